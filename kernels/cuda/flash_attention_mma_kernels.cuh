// FlashKernel::kMma (flash_attention.h), the device side: the flash attention's tiles on
// bf16 tensor cores through mma.sync.m16n8k16, with the scores, the
// probabilities and the output accumulators in registers, as
// FlashAttention-2 keeps them. The WMMA kernels (flash_attention.cu) go
// through shared memory for every score tile, because a WMMA fragment's
// layout is unspecified, and an H200 ran them slower than cuBLAS's GEMM
// attention (docs/benchmarks.md). mma.sync's fragment layouts are fixed by
// the PTX ISA, so a warp can take the softmax of its scores where the
// product leaves them and feed the probabilities to the next product
// without a round trip.
//
// Tiles: 64 queries x 64 keys a block, 4 warps, each warp 16 rows. Every
// fragment is read from shared memory with 32-bit loads of two adjacent
// bf16 (no ldmatrix): a matrix_a fragment from a tile whose rows are the
// product's rows, a matrix_b fragment from a tile whose rows are the
// product's columns (K for S = Q K^T; V transposed for O = P V). So each
// tile is kept row-major, transposed, or both, as its products need.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16" with
// .bf16), for lane = 4 g + t (g = lane / 4, t = lane % 4):
//   A (16 x 16, row): reg0 = A[g][2t, 2t+1], reg1 = A[g+8][2t, 2t+1],
//                     reg2 = A[g][2t+8, 2t+9], reg3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, col):  reg0 = B[2t, 2t+1][g], reg1 = B[2t+8, 2t+9][g]
//   C, D (16 x 8 fp32): c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]
// (the lower-indexed element in a register's low 16 bits). So two
// adjacent n8 blocks of a C tile, rounded and packed in pairs, are the A
// fragment of the next product's k16 step: P = softmax(S) goes from the
// S = Q K^T accumulators straight into O += P V. A row's 16 values of a
// 64-wide tile sit in the 4 lanes of a quad (same g): row maxima and sums
// take two shuffles.
//
// The same three kernels as the WMMA ones (forward; dk and dv over key
// tiles; dq over query tiles), the same formulas (the exponentials taken in
// base 2: kLog2e below), roundings to bf16 and fixed summation orders:
// bitwise deterministic run to run. Query tiles
// start from the last (it sees every key tile), so the longest blocks run
// first.
//
// Device code only, included by flash_attention_mma.cu (the launches) and
// by kernels/cuda/emulation's test, which runs these kernels on the CPU
// through warp_emulation.h (PIPETRAIN_CUDA_EMULATION defined): the one
// place the mma instruction and the shared memory declaration differ.
#ifndef PIPETRAIN_KERNELS_CUDA_FLASH_ATTENTION_MMA_KERNELS_CUH_
#define PIPETRAIN_KERNELS_CUDA_FLASH_ATTENTION_MMA_KERNELS_CUH_

#ifdef PIPETRAIN_CUDA_EMULATION
#include "kernels/cuda/emulation/warp_emulation.h"
#else
#include <cuda_bf16.h>
#define PIPETRAIN_DYNAMIC_SHARED_MEMORY(name) extern __shared__ __align__(128) unsigned char name[]
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/flash_attention_tiles.cuh"

