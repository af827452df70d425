// cuBLAS linear layer against the CPU reference (kernels/cpu/linear.cc).
//
// Tolerance |gpu - cpu| <= atol + rtol * |cpu| per element, from
// GemmTolerance (kernels/cuda/gemm_tolerance_testing.h says why). The bias
// gradient is a plain fp32 column sum in both modes.
#include "kernels/cuda/linear.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm_tolerance_testing.h"
#include "kernels/cuda/linear_bias.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

using testing::AllClose;
using testing::GemmTolerance;
using testing::RandomNormal;
using testing::Tolerance;

struct Shape {
  int n;  // rows: batch * sequence positions
  int in;
  int out;
};

struct LinearData {
  Shape shape;
  std::vector<float> x, w, b, dy, dw, db;  // dw, db: values to accumulate onto
  float w_std;
};

LinearData MakeData(const Shape& s, uint64_t seed) {
  LinearData d;
  d.shape = s;
  d.w_std = 1.0f / std::sqrt(static_cast<float>(s.in));
  d.x = RandomNormal(seed, int64_t{s.n} * s.in, 0.0f, 1.0f);
  d.w = RandomNormal(seed + 1, int64_t{s.in} * s.out, 0.0f, d.w_std);
  d.b = RandomNormal(seed + 2, s.out, 0.0f, 1.0f);
  d.dy = RandomNormal(seed + 3, int64_t{s.n} * s.out, 0.0f, 1.0f);
  d.dw = RandomNormal(seed + 4, int64_t{s.in} * s.out, 0.0f, 1.0f);
  d.db = RandomNormal(seed + 5, s.out, 0.0f, 1.0f);
  return d;
}

// y on the GPU; bias only when with_bias.
absl::StatusOr<std::vector<float>> ForwardOnGpu(GemmMode mode, const LinearData& d,
                                                bool with_bias) {
  const Shape& s = d.shape;
  ASSIGN_OR_RETURN(CublasHandle handle, CublasHandle::Create(mode));
  ASSIGN_OR_RETURN(DeviceBuffer<float> x, DeviceBuffer<float>::FromHost(d.x));
  ASSIGN_OR_RETURN(DeviceBuffer<float> w, DeviceBuffer<float>::FromHost(d.w));
  ASSIGN_OR_RETURN(DeviceBuffer<float> b, DeviceBuffer<float>::FromHost(d.b));
  ASSIGN_OR_RETURN(DeviceBuffer<float> y, DeviceBuffer<float>::Create(int64_t{s.n} * s.out));
  RETURN_IF_ERROR(LinearForwardCuda(handle, x.data(), w.data(), with_bias ? b.data() : nullptr, s.n,
                                    s.in, s.out, y.data()));
  return y.ToHost();
}

struct Grads {
  std::vector<float> dx, dw, db;  // dx and db empty when not requested
};

// Gradients on the GPU, accumulating onto d.dw and d.db; dx and db only
// when all_outputs.
absl::StatusOr<Grads> BackwardOnGpu(GemmMode mode, const LinearData& d, bool all_outputs) {
  const Shape& s = d.shape;
  ASSIGN_OR_RETURN(CublasHandle handle, CublasHandle::Create(mode));
  ASSIGN_OR_RETURN(DeviceBuffer<float> x, DeviceBuffer<float>::FromHost(d.x));
  ASSIGN_OR_RETURN(DeviceBuffer<float> w, DeviceBuffer<float>::FromHost(d.w));
  ASSIGN_OR_RETURN(DeviceBuffer<float> dy, DeviceBuffer<float>::FromHost(d.dy));
  ASSIGN_OR_RETURN(DeviceBuffer<float> dw, DeviceBuffer<float>::FromHost(d.dw));
  ASSIGN_OR_RETURN(DeviceBuffer<float> db, DeviceBuffer<float>::FromHost(d.db));
  ASSIGN_OR_RETURN(DeviceBuffer<float> dx, DeviceBuffer<float>::Create(int64_t{s.n} * s.in));
  RETURN_IF_ERROR(LinearBackwardCuda(handle, x.data(), w.data(), dy.data(), s.n, s.in, s.out,
                                     all_outputs ? dx.data() : nullptr, dw.data(),
                                     all_outputs ? db.data() : nullptr));
  Grads grads;
  ASSIGN_OR_RETURN(grads.dw, dw.ToHost());
  if (all_outputs) {
    ASSIGN_OR_RETURN(grads.dx, dx.ToHost());
    ASSIGN_OR_RETURN(grads.db, db.ToHost());
  }
  return grads;
}

