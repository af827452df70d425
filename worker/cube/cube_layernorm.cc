#include "worker/cube/cube_layernorm.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/cube/cube_layout.h"
#include "worker/cube/cube_vector.h"

namespace pipetrain {
namespace {

struct Blocks {
  int64_t rows = 0, cols = 0, vector = 0;  // M / p^2, H / p, this rank's gamma piece
};

absl::StatusOr<Blocks> CheckDims(const CubeLayerNormDims& dims, int p, const CubeCoord& coord,
                                 const CubeDirection& direction) {
  RETURN_IF_ERROR(ValidateCube(p, direction, "CubeLayerNorm"));
  const int64_t pp = int64_t{p} * p;
  if (dims.rows <= 0 || dims.rows % pp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("CubeLayerNorm: rows (M) = ", dims.rows,
                                                   " must be a positive multiple of p^2 = ", pp));
  }
  if (dims.hidden <= 0 || dims.hidden % pp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("CubeLayerNorm: hidden (H) = ", dims.hidden,
                                                   " must be a positive multiple of p^2 = ", pp));
  }
  ASSIGN_OR_RETURN(const CubeBlock piece,
                   CubeBlockOf(CubeOperand::kVector, 1, dims.hidden, p, coord, direction));
  return Blocks{dims.rows / pp, dims.hidden / p, piece.size()};
}

absl::Status CheckSpan(const char* name, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("CubeLayerNorm: ", name, " has ", got, " values, its layout ", want));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CubeLayerNormForward(CubeComm& comm, const CubeDirection& direction,
                                  const CubeLayerNormDims& dims, absl::Span<const float> x,
                                  absl::Span<const float> gamma, absl::Span<const float> beta,
                                  absl::Span<float> y, absl::Span<float> mean,
                                  absl::Span<float> rstd) {
  ASSIGN_OR_RETURN(const Blocks b, CheckDims(dims, comm.p(), comm.coord(), direction));
  RETURN_IF_ERROR(CheckSpan("x", x.size(), b.rows * b.cols));
  RETURN_IF_ERROR(CheckSpan("gamma", gamma.size(), b.vector));
  RETURN_IF_ERROR(CheckSpan("beta", beta.size(), b.vector));
  RETURN_IF_ERROR(CheckSpan("y", y.size(), b.rows * b.cols));
  RETURN_IF_ERROR(CheckSpan("mean", mean.size(), b.rows));
  RETURN_IF_ERROR(CheckSpan("rstd", rstd.size(), b.rows));
  // Algorithm 7, lines 1-2, for both parameters.
  std::vector<float> g(static_cast<size_t>(b.cols)), be(static_cast<size_t>(b.cols));
  RETURN_IF_ERROR(CubeVectorAllGather(comm, direction, dims.hidden, gamma, absl::MakeSpan(g)));
  RETURN_IF_ERROR(CubeVectorAllGather(comm, direction, dims.hidden, beta, absl::MakeSpan(be)));

  const float h = static_cast<float>(dims.hidden);
  // Pass 1: the mean, from the rows' sums over all of H.
  for (int64_t r = 0; r < b.rows; ++r) {
    const float* xr = x.data() + r * b.cols;
    float sum = 0.0f;
    for (int64_t k = 0; k < b.cols; ++k) sum += xr[k];
    mean[r] = sum;
  }
  RETURN_IF_ERROR(comm.AllReduce(direction.output, mean));
  for (int64_t r = 0; r < b.rows; ++r) mean[r] /= h;
  // Pass 2: the biased variance from centred squares (no E[x^2] - E[x]^2
  // cancellation, as the kernel).
  for (int64_t r = 0; r < b.rows; ++r) {
    const float* xr = x.data() + r * b.cols;
    float sq = 0.0f;
    for (int64_t k = 0; k < b.cols; ++k) {
      const float d = xr[k] - mean[r];
      sq += d * d;
    }
    rstd[r] = sq;
  }
  RETURN_IF_ERROR(comm.AllReduce(direction.output, rstd));
  for (int64_t r = 0; r < b.rows; ++r) {
    rstd[r] = 1.0f / std::sqrt(rstd[r] / h + dims.eps);
    const float* xr = x.data() + r * b.cols;
    float* yr = y.data() + r * b.cols;
    for (int64_t k = 0; k < b.cols; ++k) yr[k] = (xr[k] - mean[r]) * rstd[r] * g[k] + be[k];
  }
  return absl::OkStatus();
}

