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

// `text` as valid UTF-8: well-formed sequences (RFC 3629: no overlong
// forms, no surrogates, at most U+10FFFF) kept, and each other byte
// written as "\xNN". For text from outside (a peer's gRPC status message,
// whose %XX escapes gRPC decodes to any bytes; a path) put into a proto
// string field: protobuf refuses to parse a string that is not UTF-8, so
// one such byte would lose the message that carries it (a worker's
// failure report), or a record saved with it (a coordinator's job).
std::string ValidUtf8(absl::string_view text);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_ECHO_INPUT_H_