std::vector<float> ForwardOnCpu(const LinearData& d, bool with_bias) {
  const Shape& s = d.shape;
  std::vector<float> y(static_cast<size_t>(s.n) * s.out);
  LinearForward(d.x.data(), d.w.data(), with_bias ? d.b.data() : nullptr, s.n, s.in, s.out,
                y.data());
  return y;
}

Grads BackwardOnCpu(const LinearData& d) {
  const Shape& s = d.shape;
  Grads grads{std::vector<float>(static_cast<size_t>(s.n) * s.in), d.dw, d.db};
  LinearBackward(d.x.data(), d.w.data(), d.dy.data(), s.n, s.in, s.out, grads.dx.data(),
                 grads.dw.data(), grads.db.data());
  return grads;
}

// Rows 1, 7, 130 (B*T) and widths 1, 33, 768, 3072: none of the odd ones is
// a multiple of cuBLAS's 8/32-element tiles; each appears as in and as out.
const Shape kShapes[] = {
    {1, 1, 1},        {1, 33, 768}, {7, 768, 33}, {7, 3072, 768}, {130, 768, 3072},
    {130, 3072, 768}, {130, 33, 1}, {130, 1, 33}, {7, 1, 3072},   {1, 3072, 1},
};

class LinearCudaParityTest : public testing::CudaTest,
                             public ::testing::WithParamInterface<std::tuple<GemmMode, Shape>> {};

TEST_P(LinearCudaParityTest, LinearForwardCuda_RandomInput_MatchesCpu) {
  const auto [mode, shape] = GetParam();
  const LinearData d = MakeData(shape, 10);
  auto got = ForwardOnGpu(mode, d, /*with_bias=*/true);
  ASSERT_TRUE(got.ok()) << got.status();
  const Tolerance tol = GemmTolerance(mode, shape.in, d.w_std, 1.0f);
  EXPECT_TRUE(AllClose("linear forward y", *got, ForwardOnCpu(d, true), tol.atol, tol.rtol));
}

// The residual block's last layer: y = residual + x W + b with the residual
// seeded into the GEMM, against the CPU's LinearForward then Add. The
// seeded values (bias and residual, each of std 1) have std sqrt(2); the
// orders of the two additions differ, within the tolerance's rounding.
TEST_P(LinearCudaParityTest, LinearForwardResidualCuda_RandomInput_MatchesCpuThenAdd) {
  const auto [mode, shape] = GetParam();
  const LinearData d = MakeData(shape, 15);
  const std::vector<float> residual = RandomNormal(16, int64_t{shape.n} * shape.out, 0.0f, 1.0f);
  for (bool with_bias : {true, false}) {
    auto handle = CublasHandle::Create(mode);
    auto x = DeviceBuffer<float>::FromHost(d.x);
    auto w = DeviceBuffer<float>::FromHost(d.w);
    auto b = DeviceBuffer<float>::FromHost(d.b);
    auto res = DeviceBuffer<float>::FromHost(residual);
    auto y = DeviceBuffer<float>::Create(int64_t{shape.n} * shape.out);
    ASSERT_TRUE(handle.ok() && x.ok() && w.ok() && b.ok() && res.ok() && y.ok());
    const absl::Status run =
        LinearForwardResidualCuda(*handle, x->data(), w->data(), with_bias ? b->data() : nullptr,
                                  res->data(), shape.n, shape.in, shape.out, y->data());
    ASSERT_TRUE(run.ok()) << run;
    auto got = y->ToHost();
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<float> want = ForwardOnCpu(d, with_bias);
    for (size_t i = 0; i < want.size(); ++i) want[i] += residual[i];
    const Tolerance tol =
        GemmTolerance(mode, shape.in, d.w_std, with_bias ? std::sqrt(2.0f) : 1.0f);
    EXPECT_TRUE(AllClose(with_bias ? "y + residual" : "y + residual, no bias", *got, want, tol.atol,
                         tol.rtol));
  }
}

