// RED metrics (rate, errors, duration) of a gRPC server, recorded by a server
// interceptor so that every call is counted, whichever service handles it
// and however it ends (refused by authentication, failed, cancelled):
//
//   pipetrain_rpc_requests_total{method,code}     counter    calls handled
//   pipetrain_rpc_duration_seconds{method,code}   histogram  from the call's
//                                                 start to its status
//
// method is the full gRPC method name ("/pipetrain.v1.CoordinatorService/SubmitJob");
// code the status code's name ("OK", "INVALID_ARGUMENT", ...). Labels stay
// bounded: a method not named at construction is counted as "other" (e.g. a
// client calling a method nobody serves), and there are 17 codes. Every
// known method has its code="OK" series from the start, at zero, so rates
// and absent() work before the first call.
//
//   GrpcRedMetrics red(registry, GrpcRedMetrics::MethodsOf({service}));
//   grpc::ServerBuilder builder;
//   builder.experimental().SetInterceptorCreators(red.Interceptors());
//
// Streaming calls are observed once, when their status is sent: the duration
// is the stream's lifetime.
//
// Thread-safe (prometheus-cpp metrics are; the method table is read-only
// after construction). The registry must outlive this object, and this
// object every server built with its interceptors.
#ifndef PIPETRAIN_COMMON_METRICS_GRPC_RED_METRICS_H_
#define PIPETRAIN_COMMON_METRICS_GRPC_RED_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/server_interceptor.h"
#include "grpcpp/support/status.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pipetrain {

class GrpcRedMetrics {
 public:
  // The label of calls to a method not named at construction.
  static constexpr absl::string_view kOtherMethod = "other";

  // Registers both families in `registry` with series at zero for
  // code="OK" of each of `methods` (full names, "/package.Service/Method").
  GrpcRedMetrics(prometheus::Registry& registry, const std::vector<std::string>& methods);
  GrpcRedMetrics(const GrpcRedMetrics&) = delete;
  GrpcRedMetrics& operator=(const GrpcRedMetrics&) = delete;

  // The full names of every method of `services`.
  static std::vector<std::string> MethodsOf(
      const std::vector<const google::protobuf::ServiceDescriptor*>& services);
  // The methods gRPC's own health service (grpc.health.v1.Health) and server
  // reflection (grpc.reflection.v1alpha, as libgrpc++_reflection 1.51
  // serves it) add to a server (common/serving_health.h).
  static std::vector<std::string> HealthAndReflectionMethods();

  // For ServerBuilder::experimental().SetInterceptorCreators: one factory
  // whose interceptors observe each call into this object.
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
  Interceptors();

  // One call of `method` ended with `code` after `seconds`. Called by the
  // interceptor; public for tests and for servers without interceptors.
  void Observe(absl::string_view method, grpc::StatusCode code, double seconds);

  // "OK", "CANCELLED", ... as in google.rpc.Code; "UNKNOWN" for values
  // outside it.
  static std::string CodeName(grpc::StatusCode code);

 private:
  const std::string& MethodLabel(absl::string_view method) const;

  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& duration_;
  std::map<std::string, std::string, std::less<>> methods_;  // name -> label (itself)
  const std::string other_{kOtherMethod};
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_METRICS_GRPC_RED_METRICS_H_
