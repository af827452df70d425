// Device side of flash_attention.h: tiles of 64 queries and 64 keys, four
// warps per block, each warp owning 16 rows of its block's tile, products
// on bf16 tensor cores through WMMA (16 x 16 x 16 fragments, fp32
// accumulators). A warp reads and writes only its own rows of the score,
// probability and accumulator tiles, so only the shared q/k/v/dout tiles
// need block barriers.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_mma.h"
#include "kernels/cuda/flash_attention_tiles.cuh"

namespace pipetrain {
namespace {

namespace wmma = nvcuda::wmma;
using Bf16 = __nv_bfloat16;

using flash_tiles::HeadSlices;
using flash_tiles::kThreads;
using flash_tiles::kTile;
using flash_tiles::kWarps;
using flash_tiles::Launch;
using flash_tiles::LoadRowStats;
using flash_tiles::Slices;
using flash_tiles::Tiles;
using flash_tiles::WithPaddedHeadDim;

constexpr int kFrag = 16;  // WMMA's bf16 fragment: 16 x 16, k = 16 (a warp's 16 rows)
static_assert(kFrag == flash_tiles::kWarpRows);
constexpr int kMaxTiles = 65535;  // gridDim.y

// Row strides in elements. WMMA wants a multiple of 8 (bf16) or 4 (float)
// and 32-byte aligned fragment starts; the extra columns spread a column's
// elements over the shared-memory banks.
constexpr int kLdScore = kTile + 4;  // float [rows][64 keys or queries]
constexpr int kLdProb = kTile + 8;   // bf16 [rows][64]
template <int kHdp>
struct Ld {
  static constexpr int kBf16 = kHdp + 8;   // bf16 q, k, v, dout tiles [64][kHdp]
  static constexpr int kFloat = kHdp + 4;  // float [rows][kHdp] staging
};

using FragA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, Bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, Bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, Bf16, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

// Butterfly reductions: every lane ends with the same value (IEEE addition
// and max are commutative), in a fixed order.
__device__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// tile[r][d] = bf16(base[(row0 + r) * row_stride + d]) for the block's 64
// rows, zero past seq_len or head_dim (zeros add nothing to the products).
template <int kHdp>
__device__ void LoadTile(const float* base, int64_t row_stride, int row0, int seq_len, int hd,
                         Bf16* tile) {
  for (int i = threadIdx.x; i < kTile * kHdp; i += kThreads) {
    const int r = i / kHdp, d = i % kHdp, t = row0 + r;
    const float v = (t < seq_len && d < hd) ? base[int64_t{t} * row_stride + d] : 0.0f;
    tile[r * Ld<kHdp>::kBf16 + d] = __float2bfloat16_rn(v);
  }
}

// One warp: dst[16][64] (stride kLdScore) = a[16][kHdp] b[64][kHdp]^T, with
// a and b bf16 rows of stride Ld::kBf16 (b^T read as a column-major
// matrix_b).
template <int kHdp>
__device__ void WarpProductNT(const Bf16* a, const Bf16* b, float* dst) {
  constexpr int ld = Ld<kHdp>::kBf16;
  for (int j = 0; j < kTile / kFrag; ++j) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < kHdp / kFrag; ++kk) {
      FragA fa;
      FragBCol fb;
      wmma::load_matrix_sync(fa, a + kk * kFrag, ld);
      wmma::load_matrix_sync(fb, b + j * kFrag * ld + kk * kFrag, ld);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(dst + j * kFrag, acc, kLdScore, wmma::mem_row_major);
  }
}

// One warp: acc[16][kHdp] += p[16][64] (stride kLdProb) m[64][kHdp]
// (stride Ld::kBf16).
template <int kHdp>
__device__ void WarpProductNN(const Bf16* p, const Bf16* m, FragAcc (&acc)[kHdp / kFrag]) {
  constexpr int ld = Ld<kHdp>::kBf16;
  for (int kk = 0; kk < kTile / kFrag; ++kk) {
    FragA fa;
    wmma::load_matrix_sync(fa, p + kk * kFrag, kLdProb);
    for (int n = 0; n < kHdp / kFrag; ++n) {
      FragBRow fb;
      wmma::load_matrix_sync(fb, m + kk * kFrag * ld + n * kFrag, ld);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// One warp writes acc[16][kHdp] to dst's rows row0.. (a [batch, seq_len,
// row_stride] matrix at this head's column), through `stage` (16 rows of
// stride Ld::kFloat, the warp's own), skipping rows past seq_len and
// columns past hd.
template <int kHdp>
__device__ void WarpStoreRows(FragAcc (&acc)[kHdp / kFrag], float* stage, float* dst,
                              int64_t row_stride, int row0, int seq_len, int hd, int lane) {
  constexpr int ldf = Ld<kHdp>::kFloat;
  __syncwarp();  // the stage's earlier readers are done
  for (int n = 0; n < kHdp / kFrag; ++n) {
    wmma::store_matrix_sync(stage + n * kFrag, acc[n], ldf, wmma::mem_row_major);
  }
  __syncwarp();
  for (int i = lane; i < kFrag * kHdp; i += 32) {
    const int r = i / kHdp, d = i % kHdp, t = row0 + r;
    if (t < seq_len && d < hd) dst[int64_t{t} * row_stride + d] = stage[r * ldf + d];
  }
}

template <int kHdp>
constexpr size_t ForwardSharedBytes() {
  return 3 * size_t{kTile} * Ld<kHdp>::kBf16 * sizeof(Bf16) +    // q, k, v
         size_t{kTile} * kLdScore * sizeof(float) +              // scores
         size_t{kTile} * kLdProb * sizeof(Bf16) +                // probabilities
         2 * size_t{kTile} * Ld<kHdp>::kFloat * sizeof(float) +  // O, P v
         3 * size_t{kTile} * sizeof(float);                      // max, sum, rescale
}

// Grid (batch * heads, query tiles); eq. of flash_attention.h's forward.
template <int kHdp>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(const float* qkv, int seq_len, int c, int heads, int hd, float scale,
                       float* out, float* lse) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ldb = Ld<kHdp>::kBf16, ldf = Ld<kHdp>::kFloat;
  Bf16* q_tile = reinterpret_cast<Bf16*>(smem);
  Bf16* k_tile = q_tile + kTile * ldb;
  Bf16* v_tile = k_tile + kTile * ldb;
  float* scores = reinterpret_cast<float*>(v_tile + kTile * ldb);
  Bf16* probs = reinterpret_cast<Bf16*>(scores + kTile * kLdScore);
  float* o_acc = reinterpret_cast<float*>(probs + kTile * kLdProb);
  float* pv = o_acc + kTile * ldf;
  float* row_max = pv + kTile * ldf;
  float* row_sum = row_max + kTile;
  float* row_rescale = row_sum + kTile;

  const int q_tile_index = blockIdx.y, q0 = q_tile_index * kTile;
  const HeadSlices at = Slices(blockIdx.x, seq_len, c, heads, hd);
  const int64_t width = 3 * int64_t{c};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rows0 = warp * kFrag;

  LoadTile<kHdp>(qkv + at.qkv_offset, width, q0, seq_len, hd, q_tile);
  for (int i = threadIdx.x; i < kTile * ldf; i += kThreads) o_acc[i] = 0.0f;
  for (int r = threadIdx.x; r < kTile; r += kThreads) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.0f;
  }
  // Causal, with equal tile sizes: key tiles up to the diagonal one. Key 0
  // is in tile 0 and visible to every query, so every row's max is finite
  // from the first tile on (no inf - inf below).
  for (int kt = 0; kt <= q_tile_index; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's readers are done; q's loads seen
    LoadTile<kHdp>(qkv + at.qkv_offset + c, width, k0, seq_len, hd, k_tile);
    LoadTile<kHdp>(qkv + at.qkv_offset + 2 * int64_t{c}, width, k0, seq_len, hd, v_tile);
    __syncthreads();
    float* s = scores + rows0 * kLdScore;
    WarpProductNT<kHdp>(q_tile + rows0 * ldb, k_tile, s);
    __syncwarp();
    // Online softmax, one row at a time, two keys per lane.
    for (int r = 0; r < kFrag; ++r) {
      const int row = rows0 + r, t = q0 + row;
      float x[2];
      float tile_max = -INFINITY;
      for (int half = 0; half < 2; ++half) {
        const int col = lane + 32 * half, key = k0 + col;
        x[half] = (key <= t && key < seq_len) ? s[r * kLdScore + col] * scale : -INFINITY;
        tile_max = fmaxf(tile_max, x[half]);
      }
      const float m_old = row_max[row];
      const float m_new = fmaxf(m_old, WarpMax(tile_max));
      float sum = 0.0f;
      for (int half = 0; half < 2; ++half) {
        const Bf16 p = __float2bfloat16_rn(expf(x[half] - m_new));  // masked: exp(-inf) = 0
        probs[row * kLdProb + lane + 32 * half] = p;
        sum += __bfloat162float(p);  // l sums what P v uses: out stays a convex mix
      }
      sum = WarpSum(sum);
      // Every lane has read row_max[row] (m_old) before lane 0 replaces it:
      // a shuffle orders no memory, and compute-sanitizer's racecheck
      // reported this read/write pair on an H200 without the barrier.
      __syncwarp();
      if (lane == 0) {
        const float rescale = expf(m_old - m_new);  // 0 on the first tile
        row_rescale[row] = rescale;
        row_sum[row] = row_sum[row] * rescale + sum;
        row_max[row] = m_new;
      }
    }
    __syncwarp();
    FragAcc acc[kHdp / kFrag];
    for (int n = 0; n < kHdp / kFrag; ++n) wmma::fill_fragment(acc[n], 0.0f);
    WarpProductNN<kHdp>(probs + rows0 * kLdProb, v_tile, acc);
    for (int n = 0; n < kHdp / kFrag; ++n) {
      wmma::store_matrix_sync(pv + rows0 * ldf + n * kFrag, acc[n], ldf, wmma::mem_row_major);
    }
    __syncwarp();
    for (int i = lane; i < kFrag * kHdp; i += 32) {
      const int row = rows0 + i / kHdp, d = i % kHdp;
      o_acc[row * ldf + d] = o_acc[row * ldf + d] * row_rescale[row] + pv[row * ldf + d];
    }
    __syncwarp();
  }
  for (int i = lane; i < kFrag * kHdp; i += 32) {
    const int row = rows0 + i / kHdp, d = i % kHdp, t = q0 + row;
    if (t < seq_len && d < hd) {
      out[at.out_offset + int64_t{t} * c + d] = o_acc[row * ldf + d] / row_sum[row];
    }
  }
  if (lane < kFrag) {
    const int row = rows0 + lane, t = q0 + row;
    if (t < seq_len) lse[at.stats_offset + t] = row_max[row] + logf(row_sum[row]);
  }
}

// D = rowsum(dout * out), one warp per (batch, head, position) row, grid
// stride (the loop's bounds are the same for a warp's lanes).
__global__ void RowDotsKernel(const float* out, const float* dout, int64_t rows, int seq_len, int c,
                              int heads, int hd, float* row_dots) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * blockDim.x / 32;
  for (int64_t row = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32; row < rows;
       row += warps) {
    const int t = static_cast<int>(row % seq_len);
    const int64_t bh = row / seq_len, b = bh / heads, h = bh % heads;
    const int64_t at = (b * seq_len + t) * c + h * hd;
    float sum = 0.0f;
    for (int d = lane; d < hd; d += 32) sum += out[at + d] * dout[at + d];
    sum = WarpSum(sum);
    if (lane == 0) row_dots[row] = sum;
  }
}

template <int kHdp>
constexpr size_t BackwardSharedBytes() {
  return 4 * size_t{kTile} * Ld<kHdp>::kBf16 * sizeof(Bf16) +     // q, dout, k, v
         2 * size_t{kTile} * sizeof(float) +                      // lse, D
         size_t{kWarps} * 2 * kFrag * kLdScore * sizeof(float) +  // S, dP per warp
         size_t{kWarps} * 2 * kFrag * kLdProb * sizeof(Bf16);     // P, dS per warp
}

// The backward kernels' shared memory, carved as BackwardSharedBytes says.
template <int kHdp>
struct BackwardShared {
  Bf16 *q, *dout, *k, *v;
  float *lse, *dots;
  float *scores, *dprobs;  // this warp's [16][kLdScore] each
  Bf16 *probs, *dscores;   // this warp's [16][kLdProb] each

