#include "cli/commands.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/checkpoint_command.h"
#include "cli/cluster_commands.h"
#include "cli/completion.h"
#include "cli/exit_codes.h"
#include "cli/plan_command.h"
#include "cli/train_local_command.h"
#include "common/build_info.h"

namespace pipetrain {
namespace {

// The flags taken before any command.
const std::vector<std::string> kTopFlags = {"--help", "--version"};

std::vector<FlagSet::Info> NoFlags() { return {}; }

int RunVersion(const std::vector<std::string>& args) {
  // Every command answers --help (the top-level usage says so).
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    std::printf("usage: pipetrain version\nPrints the version (also: pipetrain --version).\n");
    return kExitOk;
  }
  if (!args.empty()) {
    std::fprintf(stderr, "pipetrain version: takes no arguments\n");
    return kExitUsage;
  }
  std::printf("%s\n", VersionLine("pipetrain").c_str());
  return kExitOk;
}

int RunCompletion(const std::vector<std::string>& args) {
  const std::string shell = args.size() == 1 ? args[0] : "";
  if (shell != "bash" && shell != "zsh") {
    // Asked for (--help), on stdout as every command's help; a mistake, on
    // stderr.
    const bool help = args.size() == 1 && (args[0] == "--help" || args[0] == "-h");
    std::fprintf(help ? stdout : stderr,
                 "usage: pipetrain completion bash|zsh\n"
                 "  e.g. source <(pipetrain completion bash) in ~/.bashrc\n");
    return help ? kExitOk : kExitUsage;
  }
  std::vector<CompletedCommand> completed;
  for (const Command& c : Commands()) completed.push_back({c.name, c.summary, c.words, c.flags()});
  const std::string script = shell == "bash" ? BashCompletion("pipetrain", kTopFlags, completed)
                                             : ZshCompletion("pipetrain", kTopFlags, completed);
  std::printf("%s", script.c_str());
  return kExitOk;
}

}  // namespace

const std::vector<Command>& Commands() {
  static const std::vector<Command>* const commands = new std::vector<Command>{
      {"up", "up", "start a coordinator and workers here and train a model", RunUp, UpFlagInfo},
      {"submit", "submit FILE", "submit a job spec (JSON or YAML) to a coordinator", RunSubmit,
       SubmitFlagInfo},
      {"jobs", "jobs", "list jobs (--json)", RunJobs, JobsFlagInfo},
      {"job", "job ID", "show one job (JSON)", RunJob, JobFlagInfo},
      {"cancel", "cancel ID", "cancel a job", RunCancel, CancelFlagInfo},
      {"drain", "drain WORKER", "take a worker out of service (its job re-plans without it)",
       RunDrain, DrainFlagInfo},
      {"workers", "workers", "list workers (--json)", RunWorkers, WorkersFlagInfo},
      {"plan", "plan", "split a profiled model over workers and show the timeline", RunPlan,
       PlanFlagInfo},
      {"train-local", "train-local", "train a GPT-2 model in this process (the reference)",
       RunTrainLocal, TrainLocalFlagInfo},
      {"checkpoint",
       "checkpoint",
       "export DIR --out FILE: write a job checkpoint as HF safetensors",
       RunCheckpoint,
       CheckpointExportFlagInfo,
       {"export"}},
      {"completion",
       "completion SHELL",
       "print a bash or zsh completion script",
       RunCompletion,
       NoFlags,
       {"bash", "zsh"}},
      {"version", "version", "print the version (also --version)", RunVersion, NoFlags},
  };
  return *commands;
}

const Command* FindCommand(const std::string& name) {
  for (const Command& c : Commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::string UsageText() {
  std::string out =
      "usage: pipetrain <command> [flags]   (pipetrain --version: the version)\n\n"
      "Commands (each has --help):\n";
  for (const Command& c : Commands()) {
    absl::StrAppend(&out, absl::StrFormat("  %-17s %s\n", c.synopsis, c.summary));
  }
  absl::StrAppend(&out,
                  "\nThe commands that call a coordinator read $PIPETRAIN_COORDINATOR, "
                  "$PIPETRAIN_CA,\n$PIPETRAIN_TLS_CERT, $PIPETRAIN_TLS_KEY and $PIPETRAIN_TOKEN "
                  "when --coordinator,\n--tls-ca, --tls-cert, --tls-key and --token-file are not "
                  "given.\nExit codes: 0 ok, 1 the job did not succeed (submit --follow, up), "
                  "2 usage,\n3 submit --follow lost the job it submitted (it may still run),\n"
                  "64 + the gRPC status code of a failed call (e.g. 69 NOT_FOUND, 78 "
                  "UNAVAILABLE,\n80 UNAUTHENTICATED), 128 + N stopped by signal N; "
                  "docs/operations.md has the table.\n");
  return out;
}

}  // namespace pipetrain
