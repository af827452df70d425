// The LM head's products on the GPU (lm_head.h) against the CPU's three
// Sgemm calls over the unpadded vocabulary (what HeadUnit computes on the
// CPU), in fp32 and bf16 modes, with the row stride padded (GPT-2's 50257
// to 50304, and an odd width) and not. Tolerances: GemmTolerance
// (gemm_tolerance_testing.h). The padding columns start as NaN, so a
// padded class that is read where it should add zero shows.
#include "kernels/cuda/lm_head.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/blas.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm_tolerance_testing.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

using testing::AllClose;
using testing::GemmTolerance;
using testing::RandomNormal;
using testing::Tolerance;

struct Shape {
  int n, d, vocab, ld;
};

std::string Name(const Shape& s, GemmMode mode) {
  return absl::StrCat("n=", s.n, " d=", s.d, " vocab=", s.vocab, " ld=", s.ld, " ",
                      GemmModeName(mode));
}

// Host data of one case: rows of logits-shaped matrices at stride ld, with
// NaN in the padding columns.
struct Data {
  Shape s;
  std::vector<float> x, wte, dwte, dlogits;  // dlogits [n, ld]
  float wte_std;

  explicit Data(const Shape& shape) : s(shape) {
    wte_std = 1.0f / std::sqrt(static_cast<float>(s.d));
    x = RandomNormal(1, int64_t{s.n} * s.d, 0.0f, 1.0f);
    wte = RandomNormal(2, int64_t{s.vocab} * s.d, 0.0f, wte_std);
    dwte = RandomNormal(3, int64_t{s.vocab} * s.d, 0.0f, 1.0f);
    const std::vector<float> packed = RandomNormal(4, int64_t{s.n} * s.vocab, 0.0f, 1.0f);
    dlogits.assign(static_cast<size_t>(s.n) * s.ld, NAN);
    for (int i = 0; i < s.n; ++i) {
      for (int j = 0; j < s.vocab; ++j) {
        dlogits[static_cast<size_t>(i) * s.ld + j] = packed[static_cast<size_t>(i) * s.vocab + j];
      }
    }
  }
  // The first vocab columns of a [n, ld] matrix.
  std::vector<float> Columns(const std::vector<float>& m) const {
    std::vector<float> out;
    for (int i = 0; i < s.n; ++i) {
      const float* row = m.data() + static_cast<size_t>(i) * s.ld;
      out.insert(out.end(), row, row + s.vocab);
    }
    return out;
  }
  // The padding columns of a [n, ld] matrix.
  std::vector<float> Padding(const std::vector<float>& m) const {
    std::vector<float> out;
    for (int i = 0; i < s.n; ++i) {
      const float* row = m.data() + static_cast<size_t>(i) * s.ld;
      out.insert(out.end(), row + s.vocab, row + s.ld);
    }
    return out;
  }
};

struct Results {
  std::vector<float> logits, dx, dwte, dlogits;
};

// The CPU's products over the packed vocabulary (strides ld, as HeadUnit).
Results OnCpu(const Data& d) {
  const Shape& s = d.s;
  Results r;
  r.logits.assign(static_cast<size_t>(s.n) * s.ld, NAN);
  Sgemm(false, true, s.n, s.vocab, s.d, 1.0f, d.x.data(), s.d, d.wte.data(), s.d, 0.0f,
        r.logits.data(), s.ld);
  r.dx.assign(static_cast<size_t>(s.n) * s.d, 0.0f);
  Sgemm(false, false, s.n, s.d, s.vocab, 1.0f, d.dlogits.data(), s.ld, d.wte.data(), s.d, 0.0f,
        r.dx.data(), s.d);
  r.dwte = d.dwte;
  Sgemm(true, false, s.vocab, s.d, s.n, 1.0f, d.dlogits.data(), s.ld, d.x.data(), s.d, 1.0f,
        r.dwte.data(), s.d);
  return r;
}

