#include "coordinator/planner/tensor_cube_costs.h"

#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/planner/tensor_partitions.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// embed, attn_0, mlp_0, attn_1, mlp_1, head: unit u takes (u + 1) ms
// forward and twice that backward, with `bytes` of output.
ModelProfile Profile(double bytes) {
  ModelProfile p;
  p.micro_batch_size = 4;
  double ms = 1e-3;
  for (const std::string name : {"embed", "attn_0", "mlp_0", "attn_1", "mlp_1", "head"}) {
    UnitProfile u;
    u.name = name;
    u.fwd_seconds = ms;
    u.bwd_seconds = 2 * ms;
    u.activation_bytes = bytes;
    p.units.push_back(u);
    ms += 1e-3;
  }
  return p;
}

struct Dims {
  int p;
  int64_t batch, seq_len, d_model, n_head;
  int64_t rows() const { return batch * seq_len; }
};

// The floats a diagonal rank (the busiest: it roots the vector broadcasts)
// sends per pass of a block, written out from the formulas of
// cube_linear.h, cube_vector.h and cube_blocks.h for dims that every
// division is exact for: K = 3d (attention) or 4d (MLP) wide first linear,
// K2 = d or 4d wide second.
struct Expected {
  double forward, backward;
};
Expected DiagonalBlockFloats(const Dims& s, bool attention) {
  const double p = s.p, p2 = p * p, p3 = p2 * p, m = s.rows(), d = s.d_model;
  const double k = attention ? 3 * d : 4 * d, k2 = attention ? d : 4 * d;
  const auto linear_fwd = [&](double mm, double nn, double kk) {
    return (p - 1) * (mm * nn + nn * kk + mm * kk) / p3;
  };
  const auto linear_bwd = [&](double mm, double nn, double kk) {
    return (p - 1) * (2 * mm * nn + 2 * nn * kk + mm * kk) / p3;
  };
  const auto vector_gather = [&](double l) { return 2 * (p - 1) * l / p2; };  // a root's
  const auto reduce_grad = [&](double l) { return (p - 1) * l / p2 + 2 * (p - 1) * l / p3; };
  const auto all_reduce = [&](double n) { return 2 * (p - 1) * n / p; };
  const double row_values = m / p2;
  Expected e;
  e.forward = 2 * vector_gather(d) + 2 * all_reduce(row_values) + linear_fwd(m, d, k) +
              vector_gather(k) + linear_fwd(m, k2, d) + vector_gather(d);
  e.backward = linear_bwd(m, k2, d) + reduce_grad(d) + linear_bwd(m, d, k) + reduce_grad(k) +
               vector_gather(d) + all_reduce(2 * row_values) + 2 * reduce_grad(d);
  return e;
}

// A full [B, T, d] activation all-gathered over the cube, one axis at a time.
double GatherFloats(const Dims& s) {
  const double n = s.rows() * s.d_model, p = s.p;
  return (p - 1) * n / (p * p * p) + (p - 1) * n / (p * p) + (p - 1) * n / p;
}

absl::StatusOr<std::vector<TensorParallelUnitLanes>> Passes(const Dims& s, double bandwidth,
                                                            double latency) {
  return CubeTensorParallelUnitPasses(Profile(1e6), s.p * s.p * s.p, s.batch, s.seq_len, s.d_model,
                                      s.n_head, bandwidth, latency);
}

const Dims kCube2{2, 4, 16, 16, 4};
const Dims kCube3{3, 9, 3, 54, 6};

TEST(CubeTensorParallelUnitPassesTest, Compute_DividedByT_OnePartition) {
  for (const Dims& s : {kCube2, kCube3}) {
    absl::StatusOr<std::vector<TensorParallelUnitLanes>> passes = Passes(s, 1e9, 1e-6);
    ASSERT_TRUE(passes.ok()) << passes.status();
    ASSERT_EQ(passes->size(), 6u);
    const int t = s.p * s.p * s.p;
    for (int u = 0; u < 6; ++u) {
      SCOPED_TRACE(u);
      EXPECT_DOUBLE_EQ((*passes)[u].forward.compute_seconds, (u + 1) * 1e-3 / t);
      EXPECT_DOUBLE_EQ((*passes)[u].backward.compute_seconds, 2 * (u + 1) * 1e-3 / t);
      EXPECT_EQ((*passes)[u].forward.partitions, 1);
      EXPECT_EQ((*passes)[u].backward.partitions, 1);
    }
  }
}

