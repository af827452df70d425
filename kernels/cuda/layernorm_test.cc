// LayerNorm CUDA kernels against the CPU reference (kernels/cpu/layernorm.cc).
//
// Tolerance |gpu - cpu| <= atol + rtol * |cpu|, in fp32. The two sides sum
// each row in different orders: the CPU left to right, the GPU in a tree of
// 256 per-thread partial sums and warp shuffles (more accurate, not equal),
// and nvcc contracts multiply-adds into FMAs. Rounding in the row sums moves
// mean and rstd by a few ulp times sqrt(c); y, mean and rstd are O(1) here.
// Measured against a double-precision LayerNorm on these inputs, the CPU
// reference itself is off by up to 6e-6 (y), 2.6e-6 (mean), 6e-7 relative
// (rstd) and 2.6e-6 (dx) at [256, 4096]; dw and db, running sums over 256
// rows that reach ~50 (ulp 4e-6), by up to 3.9e-5. The GPU's error is of the
// same kind (smaller for the tree sums, and for dw and db, summed in
// chunks of 256 rows in parallel) but was not measured when these bounds were written (no GPU), so
// they leave about 3x headroom over the CPU's own error. A wrong index or a
// missing term shows up as errors of order 0.1.
#include "kernels/cuda/layernorm.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

using testing::AllClose;
using testing::RandomNormal;

constexpr float kForwardAtol = 2e-5f;     // y, mean, rstd
constexpr float kInputGradAtol = 2e-5f;   // dx
constexpr float kParamGradAtol = 1e-4f;   // dw, db
constexpr float kRtol = 1e-5f;            // rstd is 316 for a constant row

struct Shape {
  int n;  // rows
  int c;  // columns (the normalised dimension)
};

// Rows narrower than a warp, GPT-2's 768, and widths that are not multiples
// of the 256-thread block; the last has 2^20 elements.
const Shape kShapes[] = {{1, 1}, {1, 7}, {7, 768}, {3, 1000}, {2, 4097}, {256, 4096}};

std::string Name(const Shape& s, const char* tensor) {
  return "[" + std::to_string(s.n) + ", " + std::to_string(s.c) + "] " + tensor;
}

class LayerNormCudaTest : public testing::CudaTest {};

TEST_F(LayerNormCudaTest, LayerNormForwardCuda_Shapes_MatchesCpu) {
  for (const Shape& s : kShapes) {
    const int64_t nc = static_cast<int64_t>(s.n) * s.c;
    // A non-zero mean exercises the two-pass variance.
    const std::vector<float> x = RandomNormal(10, nc, 1.0f, 2.0f);
    const std::vector<float> w = RandomNormal(11, s.c, 1.0f, 0.2f);
    const std::vector<float> b = RandomNormal(12, s.c, 0.0f, 0.2f);
    std::vector<float> y(nc), mean(s.n), rstd(s.n);
    LayerNormForward(x.data(), w.data(), b.data(), s.n, s.c, kLayerNormEps, y.data(),
                     mean.data(), rstd.data());

    auto x_d = DeviceBuffer<float>::FromHost(x);
    auto w_d = DeviceBuffer<float>::FromHost(w);
    auto b_d = DeviceBuffer<float>::FromHost(b);
    auto y_d = DeviceBuffer<float>::Create(nc);
    auto mean_d = DeviceBuffer<float>::Create(s.n);
    auto rstd_d = DeviceBuffer<float>::Create(s.n);
    ASSERT_TRUE(x_d.ok() && w_d.ok() && b_d.ok() && y_d.ok() && mean_d.ok() && rstd_d.ok());
    const absl::Status run =
        LayerNormForwardCuda(x_d->data(), w_d->data(), b_d->data(), s.n, s.c, kLayerNormEps,
                             y_d->data(), mean_d->data(), rstd_d->data());
    ASSERT_TRUE(run.ok()) << run;
    auto y_got = y_d->ToHost();
    auto mean_got = mean_d->ToHost();
    auto rstd_got = rstd_d->ToHost();
    ASSERT_TRUE(y_got.ok() && mean_got.ok() && rstd_got.ok());
    EXPECT_TRUE(AllClose(Name(s, "y"), *y_got, y, kForwardAtol, kRtol));
    EXPECT_TRUE(AllClose(Name(s, "mean"), *mean_got, mean, kForwardAtol, kRtol));
    EXPECT_TRUE(AllClose(Name(s, "rstd"), *rstd_got, rstd, kForwardAtol, kRtol));
  }
}

