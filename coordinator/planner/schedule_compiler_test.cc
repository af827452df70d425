#include "coordinator/planner/schedule_compiler.h"

#include <functional>
#include <set>
#include <tuple>

#include "common/program_text.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::vector<std::string> Describe(const v1::Program& p) {
  std::vector<std::string> out;
  for (const auto& in : p.instructions()) out.push_back(DescribeInstruction(in));
  return out;
}

TEST(ScheduleCompilerTest, OneFOneB_TwoStagesThreeMicroBatches_ExactPrograms) {
  auto programs = CompilePrograms({{0, 2}, {2, 4}}, 4, 3, Schedule::kOneFOneB).value();
  ASSERT_EQ(programs.size(), 2u);
  EXPECT_EQ(Describe(programs[0]),
            (std::vector<std::string>{
                "forward [0, 2) mb 0", "send ACTIVATION unit 1 mb 0 to stage 1",
                "forward [0, 2) mb 1", "send ACTIVATION unit 1 mb 1 to stage 1",
                "recv ACTIVATION_GRAD unit 2 mb 0 from stage 1", "backward [0, 2) mb 0",
                "forward [0, 2) mb 2", "send ACTIVATION unit 1 mb 2 to stage 1",
                "recv ACTIVATION_GRAD unit 2 mb 1 from stage 1", "backward [0, 2) mb 1",
                "recv ACTIVATION_GRAD unit 2 mb 2 from stage 1", "backward [0, 2) mb 2",
                "send TIED_EMBEDDING_GRAD unit 0 mb -1 to stage 1",
                "recv TIED_EMBEDDING_GRAD unit 0 mb -1 from stage 1", "add tied gradient",
                "optimizer step [0, 2)"}));
  EXPECT_EQ(Describe(programs[1]),
            (std::vector<std::string>{
                "recv ACTIVATION unit 1 mb 0 from stage 0", "forward [2, 4) mb 0",
                "backward [2, 4) mb 0", "send ACTIVATION_GRAD unit 2 mb 0 to stage 0",
                "recv ACTIVATION unit 1 mb 1 from stage 0", "forward [2, 4) mb 1",
                "backward [2, 4) mb 1", "send ACTIVATION_GRAD unit 2 mb 1 to stage 0",
                "recv ACTIVATION unit 1 mb 2 from stage 0", "forward [2, 4) mb 2",
                "backward [2, 4) mb 2", "send ACTIVATION_GRAD unit 2 mb 2 to stage 0",
                "send TIED_EMBEDDING_GRAD unit 0 mb -1 to stage 0",
                "recv TIED_EMBEDDING_GRAD unit 0 mb -1 from stage 0", "add tied gradient",
                "optimizer step [2, 4)"}));
}

TEST(ScheduleCompilerTest, SingleStage_SumsTiedGradientLocally) {
  auto programs = CompilePrograms({{0, 4}}, 4, 2, Schedule::kGPipe).value();
  EXPECT_EQ(Describe(programs[0]),
            (std::vector<std::string>{"forward [0, 4) mb 0", "forward [0, 4) mb 1",
                                      "backward [0, 4) mb 0", "backward [0, 4) mb 1",
                                      "add tied gradient", "optimizer step [0, 4)"}));
}

// Runs all stage programs together with buffered sends and blocking
// receives, round-robin, and reports the peak number of micro-batches whose
// forward ran but whose backward did not, per stage.
struct SimulationResult {
  bool finished = false;
  std::vector<int> peak_in_flight;
  int unmatched_sends = 0;
  int recomputes = 0;
};

