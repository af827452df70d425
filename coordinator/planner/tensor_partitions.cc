#include "coordinator/planner/tensor_partitions.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/elem_topk_codec.h"
#include "worker/collectives/all_reduce_algorithm.h"
#include "worker/model/tensor_parallel.h"

namespace pipetrain {

namespace {

// The group's links for eq. 3; the algorithm is each all-reduce's own
// (GroupAllReduceSeconds).
AllReduceModel RuntimeModel(int tensor, double bandwidth_bytes_per_second, double latency_seconds) {
  AllReduceModel model;
  model.alpha_seconds = latency_seconds;
  model.beta_seconds_per_byte =
      bandwidth_bytes_per_second > 0 ? 1.0 / bandwidth_bytes_per_second : 0.0;
  model.group_size = tensor;
  return model;
}

// Eq. 3 for one all-reduce of `bytes` on the wire as the group runs it:
// Collectives::AllReduce's recursive doubling for two ranks, or a power of
// two below kSmallAllReduceBytes (log2 T exchanges: 3 latencies at T = 8
// where the ring pays 14); else the ring. Through a codec
// (AllReduceEncoded) two ranks exchange once too, and more run the ring
// at any size.
absl::StatusOr<double> GroupAllReduceSeconds(AllReduceModel model, double bytes, bool encoded) {
  const bool doubling =
      encoded ? model.group_size == 2 : AllReduceRunsRecursiveDoubling(model.group_size, bytes);
  model.algorithm = doubling ? AllReduceAlgorithm::kRecursiveDoubling : AllReduceAlgorithm::kRing;
  return AllReduceSeconds(model, bytes);
}

// One of K micro-partitions of the unit on one rank of `tensor`: measured
// when the profile has K's timing, else the whole pass / K; either / T.
double PartitionSeconds(const UnitProfile& unit, int k, bool forward, int tensor) {
  auto it = unit.partition_seconds.find(k);
  if (k > 1 && it != unit.partition_seconds.end()) {
    return (forward ? it->second.first : it->second.second) / tensor;
  }
  return (forward ? unit.fwd_seconds : unit.bwd_seconds) / tensor / k;
}

// Alg. 1's problem over the profile's attention and MLP units (model
// order; their profile indices in *layer_units), all-reduce seconds per
// size from eq. 3 (RuntimeModel).
absl::StatusOr<AccTfmProblem> BlockUnitsProblem(const ModelProfile& profile, int tensor,
                                                double bandwidth_bytes_per_second,
                                                double latency_seconds, double block_wire_fraction,
                                                double block_coding_seconds_per_byte,
                                                bool block_encoded, std::vector<int>* layer_units) {
  const AllReduceModel model = RuntimeModel(tensor, bandwidth_bytes_per_second, latency_seconds);
  AccTfmProblem problem;
  layer_units->clear();
  for (size_t u = 0; u < profile.units.size(); ++u) {
    const UnitProfile& unit = profile.units[u];
    if (!IsTensorParallelBlockUnit(unit)) continue;
    AccTfmLayer layer;
    for (int k : kAccTfmSizes) {
      layer.fwd_compute_seconds.push_back(PartitionSeconds(unit, k, true, tensor));
      layer.bwd_compute_seconds.push_back(PartitionSeconds(unit, k, false, tensor));
      ASSIGN_OR_RETURN(const double seconds,
                       GroupAllReduceSeconds(model, unit.activation_bytes * block_wire_fraction / k,
                                             block_encoded));
      layer.allreduce_seconds.push_back(seconds +
                                        block_coding_seconds_per_byte * unit.activation_bytes / k);
    }
    problem.layers.push_back(std::move(layer));
    layer_units->push_back(static_cast<int>(u));
  }
  return problem;
}

// The runtime streams a block unit's partitions into the next block unit
// (Unit::set_stream_output), so a run of block units is Alg. 1's timeline
// (acctfm.h EvaluateSizes) as a whole. Each unit is charged its share:
// the end of the timeline through it minus the end through the one before
// (forward in model order, backward from the last unit), so the charges
// of a run add up to its timeline. `sizes[l]` per layer of `problem`.
absl::StatusOr<std::vector<double>> StreamedCharges(const AccTfmProblem& problem, AccTfmPass pass,
                                                    const std::vector<int>& sizes) {
  const size_t n = problem.layers.size();
  std::vector<double> charges(n, 0.0);
  double before = 0;
  for (size_t i = 0; i < n; ++i) {
    // Forward: layers [0, l]; backward: layers [l, n), l from the last.
    const size_t l = pass == AccTfmPass::kForward ? i : n - 1 - i;
    AccTfmProblem part;
    std::vector<int> part_sizes;
    const size_t begin = pass == AccTfmPass::kForward ? 0 : l;
    const size_t end = pass == AccTfmPass::kForward ? l + 1 : n;
    for (size_t j = begin; j < end; ++j) {
      part.layers.push_back(problem.layers[j]);
      part_sizes.push_back(sizes[j]);
    }
    ASSIGN_OR_RETURN(const double through, EvaluateSizes(part, pass, part_sizes));
    charges[l] = through - before;
    before = through;
  }
  return charges;
}

}  // namespace

bool IsTensorParallelBlockUnit(const UnitProfile& unit) {
  return absl::StartsWith(unit.name, "attn_") || absl::StartsWith(unit.name, "mlp_");
}

absl::StatusOr<double> TensorParallelWireFraction(const std::string& spec, int64_t tokens,
                                                  int seq_len, int64_t d_model) {
  ASSIGN_OR_RETURN(TensorParallelCompression compression,
                   MakeTensorParallelCompression(spec, "spec.parallelism.tensor_compression"));
  if (tokens < 1 || d_model < 1 || seq_len < 1 || tokens % seq_len != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a [", tokens, ", ", d_model,
                                                   "] all-reduce of samples of ", seq_len,
                                                   " tokens has no bytes"));
  }
  // The rows sent: per sample the rounded-up share the runtime keeps
  // (KeepTopTokensPerSample), not keep x tokens (2 of 16 rows at keep 0.1,
  // not 1.6).
  const int64_t rows = tokens / seq_len * TopKCount(compression.keep, seq_len);
  const double fp32 = 4.0 * static_cast<double>(tokens) * static_cast<double>(d_model);
  const double encoded =
      compression.codec == nullptr
          ? 4.0 * static_cast<double>(rows) * static_cast<double>(d_model)
          : static_cast<double>(compression.codec->EncodedBytes({rows, d_model}));
  return encoded / fp32;
}

