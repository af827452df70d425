// AccTFM's hybrid compression of the tensor-parallel all-reduces
// (acctfm.txt §4.3) on single units: T = 2 ranks, one thread each, their
// all-reduces on Collectives over an in-process fabric, against the whole
// unit of the same seed.
//
// What must hold: every rank ends with bitwise the same output; each sample
// keeps TopKCount(keep, T) tokens; a dropped token's output is its input
// (the residual) bitwise; a kept token's output is the whole unit's (with 2
// ranks each all-reduce adds two terms, which commute, but the partial GEMMs
// sum in another order than one GEMM: 1e-5 of the tensor's scale); and the
// weights' gradients are the whole unit's for the upstream gradient with
// the dropped tokens' rows zeroed (their outputs were constants), to 1e-4
// of their scale as in tensor_parallel_model_test.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/philox.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "kernels/compress/elem_topk_codec.h"
#include "worker/collectives/tensor_parallel_chain_testing.h"
#include "worker/collectives/tensor_parallel_comm.h"
#include "worker/model/attention_unit.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/mlp_unit.h"
#include "worker/runtime/data_parallel_testing.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

constexpr uint64_t kSeed = 77;
constexpr int kRanks = 2;

GptConfig Config(int d_model) { return testing::TensorParallelChainConfig(d_model); }
TokenBatch Batch() { return testing::TensorParallelChainBatch(); }

Tensor Random(const Shape& shape, uint64_t stream, float stddev) {
  Tensor t = Tensor::Zeros(shape);
  FillNormal(kSeed, stream, 0.0f, stddev, t.data(), t.numel());
  return t;
}

std::unique_ptr<Unit> MakeLayerUnit(bool attention, int d_model, TensorParallelComm* tp) {
  std::unique_ptr<Unit> unit;
  if (attention) {
    unit = std::make_unique<AttentionUnit>(Config(d_model), 0, CpuBackend(), tp);
  } else {
    unit = std::make_unique<MlpUnit>(Config(d_model), 0, CpuBackend(), tp);
  }
  InitializeParameters(unit.get(), kSeed);
  return unit;
}

// One rank's (or the whole unit's) forward and backward.
struct UnitRun {
  Tensor y, dx;
  std::vector<float> kept;  // the kept rows' flags (ranks only)
  std::map<std::string, Tensor> grads;
  std::map<std::string, ParameterShard> shards;
  int64_t wire_bytes = 0, compressed_bytes = 0;
  double error_squared = 0, norm_squared = 0;
};

UnitRun RunUnit(Unit& unit, const Tensor& x, const Tensor& dy) {
  UnitRun run;
  UnitContext ctx;
  unit.ZeroGrads();
  run.y = unit.Forward(x, Batch(), &ctx);
  run.dx = unit.Backward(dy, Batch(), ctx);
  if (ctx.saved.size() > 6 + size_t{unit.kind() == UnitKind::kAttention}) {
    run.kept = ctx.saved.back().ToVector();
  }
  for (Parameter* p : unit.parameters()) {
    run.grads[p->name] = p->grad.Clone();
    run.shards[p->name] = p->shard;
  }
  return run;
}

