// FlashKernel::kMma's launches (flash_attention_mma.h); the kernels, and
// why they are built as they are, in flash_attention_mma_kernels.cuh.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_mma.h"
#include "kernels/cuda/flash_attention_mma_kernels.cuh"
#include "kernels/cuda/flash_attention_tiles.cuh"

namespace pipetrain {
namespace {

using flash_tiles::Launch;
using flash_tiles::Tiles;
using flash_tiles::WithPaddedHeadDim;

float Scale(int hd) { return 1.0f / std::sqrt(static_cast<float>(hd)); }  // as the CPU

}  // namespace

absl::Status FlashMmaForward(const float* qkv, int batch, int seq_len, int c, int heads, float* out,
                             float* lse, cudaStream_t stream) {
  const int hd = c / heads;
  return WithPaddedHeadDim(hd, [&](auto hdp) {
    constexpr int kHdp = decltype(hdp)::value;
    return Launch("MmaForwardKernel", MmaForwardKernel<kHdp>, ForwardSharedBytes<kHdp>(),
                  batch * heads, Tiles(seq_len), stream, qkv, seq_len, c, heads, hd, Scale(hd), out,
                  lse);
  });
}

absl::Status FlashMmaGradients(const float* qkv, const float* dout, const float* lse,
                               const float* row_dots, int batch, int seq_len, int c, int heads,
                               float* dqkv, cudaStream_t stream) {
  const int hd = c / heads, tiles = Tiles(seq_len);
  return WithPaddedHeadDim(hd, [&](auto hdp) -> absl::Status {
    constexpr int kHdp = decltype(hdp)::value;
    const absl::Status keys = Launch(
        "MmaKeyGradKernel", MmaKeyGradKernel<kHdp>, KeyGradSharedBytes<kHdp>(), batch * heads,
        tiles, stream, qkv, dout, lse, row_dots, seq_len, c, heads, hd, Scale(hd), tiles, dqkv);
    if (!keys.ok()) return keys;
    return Launch("MmaQueryGradKernel", MmaQueryGradKernel<kHdp>, QueryGradSharedBytes<kHdp>(),
                  batch * heads, tiles, stream, qkv, dout, lse, row_dots, seq_len, c, heads, hd,
                  Scale(hd), dqkv);
  });
}

}  // namespace pipetrain