absl::StatusOr<bool> TensorParallelEncoded(const std::string& spec) {
  ASSIGN_OR_RETURN(TensorParallelCompression compression,
                   MakeTensorParallelCompression(spec, "spec.parallelism.tensor_compression"));
  return compression.codec != nullptr;
}

absl::StatusOr<double> TensorParallelCodingSecondsPerByte(const std::string& spec, int seq_len,
                                                          const ModelProfile& profile) {
  ASSIGN_OR_RETURN(TensorParallelCompression compression,
                   MakeTensorParallelCompression(spec, "spec.parallelism.tensor_compression"));
  if (compression.codec == nullptr) return 0.0;
  if (seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("samples of ", seq_len, " tokens"));
  }
  const double kept = static_cast<double>(TopKCount(compression.keep, seq_len)) / seq_len;
  return kept * QuantizedAllReduceSecondsPerByte(profile, compression.codec->name());
}

absl::StatusOr<TensorPartitionPlan> ChooseTensorPartitions(const ModelProfile& profile, int tensor,
                                                           double bandwidth_bytes_per_second,
                                                           double latency_seconds,
                                                           double block_wire_fraction,
                                                           double block_coding_seconds_per_byte,
                                                           bool block_encoded) {
  if (tensor < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("AccTFM partitions need a tensor-parallel group of 2 or more, got ", tensor));
  }
  std::vector<int> layer_units;  // the profile's index of each layer
  ASSIGN_OR_RETURN(const AccTfmProblem problem,
                   BlockUnitsProblem(profile, tensor, bandwidth_bytes_per_second, latency_seconds,
                                     block_wire_fraction, block_coding_seconds_per_byte,
                                     block_encoded, &layer_units));
  if (problem.layers.empty()) {
    return absl::InvalidArgumentError("the profile has no attention or MLP unit to partition");
  }
  TensorPartitionPlan out;
  ASSIGN_OR_RETURN(out.solution, SolveAccTfm(problem));
  out.forward.assign(profile.units.size(), 1);
  out.backward.assign(profile.units.size(), 1);
  for (size_t l = 0; l < layer_units.size(); ++l) {
    out.forward[layer_units[l]] = out.solution.forward.plan.partition_sizes[l];
    out.backward[layer_units[l]] = out.solution.backward.plan.partition_sizes[l];
  }
  // The runtime's timeline (TensorParallelUnitPasses: the block units'
  // streamed charges, which add up to Alg. 1's timeline where every block
  // unit shares a stage with its neighbours): the block units' passes
  // summed, forward and backward apart.
  const auto runtime_seconds =
      [&](const std::vector<int>& forward,
          const std::vector<int>& backward) -> absl::StatusOr<std::pair<double, double>> {
    ASSIGN_OR_RETURN(
        const std::vector<TensorParallelUnitLanes> passes,
        TensorParallelUnitPasses(profile, tensor, forward, backward, bandwidth_bytes_per_second,
                                 latency_seconds, block_wire_fraction,
                                 block_coding_seconds_per_byte, block_encoded));
    std::pair<double, double> sum{0, 0};
    for (int u : layer_units) {
      sum.first += PassSeconds(passes[u].forward);
      sum.second += PassSeconds(passes[u].backward);
    }
    return sum;
  };
  using PassTotals = std::pair<double, double>;  // forward, backward
  ASSIGN_OR_RETURN(PassTotals best, runtime_seconds(out.forward, out.backward));
  for (int k : kAccTfmSizes) {
    std::vector<int> uniform(profile.units.size(), 1);
    for (int u : layer_units) uniform[u] = k;
    ASSIGN_OR_RETURN(const PassTotals seconds, runtime_seconds(uniform, uniform));
    if (seconds.first < best.first) {
      best.first = seconds.first;
      out.forward = uniform;
      out.forward_uniform_by_runtime = true;
    }
    if (seconds.second < best.second) {
      best.second = seconds.second;
      out.backward = uniform;
      out.backward_uniform_by_runtime = true;
    }
  }
  return out;
}

