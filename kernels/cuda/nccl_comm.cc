#include "kernels/cuda/nccl_comm.h"

#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/nccl_status.h"

namespace pipetrain {
namespace {

// Runs fn() with `device` current on this thread and restores the previous
// device, so callers need not track which device NCCL calls switched to.
template <typename Fn>
absl::Status OnDevice(int device, Fn&& fn) {
  int previous = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
  if (previous != device) CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  absl::Status status = fn();
  if (previous != device) {
    const absl::Status restored =
        CudaStatus(cudaSetDevice(previous), "cudaSetDevice(previous)", __FILE__, __LINE__);
    if (status.ok()) status = restored;
  }
  return status;
}

// Restores the calling thread's current device on scope exit, for the
// teardown calls that must reach NCCL even when CUDA is already failing
// (so they cannot go through OnDevice's early returns).
class DeviceKeeper {
 public:
  DeviceKeeper() : saved_(cudaGetDevice(&device_) == cudaSuccess) {}
  DeviceKeeper(const DeviceKeeper&) = delete;
  DeviceKeeper& operator=(const DeviceKeeper&) = delete;
  // The error is dropped: a destructor cannot report it, and it can only
  // follow a sticky device error that the next checked call reports.
  ~DeviceKeeper() {
    if (saved_) cudaSetDevice(device_);
  }

 private:
  int device_ = 0;
  bool saved_;
};

absl::Status EmptyCommError(const char* method) {
  return absl::FailedPreconditionError(
      absl::StrCat("NcclComm::", method,
                   " on an empty communicator (default-constructed, moved-from, destroyed or "
                   "aborted); create one with NcclComm::Create()"));
}

absl::Status CheckCreateArgs(int nranks, int rank, int device) {
  if (nranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclComm::Create: nranks is ", nranks, "; a communicator needs >= 1 rank"));
  }
  if (rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclComm::Create: rank ", rank, " is outside [0, ", nranks, ")"));
  }
  if (device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("NcclComm::Create: device ", device,
                                                   " is negative; pass a CUDA device index"));
  }
  return absl::OkStatus();
}

// Where a non-blocking communicator's last call stands
// (ncclCommGetAsyncError), or the query's own failure.
ncclResult_t AsyncState(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
  return asked != ncclSuccess ? asked : state;
}

// A blocking init or split that fails after allocating hands the
// communicator back unfreed: aborts it (aborting does not wait for the
// other ranks) and returns `status` prefixed with `call`.
absl::Status AbortHalfMade(ncclComm_t comm, const absl::Status& status, const std::string& call) {
  if (comm != nullptr) {
    DeviceKeeper keeper;
    ncclCommAbort(comm);
  }
  return absl::Status(status.code(), absl::StrCat(call, ": ", status.message()));
}

}  // namespace

absl::Status PollWithinLimits(const std::function<absl::StatusOr<bool>()>& poll,
                              const NcclJoinLimits& limits, const std::string& what,
                              const std::string& pending) {
  while (true) {
    absl::StatusOr<bool> done = poll();
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
    if (MonotonicClock()->Now() > limits.deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": ", pending, " by the deadline"));
    }
    if (limits.cancelled != nullptr && limits.cancelled()) {
      return absl::CancelledError(absl::StrCat(what, ": cancelled (", pending, ")"));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

absl::Status AwaitCudaStreams(const std::vector<cudaStream_t>& streams,
                              const NcclJoinLimits& limits, const std::string& what) {
  return PollWithinLimits(
      [&]() -> absl::StatusOr<bool> {
        bool done = true;
        for (cudaStream_t stream : streams) {
          const cudaError_t state = cudaStreamQuery(stream);
          if (state == cudaErrorNotReady) {
            cudaGetLastError();  // not an error (CudaEvent::Query clears it too)
            done = false;
          } else {
            CUDA_RETURN_IF_ERROR(state);
          }
        }
        return done;
      },
      limits, what, "not done");
}

namespace nccl_internal {

absl::Status CheckBuffer(const char* op, const char* name, const void* buffer, int64_t count) {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": count ", count, " is negative"));
  }
  if (count > 0 && buffer == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " is null with count ", count, "; pass device memory"));
  }
  return absl::OkStatus();
}

