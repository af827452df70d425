// Reading Prometheus text exposition format (version 0.0.4): the samples of
// a /metrics page, for tools and tests that look at a running service's
// metrics (e.g. `pipetrain up`'s link summary). Not a full parser: no
// timestamps, no escaped quotes inside label values (our labels never hold
// them); comment and blank lines are skipped.
#ifndef PIPETRAIN_COMMON_PROMETHEUS_TEXT_H_
#define PIPETRAIN_COMMON_PROMETHEUS_TEXT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// INVALID_ARGUMENT naming the line number for a line that is not
// `name{k="v",...} value` or `name value`.
absl::StatusOr<std::vector<MetricSample>> ParsePrometheusText(absl::string_view text);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_PROMETHEUS_TEXT_H_