absl::StatusOr<std::vector<TensorParallelUnitLanes>> TensorParallelUnitPasses(
    const ModelProfile& profile, int tensor, const std::vector<int>& forward,
    const std::vector<int>& backward, double bandwidth_bytes_per_second, double latency_seconds,
    double block_wire_fraction, double block_coding_seconds_per_byte, bool block_encoded,
    int64_t tokens) {
  if (tensor < 2 || forward.size() != profile.units.size() ||
      backward.size() != profile.units.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel unit costs: ", tensor, " ranks, ", forward.size(), " and ",
                     backward.size(), " partition counts for ", profile.units.size(), " units"));
  }
  const AllReduceModel model = RuntimeModel(tensor, bandwidth_bytes_per_second, latency_seconds);
  std::vector<TensorParallelUnitLanes> out(profile.units.size());
  for (size_t u = 0; u < profile.units.size(); ++u) {
    const UnitProfile& in = profile.units[u];
    TensorParallelUnitLanes& lanes = out[u];
    lanes.forward.compute_seconds = in.fwd_seconds / tensor;
    lanes.backward.compute_seconds = in.bwd_seconds / tensor;
    if (IsTensorParallelBlockUnit(in)) {
      // acctfm.h's timeline for the unit alone: K partitions, each
      // all-reducing 1/K of the output (or of its gradient).
      for (auto [pass, k] : {std::pair<TensorParallelPass*, int>{&lanes.forward, forward[u]},
                             {&lanes.backward, backward[u]}}) {
        if (k != 1 && k != 2 && k != 4) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tensor-parallel unit costs: unit ", u, " has ", k, " partitions; want 1, 2 or 4"));
        }
        pass->partitions = k;
        pass->compute_seconds = k * PartitionSeconds(in, k, pass == &lanes.forward, tensor);
        ASSIGN_OR_RETURN(pass->all_reduce_seconds,
                         GroupAllReduceSeconds(model, in.activation_bytes * block_wire_fraction / k,
                                               block_encoded));
        pass->all_reduce_seconds += block_coding_seconds_per_byte * in.activation_bytes / k;
      }
    } else if (u == 0) {
      ASSIGN_OR_RETURN(lanes.forward.all_reduce_seconds,
                       GroupAllReduceSeconds(model, in.activation_bytes, false));
    } else if (u + 1 == profile.units.size()) {
      // The row maxima [T, tokens] and the softmax partials [2, tokens]: a
      // few floats a token, each all-reduced by the algorithm its size
      // gets (head_unit.cc).
      const double n = static_cast<double>(tokens);
      ASSIGN_OR_RETURN(const double maxima, GroupAllReduceSeconds(model, 4.0 * tensor * n, false));
      ASSIGN_OR_RETURN(const double partials, GroupAllReduceSeconds(model, 8.0 * n, false));
      lanes.forward.all_reduce_seconds = maxima + partials;
      ASSIGN_OR_RETURN(lanes.backward.all_reduce_seconds,
                       GroupAllReduceSeconds(model, profile.units[u - 1].activation_bytes, false));
    }
  }
  // The block units stream into each other: charge each its share of the
  // run's timeline instead of its timeline alone.
  std::vector<int> layer_units;
  ASSIGN_OR_RETURN(const AccTfmProblem problem,
                   BlockUnitsProblem(profile, tensor, bandwidth_bytes_per_second, latency_seconds,
                                     block_wire_fraction, block_coding_seconds_per_byte,
                                     block_encoded, &layer_units));
  if (problem.layers.empty()) return out;
  std::vector<int> forward_sizes, backward_sizes;
  for (int u : layer_units) {
    forward_sizes.push_back(forward[u]);
    backward_sizes.push_back(backward[u]);
  }
  ASSIGN_OR_RETURN(const std::vector<double> forward_charges,
                   StreamedCharges(problem, AccTfmPass::kForward, forward_sizes));
  ASSIGN_OR_RETURN(const std::vector<double> backward_charges,
                   StreamedCharges(problem, AccTfmPass::kBackward, backward_sizes));
  for (size_t l = 0; l < layer_units.size(); ++l) {
    out[layer_units[l]].forward.charged_seconds = forward_charges[l];
    out[layer_units[l]].backward.charged_seconds = backward_charges[l];
  }
  return out;
}