absl::Status AwaitNccl(const std::function<ncclResult_t()>& state, const NcclJoinLimits& limits,
                       const std::string& what) {
  return PollWithinLimits(
      [&]() -> absl::StatusOr<bool> {
        const ncclResult_t result = state();
        if (result == ncclSuccess) return true;
        if (result == ncclInProgress) return false;
        return absl::InternalError(absl::StrCat(what, " failed: ", NcclResultName(result), " (",
                                                ncclGetErrorString(result), ")"));
      },
      limits, what, "not every rank joined");
}

absl::Status CheckPeer(const char* op, int peer, int nranks) {
  if (peer < 0 || peer >= nranks) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": peer ", peer, " is outside [0, ", nranks,
                                                   "), the ranks of this communicator"));
  }
  return absl::OkStatus();
}

}  // namespace nccl_internal

absl::StatusOr<std::string> NcclVersion() {
  int code = 0;
  NCCL_RETURN_IF_ERROR(ncclGetVersion(&code));
  return NcclVersionString(code);
}

bool NcclVersionAtLeast(int code, int major, int minor) {
  const int code_major = code >= 10000 ? code / 10000 : code / 1000;
  const int code_minor = code >= 10000 ? code % 10000 / 100 : code % 1000 / 100;
  return code_major != major ? code_major > major : code_minor >= minor;
}

namespace {

// `name`'s value in NCCL configuration file `path`, if the file exists and
// sets it. Read as NCCL reads these files: the name is everything before a
// line's first '=' and the value the rest of the line, nothing trimmed (a
// "# NAME=1" line names "# NAME"); the first line for a name wins.
std::optional<std::string> SettingInFile(const std::string& path, const std::string& name) {
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    const size_t equals = line.find('=');
    if (equals != std::string::npos && line.substr(0, equals) == name) {
      return line.substr(equals + 1);
    }
  }
  return std::nullopt;
}

// The user's home directory as NCCL finds it (the password database, not
// $HOME); getpwuid_r, as CheckNcclForDeviceGroups runs on more than one
// thread.
std::optional<std::string> HomeDirectory() {
  std::vector<char> buffer(16384);
  passwd entry;
  passwd* found = nullptr;
  if (getpwuid_r(getuid(), &entry, buffer.data(), buffer.size(), &found) != 0 || found == nullptr ||
      found->pw_dir == nullptr) {
    return std::nullopt;
  }
  return std::string(found->pw_dir);
}

}  // namespace

std::optional<std::string> NcclSetting(const std::string& name, const NcclConfFiles& files) {
  if (const char* value = std::getenv(name.c_str()); value != nullptr) return std::string(value);
  std::optional<std::string> user_file;
  const char* conf = std::getenv("NCCL_CONF_FILE");
  if (conf != nullptr && conf[0] != '\0') {  // NCCL ignores an empty NCCL_CONF_FILE
    user_file = conf;
  } else if (std::optional<std::string> home = files.home ? files.home : HomeDirectory()) {
    user_file = *home + "/.nccl.conf";
  }
  if (user_file.has_value()) {
    if (std::optional<std::string> v = SettingInFile(*user_file, name)) return v;
  }
  return SettingInFile(files.system_file, name);
}

bool NcclIntegerSettingNonZero(const std::string& value) {
  // NCCL parses integer settings with strtoll(value, NULL, 0), keeping its
  // default for an empty value or on a range error; a non-number reads 0.
  // INT_MIN is its "undefined" marker.
  if (value.empty()) return false;
  errno = 0;
  const long long parsed = std::strtoll(value.c_str(), nullptr, 0);
  if (errno != 0) return false;
  return parsed != 0 && parsed != std::numeric_limits<int>::min();
}

absl::Status CheckNcclForDeviceGroups() {
  int code = 0;
  NCCL_RETURN_IF_ERROR(ncclGetVersion(&code));
  if (!NcclVersionAtLeast(code, 2, 22)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL ", NcclVersionString(code),
        " is older than 2.22, whose grouped abort device groups need (a link whose peer "
        "died would keep the others from being aborted); use NCCL 2.22 or later"));
  }
  const std::optional<std::string> share = NcclSetting("NCCL_COMM_SPLIT_SHARE_RESOURCES");
  if (share.has_value() && NcclIntegerSettingNonZero(*share)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL_COMM_SPLIT_SHARE_RESOURCES=", *share,
        " would make a device group's links share one NCCL stream (a receive on one link could "
        "wait behind another link's send to a peer that waits for it); unset it"));
  }
  return absl::OkStatus();
}

