#include "kernels/cuda/emulation/warp_emulation.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "kernels/compress/fp16_codec.h"

thread_local EmulatedDim3 threadIdx, blockIdx, gridDim, blockDim;

__nv_bfloat16 __float2bfloat16_rn(float value) {
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  if (std::isnan(value)) return {static_cast<uint16_t>(sign | 0x7fc0)};  // NaN stays NaN
  uint16_t bits = 0;
  // The bf16 codec's rounding; beyond bf16's range: the signed infinity.
  if (!pipetrain::FloatToBf16(value, &bits)) bits = sign | 0x7f80;
  return {bits};
}

float __bfloat162float(__nv_bfloat16 value) { return pipetrain::Bf16ToFloat(value.bits); }

namespace pipetrain {
namespace cuda_emulation {
namespace {

constexpr int kWarpSize = 32;

// Waits until `count` threads have arrived; reusable (a generation count).
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  const int count_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

// What a warp's lanes exchange: written by each lane for itself between
// two barriers of the warp, read by every lane after the first.
struct Warp {
  Barrier barrier{kWarpSize};
  float shuffle[kWarpSize];
  uint32_t a[kWarpSize][4];
  uint32_t b[kWarpSize][2];
};

struct Block {
  Block(int threads, size_t shared_bytes)
      : barrier(threads),
        warps(static_cast<size_t>(threads / kWarpSize)),
        shared(new (std::align_val_t(128)) unsigned char[std::max<size_t>(shared_bytes, 1)]) {
    // Exactly the bytes asked for, so ASan sees a kernel reading past them.
    std::memset(shared.get(), 0xff, shared_bytes);
  }
  struct AlignedDelete {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t(128)); }
  };
  Barrier barrier;
  std::vector<Warp> warps;
  std::unique_ptr<unsigned char[], AlignedDelete> shared;
};

thread_local Block* current_block = nullptr;

int Lane() { return static_cast<int>(threadIdx.x % kWarpSize); }
Warp& ThisWarp() { return current_block->warps[threadIdx.x / kWarpSize]; }

// A 32-bit register's two bf16: element 0 in the low half, 1 in the high.
float Half(uint32_t reg, int element) {
  return __bfloat162float({static_cast<uint16_t>(element == 0 ? reg & 0xffffu : reg >> 16)});
}

}  // namespace

unsigned char* DynamicSharedMemory() { return current_block->shared.get(); }

// The fragments, from the PTX ISA's tables for mma.m16n8k16 (.bf16 A and
// B, .f32 C and D), with groupID = lane >> 2 and threadID_in_group =
// lane % 4; a register holds elements 2r (low half) and 2r + 1 (high):
//   A element i (0..7): row groupID for i in {0, 1, 4, 5}, else groupID + 8;
//                       col threadID_in_group * 2 + (i & 1), + 8 for i >= 4.
//   B element i (0..3): row threadID_in_group * 2 + (i & 1), + 8 for i >= 2;
//                       col groupID.
//   C, D element i (0..3): row groupID for i < 2, else groupID + 8;
//                          col threadID_in_group * 2 + (i & 1).
void MmaM16N8K16Bf16F32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Warp& warp = ThisWarp();
  const int lane = Lane();
  std::memcpy(warp.a[lane], a, sizeof(a));
  warp.b[lane][0] = b0;
  warp.b[lane][1] = b1;
  warp.barrier.Wait();
  float A[16][16], B[16][8];
  for (int l = 0; l < kWarpSize; ++l) {
    const int group = l >> 2, in_group = l % 4;
    for (int i = 0; i < 8; ++i) {
      const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
      const int col = in_group * 2 + (i & 1) + (i >= 4 ? 8 : 0);
      A[row][col] = Half(warp.a[l][i / 2], i % 2);
    }
    for (int i = 0; i < 4; ++i) {
      const int row = in_group * 2 + (i & 1) + (i >= 2 ? 8 : 0);
      B[row][group] = Half(warp.b[l][i / 2], i % 2);
    }
  }
  const int group = lane >> 2, in_group = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = i < 2 ? group : group + 8, col = in_group * 2 + (i & 1);
    double sum = d[i];  // bf16 products are exact in double; one rounding at the end
    for (int k = 0; k < 16; ++k) sum += double{A[row][k]} * B[k][col];
    d[i] = static_cast<float>(sum);
  }
  warp.barrier.Wait();  // every lane has read the slots before they are reused
}

void LaunchEmulated(unsigned grid_x, unsigned grid_y, int threads, size_t shared_bytes,
                    const std::function<void()>& kernel) {
  if (threads <= 0 || threads % kWarpSize != 0) {  // a test's own mistake: stop it there
    std::fprintf(stderr, "LaunchEmulated: %d threads, not a positive multiple of 32\n", threads);
    std::abort();
  }
  // One std::thread per CUDA thread for the whole launch (not per block:
  // creating them dominated the emulation's time). Each runs its thread of
  // every block in turn; between blocks all of them wait, and thread 0
  // fills the shared memory with 0xff bytes again, as a fresh block's.
  Block block(threads, shared_bytes);
  std::vector<std::thread> lanes;
  lanes.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    lanes.emplace_back([&, t] {
      threadIdx = {static_cast<unsigned>(t), 0, 0};
      gridDim = {grid_x, grid_y, 1};
      blockDim = {static_cast<unsigned>(threads), 1, 1};
      current_block = &block;
      for (unsigned y = 0; y < grid_y; ++y) {
        for (unsigned x = 0; x < grid_x; ++x) {
          blockIdx = {x, y, 0};
          kernel();
          block.barrier.Wait();  // the block's every thread is done
          if (t == 0) std::memset(block.shared.get(), 0xff, shared_bytes);
          block.barrier.Wait();  // before the next block starts
        }
      }
    });
  }
  for (std::thread& lane : lanes) lane.join();
}

}  // namespace cuda_emulation
}  // namespace pipetrain

void __syncthreads() { pipetrain::cuda_emulation::current_block->barrier.Wait(); }

float __shfl_xor_sync(unsigned /*mask*/, float value, int lane_mask) {
  using namespace pipetrain::cuda_emulation;
  Warp& warp = ThisWarp();
  const int lane = Lane();
  warp.shuffle[lane] = value;
  warp.barrier.Wait();
  const float other = warp.shuffle[(lane ^ lane_mask) % kWarpSize];
  warp.barrier.Wait();
  return other;
}
