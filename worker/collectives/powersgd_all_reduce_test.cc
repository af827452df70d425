#include "worker/collectives/powersgd_all_reduce.h"

#include <cmath>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

// Runs body(rank, collectives) on n threads over an in-process fabric.
void RunGroup(int n, const std::function<void(int, Collectives&)>& body) {
  InProcessFabric fabric(n);
  std::vector<int> members(n);
  for (int i = 0; i < n; ++i) members[i] = i;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Transport> transport = fabric.Connect(r);
      Collectives c(transport.get(), {members, "j"});
      body(r, c);
    });
  }
  for (std::thread& t : threads) t.join();
}

std::vector<float> Random(int seed, int64_t n) {
  std::mt19937 random(seed);
  std::normal_distribution<float> normal;
  std::vector<float> out(n);
  for (float& v : out) v = normal(random);
  return out;
}

double Norm(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

// A sum of a few subnormal entries: finite results and warm start on
// every member (P's column counts as zero rather than Inf/NaN), so the
// next call on the same state still reduces a normal gradient.
TEST(PowerSgdAllReduceTest, TinySum_FiniteResultAndWarmStart) {
  constexpr int n = 2, rows = 4, cols = 4;
  RunGroup(n, [&](int r, Collectives& c) {
    Tensor m = Tensor::Zeros({rows * cols});
    m.data()[0] = 1e-40f;
    PowerSgdAllReduceState state;
    ASSERT_TRUE(PowerSgdAllReduce(c, 1, 0, /*rank=*/1, rows, cols, false, m, &state).ok());
    for (float v : m.ToVector()) EXPECT_TRUE(std::isfinite(v));
    for (float v : state.q.ToVector()) EXPECT_TRUE(std::isfinite(v));
  });
}

// Members hold u v_i^T with one u: the sum is rank 1, and rank 1 PowerSGD
// reproduces it (to fp32 precision) on every member, bitwise alike.
TEST(PowerSgdAllReduceTest, RankOneSum_ReproducedOnEveryMemberAlike) {
  constexpr int n = 3, rows = 40, cols = 24;
  const std::vector<float> u = Random(1, rows);
  std::vector<std::vector<float>> v(n), results(n);
  for (int i = 0; i < n; ++i) v[i] = Random(10 + i, cols);
  RunGroup(n, [&](int r, Collectives& c) {
    Tensor m = Tensor::Zeros({rows * cols});
    for (int a = 0; a < rows; ++a) {
      for (int b = 0; b < cols; ++b) m.data()[a * cols + b] = u[a] * v[r][b];
    }
    PowerSgdAllReduceState state;
    ASSERT_TRUE(PowerSgdAllReduce(c, 1, 0, /*rank=*/1, rows, cols, false, m, &state).ok());
    results[r] = m.ToVector();
  });
  for (int r = 1; r < n; ++r) EXPECT_EQ(results[r], results[0]) << "member " << r;
  for (int a = 0; a < rows; ++a) {
    for (int b = 0; b < cols; ++b) {
      double exact = 0;
      for (int i = 0; i < n; ++i) exact += double(u[a]) * v[i][b];
      EXPECT_NEAR(results[0][a * cols + b], exact, 1e-4 * (1 + std::fabs(exact)));
    }
  }
}

// Full-rank gradients, the same every step: without error feedback the
// rank-2 approximation misses a fixed part of the sum every step; with it,
// the missed parts are carried and the steps' total follows the true total
// (Vogels et al.'s point). Over 40 steps the total's relative error must
// be far smaller with error feedback.
TEST(PowerSgdAllReduceTest, ErrorFeedback_CarriesWhatEachStepMisses) {
  constexpr int n = 2, rows = 16, cols = 12, steps = 40;
  std::vector<std::vector<float>> inputs(n);
  for (int i = 0; i < n; ++i) inputs[i] = Random(100 + i, rows * cols);
  std::vector<double> exact_total(rows * cols, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < rows * cols; ++k) exact_total[k] += double(inputs[i][k]) * steps;
  }
  auto relative_error = [&](bool feedback) {
    std::vector<double> total(rows * cols, 0.0);
    RunGroup(n, [&](int r, Collectives& c) {
      PowerSgdAllReduceState state;
      for (int s = 0; s < steps; ++s) {
        Tensor m = Tensor::FromVector({rows * cols}, inputs[r]);
        ASSERT_TRUE(PowerSgdAllReduce(c, s, 0, /*rank=*/2, rows, cols, feedback, m, &state).ok());
        if (r == 0) {
          for (int k = 0; k < rows * cols; ++k) total[k] += m.data()[k];
        }
      }
    });
    std::vector<double> diff(rows * cols);
    for (int k = 0; k < rows * cols; ++k) diff[k] = total[k] - exact_total[k];
    return Norm(diff) / Norm(exact_total);
  };
  const double with = relative_error(true), without = relative_error(false);
  EXPECT_LT(with, 0.1) << "with error feedback";
  EXPECT_GT(without, 3 * with) << "without error feedback";
}

TEST(PowerSgdAllReduceTest, BadShape_InvalidArgument) {
  InProcessFabric fabric(1);
  std::unique_ptr<Transport> transport = fabric.Connect(0);
  Collectives c(transport.get(), {{0}, "j"});
  Tensor m = Tensor::Zeros({10});
  PowerSgdAllReduceState state;
  EXPECT_EQ(PowerSgdAllReduce(c, 1, 0, 1, 3, 4, false, m, &state).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PowerSgdAllReduce(c, 1, 0, 0, 2, 5, false, m, &state).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
