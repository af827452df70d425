// DeviceLinkEncoder against the host path it stands in for (LinkCompressor):
// a stand-in backend computes on the CPU but claims device codecs, producing
// them with the CPU codecs and the CodecState it is handed, so for the same
// sends the two must give the same payloads byte for byte: codec state per
// link, error feedback's residual, the flush at the end of an iteration and
// the residual an aborted iteration leaves.
#include "worker/runtime/device_link_encoder.h"

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "common/testing/gradient_check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/compress/codec_spec.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/forwarding_backend.h"
#include "worker/runtime/link_compressor.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::RandomTensor;
using ::testing::HasSubstr;

// The CPU backend, claiming every codec not in `refused` as a device codec.
class StandInDevice : public ForwardingBackend {
 public:
  StandInDevice() : ForwardingBackend(CpuBackend()) {}

  absl::StatusOr<std::string> EncodeOnDevice(const Tensor& t, const std::string& spec,
                                             absl::Span<const float> /*scores*/,
                                             CodecState* state) override {
    ++encodes;
    if (refused.count(spec)) return absl::UnimplementedError("refused");
    if (!device_error.ok()) return device_error;
    return MakeCodec(spec).value()->Encode(t, state);
  }
  absl::StatusOr<Tensor> DecodeOnDevice(const std::string& spec, const std::string& payload,
                                        const Shape& shape) override {
    ++decodes;
    if (refused.count(spec)) return absl::UnimplementedError("refused");
    absl::StatusOr<Tensor> t = MakeCodec(spec).value()->Decode(payload);
    if (!t.ok()) return t.status();
    return t->Reshape(shape);
  }

  std::set<std::string> refused;
  absl::Status device_error;  // what every encode fails with, when not OK
  int encodes = 0;
  int decodes = 0;
};

v1::Instruction::Send GradSend(const std::string& codec, int unit, bool feedback, bool flush) {
  v1::Instruction::Send s;
  s.mutable_tensor()->set_kind(v1::TENSOR_KIND_ACTIVATION_GRAD);
  s.mutable_tensor()->set_unit(unit);
  s.set_peer_stage(1);
  s.set_codec(codec);
  s.set_error_feedback(feedback);
  s.set_flush_residual(flush);
  return s;
}

