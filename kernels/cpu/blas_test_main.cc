// gtest main for tests that run GEMM-heavy code: re-executes with
// OPENBLAS_CORETYPE=SkylakeX on AVX-512 CPUs (see blas.h) and pins OpenBLAS
// to one thread so results are bitwise reproducible.
#include "gtest/gtest.h"
#include "kernels/cpu/blas.h"

int main(int argc, char** argv) {
  pipetrain::ConfigureBlasOrReexec(argv);
  pipetrain::SetBlasThreads(1);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
