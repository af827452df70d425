// The runtime applies the codecs its program names, with the inputs the
// papers prescribe: a token_topk send of an attention unit's output ranks
// tokens by that unit's attention column sums (acctfm §4.3.1), not by their
// L2 norm. A recording transport captures what stage 0 actually put on the
// wire, and the test rebuilds the expected payload from scratch.
#include <thread>

#include "common/status_macros.h"
#include "coordinator/planner/compression_marking.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "kernels/compress/codec_spec.h"
#include "kernels/compress/token_topk_codec.h"
#include "worker/data/synthetic_text.h"
#include "worker/model/unit.h"
#include "worker/runtime/in_process_device_collective.h"
#include "worker/runtime/pipeline_testing.h"
#include "worker/runtime/stage_runtime.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

// Forwards everything to `inner` and keeps a copy of each sent WireTensor.
class RecordingTransport : public Transport {
 public:
  explicit RecordingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  int stage() const override { return inner_->stage(); }
  absl::Status SendWire(int peer, const TensorAddress& address, const WireTensor& wire) override {
    sent_.emplace_back(address, wire);
    return inner_->SendWire(peer, address, wire);
  }
  absl::StatusOr<WireTensor> RecvWire(int peer, const TensorAddress& address,
                                      absl::Duration timeout) override {
    return inner_->RecvWire(peer, address, timeout);
  }
  const std::vector<std::pair<TensorAddress, WireTensor>>& sent() const { return sent_; }

 private:
  std::unique_ptr<Transport> inner_;
  std::vector<std::pair<TensorAddress, WireTensor>> sent_;  // one thread sends
};

