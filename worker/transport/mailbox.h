// Mailbox: where received tensors wait until the program asks for them.
// It holds WireTensors as they arrived (raw or encoded); decoding is the
// receiver's (Transport::Recv).
//
// Keyed by (source stage, tensor address). Put never blocks; Take blocks
// until the tensor is there, the timeout passes (DEADLINE_EXCEEDED naming
// the source and tensor) or Shutdown is called (ABORTED). A second Put of
// the same key before it is taken is FAILED_PRECONDITION (a duplicate frame
// or a program bug).
//
// Memory is bounded (docs/operations.md "Security"), so no peer can make a
// worker buffer without end:
//   - bytes: at most MailboxLimits::max_bytes of tensors (their wire bytes)
//     wait at once; a Put beyond it is RESOURCE_EXHAUSTED.
//   - run-ahead: once a job is opened (OpenJob), a tensor of an iteration
//     more than run_ahead_iterations past the job's current iteration (the
//     first iteration, or the latest one a Take asked for) is
//     RESOURCE_EXHAUSTED. Peers of a synchronous pipeline are never more
//     than one iteration ahead, so this refuses only floods.
// Admit answers the same question before a tensor's frames are assembled,
// so a refused tensor is never buffered at all.
//
// Thread-safe.
#ifndef PIPETRAIN_WORKER_TRANSPORT_MAILBOX_H_
#define PIPETRAIN_WORKER_TRANSPORT_MAILBOX_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "common/annotated_mutex.h"
#include "worker/transport/transport.h"

namespace pipetrain {

struct MailboxLimits {
  // Most bytes of tensors waiting at once, all jobs together (the worker's
  // --mailbox-limit). A GPipe stage may hold every micro-batch's activation
  // of an iteration; the default leaves room for large models.
  int64_t max_bytes = int64_t{4} << 30;
  // Iterations past the job's current one that frames may be for.
  int64_t run_ahead_iterations = 2;
};

class Mailbox {
 public:
  explicit Mailbox(MailboxLimits limits = {}) : limits_(limits) {}

  // The worker starts running `job_id` from `first_iteration`: the job's
  // current iteration for the run-ahead window, and it is no longer aborted
  // (AbortJob); other jobs' abort marks and tensors are forgotten (their
  // runners are gone), so the mailbox keeps no state for old jobs, and from
  // now on a tensor of any other job is refused (FAILED_PRECONDITION):
  // a worker runs one job, and a re-planned job is another data-plane job
  // (worker/agent/job_runner.h DataPlaneJobId), so a straggling frame of
  // the old plan can never be taken as one of the new.
  void OpenJob(const std::string& job_id, int64_t first_iteration);
  // OK when a tensor of `wire_bytes` for `address` would be accepted now;
  // RESOURCE_EXHAUSTED naming the limit otherwise.
  absl::Status Admit(const TensorAddress& address, int64_t wire_bytes) const;
  // Stores `wire` under (source_stage, address). FAILED_PRECONDITION naming
  // the source and tensor if that key is already waiting; RESOURCE_EXHAUSTED
  // as Admit.
  absl::Status Put(int source_stage, const TensorAddress& address, WireTensor wire);
  // Waits up to `timeout` for the key and removes it (see the file comment
  // for DEADLINE_EXCEEDED and ABORTED).
  absl::StatusOr<WireTensor> Take(int source_stage, const TensorAddress& address,
                                  absl::Duration timeout);
  // Wakes all waiters with ABORTED; later Takes fail at once.
  void Shutdown();
  // Drops every tensor of `job_id` (e.g. after a cancel).
  void DropJob(const std::string& job_id);
  // DropJob, and every current or later Take for `job_id` fails with
  // ABORTED: how a STOP interrupts a stage blocked in a receive.
  void AbortJob(const std::string& job_id);
  size_t size() const;
  // Wire bytes of the tensors waiting.
  int64_t bytes() const;

 private:
  using Key = std::pair<int, TensorAddress>;
  absl::Status AdmitLocked(const TensorAddress& address, int64_t wire_bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropJobLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MailboxLimits limits_;
  mutable AnnotatedMutex mu_;
  std::map<Key, WireTensor> tensors_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The opened job and its current iteration (OpenJob, then Take).
  std::string open_job_ ABSL_GUARDED_BY(mu_);
  int64_t current_iteration_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> aborted_jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_MAILBOX_H_
