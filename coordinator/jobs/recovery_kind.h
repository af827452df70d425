// Why a job went RECOVERING: the `reason` label of
// pipetrain_job_recoveries_total (docs/operations.md, Metrics). One list,
// so that the metrics can create every label value at zero before the first
// event (a series born at 1 counts as 0 in Prometheus' increase()).
#ifndef PIPETRAIN_COORDINATOR_JOBS_RECOVERY_KIND_H_
#define PIPETRAIN_COORDINATOR_JOBS_RECOVERY_KIND_H_

namespace pipetrain {

enum class RecoveryKind {
  kWorkerLost,          // a worker of the job was lost (or went while re-planning)
  kPeerFailure,         // a stage reported that a peer failed it
  kCheckpointUnusable,  // a stage could not load the checkpoint it was given
  kCheckpointFailed,    // the checkpoint of a drain's or join's step boundary failed
  kCoordinatorRestart,  // a restarted coordinator resumed the job from its store
  kReplanRefused,       // a boundary's re-plan refused for memory, or refused its
                        // joining workers and too few are left without them, or
                        // a worker new to the plan failed to start its stage
};

inline constexpr RecoveryKind kAllRecoveryKinds[] = {
    RecoveryKind::kWorkerLost,         RecoveryKind::kPeerFailure,
    RecoveryKind::kCheckpointUnusable, RecoveryKind::kCheckpointFailed,
    RecoveryKind::kCoordinatorRestart, RecoveryKind::kReplanRefused,
};

// The label value: worker_lost, peer_failure, checkpoint_unusable,
// checkpoint_failed, coordinator_restart, replan_refused.
constexpr const char* RecoveryKindName(RecoveryKind kind) {
  switch (kind) {
    case RecoveryKind::kWorkerLost:
      return "worker_lost";
    case RecoveryKind::kPeerFailure:
      return "peer_failure";
    case RecoveryKind::kCheckpointUnusable:
      return "checkpoint_unusable";
    case RecoveryKind::kCheckpointFailed:
      return "checkpoint_failed";
    case RecoveryKind::kCoordinatorRestart:
      return "coordinator_restart";
    case RecoveryKind::kReplanRefused:
      return "replan_refused";
  }
  return "unknown";
}

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_RECOVERY_KIND_H_