TEST_P(LinearCudaParityTest, LinearBackwardCuda_RandomInput_MatchesCpu) {
  const auto [mode, shape] = GetParam();
  const LinearData d = MakeData(shape, 20);
  auto got = BackwardOnGpu(mode, d, /*all_outputs=*/true);
  ASSERT_TRUE(got.ok()) << got.status();
  const Grads want = BackwardOnCpu(d);
  // dx = dy W^T sums `out` terms of std w_std; dW and db sum n terms of std
  // 1 onto initial values of std 1.
  const Tolerance dx_tol = GemmTolerance(mode, shape.out, d.w_std, 0.0f);
  const Tolerance dw_tol = GemmTolerance(mode, shape.n, 1.0f, 1.0f);
  const Tolerance db_tol = GemmTolerance(GemmMode::kFp32, shape.n, 1.0f, 1.0f);
  EXPECT_TRUE(AllClose("linear backward dx", got->dx, want.dx, dx_tol.atol, dx_tol.rtol));
  EXPECT_TRUE(AllClose("linear backward dw", got->dw, want.dw, dw_tol.atol, dw_tol.rtol));
  EXPECT_TRUE(AllClose("linear backward db", got->db, want.db, db_tol.atol, db_tol.rtol));
}

std::string ParamName(const ::testing::TestParamInfo<std::tuple<GemmMode, Shape>>& info) {
  const auto& [mode, s] = info.param;
  return absl::StrCat(GemmModeName(mode), "_n", s.n, "_in", s.in, "_out", s.out);
}

INSTANTIATE_TEST_SUITE_P(ModesAndShapes, LinearCudaParityTest,
                         ::testing::Combine(::testing::Values(GemmMode::kFp32, GemmMode::kTf32,
                                                                GemmMode::kBf16),
                                            ::testing::ValuesIn(kShapes)),
                         ParamName);

class LinearCudaTest : public testing::CudaTest {};

TEST_F(LinearCudaTest, LinearForwardCuda_NoBias_MatchesCpu) {
  const LinearData d = MakeData({7, 768, 33}, 30);
  auto got = ForwardOnGpu(GemmMode::kFp32, d, /*with_bias=*/false);
  ASSERT_TRUE(got.ok()) << got.status();
  const Tolerance tol = GemmTolerance(GemmMode::kFp32, 768, d.w_std, 0.0f);
  EXPECT_TRUE(
      AllClose("linear forward y, no bias", *got, ForwardOnCpu(d, false), tol.atol, tol.rtol));
}

TEST_F(LinearCudaTest, LinearBackwardCuda_OnlyDw_MatchesCpu) {
  const LinearData d = MakeData({130, 33, 768}, 40);
  auto got = BackwardOnGpu(GemmMode::kFp32, d, /*all_outputs=*/false);
  ASSERT_TRUE(got.ok()) << got.status();
  const Tolerance tol = GemmTolerance(GemmMode::kFp32, 130, 1.0f, 1.0f);
  EXPECT_TRUE(
      AllClose("linear backward dw only", got->dw, BackwardOnCpu(d).dw, tol.atol, tol.rtol));
}

TEST_F(LinearCudaTest, LinearForwardBackwardCuda_TwoRuns_BitwiseEqual) {
  const LinearData d = MakeData({130, 768, 3072}, 50);
  for (GemmMode mode : {GemmMode::kFp32, GemmMode::kTf32, GemmMode::kBf16}) {
    auto y1 = ForwardOnGpu(mode, d, true);
    auto y2 = ForwardOnGpu(mode, d, true);
    ASSERT_TRUE(y1.ok() && y2.ok()) << y1.status() << " " << y2.status();
    EXPECT_EQ(*y1, *y2) << GemmModeName(mode);
    auto g1 = BackwardOnGpu(mode, d, true);
    auto g2 = BackwardOnGpu(mode, d, true);
    ASSERT_TRUE(g1.ok() && g2.ok()) << g1.status() << " " << g2.status();
    EXPECT_EQ(g1->dx, g2->dx) << GemmModeName(mode);
    EXPECT_EQ(g1->dw, g2->dw) << GemmModeName(mode);
    EXPECT_EQ(g1->db, g2->db) << GemmModeName(mode);
  }
}

