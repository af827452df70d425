// AccTFM's pipeline across units (Unit::set_stream_output): an attention
// unit hands its partitions' pending all-reduces to the MLP unit after it,
// forward, and the MLP to the attention, backward. The order in which the
// sums are started and waited for shows the overlap (the next unit's
// first partition is computed before the previous unit's last sum is
// waited for), and streaming must not change the results: outputs and
// input gradients bitwise (the same per-row arithmetic), parameter
// gradients bitwise except the LayerNorm's, which the streamed backward
// accumulates one partition at a time (a different summation order).
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/philox.h"
#include "gtest/gtest.h"
#include "worker/model/unit.h"

namespace pipetrain {
namespace {

// A group of two ranks whose "other rank" contributes zeros: a sum leaves
// the tensor as it is, so a single process can run a rank's units. It
// records "S<ticket>" when a sum is started and "W<ticket>" when it is
// waited for.
class RecordingComm : public TensorParallelComm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void AllReduceSum(Tensor&) override { events.push_back("sync"); }
  absl::Status status() const override { return absl::OkStatus(); }
  int StartAllReduceSum(Tensor&) override {
    events.push_back("S" + std::to_string(next_));
    return next_++;
  }
  void WaitAllReduce(int ticket) override { events.push_back("W" + std::to_string(ticket)); }
  std::vector<std::string> events;

 private:
  int next_ = 0;
};

// The same group compressing as AccTFM's hybrid compression does, with
// its effects deferred to the wait, as a real group's background sum
// would land: a token-sparse sum keeps each sample's top half of rows by
// score (ties to the lower row), zeroes the others and only then tells
// which it kept; a masked sum zeroes the rows not kept. A unit that read
// a streamed sum's rows, or its kept flags, before the wait would see them
// unsummed.
class CompressingComm : public RecordingComm {
 public:
  bool compresses() const override { return true; }
  int StartTokenSparseSum(Tensor& data, std::vector<float> scores, int seq_len,
                          std::vector<uint8_t>* kept) override {
    std::vector<uint8_t> flags(scores.size(), 0);
    for (size_t s0 = 0; s0 < scores.size(); s0 += seq_len) {
      std::vector<size_t> order(seq_len);
      for (int t = 0; t < seq_len; ++t) order[t] = s0 + t;
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return scores[a] > scores[b]; });
      for (int t = 0; t < seq_len / 2; ++t) flags[order[t]] = 1;
    }
    const int ticket = StartAllReduceSum(data);
    deferred_[ticket] = {data, flags, kept};
    return ticket;
  }
  int StartMaskedSum(Tensor& data, std::vector<uint8_t> kept) override {
    const int ticket = StartAllReduceSum(data);
    deferred_[ticket] = {data, std::move(kept), nullptr};
    return ticket;
  }
  void WaitAllReduce(int ticket) override {
    RecordingComm::WaitAllReduce(ticket);
    auto it = deferred_.find(ticket);
    if (it == deferred_.end()) return;
    Deferred& d = it->second;
    const int64_t width = d.data.shape().back();
    for (size_t r = 0; r < d.flags.size(); ++r) {
      if (!d.flags[r]) std::fill_n(d.data.data() + r * width, width, 0.0f);
    }
    if (d.kept_out != nullptr) *d.kept_out = d.flags;
    deferred_.erase(it);
  }

 private:
  struct Deferred {
    Tensor data;
    std::vector<uint8_t> flags;
    std::vector<uint8_t>* kept_out;
  };
  std::map<int, Deferred> deferred_;
};

GptConfig Config() {
  GptConfig c;
  c.vocab_size = 16;
  c.max_seq_len = 4;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 8;
  return c;
}

Tensor Random(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::Zeros(shape);
  FillNormal(seed, 1, 0.0f, 1.0f, t.data(), t.numel());
  return t;
}

struct ChainRun {
  std::vector<std::string> events;
  Tensor y, dx;
  std::vector<Tensor> grads;  // attention's then the MLP's, in parameters() order
  std::vector<Tensor> kept;   // compressed: the attention's then the MLP's kept rows
};

// attn_0 then mlp_0 of Config() on 4 samples, both units with `partitions`
// (forward and backward), streamed or not, on a CompressingComm when
// `compress`.
ChainRun RunChain(bool stream, int attn_partitions, int mlp_partitions, bool compress = false) {
  const GptConfig c = Config();
  RecordingComm plain_comm;
  CompressingComm compressing_comm;
  RecordingComm& comm = compress ? compressing_comm : plain_comm;
  auto attn = MakeUnit(c, 1, CpuBackend(), &comm);
  auto mlp = MakeUnit(c, 2, CpuBackend(), &comm);
  attn->set_tensor_parallel_partitions(attn_partitions, attn_partitions);
  mlp->set_tensor_parallel_partitions(mlp_partitions, mlp_partitions);
  InitializeParameters(attn.get(), 7);
  InitializeParameters(mlp.get(), 7);
  const TokenBatch batch{4, 4, {}, {}};
  const Tensor x = Random({4, 4, c.d_model}, 11);
  UnitContext attn_ctx, mlp_ctx;
  attn->set_stream_output(stream);
  Tensor h = attn->Forward(x, batch, &attn_ctx);
  if (stream) attn->PassPendingTo(mlp.get());
  ChainRun run;
  run.y = mlp->Forward(h, batch, &mlp_ctx).Clone();
  mlp->set_stream_output(stream);
  Tensor dh = mlp->Backward(Random({4, 4, c.d_model}, 13), batch, mlp_ctx);
  if (stream) mlp->PassPendingTo(attn.get());
  run.dx = attn->Backward(dh, batch, attn_ctx).Clone();
  run.events = comm.events;
  for (Unit* u : {attn.get(), mlp.get()}) {
    for (Parameter* p : u->parameters()) run.grads.push_back(p->grad.Clone());
  }
  if (compress) run.kept = {attn_ctx.saved.back().Clone(), mlp_ctx.saved.back().Clone()};
  return run;
}

