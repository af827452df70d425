#include "common/echo_input.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace pipetrain {

std::string EchoInput(absl::string_view value, size_t max_bytes) {
  // Escaped after the cut: a byte cut off mid-character shows as \xNN.
  std::string shown = absl::CHexEscape(value.substr(0, max_bytes));
  if (value.size() > max_bytes) shown += "...";
  return shown;
}

namespace {

// The length of the well-formed UTF-8 sequence at the start of `s`, or 0.
size_t SequenceLength(absl::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const auto continuation = [&](size_t i) { return i < s.size() && (byte(i) & 0xC0) == 0x80; };
  const unsigned char b0 = byte(0);
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) return continuation(1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (!continuation(1) || !continuation(2)) return 0;
    if (b0 == 0xE0 && byte(1) < 0xA0) return 0;   // overlong
    if (b0 == 0xED && byte(1) >= 0xA0) return 0;  // a surrogate
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (!continuation(1) || !continuation(2) || !continuation(3)) return 0;
    if (b0 == 0xF0 && byte(1) < 0x90) return 0;   // overlong
    if (b0 == 0xF4 && byte(1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;  // a continuation byte, C0, C1 or F5..FF
}

}  // namespace

std::string ValidUtf8(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const size_t n = SequenceLength(text);
    if (n > 0) {
      out.append(text.data(), n);
      text.remove_prefix(n);
    } else {
      out += absl::StrCat("\\x", absl::Hex(static_cast<unsigned char>(text[0]), absl::kZeroPad2));
      text.remove_prefix(1);
    }
  }
  return out;
}

}  // namespace pipetrain