absl::StatusOr<ModelProfile> TensorParallelUnitCosts(
    const ModelProfile& profile, int tensor, const std::vector<int>& forward,
    const std::vector<int>& backward, double bandwidth_bytes_per_second, double latency_seconds,
    double block_wire_fraction, double block_coding_seconds_per_byte, bool block_encoded,
    int64_t tokens) {
  ASSIGN_OR_RETURN(
      const std::vector<TensorParallelUnitLanes> passes,
      TensorParallelUnitPasses(profile, tensor, forward, backward, bandwidth_bytes_per_second,
                               latency_seconds, block_wire_fraction, block_coding_seconds_per_byte,
                               block_encoded, tokens));
  return TensorParallelCostsOf(profile, tensor, passes);
}

namespace {

// What a rank of a block unit or the head keeps of `whole` bytes (its stash,
// or the head's transient): the replicated part, the LayerNorm's input and
// output ([B, T, d] each, the unit's input size `input_bytes`) and its
// per-token statistics, whole; the rest (q, k, v, the attention output
// and probabilities of its heads; the MLP's hidden columns; the head's
// logits and their gradient over its vocabulary slice) divided by T. The
// statistics (8 bytes a token) are covered by 1/32 more of the input (d >=
// 32), so the estimate does not fall below what a rank allocates.
double RankShare(double whole, double input_bytes, int tensor) {
  const double replicated = std::min(whole, 2 * input_bytes * 33.0 / 32.0);
  return replicated + (whole - replicated) / tensor;
}

}  // namespace

ModelProfile TensorParallelCostsOf(const ModelProfile& profile, int tensor,
                                   const std::vector<TensorParallelUnitLanes>& passes,
                                   double speed) {
  ModelProfile out = profile;
  // wpe [max_seq_len, d] stays whole on every rank (tensor_parallel.h): the
  // embedding (wte + wpe) less the head (wte + ln_f's 2·d floats), which
  // leaves it 8·d bytes short. A long context makes it large (8192 x 4096:
  // 134 MB a rank, four times with its gradient and moments).
  const double wpe_bytes =
      profile.units.size() >= 2
          ? std::max(0.0, profile.units.front().weight_bytes - profile.units.back().weight_bytes)
          : 0.0;
  for (size_t u = 0; u < profile.units.size(); ++u) {
    UnitProfile& unit = out.units[u];
    unit.weight_bytes = u == 0 ? (profile.units[u].weight_bytes - wpe_bytes) / tensor + wpe_bytes
                               : profile.units[u].weight_bytes / tensor;
    const bool head = u > 0 && u + 1 == profile.units.size();
    if (u > 0 && (IsTensorParallelBlockUnit(unit) || head)) {
      const double input_bytes = profile.units[u - 1].activation_bytes;
      unit.stash_bytes = RankShare(unit.stash_bytes, input_bytes, tensor);
      // The head's transient is its logit gradient over the rank's slice.
      if (head) unit.transient_bytes = RankShare(unit.transient_bytes, input_bytes, tensor);
    }
    unit.optimizer_seconds = profile.units[u].optimizer_seconds / tensor;  // its shard's
    // A streamed block unit may be charged less than its compute (its
    // first partitions ran under the unit before's all-reduces): then all
    // of its charge is compute, and none of it waits.
    for (auto [pass, compute, comm] :
         {std::tuple{&passes[u].forward, &unit.fwd_seconds, &unit.fwd_comm_seconds},
          std::tuple{&passes[u].backward, &unit.bwd_seconds, &unit.bwd_comm_seconds}}) {
      const double charged = PassSeconds(*pass);
      const double computing = std::min(charged, pass->compute_seconds);
      *compute = computing * speed;
      *comm = charged - computing;
    }
  }
  return out;
}

}  // namespace pipetrain
