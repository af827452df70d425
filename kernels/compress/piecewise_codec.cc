#include "kernels/compress/piecewise_codec.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/payload.h"

namespace pipetrain {
namespace {

// eq. (9), clamped so that a == M lands in the last cluster.
int ClusterOf(double a, double max_abs, int n) {
  const double k = std::floor(a * n / max_abs);
  return static_cast<int>(std::clamp(k, 0.0, static_cast<double>(n - 1)));
}

// eq. (8) with eq. (12): U_k = M / (N * 2^(N-1)) * 2^k.
double IntervalWidth(double max_abs, int n, int k) {
  return max_abs / (n * std::ldexp(1.0, n - 1 - k));
}

// First level index of cluster k: the intervals of clusters 0..k-1.
uint32_t FirstLevel(int n, int k) { return (1u << n) - (1u << (n - k)); }

// The per-cluster constants of eq. (6)-(8) and (12) for one M, computed
// once per tensor with the same expressions LevelOf used per value, so the
// codes are unchanged and the per-value work is a floor, a division and a
// round.
struct ClusterTable {
  double c[kPiecewiseMaxClusters];      // C_k, eq. (7)
  double u[kPiecewiseMaxClusters];      // U_k, eq. (8) with (12)
  double j_max[kPiecewiseMaxClusters];  // 2^(N-1-k) intervals in cluster k
  uint32_t first[kPiecewiseMaxClusters];
  ClusterTable(double max_abs, int n) {
    for (int k = 0; k < n; ++k) {
      c[k] = max_abs / n * k;
      u[k] = IntervalWidth(max_abs, n, k);
      j_max[k] = std::ldexp(1.0, n - 1 - k);
      first[k] = FirstLevel(n, k);
    }
  }
};

// Magnitude level index of a = |val| (0 <= a <= M, M > 0).
inline uint32_t LevelOf(double a, double max_abs, int n, const ClusterTable& t) {
  const int k = ClusterOf(a, max_abs, n);
  const double j = std::round((a - t.c[k]) / t.u[k]);  // eq. (6)
  return t.first[k] + static_cast<uint32_t>(std::clamp(j, 0.0, t.j_max[k]));
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
  RETURN_IF_ERROR(CheckFinite(x, name()));
  const float* p = x.data();
  float max_abs = 0.0f;
  for (int64_t i = 0; i < x.numel(); ++i) max_abs = std::max(max_abs, std::fabs(p[i]));
  std::string out;
  out.reserve(static_cast<size_t>(EncodedBytes(x.shape())));
  WriteHeader(CodecId::kPiecewise, x.shape(), &out);
  ByteWriter w(&out);
  w.U8(static_cast<uint8_t>(n_));
  w.F32(max_abs);
  BitWriter bw(&out);
  const ClusterTable table(max_abs, n_);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const uint32_t level = max_abs > 0.0f ? LevelOf(std::fabs(p[i]), max_abs, n_, table) : 0;
    const uint32_t sign = p[i] < 0.0f ? 1 : 0;
    bw.Put((sign << n_) | level, n_ + 1);
  }
  bw.Finish();
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
  BitReader br(body);
  const std::vector<float> levels = Levels(max_abs, n_);
  const uint32_t level_mask = (1u << n_) - 1;
  Tensor t = Tensor::Zeros(shape);
  float* out = t.data();
  for (int64_t i = 0; i < count; ++i) {
    uint32_t code = 0;
    br.Get(n_ + 1, &code);  // Cannot fail: the body length was checked.
    const float magnitude = levels[code & level_mask];
    out[i] = (code >> n_) ? -magnitude : magnitude;
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
    return absl::InvalidArgumentError(absl::StrCat(
        "piecewise codec: bits=", bits, " (clusters N) is out of range; use 1..8 (N + 1 bits "
        "per value)"));
  }
  return std::unique_ptr<Codec>(new PiecewiseCodec(bits));
}

}  // namespace pipetrain
