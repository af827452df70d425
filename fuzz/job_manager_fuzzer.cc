// The job manager's side of what running workers send
// (coordinator/jobs/job_manager.h): ReportProgress, the weights upload
// (AddWeightsChunk, FinishWeights), interleaved with what users and the
// coordinator do meanwhile (Drain, Cancel, a worker lost, time passing and
// rescheduling, reading the job and its plan). Each input starts a fresh
// registry of two workers and a job of two stages, planned and running at
// once (analytic profile: no fetcher, so no worker is dialled), on a fake
// clock. Planning runs when the input says (BackgroundQueue), so operations
// also land while the job is PLANNING. The job asks for its weights as
// weights.safetensors under a scratch --output-dir (emptied before each
// input, removed at exit), so uploads reach the file writer.
//
// Input: operations until it ends (at most kMaxOperations), each a byte
// choosing one (its low 3 bits) and what it needs:
//   0 ReportProgress: a serialized ReportProgressRequest (uint16-length-
//     prefixed); bit 3 of the byte addresses it from the job's worker
//     (bit 4 picks which) with the job's id, the current plan version and
//     the worker's incarnation, so that inputs reach past those checks
//   1 AddWeightsChunk: a serialized WeightsChunk (uint16-length-prefixed);
//     bit 3 addresses it as above
//   2 FinishWeights of the job's worker (bit 3 picks which)
//   3 Drain that worker
//   4 the worker lost (OnWorkerLost)
//   5 Cancel the job
//   6 Get and GetPlan of the job
//   7 time passes (a byte, in seconds), then ScheduleQueued; the plans
//     queued so far are made then, or with bit 3 left PLANNING until the
//     next operation 7 without it
//
// Checks beyond the sanitizers: the job can always be read back (Get), and
// a job that ended stays ended, whatever its workers send. At the end (the
// background work run): a job that failed or was cancelled left nothing in
// the output directory (its temporary removed, no file renamed in), and
// one that succeeded left exactly its weights file.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/logging.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/background_queue_testing.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/small_spec_testing.h"
#include "coordinator/registry/worker_registry.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/scratch_dir.h"
#include "proto/pipetrain/v1/coordinator.pb.h"

namespace {

// Enough for the whole_model_succeeds seed (44: every tensor from each
// worker, the steps and the finishes).
constexpr int kMaxOperations = 64;

constexpr char kWeightsName[] = "weights.safetensors";

pipetrain::v1::JobSpec TwoStageSpec() {
  pipetrain::v1::JobSpec spec = pipetrain::SmallJobSpec(2);
  spec.mutable_output()->set_weights_path(kWeightsName);
  return spec;
}

bool Ended(pipetrain::v1::JobState state) {
  return state == pipetrain::v1::JOB_STATE_SUCCEEDED || state == pipetrain::v1::JOB_STATE_FAILED ||
         state == pipetrain::v1::JOB_STATE_CANCELLED;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  static const bool quiet = [] {
    SetMinLogSeverity(LogSeverity::kError);  // every job event is logged
    return true;
  }();
  (void)quiet;
  const std::string& output_dir = ScratchDir("jobs-fuzz");
  EmptyDir(output_dir);
  FakeClock clock;
  WorkerRegistry registry(WorkerRegistry::Options{.clock = &clock});
  AssignmentHub hub;
  BackgroundQueue background;  // outlives jobs
  JobManager jobs(
      &registry, &hub, &clock,
      JobManagerOptions{.output_dir = output_dir, .background_runner = background.Runner()});
  for (const char* address : {"10.0.0.1:9001", "10.0.0.2:9001"}) {
    v1::RegisterWorkerRequest request;
    request.set_data_address(address);
    if (!registry.Register(request).ok()) __builtin_trap();
  }
  absl::StatusOr<v1::Job> submitted = jobs.Submit(TwoStageSpec());
  if (!submitted.ok()) __builtin_trap();
  const std::string job_id = submitted->id();
  background.RunAll();
  absl::StatusOr<v1::Job> running = jobs.Get(job_id);
  if (!running.ok() || running->state() != v1::JOB_STATE_RUNNING) __builtin_trap();
  v1::Job job = *running;  // as read after the last operation
  bool ended = false;

  FuzzInput in(data, size);
  for (int op = 0; op < kMaxOperations && !in.empty(); ++op) {
    const uint8_t choice = in.Byte();
    // The job's worker the operation names, and its incarnation.
    const std::string worker = job.worker_ids_size() > 0
                                   ? job.worker_ids(((choice >> 4) & 1) % job.worker_ids_size())
                                   : "w-1";
    absl::StatusOr<v1::Worker> entry = registry.Get(worker);
    const int64_t incarnation = entry.ok() ? entry->incarnation() : 1;
    const bool addressed = choice & 8;
    switch (choice & 7) {
      case 0: {
        v1::ReportProgressRequest request;
        if (!in.ParseLengthPrefixed(request)) break;
        if (addressed) {
          request.set_worker_id(worker);
          request.set_incarnation(incarnation);
          request.set_job_id(job_id);
          request.set_plan_version(job.plan_version());
        }
        (void)jobs.ReportProgress(request);
        break;
      }
      case 1: {
        v1::WeightsChunk chunk;
        if (!in.ParseLengthPrefixed(chunk)) break;
        if (addressed) {
          chunk.set_worker_id(worker);
          chunk.set_job_id(job_id);
        }
        (void)jobs.AddWeightsChunk(chunk);
        break;
      }
      case 2:
        (void)jobs.FinishWeights(worker, job_id);
        break;
      case 3:
        (void)jobs.Drain(worker);
        break;
      case 4:
        // The current incarnation, or (addressed) one before it, as after
        // a re-registration.
        jobs.OnWorkerLost(worker, job_id, "lost by the fuzzer",
                          addressed ? incarnation - 1 : incarnation);
        break;
      case 5:
        (void)jobs.Cancel(job_id);
        break;
      case 6:
        (void)jobs.GetPlan(job_id);
        break;
      case 7:
        clock.Advance(absl::Seconds(in.Byte()));
        jobs.ScheduleQueued();
        if (!addressed) background.RunAll();
        break;
    }
    absl::StatusOr<v1::Job> after = jobs.Get(job_id);
    if (!after.ok()) __builtin_trap();
    if (ended && !Ended(after->state())) __builtin_trap();  // an ended job came back
    ended = Ended(after->state());
    job = *std::move(after);
  }
  background.RunAll();  // a weights sync in flight ends, committed or not
  absl::StatusOr<v1::Job> last = jobs.Get(job_id);
  if (!last.ok()) __builtin_trap();
  const std::vector<std::string> left = DirEntries(output_dir);
  if (last->state() == v1::JOB_STATE_SUCCEEDED) {
    if (left != std::vector<std::string>{kWeightsName}) __builtin_trap();
  } else if (Ended(last->state()) && !left.empty()) {
    __builtin_trap();  // a failed or cancelled job's upload left a file
  }
  return 0;
}
