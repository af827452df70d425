// GPU PowerSGD against the CPU codec (kernels/compress/powersgd_codec.cc),
// cuBLAS in fp32 GEMM mode.
//
// Tolerances, |gpu - cpu| <= atol + rtol * |cpu| with atol relative to the
// largest |cpu| value of the compared array (kScale below):
//   Both sides compute the same formulas from the same start Q; only the
//   order of the sums differs (cuBLAS GEMMs vs the CPU codec's fixed-order
//   sums, kernels/cpu/low_rank.h, over at most 300 terms; block vs
//   sequential double sums in Gram-Schmidt). fp32 GEMM rounding is at most
//   k * eps ~ 2e-5 relative for k = 300 and typically sqrt(k) * eps ~ 1e-6;
//   Gram-Schmidt amplifies a perturbation of P by the
//   condition number of M Q0, which for the Gaussian test matrices (r <= 4,
//   at least 5 rows and columns) stays below ~100. So ~1e-4 relative is the
//   expected worst case; kRel = 1e-3 leaves 10x headroom.
//   Exactness on rank <= r matrices: M^ = P P^T M reproduces M up to the
//   same rounding, bounded by kExactRel * max|M|.
#include "kernels/cuda/powersgd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/compress/codec.h"
#include "kernels/compress/payload.h"
#include "kernels/compress/powersgd_codec.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"
#include "kernels/cuda/powersgd_payload.h"

namespace pipetrain {
namespace {

using testing::AllClose;
using testing::RandomNormal;

constexpr float kRel = 1e-3f;
constexpr float kExactRel = 1e-4f;

float MaxAbs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// |gpu - cpu| <= kRel * max|cpu| + kRel * |cpu|.
::testing::AssertionResult Close(const std::string& what, const std::vector<float>& gpu,
                                 const std::vector<float>& cpu) {
  return AllClose(what, gpu, cpu, kRel * MaxAbs(cpu), kRel);
}

// P, Q and the decoded M^ from the CPU codec.
struct CpuResult {
  std::vector<float> p, q, decoded;
};

CpuResult CpuEncode(const Tensor& x, int64_t rows, int64_t cols, int rank, CodecState* state) {
  CpuResult result;
  auto codec = MakePowerSgdCodec(rank);
  if (!codec.ok()) return result;
  absl::StatusOr<std::string> payload = (*codec)->Encode(x, state);
  if (!payload.ok()) return result;
  absl::StatusOr<PowerSgdFactors> factors = ReadPowerSgdPayload(*payload, rank);
  if (!factors.ok() || factors->matrix.rows != rows || factors->matrix.cols != cols) return result;
  result.p = factors->p;
  result.q = factors->q;
  absl::StatusOr<Tensor> decoded = (*codec)->Decode(*payload);
  if (decoded.ok()) result.decoded.assign(decoded->data(), decoded->data() + decoded->numel());
  return result;
}

class PowerSgdCudaTest : public testing::CudaTest {
 protected:
  void SetUp() override {
    testing::CudaTest::SetUp();
    if (IsSkipped()) return;
    auto handle = CublasHandle::Create(GemmMode::kFp32);
    ASSERT_TRUE(handle.ok()) << handle.status();
    handle_ = std::move(*handle);
  }

  struct GpuResult {
    std::vector<float> p, q, decoded;
  };

  // Encodes `m` [rows, cols] (warm-started from q_warm when non-empty) and
  // decodes it again.
  GpuResult GpuEncode(const std::vector<float>& m, int64_t rows, int64_t cols, int rank,
                      const std::vector<float>& q_warm = {}) {
    GpuResult result;
    auto m_dev = DeviceBuffer<float>::FromHost(m);
    auto warm = DeviceBuffer<float>::FromHost(q_warm);
    auto p = DeviceBuffer<float>::Create(rows * rank);
    auto q = DeviceBuffer<float>::Create(cols * rank);
    auto out = DeviceBuffer<float>::Create(rows * cols);
    EXPECT_TRUE(m_dev.ok() && warm.ok() && p.ok() && q.ok() && out.ok());
    if (HasFailure()) return result;
    const absl::Status encoded =
        PowerSgdEncodeCuda(handle_, m_dev->data(), rows, cols, rank,
                           q_warm.empty() ? nullptr : warm->data(), p->data(), q->data());
    EXPECT_TRUE(encoded.ok()) << encoded;
    const absl::Status decoded =
        PowerSgdDecodeCuda(handle_, p->data(), q->data(), rows, cols, rank, out->data());
    EXPECT_TRUE(decoded.ok()) << decoded;
    result.p = p->ToHost().value_or(std::vector<float>{});
    result.q = q->ToHost().value_or(std::vector<float>{});
    result.decoded = out->ToHost().value_or(std::vector<float>{});
    return result;
  }

