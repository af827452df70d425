// pipetrain_build_info{version,commit} 1: which build a scraped process
// runs (common/build_info.h), for joins such as
//   up * on (instance) group_left (version) pipetrain_build_info
// and for spotting mixed versions in a fleet.
#ifndef PIPETRAIN_COMMON_METRICS_BUILD_INFO_METRIC_H_
#define PIPETRAIN_COMMON_METRICS_BUILD_INFO_METRIC_H_

#include "prometheus/registry.h"

namespace pipetrain {

// Registers the gauge, set to 1, in `registry`. Call once per registry.
void AddBuildInfo(prometheus::Registry& registry);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_METRICS_BUILD_INFO_METRIC_H_
