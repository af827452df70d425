#include "kernels/cuda/lm_head.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/bf16_round.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/stream_scratch.h"

namespace pipetrain {
namespace {

absl::Status CheckArguments(const char* op, int n, int d, int vocab, int ld,
                            std::initializer_list<std::pair<const char*, const void*>> pointers) {
  if (n < 0 || d < 1 || vocab < 1 || ld < vocab) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": n ", n, ", d ", d, ", vocab ", vocab,
                                                   ", ld ", ld,
                                                   " needs n >= 0, d >= 1, vocab >= 1 and "
                                                   "ld >= vocab"));
  }
  if (n == 0) return absl::OkStatus();
  for (const auto& [name, pointer] : pointers) {
    if (pointer == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is null"));
  }
  return absl::OkStatus();
}

// wte [vocab, d] followed by ld - vocab zero rows, in scratch on `stream`.
absl::StatusOr<StreamScratch> PaddedWeights(const float* wte, int d, int vocab, int ld,
                                            cudaStream_t stream) {
  const size_t row_bytes = static_cast<size_t>(d) * sizeof(float);
  ASSIGN_OR_RETURN(StreamScratch padded,
                   StreamScratch::Create(static_cast<size_t>(ld) * row_bytes, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(padded.get(), wte, static_cast<size_t>(vocab) * row_bytes,
                                       cudaMemcpyDeviceToDevice, stream));
  if (ld > vocab) {  // (else the pointer would be one past the scratch)
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(padded.as<float>() + static_cast<size_t>(vocab) * d, 0,
                                         static_cast<size_t>(ld - vocab) * row_bytes, stream));
  }
  return padded;
}

// wte rounded to bf16 [vocab, d] followed by ld - vocab zero rows (+0 in
// bf16 is all zero bits), in scratch on `stream`.
absl::StatusOr<StreamScratch> PaddedBf16Weights(const float* wte, int d, int vocab, int ld,
                                                cudaStream_t stream) {
  const size_t bf16 = sizeof(uint16_t);
  ASSIGN_OR_RETURN(StreamScratch wte16,
                   StreamScratch::Create(static_cast<size_t>(ld) * d * bf16, stream));
  RETURN_IF_ERROR(RoundToBf16Cuda(wte, int64_t{vocab} * d, wte16.as<uint16_t>(), stream));
  if (ld > vocab) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(wte16.as<uint16_t>() + static_cast<size_t>(vocab) * d, 0,
                                         static_cast<size_t>(ld - vocab) * d * bf16, stream));
  }
  return wte16;
}

}  // namespace

absl::Status LmHeadForwardCuda(const CublasHandle& handle, const float* x, const float* wte, int n,
                               int d, int vocab, int ld, float* logits) {
  RETURN_IF_ERROR(CheckArguments("LmHeadForwardCuda", n, d, vocab, ld,
                                 {{"x", x}, {"wte", wte}, {"logits", logits}}));
  if (n == 0) return absl::OkStatus();
  if (ld == vocab) {
    return SgemmCuda(handle, false, true, n, vocab, d, 1.0f, x, d, wte, d, 0.0f, logits, ld);
  }
  if (handle.empty())
    return absl::FailedPreconditionError("LmHeadForwardCuda: empty cuBLAS handle");
  if (MultipliesBf16Copies(handle, {d, ld})) {
    // The copies SgemmCuda would make, but wte rounded straight into its
    // padded copy (no padded fp32 wte first): bitwise the same product.
    ASSIGN_OR_RETURN(StreamScratch wte16, PaddedBf16Weights(wte, d, vocab, ld, handle.stream()));
    ASSIGN_OR_RETURN(StreamScratch x16, Bf16CopyCuda(x, int64_t{n} * d, handle.stream()));
    return SgemmBf16Cuda(handle, false, true, n, ld, d, 1.0f, x16.as<uint16_t>(), d,
                         wte16.as<uint16_t>(), d, 0.0f, logits, ld);
  }
  // The scratch may go once the GEMM that reads it is queued on its stream.
  ASSIGN_OR_RETURN(StreamScratch padded, PaddedWeights(wte, d, vocab, ld, handle.stream()));
  return SgemmCuda(handle, false, true, n, ld, d, 1.0f, x, d, padded.as<float>(), d, 0.0f, logits,
                   ld);
}

