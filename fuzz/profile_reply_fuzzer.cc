// A worker's answer to WorkerControl.Profile as the coordinator takes it
// (coordinator/jobs/job_manager_profiling.cc FinishProfiling): a worker is a peer,
// and its profile is checked (CheckWorkerProfile against the model's
// sizes), then cached (ProfileCache), saved to the state store and planned
// with (FromProto, the solvers, the simulator) for every later job of the
// model on that kind of device. Each input starts a fresh job manager
// (in-memory store, fake clock) with two registered workers and a
// ProfileFetcher that answers with the input instead of dialling the
// worker (MakeWorkerProfileFetcher's gRPC call is the only part left out);
// a job is submitted, profiled on that answer and planned.
//
// Input: byte 0, then a serialized pipetrain.v1.ModelProfile (the reply).
//   bit 0  the job is tensor-parallel (one stage, tensor 2, partitions
//          chosen per layer) instead of two stages, so the request asks
//          for timings of partitions {2, 4} (AccTFM's Alg. 1)
// The model is 1 layer, 2 heads, d_model 16, vocab 256, max_seq_len 8;
// seq_len 8, micro-batches of 4 (the seeds' request). Inputs that do not
// parse are skipped: the gRPC client would fail the call.
//
// Checks beyond the sanitizers:
//  - the fetcher is asked once;
//  - a profile the coordinator cached (and saved) is the reply as sent, and
//    holds only finite numbers within profile_cache.h's bounds: one unit
//    per unit of the model, named and sized as the model's shape says
//    (stash and transient at most twice), times in [0, 1e6] s, sizes in [0, 1e15] bytes,
//    the request's micro-batch size and partitions, at most 16 codecs of
//    distinct 1..64-byte names at [0, 1e-3] s/byte, device_kind at most
//    256 bytes, repetitions >= 0; a profile not cached is not saved either;
//  - the job is planned (RUNNING, its plan readable) either way: with the
//    reply, or with the analytic profile after refusing it.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "common/clock.h"
#include "common/device_kind.h"
#include "common/logging.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/background_queue_testing.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/profile_cache.h"
#include "coordinator/jobs/small_spec_testing.h"
#include "coordinator/planner/solve_plan.h"
#include "coordinator/registry/worker_registry.h"
#include "coordinator/store/coordinator_state.h"
#include "coordinator/store/memory_store.h"
#include "fuzz/fuzz_input.h"
#include "proto/pipetrain/v1/profile.pb.h"

