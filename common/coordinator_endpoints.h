// CoordinatorEndpoints: which of several coordinators to talk to, for
// workers and the CLI (highly available coordinators, DESIGN.md §11).
//
// Given the addresses of every coordinator ("a:7070,b:7070"), it hands out
// a channel to the one it believes is the leader and follows the leader
// when a call says otherwise: a follower refuses every call with
// UNAVAILABLE and names the leader in the trailing metadata
// kLeaderMetadataKey (a new leader still loading its state refuses so too,
// naming itself: it is asked again); a coordinator that does not answer at
// all is skipped for the next address, round robin. A single address
// behaves as a plain channel. Thread-safe.
//
// Each move is logged: one to a leader a refusal named every time (rare,
// and it says where the calls went), one to the next address at most once
// a minute with how many were not (in an outage of every coordinator each
// failed call moves on: a line per heartbeat, per worker).
//
// Only the configured addresses are ever used: a named leader that is not
// one of them, spelled exactly as given (so each coordinator's
// --advertise-address must appear in the clients' list), is ignored as if
// none were named. Otherwise whoever answers on a listed address could send
// the clients, and the bearer tokens on their calls, to any host.
//
//   CoordinatorEndpoints endpoints(addresses, make_channel);
//   std::shared_ptr<grpc::Channel> channel = endpoints.channel();
//   auto stub = v1::CoordinatorService::NewStub(channel);
//   grpc::Status s = stub->Heartbeat(&context, request, &response);
//   if (!s.ok()) endpoints.Failed(s, context, channel);  // next call: the leader
#ifndef PIPETRAIN_COMMON_COORDINATOR_ENDPOINTS_H_
#define PIPETRAIN_COMMON_COORDINATOR_ENDPOINTS_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/annotated_mutex.h"
#include "common/clock.h"
#include "common/log_rate_limiter.h"

namespace pipetrain {

// Trailing metadata of a follower's refusal: the leader's address.
inline constexpr char kLeaderMetadataKey[] = "x-pipetrain-leader";

// "a:7070, b:7070" -> {"a:7070", "b:7070"}; INVALID_ARGUMENT naming `flag`
// when empty, an entry is empty, or an entry's port (after its last ':') is
// not a number in [1, 65535] (gRPC would wrap 99999 to 34463), or it is an
// IPv6 address without brackets (gRPC would use port 443). Entries
// "unix:PATH" and "unix-abstract:NAME" have no port.
absl::StatusOr<std::vector<std::string>> ParseCoordinatorAddresses(const std::string& flag,
                                                                   const std::string& list);

// A leader hint longer than this is ignored (host names are at most 253).
inline constexpr size_t kMaxLeaderHintBytes = 512;

// The leader a refused call named (kLeaderMetadataKey), or "" when none or
// one over kMaxLeaderHintBytes. Untrusted: see ListedLeaderHint.
std::string LeaderHint(const grpc::ClientContext& context);

// LeaderHint when it is one of `addresses` (exactly), else "": the hint a
// client may follow.
std::string ListedLeaderHint(const grpc::ClientContext& context,
                             const std::vector<std::string>& addresses);

class CoordinatorEndpoints {
 public:
  using ChannelFactory = std::function<std::shared_ptr<grpc::Channel>(const std::string&)>;

  // `addresses` non-empty. `clock` (not owned) paces the round robin's
  // lines; tests step a FakeClock.
  CoordinatorEndpoints(std::vector<std::string> addresses, ChannelFactory make_channel,
                       Clock* clock = MonotonicClock());

  // The channel to the coordinator believed to lead; hand it back to
  // Failed with a failed call's outcome.
  std::shared_ptr<grpc::Channel> channel();
  std::string current() const;
  // How many addresses are listed.
  size_t size() const { return addresses_.size(); }
  // A call on `used` (an earlier channel()) failed with `status`.
  // UNAVAILABLE (a follower's refusal, or nobody listening),
  // DEADLINE_EXCEEDED (nobody answering) and UNIMPLEMENTED (no coordinator
  // API there: a proxy answering 404 during a rollout) move to the leader
  // the refusal named if it is one of the addresses, or else to the
  // address after the current one in the list. A refusal naming the
  // current address itself (its leader, still loading its state) keeps it.
  // Other codes change nothing: the coordinator answered. Nor does a
  // failure on a channel that is no longer the current one: several
  // threads see one coordinator die, the first moves on, and the others
  // moving again would send them all back to the dead one.
  //
  // True when it moved to the leader the refusal named: a call sent again
  // at once reaches it (a heartbeat need not wait its interval after a
  // failover). False otherwise, a move to the next address included.
  bool Failed(const grpc::Status& status, const grpc::ClientContext& context,
              const std::shared_ptr<grpc::Channel>& used);

 private:
  void SwitchToLocked(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<std::string> addresses_;
  const ChannelFactory make_channel_;
  mutable AnnotatedMutex mu_;
  std::string current_ ABSL_GUARDED_BY(mu_);
  // Where the round robin stands: the index of current_ in addresses_.
  size_t position_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);
  // The round robin's moves: one line a minute.
  LogRateLimiter round_robin_log_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_COORDINATOR_ENDPOINTS_H_
