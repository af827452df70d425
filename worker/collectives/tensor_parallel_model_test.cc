// 1-D tensor parallelism of the whole model (DESIGN.md §12's invariant): T
// ranks, one thread each, every one a GptModel of shards whose all-reduces
// run on Collectives over an in-process fabric, against the unsplit
// GptModel of the same seed.
//
// Tolerance: each row-parallel layer's output is the sum of T partial GEMMs
// instead of one GEMM over the whole inner dimension, and the softmax's
// normaliser a sum of T partial sums: the same terms in another order, so
// results agree to a few float32 ulps per layer, not bitwise. Losses and
// weights are held to data parallelism's definition of "equal"
// (worker/runtime/data_parallel_testing.h: losses within 1e-5 relative,
// weights within kTensorParallelWeightsRelative, the key bias, whose exact
// gradient is zero, to Adam's bound); the first step's
// gradients to 1e-4 of their tensor's largest magnitude. T = 1 changes no
// order and must be bitwise. Replicated parameters must be bitwise the same
// on every rank (each all-reduce gives every rank the same bits).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/collectives/tensor_parallel_comm.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/flash_cpu_testing.h"
#include "worker/model/gpt_model.h"
#include "worker/runtime/data_parallel_testing.h"
#include "worker/train/adamw_optimizer.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

constexpr uint64_t kSeed = 1234;
constexpr int kSteps = 4;
constexpr float kLr = 1e-3f;

GptConfig Config() {
  GptConfig c;
  c.vocab_size = 64;
  c.max_seq_len = 8;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 32;
  return c;
}

TokenBatch Batch(int step) {
  TokenBatch b;
  b.batch = 4;  // splits into 1, 2 or 4 partitions
  b.seq_len = 8;
  for (int i = 0; i < b.batch * b.seq_len; ++i) {
    b.inputs.push_back((i * 37 + step * 11 + 5) % 64);
    b.targets.push_back((i * 23 + step * 7 + 3) % 64);
  }
  return b;
}

// What one model (or one rank's shard of it) saw and ended with.
struct TrainRun {
  std::vector<float> losses;                    // per step
  std::map<std::string, Tensor> first_grads;    // after step 0's backward
  std::map<std::string, Tensor> final_weights;  // after the last step
  std::map<std::string, ParameterShard> shards;
};

// kSteps steps of forward + backward (two micro-batches of the same batch,
// scale 1/2) and AdamW on `model`; `begin_step` runs first in each step.
absl::Status Train(GptModel& model, const std::function<void(int)>& begin_step, TrainRun* run) {
  AdamWConfig adamw;
  adamw.lr = kLr;
  AdamWOptimizer optimizer(adamw, DecayPolicy::kMatricesOnly);
  for (int step = 0; step < kSteps; ++step) {
    begin_step(step);
    model.ZeroGrads();
    float loss = 0;
    for (int micro = 0; micro < 2; ++micro)
      loss += model.ForwardBackward(Batch(step + micro), 0.5f);
    model.ReduceTiedGradients();
    run->losses.push_back(loss / 2);
    if (step == 0) {
      for (Parameter* p : model.parameters()) run->first_grads[p->name] = p->grad.Clone();
    }
    optimizer.Step(model.parameters());
  }
  for (Parameter* p : model.parameters()) {
    run->final_weights[p->name] = p->value.Clone();
    run->shards[p->name] = p->shard;
  }
  return absl::OkStatus();
}

TrainRun Whole() {
  absl::StatusOr<std::unique_ptr<GptModel>> model = GptModel::Create(Config(), kSeed);
  EXPECT_TRUE(model.ok()) << model.status();
  TrainRun run;
  EXPECT_TRUE(Train(
                  **model, [](int) {}, &run)
                  .ok());
  return run;
}

