// The product of two low-rank factors, P Q^T, computed so that every CPU
// gets bitwise the same result.
//
// OpenBLAS picks its kernel by the CPU it loads on (SkylakeX, Haswell,
// Sandybridge, ...) and splits the work by its thread count, and either
// changes the rounding of an sgemm. Where the product of factors that are
// already equal on every data-parallel replica (all-reduced) goes straight
// into each replica's weights, that would make the replicas drift apart
// on mixed hosts or --threads. Here each element is one float accumulator
// summed over k = 0..r-1 in order: the same arithmetic in every target
// clone (PT_TARGET_CLONES; KERNEL_COPTS' -ffp-contract=off forbids FMAs),
// and no threads.
//
// Thread-safety: a pure function of its arguments.
#ifndef PIPETRAIN_KERNELS_CPU_LOW_RANK_H_
#define PIPETRAIN_KERNELS_CPU_LOW_RANK_H_

#include <cstdint>

namespace pipetrain {

// out[i * cols + j] = sum over k of p[i * r + k] * q[j * r + k], for
// P [rows, r] and Q [cols, r] row-major (PowerSGD's P^ Q'^T: Vogels et al.,
// Algorithm 1, the approximation's last line). rows, cols >= 0, r >= 1;
// `out` holds rows * cols floats and overlaps neither factor.
void LowRankProduct(const float* p, const float* q, int64_t rows, int64_t cols, int r, float* out);

// PowerSGD's two projections of a matrix M [rows, cols] (row-major) onto
// rank-r factors (Vogels et al., Algorithm 1, P <- M Q and Q <- M^T P), in
// a fixed order so that every CPU gets the same bits. A stage's
// tensor-parallel ranks each encode the same replicated tensor for their
// link (stage_runtime.h); with OpenBLAS, hosts of different CPU types
// would send their peers different factors, and the peers' replicated
// parameters would drift apart.
//
// MatrixTimesFactor: out [rows, r], out[i * r + k] = sum over j of
// m[i * cols + j] * q[j * r + k], for Q [cols, r]. Each sum is kept in
// kLowRankLanes partial sums, lane l adding j = l, l + kLowRankLanes, ...
// up to the last whole group of lanes, in order; the lanes are then added
// 0..kLowRankLanes-1 in order, and the last cols % kLowRankLanes terms
// after them, in order.
constexpr int64_t kLowRankLanes = 16;
void MatrixTimesFactor(const float* m, const float* q, int64_t rows, int64_t cols, int r,
                       float* out);

// MatrixTransposeTimesFactor: out [cols, r], out[j * r + k] = sum over i of
// m[i * cols + j] * p[i * r + k], for P [rows, r], summed in i = 0..rows-1
// order.
//
// Both: rows, cols >= 0, r >= 1; `out` overlaps neither input; an empty
// side leaves out all zeros. The same bits in every target clone only
// because the kernels build with -ffp-contract=off (KERNEL_COPTS): with
// contraction, the x86-64-v3 clone fuses the products into FMAs and rounds
// otherwise.
void MatrixTransposeTimesFactor(const float* m, const float* p, int64_t rows, int64_t cols, int r,
                                float* out);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_LOW_RANK_H_
