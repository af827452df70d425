// NCCL communicators for groups of workers whose GPUs can reach each other
// (issue 6): all-reduce for data-parallel groups, and point-to-point send and
// receive of activations and gradients inside a node. Across nodes, and as
// the fallback, the gRPC data plane carries tensors instead.
//
// Setting up a group of n ranks:
//   1. One party (the coordinator) creates an NcclUniqueId and hands its
//      ToBytes() to every member (a proto bytes field).
//   2. Every member rebuilds it with NcclUniqueId::FromBytes and calls
//      NcclComm::Create(id, n, its_rank, its_device). The calls of all n ranks
//      must run concurrently (different processes, or different threads of
//      one process): each blocks until all have joined.
//   3. Collectives (AllReduceSum) must be called by every rank, in the same
//      order, with the same count. A Send must be matched by the peer's Recv
//      of the same count; a rank that both sends and receives puts the pair in
//      one NcclGroup, or the two ranks can block each other.
//
//   ASSIGN_OR_RETURN(NcclComm comm, NcclComm::Create(id, 2, rank, device));
//   {
//     ASSIGN_OR_RETURN(NcclGroup group, NcclGroup::Start());
//     RETURN_IF_ERROR(comm.Send(out, n, 1 - rank, stream));
//     RETURN_IF_ERROR(comm.Recv(in, n, 1 - rank, stream));
//     RETURN_IF_ERROR(group.End());
//   }
//
// Operations are asynchronous: they return once queued on `stream`, and the
// data is ready when the stream is (CudaStream::Synchronize, or an event).
// Argument checks happen before any NCCL call and return INVALID_ARGUMENT;
// NCCL and CUDA failures return INTERNAL naming the call (nccl_status.h).
//
// What one GPU can show: see the limits in nccl_comm_test.cc's header.
#ifndef PIPETRAIN_KERNELS_CUDA_NCCL_COMM_H_
#define PIPETRAIN_KERNELS_CUDA_NCCL_COMM_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pipetrain {

// The NCCL library's version, e.g. "2.28.9" (ncclGetVersion: the library
// loaded at run time, not the header built against). Needs no GPU. INTERNAL
// if NCCL fails.
absl::StatusOr<std::string> NcclVersion();

// A version code as ncclGetVersion returns it, as "major.minor.patch":
// 22809 -> "2.28.9" (codes >= 10000, NCCL 2.9 on), 2708 -> "2.7.8" (older).
std::string NcclVersionString(int code);

// Whether a version code (either scheme, as above) is at least
// major.minor.
bool NcclVersionAtLeast(int code, int major, int minor);

// OK if the NCCL loaded at run time can carry device groups: 2.22 or later,
// whose grouped abort (NcclComm::AbortAll) flags every link before freeing
// any (an older one frees, and so waits for the device, link by link: a
// link whose peer died keeps the others from being aborted), and
// NCCL_COMM_SPLIT_SHARE_RESOURCES unset or 0 (shared, the links' split
// communicators would share one internal stream). FAILED_PRECONDITION
// naming the reason otherwise; INTERNAL if NCCL fails. The setting is
// looked up as NCCL will see it (NcclSetting), configuration files included.
absl::Status CheckNcclForDeviceGroups();

// Where NCCL's configuration files are (overridable for tests).
struct NcclConfFiles {
  std::optional<std::string> home;  // unset: the user's, from the password database
  std::string system_file = "/etc/nccl.conf";
};

// The value NCCL will use for setting `name` (e.g.
// "NCCL_COMM_SPLIT_SHARE_RESOURCES"): the environment's, else the first of
// NCCL's configuration files that sets it: $NCCL_CONF_FILE if set and not
// empty, else ~/.nccl.conf; then /etc/nccl.conf (NCCL loads them in that
// order at its first call and a value already set wins). Read as NCCL
// reads them: NAME=VALUE lines, nothing trimmed. nullopt when nothing sets
// it.
std::optional<std::string> NcclSetting(const std::string& name,
                                       const NcclConfFiles& files = NcclConfFiles());

// Whether NCCL reads integer setting `value` as non-zero (and not its
// "undefined" INT_MIN): strtoll with base 0, so "00" and "abc" are 0, "0x1"
// and " 1" are 1; empty or out of range keeps NCCL's default (false here).
bool NcclIntegerSettingNonZero(const std::string& value);