TEST(CubeTensorParallelUnitPassesTest, Blocks_PayTheBusiestRanksFloats_AndTheBoundaryGathers) {
  // Latency 0, 1 GB/s: a pass's communication is 4 bytes a float / 1e9.
  for (const Dims& s : {kCube2, kCube3}) {
    SCOPED_TRACE(s.p);
    absl::StatusOr<std::vector<TensorParallelUnitLanes>> passes = Passes(s, 1e9, 0);
    ASSERT_TRUE(passes.ok()) << passes.status();
    const Expected attn = DiagonalBlockFloats(s, true), mlp = DiagonalBlockFloats(s, false);
    const double gather = GatherFloats(s);
    const auto secs = [](double floats) { return floats * 4 / 1e9; };
    const std::vector<TensorParallelUnitLanes>& l = *passes;
    // Inside the run of cube units: the block's own collectives only.
    EXPECT_NEAR(l[2].forward.all_reduce_seconds, secs(mlp.forward), 1e-15);
    EXPECT_NEAR(l[2].backward.all_reduce_seconds, secs(mlp.backward), 1e-15);
    EXPECT_NEAR(l[3].forward.all_reduce_seconds, secs(attn.forward), 1e-15);
    EXPECT_NEAR(l[3].backward.all_reduce_seconds, secs(attn.backward), 1e-15);
    // attn_0 gathers its input gradient for the embedding; mlp_1 its
    // output for the head.
    EXPECT_NEAR(l[1].forward.all_reduce_seconds, secs(attn.forward), 1e-15);
    EXPECT_NEAR(l[1].backward.all_reduce_seconds, secs(attn.backward + gather), 1e-15);
    EXPECT_NEAR(l[4].forward.all_reduce_seconds, secs(mlp.forward + gather), 1e-15);
    EXPECT_NEAR(l[4].backward.all_reduce_seconds, secs(mlp.backward), 1e-15);
  }
}

TEST(CubeTensorParallelUnitPassesTest, Blocks_KnownFigures_P2) {
  // kCube2 worked by hand (M = 64 rows, d = 16, diagonal rank): attention
  // forward 608 (c_attn) + 288 (c_proj) + 2 x 8 (ln vectors) + 2 x 16
  // (ln row sums) + 24 + 8 (biases) = 976 floats; the gather 64 x 16 x
  // (1/8 + 1/4 + 1/2) = 896 floats.
  absl::StatusOr<std::vector<TensorParallelUnitLanes>> passes = Passes(kCube2, 4e9, 0);
  ASSERT_TRUE(passes.ok()) << passes.status();
  EXPECT_NEAR((*passes)[3].forward.all_reduce_seconds, 976e-9, 1e-18);
  EXPECT_NEAR((*passes)[1].backward.all_reduce_seconds - (*passes)[3].backward.all_reduce_seconds,
              896e-9, 1e-18);
}

TEST(CubeTensorParallelUnitPassesTest, EmbedAndHead_EqualThe1dCosts) {
  const ModelProfile profile = Profile(1e6);
  const std::vector<int> whole(6, 1);
  absl::StatusOr<std::vector<TensorParallelUnitLanes>> cube =
      CubeTensorParallelUnitPasses(profile, 8, 4, 16, 16, 4, 1e9, 1e-5);
  // The micro-batch's 4 x 16 tokens size the head's small all-reduces.
  absl::StatusOr<std::vector<TensorParallelUnitLanes>> flat =
      TensorParallelUnitPasses(profile, 8, whole, whole, 1e9, 1e-5, 1.0, 0, false, 4 * 16);
  ASSERT_TRUE(cube.ok() && flat.ok()) << cube.status() << flat.status();
  for (int u : {0, 5}) {
    SCOPED_TRACE(u);
    for (auto pass : {&TensorParallelUnitLanes::forward, &TensorParallelUnitLanes::backward}) {
      EXPECT_EQ(((*cube)[u].*pass).compute_seconds, ((*flat)[u].*pass).compute_seconds);
      EXPECT_EQ(((*cube)[u].*pass).partitions, ((*flat)[u].*pass).partitions);
      EXPECT_EQ(((*cube)[u].*pass).all_reduce_seconds, ((*flat)[u].*pass).all_reduce_seconds);
    }
  }
  EXPECT_GT((*cube)[0].forward.all_reduce_seconds, 0);  // the embedding's all-reduce is there
}