TEST_F(LayerNormCudaTest, LayerNormBackwardCuda_Shapes_MatchesCpuAndAccumulates) {
  for (const Shape& s : kShapes) {
    const int64_t nc = static_cast<int64_t>(s.n) * s.c;
    const std::vector<float> x = RandomNormal(20, nc, 1.0f, 2.0f);
    const std::vector<float> w = RandomNormal(21, s.c, 1.0f, 0.2f);
    const std::vector<float> b = RandomNormal(22, s.c, 0.0f, 0.2f);
    const std::vector<float> dy = RandomNormal(23, nc, 0.0f, 1.0f);
    std::vector<float> y(nc), mean(s.n), rstd(s.n), dx(nc);
    LayerNormForward(x.data(), w.data(), b.data(), s.n, s.c, kLayerNormEps, y.data(),
                     mean.data(), rstd.data());
    // dw and db start non-zero: both sides must add to them, not overwrite.
    std::vector<float> dw = RandomNormal(24, s.c, 0.0f, 1.0f);
    std::vector<float> db = RandomNormal(25, s.c, 0.0f, 1.0f);
    auto dw_d = DeviceBuffer<float>::FromHost(dw);
    auto db_d = DeviceBuffer<float>::FromHost(db);
    LayerNormBackward(x.data(), w.data(), mean.data(), rstd.data(), dy.data(), s.n, s.c,
                      dx.data(), dw.data(), db.data());

    // The GPU backward uses the CPU's mean and rstd, so it is checked alone.
    auto x_d = DeviceBuffer<float>::FromHost(x);
    auto w_d = DeviceBuffer<float>::FromHost(w);
    auto mean_d = DeviceBuffer<float>::FromHost(mean);
    auto rstd_d = DeviceBuffer<float>::FromHost(rstd);
    auto dy_d = DeviceBuffer<float>::FromHost(dy);
    auto dx_d = DeviceBuffer<float>::Create(nc);
    ASSERT_TRUE(x_d.ok() && w_d.ok() && mean_d.ok() && rstd_d.ok() && dy_d.ok() && dx_d.ok() &&
                dw_d.ok() && db_d.ok());
    const absl::Status run = LayerNormBackwardCuda(
        x_d->data(), w_d->data(), mean_d->data(), rstd_d->data(), dy_d->data(), s.n, s.c,
        dx_d->data(), dw_d->data(), db_d->data());
    ASSERT_TRUE(run.ok()) << run;
    auto dx_got = dx_d->ToHost();
    auto dw_got = dw_d->ToHost();
    auto db_got = db_d->ToHost();
    ASSERT_TRUE(dx_got.ok() && dw_got.ok() && db_got.ok());
    EXPECT_TRUE(AllClose(Name(s, "dx"), *dx_got, dx, kInputGradAtol, kRtol));
    EXPECT_TRUE(AllClose(Name(s, "dw"), *dw_got, dw, kParamGradAtol, kRtol));
    EXPECT_TRUE(AllClose(Name(s, "db"), *db_got, db, kParamGradAtol, kRtol));
  }
}

TEST_F(LayerNormCudaTest, LayerNormBackwardCuda_TwoRuns_BitwiseEqual) {
  constexpr int kN = 64, kC = 768;
  const int64_t nc = int64_t{kN} * kC;
  auto x = DeviceBuffer<float>::FromHost(RandomNormal(30, nc, 0.0f, 1.0f));
  auto w = DeviceBuffer<float>::FromHost(RandomNormal(31, kC, 1.0f, 0.2f));
  auto b = DeviceBuffer<float>::FromHost(RandomNormal(32, kC, 0.0f, 0.2f));
  auto dy = DeviceBuffer<float>::FromHost(RandomNormal(33, nc, 0.0f, 1.0f));
  auto y = DeviceBuffer<float>::Create(nc);
  auto mean = DeviceBuffer<float>::Create(kN);
  auto rstd = DeviceBuffer<float>::Create(kN);
  auto dx = DeviceBuffer<float>::Create(nc);
  ASSERT_TRUE(x.ok() && w.ok() && b.ok() && dy.ok() && y.ok() && mean.ok() && rstd.ok() &&
              dx.ok());
  std::vector<float> runs[2];
  for (std::vector<float>& run : runs) {
    auto dw = DeviceBuffer<float>::FromHost(std::vector<float>(kC, 0.0f));
    auto db = DeviceBuffer<float>::FromHost(std::vector<float>(kC, 0.0f));
    ASSERT_TRUE(dw.ok() && db.ok());
    ASSERT_TRUE(LayerNormForwardCuda(x->data(), w->data(), b->data(), kN, kC, kLayerNormEps,
                                     y->data(), mean->data(), rstd->data())
                    .ok());
    ASSERT_TRUE(LayerNormBackwardCuda(x->data(), w->data(), mean->data(), rstd->data(),
                                      dy->data(), kN, kC, dx->data(), dw->data(), db->data())
                    .ok());
    for (const DeviceBuffer<float>* out : {&*y, &*dx, &*dw, &*db}) {
      auto host = out->ToHost();
      ASSERT_TRUE(host.ok()) << host.status();
      run.insert(run.end(), host->begin(), host->end());
    }
  }
  EXPECT_EQ(runs[0], runs[1]);
}