// In bf16 with plain copies LinearBackwardCuda rounds dy once for both of
// its products, in the pass that sums db (AddColumnSumsRoundingCuda); the
// results must be bitwise those of the two products made one by one
// through SgemmCuda (which round dy each) and of AddColumnSumsCuda, with
// and without aligned rows (the latter through cuBLAS's narrowing under
// kAlignedCopies).
// With and without dx and db: each combination takes its own way to dy's
// bf16 copy (the bias pass writes it, or a copy of its own).
TEST_F(LinearCudaTest, LinearBackwardCuda_Bf16_BitwiseItsTwoSgemmProducts) {
  for (Bf16Operands how : {Bf16Operands::kAlignedCopies, Bf16Operands::kCopies}) {
    for (const Shape& s : {Shape{130, 768, 3072}, Shape{33, 40, 7}}) {
      for (auto [with_dx, with_db] : {std::pair{true, true}, std::pair{true, false},
                                      std::pair{false, true}, std::pair{false, false}}) {
        SCOPED_TRACE(absl::StrCat(Bf16OperandsName(how), " n=", s.n, " in=", s.in, " out=", s.out,
                                  with_dx ? " dx" : "", with_db ? " db" : ""));
        const LinearData d = MakeData(s, 60);
        auto handle = CublasHandle::Create(GemmMode::kBf16);
        ASSERT_TRUE(handle.ok()) << handle.status();
        handle->set_bf16_operands(how);
        auto x = DeviceBuffer<float>::FromHost(d.x);
        auto w = DeviceBuffer<float>::FromHost(d.w);
        auto dy = DeviceBuffer<float>::FromHost(d.dy);
        auto dw1 = DeviceBuffer<float>::FromHost(d.dw);
        auto dw2 = DeviceBuffer<float>::FromHost(d.dw);
        auto dx1 = DeviceBuffer<float>::Create(int64_t{s.n} * s.in);
        auto dx2 = DeviceBuffer<float>::Create(int64_t{s.n} * s.in);
        auto db1 = DeviceBuffer<float>::FromHost(d.db);
        auto db2 = DeviceBuffer<float>::FromHost(d.db);
        ASSERT_TRUE(x.ok() && w.ok() && dy.ok() && dw1.ok() && dw2.ok() && dx1.ok() && dx2.ok() &&
                    db1.ok() && db2.ok());
        ASSERT_TRUE(LinearBackwardCuda(*handle, x->data(), w->data(), dy->data(), s.n, s.in, s.out,
                                       with_dx ? dx1->data() : nullptr, dw1->data(),
                                       with_db ? db1->data() : nullptr)
                        .ok());
        if (with_db) {
          ASSERT_TRUE(
              AddColumnSumsCuda(dy->data(), s.n, s.out, db2->data(), handle->stream()).ok());
        }
        if (with_dx) {
          ASSERT_TRUE(SgemmCuda(*handle, false, true, s.n, s.in, s.out, 1.0f, dy->data(), s.out,
                                w->data(), s.out, 0.0f, dx2->data(), s.in)
                          .ok());
        }
        ASSERT_TRUE(SgemmCuda(*handle, true, false, s.in, s.out, s.n, 1.0f, x->data(), s.in,
                              dy->data(), s.out, 1.0f, dw2->data(), s.out)
                        .ok());
        auto got_dw = dw1->ToHost(), want_dw = dw2->ToHost();
        ASSERT_TRUE(got_dw.ok() && want_dw.ok());
        EXPECT_EQ(*got_dw, *want_dw);
        if (with_dx) {
          auto got_dx = dx1->ToHost(), want_dx = dx2->ToHost();
          ASSERT_TRUE(got_dx.ok() && want_dx.ok());
          EXPECT_EQ(*got_dx, *want_dx);
        }
        if (with_db) {
          auto got_db = db1->ToHost(), want_db = db2->ToHost();
          ASSERT_TRUE(got_db.ok() && want_db.ok());
          EXPECT_EQ(*got_db, *want_db);
        } else {  // left as it was
          auto kept_db = db1->ToHost();
          ASSERT_TRUE(kept_db.ok());
          EXPECT_EQ(*kept_db, d.db);
        }
      }
    }
  }
}

