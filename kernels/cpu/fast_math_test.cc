#include "kernels/cpu/fast_math.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// The kernels call FastExp/FastTanh inside target_clones loops, where GCC
// vectorises them per instruction set. The sweeps below run each of those
// compilations that this CPU can execute, plus plain scalar calls. With
// -ffp-contract=off (KERNEL_COPTS) no clone contracts a*b+c into an FMA, so
// all of them round alike: every clone computes bitwise what the scalar
// code does, and a job's workers agree whichever clone their CPUs pick.
using Loop = void (*)(const float* x, int64_t n, float* y);

#define PT_FAST_MATH_LOOPS(suffix, attribute)                                \
  attribute void FastExpLoop##suffix(const float* x, int64_t n, float* y) {  \
    for (int64_t i = 0; i < n; ++i) y[i] = FastExp(x[i]);                    \
  }                                                                          \
  attribute void FastTanhLoop##suffix(const float* x, int64_t n, float* y) { \
    for (int64_t i = 0; i < n; ++i) y[i] = FastTanh(x[i]);                   \
  }

// The clones' instruction sets (target("arch=...") would not inline the
// always-inline FastExp, which the kernels' target_clones do).
PT_FAST_MATH_LOOPS(Avx512, __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma"))))
PT_FAST_MATH_LOOPS(Avx2, __attribute__((target("avx2,fma"))))
PT_FAST_MATH_LOOPS(Default, )
#undef PT_FAST_MATH_LOOPS

void ScalarExpLoop(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    y[i] = FastExp(x[i]);
    asm volatile("" ::: "memory");  // Keeps this loop scalar.
  }
}

void ScalarTanhLoop(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    y[i] = FastTanh(x[i]);
    asm volatile("" ::: "memory");  // Keeps this loop scalar.
  }
}

struct Variant {
  const char* name;
  bool supported;
  Loop exp;
  Loop tanh;
};

std::vector<Variant> Variants() {
  __builtin_cpu_init();
  return {
      {"avx512",
       __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"),
       FastExpLoopAvx512, FastTanhLoopAvx512},
      {"avx2", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), FastExpLoopAvx2,
       FastTanhLoopAvx2},
      {"default", true, FastExpLoopDefault, FastTanhLoopDefault},
      {"scalar", true, ScalarExpLoop, ScalarTanhLoop},
  };
}

// n + 1 evenly spaced floats covering [lo, hi] (endpoints included).
std::vector<float> Sweep(double lo, double hi, int64_t n) {
  std::vector<float> x(n + 1);
  for (int64_t i = 0; i <= n; ++i) x[i] = static_cast<float>(lo + (hi - lo) * i / n);
  x[n] = static_cast<float>(hi);
  return x;
}

// "%.3g" of an error, recorded in the test XML so the bound actually met is
// visible next to the one claimed in fast_math.h.
std::string Format(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g", value);
  return text;
}

// About 4 million points: spacing 4e-5 on [-87, 88], so every binade and
// every reduction interval of the exp argument is visited many times.
constexpr int64_t kSweepPoints = int64_t{1} << 22;

TEST(FastExpTest, DenseSweep_RelativeErrorBelow4e7) {
  const std::vector<float> x = Sweep(-87.0, 88.0, kSweepPoints);
  std::vector<float> y(x.size());
  for (const Variant& variant : Variants()) {
    if (!variant.supported) continue;
    variant.exp(x.data(), static_cast<int64_t>(x.size()), y.data());
    double worst = 0.0;
    float worst_x = 0.0f;
    for (size_t i = 0; i < x.size(); ++i) {
      const double expected = std::exp(double{x[i]});
      const double error = std::fabs(y[i] - expected) / expected;
      if (!(error <= worst)) {
        worst = error;
        worst_x = x[i];
      }
    }
    RecordProperty(std::string("max_relative_error_") + variant.name, Format(worst));
    EXPECT_LT(worst, 4e-7) << variant.name << ": worst at x = " << worst_x;
  }
}

TEST(FastExpTest, InfiniteInputs_ClampToFiniteNonNan) {
  const float inf = std::numeric_limits<float>::infinity();
  const float big = FastExp(inf);
  const float small = FastExp(-inf);
  EXPECT_TRUE(std::isfinite(big));
  EXPECT_TRUE(std::isfinite(small));
  // The clamp bounds: e^88 ~ 1.65e38 and e^-87 ~ 1.65e-38 (a normal float).
  EXPECT_EQ(big, FastExp(88.0f));
  EXPECT_EQ(small, FastExp(-87.0f));
  EXPECT_NEAR(big / std::exp(88.0), 1.0, 4e-7);
  EXPECT_NEAR(small / std::exp(-87.0), 1.0, 4e-7);
  EXPECT_GE(small, std::numeric_limits<float>::min());
}

TEST(FastExpTest, ExactPoints_ZeroGivesOne) { EXPECT_EQ(FastExp(0.0f), 1.0f); }

