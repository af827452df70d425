#include "kernels/cuda/linear.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/bf16_round.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/linear_bias.h"
#include "kernels/cuda/stream_scratch.h"

// cuBLAS is column-major and the project is row-major. A row-major matrix
// M [r, c] occupies the same memory as the column-major M^T [c, r] with
// leading dimension c. So each row-major product C = A B is computed as the
// column-major C^T = B^T A^T: the operands are swapped, and the transpose
// flags and m/n are those of the transposed problem. No data is transposed.

namespace pipetrain {
namespace {

cublasMath_t MathMode(GemmMode mode) {
  return mode == GemmMode::kTf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
}

// How many elements a GEMM operand's stored matrix spans from its first:
// `rows` x `cols` column-major with leading dimension `ld` (cuBLAS's view).
int64_t Span(int rows, int cols, int ld) {
  return rows == 0 || cols == 0 ? 0 : int64_t{cols - 1} * ld + rows;
}

// A bf16 copy of x[0, span) in scratch on `stream`, laid out as x (so the
// operand's leading dimension still holds). The scratch may go once the
// GEMM that reads it is queued on the same stream (stream_scratch.h).
absl::StatusOr<StreamScratch> Bf16Copy(const float* x, int64_t span, cudaStream_t stream) {
  ASSIGN_OR_RETURN(StreamScratch copy,
                   StreamScratch::Create(static_cast<size_t>(span) * sizeof(uint16_t), stream));
  RETURN_IF_ERROR(RoundToBf16Cuda(x, span, copy.as<uint16_t>(), stream));
  return copy;
}

// Whether every row of the three matrices starts 16-byte aligned (a
// leading dimension that is a multiple of 8 elements), as the tensor cores'
// fast bf16 kernels want.
bool RowsAligned(int lda, int ldb, int ldc) { return lda % 8 == 0 && ldb % 8 == 0 && ldc % 8 == 0; }

// One fp32 GEMM (column-major, cuBLAS's arguments) in the handle's mode:
// cublasSgemm for fp32 and TF32 (the handle's math mode decides); for bf16
// both operands rounded to bf16 copies first (bf16_round.h), then
// cublasGemmEx on them with fp32 accumulation into the fp32 C. Measured on
// an H200 (docs/benchmarks.md): cuBLAS's own narrowing
// (CUBLAS_COMPUTE_32F_FAST_16BF on fp32 operands) ran an 8192^3 product at
// 355 TFLOP/s, bf16 copies at 591, and the GPT-2 layers' GEMMs took 16 ms a
// step instead of 20; but the tied LM head's three products (leading
// dimension 50257, the vocabulary) took 17.6 ms instead of 15.1, so
// unaligned rows keep cuBLAS's narrowing.
absl::Status Gemm(const CublasHandle& h, cublasOperation_t trans_a, cublasOperation_t trans_b,
                  int m, int n, int k, const float* alpha, const float* a, int lda, const float* b,
                  int ldb, const float* beta, float* c, int ldc) {
  if (h.mode() != GemmMode::kBf16) {
    CUBLAS_RETURN_IF_ERROR(
        cublasSgemm(h.get(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
    return absl::OkStatus();
  }
  if (!RowsAligned(lda, ldb, ldc)) {
    CUBLAS_RETURN_IF_ERROR(cublasGemmEx(h.get(), trans_a, trans_b, m, n, k, alpha, a, CUDA_R_32F,
                                        lda, b, CUDA_R_32F, ldb, beta, c, CUDA_R_32F, ldc,
                                        CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  }
  // op(A) is m x k, stored as m x k (OP_N) or k x m (OP_T); op(B), k x n,
  // likewise.
  const int64_t span_a = trans_a == CUBLAS_OP_N ? Span(m, k, lda) : Span(k, m, lda);
  const int64_t span_b = trans_b == CUBLAS_OP_N ? Span(k, n, ldb) : Span(n, k, ldb);
  ASSIGN_OR_RETURN(StreamScratch a16, Bf16Copy(a, span_a, h.stream()));
  ASSIGN_OR_RETURN(StreamScratch b16, Bf16Copy(b, span_b, h.stream()));
  CUBLAS_RETURN_IF_ERROR(cublasGemmEx(h.get(), trans_a, trans_b, m, n, k, alpha, a16.get(),
                                      CUDA_R_16BF, lda, b16.get(), CUDA_R_16BF, ldb, beta, c,
                                      CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

// `batch` of Gemm's products at once (strides in floats). bf16 keeps
// cuBLAS's own narrowing here: the batched products are attention's
// (attention_gemm.h), whose operands are slices of wider rows, so a
// rounded copy would convert the whole rows for every call.
cublasStatus_t GemmBatched(const CublasHandle& h, cublasOperation_t trans_a,
                           cublasOperation_t trans_b, int m, int n, int k, const float* alpha,
                           const float* a, int lda, int64_t stride_a, const float* b, int ldb,
                           int64_t stride_b, const float* beta, float* c, int ldc,
                           int64_t stride_c, int batch) {
  if (h.mode() != GemmMode::kBf16) {
    return cublasSgemmStridedBatched(h.get(), trans_a, trans_b, m, n, k, alpha, a, lda, stride_a,
                                     b, ldb, stride_b, beta, c, ldc, stride_c, batch);
  }
  return cublasGemmStridedBatchedEx(h.get(), trans_a, trans_b, m, n, k, alpha, a, CUDA_R_32F,
                                    lda, stride_a, b, CUDA_R_32F, ldb, stride_b, beta, c,
                                    CUDA_R_32F, ldc, stride_c, batch,
                                    CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT);
}

absl::Status CheckShape(const char* op, int n, int in, int out) {
  if (n >= 0 && in >= 1 && out >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": shape n=", n, " in=", in, " out=", out,
                                                 " needs n >= 0, in >= 1 and out >= 1"));
}

// INVALID_ARGUMENT naming the first null pointer among `named` (when n > 0).
absl::Status CheckPointers(const char* op, int64_t n,
                           std::initializer_list<std::pair<const char*, const void*>> named) {
  if (n == 0) return absl::OkStatus();
  for (const auto& [name, ptr] : named) {
    if (ptr == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", name, " is null; it must be a device pointer when n=", n, " > 0"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckHandle(const char* op, const CublasHandle& handle) {
  if (!handle.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(op,
                   ": the CublasHandle is empty (default-constructed or moved from); "
                   "create it with CublasHandle::Create"));
}

}  // namespace

const char* GemmModeName(GemmMode mode) {
  switch (mode) {
    case GemmMode::kFp32: return "fp32";
    case GemmMode::kTf32: return "tf32";
    case GemmMode::kBf16: return "bf16";
  }
  return "?";
}

absl::StatusOr<CublasHandle> CublasHandle::Create(GemmMode mode, cudaStream_t stream) {
  CublasHandle handle;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle.handle_));
  handle.mode_ = mode;
  CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(handle.handle_, MathMode(mode)));
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle.handle_, stream));
  handle.stream_ = stream;
  return handle;
}

CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      mode_(other.mode_),
      stream_(std::exchange(other.stream_, nullptr)) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    Destroy();
    handle_ = std::exchange(other.handle_, nullptr);
    mode_ = other.mode_;
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

CublasHandle::~CublasHandle() { Destroy(); }

// cublasDestroy's status is dropped: a destructor cannot report it, and it
// only fails when the context is already broken, which the next checked
// call reports.
void CublasHandle::Destroy() {
  if (handle_ != nullptr) cublasDestroy(handle_);
  handle_ = nullptr;
}

absl::Status CublasHandle::SetStream(cudaStream_t stream) {
  if (empty()) return CheckHandle("CublasHandle::SetStream", *this);
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle_, stream));
  stream_ = stream;
  return absl::OkStatus();
}

absl::Status LinearForwardCuda(const CublasHandle& handle, const float* x, const float* w,
                               const float* b, int n, int in, int out, float* y) {
  constexpr const char* kOp = "LinearForwardCuda";
  absl::Status valid = CheckShape(kOp, n, in, out);
  if (valid.ok()) valid = CheckPointers(kOp, n, {{"x", x}, {"w", w}, {"y", y}});
  if (valid.ok()) valid = CheckHandle(kOp, handle);
  if (!valid.ok() || n == 0) return valid;

  float beta = 0.0f;
  if (b != nullptr) {
    // Seed y with the bias rows so the GEMM adds onto it, as on the CPU.
    absl::Status seeded = BroadcastRowsCuda(b, n, out, y, handle.stream());
    if (!seeded.ok()) return seeded;
    beta = 1.0f;
  }
  const float alpha = 1.0f;
  // Row-major y [n, out] = x [n, in] W [in, out]  <=>  column-major
  // y^T [out, n] = W^T [out, in] x^T [in, n]: no transposes, m = out.
  RETURN_IF_ERROR(
      Gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, out, n, in, &alpha, w, out, x, in, &beta, y, out));
  return absl::OkStatus();
}

absl::Status LinearBackwardCuda(const CublasHandle& handle, const float* x, const float* w,
                                const float* dy, int n, int in, int out, float* dx, float* dw,
                                float* db) {
  constexpr const char* kOp = "LinearBackwardCuda";
  absl::Status valid = CheckShape(kOp, n, in, out);
  if (valid.ok()) valid = CheckPointers(kOp, n, {{"x", x}, {"w", w}, {"dy", dy}, {"dw", dw}});
  if (valid.ok()) valid = CheckHandle(kOp, handle);
  if (!valid.ok() || n == 0) return valid;

  const float one = 1.0f;
  const float zero = 0.0f;
  if (dx != nullptr) {
    // Row-major dx [n, in] = dy [n, out] W^T  <=>  column-major
    // dx^T [in, n] = W [in, out] dy^T [out, n]; the stored W is the
    // column-major W^T [out, in] (ld out), hence OP_T on it.
    RETURN_IF_ERROR(
        Gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, in, n, out, &one, w, out, dy, out, &zero, dx, in));
  }
  // Row-major dW [in, out] += x^T [in, n] dy [n, out]  <=>  column-major
  // dW^T [out, in] += dy^T [out, n] x [n, in]; the stored x is the
  // column-major x^T [in, n] (ld in), hence OP_T on it. beta = 1 accumulates.
  RETURN_IF_ERROR(
      Gemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, out, in, n, &one, dy, out, x, in, &one, dw, out));
  if (db != nullptr) return AddColumnSumsCuda(dy, n, out, db, handle.stream());
  return absl::OkStatus();
}

