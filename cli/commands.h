// The table of `pipetrain` subcommands: main dispatches through it, and the
// usage text and the shell completion scripts are generated from it, so a
// command added here is listed and completed everywhere.
#ifndef PIPETRAIN_CLI_COMMANDS_H_
#define PIPETRAIN_CLI_COMMANDS_H_

#include <string>
#include <vector>

#include "common/flag_set.h"

namespace pipetrain {

struct Command {
  std::string name;      // the word after `pipetrain`
  std::string synopsis;  // name and arguments, e.g. "job ID"
  std::string summary;   // one line
  // Runs the command with the words after its name; returns the exit code.
  int (*run)(const std::vector<std::string>& args);
  // The flags `run` parses (for completion).
  std::vector<FlagSet::Info> (*flags)();
  // Fixed words that may follow the name (e.g. "export"), for completion.
  std::vector<std::string> words;
};

// Every subcommand, in the order `pipetrain --help` lists them.
const std::vector<Command>& Commands();

// The command named `name`, or nullptr.
const Command* FindCommand(const std::string& name);

// `pipetrain --help`: the usage line and one line per command.
std::string UsageText();

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_COMMANDS_H_
