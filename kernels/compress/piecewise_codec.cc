#include "kernels/compress/piecewise_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/bit_pack.h"
#include "kernels/compress/payload.h"
#include "kernels/compress/rounding.h"

namespace pipetrain {
namespace {

// eq. (9), clamped so that a == M lands in the last cluster (clamping
// before the floor gives the same result, and keeps the truncation, which is
// the floor of a value >= 0, in range).
int ClusterOf(double a, double max_abs, int n) {
  return FloorNonNegative(std::min(a * n / max_abs, static_cast<double>(n - 1)));
}

// eq. (8) with eq. (12): U_k = M / (N * 2^(N-1)) * 2^k.
double IntervalWidth(double max_abs, int n, int k) {
  return max_abs / (n * std::ldexp(1.0, n - 1 - k));
}

// First level index of cluster k: the intervals of clusters 0..k-1.
uint32_t FirstLevel(int n, int k) { return (1u << n) - (1u << (n - k)); }

// The per-cluster constants of eq. (6)-(8) and (12) for one M, computed
// once per tensor, so the per-value work is a truncation, a division and a
// rounding (the same IEEE operations kernels/cuda/quantize.cu performs, so
// CPU and GPU codes agree).
struct ClusterTable {
  double c[kPiecewiseMaxClusters];       // C_k, eq. (7)
  double u[kPiecewiseMaxClusters];       // U_k, eq. (8) with (12)
  int32_t j_max[kPiecewiseMaxClusters];  // 2^(N-1-k) intervals in cluster k
  uint32_t first[kPiecewiseMaxClusters];
  ClusterTable(double max_abs, int n) {
    for (int k = 0; k < n; ++k) {
      c[k] = max_abs / n * k;
      u[k] = IntervalWidth(max_abs, n, k);
      j_max[k] = int32_t{1} << (n - 1 - k);
      first[k] = FirstLevel(n, k);
    }
  }
};

// Magnitude level index of a = |val| (0 <= a <= M, M > 0). j = round((a -
// C_k) / U_k), eq. (6), clamped to [0, 2^(N-1-k)]; the ratio is clamped to
// [-1, j_max + 1] first (which changes no result) so the integer rounding
// stays in range whatever the inputs.
inline uint32_t LevelOf(double a, double max_abs, int n, const ClusterTable& t) {
  const int k = ClusterOf(a, max_abs, n);
  const double ratio = std::clamp((a - t.c[k]) / t.u[k], -1.0, t.j_max[k] + 1.0);
  const int32_t j = std::clamp(RoundHalfAwayFromZero(ratio), 0, t.j_max[k]);
  return t.first[k] + static_cast<uint32_t>(j);
}

// Encoding by level boundaries. LevelOf is a non-decreasing step function of
// the magnitude a: eq. (9)'s cluster and eq. (6)'s rounded offset are both
// monotone in a, and the last level of cluster k is the first of cluster k+1.
// So the level of a equals the number of boundaries B_l <= a, where B_l
// (l = 1 .. 2^N - 1) is the smallest float a <= M with LevelOf(a) >= l
// (+inf when no a <= M reaches level l), found by a binary search over the
// float bit patterns (non-negative floats order as their bits). Counting is
// 2^N - 1 branch-free compares that vectorise; the codes are LevelOf's,
// exactly. Used for N <= kMaxBoundaryClusters, on tensors large enough to
// repay the ~32 LevelOf calls per boundary.
constexpr int kMaxBoundaryClusters = 4;
constexpr int64_t kMinBoundaryElements = 16384;

std::vector<float> LevelBoundaries(float max_abs, int n, const ClusterTable& table) {
  uint32_t top;
  std::memcpy(&top, &max_abs, sizeof(top));
  auto level_of_bits = [&](uint32_t bits) {
    float a;
    std::memcpy(&a, &bits, sizeof(a));
    return LevelOf(a, max_abs, n, table);
  };
  std::vector<float> bounds((size_t{1} << n) - 1);
  uint32_t lo = 0;  // Boundaries do not decrease: each search starts at the last.
  for (uint32_t l = 1; l <= bounds.size(); ++l) {
    uint32_t hi = top + 1;  // One past the patterns <= M: "not reached".
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo) / 2;
      if (level_of_bits(mid) >= l) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    if (lo > top) {
      bounds[l - 1] = std::numeric_limits<float>::infinity();
    } else {
      std::memcpy(&bounds[l - 1], &lo, sizeof(float));
    }
  }
  return bounds;
}

// codes[i] = sign << N | level for p[0, count), levels counted against the
// 2^N - 1 boundaries.
template <int N>
void CodesByBoundaries(const float* p, int64_t count, const float* bounds, uint16_t* codes) {
  constexpr int kBounds = (1 << N) - 1;
  for (int64_t i = 0; i < count; ++i) {
    const float a = std::fabs(p[i]);
    uint32_t level = 0;
    // Unrolled, so that this element loop (not the compare loop) vectorises.
#pragma GCC unroll 16
    for (int l = 0; l < kBounds; ++l) level += a >= bounds[l] ? 1u : 0u;
    const uint32_t sign = p[i] < 0.0f ? 1u : 0u;
    codes[i] = static_cast<uint16_t>((sign << N) | level);
  }
}

void CodesByBoundaries(int n, const float* p, int64_t count, const float* bounds, uint16_t* codes) {
  static_assert(kMaxBoundaryClusters == 4, "one instantiation per N below");
  switch (n) {
    case 1:
      return CodesByBoundaries<1>(p, count, bounds, codes);
    case 2:
      return CodesByBoundaries<2>(p, count, bounds, codes);
    case 3:
      return CodesByBoundaries<3>(p, count, bounds, codes);
    case 4:
      return CodesByBoundaries<4>(p, count, bounds, codes);
  }
}

// The 2^N magnitudes C_k + j U_k in level order (eq. 6, decode side).
std::vector<float> Levels(double max_abs, int n) {
  std::vector<float> levels(size_t{1} << n);
  for (int k = 0; k < n; ++k) {
    const uint32_t first = FirstLevel(n, k);
    const uint32_t end = k + 1 < n ? FirstLevel(n, k + 1) : (1u << n);
    for (uint32_t l = first; l < end; ++l) {
      const double v = max_abs / n * k + (l - first) * IntervalWidth(max_abs, n, k);
      levels[l] = static_cast<float>(std::min(v, max_abs));
    }
  }
  return levels;
}

class PiecewiseCodec : public Codec {
 public:
  explicit PiecewiseCodec(int n) : n_(n) {}

