#include "coordinator/planner/compression_marking.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/program_text.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "kernels/compress/codec_spec.h"

namespace pipetrain {
namespace {

// 4 stages of a 3-layer model (8 units: embed, 6 half-layers, head).
constexpr int kUnits = 8;
const std::vector<Range> kFourStages = {{0, 2}, {2, 4}, {4, 6}, {6, 8}};

std::vector<v1::Program> Compile(Schedule schedule, int micro_batches) {
  return CompilePrograms(kFourStages, kUnits, micro_batches, schedule).value();
}

v1::CompressionSpec Spec(const std::string& forward, const std::string& backward, bool ef,
                         bool epilogue_only) {
  v1::CompressionSpec c;
  c.set_forward(forward);
  c.set_backward(backward);
  c.set_error_feedback(ef);
  c.set_epilogue_only(epilogue_only);
  return c;
}

std::vector<const v1::Instruction::Send*> Sends(const v1::Program& p, v1::TensorKind kind) {
  std::vector<const v1::Instruction::Send*> out;
  for (const auto& in : p.instructions()) {
    if (in.has_send() && in.send().tensor().kind() == kind) out.push_back(&in.send());
  }
  return out;
}

TEST(MarkCompression, NoneEverywhere_LeavesEverySendRaw) {
  std::vector<v1::Program> programs = Compile(Schedule::kOneFOneB, 4);
  MarkCompression(Spec("none", "none", false, false), &programs);
  int sends = 0;
  for (const v1::Program& p : programs) {
    for (const auto& in : p.instructions()) {
      if (!in.has_send()) continue;
      ++sends;
      EXPECT_EQ(in.send().codec(), "") << DescribeInstruction(in);
      EXPECT_FALSE(in.send().error_feedback());
      EXPECT_FALSE(in.send().flush_residual());
    }
  }
  EXPECT_EQ(sends, 2 * 3 * 4 + 2);  // both ways over 3 boundaries, 4 micro-batches; tied
}

TEST(MarkCompression, ForwardAndBackward_CodecByKindTiedStaysRaw) {
  std::vector<v1::Program> programs = Compile(Schedule::kOneFOneB, 4);
  MarkCompression(Spec("piecewise:bits=3", "fp16", false, false), &programs);
  int activations = 0, grads = 0, tied = 0;
  for (const v1::Program& p : programs) {
    for (const auto* s : Sends(p, v1::TENSOR_KIND_ACTIVATION)) {
      EXPECT_EQ(s->codec(), "piecewise:bits=3");
      ++activations;
    }
    for (const auto* s : Sends(p, v1::TENSOR_KIND_ACTIVATION_GRAD)) {
      EXPECT_EQ(s->codec(), "fp16");
      EXPECT_FALSE(s->error_feedback());
      ++grads;
    }
    for (const auto* s : Sends(p, v1::TENSOR_KIND_TIED_EMBEDDING_GRAD)) {
      EXPECT_EQ(s->codec(), "");
      ++tied;
    }
  }
  EXPECT_EQ(activations, 3 * 4);  // 3 boundaries x 4 micro-batches
  EXPECT_EQ(grads, 3 * 4);
  EXPECT_EQ(tied, 2);
}

// 1F1B, P = 4 stages: stage s's cool-down sends are its last P - s - 1
// backward passes plus the one right after its last forward, i.e. P - s of
// them (when m >= P - s); the earlier ones overlap the steady phase.
TEST(MarkCompression, OneFOneB_EpilogueIsTheCoolDown) {
  for (int m : {4, 6}) {
    std::vector<v1::Program> programs = Compile(Schedule::kOneFOneB, m);
    MarkCompression(Spec("none", "powersgd:rank=4", false, true), &programs);
    for (int s = 1; s < 4; ++s) {
      std::vector<const v1::Instruction::Send*> grads =
          Sends(programs[s], v1::TENSOR_KIND_ACTIVATION_GRAD);
      ASSERT_EQ(static_cast<int>(grads.size()), m);
      for (int i = 0; i < m; ++i) {
        const bool expect_epilogue = i >= m - (4 - s);
        EXPECT_EQ(grads[i]->epilogue(), expect_epilogue) << "stage " << s << " send " << i;
        EXPECT_EQ(grads[i]->codec(), expect_epilogue ? "powersgd:rank=4" : "")
            << "stage " << s << " send " << i;
      }
    }
  }
}

TEST(MarkCompression, GPipe_EveryBackwardSendIsEpilogue) {
  std::vector<v1::Program> programs = Compile(Schedule::kGPipe, 3);
  MarkCompression(Spec("none", "powersgd:rank=4", false, true), &programs);
  for (int s = 1; s < 4; ++s) {
    const std::vector<const v1::Instruction::Send*> grads =
        Sends(programs[s], v1::TENSOR_KIND_ACTIVATION_GRAD);
    ASSERT_EQ(grads.size(), 3u) << "stage " << s;  // one per micro-batch
    for (const auto* g : grads) {
      EXPECT_TRUE(g->epilogue());
      EXPECT_EQ(g->codec(), "powersgd:rank=4");
    }
  }
}

TEST(MarkCompression, ErrorFeedback_FlushesOnTheLastSendOfEachLink) {
  std::vector<v1::Program> programs = Compile(Schedule::kOneFOneB, 4);
  MarkCompression(Spec("none", "powersgd:rank=4", true, false), &programs);
  for (int s = 1; s < 4; ++s) {
    std::vector<const v1::Instruction::Send*> grads =
        Sends(programs[s], v1::TENSOR_KIND_ACTIVATION_GRAD);
    ASSERT_EQ(grads.size(), 4u);
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_TRUE(grads[i]->error_feedback());
      EXPECT_EQ(grads[i]->flush_residual(), i + 1 == grads.size()) << "stage " << s << " " << i;
    }
  }
  // The flag shows in the program text (`pipetrain job --plan`, worker status).
  bool described = false;
  for (const auto& in : programs[3].instructions()) {
    if (in.has_send() && in.send().flush_residual()) {
      EXPECT_EQ(DescribeInstruction(in),
                "send ACTIVATION_GRAD unit 6 mb 3 to stage 2 as powersgd:rank=4 "
                "(error feedback, flush)");
      described = true;
    }
  }
  EXPECT_TRUE(described);
}

TEST(MarkCompression, ErrorFeedbackWithEpilogueOnly_FlushesOnLastCompressedSend) {
  std::vector<v1::Program> programs = Compile(Schedule::kOneFOneB, 4);
  MarkCompression(Spec("none", "powersgd:rank=4", true, true), &programs);
  for (int s = 1; s < 4; ++s) {
    std::vector<const v1::Instruction::Send*> grads =
        Sends(programs[s], v1::TENSOR_KIND_ACTIVATION_GRAD);
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_EQ(grads[i]->error_feedback(), grads[i]->epilogue());
      EXPECT_EQ(grads[i]->flush_residual(), i + 1 == grads.size());
    }
  }
}

