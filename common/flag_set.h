// Command-line flags for every pipetrain binary (the CLI's subcommands, the
// coordinator, the workers, the benchmarks).
//
// Each subcommand declares its own flags (with defaults taken from the bound
// variables) so `pipetrain train-local --help` lists only what applies.
// Accepted forms: --name=value, --name value, and for booleans --name,
// --name=true|false, --noname. Not thread-safe; bind, parse, read.
#ifndef PIPETRAIN_COMMON_FLAG_SET_H_
#define PIPETRAIN_COMMON_FLAG_SET_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pipetrain {

class FlagSet {
 public:
  explicit FlagSet(std::string usage_line) : usage_line_(std::move(usage_line)) {}

  // Bind a flag to `target`; its current value is the default shown in help.
  void String(const std::string& name, std::string* target, const std::string& help);
  void Int(const std::string& name, int* target, const std::string& help);
  void Int64(const std::string& name, int64_t* target, const std::string& help);
  void Uint64(const std::string& name, uint64_t* target, const std::string& help);
  void Float(const std::string& name, float* target, const std::string& help);
  void Double(const std::string& name, double* target, const std::string& help);
  void Bool(const std::string& name, bool* target, const std::string& help);

  // Parses `args` (the words after the subcommand). INVALID_ARGUMENT naming
  // the flag for: an unknown flag, a missing value, a value that does not
  // parse as the flag's type, or a positional argument. "--help" / "-h" sets
  // help_requested() and stops parsing.
  absl::Status Parse(const std::vector<std::string>& args);

  bool help_requested() const { return help_requested_; }
  bool IsSet(const std::string& name) const { return set_.count(name) > 0; }
  std::string Usage() const;

 private:
  struct Flag {
    std::string help;
    std::string default_text;
    bool is_bool = false;
    std::function<bool(const std::string&)> parse;  // false: bad value
  };
  void Add(const std::string& name, Flag flag);
  absl::Status Apply(const std::string& name, const std::string& value);

  std::string usage_line_;
  std::map<std::string, Flag> flags_;
  std::set<std::string> set_;
  bool help_requested_ = false;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_FLAG_SET_H_
