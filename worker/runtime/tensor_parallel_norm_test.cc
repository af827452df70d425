// The global gradient norm of gradient clipping under tensor parallelism,
// checked directly (IterationResult::grad_norm) against train-local's: the
// tensor ranks add a shard's squares over the ranks and count a tensor
// every rank holds whole (LayerNorms, biases, wpe, ln_f) once
// (ParameterShard::CountsTowardNorm), a cube's vectors on its diagonal
// ranks only. The equivalence tests clip on every step, where a miscounted
// norm only changes the step's one scale factor, which AdamW mostly
// cancels; here the clipping is set far above every norm, so it measures
// and never scales, and the norm itself is compared, step by step.
//
// Tolerance: kNormRelative (1e-5). The gradients differ from one process's
// only by the order of fp32 sums (row-parallel GEMMs, the softmax's and
// LayerNorm's partial sums), and the weights by the few steps those
// differences take through AdamW: at most 3e-7 relative here. A replicated
// tensor counted on every rank instead of once is far more: ln_f.bias
// alone moves the norm by 8e-5 at T = 2, wpe by 1e-2.
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/planner/partition.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "worker/runtime/pipeline_testing.h"
#include "worker/runtime/stage_runtime.h"
#include "worker/train/grad_clip.h"
#include "worker/train/local_trainer.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

constexpr int kSteps = 5;
constexpr double kNormRelative = 1e-5;  // why: the file's comment

struct Layout {
  std::string name;
  int replicas = 1;
  int stages = 1;
  int tensor = 1;
  std::string mode = "1d";
};

// 4 heads (split by 2, 4 and a cube column of 2), micro-batches of 4
// samples (p^2 for the cube), a constant learning rate, no validation, and
// clipping at `grad_clip`.
TrainConfig NormConfig(float grad_clip) {
  TrainConfig c = testing::SmallConfig();
  c.model.n_head = 4;
  c.batch_size = 16;
  c.micro_batches = 4;
  c.eval_interval = 0;
  c.grad_clip = grad_clip;
  return c;
}

// LocalTrainer's global norm before each of `steps` steps. Requires
// c.grad_clip above every norm: the gradients then stay as the step
// measured them, and their squares added in parameter order are its total.
std::vector<double> LocalNorms(const TrainConfig& c, const Dataset& data, int steps) {
  auto trainer = LocalTrainer::Create(c, &data).value();
  std::vector<double> norms;
  for (int i = 0; i < steps; ++i) {
    EXPECT_TRUE(trainer->Step().ok());
    const std::vector<Parameter*> params = trainer->model().parameters();
    double total = 0;
    for (double squares : ParametersSquares(CpuBackend(), {params.begin(), params.end()})) {
      total += squares;
    }
    norms.push_back(std::sqrt(total));
    EXPECT_LT(norms.back(), c.grad_clip) << "train-local clipped at step " << i + 1;
  }
  return norms;
}

