// What the NCCL device channel and replica collective share about being
// aborted from another thread (nccl_device_channel.h,
// nccl_device_collective.h): the flag their NCCL calls' "in progress"
// waits end on, the ABORTED answer after it, and the host waits for their
// streams (a flush, the drain at teardown), which end with it too.
//
// Thread-safe: the job thread asks, the stopping thread sets.
#ifndef PIPETRAIN_WORKER_MODEL_NCCL_ABORT_FLAG_H_
#define PIPETRAIN_WORKER_MODEL_NCCL_ABORT_FLAG_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/cuda/nccl_comm.h"

namespace pipetrain {

class NcclAbortFlag {
 public:
  // `owner` names the object in the ABORTED message, e.g. "device channel
  // of stage 2".
  explicit NcclAbortFlag(std::string owner) : owner_(std::move(owner)) {}

  // Sets the flag; whether it was set already (a second Abort waits for
  // the first one's work instead of repeating it).
  bool Set() { return aborted_.exchange(true); }
  bool is_set() const { return aborted_.load(); }

  // OK, or ABORTED "<owner> was aborted (the job stopped)" once set.
  absl::Status Check() const;

  // For NCCL calls on a non-blocking communicator: "in progress" is waited
  // out until the flag is set.
  NcclJoinLimits UntilSet() const;

  // A flush: waits on the host until `streams`' queued work is done:
  // ABORTED once the flag is set (before or while waiting),
  // DEADLINE_EXCEEDED after `timeout`, CANCELLED once `cancelled` (may be
  // null) says so; `what` names the wait.
  absl::Status Flush(const std::vector<cudaStream_t>& streams, absl::Duration timeout,
                     const std::function<bool()>& cancelled, const std::string& what) const;

 private:
  const std::string owner_;
  std::atomic<bool> aborted_{false};
};

// The drain at teardown: waits for `streams` up to `timeout` (the work of
// a peer that stopped with ours unmatched never ends); false when it gave
// up, after which the caller aborts its communicators.
bool DrainNcclStreams(const std::vector<cudaStream_t>& streams, absl::Duration timeout,
                      const std::string& what);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_NCCL_ABORT_FLAG_H_
