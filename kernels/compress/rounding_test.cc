// The integer rounding helpers against the libm functions they replace, on
// halfway cases, their neighbours one ulp away, and random values.
#include "kernels/compress/rounding.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::vector<double> Probes() {
  std::vector<double> xs = {0.0,
                            -0.0,
                            0.25,
                            0.5,
                            1.5,
                            2.5,
                            -0.5,
                            -1.5,
                            -2.5,
                            1e-300,
                            -1e-300,
                            0.49999999999999994,
                            -0.49999999999999994,
                            2147483647.0,
                            -2147483647.0,
                            2147483646.5,
                            -2147483646.5};
  for (int i = -300; i <= 300; ++i) {
    const double half = i + 0.5;
    for (double x : {half, std::nextafter(half, 1e9), std::nextafter(half, -1e9),
                     static_cast<double>(i), std::nextafter(static_cast<double>(i), 1e9),
                     std::nextafter(static_cast<double>(i), -1e9)}) {
      xs.push_back(x);
    }
  }
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> wide(-1e9, 1e9), narrow(-300, 300);
  for (int i = 0; i < 100000; ++i) xs.push_back(i % 2 ? wide(rng) : narrow(rng));
  return xs;
}

TEST(Rounding, RoundHalfAwayFromZero_EqualsLround) {
  for (double x : Probes()) {
    ASSERT_EQ(RoundHalfAwayFromZero(x), std::lround(x)) << std::hexfloat << x;
  }
}

TEST(Rounding, FloorNonNegative_EqualsFloor) {
  for (double x : Probes()) {
    if (x < 0) continue;
    ASSERT_EQ(FloorNonNegative(x), static_cast<int32_t>(std::floor(x))) << std::hexfloat << x;
  }
}

}  // namespace
}  // namespace pipetrain
