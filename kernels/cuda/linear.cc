#include "kernels/cuda/linear.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <type_traits>
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

// Whether a leading dimension starts every row (cuBLAS's column) 16-byte
// aligned for both bf16 and fp32 elements, as the tensor cores' fast
// kernels want.
bool Aligned(int ld) { return ld % 8 == 0; }

int PaddedLd(int rows) { return std::max(8, (rows + 7) / 8 * 8); }

// A GEMM operand as cuBLAS reads it: its stored matrix (rows x cols,
// column-major, leading dimension ld) and where it lives.
struct Operand {
  const void* data;
  int ld;
  StreamScratch scratch;  // owns a bf16 copy when data points into it
};

// A bf16 copy of the stored rows x cols matrix at x (leading dimension ld)
// in scratch on `stream`: laid out as x (leading dimension ld, all `Span`
// elements rounded) or, with `pad` and an unaligned ld, with the leading
// dimension PaddedLd(rows). The scratch may go once the GEMM that reads it
// is queued on the same stream (stream_scratch.h).
absl::StatusOr<Operand> Bf16Copy(const float* x, int rows, int cols, int ld, bool pad,
                                 cudaStream_t stream) {
  Operand out{nullptr, ld, {}};
  if (pad && !Aligned(ld)) {
    out.ld = PaddedLd(rows);
    ASSIGN_OR_RETURN(
        out.scratch,
        StreamScratch::Create(static_cast<size_t>(out.ld) * cols * sizeof(uint16_t), stream));
    RETURN_IF_ERROR(
        RoundToBf16StridedCuda(x, cols, rows, ld, out.scratch.as<uint16_t>(), out.ld, stream));
  } else {
    ASSIGN_OR_RETURN(out.scratch, Bf16CopyCuda(x, Span(rows, cols, ld), stream));
  }
  out.data = out.scratch.get();
  return out;
}

