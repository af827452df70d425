#include "worker/agent/worker_control_service.h"

#include "common/grpc_credentials.h"
#include "common/logging.h"
#include "worker/profile/unit_profiler.h"

namespace pipetrain {

WorkerControlService::WorkerControlService(const SessionCredential* session,
                                           ProfileBackendFactory make_backend)
    : session_(session), make_backend_(std::move(make_backend)) {
  PT_CHECK(session != nullptr);
}

grpc::Status WorkerControlService::Profile(grpc::ServerContext* context,
                                           const v1::ProfileRequest* request,
                                           v1::ModelProfile* response) {
  const absl::Status caller = session_->Check(AuthorizationOf(*context));
  if (!caller.ok()) {
    PT_LOG(WARNING) << "refused a WorkerControl.Profile call from " << context->peer() << ": "
                    << caller.message();
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(caller.message()));
  }
  AnnotatedMutexLock lock(&profile_mu_);
  PT_LOG(INFO) << "profiling a " << request->model().n_layer() << "-layer model (d_model "
               << request->model().d_model() << ", seq_len " << request->seq_len()
               << ", micro-batch " << request->micro_batch_size() << ") for "
               << context->peer();
  absl::StatusOr<SelectedBackend> backend =
      make_backend_ != nullptr ? make_backend_() : SelectBackend("cpu", "fp32");
  absl::StatusOr<v1::ModelProfile> profile =
      backend.ok() ? ProfileUnits(*request, nullptr, backend->backend) : backend.status();
  if (!profile.ok()) {
    return grpc::Status(static_cast<grpc::StatusCode>(profile.status().code()),
                        std::string(profile.status().message()));
  }
  *response = *std::move(profile);
  return grpc::Status::OK;
}

}  // namespace pipetrain
