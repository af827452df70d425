// Text that users put in (job names, paths) and that other users see on a
// terminal: `pipetrain jobs` lists every user's job names. Escape
// sequences in them (ESC [2J, an OSC that sets the window title, CR and LF
// forging lines, and Unicode's line and paragraph separators likewise) or
// Unicode's bidirectional controls (U+202E, which shows "gpj.exe" for
// "exe.jpg") would act on the reader's terminal.
#ifndef PIPETRAIN_COMMON_TERMINAL_SAFE_H_
#define PIPETRAIN_COMMON_TERMINAL_SAFE_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace pipetrain {

// Where the first character that acts on a terminal starts in `text`: a C0
// control (bytes 0x00-0x1f, tab included), DEL (0x7f), a C1 control
// (U+0080-U+009F, as UTF-8), the line and paragraph separators (U+2028,
// U+2029), or a bidirectional mark, embedding, override or isolate (U+200E,
// U+200F, U+061C, U+202A-U+202E, U+2066-U+2069). nullopt when there is none.
// Other bytes, invalid UTF-8 among them, are left to the caller.
std::optional<size_t> FirstTerminalControl(absl::string_view text);

// `text` with each such character written as "\xNN" (C0, DEL) or "\u{XXXX}"
// (the others), and backslashes as "\\", so that what is printed is inert
// and says what was there.
std::string TerminalSafe(absl::string_view text);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_TERMINAL_SAFE_H_
