// The GPT-2 self-attention and MLP blocks on a p x p x p cube
// (3d-parallelism.txt §3.2, Figure 6): the numerics of worker/model's
// AttentionUnit and MlpUnit (unsplit, tp = nullptr) with every linear layer
// a 3-D linear (cube_linear.h) and the LayerNorm the 3-D LayerNorm
// (cube_layernorm.h). Jobs run them as Units through
// worker/model/cube_units.h (spec.parallelism.tensor_mode 3d).
//
// Activations. A block's input and output are X [M, d], M = B * T rows in
// sample-major order (row b * T + t), held in the kActivation layout of the
// block's direction dir (cube_layout.h): [M / p^2, d / p] per rank. B must
// be a multiple of p^2, so that each rank's M / p^2 rows are B / p^2 whole
// sequences; every token's attention then stays on its rank.
//
//   attention  ln_1 (dir) -> c_attn 3-D linear (dir; out [M/p^2, 3d/p] in
//              dir.Swapped()) -> causal attention, local, on B/p^2 samples
//              and n_head/p heads -> c_proj 3-D linear (dir.Swapped(); out
//              in dir) -> + X.
//   MLP        ln_2 (dir) -> c_fc (dir; out [M/p^2, 4d/p] in dir.Swapped())
//              -> GELU, local -> c_proj (dir.Swapped(); out in dir) -> + X.
// Both return to dir (§3.2), so a stack of blocks runs in one direction.
//
// The c_attn permutation. c_attn's output columns are [q | k | v], each d
// wide with head h in columns [h hd, (h+1) hd), hd = d / n_head. The 3-D
// linear hands rank (.., coord[dir.input] = a, ..) the columns block a of
// p (3d / p columns); for attention to be local that block must be the q, k
// and v columns of whole heads. So the cube's c_attn weight columns (and
// bias entries) are the unsplit ones permuted: with c = d / p (the width
// of n_head / p heads), cube column
//     g * 3c + s * c + j   holds unsplit column   s * d + g * c + j
// for group g < p, part s in {0 q, 1 k, 2 v}, j < c. Group g = a is then
// [q | k | v] of heads [a n_head / p, (a+1) n_head / p), the qkv layout
// kernels/cpu/attention.h expects with c columns per part, and the
// attention output's column block a is the unsplit attention output's
// columns [a c, (a+1) c): c_proj needs no permutation. Scatter applies the
// permutation, gather undoes it (CubeAttentionPermutedColumn).
//
// Parameters. Both blocks have the same six, in the Units' parameters()
// order: the LayerNorm's gain and bias (ln_1 / ln_2), the first linear's
// weight and bias (c_attn [d, 3d] / [3d], c_fc [d, 4d] / [4d]) and the
// second's (c_proj [d, d] or [4d, d] / [d]). This rank holds
//   ln_weight, ln_bias    kVector under dir            (d / p^2 on the diagonal)
//   in_weight             kWeight under dir            [d / p, K / p^2]
//   in_bias               kVector under dir.Swapped()  (K / p^2 on the diagonal)
//   out_weight            kWeight under dir.Swapped()  [K / p, d / p^2]
//   out_bias              kVector under dir            (d / p^2 on the diagonal)
// K = 3d (attention, permuted as above) or 4d (MLP). "Diagonal" is
// coord[dir.input] == coord[dir.output] for all three vectors (Swapped()
// exchanges those two axes); other ranks hold empty vector blocks.
//
// Communication each rank sends (floats; the in-process comm's count, see
// cube_testing.h) is the sum of its layers' (CubeAttentionSent,
// CubeMlpSent): the two linears' CubeLinearSent (forward; backward with
// dx), their biases' CubeVectorAllGather / CubeVectorReduceGrad, and the
// LayerNorm's two vector all-gathers plus two all-reduces of M / p^2 row
// values (forward) or one vector all-gather, one all-reduce of 2 M / p^2
// and two reduce-grads (backward). The attention core and GELU send
// nothing.
//
// Every rank of the cube must call the block functions together with the
// same direction and dims (they are collectives). Errors: INVALID_ARGUMENT
// naming the dimension when p < 2, B is not a multiple of p^2, n_head not
// of p (attention), d_model not of p^2 or of n_head, or a span has the
// wrong size; the comm's errors otherwise. Not thread-safe per comm.
#ifndef PIPETRAIN_WORKER_CUBE_CUBE_BLOCKS_H_
#define PIPETRAIN_WORKER_CUBE_CUBE_BLOCKS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/cube/cube_comm.h"