// The units of kRanks ranks compressing with `spec`, `partitions` AccTFM
// partitions each; with `eval`, in a validation pass (BeginIteration's).
std::vector<UnitRun> RunRanks(bool attention, int d_model, const std::string& spec, int partitions,
                              const Tensor& x, const Tensor& dy, bool eval = false) {
  InProcessFabric fabric(kRanks);
  std::vector<UnitRun> runs(kRanks);
  std::vector<absl::Status> status(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Transport> transport = fabric.Connect(r);
      Collectives collectives(transport.get(), CollectiveGroup{{0, 1}, "tp"});
      absl::StatusOr<TensorParallelCompression> compression =
          MakeTensorParallelCompression(spec, "tensor_compression");
      if (!compression.ok()) {
        status[r] = compression.status();
        return;
      }
      CollectivesTensorParallelComm comm(&collectives, CpuBackend(), *std::move(compression));
      comm.BeginIteration(0, eval);
      std::unique_ptr<Unit> unit = MakeLayerUnit(attention, d_model, &comm);
      unit->set_tensor_parallel_partitions(partitions, partitions);
      runs[r] = RunUnit(*unit, x, dy);
      runs[r].wire_bytes = comm.wire_bytes();
      runs[r].compressed_bytes = comm.compressed_bytes();
      runs[r].error_squared = comm.compression_error_squared();
      runs[r].norm_squared = comm.compressed_norm_squared();
      status[r] = comm.status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  return runs;
}

// `t` ([rows, d]) with the rows whose flag is 0 (zero_kept = false) or 1
// (true) zeroed.
Tensor ZeroRows(const Tensor& t, const std::vector<float>& kept, bool zero_kept) {
  Tensor out = t.Clone();
  const int64_t d = t.shape().back();
  for (size_t r = 0; r < kept.size(); ++r) {
    if ((kept[r] != 0) == zero_kept) std::fill_n(out.data() + r * d, d, 0.0f);
  }
  return out;
}

// A validation pass does not compress: its forward is bitwise the
// uncompressed one's (the loss it reports is the model's), and no
// token-sparse sum runs.
TEST(HybridCompressionTest, ValidationPass_NotCompressed) {
  const Tensor x = Random({4, 16, 32}, 21, 1.0f), dy = Random({4, 16, 32}, 22, 0.1f);
  for (bool attention : {true, false}) {
    const std::vector<UnitRun> none = RunRanks(attention, 32, "none", 1, x, dy, /*eval=*/true);
    const std::vector<UnitRun> compressed =
        RunRanks(attention, 32, "token_topk:keep=0.5+piecewise:bits=3", 1, x, dy, /*eval=*/true);
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(compressed[r].compressed_bytes, 0) << "rank " << r;
      EXPECT_EQ(compressed[r].y.ToVector(), none[r].y.ToVector())
          << "rank " << r << (attention ? " attention" : " mlp");
    }
  }
}

class TokenSparseTest : public ::testing::TestWithParam<std::tuple<bool, int>> {};

// Keep 0.5 without quantization: the kept tokens' sums are exact (2 terms).
TEST_P(TokenSparseTest, DroppedTokensPassTheResidual_KeptOnesEqualTheWholeUnit) {
  const auto [attention, partitions] = GetParam();
  const int d = 32;
  const Tensor x = Random({4, 16, d}, 1, 1.0f), dy = Random({4, 16, d}, 2, 0.1f);
  const std::vector<UnitRun> ranks =
      RunRanks(attention, d, "token_topk:keep=0.5", partitions, x, dy);
  ASSERT_EQ(ranks[0].kept.size(), 64u);
  EXPECT_EQ(ranks[1].kept, ranks[0].kept);
  EXPECT_EQ(ranks[1].y.ToVector(), ranks[0].y.ToVector()) << "ranks' outputs differ";
  EXPECT_EQ(ranks[1].dx.ToVector(), ranks[0].dx.ToVector()) << "ranks' input gradients differ";
  for (int b = 0; b < 4; ++b) {
    int kept = 0;
    for (int t = 0; t < 16; ++t) kept += ranks[0].kept[b * 16 + t] != 0;
    EXPECT_EQ(kept, TopKCount(0.5, 16)) << "sample " << b;
  }
  // Dropped: y = x, bitwise. Kept: the whole unit's y.
  std::unique_ptr<Unit> whole = MakeLayerUnit(attention, d, nullptr);
  const Tensor dy_kept = ZeroRows(dy, ranks[0].kept, /*zero_kept=*/false);
  const UnitRun reference = RunUnit(*whole, x, dy_kept);
  EXPECT_EQ(ZeroRows(ranks[0].y, ranks[0].kept, true).ToVector(),
            ZeroRows(x, ranks[0].kept, true).ToVector());
  testing::ExpectScaledClose(ZeroRows(ranks[0].y, ranks[0].kept, false).ToVector(),
                             ZeroRows(reference.y, ranks[0].kept, false).ToVector(), 1e-5,
                             "kept tokens' outputs");
  if (attention) {
    // The paper's choice: the tokens of highest An over all heads.
    UnitContext ctx;
    whole->KeepTokenImportance();
    whole->Forward(x, Batch(), &ctx);
    const std::vector<uint8_t> top = KeepTopTokensPerSample(whole->TokenImportance(ctx), 16, 0.5);
    EXPECT_EQ(ranks[0].kept, std::vector<float>(top.begin(), top.end()));
  }
  // The weights' gradients (the two GEMMs'; the LayerNorm's see the dropped
  // rows of the input gradient, which compression leaves out).
  for (const auto& [name, grad] : reference.grads) {
    if (name.find("ln_") != std::string::npos) continue;
    const ParameterShard& shard = ranks[0].shards.at(name);
    Tensor got = ranks[0].grads.at(name);
    if (shard.sharded()) {
      got = *GatherShards({ranks[0].grads.at(name), ranks[1].grads.at(name)}, shard);
    }
    testing::ExpectScaledClose(got.ToVector(), grad.ToVector(), 1e-4, name + " gradient");
  }
  if (!attention) {
    // The MLP works token by token, so a dropped token's input gradient is
    // exactly the residual's: dx = whole's for dy_kept + the dropped rows of dy.
    Tensor want = reference.dx.Clone();
    const Tensor dropped = ZeroRows(dy, ranks[0].kept, true);
    for (int64_t i = 0; i < want.numel(); ++i) want.data()[i] += dropped[i];
    testing::ExpectScaledClose(ranks[0].dx.ToVector(), want.ToVector(), 1e-4, "input gradient");
  }
}

