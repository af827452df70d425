// Host side of half_codec.h: the payload framing around the GPU casts,
// with the CPU codec's header, validation order and messages
// (kernels/compress/fp16_codec.cc).
#include "kernels/cuda/half_codec.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/fp16_codec.h"
#include "kernels/compress/payload.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/stream_scratch.h"

namespace pipetrain {
namespace {

constexpr unsigned long long kNoBadElement = ULLONG_MAX;

CodecId IdOf(HalfFormat format) {
  return format == HalfFormat::kFp16 ? CodecId::kFp16 : CodecId::kBf16;
}

const char* NameOf(HalfFormat format) { return format == HalfFormat::kFp16 ? "fp16" : "bf16"; }

// A device flag for the kernels' first bad index, set to "none".
absl::StatusOr<StreamScratch> BadIndexFlag(cudaStream_t stream) {
  ASSIGN_OR_RETURN(StreamScratch flag, StreamScratch::Create(sizeof(unsigned long long), stream));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flag.get(), 0xff, sizeof(unsigned long long), stream));
  return flag;
}

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
  ASSIGN_OR_RETURN(StreamScratch flag, BadIndexFlag(stream));
  RETURN_IF_ERROR(HalfPackCuda(format, x, n, body.as<uint16_t>(), flag.as<unsigned long long>(),
                               stream));
  unsigned long long first_bad = kNoBadElement;
  const size_t header = out.size();
  out.resize(header + static_cast<size_t>(2 * n));
  // uint16 little-endian on the device, as the payload wants.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&out[header], body.get(), static_cast<size_t>(2 * n),
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&first_bad, flag.get(), sizeof(first_bad),
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (first_bad != kNoBadElement) {
    float value = 0.0f;
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&value, x + first_bad, sizeof(value),
                                         cudaMemcpyDeviceToHost, stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return HalfOverflowError(name, static_cast<int64_t>(first_bad), value);
  }
  return out;
}

absl::StatusOr<Shape> HalfDecodeCuda(HalfFormat format, absl::string_view payload, float* out,
                                     int64_t capacity, cudaStream_t stream) {
  const char* name = NameOf(format);
  ByteReader r(payload);
  ASSIGN_OR_RETURN(Shape shape, ReadHeader(IdOf(format), &r));
  const int64_t n = NumElements(shape);
  if (r.remaining() != 2 * n) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": body has ", r.remaining(),
                                                   " bytes, shape ", ShapeToString(shape),
                                                   " needs ", 2 * n));
  }
  if (n > capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": payload shape ", ShapeToString(shape), " holds ", n,
        " values, the output buffer only ", capacity, "; allocate the tensor's full size"));
  }
  if (n == 0) return shape;
  absl::string_view host_body;
  r.Bytes(r.remaining(), &host_body);  // its length was checked above
  ASSIGN_OR_RETURN(StreamScratch body, StreamScratch::Create(host_body.size(), stream));
  ASSIGN_OR_RETURN(StreamScratch flag, BadIndexFlag(stream));
  // From pageable memory the copy has read `host_body` when it returns.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(body.get(), host_body.data(), host_body.size(),
                                       cudaMemcpyHostToDevice, stream));
  RETURN_IF_ERROR(HalfUnpackCuda(format, body.as<uint16_t>(), n, out,
                                 flag.as<unsigned long long>(), stream));
  unsigned long long first_bad = kNoBadElement;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&first_bad, flag.get(), sizeof(first_bad),
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (first_bad != kNoBadElement) return HalfCorruptError(name, static_cast<int64_t>(first_bad));
  return shape;
}

}  // namespace pipetrain