// The rendezvous token of one communicator: NCCL_UNIQUE_ID_BYTES opaque
// bytes, naming the bootstrap root that ranks connect to. Copyable value;
// thread-compatible.
class NcclUniqueId {
 public:
  // A fresh id (ncclGetUniqueId). It starts NCCL's bootstrap root in this
  // process, which waits for the ranks of the communicator to connect, so
  // the creating process must live until all ranks have joined, and must be
  // reachable from every rank's host; an id never used keeps that thread
  // and its socket until the process exits. Needs a network interface
  // (loopback will do), not a GPU. INTERNAL if NCCL fails.
  static absl::StatusOr<NcclUniqueId> Create();

  // The id serialised by ToBytes. INVALID_ARGUMENT unless `bytes` holds
  // exactly NCCL_UNIQUE_ID_BYTES bytes. The content is not validated: a
  // corrupted id makes NcclComm::Create fail (or wait for ranks that never
  // come), so carry it unchanged.
  static absl::StatusOr<NcclUniqueId> FromBytes(std::string_view bytes);

  // Exactly NCCL_UNIQUE_ID_BYTES bytes (binary, may contain NULs).
  std::string ToBytes() const;

  const ncclUniqueId& get() const { return id_; }

 private:
  NcclUniqueId() = default;

  ncclUniqueId id_{};
};

// How long NcclComm::Create may wait for the other ranks, and how its caller
// stops it early (asked every millisecond while waiting, e.g. "has the job
// been stopped?"). The default waits forever in a blocking init.
// `deadline` is a MonotonicClock() reading (common/clock.h), so that a step
// of the system clock neither cuts a join short nor stretches it.
struct NcclJoinLimits {
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled;  // null: never

  bool limited() const { return deadline != absl::InfiniteFuture() || cancelled != nullptr; }
};

// Calls `poll` every millisecond (as NCCL's own waits poll) until it answers
// true (done: OK) or an error (returned as is), within `limits`: once
// limits.deadline has passed, DEADLINE_EXCEEDED "<what>: <pending> by the
// deadline"; once limits.cancelled() is true, CANCELLED "<what>: cancelled
// (<pending>)". `poll` runs at least once. The joins, splits and drains of
// NCCL communicators and device channels wait with it.
absl::Status PollWithinLimits(const std::function<absl::StatusOr<bool>()>& poll,
                              const NcclJoinLimits& limits, const std::string& what,
                              const std::string& pending);

// Polls every stream of `streams` (PollWithinLimits) until its queued work
// is done: OK, or DEADLINE_EXCEEDED / CANCELLED as `limits` say, INTERNAL
// for a CUDA error. `what` names the wait. Device channels and collectives
// drain their NCCL streams with it (a transfer whose peer never comes has
// no timeout of its own).
absl::Status AwaitCudaStreams(const std::vector<cudaStream_t>& streams,
                              const NcclJoinLimits& limits, const std::string& what);

// One rank's membership of an NCCL communicator. Move-only RAII: destruction
// (or Destroy) calls ncclCommDestroy, Abort calls ncclCommAbort.
//
// Thread-compatible: NCCL does not allow concurrent calls on one
// communicator; different communicators may be used from different threads.
// Operations may be called from a thread whose current CUDA device is
// another one: each switches to the communicator's device for the call and
// switches back.
class NcclComm {
 public:
  // Joins rank `rank` of an `nranks`-rank communicator on CUDA device
  // `device` (ncclCommInitRank). All ranks must call this concurrently with
  // the same id and nranks, from different processes or threads, each with
  // its own rank; it blocks until all have joined (there is no timeout: a
  // rank that never comes blocks the others). The calling thread's current
  // device is restored before returning.
  // INVALID_ARGUMENT if nranks < 1, rank is outside [0, nranks) or
  // device < 0 (before any CUDA or NCCL call); INTERNAL if CUDA fails (e.g.
  // no such device, no driver) or NCCL fails (e.g. ncclInvalidUsage when
  // two ranks name the same GPU and this NCCL version rejects that); a
  // half-initialised communicator is aborted before returning.
  //
  // With `limits` (a deadline or a cancel check), the communicator is made
  // non-blocking (ncclCommInitRankConfig, blocking = 0) and its init polled
  // (ncclCommGetAsyncError): DEADLINE_EXCEEDED past the deadline, CANCELLED
  // when `cancelled` says so, each after aborting the half-made
  // communicator, so a rank that never comes cannot hold the others
  // forever. Its operations wait out NCCL's "in progress" answers
  // themselves.
  static absl::StatusOr<NcclComm> Create(const NcclUniqueId& id, int nranks, int rank, int device,
                                         const NcclJoinLimits& limits = {});

