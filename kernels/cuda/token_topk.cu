// Device side of token_topk.h: scores, rank counting, kept indices, and the
// row gather/scatter. The keep -> count rounding is host code in
// token_topk.cc (it calls the CPU codec's TopKCount).
#include <climits>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/token_topk.h"

namespace pipetrain {
namespace {

constexpr unsigned long long kNoBadScore = ULLONG_MAX;
constexpr int kRankThreads = 256;   // tile width of the rank count
constexpr int kIndexThreads = 1024;  // the one block of the index pass

// The first non-finite score (integer atomicMin: order-independent).
__global__ void FirstNonFiniteKernel(const float* s, int64_t n, unsigned long long* first_bad) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    if (!isfinite(s[i])) {
      atomicMin(first_bad, static_cast<unsigned long long>(i));
      return;  // Later indices of this thread are larger.
    }
  }
}

// The CPU's squared norm, same order and roundings (no FMA: -fmad=false).
__global__ void SquaredNormKernel(const float* x, int64_t tokens, int64_t d, double* score) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < tokens;
       t += stride) {
    const float* row = x + t * d;
    double sum = 0;
    for (int64_t j = 0; j < d; ++j) sum += double{row[j]} * row[j];
    score[t] = sum;
  }
}

// mask[i] = 1 iff fewer than `kept` tokens come before i in the order
// (score descending, index ascending). The scores pass through shared
// memory one 256-wide tile at a time.
template <typename T>
__global__ void RankKernel(const T* s, int64_t n, int64_t kept, uint8_t* mask) {
  __shared__ T tile[kRankThreads];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kRankThreads + threadIdx.x;
  const T mine = i < n ? s[i] : T{0};
  int64_t rank = 0;
  for (int64_t base = 0; base < n; base += kRankThreads) {
    const int64_t j = base + threadIdx.x;
    tile[threadIdx.x] = j < n ? s[j] : T{0};
    __syncthreads();
    const int64_t width = min(static_cast<int64_t>(kRankThreads), n - base);
    if (i < n && rank < kept) {
      for (int k = 0; k < width; ++k) {
        const T other = tile[k];
        rank += (other > mine || (other == mine && base + k < i)) ? 1 : 0;
      }
    }
    __syncthreads();
  }
  if (i < n) mask[i] = rank < kept ? 1 : 0;
}

// One block: kept_index = the positions of the set mask bytes, ascending.
// Each thread counts a contiguous chunk; thread 0 turns the counts into
// offsets; each thread then writes its chunk's indices, never past `kept`
// (a mask of more set bytes, from scores with a NaN, which the callers
// reject first, would otherwise overrun kept_index). The launch bound keeps
// the registers within what a block of kIndexThreads may have.
__global__ void __launch_bounds__(kIndexThreads)
    KeptIndexKernel(const uint8_t* mask, int64_t n, int64_t kept, int64_t* kept_index) {
  __shared__ int64_t offset[kIndexThreads];
  const int64_t chunk = (n + kIndexThreads - 1) / kIndexThreads;
  const int64_t begin = min(n, threadIdx.x * chunk);
  const int64_t end = min(n, begin + chunk);
  int64_t count = 0;
  for (int64_t i = begin; i < end; ++i) count += mask[i];
  offset[threadIdx.x] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t sum = 0;
    for (int t = 0; t < kIndexThreads; ++t) {
      const int64_t c = offset[t];
      offset[t] = sum;
      sum += c;
    }
  }
  __syncthreads();
  int64_t pos = offset[threadIdx.x];
  for (int64_t i = begin; i < end && pos < kept; ++i) {
    if (mask[i]) kept_index[pos++] = i;
  }
}

__global__ void GatherKernel(const float* x, int64_t d, const int64_t* kept_index, int64_t n,
                             float* rows) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += stride) {
    rows[e] = x[kept_index[e / d] * d + e % d];
  }
}

__global__ void ScatterKernel(const float* rows, int64_t d, const int64_t* kept_index, int64_t n,
                              float* out) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += stride) {
    out[kept_index[e / d] * d + e % d] = rows[e];
  }
}

absl::Status CheckCounts(const char* op, int64_t tokens, int64_t kept) {
  if (tokens >= 0 && kept >= 0 && kept <= tokens) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": kept=", kept, " of tokens=", tokens, "; needs 0 <= kept <= tokens"));
}