std::string NcclVersionString(int code) {
  // NCCL_VERSION() switched from X*1000+Y*100+Z to X*10000+Y*100+Z at 2.9.
  if (code >= 10000) return absl::StrCat(code / 10000, ".", code % 10000 / 100, ".", code % 100);
  return absl::StrCat(code / 1000, ".", code % 1000 / 100, ".", code % 100);
}

absl::StatusOr<NcclUniqueId> NcclUniqueId::Create() {
  NcclUniqueId id;
  NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id.id_));
  return id;
}

absl::StatusOr<NcclUniqueId> NcclUniqueId::FromBytes(std::string_view bytes) {
  if (bytes.size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclUniqueId::FromBytes: got ", bytes.size(), " bytes, an NCCL unique id has exactly ",
        sizeof(ncclUniqueId), "; pass NcclUniqueId::ToBytes() unchanged"));
  }
  NcclUniqueId id;
  std::memcpy(id.id_.internal, bytes.data(), bytes.size());
  return id;
}

std::string NcclUniqueId::ToBytes() const {
  return std::string(id_.internal, sizeof(id_.internal));
}

absl::StatusOr<NcclComm> NcclComm::Create(const NcclUniqueId& id, int nranks, int rank, int device,
                                          const NcclJoinLimits& limits) {
  RETURN_IF_ERROR(CheckCreateArgs(nranks, rank, device));
  const std::string call =
      absl::StrCat("NcclComm::Create(rank ", rank, " of ", nranks, ", device ", device, ")");
  ncclComm_t comm = nullptr;
  const bool blocking = !limits.limited();
  const absl::Status status = OnDevice(device, [&]() -> absl::Status {
    if (blocking) {
      NCCL_RETURN_IF_ERROR(ncclCommInitRank(&comm, nranks, id.get(), rank));
      return absl::OkStatus();
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t started = ncclCommInitRankConfig(&comm, nranks, id.get(), rank, &config);
    if (started != ncclInProgress) NCCL_RETURN_IF_ERROR(started);
    return nccl_internal::AwaitNccl([&comm] { return AsyncState(comm); }, limits,
                                    "ncclCommInitRankConfig");
  });
  if (!status.ok()) return AbortHalfMade(comm, status, call);
  return NcclComm(comm, rank, nranks, device, blocking);
}

absl::StatusOr<NcclComm> NcclComm::Split(int color, int key, const NcclJoinLimits& limits) const {
  if (!valid()) return EmptyCommError("Split");
  // NCCL's split job writes the new communicator into this slot when it is
  // done, which may be after we stopped waiting: the slot lives on the heap.
  auto slot = std::make_unique<ncclComm_t>(nullptr);
  ncclComm_t& part = *slot;
  const bool part_blocking = !limits.limited();
  const absl::Status status = OnDevice(device_, [&]() -> absl::Status {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = part_blocking ? 1 : 0;
    // Each part its own resources (its own internal stream): shared, a
    // receive on one link would queue behind a send on another that waits
    // for its peer (nccl_device_channel.h: one stream per link). NCCL's
    // default, said here; NCCL_COMM_SPLIT_SHARE_RESOURCES overrides it,
    // which CheckNcclForDeviceGroups refuses.
    config.splitShare = 0;
    const ncclResult_t started =
        ncclCommSplit(comm_, color < 0 ? kNoColor : color, key, slot.get(), &config);
    // The split runs as a job of this communicator: waiting for it is
    // polling this one (`part` is set once it is done).
    RETURN_IF_ERROR(Finish(started, "ncclCommSplit", limits));
    // On a non-blocking parent NCCL 2.28 answers ncclSuccess while the job
    // still runs (ncclCommSplit passes on its own result, not the group's
    // ncclInProgress), so `part` may still be null here: wait for the
    // parent's state whatever the call returned. Seen on an H200: a null
    // part taken for "no color", and the job writing into the freed slot.
    if (!blocking_) {
      RETURN_IF_ERROR(
          nccl_internal::AwaitNccl([this] { return AsyncState(comm_); }, limits, "ncclCommSplit"));
    }
    if (part == nullptr) return absl::OkStatus();
    return nccl_internal::AwaitNccl([&part] { return AsyncState(part); }, limits, "ncclCommSplit");
  });
  const std::string call =
      absl::StrCat("NcclComm::Split(rank ", rank_, " of ", size_, ", color ", color, ")");
  if (!status.ok() && part == nullptr &&
      (absl::IsDeadlineExceeded(status) || absl::IsCancelled(status))) {
    // The split job still holds the slot; it ends when this communicator is
    // aborted, which then aborts what the job made.
    unfinished_splits_.push_back(std::move(slot));
    return absl::Status(status.code(), absl::StrCat(call, ": ", status.message()));
  }
  if (!status.ok()) return AbortHalfMade(part, status, call);
  if (part == nullptr) return NcclComm();  // kNoColor: in no part
  int rank = 0, size = 0;
  const absl::Status described = OnDevice(device_, [&]() -> absl::Status {
    NCCL_RETURN_IF_ERROR(ncclCommUserRank(part, &rank));
    NCCL_RETURN_IF_ERROR(ncclCommCount(part, &size));
    return absl::OkStatus();
  });
  NcclComm out(part, rank, size, device_, part_blocking);  // owns `part` from here, also on error
  RETURN_IF_ERROR(described);
  return out;
}

NcclComm::NcclComm(NcclComm&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)),
      rank_(std::exchange(other.rank_, 0)),
      size_(std::exchange(other.size_, 0)),
      device_(std::exchange(other.device_, -1)),
      blocking_(std::exchange(other.blocking_, true)),
      unfinished_splits_(std::move(other.unfinished_splits_)) {}

