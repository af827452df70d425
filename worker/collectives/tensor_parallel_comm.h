// TensorParallelComm (worker/model/tensor_parallel.h) on Collectives: the
// all-reduces of a tensor-parallel unit group run over the data plane as
// deterministic ring / recursive-doubling all-reduces, so every rank gets
// bitwise the same sum.
//
// Message addressing: the collectives of one step are told apart by a tag
// that counts up from kTensorParallelTagBase, reset by BeginIteration: the
// ranks run the same units in the same order, so the n-th all-reduce of a
// step has the same tag on every rank. Tensors on a device backend cross
// to the host and back (the CPU backend's are summed in place).
//
// Overlap: StartAllReduceSum hands the sum to one background thread, which
// runs the group's all-reduces in Start order (the Collectives object is
// used by that thread only); the device copies stay on the caller's thread
// (at Start and at Wait). After a failed all-reduce the later ones are
// skipped; the error shows in status() once its ticket is waited for.
//
// Not thread-safe: the thread driving the units calls it.
#ifndef PIPETRAIN_WORKER_COLLECTIVES_TENSOR_PARALLEL_COMM_H_
#define PIPETRAIN_WORKER_COLLECTIVES_TENSOR_PARALLEL_COMM_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>

#include "common/annotated_mutex.h"
#include "common/serial_executor.h"
#include "worker/collectives/collectives.h"
#include "worker/model/backend.h"
#include "worker/model/tensor_parallel.h"

namespace pipetrain {

// Tags at and above this are the tensor-parallel group's (below: the data-
// parallel and loss collectives of stage_runtime.cc).
inline constexpr int kTensorParallelTagBase = 1 << 23;

class CollectivesTensorParallelComm : public TensorParallelComm {
 public:
  // `collectives` is the group in rank order (its rank() is this rank);
  // `backend` the units'. Both must outlive this.
  CollectivesTensorParallelComm(Collectives* collectives, Backend* backend)
      : collectives_(collectives), backend_(backend), status_(collectives->status()) {}

  // Starts step `iteration`'s collectives (tags from the base again), or
  // with `eval` those of the validation pass after step `iteration` (tags
  // of their own, so that they never meet the step's).
  void BeginIteration(int64_t iteration, bool eval = false) {
    iteration_ = iteration;
    next_tag_ = kTensorParallelTagBase + (eval ? kEvalTagOffset : 0);
  }

  int rank() const override { return collectives_->rank(); }
  int size() const override { return collectives_->size(); }
  void AllReduceSum(Tensor& data) override;
  absl::Status status() const override { return status_; }
  int StartAllReduceSum(Tensor& data) override;
  void WaitAllReduce(int ticket) override;
  // All-reduces run so far, the fp32 bytes they reduced and the seconds
  // they took (for the metrics and tests).
  int64_t all_reduces() const { return all_reduces_; }
  int64_t bytes() const { return bytes_; }
  double seconds() const { return seconds_; }
  // The time the caller spent blocked in WaitAllReduce (and so in
  // AllReduceSum): what the partitions did not hide behind compute. It
  // includes a queued all-reduce's wait for the background thread, so it
  // can exceed seconds().
  double waited_seconds() const { return waited_seconds_; }

 private:
  static constexpr int kEvalTagOffset = 1 << 22;

  // One started all-reduce. The background task sums `host` and then sets
  // status, seconds and done under mu_; the caller's Wait reads them (and
  // `host`) after seeing done under mu_, which orders the two threads (an
  // AnnotatedMutex, so that ThreadSanitizer sees it too).
  struct Pending {
    Tensor target;  // the caller's tensor
    Tensor host;    // its host copy (target itself on the CPU)
    absl::Status status;
    double seconds = 0;
    bool done = false;
  };

  Collectives* const collectives_;
  Backend* const backend_;
  absl::Status status_;
  int64_t iteration_ = 0;
  int next_tag_ = kTensorParallelTagBase;
  int64_t all_reduces_ = 0;
  int64_t bytes_ = 0;
  double seconds_ = 0;
  double waited_seconds_ = 0;
  int next_ticket_ = 0;
  std::map<int, std::unique_ptr<Pending>> pending_;  // by ticket
  std::atomic<bool> failed_{false};                  // a background all-reduce failed
  AnnotatedMutex mu_;  // guards each Pending's status, seconds and done
  // Last: destroyed first, running what is queued while pending_ exists.
  std::unique_ptr<SerialExecutor> executor_ = std::make_unique<SerialExecutor>();
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COLLECTIVES_TENSOR_PARALLEL_COMM_H_