  NcclComm() = default;  // empty: valid() is false
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  NcclComm(NcclComm&& other) noexcept;
  NcclComm& operator=(NcclComm&& other) noexcept;  // destroys the current one first
  ~NcclComm();                                     // Destroy(), error dropped

  // Splits this communicator (ncclCommSplit): the ranks that pass the same
  // color >= 0 form a new communicator, ranked by `key` (ties by their rank
  // here); a rank passing kNoColor joins none and gets an empty one.
  // Collective: every rank calls it, in the same order with respect to other
  // collectives and splits, and it blocks until all have. How device groups
  // give each link its own communicator (nccl_device_channel.h).
  // With `limits`, the part is non-blocking (as Create's) and the wait for
  // the other ranks ends with DEADLINE_EXCEEDED or CANCELLED as Create's;
  // the split may then still be under way inside NCCL, which will write the
  // part it makes into a slot this communicator keeps: the caller aborts
  // this communicator (Abort, AbortAll; Destroy does too then), which ends
  // the split and then aborts what it made.
  // FAILED_PRECONDITION if empty; INTERNAL if NCCL fails (a half-made
  // communicator is aborted).
  static constexpr int kNoColor = NCCL_SPLIT_NOCOLOR;
  absl::StatusOr<NcclComm> Split(int color, int key, const NcclJoinLimits& limits = {}) const;

  bool valid() const { return comm_ != nullptr; }
  int rank() const { return rank_; }      // 0 when empty
  int size() const { return size_; }      // nranks; 0 when empty
  int device() const { return device_; }  // -1 when empty
  ncclComm_t get() const { return comm_; }

  // recv[i] = sum over ranks of that rank's send[i], i in [0, count), on
  // `stream` (ncclAllReduce, float, ncclSum). send == recv (in place) is
  // allowed. Every rank must call it with the same count. The order of the
  // additions is NCCL's (it depends on the algorithm NCCL picks for the
  // topology); with one or two ranks every order gives the same floats.
  // INVALID_ARGUMENT if count < 0 or a pointer is null while count > 0;
  // FAILED_PRECONDITION if empty; INTERNAL if NCCL fails.
  // On a non-blocking communicator NCCL may answer "in progress": `limits`
  // bound that wait as Send's do.
  absl::Status AllReduceSum(const float* send, float* recv, int64_t count, cudaStream_t stream,
                            const NcclJoinLimits& limits = {});

  // Sends send[0, count) to rank `peer` on `stream` (ncclSend); the peer
  // must post a Recv of the same count from this rank. peer == rank() is
  // allowed inside an NcclGroup that also holds the matching Recv.
  // INVALID_ARGUMENT if count < 0, send is null while count > 0, or peer is
  // outside [0, size()); FAILED_PRECONDITION if empty (checked before the
  // peer); INTERNAL if NCCL fails. On a non-blocking communicator NCCL may
  // answer "in progress" (the first exchange with a peer connects to it,
  // which needs the peer): `limits` bound that wait (DEADLINE_EXCEEDED,
  // CANCELLED; abort the communicator then), the default waits as long as
  // it takes.
  absl::Status Send(const float* send, int64_t count, int peer, cudaStream_t stream,
                    const NcclJoinLimits& limits = {});

  // Receives count floats from rank `peer` into recv on `stream` (ncclRecv).
  // Errors and `limits` as Send.
  absl::Status Recv(float* recv, int64_t count, int peer, cudaStream_t stream,
                    const NcclJoinLimits& limits = {});

  // ncclCommDestroy: waits for this communicator's queued work, then frees
  // it. With several ranks in one process, NCCL waits for the other local
  // ranks to destroy theirs too, so destroy them concurrently (one thread
  // each), as they were created. The handle is empty afterwards. OK if
  // already empty; INTERNAL if NCCL reports an error (resources are freed
  // anyway).
  absl::Status Destroy();