TEST(MarkCompression, RunTwice_SameResultAfterSpecChange) {
  std::vector<v1::Program> programs = Compile(Schedule::kOneFOneB, 4);
  MarkCompression(Spec("fp16", "powersgd:rank=4", true, false), &programs);
  MarkCompression(Spec("none", "none", false, false), &programs);
  std::vector<v1::Program> fresh = Compile(Schedule::kOneFOneB, 4);
  MarkCompression(Spec("none", "none", false, false), &fresh);
  ASSERT_EQ(programs.size(), fresh.size());
  for (size_t i = 0; i < programs.size(); ++i) {
    EXPECT_EQ(programs[i].SerializeAsString(), fresh[i].SerializeAsString());
  }
}

// Bi-Partition: a backward-only worker (no Forward at all) has only
// cool-down sends.
TEST(MarkCompression, BackwardOnlyWorker_AllItsGradSendsAreEpilogue) {
  // Worker 1 runs no forward; its backward range is units [2, 5).
  auto programs = CompileBiPartitionPrograms({{0, 4}, {4, 4}, {4, 8}}, {{0, 2}, {2, 5}, {5, 8}},
                                             kUnits, 3, Schedule::kOneFOneB)
                      .value();
  MarkCompression(Spec("none", "fp16", false, true), &programs);
  std::vector<const v1::Instruction::Send*> grads =
      Sends(programs[1], v1::TENSOR_KIND_ACTIVATION_GRAD);
  ASSERT_EQ(grads.size(), 3u);
  for (const auto* g : grads) {
    EXPECT_TRUE(g->epilogue());
    EXPECT_EQ(g->codec(), "fp16");
  }
}

