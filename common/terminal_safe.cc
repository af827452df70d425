#include "common/terminal_safe.h"

#include "absl/strings/str_format.h"

namespace pipetrain {
namespace {

// The length of the terminal control at `at`, and its code point; 0 when
// there is none.
size_t ControlAt(absl::string_view text, size_t at, unsigned* code_point) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned b0 = byte(at);
  if (b0 < 0x20 || b0 == 0x7f) {
    *code_point = b0;
    return 1;
  }
  if (b0 == 0xc2 && at + 1 < text.size() && byte(at + 1) >= 0x80 && byte(at + 1) <= 0x9f) {
    *code_point = byte(at + 1);  // U+0080-U+009F
    return 2;
  }
  if (b0 == 0xd8 && at + 1 < text.size() && byte(at + 1) == 0x9c) {
    *code_point = 0x061c;  // ARABIC LETTER MARK
    return 2;
  }
  if (b0 == 0xe2 && at + 2 < text.size()) {
    const unsigned b1 = byte(at + 1), b2 = byte(at + 2);
    const unsigned cp = ((b0 & 0x0f) << 12) | ((b1 & 0x3f) << 6) | (b2 & 0x3f);
    if ((b1 & 0xc0) == 0x80 && (b2 & 0xc0) == 0x80 &&
        (cp == 0x200e || cp == 0x200f || cp == 0x2028 || cp == 0x2029 ||
         (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069))) {
      *code_point = cp;
      return 3;
    }
  }
  return 0;
}

}  // namespace

std::optional<size_t> FirstTerminalControl(absl::string_view text) {
  unsigned code_point = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (ControlAt(text, i, &code_point) > 0) return i;
  }
  return std::nullopt;
}

std::string TerminalSafe(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    unsigned code_point = 0;
    const size_t length = ControlAt(text, i, &code_point);
    if (length == 0) {
      if (text[i] == '\\') out += '\\';
      out += text[i++];
      continue;
    }
    out += length == 1 ? absl::StrFormat("\\x%02x", code_point)
                       : absl::StrFormat("\\u{%04X}", code_point);
    i += length;
  }
  return out;
}

}  // namespace pipetrain
