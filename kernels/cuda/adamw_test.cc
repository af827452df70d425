// AdamW CUDA kernel against the CPU reference (kernels/cpu/adamw.cc).
//
// Tolerance |gpu - cpu| <= kAtol + kRtol * |cpu| on param, m and v, in fp32.
// Both sides do the same operations in the same order on the same scalars
// (bias corrections in double on the host, division and sqrt IEEE-rounded),
// so they differ only where nvcc fuses a multiply-add into an FMA, which it
// does by default in places it does not promise (the CPU reference never
// does: kernels/cpu builds with -ffp-contract=off). A
// fused or unfused multiply-add differs by at most 1 ulp of its larger term,
// and m = beta1 m + (1 - beta1) g can cancel, so errors are absolute near
// zero. Measured on the CPU on these inputs (x86-64, GCC 12), the reference
// itself is off from a double-precision AdamW by up to 4.8e-7 absolute (2
// ulp of |param| ~ 2.5); C++ re-implementations of the loop with the
// multiply-adds fused in either order differ from it by up to 4.8e-7 (param),
// 1.5e-7 (m) and 2.4e-7 (v). These bounds leave about 8x headroom over those
// differences (not yet measured on a GPU: none was available). Real bugs are
// far larger: a missing decay moves param by ~5e-4, a bias correction off by
// one step by ~1e-3.
#include "kernels/cuda/adamw.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

using testing::AllClose;
using testing::RandomNormal;

constexpr float kAtol = 1e-6f;
constexpr float kRtol = 2e-6f;

// A larger learning rate than the default makes every term of the update
// visible at the tolerance above.
AdamWConfig TestConfig() {
  AdamWConfig config;
  config.lr = 1e-2f;
  config.weight_decay = 0.1f;
  return config;
}

// Optimizer state on both sides: the CPU's vectors and the GPU's buffers.
struct AdamWState {
  std::vector<float> param, m, v;
  DeviceBuffer<float> param_d, m_d, v_d;

  // Copies the host state to fresh device buffers.
  absl::Status Upload() {
    for (auto [host, dev] : {std::pair{&param, &param_d}, std::pair{&m, &m_d},
                             std::pair{&v, &v_d}}) {
      absl::StatusOr<DeviceBuffer<float>> buffer = DeviceBuffer<float>::FromHost(*host);
      if (!buffer.ok()) return buffer.status();
      *dev = *std::move(buffer);
    }
    return absl::OkStatus();
  }

  // One update on both sides with the same gradient.
  absl::Status Step(const std::vector<float>& grad, int64_t step, bool apply_decay) {
    const int64_t n = static_cast<int64_t>(param.size());
    const AdamWConfig config = TestConfig();
    AdamWUpdate(param.data(), grad.data(), m.data(), v.data(), n, step, config, apply_decay);
    absl::StatusOr<DeviceBuffer<float>> grad_d = DeviceBuffer<float>::FromHost(grad);
    if (!grad_d.ok()) return grad_d.status();
    return AdamWUpdateCuda(param_d.data(), grad_d->data(), m_d.data(), v_d.data(), n, step,
                           config, apply_decay);
  }

  // Compares the GPU's param, m and v with the CPU's.
  void ExpectMatches(const std::string& what) const {
    for (auto [name, host, dev] : {std::tuple{"param", &param, &param_d},
                                   std::tuple{"m", &m, &m_d}, std::tuple{"v", &v, &v_d}}) {
      absl::StatusOr<std::vector<float>> got = dev->ToHost();
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(AllClose(what + " " + name, *got, *host, kAtol, kRtol));
    }
  }
};

// Sizes around the 256-thread block and the 1024-block grid cap: a single
// element, a partial warp, partial blocks, and 2^20 elements (4 grid-stride
// iterations).
class AdamWCudaParityTest : public testing::CudaTest,
                            public ::testing::WithParamInterface<int64_t> {};

TEST_P(AdamWCudaParityTest, AdamWUpdateCuda_FiveStepsFromZero_MatchesCpu) {
  const int64_t n = GetParam();
  AdamWState state;
  state.param = RandomNormal(40, n, 0.0f, 0.5f);
  state.m.assign(n, 0.0f);
  state.v.assign(n, 0.0f);
  ASSERT_TRUE(state.Upload().ok());
  for (int64_t step = 1; step <= 5; ++step) {
    // Steps 1 to 3 decay, 4 and 5 do not: both branches of apply_decay.
    const absl::Status run =
        state.Step(RandomNormal(40 + step, n, 0.0f, 1.0f), step, /*apply_decay=*/step <= 3);
    ASSERT_TRUE(run.ok()) << run;
  }
  state.ExpectMatches("n " + std::to_string(n) + " after 5 steps");
}

INSTANTIATE_TEST_SUITE_P(Sizes, AdamWCudaParityTest,
                         ::testing::Values(int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4097},
                                           int64_t{1} << 20));

class AdamWCudaTest : public testing::CudaTest {};

// Late in training both bias corrections round to 1 in float; m and v carry
// history, including elements whose gradient is exactly zero.
TEST_F(AdamWCudaTest, AdamWUpdateCuda_LateStepWithHistory_MatchesCpu) {
  constexpr int64_t kN = 4097;
  AdamWState state;
  state.param = RandomNormal(50, kN, 0.0f, 0.5f);
  state.m = RandomNormal(51, kN, 0.0f, 0.1f);
  state.v = RandomNormal(52, kN, 0.0f, 0.3f);
  for (float& x : state.v) x *= x;  // a second moment is non-negative
  std::vector<float> grad = RandomNormal(53, kN, 0.0f, 1.0f);
  for (int64_t i = 0; i < kN; i += 5) grad[i] = 0.0f;
  ASSERT_TRUE(state.Upload().ok());
  const absl::Status run = state.Step(grad, 100000, /*apply_decay=*/true);
  ASSERT_TRUE(run.ok()) << run;
  state.ExpectMatches("step 100000");
}

