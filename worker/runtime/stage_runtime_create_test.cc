// StageRuntime::Create's checks of the program it is given (the
// coordinator's, so untrusted): a Forward, Recompute or Backward whose
// micro-batch is not one of this replica's is INVALID_ARGUMENT naming the
// instruction, instead of a CHECK failure in the dataset (a negative or
// too large one) or training on another replica's samples; so are units
// outside the model, peers outside the stages and validation Forwards
// outside the validation program.
#include <climits>
#include <string>
#include <vector>

#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "worker/runtime/pipeline_testing.h"
#include "worker/runtime/stage_runtime.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

constexpr int kUnits = 6;  // SmallConfig's 2 layers: embed, 4 blocks, head

// `program` with the first instruction of kind `op` (a Recompute is added
// when it has none) set to micro-batch `mb`.
v1::Program WithMicroBatch(v1::Program program, v1::Instruction::OpCase op, int mb) {
  for (v1::Instruction& in : *program.mutable_instructions()) {
    if (in.op_case() != op) continue;
    if (op == v1::Instruction::kForward) in.mutable_forward()->set_micro_batch(mb);
    if (op == v1::Instruction::kBackward) in.mutable_backward()->set_micro_batch(mb);
    return program;
  }
  v1::Instruction::Recompute* r = program.add_instructions()->mutable_recompute();
  r->mutable_units()->set_begin(0);
  r->mutable_units()->set_end(kUnits);
  r->set_micro_batch(mb);
  return program;
}

// Replica 0 of 2 of a one-stage job: SmallConfig's 4 micro-batches per
// step, so this replica's are 0 and 1 (replica 1 trains 2 and 3).
TEST(StageRuntimeCreate, TrainingMicroBatchNotThisReplicas_InvalidArgumentNamingIt) {
  const TrainConfig c = testing::SmallConfig();
  const Dataset data = testing::MakeDataset();
  const std::vector<Range> ranges = {{0, kUnits}};
  const v1::Program program =
      CompilePrograms(ranges, kUnits, /*micro_batches=*/2, Schedule::kOneFOneB).value()[0];
  InProcessFabric fabric(2);
  std::unique_ptr<Transport> transport = fabric.Connect(0);
  StageSetup setup{
      "job-m", c, 0, 1, ToUnitRange(ranges[0]), ToUnitRange(ranges[0]), program, absl::Seconds(30)};
  setup.replicas = 2;
  ASSERT_TRUE(StageRuntime::Create(setup, &data, transport.get()).ok());
  const std::vector<std::pair<v1::Instruction::OpCase, std::string>> ops = {
      {v1::Instruction::kForward, "forward [0, 6)"},
      {v1::Instruction::kBackward, "backward [0, 6)"},
      {v1::Instruction::kRecompute, "recompute [0, 6)"}};
  for (const auto& [op, text] : ops) {
    for (int mb : {-1, 2, 3, 1 << 30}) {  // 2 and 3 are replica 1's
      setup.program = WithMicroBatch(program, op, mb);
      absl::Status created = StageRuntime::Create(setup, &data, transport.get()).status();
      EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument) << text << " mb " << mb;
      EXPECT_NE(created.message().find(absl::StrCat("stage 0: \"", text, " mb ", mb,
                                                    "\" reads training micro-batch ", mb,
                                                    "; this replica's are 0 .. 1")),
                std::string::npos)
          << created;
    }
    setup.program = WithMicroBatch(program, op, 1);
    EXPECT_TRUE(StageRuntime::Create(setup, &data, transport.get()).ok()) << text;
  }
}

