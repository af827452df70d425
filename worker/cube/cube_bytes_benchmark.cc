// Issue 22 acceptance "3-D against 1-D": the bytes each of 8 tensor-
// parallel ranks SENDS for one transformer layer (attention block + MLP
// block, forward + backward, one micro-batch), measured in two layouts and
// printed next to the formulas as a markdown table.
//
//   1-D (Megatron), T = 8: 8 threads, each an AttentionUnit and an MlpUnit
//       (worker/model) with a CollectivesTensorParallelComm over Collectives
//       on an in-process fabric; a rank's bytes are comm.wire_bytes() (what
//       its messages carried). Formula: 4 all-reduces of the [M, d] fp32
//       activation per layer (2 forward after the row-parallel c_proj's, 2
//       backward before the column-parallel c_attn / c_fc's dx); each is a
//       ring (Collectives uses recursive doubling, log2(T) x the whole
//       tensor, only below 64 KiB) sending 2 (T-1)/T x M x d x 4 bytes.
//   3-D (cube), p = 2: cube_blocks.h's CubeAttention* and CubeMlp* on the
//       in-process cube fabric (cube_testing.h); a rank's bytes are its
//       comm's sent_bytes(). Formula: 4 x (CubeAttentionSent + CubeMlpSent),
//       i.e. the paper's (p-1)(MN+NK+MK)/p^3 per 3-D product forward and
//       (p-1)(2MN+2NK+MK)/p^3 backward, plus the LayerNorm's and biases'
//       vector gathers / reductions.
//
// Bytes only: nothing is timed. Run:
//   bazel run -c opt //worker/cube:cube_bytes_benchmark
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/malloc_tuning.h"
#include "common/tensor.h"
#include "kernels/cpu/blas.h"
#include "worker/collectives/collectives.h"
#include "worker/collectives/tensor_parallel_comm.h"
#include "worker/cube/cube_blocks.h"
#include "worker/cube/cube_comm.h"
#include "worker/cube/cube_testing.h"
#include "worker/data/dataset.h"
#include "worker/model/attention_unit.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/gpt_config.h"
#include "worker/model/mlp_unit.h"
#include "worker/model/unit.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

constexpr int kRanks = 8;  // T (1-D) = p^3 (3-D)
constexpr int kP = 2;
constexpr int kHeads = 8;
constexpr uint64_t kSeed = 22;
const CubeDirection kDirection{CubeAxis::kY, CubeAxis::kX, CubeAxis::kZ};

struct Shape3 {
  int64_t d_model, batch, seq_len;
};

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& v : out) v = value(random);
  return out;
}

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

// Bytes each rank sent in the 1-D layout, indexed by rank.
std::vector<int64_t> Measure1D(const Shape3& s) {
  GptConfig config;
  config.max_seq_len = static_cast<int>(s.seq_len);
  config.n_layer = 1;
  config.n_head = kHeads;
  config.d_model = static_cast<int>(s.d_model);
  TokenBatch batch;
  batch.batch = static_cast<int>(s.batch);
  batch.seq_len = static_cast<int>(s.seq_len);
  batch.inputs.assign(s.batch * s.seq_len, 0);
  batch.targets.assign(s.batch * s.seq_len, 0);
  const int64_t n = s.batch * s.seq_len * s.d_model;
  const Tensor x = Tensor::FromVector({s.batch, s.seq_len, s.d_model}, Random(n, 1));
  const Tensor dy = Tensor::FromVector({s.batch, s.seq_len, s.d_model}, Random(n, 2));

  InProcessFabric fabric(kRanks);
  std::vector<int> members(kRanks);
  for (int r = 0; r < kRanks; ++r) members[r] = r;
  std::vector<int64_t> sent(kRanks, 0), all_reduces(kRanks, 0);
  std::vector<absl::Status> status(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Transport> transport = fabric.Connect(r);
      Collectives collectives(transport.get(), CollectiveGroup{members, "tp"});
      CollectivesTensorParallelComm comm(&collectives, CpuBackend());
      comm.BeginIteration(0);
      AttentionUnit attention(config, 0, CpuBackend(), &comm);
      MlpUnit mlp(config, 0, CpuBackend(), &comm);
      InitializeParameters(&attention, kSeed);
      InitializeParameters(&mlp, kSeed);
      for (Unit* unit : {static_cast<Unit*>(&attention), static_cast<Unit*>(&mlp)}) {
        UnitContext ctx;
        unit->ZeroGrads();
        unit->Forward(x, batch, &ctx);
        unit->Backward(dy, batch, ctx);
      }
      sent[r] = comm.wire_bytes();
      all_reduces[r] = comm.all_reduces();
      status[r] = comm.status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    if (!status[r].ok()) Die(absl::StrCat("1-D rank ", r), status[r]);
    if (all_reduces[r] != 4) {
      std::fprintf(stderr, "note: 1-D rank %d ran %lld all-reduces, not 4\n", r,
                   static_cast<long long>(all_reduces[r]));
    }
  }
  return sent;
}