namespace {

using namespace pipetrain;

v1::JobSpec Spec(bool tensor_parallel) {
  v1::JobSpec spec = SmallJobSpec(tensor_parallel ? 1 : 2);
  spec.mutable_model()->set_vocab_size(256);
  spec.mutable_model()->set_max_seq_len(8);
  spec.mutable_training()->set_batch_size(8);  // micro-batches of 4: partitions 2 and 4
  if (tensor_parallel) {
    spec.mutable_parallelism()->set_tensor(2);
    spec.mutable_parallelism()->set_tensor_partitions(0);  // AccTFM's Alg. 1: measured partitions
  }
  return spec;
}

bool Within(double value, double limit) {
  return std::isfinite(value) && value >= 0 && value <= limit;
}

// Traps unless `p`, cached as the answer to `request`, keeps the bounds the
// header of profile_cache.h documents (checked here from the model, not
// with CheckWorkerProfile's code).
void CheckAccepted(const v1::ModelProfile& p, const v1::ProfileRequest& request) {
  const GptConfig model{256, 8, 1, 2, 16};
  const ModelProfile sizes =
      AnalyticProfile(model, request.seq_len(), request.micro_batch_size(), 1e9);
  if (p.micro_batch_size() != request.micro_batch_size() || p.units_size() != NumUnits(model) ||
      p.repetitions() < 0 || p.device_kind().size() > 256 || p.codecs_size() > 16) {
    __builtin_trap();
  }
  for (int u = 0; u < p.units_size(); ++u) {
    const v1::UnitProfile& unit = p.units(u);
    const UnitProfile& want = sizes.units[u];
    if (unit.name() != UnitName(model, u) || unit.weight_bytes() != want.weight_bytes ||
        unit.activation_bytes() != want.activation_bytes ||
        !(unit.stash_bytes() <= 2 * want.stash_bytes) ||
        !(unit.transient_bytes() <= 2 * want.transient_bytes)) {
      __builtin_trap();
    }
    for (double s : {unit.fwd_seconds(), unit.bwd_seconds(), unit.optimizer_seconds()}) {
      if (!Within(s, 1e6)) __builtin_trap();
    }
    for (double b : {unit.weight_bytes(), unit.activation_bytes(), unit.stash_bytes(),
                     unit.transient_bytes(), unit.peak_memory_bytes()}) {
      if (!Within(b, 1e15)) __builtin_trap();
    }
    if (unit.partitions_size() != request.partitions_size()) __builtin_trap();
    for (int k = 0; k < unit.partitions_size(); ++k) {
      const v1::PartitionTiming& t = unit.partitions(k);
      if (t.count() != request.partitions(k) || !Within(t.fwd_seconds(), 1e6) ||
          !Within(t.bwd_seconds(), 1e6)) {
        __builtin_trap();
      }
    }
  }
  std::set<std::string> names;
  for (const v1::CodecTiming& c : p.codecs()) {
    if (c.codec().empty() || c.codec().size() > 64 || !names.insert(c.codec()).second ||
        !Within(c.all_reduce_seconds_per_byte(), 1e-3)) {
      __builtin_trap();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    SetMinLogSeverity(LogSeverity::kError);  // refused profiles are logged
    return true;
  }();
  (void)quiet;
  FuzzInput in(data, size);
  const bool tensor_parallel = in.Byte() & 1;
  const std::string_view bytes = in.Rest();
  v1::ModelProfile reply;
  if (!reply.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;

  int asked = 0;
  v1::ProfileRequest request;  // read after AwaitProfiling has joined the fetch's thread
  FakeClock clock;
  MemoryStore store;
  CoordinatorState state(&store);
  if (!state.Initialize().ok()) __builtin_trap();
  WorkerRegistry registry(WorkerRegistry::Options{.clock = &clock});
  AssignmentHub hub;
  BackgroundQueue background;  // outlives jobs
  JobManager jobs(&registry, &hub, &clock,
                  JobManagerOptions{.state = &state, .background_runner = background.Runner()});
  jobs.SetProfileFetcher([&](const std::string&, const std::string&,
                             const v1::ProfileRequest& r) -> absl::StatusOr<v1::ModelProfile> {
    ++asked;
    request = r;
    return reply;
  });
  v1::DeviceInfo device;
  for (const char* address : {"10.0.0.1:9001", "10.0.0.2:9001"}) {
    v1::RegisterWorkerRequest worker;
    worker.set_data_address(address);
    worker.mutable_device()->set_cpu_model("AMD EPYC");
    worker.mutable_device()->set_cpu_cores(2);
    device = worker.device();
    if (!registry.Register(worker).ok()) __builtin_trap();
  }
  absl::StatusOr<v1::Job> submitted = jobs.Submit(Spec(tensor_parallel));
  if (!submitted.ok()) __builtin_trap();
  jobs.AwaitProfiling();  // the reply is checked and cached, the job queued again
  background.RunAll();    // planned, with the reply or the analytic profile
  if (asked != 1) __builtin_trap();

  const std::string key = ProfileKey(request, DeviceKind(device));
  const std::optional<v1::ModelProfile> cached = jobs.profiles().Get(key);
  // The profile is stored on the manager's io queue, off its lock: read
  // the store once that is done (without, this raced the store's write).
  jobs.FlushIo();
  absl::StatusOr<std::map<std::string, v1::ModelProfile>> saved = state.LoadProfiles();
  if (!saved.ok()) __builtin_trap();
  // The reply's known fields: unknown ones are not kept (job_manager_profiling.cc).
  v1::ModelProfile known = reply;
  known.DiscardUnknownFields();
  if (cached) {
    if (cached->SerializeAsString() != known.SerializeAsString()) __builtin_trap();
    CheckAccepted(*cached, request);
    auto it = saved->find(key);
    if (it == saved->end() || it->second.SerializeAsString() != known.SerializeAsString()) {
      __builtin_trap();
    }
  } else if (jobs.profiles().size() != 0 || !saved->empty()) {
    __builtin_trap();  // something else was cached or saved
  }
  absl::StatusOr<v1::Job> job = jobs.Get(submitted->id());
  if (!job.ok() || job->state() != v1::JOB_STATE_RUNNING) __builtin_trap();
  if (!jobs.GetPlan(submitted->id()).ok()) __builtin_trap();
  jobs.FlushIo();
  return 0;
}
