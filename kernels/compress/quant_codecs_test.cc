// Tests of the quantization codecs: fp16, bf16, linear, piecewise.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/compress/fp16_codec.h"
#include "kernels/compress/linear_codec.h"
#include "kernels/compress/payload.h"
#include "kernels/compress/piecewise_codec.h"

namespace pipetrain {
namespace {

enum class Kind { kFp16, kBf16, kLinear, kPiecewise };

struct Spec {
  Kind kind;
  int bits;  // Linear bits or piecewise N; unused for fp16/bf16.
};

std::string SpecName(const Spec& s) {
  switch (s.kind) {
    case Kind::kFp16: return "fp16";
    case Kind::kBf16: return "bf16";
    case Kind::kLinear: return "linear" + std::to_string(s.bits);
    case Kind::kPiecewise: return "piecewise" + std::to_string(s.bits);
  }
  return "";
}

std::unique_ptr<Codec> Make(const Spec& s) {
  switch (s.kind) {
    case Kind::kFp16: return MakeFp16Codec();
    case Kind::kBf16: return MakeBf16Codec();
    case Kind::kLinear: return *MakeLinearCodec(s.bits);
    case Kind::kPiecewise: return *MakePiecewiseCodec(s.bits);
  }
  return nullptr;
}

// The documented EncodedBytes formula of each codec's header, restated.
int64_t DocumentedBytes(const Spec& s, const Shape& shape) {
  const int64_t n = NumElements(shape);
  const int64_t header = 6 + 8 * static_cast<int64_t>(shape.size());
  switch (s.kind) {
    case Kind::kFp16:
    case Kind::kBf16: return header + 2 * n;
    case Kind::kLinear: return header + 5 + (s.bits * n + 7) / 8;
    case Kind::kPiecewise: return header + 5 + ((s.bits + 1) * n + 7) / 8;
  }
  return -1;
}

float PayloadF32(const std::string& payload, int64_t offset) {
  float v;
  std::memcpy(&v, payload.data() + offset, sizeof(v));
  return v;
}

// Piecewise quantization's interval width for a magnitude `a` of a tensor
// whose largest magnitude is `m`, with `n` clusters, restated from the
// paper rather than taken from the codec (a wrong width there would widen
// the bound it is checked against by as much): eq. (9)'s cluster
// k = min(floor(a N / M), N - 1) and eq. (12)'s U_k = M / (N 2^(N-1)) 2^k.
double PaperPiecewiseInterval(double a, double m, int n) {
  const int k = std::min(static_cast<int>(std::floor(a * n / m)), n - 1);
  return m / (n * std::ldexp(1.0, n - 1)) * std::ldexp(1.0, k);
}

// The per-element bound each header promises, plus float32 rounding of the
// decoded value (half an ulp; we allow 2^-23 |x| to cover the double->float
// step and the float step/max stored in the payload).
double ErrorBound(const Spec& s, const std::string& payload, int rank, float x) {
  const double ax = std::fabs(double{x});
  const double rounding = std::ldexp(ax, -23) + 1e-45;
  const int64_t params = HeaderBytes(rank) + 1;
  switch (s.kind) {
    case Kind::kFp16: return std::max(std::ldexp(ax, -11), std::ldexp(1.0, -25));
    case Kind::kBf16: return std::max(std::ldexp(ax, -8), std::ldexp(1.0, -134));
    case Kind::kLinear: return PayloadF32(payload, params) / 2.0 + rounding;
    case Kind::kPiecewise: {
      const double m = PayloadF32(payload, params);
      return m > 0 ? PaperPiecewiseInterval(ax, m, s.bits) / 2.0 + rounding : rounding;
    }
  }
  return 0;
}

std::vector<Spec> AllSpecs() {
  std::vector<Spec> specs = {{Kind::kFp16, 0}, {Kind::kBf16, 0}};
  for (int b = kLinearMinBits; b <= kLinearMaxBits; ++b) specs.push_back({Kind::kLinear, b});
  for (int n = kPiecewiseMinClusters; n <= kPiecewiseMaxClusters; ++n) {
    specs.push_back({Kind::kPiecewise, n});
  }
  return specs;
}

const std::vector<Shape>& TestShapes() {
  static const auto* shapes =
      new std::vector<Shape>{{},
                             {0},
                             {1},
                             {7},
                             {3, 5},
                             {2, 0, 4},
                             {2, 3, 4},
                             {1000},
                             {17, 33},
                             // Past kPackChunkCodes (bit_pack.h): codes packed in several chunks,
                             // the last one partial.
                             {3, 1500}};
  return *shapes;
}

// Input families: Gaussian, zeros, constant, mixed magnitudes, all negative.
Tensor MakeInput(const Shape& shape, int family, std::mt19937* rng) {
  Tensor t = Tensor::Zeros(shape);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-6.0f, 4.0f);  // 1e4 < fp16 max.
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (family) {
      case 0: t[i] = normal(*rng); break;
      case 1: t[i] = 0.0f; break;
      case 2: t[i] = -2.75f; break;
      case 3: t[i] = normal(*rng) * std::pow(10.0f, exponent(*rng)); break;
      case 4: t[i] = -std::fabs(normal(*rng)) - 0.01f; break;
    }
  }
  return t;
}

