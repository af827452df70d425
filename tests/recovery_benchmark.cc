// Recovery time and checkpoint cost, measured on real processes (the
// Elastic issue's figures; docs/benchmarks.md "Recovery").
//
//   bazel build //tests:recovery_benchmark //coordinator:pipetrain-coordinator
//       //worker:pipetrain-worker   (one command)
//   bazel-bin/tests/recovery_benchmark [--kills 20] [--seed 1] [--rounds 5]
//
// Part 1 (recovery): a coordinator and 4 workers with default settings run
// the demo model (pipetrain up's: 2 layers, d_model 128, 4 heads, seq 64,
// batch 16 in 4 micro-batches) as one long job with a checkpoint every 10
// steps and spec.elastic.max_workers 4. `--kills` times: wait a random
// 20-60 steps, SIGKILL the worker of a random stage, and time from the kill
// (this program's clock) to
//   detection   the job shows RECOVERING,
//   re-planned  its plan version rises (the survivors were heard from and
//               the new plan sent),
//   first step  a step completes on the new plan;
// the new plan's resume_load_seconds (the slowest stage's checkpoint load)
// splits the last phase into load and restart. Then a replacement worker
// starts and the job grows back to 4 at a step boundary before the next
// kill. GetJob is polled every 2 ms, which bounds the resolution.
//
// Part 2 (checkpoint cost): the same model, 4 workers, 300 steps with no
// checkpoints and with one every 10 steps, alternated (--rounds each); the
// mean step time of each and the bytes a checkpoint writes.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/coordinator_client.h"
#include "cli/local_cluster.h"
#include "common/flag_set.h"
#include "common/status_macros.h"
#include "worker/agent/device_info.h"

namespace pipetrain {
namespace {

v1::JobSpec DemoSpec(int64_t steps, int checkpoint_interval) {
  v1::JobSpec spec;
  spec.set_name("recovery-benchmark");
  spec.mutable_model()->set_n_layer(2);
  spec.mutable_model()->set_n_head(4);
  spec.mutable_model()->set_d_model(128);
  auto* t = spec.mutable_training();
  t->set_seq_len(64);
  t->set_batch_size(16);
  t->set_micro_batches(4);
  t->set_steps(steps);
  t->set_lr(1e-3f);
  spec.mutable_data()->set_synthetic_bytes(1000000);
  spec.mutable_parallelism()->set_stages(4);
  spec.mutable_checkpoint()->set_interval_steps(checkpoint_interval);
  spec.mutable_checkpoint()->set_keep(2);
  return spec;
}

absl::StatusOr<v1::Job> GetJob(v1::CoordinatorService::Stub& stub, const std::string& id) {
  v1::GetJobRequest request;
  request.set_id(id);
  v1::Job job;
  grpc::Status s = stub.GetJob(WithDeadline(absl::Seconds(10)).get(), request, &job);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  return job;
}

// Polls until `done(job)` or `timeout`; the job last seen.
absl::StatusOr<v1::Job> Await(v1::CoordinatorService::Stub& stub, const std::string& id,
                              absl::Duration timeout,
                              const std::function<bool(const v1::Job&)>& done) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<v1::Job> job = GetJob(stub, id);
    if (!job.ok()) return job;
    if (done(*job)) return job;
    if (job->state() == v1::JOB_STATE_FAILED || job->state() == v1::JOB_STATE_CANCELLED) {
      return absl::AbortedError(absl::StrCat("job ended: ", job->reason()));
    }
    if (absl::Now() > deadline) return absl::DeadlineExceededError("timed out waiting");
    absl::SleepFor(absl::Milliseconds(2));  // polls a remote state
  }
}

