#include "common/flag_set.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/closest_name.h"
#include "common/logging.h"

namespace pipetrain {

void FlagSet::Add(const std::string& name, Flag flag) {
  PT_CHECK(flags_.emplace(name, std::move(flag)).second) << "flag --" << name << " twice";
}

std::string FlagSet::Expected(const Flag& flag) {
  return flag.expected.empty() ? "" : absl::StrCat(" (want ", flag.expected, ")");
}

void FlagSet::String(const std::string& name, std::string* target, const std::string& help) {
  Add(name, {help, "\"" + *target + "\"", false, [target](const std::string& v) {
               *target = v;
               return true;
             }});
}

void FlagSet::Int(const std::string& name, int* target, const std::string& help) {
  Add(name, {help, absl::StrCat(*target), false,
             [target](const std::string& v) { return absl::SimpleAtoi(v, target); }});
}

void FlagSet::CountOrAuto(const std::string& name, int* target, const std::string& help) {
  Add(name, {help, *target == 0 ? "auto" : absl::StrCat(*target), false,
             [target](const std::string& v) {
               if (v == "auto") {
                 *target = 0;
                 return true;
               }
               int count = 0;
               if (!absl::SimpleAtoi(v, &count) || count < 1) return false;
               *target = count;
               return true;
             },
             "", "a count >= 1 or auto"});
}

void FlagSet::Int64(const std::string& name, int64_t* target, const std::string& help) {
  Add(name, {help, absl::StrCat(*target), false,
             [target](const std::string& v) { return absl::SimpleAtoi(v, target); }});
}

void FlagSet::Uint64(const std::string& name, uint64_t* target, const std::string& help) {
  Add(name, {help, absl::StrCat(*target), false,
             [target](const std::string& v) { return absl::SimpleAtoi(v, target); }});
}

void FlagSet::Float(const std::string& name, float* target, const std::string& help) {
  Add(name, {help, absl::StrCat(*target), false, [target](const std::string& v) {
               return absl::SimpleAtof(v, target) && std::isfinite(*target);
             }});
}

void FlagSet::Double(const std::string& name, double* target, const std::string& help) {
  Add(name, {help, absl::StrCat(*target), false, [target](const std::string& v) {
               return absl::SimpleAtod(v, target) && std::isfinite(*target);
             }});
}

void FlagSet::Bool(const std::string& name, bool* target, const std::string& help) {
  Add(name, {help, *target ? "true" : "false", true,
             [target](const std::string& v) { return absl::SimpleAtob(v, target); }});
}

void FlagSet::Duration(const std::string& name, absl::Duration* target, const std::string& help) {
  Add(name, {help, absl::FormatDuration(*target), false, [target](const std::string& v) {
               absl::Duration parsed;
               double seconds = 0;
               if (absl::SimpleAtod(v, &seconds) && std::isfinite(seconds)) {
                 parsed = absl::Seconds(seconds);
               } else if (!absl::ParseDuration(v, &parsed)) {
                 return false;
               }
               if (parsed < absl::ZeroDuration() || parsed == absl::InfiniteDuration()) {
                 return false;
               }
               *target = parsed;
               return true;
             }});
}

void FlagSet::FromEnv(const std::string& name, const std::string& variable) {
  auto it = flags_.find(name);
  PT_CHECK(it != flags_.end()) << "FromEnv: no flag --" << name;
  it->second.env = variable;
}

void FlagSet::DefaultText(const std::string& name, const std::string& text) {
  auto it = flags_.find(name);
  PT_CHECK(it != flags_.end()) << "DefaultText: no flag --" << name;
  it->second.default_text = text;
}

void FlagSet::AddVersionFlag() {
  PT_CHECK(flags_.count("version") == 0) << "flag --version twice";
  version_flag_ = true;
}

absl::Status FlagSet::ApplyEnvironment() {
  for (const auto& [name, flag] : flags_) {  // IsSet() is true after, as for a flag
    if (flag.env.empty() || set_.count(name) > 0) continue;
    const char* value = std::getenv(flag.env.c_str());
    if (value == nullptr || value[0] == '\0') continue;
    if (!flag.parse(value)) {
      return absl::InvalidArgumentError(absl::StrCat("$", flag.env, " (the default of --", name,
                                                     "): cannot parse '", value, "'",
                                                     Expected(flag)));
    }
    set_.insert(name);
    from_env_.insert(name);
  }
  return absl::OkStatus();
}

absl::Status FlagSet::Apply(const std::string& name, const std::string& value) {
  auto it = flags_.find(name);
  if (!it->second.parse(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": cannot parse '", value, "'", Expected(it->second)));
  }
  set_.insert(name);
  return absl::OkStatus();
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args) { return Parse(args, nullptr); }

absl::Status FlagSet::Parse(const std::vector<std::string>& args,
                            std::vector<std::string>* positional) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      return absl::OkStatus();
    }
    if (version_flag_ && arg == "--version") {
      version_requested_ = true;
      return absl::OkStatus();
    }
    if (positional != nullptr && arg.rfind("--", 0) != 0) {
      positional->push_back(arg);
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    auto it = flags_.find(name);
    if (it == flags_.end() && !has_value && name.rfind("no", 0) == 0) {
      auto negated = flags_.find(name.substr(2));
      if (negated != flags_.end() && negated->second.is_bool) {
        absl::Status status = Apply(name.substr(2), "false");  // --noflag
        if (!status.ok()) return status;
        continue;
      }
    }
    if (it == flags_.end()) {
      std::vector<std::string> names;
      for (const auto& [known, flag] : flags_) names.push_back(known);
      const std::string near = ClosestName(name, names);
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag --", name, near.empty() ? "" : absl::StrCat("; did you mean --", near, "?"),
          " (see --help)"));
    }
    if (!has_value) {
      if (it->second.is_bool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
    }
    absl::Status status = Apply(name, value);
    if (!status.ok()) return status;
  }
  return ApplyEnvironment();
}

std::string FlagSet::Usage() const {
  std::string out = usage_line_ + "\n\nFlags:\n";
  for (const auto& [name, flag] : flags_) {
    absl::StrAppend(&out, "  --", name, "  ", flag.help, " (default ", flag.default_text,
                    flag.env.empty() ? "" : absl::StrCat("; env $", flag.env), ")\n");
  }
  if (version_flag_) absl::StrAppend(&out, "  --version  print the version and exit\n");
  return out;
}

std::vector<FlagSet::Info> FlagSet::Describe() const {
  std::vector<Info> out;
  for (const auto& [name, flag] : flags_) out.push_back({name, flag.help, flag.is_bool, flag.env});
  if (version_flag_) out.push_back({"version", "print the version and exit", true, ""});
  std::sort(out.begin(), out.end(), [](const Info& a, const Info& b) { return a.name < b.name; });
  return out;
}

}  // namespace pipetrain
