// ProfileCache: measured model profiles kept by the coordinator per (model
// shape, sequence length, micro-batch size, device kind), so a model is
// profiled once per kind of device (the Planner issue, scope 1). In memory;
// with durable state the JobManager also saves each profile it puts here
// and loads them back at start-up (CoordinatorState::SaveProfile), so a
// restarted coordinator does not profile again. Thread-safe.
#ifndef PIPETRAIN_COORDINATOR_JOBS_PROFILE_CACHE_H_
#define PIPETRAIN_COORDINATOR_JOBS_PROFILE_CACHE_H_

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/annotated_mutex.h"
#include "common/device_kind.h"  // DeviceKind: the device part of a key
#include "coordinator/planner/profile.h"
#include "proto/pipetrain/v1/coordinator.pb.h"
#include "proto/pipetrain/v1/profile.pb.h"

namespace pipetrain {

// The cache key of a profile request on a device kind: printable ASCII, as
// the state store's keys must be (Store), whatever device name a worker
// reported: the kind is C-escaped (a plain name stays as it is), and one
// longer than kMaxProfileKindBytes escaped is cut, with a digest of the
// whole, to stay within the store's key limit. A key with a UTF-8 or
// control byte was refused by the store, so such workers' profiles were
// measured again for every job.
inline constexpr size_t kMaxProfileKindBytes = 300;
std::string ProfileKey(const v1::ProfileRequest& request, const std::string& device_kind);

// The device part of a profile's key for a worker: its DeviceKind and how
// it computes there, which the profile's figures depend on as much: a
// CUDA worker's GEMM and attention modes (--gemm, --attention: its
// DeviceInfo.backend less the device's ordinal and name, so the GPUs of a
// host share profiles) and a CPU worker's threads (--threads). Why: a
// profile measured with flash attention (no probabilities kept) reused by
// workers with GEMM attention understated their memory by a T x T matrix
// a head, and one measured on 1 thread made 16-thread workers look 16
// times slower.
// With the worker's `build` (its version and commit, when it reports
// them): the timings are its kernels', and an upgrade to faster ones (or
// another CUDA library under the same modes) kept serving the old build's
// profiles, refreshed at each use, to every job of the model.
std::string ProfileDeviceKey(const v1::DeviceInfo& device,
                             const v1::BuildIdentity& build = v1::BuildIdentity());

// How `device`'s worker runs attention, for analytic sizes: from its
// DeviceInfo.backend (Backend::Describe), which names a CUDA backend's
// attention ("cuda:N (name), ..., flash attention (...)"); kCpu for any
// other backend.
AnalyticAttention AnalyticAttentionOf(const v1::DeviceInfo& device);

// The planner's view of a measured profile. A unit whose transient_bytes
// the profiler did not measure (0: a device backend) takes model_sizes'
// (AnalyticProfile's, one unit each), when given.
ModelProfile FromProto(const v1::ModelProfile& profile, const ModelProfile* model_sizes = nullptr);

// The profile a plan on workers that run attention as `placed` (each
// AnalyticAttentionOf the placed workers' devices) prices memory with:
// `profile`, measured (or analytic) on a worker running it as `profiled`
// (nullopt: not known, state stored before it was kept). For each placed
// kind other than `profiled`, each unit's stash_bytes and transient_bytes
// is at least max(theirs, measured + theirs - ours), theirs and ours
// being `sizes_of` that kind and of `profiled` (ModelSizes, one unit each
// in the profile's order; only attention's differ between kinds, so other
// units keep their measurement), or with `profiled` not known
// max(measured, theirs). The measured size itself counts only where
// `profiled` is placed or not known. Times are kept (the planner scales
// them by each worker's speed). One array prices every worker, so a plan
// mixing kinds charges each the largest kind's. Why: a re-plan onto a
// spare of another kind reused the first plan's profile, and a
// flash-attention profile understated a CPU spare's stash by the B·H·T²
// probabilities of each micro-batch in flight (it ran out of memory at run
// time), a CPU profile overstated flash workers' (a spare that fits was
// refused as unfit). `note`, when not null, is set to what changed ("" when
// nothing did), for the plan's profile_source.
ModelProfile ProfileForAttentions(const ModelProfile& profile,
                                  std::optional<AnalyticAttention> profiled,
                                  const std::vector<AnalyticAttention>& placed,
                                  const std::function<ModelProfile(AnalyticAttention)>& sizes_of,
                                  std::string* note);

// How AnalyticAttention reads in a plan's profile_source.
const char* AnalyticAttentionName(AnalyticAttention attention);

// Bounds of a worker's profile (CheckWorkerProfile).
inline constexpr double kMaxProfileSeconds = 1e6;  // a unit's pass, ~11 days
inline constexpr double kMaxProfileBytes = 1e15;   // a unit's bytes, 1 PB
inline constexpr size_t kMaxProfileDeviceKindBytes = 256;
// The fastest compute a profile may claim (100 PFLOP/s, about 50 times one
// H200's dense bf16): a unit's forward or backward time below its FLOPs at
// this rate (or 0 where it computes anything) is no measurement.
inline constexpr double kMaxProfileFlopsPerSecond = 1e17;
// The least all-reduce time per byte a profile's codec timing may claim
// (10 TB/s; the worker measures a host all-reduce of 2 members): a codec
// costed near 0 would make every stage's compression look free.
inline constexpr double kMinProfileCodecSecondsPerByte = 1e-13;
// The rate `model_sizes`' times are computed at (their FLOPs / this):
// ModelSizes in job_manager_profiling.cc.
inline constexpr double kModelSizesFlopsPerSecond = 1e9;

// Whether `profile`, a worker's answer to `request` (WorkerControl.Profile),
// may be cached and planned with: one unit per name in `unit_names`, named
// so and in that order; the request's micro_batch_size; every time in [0,
// kMaxProfileSeconds] and every size in [0, kMaxProfileBytes], finite; each
// unit's partitions the request's, in its order; at most
// kMaxProfileCodecs codecs, each a name of 1 to kMaxProfileCodecNameBytes
// bytes given once with all_reduce_seconds_per_byte in
// [kMinProfileCodecSecondsPerByte, kMaxCodecSecondsPerByte] (a worker
// measures every codec it lists); device_kind at most
// kMaxProfileDeviceKindBytes; repetitions >= 0; store_sequence 0 (the
// store's to set). INVALID_ARGUMENT naming the first field that is not.
// A worker is a peer: what it sends reaches the planner, whose indexing
// and CHECKs trust the unit count, only through this. With `model_sizes` (the sizes the model's
// shape gives, AnalyticProfile's, one unit each), each unit's weight_bytes
// and activation_bytes must equal them and its stash_bytes and
// transient_bytes be within a factor of two of them (a transient_bytes of
// 0 is not measured and passes), and its fwd_seconds and bwd_seconds must be at least the
// unit's FLOPs at kMaxProfileFlopsPerSecond (above 0 where it has any),
// each partition timing's at least 1 / count of them:
// the profile is cached for every job of the model on that kind of
// device, and a worker's inflated sizes would make other users' plans
// refuse (or fit what does not), its near-zero times make them plan as if
// compute were free.
absl::Status CheckWorkerProfile(const v1::ModelProfile& profile, const v1::ProfileRequest& request,
                                const std::vector<std::string>& unit_names,
                                const ModelProfile* model_sizes = nullptr);

// The most profiles a cache keeps. Keys come from what users submit (model
// shape, sequence length, micro-batch size): without a bound, jobs of ever
// new shapes would grow the coordinator's memory and store for good.
inline constexpr size_t kMaxCachedProfiles = 512;

// Least recently used goes first. A restarted coordinator puts the stored
// profiles back oldest save first (CoordinatorState::LoadProfilesBySave),
// so the order survives a restart as far as saves tell it: a Get is not
// stored (that would be a commit of the whole record per job planned), so
// a profile measured long ago and got since ranks after the restart by its
// save alone, below profiles measured later.
class ProfileCache {
 public:
  explicit ProfileCache(size_t capacity = kMaxCachedProfiles) : capacity_(capacity) {}

  // A Get counts as a use (the least recently used is evicted first).
  std::optional<v1::ModelProfile> Get(const std::string& key) const;
  // Returns the keys evicted to stay within the capacity (for the store
  // to drop too): the least recently put or got, never `key`.
  std::vector<std::string> Put(const std::string& key, const v1::ModelProfile& profile);
  int size() const;

 private:
  struct Entry {
    v1::ModelProfile profile;
    int64_t last_use = 0;
  };
  const size_t capacity_;
  mutable AnnotatedMutex mu_;
  mutable std::map<std::string, Entry> profiles_ ABSL_GUARDED_BY(mu_);
  mutable int64_t uses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_PROFILE_CACHE_H_