void RunOnGpu(GemmMode mode, const Data& d, Results* r) {
  const Shape& s = d.s;
  auto handle = CublasHandle::Create(mode);
  ASSERT_TRUE(handle.ok()) << handle.status();
  auto x = DeviceBuffer<float>::FromHost(d.x);
  auto wte = DeviceBuffer<float>::FromHost(d.wte);
  auto dwte = DeviceBuffer<float>::FromHost(d.dwte);
  auto dlogits = DeviceBuffer<float>::FromHost(d.dlogits);
  auto logits = DeviceBuffer<float>::FromHost(std::vector<float>(d.dlogits.size(), NAN));
  auto dx = DeviceBuffer<float>::Create(int64_t{s.n} * s.d);
  ASSERT_TRUE(x.ok() && wte.ok() && dwte.ok() && dlogits.ok() && logits.ok() && dx.ok());
  const absl::Status forward =
      LmHeadForwardCuda(*handle, x->data(), wte->data(), s.n, s.d, s.vocab, s.ld, logits->data());
  ASSERT_TRUE(forward.ok()) << forward;
  const absl::Status backward =
      LmHeadBackwardCuda(*handle, x->data(), wte->data(), dlogits->data(), s.n, s.d, s.vocab, s.ld,
                         dx->data(), dwte->data());
  ASSERT_TRUE(backward.ok()) << backward;
  auto got_logits = logits->ToHost();
  auto got_dx = dx->ToHost();
  auto got_dwte = dwte->ToHost();
  auto got_dlogits = dlogits->ToHost();
  ASSERT_TRUE(got_logits.ok() && got_dx.ok() && got_dwte.ok() && got_dlogits.ok());
  r->logits = *got_logits;
  r->dx = *got_dx;
  r->dwte = *got_dwte;
  r->dlogits = *got_dlogits;
}

class LmHeadCudaTest : public testing::CudaTest {};

// Every product against the CPU; the padding columns of the logits are
// zero (the zero rows' products) and dlogits' are zeroed; dlogits' other
// columns are left as they were.
TEST_F(LmHeadCudaTest, PaddedAndPackedVocabulary_MatchCpu) {
  const Shape shapes[] = {{8, 64, 50257, 50304}, {33, 40, 1001, 1024}, {17, 24, 100, 100}};
  for (GemmMode mode : {GemmMode::kFp32, GemmMode::kBf16}) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(Name(s, mode));
      const Data d(s);
      const Results want = OnCpu(d);
      Results got;
      ASSERT_NO_FATAL_FAILURE(RunOnGpu(mode, d, &got));
      // logits: d products of std wte_std; dx: vocab products of std
      // wte_std; dwte: n products of std 1 onto values of std 1.
      const Tolerance logits_tol = GemmTolerance(mode, s.d, d.wte_std, 0.0f);
      const Tolerance dx_tol = GemmTolerance(mode, s.vocab, d.wte_std, 0.0f);
      const Tolerance dwte_tol = GemmTolerance(mode, s.n, 1.0f, 1.0f);
      EXPECT_TRUE(AllClose("logits", d.Columns(got.logits), d.Columns(want.logits), logits_tol.atol,
                           logits_tol.rtol));
      EXPECT_TRUE(AllClose("dx", got.dx, want.dx, dx_tol.atol, dx_tol.rtol));
      EXPECT_TRUE(AllClose("dwte", got.dwte, want.dwte, dwte_tol.atol, dwte_tol.rtol));
      EXPECT_EQ(d.Columns(got.dlogits), d.Columns(d.dlogits));
      const std::vector<float> zeros(static_cast<size_t>(s.n) * (s.ld - s.vocab), 0.0f);
      EXPECT_EQ(d.Padding(got.logits), zeros);
      EXPECT_EQ(d.Padding(got.dlogits), zeros);
    }
  }
}

TEST_F(LmHeadCudaTest, TwoRuns_BitwiseEqual) {
  const Data d({16, 48, 5003, 5056});
  Results runs[2];
  for (Results& r : runs) ASSERT_NO_FATAL_FAILURE(RunOnGpu(GemmMode::kBf16, d, &r));
  EXPECT_EQ(runs[0].logits, runs[1].logits);
  EXPECT_EQ(runs[0].dx, runs[1].dx);
  EXPECT_EQ(runs[0].dwte, runs[1].dwte);
}

