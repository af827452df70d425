#include "coordinator/api/weights_upload.h"

#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/annotated_mutex.h"
#include "coordinator/api/grpc_status.h"

namespace pipetrain {
namespace {

constexpr char kMethod[] = "UploadWeights";

class WeightsUpload final : public grpc::ServerReadReactor<v1::WeightsChunk> {
 public:
  WeightsUpload(grpc::CallbackServerContext* context, WorkerRegistry::SessionIdentity caller,
                CoordinatorMetrics* metrics, JobManager* jobs, SerialExecutor* executor,
                OpenUploads* open, uint64_t ticket)
      : context_(context),
        caller_(std::move(caller)),
        metrics_(metrics),
        jobs_(jobs),
        executor_(executor),
        open_(open),
        ticket_(ticket) {
    AnnotatedMutexLock lock(&mu_);
    StartRead(&chunk_);
  }

  // Abandoned by the client (its stream broke, or its deadline passed):
  // the worker's slot is freed now, whether a read is pending or a chunk
  // waits on the strand (behind other uploads' work, or a job's weights
  // file being reserved). The worker's retry may come before this stream's
  // turn there, and was refused until then. (The ticket keeps this late
  // close from freeing a newer stream's slot.)
  void OnCancel() override { open_->Close(caller_.worker_id, ticket_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      executor_->Post([this] { HandleEnd(); });
      return;
    }
    // Moved out so the next read can fill chunk_ while the task runs.
    auto chunk = std::make_shared<v1::WeightsChunk>(std::move(chunk_));
    executor_->Post([this, chunk] { HandleChunk(*chunk); });
  }

  void OnDone() override {
    {
      AnnotatedMutexLock lock(&mu_);  // also orders the last task before the delete
      open_->Close(caller_.worker_id, ticket_);
    }
    delete this;
  }

 private:
  // On the executor. Stores the chunk and reads the next, or finishes.
  void HandleChunk(const v1::WeightsChunk& chunk) {
    AnnotatedMutexLock lock(&mu_);
    const absl::Status acts = CallerAuth::CheckActsFor(caller_, chunk.worker_id());
    if (!acts.ok()) {
      metrics_->CountRefused(kMethod, acts.code());
      return End(ToGrpcStatus(acts));
    }
    if (chunks_ == 0) {
      worker_id_ = chunk.worker_id();
      job_id_ = chunk.job_id();
    } else if (chunk.job_id() != job_id_) {
      return End(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("chunk ", chunks_, " is for job ",
                       absl::CHexEscape(absl::string_view(chunk.job_id()).substr(0, 64)),
                       " but the stream began with job ", job_id_,
                       "; use one UploadWeights stream per job")));
    }
    ++chunks_;
    absl::Status stored = jobs_->AddWeightsChunk(chunk);
    if (!stored.ok()) return End(ToGrpcStatus(stored));
    StartRead(&chunk_);
  }

  // Frees the worker's upload slot, then finishes the call: gRPC may run
  // OnDone only after the client has the status, and a worker that uploads
  // again at once must not be refused as if this call were still open.
  void End(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    open_->Close(caller_.worker_id, ticket_);
    Finish(status);
  }

  // On the executor, after the client closed its side (or went away).
  void HandleEnd() {
    AnnotatedMutexLock lock(&mu_);
    if (context_->IsCancelled()) {
      return End(grpc::Status(grpc::StatusCode::CANCELLED, "the upload was cancelled"));
    }
    if (chunks_ == 0) {
      return End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "UploadWeights stream carried no chunks; send at least one "
                              "WeightsChunk naming worker_id and job_id"));
    }
    End(ToGrpcStatus(jobs_->FinishWeights(worker_id_, job_id_)));
  }

  grpc::CallbackServerContext* const context_;
  const WorkerRegistry::SessionIdentity caller_;
  CoordinatorMetrics* const metrics_;
  JobManager* const jobs_;
  SerialExecutor* const executor_;
  OpenUploads* const open_;
  const uint64_t ticket_;  // this stream's hold on its worker's slot in open_

  // Held by each executor task (and taken by OnDone) so TSan sees the tasks
  // ordered before the delete; gRPC's own hand-offs are invisible to it.
  AnnotatedMutex mu_;
  v1::WeightsChunk chunk_;  // filled by the read in flight
  int64_t chunks_ ABSL_GUARDED_BY(mu_) = 0;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  std::string job_id_ ABSL_GUARDED_BY(mu_);
};

// Ends the call with `status` without reading anything; deletes itself.
class RefusedUpload final : public grpc::ServerReadReactor<v1::WeightsChunk> {
 public:
  explicit RefusedUpload(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerReadReactor<v1::WeightsChunk>* NewWeightsUpload(
    grpc::CallbackServerContext* context, const std::string& authorization, const CallerAuth* auth,
    CoordinatorMetrics* metrics, JobManager* jobs, const UploadStrandOf& strand_of,
    OpenUploads* open) {
  absl::StatusOr<WorkerRegistry::SessionIdentity> caller = auth->AuthenticateWorker(authorization);
  if (!caller.ok()) {
    // A worker's own stale session counted apart, as for the unary calls
    // (CoordinatorGrpcService::CountRefusal).
    if (caller.status().code() == absl::StatusCode::kUnauthenticated &&
        auth->IsStaleWorkerSession(authorization)) {
      metrics->CountStaleSession(kMethod);
    } else {
      metrics->CountRefused(kMethod, caller.status().code());
    }
    return new RefusedUpload(caller.status());
  }
  const std::optional<uint64_t> ticket = open->TryOpen(caller->worker_id);
  if (!ticket.has_value()) {
    // UNAVAILABLE, which the worker retries: its earlier stream, broken on
    // its side and not yet seen to end here.
    return new RefusedUpload(absl::UnavailableError(
        absl::StrCat("worker ", caller->worker_id,
                     " has an upload open already (one at a time); retry once it has closed")));
  }
  SerialExecutor* const strand = strand_of(caller->worker_id);
  return new WeightsUpload(context, *std::move(caller), metrics, jobs, strand, open, *ticket);
}

std::optional<uint64_t> OpenUploads::TryOpen(const std::string& worker_id) {
  AnnotatedMutexLock lock(&mu_);
  const uint64_t ticket = next_ticket_++;
  if (!open_.emplace(worker_id, ticket).second) return std::nullopt;
  return ticket;
}

void OpenUploads::Close(const std::string& worker_id, uint64_t ticket) {
  AnnotatedMutexLock lock(&mu_);
  auto it = open_.find(worker_id);
  if (it != open_.end() && it->second == ticket) open_.erase(it);
}

}  // namespace pipetrain
