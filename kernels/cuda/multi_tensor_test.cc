// The multi-tensor passes (multi_tensor.h): clipping's against the host's
// arithmetic in worker/train/grad_clip.h, and zeroing.
//
// Tolerances: the sums of squares are compared with the element-order
// double sum within 1e-10 relative. Both are double sums of the same
// non-negative terms in different orders; each is within (terms - 1) *
// 2^-53 relative of the exact sum (3.5e-10 for the largest tensor here, in
// the worst case; about 1e-13 in practice). Leaving out one element of the
// largest tensor would change its sum by about 3e-7 relative. The scaling
// is bitwise: one IEEE product per element on both sides.
#include "kernels/cuda/multi_tensor.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

using testing::AllClose;
using testing::RandomNormal;

// Element-order double sum, as grad_clip.cc's ParameterSquares.
double HostSquares(const std::vector<float>& x) {
  double sum = 0;
  for (float v : x) sum += double(v) * double(v);
  return sum;
}

// Tensors of the given sizes on the device, with their host copies.
struct DeviceTensors {
  std::vector<std::vector<float>> host;
  std::vector<DeviceBuffer<float>> device;
  std::vector<float*> pointers;
  std::vector<int64_t> counts;
};

DeviceTensors MakeTensors(const std::vector<int64_t>& sizes, uint64_t seed) {
  DeviceTensors t;
  for (size_t i = 0; i < sizes.size(); ++i) {
    // Scales that differ by tensor, as gradients of different layers do.
    t.host.push_back(RandomNormal(seed + i, sizes[i], 0.0f, std::ldexp(1.0f, int(i % 7) - 3)));
    t.counts.push_back(sizes[i]);
    if (sizes[i] == 0) {
      t.device.emplace_back();
      t.pointers.push_back(nullptr);
      continue;
    }
    auto buffer = DeviceBuffer<float>::FromHost(t.host.back());
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    t.pointers.push_back(buffer->data());
    t.device.push_back(*std::move(buffer));
  }
  return t;
}

std::vector<double> DeviceSums(const DeviceTensors& t) {
  const int count = static_cast<int>(t.counts.size());
  auto sums = DeviceBuffer<double>::Create(count);
  EXPECT_TRUE(sums.ok()) << sums.status();
  std::vector<const float*> pointers(t.pointers.begin(), t.pointers.end());
  const absl::Status run = SumsOfSquaresCuda(pointers.data(), t.counts.data(), count, sums->data());
  EXPECT_TRUE(run.ok()) << run;
  auto host = sums->ToHost();
  EXPECT_TRUE(host.ok()) << host.status();
  return *host;
}

class MultiTensorCudaTest : public testing::CudaTest {};

// Sizes around the block (256 threads, 1024 elements a block), the block
// cap (256 blocks: 262,144 elements) and past it (grid-stride steps), an
// empty tensor, and 70 tensors (two launches of 64).
TEST_F(MultiTensorCudaTest, SumsOfSquares_ManySizes_MatchHostDoubleSums) {
  std::vector<int64_t> sizes = {1, 0, 31, 255, 256, 1000, 1024, 1025, 262144, 262145, 3 << 20};
  while (sizes.size() < 70) sizes.push_back(97 * int64_t(sizes.size()) + 5);
  const DeviceTensors t = MakeTensors(sizes, 11);
  const std::vector<double> got = DeviceSums(t);
  ASSERT_EQ(got.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    const double want = HostSquares(t.host[i]);
    EXPECT_NEAR(got[i], want, 1e-10 * want) << "tensor " << i << " of " << sizes[i];
  }
}

