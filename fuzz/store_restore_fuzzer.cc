// A coordinator starting over a state store whose records it did not write
// as they are (coordinator/store/coordinator_state.h): a store of an older
// version, a damaged one, or an etcd a stranger could write. Each input
// fills a fresh in-memory store with up to 8 records, restores the worker
// registry and the job manager from it (JobManager::Restore trusts stored
// plans, checkpoints, layouts and profiles only after its own checks), then
// registers two workers and lets time pass, so that restored jobs are
// planned again, resumed or failed, on a fake clock. The job manager has a
// scratch --output-dir (emptied before each input): without one, Restore
// fails every unfinished job that writes checkpoints or weights, and no
// input reached a recovery.
//
// Input: records until it ends, each a byte choosing the table ((byte & 3)
// % 3: jobs/, workers/, profiles/) and, with bit 2, that the value is a
// record with the record's bytes merged into it as protobuf fields (so
// that restores get past parsing): in jobs/ a job of SmallJobSpec(2),
// RUNNING; in workers/ a worker "w-<record number + 1>" with a data address
// of its own; then the record's uint16-length-prefixed bytes.
//
// A record of the jobs/ or workers/ table that parses with an id is stored
// under jobs/<that id> or workers/<that id>, as the coordinator keys them
// (a worker's must also be "w-<n>" for the registry to restore it).
// Profiles stay under made-up keys: the planner never finds them (a gap).
//
// Checks beyond the sanitizers: a successful Restore brought back every job
// stored under its own id; whatever Restore accepts can be listed and
// read back (Get) at every step, and a plan it serves (GetPlan) has
// degrees that hold (StoredPlanMismatch).
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/background_queue_testing.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/small_spec_testing.h"
#include "coordinator/jobs/stored_job_check.h"
#include "coordinator/registry/worker_registry.h"
#include "coordinator/store/coordinator_state.h"
#include "coordinator/store/memory_store.h"
#include "coordinator/store/state.pb.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/scratch_dir.h"

namespace {

constexpr int kMaxRecords = 8;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  static const bool quiet = [] {
    SetMinLogSeverity(LogSeverity::kError);  // restores and recoveries are logged
    return true;
  }();
  (void)quiet;
  FuzzInput in(data, size);
  MemoryStore store;
  CoordinatorState state(&store);
  if (!state.Initialize().ok()) __builtin_trap();
  std::vector<StoreWrite> writes;
  std::set<std::string> restorable_ids;
  for (int i = 0; i < kMaxRecords && !in.empty(); ++i) {
    const uint8_t kind = in.Byte();
    const std::string_view bytes = in.LengthPrefixed();
    std::string value(bytes);
    static const char* const kTables[] = {"jobs/", "workers/", "profiles/"};
    const std::string table = kTables[(kind & 3) % 3];
    if ((kind & 4) && table == "workers/") {
      // A worker record that parses, as the registry numbers them, merged
      // with the input's fields (protobuf's merge: later fields win).
      store::StoredWorker worker;
      worker.set_id(absl::StrCat("w-", i + 1));
      worker.set_data_address(absl::StrCat("10.0.1.", i + 1, ":9001"));
      worker.set_incarnation(1);
      worker.MergeFromString(value);  // a failed merge keeps what parsed
      value = worker.SerializeAsString();
    } else if (kind & 4) {
      // A record that parses: a minimal job of SmallJobSpec merged with the
      // input's fields.
      store::StoredJob job;
      *job.mutable_job()->mutable_spec() = SmallJobSpec(2);
      job.mutable_job()->set_id(absl::StrCat("job-fuzz-", i));
      job.mutable_job()->set_state(v1::JOB_STATE_RUNNING);
      job.MergeFromString(value);
      value = job.SerializeAsString();
    }
    std::string key = absl::StrCat(table, "k", i);
    // A job is restored only from its own key (jobs/<its id>, as the
    // coordinator saves it); elsewhere LoadJobs skips it, and nothing past
    // parsing would be reached.
    store::StoredJob parsed;
    if (table == "jobs/" && parsed.ParseFromString(value) && !parsed.job().id().empty()) {
      key = table + parsed.job().id();
      restorable_ids.insert(parsed.job().id());
    }
    store::StoredWorker worker;
    if (table == "workers/" && worker.ParseFromString(value) && !worker.id().empty()) {
      key = table + worker.id();  // LoadWorkers skips a worker under another key
    }
    writes.push_back(StoreWrite::Put(key, value));
  }
  if (!store.Commit(writes).ok()) return 0;

  FakeClock clock;
  WorkerRegistry registry(WorkerRegistry::Options{.clock = &clock});
  absl::StatusOr<std::vector<v1::Worker>> known = state.LoadWorkers();
  if (known.ok()) registry.Restore(*known);
  AssignmentHub hub;
  BackgroundQueue background;  // outlives jobs
  const std::string& output_dir = ScratchDir("restore-fuzz");
  EmptyDir(output_dir);
  JobManager jobs(
      &registry, &hub, &clock,
      JobManagerOptions{
          .output_dir = output_dir, .state = &state, .background_runner = background.Runner()});
  if (!jobs.Restore().ok()) return 0;
  // Every job stored under its own id is restored (failed if it does not
  // fit): the harness would otherwise fuzz nothing past LoadJobs unnoticed.
  for (const std::string& id : restorable_ids) {
    if (!jobs.Get(id).ok()) __builtin_trap();
  }
  for (const char* address : {"10.0.0.1:9001", "10.0.0.2:9001"}) {
    v1::RegisterWorkerRequest request;
    request.set_data_address(address);
    (void)registry.Register(request);  // the registry may be full of restored ones
  }
  for (int round = 0; round < 3; ++round) {
    clock.Advance(absl::Seconds(20));
    jobs.ScheduleQueued();
    background.RunAll();
    for (const v1::Job& job : jobs.List()) {
      if (!jobs.Get(job.id()).ok()) __builtin_trap();
      // A plan it serves has degrees a reader may multiply and divide by
      // (/metrics does), whatever the store held.
      absl::StatusOr<v1::Plan> plan = jobs.GetPlan(job.id());
      if (plan.ok() && !StoredPlanMismatch(*plan, std::nullopt).empty()) __builtin_trap();
    }
  }
  jobs.FlushIo();
  return 0;
}