  __device__ explicit BackwardShared(unsigned char* smem, int warp) {
    constexpr int ldb = Ld<kHdp>::kBf16;
    q = reinterpret_cast<Bf16*>(smem);
    dout = q + kTile * ldb;
    k = dout + kTile * ldb;
    v = k + kTile * ldb;
    lse = reinterpret_cast<float*>(v + kTile * ldb);
    dots = lse + kTile;
    scores = dots + kTile + warp * 2 * kFrag * kLdScore;
    dprobs = scores + kFrag * kLdScore;
    probs = reinterpret_cast<Bf16*>(dots + kTile + kWarps * 2 * kFrag * kLdScore) +
            warp * 2 * kFrag * kLdProb;
    dscores = probs + kFrag * kLdProb;
  }
};

// p = exp(s scale - lse) and ds = p (dp - D) scale where key <= query <
// seq_len, else 0, rounded to bf16. `transposed`: rows are keys and
// columns queries (the key kernel's S^T), else rows are queries.
__device__ void WarpGradScores(const float* s, const float* dp, const float* lse, const float* dots,
                               int row_first, int col_first, bool transposed, int seq_len,
                               float scale, int lane, Bf16* p_out, Bf16* ds_out) {
  for (int i = lane; i < kFrag * kTile; i += 32) {
    const int r = i / kTile, col = i % kTile;
    const int stat = transposed ? col : r;  // which query's statistics
    const int query = transposed ? col_first + col : row_first + r;
    const int key = transposed ? row_first + r : col_first + col;
    float p = 0.0f, ds = 0.0f;
    if (key <= query && query < seq_len) {
      p = expf(s[r * kLdScore + col] * scale - lse[stat]);
      ds = p * (dp[r * kLdScore + col] - dots[stat]) * scale;
    }
    if (p_out != nullptr) p_out[r * kLdProb + col] = __float2bfloat16_rn(p);
    ds_out[r * kLdProb + col] = __float2bfloat16_rn(ds);
  }
}

// Grid (batch * heads, key tiles): dk = dS^T q and dv = P^T dout for the
// tile's 64 keys, over the query tiles from the diagonal one on.
template <int kHdp>
__global__ void __launch_bounds__(kThreads)
    FlashKeyGradKernel(const float* qkv, const float* dout, const float* lse, const float* row_dots,
                       int seq_len, int c, int heads, int hd, float scale, int tiles, float* dqkv) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ldb = Ld<kHdp>::kBf16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rows0 = warp * kFrag;
  BackwardShared<kHdp> sh(smem, warp);
  const int k_tile_index = blockIdx.y, k0 = k_tile_index * kTile;
  const HeadSlices at = Slices(blockIdx.x, seq_len, c, heads, hd);
  const int64_t width = 3 * int64_t{c};
  LoadTile<kHdp>(qkv + at.qkv_offset + c, width, k0, seq_len, hd, sh.k);
  LoadTile<kHdp>(qkv + at.qkv_offset + 2 * int64_t{c}, width, k0, seq_len, hd, sh.v);
  FragAcc dk[kHdp / kFrag], dv[kHdp / kFrag];
  for (int n = 0; n < kHdp / kFrag; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (int qt = k_tile_index; qt < tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();  // the previous tile's readers are done; k, v's loads seen
    LoadTile<kHdp>(qkv + at.qkv_offset, width, q0, seq_len, hd, sh.q);
    LoadTile<kHdp>(dout + at.out_offset, c, q0, seq_len, hd, sh.dout);
    LoadRowStats(lse + at.stats_offset, q0, seq_len, sh.lse);
    LoadRowStats(row_dots + at.stats_offset, q0, seq_len, sh.dots);
    __syncthreads();
    WarpProductNT<kHdp>(sh.k + rows0 * ldb, sh.q, sh.scores);     // S^T [16 keys][64 queries]
    WarpProductNT<kHdp>(sh.v + rows0 * ldb, sh.dout, sh.dprobs);  // dP^T = v dout^T
    __syncwarp();
    WarpGradScores(sh.scores, sh.dprobs, sh.lse, sh.dots, k0 + rows0, q0, /*transposed=*/true,
                   seq_len, scale, lane, sh.probs, sh.dscores);
    __syncwarp();
    WarpProductNN<kHdp>(sh.probs, sh.dout, dv);  // dv += P^T dout
    WarpProductNN<kHdp>(sh.dscores, sh.q, dk);   // dk += dS^T q
  }
  // The warp's S and dP area (2 x 16 x kLdScore floats) holds a
  // [16][Ld::kFloat] stage for kHdp <= 128.
  float* stage = sh.scores;
  WarpStoreRows<kHdp>(dk, stage, dqkv + at.qkv_offset + c, width, k0 + rows0, seq_len, hd, lane);
  WarpStoreRows<kHdp>(dv, stage, dqkv + at.qkv_offset + 2 * int64_t{c}, width, k0 + rows0, seq_len,
                      hd, lane);
}

// Grid (batch * heads, query tiles): dq = dS k for the tile's 64 queries,
// over the key tiles up to the diagonal one.
template <int kHdp>
__global__ void __launch_bounds__(kThreads)
    FlashQueryGradKernel(const float* qkv, const float* dout, const float* lse,
                         const float* row_dots, int seq_len, int c, int heads, int hd, float scale,
                         float* dqkv) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ldb = Ld<kHdp>::kBf16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rows0 = warp * kFrag;
  BackwardShared<kHdp> sh(smem, warp);
  const int q_tile_index = blockIdx.y, q0 = q_tile_index * kTile;
  const HeadSlices at = Slices(blockIdx.x, seq_len, c, heads, hd);
  const int64_t width = 3 * int64_t{c};
  LoadTile<kHdp>(qkv + at.qkv_offset, width, q0, seq_len, hd, sh.q);
  LoadTile<kHdp>(dout + at.out_offset, c, q0, seq_len, hd, sh.dout);
  LoadRowStats(lse + at.stats_offset, q0, seq_len, sh.lse);
  LoadRowStats(row_dots + at.stats_offset, q0, seq_len, sh.dots);
  FragAcc dq[kHdp / kFrag];
  for (int n = 0; n < kHdp / kFrag; ++n) wmma::fill_fragment(dq[n], 0.0f);
  for (int kt = 0; kt <= q_tile_index; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();
    LoadTile<kHdp>(qkv + at.qkv_offset + c, width, k0, seq_len, hd, sh.k);
    LoadTile<kHdp>(qkv + at.qkv_offset + 2 * int64_t{c}, width, k0, seq_len, hd, sh.v);
    __syncthreads();
    WarpProductNT<kHdp>(sh.q + rows0 * ldb, sh.k, sh.scores);     // S [16 queries][64 keys]
    WarpProductNT<kHdp>(sh.dout + rows0 * ldb, sh.v, sh.dprobs);  // dP = dout v^T
    __syncwarp();
    WarpGradScores(sh.scores, sh.dprobs, sh.lse + rows0, sh.dots + rows0, q0 + rows0, k0,
                   /*transposed=*/false, seq_len, scale, lane, nullptr, sh.dscores);
    __syncwarp();
    WarpProductNN<kHdp>(sh.dscores, sh.k, dq);  // dq += dS k
  }
  WarpStoreRows<kHdp>(dq, sh.scores, dqkv + at.qkv_offset, width, q0 + rows0, seq_len, hd, lane);
}

