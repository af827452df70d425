// Several collectables served as one exposition: HttpServer's /metrics
// (ServePrometheus) takes one prometheus::Collectable, and a binary has its
// registry plus collectors computed at scrape time (ProcessCollector).
//
//   CollectableList all({metrics.registry(), &process});
//   ServePrometheus(http, &all);
//
// The parts must not export the same family name. Not owned: they must
// outlive the list. Thread-safe when the parts are.
#ifndef PIPETRAIN_COMMON_METRICS_COLLECTABLE_LIST_H_
#define PIPETRAIN_COMMON_METRICS_COLLECTABLE_LIST_H_

#include <utility>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace pipetrain {

class CollectableList : public prometheus::Collectable {
 public:
  explicit CollectableList(std::vector<const prometheus::Collectable*> parts)
      : parts_(std::move(parts)) {}

  // The families of each part, in order.
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> all;
    for (const prometheus::Collectable* part : parts_) {
      std::vector<prometheus::MetricFamily> families = part->Collect();
      all.insert(all.end(), std::make_move_iterator(families.begin()),
                 std::make_move_iterator(families.end()));
    }
    return all;
  }

 private:
  const std::vector<const prometheus::Collectable*> parts_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_METRICS_COLLECTABLE_LIST_H_
