// The `pipetrain` command. Subcommands available in this build:
//   train-local   single-process reference trainer
// (The cluster commands - up, submit, jobs, plan, ... - arrive with the
// coordinator; see README.md.)
#include <cstdio>
#include <string>
#include <vector>

#include "cli/train_local_command.h"
#include "kernels/cpu/blas.h"

namespace {

constexpr char kUsage[] =
    "usage: pipetrain <command> [flags]\n\n"
    "Commands:\n"
    "  train-local   train a GPT-2 model in this process (--help for flags)\n";

}  // namespace

int main(int argc, char** argv) {
  pipetrain::ConfigureBlasOrReexec(argv);
  if (argc < 2) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "train-local") return pipetrain::RunTrainLocal(args);
  if (command == "help" || command == "--help" || command == "-h") {
    std::printf("%s", kUsage);
    return 0;
  }
  std::fprintf(stderr, "pipetrain: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
