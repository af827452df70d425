#include "worker/model/gemm_probe.h"

#include <algorithm>
#include <chrono>

#include "common/philox.h"

namespace pipetrain {

double MeasureGemmGflops(Backend* backend, int n, int reps) {
  Tensor a = Tensor::Zeros({n, n}), b = Tensor::Zeros({n, n});
  FillNormal(1, 1, 0, 1, a.data(), a.numel());
  FillNormal(1, 2, 0, 1, b.data(), b.numel());
  const Tensor da = backend->Upload(a), db = backend->Upload(b);
  Tensor dc = backend->Zeros({n, n});
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {  // the first is a warm-up
    const auto t0 = std::chrono::steady_clock::now();
    backend->Sgemm(false, false, n, n, n, 1.0f, da.data(), n, db.data(), n, 0.0f, dc.data(), n);
    backend->Synchronize();
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    if (r > 0) best = std::min(best, dt.count());
  }
  if (!backend->status().ok()) return 0;
  return 2.0 * n * n * static_cast<double>(n) / best / 1e9;
}

}  // namespace pipetrain
