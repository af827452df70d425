// The `pipetrain` command: the single-process trainer and the cluster
// commands (see cluster_commands.h).
#include <cstdio>
#include <string>
#include <vector>

#include "cli/checkpoint_command.h"
#include "cli/cluster_commands.h"
#include "cli/plan_command.h"
#include "cli/train_local_command.h"
#include "kernels/cpu/blas.h"

namespace {

constexpr char kUsage[] =
    "usage: pipetrain <command> [flags]\n\n"
    "Commands (each has --help):\n"
    "  up            start a coordinator and workers here and train a model\n"
    "  submit FILE   submit a job spec (JSON or YAML) to a coordinator\n"
    "  jobs          list jobs\n"
    "  job ID        show one job (JSON)\n"
    "  cancel ID     cancel a job\n"
    "  drain WORKER  take a worker out of service (its job re-plans without it)\n"
    "  workers       list workers\n"
    "  plan          split a profiled model over workers and show the timeline\n"
    "  train-local   train a GPT-2 model in this process (the reference)\n"
    "  checkpoint    export DIR --out FILE: write a job checkpoint as HF safetensors\n";

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
  if (command == "up") return pipetrain::RunUp(args);
  if (command == "plan") return pipetrain::RunPlan(args);
  if (command == "submit") return pipetrain::RunSubmit(args);
  if (command == "jobs") return pipetrain::RunJobs(args);
  if (command == "job") return pipetrain::RunJob(args);
  if (command == "cancel") return pipetrain::RunCancel(args);
  if (command == "drain") return pipetrain::RunDrain(args);
  if (command == "workers") return pipetrain::RunWorkers(args);
  if (command == "checkpoint") return pipetrain::RunCheckpoint(args);
  if (command == "help" || command == "--help" || command == "-h") {
    std::printf("%s", kUsage);
    return 0;
  }
  std::fprintf(stderr, "pipetrain: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
