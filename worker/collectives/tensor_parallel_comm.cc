#include "worker/collectives/tensor_parallel_comm.h"

namespace pipetrain {

void CollectivesTensorParallelComm::AllReduceSum(Tensor& data) {
  WaitAllReduce(StartAllReduceSum(data));
}

int CollectivesTensorParallelComm::StartAllReduceSum(Tensor& data) {
  const int ticket = next_ticket_++;
  auto pending = std::make_unique<Pending>();
  Pending* p = pending.get();
  pending_[ticket] = std::move(pending);
  if (!status_.ok()) {
    AnnotatedMutexLock lock(&mu_);
    p->status = status_;
    p->done = true;
    return ticket;
  }
  ++all_reduces_;
  bytes_ += data.size_bytes();
  p->target = data;
  // On the CPU backend `host` is `data` itself and the sum lands in place.
  p->host = backend_->Download(data);
  const int tag = next_tag_++;
  executor_->Post([this, p, tag, iteration = iteration_] {
    const absl::Time start = absl::Now();
    absl::Status status = absl::AbortedError("an earlier tensor-parallel all-reduce failed");
    if (!failed_.load()) {
      status = collectives_->AllReduce(iteration, tag, p->host);
      if (!status.ok()) failed_.store(true);
    }
    AnnotatedMutexLock lock(&mu_);
    p->status = std::move(status);
    p->seconds = absl::ToDoubleSeconds(absl::Now() - start);
    p->done = true;
  });
  return ticket;
}

void CollectivesTensorParallelComm::WaitAllReduce(int ticket) {
  auto it = pending_.find(ticket);
  if (it == pending_.end()) return;
  Pending& p = *it->second;
  const absl::Time start = absl::Now();
  {
    AnnotatedMutexLock lock(&mu_);
    mu_.AwaitWithTimeout([&p] { return p.done; }, absl::InfiniteDuration());
  }
  waited_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
  seconds_ += p.seconds;
  if (!p.status.ok()) {
    // The first failure sticks (an ABORTED follower only if nothing came first).
    if (status_.ok()) status_ = p.status;
  } else if (status_.ok() && p.host.data() != p.target.data()) {
    backend_->CopyFromHost(p.host, &p.target);
  }
  pending_.erase(it);
}

}  // namespace pipetrain