TEST(CubeTensorParallelUnitPassesTest, UnlimitedBandwidth_LatencyOnly) {
  // Bandwidth 0: bytes are free (as for RuntimeModel / AllReduceSeconds);
  // each collective step costs the latency. Steps per block pass, by kind:
  //   forward:  4 broadcasts (1 step), 8 all-gathers and 2 reduce-scatters
  //             (p - 1), 2 all-reduces (2 (p - 1); one exchange for p = 2);
  //   backward: 1 broadcast, 7 all-gathers, 8 reduce-scatters, 5 all-reduces;
  //   a gather of the full activation: 3 all-gathers.
  const double alpha = 1e-5;
  for (const Dims& s : {kCube2, kCube3}) {
    SCOPED_TRACE(s.p);
    absl::StatusOr<std::vector<TensorParallelUnitLanes>> passes = Passes(s, 0, alpha);
    ASSERT_TRUE(passes.ok()) << passes.status();
    const int q = s.p - 1;
    const int all_reduce = s.p == 2 ? 1 : 2 * q;
    const double forward = 4 + 8 * q + 2 * q + 2 * all_reduce;
    const double backward = 1 + 7 * q + 8 * q + 5 * all_reduce;
    const double gather = 3 * q;
    const std::vector<TensorParallelUnitLanes>& l = *passes;
    EXPECT_NEAR(l[2].forward.all_reduce_seconds, alpha * forward, 1e-15);
    EXPECT_NEAR(l[3].backward.all_reduce_seconds, alpha * backward, 1e-15);
    EXPECT_NEAR(l[1].backward.all_reduce_seconds, alpha * (backward + gather), 1e-15);
    EXPECT_NEAR(l[4].forward.all_reduce_seconds, alpha * (forward + gather), 1e-15);
  }
}

TEST(CubeTensorParallelUnitPassesTest, CommunicationExposed_PassIsComputePlusCommunication) {
  const ModelProfile profile = Profile(1e6);
  absl::StatusOr<std::vector<TensorParallelUnitLanes>> passes =
      CubeTensorParallelUnitPasses(profile, 8, 4, 16, 16, 4, 1e9, 1e-5);
  ASSERT_TRUE(passes.ok()) << passes.status();
  const ModelProfile costs = TensorParallelCostsOf(profile, 8, *passes);
  for (int u = 1; u <= 4; ++u) {
    SCOPED_TRACE(u);
    const TensorParallelUnitLanes& l = (*passes)[u];
    EXPECT_GT(l.forward.all_reduce_seconds, 0);
    // The compute, which a worker's speed divides, apart from the
    // all-reduces, which it does not.
    EXPECT_DOUBLE_EQ(costs.units[u].fwd_seconds, l.forward.compute_seconds);
    EXPECT_DOUBLE_EQ(costs.units[u].fwd_comm_seconds, l.forward.all_reduce_seconds);
    EXPECT_DOUBLE_EQ(costs.units[u].bwd_seconds, l.backward.compute_seconds);
    EXPECT_DOUBLE_EQ(costs.units[u].bwd_comm_seconds, l.backward.all_reduce_seconds);
  }
}

TEST(CubeTensorParallelUnitPassesTest, BadInput_InvalidArgument) {
  const ModelProfile profile = Profile(1e6);
  const auto code = [&](int tensor, int64_t batch, int64_t d_model, int64_t n_head,
                        double bandwidth = 1e9, double latency = 0) {
    return CubeTensorParallelUnitPasses(profile, tensor, batch, 16, d_model, n_head, bandwidth,
                                        latency)
        .status();
  };
  // Not a cube of p >= 2.
  for (int tensor : {1, 4, 9, 16}) {
    SCOPED_TRACE(tensor);
    const absl::Status status = code(tensor, 36, 36, 6);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("p^3"), std::string::npos) << status;
  }
  // T = 8 (p = 2), dims that do not split.
  EXPECT_EQ(code(8, 4, 18, 2).message(),
            "3-D tensor-parallel costs: d_model 18 is not a multiple of p^2 = 4");
  EXPECT_EQ(code(8, 4, 24, 3).message(),
            "3-D tensor-parallel costs: n_head 3 is not a multiple of p = 2");
  EXPECT_EQ(code(8, 6, 16, 4).message(),
            "3-D tensor-parallel costs: the micro-batch's 6 samples are not a multiple of p^2 = 4");
  EXPECT_EQ(code(8, 4, 16, 32).code(), absl::StatusCode::kInvalidArgument);  // 32 heads of 16
  EXPECT_EQ(code(27, 9, 36, 4).code(), absl::StatusCode::kInvalidArgument);  // 3 does not divide 4
  EXPECT_EQ(code(8, 0, 16, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(8, 4, 16, 4, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(8, 4, 16, 4, 1e9, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(code(8, 4, 16, 4).ok());
}

}  // namespace
}  // namespace pipetrain
