// The planner's memory model (bipartition.h memory_i) against what the
// runtimes allocate: a CPU pipeline in one process, read with the host
// tensor counters (common/tensor.h). The counters are the process's, so the
// bound is the sum of the workers' memory_i: each worker must stay within
// its own, and the process within the sum.
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "common/tensor.h"
#include "coordinator/planner/bipartition.h"
#include "coordinator/planner/partition.h"
#include "coordinator/planner/profile.h"
#include "coordinator/planner/schedule_compiler.h"
#include "coordinator/planner/solve_plan.h"
#include "gtest/gtest.h"
#include "worker/data/synthetic_text.h"
#include "worker/runtime/pipeline_testing.h"
#include "worker/runtime/stage_runtime.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

// A model whose tied wte (vocab x d_model, 4 MiB) dwarfs a stage's stash,
// so that a copy of it the plan does not count shows.
TrainConfig WteHeavyConfig() {
  TrainConfig c = testing::SmallConfig();
  c.model.vocab_size = 4096;
  c.model.d_model = 256;
  c.model.n_head = 4;
  c.model.n_layer = 2;
  c.model.max_seq_len = 32;
  c.seq_len = 32;
  c.eval_interval = 2;  // RunPipeline: a validation pass after the last of 2 steps
  return c;
}

Dataset MakeDataset(const TrainConfig& c) {
  const std::string text = GenerateEnglishText(5, 100000);
  return Dataset::Create(std::vector<uint16_t>(text.begin(), text.end()), c.seq_len, 0.1).value();
}

// The head alone on stage 1 (finding 4 of the memory review): the two
// stages swap their wte gradients at the end of each step.
std::vector<Range> HeadAlone(const TrainConfig& c) {
  const int units = NumUnits(c.model);
  return {{0, units - 1}, {units - 1, units}};
}

// memory_i summed over the workers of `ranges` (forward == backward, 1F1B),
// from the analytic profile of the CPU backend's units, the tied wte as
// MakeBiPartitionProblem counts it, no snapshot (c_i = 0). With
// `between_steps`, the terms a stage holds between steps only: stash and
// transient bytes set to 0 leave the weights, gradients and AdamW moments.
double PlannedMemory(const TrainConfig& c, const std::vector<Range>& ranges, bool between_steps) {
  const int per = c.batch_size / c.micro_batches;
  ModelProfile profile = AnalyticProfile(c.model, c.seq_len, per, 1e9);
  if (between_steps) {
    for (UnitProfile& u : profile.units) u.stash_bytes = u.transient_bytes = 0;
  }
  ClusterSpec cluster;
  cluster.workers.resize(ranges.size());
  BiPartitionProblem problem = MakeBiPartitionProblem(profile, cluster);
  problem.micro_batches = c.micro_batches;
  problem.schedule = BiPartitionSchedule::kOneFOneB;
  const BiPartitionCosts costs(problem);
  double sum = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    sum += costs.Memory(static_cast<int>(i), ranges[i], ranges[i]);
  }
  return sum;
}

// Between steps a stage holds what memory_i charges it beyond its stash and
// transient: no received wte gradient. AddTied drops the peer's part once
// added; kept to the next step, it was 2 x 4 MiB over here (both owners),
// through the optimizer step, a validation pass and a snapshot.
TEST(StageRuntimeMemoryTest, HeadAloneOnItsStage_BetweenStepsHoldsOnlyPlannedWeights) {
  const TrainConfig c = WteHeavyConfig();
  const Dataset data = MakeDataset(c);
  const std::vector<Range> ranges = HeadAlone(c);
  const int stages = static_cast<int>(ranges.size());
  const std::vector<v1::Program> programs =
      CompileBiPartitionPrograms(ranges, ranges, NumUnits(c.model), c.micro_batches,
                                 Schedule::kOneFOneB)
          .value();
  const int64_t before = CurrentHostTensorMemory().live_bytes;
  InProcessFabric fabric(stages);
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::unique_ptr<StageRuntime>> runtimes;
  for (int s = 0; s < stages; ++s) {
    transports.push_back(fabric.Connect(s));
    StageSetup setup{
        "job-memory",     c, s, stages, ToUnitRange(ranges[s]), ToUnitRange(ranges[s]), programs[s],
        absl::Seconds(30)};
    for (int t = 0; t < stages; ++t) setup.optimizer_stages.push_back(t);
    runtimes.push_back(StageRuntime::Create(setup, &data, transports[s].get()).value());
  }
  // Two steps: the first allocates the AdamW moments.
  std::vector<absl::Status> errors(stages);
  std::vector<std::thread> threads;
  for (int s = 0; s < stages; ++s) {
    threads.emplace_back([&, s] {
      for (int i = 0; i < 2 && errors[s].ok(); ++i) {
        absl::StatusOr<IterationResult> r = runtimes[s]->RunIteration(i);
        if (!r.ok()) {
          errors[s] = r.status();
          fabric.Shutdown();  // the other fails at once instead of timing out
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int s = 0; s < stages; ++s)
    ASSERT_TRUE(errors[s].ok()) << "stage " << s << ": " << errors[s];
  const int64_t held = CurrentHostTensorMemory().live_bytes - before;
  // Exact: 4 x the stages' weights, wte counted once on each stage, and the
  // head's [1] loss of each micro-batch, which it keeps to the next step
  // (StageRuntime::losses_; unplanned, 16 bytes).
  const int64_t losses = int64_t{4} * c.micro_batches;
  EXPECT_EQ(held, static_cast<int64_t>(PlannedMemory(c, ranges, /*between_steps=*/true)) + losses);
}

}  // namespace
}  // namespace pipetrain
