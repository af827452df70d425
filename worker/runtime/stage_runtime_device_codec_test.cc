// The runtime's use of device codecs (Backend::EncodeOnDevice and
// DecodeOnDevice, which the CUDA backend provides for linear, piecewise,
// token_topk, powersgd, fp16 and bf16 payloads; device_link_encoder.h keeps error
// feedback and codec state beside them): a stand-in backend computes on the
// CPU but claims those codecs, producing them with the CPU codec and the
// codec state it is handed, so its payloads equal the host path's when the
// runtime hands it what the host path uses (token top-k's attention scores,
// each link's residual and PowerSGD Q included).
// A two-stage pipeline on stand-ins must then train bitwise as one on plain
// CPU backends, every compressed send and every compressed receive must go
// through the device calls, and the link statistics must count the same
// tensors and bytes.
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/planner/compression_marking.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "kernels/compress/codec_spec.h"
#include "kernels/compress/token_topk_codec.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/forwarding_backend.h"
#include "worker/runtime/pipeline_testing.h"
#include "worker/runtime/stage_runtime.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

// The CPU backend, with the CUDA backend's device-codec coverage, computed
// by the CPU codecs.
class StandInDeviceCodecs : public ForwardingBackend {
 public:
  StandInDeviceCodecs() : ForwardingBackend(CpuBackend()) {}

  absl::StatusOr<std::string> EncodeOnDevice(const Tensor& t, const std::string& spec,
                                             absl::Span<const float> scores,
                                             CodecState* state) override {
    if (!Claims(spec)) return absl::UnimplementedError("not claimed");
    ++encodes;
    std::unique_ptr<Codec> codec = MakeCodec(spec).value();
    if (const auto* topk = dynamic_cast<const TokenTopKCodec*>(codec.get())) {
      if (!scores.empty()) {
        ++scored_encodes;
        return topk->EncodeWithScores(t, scores, state);
      }
    }
    return codec->Encode(t, state);
  }
  absl::StatusOr<Tensor> DecodeOnDevice(const std::string& spec, const std::string& payload,
                                        const Shape& shape) override {
    if (!Claims(spec)) return absl::UnimplementedError("not claimed");
    ++decodes;
    absl::StatusOr<Tensor> t = MakeCodec(spec).value()->Decode(payload);
    if (!t.ok()) return t.status();
    if (t->numel() != NumElements(shape)) return absl::InvalidArgumentError("wrong size");
    return t->Reshape(shape);
  }

  std::atomic<int> encodes{0};
  std::atomic<int> scored_encodes{0};  // token_topk with the runtime's scores
  std::atomic<int> decodes{0};

 private:
  static bool Claims(const std::string& spec) {
    return spec.rfind("linear:", 0) == 0 || spec.rfind("piecewise:", 0) == 0 ||
           spec.rfind("token_topk:", 0) == 0 || spec.rfind("powersgd:", 0) == 0 ||
           spec == "fp16" || spec == "bf16";
  }
};

struct PipelineRun {
  std::vector<float> losses;
  std::vector<IterationResult> results;  // per stage, of the last iteration
};

// Two stages cut before unit `cut` (3: after an MLP; 2: after attention),
// 1F1B, three iterations; stage s computes on backends[s].
PipelineRun TrainPipeline(const v1::CompressionSpec& compression,
                          const std::vector<Backend*>& backends, int cut = 3) {
  const TrainConfig c = testing::SmallConfig();
  const Dataset data = testing::MakeDataset();
  const int units = NumUnits(c.model);
  const std::vector<Range> ranges = {{0, cut}, {cut, units}};
  auto programs = CompilePrograms(ranges, units, c.micro_batches, Schedule::kOneFOneB).value();
  MarkCompression(compression, &programs);
  InProcessFabric fabric(2);
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::unique_ptr<StageRuntime>> runtimes;
  for (int s = 0; s < 2; ++s) {
    transports.push_back(fabric.Connect(s));
    StageSetup setup{"job-dc", c, s, 2, ToUnitRange(ranges[s]), ToUnitRange(ranges[s]),
                     programs[s], absl::Seconds(30)};
    setup.backend = backends[s];
    runtimes.push_back(StageRuntime::Create(setup, &data, transports[s].get()).value());
  }
  PipelineRun run;
  run.results.resize(2);
  for (int64_t it = 0; it < 3; ++it) {
    std::vector<absl::StatusOr<IterationResult>> results(2, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int s = 0; s < 2; ++s) {
      threads.emplace_back([&, s] {
        results[s] = runtimes[s]->RunIteration(it);
        if (!results[s].ok()) fabric.Shutdown();
      });
    }
    for (auto& t : threads) t.join();
    for (int s = 0; s < 2; ++s) {
      EXPECT_TRUE(results[s].ok()) << results[s].status();
      if (!results[s].ok()) return run;
      run.results[s] = *results[s];
    }
    for (float loss : results[1]->micro_batch_losses) run.losses.push_back(loss);
  }
  return run;
}

