// CheckpointWriter: writes a stage's checkpoints off the training thread.
//
// The runner snapshots its units to the host between two iterations (the
// only part on the critical path) and Submits the snapshot; a thread of the
// writer writes the files (unit_checkpoint.h) and calls `done` with what it
// wrote, or the error. Submit waits for the previous write to end first,
// so a disk slower than the checkpoint interval slows training rather than
// filling memory; a caller that Waits before taking its next snapshot (the
// job runner does) holds one snapshot at a time, not two.
//
// Thread-safe; `done` runs on the writer's thread, one call at a time.
#ifndef PIPETRAIN_WORKER_CHECKPOINT_CHECKPOINT_WRITER_H_
#define PIPETRAIN_WORKER_CHECKPOINT_CHECKPOINT_WRITER_H_

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/annotated_mutex.h"
#include "worker/checkpoint/checkpoint_hold.h"
#include "worker/checkpoint/unit_checkpoint.h"

namespace pipetrain {

class CheckpointWriter {
 public:
  using Done = std::function<void(int64_t step, double write_seconds,
                                  const absl::StatusOr<std::vector<v1::UnitFile>>& files)>;

  // `hold`: a test's (checkpoint_hold.h); a write it claims never ends.
  // `stopped` (may be empty): once true, a write in progress ends after its
  // current unit file, CANCELLED (WriteStageCheckpoint), so a stopped
  // stage's STOP and its job's recovery do not wait for a write nobody
  // takes, nor does it leave files in an ended job's swept directories.
  CheckpointWriter(std::string root, std::string dir, CheckpointIdentity identity, Done done,
                   CheckpointHold hold = {}, std::function<bool()> stopped = nullptr);
  ~CheckpointWriter();  // Wait()
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void Submit(StageSnapshot snapshot);
  // Returns once every submitted snapshot is written (or failed).
  void Wait();

 private:
  const std::string root_;
  const std::string dir_;
  const CheckpointIdentity identity_;
  const Done done_;
  const CheckpointHold hold_;
  const std::function<bool()> stopped_;
  AnnotatedMutex mu_;  // serialises Submit and Wait
  std::thread writing_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_CHECKPOINT_CHECKPOINT_WRITER_H_
