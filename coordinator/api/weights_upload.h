// The server side of UploadWeights: a stage's final weights, chunk by chunk.
//
// Every chunk of one stream must name the same worker and job (the first
// chunk sets them). Each chunk goes to JobManager::AddWeightsChunk and, at the
// end of the stream, JobManager::FinishWeights completes the stage (and may
// write the job's safetensors file). Both run on the service's executor, not
// in a gRPC reaction: they wait on JobManager's lock, which a weights write
// can hold for a while. The next read starts after a chunk is stored, so a
// stream holds at most one chunk in memory beyond what JobManager keeps and
// gRPC flow control slows a fast sender.
//
// The call ends with
//   OK                   after FinishWeights succeeded,
//   INVALID_ARGUMENT     for an empty stream, chunks of different workers or
//                        jobs, or a chunk that does not fit its tensor,
//   NOT_FOUND / FAILED_PRECONDITION  as JobManager returns them (unknown job,
//                        a worker not in the job, a job that ended),
//   CANCELLED            when the client goes away.
#ifndef PIPETRAIN_COORDINATOR_API_WEIGHTS_UPLOAD_H_
#define PIPETRAIN_COORDINATOR_API_WEIGHTS_UPLOAD_H_

#include <grpcpp/grpcpp.h>

#include "common/serial_executor.h"
#include "coordinator/jobs/job_manager.h"
#include "proto/pipetrain/v1/coordinator.pb.h"

namespace pipetrain {

// A reactor for one UploadWeights call; it deletes itself when done.
// `jobs` and `executor` are not owned and must outlive the call.
grpc::ServerReadReactor<v1::WeightsChunk>* NewWeightsUpload(grpc::CallbackServerContext* context,
                                                            JobManager* jobs,
                                                            SerialExecutor* executor);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_WEIGHTS_UPLOAD_H_
