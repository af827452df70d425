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

#include <cstddef>

#include "absl/status/status.h"

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

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_GRPC_STATUS_H_
