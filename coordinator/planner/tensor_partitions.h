// AccTFM's per-layer partition sizes for a tensor-parallel job
// (acctfm.txt §4.2, Algorithm 1; spec.parallelism.tensor_partitions 0).
//
// Every attention and MLP unit is one of Alg. 1's layers. Its costs come
// from the job's profile and link model:
//   compute of one of K micro-partitions: the unit's measured pass on
//     micro_batch / K samples (UnitProfile::partition_seconds, which the
//     coordinator asks the profiler for when tensor_partitions is 0) / T,
//     or without it (analytic profiles) the whole pass / T / K (the split
//     divides the unit's FLOPs by T; a partition does 1/K of the samples),
//   all-reduce of one micro-partition: eq. 3 for activation_bytes / K as
//     the group runs it (GroupAllReduceSeconds in the .cc): one exchange
//     for T = 2 (c1 = c2 = 1); recursive doubling (c1 = c2 = log2 T) for
//     a power of two below kSmallAllReduceBytes without a codec
//     (Collectives::AllReduce); else a ring of T; with
//     alpha = the link's latency, beta = 1 / bandwidth,
//     the bytes times `block_wire_fraction` (what AccTFM's hybrid
//     compression sends of the fp32 size, TensorParallelWireFraction; 1
//     when exact; the token scores' small all-reduce is not modelled).
// SolveAccTfm then picks each layer's size, forward and backward (the
// better of Alg. 1 and the best uniform size). Embed and head are not
// partitioned (size 1).
//
// Alg. 1's timeline lets a layer's first partition start once the previous
// layer's matching partition is reduced, and so does the runtime between
// the attention and MLP units of a stage (Unit::set_stream_output). The
// choice is checked against the runtime's timeline as the simulator costs
// it (TensorParallelUnitPasses, which charges each block unit its share of
// that streamed timeline): where a uniform size is faster there, in a pass,
// that size is used for the pass (forward_uniform_by_runtime /
// backward_uniform_by_runtime), so the plan is never predicted slower than
// the best uniform size. At run time, tensor_partitions_tune_steps then
// checks the choice by measurement (worker/runtime/partition_tuner.h).
#ifndef PIPETRAIN_COORDINATOR_PLANNER_TENSOR_PARTITIONS_H_
#define PIPETRAIN_COORDINATOR_PLANNER_TENSOR_PARTITIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/acctfm.h"
#include "coordinator/planner/profile.h"
#include "coordinator/planner/tensor_parallel_lanes.h"

