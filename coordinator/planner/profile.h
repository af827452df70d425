// Model profiles and cluster descriptions, the planner's inputs, and their
// JSON files (the Planner issue, scope 1):
//
// profile:  {"micro_batch_size": 4, "units": [{"name": "embed",
//            "fwd_seconds": 0.0012, "bwd_seconds": 0.0025,
//            "weight_bytes": 3145728, "activation_bytes": 131072,
//            "stash_bytes": 262144, "transient_bytes": 393216}, ...]}
// cluster:  {"workers": [{"name": "w0", "speed": 1.0,
//            "memory_bytes": 17179869184}, ...],
//            (optional per worker: "host", "host_cores", "compute_threads"),
//            "bandwidth_bytes_per_second": 1.25e9, "latency_seconds": 5e-5}
//
// Workers sit in the pipeline in file order. Parsing rejects unknown keys,
// wrong types, missing fields, negative or non-finite numbers and empty
// lists with INVALID_ARGUMENT naming the field ("units[3].fwd_seconds: ...").
#ifndef PIPETRAIN_COORDINATOR_PLANNER_PROFILE_H_
#define PIPETRAIN_COORDINATOR_PLANNER_PROFILE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data_plane_limits.h"
#include "coordinator/planner/bipartition.h"

namespace pipetrain {

struct UnitProfile {
  std::string name;
  double fwd_seconds = 0, bwd_seconds = 0;  // per micro-batch
  double weight_bytes = 0, activation_bytes = 0, stash_bytes = 0;
  // The most a pass of the unit allocates beyond its stash, at once
  // (v1::UnitProfile.transient_bytes); BiPartitionProblem's term.
  double transient_bytes = 0;
  // One optimizer (AdamW) step over the unit's parameters, when the profile
  // timed it; 0: not timed (the simulator then charges none).
  double optimizer_seconds = 0;
  // Measured passes of one of K micro-partitions, by K (2, 4), when the
  // profile has them (v1::UnitProfile.partitions); AccTFM's Alg. 1 uses
  // them instead of fwd_seconds / K.
  std::map<int, std::pair<double, double>> partition_seconds;  // K -> {fwd, bwd}
  // Seconds per micro-batch a pass waits beyond its compute that the
  // worker's speed does not shorten: a tensor-parallel rank's exposed
  // all-reduces (TensorParallelCostsOf), which every consumer adds after
  // dividing fwd_seconds / bwd_seconds by the speed. Derived when a job is
  // planned; profiles never carry them (0 as parsed).
  double fwd_comm_seconds = 0, bwd_comm_seconds = 0;
};

// How a worker runs attention, for AnalyticProfile's (solve_plan.h) attention units:
//   kCpu       the CPU backend: the B·H·T² probabilities stashed; the
//              backward's scratch one [T, T] matrix.
//   kCudaGemm  the CUDA backend without flash (--attention gemm, reference):
//              the probabilities stashed; the backward's dS for every
//              (batch, head) at once, B·H·T² floats more.
//   kCudaFlash the CUDA backend's --attention flash: B·H·T row statistics
//              stashed (Backend::AttentionSavedFloats) instead of the
//              probabilities, the backward recomputes the scores QK^T
//              (2·B·T²·d FLOPs more) with B·H·T floats of scratch. Heads
//              wider than the kernel takes (128 dims) run as kCudaGemm.
enum class AnalyticAttention { kCpu, kCudaGemm, kCudaFlash };

struct ModelProfile {
  int micro_batch_size = 1;
  std::vector<UnitProfile> units;
  // The CPU seconds of a quantized data-parallel all-reduce per fp32 byte of
  // a member's tensor, by quantizer name ("bf16", "piecewise:bits=8"), as
  // the profile measured them (v1::CodecTiming); empty: not measured, not
  // modelled (QuantizedAllReduceSecondsPerByte).
  std::map<std::string, double> codec_all_reduce_seconds_per_byte;
};

// A profile's measured cost per byte of the quantized all-reduce through
// `quantizer` (a MakeQuantizer name): its own entry, else its family's
// 8-bit one ("linear:bits=4" -> "linear:bits=8"; the cost per byte hardly
// depends on the width), else 0 (not measured).
double QuantizedAllReduceSecondsPerByte(const ModelProfile& profile, const std::string& quantizer);

// The same for PowerSGD of `rank` (>= 1): the line through the profile's
// "powersgd:rank=1" and "powersgd:rank=8" entries (its GEMMs grow with the
// rank, its error feedback does not), past rank 8 never below the rank 8
// entry (a line falling from rank 1 to 8 is noise: beyond, it reached 0,
// read as free); 0 when either is missing.
double PowerSgdAllReduceSecondsPerByte(const ModelProfile& profile, int rank);

struct WorkerSpec {
  std::string name;
  double speed = 1.0;       // relative compute speed (> 0)
  double memory_bytes = 0;  // 0: unlimited
  // The host whose CPU cores the worker computes on, its cores, and the
  // threads the worker computes with (host_sharing.h); 0: not known or not
  // on the CPU (a GPU), no sharing modelled.
  std::string host;
  int host_cores = 0;
  int compute_threads = 0;
  // Computes on a GPU: its gradients stay in device memory, and the runtime
  // all-reduces them at the optimizer step instead of overlapping the
  // backward pass (simulator.h).
  bool gpu = false;
  // How a GPU worker rounds beyond its kind: its model and its backend's
  // GEMM mode (GpuArithmetic, data_parallel_layout.h). Empty on the CPU or
  // where not known (cluster files); compared only between the GPU ranks
  // of one tensor group (CheckReplicaDevices).
  std::string gpu_arithmetic;
};

struct ClusterSpec {
  std::vector<WorkerSpec> workers;
  double bandwidth_bytes_per_second = 0;  // 0: unlimited
  double latency_seconds = 0;
  // Of latency_seconds, the part that is the data plane's serial work per
  // message (AddDataPlaneCost folds it in): a link pays it for each of its
  // messages in turn, where the rest overlaps between back-to-back sends
  // (simulator.h's LinkParameters). 0 as parsed; not read or written by
  // cluster files, and not kept by ReplicaStageCluster or
  // TensorGroupCluster (SimulateWithSharedCores takes it from the job's).
  double per_message_seconds = 0;
  // The data plane's own cost per message beyond the link (measured by the
  // workers, worker/transport/data_plane_probe.h; 0: not known), and
  // whether the link above is emulated (store-and-forward before that
  // cost) or a real network (the copy overlaps the wire). The planner adds
  // it to the link with data_plane_cost.h's AddDataPlaneCost.
  double data_plane_overhead_seconds = 0;
  double data_plane_bytes_per_second = 0;
  bool links_emulated = false;
  // The smallest --mailbox-limit among the job's workers
  // (DeviceInfo.mailbox_limit_bytes): a worker's mailbox refuses any one
  // tensor larger. 0: none reported; the data plane's limit holds
  // (MaxPlannedTensorBytes). Not read or written by cluster files.
  int64_t mailbox_limit_bytes = 0;
  // Where the link above comes from, for the plan's profile_source (e.g.
  // "the coordinator's --network"); not read or written by cluster files.
  std::string links_origin;
};

// The most bytes one tensor of a plan on `cluster` may have:
// kMaxDataPlaneTensorBytes (common/data_plane_limits.h), or the workers'
// smallest mailbox limit where that is reported and smaller.
inline double MaxPlannedTensorBytes(const ClusterSpec& cluster) {
  return static_cast<double>(cluster.mailbox_limit_bytes > 0
                                 ? std::min(cluster.mailbox_limit_bytes, kMaxDataPlaneTensorBytes)
                                 : kMaxDataPlaneTensorBytes);
}

// Bounds of a profile's codec timings, for ParseProfileJson and the
// coordinator's check of a worker's profile (profile_cache.h): at most
// kMaxProfileCodecs entries (the profiler writes four), each a name of 1 to
// kMaxProfileCodecNameBytes bytes given once, with
// all_reduce_seconds_per_byte at most kMaxCodecSecondsPerByte.
inline constexpr size_t kMaxProfileCodecs = 16;
inline constexpr size_t kMaxProfileCodecNameBytes = 64;
inline constexpr double kMaxCodecSecondsPerByte = 1e-3;

// OK when `name` is a codec-table entry the simulator reads: a quantizer
// written as MakeQuantizer names it ("bf16", "linear:bits=8"; the lookup
// is by that exact string) or "powersgd:rank=1" / "powersgd:rank=8" (the
// two PowerSgdAllReduceSecondsPerByte draws its line through). Anything
// else would be accepted and never used; the error says what is allowed.
// The caller names the field.
absl::Status CheckProfileCodecName(const std::string& name);

// The most units a profile file may list: those of a model of
// spec.model.n_layer's bound (embed, attention and MLP per layer, head).
inline constexpr int kMaxProfileUnits = 2 * 256 + 2;
// A unit's name ("attn_12"): printed in plans, so bounded.
inline constexpr size_t kMaxProfileUnitNameBytes = 128;

// Both parsers reject, naming the field: unknown keys, wrong types, numbers
// that are negative, non-finite or over 1e18. ParseProfileJson: more than
// kMaxProfileUnits units, a unit name that is empty, over
// kMaxProfileUnitNameBytes, holds a control character or is given twice.
// ParseClusterJson: more than kMaxStages workers, a worker name that is
// empty, over 253 bytes, holds a control character or is given twice, a speed
// outside [1e-6, 1e6], a bandwidth in (0, 1), one of the two data-plane
// cost fields without the other.
absl::StatusOr<ModelProfile> ParseProfileJson(const std::string& json);
// The first key of profile `json` that ParseProfileJson does not know, as
// its error names it ("units[0].future_key", escaped and cut as there);
// "" when there is none, or when `json` does not parse (ParseProfileJson
// says why). A profile written by a newer build may hold keys added since.
std::string FirstUnknownProfileKey(const std::string& json);
absl::StatusOr<ClusterSpec> ParseClusterJson(const std::string& json);
// Indented by `indent` spaces a level; -1: on one line, no spaces.
std::string ProfileToJson(const ModelProfile& profile, int indent = 2);
std::string ClusterToJson(const ClusterSpec& cluster);

// The Bi-Partition problem of a profile on a cluster: per-unit costs and
// sizes (fwd, bwd, activation, weight, stash and transient bytes), per-worker speeds and
// memory, the link's bandwidth and latency, and the largest weight sync
// (MaxPlannedTensorBytes). What the files do not hold is
// left at BiPartitionProblem's defaults for the caller to set:
// micro_batches (1), schedule (1F1B) and objective (paper).
BiPartitionProblem MakeBiPartitionProblem(const ModelProfile& profile, const ClusterSpec& cluster);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_PROFILE_H_
