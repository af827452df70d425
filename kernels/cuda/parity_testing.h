// Test helpers for the CUDA kernel parity tests (testonly).
//
// CudaTest: a fixture whose SetUp skips the test (GTEST_SKIP, "no CUDA
// device") when CudaDeviceCount() is 0 (no GPU, or no driver that serves
// this runtime), so GPU tests report SKIPPED on machines without a GPU
// instead of passing vacuously; any other error of it fails the test.
//
// AllClose: the llm.c-style comparison |gpu - cpu| <= atol + rtol * |cpu|,
// element by element, printing the first mismatches.
#ifndef PIPETRAIN_KERNELS_CUDA_PARITY_TESTING_H_
#define PIPETRAIN_KERNELS_CUDA_PARITY_TESTING_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace testing {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override;
};

// Success iff gpu.size() == cpu.size() and every element satisfies
// |gpu[i] - cpu[i]| <= atol + rtol * |cpu[i]| (a NaN on either side fails).
// The failure message names `what`, counts mismatches, reports the largest
// absolute difference and lists the first 10 mismatching indices.
::testing::AssertionResult AllClose(std::string_view what, const std::vector<float>& gpu,
                                    const std::vector<float>& cpu, float atol, float rtol);

// n values from N(mean, stddev^2), a pure function of (seed, n, ...).
std::vector<float> RandomNormal(uint64_t seed, int64_t n, float mean, float stddev);

}  // namespace testing
}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_PARITY_TESTING_H_