SimulationResult Simulate(const std::vector<v1::Program>& programs) {
  const int stages = static_cast<int>(programs.size());
  using Msg = std::tuple<int, int, int, int, int>;  // from, to, kind, mb, unit
  std::multiset<Msg> wire;
  std::vector<int> pc(stages, 0), in_flight(stages, 0);
  SimulationResult result;
  result.peak_in_flight.assign(stages, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      while (pc[s] < programs[s].instructions_size()) {
        const auto& in = programs[s].instructions(pc[s]);
        if (in.has_recv()) {
          const auto& k = in.recv().tensor();
          auto it = wire.find({in.recv().peer_stage(), s, k.kind(), k.micro_batch(), k.unit()});
          if (it == wire.end()) break;  // blocked
          wire.erase(it);
        } else if (in.has_send()) {
          const auto& k = in.send().tensor();
          wire.insert({s, in.send().peer_stage(), k.kind(), k.micro_batch(), k.unit()});
        } else if (in.has_forward()) {
          result.peak_in_flight[s] = std::max(result.peak_in_flight[s], ++in_flight[s]);
        } else if (in.has_backward()) {
          --in_flight[s];
        } else if (in.has_recompute()) {
          ++result.recomputes;
        }
        ++pc[s];
        progress = true;
      }
    }
  }
  result.finished = true;
  for (int s = 0; s < stages; ++s) {
    result.finished = result.finished && pc[s] == programs[s].instructions_size();
  }
  result.unmatched_sends = static_cast<int>(wire.size());
  return result;
}

TEST(ScheduleCompilerTest, AllShapes_DeadlockFreeMatchedAndBounded) {
  for (Schedule schedule : {Schedule::kOneFOneB, Schedule::kGPipe}) {
    for (int stages = 1; stages <= 6; ++stages) {
      for (int m = 1; m <= 8; ++m) {
        std::vector<Range> ranges;
        for (int s = 0; s < stages; ++s) ranges.push_back({s, s + 1});
        auto programs = CompilePrograms(ranges, stages, m, schedule).value();
        SimulationResult r = Simulate(programs);
        SCOPED_TRACE(ScheduleName(schedule) + " P=" + std::to_string(stages) +
                     " m=" + std::to_string(m));
        EXPECT_TRUE(r.finished);
        EXPECT_EQ(r.unmatched_sends, 0);
        for (int s = 0; s < stages; ++s) {
          const int bound = schedule == Schedule::kGPipe ? m : std::min(m, stages - s);
          EXPECT_EQ(r.peak_in_flight[s], bound) << "stage " << s;
        }
      }
    }
  }
}

// The paper's example plan (bipartition.txt Fig. 7, 0-based): worker 0 runs
// F{0} B{0,1}, worker 1 F{1,2} B{2}, worker 2 F{3} B{3}.
TEST(ScheduleCompilerTest, BiPartition_PaperExample_RecomputesAndSyncsWeights) {
  auto programs = CompileBiPartitionPrograms({{0, 1}, {1, 3}, {3, 4}}, {{0, 2}, {2, 3}, {3, 4}},
                                             4, 1, Schedule::kGPipe)
                      .value();
  EXPECT_EQ(Describe(programs[0]),
            (std::vector<std::string>{
                "forward [0, 1) mb 0", "send ACTIVATION unit 0 mb 0 to stage 1",
                "recompute [1, 2) mb 0", "recv ACTIVATION_GRAD unit 2 mb 0 from stage 1",
                "backward [0, 2) mb 0", "send TIED_EMBEDDING_GRAD unit 0 mb -1 to stage 2",
                "recv TIED_EMBEDDING_GRAD unit 0 mb -1 from stage 2", "add tied gradient",
                "optimizer step [0, 2)", "send UNIT_WEIGHTS unit 1 mb -1 to stage 1"}));
  EXPECT_EQ(Describe(programs[1]),
            (std::vector<std::string>{
                "recv ACTIVATION unit 0 mb 0 from stage 0", "forward [1, 3) mb 0",
                "send ACTIVATION unit 2 mb 0 to stage 2",
                "recv ACTIVATION_GRAD unit 3 mb 0 from stage 2", "backward [2, 3) mb 0",
                "send ACTIVATION_GRAD unit 2 mb 0 to stage 0", "optimizer step [2, 3)",
                "recv UNIT_WEIGHTS unit 1 mb -1 from stage 0"}));
}

