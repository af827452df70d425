// Codec spec strings as a job spec or a peer's frame header names them
// (kernels/compress/codec_spec.h): ParseCodecSpec and MakeCodec, then the
// codec built from the spec decodes the payload that follows, so codec
// parameters no fixed list holds (keep=1e-9, rank=1024) meet payloads.
//
// Input: the spec, a newline, the payload (payload.h). Without a newline
// the whole input is the spec. Payloads announcing more than
// kFuzzMaxDecodedElements are not decoded, as in codec_fuzzer.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "fuzz/codec_specs.h"
#include "kernels/compress/codec_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t newline = input.find('\n');
  const std::string spec(input.substr(0, newline));
  if (!ParseCodecSpec(spec).ok()) return 0;
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(spec);
  if (!codec.ok() || newline == std::string_view::npos) return 0;
  const std::string_view rest = input.substr(newline + 1);
  const absl::string_view payload(rest.data(), rest.size());
  if (!WithinFuzzDecodeLimit(payload)) return 0;
  DecodeAndCheckShape(**codec, payload);
  return 0;
}
