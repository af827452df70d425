#include "kernels/cuda/token_topk_payload.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/payload.h"
#include "kernels/compress/token_topk_codec.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/cuda/token_topk.h"

namespace pipetrain {
namespace {

template <typename T>
absl::StatusOr<StreamScratch> Scratch(int64_t n, cudaStream_t stream) {
  return StreamScratch::Create(static_cast<size_t>(n) * sizeof(T), stream);
}

}  // namespace

absl::StatusOr<std::string> TokenTopKEncodeCuda(const float* x, const Shape& shape, double keep,
                                                const TokenTopKInner& inner,
                                                absl::Span<const float> scores,
                                                cudaStream_t stream) {
  RETURN_IF_ERROR(CheckTokenTopKRank(shape));
  const int64_t d = shape.back();
  const int64_t n = NumElements(shape);
  const int64_t tokens = NumElements(Shape(shape.begin(), shape.end() - 1));
  if (n == 0) {
    return absl::InvalidArgumentError(absl::StrCat("token_topk on the GPU: ", ShapeToString(shape),
                                                   " is empty; encode it on the host"));
  }
  RETURN_IF_ERROR(CheckFiniteCuda(x, n, "token_topk", stream));
  if (!scores.empty()) RETURN_IF_ERROR(CheckTokenTopKScores(scores, shape));
  ASSIGN_OR_RETURN(const int64_t kept, TokenTopKKeptCount(keep, tokens));
  ASSIGN_OR_RETURN(StreamScratch mask_block, Scratch<uint8_t>(tokens, stream));
  ASSIGN_OR_RETURN(StreamScratch index_block, Scratch<int64_t>(kept, stream));
  ASSIGN_OR_RETURN(StreamScratch rows_block, Scratch<float>(kept * d, stream));
  uint8_t* mask = mask_block.as<uint8_t>();
  int64_t* kept_index = index_block.as<int64_t>();
  float* rows = rows_block.as<float>();
  if (!scores.empty()) {
    ASSIGN_OR_RETURN(StreamScratch score_block, Scratch<float>(tokens, stream));
    // From pageable memory the copy has read `scores` when it returns.
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(score_block.get(), scores.data(),
                                         scores.size() * sizeof(float), cudaMemcpyHostToDevice,
                                         stream));
    RETURN_IF_ERROR(
        TokenTopKSelectCuda(score_block.as<float>(), tokens, kept, mask, kept_index, stream));
  } else {
    RETURN_IF_ERROR(TokenTopKSelectByNormCuda(x, tokens, d, kept, mask, kept_index, stream));
  }
  RETURN_IF_ERROR(TokenGatherCuda(x, d, kept_index, kept, rows, stream));
  std::vector<uint8_t> host_mask(static_cast<size_t>(tokens));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_mask.data(), mask, host_mask.size(), cudaMemcpyDeviceToHost, stream));
  std::vector<float> host_rows;
  if (inner.kind == TokenTopKInner::Kind::kRaw) {
    host_rows.resize(static_cast<size_t>(kept * d));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_rows.data(), rows, host_rows.size() * sizeof(float),
                                         cudaMemcpyDeviceToHost, stream));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::string out;
  WriteTokenTopKPrefix(shape, keep, kept, std::vector<bool>(host_mask.begin(), host_mask.end()),
                       &out);
  ByteWriter w(&out);
  if (inner.kind == TokenTopKInner::Kind::kRaw) {
    w.F32s(host_rows.data(), static_cast<int64_t>(host_rows.size()));
    return out;
  }
  const Shape kept_shape = {kept, d};
  ASSIGN_OR_RETURN(std::string payload,
                   inner.kind == TokenTopKInner::Kind::kLinear
                       ? LinearEncodeCuda(rows, kept_shape, inner.bits, stream)
                       : PiecewiseEncodeCuda(rows, kept_shape, inner.bits, stream));
  w.I64(static_cast<int64_t>(payload.size()));
  w.Bytes(payload);
  return out;
}

absl::StatusOr<Shape> TokenTopKDecodeCuda(absl::string_view payload, double keep,
                                          const TokenTopKInner& inner, float* out, int64_t capacity,
                                          cudaStream_t stream) {
  // Compared with the output's capacity before the mask is read: the
  // kept tokens' indices take 8 bytes each on the host, so an announced
  // shape beyond the output must not reach ReadTokenTopKPrefix.
  ASSIGN_OR_RETURN(const Shape announced, PeekPayloadShape(payload));
  const int64_t n = NumElements(announced);
  if (n > capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token_topk: payload shape ", ShapeToString(announced), " holds ", n,
        " values, the output buffer only ", capacity, "; allocate the tensor's full size"));
  }
  ByteReader r(payload);
  ASSIGN_OR_RETURN(TokenTopKPrefix prefix, ReadTokenTopKPrefix(&r, keep));
  const Shape& shape = prefix.shape;
  if (n == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token_topk: payload shape ", ShapeToString(shape), " is empty; decode it on the host"));
  }
  const int64_t d = shape.back();
  const int64_t tokens = NumElements(Shape(shape.begin(), shape.end() - 1));
  const int64_t kept = static_cast<int64_t>(prefix.kept_tokens.size());
  absl::string_view body;
  r.Bytes(r.remaining(), &body);
  // The body is checked before anything is allocated on the device, an
  // inner payload as the CPU Decode checks it, so that both report the
  // same error for a bad one.
  absl::string_view inner_payload;
  if (inner.kind == TokenTopKInner::Kind::kRaw) {
    if (static_cast<int64_t>(body.size()) != 4 * kept * d) {
      return absl::InvalidArgumentError(
          absl::StrCat("token_topk: body is ", body.size(), " bytes, expected ", 4 * kept * d));
    }
  } else {
    ASSIGN_OR_RETURN(inner_payload, TokenTopKInnerPayload(body, kept, d));
  }
  ASSIGN_OR_RETURN(StreamScratch rows_block, Scratch<float>(kept * d, stream));
  float* rows = rows_block.as<float>();
  if (inner.kind == TokenTopKInner::Kind::kRaw) {
    Tensor values = Tensor::Zeros({kept, d});
    ByteReader v(body);
    v.F32s(values.data(), values.numel());  // The length was checked above.
    RETURN_IF_ERROR(CheckFinite(values, "token_topk decode"));
    if (values.numel() > 0) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rows, values.data(), values.size_bytes(),
                                           cudaMemcpyHostToDevice, stream));
    }
  } else {
    ASSIGN_OR_RETURN(const Shape inner_shape,
                     inner.kind == TokenTopKInner::Kind::kLinear
                         ? LinearDecodeCuda(inner_payload, inner.bits, rows, kept * d, stream)
                         : PiecewiseDecodeCuda(inner_payload, inner.bits, rows, kept * d, stream));
    if (inner_shape != Shape{kept, d}) {
      return absl::InvalidArgumentError(absl::StrCat("token_topk: inner payload has shape ",
                                                     ShapeToString(inner_shape), ", expected ",
                                                     ShapeToString({kept, d})));
    }
  }
  ASSIGN_OR_RETURN(StreamScratch index_block, Scratch<int64_t>(kept, stream));
  if (kept > 0) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(index_block.get(), prefix.kept_tokens.data(),
                                         kept * sizeof(int64_t), cudaMemcpyHostToDevice, stream));
  }
  RETURN_IF_ERROR(TokenScatterCuda(rows, d, index_block.as<int64_t>(), kept, tokens, out, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return shape;
}

}  // namespace pipetrain