// BiasEpilogue::kCublasLt: the bias in cuBLASLt's epilogue and the
// residual as its C, against the CPU (LinearForward, then Add) within the
// bf16 GEMM tolerance, bitwise the same run to run. Where a leading
// dimension is not a multiple of 8 ({7, 768, 33}) the seeded path runs:
// bitwise the default handle's y, and no epilogue product is counted.
TEST_F(LinearCudaTest, LinearForwardCuda_Bf16CublasLtBias_MatchesCpuAndRepeats) {
  for (const Shape& s : {Shape{130, 768, 3072}, Shape{130, 3072, 768}, Shape{64, 768, 2304},
                         Shape{33, 40, 8}, Shape{7, 768, 33}}) {
    const bool aligned = s.in % 8 == 0 && s.out % 8 == 0;
    for (bool with_residual : {false, true}) {
      SCOPED_TRACE(absl::StrCat("n=", s.n, " in=", s.in, " out=", s.out,
                                with_residual ? " + residual" : ""));
      const LinearData d = MakeData(s, 70);
      const std::vector<float> residual = RandomNormal(71, int64_t{s.n} * s.out, 0.0f, 1.0f);
      auto seeded = CublasHandle::Create(GemmMode::kBf16);
      auto fused = CublasHandle::Create(GemmMode::kBf16);
      ASSERT_TRUE(seeded.ok() && fused.ok());
      seeded->set_bf16_operands(Bf16Operands::kAlignedCopies);
      fused->set_bf16_operands(Bf16Operands::kAlignedCopies);
      ASSERT_TRUE(seeded->SetBiasEpilogue(BiasEpilogue::kSeed).ok());
      ASSERT_TRUE(fused->SetBiasEpilogue(BiasEpilogue::kCublasLt).ok());
      ASSERT_NE(fused->lt(), nullptr);
      auto x = DeviceBuffer<float>::FromHost(d.x);
      auto w = DeviceBuffer<float>::FromHost(d.w);
      auto b = DeviceBuffer<float>::FromHost(d.b);
      auto res = DeviceBuffer<float>::FromHost(residual);
      ASSERT_TRUE(x.ok() && w.ok() && b.ok() && res.ok());
      auto run = [&](const CublasHandle& handle) -> std::vector<float> {
        auto y = DeviceBuffer<float>::Create(int64_t{s.n} * s.out);
        EXPECT_TRUE(y.ok());
        if (!y.ok()) return {};
        const absl::Status done =
            with_residual ? LinearForwardResidualCuda(handle, x->data(), w->data(), b->data(),
                                                      res->data(), s.n, s.in, s.out, y->data())
                          : LinearForwardCuda(handle, x->data(), w->data(), b->data(), s.n, s.in,
                                              s.out, y->data());
        EXPECT_TRUE(done.ok()) << done;
        auto host = y->ToHost();
        EXPECT_TRUE(host.ok()) << host.status();
        return host.ok() ? *std::move(host) : std::vector<float>{};
      };
      const int64_t before = BiasEpilogueProducts();
      const std::vector<float> first = run(*fused);
      const std::vector<float> second = run(*fused);
      EXPECT_EQ(BiasEpilogueProducts() - before, aligned ? 2 : 0);
      ASSERT_EQ(first.size(), static_cast<size_t>(s.n) * s.out);
      EXPECT_EQ(first, second);
      std::vector<float> want = ForwardOnCpu(d, /*with_bias=*/true);
      if (with_residual) {
        for (size_t i = 0; i < want.size(); ++i) want[i] += residual[i];
      }
      const Tolerance tol =
          GemmTolerance(GemmMode::kBf16, s.in, d.w_std, with_residual ? std::sqrt(2.0f) : 1.0f);
      EXPECT_TRUE(AllClose("cuBLASLt bias epilogue", first, want, tol.atol, tol.rtol));
      if (!aligned) EXPECT_EQ(first, run(*seeded));
    }
  }
}

TEST_F(LinearCudaTest, CublasHandleCreate_EachMode_SetsMathModeAndStream) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (auto [mode, want] : {std::pair{GemmMode::kFp32, CUBLAS_DEFAULT_MATH},
                            std::pair{GemmMode::kTf32, CUBLAS_TF32_TENSOR_OP_MATH},
                            std::pair{GemmMode::kBf16, CUBLAS_DEFAULT_MATH}}) {
    auto handle = CublasHandle::Create(mode, stream);
    ASSERT_TRUE(handle.ok()) << handle.status();
    cublasMath_t math;
    ASSERT_EQ(cublasGetMathMode(handle->get(), &math), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(math, want) << GemmModeName(mode);
    cudaStream_t got_stream = nullptr;
    ASSERT_EQ(cublasGetStream(handle->get(), &got_stream), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(got_stream, stream);
    EXPECT_EQ(handle->stream(), stream);
    EXPECT_EQ(handle->mode(), mode);
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST_F(LinearCudaTest, CublasHandle_MovedFrom_IsEmpty) {
  auto handle = CublasHandle::Create(GemmMode::kTf32);
  ASSERT_TRUE(handle.ok()) << handle.status();
  CublasHandle moved = std::move(*handle);
  EXPECT_TRUE(handle->empty());
  EXPECT_FALSE(moved.empty());
  EXPECT_EQ(moved.mode(), GemmMode::kTf32);
}

// Argument checks happen before any CUDA call, so these run without a GPU
// (an empty handle stands in for a real one).
float dummy = 0.0f;  // a non-null pointer that is never dereferenced

TEST(LinearCudaArgumentsTest, LinearForwardCuda_NegativeRows_InvalidArgument) {
  const CublasHandle empty;
  const absl::Status status = LinearForwardCuda(empty, &dummy, &dummy, nullptr, -1, 4, 4, &dummy);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("LinearForwardCuda: shape n=-1 in=4 out=4"), std::string::npos)
      << status;
}

TEST(LinearCudaArgumentsTest, LinearForwardResidualCuda_NullW_InvalidArgument) {
  float dummy = 0.0f;
  const CublasHandle empty;
  const absl::Status status =
      LinearForwardResidualCuda(empty, &dummy, nullptr, nullptr, &dummy, 2, 3, 4, &dummy);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("LinearForwardResidualCuda"), std::string::npos) << status;
}

TEST(LinearCudaArgumentsTest, LinearBackwardCuda_ZeroOut_InvalidArgument) {
  const CublasHandle empty;
  const absl::Status status =
      LinearBackwardCuda(empty, &dummy, &dummy, &dummy, 3, 4, 0, &dummy, &dummy, &dummy);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("LinearBackwardCuda: shape n=3 in=4 out=0"), std::string::npos)
      << status;
}