// A tensor's sum depends on its size alone: alone or in a batch, first or
// last, run after run, the same bits.
TEST_F(MultiTensorCudaTest, SumsOfSquares_SameBitsAloneInABatchAndRunToRun) {
  const std::vector<int64_t> sizes = {262145, 77, 5000, 1 << 20};
  const DeviceTensors all = MakeTensors(sizes, 21);
  const std::vector<double> batch = DeviceSums(all);
  EXPECT_EQ(DeviceSums(all), batch);
  for (size_t i = 0; i < sizes.size(); ++i) {
    DeviceTensors one;
    one.pointers = {all.pointers[i]};
    one.counts = {sizes[i]};
    const std::vector<double> alone = DeviceSums(one);
    ASSERT_EQ(alone.size(), 1u);
    EXPECT_EQ(alone[0], batch[i]) << "tensor " << i;
  }
}

TEST_F(MultiTensorCudaTest, ScaleAll_MatchesHostProductsBitwise) {
  std::vector<int64_t> sizes = {1, 0, 255, 1025, 262145};
  while (sizes.size() < 66) sizes.push_back(13 * int64_t(sizes.size()));
  DeviceTensors t = MakeTensors(sizes, 31);
  const float scale = 0.37318f;
  const absl::Status run =
      ScaleAllCuda(t.pointers.data(), t.counts.data(), static_cast<int>(sizes.size()), scale);
  ASSERT_TRUE(run.ok()) << run;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) continue;
    std::vector<float> want = t.host[i];
    for (float& v : want) v *= scale;
    auto got = t.device[i].ToHost();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(AllClose("tensor " + std::to_string(i), *got, want, 0.0f, 0.0f));
  }
}

// Every element of 70 tensors (two launches) becomes +0, NaN and -0 too;
// an empty tensor is skipped.
TEST_F(MultiTensorCudaTest, ZeroAll_EveryElementPositiveZero) {
  std::vector<int64_t> sizes = {1, 0, 255, 1025, 262145};
  while (sizes.size() < 70) sizes.push_back(7 * int64_t(sizes.size()) + 1);
  DeviceTensors t = MakeTensors(sizes, 41);
  const float specials[] = {NAN, -0.0f, INFINITY};
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_EQ(cudaMemcpy(t.pointers[2] + k, &specials[k], sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  const absl::Status run =
      ZeroAllCuda(t.pointers.data(), t.counts.data(), static_cast<int>(sizes.size()));
  ASSERT_TRUE(run.ok()) << run;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) continue;
    auto got = t.device[i].ToHost();
    ASSERT_TRUE(got.ok()) << got.status();
    int64_t not_zero = 0;
    for (float v : *got) not_zero += (v != 0.0f || std::signbit(v)) ? 1 : 0;
    EXPECT_EQ(not_zero, 0) << "tensor " << i << " of " << sizes[i];
  }
}

// Checked before any CUDA call, so these run without a GPU too.
TEST(MultiTensorCudaNoDeviceTest, BadTables_InvalidArgumentBeforeAnyCudaCall) {
  double* sums = nullptr;  // never reached
  const float* none[2] = {nullptr, nullptr};
  const int64_t negative[2] = {0, -1};
  absl::Status s = SumsOfSquaresCuda(none, negative, 2, sums);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("tensor 1 of 2 has -1 elements"), std::string::npos) << s;
  const int64_t counts[2] = {0, 3};
  s = SumsOfSquaresCuda(none, counts, 2, sums);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("tensor 1 of 2 is null"), std::string::npos) << s;
  s = SumsOfSquaresCuda(none, counts, -1, sums);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  const int64_t empty[2] = {0, 0};
  s = SumsOfSquaresCuda(none, empty, 2, sums);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("sums is null"), std::string::npos) << s;
  EXPECT_TRUE(SumsOfSquaresCuda(none, empty, 0, sums).ok());  // nothing to do
  float* writable[2] = {nullptr, nullptr};
  s = ScaleAllCuda(writable, counts, 2, 0.5f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = ZeroAllCuda(writable, negative, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(ZeroAllCuda(writable, empty, 2).ok());
  EXPECT_TRUE(ScaleAllCuda(writable, empty, 2, 0.5f).ok());  // no elements: no launch
}

}  // namespace
}  // namespace pipetrain