// Validation micro-batches are the planner's ceil(eval_windows / rows per
// micro-batch): SmallConfig's 7 windows in micro-batches of 2 rows make 4.
TEST(StageRuntimeCreate, ValidationMicroBatchOutOfRange_InvalidArgumentNamingIt) {
  const TrainConfig c = testing::SmallConfig();
  const Dataset data = testing::MakeDataset();
  const std::vector<Range> ranges = {{0, kUnits}};
  const v1::Program program =
      CompilePrograms(ranges, kUnits, c.micro_batches, Schedule::kOneFOneB).value()[0];
  const v1::Program eval = CompileEvalPrograms(ranges, kUnits, 4).value()[0];
  StageSetup setup{
      "job-m",           c,   0, 1, ToUnitRange(ranges[0]), ToUnitRange(ranges[0]), program,
      absl::Seconds(30), eval};
  ASSERT_TRUE(StageRuntime::Create(setup, &data, nullptr).ok());
  for (int mb : {-1, 4}) {
    setup.eval_program = WithMicroBatch(eval, v1::Instruction::kForward, mb);
    absl::Status created = StageRuntime::Create(setup, &data, nullptr).status();
    EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument) << mb;
    EXPECT_NE(created.message().find(absl::StrCat("stage 0: \"validation forward [0, 6) mb ", mb,
                                                  "\" reads validation micro-batch ", mb,
                                                  "; there are 0 .. 3")),
              std::string::npos)
        << created;
  }
}

// One stage of the whole model, for the checks below.
struct OneStage {
  TrainConfig config = testing::SmallConfig();
  Dataset data = testing::MakeDataset();
  std::vector<Range> ranges = {{0, kUnits}};
  v1::Program program =
      CompilePrograms(ranges, kUnits, config.micro_batches, Schedule::kOneFOneB).value()[0];
  StageSetup setup{"job-u", config,           0, 1, ToUnitRange(ranges[0]), ToUnitRange(ranges[0]),
                   program, absl::Seconds(30)};
  absl::Status Create() { return StageRuntime::Create(setup, &data, nullptr).status(); }
};

// The constructor notes every unit of every Backward: [0, INT_MAX) would
// have allocated a map node per unit until the worker died.
TEST(StageRuntimeCreate, UnitsOutsideTheModel_InvalidArgumentNamingThem) {
  OneStage stage;
  ASSERT_TRUE(stage.Create().ok());
  const std::vector<std::pair<int, int>> bad = {{0, INT_MAX}, {-1, 3}, {4, 3}, {INT_MIN, 1}};
  for (v1::Instruction::OpCase op :
       {v1::Instruction::kForward, v1::Instruction::kBackward, v1::Instruction::kRecompute}) {
    for (const auto& [begin, end] : bad) {
      stage.setup.program = WithMicroBatch(stage.program, op, 0);
      for (v1::Instruction& in : *stage.setup.program.mutable_instructions()) {
        if (in.op_case() != op) continue;
        v1::UnitRange* units =
            op == v1::Instruction::kForward    ? in.mutable_forward()->mutable_units()
            : op == v1::Instruction::kBackward ? in.mutable_backward()->mutable_units()
                                               : in.mutable_recompute()->mutable_units();
        units->set_begin(begin);
        units->set_end(end);
        break;
      }
      const absl::Status created = stage.Create();
      EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument) << op << " " << begin;
      EXPECT_NE(created.message().find(
                    absl::StrCat("names units [", begin, ", ", end, ") outside the 6-unit model")),
                std::string::npos)
          << created;
    }
  }
}