TEST(LinearCudaArgumentsTest, LinearForwardCuda_NullX_InvalidArgument) {
  const CublasHandle empty;
  const absl::Status status = LinearForwardCuda(empty, nullptr, &dummy, nullptr, 2, 4, 4, &dummy);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("LinearForwardCuda: x is null"), std::string::npos) << status;
}

TEST(LinearCudaArgumentsTest, LinearBackwardCuda_NullDw_InvalidArgument) {
  const CublasHandle empty;
  const absl::Status status =
      LinearBackwardCuda(empty, &dummy, &dummy, &dummy, 2, 4, 4, nullptr, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("LinearBackwardCuda: dw is null"), std::string::npos) << status;
}

TEST(LinearCudaArgumentsTest, LinearForwardCuda_EmptyHandle_FailedPrecondition) {
  const CublasHandle empty;
  const absl::Status status = LinearForwardCuda(empty, &dummy, &dummy, nullptr, 2, 4, 4, &dummy);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("LinearForwardCuda: the CublasHandle is empty"),
            std::string::npos)
      << status;
}

TEST(LinearCudaArgumentsTest, LinearBackwardCuda_EmptyHandle_FailedPrecondition) {
  const CublasHandle empty;
  const absl::Status status =
      LinearBackwardCuda(empty, &dummy, &dummy, &dummy, 0, 4, 4, nullptr, &dummy, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("LinearBackwardCuda: the CublasHandle is empty"),
            std::string::npos)
      << status;
}

TEST(LinearCudaArgumentsTest, CublasHandleSetStream_Empty_FailedPrecondition) {
  CublasHandle empty;
  EXPECT_TRUE(empty.empty());
  const absl::Status status = empty.SetStream(nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("CublasHandle::SetStream"), std::string::npos) << status;
}

TEST(LinearCudaArgumentsTest, Bf16Operands_NamesParseBack_UnknownListsThem) {
  for (Bf16Operands how : {Bf16Operands::kCublasNarrows, Bf16Operands::kAlignedCopies,
                           Bf16Operands::kCopies, Bf16Operands::kPaddedCopies}) {
    absl::StatusOr<Bf16Operands> parsed = ParseBf16Operands(Bf16OperandsName(how));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, how);
  }
  absl::StatusOr<Bf16Operands> bad = ParseBf16Operands("fast");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("cublas, aligned-copies, copies or padded-copies"),
            std::string::npos)
      << bad.status();
}

// The environment's choice is read before any CUDA call, so a bad one is
// refused on a machine without a GPU too.
TEST(LinearCudaArgumentsTest, CublasHandleCreate_UnknownEnvironmentChoice_InvalidArgument) {
  const char* before = std::getenv("PIPETRAIN_BF16_OPERANDS");
  const std::string saved = before == nullptr ? "" : before;
  ASSERT_EQ(setenv("PIPETRAIN_BF16_OPERANDS", "fast", 1), 0);
  absl::StatusOr<CublasHandle> handle = CublasHandle::Create(GemmMode::kBf16);
  // Put back what the run was given: the other cases honour it.
  if (before == nullptr) {
    unsetenv("PIPETRAIN_BF16_OPERANDS");
  } else {
    setenv("PIPETRAIN_BF16_OPERANDS", saved.c_str(), 1);
  }
  EXPECT_EQ(handle.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(handle.status().message().find("PIPETRAIN_BF16_OPERANDS"), std::string::npos)
      << handle.status();
}

TEST(LinearCudaArgumentsTest, BiasEpilogue_NamesParseBack_UnknownListsThem) {
  for (BiasEpilogue epilogue : {BiasEpilogue::kSeed, BiasEpilogue::kCublasLt}) {
    absl::StatusOr<BiasEpilogue> parsed = ParseBiasEpilogue(BiasEpilogueName(epilogue));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, epilogue);
  }
  absl::StatusOr<BiasEpilogue> bad = ParseBiasEpilogue("fused");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("seed or cublaslt"), std::string::npos) << bad.status();
}

