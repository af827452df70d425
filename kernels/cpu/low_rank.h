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

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_LOW_RANK_H_
