// Test helper: reads one series' value out of a collectable.
#ifndef PIPETRAIN_COMMON_METRICS_METRICS_TESTING_H_
#define PIPETRAIN_COMMON_METRICS_METRICS_TESTING_H_

#include <map>
#include <optional>
#include <string>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace pipetrain::testing {

// The value of the series of family `name` with exactly `labels`: a
// counter's or gauge's value, a histogram's sample count. nullopt when
// there is no such series.
inline std::optional<double> SeriesValue(const prometheus::Collectable& collectable,
                                         const std::string& name,
                                         const std::map<std::string, std::string>& labels = {}) {
  for (const prometheus::MetricFamily& family : collectable.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::map<std::string, std::string> have;
      for (const auto& label : metric.label) have[label.name] = label.value;
      if (have != labels) continue;
      switch (family.type) {
        case prometheus::MetricType::Counter:
          return metric.counter.value;
        case prometheus::MetricType::Gauge:
          return metric.gauge.value;
        case prometheus::MetricType::Histogram:
          return static_cast<double>(metric.histogram.sample_count);
        default:
          return metric.untyped.value;
      }
    }
  }
  return std::nullopt;
}

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_COMMON_METRICS_METRICS_TESTING_H_
