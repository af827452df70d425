// OpenBLAS runtime control and a row-major sgemm wrapper.
//
// Debian's OpenBLAS does not recognise AVX-512 EPYC CPUs and falls back to
// Haswell (AVX2) kernels at half the speed. OPENBLAS_CORETYPE=SkylakeX fixes
// that, but OpenBLAS reads the variable only while the shared library loads,
// before main() runs; so a binary that wants it must re-execute itself with
// the variable set. Every pipetrain binary calls ConfigureBlasOrReexec first.
#ifndef PIPETRAIN_KERNELS_CPU_BLAS_H_
#define PIPETRAIN_KERNELS_CPU_BLAS_H_

#include <string>

namespace pipetrain {

// True when the CPU has the AVX-512 subsets OpenBLAS's SkylakeX kernels use
// (F, BW, DQ, VL).
bool CpuHasAvx512();

// If the CPU has AVX-512 and OPENBLAS_CORETYPE is unset, sets it to SkylakeX
// and execv()s /proc/self/exe with the same argv; returns only when no
// re-exec was needed or the exec failed (then it logs a warning and the
// program continues at the slower speed). Call first thing in main().
void ConfigureBlasOrReexec(char** argv);

// Threads OpenBLAS uses for each GEMM (>= 1). Fixed thread counts give
// bitwise-reproducible results. OpenBLAS caps the count at its build's
// maximum; a capped request logs a warning naming the count it runs (the
// user asked for something else). Not thread-safe with concurrent GEMMs.
void SetBlasThreads(int threads);
int BlasThreads();
// The kernel family OpenBLAS picked, e.g. "SkylakeX" or "Haswell".
std::string BlasCoreName();

// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, all row-major with
// leading dimensions lda, ldb, ldc (elements between rows). trans_a means
// A is stored [K,M]; trans_b means B is stored [N,K].
void Sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
           int lda, const float* b, int ldb, float beta, float* c, int ldc);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_BLAS_H_
