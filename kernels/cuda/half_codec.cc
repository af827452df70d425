// Host side of half_codec.h: the payload framing around the GPU casts,
// with the CPU codec's header, validation order and messages
// (kernels/compress/fp16_codec.cc).
#include "kernels/cuda/half_codec.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/fp16_codec.h"
#include "kernels/compress/payload.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/first_index_flag.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/stream_scratch.h"

namespace pipetrain {
namespace {

CodecId IdOf(HalfFormat format) {
  return format == HalfFormat::kFp16 ? CodecId::kFp16 : CodecId::kBf16;
}

const char* NameOf(HalfFormat format) { return format == HalfFormat::kFp16 ? "fp16" : "bf16"; }

}  // namespace

absl::StatusOr<std::string> HalfEncodeCuda(HalfFormat format, const float* x, const Shape& shape,
                                           cudaStream_t stream) {
  const char* name = NameOf(format);
  const int64_t n = NumElements(shape);
  std::string out;
  WriteHeader(IdOf(format), shape, &out);
  if (n == 0) return out;
  RETURN_IF_ERROR(CheckFiniteCuda(x, n, name, stream));  // the CPU's first check
  ASSIGN_OR_RETURN(StreamScratch body, StreamScratch::Create(static_cast<size_t>(2 * n), stream));
  ASSIGN_OR_RETURN(FirstIndexFlag flag, FirstIndexFlag::Create(stream));
  RETURN_IF_ERROR(HalfPackCuda(format, x, n, body.as<uint16_t>(), flag.get(), stream));
  const size_t header = out.size();
  out.resize(header + static_cast<size_t>(2 * n));
  // uint16 little-endian on the device, as the payload wants.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&out[header], body.get(), static_cast<size_t>(2 * n),
                                       cudaMemcpyDeviceToHost, stream));
  ASSIGN_OR_RETURN(const int64_t first_bad, flag.Read());  // waits for the stream
  if (first_bad >= 0) {
    float value = 0.0f;
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&value, x + first_bad, sizeof(value),
                                         cudaMemcpyDeviceToHost, stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return HalfOverflowError(name, first_bad, value);
  }
  return out;
}

absl::StatusOr<Shape> HalfDecodeCuda(HalfFormat format, absl::string_view payload, float* out,
                                     int64_t capacity, cudaStream_t stream) {
  const char* name = NameOf(format);
  ASSIGN_OR_RETURN(const HalfPayload read, ReadHalfPayload(name, IdOf(format), payload));
  const Shape& shape = read.shape;
  const absl::string_view host_body = read.body;
  const int64_t n = NumElements(shape);
  if (n > capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": payload shape ", ShapeToString(shape), " holds ", n,
        " values, the output buffer only ", capacity, "; allocate the tensor's full size"));
  }
  if (n == 0) return shape;
  ASSIGN_OR_RETURN(StreamScratch body, StreamScratch::Create(host_body.size(), stream));
  ASSIGN_OR_RETURN(FirstIndexFlag flag, FirstIndexFlag::Create(stream));
  // From pageable memory the copy has read `host_body` when it returns.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(body.get(), host_body.data(), host_body.size(),
                                       cudaMemcpyHostToDevice, stream));
  RETURN_IF_ERROR(HalfUnpackCuda(format, body.as<uint16_t>(), n, out, flag.get(), stream));
  ASSIGN_OR_RETURN(const int64_t first_bad, flag.Read());  // waits for the stream
  if (first_bad >= 0) return HalfCorruptError(name, first_bad);
  return shape;
}

}  // namespace pipetrain
