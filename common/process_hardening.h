// Keeps other processes of the same user out of this one's memory.
//
// The coordinator holds the join and user tokens and every worker's session
// credential and the plans' data-plane keys; a worker holds its session
// credential and its own data-plane keys. A Linux process is "dumpable" by default: a crash
// writes its memory to a core file (wherever core_pattern says, often
// readable by more people than the tokens' files are), and any process of
// the same uid may ptrace it or read /proc/PID/mem and /proc/PID/environ.
// Marking the process non-dumpable (prctl PR_SET_DUMPABLE 0, as OpenSSH's
// ssh-agent does) stops all three; root, or a holder of CAP_SYS_PTRACE,
// still can.
//
// The cost is debuggability: no core files, and `gdb -p`, perf or py-spy
// by the same user are refused. Hence the daemons' --allow-core-dumps.
#ifndef PIPETRAIN_COMMON_PROCESS_HARDENING_H_
#define PIPETRAIN_COMMON_PROCESS_HARDENING_H_

#include "absl/status/status.h"

namespace pipetrain {

// The help text of the daemons' --allow-core-dumps flag.
inline constexpr char kAllowCoreDumpsHelp[] =
    "leave this process dumpable: a crash may write a core file, and processes of the same "
    "user may trace it or read its memory (the tokens it holds); default: neither";

// Marks the calling process non-dumpable. Call in main once the flags are
// read and after any re-exec: execve makes a process dumpable again. The
// setting covers every thread, present and future. INTERNAL with errno's
// text if the kernel refuses.
absl::Status ForbidCoreDumpsAndTracing();

// Whether the calling process is dumpable now (PR_GET_DUMPABLE).
bool ProcessIsDumpable();

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_PROCESS_HARDENING_H_
