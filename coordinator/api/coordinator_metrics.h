// The coordinator's Prometheus metrics (DESIGN.md §8), in one registry that
// the HTTP server exposes at /metrics.
//
//   pipetrain_workers{state}                      gauge    workers per WorkerState
//   pipetrain_jobs{state}                         gauge    jobs per JobState
//   pipetrain_job_loss                            gauge    last step's mean loss (*)
//   pipetrain_job_val_loss                        gauge    latest validation loss (*)
//   pipetrain_job_tokens_per_second               gauge    training throughput (*)
//   pipetrain_plan_predicted_iteration_seconds    gauge    the plan's simulated iteration time (*)
//   pipetrain_plan_version                        gauge    the plan's version (*)
//   pipetrain_job_steps_total                     counter  optimizer steps completed, all jobs
//   pipetrain_stage_busy_seconds_total{stage}     counter  compute time reported per stage
//   pipetrain_stage_idle_seconds_total{stage}     counter  time stages waited on receives
//   pipetrain_job_recoveries_total{reason}        counter  jobs that went RECOVERING: worker_lost,
//                                                          peer_failure, checkpoint_unusable
//   pipetrain_job_recovery_seconds                histogram  loss detected to the first step
//                                                          completed on the new plan
//   pipetrain_job_steps_redone_total              counter  steps run again after recoveries
//   pipetrain_checkpoints_total{result}           counter  checkpoints complete / stage writes
//   failed pipetrain_checkpoint_write_seconds            histogram  a stage writing its unit files
//   pipetrain_checkpoint_bytes_total              counter  bytes of complete checkpoints
//   pipetrain_rpc_duration_seconds{method}        histogram  unary gRPC handling time
//   pipetrain_rpc_refused_total{method,code}      counter  calls refused before handling
//                                                          (UNAUTHENTICATED, PERMISSION_DENIED)
//
// (*) of the "current" job: the most recently submitted RUNNING job, or, when
// none runs, the most recently submitted job that completed a step (so the
// final values of a finished job stay visible); 0 before any step.
//
// Labels are bounded: state and method come from the protos, stage is the
// pipeline position "0", "1", ... capped at kMaxStageLabel ("63+" for stages
// beyond; plans have at most 2 * n_layer + 2 stages). No job ids, steps or
// micro-batches, which would grow without bound.
//
// Thread-safe: prometheus-cpp metrics are atomic, and Refresh only reads the
// registry and job manager through their thread-safe methods.
#ifndef PIPETRAIN_COORDINATOR_API_COORDINATOR_METRICS_H_
#define PIPETRAIN_COORDINATOR_API_COORDINATOR_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/registry/worker_registry.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pipetrain {

class CoordinatorMetrics {
 public:
  // Stages at or above this share the label "63+".
  static constexpr int kMaxStageLabel = 63;

  // `workers` and `jobs` are read by Refresh; not owned, must outlive this.
  CoordinatorMetrics(const WorkerRegistry* workers, const JobManager* jobs);
  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;

  // What /metrics serves.
  const prometheus::Registry* registry() const { return registry_.get(); }

  // Re-reads the gauges (workers, jobs, current job's loss, throughput and
  // plan) from their sources. Called before each scrape.
  void Refresh();

  // One unary RPC of `method` (e.g. "SubmitJob") took `seconds`.
  void ObserveRpc(absl::string_view method, double seconds);
  // A call of `method` was refused with `code` by authentication (only
  // UNAUTHENTICATED and PERMISSION_DENIED are counted: the label stays
  // bounded). Refused calls are not observed by ObserveRpc.
  void CountRefused(absl::string_view method, absl::StatusCode code);
  // A stage reported an iteration's compute and receive-wait time (from
  // ReportProgress). Negative or non-finite values are ignored: they come
  // from workers, and counters only go up.
  void AddStageTime(int stage, double busy_seconds, double idle_seconds);
  // One optimizer step completed (a ReportProgress carrying losses).
  void CountStep();
  // The job manager's events (JobManager::SetEvents), feeding the recovery
  // and checkpoint metrics above.
  JobEvents Events();

 private:
  void RefreshCurrentJob();
  static std::string StageLabel(int stage);

  const WorkerRegistry* const workers_;
  const JobManager* const jobs_;
  std::unique_ptr<prometheus::Registry> registry_;

  prometheus::Family<prometheus::Gauge>* workers_by_state_;
  prometheus::Family<prometheus::Gauge>* jobs_by_state_;
  prometheus::Gauge* job_loss_;
  prometheus::Gauge* job_val_loss_;
  prometheus::Gauge* job_tokens_per_second_;
  prometheus::Gauge* plan_predicted_seconds_;
  prometheus::Gauge* plan_version_;
  prometheus::Counter* job_steps_;
  prometheus::Family<prometheus::Counter>* stage_busy_;
  prometheus::Family<prometheus::Counter>* stage_idle_;
  prometheus::Family<prometheus::Histogram>* rpc_duration_;
  prometheus::Family<prometheus::Counter>* rpc_refused_;
  prometheus::Family<prometheus::Counter>* recoveries_;
  prometheus::Histogram* recovery_seconds_;
  prometheus::Counter* steps_redone_;
  prometheus::Family<prometheus::Counter>* checkpoints_;
  prometheus::Histogram* checkpoint_write_seconds_;
  prometheus::Counter* checkpoint_bytes_;
  // Histograms of the service's unary methods, created up front; filled in
  // the constructor and read-only afterwards.
  std::map<std::string, prometheus::Histogram*, std::less<>> rpc_by_method_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_COORDINATOR_METRICS_H_
