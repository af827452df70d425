#include "worker/model/nccl_device_collective.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/nccl_comm.h"
#include "kernels/cuda/stream.h"
#include "worker/model/nccl_abort_flag.h"

namespace pipetrain {
namespace {

// A sum queued and not yet ordered before the compute stream's later work:
// the flat block it used (empty for an in-place sum) and the event after it.
struct Pending {
  Tensor flat;
  // Handles on the caller's tensors: the sum writes into them (in place
  // for one, copied back out of `flat` for more) after AllReduceSum has
  // returned, so their storage must not go back to the allocator's cache,
  // and be handed to compute work, before the sum is done.
  std::vector<Tensor> summed;
  CudaEvent done;
};

class NcclDeviceCollective final : public DeviceCollective {
 public:
  NcclDeviceCollective(int rank, int device, cudaStream_t compute,
                       std::function<Tensor(const Shape&)> allocate, NcclComm comm,
                       CudaStream stream, absl::Duration drain_timeout)
      : rank_(rank),
        device_(device),
        compute_(compute),
        allocate_(std::move(allocate)),
        drain_timeout_(drain_timeout),
        aborted_(absl::StrCat("replica collective of member ", rank)),
        comm_(std::move(comm)),
        stream_(std::move(stream)) {}

  ~NcclDeviceCollective() override {
    // Sums still under way read and write blocks that pending_ keeps: wait
    // for them (a member that stopped with a sum unmatched never ends it:
    // past drain_timeout_ the communicator is aborted, ending its kernels).
    cudaSetDevice(device_);
    if (!DrainNcclStreams({stream_.get()}, drain_timeout_, "replica collective teardown")) {
      Abort();
    }
    stream_.Synchronize().IgnoreError();
    pending_.clear();
    kept_until_teardown_.clear();
  }

  absl::Status AllReduceSum(const std::vector<Tensor*>& tensors) override {
    int64_t total = 0;
    for (const Tensor* t : tensors) {
      if (t == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("replica collective of member ", rank_, ": a null tensor"));
      }
      total += t->numel();
    }
    if (total == 0) return aborted_.Check();
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    // The block is taken before mu_ (an allocation may wait for the whole
    // device, and Abort must never wait behind it; nccl_device_channel.cc).
    Tensor flat;
    if (tensors.size() > 1) {
      flat = allocate_({total});
      if (flat.data() == nullptr) {
        return absl::InternalError(
            absl::StrCat("replica collective: no device memory for ", total, " floats"));
      }
    }
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(aborted_.Check());
    RETURN_IF_ERROR(StreamWaitsFor(stream_.get(), compute_));
    float* buffer = tensors.size() > 1 ? flat.data() : tensors[0]->data();
    // From the first copy on the stream may touch the tensors and the block
    // even if a call below fails: the block is then kept until teardown.
    absl::Status queued = Copy(tensors, buffer, /*into_flat=*/true);
    if (queued.ok()) {
      queued = comm_.AllReduceSum(buffer, buffer, total, stream_.get(), aborted_.UntilSet());
    }
    if (queued.ok()) queued = Copy(tensors, buffer, /*into_flat=*/false);
    absl::StatusOr<CudaEvent> done = queued.ok() ? CudaEvent::Create() : queued;
    if (done.ok()) queued = done->Record(stream_.get());
    std::vector<Tensor> summed;
    summed.reserve(tensors.size());
    for (const Tensor* t : tensors) summed.push_back(*t);
    if (!done.ok() || !queued.ok()) {
      kept_until_teardown_.push_back(flat);
      for (Tensor& t : summed) kept_until_teardown_.push_back(std::move(t));
      return done.ok() ? queued : done.status();
    }
    pending_.push_back({std::move(flat), std::move(summed), *std::move(done)});
    return absl::OkStatus();
  }

