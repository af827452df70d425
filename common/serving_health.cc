#include "common/serving_health.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pipetrain {

void EnableGrpcHealthAndReflection() {
  static std::once_flag once;
  std::call_once(once, [] {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  });
}

ServingHealth::ServingHealth(std::vector<std::string> services, std::string starting)
    : services_(std::move(services)), reason_(std::move(starting)) {}

void ServingHealth::Attach(grpc::Server* server) {
  PT_CHECK(server->GetHealthCheckService() != nullptr)
      << "gRPC server built without a health service; call EnableGrpcHealthAndReflection first";
  AnnotatedMutexLock lock(&mu_);
  server_ = server;
  PublishLocked();
}

void ServingHealth::Detach() {
  AnnotatedMutexLock lock(&mu_);
  server_ = nullptr;
}

void ServingHealth::SetReady() {
  AnnotatedMutexLock lock(&mu_);
  if (draining_) return;
  ready_ = true;
  reason_.clear();
  PublishLocked();
}

void ServingHealth::SetNotReady(std::string reason) {
  AnnotatedMutexLock lock(&mu_);
  if (draining_) return;  // the drain's reason stands
  ready_ = false;
  reason_ = std::move(reason);
  PublishLocked();
}

void ServingHealth::Drain(std::string reason) {
  AnnotatedMutexLock lock(&mu_);
  draining_ = true;
  ready_ = false;
  reason_ = std::move(reason);
  PublishLocked();
}

bool ServingHealth::ready() const {
  AnnotatedMutexLock lock(&mu_);
  return ready_;
}

std::string ServingHealth::reason() const {
  AnnotatedMutexLock lock(&mu_);
  return reason_;
}

void ServingHealth::PublishLocked() {
  if (server_ == nullptr) return;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  // The server as a whole ("") changes last, in both directions: a client
  // that saw "" change (to SERVING or to NOT_SERVING) finds every service
  // changed already. (Setting "" first when draining let a client see ""
  // NOT_SERVING and then a service still SERVING: a flaky health test.)
  for (const std::string& service : services_) health->SetServingStatus(service, ready_);
  health->SetServingStatus("", ready_);
}

void ServeHealthEndpoints(HttpServer& server, const ServingHealth* health) {
  server.Get("/healthz",
             [](const HttpRequest&) { return JsonResponse(200, R"({"status":"ok"})"); });
  server.Get("/readyz", [health](const HttpRequest&) {
    if (health->ready()) return JsonResponse(200, R"({"status":"ready"})");
    return JsonError(503, "UNAVAILABLE", absl::StrCat("not ready: ", health->reason()));
  });
}

}  // namespace pipetrain
