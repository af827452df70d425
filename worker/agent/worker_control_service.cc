#include "worker/agent/worker_control_service.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc_credentials.h"
#include "common/logging.h"
#include "common/raw_request.h"
#include "worker/profile/unit_profiler.h"

namespace pipetrain {

void WorkerControlService::Stop() { stopping_.store(true); }

WorkerControlService::WorkerControlService(const SessionCredential* session,
                                           ProfileBackendFactory make_backend)
    : session_(session), make_backend_(std::move(make_backend)) {
  PT_CHECK(session != nullptr);
}

grpc::ServerUnaryReactor* WorkerControlService::Profile(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* raw,
                                                        grpc::ByteBuffer* answer) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status caller = session_->Check(AuthorizationOf(*context));
  if (!caller.ok()) {
    // Any host that reaches --listen can call: a bounded log, so a loop of
    // calls cannot fill the disk or bury the real errors (the RPC metrics
    // count every one).
    int64_t dropped = 0;
    if (refused_log_.Allow(&dropped)) {
      PT_LOG(WARNING) << "refused a WorkerControl.Profile call from " << context->peer() << ": "
                      << caller.message() << LogRateLimiter::Dropped(dropped);
    }
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(caller.message())));
    return reactor;
  }
  {
    AnnotatedMutexLock lock(&mu_);
    if (pending_ >= kMaxPendingProfiles) {
      reactor->Finish(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat(kMaxPendingProfiles, " profiles are running or waiting already")));
      return reactor;
    }
    ++pending_;
  }
  // Parsed only now: the credential passed, and the bytes fit.
  auto request = std::make_shared<v1::ProfileRequest>();
  absl::Status parsed = CheckRequestBytes("Profile", raw->Length(), kMaxProfileRequestBytes);
  if (parsed.ok()) parsed = ParseRequest("Profile", *raw, request.get());
  if (!parsed.ok()) {
    {
      AnnotatedMutexLock lock(&mu_);
      --pending_;
    }
    reactor->Finish(
        grpc::Status(static_cast<grpc::StatusCode>(parsed.code()), std::string(parsed.message())));
    return reactor;
  }
  // The answer's bytes and the context stay valid until Finish.
  profiler_.Post([this, context, request, answer, reactor] {
    v1::ModelProfile response;
    grpc::Status status =
        stopping_.load() ? grpc::Status(grpc::StatusCode::CANCELLED, "the worker is shutting down")
        : context->IsCancelled()
            ? grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away while it waited")
            : RunProfile(*request, context, &response);
    if (status.ok()) {
      if (const absl::Status serialized = SerializeAnswer(response, answer); !serialized.ok()) {
        status = grpc::Status(grpc::StatusCode::INTERNAL, std::string(serialized.message()));
      }
    }
    {
      AnnotatedMutexLock lock(&mu_);
      --pending_;
    }
    reactor->Finish(status);
  });
  return reactor;
}

grpc::Status WorkerControlService::RunProfile(const v1::ProfileRequest& request,
                                              grpc::CallbackServerContext* context,
                                              v1::ModelProfile* response) {
  const std::string peer = context->peer();
  PT_LOG(INFO) << "profiling a " << request.model().n_layer() << "-layer model (d_model "
               << request.model().d_model() << ", seq_len " << request.seq_len() << ", micro-batch "
               << request.micro_batch_size() << ") for " << peer;
  absl::StatusOr<SelectedBackend> backend =
      make_backend_ != nullptr ? make_backend_() : SelectBackend("cpu", "fp32");
  // Between passes: a worker shutting down, or a caller gone (its
  // deadline passed: the coordinator plans without this profile, and may
  // give this worker a job at once), ends it within a pass (a profile of a
  // large model takes minutes, and shutdown waits for it).
  const ProfileStopCheck go_on = [this, context]() {
    if (stopping_.load()) return absl::CancelledError("the worker is shutting down");
    if (context->IsCancelled()) return absl::CancelledError("the caller went away");
    return absl::OkStatus();
  };
  absl::StatusOr<v1::ModelProfile> profile =
      backend.ok() ? ProfileUnits(
                         request, [&go_on](int, const std::string&) { return go_on(); },
                         backend->backend, go_on)
                   : backend.status();
  if (!profile.ok()) {
    return grpc::Status(static_cast<grpc::StatusCode>(profile.status().code()),
                        std::string(profile.status().message()));
  }
  *response = *std::move(profile);
  return grpc::Status::OK;
}

}  // namespace pipetrain
