#include "common/flag_set.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pipetrain {

void FlagSet::Add(const std::string& name, Flag flag) {
  PT_CHECK(flags_.emplace(name, std::move(flag)).second) << "flag --" << name << " twice";
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

absl::Status FlagSet::Apply(const std::string& name, const std::string& value) {
  auto it = flags_.find(name);
  if (!it->second.parse(value)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": cannot parse '", value, "'"));
  }
  set_.insert(name);
  return absl::OkStatus();
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      return absl::OkStatus();
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
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
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
  return absl::OkStatus();
}

std::string FlagSet::Usage() const {
  std::string out = usage_line_ + "\n\nFlags:\n";
  for (const auto& [name, flag] : flags_) {
    absl::StrAppend(&out, "  --", name, "  ", flag.help, " (default ", flag.default_text, ")\n");
  }
  return out;
}

}  // namespace pipetrain