// Forward of units 1-2 on worker 0, their backward on worker 1: worker 1
// gets unit 0's output routed to it and recomputes [1, 3) before backward.
TEST(ScheduleCompilerTest, BiPartition_BackwardAfterForward_RoutesInput) {
  auto programs = CompileBiPartitionPrograms({{0, 3}, {3, 4}}, {{0, 1}, {1, 4}}, 4, 1,
                                             Schedule::kGPipe)
                      .value();
  EXPECT_EQ(Describe(programs[0]),
            (std::vector<std::string>{
                "forward [0, 3) mb 0", "send ACTIVATION unit 2 mb 0 to stage 1",
                "send ACTIVATION unit 0 mb 0 to stage 1",
                "recv ACTIVATION_GRAD unit 1 mb 0 from stage 1", "backward [0, 1) mb 0",
                "send TIED_EMBEDDING_GRAD unit 0 mb -1 to stage 1",
                "recv TIED_EMBEDDING_GRAD unit 0 mb -1 from stage 1", "add tied gradient",
                "optimizer step [0, 1)", "recv UNIT_WEIGHTS unit 1 mb -1 from stage 1",
                "recv UNIT_WEIGHTS unit 2 mb -1 from stage 1"}));
  EXPECT_EQ(Describe(programs[1]),
            (std::vector<std::string>{
                "recv ACTIVATION unit 2 mb 0 from stage 0", "forward [3, 4) mb 0",
                "recv ACTIVATION unit 0 mb 0 from stage 0", "recompute [1, 3) mb 0",
                "backward [1, 4) mb 0", "send ACTIVATION_GRAD unit 1 mb 0 to stage 0",
                "send TIED_EMBEDDING_GRAD unit 0 mb -1 to stage 0",
                "recv TIED_EMBEDDING_GRAD unit 0 mb -1 from stage 0", "add tied gradient",
                "optimizer step [1, 4)", "send UNIT_WEIGHTS unit 1 mb -1 to stage 0",
                "send UNIT_WEIGHTS unit 2 mb -1 to stage 0"}));
}

// Every valid Bi-Partition plan of up to 5 units on up to 4 workers, both
// schedules, m in 1..4: the programs finish, every send is received, and
// every unit's forward and backward pass runs exactly once per micro-batch.
std::vector<std::vector<Range>> AllSequences(int units, int workers) {
  std::vector<std::vector<Range>> out;
  std::vector<Range> current;
  std::function<void(int)> rec = [&](int begin) {
    if (static_cast<int>(current.size()) == workers) {
      if (begin == units) out.push_back(current);
      return;
    }
    for (int end = begin; end <= units; ++end) {
      current.push_back({begin, end});
      rec(end);
      current.pop_back();
    }
  };
  rec(0);
  return out;
}

TEST(ScheduleCompilerTest, BiPartition_AllSmallPlans_FinishMatchedAndComplete) {
  int plans = 0, recomputes = 0;
  for (int units = 1; units <= 5; ++units) {
    for (int workers = 1; workers <= 4; ++workers) {
      const auto sequences = AllSequences(units, workers);
      for (const auto& forward : sequences) {
        for (const auto& backward : sequences) {
          bool valid = true;
          for (int w = 0; w < workers; ++w) {
            valid = valid && (forward[w].end > forward[w].begin ||
                              backward[w].end > backward[w].begin);
          }
          if (!valid) continue;
          ++plans;
          for (Schedule schedule : {Schedule::kOneFOneB, Schedule::kGPipe}) {
            for (int m = 1; m <= 4; ++m) {
              auto programs =
                  CompileBiPartitionPrograms(forward, backward, units, m, schedule).value();
              SimulationResult r = Simulate(programs);
              ASSERT_TRUE(r.finished) << units << " units, " << workers << " workers";
              ASSERT_EQ(r.unmatched_sends, 0);
              recomputes += r.recomputes;
              // Per unit and micro-batch: one forward, one backward.
              std::vector<int> fwd(units * m), bwd(units * m);
              for (const auto& p : programs) {
                for (const auto& in : p.instructions()) {
                  if (in.has_forward()) {
                    for (int u = in.forward().units().begin(); u < in.forward().units().end(); ++u)
                      ++fwd[u * m + in.forward().micro_batch()];
                  }
                  if (in.has_backward()) {
                    for (int u = in.backward().units().begin(); u < in.backward().units().end(); ++u)
                      ++bwd[u * m + in.backward().micro_batch()];
                  }
                }
              }
              ASSERT_EQ(fwd, std::vector<int>(units * m, 1));
              ASSERT_EQ(bwd, std::vector<int>(units * m, 1));
            }
          }
        }
      }
    }
  }
  EXPECT_GT(plans, 1000);
  EXPECT_GT(recomputes, 0);  // the plans with differing cuts did recompute
}

