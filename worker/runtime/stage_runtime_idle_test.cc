// IterationResult's busy and idle time: a stage blocked in a collective,
// waiting for another stage or replica to get there, is idle, as a receive's
// wait is, so that busy stays its own compute (what the plan's
// predicted_busy_seconds and the bubble alert compare it with). A stand-in
// backend makes one stage or replica slower by a fixed delay; the stage
// that waits for it must book the wait as idle, not in its busy time nor
// in its "optimizer" phase.
//
// Timing: the injected delay (kDelay, at least once per step) is twice the
// tolerance that busy times of two runs may differ by per step, and the
// measured steps are averaged, so machine noise does not decide the test.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/planner/partition.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/forwarding_backend.h"
#include "worker/model/gpt_config.h"
#include "worker/runtime/pipeline_testing.h"
#include "worker/runtime/stage_runtime.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

constexpr absl::Duration kDelay = absl::Milliseconds(50);
// Seconds per step by which the same stage's busy (or idle, or optimizer)
// time may differ between two runs: half of kDelay.
constexpr double kTolerance = 0.025;
constexpr int kStages = 3;
constexpr int kIterations = 5;  // the first is a warm-up, not measured

// The CPU backend, with each LinearBackward (a stage's backward pass) or
// AdamWUpdateAll (its optimizer step) kDelay slower.
class SlowBackend : public ForwardingBackend {
 public:
  enum class Op { kLinearBackward, kAdamW };
  explicit SlowBackend(Op op) : ForwardingBackend(CpuBackend()), op_(op) {}

  void LinearBackward(const float* x, const float* w, const float* dy, int n, int in, int out,
                      float* dx, float* dw, float* db) override {
    if (op_ == Op::kLinearBackward) absl::SleepFor(kDelay);
    inner()->LinearBackward(x, w, dy, n, in, out, dx, dw, db);
  }
  void AdamWUpdateAll(const std::vector<AdamWTensor>& tensors, int64_t step,
                      const AdamWConfig& config) override {
    if (op_ == Op::kAdamW) absl::SleepFor(kDelay);
    inner()->AdamWUpdateAll(tensors, step, config);
  }

 private:
  const Op op_;
};

// One runtime's measured steps, per step.
struct StepTimes {
  double busy = 0;
  double idle = 0;
  std::map<std::string, double> phases;
  std::map<std::string, double> collective_seconds;  // by purpose
  double phase(const std::string& name) const {
    auto it = phases.find(name);
    return it == phases.end() ? 0.0 : it->second;
  }
};