// Bi-Partition: a worker that forwards units 0-3 sends unit 1's output to
// the worker that recomputes units 2-3 (its backward range begins at 2)
// raw, since it runs unit 2 forward itself from the exact tensor: a
// recompute from a lossy copy would save contexts the forward never had.
// Unit 3's output, the next worker's forward input, is compressed.
TEST(MarkCompression, BiPartitionRecomputeInputFromTheForwardingWorker_StaysRaw) {
  auto programs =
      CompileBiPartitionPrograms({{0, 4}, {4, 8}}, {{0, 2}, {2, 8}}, kUnits, 2, Schedule::kOneFOneB)
          .value();
  MarkCompression(Spec("token_topk:keep=0.5", "none", false, false), &programs);
  int raw = 0, compressed = 0;
  for (const v1::Instruction::Send* send : Sends(programs[0], v1::TENSOR_KIND_ACTIVATION)) {
    if (send->tensor().unit() == 1) {
      EXPECT_EQ(send->codec(), "") << "the recompute input of unit 2";
      ++raw;
    } else {
      EXPECT_EQ(send->tensor().unit(), 3);
      EXPECT_EQ(send->codec(), "token_topk:keep=0.5");
      ++compressed;
    }
  }
  EXPECT_EQ(raw, 2);  // one per micro-batch
  EXPECT_EQ(compressed, 2);
  for (const auto& in : programs[1].instructions()) {
    if (!in.has_recv() || in.recv().tensor().kind() != v1::TENSOR_KIND_ACTIVATION) continue;
    EXPECT_EQ(in.recv().codec(),
              in.recv().tensor().unit() == 1 ? kCodecNone : "token_topk:keep=0.5")
        << DescribeInstruction(in);
  }
}

// A recompute spanning other workers' forward ranges: worker 1 recomputes
// units 1-3 from unit 0's output, whose forward ran on worker 0 (units
// 0-1) and worker 2 (units 2-7). Unit 1's output, worker 0's forward
// output to worker 2, stays raw too: over a lossy link worker 2's forward
// of units 2-3 would run on other values than worker 1's recompute.
TEST(MarkCompression, BiPartitionRecomputeAcrossTwoForwardRanges_ItsInputsStayRaw) {
  auto programs = CompileBiPartitionPrograms({{0, 2}, {2, 2}, {2, 8}}, {{0, 1}, {1, 4}, {4, 8}},
                                             kUnits, 2, Schedule::kOneFOneB)
                      .value();
  MarkCompression(Spec("fp16", "none", false, false), &programs);
  int raw = 0;
  for (const v1::Program& program : programs) {
    for (const auto& in : program.instructions()) {
      if (!in.has_send() || in.send().tensor().kind() != v1::TENSOR_KIND_ACTIVATION) continue;
      const int unit = in.send().tensor().unit();
      EXPECT_EQ(in.send().codec(), unit <= 2 ? "" : "fp16") << DescribeInstruction(in);
      raw += unit <= 2;
    }
  }
  EXPECT_GT(raw, 0);
}

// A routed recompute: worker 2 recomputes units 2-4 from unit 1's output,
// which worker 0 forwarded and sends both to worker 1 (which forwards
// unit 2) and to worker 2. Both decode one payload with a stateless codec,
// so it stays compressed; with PowerSGD each link warm-starts from its own
// state, which differs after a resume onto another plan, so it is raw.
TEST(MarkCompression, RoutedRecomputeInput_CompressedUnlessTheCodecKeepsLinkState) {
  for (const std::string codec : {"fp16", "powersgd:rank=2"}) {
    SCOPED_TRACE(codec);
    auto programs = CompileBiPartitionPrograms({{0, 2}, {2, 5}, {5, 8}}, {{0, 2}, {2, 2}, {2, 8}},
                                               kUnits, 2, Schedule::kOneFOneB)
                        .value();
    MarkCompression(Spec(codec, "none", false, false), &programs);
    std::map<int, int> unit1_sends;  // peer -> count
    for (const v1::Instruction::Send* send : Sends(programs[0], v1::TENSOR_KIND_ACTIVATION)) {
      if (send->tensor().unit() != 1) continue;
      ++unit1_sends[send->peer_stage()];
      EXPECT_EQ(send->codec(), codec == "fp16" ? "fp16" : "");
    }
    EXPECT_EQ(unit1_sends, (std::map<int, int>{{1, 2}, {2, 2}}));
  }
}