// The backward fused with the residual: dx bitwise the plain backward's
// plus the residual (one float addition each, done here on the host), dw
// and db bitwise the plain backward's, at every shape.
TEST_F(LayerNormCudaTest, LayerNormBackwardResidualCuda_BitwiseBackwardThenAdd) {
  for (const Shape& s : kShapes) {
    const int64_t nc = static_cast<int64_t>(s.n) * s.c;
    const std::vector<float> residual = RandomNormal(44, nc, 0.0f, 3.0f);
    auto x = DeviceBuffer<float>::FromHost(RandomNormal(40, nc, 0.5f, 1.0f));
    auto w = DeviceBuffer<float>::FromHost(RandomNormal(41, s.c, 1.0f, 0.2f));
    auto b = DeviceBuffer<float>::FromHost(RandomNormal(42, s.c, 0.0f, 0.2f));
    auto dy = DeviceBuffer<float>::FromHost(RandomNormal(43, nc, 0.0f, 1.0f));
    auto res = DeviceBuffer<float>::FromHost(residual);
    auto y = DeviceBuffer<float>::Create(nc);
    auto mean = DeviceBuffer<float>::Create(s.n);
    auto rstd = DeviceBuffer<float>::Create(s.n);
    ASSERT_TRUE(x.ok() && w.ok() && b.ok() && dy.ok() && res.ok() && y.ok() && mean.ok() &&
                rstd.ok());
    ASSERT_TRUE(LayerNormForwardCuda(x->data(), w->data(), b->data(), s.n, s.c, kLayerNormEps,
                                     y->data(), mean->data(), rstd->data())
                    .ok());
    std::vector<float> out[2][3];  // [plain, fused][dx, dw, db]
    for (int fused = 0; fused < 2; ++fused) {
      auto dx = DeviceBuffer<float>::Create(nc);
      auto dw = DeviceBuffer<float>::FromHost(std::vector<float>(s.c, 0.0f));
      auto db = DeviceBuffer<float>::FromHost(std::vector<float>(s.c, 0.0f));
      ASSERT_TRUE(dx.ok() && dw.ok() && db.ok());
      const absl::Status run =
          fused ? LayerNormBackwardResidualCuda(x->data(), w->data(), mean->data(), rstd->data(),
                                                dy->data(), res->data(), s.n, s.c, dx->data(),
                                                dw->data(), db->data())
                : LayerNormBackwardCuda(x->data(), w->data(), mean->data(), rstd->data(),
                                        dy->data(), s.n, s.c, dx->data(), dw->data(), db->data());
      ASSERT_TRUE(run.ok()) << run;
      int k = 0;
      for (const DeviceBuffer<float>* t : {&*dx, &*dw, &*db}) {
        auto host = t->ToHost();
        ASSERT_TRUE(host.ok()) << host.status();
        out[fused][k++] = *host;
      }
    }
    std::vector<float> want = out[0][0];
    for (int64_t i = 0; i < nc; ++i) want[i] += residual[i];
    EXPECT_EQ(out[1][0], want) << Name(s, "dx");
    EXPECT_EQ(out[1][1], out[0][1]) << Name(s, "dw");
    EXPECT_EQ(out[1][2], out[0][2]) << Name(s, "db");
  }
}

// Shape checks happen before any CUDA call, so these run without a GPU.
TEST(LayerNormCudaArgumentsTest, LayerNormForwardCuda_ZeroColumns_InvalidArgument) {
  const absl::Status status = LayerNormForwardCuda(nullptr, nullptr, nullptr, 4, 0,
                                                   kLayerNormEps, nullptr, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("LayerNormForwardCuda: shape [4, 0]"), std::string::npos)
      << status;
}

TEST(LayerNormCudaArgumentsTest, LayerNormBackwardCuda_NegativeRows_InvalidArgument) {
  const absl::Status status = LayerNormBackwardCuda(nullptr, nullptr, nullptr, nullptr, nullptr,
                                                    -1, 8, nullptr, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("LayerNormBackwardCuda: shape [-1, 8]"), std::string::npos)
      << status;
}

TEST(LayerNormCudaArgumentsTest, LayerNormBackwardResidualCuda_ZeroColumns_InvalidArgument) {
  const float residual = 0.0f;
  const absl::Status status = LayerNormBackwardResidualCuda(
      nullptr, nullptr, nullptr, nullptr, nullptr, &residual, 3, 0, nullptr, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("LayerNormBackwardResidualCuda: shape [3, 0]"), std::string::npos)
      << status;
}

TEST(LayerNormCudaArgumentsTest, LayerNormForwardCuda_ZeroRows_OkWithoutLaunch) {
  EXPECT_TRUE(LayerNormForwardCuda(nullptr, nullptr, nullptr, 0, 8, kLayerNormEps, nullptr,
                                   nullptr, nullptr)
                  .ok());
  EXPECT_TRUE(LayerNormBackwardCuda(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, nullptr,
                                    nullptr, nullptr)
                  .ok());
}

}  // namespace
}  // namespace pipetrain
