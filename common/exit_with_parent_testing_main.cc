// A helper program for subprocess_test's parent-death cases (testonly).
//
//   exit_with_parent_testing child PIDFILE
//       ExitWithParentIfAsked, writes its pid to PIDFILE, waits for a signal.
//   exit_with_parent_testing parent PIDFILE [plain]
//       spawns `child PIDFILE` (with SpawnOptions::exit_with_parent unless
//       "plain"), waits until the child has written PIDFILE, then waits for
//       a signal itself: the test kills it with SIGKILL, so it never gets to
//       clean up after its child.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "common/subprocess.h"

int main(int argc, char** argv) {
  pipetrain::ExitWithParentIfAsked();
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc < 3 || (mode != "child" && mode != "parent")) {
    std::fprintf(stderr, "usage: %s child|parent PIDFILE [plain]\n", argv[0]);
    return 2;
  }
  const std::string pidfile = argv[2];
  if (mode == "child") {
    {
      std::ofstream out(pidfile + ".tmp");
      out << getpid() << "\n";
    }
    std::rename((pidfile + ".tmp").c_str(), pidfile.c_str());  // whole, or not there
    for (;;) pause();
  }
  pipetrain::SpawnOptions options;
  options.exit_with_parent = !(argc > 3 && std::string(argv[3]) == "plain");
  auto child =
      pipetrain::Subprocess::Spawn({"/proc/self/exe", "child", pidfile}, pidfile + ".log", options);
  if (!child.ok()) {
    std::fprintf(stderr, "%s\n", child.status().ToString().c_str());
    return 1;
  }
  if (!pipetrain::WaitForFile(pidfile, absl::Seconds(30), &*child).ok()) return 1;
  for (;;) pause();
}
