#include "worker/model/nccl_device_channel.h"

#include <deque>
#include <map>
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
                    std::function<Tensor(const Shape&)> allocate, std::map<int, LinkEnd> sends_to,
                    std::map<int, LinkEnd> receives_from, absl::Duration drain_timeout)
      : stage_(stage),
        device_(device),
        compute_(compute),
        allocate_(std::move(allocate)),
        drain_timeout_(drain_timeout),
        aborted_(absl::StrCat("device channel of stage ", stage)),
        sends_to_(std::move(sends_to)),
        receives_from_(std::move(receives_from)) {}

  ~NcclDeviceChannel() override {
    // Sends still in flight read tensors that in_flight_ keeps: wait for
    // them before those blocks can be handed out again. A peer that stopped
    // with one of our sends unmatched would make that wait endless: past
    // drain_timeout_ the links are aborted, which ends their kernels.
    cudaSetDevice(device_);
    if (!DrainNcclStreams(Streams(), drain_timeout_, "device channel teardown")) Abort();
    ForEachEnd([](LinkEnd& end) { end.stream.Synchronize().IgnoreError(); });
    in_flight_.clear();
    kept_until_teardown_.clear();
    // The communicators are destroyed by their handles (empty if aborted).
  }

  absl::Status Flush(absl::Duration timeout, const std::function<bool()>& cancelled) override {
    // Without mu_ (Abort must not wait behind a flush); the streams outlive
    // an abort, which makes their kernels end.
    return aborted_.Flush(Streams(), timeout, cancelled, "device channel flush");
  }

  void Abort() override {
    // First the flag: a Send or Recv waiting inside NCCL under mu_ sees it
    // and returns, so the lock below cannot wait for a peer. A second
    // caller waits (on mu_) until the first has aborted everything.
    const bool again = aborted_.Set();
    absl::MutexLock lock(&mu_);
    if (again) return;
    // ncclCommAbort frees a communicator: no NCCL call of the job thread
    // may be under way (mu_), and none comes after (aborted_, checked under
    // mu_; the handles are empty from here).
    std::vector<NcclComm*> comms;
    ForEachEnd([&comms](LinkEnd& end) { comms.push_back(&end.comm); });
    NcclComm::AbortAll(comms);
  }

  absl::Status Send(int peer_stage, const Tensor& t) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(aborted_.Check());
    ASSIGN_OR_RETURN(LinkEnd * end, Find(sends_to_, peer_stage, "to"));
    RETURN_IF_ERROR(Prune());
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    RETURN_IF_ERROR(StreamWaitsFor(end->stream.get(), compute_));
    // From here NCCL may have queued a read of t even if a call below
    // fails (a launch that gave up waiting, an event that could not be
    // made): t is then kept until teardown, which waits for the streams.
    absl::Status queued =
        end->comm.Send(t.data(), t.numel(), end->peer_rank, end->stream.get(), aborted_.UntilSet());
    absl::StatusOr<CudaEvent> sent = queued.ok() ? CudaEvent::Create() : queued;
    if (sent.ok()) queued = sent->Record(end->stream.get());
    if (!sent.ok() || !queued.ok()) {
      kept_until_teardown_.push_back(t);
      return sent.ok() ? queued : sent.status();
    }
    in_flight_.push_back({t, *std::move(sent)});
    return absl::OkStatus();
  }

  absl::StatusOr<Tensor> Recv(int peer_stage, const Shape& shape) override {
    // The block is taken before mu_: an allocation may wait for the whole
    // device (the cache's out-of-memory retry frees blocks with cudaFree),
    // a link kernel waiting for a dead peer included, and Abort, which
    // ends such kernels, must never wait behind it for mu_.
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    Tensor t = allocate_(shape);
    if (t.numel() > 0 && t.data() == nullptr) {
      return absl::InternalError(absl::StrCat("device channel: no device memory for ",
                                              ShapeToString(shape), " from stage ", peer_stage));
    }
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(aborted_.Check());
    ASSIGN_OR_RETURN(LinkEnd * end, Find(receives_from_, peer_stage, "from"));
    // The block's earlier users ran on the compute stream: the receive
    // waits for them before it overwrites it.
    RETURN_IF_ERROR(StreamWaitsFor(end->stream.get(), compute_));
    const absl::Status queued =
        end->comm.Recv(t.data(), t.numel(), end->peer_rank, end->stream.get(), aborted_.UntilSet());
    if (!queued.ok()) {
      // NCCL may have queued a write into t: not back to the cache before
      // teardown, which waits for the streams.
      kept_until_teardown_.push_back(t);
      return queued;
    }
    absl::StatusOr<CudaEvent> arrived = CudaEvent::Create();
    absl::Status ordered = arrived.ok() ? arrived->Record(end->stream.get()) : arrived.status();
    if (ordered.ok()) ordered = arrived->StreamWait(compute_);
    if (!ordered.ok()) {
      kept_until_teardown_.push_back(t);  // compute does not wait for the write
      return ordered;
    }
    return t;  // the event may go: a wait already queued keeps its capture
  }

 private:
  template <typename Fn>
  void ForEachEnd(Fn fn) {
    for (auto* ends : {&sends_to_, &receives_from_}) {
      for (auto& [peer, end] : *ends) fn(end);
    }
  }

  std::vector<cudaStream_t> Streams() {
    std::vector<cudaStream_t> streams;
    ForEachEnd([&streams](LinkEnd& end) { streams.push_back(end.stream.get()); });
    return streams;
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
  const absl::Duration drain_timeout_;
  // The links' NCCL calls wait out "in progress" until it is set (they
  // hold mu_, which Abort takes after setting it).
  NcclAbortFlag aborted_;
  // The job thread's Send and Recv against Abort from another thread: the
  // links' communicators (in the maps' LinkEnds) are used and aborted under
  // it. The maps themselves never change after construction.
  absl::Mutex mu_;
  std::map<int, LinkEnd> sends_to_;       // by receiving stage
  std::map<int, LinkEnd> receives_from_;  // by sending stage
  std::deque<InFlight> in_flight_;        // the job thread's
  // Tensors of a failed Send or Recv that NCCL may still read or write.
  std::vector<Tensor> kept_until_teardown_;  // the job thread's
};