// Three links interleaved, as a stage's cool-down sends them: PowerSGD with
// error feedback (unit 4), linear with error feedback (unit 3), PowerSGD
// without (unit 2, its Q warm across iterations). An aborted iteration (two
// sends, no flush), then two complete ones (flush at micro-batch 3).
TEST(DeviceLinkEncoder, ErrorFeedbackAndCodecState_PayloadsEqualTheHostPath) {
  StandInDevice device;
  DeviceLinkEncoder on_device(&device);
  LinkCompressor on_host;
  struct Link {
    std::string codec;
    int unit;
    bool feedback;
  };
  const std::vector<Link> links = {
      {"powersgd:rank=2", 4, true}, {"linear:bits=4", 3, true}, {"powersgd:rank=2", 2, false}};
  uint64_t seed = 1;
  int compared = 0;
  for (int iteration = 0; iteration < 3; ++iteration) {
    on_device.BeginIteration();
    on_host.BeginIteration();
    const int sends = iteration == 0 ? 2 : 4;
    for (int mb = 0; mb < sends; ++mb) {
      for (const Link& l : links) {
        SCOPED_TRACE(::testing::Message() << "iteration " << iteration << " mb " << mb << " "
                                          << l.codec << " unit " << l.unit);
        const v1::Instruction::Send send = GradSend(l.codec, l.unit, l.feedback, mb == 3);
        const Tensor x = RandomTensor({2, 6, 8}, seed++);
        const std::vector<float> before = x.ToVector();
        LinkStats stats;
        const std::string want = on_host.Encode(send, x, &stats).value().payload;
        absl::StatusOr<std::string> got = on_device.Encode(send, x, {});
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(*got, want);
        EXPECT_EQ(x.ToVector(), before) << "the sent tensor was written";
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 30);
  // Error feedback decodes every send but the flush one: 2 links x (2 + 3 + 3).
  EXPECT_EQ(device.decodes, 16);
}

// The residual must go into the next send: without it (a fresh encoder
// per send) the second payload differs from the host path's.
TEST(DeviceLinkEncoder, ErrorFeedback_SecondSendCarriesTheResidual) {
  StandInDevice device;
  DeviceLinkEncoder on_device(&device);
  const v1::Instruction::Send send = GradSend("linear:bits=2", 4, true, false);
  const Tensor a = RandomTensor({4, 16}, 7), b = RandomTensor({4, 16}, 8);
  ASSERT_TRUE(on_device.Encode(send, a, {}).ok());
  const std::string second = on_device.Encode(send, b, {}).value();
  const std::string no_residual = MakeCodec("linear:bits=2").value()->Encode(b, nullptr).value();
  EXPECT_NE(second, no_residual);
}

TEST(DeviceLinkEncoder, UnclaimedCodec_HostPathForGood) {
  StandInDevice device;
  device.refused = {"fp16"};
  DeviceLinkEncoder on_device(&device);
  const v1::Instruction::Send send = GradSend("fp16", 4, false, false);
  const Tensor x = RandomTensor({2, 3}, 1);
  EXPECT_EQ(on_device.Encode(send, x, {}).status().code(), absl::StatusCode::kUnimplemented);
  device.refused.clear();  // even if the backend would take it now
  EXPECT_EQ(on_device.Encode(send, x, {}).status().code(), absl::StatusCode::kUnimplemented);
  on_device.BeginIteration();
  EXPECT_EQ(on_device.Encode(send, x, {}).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(device.encodes, 1);
  // Another link decides for itself.
  EXPECT_TRUE(on_device.Encode(GradSend("fp16", 3, false, false), x, {}).ok());
}

TEST(DeviceLinkEncoder, DeviceCodecThatStopsAnswering_Internal) {
  StandInDevice device;
  DeviceLinkEncoder on_device(&device);
  const v1::Instruction::Send send = GradSend("linear:bits=4", 4, true, false);
  const Tensor x = RandomTensor({2, 3}, 1);
  ASSERT_TRUE(on_device.Encode(send, x, {}).ok());
  device.refused = {"linear:bits=4"};
  absl::StatusOr<std::string> got = on_device.Encode(send, x, {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("stopped answering"));
}

// A bad send fails and drops the residual: the next send encodes as the
// first of an iteration (here compared with a fresh encoder's payload).
TEST(DeviceLinkEncoder, ShapeChangeOrNonFinite_Fails_ResidualDropped) {
  StandInDevice device;
  DeviceLinkEncoder on_device(&device);
  const v1::Instruction::Send send = GradSend("linear:bits=4", 4, true, false);
  ASSERT_TRUE(on_device.Encode(send, RandomTensor({2, 3}, 1), {}).ok());
  absl::StatusOr<std::string> got = on_device.Encode(send, RandomTensor({3, 2}, 2), {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("does not match the link's residual"));

  const Tensor x = RandomTensor({3, 2}, 3);
  StandInDevice fresh_device;
  DeviceLinkEncoder fresh(&fresh_device);
  EXPECT_EQ(on_device.Encode(send, x, {}).value(), fresh.Encode(send, x, {}).value());

  Tensor bad = RandomTensor({3, 2}, 4);
  bad[5] = std::nanf("");
  got = on_device.Encode(send, bad, {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  DeviceLinkEncoder fresh_again(&fresh_device);
  EXPECT_EQ(on_device.Encode(send, x, {}).value(), fresh_again.Encode(send, x, {}).value());
}

// A codec carries finite values only: a NaN or infinity to send means the
// training diverged, and the job must fail saying so, in the host path's
// words (link_compressor_test.cc), with or without error feedback, not with
// the codec's "only finite values can be encoded". A finite value the codec
// cannot carry stays INVALID_ARGUMENT, and a device error is passed on.
TEST(DeviceLinkEncoder, NonFiniteTensor_TrainingDiverged) {
  StandInDevice device;
  DeviceLinkEncoder on_device(&device);
  for (const bool feedback : {false, true}) {
    for (const float bad : {NAN, INFINITY}) {
      SCOPED_TRACE(::testing::Message() << "feedback " << feedback << " value " << bad);
      const v1::Instruction::Send send = GradSend("piecewise:bits=4", 4, feedback, false);
      Tensor x = RandomTensor({2, 4}, 1);
      x[7] = bad;
      absl::StatusOr<std::string> got = on_device.Encode(send, x, {});
      EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
      EXPECT_THAT(got.status().message(),
                  HasSubstr("training diverged: encoding as piecewise:bits=4 on the device"));
      EXPECT_THAT(got.status().message(), HasSubstr("at element 7"));
      EXPECT_THAT(got.status().message(), HasSubstr("try a lower learning rate"));
    }
  }
  const v1::Instruction::Send fp16 = GradSend("fp16", 3, false, false);
  absl::StatusOr<std::string> too_big =
      on_device.Encode(fp16, Tensor::FromVector({2}, {1, 1e6f}), {});
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument) << too_big.status();

  device.device_error = absl::InternalError("CUDA error: an illegal memory access");
  absl::StatusOr<std::string> failed =
      on_device.Encode(fp16, Tensor::FromVector({2}, {1, NAN}), {});
  EXPECT_EQ(failed.status(), device.device_error);
}

}  // namespace
}  // namespace pipetrain
