// Keeps a job's stored record (state.proto's StoredJob) within the
// store's value limit whatever the job's size.
//
// Each part of the record has its own bound (checkpoints at submit, plan
// history, loss history, drawings dropped), but not their sum: a job of a
// few thousand workers with a deep model, a long keep and re-plans could
// pass kMaxValueBytes after submit, and from then on every save of the job
// failed (retried each second, a Cancel answered UNAVAILABLE, a restart
// resuming the last state that saved). What a restart can do without goes
// first instead, and the save goes through.
#ifndef PIPETRAIN_COORDINATOR_JOBS_STORED_JOB_FIT_H_
#define PIPETRAIN_COORDINATOR_JOBS_STORED_JOB_FIT_H_

#include <cstddef>
#include <string>

#include "coordinator/store/state.pb.h"

namespace pipetrain {

// The most bytes a StoredJob may serialise to: the store's value limit
// less the seal's (coordinator_state.h).
size_t MaxStoredJobBytes();

// Sheds parts of `stored` while it serialises to more than `limit` bytes,
// in this order, each only as far as needed: the oldest half of
// job.progress.loss_history again and again (loss_history_start moves
// on, so every kept loss keeps its step), then job.plan_history from the
// oldest (the newest version stays), then job.progress.stage_times (the
// running plan's reports start afresh). Returns what it shed, for a log
// line ("" when `stored` fit as it was). A record still larger than
// `limit` after all of that is left so (its save fails naming the limit),
// and the line says so ("... is still N bytes, over L: its saves fail").
std::string FitStoredJob(size_t limit, store::StoredJob* stored);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_STORED_JOB_FIT_H_
