#include "common/loopback_channel.h"

#include <grpc/grpc.h>

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/host_port.h"

namespace pipetrain {
namespace {

// The host of one address, split as gRPC splits it: "[v6]:port" and
// "[v6]" in brackets; "host:port" at its only ':'; no ':' or several (an
// IPv6 address without brackets): all of it, without a port.
absl::string_view HostOfAddress(absl::string_view address) {
  if (absl::ConsumePrefix(&address, "[")) {
    const size_t close = address.find(']');
    return close == absl::string_view::npos ? absl::string_view() : address.substr(0, close);
  }
  const size_t colon = address.find(':');
  if (colon == absl::string_view::npos || address.find(':', colon + 1) != absl::string_view::npos) {
    return address;
  }
  return address.substr(0, colon);
}

}  // namespace

bool IsLoopbackTarget(absl::string_view target) {
  if (absl::ConsumePrefix(&target, "ipv4:") || absl::ConsumePrefix(&target, "ipv6:")) {
    // gRPC's sockaddr resolver takes the path, without a leading '/'.
    if (!absl::ConsumePrefix(&target, "///")) absl::ConsumePrefix(&target, "/");
    const std::vector<absl::string_view> addresses = absl::StrSplit(target, ',');
    for (absl::string_view address : addresses) {
      if (!IsLoopbackHost(HostOfAddress(address))) return false;
    }
    return true;
  }
  // "dns:host:port" and "dns:///host:port" (no authority: the system's
  // resolver); "dns://server/..." keeps its "//" and fails below.
  if (absl::ConsumePrefix(&target, "dns:")) absl::ConsumePrefix(&target, "///");
  return IsLoopbackHost(HostOfAddress(target));
}

void SkipProxyForLoopback(absl::string_view target, grpc::ChannelArguments* args) {
  if (IsLoopbackTarget(target)) args->SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
}

std::shared_ptr<grpc::Channel> CreateCustomChannelSkippingLoopbackProxy(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& creds,
    const grpc::ChannelArguments& args) {
  grpc::ChannelArguments own = args;
  SkipProxyForLoopback(target, &own);
  return grpc::CreateCustomChannel(target, creds, own);
}

}  // namespace pipetrain
