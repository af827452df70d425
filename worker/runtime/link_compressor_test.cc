#include "worker/runtime/link_compressor.h"

#include <cmath>
#include <vector>

#include "common/testing/gradient_check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/compress/codec_spec.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::RandomTensor;
using ::testing::HasSubstr;

v1::Instruction::Send GradSend(const std::string& codec, bool feedback = false,
                               bool flush = false, int micro_batch = 0) {
  v1::Instruction::Send s;
  s.mutable_tensor()->set_kind(v1::TENSOR_KIND_ACTIVATION_GRAD);
  s.mutable_tensor()->set_unit(4);
  s.mutable_tensor()->set_micro_batch(micro_batch);
  s.set_peer_stage(1);
  s.set_codec(codec);
  s.set_error_feedback(feedback);
  s.set_flush_residual(flush);
  return s;
}

std::vector<float> Values(const WireTensor& wire) {
  return DecodeWireTensor(wire, "test").value().ToVector();
}

TEST(LinkCompressor, RawSend_PassesTheTensorAndCountsBytes) {
  LinkCompressor c;
  c.BeginIteration();
  LinkStats stats;
  const Tensor x = RandomTensor({3, 5}, 1);
  WireTensor wire = c.Encode(GradSend(""), x, &stats).value();
  EXPECT_FALSE(wire.encoded());
  EXPECT_EQ(wire.tensor.ToVector(), x.ToVector());
  EXPECT_EQ(stats.tensors, 1);
  EXPECT_EQ(stats.compressed_tensors, 0);
  EXPECT_EQ(stats.raw_bytes, 60);
  EXPECT_EQ(stats.wire_bytes, 60);
  EXPECT_EQ(stats.error_samples, 0);
}

TEST(LinkCompressor, CodecSend_WireBytesAreThePayloadAndErrorSampledOncePerIteration) {
  LinkCompressor c;
  const std::string spec = "piecewise:bits=3";
  const int64_t expected_bytes = MakeCodec(spec).value()->EncodedBytes({4, 8, 16});
  LinkStats stats;
  c.BeginIteration();
  for (int mb = 0; mb < 3; ++mb) {
    WireTensor wire =
        c.Encode(GradSend(spec, false, false, mb), RandomTensor({4, 8, 16}, mb), &stats).value();
    EXPECT_TRUE(wire.encoded());
    EXPECT_EQ(wire.codec, spec);
    EXPECT_EQ(wire.shape, (Shape{4, 8, 16}));
    EXPECT_EQ(wire.wire_bytes(), expected_bytes);
  }
  EXPECT_EQ(stats.compressed_tensors, 3);
  EXPECT_EQ(stats.raw_bytes, 3 * 4 * 8 * 16 * 4);
  EXPECT_EQ(stats.wire_bytes, 3 * expected_bytes);
  EXPECT_EQ(stats.error_samples, 1);
  // 4 bits per Gaussian value: a few percent, certainly not 0 or 1.
  EXPECT_GT(stats.error_sum, 0.01);
  EXPECT_LT(stats.error_sum, 0.5);
  c.BeginIteration();
  ASSERT_TRUE(c.Encode(GradSend(spec), RandomTensor({4, 8, 16}, 9), &stats).ok());
  EXPECT_EQ(stats.error_samples, 2);
}

// elem_topk keep 0.5 of two values sends the larger magnitude exactly.
TEST(LinkCompressor, ErrorFeedback_ResidualGoesIntoTheFlushSendAndNoFurther) {
  LinkCompressor c;
  const std::string spec = "elem_topk:keep=0.5";
  LinkStats stats;
  c.BeginIteration();
  WireTensor first =
      c.Encode(GradSend(spec, true, false, 0), Tensor::FromVector({2}, {3, -4}), &stats).value();
  EXPECT_EQ(Values(first), (std::vector<float>{0, -4}));
  // The flush send carries the residual {3, 0}: the two decoded tensors sum
  // to the two inputs.
  WireTensor flush =
      c.Encode(GradSend(spec, true, true, 1), Tensor::Zeros({2}), &stats).value();
  EXPECT_EQ(Values(flush), (std::vector<float>{3, 0}));
  EXPECT_EQ(stats.error_samples, 2);  // every error-feedback send is measured
  EXPECT_NEAR(stats.error_sum, 0.6, 1e-6);
  // Next iteration: nothing left over.
  c.BeginIteration();
  WireTensor next =
      c.Encode(GradSend(spec, true, false, 0), Tensor::Zeros({2}), &stats).value();
  EXPECT_EQ(Values(next), (std::vector<float>{0, 0}));
}

TEST(LinkCompressor, AbortedIteration_BeginIterationDropsTheResidual) {
  LinkCompressor c;
  const std::string spec = "elem_topk:keep=0.5";
  LinkStats stats;
  c.BeginIteration();
  ASSERT_TRUE(c.Encode(GradSend(spec, true), Tensor::FromVector({2}, {3, -4}), &stats).ok());
  c.BeginIteration();  // the flush send never ran
  WireTensor wire = c.Encode(GradSend(spec, true), Tensor::Zeros({2}), &stats).value();
  EXPECT_EQ(Values(wire), (std::vector<float>{0, 0}));
}

