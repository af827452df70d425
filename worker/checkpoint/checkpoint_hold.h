// A test's hold on one checkpoint write: how a multi-process test leaves a
// checkpoint that every stage but one completed, deterministically
// (tests/elastic_cluster_test.cc, KilledWhileACheckpointIsWritten).
//
// A worker started with --test-hold-checkpoint=STEP:UNIT:MARKER (every
// worker of the test's cluster may have it) holds the write of checkpoint
// STEP by the stage holding UNIT: that writer first creates the file
// MARKER (O_EXCL, so one process of all that have the flag claims it,
// and a re-planned stage holding UNIT later writes as usual), writes its
// pid and its stage's units into it, then never writes the checkpoint:
// its writer thread waits until the process ends. The stage's training
// goes on until its next checkpoint waits for this one
// (CheckpointWriter::Submit), so the other stages finish theirs; the test
// then kills the process, which never reported STEP.
// Without the flag (every production run) nothing is held.
// Thread-safe (pure functions but for the marker file).
#ifndef PIPETRAIN_WORKER_CHECKPOINT_CHECKPOINT_HOLD_H_
#define PIPETRAIN_WORKER_CHECKPOINT_CHECKPOINT_HOLD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/checkpoint/unit_checkpoint.h"

namespace pipetrain {

struct CheckpointHold {
  int64_t step = 0;  // 0: hold nothing
  int unit = 0;
  std::string marker;  // an absolute path
};

// "STEP:UNIT:MARKER" (STEP >= 1, UNIT >= 0, MARKER an absolute path) or ""
// (no hold). INVALID_ARGUMENT naming `flag` and the expected form.
absl::StatusOr<CheckpointHold> ParseCheckpointHold(const std::string& flag,
                                                   const std::string& value);

// Whether the write of `snapshot` is the one `hold` holds: its step and a
// unit match, and this call created hold.marker, whole at once: "<pid>\n"
// and the snapshot's units, space-separated, on a second line. A marker
// that exists already (another process claimed it) or cannot be created
// is false: the write goes on.
bool ClaimCheckpointHold(const CheckpointHold& hold, const StageSnapshot& snapshot);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_CHECKPOINT_CHECKPOINT_HOLD_H_