INSTANTIATE_TEST_SUITE_P(UnitsAndPartitions, TokenSparseTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(1, 2)));

// keep 0.5 and 4-bit piecewise codes (3 clusters and a sign bit, the
// paper's "4-bit"): the ranks still agree bitwise, the codec's error shows
// in the statistics, and the bytes this rank sent are at least 12 times
// fewer than the fp32 all-reduces' (the goal; the token scores'
// all-reduce counted in).
TEST(HybridCompressionTest, KeepHalfPiecewise4Bit_RanksAgree_TwelveTimesFewerBytes) {
  for (bool attention : {false, true}) {
    const int d = 128;
    const Tensor x = Random({4, 16, d}, 3, 1.0f), dy = Random({4, 16, d}, 4, 0.1f);
    const std::vector<UnitRun> plain = RunRanks(attention, d, "none", 1, x, dy);
    const std::vector<UnitRun> ranks =
        RunRanks(attention, d, "token_topk:keep=0.5+piecewise:bits=3", 1, x, dy);
    EXPECT_EQ(ranks[1].y.ToVector(), ranks[0].y.ToVector());
    EXPECT_EQ(ranks[1].dx.ToVector(), ranks[0].dx.ToVector());
    EXPECT_EQ(plain[0].error_squared, 0.0);
    EXPECT_GT(ranks[0].error_squared, 0.0);
    EXPECT_LT(ranks[0].error_squared, ranks[0].norm_squared);
    // Two all-reduces of 64 x 128 fp32 values each.
    EXPECT_EQ(plain[0].wire_bytes, 2 * 64 * 128 * 4);
    EXPECT_GE(plain[0].wire_bytes, 12 * ranks[0].wire_bytes)
        << (attention ? "attention" : "mlp") << ": " << ranks[0].wire_bytes << " bytes";
    // The kept tokens' outputs stay near the uncompressed ones (the codec's
    // own bound is collectives_test's): within a quarter of the branch's
    // largest output.
    const std::vector<float> kept = ranks[0].kept;
    const Tensor got = ZeroRows(ranks[0].y, kept, false), want = ZeroRows(plain[0].y, kept, false);
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      scale = std::max(scale, double{std::abs(want[i] - x[i])});
      const double diff = std::abs(got[i] - want[i]);
      // A NaN is infinitely far: std::max would drop it (it compares false).
      worst = std::max(worst, std::isfinite(diff) ? diff : INFINITY);
    }
    EXPECT_GT(worst, 0.0);
    EXPECT_LE(worst, 0.25 * scale) << (attention ? "attention" : "mlp");
  }
}

TEST(HybridCompressionTest, Specs_NoneAndCodecsAccepted_OthersNamedInTheError) {
  EXPECT_FALSE(MakeTensorParallelCompression("none", "f")->enabled());
  EXPECT_FALSE(MakeTensorParallelCompression("", "f")->enabled());
  EXPECT_TRUE(MakeTensorParallelCompression("piecewise:bits=3", "f")->enabled());
  auto both = MakeTensorParallelCompression("token_topk:keep=0.25+linear:bits=8", "f");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->keep, 0.25);
  EXPECT_NE(both->codec, nullptr);
  for (const char* bad : {"powersgd:rank=2", "elem_topk:keep=0.1", "token_topk:keep=2", "zip"}) {
    const auto got = MakeTensorParallelCompression(bad, "spec.parallelism.tensor_compression");
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(got.status().message().find("spec.parallelism.tensor_compression"), std::string::npos)
        << got.status();
  }
}