// Every Recv names the codec of the Send it is matched to (same tensor,
// from its peer to this stage), "none" for raw ones: epilogue_only
// compresses some gradient sends of a link and not others, so the codec
// must come from the sender's own instruction, not the tensor's kind.
TEST(MarkCompression, EveryRecvNamesItsSendsCodec) {
  for (const bool epilogue_only : {false, true}) {
    SCOPED_TRACE(epilogue_only ? "epilogue only" : "every gradient send");
    std::vector<v1::Program> programs = Compile(Schedule::kOneFOneB, 6);
    MarkCompression(Spec("fp16", "powersgd:rank=4", true, epilogue_only), &programs);
    std::map<std::string, std::string> codec_of_send;  // "from>to kind mb unit" -> codec
    auto name = [](int from, int to, const v1::TensorKey& t) {
      return absl::StrCat(from, ">", to, " ", t.kind(), " ", t.micro_batch(), " ", t.unit());
    };
    for (size_t s = 0; s < programs.size(); ++s) {
      for (const auto& in : programs[s].instructions()) {
        if (!in.has_send()) continue;
        codec_of_send[name(static_cast<int>(s), in.send().peer_stage(), in.send().tensor())] =
            in.send().codec().empty() ? kCodecNone : in.send().codec();
      }
    }
    std::map<std::string, int> recvs_by_codec;
    for (size_t s = 0; s < programs.size(); ++s) {
      for (const auto& in : programs[s].instructions()) {
        if (!in.has_recv()) continue;
        const std::string key =
            name(in.recv().peer_stage(), static_cast<int>(s), in.recv().tensor());
        ASSERT_EQ(codec_of_send.count(key), 1u) << key;
        EXPECT_EQ(in.recv().codec(), codec_of_send[key]) << DescribeInstruction(in);
        ++recvs_by_codec[in.recv().codec()];
      }
    }
    // 3 boundaries x 6 micro-batches each way, and the two tied gradients.
    EXPECT_EQ(recvs_by_codec["fp16"], 18);
    // 1F1B on 4 stages: stages 1-3 have 3, 2 and 1 cool-down gradient sends.
    EXPECT_EQ(recvs_by_codec["powersgd:rank=4"], epilogue_only ? 6 : 18);
    EXPECT_EQ(recvs_by_codec[kCodecNone], epilogue_only ? 2 + 12 : 2);
  }
}

TEST(LinkCodecWireFractions, EachCodecsEncodedSizeOverFp32NoneSkipped) {
  const auto fractions =
      LinkCodecWireFractions(Spec("piecewise:bits=3", "fp16", false, false), 2, 64, 128);
  ASSERT_TRUE(fractions.ok()) << fractions.status();
  const double fp32 = 4.0 * 2 * 64 * 128;
  EXPECT_EQ(fractions->size(), 2u);
  EXPECT_EQ(fractions->at("piecewise:bits=3"),
            MakeCodec("piecewise:bits=3").value()->EncodedBytes({2, 64, 128}) / fp32);
  EXPECT_EQ(fractions->at("fp16"), MakeCodec("fp16").value()->EncodedBytes({2, 64, 128}) / fp32);
  EXPECT_GT(fractions->at("fp16"), 0.5);  // half, plus the payload's header
  EXPECT_LT(fractions->at("fp16"), 0.51);
  EXPECT_TRUE(LinkCodecWireFractions(Spec("none", "none", false, false), 2, 64, 128)->empty());
  EXPECT_EQ(LinkCodecWireFractions(Spec("fp16", "none", false, false), 0, 64, 128).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