// Every runtime's IterationResult::grad_norm for `steps` steps of a uniform
// 1F1B pipeline in `layout`, by runtime ((replica * stages + stage) * T +
// tensor rank), then step.
std::vector<std::vector<std::optional<double>>> PipelineNorms(const TrainConfig& c,
                                                              const Dataset& data,
                                                              const Layout& layout, int steps) {
  const int units = NumUnits(c.model);
  const std::vector<Range> ranges = UniformPartition(units, layout.stages).value();
  const std::vector<v1::Program> programs =
      CompileBiPartitionPrograms(ranges, ranges, units, c.micro_batches / layout.replicas,
                                 Schedule::kOneFOneB)
          .value();
  const int total = layout.replicas * layout.stages * layout.tensor;
  InProcessFabric fabric(total);
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::unique_ptr<StageRuntime>> runtimes;
  for (int g = 0; g < total; ++g) {
    const int s = (g / layout.tensor) % layout.stages;
    StageSetup setup{"job-norm",
                     c,
                     s,
                     layout.stages,
                     ToUnitRange(ranges[s]),
                     ToUnitRange(ranges[s]),
                     programs[s],
                     absl::Seconds(30)};
    setup.replica = g / (layout.stages * layout.tensor);
    setup.replicas = layout.replicas;
    setup.tensor_rank = g % layout.tensor;
    setup.tensor_parallel = layout.tensor;
    setup.tensor_mode = layout.mode;
    for (int t = 0; t < layout.stages; ++t) setup.optimizer_stages.push_back(t);
    transports.push_back(fabric.Connect(g));
    runtimes.push_back(StageRuntime::Create(setup, &data, transports[g].get()).value());
  }
  std::vector<std::vector<std::optional<double>>> norms(total);
  std::vector<absl::Status> errors(total);
  std::vector<std::thread> threads;
  for (int g = 0; g < total; ++g) {
    threads.emplace_back([&, g] {
      for (int i = 0; i < steps; ++i) {
        absl::StatusOr<IterationResult> r = runtimes[g]->RunIteration(i);
        if (!r.ok()) {
          errors[g] = r.status();
          fabric.Shutdown();  // wakes the others instead of letting them time out
          return;
        }
        norms[g].push_back(r->grad_norm);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int g = 0; g < total; ++g)
    EXPECT_TRUE(errors[g].ok()) << "runtime " << g << ": " << errors[g];
  return norms;
}

// Every runtime reports a norm at every step, bitwise runtime 0's, and
// runtime 0's is within kNormRelative of `local`'s.
void ExpectNormsMatch(const std::vector<std::vector<std::optional<double>>>& norms,
                      const std::vector<double>& local, const std::string& what) {
  ASSERT_FALSE(norms.empty()) << what;
  for (size_t g = 0; g < norms.size(); ++g) {
    ASSERT_EQ(norms[g].size(), local.size()) << what << ": runtime " << g;
    for (size_t i = 0; i < local.size(); ++i) {
      ASSERT_TRUE(norms[g][i].has_value()) << what << ": runtime " << g << ", step " << i + 1;
      EXPECT_EQ(*norms[g][i], *norms[0][i]) << what << ": runtime " << g << ", step " << i + 1;
    }
  }
  for (size_t i = 0; i < local.size(); ++i) {
    const double norm = *norms[0][i];
    EXPECT_LE(std::abs(norm - local[i]), kNormRelative * local[i])
        << what << ", step " << i + 1 << ": norm " << norm << ", train-local's " << local[i]
        << " (relative " << std::abs(norm - local[i]) / local[i] << ")";
  }
}

TEST(TensorParallelNormTest, GradNorm_UnclippedOneDimensionalRanks_MatchesTrainLocalEveryStep) {
  const TrainConfig c = NormConfig(1e3f);  // far above every norm: never scales
  const Dataset data = testing::MakeDataset();
  const std::vector<double> local = LocalNorms(c, data, kSteps);
  const std::vector<Layout> layouts = {
      {"T2 P1", 1, 1, 2},
      {"T2 P2", 1, 2, 2},
      {"T4 P3", 1, 3, 4},
      {"D2 P2 T2", 2, 2, 2},
  };
  for (const Layout& layout : layouts) {
    ExpectNormsMatch(PipelineNorms(c, data, layout, kSteps), local, layout.name);
  }
}

TEST(TensorParallelNormTest, GradNorm_UnclippedCube_MatchesTrainLocalEveryStep) {
  const TrainConfig c = NormConfig(1e3f);
  const Dataset data = testing::MakeDataset();
  const std::vector<double> local = LocalNorms(c, data, kSteps);
  for (int stages : {1, 2}) {
    const Layout cube{"cube P" + std::to_string(stages), 1, stages, 8, "3d"};
    ExpectNormsMatch(PipelineNorms(c, data, cube, kSteps), local, cube.name);
  }
}

// With clipping that scales (0.05, as the equivalence tests clip), the
// reported norm is the one before clipping: on the first step, from the
// same weights, train-local's unclipped norm.
TEST(TensorParallelNormTest, GradNorm_Clipping_IsTheNormBeforeClipping) {
  const Dataset data = testing::MakeDataset();
  const std::vector<double> local = LocalNorms(NormConfig(1e3f), data, 1);
  ASSERT_GT(local[0], 0.05) << "the clipping below would not scale";
  ExpectNormsMatch(PipelineNorms(NormConfig(0.05f), data, {"T2 P2", 1, 2, 2}, 1), local,
                   "T2 P2, clipped");
}

TEST(TensorParallelNormTest, GradNorm_ClippingOff_Unset) {
  const Dataset data = testing::MakeDataset();
  const auto norms = PipelineNorms(NormConfig(0), data, {"T2 P1", 1, 1, 2}, 1);
  ASSERT_EQ(norms.size(), 2u);
  for (const auto& of_runtime : norms) {
    ASSERT_EQ(of_runtime.size(), 1u);
    EXPECT_FALSE(of_runtime[0].has_value());
  }
}

}  // namespace
}  // namespace pipetrain
