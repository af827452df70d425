// DeviceBuffer: argument checks and empty buffers run without a GPU; the
// round trip through device memory needs one and skips otherwise.
#include "kernels/cuda/device_buffer.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

TEST(DeviceBufferTest, Create_NegativeSize_InvalidArgument) {
  const auto buffer = DeviceBuffer<float>::Create(-3);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(buffer.status().message().find("DeviceBuffer size -3"), std::string::npos)
      << buffer.status();
}

TEST(DeviceBufferTest, Create_Overflowing_InvalidArgument) {
  const auto buffer = DeviceBuffer<double>::Create(int64_t{1} << 62);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceBufferTest, Create_ZeroSize_EmptyWithoutCudaCall) {
  auto buffer = DeviceBuffer<float>::Create(0);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(buffer->data(), nullptr);
  EXPECT_EQ(buffer->size(), 0);
  auto host = buffer->ToHost();
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_TRUE(host->empty());
}

TEST(DeviceBufferTest, CopyFromHost_MoreThanSize_InvalidArgument) {
  auto buffer = DeviceBuffer<float>::Create(0);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const float value = 1.0f;
  const absl::Status status = buffer->CopyFromHost(&value, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("CopyFromHost: 1 elements requested, buffer holds 0"),
            std::string::npos)
      << status;
}

class DeviceBufferCudaTest : public testing::CudaTest {};

TEST_F(DeviceBufferCudaTest, FromHost_RoundTrip_SameValues) {
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f};
  auto buffer = DeviceBuffer<float>::FromHost(values);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_NE(buffer->data(), nullptr);
  EXPECT_EQ(buffer->size(), 5);
  auto back = buffer->ToHost();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, values);
}

TEST_F(DeviceBufferCudaTest, MoveAssign_TakesOwnership_SourceEmpty) {
  auto source = DeviceBuffer<int>::FromHost({4, 5, 6});
  ASSERT_TRUE(source.ok()) << source.status();
  DeviceBuffer<int> target;
  target = std::move(*source);
  EXPECT_EQ(source->data(), nullptr);
  EXPECT_EQ(source->size(), 0);
  auto back = target.ToHost();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, (std::vector<int>{4, 5, 6}));
}

}  // namespace
}  // namespace pipetrain
