#include "kernels/compress/powersgd_codec.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/philox.h"
#include "common/status_macros.h"
#include "kernels/compress/payload.h"
#include "kernels/cpu/low_rank.h"

namespace pipetrain {
namespace {

constexpr uint64_t kQSeed = 0x5057525347440001ull;  // Fixed: payloads are reproducible.
constexpr float kDependentColumn = 1e-5f;
constexpr int kMaxRank = 65536;

double ColumnNorm(const float* a, int64_t rows, int r, int col) {
  double sum = 0;
  for (int64_t i = 0; i < rows; ++i) sum += double{a[i * r + col]} * a[i * r + col];
  return std::sqrt(sum);
}

// Modified Gram-Schmidt with one re-orthogonalisation pass (header, step 3).
void Orthonormalise(float* p, int64_t rows, int r) {
  for (int c = 0; c < r; ++c) {
    const double before = ColumnNorm(p, rows, r, c);
    for (int pass = 0; pass < 2; ++pass) {
      for (int prev = 0; prev < c; ++prev) {
        double dot = 0;
        for (int64_t i = 0; i < rows; ++i) dot += double{p[i * r + prev]} * p[i * r + c];
        for (int64_t i = 0; i < rows; ++i) p[i * r + c] -= static_cast<float>(dot * p[i * r + prev]);
      }
    }
    const double after = ColumnNorm(p, rows, r, c);
    // Dependent on the earlier columns (relative to its own norm), or too
    // small to scale to unit length in float: 1/after past FLT_MAX (a
    // gradient of a few subnormal entries) would make the column Inf and
    // NaN, and through Q the warm start of every later call.
    const bool dependent = before == 0.0 || after <= kDependentColumn * before ||
                           1.0 / after > std::numeric_limits<float>::max();
    const float scale = dependent ? 0.0f : static_cast<float>(1.0 / after);
    for (int64_t i = 0; i < rows; ++i) p[i * r + c] *= scale;
  }
}

// The start Q [cols, r] (header, step 1).
Tensor StartQ(const CodecState* state, int64_t cols, int r) {
  return PowerSgdStartQ(state != nullptr ? state->powersgd_q : Tensor(), cols, r);
}

}  // namespace

void PowerSgdOrthonormalise(float* p, int64_t rows, int r) { Orthonormalise(p, rows, r); }

Tensor PowerSgdStartQ(const Tensor& warm, int64_t cols, int r) {
  Tensor fresh = Tensor::Zeros({cols, r});
  FillNormal(kQSeed, HashName("powersgd_q"), 0.0f, 1.0f, fresh.data(), fresh.numel());
  if (warm.is_null() || warm.shape() != Shape{cols, r}) return fresh;
  Tensor q = warm.Clone();
  for (int c = 0; c < r; ++c) {
    if (ColumnNorm(q.data(), cols, r, c) != 0.0) continue;
    for (int64_t i = 0; i < cols; ++i) q[i * r + c] = fresh[i * r + c];
  }
  return q;
}

namespace {

absl::Status CheckBlasDims(const PowerSgdMatrix& m, const Shape& shape) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (m.rows <= kMax && m.cols <= kMax) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("powersgd: ", ShapeToString(shape),
                                                 " as a matrix is ", m.rows, " x ", m.cols,
                                                 "; both sides must be below 2^31"));
}

class PowerSgdCodec : public Codec {
 public:
  explicit PowerSgdCodec(int rank) : rank_(rank) {}

  std::string name() const override { return absl::StrCat("powersgd:rank=", rank_); }

  absl::StatusOr<std::string> Encode(const Tensor& x, CodecState* state) const override {
    RETURN_IF_ERROR(CheckFinite(x, "powersgd"));
    const PowerSgdMatrix m = PowerSgdMatrixOf(x.shape());
    RETURN_IF_ERROR(CheckBlasDims(m, x.shape()));
    Tensor p = Tensor::Zeros({m.rows, rank_});
    Tensor q = Tensor::Zeros({m.cols, rank_});
    if (m.rows > 0 && m.cols > 0) {
      Tensor q0 = StartQ(state, m.cols, rank_);
      // Not sgemms: a stage's tensor-parallel ranks encode the same tensor
      // and must send the same factors from any CPU (low_rank.h).
      MatrixTimesFactor(x.data(), q0.data(), m.rows, m.cols, rank_, p.data());
      Orthonormalise(p.data(), m.rows, rank_);
      MatrixTransposeTimesFactor(x.data(), p.data(), m.rows, m.cols, rank_, q.data());
      // Q = X^T P overflows float for entries near FLT_MAX: refused before
      // it becomes the next call's start.
      RETURN_IF_ERROR(CheckFinite(q, "powersgd (its factor Q = X^T P)"));
      if (state != nullptr) state->powersgd_q = q.Clone();
    }
    return WritePowerSgdPayload(x.shape(), rank_, p.data(), q.data());
  }

