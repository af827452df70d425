// Quoting what a client or peer sent inside an error message.
#ifndef PIPETRAIN_COMMON_ECHO_INPUT_H_
#define PIPETRAIN_COMMON_ECHO_INPUT_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace pipetrain {

// `value` C-escaped (control bytes, quotes, backslashes and non-ASCII bytes
// as \n, \", \\, \xNN) and cut to its first `max_bytes` bytes, "..." marking
// a cut: printable ASCII whatever was sent, so a message quoting it cannot
// act on a terminal, forge a log line or grow with the request.
std::string EchoInput(absl::string_view value, size_t max_bytes = 64);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_ECHO_INPUT_H_