// A tensor of 0 rows (e.g. a micro-batch with no tokens): the forward sum
// keeps no rows, and the backward's sum over that empty mask is a mask of 0
// rows, not a missing one (which would ask for token scores and fail with
// INTERNAL "0 scores for 0 rows").
TEST(HybridCompressionTest, MaskedSum_EmptyMaskOfZeroRows_Ok) {
  for (const char* spec : {"token_topk:keep=0.5", "token_topk:keep=0.5+piecewise:bits=3"}) {
    InProcessFabric fabric(kRanks);
    std::vector<absl::Status> status(kRanks);
    std::vector<std::vector<uint8_t>> kept(kRanks, std::vector<uint8_t>{9});
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        std::unique_ptr<Transport> transport = fabric.Connect(r);
        Collectives collectives(transport.get(), CollectiveGroup{{0, 1}, "tp"});
        CollectivesTensorParallelComm comm(&collectives, CpuBackend(),
                                           *MakeTensorParallelCompression(spec, "f"));
        comm.BeginIteration(0);
        Tensor empty = Tensor::Zeros({0, 8});
        comm.WaitAllReduce(comm.StartTokenSparseSum(empty, {}, /*seq_len=*/16, &kept[r]));
        comm.WaitAllReduce(comm.StartMaskedSum(empty, kept[r]));
        // The group's tags still agree: a sum after it is right (constant
        // rows, which the codec carries exactly too).
        Tensor one = Tensor::Filled({1, 8}, float(r + 1));
        comm.WaitAllReduce(comm.StartMaskedSum(one, {1}));
        if (comm.status().ok()) {
          EXPECT_EQ(one.ToVector(), std::vector<float>(8, 3.f)) << spec;
        }
        status[r] = comm.status();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_TRUE(status[r].ok()) << spec << ", rank " << r << ": " << status[r];
      EXPECT_TRUE(kept[r].empty()) << spec << ", rank " << r;
    }
  }
}

// Each of kRanks ranks runs `run` (given its rank and its comm, which
// compresses with `compression`) on a thread of its own; their comms'
// statuses after it.
std::vector<absl::Status> CommStatusesOfRanks(
    const std::string& compression,
    const std::function<void(int, CollectivesTensorParallelComm&)>& run) {
  InProcessFabric fabric(kRanks);
  std::vector<absl::Status> status(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Transport> transport = fabric.Connect(r);
      Collectives collectives(transport.get(), CollectiveGroup{{0, 1}, "tp"});
      CollectivesTensorParallelComm comm(&collectives, CpuBackend(),
                                         *MakeTensorParallelCompression(compression, "f"));
      run(r, comm);
      status[r] = comm.status();
    });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

// Rank 1's token scores hold a NaN: every rank's comm status after
// `waits` (given the comm, the data and rank's scores) over token_topk.
std::vector<absl::Status> StatusesWithANanScore(
    const std::function<void(CollectivesTensorParallelComm&, Tensor&, std::vector<float>&)>&
        waits) {
  return CommStatusesOfRanks("token_topk:keep=0.5",
                             [&](int r, CollectivesTensorParallelComm& comm) {
                               comm.BeginIteration(0);
                               Tensor data = Tensor::Filled({4, 8}, 1.f);  // one sample of 4 tokens
                               std::vector<float> scores = {1, 2, 3, 4};
                               if (r == 1) scores[2] = std::nanf("");
                               waits(comm, data, scores);
                             });
}

void ExpectNanScoreDataLoss(const std::vector<absl::Status>& status) {
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDataLoss) << "rank " << r << ": " << status[r];
    EXPECT_NE(status[r].message().find("token scores summed over the group: row 2 is nan"),
              std::string::npos)
        << status[r];
  }
}

// The summed token scores choose the kept tokens by their order, which a
// NaN (a peer's, or a diverged rank's) does not have: both ranks' sums
// fail with DATA_LOSS naming the row, and no rank sums over a mask drawn
// from it.
TEST(HybridCompressionTest, TokenSparseSum_NonFiniteScore_DataLossOnEveryRank) {
  ExpectNanScoreDataLoss(StatusesWithANanScore(
      [](CollectivesTensorParallelComm& comm, Tensor& data, std::vector<float>& scores) {
        std::vector<uint8_t> kept;
        comm.WaitAllReduce(comm.StartTokenSparseSum(data, scores, /*seq_len=*/4, &kept));
      }));
}

