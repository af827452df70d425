#include <algorithm>
#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/multi_tensor.h"
#include "kernels/cuda/multi_tensor_kernels.cuh"
#include "kernels/cuda/stream_scratch.h"

namespace pipetrain {
namespace {

template <typename Pointer>
absl::Status CheckTensors(const char* op, Pointer const* tensors, const int64_t* counts,
                          int count) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat(op, ": ", count, " tensors"));
  if (count > 0 && (tensors == nullptr || counts == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": null tensor table"));
  }
  for (int i = 0; i < count; ++i) {
    if (counts[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": tensor ", i, " of ", count, " has ", counts[i], " elements"));
    }
    if (counts[i] > 0 && tensors[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": tensor ", i, " of ", count, " is null"));
    }
  }
  return absl::OkStatus();
}

// ElementwiseKernel(batch, op) for each batch of up to kTensorsPerLaunch
// tensors that has elements, on grid (blocks for its largest tensor, its
// tensors).
template <typename Op>
absl::Status LaunchPerBatch(const char* name, Op op, float* const* tensors, const int64_t* counts,
                            int count, cudaStream_t stream) {
  for (int first = 0; first < count; first += kTensorsPerLaunch) {
    TensorBatch<float*> batch{};
    int64_t largest = 0;
    const int in_batch = FillBatch(tensors, counts, count, first, &batch, &largest);
    if (largest == 0) continue;
    ElementwiseKernel<<<dim3(ElementwiseBlocks(largest), in_batch), kElementwiseThreads, 0,
                        stream>>>(batch, op);
    CUDA_CHECK_LAUNCH(name);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SumsOfSquaresCuda(const float* const* tensors, const int64_t* counts, int count,
                               double* sums, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckTensors("SumsOfSquaresCuda", tensors, counts, count));
  if (count == 0) return absl::OkStatus();
  if (sums == nullptr) return absl::InvalidArgumentError("SumsOfSquaresCuda: sums is null");
  ASSIGN_OR_RETURN(StreamScratch partials,
                   StreamScratch::Create(
                       static_cast<size_t>(count) * kMaxSquaresBlocks * sizeof(double), stream));
  for (int first = 0; first < count; first += kTensorsPerLaunch) {
    TensorBatch<const float*> batch{};
    int64_t largest = 0;
    const int in_batch = FillBatch(tensors, counts, count, first, &batch, &largest);
    SquaresPartialsKernel<<<dim3(SquaresBlocks(largest), in_batch), kSquaresThreads, 0, stream>>>(
        batch, first, partials.as<double>());
    CUDA_CHECK_LAUNCH("SquaresPartialsKernel");
    SquaresTotalsKernel<<<in_batch, kSquaresThreads, 0, stream>>>(batch, first,
                                                                  partials.as<double>(), sums);
    CUDA_CHECK_LAUNCH("SquaresTotalsKernel");
  }
  return absl::OkStatus();
}

absl::Status ScaleAllCuda(float* const* tensors, const int64_t* counts, int count, float scale,
                          cudaStream_t stream) {
  RETURN_IF_ERROR(CheckTensors("ScaleAllCuda", tensors, counts, count));
  return LaunchPerBatch("ElementwiseKernel<ScaleOp>", ScaleOp{scale}, tensors, counts, count,
                        stream);
}

absl::Status ZeroAllCuda(float* const* tensors, const int64_t* counts, int count,
                         cudaStream_t stream) {
  RETURN_IF_ERROR(CheckTensors("ZeroAllCuda", tensors, counts, count));
  return LaunchPerBatch("ElementwiseKernel<ZeroOp>", ZeroOp{}, tensors, counts, count, stream);
}

}  // namespace pipetrain