namespace pipetrain {
namespace {

using Bf16 = __nv_bfloat16;

using flash_tiles::HeadSlices;
using flash_tiles::kThreads;
using flash_tiles::kTile;
using flash_tiles::kWarpRows;
using flash_tiles::LoadRowStats;
using flash_tiles::Slices;

constexpr int kTileBlocks = kTile / 8;  // n8 blocks across a 64-wide tile
constexpr int kTileSteps = kTile / 16;  // k16 steps along a 64-long tile
constexpr int kLdCols = kTile + 8;      // row stride of a transposed tile [kHdp][64]

// The softmax runs in base 2, as FlashAttention-2's does: exp(x) =
// exp2(x log2 e), with log2 e folded into the scores' scale, so each
// probability costs one fma and one ex2 (expf adds about eight
// instructions of range reduction to its ex2). The log-sum-exp leaves and
// enters the kernels in natural-log units (flash_attention.h's contract).
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Row stride of a row-major tile [64][kHdp]. The 8 extra bf16 (4 words)
// put the 8 rows a fragment load touches in 8 different 4-bank groups.
template <int kHdp>
constexpr int kLdRows = kHdp + 8;

__device__ __forceinline__ uint32_t Load32(const Bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<uint32_t*>(&v);
}

// d += a b for one m16n8k16 tile, fp32 accumulation.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
#ifdef PIPETRAIN_CUDA_EMULATION
  cuda_emulation::MmaM16N8K16Bf16F32(d, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// The A fragment of rows [0, 16) and columns [k0, k0 + 16) of the
// row-major bf16 matrix m (row stride ld).
__device__ __forceinline__ void LoadA(const Bf16* m, int ld, int k0, int g, int t,
                                      uint32_t (&a)[4]) {
  a[0] = Load32(m + g * ld + k0 + 2 * t);
  a[1] = Load32(m + (g + 8) * ld + k0 + 2 * t);
  a[2] = Load32(m + g * ld + k0 + 2 * t + 8);
  a[3] = Load32(m + (g + 8) * ld + k0 + 2 * t + 8);
}

// The B fragment B[k][n] = m[n0 + n][k0 + k] (k < 16, n < 8): columns of
// the product are rows of m (row stride ld).
__device__ __forceinline__ void LoadB(const Bf16* m, int ld, int n0, int k0, int g, int t,
                                      uint32_t& b0, uint32_t& b1) {
  b0 = Load32(m + (n0 + g) * ld + k0 + 2 * t);
  b1 = Load32(m + (n0 + g) * ld + k0 + 2 * t + 8);
}

// The A fragment of k16 step `step` of a 16 x 64 tile held as n8 blocks
// of accumulators c[8][4], rounded to bf16.
__device__ __forceinline__ void PackA(const float (&c)[kTileBlocks][4], int step,
                                      uint32_t (&a)[4]) {
  a[0] = Pack(c[2 * step][0], c[2 * step][1]);
  a[1] = Pack(c[2 * step][2], c[2 * step][3]);
  a[2] = Pack(c[2 * step + 1][0], c[2 * step + 1][1]);
  a[3] = Pack(c[2 * step + 1][2], c[2 * step + 1][3]);
}

// s = a b^T for one warp: the 16 rows of a by the 64 rows of b (both
// row-major bf16 tiles of stride kLdRows, kHdp columns), as n8 blocks of
// accumulators.
template <int kHdp>
__device__ __forceinline__ void ScoreTile(const Bf16* a, const Bf16* b, int g, int t,
                                          float (&s)[kTileBlocks][4]) {
  constexpr int ld = kLdRows<kHdp>;
  for (auto& block : s) {
    for (float& v : block) v = 0.0f;
  }
  for (int kk = 0; kk < kHdp / 16; ++kk) {
    uint32_t fa[4];
    LoadA(a, ld, kk * 16, g, t, fa);
    for (int j = 0; j < kTileBlocks; ++j) {
      uint32_t b0, b1;
      LoadB(b, ld, j * 8, kk * 16, g, t, b0, b1);
      Mma(s[j], fa, b0, b1);
    }
  }
}

// acc += p m for one warp: p, 16 x 64 accumulators (ScoreTile's layout),
// rounded to bf16; m [64][kHdp] given transposed as cols [kHdp][kLdCols].
template <int kHdp>
__device__ __forceinline__ void AccumulateTile(const float (&p)[kTileBlocks][4], const Bf16* cols,
                                               int g, int t, float (&acc)[kHdp / 8][4]) {
  for (int step = 0; step < kTileSteps; ++step) {
    uint32_t a[4];
    PackA(p, step, a);
    for (int nb = 0; nb < kHdp / 8; ++nb) {
      uint32_t b0, b1;
      LoadB(cols, kLdCols, nb * 8, step * 16, g, t, b0, b1);
      Mma(acc[nb], a, b0, b1);
    }
  }
}

// op over the 4 lanes of a quad (a row's lanes), the same on each.
__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The block's 64 rows row0.. of base (row stride row_stride floats, hd
// columns) rounded to bf16, zero past seq_len or hd (zeros add nothing to
// the products): into `rows` as [64][kLdRows] and/or `cols` as the
// transpose [kHdp][kLdCols] (either may be null).
//
// Where base is 16-byte aligned and hd and row_stride are multiples of 4
// (GPT-2's heads: hd 64, rows of 2304 floats), each thread takes a pair of
// adjacent rows' 8 columns, [r, r + 1] x [d, d + 8), a quad at a time:
// two 16-byte loads (a warp reads each row's 32 bytes whole over the two
// quads), an 8-byte store per row into `rows` and, for `cols`, four 32-bit
// stores of (r, r + 1) pairs. The 32 lanes of a warp hold the tile's 32
// row pairs at one column octet, so those pairs land in 32 consecutive
// words: no bank conflict. Otherwise one value at a time, consecutive
// threads along a row.
template <int kHdp>
__device__ void LoadTile(const float* base, int64_t row_stride, int row0, int seq_len, int hd,
                         Bf16* rows, Bf16* cols) {
  constexpr int ld = kLdRows<kHdp>;
  static_assert(ld * sizeof(Bf16) % 8 == 0, "a row of `rows` starts 8-byte aligned");
  const bool vector =
      hd % 4 == 0 && row_stride % 4 == 0 && reinterpret_cast<uintptr_t>(base) % sizeof(float4) == 0;
  if (!vector) {
    // Not unrolled: next to the vector path, an unrolled copy of this loop
    // makes the key-gradient kernel at width 128 spill.
#pragma unroll 1
    for (int i = threadIdx.x; i < kTile * kHdp; i += kThreads) {
      const int r = i / kHdp, d = i % kHdp, token = row0 + r;
      const Bf16 v = __float2bfloat16_rn(
          (token < seq_len && d < hd) ? base[int64_t{token} * row_stride + d] : 0.0f);
      if (rows != nullptr) rows[r * ld + d] = v;
      if (cols != nullptr) cols[d * kLdCols + r] = v;
    }
    return;
  }
  constexpr int kPairs = kTile / 2;  // one a lane: kThreads is a multiple of it
  static_assert(kPairs == 32 && kThreads % kPairs == 0, "a warp's lanes hold the row pairs");
  for (int i = threadIdx.x; i < kPairs * (kHdp / 8); i += kThreads) {
    const int r = 2 * (i % kPairs), d0 = i / kPairs * 8;
    // A quad of columns at a time: 8 values live, not 16 (the key-gradient
    // kernel at width 128 has no registers to spare).
    for (int d = d0; d < d0 + 8; d += 4) {
      float v[2][4];  // rows r, r + 1; columns d..d + 3
      for (int h = 0; h < 2; ++h) {
        const int token = row0 + r + h;
        float4 f = {0.0f, 0.0f, 0.0f, 0.0f};
        if (token < seq_len && d < hd) {  // hd % 4 == 0: a quad is all in or all out
          f = *reinterpret_cast<const float4*>(base + int64_t{token} * row_stride + d);
        }
        v[h][0] = f.x;
        v[h][1] = f.y;
        v[h][2] = f.z;
        v[h][3] = f.w;
      }
      if (rows != nullptr) {
        for (int h = 0; h < 2; ++h) {
          const uint2 packed = {Pack(v[h][0], v[h][1]), Pack(v[h][2], v[h][3])};
          *reinterpret_cast<uint2*>(rows + (r + h) * ld + d) = packed;  // 8-byte aligned
        }
      }
      if (cols != nullptr) {
        for (int e = 0; e < 4; ++e) {
          *reinterpret_cast<uint32_t*>(cols + (d + e) * kLdCols + r) = Pack(v[0][e], v[1][e]);
        }
      }
    }
  }
}

// Writes a warp's 16 x kHdp accumulators acc[kHdp / 8][4] (rows `token`
// for c0, c1 and token + 8 for c2, c3) to dst's rows (stride row_stride),
// skipping rows at or past seq_len and columns past hd, each value divided
// by its row's divisor (1 for gradients).
template <int kHdp>
__device__ void StoreRows(const float (&acc)[kHdp / 8][4], const int (&token)[2],
                          const float (&divisor)[2], float* dst, int64_t row_stride, int seq_len,
                          int hd, int t) {
  for (int half = 0; half < 2; ++half) {
    if (token[half] >= seq_len) continue;
    float* row = dst + int64_t{token[half]} * row_stride;
    for (int nb = 0; nb < kHdp / 8; ++nb) {
      for (int e = 0; e < 2; ++e) {
        const int d = nb * 8 + 2 * t + e;
        if (d < hd) row[d] = acc[nb][2 * half + e] / divisor[half];
      }
    }
  }
}

// Where a thread stands, as every kernel starts: its place in the
// fragments (g = lane / 4, t = lane % 4: the layouts above), its warp's
// first row of the block's tile, the block's (batch, head) slices, and
// qkv's row stride.
struct Place {
  int g, t, rows0;
  HeadSlices at;
  int64_t width;
};

__device__ __forceinline__ Place PlaceOf(int seq_len, int c, int heads, int hd) {
  const int lane = threadIdx.x % 32;
  return {lane / 4, lane % 4, static_cast<int>(threadIdx.x / 32) * kWarpRows,
          Slices(blockIdx.x, seq_len, c, heads, hd), 3 * int64_t{c}};
}

// The block's query tile, counted from the last: it sees every key tile,
// so the longest blocks start first.
__device__ __forceinline__ int QueryTileFromLast() {
  return static_cast<int>(gridDim.y - 1 - blockIdx.y);
}

template <int kHdp>
constexpr size_t ForwardSharedBytes() {
  return (2 * size_t{kTile} * kLdRows<kHdp> + size_t{kHdp} * kLdCols) * sizeof(Bf16);
}

// Grid (batch * heads, query tiles); flash_attention.h's forward.
template <int kHdp>
__global__ void __launch_bounds__(kThreads)
    MmaForwardKernel(const float* qkv, int seq_len, int c, int heads, int hd, float scale,
                     float* out, float* lse) {
  PIPETRAIN_DYNAMIC_SHARED_MEMORY(smem);
  constexpr int ld = kLdRows<kHdp>;
  Bf16* q_rows = reinterpret_cast<Bf16*>(smem);
  Bf16* k_rows = q_rows + kTile * ld;
  Bf16* v_cols = k_rows + kTile * ld;

  const auto [g, t, rows0, at, width] = PlaceOf(seq_len, c, heads, hd);
  const int q_tile_index = QueryTileFromLast(), q0 = q_tile_index * kTile;
  const int query[2] = {q0 + rows0 + g, q0 + rows0 + g + 8};
  const float scale_log2 = scale * kLog2e;  // scores in log2 units from here on

  LoadTile<kHdp>(qkv + at.qkv_offset, width, q0, seq_len, hd, q_rows, nullptr);
  float o[kHdp / 8][4];
  for (auto& block : o) {
    for (float& v : block) v = 0.0f;
  }
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  // Causal, with equal tile sizes: key tiles up to the diagonal one. Key 0
  // is in tile 0 and visible to every query, and the diagonal tile's first
  // key to every query of its tile, so every row's max is finite from the
  // first tile on (no inf - inf below).
  for (int kt = 0; kt <= q_tile_index; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous k, v; q's loads seen
    LoadTile<kHdp>(qkv + at.qkv_offset + c, width, k0, seq_len, hd, k_rows, nullptr);
    LoadTile<kHdp>(qkv + at.qkv_offset + 2 * int64_t{c}, width, k0, seq_len, hd, nullptr, v_cols);
    __syncthreads();
    float s[kTileBlocks][4];
    ScoreTile<kHdp>(q_rows + rows0 * ld, k_rows, g, t, s);  // S = q k^T: 16 queries x 64 keys
    // Scale (to log2 units), mask and the rows' new maxima.
    float tile_max[2] = {-INFINITY, -INFINITY};
    for (int j = 0; j < kTileBlocks; ++j) {
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2, key = k0 + j * 8 + 2 * t + e % 2;
        const float x = (key <= query[half] && key < seq_len) ? s[j][e] * scale_log2 : -INFINITY;
        s[j][e] = x;
        tile_max[half] = fmaxf(tile_max[half], x);
      }
    }
    float rescale[2];
    for (int half = 0; half < 2; ++half) {
      const float m_new = fmaxf(m[half], QuadMax(tile_max[half]));
      rescale[half] = exp2f(m[half] - m_new);  // 0 on the first tile
      m[half] = m_new;
    }
    // P = exp(S scale - m) = exp2(x - m') in bf16 (m' = m log2 e); l sums
    // what P v uses, so out stays a convex mix of v's rows.
    float sum[2] = {0.0f, 0.0f};
    for (int j = 0; j < kTileBlocks; ++j) {
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;
        const float p = __bfloat162float(__float2bfloat16_rn(exp2f(s[j][e] - m[half])));
        s[j][e] = p;
        sum[half] += p;
      }
    }
    for (int half = 0; half < 2; ++half) l[half] = l[half] * rescale[half] + QuadSum(sum[half]);
    for (auto& block : o) {
      for (int e = 0; e < 4; ++e) block[e] *= rescale[e / 2];
    }
    AccumulateTile<kHdp>(s, v_cols, g, t, o);  // O += P v
  }
  StoreRows<kHdp>(o, query, l, out + at.out_offset, c, seq_len, hd, t);
  if (t == 0) {
    for (int half = 0; half < 2; ++half) {
      // m' ln 2 = m: the log-sum-exp in natural-log units.
      if (query[half] < seq_len)
        lse[at.stats_offset + query[half]] = m[half] * kLn2 + logf(l[half]);
    }
  }
}

template <int kHdp>
constexpr size_t KeyGradSharedBytes() {
  return (4 * size_t{kTile} * kLdRows<kHdp> + 2 * size_t{kHdp} * kLdCols) * sizeof(Bf16) +
         2 * size_t{kTile} * sizeof(float);
}

// Grid (batch * heads, key tiles): dk = dS^T q and dv = P^T dout for the
// tile's 64 keys, over the query tiles from the diagonal one on. A warp
// computes S^T = k q^T and dP^T = v dout^T for its 16 keys, so P^T and
// dS^T land as A fragments of the two products.
template <int kHdp>
__global__ void __launch_bounds__(kThreads)
    MmaKeyGradKernel(const float* qkv, const float* dout, const float* lse, const float* row_dots,
                     int seq_len, int c, int heads, int hd, float scale, int tiles, float* dqkv) {
  PIPETRAIN_DYNAMIC_SHARED_MEMORY(smem);
  constexpr int ld = kLdRows<kHdp>;
  Bf16* k_rows = reinterpret_cast<Bf16*>(smem);
  Bf16* v_rows = k_rows + kTile * ld;
  Bf16* q_rows = v_rows + kTile * ld;
  Bf16* dout_rows = q_rows + kTile * ld;
  Bf16* q_cols = dout_rows + kTile * ld;
  Bf16* dout_cols = q_cols + kHdp * kLdCols;
  float* lse_tile = reinterpret_cast<float*>(dout_cols + kHdp * kLdCols);
  float* dots_tile = lse_tile + kTile;

  const auto [g, t, rows0, at, width] = PlaceOf(seq_len, c, heads, hd);
  // Key tile 0 sees every query tile: the longest blocks come first.
  const int k_tile_index = blockIdx.y, k0 = k_tile_index * kTile;
  const int key[2] = {k0 + rows0 + g, k0 + rows0 + g + 8};
  const float scale_log2 = scale * kLog2e;
  LoadTile<kHdp>(qkv + at.qkv_offset + c, width, k0, seq_len, hd, k_rows, nullptr);
  LoadTile<kHdp>(qkv + at.qkv_offset + 2 * int64_t{c}, width, k0, seq_len, hd, v_rows, nullptr);
  float dk[kHdp / 8][4], dv[kHdp / 8][4];
  for (int nb = 0; nb < kHdp / 8; ++nb) {
    for (int e = 0; e < 4; ++e) dk[nb][e] = dv[nb][e] = 0.0f;
  }
  for (int qt = k_tile_index; qt < tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();  // every warp is done with the previous tiles; k, v's loads seen
    LoadTile<kHdp>(qkv + at.qkv_offset, width, q0, seq_len, hd, q_rows, q_cols);
    LoadTile<kHdp>(dout + at.out_offset, c, q0, seq_len, hd, dout_rows, dout_cols);
    LoadRowStats(lse + at.stats_offset, q0, seq_len, lse_tile, kLog2e);  // log2 units
    LoadRowStats(row_dots + at.stats_offset, q0, seq_len, dots_tile);
    __syncthreads();
    // S^T = k q^T and dP^T = v dout^T: 16 keys x 64 queries.
    float st[kTileBlocks][4], dpt[kTileBlocks][4];
    ScoreTile<kHdp>(k_rows + rows0 * ld, q_rows, g, t, st);
    ScoreTile<kHdp>(v_rows + rows0 * ld, dout_rows, g, t, dpt);
    // P^T = exp(S^T scale - lse) = exp2(S^T scale log2 e - lse log2 e) and
    // dS^T = P^T (dP^T - D) scale where key <= query < seq_len, else 0.
    for (int j = 0; j < kTileBlocks; ++j) {
      for (int e = 0; e < 4; ++e) {
        const int col = j * 8 + 2 * t + e % 2, query = q0 + col;
        float p = 0.0f, ds = 0.0f;
        if (key[e / 2] <= query && query < seq_len) {
          p = exp2f(fmaf(st[j][e], scale_log2, -lse_tile[col]));
          ds = p * (dpt[j][e] - dots_tile[col]) * scale;
        }
        st[j][e] = p;
        dpt[j][e] = ds;
      }
    }
    AccumulateTile<kHdp>(st, dout_cols, g, t, dv);  // dv += P^T dout
    AccumulateTile<kHdp>(dpt, q_cols, g, t, dk);    // dk += dS^T q
  }
  const float one[2] = {1.0f, 1.0f};
  StoreRows<kHdp>(dk, key, one, dqkv + at.qkv_offset + c, width, seq_len, hd, t);
  StoreRows<kHdp>(dv, key, one, dqkv + at.qkv_offset + 2 * int64_t{c}, width, seq_len, hd, t);
}

template <int kHdp>
constexpr size_t QueryGradSharedBytes() {
  return (4 * size_t{kTile} * kLdRows<kHdp> + size_t{kHdp} * kLdCols) * sizeof(Bf16);
}

// Grid (batch * heads, query tiles): dq = dS k for the tile's 64 queries,
// over the key tiles up to the diagonal one.
template <int kHdp>
__global__ void __launch_bounds__(kThreads)
    MmaQueryGradKernel(const float* qkv, const float* dout, const float* lse, const float* row_dots,
                       int seq_len, int c, int heads, int hd, float scale, float* dqkv) {
  PIPETRAIN_DYNAMIC_SHARED_MEMORY(smem);
  constexpr int ld = kLdRows<kHdp>;
  Bf16* q_rows = reinterpret_cast<Bf16*>(smem);
  Bf16* dout_rows = q_rows + kTile * ld;
  Bf16* k_rows = dout_rows + kTile * ld;
  Bf16* v_rows = k_rows + kTile * ld;
  Bf16* k_cols = v_rows + kTile * ld;

  const auto [g, t, rows0, at, width] = PlaceOf(seq_len, c, heads, hd);
  const int q_tile_index = QueryTileFromLast(), q0 = q_tile_index * kTile;
  const int query[2] = {q0 + rows0 + g, q0 + rows0 + g + 8};
  const float scale_log2 = scale * kLog2e;
  float row_lse[2], row_dot[2];
  for (int half = 0; half < 2; ++half) {
    const bool in = query[half] < seq_len;
    row_lse[half] = in ? lse[at.stats_offset + query[half]] * kLog2e : 0.0f;  // log2 units
    row_dot[half] = in ? row_dots[at.stats_offset + query[half]] : 0.0f;
  }
  LoadTile<kHdp>(qkv + at.qkv_offset, width, q0, seq_len, hd, q_rows, nullptr);
  LoadTile<kHdp>(dout + at.out_offset, c, q0, seq_len, hd, dout_rows, nullptr);
  float dq[kHdp / 8][4];
  for (auto& block : dq) {
    for (float& v : block) v = 0.0f;
  }
  for (int kt = 0; kt <= q_tile_index; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous k, v; q, dout's loads seen
    LoadTile<kHdp>(qkv + at.qkv_offset + c, width, k0, seq_len, hd, k_rows, k_cols);
    LoadTile<kHdp>(qkv + at.qkv_offset + 2 * int64_t{c}, width, k0, seq_len, hd, v_rows, nullptr);
    __syncthreads();
    // S = q k^T and dP = dout v^T: 16 queries x 64 keys.
    float s[kTileBlocks][4], dp[kTileBlocks][4];
    ScoreTile<kHdp>(q_rows + rows0 * ld, k_rows, g, t, s);
    ScoreTile<kHdp>(dout_rows + rows0 * ld, v_rows, g, t, dp);
    // dS = P (dP - D) scale where key <= query < seq_len, else 0; P =
    // exp2(S scale log2 e - lse log2 e).
    for (int j = 0; j < kTileBlocks; ++j) {
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2, key = k0 + j * 8 + 2 * t + e % 2;
        float ds = 0.0f;
        if (key <= query[half] && query[half] < seq_len) {
          const float p = exp2f(fmaf(s[j][e], scale_log2, -row_lse[half]));
          ds = p * (dp[j][e] - row_dot[half]) * scale;
        }
        dp[j][e] = ds;
      }
    }
    AccumulateTile<kHdp>(dp, k_cols, g, t, dq);  // dq += dS k
  }
  const float one[2] = {1.0f, 1.0f};
  StoreRows<kHdp>(dq, query, one, dqkv + at.qkv_offset, width, seq_len, hd, t);
}

}  // namespace
}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_FLASH_ATTENTION_MMA_KERNELS_CUH_