// A later sum waited before the failed one (a streamed unit's partitions
// are waited by the next unit, after this unit's token scores): the
// comm's status still names the first failure, with its code, not an
// ABORTED "an earlier all-reduce failed" that the stage took for a lost
// peer (the job recovered and replayed the same failure).
TEST(HybridCompressionTest, FailedSumWaitedAfterALaterOne_StatusIsTheFirstFailure) {
  ExpectNanScoreDataLoss(StatusesWithANanScore(
      [](CollectivesTensorParallelComm& comm, Tensor& data, std::vector<float>& scores) {
        std::vector<uint8_t> kept;
        const int failing = comm.StartTokenSparseSum(data, scores, /*seq_len=*/4, &kept);
        Tensor later = Tensor::Filled({2, 8}, 1.f);
        comm.WaitAllReduce(comm.StartAllReduceSum(later));
        comm.WaitAllReduce(failing);
      }));
}

// The step's and the validation pass's tags have spans of their own, with
// other phases' tags above them (stage_runtime.cc): an all-reduce past its
// span fails RESOURCE_EXHAUSTED on every rank, naming the step or the
// pass, instead of taking a tag another phase may be using at the same
// iteration. The sums within the span are right.
TEST(TensorParallelCommTest, AllReducesPastTheirTagSpan_ResourceExhausted) {
  for (bool eval : {false, true}) {
    const std::vector<absl::Status> status =
        CommStatusesOfRanks("none", [&](int r, CollectivesTensorParallelComm& comm) {
          comm.SetTagSpansForTesting(/*step=*/3, /*eval=*/2);
          comm.BeginIteration(7, eval);
          for (int i = 0; i < (eval ? 2 : 3); ++i) {
            Tensor data = Tensor::Filled({2, 4}, float(r + 1));
            comm.AllReduceSum(data);
            EXPECT_EQ(data.ToVector(), std::vector<float>(8, 3.f)) << "sum " << i;
          }
          EXPECT_TRUE(comm.status().ok()) << comm.status();
          Tensor past = Tensor::Filled({2, 4}, 1.f);
          comm.AllReduceSum(past);
        });
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(status[r].code(), absl::StatusCode::kResourceExhausted) << status[r];
      const std::string said = eval
                                   ? "the validation pass after step 7: its tensor-parallel "
                                     "all-reduces outgrew their 2 tags"
                                   : "step 7: its tensor-parallel all-reduces outgrew their 3 tags";
      EXPECT_NE(status[r].message().find(said), std::string::npos) << status[r];
    }
  }
}

// AccTFM's pipeline across units under its hybrid compression, over the
// real group: the same outputs, kept rows and input and weight gradients,
// bitwise, as waiting in each unit; the LayerNorms' gradients within
// rounding (the streamed backward adds them one partition at a time).
TEST(HybridCompressionTest, StreamedAcrossUnits_SameAsWaitingInEachUnit) {
  const int d = 32;
  const Tensor x = Random({4, 16, d}, 5, 1.0f), dy = Random({4, 16, d}, 6, 0.1f);
  for (const std::string spec : {"token_topk:keep=0.5", "token_topk:keep=0.5+piecewise:bits=3"}) {
    SCOPED_TRACE(spec);
    auto run = [&](bool stream) {
      std::vector<testing::TensorParallelChainRun> ranks =
          testing::RunTensorParallelChain(Config(d), kSeed, kRanks, spec, /*partitions=*/2, stream,
                                          x, dy, Batch(), [](int) { return CpuBackend(); });
      for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(ranks[r].status.ok()) << ranks[r].status;
      return ranks[0];
    };
    const testing::TensorParallelChainRun waited = run(false), streamed = run(true);
    ASSERT_EQ(waited.attn_kept.size(), 64u);
    ASSERT_EQ(waited.mlp_kept.size(), 64u);
    EXPECT_EQ(std::count(waited.attn_kept.begin(), waited.attn_kept.end(), 1.0f),
              4 * TopKCount(0.5, 16));
    EXPECT_EQ(streamed.attn_kept, waited.attn_kept);
    EXPECT_EQ(streamed.mlp_kept, waited.mlp_kept);
    EXPECT_EQ(streamed.y.ToVector(), waited.y.ToVector());
    EXPECT_EQ(streamed.dx.ToVector(), waited.dx.ToVector());
    for (const auto& [name, grad] : waited.grads) {
      if (name.find("ln_") == std::string::npos) {
        EXPECT_EQ(streamed.grads.at(name).ToVector(), grad.ToVector()) << name;
      } else {
        testing::ExpectScaledClose(streamed.grads.at(name).ToVector(), grad.ToVector(), 1e-5,
                                   name + " gradient");
      }
    }
  }
}

