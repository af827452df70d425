// Compressed tensors from a peer: Codec::Decode of every codec in
// kernels/compress/ and the token_topk compositions, on arbitrary payloads.
//
// Input: byte 0 picks the codec (fuzz/codec_specs.h); the rest is the
// payload (payload.h: "PTC1", codec id, rank, dims, the codec's body).
//
// As receivers do (codec.h), payloads announcing more than
// kFuzzMaxDecodedElements are not decoded: Decode allocates what the header
// announces, and the fuzzer's memory limit is 2 GB.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "common/logging.h"
#include "fuzz/codec_specs.h"
#include "fuzz/fuzz_input.h"
#include "kernels/compress/codec_spec.h"

namespace {

const std::vector<std::unique_ptr<pipetrain::Codec>>& Codecs() {
  static const auto* codecs = [] {
    auto* made = new std::vector<std::unique_ptr<pipetrain::Codec>>;
    for (const char* spec : pipetrain::kFuzzCodecSpecs) {
      absl::StatusOr<std::unique_ptr<pipetrain::Codec>> codec = pipetrain::MakeCodec(spec);
      PT_CHECK(codec.ok()) << spec << ": " << codec.status();
      made->push_back(*std::move(codec));
    }
    return made;
  }();
  return *codecs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  FuzzInput in(data, size);
  const Codec& codec = *Codecs()[in.Byte() % kNumFuzzCodecSpecs];
  const std::string_view rest = in.Rest();
  const absl::string_view payload(rest.data(), rest.size());
  if (!WithinFuzzDecodeLimit(payload)) return 0;
  DecodeAndCheckShape(codec, payload);
  return 0;
}
