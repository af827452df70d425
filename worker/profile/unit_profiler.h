// The per-unit profiler a worker runs for the planner (DESIGN.md §5): times
// each unit's forward and backward pass on this machine and reports the
// sizes the solvers need, as a v1::ModelProfile.
//
// How a profile is measured. The units are built one at a time in pipeline
// order (MakeUnit + InitializeParameters with request.seed), so the profiler
// holds one unit's parameters at a time, not the whole model. The micro-batch
// is a deterministic synthetic token batch of micro_batch_size × seq_len
// tokens in [0, vocab_size), a pure function of request.seed. Unit i gets the
// real output of unit i - 1 as its input (embed reads the tokens) and a
// dy = N(0, 1) tensor of its output's shape, also a pure function of
// (seed, unit name); head gets dy = [1]{1}. Each unit runs one untimed
// forward that produces its output, then `warmup` untimed and `repetitions`
// timed forward + backward passes, each pass timed separately with
// std::chrono::steady_clock. Gradients accumulate across the runs; the
// timed AdamW steps (optimizer_seconds) read them and move the weights
// before the partitions are timed, which changes no timing (the work does
// not depend on the values). Each pass frees the previous pass's stash
// before its forward (outside the timed interval), so the profiler holds
// one micro-batch's stash at a time: its peak is at most about
// 4 × weight_bytes + stash_bytes + transient_bytes + the unit's output and
// output gradient (held throughout; no stash is held once the AdamW
// moments exist).
//
// Fields of each UnitProfile:
//   name               UnitName(): "embed", "attn_<i>", "mlp_<i>", "head".
//   fwd_seconds,       the MEDIAN of the timed runs (the mean of the two middle
//   bwd_seconds        values when repetitions is even).
//   weight_bytes       4 × the unit's parameter elements. The head counts its
//                      own copy of the tied wte.weight (vocab_size × d_model):
//                      a stage that holds the head without the embedding holds
//                      that copy.
//   activation_bytes   4 × the elements of the unit's output per micro-batch.
//                      For head that output is its [1] loss, so 4 bytes.
//   stash_bytes        UnitContext::bytes() after Forward. For attn, mlp and
//                      head it includes the unit's input x, which is the same
//                      buffer as the previous unit's output.
//   peak_memory_bytes  An ESTIMATE computed from tensor sizes, not measured
//                      from the allocator: 4 × weight_bytes (values, gradients,
//                      Adam m and v) + input + output + stash + input gradient,
//                      where input is x (embed: its int32 token ids; head: x
//                      plus its int32 targets), stashed tensors that share
//                      storage with the input or output are counted once, and
//                      embed has no input gradient. Temporaries that live only
//                      inside a pass (e.g. head's [B·T, vocab] logit gradient)
//                      are not counted, so the real peak can be higher.
//   transient_bytes    MEASURED on the CPU backend: the most the host tensor
//                      counters (CurrentHostTensorMemory, common/tensor.h)
//                      rose during one more forward + backward pass, after
//                      the timed ones, on a fresh context, less what the
//                      forward stashed (but its input): the output (held
//                      to the end of the pass), the input gradient and
//                      every temporary, e.g. the head's logit gradient.
//                      Kernels' std::vector scratch is not seen. 0 on a
//                      device backend (not measured).
//   optimizer_seconds  the MEDIAN of `repetitions` timed AdamW steps over
//                      the unit's parameters (default hyperparameters and
//                      decay policy; moments allocated by an untimed first
//                      step, then `warmup` untimed ones), on `backend`.
//   partitions         for each request.partitions K (2 or 4, dividing the
//                      micro-batch; AccTFM's Alg. 1 wants measured compute
//                      per partition size), one of K micro-partitions timed
//                      the same way: the first micro_batch_size / K samples
//                      of the same input and output gradient.
// and of the ModelProfile: micro_batch_size, device_kind ("cpu:" + the CPU
// model name, or "cuda:" + the GPU's name on a CUDA backend), repetitions
// (the resolved count) and codecs: for each of kProfiledQuantizers, the
// median time of Collectives::AllReduceEncoded through it between two
// members on threads of this process (in-process transport, coding error
// kept, as a compressed data-parallel stage runs it) on the host CPU (where
// gradients are coded whatever the backend), over `warmup` untimed and
// `repetitions` timed runs, per fp32 byte of a member's tensor; and the
// same for PowerSgdAllReduce (error feedback, warm start kept) at each of
// kProfiledPowerSgdRanks on a [kPowerSgdTimingRows, 512] matrix.
//
// Units run on `backend` (the CPU by default); each timed pass ends with
// Backend::Synchronize, so a GPU's times include its queued work. On the
// CPU, GEMMs run on as many OpenBLAS threads as the process has configured
// (SetBlasThreads in kernels/cpu/blas.h); the profiler does not change it.
//
// Thread-safety: ProfileUnits must not run concurrently with other GEMM work
// in the process (OpenBLAS's thread pool is shared) and measures best on an
// otherwise idle machine. ProfileToFileJson is pure and thread-safe.
#ifndef PIPETRAIN_WORKER_PROFILE_UNIT_PROFILER_H_
#define PIPETRAIN_WORKER_PROFILE_UNIT_PROFILER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "proto/pipetrain/v1/profile.pb.h"
#include "worker/model/backend.h"
#include "worker/model/cpu_backend.h"

