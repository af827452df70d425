// absl::Status -> grpc::Status. Both use the google.rpc.Code numbering, so
// the code maps 1:1. The message is passed through, cut to
// kMaxStatusMessageBytes: gRPC sends it in a trailer, and one past the
// client's metadata limit (8 KiB by default) fails the call at the client
// ("received initial metadata size exceeds limit") instead of saying why.
// Messages may quote what a request carried (an unknown 1 MB job id). A status
// that names a field (common/rpc_status.h) also carries google.rpc.Status
// binary details with a google.rpc.BadRequest field violation (the
// grpc-status-details-bin trailer, which grpcurl and gRPC's
// status-details helpers read).
#ifndef PIPETRAIN_COORDINATOR_API_GRPC_STATUS_H_
#define PIPETRAIN_COORDINATOR_API_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <chrono>
#include <cstddef>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace pipetrain {

// The most bytes of a status message ToGrpcStatus sends; a longer one is
// cut (at a UTF-8 character) and ends " ... [N more bytes]". The trailers
// carry it twice (grpc-message percent-encoded, up to 3 bytes a byte, and
// in the details, base64), so 1 KiB stays well inside 8 KiB.
inline constexpr size_t kMaxStatusMessageBytes = 1024;

// Thread-safe (pure).
grpc::Status ToGrpcStatus(const absl::Status& status);

// `status` with its message cut as ToGrpcStatus cuts it (the code kept):
// what a client is answered over REST too, where the protobuf JSON
// parser's messages quote a bad value whole (a 200,000-digit number came
// back twice, in the message and in the details).
absl::Status BoundedStatus(const absl::Status& status);

// How long a server may work on a call before its answer would miss the
// caller's `deadline` (grpc::ServerContextBase::deadline(); the
// time_point's max: none, infinite): the time left at `now`, less a fifth
// of it (at most a second) for the answer's way back; zero once it passed.
// For waits a call may cut short with a "not yet" answer (CancelJob's wait
// for its save), so that the caller reads that answer, not its own
// DEADLINE_EXCEEDED. Thread-safe (pure).
absl::Duration CallerWaitBudget(std::chrono::system_clock::time_point deadline, absl::Time now);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_GRPC_STATUS_H_