// Runs iteration 0 on every stage at once, each on a thread; the first to
// fail shuts the fabric down so the others stop waiting. Their statuses.
std::vector<absl::Status> RunFirstIteration(
    const std::vector<std::unique_ptr<StageRuntime>>& runtimes, InProcessFabric& fabric) {
  std::vector<absl::Status> errors(runtimes.size());
  std::vector<std::thread> threads;
  for (size_t s = 0; s < runtimes.size(); ++s) {
    threads.emplace_back([&, s] {
      errors[s] = runtimes[s]->RunIteration(0).status();
      if (!errors[s].ok()) fabric.Shutdown();
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Sends its activations as encoded payloads declaring a shape of 64 Mi
// values (a peer that does not follow the protocol).
class ShapeLyingTransport : public Transport {
 public:
  explicit ShapeLyingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  int stage() const override { return inner_->stage(); }
  absl::Status SendWire(int peer, const TensorAddress& address, const WireTensor& wire) override {
    if (address.kind != v1::TENSOR_KIND_ACTIVATION) return inner_->SendWire(peer, address, wire);
    return inner_->SendWire(peer, address, WireTensor::Encoded("fp16", "xx", {64, 1024, 1024}));
  }
  absl::StatusOr<WireTensor> RecvWire(int peer, const TensorAddress& address,
                                      absl::Duration timeout) override {
    return inner_->RecvWire(peer, address, timeout);
  }

 private:
  std::unique_ptr<Transport> inner_;
};

// A received tensor's declared size is checked against the one the stage
// expects before anything is decoded (a small payload can declare GiBs).
TEST(StageRuntimeCompression, DeclaredShapeOtherThanExpected_RefusedBeforeDecoding) {
  TrainConfig c;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.d_model = 16;
  c.model.max_seq_len = 8;
  c.seq_len = 8;
  c.batch_size = 2;
  c.micro_batches = 1;
  const std::string text = GenerateEnglishText(5, 5000);
  const Dataset data =
      Dataset::Create(std::vector<uint16_t>(text.begin(), text.end()), 8, 0.1).value();
  const std::vector<Range> ranges = {{0, 2}, {2, 4}};
  const auto programs = CompilePrograms(ranges, 4, c.micro_batches, Schedule::kOneFOneB).value();
  InProcessFabric fabric(2);
  std::vector<std::unique_ptr<Transport>> transports;
  transports.push_back(std::make_unique<ShapeLyingTransport>(fabric.Connect(0)));
  transports.push_back(fabric.Connect(1));
  std::vector<std::unique_ptr<StageRuntime>> runtimes;
  for (int s = 0; s < 2; ++s) {
    StageSetup setup{
        "job-lie",        c, s, 2, ToUnitRange(ranges[s]), ToUnitRange(ranges[s]), programs[s],
        absl::Seconds(30)};
    runtimes.push_back(StageRuntime::Create(setup, &data, transports[s].get()).value());
  }
  const std::vector<absl::Status> errors = RunFirstIteration(runtimes, fabric);
  EXPECT_EQ(errors[1].code(), absl::StatusCode::kInvalidArgument) << errors[1];
  EXPECT_NE(errors[1].message().find("has shape [64, 1024, 1024]; expected [2, 8, 16]"),
            std::string::npos)
      << errors[1];
}

// Sends its activations in the codec it chooses: `codec` ("none": raw),
// re-encoding what the program had it send (a peer that does not follow
// its program). The shape stays the expected one.
class CodecChoosingTransport : public Transport {
 public:
  CodecChoosingTransport(std::unique_ptr<Transport> inner, std::string codec)
      : inner_(std::move(inner)), codec_(std::move(codec)) {}
  int stage() const override { return inner_->stage(); }
  absl::Status SendWire(int peer, const TensorAddress& address, const WireTensor& wire) override {
    if (address.kind != v1::TENSOR_KIND_ACTIVATION) return inner_->SendWire(peer, address, wire);
    ASSIGN_OR_RETURN(Tensor x, DecodeWireTensor(wire, "the program's send"));
    if (codec_ == kCodecNone) return inner_->SendWire(peer, address, WireTensor::Raw(x));
    ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, MakeCodec(codec_));
    CodecState state;
    ASSIGN_OR_RETURN(std::string payload, codec->Encode(x, &state));
    return inner_->SendWire(peer, address, WireTensor::Encoded(codec_, payload, x.shape()));
  }
  absl::StatusOr<WireTensor> RecvWire(int peer, const TensorAddress& address,
                                      absl::Duration timeout) override {
    return inner_->RecvWire(peer, address, timeout);
  }

 private:
  std::unique_ptr<Transport> inner_;
  std::string codec_;
};

// The receiver decodes only the codec its program names for the tensor
// (compression_marking.h writes it on each Recv): a peer that sends a
// codec of its own choice, or raw where the program compresses, is refused
// before anything is decoded; the codec the program names is taken.
TEST(StageRuntimeCompression, CodecOtherThanTheProgramsRecv_Refused) {
  const TrainConfig c = testing::SmallConfig();
  const Dataset data = testing::MakeDataset();
  const std::vector<Range> ranges = {{0, 3}, {3, 6}};
  struct Case {
    std::string program_codec;  // spec.compression.forward
    std::string sent_codec;     // what stage 0 puts on the wire
    bool refused;
  };
  for (const Case& k : std::vector<Case>{{kCodecNone, "powersgd:rank=2", true},
                                         {kCodecNone, "fp16", true},
                                         {"fp16", kCodecNone, true},
                                         {"fp16", "bf16", true},
                                         {"fp16", "fp16", false},
                                         {kCodecNone, kCodecNone, false}}) {
    SCOPED_TRACE(k.program_codec + " in the program, " + k.sent_codec + " sent");
    auto programs = CompilePrograms(ranges, 6, c.micro_batches, Schedule::kOneFOneB).value();
    v1::CompressionSpec compression;
    compression.set_forward(k.program_codec);
    compression.set_backward(kCodecNone);
    MarkCompression(compression, &programs);
    InProcessFabric fabric(2);
    std::vector<std::unique_ptr<Transport>> transports;
    transports.push_back(std::make_unique<CodecChoosingTransport>(fabric.Connect(0), k.sent_codec));
    transports.push_back(fabric.Connect(1));
    std::vector<std::unique_ptr<StageRuntime>> runtimes;
    for (int s = 0; s < 2; ++s) {
      StageSetup setup{
          "job-codec",      c, s, 2, ToUnitRange(ranges[s]), ToUnitRange(ranges[s]), programs[s],
          absl::Seconds(30)};
      runtimes.push_back(StageRuntime::Create(setup, &data, transports[s].get()).value());
    }
    const std::vector<absl::Status> errors = RunFirstIteration(runtimes, fabric);
    if (!k.refused) {
      EXPECT_TRUE(errors[0].ok()) << errors[0];
      EXPECT_TRUE(errors[1].ok()) << errors[1];
      continue;
    }
    EXPECT_EQ(errors[1].code(), absl::StatusCode::kInvalidArgument) << errors[1];
    EXPECT_NE(errors[1].message().find(absl::StrCat("arrived as codec \"", k.sent_codec,
                                                    "\"; the program receives it as \"",
                                                    k.program_codec, "\"")),
              std::string::npos)
        << errors[1];
  }
}

// A data-parallel quantizer from the assignment is checked before use: a
// spec that is not one quantizer, one without replicas to reduce over, or
// one beside a PowerSGD rank is INVALID_ARGUMENT, not a crash; so is a
// checkpoint bound of no replica's feedback.
TEST(StageRuntimeCompression, DataParallelQuantizer_BadSetupsRefused) {
  const TrainConfig c = testing::SmallConfig();
  const Dataset data = testing::MakeDataset();
  const std::vector<Range> ranges = {{0, 6}};
  auto programs = CompilePrograms(ranges, 6, 1, Schedule::kOneFOneB).value();
  InProcessFabric fabric(2);
  std::unique_ptr<Transport> transport = fabric.Connect(0);
  StageSetup setup{"job-q", c, 0, 1, ToUnitRange(ranges[0]), ToUnitRange(ranges[0]),
                   programs[0], absl::Seconds(30)};
  setup.replicas = 2;
  setup.data_parallel_quantizer = "bf16";
  EXPECT_TRUE(StageRuntime::Create(setup, &data, transport.get()).ok());
  for (const std::string& bad :
       std::vector<std::string>{"token_topk:keep=0.5", "powersgd:rank=2", std::string(300, 'x')}) {
    setup.data_parallel_quantizer = bad;
    EXPECT_EQ(StageRuntime::Create(setup, &data, transport.get()).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad.substr(0, 20);
  }
  setup.data_parallel_quantizer = "bf16";
  setup.data_parallel_powersgd_rank = 2;
  EXPECT_EQ(StageRuntime::Create(setup, &data, transport.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  setup.data_parallel_powersgd_rank = 0;
  setup.max_feedback_replicas = 0;  // a checkpoint could keep no feedback
  EXPECT_EQ(StageRuntime::Create(setup, &data, transport.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  setup.max_feedback_replicas = kMaxFeedbackReplicasKept;
  setup.replicas = 1;
  EXPECT_EQ(StageRuntime::Create(setup, &data, transport.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A replica device collective sums exactly: beside a PowerSGD rank or a
// quantizer, or without replicas, it is INVALID_ARGUMENT (the coordinator
// forms no group for a compressed stage; an assignment that says otherwise
// is refused, not trained wrongly).
TEST(StageRuntimeCompression, ReplicaDeviceCollective_OnlyForExactAllReduce) {
  const TrainConfig c = testing::SmallConfig();
  const Dataset data = testing::MakeDataset();
  const std::vector<Range> ranges = {{0, 6}};
  auto programs = CompilePrograms(ranges, 6, 1, Schedule::kOneFOneB).value();
  InProcessFabric fabric(2);
  std::unique_ptr<Transport> transport = fabric.Connect(0);
  InProcessCollectiveHub hub(2);
  std::unique_ptr<DeviceCollective> collective = hub.CollectiveFor(0);
  StageSetup setup{"job-q", c, 0, 1, ToUnitRange(ranges[0]), ToUnitRange(ranges[0]),
                   programs[0], absl::Seconds(30)};
  setup.replicas = 2;
  setup.device_collective = collective.get();
  EXPECT_TRUE(StageRuntime::Create(setup, &data, transport.get()).ok());
  setup.data_parallel_quantizer = "bf16";
  EXPECT_EQ(StageRuntime::Create(setup, &data, transport.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  setup.data_parallel_quantizer.clear();
  setup.data_parallel_powersgd_rank = 2;
  EXPECT_EQ(StageRuntime::Create(setup, &data, transport.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  setup.data_parallel_powersgd_rank = 0;
  setup.replicas = 1;
  EXPECT_EQ(StageRuntime::Create(setup, &data, transport.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The model and text of the token top-k tests: 2 layers, micro-batches of
// 2 sequences of 16 tokens.
TrainConfig TokenTopKConfig() {
  TrainConfig c;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.d_model = 32;
  c.model.max_seq_len = 16;
  c.seq_len = 16;
  c.batch_size = 4;
  c.micro_batches = 2;
  c.seed = 7;
  return c;
}

Dataset TokenTopKDataset() {
  const std::string text = GenerateEnglishText(5, 50000);
  return Dataset::Create(std::vector<uint16_t>(text.begin(), text.end()), 16, 0.1).value();
}

// attn_0's (unit 1's) output for micro-batch 0 of the first step, computed
// by hand as stage 0 computes it (same Philox initialisation, same batch),
// and coded by token_topk:keep=0.5 with its tokens ranked by the
// attention's column sums, and by their L2 norms.
struct AttentionOutputCoded {
  std::string by_attention, by_norm;
};
AttentionOutputCoded CodeAttentionOutputByHand(const TrainConfig& c, const Dataset& data) {
  auto embed = MakeUnit(c.model, 0), attn = MakeUnit(c.model, 1);
  InitializeParameters(embed.get(), c.seed);
  InitializeParameters(attn.get(), c.seed);
  attn->KeepTokenImportance();  // as the runtime does for a token_topk send
  const TokenBatch batch = data.TrainBatch(c.seed, 0, 0, c.batch_size / c.micro_batches);
  UnitContext embed_ctx, attn_ctx;
  const Tensor x = attn->Forward(embed->Forward(Tensor(), batch, &embed_ctx), batch, &attn_ctx);
  auto codec = MakeCodec("token_topk:keep=0.5").value();
  const auto* token_topk = dynamic_cast<const TokenTopKCodec*>(codec.get());
  if (token_topk == nullptr) {
    ADD_FAILURE() << "token_topk:keep=0.5 is not a TokenTopKCodec";
    return {};
  }
  return {token_topk->EncodeWithScores(x, attn->TokenImportance(attn_ctx), nullptr).value(),
          token_topk->Encode(x, nullptr).value()};
}

TEST(StageRuntimeCompression, TokenTopKOnAttentionOutput_RanksTokensByColumnSums) {
  const TrainConfig c = TokenTopKConfig();
  const Dataset data = TokenTopKDataset();
  // Stage 0 runs embed and attn_0 (unit 1): its output is an attention output.
  const std::vector<Range> ranges = {{0, 2}, {2, 6}};
  auto programs = CompilePrograms(ranges, 6, c.micro_batches, Schedule::kOneFOneB).value();
  v1::CompressionSpec compression;
  compression.set_forward("token_topk:keep=0.5");
  compression.set_backward("none");
  MarkCompression(compression, &programs);

  InProcessFabric fabric(2);
  auto recording = std::make_unique<RecordingTransport>(fabric.Connect(0));
  RecordingTransport* recorder = recording.get();
  std::vector<std::unique_ptr<Transport>> transports;
  transports.push_back(std::move(recording));
  transports.push_back(fabric.Connect(1));
  std::vector<std::unique_ptr<StageRuntime>> runtimes;
  for (int s = 0; s < 2; ++s) {
    StageSetup setup{"job-tk", c, s, 2, ToUnitRange(ranges[s]), ToUnitRange(ranges[s]),
                     programs[s], absl::Seconds(30)};
    runtimes.push_back(StageRuntime::Create(setup, &data, transports[s].get()).value());
  }
  const std::vector<absl::Status> errors = RunFirstIteration(runtimes, fabric);
  ASSERT_TRUE(errors[0].ok()) << errors[0];
  ASSERT_TRUE(errors[1].ok()) << errors[1];

  // What stage 0 sent for micro-batch 0.
  const WireTensor* sent = nullptr;
  for (const auto& [address, wire] : recorder->sent()) {
    if (address.kind == v1::TENSOR_KIND_ACTIVATION && address.micro_batch == 0) sent = &wire;
  }
  ASSERT_NE(sent, nullptr);
  ASSERT_EQ(sent->codec, "token_topk:keep=0.5");

  const AttentionOutputCoded by_hand = CodeAttentionOutputByHand(c, data);
  // The test can tell the two apart only if they select different tokens.
  ASSERT_NE(by_hand.by_attention, by_hand.by_norm)
      << "column sums and L2 norms pick the same tokens here";
  EXPECT_EQ(sent->payload, by_hand.by_attention);
}

// A Bi-Partition plan may send one activation twice: forward {[0,2),
// [2,4), [4,6)} with backward {[0,1), [1,2), [2,6)} has worker 0 send
// unit 1's output to worker 1 (its forward input) and to worker 2 (the
// input its backward recomputes from). Both must be ranked by the
// attention scores: the second send found them taken by the first and
// ranked by L2 norm, so worker 2 recomputed from another input than the
// forward used.
TEST(StageRuntimeCompression, TokenTopKActivationSentTwice_BothRankedByAttention) {
  const TrainConfig c = TokenTopKConfig();
  const Dataset data = TokenTopKDataset();
  const std::vector<Range> forward = {{0, 2}, {2, 4}, {4, 6}};
  const std::vector<Range> backward = {{0, 1}, {1, 2}, {2, 6}};
  auto programs =
      CompileBiPartitionPrograms(forward, backward, 6, c.micro_batches, Schedule::kOneFOneB)
          .value();
  v1::CompressionSpec compression;
  compression.set_forward("token_topk:keep=0.5");
  compression.set_backward("none");
  MarkCompression(compression, &programs);

  InProcessFabric fabric(3);
  auto recording = std::make_unique<RecordingTransport>(fabric.Connect(0));
  RecordingTransport* recorder = recording.get();
  std::vector<std::unique_ptr<Transport>> transports;
  transports.push_back(std::move(recording));
  transports.push_back(fabric.Connect(1));
  transports.push_back(fabric.Connect(2));
  std::vector<std::unique_ptr<StageRuntime>> runtimes;
  for (int s = 0; s < 3; ++s) {
    StageSetup setup{
        "job-tk2",        c, s, 3, ToUnitRange(forward[s]), ToUnitRange(backward[s]), programs[s],
        absl::Seconds(30)};
    runtimes.push_back(StageRuntime::Create(setup, &data, transports[s].get()).value());
  }
  const std::vector<absl::Status> errors = RunFirstIteration(runtimes, fabric);
  for (const absl::Status& e : errors) ASSERT_TRUE(e.ok()) << e;

  // Unit 1's output for micro-batch 0, as sent to each peer.
  std::vector<std::string> payloads;
  for (const auto& [address, wire] : recorder->sent()) {
    if (address.kind == v1::TENSOR_KIND_ACTIVATION && address.micro_batch == 0 &&
        address.unit == 1) {
      ASSERT_EQ(wire.codec, "token_topk:keep=0.5");
      payloads.push_back(wire.payload);
    }
  }
  ASSERT_EQ(payloads.size(), 2u) << "unit 1's output goes to workers 1 and 2";
  EXPECT_EQ(payloads[0], payloads[1]);

  // And it is the attention's ranking, not the norms'.
  EXPECT_EQ(payloads[1], CodeAttentionOutputByHand(c, data).by_attention);
}

}  // namespace
}  // namespace pipetrain