absl::Status LmHeadBackwardCuda(const CublasHandle& handle, const float* x, const float* wte,
                                float* dlogits, int n, int d, int vocab, int ld, float* dx,
                                float* dwte) {
  RETURN_IF_ERROR(
      CheckArguments("LmHeadBackwardCuda", n, d, vocab, ld,
                     {{"x", x}, {"wte", wte}, {"dlogits", dlogits}, {"dx", dx}, {"dwte", dwte}}));
  if (n == 0) return absl::OkStatus();
  if (ld == vocab) {
    RETURN_IF_ERROR(
        SgemmCuda(handle, false, false, n, d, vocab, 1.0f, dlogits, ld, wte, d, 0.0f, dx, d));
    return SgemmCuda(handle, true, false, vocab, d, n, 1.0f, dlogits, ld, x, d, 1.0f, dwte, d);
  }
  if (handle.empty()) {
    return absl::FailedPreconditionError("LmHeadBackwardCuda: empty cuBLAS handle");
  }
  const cudaStream_t stream = handle.stream();
  // Zeros in the padding columns, so the padded classes add exact zeros to
  // dx (0 * 0, never NaN from whatever was there).
  CUDA_RETURN_IF_ERROR(cudaMemset2DAsync(dlogits + vocab, static_cast<size_t>(ld) * sizeof(float),
                                         0, static_cast<size_t>(ld - vocab) * sizeof(float), n,
                                         stream));
  ASSIGN_OR_RETURN(StreamScratch padded, PaddedWeights(wte, d, vocab, ld, stream));
  RETURN_IF_ERROR(SgemmCuda(handle, false, false, n, d, ld, 1.0f, dlogits, ld, padded.as<float>(),
                            d, 0.0f, dx, d));
  // The same scratch then takes the padded weight gradient: the GEMM above
  // is queued before this one on the one stream, so it has read the
  // weights by then.
  RETURN_IF_ERROR(SgemmCuda(handle, true, false, ld, d, n, 1.0f, dlogits, ld, x, d, 0.0f,
                            padded.as<float>(), d));
  return AddInPlaceCuda(dwte, padded.as<float>(), int64_t{vocab} * d, stream);
}

absl::Status LmHeadBackwardBf16Cuda(const CublasHandle& handle, const uint16_t* gradient,
                                    float dloss, const float* x, const float* wte, int n, int d,
                                    int vocab, int ld, float* dx, float* dwte) {
  constexpr const char* kOp = "LmHeadBackwardBf16Cuda";
  RETURN_IF_ERROR(
      CheckArguments(kOp, n, d, vocab, ld,
                     {{"gradient", gradient}, {"x", x}, {"wte", wte}, {"dx", dx}, {"dwte", dwte}}));
  if (n == 0) return absl::OkStatus();
  if (handle.empty())
    return absl::FailedPreconditionError(absl::StrCat(kOp, ": empty cuBLAS handle"));
  if (!MultipliesBf16Copies(handle, {ld, d})) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": the handle's products (", GemmModeName(handle.mode()),
                     ") do not multiply bf16 copies at row strides ", ld, " and ", d));
  }
  const cudaStream_t stream = handle.stream();
  ASSIGN_OR_RETURN(StreamScratch wte16, PaddedBf16Weights(wte, d, vocab, ld, stream));
  ASSIGN_OR_RETURN(StreamScratch x16, Bf16CopyCuda(x, int64_t{n} * d, stream));
  // dloss as the products' alpha: the gradient is that of the mean loss.
  RETURN_IF_ERROR(SgemmBf16Cuda(handle, false, false, n, d, ld, dloss, gradient, ld,
                                wte16.as<uint16_t>(), d, 0.0f, dx, d));
  // The padded weight gradient in scratch, its first vocab rows then added
  // into dwte, as LmHeadBackwardCuda does.
  ASSIGN_OR_RETURN(StreamScratch padded,
                   StreamScratch::Create(static_cast<size_t>(ld) * d * sizeof(float), stream));
  RETURN_IF_ERROR(SgemmBf16Cuda(handle, true, false, ld, d, n, dloss, gradient, ld,
                                x16.as<uint16_t>(), d, 0.0f, padded.as<float>(), d));
  return AddInPlaceCuda(dwte, padded.as<float>(), int64_t{vocab} * d, stream);
}

}  // namespace pipetrain