NcclComm& NcclComm::operator=(NcclComm&& other) noexcept {
  if (this != &other) {
    Destroy().IgnoreError();
    comm_ = std::exchange(other.comm_, nullptr);
    rank_ = std::exchange(other.rank_, 0);
    size_ = std::exchange(other.size_, 0);
    device_ = std::exchange(other.device_, -1);
    blocking_ = std::exchange(other.blocking_, true);
    unfinished_splits_ = std::move(other.unfinished_splits_);
  }
  return *this;
}

// A destructor cannot report the error; call Destroy() to see it.
NcclComm::~NcclComm() { Destroy().IgnoreError(); }

absl::Status NcclComm::AllReduceSum(const float* send, float* recv, int64_t count,
                                    cudaStream_t stream, const NcclJoinLimits& limits) {
  RETURN_IF_ERROR(nccl_internal::CheckBuffer("NcclComm::AllReduceSum", "send", send, count));
  RETURN_IF_ERROR(nccl_internal::CheckBuffer("NcclComm::AllReduceSum", "recv", recv, count));
  if (!valid()) return EmptyCommError("AllReduceSum");
  return OnDevice(device_, [&]() -> absl::Status {
    return Finish(
        ncclAllReduce(send, recv, static_cast<size_t>(count), ncclFloat32, ncclSum, comm_, stream),
        "ncclAllReduce", limits);
  });
}

absl::Status NcclComm::Send(const float* send, int64_t count, int peer, cudaStream_t stream,
                            const NcclJoinLimits& limits) {
  RETURN_IF_ERROR(nccl_internal::CheckBuffer("NcclComm::Send", "send", send, count));
  if (!valid()) return EmptyCommError("Send");
  RETURN_IF_ERROR(nccl_internal::CheckPeer("NcclComm::Send", peer, size_));
  return OnDevice(device_, [&]() -> absl::Status {
    return Finish(ncclSend(send, static_cast<size_t>(count), ncclFloat32, peer, comm_, stream),
                  "ncclSend", limits);
  });
}

absl::Status NcclComm::Recv(float* recv, int64_t count, int peer, cudaStream_t stream,
                            const NcclJoinLimits& limits) {
  RETURN_IF_ERROR(nccl_internal::CheckBuffer("NcclComm::Recv", "recv", recv, count));
  if (!valid()) return EmptyCommError("Recv");
  RETURN_IF_ERROR(nccl_internal::CheckPeer("NcclComm::Recv", peer, size_));
  return OnDevice(device_, [&]() -> absl::Status {
    return Finish(ncclRecv(recv, static_cast<size_t>(count), ncclFloat32, peer, comm_, stream),
                  "ncclRecv", limits);
  });
}

