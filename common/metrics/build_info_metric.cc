#include "common/metrics/build_info_metric.h"

#include "common/build_info.h"
#include "prometheus/gauge.h"

namespace pipetrain {

void AddBuildInfo(prometheus::Registry& registry) {
  const BuildInfo& build = GetBuildInfo();
  prometheus::BuildGauge()
      .Name("pipetrain_build_info")
      .Help("Always 1; the labels say which release and git commit this process runs")
      .Register(registry)
      .Add({{"version", build.version}, {"commit", build.commit}})
      .Set(1);
}

}  // namespace pipetrain