  CublasHandle handle_;
};

struct Case {
  Shape shape;
  int rank;
};

class PowerSgdCudaParityTest : public PowerSgdCudaTest,
                               public ::testing::WithParamInterface<Case> {};

TEST_P(PowerSgdCudaParityTest, Encode_ColdStart_MatchesCpuWithinTolerance) {
  const Shape& shape = GetParam().shape;
  const int rank = GetParam().rank;
  const int64_t cols = shape.back(), rows = NumElements(shape) / cols;
  const std::vector<float> m = RandomNormal(7, NumElements(shape), 0.0f, 1.0f);
  const CpuResult want = CpuEncode(Tensor::FromVector(shape, m), rows, cols, rank, nullptr);
  ASSERT_FALSE(want.decoded.empty());
  const GpuResult got = GpuEncode(m, rows, cols, rank);
  EXPECT_TRUE(Close("P", got.p, want.p));
  EXPECT_TRUE(Close("Q", got.q, want.q));
  EXPECT_TRUE(Close("M^", got.decoded, want.decoded));
}

TEST_P(PowerSgdCudaParityTest, Encode_WarmStartWithZeroColumn_MatchesCpuWithinTolerance) {
  const Shape& shape = GetParam().shape;
  const int rank = GetParam().rank;
  const int64_t cols = shape.back(), rows = NumElements(shape) / cols;
  // A first call on a constant (rank-1) matrix leaves Q with rank - 1 zero
  // columns, which the second call replaces by the Philox columns.
  const std::vector<float> first(NumElements(shape), 0.5f);
  const std::vector<float> second = RandomNormal(8, NumElements(shape), 0.0f, 1.0f);
  CodecState state;
  const CpuResult cpu_first = CpuEncode(Tensor::FromVector(shape, first), rows, cols, rank, &state);
  const CpuResult want = CpuEncode(Tensor::FromVector(shape, second), rows, cols, rank, &state);
  ASSERT_FALSE(want.decoded.empty());
  const GpuResult gpu_first = GpuEncode(first, rows, cols, rank);
  EXPECT_TRUE(Close("first Q", gpu_first.q, cpu_first.q));
  const GpuResult got = GpuEncode(second, rows, cols, rank, gpu_first.q);
  EXPECT_TRUE(Close("P", got.p, want.p));
  EXPECT_TRUE(Close("Q", got.q, want.q));
  EXPECT_TRUE(Close("M^", got.decoded, want.decoded));
}

// Rows/cols: one element, a few, no multiple of a warp or the 1024-thread
// block, and a rank-3 tensor viewed as 200 x 64.
INSTANTIATE_TEST_SUITE_P(Shapes, PowerSgdCudaParityTest,
                         ::testing::Values(Case{{1, 1}, 1}, Case{{7, 5}, 2}, Case{{33, 300}, 4},
                                           Case{{1500, 9}, 3}, Case{{4, 50, 64}, 1},
                                           Case{{4, 50, 64}, 4}));

TEST_F(PowerSgdCudaTest, Encode_LowRankMatrix_ReproducedWithinTolerance) {
  struct LowRank {
    int64_t rows, cols;
    int k, rank;
  };
  for (const LowRank& c : {LowRank{64, 48, 2, 4}, LowRank{300, 17, 3, 3}, LowRank{1, 1, 1, 1},
                           LowRank{1025, 6, 1, 2}}) {
    SCOPED_TRACE(absl::StrCat(c.rows, "x", c.cols, " rank ", c.k, " r ", c.rank));
    const std::vector<float> a = RandomNormal(9, c.rows * c.k, 0.0f, 1.0f);
    const std::vector<float> b = RandomNormal(10, c.cols * c.k, 0.0f, 1.0f);
    std::vector<float> m(c.rows * c.cols, 0.0f);
    for (int64_t i = 0; i < c.rows; ++i) {
      for (int64_t j = 0; j < c.cols; ++j) {
        for (int t = 0; t < c.k; ++t) m[i * c.cols + j] += a[i * c.k + t] * b[j * c.k + t];
      }
    }
    const GpuResult got = GpuEncode(m, c.rows, c.cols, c.rank);
    EXPECT_TRUE(AllClose("M^ vs M", got.decoded, m, kExactRel * MaxAbs(m), 0.0f));
  }
}

TEST_F(PowerSgdCudaTest, Encode_ZeroMatrix_ZeroFactorsLikeCpu) {
  const std::vector<float> m(40 * 30, 0.0f);
  const CpuResult want = CpuEncode(Tensor::FromVector({40, 30}, m), 40, 30, 3, nullptr);
  const GpuResult got = GpuEncode(m, 40, 30, 3);
  EXPECT_EQ(got.p, want.p);
  EXPECT_EQ(got.q, want.q);
  EXPECT_EQ(got.decoded, m);
}

TEST_F(PowerSgdCudaTest, Encode_TwoRuns_BitwiseEqual) {
  const std::vector<float> m = RandomNormal(11, 513 * 70, 0.0f, 1.0f);
  const GpuResult first = GpuEncode(m, 513, 70, 4);
  const GpuResult second = GpuEncode(m, 513, 70, 4);
  EXPECT_EQ(first.p, second.p);
  EXPECT_EQ(first.q, second.q);
  EXPECT_EQ(first.decoded, second.decoded);
}

TEST_F(PowerSgdCudaTest, Encode_NonFinite_SameErrorAsCpu) {
  std::vector<float> m = RandomNormal(12, 20 * 10, 0.0f, 1.0f);
  m[77] = std::numeric_limits<float>::infinity();
  auto codec = MakePowerSgdCodec(2);
  ASSERT_TRUE(codec.ok());
  const absl::Status want = (*codec)->Encode(Tensor::FromVector({20, 10}, m), nullptr).status();
  auto m_dev = DeviceBuffer<float>::FromHost(m);
  auto p = DeviceBuffer<float>::Create(40);
  auto q = DeviceBuffer<float>::Create(20);
  ASSERT_TRUE(m_dev.ok() && p.ok() && q.ok());
  const absl::Status got =
      PowerSgdEncodeCuda(handle_, m_dev->data(), 20, 10, 2, nullptr, p->data(), q->data());
  EXPECT_NE(got.message().find("element 77 is inf"), std::string::npos) << got;
  EXPECT_EQ(got, want);
}

TEST_F(PowerSgdCudaTest, Encode_EmptyMatrix_ZeroFactors) {
  auto q = DeviceBuffer<float>::FromHost(std::vector<float>(8, 1.0f));
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(PowerSgdEncodeCuda(handle_, nullptr, 0, 4, 2, nullptr, nullptr, q->data()).ok());
  EXPECT_EQ(q->ToHost().value_or(std::vector<float>{}), std::vector<float>(8, 0.0f));
}

// With q aliasing q_warm (how a link keeps its Q), an empty matrix leaves
// the warm start as it was, as the CPU codec leaves its state.
TEST_F(PowerSgdCudaTest, Encode_EmptyMatrixWarm_KeepsTheWarmStart) {
  auto q = DeviceBuffer<float>::FromHost(std::vector<float>(8, 1.5f));
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(PowerSgdEncodeCuda(handle_, nullptr, 0, 4, 2, q->data(), nullptr, q->data()).ok());
  EXPECT_EQ(q->ToHost().value_or(std::vector<float>{}), std::vector<float>(8, 1.5f));
}

// --- Payloads (powersgd_payload.h): what a CUDA stage sends and receives.

// Three encodes on one link, Q kept on the device between them (q_out
// aliasing q_warm; the backend writes beside it, so that a refused encode
// keeps the warm start): each payload has the CPU
// codec's size and header, and decodes (on the CPU) to what the CPU codec
// with its own CodecState delivers, within the parity tolerance.
TEST_F(PowerSgdCudaTest, PayloadEncode_WarmStartedSequence_DecodesAsTheCpuCodecs) {
  const Shape shape = {3, 37, 65};  // 111 x 65: off every block size
  const int rank = 4;
  auto codec = MakePowerSgdCodec(rank);
  ASSERT_TRUE(codec.ok());
  CodecState cpu_state;
  auto q_dev = DeviceBuffer<float>::Create(65 * rank);
  ASSERT_TRUE(q_dev.ok());
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE(absl::StrCat("call ", call));
    const std::vector<float> m = RandomNormal(30 + call, NumElements(shape), 0.0f, 1.0f);
    const Tensor x = Tensor::FromVector(shape, m);
    const std::string want = (*codec)->Encode(x, &cpu_state).value();
    auto x_dev = DeviceBuffer<float>::FromHost(m);
    ASSERT_TRUE(x_dev.ok());
    absl::StatusOr<std::string> got = PowerSgdEncodePayloadCuda(
        handle_, x_dev->data(), shape, rank, call == 0 ? nullptr : q_dev->data(), q_dev->data());
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want.size());
    EXPECT_EQ(got->substr(0, HeaderBytes(3) + 4), want.substr(0, HeaderBytes(3) + 4));
    absl::StatusOr<Tensor> decoded = (*codec)->Decode(*got);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_TRUE(Close("M^", decoded->ToVector(), (*codec)->Decode(want).value().ToVector()));
    EXPECT_TRUE(Close("Q kept", q_dev->ToHost().value(), cpu_state.powersgd_q.ToVector()));
  }
}

