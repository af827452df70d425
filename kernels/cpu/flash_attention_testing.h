// What the flash attention tests on the CPU share (kernels/cpu's twin
// test, kernels/cuda/emulation's run of the GPU kernels): bf16-exact
// inputs and the worst error against a tolerance. Test-only.
#ifndef PIPETRAIN_KERNELS_CPU_FLASH_ATTENTION_TESTING_H_
#define PIPETRAIN_KERNELS_CPU_FLASH_ATTENTION_TESTING_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/tensor.h"
#include "common/testing/gradient_check.h"
#include "kernels/cpu/flash_attention.h"

namespace pipetrain {
namespace testing {

// n values drawn as RandomTensor draws them, each rounded to bf16, so the
// kernels' own rounding of their inputs changes nothing.
inline std::vector<float> Bf16Normal(uint64_t seed, int64_t n) {
  std::vector<float> v = RandomTensor({n}, seed).ToVector();
  for (float& x : v) x = RoundToBf16(x);
  return v;
}

// The largest |got - want| / (atol + rtol |want|): at most 1 passes; a NaN
// (an element never written) is infinitely far.
inline double WorstRatio(const std::vector<float>& got, const std::vector<float>& want, double atol,
                         double rtol) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(double{got[i]} - want[i]);
    worst =
        std::max(worst, std::isfinite(err) ? err / (atol + rtol * std::fabs(want[i])) : INFINITY);
  }
  return worst;
}

}  // namespace testing
}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_FLASH_ATTENTION_TESTING_H_