  // ncclCommAbort: stops queued work and frees the communicator without
  // waiting for peers. For failure paths (a peer died, an operation failed
  // or hangs). The handle is empty afterwards; a no-op if already empty.
  // Several communicators of one device: AbortAll, not one Abort after
  // another.
  void Abort();

  // Aborts every communicator of `comms` (empty ones are skipped) in one
  // NCCL group: one abort frees device memory, which waits for the device's
  // running kernels, among them those of the communicators not yet aborted,
  // which may wait for a peer forever; in a group NCCL first flags them all
  // and frees after (NCCL >= 2.22). The calling thread's current device is
  // kept. Each handle is empty afterwards.
  static void AbortAll(const std::vector<NcclComm*>& comms);

  // Empties the handle without destroying the communicator and returns the
  // raw one: for a communicator that another thread aborted through get()
  // (ncclCommAbort of the raw handle, the way to end an operation that
  // hangs), which must then be neither destroyed nor aborted again.
  ncclComm_t Release();

 private:
  NcclComm(ncclComm_t comm, int rank, int size, int device, bool blocking = true)
      : comm_(comm), rank_(rank), size_(size), device_(device), blocking_(blocking) {}

  // For a non-blocking communicator, waits until its last call is no longer
  // in progress (`result` is that call's), within `limits`; INTERNAL naming
  // `call` for an error.
  absl::Status Finish(ncclResult_t result, const char* call,
                      const NcclJoinLimits& limits = {}) const;

  // Aborts the parts that splits left unfinished wrote into their slots
  // (call after this communicator's abort, which ended those splits).
  static void AbortUnfinishedSplits(std::vector<std::unique_ptr<ncclComm_t>> slots);

  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
  int device_ = -1;
  bool blocking_ = true;
  // Out-slots of splits that gave up waiting while NCCL's split job still
  // held them (Split's `limits`); mutable: Split is const.
  mutable std::vector<std::unique_ptr<ncclComm_t>> unfinished_splits_;
};

// A group of NCCL operations launched together (ncclGroupStart/End): a
// rank's Send and Recv of an exchange go in one group so neither waits for
// the other to be posted. Operations queued between Start and End launch at
// End, which reports their NCCL errors. For blocking communicators only: on
// a non-blocking one End may answer "in progress", which End reports as an
// error (it does not know which communicators to poll).
//
// NCCL keeps the group per thread: End must run on the thread that called
// Start, so do not hand an open group to another thread. If an operation in
// the group fails its argument check, the others still launch at End and may
// wait for a peer forever: check arguments before starting, or Abort the
// communicator after such a failure.
//
// NCCL 2.28 leaks a small allocation (160 bytes) for each group ended with
// no operations in it: do not open empty groups in a per-step loop.
class NcclGroup {
 public:
  // ncclGroupStart. Needs no GPU. INTERNAL if NCCL fails.
  static absl::StatusOr<NcclGroup> Start();

  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  NcclGroup(NcclGroup&& other) noexcept;
  NcclGroup& operator=(NcclGroup&&) = delete;
  ~NcclGroup();  // End() if still open, error dropped

  bool open() const { return open_; }

  // ncclGroupEnd: launches the queued operations. FAILED_PRECONDITION if
  // already ended (or moved from); INTERNAL if NCCL fails.
  absl::Status End();

 private:
  NcclGroup() : open_(true) {}

  bool open_ = false;
};

namespace nccl_internal {

// NcclComm's argument checks, exposed so tests can run them without a GPU.
// Each returns OK or INVALID_ARGUMENT naming `op` and the bad argument.

// Asks `state` (ncclCommGetAsyncError of a non-blocking communicator) every
// millisecond until it answers other than ncclInProgress: OK for
// ncclSuccess, INTERNAL naming `what` for an error (the answer's name),
// DEADLINE_EXCEEDED once limits.deadline has passed and CANCELLED once
// limits.cancelled() is true, both naming `what` (the caller then aborts
// the communicator). Needs no GPU: tests drive it with a fake state.
absl::Status AwaitNccl(const std::function<ncclResult_t()>& state, const NcclJoinLimits& limits,
                       const std::string& what);

// count >= 0, and `buffer` (called `name`) non-null when count > 0.
absl::Status CheckBuffer(const char* op, const char* name, const void* buffer, int64_t count);

// 0 <= peer < nranks.
absl::Status CheckPeer(const char* op, int peer, int nranks);

}  // namespace nccl_internal

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_NCCL_COMM_H_