v1::Instruction::Send ActivationSend(const std::string& codec) {
  v1::Instruction::Send s;
  s.mutable_tensor()->set_kind(v1::TENSOR_KIND_ACTIVATION);
  s.mutable_tensor()->set_unit(1);
  s.set_peer_stage(1);
  s.set_codec(codec);
  return s;
}

// Two tokens of 2 values: token 0 has the larger norm, the scores favour
// token 1 (acctfm §4.3.1: attention column sums rank tokens, not norms).
TEST(LinkCompressor, TokenTopKWithScores_KeepsTheHighestScoredToken) {
  LinkCompressor c;
  c.BeginIteration();
  LinkStats stats;
  const Tensor x = Tensor::FromVector({1, 2, 2}, {5, 5, 1, 1});
  WireTensor by_norm = c.Encode(ActivationSend("token_topk:keep=0.5"), x, &stats).value();
  EXPECT_EQ(Values(by_norm), (std::vector<float>{5, 5, 0, 0}));
  WireTensor by_score =
      c.Encode(ActivationSend("token_topk:keep=0.5"), x, &stats, {0.2f, 1.8f}).value();
  EXPECT_EQ(Values(by_score), (std::vector<float>{0, 0, 1, 1}));
  // Other codecs ignore scores.
  WireTensor fp16 = c.Encode(ActivationSend("fp16"), x, &stats, {0.2f, 1.8f}).value();
  EXPECT_EQ(Values(fp16), (std::vector<float>{5, 5, 1, 1}));
  // A score per token or nothing.
  auto bad = c.Encode(ActivationSend("token_topk:keep=0.5"), x, &stats, {1.0f});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// A codec carries finite values only: a NaN or infinity to send means
// the training diverged (the job fails saying so, as an uncompressed one
// does at the loss), not that the codec is at fault. A finite value the
// codec cannot carry stays INVALID_ARGUMENT.
TEST(LinkCompressor, NonFiniteTensor_TrainingDivergedNamingTheSend) {
  LinkCompressor c;
  c.BeginIteration();
  LinkStats stats;
  for (const float bad : {NAN, INFINITY}) {
    auto wire = c.Encode(GradSend("fp16"), Tensor::FromVector({2}, {1, bad}), &stats);
    EXPECT_EQ(wire.status().code(), absl::StatusCode::kFailedPrecondition) << wire.status();
    EXPECT_THAT(wire.status().message(),
                HasSubstr("training diverged: send ACTIVATION_GRAD unit 4 mb 0 to stage 1"));
    EXPECT_THAT(wire.status().message(), HasSubstr("at element 1"));
  }
  auto too_big = c.Encode(GradSend("fp16"), Tensor::FromVector({2}, {1, 1e6f}), &stats);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument) << too_big.status();
  EXPECT_THAT(too_big.status().message(), HasSubstr("send ACTIVATION_GRAD unit 4 mb 0 to stage 1"));
}

TEST(LinkCompressor, UnknownCodec_InvalidArgument) {
  LinkCompressor c;
  c.BeginIteration();
  LinkStats stats;
  auto wire = c.Encode(GradSend("zstd"), Tensor::Zeros({2}), &stats);
  EXPECT_EQ(wire.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wire.status().message(), HasSubstr("zstd"));
}

TEST(LinkCompressor, Decode_RoundTripsAndCounts) {
  LinkCompressor sender, receiver;
  sender.BeginIteration();
  LinkStats sent, received;
  const Tensor x = RandomTensor({2, 3, 8}, 5);
  WireTensor wire = sender.Encode(GradSend("fp16"), x, &sent).value();
  Tensor y = receiver.Decode(wire, "grad", &received).value();
  ASSERT_EQ(y.shape(), x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_NEAR(y[i], x[i], std::fabs(x[i]) * 1e-3);
  EXPECT_EQ(received.compressed_tensors, 1);
  EXPECT_EQ(received.raw_bytes, 2 * 3 * 8 * 4);
  EXPECT_EQ(received.wire_bytes, wire.wire_bytes());
  // Raw passes through.
  Tensor raw = receiver.Decode(WireTensor::Raw(x), "grad", &received).value();
  EXPECT_EQ(raw.ToVector(), x.ToVector());
}

TEST(LinkCompressor, DecodeCorruptPayload_InvalidArgumentNamingTheTensor) {
  LinkCompressor c;
  LinkStats stats;
  WireTensor wire = WireTensor::Encoded("piecewise:bits=3", "PTC1garbage", {4});
  auto y = c.Decode(wire, "ACTIVATION of unit 3", &stats);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(y.status().message(), HasSubstr("ACTIVATION of unit 3"));
}

}  // namespace
}  // namespace pipetrain
