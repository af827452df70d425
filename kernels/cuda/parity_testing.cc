#include "kernels/cuda/parity_testing.h"

#include <cmath>
#include <sstream>

#include "absl/status/statusor.h"
#include "common/philox.h"
#include "kernels/cuda/device.h"

namespace pipetrain {
namespace testing {

void CudaTest::SetUp() {
  // CudaDeviceCount reads "no GPU" and "no driver" as 0; any error it still
  // returns is a fault on a machine that has a GPU, which a skip would hide.
  const absl::StatusOr<int> count = CudaDeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  if (*count == 0) GTEST_SKIP() << "no CUDA device";
}

::testing::AssertionResult AllClose(std::string_view what, const std::vector<float>& gpu,
                                    const std::vector<float>& cpu, float atol, float rtol) {
  if (gpu.size() != cpu.size()) {
    return ::testing::AssertionFailure() << what << ": GPU has " << gpu.size()
                                         << " elements, CPU " << cpu.size();
  }
  constexpr int kShown = 10;
  int64_t mismatches = 0;
  double max_diff = 0.0;
  std::ostringstream first;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(gpu[i]) - cpu[i]);
    const double bound = atol + rtol * std::fabs(static_cast<double>(cpu[i]));
    if (diff > max_diff) max_diff = diff;
    if (diff <= bound) continue;  // false for NaN, which counts as a mismatch
    if (mismatches < kShown) {
      first << "\n  [" << i << "] gpu " << gpu[i] << " cpu " << cpu[i] << " |diff| " << diff
            << " > " << bound;
    }
    ++mismatches;
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << mismatches << " of " << gpu.size()
         << " elements differ by more than atol " << atol << " + rtol " << rtol
         << " * |cpu| (largest |diff| " << max_diff << "); first mismatches:" << first.str();
}

std::vector<float> RandomNormal(uint64_t seed, int64_t n, float mean, float stddev) {
  std::vector<float> out(static_cast<size_t>(n));
  FillNormal(seed, static_cast<uint64_t>(n), mean, stddev, out.data(), n);
  return out;
}

}  // namespace testing
}  // namespace pipetrain