// cublasGemmEx on bf16 operands with fp32 accumulation into the fp32 C.
cublasStatus_t GemmOnCopies(const CublasHandle& h, cublasOperation_t trans_a,
                            cublasOperation_t trans_b, int m, int n, int k, const float* alpha,
                            const Operand& a, const Operand& b, const float* beta, float* c,
                            int ldc) {
  return cublasGemmEx(h.get(), trans_a, trans_b, m, n, k, alpha, a.data, CUDA_R_16BF, a.ld, b.data,
                      CUDA_R_16BF, b.ld, beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
}

// One fp32 GEMM (column-major, cuBLAS's arguments) in the handle's mode:
// cublasSgemm for fp32 and TF32 (the handle's math mode decides); for bf16
// as the handle's Bf16Operands says (linear.h).
absl::Status Gemm(const CublasHandle& h, cublasOperation_t trans_a, cublasOperation_t trans_b,
                  int m, int n, int k, const float* alpha, const float* a, int lda, const float* b,
                  int ldb, const float* beta, float* c, int ldc) {
  if (h.mode() != GemmMode::kBf16) {
    CUBLAS_RETURN_IF_ERROR(
        cublasSgemm(h.get(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
    return absl::OkStatus();
  }
  const Bf16Operands how = h.bf16_operands();
  if (how == Bf16Operands::kCublasNarrows ||
      (how == Bf16Operands::kAlignedCopies && !(Aligned(lda) && Aligned(ldb) && Aligned(ldc)))) {
    CUBLAS_RETURN_IF_ERROR(cublasGemmEx(h.get(), trans_a, trans_b, m, n, k, alpha, a, CUDA_R_32F,
                                        lda, b, CUDA_R_32F, ldb, beta, c, CUDA_R_32F, ldc,
                                        CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  }
  const bool pad = how == Bf16Operands::kPaddedCopies;
  const cudaStream_t stream = h.stream();
  // op(A) is m x k, stored as m x k (OP_N) or k x m (OP_T); op(B), k x n,
  // likewise.
  const bool a_plain = trans_a == CUBLAS_OP_N, b_plain = trans_b == CUBLAS_OP_N;
  ASSIGN_OR_RETURN(Operand a16, Bf16Copy(a, a_plain ? m : k, a_plain ? k : m, lda, pad, stream));
  ASSIGN_OR_RETURN(Operand b16, Bf16Copy(b, b_plain ? k : n, b_plain ? n : k, ldb, pad, stream));
  if (!pad || Aligned(ldc)) {
    CUBLAS_RETURN_IF_ERROR(
        GemmOnCopies(h, trans_a, trans_b, m, n, k, alpha, a16, b16, beta, c, ldc));
    return absl::OkStatus();
  }
  // C (m x n, leading dimension ldc) through an aligned scratch copy.
  const int padded_ldc = PaddedLd(m);
  ASSIGN_OR_RETURN(
      StreamScratch c32,
      StreamScratch::Create(static_cast<size_t>(padded_ldc) * n * sizeof(float), stream));
  const size_t row_bytes = static_cast<size_t>(m) * sizeof(float);
  if (*beta != 0.0f) {
    CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(c32.get(), padded_ldc * sizeof(float), c,
                                           ldc * sizeof(float), row_bytes, n,
                                           cudaMemcpyDeviceToDevice, stream));
  }
  CUBLAS_RETURN_IF_ERROR(GemmOnCopies(h, trans_a, trans_b, m, n, k, alpha, a16, b16, beta,
                                      c32.as<float>(), padded_ldc));
  CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(c, ldc * sizeof(float), c32.get(),
                                         padded_ldc * sizeof(float), row_bytes, n,
                                         cudaMemcpyDeviceToDevice, stream));
  return absl::OkStatus();
}

std::atomic<int64_t> bias_epilogue_products{0};

// cuBLASLt's descriptors, destroyed with their owners.
using LtMatmulDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>,
                                     decltype(&cublasLtMatmulDescDestroy)>;
using LtLayout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>,
                                 decltype(&cublasLtMatrixLayoutDestroy)>;
using LtPreference = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                                     decltype(&cublasLtMatmulPreferenceDestroy)>;

// Workspace a cuBLASLt algorithm may ask for (Hopper's larger kernels use
// up to 32 MiB); taken from the stream's scratch cache for each call.
constexpr uint64_t kLtWorkspaceBytes = uint64_t{32} << 20;

// The largest power of two, at most 256, that divides p's address: what
// cuBLASLt's heuristic may assume of an operand (it does not see the
// pointers themselves).
uint32_t AlignmentOf(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

absl::StatusOr<LtLayout> MakeLtLayout(cudaDataType type, int rows, int cols, int ld) {
  cublasLtMatrixLayout_t raw = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&raw, type, rows, cols, ld));
  return LtLayout(raw, &cublasLtMatrixLayoutDestroy);
}

template <typename T>
cublasStatus_t SetLtAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t name,
                              const T& value) {
  return cublasLtMatmulDescSetAttribute(desc, name, &value, sizeof(value));
}

template <typename T>
cublasStatus_t SetLtPreference(cublasLtMatmulPreference_t pref,
                               cublasLtMatmulPreferenceAttributes_t name, const T& value) {
  return cublasLtMatmulPreferenceSetAttribute(pref, name, &value, sizeof(value));
}

// BiasEpilogue::kCublasLt's product (linear.h): column-major y^T [out, n]
// = W^T [out, in] x^T [in, n] on bf16 copies of w and x, plus residual^T
// as C (beta 1) when given, plus b broadcast over the columns in the
// epilogue (CUBLASLT_EPILOGUE_BIAS; b has `out` elements, one per row of
// y^T). The caller checked the shapes and that every leading dimension
// (out, in) is a multiple of 8. UNIMPLEMENTED when cuBLASLt has no
// algorithm for it (its heuristic finds none or answers NOT_SUPPORTED, or
// the matmul does: CublasStatus) or `b` is not 16-byte aligned (the
// epilogue's bias loads assume it, and the heuristic never sees the
// pointer; every parameter has its own allocation today, but a slice of
// one need not): the caller then seeds y and calls Gemm. Other errors as
// Gemm's.
absl::Status LtBiasForward(const CublasHandle& h, const float* x, const float* w, const float* b,
                           const float* residual, int n, int in, int out, float* y) {
  if (AlignmentOf(b) < 16) {
    return absl::UnimplementedError("cuBLASLt bias epilogue: the bias is not 16-byte aligned");
  }
  const cudaStream_t stream = h.stream();
  cublasLtMatmulDesc_t raw_desc = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const LtMatmulDesc desc(raw_desc, &cublasLtMatmulDescDestroy);
  const cublasOperation_t plain = CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  const int32_t bias_type = CUDA_R_32F;
  // The bias pointer before the heuristic: it reads its alignment.
  CUBLAS_RETURN_IF_ERROR(SetLtAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, plain));
  CUBLAS_RETURN_IF_ERROR(SetLtAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, plain));
  CUBLAS_RETURN_IF_ERROR(SetLtAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue));
  CUBLAS_RETURN_IF_ERROR(SetLtAttribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, b));
  CUBLAS_RETURN_IF_ERROR(
      SetLtAttribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type));
  ASSIGN_OR_RETURN(LtLayout a_layout, MakeLtLayout(CUDA_R_16BF, out, in, out));
  ASSIGN_OR_RETURN(LtLayout b_layout, MakeLtLayout(CUDA_R_16BF, in, n, in));
  ASSIGN_OR_RETURN(LtLayout c_layout, MakeLtLayout(CUDA_R_32F, out, n, out));
  ASSIGN_OR_RETURN(Operand w16, Bf16Copy(w, out, in, out, /*pad=*/false, stream));
  ASSIGN_OR_RETURN(Operand x16, Bf16Copy(x, in, n, in, /*pad=*/false, stream));
  const float* c = residual != nullptr ? residual : y;  // not read when beta is 0

  cublasLtMatmulPreference_t raw_pref = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&raw_pref));
  const LtPreference pref(raw_pref, &cublasLtMatmulPreferenceDestroy);
  CUBLAS_RETURN_IF_ERROR(
      SetLtPreference(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kLtWorkspaceBytes));
  CUBLAS_RETURN_IF_ERROR(SetLtPreference(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                         AlignmentOf(w16.data)));
  CUBLAS_RETURN_IF_ERROR(SetLtPreference(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                         AlignmentOf(x16.data)));
  CUBLAS_RETURN_IF_ERROR(
      SetLtPreference(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, AlignmentOf(c)));
  CUBLAS_RETURN_IF_ERROR(
      SetLtPreference(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, AlignmentOf(y)));
  cublasLtMatmulHeuristicResult_t chosen{};
  int found = 0;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(
      h.lt(), desc.get(), a_layout.get(), b_layout.get(), c_layout.get(), c_layout.get(),
      pref.get(), 1, &chosen, &found));
  if (found < 1 || chosen.state != CUBLAS_STATUS_SUCCESS) {
    return absl::UnimplementedError(
        absl::StrCat("cuBLASLt: no bias-epilogue algorithm for n=", n, " in=", in, " out=", out));
  }
  StreamScratch workspace;
  if (chosen.workspaceSize > 0) {
    ASSIGN_OR_RETURN(workspace, StreamScratch::Create(chosen.workspaceSize, stream));
  }
  const float alpha = 1.0f, beta = residual != nullptr ? 1.0f : 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(h.lt(), desc.get(), &alpha, w16.data, a_layout.get(),
                                        x16.data, b_layout.get(), &beta, c, c_layout.get(), y,
                                        c_layout.get(), &chosen.algo, workspace.get(),
                                        chosen.workspaceSize, stream));
  bias_epilogue_products.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

