#include "common/byte_size.h"

#include <cctype>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pipetrain {

absl::StatusOr<int64_t> ParseByteSize(const std::string& flag, const std::string& text) {
  double number = 0;
  std::string digits = text;  // without the suffix
  double unit = 1;
  if (!digits.empty()) {
    const char suffix = static_cast<char>(std::toupper(static_cast<unsigned char>(digits.back())));
    const std::string units = "KMGT";
    if (const size_t at = units.find(suffix); at != std::string::npos) {
      unit = std::ldexp(1.0, 10 * static_cast<int>(at + 1));
      digits.pop_back();
    }
  }
  // At least a byte: 0.5 truncated to 0, which --memory-limit reads as
  // none and --mailbox-limit as room for nothing.
  if (!absl::SimpleAtod(digits, &number) || !(number * unit >= 1) ||
      number * unit > std::ldexp(1.0, 50)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " \"", text,
                     "\" is not a size in [1, 1P] bytes such as 512M, 8G or 1073741824"));
  }
  return static_cast<int64_t>(number * unit);
}

}  // namespace pipetrain
