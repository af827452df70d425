// The exit codes of the `pipetrain` commands that talk to a coordinator
// (submit, jobs, job, cancel, drain, workers, up). A failed call exits with
// 64 + its canonical status code, as grpcurl does, so a script can tell
// "no such job" (69) from "coordinator unreachable" (78) without parsing
// messages. The table is documented in docs/operations.md ("Exit codes").
//
//   0   success                      2   bad command line (usage)
//   1   the job ended, not SUCCEEDED 130 interrupted (Ctrl-C)
//   3   `submit --follow`: the job was submitted, then following it
//       failed (the coordinator lost, the job no longer found)
//   129, 141, 143 `up` stopped by a hangup, a closed stdout or SIGTERM
//                 (128 + the signal); 141 also `submit --follow`'s
//   65  CANCELLED          66 UNKNOWN            67 INVALID_ARGUMENT
//   68  DEADLINE_EXCEEDED  69 NOT_FOUND          70 ALREADY_EXISTS
//   71  PERMISSION_DENIED  72 RESOURCE_EXHAUSTED 73 FAILED_PRECONDITION
//   74  ABORTED            75 OUT_OF_RANGE       76 UNIMPLEMENTED
//   77  INTERNAL           78 UNAVAILABLE        79 DATA_LOSS
//   80  UNAUTHENTICATED
#ifndef PIPETRAIN_CLI_EXIT_CODES_H_
#define PIPETRAIN_CLI_EXIT_CODES_H_

#include "absl/status/status.h"

namespace pipetrain {

constexpr int kExitOk = 0;
constexpr int kExitJobNotSucceeded = 1;
constexpr int kExitUsage = 2;
// `submit --follow` after the job was created (its id printed): following
// it failed. Not the failed call's own code: 78 or 69 there read as a
// submit that never got through, and a script retrying on them would start
// a second job.
constexpr int kExitFollowFailed = 3;
// A command stopped by signal N (SIGINT, SIGTERM, a closed stdout's
// SIGPIPE) after cleaning up exits kExitSignalBase + N, as a shell reports
// a process that signal ended: 130, 143, 141.
constexpr int kExitSignalBase = 128;
// A failed call exits kExitStatusBase + its status code (1..16).
constexpr int kExitStatusBase = 64;

// The exit code for `code`: 0 for OK, 64 + code for the sixteen canonical
// error codes, and UNKNOWN's (66) for a code outside them. Thread-safe.
int ExitCodeFor(absl::StatusCode code);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_EXIT_CODES_H_