// `batch` of Gemm's products at once (strides in floats). bf16 keeps
// cuBLAS's own narrowing here whatever the handle's Bf16Operands: the
// batched products are attention's (attention_gemm.h), whose operands are
// slices of wider rows, so a rounded copy would convert the whole rows for
// every call.
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

// A row-major product's sizes: m, n, k >= 0 and row strides at least the
// stored rows' widths (SgemmCuda's, SgemmStridedBatchedCuda's and
// SgemmBf16Cuda's first check).
absl::Status CheckGemmSizes(const char* op, bool trans_a, bool trans_b, int m, int n, int k,
                            int lda, int ldb, int ldc) {
  // Row widths of the three matrices as stored.
  const int a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
  if (m >= 0 && n >= 0 && k >= 0 && lda >= std::max(1, a_cols) && ldb >= std::max(1, b_cols) &&
      ldc >= std::max(1, n)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": m=", m, " n=", n, " k=", k, " lda=", lda, " ldb=", ldb, " ldc=", ldc));
}

// Their pointers for `outputs` output elements (c whenever there is one; a
// and b too when k > 0), then the handle (the same functions' last check).
absl::Status CheckGemmOperands(const char* op, const CublasHandle& handle, int64_t outputs, int k,
                               const void* a, const void* b, const void* c) {
  absl::Status valid = CheckPointers(op, outputs, {{"c", c}});
  if (valid.ok() && k > 0) valid = CheckPointers(op, outputs, {{"a", a}, {"b", b}});
  if (valid.ok()) valid = CheckHandle(op, handle);
  return valid;
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

const char* Bf16OperandsName(Bf16Operands operands) {
  switch (operands) {
    case Bf16Operands::kCublasNarrows:
      return "cublas";
    case Bf16Operands::kAlignedCopies:
      return "aligned-copies";
    case Bf16Operands::kCopies:
      return "copies";
    case Bf16Operands::kPaddedCopies:
      return "padded-copies";
  }
  return "?";
}

absl::StatusOr<Bf16Operands> ParseBf16Operands(const std::string& name) {
  for (Bf16Operands operands : {Bf16Operands::kCublasNarrows, Bf16Operands::kAlignedCopies,
                                Bf16Operands::kCopies, Bf16Operands::kPaddedCopies}) {
    if (name == Bf16OperandsName(operands)) return operands;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "bf16 operands \"", name, "\": want cublas, aligned-copies, copies or padded-copies"));
}

