// What the codec fuzz targets share: the codecs codec_fuzzer decodes with
// (byte 0 of its input picks kFuzzCodecSpecs[byte % kNumFuzzCodecSpecs]:
// every codec with boundary and middle parameters, and the token_topk
// compositions; make_seeds.cc writes seeds by this order, so append, never
// reorder), and the decoded-size limit both targets apply.
#ifndef PIPETRAIN_FUZZ_CODEC_SPECS_H_
#define PIPETRAIN_FUZZ_CODEC_SPECS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/tensor.h"
#include "kernels/compress/codec.h"
#include "kernels/compress/payload.h"

namespace pipetrain {

// The codec targets decode a payload only if it announces at most this many
// elements (64 MiB of fp32), as a receiver checks the announced shape
// against the one it expects before decoding (codec.h, PeekPayloadShape).
inline constexpr int64_t kFuzzMaxDecodedElements = int64_t{1} << 24;

// False when the payload's header is readable and announces more than
// kFuzzMaxDecodedElements; an unreadable header is left to Decode to reject.
inline bool WithinFuzzDecodeLimit(absl::string_view payload) {
  const absl::StatusOr<Shape> shape = PeekPayloadShape(payload);
  return !shape.ok() || NumElements(*shape) <= kFuzzMaxDecodedElements;
}

// Codec::Decode of `payload`, and the contract receivers rely on checked:
// a payload that decodes yields exactly the shape its header announces
// (DecodeWireTensorWith bounds what it accepts by PeekPayloadShape before
// decoding, so a decoder that produced another shape would get past that
// bound). A broken contract is a crash, for the fuzzer to report.
inline void DecodeAndCheckShape(const Codec& codec, absl::string_view payload) {
  const absl::StatusOr<Tensor> decoded = codec.Decode(payload);
  if (!decoded.ok()) return;
  const absl::StatusOr<Shape> announced = PeekPayloadShape(payload);
  PT_CHECK(announced.ok()) << codec.name() << " decoded a payload whose header does not read: "
                           << announced.status();
  PT_CHECK(decoded->shape() == *announced)
      << codec.name() << " decoded " << ShapeToString(decoded->shape())
      << " from a payload announcing " << ShapeToString(*announced);
}

inline constexpr const char* kFuzzCodecSpecs[] = {
    "fp16",
    "bf16",
    "linear:bits=2",
    "linear:bits=8",
    "linear:bits=16",
    "piecewise:bits=1",
    "piecewise:bits=3",
    "piecewise:bits=8",
    "elem_topk:keep=0.1",
    "elem_topk:keep=1",
    "token_topk:keep=0.5",
    "token_topk:keep=1",
    "token_topk:keep=0.5+fp16",
    "token_topk:keep=0.5+bf16",
    "token_topk:keep=0.5+linear:bits=4",
    "token_topk:keep=0.5+piecewise:bits=3",
    "token_topk:keep=0.25+elem_topk:keep=0.5",
    "powersgd:rank=1",
    "powersgd:rank=4",
    "linear:bits=5",
    "piecewise:bits=5",
};
inline constexpr size_t kNumFuzzCodecSpecs = sizeof(kFuzzCodecSpecs) / sizeof(kFuzzCodecSpecs[0]);

}  // namespace pipetrain

#endif  // PIPETRAIN_FUZZ_CODEC_SPECS_H_
