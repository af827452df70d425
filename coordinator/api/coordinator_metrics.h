// The coordinator's Prometheus metrics (DESIGN.md §8), in one registry that
// the HTTP server exposes at /metrics.
//
//   pipetrain_workers{state}                      gauge    workers per WorkerState
//   pipetrain_worker_info{metrics_address}        gauge    1 per live worker (not LOST or
//                                                          LEFT): where its /metrics is
//                                                          (the dashboard's $worker by
//                                                          $coordinator)
//   pipetrain_jobs{state}                         gauge    jobs per JobState
//   pipetrain_job_longest_without_step_seconds    gauge    over RUNNING jobs, the longest time
//                                                          since a job's last step or its
//                                                          current plan's start; 0 when none
//                                                          runs (PipetrainJobStalled)
//   pipetrain_job_loss                            gauge    last step's mean loss (*)
//   pipetrain_job_val_loss                        gauge    latest validation loss (*)
//   pipetrain_job_tokens_total                    counter  tokens trained, all jobs: each
//                                                          step's batch_size * seq_len, once
//                                                          (redone steps are not counted again)
//   pipetrain_plan_predicted_iteration_seconds    gauge    the plan's simulated iteration time (*)
//   pipetrain_plan_version                        gauge    the plan's version (*)
//   pipetrain_plan_predicted_stage_busy_seconds{stage}  gauge  the simulated step of each
//   pipetrain_plan_predicted_stage_idle_seconds{stage}  gauge  pipeline stage: its workers'
//                                                          largest compute and idle time
//                                                          (Plan.stages; stages 0-62 (*))
//   pipetrain_job_steps_total                     counter  optimizer steps completed, all jobs
//   pipetrain_stage_busy_seconds_total{stage}     counter  busy time (all but idle) the workers
//                                                          of a pipeline stage reported,
//                                                          averaged over its replicas and
//                                                          tensor ranks
//   pipetrain_stage_idle_seconds_total{stage}     counter  idle time they reported: waits in
//                                                          receives and collectives (a
//                                                          worker's own, unlabelled, is
//                                                          pipetrain_worker_idle_seconds_total)
//   pipetrain_job_recoveries_total{reason}        counter  jobs that went RECOVERING: worker_lost,
//                                                          peer_failure, checkpoint_unusable,
//                                                          checkpoint_failed, coordinator_restart,
//                                                          replan_refused (recovery_kind.h)
//   pipetrain_job_recovery_seconds                histogram  loss detected to the first step
//                                                          completed on the new plan
//   pipetrain_job_steps_redone_total              counter  steps run again after recoveries
//   pipetrain_checkpoints_total{result}           counter  checkpoints complete / stage writes
//                                                          failed
//   pipetrain_checkpoint_write_seconds            histogram  a stage writing its unit files
//                                                          (buckets to 1 h)
//   pipetrain_checkpoint_bytes_total              counter  bytes of complete checkpoints
//   pipetrain_plan_seconds{phase}                 histogram  a placement's planning: queued
//                                                          (waiting for the job manager's
//                                                          background thread), computing
//                                                          (buckets to 10 min)
//   pipetrain_rpc_requests_total{method,code}     counter    gRPC calls (common/metrics/
//   pipetrain_rpc_duration_seconds{method,code}   histogram  grpc_red_metrics.h), through rpc()
//   pipetrain_jobs_checkpoint_failing             gauge    jobs not ended whose checkpoint
//                                                          writes failed since their last
//                                                          complete checkpoint
//   pipetrain_state_save_failures_total           counter  saves of a job's state to the state
//                                                          store (--state-dir, --etcd-endpoints)
//                                                          that failed: submits' and the
//                                                          job manager's (retried every second)
//   pipetrain_jobs_state_save_failing             gauge    jobs whose latest save failed (a
//                                                          restart would restore them as last
//                                                          saved; JobManager::JobsWithFailedSave)
//   pipetrain_state_delete_failures_total         counter  deletes of a job's state from the
//                                                          store that failed: pruned jobs' and
//                                                          failed submits' (retried every second)
//   pipetrain_jobs_state_delete_failing           gauge    jobs whose latest delete failed (a
//                                                          restart would bring a pruned one
//                                                          back; JobsWithFailedDelete)
//   pipetrain_workers_drained                     gauge    drained workers not gone (also in
//                                                          pipetrain_workers, READY included)
//   pipetrain_jobs_ended_total{state}             counter  jobs that ended (SUCCEEDED, FAILED,
//                                                          CANCELLED): what PipetrainJobFailed
//                                                          counts, as pruning lowers pipetrain_jobs
//   pipetrain_rpc_refused_total{method,code}      counter  calls refused before handling
//                                                          (each gRPC method's UNAUTHENTICATED
//                                                          at 0 from the start)
//                                                          (UNAUTHENTICATED, PERMISSION_DENIED;
//                                                          REST 401s and 403s as method
//                                                          "GET /v1/jobs")
//   pipetrain_rpc_stale_sessions_total{method}    counter  worker calls refused for a session
//                                                          of their own gone stale (after a
//                                                          coordinator restart); not in
//                                                          pipetrain_rpc_refused_total
//   pipetrain_http_requests_total{method,route,code}            counter    REST and /metrics
//   pipetrain_http_request_duration_seconds{method,route,code}  histogram  (http_red_metrics.h)
//   pipetrain_build_info{version,commit}          gauge    1 (common/metrics/build_info_metric.h)
//   pipetrain_coordinator_serving_since_timestamp_seconds  gauge  when this coordinator began
//                                                          serving (Unix seconds): these
//                                                          metrics are made then, after
//                                                          winning the election with
//                                                          etcd, and followers have none
//   process_cpu_seconds_total, process_resident_memory_bytes, ...  (process_collector.h)
//
// (*) of the "current" job: the most recently submitted RUNNING job, or, when
// none runs, the most recently submitted job that completed a step (so the
// final values of a finished job stay visible); 0 (and no stage series)
// before any step and once no listed job qualifies (the last one pruned),
// the plan's gauges also while its plan cannot be read.
//
// Labels are bounded: state and method come from the protos (state without
// its enum's prefix: "LOST", "RUNNING"), stage is the
// pipeline position "0", "1", ... capped at kMaxStageLabel ("63+" for stages
// beyond; plans have at most 2 * n_layer + 2 stages). No job ids, steps or
// micro-batches, which would grow without bound. metrics_address grows with
// the fleet only: a worker that leaves loses its series.
//
// Every series a label set is known for exists from the start, at zero: all
// states, recovery reasons, checkpoint results, and the OK series of every
// gRPC method of pipetrain.v1.CoordinatorService, health checking and reflection.
//
// Thread-safe: prometheus-cpp metrics are atomic, Refresh reads the registry
// and job manager through their thread-safe methods and keeps its own
// bookkeeping under a mutex.
#ifndef PIPETRAIN_COORDINATOR_API_COORDINATOR_METRICS_H_
#define PIPETRAIN_COORDINATOR_API_COORDINATOR_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "common/annotated_mutex.h"
#include "common/metrics/collectable_list.h"
#include "common/metrics/grpc_red_metrics.h"
#include "common/metrics/http_red_metrics.h"
#include "common/metrics/process_collector.h"
#include "common/metrics/tls_expiry_metric.h"
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
  // Made when the coordinator begins serving (after the election), before
  // JobManager::Restore: now is pipetrain_coordinator_serving_since_
  // timestamp_seconds.
  CoordinatorMetrics(const WorkerRegistry* workers, const JobManager* jobs);
  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;

  // What /metrics serves: the registry and the process metrics.
  const prometheus::Collectable* registry() const { return &exposition_; }
  // pipetrain_tls_certificate_expiry_timestamp_seconds (tls_expiry_metric.h).
  // Call once.
  void AddTlsCertificates(const std::vector<TlsCertificateExpiry>& certificates) {
    AddTlsCertificateExpiry(*registry_, certificates);
  }

  // RED of the gRPC server: its interceptors go on the coordinator's
  // ServerBuilder (GrpcRedMetrics::Interceptors).
  GrpcRedMetrics& rpc() { return rpc_; }
  // RED of the HTTP server: declare its routes, feed it every response.
  HttpRedMetrics& http() { return http_; }
  // The HTTP server's on_response: http()'s observer, and a 401
  // (UNAUTHENTICATED) or 403 (PERMISSION_DENIED) counted in
  // pipetrain_rpc_refused_total with method "<METHOD> <route>" (e.g.
  // "GET /v1/jobs"), as gRPC refusals are with theirs.
  std::function<void(const std::string&, const std::string&, int, double)> HttpObserver();

  // Re-reads the gauges (workers, jobs, current job's loss and plan) and
  // the tokens trained from their sources. Called before each scrape.
  void Refresh();
  // The jobs whose counted steps the token counter remembers (those listed
  // at the last Refresh). For tests.
  size_t JobsCountedForTesting() {
    AnnotatedMutexLock lock(&refresh_mu_);
    return steps_counted_.size();
  }

  // A call of `method` was refused with `code` by authentication (only
  // UNAUTHENTICATED and PERMISSION_DENIED are counted: the label stays
  // bounded). rpc()'s interceptor times refused calls too, with their code.
  void CountRefused(absl::string_view method, absl::StatusCode code);
  // A worker's call of `method` was refused for its own session gone
  // stale (CallerAuth::IsStaleWorkerSession): every worker's next calls
  // after a coordinator restart, which must not read as strangers.
  void CountStaleSession(absl::string_view method);
  // A stage reported an iteration's busy and idle time (from
  // ReportProgress). Negative or non-finite values are ignored: they come
  // from workers, and counters only go up.
  void AddStageTime(int stage, double busy_seconds, double idle_seconds);
  // The pipeline stage of the worker at `index` of a plan's `workers`
  // (Job.worker_ids, Plan.stages): replica-major, then stage, tensor rank
  // innermost (plan.proto), with `replicas` and `tensor` of at least 1.
  // Workers that do not divide into them count as one replica of one rank.
  static int PipelineStageOf(int index, int workers, int replicas, int tensor);
  // One optimizer step completed (a ReportProgress carrying losses).
  void CountStep();
  // The job manager's events (JobManager::SetEvents), feeding the recovery
  // and checkpoint metrics above; a restored job's steps are taken as
  // counted in pipetrain_job_tokens_total (an earlier process trained them).
  JobEvents Events();

 private:
  void RefreshWorkers();
  void RefreshCurrentJob(const std::vector<JobManager::JobSummary>& jobs);
  void CountTokens(const std::vector<JobManager::JobSummary>& jobs);
  static std::string StageLabel(int stage);

  const WorkerRegistry* const workers_;
  const JobManager* const jobs_;
  std::unique_ptr<prometheus::Registry> registry_;
  GrpcRedMetrics rpc_;
  HttpRedMetrics http_;
  ProcessCollector process_;
  CollectableList exposition_;

  prometheus::Family<prometheus::Gauge>* workers_by_state_;
  prometheus::Gauge* workers_drained_;
  prometheus::Gauge* jobs_checkpoint_failing_;
  prometheus::Gauge* jobs_state_save_failing_;
  prometheus::Counter* state_save_failures_;
  prometheus::Gauge* jobs_state_delete_failing_;
  prometheus::Gauge* jobs_io_queue_age_seconds_;
  prometheus::Counter* state_delete_failures_;
  prometheus::Family<prometheus::Gauge>* worker_info_;
  prometheus::Family<prometheus::Gauge>* jobs_by_state_;
  prometheus::Gauge* job_longest_without_step_;
  prometheus::Gauge* job_loss_;
  prometheus::Gauge* job_val_loss_;
  prometheus::Counter* job_tokens_;
  prometheus::Gauge* plan_predicted_seconds_;
  prometheus::Gauge* plan_version_;
  prometheus::Family<prometheus::Gauge>* plan_stage_busy_;
  prometheus::Family<prometheus::Gauge>* plan_stage_idle_;
  prometheus::Counter* job_steps_;
  prometheus::Family<prometheus::Counter>* stage_busy_;
  prometheus::Family<prometheus::Counter>* stage_idle_;
  prometheus::Family<prometheus::Counter>* rpc_refused_;
  prometheus::Family<prometheus::Counter>* rpc_stale_sessions_;
  prometheus::Family<prometheus::Counter>* recoveries_;
  prometheus::Histogram* recovery_seconds_;
  prometheus::Counter* steps_redone_;
  prometheus::Family<prometheus::Counter>* checkpoints_;
  prometheus::Family<prometheus::Counter>* jobs_ended_;
  prometheus::Histogram* checkpoint_write_seconds_;
  prometheus::Family<prometheus::Histogram>* plan_seconds_;
  prometheus::Counter* checkpoint_bytes_;

  // Held through a whole Refresh, so that scrapes (several at once: an HA
  // Prometheus pair) apply their job listings in the order they took them.
  // Overlapping, an older listing still naming a job a newer one had
  // dropped (pruned) brought it back at its first step, and its whole
  // training was counted in pipetrain_job_tokens_total again. Taken before
  // the job manager's and the registry's locks; nothing holding those
  // takes it.
  AnnotatedMutex scrape_mu_;
  AnnotatedMutex refresh_mu_;
  // Per job id, the highest step whose tokens pipetrain_job_tokens_total
  // holds.
  std::map<std::string, int64_t> steps_counted_ ABSL_GUARDED_BY(refresh_mu_);
  // The metrics addresses that have a pipetrain_worker_info series.
  std::map<std::string, prometheus::Gauge*> worker_info_series_ ABSL_GUARDED_BY(refresh_mu_);
  // How many stages have pipetrain_plan_predicted_stage_* series (a plan
  // with fewer stages removes the rest).
  int predicted_stages_shown_ ABSL_GUARDED_BY(refresh_mu_) = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_COORDINATOR_METRICS_H_
