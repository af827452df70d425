#include "kernels/cpu/blas.h"

#include <cblas.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/logging.h"

// OpenBLAS extensions (declared in its cblas.h on Debian, repeated here so
// the contract is visible).
extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
char* openblas_get_corename(void);
}

namespace pipetrain {

bool CpuHasAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

void ConfigureBlasOrReexec(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || !CpuHasAvx512()) return;
  setenv("OPENBLAS_CORETYPE", "SkylakeX", /*overwrite=*/1);
  execv("/proc/self/exe", argv);
  // Only reached when exec failed; carry on with the generic kernels.
  PT_LOG(WARNING) << "could not re-exec with OPENBLAS_CORETYPE=SkylakeX ("
                  << std::strerror(errno) << "); GEMMs run at AVX2 speed";
}

void SetBlasThreads(int threads) {
  PT_CHECK(threads >= 1) << "threads=" << threads;
  openblas_set_num_threads(threads);
  if (const int running = openblas_get_num_threads(); running != threads) {
    PT_LOG(WARNING) << "--threads " << threads << ": OpenBLAS runs " << running
                    << " threads, its most";
  }
}

int BlasThreads() { return openblas_get_num_threads(); }

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name ? name : "unknown";
}

void Sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
           int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
}

}  // namespace pipetrain
