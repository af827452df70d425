// Prometheus metrics of a worker (DESIGN.md §8), fed once per iteration by
// the JobRunner's observer. Labels are bounded: phase (8 values), peer (a
// stage index), kind (4 tensor kinds), encoding (raw | wire), op
// (encode | decode).
//   pipetrain_stage_compute_seconds_total{phase}   busy time by phase
//   pipetrain_worker_idle_seconds_total            this worker's stage waiting
//                                                  in receives and collectives
//                                                  (the coordinator's
//                                                  per-stage sum of what workers
//                                                  report is pipetrain_stage_idle_
//                                                  seconds_total{stage})
//   pipetrain_stage_iterations_total
//   pipetrain_link_bytes_total{peer,kind,encoding} bytes sent: raw = fp32
//                                                  size, wire = after the
//                                                  codec (equal when raw)
//   pipetrain_link_device_bytes_total{peer,kind}  of those bytes, device to device (NCCL)
//   pipetrain_link_compressed_tensors_total{peer,kind}  sends with a codec
//   pipetrain_link_codec_seconds_total{peer,kind,op}    encode (peer = the
//                                                  destination) and decode
//                                                  (peer = the source) time
//   pipetrain_link_compression_error{peer,kind}    sampled relative error
//                                                  of compressed sends
//   pipetrain_stage_loss                           last micro-batch mean loss
//                                                  (stage owning the head)
//   pipetrain_collectives_total{purpose}           collectives this stage
//                                                  took part in (purpose: 5
//                                                  values, IterationResult)
//   pipetrain_collective_bytes_total{purpose,encoding}  bytes they reduced:
//                                                  raw = fp32, wire = sent
//   pipetrain_collective_seconds_total{purpose}    time spent in them
//   pipetrain_tensor_parallel_waited_seconds_total time waited for the
//                                                  tensor_parallel ones
//   pipetrain_tensor_parallel_compression_error    gauge: relative error of
//                                                  the last iteration's
//                                                  compressed tensor-parallel
//                                                  contributions (AccTFM §4.3)
//   pipetrain_tensor_parallel_compressed_bytes_total{encoding}  of those,
//                                                  the compressed ones: raw =
//                                                  fp32 size, wire = sent
//   pipetrain_tensor_parallel_partitions{unit,pass}  gauge: AccTFM partition
//                                                  count the unit ran last
//                                                  iteration, with measured
//                                                  tuning (tensor_partitions 0)
//   pipetrain_rpc_requests_total{method,code}      gRPC calls served (data plane,
//   pipetrain_rpc_duration_seconds{method,code}    WorkerControl), through rpc()
//   pipetrain_http_requests_total{method,route,code}, pipetrain_http_request_
//                                                  duration_seconds: /metrics,
//                                                  /healthz, through http()
//   pipetrain_worker_coordinator_call_failures_total{call,code}  this worker's
//                                                  calls to the coordinator that
//                                                  failed: call heartbeat,
//                                                  register, assignment_stream or
//                                                  report; code the gRPC code's
//                                                  name (UNAVAILABLE, ...). Its log
//                                                  says a failure once a minute
//   pipetrain_build_info{version,commit}          gauge    1 (common/metrics/build_info_metric.h)
//   process_cpu_seconds_total, ...                 common/metrics/process_collector.h
// The series of every phase and purpose exist from the start, at zero;
// link series appear with their peers. The gauges keyed by a plan's peers
// or units (link_compression_error, tensor_parallel_partitions) are
// dropped when an iteration of another run (job or plan version) comes:
// a finished job's stay until the worker's next run starts (`pipetrain
// up` reads them after the job), and never mix with another run's.
// Thread-safe (prometheus-cpp metrics are).
#ifndef PIPETRAIN_WORKER_AGENT_WORKER_METRICS_H_
#define PIPETRAIN_WORKER_AGENT_WORKER_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/collectable_list.h"
#include "common/metrics/grpc_red_metrics.h"
#include "common/metrics/http_red_metrics.h"
#include "common/metrics/process_collector.h"
#include "common/metrics/tls_expiry_metric.h"
#include "grpcpp/support/status.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "worker/runtime/stage_runtime.h"

namespace pipetrain {

class WorkerMetrics {
 public:
  // The full names of the gRPC methods a worker serves (pipetrain.v1
  // DataPlane and WorkerControl, health and reflection): the known methods
  // of rpc().
  static std::vector<std::string> GrpcMethods();

  WorkerMetrics();
  void Observe(const IterationResult& result);
  // What /metrics serves: the registry and the process metrics.
  const prometheus::Collectable* registry() const { return &exposition_; }
  // pipetrain_tls_certificate_expiry_timestamp_seconds (tls_expiry_metric.h).
  // Call once.
  void AddTlsCertificates(const std::vector<TlsCertificateExpiry>& certificates) {
    AddTlsCertificateExpiry(*registry_, certificates);
  }
  // RED of the data-plane gRPC server (its interceptors go on its builder)
  // and of the metrics HTTP server.
  GrpcRedMetrics& rpc() { return rpc_; }
  HttpRedMetrics& http() { return http_; }

  // The worker's calls to the coordinator, as the `call` label names them.
  enum class CoordinatorCall { kHeartbeat, kRegister, kAssignmentStream, kReport };
  // One of them failed with `code`, not OK (its name, GrpcRedMetrics::
  // CodeName, is the `code` label: one of the 17 codes). The coordinator
  // sees a partitioned worker only as LOST; this counts from its side.
  void CoordinatorCallFailed(CoordinatorCall call, grpc::StatusCode code);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  GrpcRedMetrics rpc_;
  HttpRedMetrics http_;
  ProcessCollector process_;
  CollectableList exposition_;
  prometheus::Family<prometheus::Counter>& compute_;
  prometheus::Counter& idle_;
  prometheus::Counter& iterations_;
  prometheus::Family<prometheus::Counter>& link_bytes_;
  prometheus::Family<prometheus::Counter>& link_codec_seconds_;
  prometheus::Family<prometheus::Counter>& link_device_bytes_;
  prometheus::Family<prometheus::Counter>& link_compressed_;
  prometheus::Family<prometheus::Gauge>& link_error_;
  prometheus::Gauge& loss_;
  prometheus::Family<prometheus::Counter>& collectives_;
  prometheus::Family<prometheus::Counter>& collective_bytes_;
  prometheus::Family<prometheus::Counter>& collective_seconds_;
  prometheus::Counter& tensor_parallel_waited_;
  prometheus::Gauge& tensor_parallel_error_;
  prometheus::Family<prometheus::Counter>& tensor_parallel_compressed_bytes_;
  prometheus::Family<prometheus::Gauge>& tensor_parallel_partitions_;
  prometheus::Family<prometheus::Counter>& coordinator_call_failures_;

  // Drops the run-keyed gauges (above) when `run` is not the last one seen.
  void StartRunLocked(const std::string& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  prometheus::Gauge& RunGauge(prometheus::Family<prometheus::Gauge>& family,
                              const std::map<std::string, std::string>& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::string run_ ABSL_GUARDED_BY(mu_);
  // The run-keyed gauges added since run_ began, with their families.
  std::vector<std::pair<prometheus::Family<prometheus::Gauge>*, prometheus::Gauge*>> run_gauges_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_WORKER_METRICS_H_