// The all-reduce tickets start from 0 again each pass with none outstanding,
// so their int never overflows in a long run.
TEST(TensorParallelCommTest, BeginIteration_NoneOutstanding_TicketsStartAgain) {
  InProcessFabric fabric(1);
  std::unique_ptr<Transport> transport = fabric.Connect(0);
  Collectives collectives(transport.get(), CollectiveGroup{{0}, "tp"});
  CollectivesTensorParallelComm comm(&collectives, CpuBackend());
  Tensor data = Tensor::Zeros({4});
  for (int64_t iteration = 0; iteration < 3; ++iteration) {
    comm.BeginIteration(iteration);
    for (int expected = 0; expected < 5; ++expected) {
      const int ticket = comm.StartAllReduceSum(data);
      EXPECT_EQ(ticket, expected) << "iteration " << iteration;
      comm.WaitAllReduce(ticket);
    }
  }
  // A ticket still outstanding keeps the count going (none is reused).
  const int outstanding = comm.StartAllReduceSum(data);
  comm.BeginIteration(3);
  EXPECT_GT(comm.StartAllReduceSum(data), outstanding);
  EXPECT_TRUE(comm.status().ok()) << comm.status();
}

TEST(HybridCompressionTest, KeepTopTokensPerSample_TiesToTheLowerToken) {
  EXPECT_EQ(KeepTopTokensPerSample({1, 3, 3, 0, 5, 5, 5, 5}, 4, 0.5),
            (std::vector<uint8_t>{0, 1, 1, 0, 1, 1, 0, 0}));
  EXPECT_EQ(KeepTopTokensPerSample({2, 1, 0}, 3, 0.1), (std::vector<uint8_t>{1, 0, 0}));
}

// The tolerance helpers this file (and tensor_parallel_model_test) checks
// with bound the largest difference, which std::max computes without a NaN
// (it compares false): a NaN on either side must fail, naming its entry.
TEST(CloseHelpersTest, ExpectScaledClose_NaNEntry_FailsNamingIt) {
  const std::vector<float> want = {1, 2, 3}, nan_got = {1, NAN, 3}, nan_want = {1, 2, NAN};
  EXPECT_NONFATAL_FAILURE(testing::ExpectScaledClose(nan_got, want, 1e-5, "y"),
                          "y: entry 1 is nan against 2");
  EXPECT_NONFATAL_FAILURE(testing::ExpectScaledClose(want, nan_want, 1e-5, "y"),
                          "y: entry 2 is 3 against nan");
}

// Also in the key bias, whose entries are not compared (data_parallel_testing.h).
TEST(CloseHelpersTest, ExpectWeightsClose_NaNEntry_FailsNamingIt) {
  using Weights = std::map<std::string, std::vector<float>>;
  const Weights want = {{"h.0.mlp.c_fc.bias", {1, 2, 3}}, {"h.0.attn.c_attn.bias", {1, 2, 3}}};
  Weights got = want;
  got["h.0.mlp.c_fc.bias"][1] = NAN;
  EXPECT_NONFATAL_FAILURE(testing::ExpectWeightsClose(got, want, /*d_model=*/1, "w"),
                          "w h.0.mlp.c_fc.bias: entry 1 is nan against 2");
  got = want;
  got["h.0.attn.c_attn.bias"][1] = NAN;  // d_model 1: entry 1 is the key bias
  EXPECT_NONFATAL_FAILURE(testing::ExpectWeightsClose(got, want, /*d_model=*/1, "w"),
                          "w h.0.attn.c_attn.bias: entry 1 is nan against 2");
}

}  // namespace
}  // namespace pipetrain