namespace pipetrain {

struct CubeBlockDims {
  int64_t batch = 0;    // B: multiple of p^2 (whole samples per rank)
  int64_t seq_len = 0;  // T
  int64_t d_model = 0;  // d: multiple of p^2 and of n_head
  int64_t n_head = 0;   // attention only: multiple of p
};

// A block's six parameter blocks (values), see above.
struct CubeBlockParams {
  absl::Span<const float> ln_weight, ln_bias, in_weight, in_bias, out_weight, out_bias;
};
// Their gradients, ADDED to by the backward passes.
struct CubeBlockGrads {
  absl::Span<float> ln_weight, ln_bias, in_weight, in_bias, out_weight, out_bias;
};

// Owned tensors of the six: a rank's blocks, or (for scatter and gather)
// the unsplit parameters in Hugging Face layout.
struct CubeBlockTensors {
  std::vector<float> ln_weight, ln_bias, in_weight, in_bias, out_weight, out_bias;
  CubeBlockParams params() const {
    return {ln_weight, ln_bias, in_weight, in_bias, out_weight, out_bias};
  }
  CubeBlockGrads grads() {
    return {absl::MakeSpan(ln_weight), absl::MakeSpan(ln_bias),    absl::MakeSpan(in_weight),
            absl::MakeSpan(in_bias),   absl::MakeSpan(out_weight), absl::MakeSpan(out_bias)};
  }
};

// What a block's backward needs from its forward (this rank's blocks).
struct CubeBlockContext {
  std::vector<float> x;           // the input block [M/p^2, d/p]
  std::vector<float> ln_out;      // LayerNorm output, same layout
  std::vector<float> mean, rstd;  // [M/p^2]
  std::vector<float> hidden;      // first linear's output [M/p^2, K/p] (qkv / fc)
  std::vector<float> act;         // attention output [M/p^2, d/p] / GELU output [M/p^2, 4d/p]
  std::vector<float> probs;       // attention: [B/p^2, n_head/p, T, T]; MLP: empty
  int64_t bytes() const;
};

// Forward: y (the input block's size) is written; *ctx is overwritten. y
// may be x itself (x is copied into ctx first).
absl::Status CubeAttentionForward(CubeComm& comm, const CubeDirection& direction,
                                  const CubeBlockDims& dims, const CubeBlockParams& params,
                                  absl::Span<const float> x, absl::Span<float> y,
                                  CubeBlockContext* ctx);
absl::Status CubeMlpForward(CubeComm& comm, const CubeDirection& direction,
                            const CubeBlockDims& dims, const CubeBlockParams& params,
                            absl::Span<const float> x, absl::Span<float> y, CubeBlockContext* ctx);

// Backward from dy = dL/dy (output block): dx (same size) is written, the
// parameter gradient blocks are ADDED to (as the kernels accumulate over
// micro-batches). ctx must come from the forward on the same input; dx
// must not overlap dy.
absl::Status CubeAttentionBackward(CubeComm& comm, const CubeDirection& direction,
                                   const CubeBlockDims& dims, const CubeBlockParams& params,
                                   const CubeBlockContext& ctx, absl::Span<const float> dy,
                                   absl::Span<float> dx, const CubeBlockGrads& grads);
absl::Status CubeMlpBackward(CubeComm& comm, const CubeDirection& direction,
                             const CubeBlockDims& dims, const CubeBlockParams& params,
                             const CubeBlockContext& ctx, absl::Span<const float> dy,
                             absl::Span<float> dx, const CubeBlockGrads& grads);

// The unsplit c_attn column that the cube's permuted column `column`
// (0 <= column < 3 d_model) holds, per the permutation above.
int64_t CubeAttentionPermutedColumn(int64_t column, int64_t d_model, int p);

// `full` ([rows, 3 d_model], c_attn's weight or, with rows 1, its bias)
// with its columns permuted into the cube's order (to_cube) or back.
std::vector<float> PermuteCubeAttentionColumns(const std::vector<float>& full, int64_t rows,
                                               int64_t d_model, int p, bool to_cube);

// Rank `coord`'s blocks of a block's unsplit parameters `full` (Hugging
// Face shapes: ln [d], in [d, K] / [K], out [K', d] / [d]); the attention
// variant permutes c_attn's columns. INVALID_ARGUMENT for dims the block
// does not accept or a full tensor of the wrong size (named).
absl::StatusOr<CubeBlockTensors> ScatterCubeAttentionParams(const CubeBlockTensors& full,
                                                            const CubeBlockDims& dims, int p,
                                                            const CubeCoord& coord,
                                                            const CubeDirection& direction);
absl::StatusOr<CubeBlockTensors> ScatterCubeMlpParams(const CubeBlockTensors& full,
                                                      const CubeBlockDims& dims, int p,
                                                      const CubeCoord& coord,
                                                      const CubeDirection& direction);
// The unsplit tensors from every rank's blocks (blocks[CubeRankIndex]),
// c_attn's columns un-permuted: for values or gradients alike.
absl::StatusOr<CubeBlockTensors> GatherCubeAttentionParams(
    const std::vector<CubeBlockTensors>& blocks, const CubeBlockDims& dims, int p,
    const CubeDirection& direction);
absl::StatusOr<CubeBlockTensors> GatherCubeMlpParams(const std::vector<CubeBlockTensors>& blocks,
                                                     const CubeBlockDims& dims, int p,
                                                     const CubeDirection& direction);

// Floats rank `coord` sends in one forward and one backward of a block:
// the sums described above, each all-reduce of n floats counted as the
// in-process comm does (n - n_c + (p - 1) n_c, n_c this member's segment;
// 2 (p - 1) n / p when p divides n). Requires dims the block accepts.
struct CubeBlockSentFloats {
  int64_t forward = 0, backward = 0;
};
CubeBlockSentFloats CubeAttentionSent(const CubeBlockDims& dims, int p, const CubeCoord& coord,
                                      const CubeDirection& direction);
CubeBlockSentFloats CubeMlpSent(const CubeBlockDims& dims, int p, const CubeCoord& coord,
                                const CubeDirection& direction);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_CUBE_CUBE_BLOCKS_H_
