#include "worker/checkpoint/checkpoint_writer.h"

#include <unistd.h>

#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/logging.h"

namespace pipetrain {

CheckpointWriter::CheckpointWriter(std::string root, std::string dir, CheckpointIdentity identity,
                                   Done done, CheckpointHold hold, std::function<bool()> stopped)
    : root_(std::move(root)),
      dir_(std::move(dir)),
      identity_(std::move(identity)),
      done_(std::move(done)),
      hold_(std::move(hold)),
      stopped_(std::move(stopped)) {}

CheckpointWriter::~CheckpointWriter() { Wait(); }

void CheckpointWriter::Submit(StageSnapshot snapshot) {
  AnnotatedMutexLock lock(&mu_);
  if (writing_.joinable()) writing_.join();
  writing_ = std::thread([this, snapshot = std::move(snapshot)] {
    if (ClaimCheckpointHold(hold_, snapshot)) {
      PT_LOG(WARNING) << "--test-hold-checkpoint: the write of checkpoint " << snapshot.step
                      << " waits until this process ends";
      for (;;) pause();  // returns after each signal handled
    }
    const absl::Time start = MonotonicClock()->Now();
    absl::StatusOr<std::vector<v1::UnitFile>> files =
        WriteStageCheckpoint(root_, dir_, snapshot, identity_, stopped_);
    done_(snapshot.step, absl::ToDoubleSeconds(MonotonicClock()->Now() - start), files);
  });
}

void CheckpointWriter::Wait() {
  AnnotatedMutexLock lock(&mu_);
  if (writing_.joinable()) writing_.join();
}

}  // namespace pipetrain
