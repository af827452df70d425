#include "coordinator/api/grpc_status.h"

#include <string>

namespace pipetrain {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode are both google.rpc.Code (0..16).
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace pipetrain