  absl::StatusOr<Tensor> Decode(absl::string_view payload) const override {
    ASSIGN_OR_RETURN(const PowerSgdFactors f, ReadPowerSgdPayload(payload, rank_));
    Tensor out = Tensor::Zeros(f.shape);
    // As the all-reduce's (powersgd_all_reduce.cc): every CPU decodes alike.
    LowRankProduct(f.p.data(), f.q.data(), f.matrix.rows, f.matrix.cols, rank_, out.data());
    // Finite factors can multiply past float32's range (P and Q of 1e30):
    // refused as the other decoders refuse non-finite values, not handed
    // on as Inf (a NaN loss blamed on training, a residual that fails the
    // next Encode).
    RETURN_IF_ERROR(CheckFinite(out, "powersgd decode (P Q^T)"));
    return out;
  }

  int64_t EncodedBytes(const Shape& shape) const override {
    const PowerSgdMatrix m = PowerSgdMatrixOf(shape);
    return HeaderBytes(static_cast<int>(shape.size())) + 4 + 4 * int64_t{rank_} * (m.rows + m.cols);
  }

 private:
  int rank_;
};

}  // namespace

PowerSgdMatrix PowerSgdMatrixOf(const Shape& shape) {
  if (shape.empty()) return {1, 1};
  return {NumElements(Shape(shape.begin(), shape.end() - 1)), shape.back()};
}

std::string WritePowerSgdPayload(const Shape& shape, int rank, const float* p, const float* q) {
  const PowerSgdMatrix m = PowerSgdMatrixOf(shape);
  std::string out;
  out.reserve(static_cast<size_t>(HeaderBytes(static_cast<int>(shape.size())) + 4 +
                                  4 * int64_t{rank} * (m.rows + m.cols)));
  WriteHeader(CodecId::kPowerSgd, shape, &out);
  ByteWriter w(&out);
  w.U32(static_cast<uint32_t>(rank));
  w.F32s(p, m.rows * rank);
  w.F32s(q, m.cols * rank);
  return out;
}

absl::StatusOr<PowerSgdFactors> ReadPowerSgdPayload(absl::string_view payload, int rank) {
  ByteReader r(payload);
  PowerSgdFactors f;
  ASSIGN_OR_RETURN(f.shape, ReadHeader(CodecId::kPowerSgd, &r));
  f.matrix = PowerSgdMatrixOf(f.shape);
  uint32_t got_rank = 0;
  if (!r.U32(&got_rank)) return absl::InvalidArgumentError("powersgd: payload truncated in rank");
  if (got_rank != static_cast<uint32_t>(rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("powersgd: payload has rank ", got_rank, ", this codec rank ", rank));
  }
  const int64_t expected = 4 * int64_t{rank} * (f.matrix.rows + f.matrix.cols);
  if (r.remaining() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("powersgd: body is ", r.remaining(), " bytes, expected ", expected));
  }
  RETURN_IF_ERROR(CheckBlasDims(f.matrix, f.shape));
  f.p.resize(static_cast<size_t>(f.matrix.rows * rank));
  f.q.resize(static_cast<size_t>(f.matrix.cols * rank));
  r.F32s(f.p.data(), static_cast<int64_t>(f.p.size()));  // Lengths checked above.
  r.F32s(f.q.data(), static_cast<int64_t>(f.q.size()));
  RETURN_IF_ERROR(CheckFinite(f.p.data(), static_cast<int64_t>(f.p.size()), "powersgd decode (P)"));
  RETURN_IF_ERROR(CheckFinite(f.q.data(), static_cast<int64_t>(f.q.size()), "powersgd decode (Q)"));
  return f;
}

absl::StatusOr<std::unique_ptr<Codec>> MakePowerSgdCodec(int rank) {
  if (rank < 1 || rank > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("powersgd: rank ", rank, " is out of range 1..", kMaxRank));
  }
  return std::unique_ptr<Codec>(new PowerSgdCodec(rank));
}

}  // namespace pipetrain
