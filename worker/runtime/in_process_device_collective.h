// InProcessCollectiveHub: DeviceCollectives (worker/model/
// device_collective.h) between the replicas of one stage running in one
// process on the CPU backend, for tests of the data-parallel device path
// without GPUs (NCCL needs a GPU per member). Each AllReduceSum waits for
// every member's call of the same sequence number and sums the members'
// tensors in member order (((m0 + m1) + m2) ...), the order the gRPC
// collectives' AllReduceInMemberOrder uses, so every member gets bitwise
// the same floats. Sums are done when the call returns; AwaitSums has
// nothing to order.
//
//   InProcessCollectiveHub hub(/*members=*/2);
//   std::unique_ptr<DeviceCollective> r0 = hub.CollectiveFor(0);
//   ... r0->AllReduceSum({&g});   // on replica 1's thread: hub.CollectiveFor(1)->...
//
// Thread-safe (one collective per member thread); the hub must outlive its
// collectives.
#ifndef PIPETRAIN_WORKER_RUNTIME_IN_PROCESS_DEVICE_COLLECTIVE_H_
#define PIPETRAIN_WORKER_RUNTIME_IN_PROCESS_DEVICE_COLLECTIVE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "worker/model/device_collective.h"

namespace pipetrain {

class InProcessCollectiveHub {
 public:
  // A sum waits up to `timeout` for the other members (then
  // DEADLINE_EXCEEDED naming who is missing), so a test whose replicas
  // disagree fails instead of hanging.
  explicit InProcessCollectiveHub(int members, absl::Duration timeout = absl::Seconds(60));

  // Member `rank`'s collective (0 <= rank < members).
  std::unique_ptr<DeviceCollective> CollectiveFor(int rank);

  // Sums completed (counted once per sum, not per member), and the floats
  // they summed per member.
  int64_t sums() const;
  int64_t floats() const;
  bool aborted() const;
  // What every collective's Abort does: waiting and later sums fail with
  // ABORTED.
  void Abort();

 private:
  friend class InProcessDeviceCollective;

  // One sum of sequence number `seq`: the members' flattened tensors.
  struct Sum {
    std::vector<std::vector<float>> parts;
    int arrived = 0;
    int taken = 0;
    bool done = false;
    std::vector<float> total;
    absl::Status status;  // of the sum itself: counts that differ
  };

  // Member `rank`'s part of sum `seq`: returns the total once every
  // member's part is in.
  absl::Status Contribute(int rank, int64_t seq, const std::vector<Tensor*>& tensors);

  const int members_;
  const absl::Duration timeout_;
  mutable AnnotatedMutex mu_;
  std::map<int64_t, Sum> pending_ ABSL_GUARDED_BY(mu_);
  int64_t sums_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t floats_ ABSL_GUARDED_BY(mu_) = 0;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_RUNTIME_IN_PROCESS_DEVICE_COLLECTIVE_H_
