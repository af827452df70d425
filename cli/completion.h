// Shell completion scripts for `pipetrain`, generated from the commands'
// own FlagSets (FlagSet::Describe) and the command table, so that they
// cannot drift from the flags the commands parse. Thread-safe.
#ifndef PIPETRAIN_CLI_COMPLETION_H_
#define PIPETRAIN_CLI_COMPLETION_H_

#include <string>
#include <vector>

#include "common/flag_set.h"

namespace pipetrain {

// What completion knows of one subcommand.
struct CompletedCommand {
  std::string name;                // e.g. "jobs"
  std::string summary;             // one line, for zsh's menu
  std::vector<std::string> words;  // fixed words right after the name, e.g. {"export"}
  std::vector<FlagSet::Info> flags;
};

// A bash script for `source <(pipetrain completion bash)` or
// /etc/bash_completion.d: completes the commands, their fixed words and
// flags; flag values and positional arguments fall back to file names.
// `top_flags` are the flags taken before any command (e.g. --version).
std::string BashCompletion(const std::string& program, const std::vector<std::string>& top_flags,
                           const std::vector<CompletedCommand>& commands);

// A zsh script (#compdef; source it, or put it on $fpath as _pipetrain):
// the commands with their summaries, and each command's flags with help.
std::string ZshCompletion(const std::string& program, const std::vector<std::string>& top_flags,
                          const std::vector<CompletedCommand>& commands);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_COMPLETION_H_
