// absl::Status -> grpc::Status. Both use the google.rpc.Code numbering, so
// the code maps 1:1 and the message is passed through unchanged.
#ifndef PIPETRAIN_COORDINATOR_API_GRPC_STATUS_H_
#define PIPETRAIN_COORDINATOR_API_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace pipetrain {

// Thread-safe (pure).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_GRPC_STATUS_H_