class QuantCodecTest : public ::testing::TestWithParam<Spec> {};

TEST_P(QuantCodecTest, RoundTrip_ManyShapesAndInputs_WithinBoundAndDocumentedSize) {
  const Spec spec = GetParam();
  auto codec = Make(spec);
  std::mt19937 rng(1234);
  for (const Shape& shape : TestShapes()) {
    for (int family = 0; family < 5; ++family) {
      const Tensor x = MakeInput(shape, family, &rng);
      auto payload = codec->Encode(x, nullptr);
      ASSERT_TRUE(payload.ok()) << payload.status();
      ASSERT_EQ(static_cast<int64_t>(payload->size()), codec->EncodedBytes(shape));
      ASSERT_EQ(codec->EncodedBytes(shape), DocumentedBytes(spec, shape));
      // The bound below is half the step the payload carries, so the step
      // itself must be the header's: linear eq. (4), computed in double and
      // stored as float32; piecewise M = max|R|. An encoder with too few
      // levels would otherwise pass with its own coarser step.
      if (spec.kind == Kind::kLinear || spec.kind == Kind::kPiecewise) {
        double max_abs = 0;
        for (int64_t i = 0; i < x.numel(); ++i)
          max_abs = std::max(max_abs, std::fabs(double{x[i]}));
        const double want =
            spec.kind == Kind::kLinear ? max_abs / ((int64_t{1} << (spec.bits - 1)) - 1) : max_abs;
        ASSERT_EQ(PayloadF32(*payload, HeaderBytes(static_cast<int>(shape.size())) + 1),
                  static_cast<float>(want))
            << ShapeToString(shape) << " family " << family;
      }
      auto y = codec->Decode(*payload);
      ASSERT_TRUE(y.ok()) << y.status();
      ASSERT_EQ(y->shape(), shape);
      for (int64_t i = 0; i < x.numel(); ++i) {
        const double err = std::fabs(double{(*y)[i]} - double{x[i]});
        ASSERT_LE(err, ErrorBound(spec, *payload, static_cast<int>(shape.size()), x[i]))
            << ShapeToString(shape) << " family " << family << " i=" << i << " x=" << x[i]
            << " y=" << (*y)[i];
        if (family == 1) {
          ASSERT_EQ((*y)[i], 0.0f);  // All zeros decode exactly.
        }
      }
      auto again = codec->Encode(x, nullptr);
      ASSERT_EQ(*again, *payload) << "not deterministic";
    }
  }
}

TEST_P(QuantCodecTest, Encode_NonFinite_InvalidArgumentNamingElement) {
  auto codec = Make(GetParam());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    Tensor x = Tensor::FromVector({2, 3}, {0.5f, 1.0f, -1.0f, bad, 2.0f, 0.0f});
    auto payload = codec->Encode(x, nullptr);
    EXPECT_EQ(payload.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(payload.status().message().find("element 3"), std::string::npos)
        << payload.status();
  }
}

