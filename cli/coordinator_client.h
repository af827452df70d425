// A gRPC stub for the coordinator, with deadlines, for the CLI.
#ifndef PIPETRAIN_CLI_COORDINATOR_CLIENT_H_
#define PIPETRAIN_CLI_COORDINATOR_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain {

// `tls_ca`: a PEM CA file for TLS; empty for plaintext.
std::unique_ptr<v1::Coordinator::Stub> ConnectCoordinator(const std::string& address,
                                                          const std::string& tls_ca);

// A client context whose deadline is now + timeout.
std::unique_ptr<grpc::ClientContext> WithDeadline(absl::Duration timeout);

absl::Status ToAbsl(const grpc::Status& status);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_COORDINATOR_CLIENT_H_
