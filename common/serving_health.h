// Liveness and readiness of a pipetrain process, for probes and load
// balancers: gRPC health checking (grpc.health.v1.Health, per service) and
// server reflection on its gRPC servers, and /healthz and /readyz on its
// HTTP server.
//
//   EnableGrpcHealthAndReflection();   // main(), before any grpc::ServerBuilder
//   ServingHealth health({"pipetrain.v1.CoordinatorService"}, "loading the state");
//   std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
//   health.Attach(server.get());       // NOT_SERVING: "loading the state"
//   ServeHealthEndpoints(http, &health);
//   health.SetReady();                 // SERVING; /readyz 200
//   ...
//   health.SetNotReady("draining");    // NOT_SERVING; /readyz 503 naming why
//
// Liveness (/healthz) is only "the process answers HTTP": always 200
// {"status":"ok"}. Readiness is one state for the whole process: every
// listed service and the server as a whole ("") are SERVING or NOT_SERVING
// together, and /readyz says the same (200 {"status":"ready"}, or 503 with
// the google.rpc.Status JSON error body, code 14 UNAVAILABLE, naming why).
//
// Both endpoints and the health service need no credentials (probes carry
// none); neither says more than "up" and a reason. Reflection, likewise
// unauthenticated, describes the protos, which are public; it serves no data.
//
// Thread-safe.
#ifndef PIPETRAIN_COMMON_SERVING_HEALTH_H_
#define PIPETRAIN_COMMON_SERVING_HEALTH_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/annotated_mutex.h"
#include "common/http_server.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace pipetrain {

// Makes every grpc::Server built after the call serve grpc.health.v1.Health
// (its default implementation: the server as a whole "" is SERVING until told
// otherwise) and server reflection (grpc.reflection.v1alpha). Process-wide;
// idempotent. Call before the first grpc::ServerBuilder is made.
void EnableGrpcHealthAndReflection();

class ServingHealth {
 public:
  // `services`: the fully qualified names of the services whose status the
  // health service reports (e.g. "pipetrain.v1.CoordinatorService"). Starts not
  // ready, because of `starting`.
  ServingHealth(std::vector<std::string> services, std::string starting);

  // Tells `server`'s health service the current state now and on every
  // change. `server` must have been built after EnableGrpcHealthAndReflection
  // (checked) and must outlive this object or be detached by Detach before
  // it is shut down. At most one server at a time.
  void Attach(grpc::Server* server);
  void Detach();

  // Ready, unless draining.
  void SetReady();
  // `reason` names what is missing ("not registered with the coordinator
  // yet").
  void SetNotReady(std::string reason);
  // Not ready from now on, because of `reason` ("draining: ..."): later
  // SetReady calls are ignored (a shutdown is not undone).
  void Drain(std::string reason);

  bool ready() const;
  std::string reason() const;  // empty when ready

 private:
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<std::string> services_;
  mutable AnnotatedMutex mu_;
  grpc::Server* server_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::string reason_ ABSL_GUARDED_BY(mu_);
};

// Registers GET /healthz (liveness) and GET /readyz (readiness of `health`,
// which must outlive the server). Both must be among the server's
// public_paths when it has a bearer token (they are by default). Requires:
// server not started.
void ServeHealthEndpoints(HttpServer& server, const ServingHealth* health);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_SERVING_HEALTH_H_
