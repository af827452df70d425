// Prometheus metrics of a worker (DESIGN.md §8), fed once per iteration by
// the JobRunner's observer. Labels are bounded: phase (5 values), peer (a
// stage index), kind (3 tensor kinds), encoding ("raw" until compression).
//   pipetrain_stage_compute_seconds_total{phase}   busy time by phase
//   pipetrain_stage_idle_seconds_total             waiting in receives
//   pipetrain_stage_iterations_total
//   pipetrain_link_bytes_total{peer,kind,encoding} bytes sent
//   pipetrain_stage_loss                           last micro-batch mean loss
//                                                  (stage owning the head)
// Thread-safe (prometheus-cpp metrics are).
#ifndef PIPETRAIN_WORKER_AGENT_WORKER_METRICS_H_
#define PIPETRAIN_WORKER_AGENT_WORKER_METRICS_H_

#include <memory>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "worker/runtime/stage_runtime.h"

namespace pipetrain {

class WorkerMetrics {
 public:
  WorkerMetrics();
  void Observe(const IterationResult& result);
  prometheus::Registry* registry() { return registry_.get(); }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& compute_;
  prometheus::Counter& idle_;
  prometheus::Counter& iterations_;
  prometheus::Family<prometheus::Counter>& link_bytes_;
  prometheus::Gauge& loss_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_WORKER_METRICS_H_