// Compares two runs' results: outputs, input gradients and parameter
// gradients bitwise, the LayerNorms' within rounding (see the top).
void ExpectSameResults(const ChainRun& plain, const ChainRun& streamed) {
  EXPECT_EQ(plain.y.ToVector(), streamed.y.ToVector());
  EXPECT_EQ(plain.dx.ToVector(), streamed.dx.ToVector());
  ASSERT_EQ(plain.grads.size(), 12u);
  ASSERT_EQ(streamed.grads.size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    const bool layernorm = i % 6 < 2;  // ln weight and bias lead each unit's six
    const std::vector<float> a = plain.grads[i].ToVector(), b = streamed.grads[i].ToVector();
    if (!layernorm) {
      EXPECT_EQ(a, b) << "parameter " << i;
      continue;
    }
    for (size_t e = 0; e < a.size(); ++e) {
      EXPECT_NEAR(a[e], b[e], 1e-5 * (1 + std::abs(a[e]))) << "parameter " << i << "[" << e << "]";
    }
  }
}

TEST(StreamedUnits, Forward_NextUnitStartsBeforeTheLastSumIsWaitedFor) {
  const ChainRun plain = RunChain(false, 2, 2);
  const ChainRun streamed = RunChain(true, 2, 2);
  // Forward: attention's sums 0-1, the MLP's 2-3; backward: the MLP's 4-5,
  // the attention's 6-7.
  EXPECT_EQ(plain.events,
            (std::vector<std::string>{"S0", "S1", "W0", "W1", "S2", "S3", "W2", "W3", "S4", "S5",
                                      "W4", "W5", "S6", "S7", "W6", "W7"}));
  EXPECT_EQ(streamed.events,
            (std::vector<std::string>{"S0", "S1", "W0", "S2", "W1", "S3", "W2", "W3", "S4", "S5",
                                      "W4", "S6", "W5", "S7", "W6", "W7"}));
}

TEST(StreamedUnits, PartitionsCutDifferently_SplitOrMerge) {
  // Attention in 4 partitions, the MLP in 2: the MLP's first partition
  // needs the attention's first two sums.
  const ChainRun streamed = RunChain(true, 4, 2);
  const std::vector<std::string> forward(streamed.events.begin(), streamed.events.begin() + 8);
  EXPECT_EQ(forward, (std::vector<std::string>{"S0", "S1", "S2", "S3", "W0", "W1", "S4", "W2"}));
}

TEST(StreamedUnits, SameResultsAsWaitingInEachUnit) {
  for (auto [attn_k, mlp_k] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{1, 4}}) {
    SCOPED_TRACE(std::to_string(attn_k) + " and " + std::to_string(mlp_k) + " partitions");
    ExpectSameResults(RunChain(false, attn_k, mlp_k), RunChain(true, attn_k, mlp_k));
  }
}

// AccTFM's hybrid compression streams too: the token-sparse sums' rows,
// and their kept flags, reach the next unit as each is waited for, and
// the backward zeroes a dropped token's gradient once its rows of a
// streamed dy are final. Same results, same kept rows as waiting in each
// unit; the overlap as without compression.
TEST(StreamedUnits, Compressed_SameResultsAndKeptRows_Overlapped) {
  for (auto [attn_k, mlp_k] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{1, 4}}) {
    SCOPED_TRACE(std::to_string(attn_k) + " and " + std::to_string(mlp_k) + " partitions");
    const ChainRun plain = RunChain(false, attn_k, mlp_k, /*compress=*/true);
    const ChainRun streamed = RunChain(true, attn_k, mlp_k, /*compress=*/true);
    ExpectSameResults(plain, streamed);
    ASSERT_EQ(plain.kept.size(), 2u);
    ASSERT_EQ(streamed.kept.size(), 2u);
    for (int u = 0; u < 2; ++u) {
      const std::vector<float> kept = plain.kept[u].ToVector();
      EXPECT_EQ(kept, streamed.kept[u].ToVector()) << "unit " << u;
      // Half of each sample's 4 tokens: the compression did drop rows.
      EXPECT_EQ(std::count(kept.begin(), kept.end(), 1.0f), 8) << "unit " << u;
    }
    // Dropping rows changed the output: the sums are not left as they were.
    EXPECT_NE(plain.y.ToVector(), RunChain(false, attn_k, mlp_k).y.ToVector());
  }
  EXPECT_EQ(RunChain(true, 2, 2, /*compress=*/true).events,
            (std::vector<std::string>{"S0", "S1", "W0", "S2", "W1", "S3", "W2", "W3", "S4", "S5",
                                      "W4", "S6", "W5", "S7", "W6", "W7"}));
}

TEST(StreamedUnits, NotAskedOrNotAbleToStream_WaitsInTheUnit) {
  // Without set_stream_output the units wait for their own sums, as the
  // single-partition, unstreamed schedule does.
  const ChainRun once = RunChain(false, 1, 1);
  EXPECT_EQ(once.events,
            (std::vector<std::string>{"S0", "W0", "S1", "W1", "S2", "W2", "S3", "W3"}));
}

}  // namespace
}  // namespace pipetrain