TEST_P(QuantCodecTest, Decode_EveryTruncationAndExtraByte_InvalidArgument) {
  auto codec = Make(GetParam());
  std::mt19937 rng(5);
  const std::string payload = *codec->Encode(MakeInput({3, 5}, 0, &rng), nullptr);
  for (size_t len = 0; len < payload.size(); ++len) {
    auto y = codec->Decode(absl::string_view(payload).substr(0, len));
    EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument) << "len=" << len;
  }
  EXPECT_EQ(codec->Decode(payload + "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(QuantCodecTest, Decode_RandomCorruption_RejectedOrDecodedWithoutCrash) {
  auto codec = Make(GetParam());
  std::mt19937 rng(11);
  const std::string payload = *codec->Encode(MakeInput({2, 7}, 3, &rng), nullptr);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bad = payload;
    const int flips = 1 + trial % 3;
    for (int f = 0; f < flips; ++f) {
      // Half the trials aim at the header and parameters, where damage matters most.
      const size_t limit = trial % 2 ? bad.size() : std::min<size_t>(bad.size(), 32);
      bad[rng() % limit] = static_cast<char>(rng() & 0xff);
    }
    auto y = codec->Decode(bad);
    if (!y.ok()) {
      EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    for (int64_t i = 0; i < y->numel(); ++i) ASSERT_TRUE(std::isfinite((*y)[i]));
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, QuantCodecTest, ::testing::ValuesIn(AllSpecs()),
                         [](const ::testing::TestParamInfo<Spec>& info) {
                           return SpecName(info.param);
                         });

TEST(QuantCodecs, Decode_WrongCodecId_InvalidArgument) {
  const Tensor x = Tensor::FromVector({3}, {1.0f, -2.0f, 0.5f});
  const std::string fp16 = *MakeFp16Codec()->Encode(x, nullptr);
  auto y = MakeBf16Codec()->Decode(fp16);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(y.status().message().find("payload is for codec 1, not 2"), std::string::npos);
  EXPECT_EQ((*MakeLinearCodec(4))->Decode(fp16).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string linear = *(*MakeLinearCodec(4))->Encode(x, nullptr);
  auto z = (*MakePiecewiseCodec(3))->Decode(linear);
  EXPECT_NE(z.status().message().find("payload is for codec 3, not 4"), std::string::npos);
}

TEST(QuantCodecs, Decode_OtherBits_InvalidArgumentNamingBits) {
  const Tensor x = Tensor::FromVector({3}, {1.0f, -2.0f, 0.5f});
  auto y = (*MakeLinearCodec(5))->Decode(*(*MakeLinearCodec(4))->Encode(x, nullptr));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(y.status().message().find("bits=4"), std::string::npos) << y.status();
  auto z = (*MakePiecewiseCodec(2))->Decode(*(*MakePiecewiseCodec(3))->Encode(x, nullptr));
  EXPECT_EQ(z.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(z.status().message().find("bits=3"), std::string::npos) << z.status();
}

TEST(QuantCodecs, Make_BitsOutOfRange_InvalidArgumentNamingBits) {
  for (int bits : {-1, 0, 1, 17, 32}) {
    auto c = MakeLinearCodec(bits);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bits;
    EXPECT_NE(c.status().message().find("bits"), std::string::npos);
  }
  for (int bits : {-1, 0, 9, 16}) {
    auto c = MakePiecewiseCodec(bits);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bits;
    EXPECT_NE(c.status().message().find("bits"), std::string::npos);
  }
  EXPECT_EQ((*MakeLinearCodec(8))->name(), "linear:bits=8");
  EXPECT_EQ((*MakePiecewiseCodec(3))->name(), "piecewise:bits=3");
  EXPECT_EQ(MakeFp16Codec()->name(), "fp16");
  EXPECT_EQ(MakeBf16Codec()->name(), "bf16");
}

// Overwrites the f32 parameter that follows the bits byte.
std::string WithParam(std::string payload, int rank, float value) {
  std::memcpy(&payload[HeaderBytes(rank) + 1], &value, sizeof(value));
  return payload;
}

TEST(QuantCodecs, Decode_BadStepOrMax_InvalidArgument) {
  const Tensor x = Tensor::FromVector({2}, {1.0f, -0.25f});
  auto linear = *MakeLinearCodec(6);
  auto piecewise = *MakePiecewiseCodec(3);
  const std::string lp = *linear->Encode(x, nullptr);
  const std::string pp = *piecewise->Encode(x, nullptr);
  for (float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    auto a = linear->Decode(WithParam(lp, 1, bad));
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find("step"), std::string::npos) << a.status();
    auto b = piecewise->Decode(WithParam(pp, 1, bad));
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(b.status().message().find("max|R|"), std::string::npos) << b.status();
  }
  // A huge but finite step that would overflow float32 on decode.
  auto c = linear->Decode(WithParam(lp, 1, 3e38f));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(QuantCodecs, LinearDecode_AllOnesCode_InvalidArgument) {
  auto linear = *MakeLinearCodec(2);  // Codes 0..2 are valid; 3 is not.
  std::string p = *linear->Encode(Tensor::FromVector({4}, {1.0f, 0.0f, -1.0f, 0.5f}), nullptr);
  p.back() = static_cast<char>(0xff);
  auto y = linear->Decode(p);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(y.status().message().find("out-of-range code"), std::string::npos) << y.status();
}

TEST(QuantCodecs, LinearEncode_Extremes_ExactAtMaxAndSymmetric) {
  auto linear = *MakeLinearCodec(3);  // step = 4 / 3, q in -3..3.
  const Tensor x = Tensor::FromVector({3}, {4.0f, -4.0f, 0.0f});
  auto y = *linear->Decode(*linear->Encode(x, nullptr));
  EXPECT_EQ(y[0], 4.0f);
  EXPECT_EQ(y[1], -4.0f);
  EXPECT_EQ(y[2], 0.0f);
}

// max|R| = FLT_MAX: eq. (4)'s step rounds up to float32 at most bit
// widths, so qmax x step would decode beyond the float range (which Decode
// refuses); LinearStep takes the float32 one ulp below, and every width
// decodes its own payload within step / 2.
TEST(QuantCodecs, LinearEncode_FloatMax_EveryWidthDecodesItsOwnPayloadWithinTheBound) {
  constexpr float kMax = std::numeric_limits<float>::max();
  const Tensor x = Tensor::FromVector({4}, {kMax, -1.0f, -kMax, kMax / 3});
  int rounded_up = 0;
  for (int bits = kLinearMinBits; bits <= kLinearMaxBits; ++bits) {
    SCOPED_TRACE("bits " + std::to_string(bits));
    const double qmax = static_cast<double>((int64_t{1} << (bits - 1)) - 1);
    if (qmax * static_cast<float>(double{kMax} / qmax) > double{kMax}) ++rounded_up;
    const float step = LinearStep(kMax, bits);
    EXPECT_LE(qmax * step, double{kMax});
    EXPECT_EQ(LinearStep(4.0f, bits), static_cast<float>(4.0 / qmax));  // eq. (4) as it was
    auto linear = *MakeLinearCodec(bits);
    absl::StatusOr<std::string> payload = linear->Encode(x, nullptr);
    ASSERT_TRUE(payload.ok()) << payload.status();
    absl::StatusOr<Tensor> y = linear->Decode(*payload);
    ASSERT_TRUE(y.ok()) << y.status();
    for (int64_t i = 0; i < x.numel(); ++i) {
      EXPECT_LE(std::fabs(double{(*y)[i]} - double{x[i]}), step / 2.0) << "element " << i;
    }
  }
  EXPECT_GT(rounded_up, 0);  // the case this guards happens
}

// Every decoded value pinned, from eq. (4)-(5) by hand: bits 3, max|R| 3,
// so step = 3 / (2^2 - 1) = 1 and q = round(val) in -3..3; and bits 4,
// max|R| 14, so step = 14 / 7 = 2 and q = round(val / 2) in -7..7.
TEST(QuantCodecs, LinearCodes_MatchEquationsFourAndFive) {
  auto three = *MakeLinearCodec(3);
  const std::vector<float> in3 = {0.4f, 0.6f, 1.4f, 1.6f, -2.6f, 3.0f, -3.0f, -0.4f};
  const std::vector<float> want3 = {0.0f, 1.0f, 1.0f, 2.0f, -3.0f, 3.0f, -3.0f, -0.0f};
  EXPECT_EQ((*three->Decode(*three->Encode(Tensor::FromVector({8}, in3), nullptr))).ToVector(),
            want3);
  auto four = *MakeLinearCodec(4);
  const std::vector<float> in4 = {14.0f, -14.0f, 0.9f, 1.1f, 5.2f, -12.9f, 13.1f};
  const std::vector<float> want4 = {14.0f, -14.0f, 0.0f, 2.0f, 6.0f, -12.0f, 14.0f};
  EXPECT_EQ((*four->Decode(*four->Encode(Tensor::FromVector({7}, in4), nullptr))).ToVector(),
            want4);
}

TEST(QuantCodecs, PiecewiseLevels_N2_MatchPaperGrid) {
  // N = 2, M = 8: U_0 = 8 / (2 * 2) = 2 in [0, 4), U_1 = 4 in [4, 8];
  // levels 0, 2, 4, 8 (2^N = 4 levels, 2^N - 1 = 3 intervals, eq. 11).
  auto pw = *MakePiecewiseCodec(2);
  const std::vector<float> in = {0.9f, 1.1f, 3.2f, 5.9f, 6.1f, 8.0f, -1.1f, -8.0f, 0.0f};
  const std::vector<float> want = {0.0f, 2.0f, 4.0f, 4.0f, 8.0f, 8.0f, -2.0f, -8.0f, 0.0f};
  auto y = *pw->Decode(*pw->Encode(Tensor::FromVector({9}, in), nullptr));
  EXPECT_EQ(y.ToVector(), want);
  EXPECT_EQ(PiecewiseIntervalFor(3.9f, 8.0f, 2), 2.0);
  EXPECT_EQ(PiecewiseIntervalFor(4.0f, 8.0f, 2), 4.0);
  EXPECT_EQ(PiecewiseIntervalFor(8.0f, 8.0f, 2), 4.0);  // a == M: last cluster.
}

// Every N: a fine sweep of [0, M] decodes to exactly 2^N magnitudes (2^N - 1
// intervals, eq. 11), each a level of the paper's grid, C_k + j U_k with
// C_k = k M / N (eq. 8) and U_k as eq. (12).
TEST(QuantCodecs, PiecewiseLevels_EveryN_ThePapersGrid) {
  constexpr double kM = 8.0;
  constexpr int kSweep = 200001;
  for (int n = kPiecewiseMinClusters; n <= kPiecewiseMaxClusters; ++n) {
    SCOPED_TRACE(n);
    std::vector<float> in(kSweep);
    for (int i = 0; i < kSweep; ++i) in[i] = static_cast<float>(kM * i / (kSweep - 1));
    auto pw = *MakePiecewiseCodec(n);
    const std::vector<float> out =
        pw->Decode(*pw->Encode(Tensor::FromVector({kSweep}, in), nullptr))->ToVector();
    std::vector<double> grid;
    for (int k = 0; k < n; ++k) {
      const double u = kM / (n * std::ldexp(1.0, n - 1)) * std::ldexp(1.0, k);
      for (int64_t j = 0; j <= (int64_t{1} << (n - 1 - k)); ++j) grid.push_back(k * kM / n + j * u);
    }
    std::sort(grid.begin(), grid.end());
    grid.erase(std::unique(grid.begin(), grid.end(),
                           [](double a, double b) { return std::fabs(a - b) < 1e-9; }),
               grid.end());
    ASSERT_EQ(grid.size(), size_t{1} << n);
    const std::set<float> seen(out.begin(), out.end());
    EXPECT_EQ(seen.size(), size_t{1} << n);
    for (float v : seen) {
      const auto nearest = std::min_element(grid.begin(), grid.end(), [v](double a, double b) {
        return std::fabs(a - v) < std::fabs(b - v);
      });
      EXPECT_LE(std::fabs(*nearest - v), 1e-6 * kM) << v;
    }
  }
}

TEST(QuantCodecs, PiecewiseN1_IsSignAndMax) {
  auto pw = *MakePiecewiseCodec(1);  // One cluster, one interval: levels 0 and M.
  const Tensor x = Tensor::FromVector({4}, {3.0f, -1.4f, 1.6f, -3.0f});
  auto y = *pw->Decode(*pw->Encode(x, nullptr));
  EXPECT_EQ(y.ToVector(), (std::vector<float>{3.0f, -0.0f, 3.0f, -3.0f}));
}

// The piecewise codes of a payload (body after the header, N and M).
std::vector<uint32_t> PiecewiseCodes(const std::string& payload, int rank, int n, int64_t count) {
  BitReader r(absl::string_view(payload).substr(HeaderBytes(rank) + 5));
  std::vector<uint32_t> codes(count);
  for (auto& c : codes) EXPECT_TRUE(r.Get(n + 1, &c));
  return codes;
}

// Large tensors with N <= 4 are encoded by counting level boundaries found
// by binary search (piecewise_codec.cc), small ones by eq. (6)-(9) directly.
// Both must give every value the same code. Probes: every level, every
// midpoint between levels (the rounding ties), their float neighbours, the
// cluster edges C_k and random values, under M from subnormal to huge; each
// probe's direct code comes from a small tensor {v, M} (same M).
TEST(QuantCodecs, PiecewiseLargeTensor_SameCodesAsDirectFormula) {
  std::mt19937 rng(21);
  for (int n = 1; n <= 4; ++n) {
    auto codec = *MakePiecewiseCodec(n);
    for (float m :
         {1.0f, 3.0f, 0.7f, 1e-30f, 3e-39f, 1e-44f, 2.5e37f, std::numeric_limits<float>::max()}) {
      std::vector<float> probes;
      // The levels: the distinct decoded magnitudes of a sweep of [0, M]
      // fine enough to hit each (the narrowest interval is M / 32 at N = 4).
      std::vector<float> levels(4097);
      for (size_t i = 0; i < levels.size(); ++i) levels[i] = m * (static_cast<float>(i) / 4096);
      levels.back() = m;
      levels =
          codec->Decode(*codec->Encode(Tensor::FromVector({4097}, levels), nullptr))->ToVector();
      std::sort(levels.begin(), levels.end());
      levels.erase(std::unique(levels.begin(), levels.end()), levels.end());
      for (size_t i = 0; i < levels.size(); ++i) {
        std::vector<float> around = {levels[i]};
        if (i + 1 < levels.size()) around.push_back(levels[i] + (levels[i + 1] - levels[i]) / 2);
        for (int k = 0; k <= n; ++k) around.push_back(m / n * k);  // cluster edges C_k
        for (float v : around) {
          for (float w : {v, std::nextafter(v, 0.0f), std::nextafter(v, m)}) {
            if (w >= 0.0f && w <= m) {
              probes.push_back(w);
              probes.push_back(-w);
            }
          }
        }
      }
      std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
      while (probes.size() < 20000) probes.push_back(uniform(rng) * m);
      probes.push_back(m);
      const int64_t count = static_cast<int64_t>(probes.size());
      const std::string big = *codec->Encode(Tensor::FromVector({count}, probes), nullptr);
      const std::vector<uint32_t> codes = PiecewiseCodes(big, 1, n, count);
      for (int64_t i = 0; i < count; ++i) {
        const std::string small = *codec->Encode(Tensor::FromVector({2}, {probes[i], m}), nullptr);
        const uint32_t direct = PiecewiseCodes(small, 1, n, 2)[0];
        ASSERT_EQ(codes[i], direct)
            << "N=" << n << " M=" << m << " value " << std::hexfloat << probes[i];
      }
    }
  }
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t ToFp16(float x) {
  uint16_t h = 0xdead;
  EXPECT_TRUE(FloatToFp16(x, &h)) << x;
  return h;
}

uint16_t ToBf16(float x) {
  uint16_t h = 0xdead;
  EXPECT_TRUE(FloatToBf16(x, &h)) << x;
  return h;
}

TEST(HalfConversions, Fp16_HalfwayValues_RoundToEven) {
  EXPECT_EQ(ToFp16(1.0f), 0x3c00);
  EXPECT_EQ(ToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);       // tie, down to even
  EXPECT_EQ(ToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);   // tie, up to even
  EXPECT_EQ(ToFp16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  EXPECT_EQ(ToFp16(-1.0f - std::ldexp(1.0f, -11)), 0xbc00);
  EXPECT_EQ(ToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(ToFp16(65519.0f), 0x7bff);
  EXPECT_EQ(ToFp16(std::ldexp(1.0f, -24)), 0x0001);               // smallest subnormal
  EXPECT_EQ(ToFp16(std::ldexp(1.0f, -25)), 0x0000);               // tie to even 0
  EXPECT_EQ(ToFp16(3 * std::ldexp(1.0f, -25)), 0x0002);           // tie to even 2
  EXPECT_EQ(ToFp16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);  // to min normal
  EXPECT_EQ(ToFp16(-std::ldexp(1.0f, -26)), 0x8000);              // signed zero
  EXPECT_EQ(ToFp16(1e-40f), 0x0000);                              // float subnormal
  uint16_t h;
  EXPECT_FALSE(FloatToFp16(65520.0f, &h));  // tie above 65504 rounds to inf
  EXPECT_FALSE(FloatToFp16(-1e10f, &h));
}

TEST(HalfConversions, Bf16_HalfwayValues_RoundToEven) {
  EXPECT_EQ(ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(ToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(ToBf16(-2.0f), 0xc000);
  EXPECT_EQ(ToBf16(FromBits(0x7f7f7fff)), 0x7f7f);
  EXPECT_EQ(ToBf16(FromBits(0x00008000)), 0x0000);  // subnormal tie to even 0
  EXPECT_EQ(ToBf16(FromBits(0x00018000)), 0x0002);  // subnormal tie to even 2
  uint16_t h;
  EXPECT_FALSE(FloatToBf16(FromBits(0x7f7f8000), &h));  // tie, odd -> rounds to inf
  EXPECT_FALSE(FloatToBf16(std::numeric_limits<float>::max(), &h));
}

TEST(HalfConversions, EveryFinitePattern_RoundTripsExactly) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f16 = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isfinite(f16)) {
      uint16_t back;
      ASSERT_TRUE(FloatToFp16(f16, &back));
      ASSERT_EQ(back, h);
    }
    const float b16 = Bf16ToFloat(static_cast<uint16_t>(h));
    if (std::isfinite(b16)) {
      uint16_t back;
      ASSERT_TRUE(FloatToBf16(b16, &back));
      ASSERT_EQ(back, h);
    }
  }
}

TEST(HalfConversions, Fp16_MatchesNearestByBruteForce) {
  // Independent model: the nearest of all finite fp16 values (ties to even).
  std::vector<std::pair<double, uint16_t>> finite;
  for (uint32_t h = 0; h < 0x7c00; ++h) finite.push_back({Fp16ToFloat(h), h});
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.0f, 65504.0f);
  for (int trial = 0; trial < 3000; ++trial) {
    const float x = trial % 2 ? u(rng) : std::ldexp(u(rng) / 65504.0f, -(trial % 30));
    auto it = std::lower_bound(finite.begin(), finite.end(), std::make_pair(double{x}, uint16_t{0}));
    uint16_t want = it->second;
    if (it != finite.begin()) {
      const auto prev = *(it - 1);
      const double dp = x - prev.first, dn = it->first - x;
      if (dp < dn || (dp == dn && (prev.second & 1) == 0)) want = prev.second;
    }
    ASSERT_EQ(ToFp16(x), want) << x;
  }
}

TEST(HalfConversions, Encode_OutOfRange_InvalidArgumentNamingElement) {
  const Tensor x = Tensor::FromVector({3}, {1.0f, 7e4f, 2.0f});
  auto p = MakeFp16Codec()->Encode(x, nullptr);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("element 1"), std::string::npos) << p.status();
  EXPECT_TRUE(MakeBf16Codec()->Encode(x, nullptr).ok());
  const Tensor big = Tensor::FromVector({2}, {1.0f, std::numeric_limits<float>::max()});
  auto q = MakeBf16Codec()->Encode(big, nullptr);
  EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(q.status().message().find("element 1"), std::string::npos) << q.status();
}

TEST(HalfConversions, Decode_InfPattern_InvalidArgument) {
  std::string p = *MakeFp16Codec()->Encode(Tensor::FromVector({1}, {1.0f}), nullptr);
  p[p.size() - 2] = 0x00;
  p[p.size() - 1] = 0x7c;  // +inf
  auto y = MakeFp16Codec()->Decode(p);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(y.status().message().find("non-finite"), std::string::npos);
}

}  // namespace
}  // namespace pipetrain
