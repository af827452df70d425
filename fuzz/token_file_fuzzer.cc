// Token corpora (worker/data/token_file.h): ParseTokenFile, the in-memory
// half of LoadTokenFile, in each format and with a range of vocabularies.
//
// Input: byte 0 picks the format (bits 0-1: auto, text, uint16,
// uint16-header) and, for auto, the file name's extension (bit 2: ".bin",
// else ".txt"); byte 1 the vocabulary size (kVocabs); the rest is the file.
// Checks beyond the sanitizers: a file it accepts has tokens, every id
// below the vocabulary size.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fuzz/fuzz_input.h"
#include "worker/data/token_file.h"

namespace {

constexpr pipetrain::DataFormat kFormats[] = {
    pipetrain::DataFormat::kAuto, pipetrain::DataFormat::kText, pipetrain::DataFormat::kUint16,
    pipetrain::DataFormat::kUint16Header};
// 0 and -1 are rejected; 65536 and above accept every uint16 id.
constexpr int kVocabs[] = {256, 50257, 65536, 1, 0, -1, 255, 100000};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  FuzzInput in(data, size);
  const uint8_t selector = in.Byte();
  const int vocab = kVocabs[in.Byte() % std::size(kVocabs)];
  const std::string name = (selector & 4) ? "fuzz.bin" : "fuzz.txt";
  const absl::StatusOr<std::vector<uint16_t>> tokens =
      ParseTokenFile(name, in.Rest(), kFormats[selector & 3], vocab);
  if (!tokens.ok()) return 0;
  // What an accepted file promises the embedding lookup: some tokens, and
  // every id inside the vocabulary.
  if (tokens->empty()) __builtin_trap();
  for (uint16_t id : *tokens) {
    if (id >= vocab) __builtin_trap();
  }
  return 0;
}
