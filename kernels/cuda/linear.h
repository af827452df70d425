// Linear layer on the GPU through cuBLAS, the CUDA twin of
// kernels/cpu/linear.h (GPT-2's Conv1D layout, W stored [in, out]):
//   forward:  y = x W + b
//   backward: dx = dy W^T (written), dW += x^T dy, db += column sums of dy
//             (both ACCUMULATED, so micro-batch gradients sum over calls).
// Shapes: x [n, in], w [in, out], b [out], y [n, out], dy [n, out],
// dx [n, in], dw [in, out], db [out]; row-major, device pointers.
// kernels/cuda/linear_test.cc checks both against the CPU versions.
//
// GemmMode picks cuBLAS's math mode for every GEMM on a handle:
//   kFp32: CUBLAS_DEFAULT_MATH, fp32 inputs and accumulation (no TF32
//          unless NVIDIA_TF32_OVERRIDE forces it process-wide).
//   kTf32: CUBLAS_TF32_TENSOR_OP_MATH, inputs reduced to TF32 (10-bit
//          mantissa) on the tensor cores, fp32 accumulation; faster, with
//          relative error about 2^-11 per input.
//   kBf16: fp32 tensors in and out, inputs reduced to bf16 (7-bit
//          mantissa) on the tensor cores, fp32 accumulation; relative error
//          at most 2^-7 per input. How the operands reach cuBLAS is the
//          handle's Bf16Operands (below). Only the GEMMs of this file use
//          the mode; other cuBLAS calls on a bf16 handle (PowerSGD) run fp32.
// The bias kernels run in fp32 in every mode.
//
// Determinism: cuBLAS gives bitwise-equal results run to run on the same GPU
// model and toolkit when a handle is used from one stream at a time; the
// bias kernels use no atomics. So a layer is bitwise deterministic.
#ifndef PIPETRAIN_KERNELS_CUDA_LINEAR_H_
#define PIPETRAIN_KERNELS_CUDA_LINEAR_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipetrain {

enum class GemmMode { kFp32, kTf32, kBf16 };

// "fp32", "tf32" or "bf16", for logs and test names.
const char* GemmModeName(GemmMode mode);

// How a kBf16 handle's single GEMMs feed the tensor cores (batched ones,
// attention's, always use kCublasNarrows: their operands are slices of
// wider rows). Measured on an H200 (docs/benchmarks.md): an 8192^3 product
// ran at 355 TFLOP/s with kCublasNarrows and 591 with bf16 copies; in the
// GPT-2 124M step copies made the layers' GEMMs faster (19.7 -> 15.9 ms)
// and the LM head's, whose rows are 50257 floats, slower (15.1 -> 17.6 ms).
enum class Bf16Operands {
  // "cublas": fp32 operands, narrowed by cuBLAS
  // (CUBLAS_COMPUTE_32F_FAST_16BF).
  kCublasNarrows,
  // "aligned-copies", the default: where every matrix's rows start 16-byte
  // aligned (leading dimensions multiples of 8), both operands rounded to
  // bf16 copies (to nearest even, bf16_round.h) in stream scratch and
  // multiplied with cublasGemmEx (CUBLAS_COMPUTE_32F); else kCublasNarrows.
  kAlignedCopies,
  // "copies": bf16 copies whatever the alignment.
  kCopies,
  // "padded-copies": bf16 copies whose leading dimensions are padded to
  // multiples of 8, and an unaligned C computed in padded scratch and
  // copied back (its old values copied in first when beta != 0).
  kPaddedCopies,
};

// The names above, for logs and PIPETRAIN_BF16_OPERANDS.
const char* Bf16OperandsName(Bf16Operands operands);

// The value named `name`; INVALID_ARGUMENT listing the names otherwise.
absl::StatusOr<Bf16Operands> ParseBf16Operands(const std::string& name);

