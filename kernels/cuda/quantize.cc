// Host side of quantize.h: the payload framing around the GPU bodies, with
// the CPU codecs' header, parameters, validation order and messages
// (kernels/compress/linear_codec.cc, piecewise_codec.cc).
#include "kernels/cuda/quantize.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/linear_codec.h"
#include "kernels/compress/payload.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/stream_scratch.h"

namespace pipetrain {
namespace {

// Which codec a payload function speaks: its id, name, bit-width range and
// the name of its float parameter.
struct QuantCodec {
  CodecId id;
  const char* family;  // "linear" or "piecewise"
  int bits;            // linear: bits; piecewise: clusters N
  int code_bits;       // bits per packed code
  const char* scale_name;

  std::string name() const { return absl::StrCat(family, ":bits=", bits); }
};

absl::StatusOr<QuantCodec> Linear(int bits) {
  if (bits < 2 || bits > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear codec: bits=", bits, " is out of range; use 2..16"));
  }
  return QuantCodec{CodecId::kLinear, "linear", bits, bits, "step"};
}

absl::StatusOr<QuantCodec> Piecewise(int clusters) {
  if (clusters < 1 || clusters > 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "piecewise codec: bits=", clusters,
        " (clusters N) is out of range; use 1..8 (N + 1 bits per value)"));
  }
  return QuantCodec{CodecId::kPiecewise, "piecewise", clusters, clusters + 1, "max|R|"};
}

// The per-tensor float parameter: linear step (eq. 4) or piecewise M.
float ScaleFor(const QuantCodec& codec, float max_abs) {
  if (codec.id == CodecId::kPiecewise) return max_abs;
  return LinearStep(max_abs, codec.bits);
}

absl::StatusOr<std::string> Encode(const QuantCodec& codec, const float* x, const Shape& shape,
                                   cudaStream_t stream) {
  const int64_t n = NumElements(shape);
  ASSIGN_OR_RETURN(MaxAbsScan scan, MaxAbsScanCuda(x, n, stream));
  if (scan.first_non_finite >= 0) {
    return NonFiniteError(codec.name(), scan.first_non_finite, scan.first_non_finite_value);
  }
  const float scale = ScaleFor(codec, scan.max_abs);
  std::string out;
  WriteHeader(codec.id, shape, &out);
  ByteWriter w(&out);
  w.U8(static_cast<uint8_t>(codec.bits));
  w.F32(scale);
  const int64_t body_bytes = PackedBytes(n, codec.code_bits);
  if (body_bytes == 0) return out;
  ASSIGN_OR_RETURN(StreamScratch body_block,
                   StreamScratch::Create(static_cast<size_t>(body_bytes), stream));
  uint8_t* body = body_block.as<uint8_t>();
  if (codec.id == CodecId::kLinear) {
    RETURN_IF_ERROR(LinearPackCuda(x, n, codec.bits, scale, body, stream));
  } else {
    RETURN_IF_ERROR(PiecewisePackCuda(x, n, codec.bits, scale, body, stream));
  }
  const size_t header = out.size();
  out.resize(header + static_cast<size_t>(body_bytes));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&out[header], body, body_bytes,
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return out;
}

// Header and parameters as the CPU Decode checks them; leaves `r` at the body.
absl::StatusOr<Shape> ReadParams(const QuantCodec& codec, ByteReader* r, float* scale) {
  ASSIGN_OR_RETURN(Shape shape, ReadHeader(codec.id, r));
  uint8_t bits = 0;
  if (!r->U8(&bits) || !r->F32(scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat(codec.name(), ": payload truncated in parameters"));
  }
  if (bits != codec.bits) {
    return absl::InvalidArgumentError(absl::StrCat(codec.name(), ": payload has bits=", int{bits},
                                                   ", this codec expects ", codec.bits));
  }
  if (!std::isfinite(*scale) || *scale < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(codec.name(), ": payload ", codec.scale_name,
                                                   " ", *scale, " is not finite and >= 0"));
  }
  const int64_t n = NumElements(shape);
  if (r->remaining() != PackedBytes(n, codec.code_bits)) {
    return absl::InvalidArgumentError(absl::StrCat(codec.name(), ": body has ", r->remaining(),
                                                   " bytes, shape ", ShapeToString(shape),
                                                   " needs ", PackedBytes(n, codec.code_bits)));
  }
  return shape;
}

absl::StatusOr<Shape> Decode(const QuantCodec& codec, absl::string_view payload, float* out,
                             int64_t capacity, cudaStream_t stream) {
  ByteReader r(payload);
  float scale = 0.0f;
  ASSIGN_OR_RETURN(Shape shape, ReadParams(codec, &r, &scale));
  const int64_t n = NumElements(shape);
  if (n > capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        codec.name(), ": payload shape ", ShapeToString(shape), " holds ", n,
        " values, the output buffer only ", capacity, "; allocate the tensor's full size"));
  }
  if (n == 0) return shape;
  absl::string_view host_body;
  r.Bytes(r.remaining(), &host_body);  // Its length was checked by ReadParams.
  ASSIGN_OR_RETURN(StreamScratch body_block, StreamScratch::Create(host_body.size(), stream));
  uint8_t* body = body_block.as<uint8_t>();
  // From pageable memory the copy has read `host_body` when it returns.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(body, host_body.data(), host_body.size(),
                                       cudaMemcpyHostToDevice, stream));
  if (codec.id == CodecId::kLinear) {
    RETURN_IF_ERROR(LinearUnpackCuda(body, n, codec.bits, scale, out, stream));
  } else {
    RETURN_IF_ERROR(PiecewiseUnpackCuda(body, n, codec.bits, scale, out, stream));
    // The *Decode functions wait for the stream (quantize.h).
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  }
  return shape;
}

}  // namespace

absl::Status CheckFiniteCuda(const float* x, int64_t n, absl::string_view codec,
                             cudaStream_t stream) {
  ASSIGN_OR_RETURN(MaxAbsScan scan, MaxAbsScanCuda(x, n, stream));
  if (scan.first_non_finite < 0) return absl::OkStatus();
  return NonFiniteError(codec, scan.first_non_finite, scan.first_non_finite_value);
}

absl::StatusOr<std::string> LinearEncodeCuda(const float* x, const Shape& shape, int bits,
                                             cudaStream_t stream) {
  ASSIGN_OR_RETURN(QuantCodec codec, Linear(bits));
  return Encode(codec, x, shape, stream);
}

absl::StatusOr<Shape> LinearDecodeCuda(absl::string_view payload, int bits, float* out,
                                       int64_t capacity, cudaStream_t stream) {
  ASSIGN_OR_RETURN(QuantCodec codec, Linear(bits));
  return Decode(codec, payload, out, capacity, stream);
}

absl::StatusOr<std::string> PiecewiseEncodeCuda(const float* x, const Shape& shape, int clusters,
                                                cudaStream_t stream) {
  ASSIGN_OR_RETURN(QuantCodec codec, Piecewise(clusters));
  return Encode(codec, x, shape, stream);
}

absl::StatusOr<Shape> PiecewiseDecodeCuda(absl::string_view payload, int clusters, float* out,
                                          int64_t capacity, cudaStream_t stream) {
  ASSIGN_OR_RETURN(QuantCodec codec, Piecewise(clusters));
  return Decode(codec, payload, out, capacity, stream);
}

}  // namespace pipetrain