const char* BiasEpilogueName(BiasEpilogue epilogue) {
  switch (epilogue) {
    case BiasEpilogue::kSeed:
      return "seed";
    case BiasEpilogue::kCublasLt:
      return "cublaslt";
  }
  return "?";
}

int64_t BiasEpilogueProducts() { return bias_epilogue_products.load(std::memory_order_relaxed); }

absl::StatusOr<BiasEpilogue> ParseBiasEpilogue(const std::string& name) {
  for (BiasEpilogue epilogue : {BiasEpilogue::kSeed, BiasEpilogue::kCublasLt}) {
    if (name == BiasEpilogueName(epilogue)) return epilogue;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("bias epilogue \"", name, "\": want seed or cublaslt"));
}

absl::StatusOr<CublasHandle> CublasHandle::Create(GemmMode mode, cudaStream_t stream) {
  Bf16Operands operands = Bf16Operands::kAlignedCopies;
  if (const char* named = std::getenv("PIPETRAIN_BF16_OPERANDS"); named != nullptr) {
    absl::StatusOr<Bf16Operands> parsed = ParseBf16Operands(named);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("PIPETRAIN_BF16_OPERANDS: ", parsed.status().message()));
    }
    operands = *parsed;
  }
  BiasEpilogue epilogue = BiasEpilogue::kSeed;
  if (const char* named = std::getenv("PIPETRAIN_BIAS_EPILOGUE"); named != nullptr) {
    absl::StatusOr<BiasEpilogue> parsed = ParseBiasEpilogue(named);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("PIPETRAIN_BIAS_EPILOGUE: ", parsed.status().message()));
    }
    epilogue = *parsed;
  }
  CublasHandle handle;
  handle.bf16_operands_ = operands;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle.handle_));
  handle.mode_ = mode;
  CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(handle.handle_, MathMode(mode)));
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle.handle_, stream));
  handle.stream_ = stream;
  RETURN_IF_ERROR(handle.SetBiasEpilogue(epilogue));
  return handle;
}

CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      mode_(other.mode_),
      stream_(std::exchange(other.stream_, nullptr)),
      bf16_operands_(other.bf16_operands_),
      bias_epilogue_(other.bias_epilogue_),
      lt_(std::exchange(other.lt_, nullptr)) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    Destroy();
    handle_ = std::exchange(other.handle_, nullptr);
    mode_ = other.mode_;
    stream_ = std::exchange(other.stream_, nullptr);
    bf16_operands_ = other.bf16_operands_;
    bias_epilogue_ = other.bias_epilogue_;
    lt_ = std::exchange(other.lt_, nullptr);
  }
  return *this;
}

CublasHandle::~CublasHandle() { Destroy(); }

// cublasDestroy's status is dropped: a destructor cannot report it, and it
// only fails when the context is already broken, which the next checked
// call reports.
void CublasHandle::Destroy() {
  if (lt_ != nullptr) cublasLtDestroy(lt_);
  lt_ = nullptr;
  if (handle_ != nullptr) cublasDestroy(handle_);
  handle_ = nullptr;
}

absl::Status CublasHandle::SetBiasEpilogue(BiasEpilogue epilogue) {
  if (empty()) return CheckHandle("CublasHandle::SetBiasEpilogue", *this);
  if (epilogue == BiasEpilogue::kCublasLt && lt_ == nullptr) {
    CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&lt_));
  }
  bias_epilogue_ = epilogue;
  return absl::OkStatus();
}

absl::Status CublasHandle::SetStream(cudaStream_t stream) {
  if (empty()) return CheckHandle("CublasHandle::SetStream", *this);
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle_, stream));
  stream_ = stream;
  return absl::OkStatus();
}

absl::Status LinearForwardCuda(const CublasHandle& handle, const float* x, const float* w,
                               const float* b, int n, int in, int out, float* y) {
  return LinearForwardResidualCuda(handle, x, w, b, nullptr, n, in, out, y);
}

