// A gRPC stub for the coordinator, with deadlines, for the CLI.
#ifndef PIPETRAIN_CLI_COORDINATOR_CLIENT_H_
#define PIPETRAIN_CLI_COORDINATOR_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain {

// The arguments of the CLI's channels to a coordinator: a worker's
// (CoordinatorChannelArguments), so that a coordinator back from a restart
// or a new leader is reached within 2 s. gRPC's own reconnect backoff grows
// to 2 minutes, and a new channel to the same address shares the old one's
// connection and its backoff: after an outage of 45 s, `submit --follow`
// gave up (its 60 s) on a coordinator serving for some time already.
grpc::ChannelArguments CoordinatorClientChannelArguments();

// `tls_ca`: a PEM CA file for TLS; empty for plaintext. `user_token`: sent
// as "authorization: Bearer <token>" on every call (the coordinator's
// --user-token); empty: none. An unreadable CA file gives a channel that
// cannot connect (the calls fail UNAVAILABLE); the CLI checks its flags with
// ClientTlsCredentials first.
std::unique_ptr<v1::CoordinatorService::Stub> ConnectCoordinator(const std::string& address,
                                                                 const std::string& tls_ca,
                                                                 const std::string& user_token);
// The same with credentials of the caller's (e.g. mutual TLS). `address`
// may list several highly available coordinators ("a:7070,b:7070"): the
// stub is then the leader's, as FindCoordinator finds it within 10 s (if
// none leads by then, or the list is malformed: a stub for the first
// address or the string given, whose calls say what is wrong).
std::unique_ptr<v1::CoordinatorService::Stub> ConnectCoordinator(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const std::string& user_token);

// For the CLI's commands, with their --coordinator (named by `flag`) and
// --timeout. `address` lists one coordinator, or several highly available
// ones ("a:7070,b:7070"); then their leader is found first: each is asked
// in turn (a follower names the leader, followed only when it is one of
// the listed addresses, so that no one can redirect the token; a leader
// still loading its state names itself, and is asked again), each with
// a deadline of `timeout` / (the number listed), so that a silent one
// cannot use up the others' time, and rounds repeat (during a takeover
// none may lead for a moment) until `timeout` has passed. One address is
// connected as it is.
// The calls on the stub need deadlines of their own (WithDeadline).
// Errors: INVALID_ARGUMENT naming `flag` for an empty list or entry
// (ParseCoordinatorAddresses); when no listed coordinator led within
// `timeout`, DEADLINE_EXCEEDED if one of them did not answer in time, else
// UNAVAILABLE (none reachable, or only followers answered); both name the
// addresses and the last one's error.
absl::StatusOr<std::unique_ptr<v1::CoordinatorService::Stub>> FindCoordinator(
    const std::string& flag, const std::string& address,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials, const std::string& user_token,
    absl::Duration timeout);

// The user token for CLI commands: the contents of `token_file` when given,
// else the PIPETRAIN_TOKEN environment variable (a trailing line end
// dropped, as from a file), else empty (a coordinator started --insecure).
// Errors: ReadSecretFile's, naming --token-file; CheckedSecret's, naming
// PIPETRAIN_TOKEN.
absl::StatusOr<std::string> UserTokenFrom(const std::string& token_file);

// A client context whose deadline is now + timeout.
std::unique_ptr<grpc::ClientContext> WithDeadline(absl::Duration timeout);

absl::Status ToAbsl(const grpc::Status& status);

// Whether a call of the CLI's whose answer was `status` may or may not
// have taken effect: UNAVAILABLE, DEADLINE_EXCEEDED (OutcomeUnknown), or
// CANCELLED, which a coordinator that stops (SIGTERM: a rolling update, an
// HA leader handing over) ends calls with that it has not answered. The
// CLI cancels none of the calls it asks this for itself (Ctrl-C is checked
// apart, Interrupted()).
bool CoordinatorOutcomeUnknown(const absl::Status& status);

// Calls `submit` until it succeeds, fails with a code other than
// UNAVAILABLE, DEADLINE_EXCEEDED or CANCELLED (CoordinatorOutcomeUnknown:
// the job may or may not exist: the call may have been refused before it
// arrived, or its answer lost), or `attempts` (>= 1) calls have failed; returns the last
// result. Between calls it tells `on_retry` the failure, the attempt that
// failed (1-based) and the wait, then waits: `backoff` first, doubling
// each time, through `wait`, which returns false to give up at once (the
// last failure is returned; e.g. Ctrl-C). Only for a submit that carries a
// request_id, which makes a repeat return the job the first one made
// (SubmitJobRequest.request_id).
absl::StatusOr<v1::Job> SubmitWithRetries(
    const std::function<absl::StatusOr<v1::Job>()>& submit, int attempts, absl::Duration backoff,
    const std::function<void(const absl::Status&, int, absl::Duration)>& on_retry,
    const std::function<bool(absl::Duration)>& wait);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_COORDINATOR_CLIENT_H_