  absl::Status AwaitSums() override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(aborted_.Check());
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    for (Pending& p : pending_) RETURN_IF_ERROR(p.done.StreamWait(compute_));
    // The compute stream now waits for every sum: its later work may reuse
    // the blocks.
    pending_.clear();
    return absl::OkStatus();
  }

  absl::Status Flush(absl::Duration timeout, const std::function<bool()>& cancelled) override {
    // Without mu_ (Abort must not wait behind a flush); the stream outlives
    // an abort, which makes its kernels end.
    return aborted_.Flush({stream_.get()}, timeout, cancelled, "replica collective flush");
  }

  void Abort() override {
    // The flag first: a sum waiting inside NCCL under mu_ sees it and
    // returns, so the lock below cannot wait for a peer.
    const bool again = aborted_.Set();
    absl::MutexLock lock(&mu_);
    if (again) return;
    NcclComm::AbortAll({&comm_});
  }

 private:
  // The tensors into the flat block, or back out of it, on the sum's
  // stream; nothing for one tensor (summed in place).
  absl::Status Copy(const std::vector<Tensor*>& tensors, float* flat, bool into_flat) {
    if (tensors.size() == 1) return absl::OkStatus();
    int64_t offset = 0;
    for (Tensor* t : tensors) {
      const size_t bytes = static_cast<size_t>(t->numel()) * sizeof(float);
      float* in_flat = flat + offset;
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(into_flat ? in_flat : t->data(),
                                           into_flat ? t->data() : in_flat, bytes,
                                           cudaMemcpyDeviceToDevice, stream_.get()));
      offset += t->numel();
    }
    return absl::OkStatus();
  }

  const int rank_;
  const int device_;
  const cudaStream_t compute_;
  const std::function<Tensor(const Shape&)> allocate_;
  const absl::Duration drain_timeout_;
  NcclAbortFlag aborted_;  // set first by Abort, which then takes mu_
  // The job thread's calls against Abort from another thread: the
  // communicator is used and aborted under it.
  absl::Mutex mu_;
  NcclComm comm_;
  CudaStream stream_;
  std::vector<Pending> pending_;             // the job thread's
  std::vector<Tensor> kept_until_teardown_;  // blocks and tensors a failed sum may still use
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCollective>> CreateNcclDeviceCollective(
    const DeviceCollectiveSpec& spec, int device, cudaStream_t compute,
    std::function<Tensor(const Shape&)> allocate) {
  RETURN_IF_ERROR(CheckDeviceCollectiveSpec(spec));
  ASSIGN_OR_RETURN(const NcclUniqueId id, NcclUniqueId::FromBytes(spec.id));
  const NcclJoinLimits limits{spec.join_deadline, spec.join_cancelled};
  ASSIGN_OR_RETURN(NcclComm comm, NcclComm::Create(id, spec.members, spec.rank, device, limits));
  // The warm-up float outlives a sum left behind by a failed warm-up (it is
  // freed after the communicator is aborted).
  DeviceBuffer<float> one;
  CudaStream stream;
  absl::Status status = [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    ASSIGN_OR_RETURN(one, DeviceBuffer<float>::Create(1));
    CUDA_RETURN_IF_ERROR(cudaMemset(one.data(), 0, sizeof(float)));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));  // the memset's stream
    ASSIGN_OR_RETURN(stream, CudaStream::Create());
    // NCCL connects the members at their first collective, which needs
    // them all: here, within the join's limits.
    RETURN_IF_ERROR(comm.AllReduceSum(one.data(), one.data(), 1, stream.get(), limits));
    return AwaitCudaStreams({stream.get()}, limits, "replica group warm-up sum");
  }();
  if (!status.ok()) {
    NcclComm::AbortAll({&comm});
    return status;
  }
  return std::unique_ptr<DeviceCollective>(
      new NcclDeviceCollective(spec.rank, device, compute, std::move(allocate), std::move(comm),
                               std::move(stream), spec.drain_timeout));
}

}  // namespace pipetrain