// Every end's communicator and the group's, aborted together (see
// NcclComm::AbortAll): what a failed setup leaves, while the other members
// may still wait in a split or the warm-up with us.
absl::Status AbortSetup(const absl::Status& status, NcclComm* whole,
                        std::map<int, LinkEnd>* sends_to, std::map<int, LinkEnd>* receives_from) {
  std::vector<NcclComm*> comms = {whole};
  for (auto* ends : {sends_to, receives_from}) {
    for (auto& [peer, end] : *ends) comms.push_back(&end.comm);
  }
  NcclComm::AbortAll(comms);
  return status;
}

// NCCL connects a link's two ends at their first exchange, which needs both
// (and blocks a blocking communicator's caller until the peer comes): one
// float over every link, here, in the group's order on every member (so the
// lowest link not yet connected always has both its ends at it), within the
// join's limits. After it, a send cannot wait on the host for its peer.
// `one` holds two floats, zeroed, that outlive any transfer left behind by
// a failed warm-up (the caller frees them after aborting the links).
absl::Status WarmUpLinks(const DeviceGroupSpec& group, int stage, std::map<int, LinkEnd>& sends_to,
                         std::map<int, LinkEnd>& receives_from, const NcclJoinLimits& limits,
                         DeviceBuffer<float>& one) {
  std::vector<cudaStream_t> streams;
  for (const auto& [from, to] : group.links) {
    if (from == stage) {
      LinkEnd& end = sends_to.at(to);
      RETURN_IF_ERROR(end.comm.Send(one.data(), 1, end.peer_rank, end.stream.get(), limits));
      streams.push_back(end.stream.get());
    } else if (to == stage) {
      LinkEnd& end = receives_from.at(from);
      RETURN_IF_ERROR(end.comm.Recv(one.data() + 1, 1, end.peer_rank, end.stream.get(), limits));
      streams.push_back(end.stream.get());
    }
  }
  return AwaitCudaStreams(streams, limits, "device group warm-up exchange");
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceChannel>> CreateNcclDeviceChannel(
    const DeviceGroupSpec& group, int stage, int device, cudaStream_t compute,
    std::function<Tensor(const Shape&)> allocate) {
  ASSIGN_OR_RETURN(const int rank, DeviceGroupRank(group, stage));
  ASSIGN_OR_RETURN(const NcclUniqueId id, NcclUniqueId::FromBytes(group.id));
  const NcclJoinLimits limits{group.join_deadline, group.join_cancelled};
  ASSIGN_OR_RETURN(NcclComm whole, NcclComm::Create(id, static_cast<int>(group.stages.size()), rank,
                                                    device, limits));
  std::map<int, LinkEnd> sends_to, receives_from;
  for (size_t l = 0; l < group.links.size(); ++l) {
    const auto [from, to] = group.links[l];
    const bool mine = from == stage || to == stage;
    // Every member splits once per link, in the group's order; the link's
    // two ends get a communicator of their own, ranked by stage.
    absl::StatusOr<NcclComm> part =
        whole.Split(mine ? static_cast<int>(l) : NcclComm::kNoColor, /*key=*/stage, limits);
    if (!part.ok()) return AbortSetup(part.status(), &whole, &sends_to, &receives_from);
    if (!mine) continue;
    LinkEnd end;
    end.comm = *std::move(part);
    end.peer_rank = 1 - end.comm.rank();
    (from == stage ? sends_to[to] : receives_from[from]) = std::move(end);
  }
  // Streams once every split is done: failing here leaves no member inside
  // a split waiting for us. The warm-up's two floats ([0] sent, [1]
  // received into: a member with links both ways must not read and write
  // one float on two streams at once) are zeroed before any link stream
  // exists, and freed after the links are aborted if the warm-up fails.
  DeviceBuffer<float> one;
  absl::Status status = [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    ASSIGN_OR_RETURN(one, DeviceBuffer<float>::Create(2));
    CUDA_RETURN_IF_ERROR(cudaMemset(one.data(), 0, 2 * sizeof(float)));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));  // the memset's stream
    for (auto* ends : {&sends_to, &receives_from}) {
      for (auto& [peer, end] : *ends) {
        ASSIGN_OR_RETURN(end.stream, CudaStream::Create());
      }
    }
    return WarmUpLinks(group, stage, sends_to, receives_from, limits, one);
  }();
  if (!status.ok()) return AbortSetup(status, &whole, &sends_to, &receives_from);
  status = whole.Destroy();
  if (!status.ok()) return AbortSetup(status, &whole, &sends_to, &receives_from);
  return std::unique_ptr<DeviceChannel>(
      new NcclDeviceChannel(stage, device, compute, std::move(allocate), std::move(sends_to),
                            std::move(receives_from), group.drain_timeout));
}

}  // namespace pipetrain
