// StreamScratch: blocks come from the device's scratch cache by stream and
// go back to it, so a recurring size costs one cudaMalloc, not one per call.
// GPU cases skip without a device.
#include "kernels/cuda/stream_scratch.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/parity_testing.h"
#include "kernels/cuda/stream.h"

namespace pipetrain {
namespace {

// Needs no device: zero bytes never reach CUDA.
TEST(StreamScratchTest, ZeroBytes_EmptyHandle) {
  absl::StatusOr<StreamScratch> scratch = StreamScratch::Create(0, nullptr);
  ASSERT_TRUE(scratch.ok()) << scratch.status();
  EXPECT_EQ(scratch->get(), nullptr);
}

class StreamScratchGpuTest : public testing::CudaTest {};

TEST_F(StreamScratchGpuTest, RecurringSizeOnOneStream_ServedFromTheCache) {
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  absl::StatusOr<CachingAllocator*> cache = DeviceScratchCachingAllocator();
  ASSERT_TRUE(cache.ok()) << cache.status();
  const CachingAllocator::Stats before = (*cache)->GetStats();
  void* first = nullptr;
  for (int call = 0; call < 10; ++call) {
    absl::StatusOr<StreamScratch> scratch = StreamScratch::Create(4096, stream->get());
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    ASSERT_NE(scratch->get(), nullptr);
    // Usable by work on the stream; given back while that work may run.
    ASSERT_EQ(cudaMemsetAsync(scratch->get(), 0, 4096, stream->get()), cudaSuccess);
    if (call == 0) first = scratch->get();
    EXPECT_EQ(scratch->get(), first) << "call " << call;
  }
  const CachingAllocator::Stats after = (*cache)->GetStats();
  EXPECT_LE(after.raw_allocations - before.raw_allocations, 1);
  EXPECT_GE(after.cache_hits - before.cache_hits, 9);
  ASSERT_TRUE(stream->Synchronize().ok());
}

// A block given back by one stream is not handed to another (it may still
// be in use by the first stream's queued work).
TEST_F(StreamScratchGpuTest, OtherStream_GetsAnotherBlock) {
  absl::StatusOr<CudaStream> a = CudaStream::Create(), b = CudaStream::Create();
  ASSERT_TRUE(a.ok() && b.ok());
  void* from_a = nullptr;
  {
    absl::StatusOr<StreamScratch> scratch = StreamScratch::Create(8192, a->get());
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    from_a = scratch->get();
  }
  absl::StatusOr<StreamScratch> on_b = StreamScratch::Create(8192, b->get());
  ASSERT_TRUE(on_b.ok()) << on_b.status();
  EXPECT_NE(on_b->get(), from_a);
}

}  // namespace
}  // namespace pipetrain
