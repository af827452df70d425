// Selective stage compression (Optimus-CC §7): compress the data-parallel
// all-reduce only on the stages whose all-reduce lies on the critical path.
// Under 1F1B the first stages finish their backward passes last, so their
// all-reduce ends the step while the later stages' overlaps the others'
// cool-down; compressing those later stages would add error and buy no
// time. The choice here reads the simulated iteration (simulator.h with
// data_parallel > 1), so it holds for any plan, Bi-Partition included.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_SELECTIVE_COMPRESSION_H_
#define PIPETRAIN_COORDINATOR_PLANNER_SELECTIVE_COMPRESSION_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/partition.h"
#include "coordinator/planner/simulator.h"
#include "kernels/compress/codec.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {

// Per stage (backward ranges of one replica): the share of its
// data-parallel gradient bytes other than the tied wte's (which always go
// exact) that PowerSGD of `rank` sends, as the runtime compresses
// (StageSetup::data_parallel_powersgd_rank, StageRuntime::PowerSgdPays):
// each tensor rank all-reduces its own shards, so with `tensor_parallel`
// T 1-D tensor ranks a parameter counts as one rank's shard (its
// ParameterShape::split_dim cut into T, or whole where it has none), and a
// 2-D shard [rows, cols] goes as r (rows + cols) values when that is fewer
// than rows * cols, everything else whole
// (SimulationCosts::all_reduce_byte_fraction). 1 for a stage without such
// gradients. T 1 (or below) prices whole matrices; a dimension T does not
// divide (which ValidateTensorParallel refuses) is priced whole.
std::vector<double> PowerSgdByteFractions(const GptConfig& model,
                                          const std::vector<Range>& backward, int rank,
                                          int tensor_parallel);

// The same for a quantizer carrying the all-reduce
// (StageSetup::data_parallel_quantizer): every gradient but the tied wte
// goes through `codec` in flat tensors (one per bucket), counted as one
// of EncodedBytes([n, 1]) for the stage's n values (a bucket's header more
// or less), at most 1 (a stage of so few values that the header outweighs
// them counts as raw). 1 for a stage without such gradients.
std::vector<double> QuantizerByteFractions(const GptConfig& model,
                                           const std::vector<Range>& backward, const Codec& codec);

// Simulates the step with `compressed` (ascending stage indices) sending
// their data-parallel all-reduce through the codec, the others exact.
using CompressedStepSimulator =
    std::function<absl::StatusOr<SimulationResult>(const std::vector<int>& compressed)>;

struct CompressedStages {
  std::vector<int> stages;      // ascending
  SimulationResult simulation;  // the step with them compressed
};

// The least gain that makes a stage worth compressing, as a fraction of
// the simulated step: the worker's end must move earlier by at least this
// much. Below it the codec's error buys no time a user could measure (the
// demo's measured steps vary by several percent), and the choice would
// follow the noise of each run's profile: on a 2-vCPU VM a stage whose
// gain sat near the codec's own cost was chosen in one run and not the
// next (docs/benchmarks.md, selective stage compression).
inline constexpr double kMinCompressionGain = 0.02;

// The stages to compress: greedily, while the worker that ends the
// simulated step last (ties: the lower index) has a data-parallel
// all-reduce (at the step or in overlapped buckets), is not compressed yet
// and has fraction[w] < 1 (missing: 1), simulate the step with it
// compressed too and keep it if its own end moved earlier by at least
// `min_gain` of the step (and by more than 0); otherwise stop.
// A compressed all-reduce sends fewer bytes and overlaps as an exact one
// does (simulator.h), so compressing a stage whose buckets already hide
// behind the backward pass gains nothing and is not chosen. When each
// worker's end depends only on its own stage's compression (the
// simulator's all-reduce touches no other worker), the result's step time
// is within `min_gain` of the step (its own) of the least of any set of
// stages, and with `min_gain` 0 reaches it. Errors: `simulate`'s.
absl::StatusOr<CompressedStages> ChooseCompressedStages(const CompressedStepSimulator& simulate,
                                                        const std::vector<double>& fractions,
                                                        double min_gain = kMinCompressionGain);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_SELECTIVE_COMPRESSION_H_