absl::Status CheckShape(const char* op, int batch, int seq_len, int c, int heads) {
  if (batch < 0 || !FlashAttentionSupports(seq_len, c, heads)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": batch ", batch, ", seq_len ", seq_len, ", c ", c, ", heads ", heads,
                     " needs batch >= 0, seq_len in 1..", int64_t{kMaxTiles} * kTile,
                     ", heads >= 1 and c a positive multiple of heads with c / heads <= ",
                     kFlashAttentionMaxHeadDim));
  }
  if (int64_t{batch} * heads > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": batch * heads = ", int64_t{batch} * heads,
                                                   " exceeds the 2^31 - 1 grid limit"));
  }
  return absl::OkStatus();
}

template <int kHdp>
absl::Status Forward(const float* qkv, int batch, int seq_len, int c, int heads, float* out,
                     float* lse, cudaStream_t stream) {
  const int hd = c / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));  // as kernels/cpu/attention.cc
  return Launch("FlashForwardKernel", FlashForwardKernel<kHdp>, ForwardSharedBytes<kHdp>(),
                batch * heads, Tiles(seq_len), stream, qkv, seq_len, c, heads, hd, scale, out, lse);
}

template <int kHdp>
absl::Status Backward(const float* qkv, const float* out, const float* lse, const float* dout,
                      int batch, int seq_len, int c, int heads, float* dqkv, float* row_dots,
                      cudaStream_t stream, FlashKernel kernel) {
  const int hd = c / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t rows = int64_t{batch} * heads * seq_len;
  constexpr int kDotThreads = 256;  // 8 rows per block
  const int64_t dot_blocks = std::min<int64_t>((rows + 7) / 8, 65536);
  RowDotsKernel<<<static_cast<unsigned>(dot_blocks), kDotThreads, 0, stream>>>(
      out, dout, rows, seq_len, c, heads, hd, row_dots);
  CUDA_CHECK_LAUNCH("RowDotsKernel");
  if (kernel == FlashKernel::kMma) {
    return FlashMmaGradients(qkv, dout, lse, row_dots, batch, seq_len, c, heads, dqkv, stream);
  }
  const int tiles = Tiles(seq_len);
  const size_t shared = BackwardSharedBytes<kHdp>();
  RETURN_IF_ERROR(Launch("FlashKeyGradKernel", FlashKeyGradKernel<kHdp>, shared, batch * heads,
                         tiles, stream, qkv, dout, lse, row_dots, seq_len, c, heads, hd, scale,
                         tiles, dqkv));
  return Launch("FlashQueryGradKernel", FlashQueryGradKernel<kHdp>, shared, batch * heads, tiles,
                stream, qkv, dout, lse, row_dots, seq_len, c, heads, hd, scale, dqkv);
}

}  // namespace