// GlobalWorker's (replica x stages + stage) x tensor ranks would overflow
// for a huge peer, and a wrapped number reaches another worker.
TEST(StageRuntimeCreate, PeerOutsideTheStages_InvalidArgumentNamingIt) {
  const TrainConfig c = testing::SmallConfig();
  const Dataset data = testing::MakeDataset();
  const std::vector<Range> ranges = {{0, 3}, {3, kUnits}};
  const v1::Program program =
      CompilePrograms(ranges, kUnits, c.micro_batches, Schedule::kOneFOneB).value()[0];
  InProcessFabric fabric(2);
  std::unique_ptr<Transport> transport = fabric.Connect(0);
  StageSetup setup{
      "job-p", c, 0, 2, ToUnitRange(ranges[0]), ToUnitRange(ranges[0]), program, absl::Seconds(30)};
  ASSERT_TRUE(StageRuntime::Create(setup, &data, transport.get()).ok());
  for (v1::Instruction::OpCase op : {v1::Instruction::kSend, v1::Instruction::kRecv}) {
    for (int peer : {-1, 2, 1 << 30}) {
      setup.program = program;
      bool changed = false;
      for (v1::Instruction& in : *setup.program.mutable_instructions()) {
        if (in.op_case() != op) continue;
        if (op == v1::Instruction::kSend) in.mutable_send()->set_peer_stage(peer);
        if (op == v1::Instruction::kRecv) in.mutable_recv()->set_peer_stage(peer);
        changed = true;
        break;
      }
      ASSERT_TRUE(changed) << op;
      const absl::Status created = StageRuntime::Create(setup, &data, transport.get()).status();
      EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument) << op << " " << peer;
      EXPECT_NE(created.message().find(
                    absl::StrCat("names peer stage ", peer, "; the stages are 0 .. 1")),
                std::string::npos)
          << created;
    }
  }
  setup.program = program;
  for (const std::vector<int>& group :
       std::vector<std::vector<int>>{{1, 0}, {0, 0}, {0, 2}, {-1}}) {
    setup.optimizer_stages = group;
    const absl::Status created = StageRuntime::Create(setup, &data, transport.get()).status();
    EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument) << created;
    EXPECT_NE(created.message().find("; want distinct stages of 0 .. 1, ascending"),
              std::string::npos)
        << created;
  }
  setup.optimizer_stages = {0, 1};
  EXPECT_TRUE(StageRuntime::Create(setup, &data, transport.get()).ok());
  // With clipping, a stage holding backward units left out of the group
  // (or an empty group) would fail at its first optimizer step.
  setup.train.grad_clip = 1;
  EXPECT_TRUE(StageRuntime::Create(setup, &data, transport.get()).ok());
  for (const std::vector<int>& group : std::vector<std::vector<int>>{{}, {1}}) {
    setup.optimizer_stages = group;
    const absl::Status created = StageRuntime::Create(setup, &data, transport.get()).status();
    EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument) << created;
    EXPECT_NE(created.message().find("leave out stage 0, which holds backward units"),
              std::string::npos)
        << created;
  }
}

// The training iteration runs every instruction: a validation Forward
// there would read validation windows that RunEval alone bounds (past
// them the dataset CHECK-fails). And the validation program computes
// nothing but validation Forwards.
TEST(StageRuntimeCreate, ValidationForwardsOnlyInTheValidationProgram) {
  OneStage stage;
  stage.setup.eval_program = CompileEvalPrograms(stage.ranges, kUnits, 4).value()[0];
  ASSERT_TRUE(stage.Create().ok());
  for (v1::Instruction& in : *stage.setup.program.mutable_instructions()) {
    if (!in.has_forward()) continue;
    in.mutable_forward()->set_validation(true);
    break;
  }
  absl::Status created = stage.Create();
  EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(created.message().find("\" is a validation Forward in the training program"),
            std::string::npos)
      << created;
  stage.setup.program = stage.program;
  for (v1::Instruction::OpCase op :
       {v1::Instruction::kForward, v1::Instruction::kBackward, v1::Instruction::kRecompute}) {
    stage.setup.eval_program = CompileEvalPrograms(stage.ranges, kUnits, 4).value()[0];
    if (op == v1::Instruction::kForward) {
      stage.setup.eval_program.mutable_instructions(0)->mutable_forward()->set_validation(false);
    } else if (op == v1::Instruction::kRecompute) {
      stage.setup.eval_program = WithMicroBatch(stage.setup.eval_program, op, 0);  // appended
    } else {
      v1::Instruction::Backward* b =
          stage.setup.eval_program.add_instructions()->mutable_backward();
      b->mutable_units()->set_begin(0);
      b->mutable_units()->set_end(kUnits);
    }
    created = stage.Create();
    EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument) << op;
    EXPECT_NE(created.message().find("is in the validation program, which holds validation "
                                     "Forwards, Sends and Recvs only"),
              std::string::npos)
        << created;
  }
}

}  // namespace
}  // namespace pipetrain
