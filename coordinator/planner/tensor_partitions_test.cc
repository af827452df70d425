#include "coordinator/planner/tensor_partitions.h"

#include <string>
#include <tuple>
#include <vector>

#include "coordinator/planner/solve_plan.h"
#include "gtest/gtest.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {
namespace {

// embed, attn_0, mlp_0, attn_1, mlp_1, head; every block unit `compute`
// seconds forward, twice that backward, and `bytes` of output.
ModelProfile Profile(double compute, double bytes) {
  ModelProfile p;
  p.micro_batch_size = 8;
  for (const std::string name : {"embed", "attn_0", "mlp_0", "attn_1", "mlp_1", "head"}) {
    UnitProfile u;
    u.name = name;
    u.fwd_seconds = compute;
    u.bwd_seconds = 2 * compute;
    u.activation_bytes = bytes;
    p.units.push_back(u);
  }
  return p;
}

// A rank's charge for a unit's pass at speed 1: its compute and its waits.
double Fwd(const UnitProfile& u) { return u.fwd_seconds + u.fwd_comm_seconds; }
double Bwd(const UnitProfile& u) { return u.bwd_seconds + u.bwd_comm_seconds; }

TEST(ChooseTensorPartitionsTest, NoCommunication_NothingToGain) {
  // Unlimited bandwidth and no latency: every choice ends when the compute
  // does (up to the rounding of t / K summed K times, on which Alg. 1 may
  // break its ties either way); embed and head stay whole.
  absl::StatusOr<TensorPartitionPlan> plan = ChooseTensorPartitions(Profile(0.01, 1e6), 2, 0, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->solution.forward.plan.seconds, 4 * 0.005, 1e-12);
  EXPECT_NEAR(plan->solution.backward.plan.seconds, 4 * 0.01, 1e-12);
  EXPECT_EQ(plan->forward.front(), 1);
  EXPECT_EQ(plan->backward.back(), 1);
}

TEST(ChooseTensorPartitionsTest, BandwidthBound_PartitionsTheBlocksOnly_AndBeatsSizeOne) {
  // 8 MB at 1 GB/s: an all-reduce of 8 ms against 5 ms of compute per rank.
  absl::StatusOr<TensorPartitionPlan> plan =
      ChooseTensorPartitions(Profile(0.01, 8e6), 2, 1e9, 1e-6);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->forward.front(), 1);  // embed
  EXPECT_EQ(plan->forward.back(), 1);   // head
  int partitioned = 0;
  for (size_t u = 1; u + 1 < plan->forward.size(); ++u) partitioned += plan->forward[u] > 1;
  EXPECT_GT(partitioned, 0);
  EXPECT_LT(plan->solution.forward.plan.seconds, plan->solution.forward.uniform_seconds[0]);
  EXPECT_LT(plan->solution.backward.plan.seconds, plan->solution.backward.uniform_seconds[0]);
}

TEST(ChooseTensorPartitionsTest, LatencyBound_StaysWhole) {
  // Tiny messages over a 1 ms latency: every partition pays the latency again.
  absl::StatusOr<TensorPartitionPlan> plan =
      ChooseTensorPartitions(Profile(0.001, 1e3), 4, 1e10, 1e-3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->forward, std::vector<int>(6, 1));
}

