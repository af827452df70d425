// DESIGN.md §4 in one process: pipelines of 1-4 stages, uniform and
// pipedream partitions, Bi-Partition plans whose forward and backward cuts
// differ (recompute, input routing, weight sync), 1F1B and GPipe schedules,
// must reproduce the single-process trainer's losses and weights. With the tied-gradient rule
// (unit.h) and backward passes visiting micro-batches in order, they agree
// bitwise, so the test demands exact equality. Validation passes (every 4
// steps and after the last, over 7 windows: micro-batches of 2, 2, 2 and 1)
// must equal LocalTrainer::Evaluate bitwise too.
#include <thread>

#include "coordinator/planner/partition.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "worker/data/synthetic_text.h"
#include "worker/runtime/stage_runtime.h"
#include "worker/train/local_trainer.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

constexpr int kIterations = 10;

TrainConfig SmallConfig() {
  TrainConfig c;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.d_model = 32;
  c.model.max_seq_len = 16;
  c.seq_len = 16;
  c.batch_size = 8;
  c.micro_batches = 4;
  c.adam.lr = 1e-3f;
  c.seed = 3;
  c.eval_interval = 4;
  c.eval_windows = 7;
  return c;
}

Dataset MakeDataset() {
  std::string text = GenerateEnglishText(5, 100000);
  return Dataset::Create(std::vector<uint16_t>(text.begin(), text.end()), 16, 0.1).value();
}

bool EvaluatesAfter(const TrainConfig& c, int step) {
  return c.eval_interval > 0 && (step % c.eval_interval == 0 || step == kIterations);
}

struct RunOutput {
  std::vector<float> losses;
  std::vector<float> val_losses;
  std::map<std::string, std::vector<float>> weights;  // every copy must agree
};

RunOutput RunLocal(const TrainConfig& c, const Dataset& data) {
  auto trainer = LocalTrainer::Create(c, &data).value();
  RunOutput out;
  for (int i = 0; i < kIterations; ++i) {
    out.losses.push_back(trainer->Step().value().loss);
    if (EvaluatesAfter(c, i + 1)) out.val_losses.push_back(trainer->Evaluate().value());
  }
  for (Parameter* p : trainer->model().parameters()) out.weights[p->name] = p->value.ToVector();
  return out;
}

