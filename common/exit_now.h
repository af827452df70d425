// ExitNow: the "give up and exit" step of a bound or a further signal (the
// worker's --stop-timeout-seconds, the coordinator's StopBound and its lost
// leadership). It logs one ERROR line and ends the process at once.
//
// The line is best effort, the exit is not: stderr can block (a stopped
// `| tee`, a Docker log driver in blocking mode that is down, a stalled
// journald stream), and a plain log line before std::_Exit then kept the
// process, and an HA leader's lease, alive until the supervisor's SIGKILL.
// So a timer thread is started before the line is written; it exits with
// the same code kExitNowGrace later if the write has not returned.
#ifndef PIPETRAIN_COMMON_EXIT_NOW_H_
#define PIPETRAIN_COMMON_EXIT_NOW_H_

#include <string>

#include "absl/time/time.h"

namespace pipetrain {

// How long the log line may take before the process exits without it.
inline constexpr absl::Duration kExitNowGrace = absl::Seconds(1);

// Writes `message` as an ERROR log line (PT_LOG's format, naming the
// caller's file and line) and exits with `code` by std::_Exit: no
// destructors, no atexit handlers, no stdio flush. Within kExitNowGrace
// even if stderr blocks; at once, without the line, when no timer thread
// can be started. Thread-safe (a second caller's code may win); not
// async-signal-safe (it allocates and starts a thread).
[[noreturn]] void ExitNow(int code, const std::string& message, const char* file = __builtin_FILE(),
                          int line = __builtin_LINE());

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_EXIT_NOW_H_