namespace pipetrain {

struct TensorPartitionPlan {
  // Per unit of the profile, in model order: 1, 2 or 4.
  std::vector<int> forward;
  std::vector<int> backward;
  AccTfmSolution solution;  // over the attention and MLP units only
  // Whether a uniform size replaced the AccTFM solution in that pass
  // because the runtime's timeline (each unit alone, TensorParallelUnitPasses)
  // predicts it faster; see ChooseTensorPartitions.
  bool forward_uniform_by_runtime = false;
  bool backward_uniform_by_runtime = false;
};

// INVALID_ARGUMENT when tensor < 2, the profile has no attention or MLP
// unit (names "attn_*", "mlp_*"), or a cost is invalid (SolveAccTfm's
// message). bandwidth 0 means unlimited. `block_encoded`: the block units'
// all-reduces go through a codec (AllReduceEncoded, always the ring;
// TensorParallelEncoded); else each runs as Collectives::AllReduce
// chooses by its size (AllReduceRunsRecursiveDoubling), as the embedding's
// and the head's do. `block_coding_seconds_per_byte` is CPU work, at the
// speed of the profile's compute (the planner divides both by the group's).
absl::StatusOr<TensorPartitionPlan> ChooseTensorPartitions(
    const ModelProfile& profile, int tensor, double bandwidth_bytes_per_second,
    double latency_seconds, double block_wire_fraction = 1.0,
    double block_coding_seconds_per_byte = 0.0, bool block_encoded = false);

// Whether a profile's unit is an attention or MLP unit ("attn_*",
// "mlp_*"), the units tensor parallelism splits and partitions.
bool IsTensorParallelBlockUnit(const UnitProfile& unit);

// The share of an attention or MLP all-reduce's fp32 bytes that
// spec.parallelism.tensor_compression `spec` sends: the codec's encoded
// size (headers included) of the kept rows, TopKCount(keep, seq_len) per
// sample of `seq_len` tokens, / the fp32 size of [tokens, d_model]; 1 for
// "none". INVALID_ARGUMENT for a spec jobs refuse, or tokens not whole
// samples.
absl::StatusOr<double> TensorParallelWireFraction(const std::string& spec, int64_t tokens,
                                                  int seq_len, int64_t d_model);

// Whether spec.parallelism.tensor_compression `spec` sends the block
// units' all-reduces through a codec (AllReduceEncoded); token_topk alone
// sums the kept rows exactly (AllReduce). INVALID_ARGUMENT for a spec jobs
// refuse.
absl::StatusOr<bool> TensorParallelEncoded(const std::string& spec);

// The CPU seconds AccTFM's hybrid compression `spec` spends coding an
// attention or MLP all-reduce, per fp32 byte of the whole tensor: the kept
// share (TopKCount(keep, seq_len) / seq_len) x the profile's measured cost
// per byte of AllReduceEncoded through the spec's codec
// (QuantizedAllReduceSecondsPerByte: its family's 8-bit one when not
// measured itself); 0 without a codec (token top-k alone sums the kept
// rows exactly) or without the profile's timings. The all-reduces the
// costs below count end that much later. INVALID_ARGUMENT for a spec jobs
// refuse.
absl::StatusOr<double> TensorParallelCodingSecondsPerByte(const std::string& spec, int seq_len,
                                                          const ModelProfile& profile);

// The profile as one rank of a tensor-parallel group of `tensor` sees it,
// for the planner and the simulator (the group is planned as one worker):
// per unit the compute / T plus the all-reduces the rank waits for, each
// by eq. 3 for the algorithm the group runs for its size (one exchange at
// T = 2; recursive doubling below 64 KiB for a power of two without a
// codec; else the ring):
//   attention, MLP: K = forward[u] (backward[u]) partitions, the all-reduce
//     of partition j (its bytes times block_wire_fraction, and its bytes
//     times block_coding_seconds_per_byte of coding) overlapping the
//     compute of j + 1 and, as the runtime streams partitions from one
//     block unit into the next, the next unit's first partitions: all block
//     units together are acctfm.h's timeline (EvaluateSizes), and each is
//     charged the end of that timeline through it minus the end through
//     the unit before (backward: from the last unit), its
//     TensorParallelPass::charged_seconds. This assumes every block unit
//     shares a stage with its neighbours; at a stage cut the runtime waits
//     for the last unit's all-reduces, which the charges leave out (an
//     under-estimate of at most one partition's all-reduce per cut and
//     pass). The lane fields still describe the unit alone, for drawing;
//   embed: forward + one all-reduce of its output; backward compute only;
//   head: forward + two all-reduces of a few floats per token, the row
//     maxima [T, tokens] and the softmax partials [2, tokens] (`tokens`:
//     a micro-batch's; 0, not known: their latency only);
//     backward + one all-reduce of its input's size.
// Weights are divided by T (the shards; replicated vectors are small), but
// for the embedding's wpe, whole on every rank (the embedding's weights
// less the head's). A
// block unit's and the head's stash, and the head's transient (its logit
// gradient), are a rank's share: the LayerNorm's input, output and
// statistics whole, the rest (the heads' q, k, v, outputs and
// probabilities, the MLP's hidden columns, the vocabulary slice's logits)
// divided by T; other transients and activations are kept. The partition
// counts are not cut to the micro-batch's samples here.
// INVALID_ARGUMENT when tensor < 2 or a vector is not one count per unit.
// The passes behind those costs, per unit (tensor_parallel_lanes.h), for
// drawing the all-reduces on the simulated timeline; PassSeconds of each is
// the cost above. The same arguments and errors, and INVALID_ARGUMENT for
// a block unit's partition count other than 1, 2 or 4.
absl::StatusOr<std::vector<TensorParallelUnitLanes>> TensorParallelUnitPasses(
    const ModelProfile& profile, int tensor, const std::vector<int>& forward,
    const std::vector<int>& backward, double bandwidth_bytes_per_second, double latency_seconds,
    double block_wire_fraction = 1.0, double block_coding_seconds_per_byte = 0.0,
    bool block_encoded = false, int64_t tokens = 0);

absl::StatusOr<ModelProfile> TensorParallelUnitCosts(
    const ModelProfile& profile, int tensor, const std::vector<int>& forward,
    const std::vector<int>& backward, double bandwidth_bytes_per_second, double latency_seconds,
    double block_wire_fraction = 1.0, double block_coding_seconds_per_byte = 0.0,
    bool block_encoded = false, int64_t tokens = 0);

// TensorParallelUnitCosts from passes TensorParallelUnitPasses computed (one
// per unit of `profile`, checked by the caller): each unit's weights / T and
// PassSeconds of its passes, split in two as the planner's consumers
// divide by a worker's speed: fwd_seconds / bwd_seconds the pass's compute
// (at most PassSeconds) and fwd_comm_seconds / bwd_comm_seconds what it
// waits beyond it (>= 0), which no speed shortens. The passes were computed
// from `profile`'s compute divided by `speed` (> 0; the group's, so that
// the all-reduces overlap the compute as the group runs it): the compute
// is multiplied back by it, to the speed-1 seconds the consumers divide.
// The all-reduces' coding (CPU work, passed at the group's speed as well)
// counts with them: what the compute does not hide of it is in the waits,
// at that speed, not multiplied back.
ModelProfile TensorParallelCostsOf(const ModelProfile& profile, int tensor,
                                   const std::vector<TensorParallelUnitLanes>& passes,
                                   double speed = 1.0);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_TENSOR_PARTITIONS_H_