TEST_F(PowerSgdCudaTest, PayloadDecode_CpuPayload_MatchesCpuDecode_BadOnesRefused) {
  const Shape shape = {2, 50, 33};
  auto codec = MakePowerSgdCodec(3);
  ASSERT_TRUE(codec.ok());
  const Tensor x = Tensor::FromVector(shape, RandomNormal(40, NumElements(shape), 0.0f, 1.0f));
  const std::string payload = (*codec)->Encode(x, nullptr).value();
  auto out = DeviceBuffer<float>::Create(NumElements(shape));
  ASSERT_TRUE(out.ok());
  absl::StatusOr<Shape> got =
      PowerSgdDecodePayloadCuda(handle_, payload, 3, out->data(), NumElements(shape));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, shape);
  EXPECT_TRUE(Close("M^", out->ToHost().value(), (*codec)->Decode(payload).value().ToVector()));
  // The CPU's errors for a truncated payload or another rank; too little room.
  const std::string truncated = payload.substr(0, payload.size() - 4);
  absl::StatusOr<Shape> bad =
      PowerSgdDecodePayloadCuda(handle_, truncated, 3, out->data(), NumElements(shape));
  EXPECT_EQ(bad.status(), (*codec)->Decode(truncated).status());
  bad = PowerSgdDecodePayloadCuda(handle_, payload, 2, out->data(), NumElements(shape));
  EXPECT_EQ(bad.status(), MakePowerSgdCodec(2).value()->Decode(payload).status());
  bad = PowerSgdDecodePayloadCuda(handle_, payload, 3, out->data(), NumElements(shape) - 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  // Finite factors whose product overflows float32: the CPU's refusal.
  const std::vector<float> p = {1e30f, 1e30f}, q = {1e30f, 1e30f};
  const std::string overflowing = WritePowerSgdPayload({2, 2}, 1, p.data(), q.data());
  bad = PowerSgdDecodePayloadCuda(handle_, overflowing, 1, out->data(), NumElements(shape));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_EQ(bad.status().code(), MakePowerSgdCodec(1).value()->Decode(overflowing).status().code());
}