// How LinearForwardCuda and LinearForwardResidualCuda add a bias on a
// kBf16 handle whose product multiplies bf16 copies (MultipliesBf16Copies).
enum class BiasEpilogue {
  // "seed", the default: a pass of its own writes the bias (plus the
  // residual) into every row of y, and the GEMM adds x W onto it (beta =
  // 1): y is written, read and written again.
  kSeed,
  // "cublaslt": one cublasLtMatmul adds the bias in its epilogue
  // (CUBLASLT_EPILOGUE_BIAS) and takes the residual as its C, so y is
  // written once: about 3 GB less traffic a GPT-2 124M step at batch 8
  // (an estimate; the GPU bundle's bench has a row for it). The sums
  // round in cuBLASLt's order, within the GEMM's tolerance of the seeded
  // ones, bitwise the same run to run. Where a leading dimension is not a
  // multiple of 8, or cuBLASLt offers no algorithm, the seeded path runs.
  kCublasLt,
};

// "seed" or "cublaslt", for logs and PIPETRAIN_BIAS_EPILOGUE.
const char* BiasEpilogueName(BiasEpilogue epilogue);

// How many products this process has run through kCublasLt's epilogue
// (tests and benchmarks: a fallback to the seeded path is not counted).
int64_t BiasEpilogueProducts();

// The value named `name`; INVALID_ARGUMENT listing the names otherwise.
absl::StatusOr<BiasEpilogue> ParseBiasEpilogue(const std::string& name);

// Owns one cuBLAS handle bound to a stream and a GemmMode.
//
// Thread-compatible: use a handle from one host thread at a time (cuBLAS
// keeps per-handle state such as the stream and workspace); create one per
// thread or stream. Destroy it before the CUDA context goes (not in a static
// destructor). A default-constructed or moved-from handle is empty: every
// Linear*Cuda call on it returns FAILED_PRECONDITION.
class CublasHandle {
 public:
  // A handle whose GEMMs run on `stream` (nullptr: the legacy default
  // stream) in `mode`, with the Bf16Operands named by the environment
  // variable PIPETRAIN_BF16_OPERANDS (a benchmarking knob) or
  // kAlignedCopies, and the BiasEpilogue named by PIPETRAIN_BIAS_EPILOGUE
  // (another) or kSeed. INTERNAL if cublasCreate (or cublasLtCreate, for
  // kCublasLt) or the stream/math-mode setup fails (e.g. no CUDA device,
  // or the driver is missing); INVALID_ARGUMENT for an unknown name in
  // either variable, before any CUDA call.
  static absl::StatusOr<CublasHandle> Create(GemmMode mode, cudaStream_t stream = nullptr);

  CublasHandle() = default;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  CublasHandle(CublasHandle&& other) noexcept;
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  ~CublasHandle();

  bool empty() const { return handle_ == nullptr; }
  cublasHandle_t get() const { return handle_; }
  GemmMode mode() const { return mode_; }
  cudaStream_t stream() const { return stream_; }
  Bf16Operands bf16_operands() const { return bf16_operands_; }
  void set_bf16_operands(Bf16Operands operands) { bf16_operands_ = operands; }
  BiasEpilogue bias_epilogue() const { return bias_epilogue_; }
  // The cuBLASLt handle kCublasLt multiplies with (null under kSeed).
  cublasLtHandle_t lt() const { return lt_; }
  // Switches the bias epilogue, creating the cuBLASLt handle when
  // kCublasLt first needs it. FAILED_PRECONDITION if empty; INTERNAL if
  // cublasLtCreate fails.
  absl::Status SetBiasEpilogue(BiasEpilogue epilogue);

  // Moves later GEMMs and bias kernels to `stream`. FAILED_PRECONDITION if
  // empty; INTERNAL if cublasSetStream fails.
  absl::Status SetStream(cudaStream_t stream);

 private:
  void Destroy();

  cublasHandle_t handle_ = nullptr;
  GemmMode mode_ = GemmMode::kFp32;
  cudaStream_t stream_ = nullptr;
  Bf16Operands bf16_operands_ = Bf16Operands::kAlignedCopies;
  BiasEpilogue bias_epilogue_ = BiasEpilogue::kSeed;
  cublasLtHandle_t lt_ = nullptr;
};

// y = x W (+ b when b is non-null; how it is added: the handle's
// BiasEpilogue). Requires n >= 0, in >= 1, out >= 1, and
// x, w, y non-null when n > 0; y must not overlap x, w or b. Work is queued
// on handle.stream(); returns before it finishes.
// INVALID_ARGUMENT for a bad shape or a missing pointer (checked before any
// CUDA call); FAILED_PRECONDITION for an empty handle; INTERNAL if cuBLAS
// or a launch fails. n == 0 does nothing.
absl::Status LinearForwardCuda(const CublasHandle& handle, const float* x, const float* w,
                               const float* b, int n, int in, int out, float* y);