// 1-D formula per rank: 4 all-reduces of M x d floats, ring or (below
// small_bytes, power-of-two T) recursive doubling.
int64_t Formula1D(const Shape3& s, bool* ring) {
  const int64_t bytes = s.batch * s.seq_len * s.d_model * 4;
  *ring = bytes >= CollectiveOptions{}.small_bytes;
  const int64_t per =
      *ring ? 2 * (kRanks - 1) * bytes / kRanks : static_cast<int64_t>(std::log2(kRanks)) * bytes;
  return 4 * per;
}

// Bytes each rank sent in the 3-D layout, indexed by rank.
std::vector<int64_t> Measure3D(const Shape3& s) {
  const int n = kP * kP * kP;
  const int64_t d = s.d_model, M = s.batch * s.seq_len;
  const CubeBlockDims dims{s.batch, s.seq_len, d, kHeads};
  // Unsplit parameters in Hugging Face shapes, then every rank's blocks.
  auto full = [&](int64_t k, int64_t k2, uint32_t seed) {
    CubeBlockTensors t;
    t.ln_weight = Random(d, seed);
    t.ln_bias = Random(d, seed + 1);
    t.in_weight = Random(d * k, seed + 2);
    t.in_bias = Random(k, seed + 3);
    t.out_weight = Random(k2 * d, seed + 4);
    t.out_bias = Random(d, seed + 5);
    return t;
  };
  const CubeBlockTensors attn_full = full(3 * d, d, 100), mlp_full = full(4 * d, 4 * d, 200);
  std::vector<CubeBlockTensors> attn(n), mlp(n), attn_grad(n), mlp_grad(n);
  for (int r = 0; r < n; ++r) {
    const CubeCoord coord = CubeCoordOf(r, kP);
    auto a = ScatterCubeAttentionParams(attn_full, dims, kP, coord, kDirection);
    auto m = ScatterCubeMlpParams(mlp_full, dims, kP, coord, kDirection);
    if (!a.ok()) Die("scatter attention", a.status());
    if (!m.ok()) Die("scatter mlp", m.status());
    attn[r] = *std::move(a);
    mlp[r] = *std::move(m);
    attn_grad[r] = attn[r];
    mlp_grad[r] = mlp[r];
  }
  const int64_t block = (M / (kP * kP)) * (d / kP);  // [M/p^2, d/p]
  std::vector<int64_t> sent(n, 0);
  auto fabric = InProcessCubeFabric::Create(kP, absl::Seconds(600));
  if (!fabric.ok()) Die("cube fabric", fabric.status());
  const std::vector<absl::Status> status = (*fabric)->Run([&](InProcessCubeComm& comm) {
    const int r = CubeRankIndex(comm.coord(), kP);
    const std::vector<float> x = Random(block, 1000 + r), dy = Random(block, 2000 + r);
    std::vector<float> h(block), y(block), dh(block), dx(block);
    CubeBlockContext attn_ctx, mlp_ctx;
    comm.ResetSentBytes();
    absl::Status st = CubeAttentionForward(comm, kDirection, dims, attn[r].params(), x,
                                           absl::MakeSpan(h), &attn_ctx);
    if (st.ok()) {
      st = CubeMlpForward(comm, kDirection, dims, mlp[r].params(), h, absl::MakeSpan(y), &mlp_ctx);
    }
    if (st.ok()) {
      st = CubeMlpBackward(comm, kDirection, dims, mlp[r].params(), mlp_ctx, dy, absl::MakeSpan(dh),
                           mlp_grad[r].grads());
    }
    if (st.ok()) {
      st = CubeAttentionBackward(comm, kDirection, dims, attn[r].params(), attn_ctx, dh,
                                 absl::MakeSpan(dx), attn_grad[r].grads());
    }
    sent[r] = comm.sent_bytes();
    return st;
  });
  for (int r = 0; r < n; ++r) {
    if (!status[r].ok()) Die(absl::StrCat("3-D rank ", r), status[r]);
  }
  return sent;
}