// --- Argument checks before any CUDA call: run without a GPU. ---

TEST(PowerSgdCudaArgumentsTest, PayloadOfEmptyTensor_InvalidArgument_GoesToTheHost) {
  const CublasHandle empty;
  absl::StatusOr<std::string> encoded =
      PowerSgdEncodePayloadCuda(empty, nullptr, {0, 8}, 2, nullptr, nullptr);
  EXPECT_EQ(encoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(encoded.status().message().find("encode it on the host"), std::string::npos)
      << encoded.status();
  const std::string payload =
      MakePowerSgdCodec(2).value()->Encode(Tensor::Zeros({0, 8}), nullptr).value();
  absl::StatusOr<Shape> decoded = PowerSgdDecodePayloadCuda(empty, payload, 2, nullptr, 0);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("decode it on the host"), std::string::npos)
      << decoded.status();
}

TEST(PowerSgdCudaArgumentsTest, Encode_RankOutOfRange_InvalidArgument) {
  const CublasHandle empty;
  const absl::Status status =
      PowerSgdEncodeCuda(empty, nullptr, 4, 4, 0, nullptr, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("powersgd: rank 0 is out of range 1..65536"), std::string::npos)
      << status;
}

TEST(PowerSgdCudaArgumentsTest, Encode_EmptyHandle_FailedPrecondition) {
  const CublasHandle empty;
  const absl::Status status =
      PowerSgdEncodeCuda(empty, nullptr, 4, 4, 2, nullptr, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("CublasHandle is empty"), std::string::npos) << status;
}

TEST(PowerSgdCudaArgumentsTest, Decode_HugeMatrix_InvalidArgument) {
  const CublasHandle empty;
  const absl::Status status =
      PowerSgdDecodeCuda(empty, nullptr, nullptr, int64_t{1} << 31, 4, 2, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("both sides must be in 0..2^31-1"), std::string::npos) << status;
}

TEST(PowerSgdCudaArgumentsTest, BuildingBlocks_BadSizes_InvalidArgument) {
  EXPECT_EQ(PowerSgdOrthonormaliseCuda(nullptr, 0, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PowerSgdStartQCuda(nullptr, nullptr, 3, 0, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
