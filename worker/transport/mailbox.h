// Mailbox: where received tensors wait until the program asks for them.
// It holds WireTensors as they arrived (raw or encoded); decoding is the
// receiver's (Transport::Recv).
//
// Keyed by (source stage, tensor address). Put never blocks; Take blocks
// until the tensor is there, the timeout passes (DEADLINE_EXCEEDED naming
// the source and tensor) or Shutdown is called (ABORTED). A second Put of
// the same key before it is taken is FAILED_PRECONDITION (a duplicate frame
// or a program bug). Thread-safe.
#ifndef PIPETRAIN_WORKER_TRANSPORT_MAILBOX_H_
#define PIPETRAIN_WORKER_TRANSPORT_MAILBOX_H_

#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "common/annotated_mutex.h"
#include "worker/transport/transport.h"

namespace pipetrain {

class Mailbox {
 public:
  // Stores `wire` under (source_stage, address). FAILED_PRECONDITION naming
  // the source and tensor if that key is already waiting.
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

 private:
  using Key = std::pair<int, TensorAddress>;
  mutable AnnotatedMutex mu_;
  std::map<Key, WireTensor> tensors_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> aborted_jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_MAILBOX_H_