// As PIPETRAIN_BF16_OPERANDS: refused before any CUDA call.
TEST(LinearCudaArgumentsTest, CublasHandleCreate_UnknownBiasEpilogue_InvalidArgument) {
  const char* before = std::getenv("PIPETRAIN_BIAS_EPILOGUE");
  const std::string saved = before == nullptr ? "" : before;
  ASSERT_EQ(setenv("PIPETRAIN_BIAS_EPILOGUE", "fused", 1), 0);
  absl::StatusOr<CublasHandle> handle = CublasHandle::Create(GemmMode::kBf16);
  if (before == nullptr) {
    unsetenv("PIPETRAIN_BIAS_EPILOGUE");
  } else {
    setenv("PIPETRAIN_BIAS_EPILOGUE", saved.c_str(), 1);
  }
  EXPECT_EQ(handle.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(handle.status().message().find("PIPETRAIN_BIAS_EPILOGUE"), std::string::npos)
      << handle.status();
}

TEST(LinearCudaArgumentsTest, CublasHandleSetBiasEpilogue_Empty_FailedPrecondition) {
  CublasHandle empty;
  EXPECT_EQ(empty.SetBiasEpilogue(BiasEpilogue::kCublasLt).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(LinearCudaArgumentsTest, GemmModeName_EachMode_ShortName) {
  EXPECT_STREQ(GemmModeName(GemmMode::kFp32), "fp32");
  EXPECT_STREQ(GemmModeName(GemmMode::kTf32), "tf32");
  EXPECT_STREQ(GemmModeName(GemmMode::kBf16), "bf16");
}

// One SgemmCuda on `handle` against the CPU Sgemm: m x n x k with alpha
// 0.5 and beta 2 onto C, each matrix's rows `pad` floats wider than they
// need be. Compares every element of C, the padding between rows included
// (nothing there may change). `what` names the case in a failure.
void ExpectSgemmMatchesCpu(const CublasHandle& handle, int m, int n, int k, bool ta, bool tb,
                           int pad, uint64_t seed, const std::string& what) {
  const float alpha = 0.5f, beta = 2.0f;
  const int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
  const std::vector<float> a = RandomNormal(seed, int64_t{ta ? k : m} * lda, 0.0f, 1.0f);
  const std::vector<float> b = RandomNormal(seed + 1, int64_t{tb ? n : k} * ldb, 0.0f, 1.0f);
  const std::vector<float> c = RandomNormal(seed + 2, int64_t{m} * ldc, 0.0f, 1.0f);
  std::vector<float> want = c;
  Sgemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, want.data(), ldc);
  auto da = DeviceBuffer<float>::FromHost(a);
  auto db = DeviceBuffer<float>::FromHost(b);
  auto dc = DeviceBuffer<float>::FromHost(c);
  ASSERT_TRUE(da.ok() && db.ok() && dc.ok());
  const absl::Status run = SgemmCuda(handle, ta, tb, m, n, k, alpha, da->data(), lda, db->data(),
                                     ldb, beta, dc->data(), ldc);
  ASSERT_TRUE(run.ok()) << what << ": " << run;
  auto got = dc->ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  // Products of N(0, 1) terms (std 1 each, alpha 0.5) onto beta * N(0, 1).
  const Tolerance tol = GemmTolerance(handle.mode(), k, alpha, beta);
  EXPECT_TRUE(AllClose(absl::StrCat(what, " ta=", ta, " tb=", tb), *got, want, tol.atol, tol.rtol));
}

// SgemmCuda against the CPU Sgemm for each transpose combination, with
// alpha, beta and strides wider than the rows (the head's three GEMMs use
// (F, T), (F, F) and (T, F)). m, n, k are off any tile size.
TEST_F(LinearCudaTest, SgemmCuda_AllTransposes_MatchesCpu) {
  auto handle = CublasHandle::Create(GemmMode::kFp32);
  ASSERT_TRUE(handle.ok()) << handle.status();
  for (bool ta : {false, true}) {
    for (bool tb : {false, true})
      ExpectSgemmMatchesCpu(*handle, 37, 129, 70, ta, tb, 3, 60, "fp32");
  }
}

// bf16 mode, every Bf16Operands, all transposes, with leading dimensions
// that are multiples of 8 (pad 0 with m, n, k = 40, 136, 72) and ones that
// are not (pad 3): each path of linear.cc's Gemm, padded C with beta != 0
// included, against the CPU at bf16 tolerances.
TEST_F(LinearCudaTest, SgemmCuda_Bf16EveryOperandsChoice_MatchesCpu) {
  auto handle = CublasHandle::Create(GemmMode::kBf16);
  ASSERT_TRUE(handle.ok()) << handle.status();
  for (Bf16Operands how : {Bf16Operands::kCublasNarrows, Bf16Operands::kAlignedCopies,
                           Bf16Operands::kCopies, Bf16Operands::kPaddedCopies}) {
    handle->set_bf16_operands(how);
    for (int pad : {0, 3}) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          ExpectSgemmMatchesCpu(*handle, 40, 136, 72, ta, tb, pad, 70,
                                absl::StrCat(Bf16OperandsName(how), " pad=", pad));
        }
      }
    }
  }
}

