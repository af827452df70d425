#include "worker/model/nccl_device_channel.h"

#include <atomic>
#include <deque>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/nccl_comm.h"
#include "kernels/cuda/stream.h"

namespace pipetrain {
namespace {

// This stage's end of one link: the link's two-rank communicator (rank 0 is
// the lower stage) and the stream its operations run on here.
struct LinkEnd {
  NcclComm comm;
  CudaStream stream;
  int peer_rank = 0;  // the other end's rank in `comm`
};

// A sent tensor held until the event after its send completes.
struct InFlight {
  Tensor tensor;
  CudaEvent sent;
};

class NcclDeviceChannel final : public DeviceChannel {
 public:
  NcclDeviceChannel(int stage, int device, cudaStream_t compute,
                    std::function<Tensor(const Shape&)> allocate,
                    std::map<int, LinkEnd> sends_to, std::map<int, LinkEnd> receives_from)
      : stage_(stage),
        device_(device),
        compute_(compute),
        allocate_(std::move(allocate)),
        sends_to_(std::move(sends_to)),
        receives_from_(std::move(receives_from)) {}

  ~NcclDeviceChannel() override {
    // Sends still in flight read tensors that in_flight_ keeps: wait for
    // them before those blocks can be handed out again (after an abort the
    // kernels have ended, so this does not wait for a peer).
    cudaSetDevice(device_);
    ForEachEnd([](LinkEnd& end) { end.stream.Synchronize().IgnoreError(); });
    in_flight_.clear();
    if (aborted_.load()) {
      // ncclCommAbort freed them: the handles must not destroy them again.
      ForEachEnd([](LinkEnd& end) { end.comm.Release(); });
    }
  }

  void Abort() override {
    if (aborted_.exchange(true)) return;
    // The raw handles, read while the job thread may be in Send or Recv:
    // they never change after construction, and aborting from another
    // thread is how NCCL ends an operation that hangs.
    ForEachEnd([](LinkEnd& end) {
      if (end.comm.get() != nullptr) ncclCommAbort(end.comm.get());
    });
  }

  absl::Status Send(int peer_stage, const Tensor& t) override {
    RETURN_IF_ERROR(CheckNotAborted());
    ASSIGN_OR_RETURN(LinkEnd * end, Find(sends_to_, peer_stage, "to"));
    RETURN_IF_ERROR(Prune());
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    RETURN_IF_ERROR(StreamWaitsForCompute(end->stream.get()));
    RETURN_IF_ERROR(end->comm.Send(t.data(), t.numel(), end->peer_rank, end->stream.get()));
    ASSIGN_OR_RETURN(CudaEvent sent, CudaEvent::Create());
    RETURN_IF_ERROR(sent.Record(end->stream.get()));
    in_flight_.push_back({t, std::move(sent)});
    return absl::OkStatus();
  }

  absl::StatusOr<Tensor> Recv(int peer_stage, const Shape& shape) override {
    RETURN_IF_ERROR(CheckNotAborted());
    ASSIGN_OR_RETURN(LinkEnd * end, Find(receives_from_, peer_stage, "from"));
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    Tensor t = allocate_(shape);
    if (t.numel() > 0 && t.data() == nullptr) {
      return absl::InternalError(absl::StrCat("device channel: no device memory for ",
                                              ShapeToString(shape), " from stage ", peer_stage));
    }
    // The block's earlier users ran on the compute stream: the receive
    // waits for them before it overwrites it.
    RETURN_IF_ERROR(StreamWaitsForCompute(end->stream.get()));
    RETURN_IF_ERROR(end->comm.Recv(t.data(), t.numel(), end->peer_rank, end->stream.get()));
    ASSIGN_OR_RETURN(CudaEvent arrived, CudaEvent::Create());
    RETURN_IF_ERROR(arrived.Record(end->stream.get()));
    RETURN_IF_ERROR(arrived.StreamWait(compute_));
    return t;  // the event may go: a wait already queued keeps its capture
  }

 private:
  template <typename Fn>
  void ForEachEnd(Fn fn) {
    for (auto* ends : {&sends_to_, &receives_from_}) {
      for (auto& [peer, end] : *ends) fn(end);
    }
  }

  absl::Status CheckNotAborted() const {
    if (!aborted_.load()) return absl::OkStatus();
    return absl::AbortedError(
        absl::StrCat("device channel of stage ", stage_, " was aborted (the job stopped)"));
  }

  absl::StatusOr<LinkEnd*> Find(std::map<int, LinkEnd>& ends, int peer_stage, const char* dir) {
    auto it = ends.find(peer_stage);
    if (it == ends.end()) {
      return absl::InvalidArgumentError(absl::StrCat("device channel of stage ", stage_,
                                                     ": its group has no link ", dir, " stage ",
                                                     peer_stage));
    }
    return &it->second;
  }

  absl::Status StreamWaitsForCompute(cudaStream_t stream) {
    ASSIGN_OR_RETURN(CudaEvent ready, CudaEvent::Create());
    RETURN_IF_ERROR(ready.Record(compute_));
    return ready.StreamWait(stream);
  }

  // Drops the sent tensors whose sends have completed (links progress
  // independently, so every entry is asked).
  absl::Status Prune() {
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      ASSIGN_OR_RETURN(const bool done, it->sent.Query());
      it = done ? in_flight_.erase(it) : std::next(it);
    }
    return absl::OkStatus();
  }

  const int stage_;
  const int device_;
  const cudaStream_t compute_;
  const std::function<Tensor(const Shape&)> allocate_;
  std::map<int, LinkEnd> sends_to_;       // by receiving stage
  std::map<int, LinkEnd> receives_from_;  // by sending stage
  std::deque<InFlight> in_flight_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceChannel>> CreateNcclDeviceChannel(
    const DeviceGroupSpec& group, int stage, int device, cudaStream_t compute,
    std::function<Tensor(const Shape&)> allocate) {
  ASSIGN_OR_RETURN(const int rank, DeviceGroupRank(group, stage));
  ASSIGN_OR_RETURN(const NcclUniqueId id, NcclUniqueId::FromBytes(group.id));
  ASSIGN_OR_RETURN(NcclComm whole,
                   NcclComm::Create(id, static_cast<int>(group.stages.size()), rank, device,
                                    NcclJoinLimits{group.join_deadline, group.join_cancelled}));
  std::map<int, LinkEnd> sends_to, receives_from;
  for (size_t l = 0; l < group.links.size(); ++l) {
    const auto [from, to] = group.links[l];
    const bool mine = from == stage || to == stage;
    // Every member splits once per link, in the group's order; the link's
    // two ends get a communicator of their own, ranked by stage.
    ASSIGN_OR_RETURN(NcclComm part, whole.Split(mine ? static_cast<int>(l) : NcclComm::kNoColor,
                                                /*key=*/stage));
    if (!mine) continue;
    LinkEnd end;
    end.comm = std::move(part);
    end.peer_rank = 1 - end.comm.rank();
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    ASSIGN_OR_RETURN(end.stream, CudaStream::Create());
    (from == stage ? sends_to[to] : receives_from[from]) = std::move(end);
  }
  RETURN_IF_ERROR(whole.Destroy());
  return std::unique_ptr<DeviceChannel>(new NcclDeviceChannel(
      stage, device, compute, std::move(allocate), std::move(sends_to), std::move(receives_from)));
}

}  // namespace pipetrain
