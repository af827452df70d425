// Selective stage compression (Optimus-CC §7): compress the data-parallel
// all-reduce only on the stages whose all-reduce lies on the critical path.
// Under 1F1B the first stages finish their backward passes last, so their
// all-reduce ends the step while the later stages' overlaps the others'
// cool-down; compressing those later stages would add error and buy no
// time. The choice here reads the simulated iteration (simulator.h with
// data_parallel > 1), so it holds for any plan, Bi-Partition included.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_SELECTIVE_COMPRESSION_H_
#define PIPETRAIN_COORDINATOR_PLANNER_SELECTIVE_COMPRESSION_H_

#include <vector>

#include "coordinator/planner/partition.h"
#include "coordinator/planner/simulator.h"
#include "kernels/compress/codec.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {

// Per stage (backward ranges of one replica): the share of its
// data-parallel bytes that PowerSGD of `rank` sends, as the runtime
// compresses (StageSetup::data_parallel_powersgd_rank): a 2-D gradient
// [rows, cols] other than the tied wte goes as r (rows + cols) values when
// that is fewer, everything else whole. 1 for a stage without gradients.
std::vector<double> PowerSgdByteFractions(const GptConfig& model,
                                          const std::vector<Range>& backward, int rank);

// The same for a quantizer carrying the all-reduce
// (StageSetup::data_parallel_quantizer): every gradient but the tied wte
// (exact) goes as one flat tensor through `codec`, so a stage sends
// EncodedBytes([n, 1]) for its n other values. 1 for a stage without
// gradients.
std::vector<double> QuantizerByteFractions(const GptConfig& model,
                                           const std::vector<Range>& backward, const Codec& codec);

// The stages to compress, ascending: greedily, while the worker that ends
// the iteration last has an uncompressed all-reduce, compress it: its
// end moves earlier by its all-reduce's simulated time at the step less
// `fraction` of all its all-reduces' length (a compressed all-reduce runs
// whole at the step; an exact one may overlap the backward pass in
// buckets, simulator.h, and then compressing it can gain little or lose);
// what follows the all-reduce there, the optimizer step and weight syncs,
// moves with it. Stops when the last worker has no all-reduce, is
// compressed already, or would gain nothing; so the result reaches the
// least step time any set of stages reaches under this model.
std::vector<int> ChooseCompressedStages(const SimulationResult& simulation,
                                        const std::vector<double>& fractions);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_SELECTIVE_COMPRESSION_H_
