#include "worker/agent/worker_control_service.h"

#include "common/logging.h"
#include "worker/profile/unit_profiler.h"

namespace pipetrain {

grpc::Status WorkerControlService::Profile(grpc::ServerContext* context,
                                           const v1::ProfileRequest* request,
                                           v1::ModelProfile* response) {
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
