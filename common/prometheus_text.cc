#include "common/prometheus_text.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pipetrain {
namespace {

// Parses `k="v",k2="v2"` (the text between the braces).
bool ParseLabels(absl::string_view text, std::map<std::string, std::string>* labels) {
  while (!text.empty()) {
    const size_t eq = text.find("=\"");
    if (eq == absl::string_view::npos) return false;
    const size_t close = text.find('"', eq + 2);
    if (close == absl::string_view::npos) return false;
    (*labels)[std::string(text.substr(0, eq))] = std::string(text.substr(eq + 2, close - eq - 2));
    text.remove_prefix(close + 1);
    absl::ConsumePrefix(&text, ",");
  }
  return true;
}

bool ParseValue(absl::string_view text, double* value) {
  text = absl::StripAsciiWhitespace(text);
  if (text == "+Inf" || text == "-Inf" || text == "NaN") {
    *value = std::strtod(std::string(text).c_str(), nullptr);
    return true;
  }
  return absl::SimpleAtod(text, value);
}

}  // namespace

absl::StatusOr<std::vector<MetricSample>> ParsePrometheusText(absl::string_view text) {
  std::vector<MetricSample> samples;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    MetricSample sample;
    const size_t brace = line.find('{');
    bool ok;
    if (brace != absl::string_view::npos) {
      const size_t close = line.rfind('}');
      sample.name = std::string(line.substr(0, brace));
      ok = close != absl::string_view::npos && close > brace &&
           ParseLabels(line.substr(brace + 1, close - brace - 1), &sample.labels) &&
           ParseValue(line.substr(close + 1), &sample.value);
    } else {
      const size_t space = line.find(' ');
      sample.name = std::string(line.substr(0, space));
      ok = space != absl::string_view::npos && ParseValue(line.substr(space + 1), &sample.value);
    }
    if (!ok || sample.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics line ", number, " is not a sample: \"", line, "\""));
    }
    samples.push_back(std::move(sample));
  }
  return samples;
}

}  // namespace pipetrain