// 3-D formula per rank (bytes), indexed by rank.
std::vector<int64_t> Formula3D(const Shape3& s) {
  const CubeBlockDims dims{s.batch, s.seq_len, s.d_model, kHeads};
  std::vector<int64_t> out;
  for (int r = 0; r < kP * kP * kP; ++r) {
    const CubeCoord coord = CubeCoordOf(r, kP);
    const CubeBlockSentFloats a = CubeAttentionSent(dims, kP, coord, kDirection);
    const CubeBlockSentFloats m = CubeMlpSent(dims, kP, coord, kDirection);
    out.push_back(4 * (a.forward + a.backward + m.forward + m.backward));
  }
  return out;
}

// The paper's products only (no LayerNorm / bias terms), bytes per rank:
// per 3-D linear M x N x K, (p-1)(MN+NK+MK)/p^3 forward and
// (p-1)(2MN+2NK+MK)/p^3 backward; the layer's four linears are
// c_attn M x d x 3d, attn c_proj M x d x d, c_fc M x d x 4d, mlp c_proj
// M x 4d x d.
int64_t PaperProducts3D(const Shape3& s) {
  const int64_t M = s.batch * s.seq_len, d = s.d_model, p3 = kP * kP * kP;
  auto linear = [&](int64_t m, int64_t n, int64_t k) {
    return (kP - 1) * ((m * n + n * k + m * k) + (2 * m * n + 2 * n * k + m * k)) / p3;
  };
  return 4 * (linear(M, d, 3 * d) + linear(M, d, d) + linear(M, d, 4 * d) + linear(M, 4 * d, d));
}

std::string Mib(int64_t bytes) { return absl::StrCat(bytes, " (", bytes / 1024, " KiB)"); }

