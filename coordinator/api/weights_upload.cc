#include "coordinator/api/weights_upload.h"

#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/annotated_mutex.h"
#include "coordinator/api/grpc_status.h"

namespace pipetrain {
namespace {

class WeightsUpload final : public grpc::ServerReadReactor<v1::WeightsChunk> {
 public:
  WeightsUpload(grpc::CallbackServerContext* context, JobManager* jobs, SerialExecutor* executor)
      : context_(context), jobs_(jobs), executor_(executor) {
    AnnotatedMutexLock lock(&mu_);
    StartRead(&chunk_);
  }

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
    { AnnotatedMutexLock lock(&mu_); }  // orders the last task before the delete
    delete this;
  }

 private:
  // On the executor. Stores the chunk and reads the next, or finishes.
  void HandleChunk(const v1::WeightsChunk& chunk) {
    AnnotatedMutexLock lock(&mu_);
    if (chunks_ == 0) {
      worker_id_ = chunk.worker_id();
      job_id_ = chunk.job_id();
    } else if (chunk.worker_id() != worker_id_ || chunk.job_id() != job_id_) {
      return Finish(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("chunk ", chunks_, " is for worker ", chunk.worker_id(), " job ",
                       chunk.job_id(), " but the stream began with worker ", worker_id_,
                       " job ", job_id_, "; use one UploadWeights stream per worker and job")));
    }
    ++chunks_;
    absl::Status stored = jobs_->AddWeightsChunk(chunk);
    if (!stored.ok()) return Finish(ToGrpcStatus(stored));
    StartRead(&chunk_);
  }

  // On the executor, after the client closed its side (or went away).
  void HandleEnd() {
    AnnotatedMutexLock lock(&mu_);
    if (context_->IsCancelled()) {
      return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the upload was cancelled"));
    }
    if (chunks_ == 0) {
      return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "UploadWeights stream carried no chunks; send at least one "
                                 "WeightsChunk naming worker_id and job_id"));
    }
    Finish(ToGrpcStatus(jobs_->FinishWeights(worker_id_, job_id_)));
  }

  grpc::CallbackServerContext* const context_;
  JobManager* const jobs_;
  SerialExecutor* const executor_;

  // Held by each executor task (and taken by OnDone) so TSan sees the tasks
  // ordered before the delete; gRPC's own hand-offs are invisible to it.
  AnnotatedMutex mu_;
  v1::WeightsChunk chunk_;  // filled by the read in flight
  int64_t chunks_ ABSL_GUARDED_BY(mu_) = 0;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  std::string job_id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerReadReactor<v1::WeightsChunk>* NewWeightsUpload(grpc::CallbackServerContext* context,
                                                            JobManager* jobs,
                                                            SerialExecutor* executor) {
  return new WeightsUpload(context, jobs, executor);
}

}  // namespace pipetrain
