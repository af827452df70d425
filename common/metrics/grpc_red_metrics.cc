#include "common/metrics/grpc_red_metrics.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/metrics/latency_buckets.h"
#include "grpcpp/support/interceptor.h"

// gRPC creates a call's interceptor on one thread and runs its hooks and
// destructor on others, ordered by gRPC core, which Debian builds without
// ThreadSanitizer: the sanitizer cannot see that order and would report the
// interceptor's own fields as racing. These annotations state it (the same
// handover ANNOTATE_HAPPENS_BEFORE/AFTER describe); outside TSan builds
// they are nothing.
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define PT_HANDED_OVER(p) __tsan_release(p)
#define PT_TAKEN_OVER(p) __tsan_acquire(p)
#else
#define PT_HANDED_OVER(p) ((void)(p))
#define PT_TAKEN_OVER(p) ((void)(p))
#endif

namespace pipetrain {
namespace {

using grpc::experimental::InterceptionHookPoints;

// Observes one call: created by gRPC when the call starts, records when the
// status is sent (or, for a call that ends without one, as CANCELLED when
// gRPC destroys it with the call).
class RedInterceptor : public grpc::experimental::Interceptor {
 public:
  RedInterceptor(GrpcRedMetrics* metrics, const char* method)
      : metrics_(metrics), method_(method), start_(std::chrono::steady_clock::now()) {
    PT_HANDED_OVER(this);
  }
  ~RedInterceptor() override {
    PT_TAKEN_OVER(this);
    if (!recorded_) Record(grpc::StatusCode::CANCELLED);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    PT_TAKEN_OVER(this);
    if (!recorded_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(methods->GetSendStatus().error_code());
    }
    PT_HANDED_OVER(this);  // the next hook may run on another thread
    methods->Proceed();
  }

 private:
  void Record(grpc::StatusCode code) {
    recorded_ = true;
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
    metrics_->Observe(method_, code, elapsed.count());
  }

  GrpcRedMetrics* const metrics_;
  const char* const method_;  // owned by gRPC, lives as long as the call
  const std::chrono::steady_clock::time_point start_;
  bool recorded_ = false;  // hooks of one call run one at a time
};

class RedInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RedInterceptorFactory(GrpcRedMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RedInterceptor(metrics_, info->method() == nullptr ? "" : info->method());
  }

 private:
  GrpcRedMetrics* const metrics_;
};

}  // namespace

GrpcRedMetrics::GrpcRedMetrics(prometheus::Registry& registry,
                               const std::vector<std::string>& methods)
    : requests_(prometheus::BuildCounter()
                    .Name("pipetrain_rpc_requests_total")
                    .Help("gRPC calls handled by this server, by full method name and status "
                          "code (method=\"other\": a method it does not serve)")
                    .Register(registry)),
      duration_(prometheus::BuildHistogram()
                    .Name("pipetrain_rpc_duration_seconds")
                    .Help("gRPC calls handled by this server, from their start to their "
                          "status (a stream's whole life), seconds, by method and code")
                    .Register(registry)) {
  for (const std::string& method : methods) {
    methods_.emplace(method, method);
    const prometheus::Labels labels = {{"method", method}, {"code", "OK"}};
    requests_.Add(labels);
    duration_.Add(labels, RequestLatencyBuckets());
  }
}

std::vector<std::string> GrpcRedMetrics::MethodsOf(
    const std::vector<const google::protobuf::ServiceDescriptor*>& services) {
  std::vector<std::string> names;
  for (const google::protobuf::ServiceDescriptor* service : services) {
    for (int i = 0; i < service->method_count(); ++i) {
      names.push_back(absl::StrCat("/", service->full_name(), "/", service->method(i)->name()));
    }
  }
  return names;
}

std::vector<std::string> GrpcRedMetrics::HealthAndReflectionMethods() {
  return {"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch",
          "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"};
}

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
GrpcRedMetrics::Interceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<RedInterceptorFactory>(this));
  return factories;
}

void GrpcRedMetrics::Observe(absl::string_view method, grpc::StatusCode code, double seconds) {
  const prometheus::Labels labels = {{"method", MethodLabel(method)}, {"code", CodeName(code)}};
  requests_.Add(labels).Increment();
  duration_.Add(labels, RequestLatencyBuckets()).Observe(seconds);
}

const std::string& GrpcRedMetrics::MethodLabel(absl::string_view method) const {
  const auto it = methods_.find(method);
  return it == methods_.end() ? other_ : it->second;
}

std::string GrpcRedMetrics::CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

}  // namespace pipetrain
