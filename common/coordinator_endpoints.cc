#include "common/coordinator_endpoints.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"

namespace pipetrain {

absl::StatusOr<std::vector<std::string>> ParseCoordinatorAddresses(const std::string& flag,
                                                                   const std::string& list) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    const std::string address(absl::StripAsciiWhitespace(part));
    if (address.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": \"", list, "\" has an empty address (a comma-separated list of host:port)"));
    }
    // gRPC reads a port past 65535 modulo 2^16 and one that is not a number
    // as 0: a typo would send the token to some other service.
    if (!absl::StartsWith(address, "unix:") && !absl::StartsWith(address, "unix-abstract:")) {
      const size_t colon = address.rfind(':');
      // "::1" or "fe80::1:7070": gRPC reads an IPv6 address without
      // brackets as a host with no port (443), whatever its last group says.
      const std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
      if (host.find(':') != std::string::npos && host.find('[') == std::string::npos &&
          host.find("://") == std::string::npos && !absl::StartsWith(host, "ipv4:")) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, ": \"", absl::CHexEscape(address.substr(0, 256)),
                         "\" is an IPv6 address without brackets; write [ADDRESS]:PORT"));
      }
      const absl::string_view port =
          colon == std::string::npos ? "" : absl::string_view(address).substr(colon + 1);
      int number = 0;
      if (port.empty() || port.size() > 5 ||
          !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
          !absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, ": \"", absl::CHexEscape(address.substr(0, 256)),
                         "\" is not host:port with a port in [1, 65535]"));
      }
    }
    out.push_back(address);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " is empty"));
  return out;
}

std::string LeaderHint(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(kLeaderMetadataKey);
  if (it == trailers.end() || it->second.size() > kMaxLeaderHintBytes) return "";
  return std::string(it->second.data(), it->second.size());
}

std::string ListedLeaderHint(const grpc::ClientContext& context,
                             const std::vector<std::string>& addresses) {
  std::string hint = LeaderHint(context);
  if (hint.empty() || std::find(addresses.begin(), addresses.end(), hint) != addresses.end()) {
    return hint;
  }
  // Said once per refusal that names it, which is rare: clients back off.
  PT_LOG(WARNING) << "a coordinator named leader \"" << absl::CHexEscape(hint)
                  << "\", which is not among the configured coordinators; ignoring it (list "
                     "each coordinator's --advertise-address in --coordinator)";
  return "";
}

CoordinatorEndpoints::CoordinatorEndpoints(std::vector<std::string> addresses,
                                           ChannelFactory make_channel, Clock* clock)
    : addresses_(std::move(addresses)),
      make_channel_(std::move(make_channel)),
      round_robin_log_(1, absl::Minutes(1), clock) {
  PT_CHECK(!addresses_.empty());
  AnnotatedMutexLock lock(&mu_);
  current_ = addresses_[0];
  channel_ = make_channel_(current_);
}

std::shared_ptr<grpc::Channel> CoordinatorEndpoints::channel() {
  AnnotatedMutexLock lock(&mu_);
  return channel_;
}

std::string CoordinatorEndpoints::current() const {
  AnnotatedMutexLock lock(&mu_);
  return current_;
}

bool CoordinatorEndpoints::Failed(const grpc::Status& status, const grpc::ClientContext& context,
                                  const std::shared_ptr<grpc::Channel>& used) {
  const grpc::StatusCode code = status.error_code();
  // UNIMPLEMENTED: what answers there does not serve the coordinator's API
  // (a proxy in front of it answering 404 during a rollout); another
  // listed address may.
  if (addresses_.size() < 2 ||
      (code != grpc::StatusCode::UNAVAILABLE && code != grpc::StatusCode::DEADLINE_EXCEEDED &&
       code != grpc::StatusCode::UNIMPLEMENTED)) {
    return false;
  }
  // Only a listed leader: anyone answering on a listed address could name
  // any host, and the calls that follow carry the bearer token.
  const std::string leader = ListedLeaderHint(context, addresses_);
  AnnotatedMutexLock lock(&mu_);
  if (used != channel_) return false;  // another call has moved on already
  // It named itself: it leads, still loading its state. The others would
  // only name it again.
  if (leader == current_) return false;
  if (!leader.empty()) {
    // The round robin goes on from the leader, so that if it is dead too
    // the next try is the address after it (not back to this one).
    position_ = std::find(addresses_.begin(), addresses_.end(), leader) - addresses_.begin();
    PT_LOG(INFO) << "coordinator " << current_ << " is not the leader; using " << leader
                 << ", the leader it named";
    SwitchToLocked(leader);
    return true;
  }
  position_ = (position_ + 1) % addresses_.size();
  // In an outage of every coordinator each failed call lands here (a
  // heartbeat, its resend, a registration try, a stream reopen).
  if (int64_t dropped = 0; round_robin_log_.Allow(&dropped)) {
    PT_LOG(INFO) << "coordinator " << current_ << " is not the leader or does not answer; using "
                 << addresses_[position_] << " (logged at most once a minute)"
                 << LogRateLimiter::Dropped(dropped);
  }
  SwitchToLocked(addresses_[position_]);
  return false;
}

void CoordinatorEndpoints::SwitchToLocked(const std::string& address) {
  current_ = address;
  channel_ = make_channel_(address);
}

}  // namespace pipetrain
