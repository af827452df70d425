// WorkerControlService: the worker's control RPCs (proto/pipetrain/v1/
// profile.proto), served beside the data plane on the same port. Today one
// method: Profile, which runs the unit profiler (worker/profile/
// unit_profiler.h) on this machine for the coordinator's planner.
//
// Callers: only the coordinator. Every call must present the worker's
// current session credential (SessionCredential::Check), which the
// coordinator issued and only it and this worker know; anything else is
// UNAUTHENTICATED before any work starts.
//
// Profiles run one at a time (OpenBLAS's thread pool is shared and parallel
// profiles would time each other); a second caller waits. The coordinator
// asks only READY workers, so a profile does not compete with a job. Each
// profile runs on a backend of its own from the factory (the worker's
// --device choice): a CUDA backend is used by one thread at a time, and the
// job thread has its own.
#ifndef PIPETRAIN_WORKER_AGENT_WORKER_CONTROL_SERVICE_H_
#define PIPETRAIN_WORKER_AGENT_WORKER_CONTROL_SERVICE_H_

#include <functional>
#include <utility>

#include "absl/status/statusor.h"
#include "common/annotated_mutex.h"
#include "proto/pipetrain/v1/profile.grpc.pb.h"
#include "worker/agent/session_credential.h"
#include "worker/model/backend_select.h"

namespace pipetrain {

// Makes the backend one profile runs on.
using ProfileBackendFactory = std::function<absl::StatusOr<SelectedBackend>()>;

class WorkerControlService final : public v1::WorkerControlService::Service {
 public:
  // `session` is not owned and must outlive the service (non-null,
  // checked). The default `make_backend` profiles on the CPU.
  explicit WorkerControlService(const SessionCredential* session,
                                ProfileBackendFactory make_backend = nullptr);

  // UNAUTHENTICATED without the session credential; INVALID_ARGUMENT for a
  // bad request (the profiler's message, naming the field); the backend's
  // error if it cannot be made or fails; otherwise OK with the profile.
  grpc::Status Profile(grpc::ServerContext* context, const v1::ProfileRequest* request,
                       v1::ModelProfile* response) override;

 private:
  const SessionCredential* const session_;
  ProfileBackendFactory make_backend_;
  AnnotatedMutex profile_mu_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_WORKER_CONTROL_SERVICE_H_