// Runs `rank(r, model, comm)` on `ranks` threads, each with rank r's shards
// of the model (seed kSeed) over a group of the ranks on an in-process
// fabric; EXPECTs every rank's returned status, and its comm's, to be OK.
void OnRanks(
    int ranks,
    const std::function<absl::Status(int, GptModel&, CollectivesTensorParallelComm&)>& rank,
    Backend* backend = CpuBackend()) {
  InProcessFabric fabric(ranks);
  std::vector<int> members(ranks);
  for (int r = 0; r < ranks; ++r) members[r] = r;
  std::vector<absl::Status> status(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Transport> transport = fabric.Connect(r);
      Collectives collectives(transport.get(), CollectiveGroup{members, "tp"});
      CollectivesTensorParallelComm comm(&collectives, backend);
      absl::StatusOr<std::unique_ptr<GptModel>> model =
          GptModel::Create(Config(), kSeed, backend, &comm);
      status[r] = model.ok() ? rank(r, **model, comm) : model.status();
      if (status[r].ok()) status[r] = comm.status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
}

// `ranks` shards of the model, each attention and MLP unit in `partitions`
// partitions (AccTFM §4.2) forward and backward.
std::vector<TrainRun> TensorParallel(int ranks, int partitions = 1,
                                     Backend* backend = CpuBackend()) {
  std::vector<TrainRun> runs(ranks);
  OnRanks(
      ranks,
      [&](int r, GptModel& model, CollectivesTensorParallelComm& comm) {
        for (int u = 0; u < model.num_units(); ++u) {
          model.unit(u).set_tensor_parallel_partitions(partitions, partitions);
        }
        return Train(
            model, [&](int step) { comm.BeginIteration(step); }, &runs[r]);
      },
      backend);
  return runs;
}

// Token top-k's scores (Unit::TokenImportance) of attn_0 with the heads
// split over 2 and 4 ranks: every rank returns the unsplit layer's An (its
// heads' column sums, summed over the group), within float rounding.
TEST(TensorParallelModelTest, AttentionTokenImportance_TheWholeLayersOnEveryRank) {
  const TokenBatch batch = Batch(0);
  auto scores_of = [&](GptModel& model) {
    UnitContext embed_ctx, attn_ctx;
    const Tensor x = model.unit(0).Forward(Tensor(), batch, &embed_ctx);
    model.unit(1).KeepTokenImportance();
    model.unit(1).Forward(x, batch, &attn_ctx);
    return model.unit(1).TokenImportance(attn_ctx);
  };
  std::unique_ptr<GptModel> unsplit = GptModel::Create(Config(), kSeed, CpuBackend()).value();
  const std::vector<float> want = scores_of(*unsplit);
  ASSERT_EQ(want.size(), static_cast<size_t>(batch.batch * batch.seq_len));
  for (int ranks : {2, 4}) {
    std::vector<std::vector<float>> got(ranks);
    OnRanks(ranks, [&](int r, GptModel& model, CollectivesTensorParallelComm& comm) {
      comm.BeginIteration(0);
      got[r] = scores_of(model);
      return absl::OkStatus();
    });
    for (int r = 0; r < ranks; ++r) {
      testing::ExpectScaledClose(got[r], want, 1e-6,
                                 absl::StrCat("rank ", r, " of ", ranks, "'s scores"));
    }
  }
}

// The unsplit tensor `name` of `field` (first_grads or final_weights) from
// the ranks' runs: gathered when sharded; rank 0's replica otherwise, after
// checking every rank's replica is bitwise the same.
Tensor Unsplit(const std::vector<TrainRun>& runs, const std::string& name,
               std::map<std::string, Tensor> TrainRun::*field) {
  const ParameterShard& shard = runs[0].shards.at(name);
  std::vector<Tensor> parts;
  for (const TrainRun& run : runs) parts.push_back((run.*field).at(name));
  if (!shard.sharded()) {
    for (size_t r = 1; r < parts.size(); ++r) {
      EXPECT_EQ(parts[r].ToVector(), parts[0].ToVector()) << name << ": replica on rank " << r;
    }
    return parts[0];
  }
  absl::StatusOr<Tensor> full = GatherShards(parts, shard);
  EXPECT_TRUE(full.ok()) << full.status();
  return *full;
}

class TensorParallelModelTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(TensorParallelModelTest, LossesGradientsAndWeights_EqualTheWholeModel) {
  const auto [ranks, partitions] = GetParam();
  const TrainRun whole = Whole();
  const std::vector<TrainRun> runs = TensorParallel(ranks, partitions);
  ASSERT_EQ(runs[0].losses.size(), static_cast<size_t>(kSteps));
  for (int r = 1; r < ranks; ++r) {
    EXPECT_EQ(runs[r].losses, runs[0].losses) << "rank " << r << "'s losses";
  }
  if (ranks == 1) {
    EXPECT_EQ(runs[0].losses, whole.losses);
  } else {
    testing::ExpectLossesClose(runs[0].losses, whole.losses, "losses");
  }
  ASSERT_EQ(runs[0].shards.size(), whole.final_weights.size());
  std::map<std::string, std::vector<float>> got, want;
  for (const auto& [name, weights] : whole.final_weights) {
    const Tensor grad = Unsplit(runs, name, &TrainRun::first_grads);
    got[name] = Unsplit(runs, name, &TrainRun::final_weights).ToVector();
    want[name] = weights.ToVector();
    if (ranks == 1) {  // partitions do nothing in a group of one
      EXPECT_EQ(grad.ToVector(), whole.first_grads.at(name).ToVector()) << name;
      EXPECT_EQ(got[name], want[name]) << name;
    } else {
      testing::ExpectScaledClose(grad.ToVector(), whole.first_grads.at(name).ToVector(), 1e-4,
                                 name + " gradient");
    }
  }
  if (ranks > 1) {
    testing::ExpectWeightsClose(got, want, Config().d_model, "weights",
                                testing::kTensorParallelWeightsRelative);
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndPartitions, TensorParallelModelTest,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values(1, 2, 4)));

// AccTFM's partitions change only the order of the weight gradients' sums
// (each partition's rows added in turn): k = 1, 2 and 4 train alike. With 2
// ranks every all-reduce adds two terms, which commute, and each op works on
// whole samples, so the first step's loss is bitwise the same.
TEST(TensorParallelModelTest, PartitionsOneTwoFour_SameLosses) {
  const std::vector<TrainRun> one = TensorParallel(2, 1);
  for (int partitions : {2, 4}) {
    const std::vector<TrainRun> split = TensorParallel(2, partitions);
    EXPECT_EQ(split[0].losses[0], one[0].losses[0]) << partitions << " partitions";
    testing::ExpectLossesClose(split[0].losses, one[0].losses,
                               absl::StrCat(partitions, " partitions"));
  }
}

// With flash attention's contract (FlashOnCpu: each row's log-sum-exp
// kept, per partition at its own offset), partitions train alike as above,
// and within the twin's bf16 rounding of the CPU backend's run.
TEST(TensorParallelModelTest, FlashStyleBackend_PartitionsTrainAlike) {
  FlashOnCpu flash;
  const std::vector<TrainRun> one = TensorParallel(2, 1, &flash);
  const std::vector<TrainRun> cpu = TensorParallel(2, 1);
  ASSERT_EQ(one[0].losses.size(), cpu[0].losses.size());
  for (size_t step = 0; step < cpu[0].losses.size(); ++step) {
    EXPECT_NEAR(one[0].losses[step], cpu[0].losses[step], 1e-2 * cpu[0].losses[step]) << step;
  }
  EXPECT_NE(one[0].losses, cpu[0].losses) << "bitwise equal, so the twin did not run";
  for (int partitions : {2, 4}) {
    const std::vector<TrainRun> split = TensorParallel(2, partitions, &flash);
    EXPECT_EQ(split[0].losses[0], one[0].losses[0]) << partitions << " partitions";
    testing::ExpectLossesClose(split[0].losses, one[0].losses,
                               absl::StrCat(partitions, " partitions"));
  }
}

TEST(TensorParallelModelTest, RanksThatDoNotSplitTheHeads_InvalidArgumentNamingTheField) {
  InProcessFabric fabric(3);
  std::unique_ptr<Transport> transport = fabric.Connect(0);
  Collectives collectives(transport.get(), CollectiveGroup{{0, 1, 2}, "tp"});
  CollectivesTensorParallelComm comm(&collectives, CpuBackend());
  absl::StatusOr<std::unique_ptr<GptModel>> model =
      GptModel::Create(Config(), kSeed, CpuBackend(), &comm);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("model.n_head"), std::string::npos) << model.status();
}

}  // namespace
}  // namespace pipetrain