TEST(TensorParallelUnitCostsTest, BlocksOverlapTheirPartitions_EmbedAndHeadPayTheirAllReduces) {
  // 1 GB/s, no latency, a group of 2: an all-reduce of m bytes takes m / 1e9
  // (ring: 2 steps of m / 2). Blocks: 10 ms forward / 2 = 5 ms compute,
  // 8 MB = 8 ms all-reduce.
  const ModelProfile p = Profile(0.01, 8e6);
  const std::vector<int> whole(6, 1), two = {1, 2, 2, 2, 2, 1};
  absl::StatusOr<ModelProfile> k1 = TensorParallelUnitCosts(p, 2, whole, whole, 1e9, 0);
  absl::StatusOr<ModelProfile> k2 = TensorParallelUnitCosts(p, 2, two, two, 1e9, 0);
  ASSERT_TRUE(k1.ok() && k2.ok()) << k1.status() << k2.status();
  EXPECT_NEAR(Fwd(k1->units[1]), 0.005 + 0.008, 1e-9);  // nothing overlaps
  // Two halves: compute 2.5, reduce 4 (overlapping the second half's
  // compute), compute 2.5, reduce 4: 2.5 + 4 + 4 = 10.5 ms.
  EXPECT_NEAR(Fwd(k2->units[1]), 0.0105, 1e-9);
  EXPECT_NEAR(Fwd(k1->units[0]), 0.005 + 0.008, 1e-9);  // embed's output
  EXPECT_NEAR(Bwd(k1->units[0]), 0.01, 1e-9);
  EXPECT_NEAR(Bwd(k1->units[5]), 0.01 + 0.008, 1e-9);  // the head's input gradient
  EXPECT_NEAR(Fwd(k1->units[5]), 0.005, 1e-9);         // latency 0
  EXPECT_EQ(TensorParallelUnitCosts(p, 2, {1}, whole, 1e9, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Streamed into mlp_0 (the runtime's AccTFM across units): its first half
  // waits for attn_0's first sum (6.5 ms) and computes while attn_0's second
  // sum runs; its sums end at 14.5 and 18.5 ms. Charged 18.5 - 10.5 = 8 ms,
  // not the 10.5 of the unit alone; with whole micro-batches nothing
  // overlaps across units either.
  EXPECT_NEAR(Fwd(k2->units[2]), 0.008, 1e-9);
  EXPECT_NEAR(Fwd(k1->units[2]), 0.013, 1e-9);
  // The charges of the four block units add up to Alg. 1's timeline of
  // the run, in both passes.
  AccTfmProblem problem;
  for (int l = 0; l < 4; ++l) {
    AccTfmLayer layer;
    for (int k : kAccTfmSizes) {
      layer.fwd_compute_seconds.push_back(0.005 / k);
      layer.bwd_compute_seconds.push_back(0.01 / k);
      layer.allreduce_seconds.push_back(0.008 / k);
    }
    problem.layers.push_back(layer);
  }
  const std::vector<int> mixed = {1, 4, 1, 2, 4, 1};
  absl::StatusOr<ModelProfile> costs = TensorParallelUnitCosts(p, 2, mixed, two, 1e9, 0);
  ASSERT_TRUE(costs.ok()) << costs.status();
  double forward = 0, backward = 0;
  for (int u = 1; u <= 4; ++u) forward += Fwd(costs->units[u]);
  for (int u = 1; u <= 4; ++u) backward += Bwd(costs->units[u]);
  EXPECT_NEAR(forward, EvaluateSizes(problem, AccTfmPass::kForward, {4, 1, 2, 4}).value(), 1e-12);
  EXPECT_NEAR(backward, EvaluateSizes(problem, AccTfmPass::kBackward, {2, 2, 2, 2}).value(), 1e-12);
}

// A rank keeps its share of a unit's stash, not the whole: GPT-2 small at
// seq 1024, 8 samples, T = 4, as the CPU backend's units save them. The
// LayerNorm's input, output and statistics are whole; the heads' q, k, v,
// outputs and probabilities, the MLP's hidden columns and the head's
// logits over its vocabulary slice are a quarter. Charged whole, a 6-block
// stage at 2 micro-batches in flight was about 9.7 GB against 3.3 GB held,
// and 8 GB workers were refused every T > 1 layout. Never below what a
// rank holds, within 2 % of it.
TEST(TensorParallelUnitCostsTest, StashIsTheRanksShare_NotTheWholeUnits) {
  GptConfig c;
  c.vocab_size = 50304;
  c.max_seq_len = 1024;
  c.n_layer = 2;
  c.n_head = 12;
  c.d_model = 768;
  const int seq = 1024, samples = 8, T = 4;
  const ModelProfile whole = AnalyticProfile(c, seq, samples, 1e12);
  const std::vector<int> ones(whole.units.size(), 1);
  const absl::StatusOr<ModelProfile> rank = TensorParallelUnitCosts(whole, T, ones, ones, 1e9, 0);
  ASSERT_TRUE(rank.ok()) << rank.status();
  const double bt = double(seq) * samples, d = c.d_model, v = c.vocab_size;
  const double replicated = 4 * bt * (2 * d + 2);
  const double probs = 4.0 * samples * c.n_head * seq * seq;
  const double attention = replicated + (4 * bt * 4 * d + probs) / T;
  const double mlp = replicated + 4 * bt * 8 * d / T;
  const double head = replicated + 4 * bt * v / T;
  const double head_transient = 4 * bt * 2 * d + 4 * bt * v / T;
  const struct {
    size_t unit;
    double got, held;
  } cases[] = {{1, rank->units[1].stash_bytes, attention},
               {2, rank->units[2].stash_bytes, mlp},
               {5, rank->units[5].stash_bytes, head},
               {5, rank->units[5].transient_bytes, head_transient}};
  for (const auto& c : cases) {
    EXPECT_GE(c.got, c.held) << whole.units[c.unit].name;
    EXPECT_LE(c.got, 1.02 * c.held) << whole.units[c.unit].name;
  }
  EXPECT_GT(whole.units[1].stash_bytes, 2.5 * rank->units[1].stash_bytes);
  EXPECT_EQ(rank->units[0].stash_bytes, whole.units[0].stash_bytes);  // the embedding's
  // Weights: the shards, but wpe whole on every rank (wte split by T).
  const double wte = 4 * v * d, wpe = 4.0 * c.max_seq_len * d;
  EXPECT_NEAR(rank->units[0].weight_bytes, wte / T + wpe, 8 * d);
  EXPECT_NEAR(rank->units[5].weight_bytes, (wte + 8 * d) / T, 1);
  EXPECT_NEAR(rank->units[1].weight_bytes, whole.units[1].weight_bytes / T, 1);
}

// Each all-reduce is priced as Collectives::AllReduce runs it: below 64
// KiB a power-of-two group does recursive doubling (log2 T latencies), the
// ring above; through a codec (AllReduceEncoded) the ring at any size.
// Before, every group of more than 2 was priced as a ring: the head's two
// small all-reduces at T = 8 cost 14 latencies each, not 3.
TEST(TensorParallelUnitCostsTest, SmallAllReducesOfPowerOfTwoGroups_RecursiveDoubling) {
  const double alpha = 1e-3;
  const std::vector<int> whole(6, 1);
  for (const auto& [tensor, doubling_steps, ring_steps] :
       std::vector<std::tuple<int, int, int>>{{4, 2, 6}, {8, 3, 14}}) {
    // 32 KiB activations: recursive doubling for every exact all-reduce.
    absl::StatusOr<std::vector<TensorParallelUnitLanes>> small =
        TensorParallelUnitPasses(Profile(0.01, 32 << 10), tensor, whole, whole, 0, alpha);
    ASSERT_TRUE(small.ok()) << small.status();
    EXPECT_NEAR(small->back().forward.all_reduce_seconds, 2 * doubling_steps * alpha, 1e-12);
    EXPECT_NEAR(small->back().backward.all_reduce_seconds, doubling_steps * alpha, 1e-12);
    EXPECT_NEAR(small->front().forward.all_reduce_seconds, doubling_steps * alpha, 1e-12);
    EXPECT_NEAR((*small)[1].forward.all_reduce_seconds, doubling_steps * alpha, 1e-12);
    // Through a codec the block units' run the ring; embed and head's not.
    absl::StatusOr<std::vector<TensorParallelUnitLanes>> encoded = TensorParallelUnitPasses(
        Profile(0.01, 32 << 10), tensor, whole, whole, 0, alpha, 0.5, 0, /*block_encoded=*/true);
    ASSERT_TRUE(encoded.ok()) << encoded.status();
    EXPECT_NEAR((*encoded)[1].forward.all_reduce_seconds, ring_steps * alpha, 1e-12);
    EXPECT_NEAR(encoded->back().backward.all_reduce_seconds, doubling_steps * alpha, 1e-12);
    // 1 MB activations: the ring; the head's few floats a token still not.
    absl::StatusOr<std::vector<TensorParallelUnitLanes>> large =
        TensorParallelUnitPasses(Profile(0.01, 1e6), tensor, whole, whole, 0, alpha);
    ASSERT_TRUE(large.ok()) << large.status();
    EXPECT_NEAR((*large)[1].forward.all_reduce_seconds, ring_steps * alpha, 1e-12);
    EXPECT_NEAR(large->back().forward.all_reduce_seconds, 2 * doubling_steps * alpha, 1e-12);
  }
  // The head's two all-reduces by their own sizes: at T = 8 and 4096 tokens
  // the row maxima are 128 KiB (the ring, 14 latencies) and the softmax
  // partials 32 KiB (recursive doubling, 3).
  absl::StatusOr<std::vector<TensorParallelUnitLanes>> head = TensorParallelUnitPasses(
      Profile(0.01, 32 << 10), 8, whole, whole, 0, alpha, 1.0, 0, false, /*tokens=*/4096);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_NEAR(head->back().forward.all_reduce_seconds, (14 + 3) * alpha, 1e-12);
  // Three ranks (not a power of two): the ring at any size.
  absl::StatusOr<std::vector<TensorParallelUnitLanes>> three =
      TensorParallelUnitPasses(Profile(0.01, 32 << 10), 3, whole, whole, 0, alpha);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_NEAR(three->back().forward.all_reduce_seconds, 2 * 4 * alpha, 1e-12);
  EXPECT_TRUE(TensorParallelEncoded("piecewise:bits=3").value());
  EXPECT_FALSE(TensorParallelEncoded("token_topk:keep=0.5").value());
  EXPECT_FALSE(TensorParallelEncoded("none").value());
}

// AccTFM's hybrid compression shrinks only the block units' all-reduces:
// keep 0.5 and 4-bit piecewise codes send 1/16 of the fp32 bytes plus the
// payloads' headers.
TEST(TensorParallelUnitCostsTest, CompressedBlocks_PayTheirWireFraction) {
  EXPECT_EQ(TensorParallelWireFraction("none", 512, 64, 128).value(), 1.0);
  const double fraction =
      TensorParallelWireFraction("token_topk:keep=0.5+piecewise:bits=3", 512, 64, 128).value();
  EXPECT_GT(fraction, 1.0 / 16);
  EXPECT_LT(fraction, 1.0 / 15);
  EXPECT_NEAR(TensorParallelWireFraction("fp16", 512, 64, 128).value(), 0.5, 1e-3);
  EXPECT_EQ(TensorParallelWireFraction("powersgd:rank=2", 512, 64, 128).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The runtime keeps ceil(keep x seq_len) rows per sample: 2 of 16 at
  // keep 0.1 (not 1.6), 1 of 16 at keep 0.05 (not 0.8).
  EXPECT_DOUBLE_EQ(TensorParallelWireFraction("token_topk:keep=0.1", 64, 16, 128).value(), 0.125);
  EXPECT_DOUBLE_EQ(TensorParallelWireFraction("token_topk:keep=0.05", 64, 16, 128).value(), 0.0625);
  EXPECT_EQ(TensorParallelWireFraction("none", 100, 16, 128).status().code(),
            absl::StatusCode::kInvalidArgument);  // not whole samples
  const ModelProfile p = Profile(0.01, 8e6);
  const std::vector<int> whole(6, 1);
  absl::StatusOr<ModelProfile> costs = TensorParallelUnitCosts(p, 2, whole, whole, 1e9, 0, 0.25);
  ASSERT_TRUE(costs.ok()) << costs.status();
  EXPECT_NEAR(Fwd(costs->units[1]), 0.005 + 0.002, 1e-9);  // a quarter of 8 ms
  EXPECT_NEAR(Fwd(costs->units[0]), 0.005 + 0.008, 1e-9);  // the embedding's stays
  // Alg. 1 sees the smaller all-reduce: 2 ms against 5 ms of compute leaves
  // little to hide, so it no longer partitions as with 8 ms.
  absl::StatusOr<TensorPartitionPlan> plan = ChooseTensorPartitions(p, 2, 1e9, 0, 0.25);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_LT(plan->solution.forward.plan.seconds,
            ChooseTensorPartitions(p, 2, 1e9, 0).value().solution.forward.plan.seconds);
}

// The compute a worker's speed divides apart from the waits it does not:
// with the passes timed at the group's speed 2 (the compute halved), the
// compute is given back at speed 1 and the all-reduce as it runs.
TEST(TensorParallelCostsOfTest, SplitsComputeFromWaits_ComputeAtSpeedOne) {
  const ModelProfile p = Profile(0.01, 8e6);
  ModelProfile halved = p;
  for (UnitProfile& u : halved.units) u.fwd_seconds /= 2, u.bwd_seconds /= 2;
  // Backward runs from mlp_1 in 4, 1, 2 and 4 partitions.
  const std::vector<int> whole(6, 1), mixed = {1, 4, 2, 1, 4, 1};
  absl::StatusOr<std::vector<TensorParallelUnitLanes>> at_one =
      TensorParallelUnitPasses(p, 2, whole, mixed, 1e9, 0);
  absl::StatusOr<std::vector<TensorParallelUnitLanes>> at_two =
      TensorParallelUnitPasses(halved, 2, whole, mixed, 1e9, 0);
  ASSERT_TRUE(at_one.ok() && at_two.ok()) << at_one.status() << at_two.status();
  const ModelProfile one = TensorParallelCostsOf(p, 2, *at_one);
  EXPECT_NEAR(one.units[1].fwd_seconds, 0.005, 1e-12);  // 10 ms / 2 ranks
  EXPECT_NEAR(one.units[1].fwd_comm_seconds, 0.008, 1e-12);
  EXPECT_NEAR(one.units[5].fwd_comm_seconds, 0, 1e-12);  // latency 0
  const ModelProfile two_speed = TensorParallelCostsOf(p, 2, *at_two, 2.0);
  EXPECT_NEAR(two_speed.units[1].fwd_seconds, 0.005, 1e-12);
  EXPECT_NEAR(two_speed.units[1].fwd_comm_seconds, 0.008, 1e-12);
  // A streamed unit may be charged less than its compute: at speed 1 the
  // backward is through mlp_0 at 44 ms (its halves reduced at 39 and 44);
  // attn_0 computes its quarters from 40 to 50 ms, the first under
  // mlp_0's second sum, and its sums end at 52: charged 8 ms of its 10 ms
  // of compute. All of the 8 ms is compute; its wait is 0, not -2.
  EXPECT_NEAR(PassSeconds((*at_one)[1].backward), 0.008, 1e-12);
  EXPECT_NEAR((*at_one)[1].backward.compute_seconds, 0.01, 1e-12);
  EXPECT_NEAR(one.units[1].bwd_seconds, 0.008, 1e-12);
  EXPECT_EQ(one.units[1].bwd_comm_seconds, 0);
  // At speed 2 the same unit is charged 8 ms beside 5 ms of compute (10 ms
  // at speed 1): 3 ms of it waits.
  EXPECT_NEAR(PassSeconds((*at_two)[1].backward), 0.008, 1e-12);
  EXPECT_NEAR(two_speed.units[1].bwd_seconds, 0.01, 1e-12);
  EXPECT_NEAR(two_speed.units[1].bwd_comm_seconds, 0.003, 1e-12);
  for (const ModelProfile* costs : {&one, &two_speed}) {
    for (const UnitProfile& u : costs->units) {
      EXPECT_GE(u.fwd_comm_seconds, 0) << u.name;
      EXPECT_GE(u.bwd_comm_seconds, 0) << u.name;
    }
  }
}

// The hybrid compression's coding: the kept share x the profile's measured cost per
// byte of the codec (its family's 8-bit entry for piecewise:bits=4), added
// to each block all-reduce for its bytes; none without a codec or timings.
TEST(TensorParallelUnitCostsTest, CompressedBlocks_PayTheirCoding) {
  ModelProfile p = Profile(0.01, 8e6);
  EXPECT_EQ(
      TensorParallelCodingSecondsPerByte("token_topk:keep=0.5+piecewise:bits=4", 64, p).value(),
      0.0);  // not measured
  p.codec_all_reduce_seconds_per_byte["piecewise:bits=8"] = 2e-9;
  EXPECT_DOUBLE_EQ(
      TensorParallelCodingSecondsPerByte("token_topk:keep=0.5+piecewise:bits=4", 64, p).value(),
      1e-9);
  EXPECT_DOUBLE_EQ(TensorParallelCodingSecondsPerByte("piecewise:bits=3", 64, p).value(), 2e-9);
  EXPECT_EQ(TensorParallelCodingSecondsPerByte("token_topk:keep=0.5", 64, p).value(), 0.0);
  EXPECT_EQ(TensorParallelCodingSecondsPerByte("none", 64, p).value(), 0.0);
  // The kept share per sample as the runtime rounds it: 2 of 16 rows.
  EXPECT_DOUBLE_EQ(
      TensorParallelCodingSecondsPerByte("token_topk:keep=0.1+piecewise:bits=3", 16, p).value(),
      0.125 * 2e-9);
  EXPECT_EQ(TensorParallelCodingSecondsPerByte("powersgd:rank=2", 64, p).status().code(),
            absl::StatusCode::kInvalidArgument);
  // 1e-9 s per byte of 8 MB: 8 ms more on each block all-reduce (halved
  // per partition with 2), none on the embedding's and the head's.
  const std::vector<int> whole(6, 1), halves = {1, 2, 2, 2, 2, 1};
  const auto passes = [&](double coding, const std::vector<int>& k) {
    return TensorParallelUnitPasses(p, 2, k, k, 1e9, 0, 0.25, coding).value();
  };
  const auto plain = passes(0, whole), coded = passes(1e-9, whole);
  EXPECT_NEAR(coded[1].forward.all_reduce_seconds - plain[1].forward.all_reduce_seconds, 0.008,
              1e-12);
  EXPECT_NEAR(coded[2].backward.all_reduce_seconds - plain[2].backward.all_reduce_seconds, 0.008,
              1e-12);
  EXPECT_EQ(coded[0].forward.all_reduce_seconds, plain[0].forward.all_reduce_seconds);
  EXPECT_EQ(coded[5].backward.all_reduce_seconds, plain[5].backward.all_reduce_seconds);
  EXPECT_NEAR(passes(1e-9, halves)[1].forward.all_reduce_seconds -
                  passes(0, halves)[1].forward.all_reduce_seconds,
              0.004, 1e-12);
  // Alg. 1 sees the coding too.
  EXPECT_GT(ChooseTensorPartitions(p, 2, 1e9, 0, 0.25, 1e-9).value().solution.forward.plan.seconds,
            ChooseTensorPartitions(p, 2, 1e9, 0, 0.25).value().solution.forward.plan.seconds);
}

// Measured partition timings replace compute / K: a unit whose quarters
// cost as much as its whole (a GEMM too small to use the machine) is not
// split in four, however long its all-reduce.
TEST(ChooseTensorPartitionsTest, MeasuredPartitionTimes_UsedInsteadOfComputeOverK) {
  ModelProfile p = Profile(0.01, 8e6);
  for (UnitProfile& u : p.units) {
    u.partition_seconds[2] = {0.005, 0.010};  // halves as cheap as expected
    u.partition_seconds[4] = {0.010, 0.020};  // quarters as dear as the whole
  }
  absl::StatusOr<TensorPartitionPlan> plan = ChooseTensorPartitions(p, 2, 1e9, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int k : plan->forward) EXPECT_NE(k, 4);
  for (int k : plan->backward) EXPECT_NE(k, 4);
  // The unit costs use them too: four quarters of 10 ms / 2 ranks.
  const std::vector<int> four = {1, 4, 4, 4, 4, 1};
  absl::StatusOr<std::vector<TensorParallelUnitLanes>> passes =
      TensorParallelUnitPasses(p, 2, four, four, 1e9, 0);
  ASSERT_TRUE(passes.ok()) << passes.status();
  EXPECT_NEAR((*passes)[1].forward.compute_seconds, 4 * 0.005, 1e-12);
  EXPECT_NEAR((*passes)[1].backward.compute_seconds, 4 * 0.010, 1e-12);
  EXPECT_NEAR((*passes)[0].forward.compute_seconds, 0.005, 1e-12);  // embed: whole / 2
}

// The choice is never predicted slower than a uniform size on the
// runtime's timeline (the block units streamed into each other), on random
// profiles and links.
TEST(ChooseTensorPartitionsTest, NeverSlowerThanUniformOnTheRuntimeTimeline) {
  for (int seed = 0; seed < 200; ++seed) {
    ModelProfile p = Profile(0.01, 8e6);
    uint32_t x = 2654435761u * (seed + 1);
    auto next = [&x] {
      x = x * 1664525u + 1013904223u;
      return (x >> 8) / double{1 << 24};
    };
    for (UnitProfile& u : p.units) {
      u.fwd_seconds = 0.002 + 0.02 * next();
      u.bwd_seconds = u.fwd_seconds * (1.5 + next());
      u.activation_bytes = 1e6 + 1.6e7 * next();
      u.partition_seconds[2] = {u.fwd_seconds * (0.5 + 0.2 * next()),
                                u.bwd_seconds * (0.5 + 0.2 * next())};
      u.partition_seconds[4] = {u.fwd_seconds * (0.25 + 0.2 * next()),
                                u.bwd_seconds * (0.25 + 0.2 * next())};
    }
    const double bandwidth = next() < 0.5 ? 1.25e8 : 1.25e9;
    const double latency = next() < 0.5 ? 5e-4 : 5e-5;
    absl::StatusOr<TensorPartitionPlan> plan = ChooseTensorPartitions(p, 2, bandwidth, latency);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const auto total = [&](const std::vector<int>& f, const std::vector<int>& b) {
      absl::StatusOr<ModelProfile> c = TensorParallelUnitCosts(p, 2, f, b, bandwidth, latency);
      double fwd = 0, bwd = 0;
      for (const UnitProfile& u : c->units) fwd += Fwd(u), bwd += Bwd(u);
      return std::make_pair(fwd, bwd);
    };
    const auto chosen = total(plan->forward, plan->backward);
    for (int k : {1, 2, 4}) {
      const std::vector<int> uniform = {1, k, k, k, k, 1};
      const auto other = total(uniform, uniform);
      EXPECT_LE(chosen.first, other.first * (1 + 1e-12)) << "seed " << seed << " k " << k;
      EXPECT_LE(chosen.second, other.second * (1 + 1e-12)) << "seed " << seed << " k " << k;
    }
  }
}

TEST(ChooseTensorPartitionsTest, BadInput_InvalidArgument) {
  EXPECT_EQ(ChooseTensorPartitions(Profile(0.01, 1e6), 1, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  ModelProfile no_blocks;
  no_blocks.units.push_back(UnitProfile{"embed", 1, 1, 0, 0, 0});
  EXPECT_EQ(ChooseTensorPartitions(no_blocks, 2, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
