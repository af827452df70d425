#include "worker/collectives/powersgd_all_reduce.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/payload.h"  // CheckFinite
#include "kernels/compress/powersgd_codec.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/low_rank.h"

namespace pipetrain {

absl::Status PowerSgdAllReduce(Collectives& collectives, int64_t iteration, int tag, int rank,
                               int64_t rows, int64_t cols, bool error_feedback, Tensor& m,
                               PowerSgdAllReduceState* state) {
  constexpr int64_t kMaxDim = std::numeric_limits<int>::max();
  if (rank < 1 || rows < 1 || cols < 1 || rows > kMaxDim || cols > kMaxDim ||
      m.numel() != rows * cols || m.on_device()) {
    return absl::InvalidArgumentError(absl::StrCat("PowerSGD all-reduce: ", m.numel(),
                                                   " host values as ", rows, " x ", cols,
                                                   " at rank ", rank));
  }
  const int r = rank, nr = static_cast<int>(rows), nc = static_cast<int>(cols);
  // M = m + the residual of earlier calls.
  Tensor matrix = m.Clone();
  if (error_feedback && state->residual.numel() == m.numel()) {
    float* x = matrix.data();
    const float* e = state->residual.data();
    for (int64_t i = 0; i < matrix.numel(); ++i) x[i] += e[i];
  }
  const Tensor q0 = PowerSgdStartQ(state->q, cols, r);
  Tensor p = Tensor::Zeros({rows, r});
  Sgemm(false, false, nr, r, nc, 1.0f, matrix.data(), nc, q0.data(), r, 0.0f, p.data(), r);
  RETURN_IF_ERROR(collectives.AllReduce(iteration, tag, p));
  // The sums are the same on every member, so every member refuses alike,
  // before a non-finite factor reaches the weights or the warm start.
  RETURN_IF_ERROR(CheckFinite(p, "PowerSGD all-reduce (the summed P = M Q)"));
  PowerSgdOrthonormalise(p.data(), rows, r);
  Tensor q = Tensor::Zeros({cols, r});
  Sgemm(true, false, nc, r, nr, 1.0f, matrix.data(), nc, p.data(), r, 0.0f, q.data(), r);
  RETURN_IF_ERROR(collectives.AllReduce(iteration, tag + 1, q));
  RETURN_IF_ERROR(CheckFinite(q, "PowerSGD all-reduce (the summed Q = M^T P)"));
  // The sum's approximation P^ Q'^T. Not an sgemm: P^ and Q' are the same
  // on every member, and so must be what each adds to its weights, on any
  // CPU and --threads (low_rank.h).
  LowRankProduct(p.data(), q.data(), rows, cols, r, m.data());
  // Finite factors may multiply past float32 (Q's entries near FLT_MAX / r):
  // refused alike on every member (the product is the same on each), before
  // the Inf reaches the weights or, through the residual, every later call.
  RETURN_IF_ERROR(CheckFinite(m, "PowerSGD all-reduce (the approximation P Q^T)"));
  if (error_feedback) {
    const float share = 1.0f / static_cast<float>(collectives.size());
    state->residual = matrix;  // M - P^ Q'^T / N
    float* e = state->residual.data();
    const float* approx = m.data();
    for (int64_t i = 0; i < matrix.numel(); ++i) e[i] -= approx[i] * share;
  }
  state->q = q;
  return absl::OkStatus();
}

}  // namespace pipetrain
