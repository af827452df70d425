// Host side of powersgd.h: argument checks, the Philox start matrix and the
// cuBLAS GEMMs.
//
// cuBLAS is column-major: a row-major X [a, b] is the column-major X^T
// [b, a] with leading dimension b (see linear.cc). Each row-major product is
// therefore computed as its transpose with the operands swapped.
#include "kernels/cuda/powersgd.h"

#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/philox.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/stream_scratch.h"

namespace pipetrain {
namespace {

// Must equal powersgd_codec.cc's kQSeed and stream name: the GPU and CPU
// codecs start from the same Q, so their payloads agree.
constexpr uint64_t kQSeed = 0x5057525347440001ull;
constexpr const char* kQStream = "powersgd_q";
constexpr int kMaxRank = 65536;

absl::Status CheckArgs(const char* op, const CublasHandle& handle, int64_t rows, int64_t cols,
                       int rank) {
  if (rank < 1 || rank > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("powersgd: rank ", rank, " is out of range 1..", kMaxRank));
  }
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (rows < 0 || cols < 0 || rows > kMax || cols > kMax) {
    return absl::InvalidArgumentError(absl::StrCat("powersgd: ", op, " matrix is ", rows, " x ",
                                                   cols, "; both sides must be in 0..2^31-1"));
  }
  if (handle.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "powersgd: ", op, ": the CublasHandle is empty; create it with CublasHandle::Create"));
  }
  return absl::OkStatus();
}

absl::Status CheckPointer(const char* op, const char* name, const void* ptr) {
  if (ptr != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("powersgd: ", op, ": ", name, " is null; it must be a device pointer"));
}

// Q0 on the device: the Philox matrix, or q_warm with its zero columns
// replaced by it (powersgd_codec.cc's StartQ). Scratch from the stream's
// cache (stream_scratch.h): no cudaMalloc, and no cudaFree stalling the
// device, per encode.
absl::StatusOr<StreamScratch> StartQ(const float* q_warm, int64_t cols, int rank,
                                     cudaStream_t stream) {
  std::vector<float> fresh(static_cast<size_t>(cols * rank));
  FillNormal(kQSeed, HashName(kQStream), 0.0f, 1.0f, fresh.data(), cols * rank);
  const size_t bytes = fresh.size() * sizeof(float);
  ASSIGN_OR_RETURN(StreamScratch q0, StreamScratch::Create(bytes, stream));
  // From pageable memory the copy has left `fresh` when the call returns.
  if (q_warm == nullptr) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(q0.get(), fresh.data(), bytes, cudaMemcpyHostToDevice, stream));
    return q0;
  }
  ASSIGN_OR_RETURN(StreamScratch fresh_dev, StreamScratch::Create(bytes, stream));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(fresh_dev.get(), fresh.data(), bytes, cudaMemcpyHostToDevice, stream));
  RETURN_IF_ERROR(
      PowerSgdStartQCuda(q_warm, fresh_dev.as<float>(), cols, rank, q0.as<float>(), stream));
  return q0;
}

}  // namespace

absl::Status PowerSgdEncodeCuda(const CublasHandle& handle, const float* m, int64_t rows,
                                int64_t cols, int rank, const float* q_warm, float* p, float* q) {
  constexpr const char* kOp = "PowerSgdEncodeCuda";
  RETURN_IF_ERROR(CheckArgs(kOp, handle, rows, cols, rank));
  if (rows > 0) RETURN_IF_ERROR(CheckPointer(kOp, "p", p));
  if (cols > 0) RETURN_IF_ERROR(CheckPointer(kOp, "q", q));
  const cudaStream_t stream = handle.stream();
  if (rows == 0 || cols == 0) {
    if (rows > 0) CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p, 0, rows * rank * sizeof(float), stream));
    if (cols > 0 && q != q_warm) {
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(q, 0, cols * rank * sizeof(float), stream));
    }
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CheckPointer(kOp, "m", m));
  RETURN_IF_ERROR(CheckFiniteCuda(m, rows * cols, "powersgd", stream));
  ASSIGN_OR_RETURN(StreamScratch q0, StartQ(q_warm, cols, rank, stream));
  const int n_rows = static_cast<int>(rows), n_cols = static_cast<int>(cols);
  const float one = 1.0f, zero = 0.0f;
  // P [rows, r] = M Q0  <=>  column-major P^T [r, rows] = Q0^T [r, cols] M^T [cols, rows].
  CUBLAS_RETURN_IF_ERROR(cublasSgemm(handle.get(), CUBLAS_OP_N, CUBLAS_OP_N, rank, n_rows, n_cols,
                                     &one, q0.as<float>(), rank, m, n_cols, &zero, p, rank));
  RETURN_IF_ERROR(PowerSgdOrthonormaliseCuda(p, rows, rank, stream));
  // Q [cols, r] = M^T P  <=>  column-major Q^T [r, cols] = P^T [r, rows] M [rows, cols];
  // the stored M is the column-major M^T (ld cols), hence OP_T on it.
  CUBLAS_RETURN_IF_ERROR(cublasSgemm(handle.get(), CUBLAS_OP_N, CUBLAS_OP_T, rank, n_cols, n_rows,
                                     &one, p, rank, m, n_cols, &zero, q, rank));
  // As the CPU codec: Q overflows float for entries near FLT_MAX, refused
  // rather than sent (or kept as a warm start) as Inf.
  RETURN_IF_ERROR(CheckFiniteCuda(q, cols * rank, "powersgd (its factor Q = X^T P)", stream));
  // Done when the stream is (the header's contract; q0 may go back to the
  // cache before that, stream_scratch.h).
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status PowerSgdDecodeCuda(const CublasHandle& handle, const float* p, const float* q,
                                int64_t rows, int64_t cols, int rank, float* out) {
  constexpr const char* kOp = "PowerSgdDecodeCuda";
  RETURN_IF_ERROR(CheckArgs(kOp, handle, rows, cols, rank));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckPointer(kOp, "p", p));
  RETURN_IF_ERROR(CheckPointer(kOp, "q", q));
  RETURN_IF_ERROR(CheckPointer(kOp, "out", out));
  const float one = 1.0f, zero = 0.0f;
  // out [rows, cols] = P Q^T  <=>  column-major out^T [cols, rows] = Q [cols, r] P^T [r, rows];
  // the stored Q is the column-major Q^T (ld r), hence OP_T on it.
  CUBLAS_RETURN_IF_ERROR(cublasSgemm(handle.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(cols),
                                     static_cast<int>(rows), rank, &one, q, rank, p, rank, &zero,
                                     out, static_cast<int>(cols)));
  return absl::OkStatus();
}

}  // namespace pipetrain