int Run(int argc, char** argv) {
  std::string command = "bazel run -c opt //worker/cube:cube_bytes_benchmark";
  std::string invoked;
  for (int i = 0; i < argc; ++i) absl::StrAppend(&invoked, i ? " " : "", argv[i]);
  std::printf("# Bytes sent per rank per layer: 1-D (Megatron, T = %d) vs 3-D (cube, p = %d)\n\n",
              kRanks, kP);
  std::printf("Machine: %s (%u hardware threads); OpenBLAS %s, %d thread per GEMM\n",
              CpuModel().c_str(), std::thread::hardware_concurrency(), BlasCoreName().c_str(),
              BlasThreads());
  std::printf("Command: %s\n(binary invoked as: %s)\n\n", command.c_str(), invoked.c_str());
  std::printf(
      "What: the bytes each of %d ranks SENDS for one transformer layer (attention block + MLP "
      "block), forward + backward, one micro-batch of B sequences of T tokens (M = B x T rows), "
      "d_model d, n_head %d, fp32. BYTES ONLY: nothing is timed here; these are counts, not "
      "speeds. All ranks are threads of this process (in-process transports), so no network "
      "is involved.\n\n",
      kRanks, kHeads);
  std::printf(
      "- 1-D measured: CollectivesTensorParallelComm::wire_bytes() of each rank's AttentionUnit "
      "+ MlpUnit (T = 8, Collectives over InProcessFabric); the max over ranks (min shown if "
      "they differ).\n"
      "- 1-D formula: 4 all-reduces of the [M, d] activation per layer; ring: 2 (T-1)/T x M x d "
      "x 4 bytes each (Collectives uses recursive doubling, log2(T) x M x d x 4, only for "
      "tensors below 64 KiB; the 'alg' column says which applies).\n"
      "- 3-D measured: InProcessCubeComm::sent_bytes() over CubeAttentionForward, "
      "CubeMlpForward, CubeMlpBackward, CubeAttentionBackward (direction y,x,z), max and mean "
      "over the 8 ranks.\n"
      "- 3-D formula: 4 x (CubeAttentionSent + CubeMlpSent) floats (cube_blocks.h), max over "
      "ranks: the paper's (p-1)(MN+NK+MK)/p^3 per product forward, (p-1)(2MN+2NK+MK)/p^3 "
      "backward, plus LayerNorm / bias vector terms; 'paper products' is that product part "
      "alone.\n"
      "- ratio = 1-D measured / 3-D measured (max).\n\n");

  const std::vector<Shape3> shapes = {{256, 4, 128}, {256, 8, 128},  {512, 4, 128},
                                      {512, 8, 128}, {1024, 4, 128}, {1024, 8, 128}};
  std::printf(
      "| d_model | B | T | M | 1-D measured B/rank | 1-D formula | alg | 3-D measured B/rank "
      "(max) | 3-D measured (mean) | 3-D formula (max) | 3-D paper products | ratio 1-D/3-D |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> disagreements;
  for (const Shape3& s : shapes) {
    const std::vector<int64_t> one = Measure1D(s);
    const std::vector<int64_t> three = Measure3D(s);
    bool ring = true;
    const int64_t one_formula = Formula1D(s, &ring);
    const std::vector<int64_t> three_formula = Formula3D(s);
    const int64_t one_max = *std::max_element(one.begin(), one.end());
    const int64_t one_min = *std::min_element(one.begin(), one.end());
    const int64_t three_max = *std::max_element(three.begin(), three.end());
    double three_mean = 0;
    for (int64_t b : three) three_mean += double(b) / three.size();
    const int64_t three_formula_max = *std::max_element(three_formula.begin(), three_formula.end());
    std::string one_cell = Mib(one_max);
    if (one_min != one_max) absl::StrAppend(&one_cell, ", min ", one_min);
    std::printf("| %lld | %lld | %lld | %lld | %s | %s | %s | %s | %.0f | %s | %s | %.2f |\n",
                static_cast<long long>(s.d_model), static_cast<long long>(s.batch),
                static_cast<long long>(s.seq_len), static_cast<long long>(s.batch * s.seq_len),
                one_cell.c_str(), Mib(one_formula).c_str(), ring ? "ring" : "rec. doubling",
                Mib(three_max).c_str(), three_mean, Mib(three_formula_max).c_str(),
                Mib(PaperProducts3D(s)).c_str(), double(one_max) / double(three_max));
    std::fflush(stdout);
    const std::string where = absl::StrCat("d ", s.d_model, " B ", s.batch, " T ", s.seq_len);
    for (int r = 0; r < kRanks; ++r) {
      if (one[r] != one_formula) {
        disagreements.push_back(absl::StrCat(where, ": 1-D rank ", r, " measured ", one[r],
                                             " vs formula ", one_formula));
      }
      if (three[r] != three_formula[r]) {
        disagreements.push_back(absl::StrCat(where, ": 3-D rank ", r, " measured ", three[r],
                                             " vs formula ", three_formula[r]));
      }
    }
  }
  // The products' part in closed form: the four linears give 39 M d + 36 d^2
  // floats times (p-1)/p^3 (forward + backward), the 1-D layer 4 x 2 (P-1)/P
  // M d with P = p^3 ranks.
  std::printf(
      "\nScaling (paper): 1-D sends O(M d) per rank per layer, independent of T (4 all-reduces "
      "x 2 (T-1)/T -> 8 M d floats); 3-D sends O(M d / p^2 + d^2 / p^2) per rank, i.e. "
      "P^(-2/3) with P = p^3 ranks. From the paper's product terms (LayerNorm / bias terms "
      "dropped, they are < 1%% here): 3-D = (p-1)/p^3 x (39 M d + 36 d^2) floats per rank, so "
      "1-D / 3-D = 8 (P-1)/P / ((p-1)/p^3 x (39 + 36 d/M)). At P = 8 (p = 2) that is "
      "56 / (39 + 36 d/M): below 1 (3-D sends MORE) until M/d = 36/17 = %.2f, and at most "
      "56/39 = %.2f for M >> d; the table's measured ratios follow it (M/d = 0.5, 1, 2, 4 -> "
      "%.2f, %.2f, %.2f, %.2f). Projection only (formula, not measured here), at M/d = 1:",
      36.0 / 17.0, 56.0 / 39.0, 56.0 / (39 + 72.0), 56.0 / (39 + 36.0), 56.0 / (39 + 18.0),
      56.0 / (39 + 9.0));
  for (int p : {2, 3, 4, 8}) {
    const double P = double(p) * p * p;
    std::printf(" P = %d: %.2f;", p * p * p, 8 * (P - 1) / P / ((p - 1) / (P) * (39 + 36.0)));
  }
  std::printf("\n\n");
  if (disagreements.empty()) {
    std::printf("Every rank's measured bytes equal its formula exactly (1-D and 3-D).\n");
  } else {
    std::printf("Measured bytes that DISAGREE with their formula:\n");
    for (const std::string& line : disagreements) std::printf("- %s\n", line.c_str());
  }
  // As the other benchmarks end: a count off its formula fails the run.
  std::printf("# %s\n", disagreements.empty() ? "OK" : "FAILED");
  return disagreements.empty() ? 0 : 1;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  pipetrain::ConfigureBlasOrReexec(argv);
  pipetrain::TuneMallocForLargeBuffers();  // As pipetrain-worker does: malloc_tuning.h.
  pipetrain::SetBlasThreads(1);
  return pipetrain::Run(argc, argv);
}
