#include "worker/model/gemm_probe.h"

#include <algorithm>
#include <chrono>

#include "common/philox.h"

namespace pipetrain {

double MeasureGemmGflops(Backend* backend, int n, int reps, double warmup_seconds) {
  Tensor a = Tensor::Zeros({n, n}), b = Tensor::Zeros({n, n});
  FillNormal(1, 1, 0, 1, a.data(), a.numel());
  FillNormal(1, 2, 0, 1, b.data(), b.numel());
  const Tensor da = backend->Upload(a), db = backend->Upload(b);
  Tensor dc = backend->Empty({n, n});
  auto gemm_seconds = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    backend->Sgemm(false, false, n, n, n, 1.0f, da.data(), n, db.data(), n, 0.0f, dc.data(), n);
    backend->Synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double warmed = 0;
  do {
    warmed += gemm_seconds();
  } while (warmed < warmup_seconds && backend->status().ok());
  double best = 1e30;
  for (int r = 0; r < reps; ++r) best = std::min(best, gemm_seconds());
  if (!backend->status().ok()) return 0;
  return 2.0 * n * n * static_cast<double>(n) / best / 1e9;
}

}  // namespace pipetrain
