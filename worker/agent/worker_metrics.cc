#include "worker/agent/worker_metrics.h"

#include <string>

namespace pipetrain {

WorkerMetrics::WorkerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      compute_(prometheus::BuildCounter()
                   .Name("pipetrain_stage_compute_seconds_total")
                   .Help("Busy time of this worker's stage, by phase")
                   .Register(*registry_)),
      idle_(prometheus::BuildCounter()
                .Name("pipetrain_stage_idle_seconds_total")
                .Help("Time this worker's stage waited for tensors (the pipeline bubble)")
                .Register(*registry_)
                .Add({})),
      iterations_(prometheus::BuildCounter()
                      .Name("pipetrain_stage_iterations_total")
                      .Help("Iterations this worker's stage completed")
                      .Register(*registry_)
                      .Add({})),
      link_bytes_(prometheus::BuildCounter()
                      .Name("pipetrain_link_bytes_total")
                      .Help("Bytes sent to peer stages, by tensor kind and encoding")
                      .Register(*registry_)),
      loss_(prometheus::BuildGauge()
                .Name("pipetrain_stage_loss")
                .Help("Mean loss of the last iteration (on the stage computing it)")
                .Register(*registry_)
                .Add({})) {}

void WorkerMetrics::Observe(const IterationResult& r) {
  for (const auto& [phase, seconds] : r.phase_seconds) {
    compute_.Add({{"phase", phase}}).Increment(seconds);
  }
  idle_.Increment(r.idle_seconds);
  iterations_.Increment();
  for (const auto& [key, bytes] : r.sent_bytes) {
    link_bytes_.Add({{"peer", std::to_string(key.first)}, {"kind", key.second}, {"encoding", "raw"}})
        .Increment(static_cast<double>(bytes));
  }
  if (!r.micro_batch_losses.empty()) {
    double sum = 0;
    for (float l : r.micro_batch_losses) sum += l;
    loss_.Set(sum / r.micro_batch_losses.size());
  }
}

}  // namespace pipetrain