namespace pipetrain {

// Defaults applied when the request leaves a count at 0 (profile.proto
// documents them). proto3 cannot tell an unset int32 from 0, so 0 always means
// "the default": a profile always has at least one warm-up run, which keeps
// first-touch page faults and cold caches out of the medians.
inline constexpr int kDefaultProfileWarmup = 2;
inline constexpr int kDefaultProfileRepetitions = 5;

// The quantizers a profile times (ModelProfile.codecs): the data-parallel
// all-reduce through each, two members of kCodecTimingElements N(0, 1e-3)
// values (a 1 MiB bucket); other bit widths cost about the same per byte.
inline constexpr const char* kProfiledQuantizers[] = {"fp16", "bf16", "linear:bits=8",
                                                      "piecewise:bits=8"};
inline constexpr int64_t kCodecTimingElements = int64_t{1} << 18;
// PowerSGD's timed ranks (ModelProfile.codecs "powersgd:rank=R"), on a
// matrix of kPowerSgdTimingRows rows of the same values: two, so that the
// planner can take its cost at any rank as a line through them.
inline constexpr int kProfiledPowerSgdRanks[] = {1, 8};
inline constexpr int64_t kPowerSgdTimingRows = 512;

// Called before each unit is profiled, with its pipeline index and name, so a
// caller can show progress on a long profile, and stop it: an error ends
// the profile with that error (a worker shutting down, a caller gone). Runs
// on the calling thread.
using ProfileProgressFn = std::function<absl::Status(int unit_index, const std::string& unit_name)>;

// Asked before the passes within a unit (each warm-up and timed pass, the
// transient pass, the optimizer's timing, each partition pass): an error
// ends the profile with it, so a
// caller that gave up (its deadline passed) or a worker shutting down
// waits one pass, not the rest of a large unit (minutes), which held the
// worker's memory and cores beside the job it was given meanwhile. Runs on
// the calling thread.
using ProfileStopCheck = std::function<absl::Status()>;

// Profiles every unit of request.model (see the file comment).
//
// Request fields: model.vocab_size defaults to 256 and model.max_seq_len to
// seq_len when unset (as for a JobSpec); warmup 0 means
// kDefaultProfileWarmup and repetitions 0 means kDefaultProfileRepetitions.
//
// Errors: INVALID_ARGUMENT whose message starts with the offending field:
//   "request.model: ..."             the model shape fails ValidateGptConfig
//                                     (the rest of the message names the size),
//                                     n_layer > 256 (kMaxLayers), or a parameter tensor
//                                     would exceed 2^31 - 1 elements;
//   "request.seq_len: ..."           seq_len < 1 or > model.max_seq_len;
//   "request.micro_batch_size: ..."  micro_batch_size < 1, or the largest
//                                     tensor of a pass would exceed 2^31 - 1
//                                     elements (the kernels index with int);
//   "request.warmup: ..."            warmup < 0 or > 1000;
//   "request.repetitions: ..."       repetitions < 0 or > 1000.
// Nothing is allocated before the request is validated. A valid request can
// still need more memory than the machine has (about the largest unit's
// peak_memory_bytes at a time); that is not checked.
absl::StatusOr<v1::ModelProfile> ProfileUnits(const v1::ProfileRequest& request,
                                              const ProfileProgressFn& progress = nullptr,
                                              Backend* backend = CpuBackend(),
                                              const ProfileStopCheck& stop_check = nullptr);

// The profile JSON file form read by the planner (docs/formats.md,
// coordinator/planner/profile.h), indented:
//   {"micro_batch_size": 4, "units": [{"name": "embed", "fwd_seconds": ...,
//    "bwd_seconds": ..., "weight_bytes": ..., "activation_bytes": ...,
//    "stash_bytes": ...}, ...]}
// and, where measured, a unit's "transient_bytes", "optimizer_seconds" and
// "partitions" ([{"count", "fwd_seconds", "bwd_seconds"}], AccTFM's), and
// the profile's "codecs". No other keys: the file format has no
// device_kind, repetitions or peak_memory_bytes, and the planner rejects
// unknown keys.
// Invalid UTF-8 in a unit name is replaced with U+FFFD rather than thrown.
std::string ProfileToFileJson(const v1::ModelProfile& profile);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PROFILE_UNIT_PROFILER_H_
