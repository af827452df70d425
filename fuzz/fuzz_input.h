// Reads a libFuzzer input as the small structure a fuzz target needs (a
// selector byte, length-prefixed pieces, the rest). Reads past the end give
// zero and empty views, so every input, however short, is usable.
#ifndef PIPETRAIN_FUZZ_FUZZ_INPUT_H_
#define PIPETRAIN_FUZZ_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pipetrain {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : rest_(reinterpret_cast<const char*>(data), size) {}

  bool empty() const { return rest_.empty(); }

  // The next byte, or 0 past the end.
  uint8_t Byte() {
    if (rest_.empty()) return 0;
    const uint8_t b = static_cast<uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return b;
  }

  // The next two bytes as a little-endian uint16 (missing bytes read as 0).
  uint16_t U16() {
    const uint16_t lo = Byte();
    return static_cast<uint16_t>(lo | Byte() << 8);
  }

  // The next min(n, remaining) bytes.
  std::string_view Take(size_t n) {
    const std::string_view piece = rest_.substr(0, std::min(n, rest_.size()));
    rest_.remove_prefix(piece.size());
    return piece;
  }

  // A piece written as a little-endian uint16 length, then that many bytes
  // (fewer if the input ends first).
  std::string_view LengthPrefixed() { return Take(U16()); }

  // Everything not read yet.
  std::string_view Rest() { return Take(rest_.size()); }

  // A length-prefixed piece parsed into `message` (a protobuf message);
  // false when the bytes are not one.
  template <typename Message>
  bool ParseLengthPrefixed(Message& message) {
    const std::string_view bytes = LengthPrefixed();
    return message.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  }

 private:
  std::string_view rest_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_FUZZ_FUZZ_INPUT_H_
