#include "coordinator/api/grpc_status.h"

#include <string>

#include "common/rpc_status.h"

namespace pipetrain {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode are both google.rpc.Code (0..16).
  const auto code = static_cast<grpc::StatusCode>(status.code());
  if (FieldViolationsOf(status).empty()) return grpc::Status(code, std::string(status.message()));
  return grpc::Status(code, std::string(status.message()), EncodeRpcStatus(status));
}

}  // namespace pipetrain