absl::Status NcclComm::Finish(ncclResult_t result, const char* call,
                              const NcclJoinLimits& limits) const {
  if (result == ncclSuccess) return absl::OkStatus();
  if (result != ncclInProgress || blocking_) {
    return NcclStatus(result, call, __FILE__, __LINE__);
  }
  return nccl_internal::AwaitNccl([this] { return AsyncState(comm_); }, limits, call);
}

absl::Status NcclComm::Destroy() {
  if (comm_ == nullptr) return absl::OkStatus();
  if (!unfinished_splits_.empty()) {
    Abort();
    return absl::AbortedError(
        "NcclComm::Destroy: a split was left unfinished; the communicator was aborted");
  }
  DeviceKeeper keeper;  // NCCL switches to the communicator's device
  if (!blocking_) {
    // A non-blocking communicator is finalized (and waited for) first.
    const absl::Status finalized = Finish(ncclCommFinalize(comm_), "ncclCommFinalize");
    if (!finalized.ok()) {
      Abort();
      return finalized;
    }
  }
  const ncclComm_t comm = std::exchange(comm_, nullptr);
  rank_ = 0;
  size_ = 0;
  device_ = -1;
  blocking_ = true;
  NCCL_RETURN_IF_ERROR(ncclCommDestroy(comm));
  return absl::OkStatus();
}

// The result is dropped: abort is the last resort, and there is nothing
// left to do with a communicator whose abort failed.
void NcclComm::Abort() {
  if (comm_ == nullptr) return;
  const ncclComm_t comm = std::exchange(comm_, nullptr);
  rank_ = 0;
  size_ = 0;
  device_ = -1;
  blocking_ = true;
  DeviceKeeper keeper;
  ncclCommAbort(comm);
  AbortUnfinishedSplits(std::move(unfinished_splits_));
  unfinished_splits_.clear();
}

void NcclComm::AbortUnfinishedSplits(std::vector<std::unique_ptr<ncclComm_t>> slots) {
  std::vector<ncclComm_t> made;
  for (const auto& slot : slots) {
    if (*slot != nullptr) made.push_back(*slot);
  }
  if (made.empty()) return;
  DeviceKeeper keeper;
  ncclGroupStart();
  for (ncclComm_t comm : made) ncclCommAbort(comm);
  ncclGroupEnd();
}

void NcclComm::AbortAll(const std::vector<NcclComm*>& comms) {
  std::vector<ncclComm_t> raw;
  std::vector<std::unique_ptr<ncclComm_t>> unfinished;
  for (NcclComm* comm : comms) {
    for (auto& slot : comm->unfinished_splits_) unfinished.push_back(std::move(slot));
    comm->unfinished_splits_.clear();
    if (comm->valid()) raw.push_back(comm->Release());
  }
  if (!raw.empty()) {
    DeviceKeeper keeper;  // each abort switches to its communicator's device
    // Results dropped, as in Abort.
    ncclGroupStart();
    for (ncclComm_t comm : raw) ncclCommAbort(comm);
    ncclGroupEnd();
  }
  // The parents' aborts ended their splits: abort what those made.
  AbortUnfinishedSplits(std::move(unfinished));
}

ncclComm_t NcclComm::Release() {
  // Slots an unfinished split may still write: whoever aborts the raw
  // communicator cannot abort what that split makes, but the slots must
  // outlive it (a few bytes, and that part, leak; AbortAll avoids both).
  for (auto& slot : unfinished_splits_) slot.release();
  unfinished_splits_.clear();
  rank_ = 0;
  size_ = 0;
  device_ = -1;
  blocking_ = true;
  return std::exchange(comm_, nullptr);
}

absl::StatusOr<NcclGroup> NcclGroup::Start() {
  NCCL_RETURN_IF_ERROR(ncclGroupStart());
  return NcclGroup();
}

NcclGroup::NcclGroup(NcclGroup&& other) noexcept : open_(std::exchange(other.open_, false)) {}

// A destructor cannot report the error; call End() to see it.
NcclGroup::~NcclGroup() {
  if (open_) End().IgnoreError();
}

absl::Status NcclGroup::End() {
  if (!open_) {
    return absl::FailedPreconditionError(
        "NcclGroup::End on a group already ended (or moved from); start a new one with "
        "NcclGroup::Start()");
  }
  open_ = false;
  NCCL_RETURN_IF_ERROR(ncclGroupEnd());
  return absl::OkStatus();
}

}  // namespace pipetrain
