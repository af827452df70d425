#include "common/echo_input.h"

#include "absl/strings/escaping.h"

namespace pipetrain {

std::string EchoInput(absl::string_view value, size_t max_bytes) {
  // Escaped after the cut: a byte cut off mid-character shows as \xNN.
  std::string shown = absl::CHexEscape(value.substr(0, max_bytes));
  if (value.size() > max_bytes) shown += "...";
  return shown;
}

}  // namespace pipetrain