bool FlashAttentionSupports(int seq_len, int c, int heads) {
  return seq_len >= 1 && heads >= 1 && c >= 1 && c % heads == 0 &&
         c / heads <= kFlashAttentionMaxHeadDim && Tiles(seq_len) <= kMaxTiles;
}

const char* FlashKernelName(FlashKernel kernel) {
  return kernel == FlashKernel::kMma ? "mma" : "wmma";
}

absl::StatusOr<FlashKernel> FlashKernelFromEnvironment() {
  const char* named = std::getenv("PIPETRAIN_FLASH_KERNEL");
  if (named == nullptr) return FlashKernel::kWmma;
  for (FlashKernel kernel : {FlashKernel::kWmma, FlashKernel::kMma}) {
    if (std::strcmp(named, FlashKernelName(kernel)) == 0) return kernel;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("PIPETRAIN_FLASH_KERNEL: \"", named, "\" is neither \"wmma\" nor \"mma\""));
}

absl::Status FlashAttentionForwardCuda(const float* qkv, int batch, int seq_len, int c, int heads,
                                       float* out, float* lse, cudaStream_t stream,
                                       FlashKernel kernel) {
  absl::Status valid = CheckShape("FlashAttentionForwardCuda", batch, seq_len, c, heads);
  if (!valid.ok() || batch == 0) return valid;
  if (kernel == FlashKernel::kMma) {
    return FlashMmaForward(qkv, batch, seq_len, c, heads, out, lse, stream);
  }
  return WithPaddedHeadDim(c / heads, [&](auto hdp) {
    return Forward<decltype(hdp)::value>(qkv, batch, seq_len, c, heads, out, lse, stream);
  });
}

absl::Status FlashAttentionBackwardCuda(const float* qkv, const float* out, const float* lse,
                                        const float* dout, int batch, int seq_len, int c, int heads,
                                        float* dqkv, float* row_dots, cudaStream_t stream,
                                        FlashKernel kernel) {
  absl::Status valid = CheckShape("FlashAttentionBackwardCuda", batch, seq_len, c, heads);
  if (!valid.ok() || batch == 0) return valid;
  return WithPaddedHeadDim(c / heads, [&](auto hdp) {
    return Backward<decltype(hdp)::value>(qkv, out, lse, dout, batch, seq_len, c, heads, dqkv,
                                          row_dots, stream, kernel);
  });
}

}  // namespace pipetrain
