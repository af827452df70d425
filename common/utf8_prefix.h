// Cutting text that must stay valid UTF-8 (proto3 strings, SVG text,
// status messages) to a byte budget without splitting a character.
#ifndef PIPETRAIN_COMMON_UTF8_PREFIX_H_
#define PIPETRAIN_COMMON_UTF8_PREFIX_H_

#include <cstddef>

#include "absl/strings/string_view.h"

namespace pipetrain {

// The longest prefix of `text` of at most `max_bytes` that does not end
// inside a UTF-8 sequence: `text` itself when it fits, else cut before the
// first byte of the character that would be split. (Valid UTF-8 in, valid
// UTF-8 out; other bytes are cut as they come.)
inline absl::string_view Utf8Prefix(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut);
}

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_UTF8_PREFIX_H_
