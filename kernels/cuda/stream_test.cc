// Streams, events, the CUDA raw allocators and pinned buffers. Argument and
// empty-handle checks run without a GPU; the overlap-safety cases need one
// and skip otherwise (CudaTest).
#include "kernels/cuda/stream.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/alloc/caching_allocator.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"
#include "kernels/cuda/pinned_buffer.h"

namespace pipetrain {
namespace {

bool Contains(const absl::Status& status, const std::string& part) {
  return std::string(status.message()).find(part) != std::string::npos;
}

// Pageable malloc memory: enough for PinnedBuffer's argument checks, which
// make no CUDA call.
class MallocRawAllocator : public RawAllocator {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override { return std::malloc(bytes); }
  void Free(void* ptr) override { std::free(ptr); }
};

TEST(CudaAllocationStatusTest, CudaAllocationStatus_Success_Ok) {
  EXPECT_TRUE(CudaAllocationStatus(cudaSuccess, "cudaMalloc", 64).ok());
}

TEST(CudaAllocationStatusTest, CudaAllocationStatus_OutOfMemory_ResourceExhausted) {
  const absl::Status status = CudaAllocationStatus(cudaErrorMemoryAllocation, "cudaMalloc", 1024);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(status, "cudaMalloc of 1024 bytes: out of memory")) << status;
}

TEST(CudaAllocationStatusTest, CudaAllocationStatus_OtherError_Internal) {
  const absl::Status status = CudaAllocationStatus(cudaErrorInvalidValue, "cudaHostAlloc", 1024);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(Contains(status, "cudaHostAlloc failed at")) << status;
  EXPECT_TRUE(Contains(status, "cudaErrorInvalidValue")) << status;
}

TEST(CudaRawAllocatorTest, Allocate_ZeroBytes_InvalidArgument) {
  CudaDeviceRawAllocator device;
  CudaPinnedRawAllocator pinned;
  const absl::Status device_status = device.Allocate(0).status();
  const absl::Status pinned_status = pinned.Allocate(0).status();
  EXPECT_EQ(device_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(device_status, "CudaDeviceRawAllocator: a zero-byte")) << device_status;
  EXPECT_EQ(pinned_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(pinned_status, "CudaPinnedRawAllocator: a zero-byte")) << pinned_status;
}

TEST(CudaStreamTest, Synchronize_EmptyHandle_FailedPrecondition) {
  CudaStream stream;
  EXPECT_FALSE(stream.valid());
  EXPECT_EQ(stream.id(), 0u);
  const absl::Status status = stream.Synchronize();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(status, "CudaStream::Synchronize on an empty handle")) << status;
}

TEST(CudaEventTest, Methods_EmptyHandle_FailedPrecondition) {
  CudaEvent event;
  EXPECT_FALSE(event.valid());
  const absl::Status record = event.Record(nullptr);
  EXPECT_EQ(record.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(record, "CudaEvent::Record on an empty handle")) << record;
  EXPECT_EQ(event.StreamWait(nullptr).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(event.Synchronize().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(event.Query().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PinnedBufferTest, Create_NullAllocator_InvalidArgument) {
  const absl::Status status = PinnedBuffer::Create(nullptr, 4).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "allocator is null")) << status;
}

TEST(PinnedBufferTest, Create_NegativeSize_InvalidArgument) {
  MallocRawAllocator raw;
  CachingAllocator allocator(&raw);
  const absl::Status status = PinnedBuffer::Create(&allocator, -2).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "PinnedBuffer size -2")) << status;
}

TEST(PinnedBufferTest, Create_ZeroSize_EmptyWithoutAllocation) {
  MallocRawAllocator raw;
  CachingAllocator allocator(&raw);
  absl::StatusOr<PinnedBuffer> buffer = PinnedBuffer::Create(&allocator, 0);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(buffer->data(), nullptr);
  EXPECT_EQ(buffer->size(), 0);
  EXPECT_EQ(allocator.GetStats().raw_allocations, 0);
  EXPECT_TRUE(buffer->CopyToDeviceAsync(nullptr, 0, nullptr).ok());
}

TEST(PinnedBufferTest, Copies_BadArguments_InvalidArgument) {
  MallocRawAllocator raw;
  CachingAllocator allocator(&raw);
  absl::StatusOr<PinnedBuffer> buffer = PinnedBuffer::Create(&allocator, 4);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(allocator.GetStats().bytes_in_use, 512u);
  float device_stand_in = 0.0f;  // never dereferenced: the checks fail first
  const absl::Status too_many = buffer->CopyToDeviceAsync(&device_stand_in, 5, nullptr);
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(too_many, "CopyToDeviceAsync: 5 elements requested, buffer holds 4"))
      << too_many;
  const absl::Status null_device = buffer->CopyFromDeviceAsync(nullptr, 2, nullptr);
  EXPECT_EQ(null_device.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(null_device, "CopyFromDeviceAsync: device pointer is null")) << null_device;
}

TEST(PinnedBufferTest, Move_MovedFrom_Empty) {
  MallocRawAllocator raw;
  CachingAllocator allocator(&raw);
  absl::StatusOr<PinnedBuffer> buffer = PinnedBuffer::Create(&allocator, 8);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  float* data = buffer->data();
  PinnedBuffer moved = std::move(*buffer);
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(moved.size(), 8);
  EXPECT_EQ(buffer->data(), nullptr);
  EXPECT_EQ(buffer->size(), 0);
}