// The head's bf16 path against its fp32 passes, in bf16 mode (plain or
// aligned copies): the cross-entropy's forward writing the bf16 gradient,
// then LmHeadBackwardBf16Cuda with dloss = 1, gives bitwise the dx and
// dwte of the fp32 forward, the fp32 backward and LmHeadBackwardCuda. With
// dloss = 1/3 (the products' alpha) the results are dloss = 1's times 1/3,
// within 1e-6 relative (one rounding of the scaling). A handle whose
// products do not multiply copies is INVALID_ARGUMENT.
TEST_F(LmHeadCudaTest, Bf16GradientBackward_BitwiseTheFp32Passes) {
  const Shape shapes[] = {{8, 64, 50257, 50304}, {33, 40, 1001, 1024}};
  for (Bf16Operands how : {Bf16Operands::kAlignedCopies, Bf16Operands::kCopies}) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(Name(s, GemmMode::kBf16) + " " + Bf16OperandsName(how));
      const Data d(s);
      const std::vector<float> logits = RandomNormal(9, int64_t{s.n} * s.ld, 0.0f, 2.0f);
      std::vector<int32_t> targets(s.n);
      for (int i = 0; i < s.n; ++i) targets[i] = (i * 7919 + 3) % s.vocab;
      auto handle = CublasHandle::Create(GemmMode::kBf16);
      ASSERT_TRUE(handle.ok()) << handle.status();
      handle->set_bf16_operands(how);
      const cudaStream_t stream = handle->stream();
      auto x = DeviceBuffer<float>::FromHost(d.x);
      auto wte = DeviceBuffer<float>::FromHost(d.wte);
      auto logits_d = DeviceBuffer<float>::FromHost(logits);
      auto targets_d = DeviceBuffer<int32_t>::FromHost(targets);
      auto gradient = DeviceBuffer<uint16_t>::Create(int64_t{s.n} * s.ld);
      auto probs = DeviceBuffer<float>::Create(int64_t{s.n} * s.ld);
      auto dlogits = DeviceBuffer<float>::Create(int64_t{s.n} * s.ld);
      auto rows = DeviceBuffer<float>::Create(s.n);
      auto loss = DeviceBuffer<float>::Create(1);
      const std::vector<float> zeros(d.dwte.size(), 0.0f);
      auto dwte1 = DeviceBuffer<float>::FromHost(d.dwte);
      auto dwte2 = DeviceBuffer<float>::FromHost(d.dwte);
      auto dwte_quarter = DeviceBuffer<float>::FromHost(zeros);
      auto dwte_one = DeviceBuffer<float>::FromHost(zeros);
      auto dx1 = DeviceBuffer<float>::Create(int64_t{s.n} * s.d);
      auto dx2 = DeviceBuffer<float>::Create(int64_t{s.n} * s.d);
      auto dx_quarter = DeviceBuffer<float>::Create(int64_t{s.n} * s.d);
      ASSERT_TRUE(x.ok() && wte.ok() && logits_d.ok() && targets_d.ok() && gradient.ok() &&
                  probs.ok() && dlogits.ok() && rows.ok() && loss.ok() && dwte1.ok() &&
                  dwte2.ok() && dwte_quarter.ok() && dwte_one.ok() && dx1.ok() && dx2.ok() &&
                  dx_quarter.ok());
      // The bf16 path.
      ASSERT_TRUE(SoftmaxCrossEntropyForwardBf16GradientCuda(logits_d->data(), targets_d->data(),
                                                             s.n, s.vocab, s.ld, gradient->data(),
                                                             rows->data(), loss->data(), stream)
                      .ok());
      absl::Status run =
          LmHeadBackwardBf16Cuda(*handle, gradient->data(), 1.0f, x->data(), wte->data(), s.n, s.d,
                                 s.vocab, s.ld, dx1->data(), dwte1->data());
      ASSERT_TRUE(run.ok()) << run;
      // The fp32 passes.
      ASSERT_TRUE(SoftmaxCrossEntropyForwardCuda(logits_d->data(), targets_d->data(), s.n, s.vocab,
                                                 s.ld, probs->data(), rows->data(), loss->data(),
                                                 stream)
                      .ok());
      ASSERT_TRUE(SoftmaxCrossEntropyBackwardCuda(probs->data(), targets_d->data(), s.n, s.vocab,
                                                  s.ld, 1.0f, dlogits->data(), stream)
                      .ok());
      run = LmHeadBackwardCuda(*handle, x->data(), wte->data(), dlogits->data(), s.n, s.d, s.vocab,
                               s.ld, dx2->data(), dwte2->data());
      ASSERT_TRUE(run.ok()) << run;
      auto got_dx = dx1->ToHost(), want_dx = dx2->ToHost();
      auto got_dwte = dwte1->ToHost(), want_dwte = dwte2->ToHost();
      ASSERT_TRUE(got_dx.ok() && want_dx.ok() && got_dwte.ok() && want_dwte.ok());
      EXPECT_EQ(*got_dx, *want_dx);
      EXPECT_EQ(*got_dwte, *want_dwte);
      // dloss = 1/4 as alpha, against dloss = 1 scaled on the host: a
      // power of two scales every partial sum exactly, so the two agree
      // bitwise however cuBLAS splits and applies alpha (with 1/3, a
      // split-K product that scales its partials would round otherwise).
      const float quarter = 0.25f;
      run = LmHeadBackwardBf16Cuda(*handle, gradient->data(), quarter, x->data(), wte->data(), s.n,
                                   s.d, s.vocab, s.ld, dx_quarter->data(), dwte_quarter->data());
      ASSERT_TRUE(run.ok()) << run;
      run = LmHeadBackwardBf16Cuda(*handle, gradient->data(), 1.0f, x->data(), wte->data(), s.n,
                                   s.d, s.vocab, s.ld, dx2->data(), dwte_one->data());
      ASSERT_TRUE(run.ok()) << run;
      auto dx_scaled = dx_quarter->ToHost(), dx_one = dx2->ToHost();
      auto dwte_scaled = dwte_quarter->ToHost(), dwte_unit = dwte_one->ToHost();
      ASSERT_TRUE(dx_scaled.ok() && dx_one.ok() && dwte_scaled.ok() && dwte_unit.ok());
      for (float& v : *dx_one) v *= quarter;
      for (float& v : *dwte_unit) v *= quarter;
      EXPECT_EQ(*dx_scaled, *dx_one);
      EXPECT_EQ(*dwte_scaled, *dwte_unit);
    }
  }
  auto fp32 = CublasHandle::Create(GemmMode::kFp32);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  float* dummy = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dummy), sizeof(float) * 64), cudaSuccess);
  const absl::Status refused =
      LmHeadBackwardBf16Cuda(*fp32, reinterpret_cast<const uint16_t*>(dummy), 1.0f, dummy, dummy, 2,
                             8, 10, 16, dummy, dummy);
  cudaFree(dummy);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
}

