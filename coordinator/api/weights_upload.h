// The server side of UploadWeights: a stage's final weights, chunk by chunk.
//
// The caller is authenticated when the stream opens (its session
// credential, caller_auth.h): without a current one the call ends
// UNAUTHENTICATED before any chunk is read. Every chunk must name the
// credential's worker (else PERMISSION_DENIED) and the same job (the first
// chunk sets it). Each chunk goes to JobManager::AddWeightsChunk and, at the
// end of the stream, JobManager::FinishWeights completes the stage (and may
// write the job's safetensors file). Both run on an executor the service
// picks for the caller's worker (a strand: one of a few, shared by hash),
// not in a gRPC reaction: a job's first chunk creates its weights file,
// reserving the model's bytes (JobManager::WeightsFileCreation), and a
// write may be slow. The next read starts after a chunk is stored, so a
// stream holds at most one chunk in memory beyond what JobManager keeps and
// gRPC flow control slows a fast sender. A stream the client abandoned
// (cancelled) frees its worker's slot at once, not when its end's turn on
// the strand comes: the worker's retry is not refused meanwhile.
//
// The call ends with
//   OK                   after FinishWeights succeeded,
//   UNAUTHENTICATED / PERMISSION_DENIED  as above (counted as refused in
//                        `metrics`); PERMISSION_DENIED also for a chunk of
//                        another worker than the stream's,
//   INVALID_ARGUMENT     for an empty stream, chunks of different jobs, an
//                        empty or over-long job id, or a chunk that does not
//                        fit its tensor,
//   NOT_FOUND            for an unknown job,
//   PERMISSION_DENIED    for a worker not in the job, or a tensor another
//                        stage owns (JobManager's answers),
//   FAILED_PRECONDITION  for a job that ended or is not running, or whose
//                        weights are complete and being written,
//   CANCELLED            when the client goes away.
#ifndef PIPETRAIN_COORDINATOR_API_WEIGHTS_UPLOAD_H_
#define PIPETRAIN_COORDINATOR_API_WEIGHTS_UPLOAD_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "common/annotated_mutex.h"
#include "common/serial_executor.h"
#include "coordinator/api/caller_auth.h"
#include "coordinator/api/coordinator_metrics.h"
#include "coordinator/jobs/job_manager.h"
#include "proto/pipetrain/v1/coordinator.pb.h"

namespace pipetrain {

// The workers with an upload open: one at a time per worker (a stage
// uploads its weights on one stream; each open stream waits in a read and
// may hold a chunk, so a worker opening them by the thousand grew the
// coordinator without end). Thread-safe.
class OpenUploads {
 public:
  // Nullopt when `worker_id` has one open already; else records it and
  // returns its ticket.
  std::optional<uint64_t> TryOpen(const std::string& worker_id);
  // Frees the worker's slot if `ticket` still holds it (a stream closing
  // twice, or after a newer one of the worker opened, frees nothing).
  void Close(const std::string& worker_id, uint64_t ticket);

 private:
  AnnotatedMutex mu_;
  std::map<std::string, uint64_t> open_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
};

// The executor a worker's upload runs on; the same for every stream of a
// worker (its tasks stay in order).
using UploadStrandOf = std::function<SerialExecutor*(const std::string& worker_id)>;

// A reactor for one UploadWeights call; it deletes itself when done.
// `authorization` is the call's credential (AuthorizationOf). A second
// upload of a worker that has one open ends UNAVAILABLE (retry). `auth`,
// `metrics`, `jobs`, the executors `strand_of` gives and `open` are not
// owned and must outlive the call.
grpc::ServerReadReactor<v1::WeightsChunk>* NewWeightsUpload(
    grpc::CallbackServerContext* context, const std::string& authorization, const CallerAuth* auth,
    CoordinatorMetrics* metrics, JobManager* jobs, const UploadStrandOf& strand_of,
    OpenUploads* open);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_WEIGHTS_UPLOAD_H_
