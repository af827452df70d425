// A CPU stand-in for the few CUDA features some of our kernels use (the
// mma.sync flash kernels, flash_attention_mma_kernels.cuh; the
// cross-entropy's, cross_entropy_kernels.cuh; the multi-tensor passes',
// multi_tensor_kernels.cuh), so those kernels' own source
// runs on a machine without a GPU: every CUDA thread of a block is a
// std::thread, __syncthreads a barrier of the block, __shfl_xor_sync and
// mma.sync exchanges through the warp's shared slots between two barriers
// of the warp, and __nv_bfloat16 a 16-bit value rounded to nearest even.
//
// What this checks, and what it does not: the kernels' indexing (tiles,
// strides, masks, fragment loads and stores, the online softmax, which lane
// holds which element) against the CPU reference, with mma.sync's fragment
// layouts taken from the PTX ISA ("Matrix Fragments for mma.m16n8k16 with
// floating point type", .bf16 A and B, .f32 C and D) and written here
// independently of the kernels' own comments. Not checked: anything the
// hardware adds (shared memory size limits, bank conflicts, registers,
// occupancy, the tensor cores' own accumulation order; the emulated mma
// sums exactly in double and rounds once). So a kernel that passes here
// can still fail on a GPU, but not for an indexing reason.
//
// Include this (with PIPETRAIN_CUDA_EMULATION defined) before a kernel
// source that follows these rules: no early return of some threads of a
// block before a barrier (the barrier would wait for them), every
// warp-wide call made by all 32 lanes, dynamic shared memory declared with
// PIPETRAIN_DYNAMIC_SHARED_MEMORY, and the mma through
// MmaM16N8K16Bf16F32. Test-only: it defines CUDA's reserved names.
//
// Where the emulation differs from the GPU in arithmetic: nvcc fuses a * b
// + c into one rounding unless told not to (__fmul_rn); compiled with
// -ffp-contract=off, the emulation never fuses. So kernels agree with the
// GPU to rounding, not bitwise, and tests compare within tolerances.
#ifndef PIPETRAIN_KERNELS_CUDA_EMULATION_WARP_EMULATION_H_
#define PIPETRAIN_KERNELS_CUDA_EMULATION_WARP_EMULATION_H_

#ifndef PIPETRAIN_CUDA_EMULATION
#error "define PIPETRAIN_CUDA_EMULATION before including warp_emulation.h"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>

// The CUDA qualifiers the kernels use, as plain C++.
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __align__(bytes) alignas(bytes)
// Blocks run one at a time, so a function-static array is the running
// block's shared memory (left as the previous block left it, as shared
// memory's contents are undefined at a block's start).
#define __shared__ static
#define PIPETRAIN_DYNAMIC_SHARED_MEMORY(name) \
  unsigned char* name = ::pipetrain::cuda_emulation::DynamicSharedMemory()

struct EmulatedDim3 {
  unsigned x = 0, y = 0, z = 0;
};
// This thread's indices in its block and grid (set by LaunchEmulated).
extern thread_local EmulatedDim3 threadIdx, blockIdx, gridDim, blockDim;

// bf16 as the kernels see it: the upper 16 bits of a float.
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __nv_bfloat162 {  // .x at the lower address: a 32-bit word's low half
  __nv_bfloat16 x, y;
};
__nv_bfloat16 __float2bfloat16_rn(float value);  // to nearest, ties to even
float __bfloat162float(__nv_bfloat16 value);
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return {__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 value) { return value.bits; }

// CUDA's 16-byte vector types, as the kernels load and store them.
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};

// Rounded products and sums with no fusing: plain IEEE operations, when
// the including file is compiled with -ffp-contract=off (the emulation
// tests' copts).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }

void __syncthreads();
// The value `value` of lane (this lane ^ lane_mask); every lane of the warp
// must call it (mask must be 0xffffffff).
float __shfl_xor_sync(unsigned mask, float value, int lane_mask);

namespace pipetrain {
namespace cuda_emulation {

// The block's dynamic shared memory (LaunchEmulated's shared_bytes, filled
// with 0xff bytes, a NaN in every float and bf16, before the block starts).
unsigned char* DynamicSharedMemory();

// d = a b + c for the warp's 16 x 8 x 16 tile, as mma.sync.aligned.
// m16n8k16.row.col.f32.bf16.bf16.f32 with d and c the same registers: each
// lane passes its fragments in the PTX ISA's layout (described in
// warp_emulation.cc, where they are assembled); every lane must call it.
void MmaM16N8K16Bf16F32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

// Runs `kernel` for every block of grid (grid_x, grid_y), one block at a
// time in ascending (y, x) order, with `threads` threads (a multiple of 32)
// of a std::thread each (the same threads for every block of the launch)
// and `shared_bytes` of dynamic shared memory, filled with 0xff bytes
// before each block.
void LaunchEmulated(unsigned grid_x, unsigned grid_y, int threads, size_t shared_bytes,
                    const std::function<void()>& kernel);

}  // namespace cuda_emulation
}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_EMULATION_WARP_EMULATION_H_
