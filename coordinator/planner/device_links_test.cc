#include "coordinator/planner/device_links.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/philox.h"
#include "common/program_text.h"
#include "coordinator/planner/compression_marking.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "proto/pipetrain/v1/job.pb.h"

namespace pipetrain {
namespace {

// A model of 3 layers: 8 units (embed, 6 half-layers, head).
constexpr int kUnits = 8;

std::vector<Range> EqualCuts(int stages) {
  std::vector<Range> ranges;
  for (int s = 0; s < stages; ++s) {
    ranges.push_back({s * kUnits / stages, (s + 1) * kUnits / stages});
  }
  return ranges;
}

std::vector<v1::Program> Compile(int stages, Schedule schedule, int micro_batches) {
  return CompilePrograms(EqualCuts(stages), kUnits, micro_batches, schedule).value();
}

v1::CompressionSpec Compression(const std::string& forward, const std::string& backward,
                                bool epilogue_only) {
  v1::CompressionSpec c;
  c.set_forward(forward);
  c.set_backward(backward);
  c.set_epilogue_only(epilogue_only);
  return c;
}

// Stage s on `host`, GPU s, with id "id-s".
std::vector<DeviceLinkMember> OneHost(int stages, const std::string& host = "h") {
  std::vector<DeviceLinkMember> members;
  for (int s = 0; s < stages; ++s) members.push_back({host, s, "id-" + std::to_string(s)});
  return members;
}

bool IsActivationKind(v1::TensorKind kind) {
  return kind == v1::TENSOR_KIND_ACTIVATION || kind == v1::TENSOR_KIND_ACTIVATION_GRAD;
}

// The program's sends and receives, each with " DEVICE" appended when it
// travels on the device.
std::vector<std::string> Transfers(const v1::Program& program) {
  std::vector<std::string> out;
  for (const v1::Instruction& in : program.instructions()) {
    if (!in.has_send() && !in.has_recv()) continue;
    const bool device = in.has_send() ? in.send().path() == v1::LINK_PATH_DEVICE
                                      : in.recv().path() == v1::LINK_PATH_DEVICE;
    out.push_back(DescribeInstruction(in) + (device ? " DEVICE" : ""));
  }
  return out;
}

v1::LinkPath PathOf(const v1::Instruction& in) {
  return in.has_send() ? in.send().path() : in.recv().path();
}

int PeerOf(const v1::Instruction& in) {
  return in.has_send() ? in.send().peer_stage() : in.recv().peer_stage();
}

const v1::TensorKey& TensorOf(const v1::Instruction& in) {
  return in.has_send() ? in.send().tensor() : in.recv().tensor();
}

// Counts of DEVICE and WIRE transfers of stage `s` with `peer` (-1: any).
std::pair<int, int> DeviceAndWire(const v1::Program& program, int peer = -1) {
  int device = 0, wire = 0;
  for (const v1::Instruction& in : program.instructions()) {
    if (!in.has_send() && !in.has_recv()) continue;
    if (peer >= 0 && PeerOf(in) != peer) continue;
    (PathOf(in) == v1::LINK_PATH_DEVICE ? device : wire)++;
  }
  return {device, wire};
}

using OrderedPairs = std::vector<std::pair<int, int>>;

std::vector<int> Stages(const v1::DeviceGroup& group) {
  return std::vector<int>(group.stages().begin(), group.stages().end());
}

TEST(PlanDeviceLinks, OneHostDistinctGpus_EveryActivationTransferIsDevice) {
  for (int stages = 2; stages <= 4; ++stages) {
    for (Schedule schedule : {Schedule::kOneFOneB, Schedule::kGPipe}) {
      SCOPED_TRACE(ScheduleName(schedule) + ", " + std::to_string(stages) + " stages");
      std::vector<v1::Program> programs = Compile(stages, schedule, 4);
      MarkCompression(Compression("none", "none", false), &programs);
      const DeviceLinkPlan plan = PlanDeviceLinks(OneHost(stages), &programs);
      ASSERT_EQ(plan.groups.size(), 1u);
      std::vector<int> all(stages);
      for (int s = 0; s < stages; ++s) all[s] = s;
      EXPECT_EQ(Stages(plan.groups[0].group), all);
      EXPECT_EQ(plan.groups[0].group.nccl_unique_id(), "id-0");
      EXPECT_EQ(plan.groups[0].id_owner_stage, 0);
      EXPECT_EQ(plan.group_of_stage, std::vector<int>(stages, 0));
      EXPECT_TRUE(plan.order_differs.empty());
      OrderedPairs links, expected_links;
      for (const v1::DeviceLink& l : plan.groups[0].group.links()) {
        links.push_back({l.from_stage(), l.to_stage()});
      }
      for (int s = 0; s + 1 < stages; ++s) {
        expected_links.push_back({s, s + 1});
        expected_links.push_back({s + 1, s});
      }
      std::sort(expected_links.begin(), expected_links.end());
      EXPECT_EQ(links, expected_links);
      int device = 0;
      for (const v1::Program& p : programs) {
        for (const v1::Instruction& in : p.instructions()) {
          if (!in.has_send() && !in.has_recv()) continue;
          const bool activation = IsActivationKind(TensorOf(in).kind());
          EXPECT_EQ(PathOf(in), activation ? v1::LINK_PATH_DEVICE : v1::LINK_PATH_WIRE)
              << DescribeInstruction(in);
          device += activation;
        }
      }
      // Per boundary and micro-batch: an activation and its gradient, each
      // a send and a receive.
      EXPECT_EQ(device, (stages - 1) * 4 * 4);
    }
  }
}

// The paper's plan (bipartition.txt Fig. 7, 0-based): worker 0 runs F{0}
// B{0,1}, worker 1 F{1,2} B{2}, worker 2 F{3} B{3}: worker 0 recomputes
// unit 1 and sends its weights to worker 1 after the step.
TEST(PlanDeviceLinks, BiPartitionPaperPlan_ActivationsOnDeviceWeightsAndTiedOnWire) {
  auto programs = CompileBiPartitionPrograms({{0, 1}, {1, 3}, {3, 4}}, {{0, 2}, {2, 3}, {3, 4}}, 4,
                                             1, Schedule::kGPipe)
                      .value();
  const DeviceLinkPlan plan = PlanDeviceLinks(OneHost(3), &programs);
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_EQ(Stages(plan.groups[0].group), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(Transfers(programs[0]),
            (std::vector<std::string>{"send ACTIVATION unit 0 mb 0 to stage 1 DEVICE",
                                      "recv ACTIVATION_GRAD unit 2 mb 0 from stage 1 DEVICE",
                                      "send TIED_EMBEDDING_GRAD unit 0 mb -1 to stage 2",
                                      "recv TIED_EMBEDDING_GRAD unit 0 mb -1 from stage 2",
                                      "send UNIT_WEIGHTS unit 1 mb -1 to stage 1"}));
  EXPECT_EQ(Transfers(programs[1]),
            (std::vector<std::string>{"recv ACTIVATION unit 0 mb 0 from stage 0 DEVICE",
                                      "send ACTIVATION unit 2 mb 0 to stage 2 DEVICE",
                                      "recv ACTIVATION_GRAD unit 3 mb 0 from stage 2 DEVICE",
                                      "send ACTIVATION_GRAD unit 2 mb 0 to stage 0 DEVICE",
                                      "recv UNIT_WEIGHTS unit 1 mb -1 from stage 0"}));
}

// Units 1-2 run forward on worker 0 and backward on worker 1, which
// recomputes them from unit 0's output, routed to it. With 1F1B and 3
// micro-batches worker 0 sends each routed input right after its forward,
// and worker 1 receives them in the same order: all on the device.
TEST(PlanDeviceLinks, BiPartitionRoutedInput_SameOrderGoesOnDevice) {
  auto programs =
      CompileBiPartitionPrograms({{0, 3}, {3, 4}}, {{0, 1}, {1, 4}}, 4, 3, Schedule::kOneFOneB)
          .value();
  const DeviceLinkPlan plan = PlanDeviceLinks(OneHost(2), &programs);
  ASSERT_EQ(plan.groups.size(), 1u);
  // Per micro-batch, 0 -> 1: the activation of unit 2 and the routed input
  // (unit 0), 1 -> 0: one gradient; each a send and a receive.
  EXPECT_EQ(DeviceAndWire(programs[0]), std::make_pair(3 * 3, 2 + 2));  // tied x2, weights x2
  EXPECT_EQ(DeviceAndWire(programs[1]), std::make_pair(3 * 3, 2 + 2));
  bool recomputes = false;
  for (const auto& in : programs[1].instructions()) recomputes |= in.has_recompute();
  EXPECT_TRUE(recomputes);
}

// The same plan under GPipe: worker 0 sends each micro-batch's activation
// and routed input together during the forwards, but worker 1 takes the
// routed inputs only in its backward phase. NCCL would match them in the
// wrong order, so 0 -> 1 stays on the wire; the gradients 1 -> 0 do not.
TEST(PlanDeviceLinks, BiPartitionRoutedInputGPipe_OrderDiffersSoActivationsStayOnWire) {
  auto programs =
      CompileBiPartitionPrograms({{0, 3}, {3, 4}}, {{0, 1}, {1, 4}}, 4, 2, Schedule::kGPipe)
          .value();
  const DeviceLinkPlan plan = PlanDeviceLinks(OneHost(2), &programs);
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_EQ(Stages(plan.groups[0].group), (std::vector<int>{0, 1}));
  EXPECT_EQ(plan.order_differs, (OrderedPairs{{0, 1}}));
  EXPECT_EQ(Transfers(programs[1]),
            (std::vector<std::string>{"recv ACTIVATION unit 2 mb 0 from stage 0",
                                      "recv ACTIVATION unit 2 mb 1 from stage 0",
                                      "recv ACTIVATION unit 0 mb 0 from stage 0",
                                      "send ACTIVATION_GRAD unit 1 mb 0 to stage 0 DEVICE",
                                      "recv ACTIVATION unit 0 mb 1 from stage 0",
                                      "send ACTIVATION_GRAD unit 1 mb 1 to stage 0 DEVICE",
                                      "send TIED_EMBEDDING_GRAD unit 0 mb -1 to stage 0",
                                      "recv TIED_EMBEDDING_GRAD unit 0 mb -1 from stage 0",
                                      "send UNIT_WEIGHTS unit 1 mb -1 to stage 0",
                                      "send UNIT_WEIGHTS unit 2 mb -1 to stage 0"}));
  EXPECT_EQ(DeviceAndWire(programs[0]), std::make_pair(2, 4 + 2 + 2));
}

// Backward codec only: gradients stay on the wire (compressed host
// payloads), activations go on the device.
TEST(PlanDeviceLinks, CompressedBackward_GradientsStayOnWireActivationsOnDevice) {
  std::vector<v1::Program> programs = Compile(3, Schedule::kOneFOneB, 4);
  MarkCompression(Compression("none", "fp16", false), &programs);
  const DeviceLinkPlan plan = PlanDeviceLinks(OneHost(3), &programs);
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_EQ(Stages(plan.groups[0].group), (std::vector<int>{0, 1, 2}));
  int device = 0;
  for (const v1::Program& p : programs) {
    for (const v1::Instruction& in : p.instructions()) {
      if (!in.has_send() && !in.has_recv()) continue;
      EXPECT_EQ(PathOf(in), TensorOf(in).kind() == v1::TENSOR_KIND_ACTIVATION ? v1::LINK_PATH_DEVICE
                                                                              : v1::LINK_PATH_WIRE)
          << DescribeInstruction(in);
      if (PathOf(in) == v1::LINK_PATH_DEVICE) ++device;
    }
  }
  EXPECT_EQ(device, 2 * 2 * 4);  // 2 boundaries x 4 micro-batches, a send and a receive each
}

// epilogue_only: the cool-down gradients are compressed (wire), the earlier
// ones raw (device); one ordered pair then uses both paths.
TEST(PlanDeviceLinks, EpilogueOnlyCompression_SplitsAPairBetweenPaths) {
  std::vector<v1::Program> programs = Compile(4, Schedule::kOneFOneB, 6);
  MarkCompression(Compression("none", "fp16", true), &programs);
  PlanDeviceLinks(OneHost(4), &programs);
  for (int s = 1; s < 4; ++s) {
    int raw = 0, compressed = 0;
    for (const v1::Instruction& in : programs[s].instructions()) {
      if (!in.has_send() || in.send().tensor().kind() != v1::TENSOR_KIND_ACTIVATION_GRAD) continue;
      const bool on_device = in.send().path() == v1::LINK_PATH_DEVICE;
      EXPECT_EQ(on_device, in.send().codec().empty()) << DescribeInstruction(in);
      (on_device ? raw : compressed)++;
    }
    EXPECT_EQ(compressed, 4 - s) << "stage " << s;  // its cool-down
    EXPECT_EQ(raw, 6 - (4 - s)) << "stage " << s;
    // The receiver marks exactly the same micro-batches.
    for (const v1::Instruction& in : programs[s - 1].instructions()) {
      if (!in.has_recv() || in.recv().tensor().kind() != v1::TENSOR_KIND_ACTIVATION_GRAD) continue;
      EXPECT_EQ(in.recv().path() == v1::LINK_PATH_DEVICE,
                in.recv().tensor().micro_batch() < 6 - (4 - s))
          << DescribeInstruction(in);
    }
  }
}

TEST(PlanDeviceLinks, TwoHosts_TwoGroupsAndCrossHostLinkOnWire) {
  std::vector<v1::Program> programs = Compile(4, Schedule::kOneFOneB, 4);
  std::vector<DeviceLinkMember> members = {
      {"a", 0, "id-a0"}, {"a", 1, "id-a1"}, {"b", 0, "id-b0"}, {"b", 1, "id-b1"}};
  const DeviceLinkPlan plan = PlanDeviceLinks(members, &programs);
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(Stages(plan.groups[0].group), (std::vector<int>{0, 1}));
  EXPECT_EQ(plan.groups[0].group.nccl_unique_id(), "id-a0");
  EXPECT_EQ(plan.groups[0].id_owner_stage, 0);
  EXPECT_EQ(Stages(plan.groups[1].group), (std::vector<int>{2, 3}));
  EXPECT_EQ(plan.groups[1].group.nccl_unique_id(), "id-b0");
  EXPECT_EQ(plan.groups[1].id_owner_stage, 2);
  EXPECT_EQ(plan.group_of_stage, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(DeviceAndWire(programs[1], 0), std::make_pair(8, 0));
  EXPECT_EQ(DeviceAndWire(programs[1], 2), std::make_pair(0, 8));
  EXPECT_EQ(DeviceAndWire(programs[2], 1), std::make_pair(0, 8));
  EXPECT_EQ(DeviceAndWire(programs[2], 3), std::make_pair(8, 0));
}

// Stage 2 shares GPU 1 with stage 1, which keeps it; stage 3 is then a
// candidate whose only neighbour (stage 2) is out, so it has no device link
// and is dropped from the group.
TEST(PlanDeviceLinks, SharedGpu_HigherStageStaysOutAndUnlinkedStageIsDropped) {
  std::vector<v1::Program> programs = Compile(4, Schedule::kGPipe, 2);
  std::vector<DeviceLinkMember> members = {
      {"h", 0, "id-0"}, {"h", 1, "id-1"}, {"h", 1, "id-2"}, {"h", 2, "id-3"}};
  const DeviceLinkPlan plan = PlanDeviceLinks(members, &programs);
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_EQ(Stages(plan.groups[0].group), (std::vector<int>{0, 1}));
  EXPECT_EQ(plan.group_of_stage, (std::vector<int>{0, 0, -1, -1}));
  EXPECT_EQ(DeviceAndWire(programs[1], 0), std::make_pair(4, 0));
  EXPECT_EQ(DeviceAndWire(programs[2]), std::make_pair(0, 8));
  EXPECT_EQ(DeviceAndWire(programs[3]).first, 0);
}

// Workers isolated by CUDA_VISIBLE_DEVICES all report ordinal 0; their PCI
// addresses say the GPUs differ, so they group. One GPU seen as ordinal 1
// by one worker and 2 by another is one GPU. A worker without an address
// (an older build) is compared by ordinal with everyone.
TEST(PlanDeviceLinks, PciBusIds_DecideOverOrdinals) {
  {
    std::vector<v1::Program> programs = Compile(3, Schedule::kOneFOneB, 2);
    std::vector<DeviceLinkMember> members = {{"h", 0, "id-0", "0000:3B:00.0"},
                                             {"h", 0, "id-1", "0000:5E:00.0"},
                                             {"h", 0, "id-2", "0000:86:00.0"}};
    const DeviceLinkPlan plan = PlanDeviceLinks(members, &programs);
    ASSERT_EQ(plan.groups.size(), 1u);
    EXPECT_EQ(Stages(plan.groups[0].group), (std::vector<int>{0, 1, 2}));
  }
  {
    std::vector<v1::Program> programs = Compile(3, Schedule::kOneFOneB, 2);
    std::vector<DeviceLinkMember> members = {{"h", 0, "id-0", "0000:3B:00.0"},
                                             {"h", 1, "id-1", "0000:5E:00.0"},
                                             {"h", 2, "id-2", "0000:5E:00.0"}};
    const DeviceLinkPlan plan = PlanDeviceLinks(members, &programs);
    ASSERT_EQ(plan.groups.size(), 1u);
    EXPECT_EQ(Stages(plan.groups[0].group), (std::vector<int>{0, 1}));  // 2 shares 5E
    EXPECT_EQ(plan.group_of_stage, (std::vector<int>{0, 0, -1}));
  }
  {
    // Stage 1 has no address and ordinal 0, like stage 0: maybe one GPU.
    std::vector<v1::Program> programs = Compile(3, Schedule::kOneFOneB, 2);
    std::vector<DeviceLinkMember> members = {
        {"h", 0, "id-0", "0000:3B:00.0"}, {"h", 0, "id-1", ""}, {"h", 1, "id-2", "0000:5E:00.0"}};
    const DeviceLinkPlan plan = PlanDeviceLinks(members, &programs);
    EXPECT_EQ(plan.group_of_stage[1], -1);
  }
  EXPECT_TRUE(SameGpu({"h", 3, "id", ""}, {"h", 3, "id", "0000:3B:00.0"}));
  EXPECT_FALSE(SameGpu({"h", 3, "id", "0000:5E:00.0"}, {"h", 3, "id", "0000:3B:00.0"}));
  EXPECT_TRUE(SameGpu({"h", 2, "id", "0000:3B:00.0"}, {"h", 3, "id", "0000:3B:00.0"}));
}

TEST(PlanDeviceLinks, MissingIdOrHost_StageStaysOut) {
  for (bool drop_id : {true, false}) {
    std::vector<v1::Program> programs = Compile(4, Schedule::kOneFOneB, 3);
    std::vector<DeviceLinkMember> members = OneHost(4);
    if (drop_id) {
      members[0].nccl_unique_id.clear();
    } else {
      members[0].host.clear();
    }
    const DeviceLinkPlan plan = PlanDeviceLinks(members, &programs);
    ASSERT_EQ(plan.groups.size(), 1u);
    EXPECT_EQ(Stages(plan.groups[0].group), (std::vector<int>{1, 2, 3}));
    // The lowest member's id, stage 1's.
    EXPECT_EQ(plan.groups[0].group.nccl_unique_id(), "id-1");
    EXPECT_EQ(plan.groups[0].id_owner_stage, 1);
    EXPECT_EQ(DeviceAndWire(programs[0]).first, 0);
    EXPECT_EQ(DeviceAndWire(programs[1], 0), std::make_pair(0, 6));
  }
}

TEST(PlanDeviceLinks, NoEligibleStages_NoGroupAndAllWire) {
  std::vector<v1::Program> programs = Compile(3, Schedule::kOneFOneB, 2);
  std::vector<DeviceLinkMember> members(3);  // no host, no id
  const DeviceLinkPlan plan = PlanDeviceLinks(members, &programs);
  EXPECT_TRUE(plan.groups.empty());
  EXPECT_EQ(plan.group_of_stage, std::vector<int>(3, -1));
  for (const v1::Program& p : programs) EXPECT_EQ(DeviceAndWire(p).first, 0);
}

// Stage 2 receives micro-batch 1's activation before micro-batch 0's; stage
// 1 sends them the other way round. Only the pair 1 -> 2 falls back.
TEST(PlanDeviceLinks, ReceiveOrderDiffersFromSendOrder_OnlyThatPairStaysOnWire) {
  std::vector<v1::Program> programs = Compile(3, Schedule::kGPipe, 3);
  std::vector<v1::Instruction::Recv*> from_1;
  for (v1::Instruction& in : *programs[2].mutable_instructions()) {
    if (in.has_recv() && in.recv().peer_stage() == 1) from_1.push_back(in.mutable_recv());
  }
  ASSERT_EQ(from_1.size(), 3u);
  ASSERT_EQ(from_1[0]->tensor().micro_batch(), 0);
  std::swap(*from_1[0]->mutable_tensor(), *from_1[1]->mutable_tensor());
  const DeviceLinkPlan plan = PlanDeviceLinks(OneHost(3), &programs);
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_EQ(Stages(plan.groups[0].group), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(plan.order_differs, (OrderedPairs{{1, 2}}));
  for (int s = 0; s < 3; ++s) {
    for (const v1::Instruction& in : programs[s].instructions()) {
      if (!in.has_send() && !in.has_recv()) continue;
      const bool one_to_two = (s == 1 && in.has_send() && PeerOf(in) == 2) ||
                              (s == 2 && in.has_recv() && PeerOf(in) == 1);
      const bool expect_device = IsActivationKind(TensorOf(in).kind()) && !one_to_two;
      EXPECT_EQ(PathOf(in) == v1::LINK_PATH_DEVICE, expect_device)
          << "stage " << s << ": " << DescribeInstruction(in);
    }
  }
  EXPECT_EQ(DeviceAndWire(programs[2], 1), std::make_pair(3, 3));  // gradients back: device
}

// A receive of a tensor the peer never sends as device-eligible (here: one
// the sender does not send at all) makes the key sequences differ.
TEST(PlanDeviceLinks, SenderSendsATensorTheReceiverNeverReceives_PairStaysOnWire) {
  std::vector<v1::Program> programs = Compile(2, Schedule::kGPipe, 2);
  // Drop stage 1's receive of micro-batch 1's activation.
  auto* instructions = programs[1].mutable_instructions();
  for (int i = 0; i < instructions->size(); ++i) {
    const v1::Instruction& in = instructions->Get(i);
    if (in.has_recv() && in.recv().tensor().kind() == v1::TENSOR_KIND_ACTIVATION &&
        in.recv().tensor().micro_batch() == 1) {
      instructions->DeleteSubrange(i, 1);
      break;
    }
  }
  const DeviceLinkPlan plan = PlanDeviceLinks(OneHost(2), &programs);
  ASSERT_EQ(plan.groups.size(), 1u);  // the gradients still link them
  EXPECT_EQ(plan.order_differs, (OrderedPairs{{0, 1}}));
  // Stage 0: activations out on the wire, gradients in on the device, the
  // tied gradient both ways on the wire; stage 1 the other side of it.
  EXPECT_EQ(DeviceAndWire(programs[0], 1), std::make_pair(2, 2 + 2));
  EXPECT_EQ(DeviceAndWire(programs[1], 0), std::make_pair(2, 1 + 2));
}

TEST(PlanDeviceLinks, RunTwice_SameResultAndStaleMarksCleared) {
  std::vector<v1::Program> programs = Compile(4, Schedule::kOneFOneB, 4);
  const std::vector<DeviceLinkMember> members = {
      {"a", 0, "id-a0"}, {"a", 1, "id-a1"}, {"b", 0, "id-b0"}, {"b", 1, "id-b1"}};
  const DeviceLinkPlan first = PlanDeviceLinks(members, &programs);
  std::vector<v1::Program> once = programs;
  const DeviceLinkPlan second = PlanDeviceLinks(members, &programs);
  ASSERT_EQ(first.groups.size(), second.groups.size());
  for (size_t g = 0; g < first.groups.size(); ++g) {
    EXPECT_EQ(first.groups[g].group.SerializeAsString(),
              second.groups[g].group.SerializeAsString());
    EXPECT_EQ(first.groups[g].id_owner_stage, second.groups[g].id_owner_stage);
  }
  EXPECT_EQ(first.group_of_stage, second.group_of_stage);
  for (size_t s = 0; s < programs.size(); ++s) {
    EXPECT_EQ(programs[s].SerializeAsString(), once[s].SerializeAsString());
  }
  // Without ids, every mark of the earlier run is gone.
  const DeviceLinkPlan none = PlanDeviceLinks(std::vector<DeviceLinkMember>(4), &programs);
  EXPECT_TRUE(none.groups.empty());
  const std::vector<v1::Program> fresh = Compile(4, Schedule::kOneFOneB, 4);
  for (size_t s = 0; s < programs.size(); ++s) {
    EXPECT_EQ(programs[s].SerializeAsString(), fresh[s].SerializeAsString());
  }
}

// Two replicas of 3 stages on one host, GPUs 0-5 (worker g = r * 3 + s):
// each replica's stages form a group of their own, numbered by worker, and
// the shared programs carry the marks both replicas agree on. Replica 1's
// group takes its id from its second member, so that stage position 0
// keeps a free id (worker 3's) for a replica device group.
TEST(PlanReplicatedDeviceLinks, TwoReplicasOnOneHost_AGroupPerReplicaByWorker) {
  std::vector<v1::Program> programs = Compile(3, Schedule::kOneFOneB, 4);
  std::vector<v1::Program> one_replica = programs;
  PlanDeviceLinks(OneHost(3), &one_replica);
  const ReplicatedDeviceLinkPlan plan = PlanReplicatedDeviceLinks(OneHost(6), 2, &programs);
  EXPECT_FALSE(plan.replicas_differ);
  ASSERT_EQ(plan.links.groups.size(), 2u);
  EXPECT_EQ(Stages(plan.links.groups[0].group), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(Stages(plan.links.groups[1].group), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(plan.links.groups[0].id_owner_stage, 0);
  EXPECT_EQ(plan.links.groups[0].group.nccl_unique_id(), "id-0");
  EXPECT_EQ(plan.links.groups[1].id_owner_stage, 4);
  EXPECT_EQ(plan.links.groups[1].group.nccl_unique_id(), "id-4");
  EXPECT_EQ(plan.links.group_of_stage, (std::vector<int>{0, 0, 0, 1, 1, 1}));
  OrderedPairs links;
  for (const v1::DeviceLink& l : plan.links.groups[1].group.links()) {
    links.push_back({l.from_stage(), l.to_stage()});
  }
  EXPECT_EQ(links, (OrderedPairs{{3, 4}, {4, 3}, {4, 5}, {5, 4}}));
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(Transfers(programs[s]), Transfers(one_replica[s])) << "stage " << s;
  }
  EXPECT_EQ(DeviceAndWire(programs[1], 0), std::make_pair(8, 0));
}

// Replica 1's stages 1 and 2 on another host: replica 0 would put the link
// 1 <-> 2 on the device and replica 1 could not, so the shared programs
// keep every path on the wire and no group forms.
TEST(PlanReplicatedDeviceLinks, ReplicasThatWouldMarkDifferently_AllOnTheWire) {
  std::vector<v1::Program> programs = Compile(3, Schedule::kOneFOneB, 4);
  std::vector<DeviceLinkMember> members = OneHost(6);
  members[5].host = "other";
  members[5].nccl_unique_id = "id-other";
  const ReplicatedDeviceLinkPlan plan = PlanReplicatedDeviceLinks(members, 2, &programs);
  EXPECT_TRUE(plan.replicas_differ);
  EXPECT_TRUE(plan.links.groups.empty());
  EXPECT_EQ(plan.links.group_of_stage, std::vector<int>(6, -1));
  for (const v1::Program& p : programs) EXPECT_EQ(DeviceAndWire(p).first, 0);
}

// One replica is PlanDeviceLinks, owner and all.
TEST(PlanReplicatedDeviceLinks, OneReplica_IsPlanDeviceLinks) {
  std::vector<v1::Program> programs = Compile(3, Schedule::kGPipe, 4);
  std::vector<v1::Program> plain = programs;
  const DeviceLinkPlan want = PlanDeviceLinks(OneHost(3), &plain);
  const ReplicatedDeviceLinkPlan got = PlanReplicatedDeviceLinks(OneHost(3), 1, &programs);
  ASSERT_EQ(got.links.groups.size(), want.groups.size());
  EXPECT_EQ(got.links.groups[0].group.SerializeAsString(),
            want.groups[0].group.SerializeAsString());
  EXPECT_EQ(got.links.group_of_stage, want.group_of_stage);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(Transfers(programs[s]), Transfers(plain[s]));
}

TEST(PlanDeviceLinksDeathTest, MembersAndProgramsDiffer_Aborts) {
  std::vector<v1::Program> programs = Compile(2, Schedule::kGPipe, 1);
  EXPECT_DEATH(PlanDeviceLinks(OneHost(3), &programs), "3 members for 2 programs");
}

// ------------------------------------------------------ Randomized check

// Deterministic draws: a pure function of (instance, counter).
class Draws {
 public:
  explicit Draws(uint32_t instance) : instance_(instance) {}
  int Below(int bound) {
    return static_cast<int>(UniformIndex(0x5eed, instance_, counter_++, 0, bound));
  }
  bool OneIn(int n) { return Below(n) == 0; }

 private:
  uint32_t instance_;
  uint32_t counter_ = 0;
};

// Ranges that follow each other from 0 to kUnits, cut at random.
std::vector<Range> RandomCuts(Draws& draws, int stages) {
  std::vector<int> cuts;
  for (int s = 0; s + 1 < stages; ++s) cuts.push_back(draws.Below(kUnits + 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<Range> ranges;
  int begin = 0;
  for (int cut : cuts) {
    ranges.push_back({begin, cut});
    begin = cut;
  }
  ranges.push_back({begin, kUnits});
  return ranges;
}

std::vector<v1::Program> RandomPrograms(Draws& draws, int stages) {
  for (;;) {
    const std::vector<Range> forward = RandomCuts(draws, stages);
    const std::vector<Range> backward = draws.OneIn(2) ? forward : RandomCuts(draws, stages);
    if (!ValidateBiPartitionRanges(forward, backward, kUnits).ok()) continue;
    const Schedule schedule = draws.OneIn(2) ? Schedule::kGPipe : Schedule::kOneFOneB;
    return CompileBiPartitionPrograms(forward, backward, kUnits, 1 + draws.Below(4), schedule)
        .value();
  }
}

// Shuffles the receives of one stage from one peer among their positions.
void ShuffleSomeReceives(Draws& draws, std::vector<v1::Program>* programs) {
  const int stages = static_cast<int>(programs->size());
  const int b = draws.Below(stages), a = draws.Below(stages);
  std::vector<v1::TensorKey*> keys;
  for (v1::Instruction& in : *(*programs)[b].mutable_instructions()) {
    if (in.has_recv() && in.recv().peer_stage() == a)
      keys.push_back(in.mutable_recv()->mutable_tensor());
  }
  for (int i = static_cast<int>(keys.size()) - 1; i > 0; --i) {
    std::swap(*keys[i], *keys[draws.Below(i + 1)]);
  }
}

// Stale marks, which the pass must clear.
void MarkSomeAtRandom(Draws& draws, std::vector<v1::Program>* programs) {
  for (v1::Program& p : *programs) {
    for (v1::Instruction& in : *p.mutable_instructions()) {
      if (!draws.OneIn(3)) continue;
      if (in.has_send()) in.mutable_send()->set_path(v1::LINK_PATH_DEVICE);
      if (in.has_recv()) in.mutable_recv()->set_path(v1::LINK_PATH_DEVICE);
    }
  }
}

// The rules restated independently of the implementation: whether stage s
// may be in a group at all (host and id present, and no lower eligible
// stage on its host may hold its GPU: the same PCI address, or the same
// ordinal when either has no address; a stage left out holds no GPU of a
// group, so it rules out no other).
std::vector<bool> Eligible(const std::vector<DeviceLinkMember>& members) {
  std::vector<bool> eligible(members.size());
  auto basic = [&](size_t s) {
    return !members[s].host.empty() && !members[s].nccl_unique_id.empty();
  };
  for (size_t s = 0; s < members.size(); ++s) {
    eligible[s] = basic(s);
    for (size_t t = 0; t < s && eligible[s]; ++t) {
      const bool both_addressed =
          !members[s].gpu_pci_bus_id.empty() && !members[t].gpu_pci_bus_id.empty();
      const bool same_gpu = both_addressed
                                ? members[t].gpu_pci_bus_id == members[s].gpu_pci_bus_id
                                : members[t].gpu_index == members[s].gpu_index;
      if (eligible[t] && members[t].host == members[s].host && same_gpu) {
        eligible[s] = false;
      }
    }
  }
  return eligible;
}

using Key = std::tuple<int, int, int>;
Key KeyOf(const v1::TensorKey& t) { return {t.kind(), t.micro_batch(), t.unit()}; }

struct PairCheck {
  bool matchable = false;  // non-empty, and the receiver takes the sends in order
  int device_sends = 0, device_recvs = 0, eligible_sends = 0, eligible_recvs = 0;
};

// Ordered pair a -> b: finds, for each raw activation send of a to b, the
// position of b's receive of that tensor from a; matchable when each is
// found once, positions increase, and b receives nothing else of those.
PairCheck CheckPair(const std::vector<v1::Program>& programs, int a, int b) {
  PairCheck check;
  std::vector<Key> sent;
  for (const v1::Instruction& in : programs[a].instructions()) {
    if (!in.has_send() || in.send().peer_stage() != b) continue;
    const bool eligible = IsActivationKind(in.send().tensor().kind()) && in.send().codec().empty();
    if (eligible) sent.push_back(KeyOf(in.send().tensor()));
    check.eligible_sends += eligible;
    check.device_sends += in.send().path() == v1::LINK_PATH_DEVICE;
  }
  std::multimap<Key, int> position;  // b's receives from a
  int index = 0;
  for (const v1::Instruction& in : programs[b].instructions()) {
    if (!in.has_recv() || in.recv().peer_stage() != a) continue;
    position.emplace(KeyOf(in.recv().tensor()), index++);
    check.device_recvs += in.recv().path() == v1::LINK_PATH_DEVICE;
  }
  check.matchable = !sent.empty();
  int last = -1;
  for (const Key& key : sent) {
    check.eligible_recvs += static_cast<int>(position.count(key));
    if (position.count(key) != 1 || position.find(key)->second <= last) {
      check.matchable = false;
    } else {
      last = position.find(key)->second;
    }
  }
  check.matchable = check.matchable && check.eligible_recvs == static_cast<int>(sent.size());
  return check;
}

// The keys of a's DEVICE sends to b and of b's DEVICE receives from a.
std::pair<std::vector<Key>, std::vector<Key>> DeviceKeys(const std::vector<v1::Program>& programs,
                                                         int a, int b) {
  std::vector<Key> sent, received;
  for (const v1::Instruction& in : programs[a].instructions()) {
    if (in.has_send() && in.send().peer_stage() == b && in.send().path() == v1::LINK_PATH_DEVICE) {
      sent.push_back(KeyOf(in.send().tensor()));
    }
  }
  for (const v1::Instruction& in : programs[b].instructions()) {
    if (in.has_recv() && in.recv().peer_stage() == a && in.recv().path() == v1::LINK_PATH_DEVICE) {
      received.push_back(KeyOf(in.recv().tensor()));
    }
  }
  return {sent, received};
}

void CheckGroups(const std::vector<DeviceLinkMember>& members,
                 const std::vector<v1::Program>& programs, const DeviceLinkPlan& plan) {
  const int stages = static_cast<int>(members.size());
  ASSERT_EQ(static_cast<int>(plan.group_of_stage.size()), stages);
  int previous_lowest = -1;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const std::vector<int> group = Stages(plan.groups[g].group);
    ASSERT_GE(group.size(), 2u);
    EXPECT_TRUE(std::is_sorted(group.begin(), group.end()));
    EXPECT_GT(group[0], previous_lowest);
    previous_lowest = group[0];
    EXPECT_EQ(plan.groups[g].id_owner_stage, group[0]);
    EXPECT_EQ(plan.groups[g].group.nccl_unique_id(), members[group[0]].nccl_unique_id);
    for (size_t r = 0; r < group.size(); ++r) {
      const int s = group[r];
      EXPECT_EQ(plan.group_of_stage[s], static_cast<int>(g));
      EXPECT_EQ(members[s].host, members[group[0]].host);
      for (size_t q = 0; q < r; ++q) {
        const DeviceLinkMember& other = members[group[q]];
        if (!other.gpu_pci_bus_id.empty() && !members[s].gpu_pci_bus_id.empty()) {
          EXPECT_NE(other.gpu_pci_bus_id, members[s].gpu_pci_bus_id);  // distinct GPUs
        } else {
          EXPECT_NE(other.gpu_index, members[s].gpu_index);
        }
      }
    }
  }
  for (int s = 0; s < stages; ++s) {
    const bool has_device = DeviceAndWire(programs[s]).first > 0;
    EXPECT_EQ(plan.group_of_stage[s] >= 0, has_device) << "stage " << s;
  }
  // Each group lists exactly its ordered pairs with DEVICE sends, by sender
  // then receiver (every member splits a communicator per link in this order).
  std::vector<OrderedPairs> expected_links(plan.groups.size());
  for (int a = 0; a < stages; ++a) {
    for (int b = 0; b < stages; ++b) {
      if (a != b && !DeviceKeys(programs, a, b).first.empty()) {
        ASSERT_GE(plan.group_of_stage[a], 0);
        EXPECT_EQ(plan.group_of_stage[a], plan.group_of_stage[b]);
        expected_links[plan.group_of_stage[a]].push_back({a, b});
      }
    }
  }
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    OrderedPairs links;
    for (const v1::DeviceLink& l : plan.groups[g].group.links()) {
      links.push_back({l.from_stage(), l.to_stage()});
    }
    EXPECT_EQ(links, expected_links[g]) << "group " << g;
  }
}

TEST(PlanDeviceLinks, RandomInstances_DevicePairsMatchAndNoMatchablePairIsLeftOnWire) {
  int device_pairs = 0, fallback_pairs = 0, compiled_fallbacks = 0, groups = 0;
  for (uint32_t instance = 0; instance < 600; ++instance) {
    SCOPED_TRACE("instance " + std::to_string(instance));
    Draws draws(instance);
    const int stages = 2 + draws.Below(4);
    std::vector<v1::Program> programs = RandomPrograms(draws, stages);
    const char* codecs[] = {"none", "none", "fp16"};
    MarkCompression(Compression(codecs[draws.Below(3)], codecs[draws.Below(3)], draws.OneIn(2)),
                    &programs);
    const bool shuffled = draws.OneIn(2);
    if (shuffled) ShuffleSomeReceives(draws, &programs);
    MarkSomeAtRandom(draws, &programs);
    std::vector<DeviceLinkMember> members;
    const int hosts = 1 + draws.Below(2);
    for (int s = 0; s < stages; ++s) {
      DeviceLinkMember m;
      m.host = draws.OneIn(10) ? "" : "h" + std::to_string(draws.Below(hosts));
      m.gpu_index = draws.Below(stages + 1);
      if (!draws.OneIn(5)) m.nccl_unique_id = "id-" + std::to_string(s);
      // Most workers report a PCI address, independent of the ordinal; some
      // (older builds) none, on the same hosts.
      if (!draws.OneIn(3)) m.gpu_pci_bus_id = "bus-" + std::to_string(draws.Below(stages + 1));
      members.push_back(m);
    }
    const DeviceLinkPlan plan = PlanDeviceLinks(members, &programs);
    groups += static_cast<int>(plan.groups.size());
    const std::vector<bool> eligible = Eligible(members);
    OrderedPairs order_differs;
    for (int a = 0; a < stages; ++a) {
      for (int b = 0; b < stages; ++b) {
        if (a == b) continue;
        SCOPED_TRACE("pair " + std::to_string(a) + " -> " + std::to_string(b));
        const auto [sent, received] = DeviceKeys(programs, a, b);
        EXPECT_EQ(sent, received);  // same tensors, same order
        const PairCheck check = CheckPair(programs, a, b);
        const bool may = eligible[a] && eligible[b] && members[a].host == members[b].host;
        if (may && check.matchable) {
          EXPECT_EQ(check.device_sends, check.eligible_sends);
          EXPECT_EQ(check.device_recvs, check.eligible_recvs);
          ++device_pairs;
        } else {
          EXPECT_EQ(check.device_sends, 0);
          EXPECT_EQ(check.device_recvs, 0);
          if (may && check.eligible_sends > 0) {
            order_differs.push_back({a, b});
            ++fallback_pairs;
            compiled_fallbacks += !shuffled;
          }
        }
      }
    }
    // Nothing but raw activations and their gradients on the device.
    for (const v1::Program& p : programs) {
      for (const v1::Instruction& in : p.instructions()) {
        if ((in.has_send() || in.has_recv()) && PathOf(in) == v1::LINK_PATH_DEVICE) {
          EXPECT_TRUE(IsActivationKind(TensorOf(in).kind())) << DescribeInstruction(in);
          if (in.has_send()) {
            EXPECT_EQ(in.send().codec(), "") << DescribeInstruction(in);
          }
        }
      }
    }
    EXPECT_EQ(plan.order_differs, order_differs);
    CheckGroups(members, programs, plan);
    // Idempotent.
    std::vector<v1::Program> again = programs;
    const DeviceLinkPlan replan = PlanDeviceLinks(members, &again);
    EXPECT_EQ(replan.group_of_stage, plan.group_of_stage);
    for (size_t s = 0; s < programs.size(); ++s) {
      EXPECT_EQ(again[s].SerializeAsString(), programs[s].SerializeAsString());
    }
  }
  // The instances exercised both outcomes.
  EXPECT_GT(device_pairs, 100);
  EXPECT_GT(fallback_pairs, 20);
  EXPECT_GT(groups, 100);
  std::printf("%d device pairs, %d fallbacks (%d from compiled programs), %d groups\n",
              device_pairs, fallback_pairs, compiled_fallbacks, groups);
}

}  // namespace
}  // namespace pipetrain
