#include "worker/agent/worker_metrics.h"

#include <cmath>
#include <string>

#include "common/metrics/build_info_metric.h"
#include "google/protobuf/descriptor.h"
#include "proto/pipetrain/v1/dataplane.grpc.pb.h"
#include "proto/pipetrain/v1/profile.grpc.pb.h"

namespace pipetrain {
namespace {

// IterationResult::phase_seconds' and ::collectives' keys.
constexpr const char* kPhases[] = {"forward", "backward",  "recompute",  "send",
                                   "decode",  "optimizer", "all_reduce", "tied"};
constexpr const char* kPurposes[] = {"data_parallel", "embedding_sync", "grad_clip", "loss_gather",
                                     "tensor_parallel"};

}  // namespace

std::vector<std::string> WorkerMetrics::GrpcMethods() {
  std::vector<const google::protobuf::ServiceDescriptor*> services;
  for (const char* name :
       {v1::DataPlaneService::service_full_name(), v1::WorkerControlService::service_full_name()}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    if (service != nullptr) services.push_back(service);
  }
  std::vector<std::string> methods = GrpcRedMetrics::HealthAndReflectionMethods();
  for (std::string& method : GrpcRedMetrics::MethodsOf(services)) methods.push_back(method);
  return methods;
}

WorkerMetrics::WorkerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      rpc_(*registry_, GrpcMethods()),
      http_(*registry_),
      exposition_({registry_.get(), &process_}),
      compute_(prometheus::BuildCounter()
                   .Name("pipetrain_stage_compute_seconds_total")
                   .Help("Time of this worker's stage by phase, seconds: busy phases, and "
                         "all_reduce (the data-parallel all-reduce at the step), which is "
                         "idle time too and also counted in pipetrain_worker_idle_seconds_total")
                   .Register(*registry_)),
      idle_(prometheus::BuildCounter()
                .Name("pipetrain_worker_idle_seconds_total")
                .Help("Time this worker's stage waited for tensors (the pipeline bubble), "
                      "for other stages or replicas in collectives and for its queued sends "
                      "to leave, seconds")
                .Register(*registry_)
                .Add({})),
      iterations_(prometheus::BuildCounter()
                      .Name("pipetrain_stage_iterations_total")
                      .Help("Iterations this worker's stage completed")
                      .Register(*registry_)
                      .Add({})),
      link_bytes_(prometheus::BuildCounter()
                      .Name("pipetrain_link_bytes_total")
                      .Help("Bytes sent to peer stages, by tensor kind; encoding raw: fp32 "
                            "before compression, wire: handed to the transport")
                      .Register(*registry_)),
      link_codec_seconds_(prometheus::BuildCounter()
                              .Name("pipetrain_link_codec_seconds_total")
                              .Help("Time spent encoding sends (op encode, peer = destination) "
                                    "and decoding receives (op decode, peer = source)")
                              .Register(*registry_)),
      link_device_bytes_(prometheus::BuildCounter()
                             .Name("pipetrain_link_device_bytes_total")
                             .Help("Bytes sent to peer stages device to device (NCCL, a device "
                                   "group) rather than over the data plane; part of "
                                   "pipetrain_link_bytes_total")
                             .Register(*registry_)),
      link_compressed_(prometheus::BuildCounter()
                           .Name("pipetrain_link_compressed_tensors_total")
                           .Help("Tensors sent to peer stages encoded with a codec")
                           .Register(*registry_)),
      link_error_(prometheus::BuildGauge()
                      .Name("pipetrain_link_compression_error")
                      .Help("Relative error ||x - decoded|| / ||x|| of compressed sends (with "
                            "error feedback ||y - decoded|| / ||y||, y = x + the carried "
                            "residual), mean of the last iteration's samples")
                      .Register(*registry_)),
      loss_(prometheus::BuildGauge()
                .Name("pipetrain_stage_loss")
                .Help("Mean loss of the last iteration (on the stage computing it)")
                .Register(*registry_)
                .Add({})),
      collectives_(prometheus::BuildCounter()
                       .Name("pipetrain_collectives_total")
                       .Help("Collectives this stage took part in, by purpose: data_parallel "
                             "(gradient all-reduce over the replicas), embedding_sync (the "
                             "tied embedding's exchange, or its fused all-reduce), grad_clip, "
                             "loss_gather, tensor_parallel (the units' all-reduces over the "
                             "stage's tensor ranks)")
                       .Register(*registry_)),
      collective_bytes_(prometheus::BuildCounter()
                            .Name("pipetrain_collective_bytes_total")
                            .Help("Bytes of the tensors this stage's collectives reduced or "
                                  "exchanged, by purpose; encoding raw: fp32, wire: what their "
                                  "messages carried (less with PowerSGD)")
                            .Register(*registry_)),
      collective_seconds_(prometheus::BuildCounter()
                              .Name("pipetrain_collective_seconds_total")
                              .Help("Time this stage spent in collectives, by purpose (the "
                                    "embedding exchange's time is in send and idle instead)")
                              .Register(*registry_)),
      tensor_parallel_waited_(
          prometheus::BuildCounter()
              .Name("pipetrain_tensor_parallel_waited_seconds_total")
              .Help("Time the stage waited for its tensor-parallel all-reduces (from asking "
                    "for each result until it was there, a queued one's wait for the "
                    "background thread included); against "
                    "pipetrain_collective_seconds_total{purpose=\"tensor_parallel\"}, what "
                    "AccTFM's partitions did not hide")
              .Register(*registry_)
              .Add({})),
      tensor_parallel_error_(
          prometheus::BuildGauge()
              .Name("pipetrain_tensor_parallel_compression_error")
              .Help("Relative L2 error AccTFM's hybrid compression made in this rank's "
                    "contributions to its tensor-parallel all-reduces in the last iteration "
                    "(dropped tokens and the codec's error over the values sent; 0 when exact)")
              .Register(*registry_)
              .Add({})),
      tensor_parallel_compressed_bytes_(
          prometheus::BuildCounter()
              .Name("pipetrain_tensor_parallel_compressed_bytes_total")
              .Help("Of the tensor-parallel all-reduces, those AccTFM's hybrid compression "
                    "applies to (the attention and MLP units'): encoding raw: their fp32 size, "
                    "wire: the bytes this rank sent for them (payloads and the token scores' "
                    "all-reduce)")
              .Register(*registry_)),
      tensor_parallel_partitions_(
          prometheus::BuildGauge()
              .Name("pipetrain_tensor_parallel_partitions")
              .Help("With spec.parallelism.tensor_partitions 0 and measured tuning: the "
                    "AccTFM partition count each attention and MLP unit whose forward and "
                    "backward both run on this stage (the units tuned) ran in the last "
                    "iteration, by unit and pass (forward, backward); after the tuning steps, "
                    "the counts kept")
              .Register(*registry_)),
      coordinator_call_failures_(
          prometheus::BuildCounter()
              .Name("pipetrain_worker_coordinator_call_failures_total")
              .Help("Calls this worker made to the coordinator that failed, by call (heartbeat, "
                    "register, assignment_stream: the stream ended, report: a progress report) "
                    "and gRPC code (UNAVAILABLE: not reachable); rising while the coordinator "
                    "shows the worker LOST means a partition between them")
              .Register(*registry_)) {
  AddBuildInfo(*registry_);
  tensor_parallel_compressed_bytes_.Add({{"encoding", "raw"}});
  tensor_parallel_compressed_bytes_.Add({{"encoding", "wire"}});
  for (const char* phase : kPhases) compute_.Add({{"phase", phase}});
  for (const char* purpose : kPurposes) {
    collectives_.Add({{"purpose", purpose}});
    collective_bytes_.Add({{"purpose", purpose}, {"encoding", "raw"}});
    collective_bytes_.Add({{"purpose", purpose}, {"encoding", "wire"}});
    collective_seconds_.Add({{"purpose", purpose}});
  }
}

void WorkerMetrics::CoordinatorCallFailed(CoordinatorCall call, grpc::StatusCode code) {
  const char* name = "report";
  switch (call) {
    case CoordinatorCall::kHeartbeat:
      name = "heartbeat";
      break;
    case CoordinatorCall::kRegister:
      name = "register";
      break;
    case CoordinatorCall::kAssignmentStream:
      name = "assignment_stream";
      break;
    case CoordinatorCall::kReport:
      break;
  }
  coordinator_call_failures_.Add({{"call", name}, {"code", GrpcRedMetrics::CodeName(code)}})
      .Increment();
}

void WorkerMetrics::StartRunLocked(const std::string& run) {
  if (run == run_) return;
  for (const auto& [family, gauge] : run_gauges_) family->Remove(gauge);
  run_gauges_.clear();
  run_ = run;
}

prometheus::Gauge& WorkerMetrics::RunGauge(prometheus::Family<prometheus::Gauge>& family,
                                           const std::map<std::string, std::string>& labels) {
  const bool existed = family.Has(labels);
  prometheus::Gauge& gauge = family.Add(labels);
  if (!existed) run_gauges_.emplace_back(&family, &gauge);
  return gauge;
}

void WorkerMetrics::Observe(const IterationResult& r) {
  absl::MutexLock lock(&mu_);
  StartRunLocked(r.run);
  for (const auto& [phase, seconds] : r.phase_seconds) {
    compute_.Add({{"phase", phase}}).Increment(seconds);
  }
  idle_.Increment(r.idle_seconds);
  iterations_.Increment();
  for (const auto& [unit, counts] : r.tensor_partitions) {
    RunGauge(tensor_parallel_partitions_, {{"unit", unit}, {"pass", "forward"}}).Set(counts.first);
    RunGauge(tensor_parallel_partitions_, {{"unit", unit}, {"pass", "backward"}})
        .Set(counts.second);
  }
  for (const auto& [purpose, stats] : r.collectives) {
    collectives_.Add({{"purpose", purpose}}).Increment(static_cast<double>(stats.count));
    collective_bytes_.Add({{"purpose", purpose}, {"encoding", "raw"}})
        .Increment(static_cast<double>(stats.bytes));
    collective_bytes_.Add({{"purpose", purpose}, {"encoding", "wire"}})
        .Increment(static_cast<double>(stats.wire_bytes));
    collective_seconds_.Add({{"purpose", purpose}}).Increment(stats.seconds);
    if (purpose == "tensor_parallel") {
      tensor_parallel_waited_.Increment(stats.waited_seconds);
      tensor_parallel_error_.Set(
          stats.compressed_norm_squared > 0
              ? std::sqrt(stats.compression_error_squared / stats.compressed_norm_squared)
              : 0.0);
      tensor_parallel_compressed_bytes_.Add({{"encoding", "raw"}})
          .Increment(static_cast<double>(stats.compressed_bytes));
      tensor_parallel_compressed_bytes_.Add({{"encoding", "wire"}})
          .Increment(static_cast<double>(stats.compressed_wire_bytes));
    }
  }
  for (const auto& [key, link] : r.sent) {
    const std::string peer = std::to_string(key.first);
    link_bytes_.Add({{"peer", peer}, {"kind", key.second}, {"encoding", "raw"}})
        .Increment(static_cast<double>(link.raw_bytes));
    link_bytes_.Add({{"peer", peer}, {"kind", key.second}, {"encoding", "wire"}})
        .Increment(static_cast<double>(link.wire_bytes));
    if (link.device_bytes > 0) {
      link_device_bytes_.Add({{"peer", peer}, {"kind", key.second}})
          .Increment(static_cast<double>(link.device_bytes));
    }
    if (link.compressed_tensors == 0) continue;
    link_compressed_.Add({{"peer", peer}, {"kind", key.second}})
        .Increment(static_cast<double>(link.compressed_tensors));
    link_codec_seconds_.Add({{"peer", peer}, {"kind", key.second}, {"op", "encode"}})
        .Increment(link.codec_seconds);
    if (link.error_samples > 0) {
      RunGauge(link_error_, {{"peer", peer}, {"kind", key.second}})
          .Set(link.error_sum / static_cast<double>(link.error_samples));
    }
  }
  for (const auto& [key, link] : r.received) {
    if (link.compressed_tensors == 0) continue;
    link_codec_seconds_
        .Add({{"peer", std::to_string(key.first)}, {"kind", key.second}, {"op", "decode"}})
        .Increment(link.codec_seconds);
  }
  // Gauges of the last iteration: an iteration without a loss (a stage
  // that does not compute it, in this job) or without tensor-parallel
  // all-reduces sets them to 0 rather than leave an earlier job's value.
  if (r.collectives.count("tensor_parallel") == 0) tensor_parallel_error_.Set(0);
  double loss = 0;
  if (!r.micro_batch_losses.empty()) {
    double sum = 0;
    for (float l : r.micro_batch_losses) sum += l;
    loss = sum / r.micro_batch_losses.size();
  }
  loss_.Set(loss);
}

}  // namespace pipetrain