RunOutput RunPipeline(const TrainConfig& c, const Dataset& data, const std::vector<Range>& forward,
                      const std::vector<Range>& backward, Schedule schedule) {
  const int stages = static_cast<int>(forward.size());
  const int units = NumUnits(c.model);
  auto programs =
      CompileBiPartitionPrograms(forward, backward, units, c.micro_batches, schedule).value();
  const int per = c.batch_size / c.micro_batches;
  auto eval_programs =
      CompileEvalPrograms(forward, units, (c.eval_windows + per - 1) / per).value();
  InProcessFabric fabric(stages);
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::unique_ptr<StageRuntime>> runtimes;
  for (int s = 0; s < stages; ++s) {
    transports.push_back(fabric.Connect(s));
    StageSetup setup{"job-eq", c, s, stages, ToUnitRange(forward[s]), ToUnitRange(backward[s]),
                     programs[s], absl::Seconds(30), eval_programs[s]};
    runtimes.push_back(StageRuntime::Create(setup, &data, transports[s].get()).value());
  }
  std::vector<std::vector<IterationResult>> results(stages);
  std::vector<std::vector<float>> val_losses(stages);
  std::vector<absl::Status> errors(stages);
  std::vector<std::thread> threads;
  for (int s = 0; s < stages; ++s) {
    threads.emplace_back([&, s] {
      for (int i = 0; i < kIterations && errors[s].ok(); ++i) {
        auto r = runtimes[s]->RunIteration(i);
        if (!r.ok()) {
          errors[s] = r.status();
          fabric.Shutdown();  // wake the other stages instead of letting them time out
          break;
        }
        results[s].push_back(*r);
        if (!EvaluatesAfter(c, i + 1)) continue;
        auto val = runtimes[s]->RunEval(i + 1);
        if (!val.ok()) {
          errors[s] = val.status();
          fabric.Shutdown();
        } else if (val->has_value()) {
          val_losses[s].push_back(**val);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  RunOutput out;
  for (int s = 0; s < stages; ++s) EXPECT_TRUE(errors[s].ok()) << errors[s];
  int loss_stage = 0;  // the forward owner of head reports the losses
  while (forward[loss_stage].end != units) ++loss_stage;
  for (const IterationResult& r : results[loss_stage]) {
    double sum = 0.0;  // LocalTrainer's mean: double sum, divided, as float
    for (float l : r.micro_batch_losses) sum += l;
    out.losses.push_back(static_cast<float>(sum / c.micro_batches));
  }
  out.val_losses = val_losses[loss_stage];
  for (int s = 0; s < stages; ++s) {
    if (s != loss_stage) EXPECT_TRUE(val_losses[s].empty()) << "stage " << s;
  }
  for (int s = 0; s < stages; ++s) {
    for (Parameter* p : runtimes[s]->parameters()) {
      auto [it, inserted] = out.weights.emplace(p->name, p->value.ToVector());
      if (!inserted) EXPECT_EQ(it->second, p->value.ToVector()) << "copies of " << p->name;
    }
  }
  return out;
}

class PipelineEquivalenceTest
    : public ::testing::TestWithParam<std::tuple<int, std::string, std::string>> {};

TEST_P(PipelineEquivalenceTest, LossesAndWeightsEqualSingleProcessBitwise) {
  const auto& [stages, solver, schedule_name] = GetParam();
  const TrainConfig c = SmallConfig();
  const Dataset data = MakeDataset();
  const int units = NumUnits(c.model);
  auto ranges = solver == "uniform"
                    ? UniformPartition(units, stages)
                    : PipeDreamPartition(AnalyticUnitCosts(c.model, c.seq_len, 2), stages);
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  const RunOutput local = RunLocal(c, data);
  const RunOutput pipe =
      RunPipeline(c, data, *ranges, *ranges, ParseSchedule(schedule_name).value());
  EXPECT_EQ(pipe.losses, local.losses);
  EXPECT_EQ(pipe.val_losses, local.val_losses);
  EXPECT_EQ(pipe.val_losses.size(), 3u);  // after steps 4, 8 and 10
  ASSERT_EQ(pipe.weights.size(), local.weights.size());
  for (const auto& [name, values] : local.weights) {
    EXPECT_EQ(pipe.weights.at(name), values) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllShapes, PipelineEquivalenceTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values("uniform", "pipedream"),
                       ::testing::Values("1f1b", "gpipe")),
    [](const auto& info) {
      return "P" + std::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param) +
             "_" + std::get<2>(info.param);
    });

// Bi-Partition plans on the 6-unit model (embed, attn0, mlp0, attn1, mlp1,
// head), each with forward and backward cuts that differ.
struct BiPlan {
  std::string name;
  std::vector<Range> forward, backward;
};

void PrintTo(const BiPlan& plan, std::ostream* os) { *os << plan.name; }

std::vector<BiPlan> BiPlans() {
  return {
      // The paper's shape: backward cut before the forward cut.
      {"P3_BackwardCutFirst", {{0, 1}, {1, 4}, {4, 6}}, {{0, 2}, {2, 4}, {4, 6}}},
      // Forward cut first: worker 1 recomputes [1, 3) from unit 0's output.
      {"P3_ForwardCutFirst", {{0, 3}, {3, 5}, {5, 6}}, {{0, 1}, {1, 5}, {5, 6}}},
      // Worker 1 runs backward passes only, all recomputed.
      {"P3_BackwardOnlyWorker", {{0, 2}, {2, 2}, {2, 6}}, {{0, 1}, {1, 4}, {4, 6}}},
      // Worker 3 runs head's forward only; worker 2 recomputes head.
      {"P4_ForwardOnlyHead", {{0, 1}, {1, 3}, {3, 5}, {5, 6}}, {{0, 2}, {2, 3}, {3, 6}, {6, 6}}},
      {"P4_Staggered", {{0, 2}, {2, 3}, {3, 4}, {4, 6}}, {{0, 1}, {1, 3}, {3, 5}, {5, 6}}},
      // Worker 0 runs every forward pass, the others only backward passes.
      {"P4_AllForwardOnOne", {{0, 6}, {6, 6}, {6, 6}, {6, 6}}, {{0, 1}, {1, 3}, {3, 5}, {5, 6}}},
  };
}

class BiPartitionEquivalenceTest
    : public ::testing::TestWithParam<std::tuple<BiPlan, std::string>> {};

TEST_P(BiPartitionEquivalenceTest, LossesAndWeightsEqualSingleProcessBitwise) {
  const auto& [plan, schedule_name] = GetParam();
  const TrainConfig c = SmallConfig();
  const Dataset data = MakeDataset();
  ASSERT_NE(plan.forward, plan.backward);
  const RunOutput local = RunLocal(c, data);
  const RunOutput pipe =
      RunPipeline(c, data, plan.forward, plan.backward, ParseSchedule(schedule_name).value());
  EXPECT_EQ(pipe.losses, local.losses);
  EXPECT_EQ(pipe.val_losses, local.val_losses);
  EXPECT_EQ(pipe.val_losses.size(), 3u);  // after steps 4, 8 and 10
  ASSERT_EQ(pipe.weights.size(), local.weights.size());
  for (const auto& [name, values] : local.weights) {
    EXPECT_EQ(pipe.weights.at(name), values) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, BiPartitionEquivalenceTest,
                         ::testing::Combine(::testing::ValuesIn(BiPlans()),
                                            ::testing::Values("1f1b", "gpipe")),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace pipetrain
