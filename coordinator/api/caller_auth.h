// CallerAuth: who may call which pipetrain.v1.CoordinatorService method
// (docs/operations.md "Security"). Transport-free apart from reading the
// "authorization" metadata value, which the caller passes in.
//
//   role     methods                                        credential
//   user     SubmitJob GetJob ListJobs CancelJob ListWorkers  "authorization: Bearer
//            GetPlan (and every REST endpoint but /healthz,   <user token>"
//            /metrics)                                         (--user-token)
//   joining  RegisterWorker                                   RegisterWorkerRequest.join_token
//                                                             (--join-token; the registry
//                                                             checks it)
//   worker   Heartbeat WatchAssignments ReportProgress        "authorization: Bearer
//            UploadWeights DeregisterWorker                   <session token>" naming the
//                                                             worker the request acts for
//   either   DrainWorker: a user any worker, a worker itself  either of the above
//
// A session credential (RegisterWorkerResponse.session_token) allows acting
// for its own worker only: a request naming another worker is
// PERMISSION_DENIED, whatever the credential's validity elsewhere. Whether
// that worker may act on a job (it must be assigned to it) is the job
// manager's check. Worker credentials are required even when the
// coordinator runs --insecure (registration is then open, but a worker
// still acts only for itself).
//
// Thread-safe.
#ifndef PIPETRAIN_COORDINATOR_API_CALLER_AUTH_H_
#define PIPETRAIN_COORDINATOR_API_CALLER_AUTH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/registry/worker_registry.h"

namespace pipetrain {

class CallerAuth {
 public:
  // `user_token` empty: user methods are open to anyone (--insecure).
  // `workers` is not owned and must outlive this.
  CallerAuth(std::string user_token, const WorkerRegistry* workers);

  // `authorization`: the call's "authorization" value ("" when absent).
  // UNAUTHENTICATED when the user token is required and missing or wrong.
  absl::Status CheckUser(absl::string_view authorization) const;

  // The session the call carries. UNAUTHENTICATED: no credential, or not a
  // current session credential (the worker must register again).
  absl::StatusOr<WorkerRegistry::SessionIdentity> AuthenticateWorker(
      absl::string_view authorization) const;

  // Whether the call's worker credential, refused, is a worker's own
  // session gone stale (WorkerRegistry::IsStaleSession): for metrics only.
  bool IsStaleWorkerSession(absl::string_view authorization) const;

  // OK when `session` may act for `worker_id`; else PERMISSION_DENIED.
  static absl::Status CheckActsFor(const WorkerRegistry::SessionIdentity& session,
                                   absl::string_view worker_id);

  // The session the call carries, if it may act for `worker_id`.
  // UNAUTHENTICATED: no credential, or not a current session credential
  // (the worker must register again). PERMISSION_DENIED: a valid credential
  // of another worker.
  absl::StatusOr<WorkerRegistry::SessionIdentity> CheckWorker(absl::string_view authorization,
                                                              absl::string_view worker_id) const;

 private:
  const std::string user_token_;
  const WorkerRegistry* const workers_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_CALLER_AUTH_H_