// The multi-tensor step: 100 tensors (three launches; empty, one-element,
// partial-block and multi-block ones; decay on some) update bitwise as
// each alone does, and as the CPU within the parity bounds.
TEST_F(AdamWCudaTest, AdamWUpdateAllCuda_ManyTensors_BitwiseEachAlone) {
  constexpr int kTensors = 100;
  std::vector<AdamWState> all(kTensors), alone(kTensors);
  std::vector<DeviceBuffer<float>> grads;
  std::vector<std::vector<float>> host_grads;
  std::vector<AdamWTensor> tensors;
  for (int i = 0; i < kTensors; ++i) {
    const int64_t n = i % 10 == 0 ? 0 : (i * 997) % 5000 + (i % 7 == 0 ? 1 : 300);
    all[i].param = RandomNormal(60 + i, n, 0.0f, 0.5f);
    all[i].m.assign(n, 0.0f);
    all[i].v.assign(n, 0.0f);
    alone[i] = AdamWState{all[i].param, all[i].m, all[i].v, {}, {}, {}};
    ASSERT_TRUE(all[i].Upload().ok() && alone[i].Upload().ok());
    host_grads.push_back(RandomNormal(200 + i, n, 0.0f, 1.0f));
    absl::StatusOr<DeviceBuffer<float>> g = DeviceBuffer<float>::FromHost(host_grads.back());
    ASSERT_TRUE(g.ok()) << g.status();
    grads.push_back(*std::move(g));
  }
  for (int i = 0; i < kTensors; ++i) {
    tensors.push_back({all[i].param_d.data(), grads[i].data(), all[i].m_d.data(), all[i].v_d.data(),
                       static_cast<int64_t>(all[i].param.size()), i % 3 != 0});
  }
  for (int64_t step = 1; step <= 2; ++step) {
    const absl::Status run =
        AdamWUpdateAllCuda(tensors.data(), kTensors, step, TestConfig(), nullptr);
    ASSERT_TRUE(run.ok()) << run;
    for (int i = 0; i < kTensors; ++i) {
      const int64_t n = static_cast<int64_t>(alone[i].param.size());
      ASSERT_TRUE(AdamWUpdateCuda(alone[i].param_d.data(), grads[i].data(), alone[i].m_d.data(),
                                  alone[i].v_d.data(), n, step, TestConfig(), i % 3 != 0)
                      .ok());
      AdamWUpdate(all[i].param.data(), host_grads[i].data(), all[i].m.data(), all[i].v.data(), n,
                  step, TestConfig(), i % 3 != 0);
    }
  }
  for (int i = 0; i < kTensors; ++i) {
    EXPECT_EQ(all[i].param_d.ToHost().value(), alone[i].param_d.ToHost().value()) << i;
    EXPECT_EQ(all[i].m_d.ToHost().value(), alone[i].m_d.ToHost().value()) << i;
    EXPECT_EQ(all[i].v_d.ToHost().value(), alone[i].v_d.ToHost().value()) << i;
    all[i].ExpectMatches("tensor " + std::to_string(i));
  }
}

// Argument checks happen before any CUDA call, so these run without a GPU.
TEST(AdamWCudaArgumentsTest, AdamWUpdateAllCuda_BadTensor_InvalidArgumentNamingIt) {
  std::vector<AdamWTensor> tensors(5, AdamWTensor{nullptr, nullptr, nullptr, nullptr, 0, true});
  tensors[3].n = -2;
  const absl::Status status = AdamWUpdateAllCuda(tensors.data(), 5, 1, AdamWConfig(), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("tensor 3 of 5: AdamWUpdateCuda: element count -2"),
            std::string::npos)
      << status;
  EXPECT_TRUE(AdamWUpdateAllCuda(tensors.data(), 3, 1, AdamWConfig(), nullptr).ok());  // all empty
  EXPECT_TRUE(AdamWUpdateAllCuda(nullptr, 0, 1, AdamWConfig(), nullptr).ok());
}

TEST(AdamWCudaArgumentsTest, AdamWUpdateCuda_NegativeSize_InvalidArgument) {
  const absl::Status status =
      AdamWUpdateCuda(nullptr, nullptr, nullptr, nullptr, -3, 1, AdamWConfig(), true);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("AdamWUpdateCuda: element count -3"), std::string::npos)
      << status;
}

TEST(AdamWCudaArgumentsTest, AdamWUpdateCuda_StepZero_InvalidArgument) {
  const absl::Status status =
      AdamWUpdateCuda(nullptr, nullptr, nullptr, nullptr, 8, 0, AdamWConfig(), true);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("step is 1-based, got 0"), std::string::npos) << status;
}

TEST(AdamWCudaArgumentsTest, AdamWUpdateCuda_BetaOne_InvalidArgument) {
  AdamWConfig config;
  config.beta2 = 1.0f;
  const absl::Status status =
      AdamWUpdateCuda(nullptr, nullptr, nullptr, nullptr, 8, 1, config, false);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("must lie in [0, 1)"), std::string::npos) << status;
}

TEST(AdamWCudaArgumentsTest, AdamWUpdateCuda_ZeroSize_OkWithoutLaunch) {
  EXPECT_TRUE(AdamWUpdateCuda(nullptr, nullptr, nullptr, nullptr, 0, 1, AdamWConfig(), true).ok());
}

}  // namespace
}  // namespace pipetrain
