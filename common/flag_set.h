// Command-line flags for every pipetrain binary (the CLI's subcommands, the
// coordinator, the workers, the benchmarks).
//
// Each subcommand declares its own flags (with defaults taken from the bound
// variables) so `pipetrain train-local --help` lists only what applies.
// Accepted forms: --name=value, --name value, and for booleans --name,
// --name=true|false, --noname. A flag may take its default from an
// environment variable (FromEnv); the command line overrides it. Not
// thread-safe; bind, parse, read.
#ifndef PIPETRAIN_COMMON_FLAG_SET_H_
#define PIPETRAIN_COMMON_FLAG_SET_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace pipetrain {

class FlagSet {
 public:
  explicit FlagSet(std::string usage_line) : usage_line_(std::move(usage_line)) {}

  // Bind a flag to `target`; its current value is the default shown in help.
  void String(const std::string& name, std::string* target, const std::string& help);
  void Int(const std::string& name, int* target, const std::string& help);
  // A count >= 1, or "auto", stored as 0 (the spec's "the planner chooses",
  // e.g. spec.parallelism.data); 0 and negative numbers do not parse, and
  // the error says what would.
  void CountOrAuto(const std::string& name, int* target, const std::string& help);
  void Int64(const std::string& name, int64_t* target, const std::string& help);
  void Uint64(const std::string& name, uint64_t* target, const std::string& help);
  void Float(const std::string& name, float* target, const std::string& help);
  void Double(const std::string& name, double* target, const std::string& help);
  void Bool(const std::string& name, bool* target, const std::string& help);
  // A duration such as 500ms, 10s, 2m or 1h (absl::ParseDuration), or a
  // plain number of seconds; negative or infinite values do not parse.
  void Duration(const std::string& name, absl::Duration* target, const std::string& help);

  // The bound flag `name` takes its value from the environment variable
  // `variable` when that is set, non-empty and the flag is not given on the
  // command line. Requires: `name` is bound.
  void FromEnv(const std::string& name, const std::string& variable);

  // Help shows `text` as the default of bound flag `name` instead of its
  // variable's value: for a flag whose variable starts at a sentinel meaning
  // "decided later" (e.g. "calibrated"). Requires: `name` is bound.
  void DefaultText(const std::string& name, const std::string& text);

  // Adds --version: Parse stops at it and sets version_requested(); the
  // caller prints VersionLine() (common/build_info.h) and exits 0.
  void AddVersionFlag();

  // Parses `args` (the words after the subcommand). INVALID_ARGUMENT naming
  // the flag for: an unknown flag, a missing value, a value that does not
  // parse as the flag's type, or a positional argument; for an environment
  // variable's value that does not parse, naming the variable. "--help" /
  // "-h" sets help_requested() and stops parsing (no environment read).
  absl::Status Parse(const std::vector<std::string>& args);
  // The same, but appends each positional argument (a word that starts
  // neither with "--" nor is "-h", and is not a flag's value) to
  // `positional`, in order, wherever it stands among the flags: `submit
  // --follow job.yaml` as well as `submit job.yaml --follow`.
  absl::Status Parse(const std::vector<std::string>& args, std::vector<std::string>* positional);

  bool help_requested() const { return help_requested_; }
  bool version_requested() const { return version_requested_; }
  // True when given on the command line or taken from its environment variable.
  bool IsSet(const std::string& name) const { return set_.count(name) > 0; }
  // True when the value came from the flag's environment variable (FromEnv),
  // not the command line.
  bool FromEnvironment(const std::string& name) const { return from_env_.count(name) > 0; }
  std::string Usage() const;

  // What a flag is, for generated shell completion (cli/completion.h).
  struct Info {
    std::string name;  // without the dashes
    std::string help;
    bool is_bool = false;
    std::string env;  // FromEnv's variable; empty: none
  };
  // Every bound flag (and --version when added), sorted by name.
  std::vector<Info> Describe() const;

 private:
  struct Flag {
    std::string help;
    std::string default_text;
    bool is_bool = false;
    std::function<bool(const std::string&)> parse;  // false: bad value
    std::string env;
    std::string expected;  // what a good value is, for the parse error; empty: the type's
  };
  void Add(const std::string& name, Flag flag);
  // " (want <expected>)" for a parse error, or "" when the flag names none.
  static std::string Expected(const Flag& flag);
  absl::Status Apply(const std::string& name, const std::string& value);
  absl::Status ApplyEnvironment();

  std::string usage_line_;
  std::map<std::string, Flag> flags_;
  std::set<std::string> set_;
  std::set<std::string> from_env_;  // a subset of set_
  bool help_requested_ = false;
  bool version_flag_ = false;
  bool version_requested_ = false;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_FLAG_SET_H_