// Three products at once with strides between them that differ from the
// matrices' sizes (as attention's heads: a head's slice of a wider row),
// each against the CPU Sgemm of its slices.
TEST_F(LinearCudaTest, SgemmStridedBatchedCuda_AllTransposes_MatchesCpuPerMatrix) {
  const int m = 33, n = 65, k = 17, batch = 3;
  const float alpha = 0.25f, beta = 1.0f;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      // Interleaved like heads: matrix i starts i * width floats into each
      // row of a row `batch * width` wide.
      const int a_width = ta ? m : k, b_width = tb ? k : n;
      const int lda = batch * a_width, ldb = batch * b_width, ldc = n + 1;
      const int64_t stride_c = int64_t{m} * ldc;
      const std::vector<float> a = RandomNormal(63, int64_t{ta ? k : m} * lda, 0.0f, 1.0f);
      const std::vector<float> b = RandomNormal(64, int64_t{tb ? n : k} * ldb, 0.0f, 1.0f);
      std::vector<float> c = RandomNormal(65, stride_c * batch, 0.0f, 1.0f);
      std::vector<float> want = c;
      for (int i = 0; i < batch; ++i) {
        Sgemm(ta, tb, m, n, k, alpha, a.data() + i * a_width, lda, b.data() + i * b_width, ldb,
              beta, want.data() + i * stride_c, ldc);
      }
      auto handle = CublasHandle::Create(GemmMode::kFp32);
      ASSERT_TRUE(handle.ok()) << handle.status();
      auto da = DeviceBuffer<float>::FromHost(a);
      auto db = DeviceBuffer<float>::FromHost(b);
      auto dc = DeviceBuffer<float>::FromHost(c);
      ASSERT_TRUE(da.ok() && db.ok() && dc.ok());
      const absl::Status run = SgemmStridedBatchedCuda(
          *handle, ta, tb, m, n, k, alpha, da->data(), lda, a_width, db->data(), ldb, b_width,
          beta, dc->data(), ldc, stride_c, batch);
      ASSERT_TRUE(run.ok()) << run;
      auto got = dc->ToHost();
      ASSERT_TRUE(got.ok()) << got.status();
      const Tolerance tol = GemmTolerance(GemmMode::kFp32, k, alpha, beta);
      EXPECT_TRUE(AllClose(absl::StrCat("batched sgemm ta=", ta, " tb=", tb), *got, want,
                           tol.atol, tol.rtol));
    }
  }
}

TEST(SgemmCudaArgsTest, SgemmStridedBatchedCuda_NegativeBatchOrStride_InvalidArgument) {
  CublasHandle empty;
  float x = 0;
  absl::Status s = SgemmStridedBatchedCuda(empty, false, false, 2, 3, 4, 1.0f, &x, 4, 0, &x, 3,
                                           0, 0.0f, &x, 3, 0, -1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = SgemmStridedBatchedCuda(empty, false, false, 2, 3, 4, 1.0f, &x, 4, -8, &x, 3, 0, 0.0f, &x,
                              3, 0, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("SgemmStridedBatchedCuda"), std::string::npos) << s;
}

TEST(SgemmCudaArgsTest, SgemmCuda_StrideTooSmall_InvalidArgument) {
  CublasHandle empty;
  float x = 0;
  absl::Status s = SgemmCuda(empty, false, false, 2, 3, 4, 1.0f, &x, 3, &x, 3, 0.0f, &x, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("lda=3"), std::string::npos) << s;
}

}  // namespace
}  // namespace pipetrain
