// absl::Status -> grpc::Status. Both use the google.rpc.Code numbering, so
// the code maps 1:1 and the message is passed through unchanged. A status
// that names a field (common/rpc_status.h) also carries google.rpc.Status
// binary details with a google.rpc.BadRequest field violation (the
// grpc-status-details-bin trailer, which grpcurl and gRPC's
// status-details helpers read).
#ifndef PIPETRAIN_COORDINATOR_API_GRPC_STATUS_H_
#define PIPETRAIN_COORDINATOR_API_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace pipetrain {

// Thread-safe (pure).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_GRPC_STATUS_H_
