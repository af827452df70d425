#include "worker/collectives/tensor_parallel_comm.h"

namespace pipetrain {

void CollectivesTensorParallelComm::AllReduceSum(Tensor& data) {
  if (!status_.ok()) return;
  const absl::Time start = absl::Now();
  ++all_reduces_;
  bytes_ += data.size_bytes();
  // On the CPU backend `host` is `data` itself and the sum lands in place.
  Tensor host = backend_->Download(data);
  status_ = collectives_->AllReduce(iteration_, next_tag_++, host);
  if (status_.ok() && host.data() != data.data()) backend_->CopyFromHost(host, &data);
  seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
}

}  // namespace pipetrain