class StreamCudaTest : public testing::CudaTest {};

// A copy on stream `copy` that waits on an event recorded after a memset on
// stream `fill` sees the memset's zeros, not the ones written before it. The
// buffer is large so that, without the wait, the copy would overtake.
TEST_F(StreamCudaTest, StreamWait_CopyAfterMemsetOnOtherStream_SeesMemset) {
  constexpr int64_t kN = int64_t{1} << 22;
  auto device = DeviceBuffer<float>::FromHost(std::vector<float>(kN, 1.0f));
  ASSERT_TRUE(device.ok()) << device.status();
  // The non-blocking streams below do not order behind the legacy stream.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto fill = CudaStream::Create();
  auto copy = CudaStream::Create();
  auto filled = CudaEvent::Create();
  auto host = PinnedBuffer::Create(kN);
  ASSERT_TRUE(fill.ok() && copy.ok() && filled.ok() && host.ok());
  ASSERT_EQ(cudaMemsetAsync(device->data(), 0, kN * sizeof(float), fill->get()), cudaSuccess);
  ASSERT_TRUE(filled->Record(fill->get()).ok());
  ASSERT_TRUE(filled->StreamWait(copy->get()).ok());
  ASSERT_TRUE(host->CopyFromDeviceAsync(device->data(), kN, copy->get()).ok());
  ASSERT_TRUE(copy->Synchronize().ok());
  int64_t nonzero = 0;
  for (float value : host->span()) nonzero += value != 0.0f;
  EXPECT_EQ(nonzero, 0);
  absl::StatusOr<bool> done = filled->Query();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(*done);
}

TEST_F(StreamCudaTest, PinnedBuffer_HostDeviceHost_RoundTrip) {
  const std::vector<float> values = testing::RandomNormal(/*seed=*/6, 1000, 0.0f, 1.0f);
  auto stream = CudaStream::Create();
  auto device = DeviceBuffer<float>::Create(1000);
  auto in = PinnedBuffer::Create(1000);
  auto out = PinnedBuffer::Create(1000);
  ASSERT_TRUE(stream.ok() && device.ok() && in.ok() && out.ok());
  std::copy(values.begin(), values.end(), in->data());
  ASSERT_TRUE(in->CopyToDeviceAsync(device->data(), 1000, stream->get()).ok());
  ASSERT_TRUE(out->CopyFromDeviceAsync(device->data(), 1000, stream->get()).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(std::vector<float>(out->data(), out->data() + 1000), values);
}

TEST_F(StreamCudaTest, CachingAllocator_OverCudaMallocFreeThenAllocate_ReusesBlock) {
  CudaDeviceRawAllocator raw;
  CachingAllocator allocator(&raw);
  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  absl::StatusOr<void*> first = allocator.Allocate(1 << 20, stream->id());
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(cudaMemsetAsync(*first, 0, 1 << 20, stream->get()), cudaSuccess);
  allocator.Free(*first);  // the memset may still run: reuse stays on this stream
  absl::StatusOr<void*> second = allocator.Allocate(1 << 20, stream->id());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, *first);
  EXPECT_EQ(allocator.GetStats().raw_allocations, 1);
  EXPECT_EQ(allocator.GetStats().cache_hits, 1);
  allocator.Free(*second);
  ASSERT_TRUE(stream->Synchronize().ok());
}

// A destroyed stream's cached scratch and pinned blocks go back to CUDA:
// a backend made per profile request left its blocks cached under a
// handle no later request asks for.
TEST_F(StreamCudaTest, DestroyedStream_ItsCachedScratchAndPinnedBlocksReleased) {
  absl::StatusOr<CachingAllocator*> scratch = DeviceScratchCachingAllocator();
  ASSERT_TRUE(scratch.ok()) << scratch.status();
  CachingAllocator& pinned = PinnedHostCachingAllocator();
  const size_t scratch_before = (*scratch)->GetStats().bytes_cached;
  const size_t pinned_before = pinned.GetStats().bytes_cached;
  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  absl::StatusOr<void*> device = (*scratch)->Allocate(8 << 20, stream->id());
  absl::StatusOr<void*> host = pinned.Allocate(1 << 20, stream->id());
  ASSERT_TRUE(device.ok() && host.ok());
  (*scratch)->Free(*device);
  pinned.Free(*host);
  EXPECT_GE((*scratch)->GetStats().bytes_cached, scratch_before + (8 << 20));
  *stream = CudaStream();  // destroyed
  EXPECT_EQ((*scratch)->GetStats().bytes_cached, scratch_before);
  EXPECT_EQ(pinned.GetStats().bytes_cached, pinned_before);
}

TEST_F(StreamCudaTest, CudaDeviceRawAllocator_MoreThanTheDevice_ResourceExhausted) {
  CudaDeviceRawAllocator raw;
  const absl::Status status = raw.Allocate(size_t{1} << 50).status();  // 1 PiB
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cleared for later launch checks
}

}  // namespace
}  // namespace pipetrain