TEST(ScheduleCompilerTest, BiPartition_BadRanges_AreInvalidArgument) {
  EXPECT_EQ(CompileBiPartitionPrograms({{0, 2}, {2, 2}}, {{0, 1}, {1, 1}}, 2, 1, Schedule::kGPipe)
                .status()
                .message(),
            "backward ranges cover 1 of 2 units");
  EXPECT_EQ(CompileBiPartitionPrograms({{0, 2}, {2, 2}}, {{0, 2}, {2, 2}}, 2, 1, Schedule::kGPipe)
                .status()
                .message(),
            "worker 1 has neither forward nor backward units");
  EXPECT_EQ(CompileBiPartitionPrograms({{0, 1}, {2, 2}}, {{0, 2}, {2, 2}}, 2, 1, Schedule::kGPipe)
                .status()
                .message(),
            "forward range of worker 1 is [2, 2); ranges must follow each other from unit 0");
}

TEST(ScheduleCompilerTest, BadRanges_AreInvalidArgument) {
  EXPECT_EQ(CompilePrograms({{0, 2}, {3, 4}}, 4, 1, Schedule::kGPipe).status().message(),
            "stage 1 covers [3, 4); stages must be non-empty and contiguous from unit 0");
  EXPECT_EQ(CompilePrograms({{0, 2}}, 4, 1, Schedule::kGPipe).status().message(),
            "stages cover 2 of 4 units");
  EXPECT_EQ(CompilePrograms({{0, 4}}, 4, 0, Schedule::kGPipe).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSchedule("zb").status().message(),
            "unknown schedule 'zb'; use 1f1b or gpipe");
}

}  // namespace
}  // namespace pipetrain

namespace pipetrain {
namespace {

TEST(CompileEvalProgramsTest, ThreeWorkersWithAForwardlessOne_ExactPrograms) {
  // Bi-Partition forward cuts: worker 1 runs no forward pass.
  auto programs = CompileEvalPrograms({{0, 2}, {2, 2}, {2, 4}}, 4, 2).value();
  ASSERT_EQ(programs.size(), 3u);
  EXPECT_EQ(Describe(programs[0]),
            (std::vector<std::string>{
                "validation forward [0, 2) mb 0", "send EVAL_ACTIVATION unit 1 mb 0 to stage 2",
                "validation forward [0, 2) mb 1", "send EVAL_ACTIVATION unit 1 mb 1 to stage 2"}));
  EXPECT_EQ(programs[1].instructions_size(), 0);
  EXPECT_EQ(Describe(programs[2]),
            (std::vector<std::string>{
                "recv EVAL_ACTIVATION unit 1 mb 0 from stage 0", "validation forward [2, 4) mb 0",
                "recv EVAL_ACTIVATION unit 1 mb 1 from stage 0", "validation forward [2, 4) mb 1"}));
}

// LINK_PATH_UNSPECIFIED is read as the wire, but the compiler says so: every
// Send and Recv of the training, Bi-Partition and validation programs is
// LINK_PATH_WIRE until device_links.h moves it.
TEST(ScheduleCompilerTest, EverySendAndRecv_ExplicitlyOnTheWire) {
  std::vector<std::vector<v1::Program>> compiled = {
      CompilePrograms({{0, 2}, {2, 4}}, 4, 3, Schedule::kOneFOneB).value(),
      CompileBiPartitionPrograms({{0, 3}, {3, 4}}, {{0, 1}, {1, 4}}, 4, 1, Schedule::kGPipe)
          .value(),
      CompileEvalPrograms({{0, 2}, {2, 2}, {2, 4}}, 4, 2).value()};
  int transfers = 0;
  for (const std::vector<v1::Program>& programs : compiled) {
    for (const v1::Program& program : programs) {
      for (const v1::Instruction& in : program.instructions()) {
        if (!in.has_send() && !in.has_recv()) continue;
        ++transfers;
        EXPECT_EQ(in.has_send() ? in.send().path() : in.recv().path(), v1::LINK_PATH_WIRE)
            << DescribeInstruction(in);
      }
    }
  }
  EXPECT_EQ(transfers, 16 + 14 + 4);
}

TEST(CompileEvalProgramsTest, BadRangesOrMicroBatches_InvalidArgument) {
  EXPECT_EQ(CompileEvalPrograms({{0, 2}, {3, 4}}, 4, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CompileEvalPrograms({{0, 2}, {2, 3}}, 4, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CompileEvalPrograms({{0, 4}}, 4, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