  std::string name() const override { return absl::StrCat("piecewise:bits=", n_); }

  int64_t EncodedBytes(const Shape& shape) const override {
    return HeaderBytes(static_cast<int>(shape.size())) + 1 + 4 +
           PackedBytes(NumElements(shape), n_ + 1);
  }

  absl::StatusOr<std::string> Encode(const Tensor& x, CodecState*) const override;
  absl::StatusOr<Tensor> Decode(absl::string_view payload) const override;

 private:
  const int n_;
};

absl::StatusOr<std::string> PiecewiseCodec::Encode(const Tensor& x, CodecState*) const {
  const float* p = x.data();
  const int64_t count = x.numel();
  ASSIGN_OR_RETURN(const float max_abs, FiniteMaxAbs(p, count, name()));
  std::string out;
  WriteHeader(CodecId::kPiecewise, x.shape(), &out);
  ByteWriter w(&out);
  w.U8(static_cast<uint8_t>(n_));
  w.F32(max_abs);
  const size_t body_offset = out.size();
  out.resize(static_cast<size_t>(EncodedBytes(x.shape())));
  auto* body = reinterpret_cast<uint8_t*>(&out[body_offset]);
  const ClusterTable table(max_abs, n_);
  const bool by_boundaries =
      max_abs > 0.0f && n_ <= kMaxBoundaryClusters && count >= kMinBoundaryElements;
  const std::vector<float> bounds =
      by_boundaries ? LevelBoundaries(max_abs, n_, table) : std::vector<float>();
  const int bits = n_ + 1;
  uint16_t codes[kPackChunkCodes];
  for (int64_t start = 0; start < count; start += kPackChunkCodes) {
    const int64_t chunk = std::min<int64_t>(kPackChunkCodes, count - start);
    if (by_boundaries) {
      CodesByBoundaries(n_, p + start, chunk, bounds.data(), codes);
    } else {
      for (int64_t i = 0; i < chunk; ++i) {
        const float v = p[start + i];
        const uint32_t level = max_abs > 0.0f ? LevelOf(std::fabs(v), max_abs, n_, table) : 0;
        const uint32_t sign = v < 0.0f ? 1 : 0;
        codes[i] = static_cast<uint16_t>((sign << n_) | level);
      }
    }
    PackCodes(codes, chunk, bits, body + start * bits / 8);
  }
  return out;
}

absl::StatusOr<Tensor> PiecewiseCodec::Decode(absl::string_view payload) const {
  ByteReader r(payload);
  ASSIGN_OR_RETURN(Shape shape, ReadHeader(CodecId::kPiecewise, &r));
  uint8_t n = 0;
  float max_abs = 0.0f;
  if (!r.U8(&n) || !r.F32(&max_abs)) {
    return absl::InvalidArgumentError(absl::StrCat(name(), ": payload truncated in parameters"));
  }
  if (n != n_) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(), ": payload has bits=", int{n}, ", this codec expects ", n_));
  }
  if (!std::isfinite(max_abs) || max_abs < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(), ": payload max|R| ", max_abs, " is not finite and >= 0"));
  }
  const int64_t count = NumElements(shape);
  if (r.remaining() != PackedBytes(count, n_ + 1)) {
    return absl::InvalidArgumentError(absl::StrCat(name(), ": body has ", r.remaining(),
                                                   " bytes, shape ", ShapeToString(shape),
                                                   " needs ", PackedBytes(count, n_ + 1)));
  }
  absl::string_view body;
  r.Bytes(r.remaining(), &body);
  // Every (n + 1)-bit code is a valid level and sign: one table lookup per
  // value. Negative levels keep -0.0f for level 0, as negating would.
  const std::vector<float> levels = Levels(max_abs, n_);
  std::vector<float> signed_levels(size_t{2} << n_);
  for (size_t l = 0; l < levels.size(); ++l) {
    signed_levels[l] = levels[l];
    signed_levels[levels.size() + l] = -levels[l];
  }
  const int bits = n_ + 1;
  const auto* in = reinterpret_cast<const uint8_t*>(body.data());
  Tensor t = Tensor::Zeros(shape);
  float* out = t.data();
  uint16_t codes[kPackChunkCodes];
  for (int64_t start = 0; start < count; start += kPackChunkCodes) {
    const int64_t chunk = std::min<int64_t>(kPackChunkCodes, count - start);
    UnpackCodes(in + start * bits / 8, chunk, bits, codes);  // Length checked above.
    for (int64_t i = 0; i < chunk; ++i) out[start + i] = signed_levels[codes[i]];
  }
  return t;
}

}  // namespace

double PiecewiseIntervalFor(float value, float max_abs, int clusters) {
  if (max_abs <= 0.0f) return 0.0;
  return IntervalWidth(max_abs, clusters, ClusterOf(std::fabs(value), max_abs, clusters));
}

absl::StatusOr<std::unique_ptr<Codec>> MakePiecewiseCodec(int bits) {
  if (bits < kPiecewiseMinClusters || bits > kPiecewiseMaxClusters) {
    return absl::InvalidArgumentError(
        absl::StrCat("piecewise codec: bits=", bits,
                     " (clusters N) is out of range; use 1..8 (N + 1 bits "
                     "per value)"));
  }
  return std::unique_ptr<Codec>(new PiecewiseCodec(bits));
}

}  // namespace pipetrain
