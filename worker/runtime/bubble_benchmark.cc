// Pipeline bubble of 1F1B, measured against theory.
//
// Runs a balanced 2-stage pipeline (stage threads in one process, the
// in-process transport, one BLAS thread each) for several micro-batch
// counts m and reports the measured bubble fraction, idle / (busy + idle)
// from the runtime's own busy/idle accounting (the same numbers workers
// export as metrics), next to the theoretical (p - 1) / (m + p - 1) of a
// perfectly balanced pipeline with free communication. Stages are never
// exactly balanced (embed and head differ a little), and a faster
// stage also idles for the difference, m times per iteration; so the table
// shows the mean over stages, the bottleneck stage's bubble (the one theory
// describes) and the measured imbalance. The check column is OK when the
// bottleneck stage's bubble is within 0.05 of theory.
//
//   bazel run //worker/runtime:bubble_benchmark -- [--stages 2] [--iterations 5]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "common/flag_set.h"
#include "common/malloc_tuning.h"
#include "coordinator/planner/partition.h"
#include "coordinator/planner/schedule_compiler.h"
#include "kernels/cpu/blas.h"
#include "worker/data/synthetic_text.h"
#include "worker/runtime/stage_runtime.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

struct Measured {
  double bubble = 0;             // mean over stages
  double bottleneck_bubble = 0;  // of the stage with the most busy time
  double imbalance = 0;          // max busy / min busy - 1
  double seconds_per_iteration = 0;
};

Measured RunPipeline(const TrainConfig& c, const Dataset& data, int stages, int iterations) {
  const int units = NumUnits(c.model);
  // One block per stage: stage 0 = embed + attn_0 + mlp_0, the last stage
  // attn + mlp + head; at d_model 512 the embed/head difference is small.
  auto ranges = UniformPartition(units, stages).value();
  auto programs = CompilePrograms(ranges, units, c.micro_batches, Schedule::kOneFOneB).value();
  InProcessFabric fabric(stages);
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::unique_ptr<StageRuntime>> runtimes;
  for (int s = 0; s < stages; ++s) {
    transports.push_back(fabric.Connect(s));
    const v1::UnitRange range = ToUnitRange(ranges[s]);
    StageSetup setup{"bubble", c, s, stages, range, range, programs[s], absl::Seconds(600)};
    runtimes.push_back(StageRuntime::Create(setup, &data, transports[s].get()).value());
  }
  std::vector<double> busy(stages), idle(stages);
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < stages; ++s) {
    threads.emplace_back([&, s] {
      SetBlasThreads(1);
      for (int i = 0; i < iterations + 1; ++i) {
        IterationResult r = runtimes[s]->RunIteration(i).value();
        if (i == 0) continue;  // warm-up
        busy[s] += r.busy_seconds;
        idle[s] += r.idle_seconds;
      }
    });
  }
  for (auto& t : threads) t.join();
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Measured m;
  int slowest = 0;
  double fastest_busy = busy[0];
  for (int s = 0; s < stages; ++s) {
    m.bubble += idle[s] / (busy[s] + idle[s]) / stages;
    if (busy[s] > busy[slowest]) slowest = s;
    fastest_busy = std::min(fastest_busy, busy[s]);
  }
  m.bottleneck_bubble = idle[slowest] / (busy[slowest] + idle[slowest]);
  m.imbalance = busy[slowest] / fastest_busy - 1;
  m.seconds_per_iteration = total / (iterations + 1);
  return m;
}

int Run(const std::vector<std::string>& args) {
  int stages = 2, iterations = 5;
  FlagSet flags("usage: bubble_benchmark [--stages 2] [--iterations 5]");
  flags.Int("stages", &stages, "pipeline stages (one thread each; use <= cores)");
  flags.Int("iterations", &iterations, "timed iterations per micro-batch count");
  const bool parsed = flags.Parse(args).ok();
  if (flags.help_requested()) return std::printf("%s", flags.Usage().c_str()), 0;
  if (!parsed || stages < 2 || iterations < 1) {
    std::fprintf(stderr, "%s", flags.Usage().c_str());
    return 2;
  }
  TrainConfig c;
  c.model.n_layer = stages;  // 2 * stages + 2 units: one block per stage
  c.model.n_head = 8;
  c.model.d_model = 512;
  c.model.max_seq_len = 64;
  c.seq_len = 64;
  const std::string text = GenerateEnglishText(1, 200000);
  Dataset data = Dataset::Create(std::vector<uint16_t>(text.begin(), text.end()), 64, 0.1).value();
  std::printf("# 1F1B bubble: %d stages (threads, in-process transport), %d layers d_model %d, "
              "micro-batch 2 x 64 tokens; BLAS %s x1 per stage\n",
              stages, c.model.n_layer, c.model.d_model, BlasCoreName().c_str());
  std::printf("%4s %12s %16s %14s %10s %12s %6s\n", "m", "bubble_mean", "bubble_bottleneck",
              "bubble_theory", "imbalance", "s_per_iter", "check");
  bool ok = true;
  for (int m : {1, 2, 4, 8, 16}) {
    c.micro_batches = m;
    c.batch_size = 2 * m;
    const Measured r = RunPipeline(c, data, stages, iterations);
    const double theory = double(stages - 1) / (m + stages - 1);
    const bool row_ok = std::fabs(r.bottleneck_bubble - theory) <= 0.05;
    ok = ok && row_ok;
    std::printf("%4d %12.3f %16.3f %14.3f %10.3f %12.3f %6s\n", m, r.bubble, r.bottleneck_bubble,
                theory, r.imbalance, r.seconds_per_iteration, row_ok ? "OK" : "FAILED");
  }
  std::printf("# %s: bottleneck stage's bubble within 0.05 of (p-1)/(m+p-1)\n",
              ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  pipetrain::ConfigureBlasOrReexec(argv);
  pipetrain::TuneMallocForLargeBuffers();  // As pipetrain-worker does: malloc_tuning.h.
  return pipetrain::Run(std::vector<std::string>(argv + 1, argv + argc));
}