// y = residual + x W (+ b): the last layer of a residual block with the
// skip connection's sum in the GEMM (the GEMM adds x W onto residual + b
// with beta = 1), not in a pass of its own. The sums round as (residual +
// b) + x W (under BiasEpilogue::kCublasLt, in cuBLASLt's order), where
// the CPU's LinearForward then Add round as (x W + b) + residual: the same
// to within one rounding of each. residual holds n *
// out floats and must not overlap y. Otherwise as LinearForwardCuda.
absl::Status LinearForwardResidualCuda(const CublasHandle& handle, const float* x, const float* w,
                                       const float* b, const float* residual, int n, int in,
                                       int out, float* y);

// Writes dx when non-null; adds x^T dy into dw; adds the column sums of dy
// into db when non-null. Requires n >= 0, in >= 1, out >= 1, and x, w, dy, dw
// non-null when n > 0; outputs must not overlap each other or the inputs.
// Queued on handle.stream(). Errors as LinearForwardCuda. n == 0 does nothing
// (dx, with no rows, has nothing to write).
absl::Status LinearBackwardCuda(const CublasHandle& handle, const float* x, const float* w,
                                const float* dy, int n, int in, int out, float* dx, float* dw,
                                float* db);

// Row-major C [m, n] = alpha op(A) op(B) + beta C, the twin of
// kernels/cpu/blas.h Sgemm (same arguments; op(X) = X^T when trans_x; lda,
// ldb, ldc are row strides). Used by the LM head (logits = x wte^T).
// Requires m, n, k >= 0, non-null pointers when m * n > 0, and strides at
// least the rows' widths. Queued on handle.stream(). INVALID_ARGUMENT for
// bad sizes or pointers; FAILED_PRECONDITION for an empty handle; INTERNAL
// if cuBLAS fails.
absl::Status SgemmCuda(const CublasHandle& handle, bool trans_a, bool trans_b, int m, int n,
                       int k, float alpha, const float* a, int lda, const float* b, int ldb,
                       float beta, float* c, int ldc);

// Whether the handle's bf16 products of operands with these row strides
// multiply unpadded bf16 copies of them (GemmMode::kBf16 with
// kAlignedCopies and every stride a multiple of 8, or with kCopies). Then
// SgemmBf16Cuda on operands the caller rounded itself (bf16_round.h)
// gives bitwise SgemmCuda's results, so an operand used in several
// products can be rounded once.
bool MultipliesBf16Copies(const CublasHandle& handle, std::initializer_list<int> strides);

// Row-major C = alpha op(A) op(B) + beta C as SgemmCuda, on A and B given
// as bf16 bits (e.g. from RoundToBf16Cuda), with fp32 accumulation into
// the fp32 C whatever the handle's GemmMode. Errors as SgemmCuda.
absl::Status SgemmBf16Cuda(const CublasHandle& handle, bool trans_a, bool trans_b, int m, int n,
                           int k, float alpha, const uint16_t* a, int lda, const uint16_t* b,
                           int ldb, float beta, float* c, int ldc);

// `batch` such products, C_i = alpha op(A_i) op(B_i) + beta C_i with
// X_i = x + i * stride_x (strides in floats, >= 0), each as SgemmCuda
// computes it (one cublasSgemmStridedBatched, or its bf16 twin): how
// attention multiplies every head's matrices at once
// (kernels/cuda/attention_gemm.h). batch >= 0; batch == 0 does nothing.
// Errors as SgemmCuda, and INVALID_ARGUMENT for a negative batch or stride.
absl::Status SgemmStridedBatchedCuda(const CublasHandle& handle, bool trans_a, bool trans_b,
                                     int m, int n, int k, float alpha, const float* a, int lda,
                                     int64_t stride_a, const float* b, int ldb, int64_t stride_b,
                                     float beta, float* c, int ldc, int64_t stride_c, int batch);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_LINEAR_H_