absl::Status CubeLayerNormBackward(CubeComm& comm, const CubeDirection& direction,
                                   const CubeLayerNormDims& dims, absl::Span<const float> x,
                                   absl::Span<const float> gamma, absl::Span<const float> mean,
                                   absl::Span<const float> rstd, absl::Span<const float> dy,
                                   absl::Span<float> dx, absl::Span<float> dgamma,
                                   absl::Span<float> dbeta) {
  ASSIGN_OR_RETURN(const Blocks b, CheckDims(dims, comm.p(), comm.coord(), direction));
  RETURN_IF_ERROR(CheckSpan("x", x.size(), b.rows * b.cols));
  RETURN_IF_ERROR(CheckSpan("gamma", gamma.size(), b.vector));
  RETURN_IF_ERROR(CheckSpan("mean", mean.size(), b.rows));
  RETURN_IF_ERROR(CheckSpan("rstd", rstd.size(), b.rows));
  RETURN_IF_ERROR(CheckSpan("dy", dy.size(), b.rows * b.cols));
  RETURN_IF_ERROR(CheckSpan("dx", dx.size(), b.rows * b.cols));
  RETURN_IF_ERROR(CheckSpan("dgamma", dgamma.size(), b.vector));
  RETURN_IF_ERROR(CheckSpan("dbeta", dbeta.size(), b.vector));
  std::vector<float> g(static_cast<size_t>(b.cols));
  RETURN_IF_ERROR(CubeVectorAllGather(comm, direction, dims.hidden, gamma, absl::MakeSpan(g)));

  // Per row: sum(dy * gamma) and sum(dy * gamma * xhat) over all of H
  // (packed [sums | xhat sums], one all-reduce); the parameters' column
  // sums over the local rows.
  std::vector<float> sums(static_cast<size_t>(2 * b.rows), 0.0f);
  std::vector<float> dgamma_cols(static_cast<size_t>(b.cols), 0.0f);
  std::vector<float> dbeta_cols(static_cast<size_t>(b.cols), 0.0f);
  for (int64_t r = 0; r < b.rows; ++r) {
    const float* xr = x.data() + r * b.cols;
    const float* dyr = dy.data() + r * b.cols;
    float g_sum = 0.0f, gx_sum = 0.0f;
    for (int64_t k = 0; k < b.cols; ++k) {
      const float xhat = (xr[k] - mean[r]) * rstd[r];
      const float gk = dyr[k] * g[k];
      g_sum += gk;
      gx_sum += gk * xhat;
      dgamma_cols[k] += dyr[k] * xhat;
      dbeta_cols[k] += dyr[k];
    }
    sums[r] = g_sum;
    sums[b.rows + r] = gx_sum;
  }
  RETURN_IF_ERROR(comm.AllReduce(direction.output, absl::MakeSpan(sums)));
  const float h = static_cast<float>(dims.hidden);
  for (int64_t r = 0; r < b.rows; ++r) {
    const float* xr = x.data() + r * b.cols;
    const float* dyr = dy.data() + r * b.cols;
    float* dxr = dx.data() + r * b.cols;
    const float g_mean = sums[r] / h, gx_mean = sums[b.rows + r] / h;
    for (int64_t k = 0; k < b.cols; ++k) {
      const float xhat = (xr[k] - mean[r]) * rstd[r];
      dxr[k] = rstd[r] * (dyr[k] * g[k] - g_mean - xhat * gx_mean);
    }
  }
  // Algorithm 8 for gamma and beta.
  RETURN_IF_ERROR(CubeVectorReduceGrad(comm, direction, dims.hidden, dgamma_cols, dgamma));
  return CubeVectorReduceGrad(comm, direction, dims.hidden, dbeta_cols, dbeta);
}

}  // namespace pipetrain