// A diverging run must show NaN, not a tiny number: NaN has to propagate.
TEST(FastExpTest, NanInput_GivesNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(FastExp(nan)));
  EXPECT_TRUE(std::isnan(FastTanh(nan)));
  // Also in every vectorised form (the clamp must not turn NaN into a
  // bound), among ordinary values and at each lane position.
  std::vector<float> x(67, 0.5f);
  for (size_t i = 0; i < x.size(); i += 5) x[i] = nan;
  std::vector<float> y(x.size());
  for (const Variant& variant : Variants()) {
    if (!variant.supported) continue;
    for (Loop loop : {variant.exp, variant.tanh}) {
      loop(x.data(), static_cast<int64_t>(x.size()), y.data());
      for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_EQ(std::isnan(y[i]), std::isnan(x[i])) << variant.name << " at " << i;
      }
    }
  }
}

TEST(FastTanhTest, DenseSweep_AbsoluteErrorBelow3e7) {
  const std::vector<float> x = Sweep(-20.0, 20.0, kSweepPoints);
  std::vector<float> y(x.size());
  for (const Variant& variant : Variants()) {
    if (!variant.supported) continue;
    variant.tanh(x.data(), static_cast<int64_t>(x.size()), y.data());
    double worst = 0.0;
    float worst_x = 0.0f;
    for (size_t i = 0; i < x.size(); ++i) {
      const double error = std::fabs(y[i] - std::tanh(double{x[i]}));
      if (!(error <= worst)) {
        worst = error;
        worst_x = x[i];
      }
    }
    RecordProperty(std::string("max_absolute_error_") + variant.name, Format(worst));
    EXPECT_LT(worst, 3e-7) << variant.name << ": worst at x = " << worst_x;
  }
}

// Bitwise the scalar code's values in every vectorised form (no FMA
// contraction, no reassociation), over both functions' working ranges.
TEST(FastMathTest, EveryVectorisedForm_BitwiseTheScalarCode) {
  const std::vector<float> exp_x = Sweep(-87.0, 88.0, kSweepPoints);
  const std::vector<float> tanh_x = Sweep(-20.0, 20.0, kSweepPoints);
  const int64_t n = static_cast<int64_t>(exp_x.size());
  std::vector<float> exp_scalar(n), tanh_scalar(n), y(n);
  ScalarExpLoop(exp_x.data(), n, exp_scalar.data());
  ScalarTanhLoop(tanh_x.data(), n, tanh_scalar.data());
  for (const Variant& variant : Variants()) {
    if (!variant.supported) continue;
    for (const auto& [loop, x, scalar] :
         {std::tuple<Loop, const std::vector<float>*, const std::vector<float>*>{
              variant.exp, &exp_x, &exp_scalar},
          {variant.tanh, &tanh_x, &tanh_scalar}}) {
      loop(x->data(), n, y.data());
      int64_t differing = 0, first = -1;
      for (int64_t i = 0; i < n; ++i) {
        if (std::memcmp(&y[i], &(*scalar)[i], sizeof(float)) != 0) {
          if (first < 0) first = i;
          ++differing;
        }
      }
      EXPECT_EQ(differing, 0) << variant.name << (loop == variant.exp ? " exp" : " tanh")
                              << ": first at x = " << (first >= 0 ? (*x)[first] : 0.0f);
    }
  }
}

TEST(FastTanhTest, LargeInputs_SaturateAtPlusMinusOne) {
  for (float x : {20.0f, 20.5f, 44.0f, 100.0f, 1e10f, 3e38f}) {
    EXPECT_EQ(FastTanh(x), 1.0f) << "x = " << x;
    EXPECT_EQ(FastTanh(-x), -1.0f) << "x = " << -x;
  }
  const std::vector<float> x = Sweep(20.0, 1000.0, 1 << 16);
  std::vector<float> y(x.size());
  for (const Variant& variant : Variants()) {
    if (!variant.supported) continue;
    for (float sign : {1.0f, -1.0f}) {
      std::vector<float> signed_x = x;
      for (float& v : signed_x) v *= sign;
      variant.tanh(signed_x.data(), static_cast<int64_t>(x.size()), y.data());
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(y[i], sign) << variant.name << ": x = " << signed_x[i];
      }
    }
  }
}

TEST(FastTanhTest, InfiniteInputs_GivePlusMinusOne) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FastTanh(inf), 1.0f);
  EXPECT_EQ(FastTanh(-inf), -1.0f);
}

TEST(FastTanhTest, Symmetry_OddWithinOneUlp) {
  // 1 - 2/(e^{2x}+1) is not computed symmetrically; it must still be odd up
  // to the absolute error bound.
  for (float x : {1e-4f, 0.1f, 0.5f, 1.0f, 3.0f, 9.0f}) {
    EXPECT_NEAR(FastTanh(-x), -FastTanh(x), 3e-7) << "x = " << x;
  }
}

}  // namespace
}  // namespace pipetrain
