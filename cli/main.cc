// The `pipetrain` command: the single-process trainer and the cluster
// commands, dispatched through the command table (commands.h).
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "common/build_info.h"
#include "common/grpc_log.h"
#include "common/malloc_tuning.h"
#include "kernels/cpu/blas.h"

int main(int argc, char** argv) {
  pipetrain::ConfigureBlasOrReexec(argv);
  pipetrain::TuneMallocForLargeBuffers();  // As pipetrain-worker does: malloc_tuning.h.
  // A failed call's error is the command's own line: gRPC's raw ones
  // ("E1202 ... Handshake failed") before it said nothing more.
  pipetrain::QuietGrpcLogsUnlessAskedFor();
  const std::string usage = pipetrain::UsageText();
  if (argc < 2) {
    std::fprintf(stderr, "%s", usage.c_str());
    return pipetrain::kExitUsage;
  }
  const std::string command = argv[1];
  if (command == "help" || command == "--help" || command == "-h") {
    // `pipetrain help submit` is `pipetrain submit --help`.
    if (command == "help" && argc >= 3 && std::string(argv[2]) != "-h" &&
        std::string(argv[2]) != "--help") {
      if (const pipetrain::Command* c = pipetrain::FindCommand(argv[2])) return c->run({"--help"});
      std::fprintf(stderr, "pipetrain help: unknown command '%s'\n\n%s", argv[2], usage.c_str());
      return pipetrain::kExitUsage;
    }
    std::printf("%s", usage.c_str());
    return pipetrain::kExitOk;
  }
  if (command == "--version") {
    std::printf("%s\n", pipetrain::VersionLine("pipetrain").c_str());
    return pipetrain::kExitOk;
  }
  if (const pipetrain::Command* c = pipetrain::FindCommand(command)) {
    return c->run(std::vector<std::string>(argv + 2, argv + argc));
  }
  std::fprintf(stderr, "pipetrain: unknown command '%s'\n\n%s", command.c_str(), usage.c_str());
  return pipetrain::kExitUsage;
}