int ProcessOf(v1::CoordinatorService::Stub& stub, const std::string& id) {
  v1::ListWorkersResponse workers;
  if (!stub.ListWorkers(WithDeadline(absl::Seconds(5)).get(), {}, &workers).ok()) return -1;
  for (const v1::Worker& w : workers.workers()) {
    if (w.id() == id && w.node_name().rfind("local-", 0) == 0) {
      return std::stoi(w.node_name().substr(6));
    }
  }
  return -1;
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * (v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

absl::StatusOr<std::unique_ptr<LocalCluster>> StartCluster(const std::string& dir, int workers) {
  mkdir(dir.c_str(), 0700);
  LocalClusterOptions options;
  ASSIGN_OR_RETURN(options.coordinator_binary,
                   FindSiblingBinary("coordinator", "pipetrain-coordinator"));
  ASSIGN_OR_RETURN(options.worker_binary, FindSiblingBinary("worker", "pipetrain-worker"));
  options.workers = workers;
  options.exit_with_parent = true;  // a crashed benchmark leaves no cluster behind
  options.dir = dir;
  options.join_token = "benchmark-join";
  options.user_token = "benchmark-user";
  options.coordinator_args = {"--output-dir=" + dir};
  options.worker_args = {"--checkpoint-root=" + dir};
  return LocalCluster::Start(options);
}

struct Kill {
  double detection = 0, replanned = 0, first_step = 0, load = 0;
  int64_t redone = 0;
};

int RunRecovery(const std::string& dir, int kills, uint64_t seed) {
  auto cluster = StartCluster(dir + "/recovery", 4);
  if (!cluster.ok()) return std::fprintf(stderr, "%s\n", cluster.status().ToString().c_str()), 1;
  auto stub = ConnectCoordinator((*cluster)->grpc_address(), "", (*cluster)->user_token());
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = DemoSpec(10000000, 10);
  v1::Job job;
  if (!stub->SubmitJob(WithDeadline(absl::Seconds(10)).get(), submit, &job).ok()) {
    return std::fprintf(stderr, "submit failed\n"), 1;
  }
  const std::string id = job.id();
  std::mt19937_64 random(seed);
  std::vector<Kill> results;
  for (int k = 0; k < kills; ++k) {
    // Running on 4 workers again, then a random number of steps more.
    absl::StatusOr<v1::Job> running = Await(*stub, id, absl::Minutes(2), [](const v1::Job& j) {
      return j.state() == v1::JOB_STATE_RUNNING && j.worker_ids_size() == 4;
    });
    if (!running.ok()) return std::fprintf(stderr, "%s\n", running.status().ToString().c_str()), 1;
    const int64_t target =
        running->progress().step() + std::uniform_int_distribution<int>(20, 60)(random);
    running = Await(*stub, id, absl::Minutes(2),
                    [&](const v1::Job& j) { return j.progress().step() >= target; });
    if (!running.ok()) return std::fprintf(stderr, "%s\n", running.status().ToString().c_str()), 1;
    const int stage = std::uniform_int_distribution<int>(0, 3)(random);
    const std::string victim = running->worker_ids(stage);
    const int process = ProcessOf(*stub, victim);
    if (process < 0) return std::fprintf(stderr, "no process for %s\n", victim.c_str()), 1;
    const int64_t version = running->plan_version();
    const int64_t step_at_kill = running->progress().step();
    // The job's count so far: it is cumulative, so after the first kill
    // "above 0" held at the first poll and measured one GetJob, not the
    // detection.
    const int recoveries_before = running->progress().recoveries();
    const absl::Time killed = absl::Now();
    (*cluster)->worker(process).Signal(SIGKILL);
    Kill r;
    absl::StatusOr<v1::Job> seen = Await(*stub, id, absl::Minutes(1), [&](const v1::Job& j) {
      return j.state() == v1::JOB_STATE_RECOVERING || j.progress().recoveries() > recoveries_before;
    });
    if (!seen.ok()) return std::fprintf(stderr, "%s\n", seen.status().ToString().c_str()), 1;
    r.detection = absl::ToDoubleSeconds(absl::Now() - killed);
    seen = Await(*stub, id, absl::Minutes(1),
                 [&](const v1::Job& j) { return j.plan_version() > version; });
    if (!seen.ok()) return std::fprintf(stderr, "%s\n", seen.status().ToString().c_str()), 1;
    r.replanned = absl::ToDoubleSeconds(absl::Now() - killed);
    const v1::PlanVersion resumed = seen->plan_history(seen->plan_history_size() - 1);
    seen = Await(*stub, id, absl::Minutes(1), [&](const v1::Job& j) {
      return j.plan_version() == resumed.version() && j.progress().step() > resumed.start_step();
    });
    if (!seen.ok()) return std::fprintf(stderr, "%s\n", seen.status().ToString().c_str()), 1;
    r.first_step = absl::ToDoubleSeconds(absl::Now() - killed);
    r.load = seen->plan_history(seen->plan_history_size() - 1).resume_load_seconds();
    r.redone = step_at_kill - resumed.start_step();
    results.push_back(r);
    std::printf(
        "kill %2d: %s (stage %d) at step %lld: detected %.3f s, re-planned %.3f s, "
        "first step %.3f s (load %.3f s); resumed from step %lld (%lld redone)\n",
        k + 1, victim.c_str(), stage, static_cast<long long>(step_at_kill), r.detection,
        r.replanned, r.first_step, r.load, static_cast<long long>(resumed.start_step()),
        static_cast<long long>(r.redone));
    std::fflush(stdout);
    // A replacement, so the job grows back to 4 at a step boundary.
    absl::StatusOr<int> added = (*cluster)->AddWorker();
    if (!added.ok()) return std::fprintf(stderr, "%s\n", added.status().ToString().c_str()), 1;
  }
  auto column = [&](auto get) {
    std::vector<double> v;
    for (const Kill& r : results) v.push_back(get(r));
    return v;
  };
  const std::vector<std::pair<std::string, std::vector<double>>> rows = {
      {"detection (kill -> RECOVERING)", column([](const Kill& r) { return r.detection; })},
      {"re-planning (-> new plan sent)",
       column([](const Kill& r) { return r.replanned - r.detection; })},
      {"checkpoint load (slowest stage)", column([](const Kill& r) { return r.load; })},
      {"restart (-> first step, less load)",
       column([](const Kill& r) { return r.first_step - r.replanned - r.load; })},
      {"total (kill -> first step)", column([](const Kill& r) { return r.first_step; })},
      {"steps redone", column([](const Kill& r) { return double(r.redone); })},
  };
  std::printf("\n%-36s %8s %8s %8s\n", "seconds (n = kills)", "median", "p95", "max");
  for (const auto& [name, v] : rows) {
    std::printf("%-36s %8.3f %8.3f %8.3f\n", name.c_str(), Percentile(v, 0.5), Percentile(v, 0.95),
                *std::max_element(v.begin(), v.end()));
  }
  const double median = Percentile(rows[4].second, 0.5);
  std::printf("# goal: median total under 5 s: %s (%.3f s over %zu kills)\n",
              median < 5 ? "met" : "NOT met", median, results.size());
  return 0;
}

// Mean seconds per step of a `steps`-step job (from the first step's end to
// the last's, so start-up is left out), and its checkpoint bytes.
absl::StatusOr<std::pair<double, int64_t>> TimeJob(v1::CoordinatorService::Stub& stub,
                                                   const std::string& dir, int64_t steps,
                                                   int interval) {
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = DemoSpec(steps, interval);
  v1::Job job;
  if (!stub.SubmitJob(WithDeadline(absl::Seconds(10)).get(), submit, &job).ok()) {
    return absl::UnavailableError("submit failed");
  }
  ASSIGN_OR_RETURN(v1::Job first, Await(stub, job.id(), absl::Minutes(2), [](const v1::Job& j) {
                     return j.progress().step() >= 10;
                   }));
  const absl::Time start = absl::Now();
  const int64_t from = first.progress().step();
  ASSIGN_OR_RETURN(v1::Job done, Await(stub, job.id(), absl::Minutes(10), [](const v1::Job& j) {
                     return j.state() == v1::JOB_STATE_SUCCEEDED;
                   }));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  int64_t bytes = 0;
  if (interval > 0) {
    // One complete checkpoint's unit files (the newest kept).
    const std::string listing = absl::StrFormat("du -sb %s/checkpoints/%s/step-%08d 2>/dev/null",
                                                dir, job.id(), (steps - 1) / interval * interval);
    if (FILE* p = popen(listing.c_str(), "r")) {
      long long b = 0;
      if (std::fscanf(p, "%lld", &b) == 1) bytes = b;
      pclose(p);
    }
  }
  return std::make_pair(seconds / double(steps - from), bytes);
}

int RunCheckpointCost(const std::string& dir, int rounds) {
  const std::string where = dir + "/cost";
  auto cluster = StartCluster(where, 4);
  if (!cluster.ok()) return std::fprintf(stderr, "%s\n", cluster.status().ToString().c_str()), 1;
  auto stub = ConnectCoordinator((*cluster)->grpc_address(), "", (*cluster)->user_token());
  std::vector<double> off, on;
  int64_t bytes = 0;
  for (int round = 0; round < rounds; ++round) {
    for (int interval : {0, 10}) {
      absl::StatusOr<std::pair<double, int64_t>> t = TimeJob(*stub, where, 300, interval);
      if (!t.ok()) return std::fprintf(stderr, "%s\n", t.status().ToString().c_str()), 1;
      (interval == 0 ? off : on).push_back(t->first);
      if (interval > 0) bytes = t->second;
      std::printf("round %d, %s: %.2f ms/step\n", round + 1,
                  interval == 0 ? "no checkpoints" : "a checkpoint every 10 steps", t->first * 1e3);
      std::fflush(stdout);
    }
  }
  const double mean_off = std::accumulate(off.begin(), off.end(), 0.0) / off.size();
  const double mean_on = std::accumulate(on.begin(), on.end(), 0.0) / on.size();
  const double overhead = (mean_on / mean_off - 1) * 100;
  // Means over the rounds, which alternate: a 2-core VM's step time
  // wanders by 5-10 % between jobs.
  std::printf(
      "\nstep time (mean of %d rounds): %.2f ms without checkpoints, %.2f ms with one every 10 "
      "steps: %+.1f %%\n",
      rounds, mean_off * 1e3, mean_on * 1e3, overhead);
  std::printf("one checkpoint: %lld bytes (%.2f MiB; weights and AdamW moments of every unit)\n",
              static_cast<long long>(bytes), bytes / 1048576.0);
  std::printf("# goal: overhead under 5 %%: %s\n", overhead < 5 ? "met" : "NOT met");
  return 0;
}

int Main(const std::vector<std::string>& args) {
  int kills = 20;
  uint64_t seed = 1;
  bool skip_cost = false;
  int rounds = 5;
  std::string dir = "/tmp/pipetrain-recovery-benchmark";
  FlagSet flags("usage: recovery_benchmark [--kills N] [--seed S] [--dir DIR] [--skip-cost]");
  flags.Int("kills", &kills, "workers to kill, one at a time");
  flags.Uint64("seed", &seed, "seed of the kill steps and stages");
  flags.String("dir", &dir, "logs, checkpoints and ports files go here");
  flags.Bool("skip-cost", &skip_cost, "skip part 2 (checkpoint cost)");
  flags.Int("rounds", &rounds, "part 2: runs of each configuration, alternated");
  absl::Status parsed = flags.Parse(args);
  if (!parsed.ok() || flags.help_requested() || kills < 0 || rounds < 1) {
    std::fprintf(stderr, "%s", flags.Usage().c_str());
    return flags.help_requested() ? 0 : 2;
  }
  mkdir(dir.c_str(), 0700);
  std::printf(
      "# recovery_benchmark: %s, %u hardware threads; coordinator and workers on "
      "loopback, default lease and heartbeats\n",
      CpuModelName().c_str(), std::thread::hardware_concurrency());
  std::printf("# part 1: %d kills, seed %llu\n", kills, static_cast<unsigned long long>(seed));
  if (kills > 0) {
    if (int code = RunRecovery(dir, kills, seed); code != 0) return code;
  }
  if (skip_cost) return 0;
  std::printf("\n# part 2: checkpoint cost\n");
  return RunCheckpointCost(dir, rounds);
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  return pipetrain::Main(std::vector<std::string>(argv + 1, argv + argc));
}