// Argument checks happen before any CUDA call, so these run without a GPU.
TEST(LmHeadCudaArgumentsTest, StrideBelowVocabOrNullPointer_InvalidArgument) {
  float dummy = 0.0f;
  const CublasHandle empty;
  const absl::Status narrow = LmHeadForwardCuda(empty, &dummy, &dummy, 2, 4, 10, 9, &dummy);
  EXPECT_EQ(narrow.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(narrow.message().find("ld 9"), std::string::npos) << narrow;
  const absl::Status null_dx =
      LmHeadBackwardCuda(empty, &dummy, &dummy, &dummy, 2, 4, 10, 16, nullptr, &dummy);
  EXPECT_EQ(null_dx.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(null_dx.message().find("dx is null"), std::string::npos) << null_dx;
  const absl::Status no_handle = LmHeadForwardCuda(empty, &dummy, &dummy, 2, 4, 10, 16, &dummy);
  EXPECT_EQ(no_handle.code(), absl::StatusCode::kFailedPrecondition) << no_handle;
  const uint16_t gradient = 0;
  const absl::Status bf16_narrow =
      LmHeadBackwardBf16Cuda(empty, &gradient, 1.0f, &dummy, &dummy, 2, 4, 10, 9, &dummy, &dummy);
  EXPECT_EQ(bf16_narrow.code(), absl::StatusCode::kInvalidArgument) << bf16_narrow;
  const absl::Status bf16_no_handle =
      LmHeadBackwardBf16Cuda(empty, &gradient, 1.0f, &dummy, &dummy, 2, 4, 10, 16, &dummy, &dummy);
  EXPECT_EQ(bf16_no_handle.code(), absl::StatusCode::kFailedPrecondition) << bf16_no_handle;
}

}  // namespace
}  // namespace pipetrain