// `replicas` replicas of kStages uniform 1F1B stages of `c` over an
// in-process fabric, each runtime on its own thread, for kIterations
// steps; replica r's stage s computes on backend_of(r, s) (the CPU when
// null). By runtime, r * kStages + s: its steps after the first.
std::vector<StepTimes> RunStages(const TrainConfig& c, int replicas,
                                 const std::function<Backend*(int, int)>& backend_of) {
  const Dataset data = testing::MakeDataset();
  const int units = NumUnits(c.model);
  const std::vector<Range> ranges = UniformPartition(units, kStages).value();
  const std::vector<v1::Program> programs =
      CompilePrograms(ranges, units, c.micro_batches / replicas, Schedule::kOneFOneB).value();
  const int total = replicas * kStages;
  InProcessFabric fabric(total);
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::unique_ptr<StageRuntime>> runtimes;
  for (int g = 0; g < total; ++g) {
    const int s = g % kStages;
    transports.push_back(fabric.Connect(g));
    StageSetup setup{"job-idle",
                     c,
                     s,
                     kStages,
                     ToUnitRange(ranges[s]),
                     ToUnitRange(ranges[s]),
                     programs[s],
                     absl::Seconds(30)};
    setup.replica = g / kStages;
    setup.replicas = replicas;
    for (int t = 0; t < kStages; ++t) setup.optimizer_stages.push_back(t);
    Backend* backend = backend_of(g / kStages, s);
    if (backend != nullptr) setup.backend = backend;
    runtimes.push_back(StageRuntime::Create(setup, &data, transports[g].get()).value());
  }
  std::vector<StepTimes> times(total);
  std::vector<absl::Status> errors(total);
  std::vector<std::thread> threads;
  for (int g = 0; g < total; ++g) {
    threads.emplace_back([&, g] {
      for (int i = 0; i < kIterations; ++i) {
        absl::StatusOr<IterationResult> r = runtimes[g]->RunIteration(i);
        if (!r.ok()) {
          errors[g] = r.status();
          fabric.Shutdown();  // the others fail at once instead of timing out
          return;
        }
        if (i == 0) continue;
        const double steps = kIterations - 1;
        times[g].busy += r->busy_seconds / steps;
        times[g].idle += r->idle_seconds / steps;
        for (const auto& [phase, seconds] : r->phase_seconds) {
          times[g].phases[phase] += seconds / steps;
        }
        for (const auto& [purpose, stats] : r->collectives) {
          times[g].collective_seconds[purpose] += stats.seconds / steps;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int g = 0; g < total; ++g)
    EXPECT_TRUE(errors[g].ok()) << "runtime " << g << ": " << errors[g];
  return times;
}

// The reviewer's case: with gradient clipping, a stage that finishes its
// backward passes before stage 0 waits in stage 0's norm broadcast for the
// pipeline's cool-down. Without clipping the same wait is the next step's
// first receive. Either way it is idle: busy, idle and the optimizer phase
// of stages 1 and 2 stay those of the unclipped run.
TEST(StageRuntimeIdleTest, GradClipBroadcastWait_IsIdle) {
  TrainConfig c = testing::SmallConfig();
  SlowBackend slow(SlowBackend::Op::kLinearBackward);
  auto stage_0_slow = [&](int, int stage) -> Backend* { return stage == 0 ? &slow : nullptr; };
  c.grad_clip = 0;
  const std::vector<StepTimes> unclipped = RunStages(c, 1, stage_0_slow);
  c.grad_clip = 0.05f;
  const std::vector<StepTimes> clipped = RunStages(c, 1, stage_0_slow);
  ASSERT_EQ(clipped.size(), static_cast<size_t>(kStages));
  ASSERT_EQ(unclipped.size(), static_cast<size_t>(kStages));
  for (int s = 1; s < kStages; ++s) {
    EXPECT_GT(clipped[s].collective_seconds.count("grad_clip"), 0u) << "stage " << s;
    EXPECT_NEAR(clipped[s].phase("optimizer"), unclipped[s].phase("optimizer"), kTolerance)
        << "stage " << s;
    EXPECT_NEAR(clipped[s].busy, unclipped[s].busy, kTolerance) << "stage " << s;
    EXPECT_NEAR(clipped[s].idle, unclipped[s].idle, kTolerance) << "stage " << s;
  }
}

// Replica 1's stage 0 is slow: replica 0's stage 0 waits for it in the
// data-parallel all-reduce, all of which is idle (and phase "all_reduce").
TEST(StageRuntimeIdleTest, DataParallelAllReduceWait_IsIdle) {
  const TrainConfig c = testing::SmallConfig();
  SlowBackend slow(SlowBackend::Op::kLinearBackward);
  const std::vector<StepTimes> even = RunStages(c, 2, [](int, int) { return nullptr; });
  const std::vector<StepTimes> uneven = RunStages(c, 2, [&](int replica, int stage) -> Backend* {
    return replica == 1 && stage == 0 ? &slow : nullptr;
  });
  ASSERT_EQ(uneven.size(), static_cast<size_t>(2 * kStages));
  ASSERT_EQ(even.size(), static_cast<size_t>(2 * kStages));
  const StepTimes& waiting = uneven[0];  // replica 0's stage 0
  EXPECT_GE(waiting.phase("all_reduce"), absl::ToDoubleSeconds(kDelay));
  EXPECT_GE(waiting.idle, waiting.phase("all_reduce"));
  EXPECT_NEAR(waiting.busy, even[0].busy, kTolerance);
  EXPECT_NEAR(waiting.phase("optimizer"), even[0].phase("optimizer"), kTolerance);
}

// Replica 1's loss stage (stage 2) steps its optimizer slowly: replica 0's
// loss stage waits for it in the losses' all-gather, which is idle.
TEST(StageRuntimeIdleTest, LossGatherWait_IsIdle) {
  const TrainConfig c = testing::SmallConfig();
  SlowBackend slow(SlowBackend::Op::kAdamW);
  const std::vector<StepTimes> even = RunStages(c, 2, [](int, int) { return nullptr; });
  const std::vector<StepTimes> uneven = RunStages(c, 2, [&](int replica, int stage) -> Backend* {
    return replica == 1 && stage == kStages - 1 ? &slow : nullptr;
  });
  ASSERT_EQ(uneven.size(), static_cast<size_t>(2 * kStages));
  ASSERT_EQ(even.size(), static_cast<size_t>(2 * kStages));
  const StepTimes& waiting = uneven[kStages - 1];  // replica 0's loss stage
  auto gather = [](const StepTimes& t) {
    auto it = t.collective_seconds.find("loss_gather");
    return it == t.collective_seconds.end() ? 0.0 : it->second;
  };
  // Most of kDelay: the gather starts once this replica's own (fast)
  // optimizer step is done.
  EXPECT_GE(gather(waiting), absl::ToDoubleSeconds(kDelay) / 2);
  EXPECT_NEAR(waiting.busy, even[kStages - 1].busy, kTolerance);
}

}  // namespace
}  // namespace pipetrain
