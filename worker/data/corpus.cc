#include "worker/data/corpus.h"

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "common/secrets.h"
#include "worker/data/synthetic_text.h"

namespace pipetrain {

absl::StatusOr<std::vector<uint16_t>> LoadCorpus(const CorpusSpec& spec) {
  if (!spec.path.empty()) {
    TokenFileLoadOptions options;
    options.name = spec.name;
    options.max_bytes = spec.max_bytes;
    options.path_is_checked_real = spec.path_is_checked_real;
    options.stop = spec.stop;
    return LoadTokenFile(spec.path, spec.format, spec.vocab_size, options);
  }
  if (spec.vocab_size < 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generated text is byte-level and needs a vocabulary of at least 256, got ",
        spec.vocab_size));
  }
  if (spec.synthetic_bytes < 1) {
    return absl::InvalidArgumentError("generated corpus size must be >= 1 byte");
  }
  // Checked before generating: the text, then a 2-byte token per byte.
  if (spec.max_bytes > 0 && spec.synthetic_bytes > spec.max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(spec.synthetic_bytes, " bytes of generated text exceeds the limit of ",
                     spec.max_bytes, " bytes"));
  }
  const std::string text = GenerateEnglishText(spec.seed, static_cast<size_t>(spec.synthetic_bytes));
  return std::vector<uint16_t>(text.begin(), text.end());
}

std::string CorpusSha256(const std::vector<uint16_t>& tokens) {
#ifdef ABSL_IS_LITTLE_ENDIAN
  return Sha256Hex(absl::string_view(reinterpret_cast<const char*>(tokens.data()),
                                     tokens.size() * sizeof(uint16_t)));
#else
  std::string bytes;
  bytes.reserve(tokens.size() * 2);
  for (uint16_t t : tokens) {
    bytes.push_back(static_cast<char>(t & 0xff));
    bytes.push_back(static_cast<char>(t >> 8));
  }
  return Sha256Hex(bytes);
#endif
}

std::string DescribeCorpus(const CorpusSpec& spec, size_t tokens) {
  if (spec.path.empty()) {
    return absl::StrCat("generated English text, ", tokens, " bytes (seed ", spec.seed, ")");
  }
  return absl::StrCat(spec.path, ", ", tokens, " tokens");
}

}  // namespace pipetrain