// The link statistics of two runs count the same tensors and bytes.
void ExpectSameLinkCounts(const PipelineRun& host, const PipelineRun& device) {
  for (int s = 0; s < 2; ++s) {
    using Links = std::map<std::pair<int, std::string>, LinkStats>;
    for (Links IterationResult::*which : {&IterationResult::sent, &IterationResult::received}) {
      const Links& want = host.results[s].*which;
      const Links& got = device.results[s].*which;
      ASSERT_EQ(got.size(), want.size()) << "stage " << s;
      for (const auto& [link, stats] : want) {
        ASSERT_TRUE(got.count(link)) << "stage " << s << " link " << link.second;
        EXPECT_EQ(got.at(link).tensors, stats.tensors) << link.second;
        EXPECT_EQ(got.at(link).compressed_tensors, stats.compressed_tensors) << link.second;
        EXPECT_EQ(got.at(link).raw_bytes, stats.raw_bytes) << link.second;
        EXPECT_EQ(got.at(link).wire_bytes, stats.wire_bytes) << link.second;
      }
    }
  }
}

TEST(StageRuntimeDeviceCodecTest, DeviceCodecs_ErrorFeedbackToo_TrainBitwiseAsTheHostPath) {
  v1::CompressionSpec compression;
  compression.set_forward("piecewise:bits=3");
  compression.set_backward("linear:bits=8");
  compression.set_error_feedback(true);
  const PipelineRun host = TrainPipeline(compression, {CpuBackend(), CpuBackend()});
  StandInDeviceCodecs stage0, stage1;
  const PipelineRun device = TrainPipeline(compression, {&stage0, &stage1});

  ASSERT_EQ(host.losses.size(), 3u * testing::SmallConfig().micro_batches);
  EXPECT_EQ(device.losses, host.losses);
  // Forward: stage 0 encodes each micro-batch's activation on the "device",
  // stage 1 decodes it there. Backward (error feedback): stage 1 encodes on
  // the "device" and decodes there for the residual, but not the flush send
  // (one per iteration); stage 0 decodes its payloads on the "device".
  const int sends = 3 * testing::SmallConfig().micro_batches;
  EXPECT_EQ(stage0.encodes.load(), sends);
  EXPECT_EQ(stage1.decodes.load(), sends + (sends - 3));
  EXPECT_EQ(stage1.encodes.load(), sends);
  EXPECT_EQ(stage0.decodes.load(), sends);
  ExpectSameLinkCounts(host, device);
  // Only sends the host encoded carry a sampled error: here none.
  EXPECT_EQ(device.results[0].sent.at({1, "ACTIVATION"}).error_samples, 0);
  EXPECT_EQ(device.results[1].sent.at({0, "ACTIVATION_GRAD"}).error_samples, 0);
  EXPECT_GT(host.results[1].sent.at({0, "ACTIVATION_GRAD"}).error_samples, 0);
}

// Optimus-CC's compressed backpropagation on the device: PowerSGD rank 2
// with lazy error propagation, epilogue-only. The cool-down sends carry the
// residual and the link's warm-started Q (both kept by the device encoder
// per link); the steady-state sends go raw.
TEST(StageRuntimeDeviceCodecTest, PowerSgdEpilogueWithErrorFeedback_TrainsBitwiseAsTheHostPath) {
  v1::CompressionSpec compression;
  compression.set_backward("powersgd:rank=2");
  compression.set_error_feedback(true);
  compression.set_epilogue_only(true);
  const PipelineRun host = TrainPipeline(compression, {CpuBackend(), CpuBackend()});
  StandInDeviceCodecs stage0, stage1;
  const PipelineRun device = TrainPipeline(compression, {&stage0, &stage1});
  ASSERT_EQ(host.losses.size(), 3u * testing::SmallConfig().micro_batches);
  EXPECT_EQ(device.losses, host.losses);
  const LinkStats& grads = device.results[1].sent.at({0, "ACTIVATION_GRAD"});
  EXPECT_GT(grads.compressed_tensors, 0);
  EXPECT_LT(grads.compressed_tensors, grads.tensors);  // epilogue only
  EXPECT_EQ(stage1.encodes.load(), 3 * grads.compressed_tensors);
  EXPECT_EQ(stage0.decodes.load(), 3 * grads.compressed_tensors);
  ExpectSameLinkCounts(host, device);
}

// Token top-k with a quantizer on the device: the runtime must hand the
// backend the attention scores the host path selects by (acctfm §4.3.1),
// or the kept tokens, and so the losses, differ.
TEST(StageRuntimeDeviceCodecTest, TokenTopK_GetsTheScores_TrainsBitwiseAsTheHostPath) {
  v1::CompressionSpec compression;
  compression.set_forward("token_topk:keep=0.5+piecewise:bits=3");
  // Cut after attention_0 (unit 1), whose output has the scores.
  const PipelineRun host = TrainPipeline(compression, {CpuBackend(), CpuBackend()}, /*cut=*/2);
  StandInDeviceCodecs stage0, stage1;
  const PipelineRun device = TrainPipeline(compression, {&stage0, &stage1}, /*cut=*/2);
  ASSERT_EQ(host.losses.size(), 3u * testing::SmallConfig().micro_batches);
  EXPECT_EQ(device.losses, host.losses);
  const int sends = 3 * testing::SmallConfig().micro_batches;
  EXPECT_EQ(stage0.encodes.load(), sends);
  EXPECT_EQ(stage0.scored_encodes.load(), sends);
  EXPECT_EQ(stage1.decodes.load(), sends);
}

}  // namespace
}  // namespace pipetrain