// residual may be null here (LinearForwardCuda): then y is seeded with the
// bias alone, or not at all.
absl::Status LinearForwardResidualCuda(const CublasHandle& handle, const float* x, const float* w,
                                       const float* b, const float* residual, int n, int in,
                                       int out, float* y) {
  const char* op = residual != nullptr ? "LinearForwardResidualCuda" : "LinearForwardCuda";
  absl::Status valid = CheckShape(op, n, in, out);
  if (valid.ok()) valid = CheckPointers(op, n, {{"x", x}, {"w", w}, {"y", y}});
  if (valid.ok()) valid = CheckHandle(op, handle);
  if (!valid.ok() || n == 0) return valid;

  if (b != nullptr && handle.bias_epilogue() == BiasEpilogue::kCublasLt && Aligned(in) &&
      Aligned(out) && MultipliesBf16Copies(handle, {out, in})) {
    // The bias in the product's epilogue, the residual as its C.
    const absl::Status fused = LtBiasForward(handle, x, w, b, residual, n, in, out, y);
    if (fused.code() != absl::StatusCode::kUnimplemented) return fused;
  }
  float beta = 0.0f;
  if (residual != nullptr) {
    // Seed y with the residual (and the bias): the GEMM adds x W onto it.
    RETURN_IF_ERROR(ResidualRowsCuda(residual, b, n, out, y, handle.stream()));
    beta = 1.0f;
  } else if (b != nullptr) {
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
  if (MultipliesBf16Copies(handle, {out, in})) {
    // Both products read dy: round it to bf16 once, not once per product
    // (the same copies and GEMMs as the general path below, so the same
    // bits), and with a bias in the pass that sums db (the same sums as
    // AddColumnSumsCuda): dy is read once. Column-major views as below:
    // dy^T [out, n], W^T [out, in], x^T [in, n], each stored with the
    // leading dimension its rows give.
    const cudaStream_t stream = handle.stream();
    Operand dy16{nullptr, out, {}};
    if (db != nullptr) {
      ASSIGN_OR_RETURN(dy16.scratch, StreamScratch::Create(
                                         static_cast<size_t>(n) * out * sizeof(uint16_t), stream));
      RETURN_IF_ERROR(
          AddColumnSumsRoundingCuda(dy, n, out, db, dy16.scratch.as<uint16_t>(), stream));
      dy16.data = dy16.scratch.get();
    } else {
      ASSIGN_OR_RETURN(dy16, Bf16Copy(dy, out, n, out, /*pad=*/false, stream));
    }
    if (dx != nullptr) {
      ASSIGN_OR_RETURN(Operand w16, Bf16Copy(w, out, in, out, /*pad=*/false, stream));
      CUBLAS_RETURN_IF_ERROR(GemmOnCopies(handle, CUBLAS_OP_T, CUBLAS_OP_N, in, n, out, &one, w16,
                                          dy16, &zero, dx, in));
    }
    ASSIGN_OR_RETURN(Operand x16, Bf16Copy(x, in, n, in, /*pad=*/false, stream));
    CUBLAS_RETURN_IF_ERROR(
        GemmOnCopies(handle, CUBLAS_OP_N, CUBLAS_OP_T, out, in, n, &one, dy16, x16, &one, dw, out));
    return absl::OkStatus();
  }
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

bool MultipliesBf16Copies(const CublasHandle& handle, std::initializer_list<int> strides) {
  if (handle.mode() != GemmMode::kBf16) return false;
  const Bf16Operands how = handle.bf16_operands();
  if (how == Bf16Operands::kCopies) return true;
  if (how != Bf16Operands::kAlignedCopies) return false;
  for (int stride : strides) {
    if (!Aligned(stride)) return false;
  }
  return true;
}

absl::Status SgemmBf16Cuda(const CublasHandle& handle, bool trans_a, bool trans_b, int m, int n,
                           int k, float alpha, const uint16_t* a, int lda, const uint16_t* b,
                           int ldb, float beta, float* c, int ldc) {
  constexpr const char* kOp = "SgemmBf16Cuda";
  RETURN_IF_ERROR(CheckGemmSizes(kOp, trans_a, trans_b, m, n, k, lda, ldb, ldc));
  absl::Status valid = CheckGemmOperands(kOp, handle, int64_t{m} * n, k, a, b, c);
  if (!valid.ok() || m == 0 || n == 0) return valid;
  // Row-major to column-major as SgemmStridedBatchedCuda: swap the operands.
  const Operand a16{a, lda, {}}, b16{b, ldb, {}};
  CUBLAS_RETURN_IF_ERROR(GemmOnCopies(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b16,
                                      a16, &beta, c, ldc));
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
  RETURN_IF_ERROR(CheckGemmSizes(op, trans_a, trans_b, m, n, k, lda, ldb, ldc));
  if (batch < 0 || stride_a < 0 || stride_b < 0 || stride_c < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": batch=", batch, " strides ", stride_a,
                                                   ", ", stride_b, ", ", stride_c,
                                                   " must not be negative"));
  }
  absl::Status valid = CheckGemmOperands(op, handle, int64_t{m} * n * batch, k, a, b, c);
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
