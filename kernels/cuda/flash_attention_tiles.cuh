// What both sets of flash attention kernels share (flash_attention.cu's
// WMMA ones and flash_attention_mma.cu's mma.sync ones): the tiling (64
// queries or keys a tile, 4 warps of 16 rows), where a (batch, head)'s
// slices start, loading a tile's row statistics, and the host side's
// launch and head_dim dispatch. Header-only: the .cu files are compiled
// without relocatable device code (tools/cuda/cuda.bzl), so device code is
// shared by inclusion.
#ifndef PIPETRAIN_KERNELS_CUDA_FLASH_ATTENTION_TILES_CUH_
#define PIPETRAIN_KERNELS_CUDA_FLASH_ATTENTION_TILES_CUH_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"

// Without a GPU (kernels/cuda/emulation) only the device side is used.
#ifndef PIPETRAIN_CUDA_EMULATION
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_status.h"
#endif

namespace pipetrain {
namespace flash_tiles {

constexpr int kTile = 64;      // queries per query tile, keys per key tile
constexpr int kWarpRows = 16;  // a warp's rows of a tile (the fragments' M)
constexpr int kWarps = kTile / kWarpRows;
constexpr int kThreads = 32 * kWarps;

// Where a (batch, head)'s slices start: q at column h * hd of qkv's rows,
// k at c + h * hd, v at 2c + h * hd; out, dout at h * hd; its rows of lse
// and D.
struct HeadSlices {
  int64_t qkv_offset;  // q's first element
  int64_t out_offset;  // out's / dout's first element
  int64_t stats_offset;
};

__device__ inline HeadSlices Slices(int bh, int seq_len, int c, int heads, int hd) {
  const int b = bh / heads, h = bh % heads;
  return {int64_t{b} * seq_len * 3 * c + int64_t{h} * hd,
          int64_t{b} * seq_len * c + int64_t{h} * hd, int64_t{bh} * seq_len};
}

// stats[r] = row[row0 + r] * factor (0 past seq_len), for a tile's 64
// rows; every thread of the block calls it.
__device__ inline void LoadRowStats(const float* row, int row0, int seq_len, float* stats,
                                    float factor = 1.0f) {
  for (int r = threadIdx.x; r < kTile; r += kThreads) {
    stats[r] = row0 + r < seq_len ? row[row0 + r] * factor : 0.0f;
  }
}

inline int Tiles(int seq_len) { return (seq_len + kTile - 1) / kTile; }

#ifndef PIPETRAIN_CUDA_EMULATION
// Sets the kernel's dynamic shared memory limit (above the default 48 KiB
// for wide heads), then launches it with kThreads threads on grid
// (batch * heads, tiles).
template <typename Kernel, typename... Args>
absl::Status Launch(const char* name, Kernel kernel, size_t shared_bytes, int batch_heads,
                    int tiles, cudaStream_t stream, Args... args) {
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(shared_bytes)));
  kernel<<<dim3(static_cast<unsigned>(batch_heads), static_cast<unsigned>(tiles)), kThreads,
           shared_bytes, stream>>>(args...);
  CUDA_CHECK_LAUNCH(name);
  return absl::OkStatus();
}
#endif  // PIPETRAIN_CUDA_EMULATION

// run(std::integral_constant<int, P>{}) for head_dim hd (<= 128) padded to
// P, a multiple of the fragments' k16: the kernels' instantiation for it.
template <typename Run>
absl::Status WithPaddedHeadDim(int hd, Run run) {
  switch ((hd + 15) / 16 * 16) {
    case 16:
      return run(std::integral_constant<int, 16>{});
    case 32:
      return run(std::integral_constant<int, 32>{});
    case 48:
      return run(std::integral_constant<int, 48>{});
    case 64:
      return run(std::integral_constant<int, 64>{});
    case 80:
      return run(std::integral_constant<int, 80>{});
    case 96:
      return run(std::integral_constant<int, 96>{});
    case 112:
      return run(std::integral_constant<int, 112>{});
    default:
      return run(std::integral_constant<int, 128>{});
  }
}

}  // namespace flash_tiles
}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_FLASH_ATTENTION_TILES_CUH_