// INVALID_ARGUMENT naming the first non-finite score, as the CPU codec.
absl::Status CheckScores(const float* scores, int64_t tokens, cudaStream_t stream) {
  ASSIGN_OR_RETURN(StreamScratch flag_block,
                   StreamScratch::Create(sizeof(unsigned long long), stream));
  unsigned long long* flag = flag_block.as<unsigned long long>();
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flag, 0xff, sizeof(unsigned long long), stream));
  FirstNonFiniteKernel<<<ElementwiseBlocks(tokens), kElementwiseThreads, 0, stream>>>(
      scores, tokens, flag);
  CUDA_CHECK_LAUNCH("FirstNonFiniteKernel");
  unsigned long long first_bad = kNoBadScore;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&first_bad, flag, sizeof(first_bad),
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (first_bad == kNoBadScore) return absl::OkStatus();
  float value = 0.0f;
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(&value, scores + first_bad, sizeof(float), cudaMemcpyDeviceToHost));
  return absl::InvalidArgumentError(absl::StrCat("token_topk: scores[", first_bad, "] is ",
                                                 double{value}, "; scores must be finite"));
}

// Rank mask, then kept indices; waits for `stream`.
template <typename T>
absl::Status Select(const T* scores, int64_t tokens, int64_t kept, uint8_t* mask,
                    int64_t* kept_index, cudaStream_t stream) {
  const int64_t blocks = (tokens + kRankThreads - 1) / kRankThreads;
  RankKernel<T><<<static_cast<unsigned>(blocks), kRankThreads, 0, stream>>>(scores, tokens, kept,
                                                                            mask);
  CUDA_CHECK_LAUNCH("RankKernel");
  KeptIndexKernel<<<1, kIndexThreads, 0, stream>>>(mask, tokens, kept, kept_index);
  CUDA_CHECK_LAUNCH("KeptIndexKernel");
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

}  // namespace

absl::Status TokenTopKSelectCuda(const float* scores, int64_t tokens, int64_t kept,
                                 uint8_t* mask, int64_t* kept_index, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckCounts("TokenTopKSelectCuda", tokens, kept));
  if (tokens == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckScores(scores, tokens, stream));
  return Select(scores, tokens, kept, mask, kept_index, stream);
}

absl::Status TokenTopKSelectByNormCuda(const float* x, int64_t tokens, int64_t d, int64_t kept,
                                       uint8_t* mask, int64_t* kept_index, cudaStream_t stream) {
  constexpr const char* kOp = "TokenTopKSelectByNormCuda";
  RETURN_IF_ERROR(CheckCounts(kOp, tokens, kept));
  if (d < 1) return absl::InvalidArgumentError(absl::StrCat(kOp, ": d=", d, " must be >= 1"));
  if (tokens == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(StreamScratch score_block,
                   StreamScratch::Create(static_cast<size_t>(tokens) * sizeof(double), stream));
  double* score = score_block.as<double>();
  SquaredNormKernel<<<ElementwiseBlocks(tokens), kElementwiseThreads, 0, stream>>>(x, tokens, d,
                                                                                   score);
  CUDA_CHECK_LAUNCH("SquaredNormKernel");
  return Select(score, tokens, kept, mask, kept_index, stream);
}

absl::Status TokenGatherCuda(const float* x, int64_t d, const int64_t* kept_index, int64_t kept,
                             float* rows, cudaStream_t stream) {
  if (kept < 0 || d < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TokenGatherCuda: kept=", kept, " d=", d, "; needs kept >= 0, d >= 1"));
  }
  if (kept == 0) return absl::OkStatus();
  const int64_t n = kept * d;
  GatherKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(x, d, kept_index, n,
                                                                         rows);
  CUDA_CHECK_LAUNCH("GatherKernel");
  return absl::OkStatus();
}

absl::Status TokenScatterCuda(const float* rows, int64_t d, const int64_t* kept_index,
                              int64_t kept, int64_t tokens, float* out, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckCounts("TokenScatterCuda", tokens, kept));
  if (d < 1) {
    return absl::InvalidArgumentError(absl::StrCat("TokenScatterCuda: d=", d, " must be >= 1"));
  }
  if (tokens == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(out, 0, static_cast<size_t>(tokens * d) * sizeof(float), stream));
  if (kept == 0) return absl::OkStatus();
  const int64_t n = kept * d;
  ScatterKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(rows, d, kept_index, n,
                                                                          out);
  CUDA_CHECK_LAUNCH("ScatterKernel");
  return absl::OkStatus();
}

}  // namespace pipetrain
