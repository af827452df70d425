#include "kernels/cuda/powersgd_payload.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/powersgd_codec.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/powersgd.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/stream_scratch.h"

namespace pipetrain {

absl::StatusOr<std::string> PowerSgdEncodePayloadCuda(const CublasHandle& handle, const float* x,
                                                      const Shape& shape, int rank,
                                                      const float* q_warm, float* q_out) {
  const PowerSgdMatrix m = PowerSgdMatrixOf(shape);
  if (m.rows == 0 || m.cols == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "powersgd: ", ShapeToString(shape), " is empty; encode it on the host"));
  }
  if (rank < 1) {  // before sizing anything by it; PowerSgdEncodeCuda checks the rest
    return absl::InvalidArgumentError(absl::StrCat("powersgd: rank ", rank, " is out of range"));
  }
  const cudaStream_t stream = handle.stream();
  std::vector<float> p(static_cast<size_t>(m.rows * rank));
  std::vector<float> q(static_cast<size_t>(m.cols * rank));
  ASSIGN_OR_RETURN(StreamScratch p_dev, StreamScratch::Create(p.size() * sizeof(float), stream));
  // Waits for the stream: P and Q are complete when it returns.
  RETURN_IF_ERROR(PowerSgdEncodeCuda(handle, x, m.rows, m.cols, rank, q_warm,
                                     p_dev.as<float>(), q_out));
  // On the handle's stream, not the legacy default one (which would wait
  // for every blocking stream of the device).
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(p.data(), p_dev.get(), p.size() * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(q.data(), q_out, q.size() * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return WritePowerSgdPayload(shape, rank, p.data(), q.data());
}

absl::StatusOr<Shape> PowerSgdDecodePayloadCuda(const CublasHandle& handle,
                                                absl::string_view payload, int rank, float* out,
                                                int64_t capacity) {
  ASSIGN_OR_RETURN(const PowerSgdFactors f, ReadPowerSgdPayload(payload, rank));
  const int64_t numel = NumElements(f.shape);
  if (numel == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "powersgd: the payload holds an empty ", ShapeToString(f.shape), "; decode it on the host"));
  }
  if (numel > capacity) {
    return absl::InvalidArgumentError(absl::StrCat("powersgd: the payload holds ", numel,
                                                   " values; the output has room for ", capacity));
  }
  const cudaStream_t stream = handle.stream();
  const size_t p_bytes = f.p.size() * sizeof(float), q_bytes = f.q.size() * sizeof(float);
  ASSIGN_OR_RETURN(StreamScratch p_dev, StreamScratch::Create(p_bytes, stream));
  ASSIGN_OR_RETURN(StreamScratch q_dev, StreamScratch::Create(q_bytes, stream));
  // From pageable memory each copy has left the host vector when it returns.
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(p_dev.get(), f.p.data(), p_bytes, cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(q_dev.get(), f.q.data(), q_bytes, cudaMemcpyHostToDevice, stream));
  RETURN_IF_ERROR(PowerSgdDecodeCuda(handle, p_dev.as<float>(), q_dev.as<float>(), f.matrix.rows,
                                     f.matrix.cols, rank, out));
  // As the CPU Decode: finite factors may multiply past float32's range.
  RETURN_IF_ERROR(CheckFiniteCuda(out, numel, "powersgd decode (P Q^T)", stream));
  return f.shape;
}

}  // namespace pipetrain
