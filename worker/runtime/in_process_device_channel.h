// InProcessDeviceHub: DeviceChannels (worker/model/device_channel.h) between
// stages running in one process on the CPU backend, for tests of the
// LINK_PATH_DEVICE paths without a GPU (one GPU cannot hold an NCCL
// communicator of two ranks). It keeps the channel's contract that matters
// to the runtime: per (sender, receiver) pair a FIFO matched in issue order,
// the receiver naming the shape. Sends are buffered (NCCL's wait for the
// matching receive is not modelled); a channel's Flush waits until its
// stage's buffered sends have been taken.
//
//   InProcessDeviceHub hub(/*num_stages=*/4);
//   std::unique_ptr<DeviceChannel> ch0 = hub.ChannelFor(0);
//   ... ch0->Send(1, t);   // on stage 1's thread: hub.ChannelFor(1)->Recv(0, shape)
//
// Thread-safe (one channel per stage thread); the hub must outlive its
// channels.
#ifndef PIPETRAIN_WORKER_RUNTIME_IN_PROCESS_DEVICE_CHANNEL_H_
#define PIPETRAIN_WORKER_RUNTIME_IN_PROCESS_DEVICE_CHANNEL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "worker/model/device_channel.h"

namespace pipetrain {

class InProcessDeviceHub {
 public:
  // A Recv waits up to `recv_timeout` (then DEADLINE_EXCEEDED naming the
  // pair), so a test whose programs disagree fails instead of hanging.
  explicit InProcessDeviceHub(int num_stages, absl::Duration recv_timeout = absl::Seconds(60));

  // The channel of `stage` (0 <= stage < num_stages).
  std::unique_ptr<DeviceChannel> ChannelFor(int stage);

  // Tensors sent so far, and those sent but not yet received.
  int64_t sent() const;
  int64_t in_flight() const;
  // Whether Abort was called.
  bool aborted() const;

  // Waits until every tensor stage `from` sent has been taken (a channel's
  // Flush): OK; ABORTED after Abort; DEADLINE_EXCEEDED after `timeout`,
  // naming how many are left; CANCELLED once `cancelled` (may be null;
  // asked every 10 ms) says so.
  absl::Status Drain(int from, absl::Duration timeout, const std::function<bool()>& cancelled);

  // What every channel's Abort does (one process, one hub): waiting and
  // later transfers of every stage fail with ABORTED.
  void Abort();

 private:
  friend class InProcessDeviceChannel;

  absl::Status Put(int from, int to, const Tensor& t);
  absl::StatusOr<Tensor> Take(int from, int to, const Shape& shape);
  int64_t PendingFromLocked(int from) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int num_stages_;
  const absl::Duration recv_timeout_;
  mutable AnnotatedMutex mu_;
  std::map<std::pair<int, int>, std::deque<Tensor>> queues_ ABSL_GUARDED_BY(mu_);
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_RUNTIME_IN_PROCESS_DEVICE_CHANNEL_H_