absl::Status SgemmCuda(const CublasHandle& handle, bool trans_a, bool trans_b, int m, int n,
                       int k, float alpha, const float* a, int lda, const float* b, int ldb,
                       float beta, float* c, int ldc) {
  return SgemmStridedBatchedCuda(handle, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0,
                                 beta, c, ldc, 0, 1);
}

absl::Status SgemmStridedBatchedCuda(const CublasHandle& handle, bool trans_a, bool trans_b,
                                     int m, int n, int k, float alpha, const float* a, int lda,
                                     int64_t stride_a, const float* b, int ldb, int64_t stride_b,
                                     float beta, float* c, int ldc, int64_t stride_c, int batch) {
  const char* op = batch == 1 && stride_a == 0 && stride_b == 0 && stride_c == 0
                       ? "SgemmCuda"
                       : "SgemmStridedBatchedCuda";
  // Row widths of the three matrices as stored.
  const int a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, a_cols) || ldb < std::max(1, b_cols) ||
      ldc < std::max(1, n)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": m=", m, " n=", n, " k=", k, " lda=",
                                                   lda, " ldb=", ldb, " ldc=", ldc));
  }
  if (batch < 0 || stride_a < 0 || stride_b < 0 || stride_c < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": batch=", batch, " strides ", stride_a,
                                                   ", ", stride_b, ", ", stride_c,
                                                   " must not be negative"));
  }
  absl::Status valid = CheckPointers(op, int64_t{m} * n * batch, {{"c", c}});
  if (valid.ok() && k > 0) valid = CheckPointers(op, int64_t{m} * n * batch, {{"a", a}, {"b", b}});
  if (valid.ok()) valid = CheckHandle(op, handle);
  if (!valid.ok() || m == 0 || n == 0 || batch == 0) return valid;
  // A row-major matrix is its transpose in column-major order, so row-major
  // C = op(A) op(B) is column-major C^T [n, m] = op(B)^T op(A)^T: swap the
  // operands, keep each one's transpose flag.
  const float alpha_value = alpha, beta_value = beta;
  if (batch == 1) {
    return Gemm(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n,
                m, k, &alpha_value, b, ldb, a, lda, &beta_value, c, ldc);
  }
  CUBLAS_RETURN_IF_ERROR(GemmBatched(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha_value,
                                     b, ldb, stride_b, a, lda, stride_a, &beta_value, c, ldc,
                                     stride_c, batch));
  return absl::OkStatus();
}

}  // namespace pipetrain
