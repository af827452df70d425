// A grpc_health_probe and grpcurl-style client for tests and operators:
// grpc.health.v1.Health/Check and /Watch, and the services a server lists
// through reflection (grpc.reflection.v1alpha.ServerReflection). Speaks the
// published wire format (common/proto_wire.h): Debian ships no .proto for
// either service.
#ifndef PIPETRAIN_TESTS_GRPC_PROBE_H_
#define PIPETRAIN_TESTS_GRPC_PROBE_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pipetrain::testing {

// grpc.health.v1.HealthCheckResponse.ServingStatus by name: "UNKNOWN",
// "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN".
std::string ServingStatusName(uint64_t status);

// Health/Check of `service` ("" for the server as a whole): the status name.
// Errors: the RPC's (e.g. NOT_FOUND for a service the server does not know,
// UNAVAILABLE when nothing listens), as absl codes.
absl::StatusOr<std::string> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                        const std::string& service, absl::Duration timeout);

// The fully qualified services `channel`'s server lists through reflection,
// in the order it lists them.
absl::StatusOr<std::vector<std::string>> ListServices(const std::shared_ptr<grpc::Channel>& channel,
                                                      absl::Duration timeout);

class RawGrpcCall;  // grpc_probe.cc

// An open Health/Watch stream: the server sends the service's status at
// once and again on every change.
class HealthWatch {
 public:
  // Opens the stream; the whole stream ends after `timeout`.
  static absl::StatusOr<std::unique_ptr<HealthWatch>> Open(
      const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
      absl::Duration timeout);
  ~HealthWatch();

  // The next status the server sends (blocking); the stream's error when it
  // ends instead.
  absl::StatusOr<std::string> Next();

 private:
  explicit HealthWatch(std::unique_ptr<RawGrpcCall> call);
  std::unique_ptr<RawGrpcCall> call_;
};

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_TESTS_GRPC_PROBE_H_
