// WorkerControlService: the worker's control RPCs (proto/pipetrain/v1/
// profile.proto), served beside the data plane on the same port. Today one
// method: Profile, which runs the unit profiler (worker/profile/
// unit_profiler.h) on this machine for the coordinator's planner.
//
// Profiles run one at a time (OpenBLAS's thread pool is shared and parallel
// profiles would time each other); a second caller waits. The coordinator
// asks only READY workers, so a profile does not compete with a job.
#ifndef PIPETRAIN_WORKER_AGENT_WORKER_CONTROL_SERVICE_H_
#define PIPETRAIN_WORKER_AGENT_WORKER_CONTROL_SERVICE_H_

#include "common/annotated_mutex.h"
#include "proto/pipetrain/v1/profile.grpc.pb.h"

namespace pipetrain {

class WorkerControlService final : public v1::WorkerControl::Service {
 public:
  // INVALID_ARGUMENT for a bad request (the profiler's message, naming the
  // field); otherwise OK with the profile.
  grpc::Status Profile(grpc::ServerContext* context, const v1::ProfileRequest* request,
                       v1::ModelProfile* response) override;

 private:
  AnnotatedMutex profile_mu_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_WORKER_CONTROL_SERVICE_H_
