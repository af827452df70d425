#include "worker/transport/frame_codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "gtest/gtest.h"
#include "kernels/compress/codec_spec.h"
#include "worker/transport/mailbox.h"

namespace pipetrain {
namespace {

constexpr int64_t kSmallFrame = 64;  // 16 floats per frame.
const AcceptedJob kJob{"j-1", /*num_stages=*/2};

TensorAddress Activation(int unit) {
  return {"j-1", /*iteration=*/7, v1::TENSOR_KIND_ACTIVATION, /*micro_batch=*/1, unit};
}

// Distinct, awkward bit patterns (negative zero, NaN, denormal) per element.
Tensor Ramp(const Shape& shape) {
  Tensor t = Tensor::Zeros(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = 0.25f * static_cast<float>(i) - 3.f;
  if (t.numel() > 2) {
    t[0] = -0.f;
    t[1] = std::numeric_limits<float>::quiet_NaN();
    t[2] = std::numeric_limits<float>::denorm_min();
  }
  return t;
}

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.size_bytes())) == 0;
}

// Feeds every frame; returns the tensor completed by the last one.
absl::StatusOr<std::optional<ReceivedTensor>> FeedAll(FrameAssembler& assembler,
                                                      const std::vector<v1::TensorFrame>& frames) {
  absl::StatusOr<std::optional<ReceivedTensor>> result;
  for (const v1::TensorFrame& frame : frames) {
    result = assembler.Accept(frame, kJob);
    if (!result.ok()) return result;
  }
  return result;
}

// What the data-plane server passes: the mailbox reserves each tensor's
// bytes while it is assembled.
FrameAssembler::Admission ReserveIn(Mailbox& mailbox) {
  return [&mailbox](const TensorAddress& address, int64_t bytes) {
    return mailbox.Reserve(address, bytes);
  };
}

// FeedAll with ReserveIn(mailbox); Puts what the last frame completes,
// with its reservation.
absl::Status FeedAllAdmitted(FrameAssembler& assembler, const std::vector<v1::TensorFrame>& frames,
                             Mailbox& mailbox) {
  for (const v1::TensorFrame& frame : frames) {
    absl::StatusOr<std::optional<ReceivedTensor>> result =
        assembler.Accept(frame, kJob, ReserveIn(mailbox));
    if (!result.ok()) return result.status();
    if (!result->has_value()) continue;
    ReceivedTensor& done = **result;
    return mailbox.Put(done.source_stage, done.address, std::move(done.wire),
                       std::move(done.reservation));
  }
  return absl::InternalError("no tensor completed");
}

template <typename T>
::testing::AssertionResult IsInvalid(const absl::StatusOr<T>& result, const std::string& fragment) {
  if (result.ok()) return ::testing::AssertionFailure() << "accepted; expected: " << fragment;
  const absl::Status& s = result.status();
  if (s.code() != absl::StatusCode::kInvalidArgument ||
      s.message().find(fragment) == absl::string_view::npos) {
    return ::testing::AssertionFailure() << s << "\nexpected INVALID_ARGUMENT with: " << fragment;
  }
  return ::testing::AssertionSuccess();
}

v1::TensorFrame OneFrame(int unit, const Shape& shape) {
  return EncodeTensorFrames(0, Activation(unit), WireTensor::Raw(Ramp(shape)),
                            kMaxFramePayloadBytes)[0];
}

TEST(FrameCodecTest, Encode_SmallerThanFrame_OneFrameWithFullHeader) {
  std::vector<v1::TensorFrame> frames =
      EncodeTensorFrames(1, Activation(3), WireTensor::Raw(Ramp({2, 5})), kSmallFrame);
  ASSERT_EQ(frames.size(), 1u);
  const v1::TensorFrame& f = frames[0];
  EXPECT_EQ(f.job_id(), "j-1");
  EXPECT_EQ(f.iteration(), 7);
  EXPECT_EQ(f.tensor().kind(), v1::TENSOR_KIND_ACTIVATION);
  EXPECT_EQ(f.tensor().micro_batch(), 1);
  EXPECT_EQ(f.tensor().unit(), 3);
  EXPECT_EQ(f.source_stage(), 1);
  EXPECT_EQ(f.dtype(), "f32");
  EXPECT_EQ(f.codec(), "raw");
  EXPECT_EQ(std::vector<int64_t>(f.shape().begin(), f.shape().end()), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(f.total_bytes(), 40);
  EXPECT_EQ(f.offset(), 0);
  EXPECT_EQ(f.payload().size(), 40u);
}

TEST(FrameCodecTest, RoundTrip_SmallerEqualAndLargerThanFrame_BitwiseEqual) {
  for (const Shape& shape : {Shape{10}, Shape{16}, Shape{4, 25}, Shape{}}) {
    SCOPED_TRACE(ShapeToString(shape));
    const Tensor sent = Ramp(shape);
    std::vector<v1::TensorFrame> frames =
        EncodeTensorFrames(1, Activation(3), WireTensor::Raw(sent), kSmallFrame);
    EXPECT_EQ(static_cast<int64_t>(frames.size()), (sent.size_bytes() + 63) / 64);
    FrameAssembler assembler;
    for (size_t i = 0; i + 1 < frames.size(); ++i) {
      absl::StatusOr<std::optional<ReceivedTensor>> partial = assembler.Accept(frames[i], kJob);
      ASSERT_TRUE(partial.ok()) << partial.status();
      EXPECT_FALSE(partial->has_value());
      EXPECT_EQ(frames[i].offset(), static_cast<int64_t>(i) * kSmallFrame);
    }
    absl::StatusOr<std::optional<ReceivedTensor>> done = assembler.Accept(frames.back(), kJob);
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_TRUE(done->has_value());
    EXPECT_EQ((*done)->source_stage, 1);
    EXPECT_EQ((*done)->address, Activation(3));
    EXPECT_TRUE(BitwiseEqual((*done)->wire.tensor, sent));
    EXPECT_FALSE(assembler.in_progress());
  }
}

TEST(FrameCodecTest, RoundTrip_LargerThanFrame_LastFrameCarriesTheRest) {
  std::vector<v1::TensorFrame> frames =
      EncodeTensorFrames(0, Activation(3), WireTensor::Raw(Ramp({100})), 64);
  ASSERT_EQ(frames.size(), 7u);  // 400 bytes: 6 x 64 + 16.
  EXPECT_EQ(frames[6].offset(), 384);
  EXPECT_EQ(frames[6].payload().size(), 16u);
}

TEST(FrameCodecTest, RoundTrip_EmptyTensor_OneEmptyFrame) {
  std::vector<v1::TensorFrame> frames =
      EncodeTensorFrames(0, Activation(3), WireTensor::Raw(Tensor::Zeros({0})), 64);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].total_bytes(), 0);
  EXPECT_TRUE(frames[0].payload().empty());
  FrameAssembler assembler;
  absl::StatusOr<std::optional<ReceivedTensor>> done = assembler.Accept(frames[0], kJob);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_TRUE(done->has_value());
  EXPECT_EQ((*done)->wire.tensor.shape(), (Shape{0}));
  EXPECT_EQ((*done)->wire.tensor.numel(), 0);
}

TEST(FrameCodecTest, Accept_TwoTensorsBackToBack_BothComplete) {
  FrameAssembler assembler;
  for (int unit : {1, 2}) {
    absl::StatusOr<std::optional<ReceivedTensor>> done =
        FeedAll(assembler,
                EncodeTensorFrames(0, Activation(unit), WireTensor::Raw(Ramp({40})), kSmallFrame));
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_TRUE(done->has_value());
    EXPECT_EQ((*done)->address.unit, unit);
  }
}

TEST(FrameCodecTest, Accept_WrongDtype_InvalidArgumentNamingTensor) {
  v1::TensorFrame f = OneFrame(3, {2});
  f.set_dtype("f16");
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob),
                        "frame of ACTIVATION of unit 3, micro-batch 1, iteration 7 (job j-1) from "
                        "stage 0: dtype \"f16\" is not supported"));
}

// Strings a peer sends are quoted by their first 64 bytes, escaped, so a
// rejection (logged, and written back to the peer) stays small whatever
// the header carried.
TEST(FrameCodecTest, Accept_HugeHeaderStrings_QuotedShortAndEscaped) {
  const std::string huge = "\x1b[31m" + std::string(1 << 20, 'x');
  for (int field = 0; field < 3; ++field) {
    v1::TensorFrame f = OneFrame(3, {2});
    if (field == 0) f.set_dtype(huge);
    if (field == 1) f.set_codec(huge);
    if (field == 2) f.set_job_id(huge);
    FrameAssembler assembler;
    absl::StatusOr<std::optional<ReceivedTensor>> result = assembler.Accept(f, kJob);
    ASSERT_FALSE(result.ok()) << field;
    const std::string message(result.status().message());
    EXPECT_LT(message.size(), 600u) << field << ": " << message.substr(0, 600);
    EXPECT_NE(message.find("\\x1b[31mxxx"), std::string::npos) << field << ": " << message;
    EXPECT_NE(message.find("... (1048581 bytes)"), std::string::npos) << field << ": " << message;
  }
}

TEST(FrameCodecTest, Accept_ShapeOfTooManyDimensions_InvalidArgumentBeforeReadingThem) {
  v1::TensorFrame f = OneFrame(3, {2});
  f.clear_shape();
  for (int i = 0; i < 100000; ++i) f.add_shape(1);
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob), "shape of 100000 dimensions; at most 8"));
}

TEST(FrameCodecTest, Accept_WrongCodec_InvalidArgument) {
  v1::TensorFrame f = OneFrame(3, {2});
  f.set_codec("powersgd");  // Not a valid spec: rank is required.
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob), "codec \"powersgd\" is not supported"));
}

TEST(FrameCodecTest, Accept_NegativeDimension_InvalidArgument) {
  v1::TensorFrame f = OneFrame(3, {2});
  f.clear_shape();
  f.add_shape(2);
  f.add_shape(-1);
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob), "shape [2, -1] has a negative dimension"));
}

TEST(FrameCodecTest, Accept_TotalBytesNotMatchingShape_InvalidArgument) {
  v1::TensorFrame f = OneFrame(3, {2, 2});
  f.set_total_bytes(12);
  f.set_payload(std::string(12, 'x'));
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob),
                        "total_bytes 12 does not match shape [2, 2] of f32 (16 bytes)"));
}

TEST(FrameCodecTest, Accept_TensorOverSizeLimit_InvalidArgumentWithoutAllocating) {
  FrameAssembler small(/*max_tensor_bytes=*/1024);
  EXPECT_TRUE(IsInvalid(small.Accept(OneFrame(3, {257}), kJob),
                        "shape [257] is over the data-plane limit of 1024 bytes per tensor"));
  v1::TensorFrame huge = OneFrame(3, {1});
  huge.clear_shape();
  huge.add_shape(int64_t{1} << 40);
  huge.add_shape(int64_t{1} << 40);  // numel overflows int64.
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(huge, kJob), "is over the data-plane limit"));
}

// Found by fuzz/frame_fuzzer: an empty raw tensor whose other dims
// overflow int64 ([2^62, 4, 0], total_bytes 0) passed the size check, and
// allocating it multiplied the dims with signed overflow.
TEST(FrameCodecTest, Accept_EmptyShapeWithHugeDims_InvalidArgument) {
  v1::TensorFrame f = OneFrame(3, {0});
  f.clear_shape();
  f.add_shape(int64_t{1} << 62);
  f.add_shape(4);
  f.add_shape(0);
  ASSERT_EQ(f.total_bytes(), 0);
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob),
                        "shape [4611686018427387904, 4, 0] is over the data-plane limit"));
  // Zero dims beside dims within the limit still make an empty tensor.
  f.clear_shape();
  f.add_shape(1024);
  f.add_shape(0);
  auto empty = assembler.Accept(f, kJob);
  ASSERT_TRUE(empty.ok()) << empty.status();
  ASSERT_TRUE(empty->has_value());
  EXPECT_EQ((*empty)->wire.tensor.shape(), (Shape{1024, 0}));
}

TEST(FrameCodecTest, Accept_FirstFrameNotAtOffsetZero_InvalidArgument) {
  std::vector<v1::TensorFrame> frames =
      EncodeTensorFrames(0, Activation(3), WireTensor::Raw(Ramp({40})), 64);
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(frames[1], kJob),
                        "frame offset 64 is not the 0 bytes received so far"));
}

TEST(FrameCodecTest, Accept_SkippedFrame_InvalidArgumentAndPartialDropped) {
  std::vector<v1::TensorFrame> frames =
      EncodeTensorFrames(0, Activation(3), WireTensor::Raw(Ramp({40})), 64);
  FrameAssembler assembler;
  ASSERT_TRUE(assembler.Accept(frames[0], kJob).ok());
  EXPECT_TRUE(assembler.in_progress());
  EXPECT_TRUE(IsInvalid(assembler.Accept(frames[2], kJob),
                        "frame offset 128 is not the 64 bytes received so far"));
  EXPECT_FALSE(assembler.in_progress());
}

TEST(FrameCodecTest, Accept_PayloadPastTotalBytes_InvalidArgument) {
  std::vector<v1::TensorFrame> frames =
      EncodeTensorFrames(0, Activation(3), WireTensor::Raw(Ramp({100})), 64);
  frames[6].mutable_payload()->append(4, '\0');
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(FeedAll(assembler, frames),
                        "payload of 20 bytes at offset 384 runs past total_bytes 400"));
}

// A frame's payload is at most kMaxFramePayloadBytes (operations.md), not
// whatever fits under the gRPC message limit: a peer's 4 MiB + 4 bytes
// frame of a larger tensor is refused.
TEST(FrameCodecTest, Accept_PayloadOverTheFrameBound_InvalidArgument) {
  const int64_t numel = kMaxFramePayloadBytes / 4 + 2;
  std::vector<v1::TensorFrame> frames =
      EncodeTensorFrames(0, Activation(3), WireTensor::Raw(Ramp({numel})), kMaxFramePayloadBytes);
  ASSERT_EQ(frames.size(), 2u);
  frames[0].mutable_payload()->append(frames[1].payload());
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(frames[0], kJob),
                        "payload of 4194312 bytes is over the 4194304 a frame may carry"));
}

TEST(FrameCodecTest, Accept_OtherTensorWhileIncomplete_InvalidArgumentNamingBoth) {
  std::vector<v1::TensorFrame> first =
      EncodeTensorFrames(0, Activation(1), WireTensor::Raw(Ramp({100})), 64);
  std::vector<v1::TensorFrame> second =
      EncodeTensorFrames(0, Activation(2), WireTensor::Raw(Ramp({100})), 64);
  FrameAssembler assembler;
  ASSERT_TRUE(assembler.Accept(first[0], kJob).ok());
  EXPECT_TRUE(IsInvalid(assembler.Accept(second[0], kJob),
                        "frame of ACTIVATION of unit 2, micro-batch 1, iteration 7 (job j-1) from "
                        "stage 0: it arrived while ACTIVATION of unit 1, micro-batch 1, iteration "
                        "7 (job j-1) from stage 0 is incomplete (64 of 400 bytes)"));
  EXPECT_FALSE(assembler.in_progress());
}

// Two tensors' frames interleaved (P0, Y0, P1, Y1, ...): one error, at Y0;
// the rest of both is dropped silently (each frame of both cost an
// error), and a tensor sent whole after them is taken.
TEST(FrameCodecTest, Accept_InterleavedTensors_OneErrorThenBothDropped) {
  std::vector<v1::TensorFrame> p =
      EncodeTensorFrames(0, Activation(1), WireTensor::Raw(Ramp({100})), 64);
  std::vector<v1::TensorFrame> y =
      EncodeTensorFrames(0, Activation(2), WireTensor::Raw(Ramp({100})), 64);
  FrameAssembler assembler;
  ASSERT_TRUE(assembler.Accept(p[0], kJob).ok());
  EXPECT_TRUE(IsInvalid(assembler.Accept(y[0], kJob), "it arrived while ACTIVATION of unit 1"));
  // The dropped one is named, for its receiver to hear of it at once.
  ASSERT_TRUE(assembler.interrupted().has_value());
  EXPECT_EQ(assembler.interrupted()->first, 0);
  EXPECT_EQ(assembler.interrupted()->second, Activation(1));
  for (size_t i = 1; i < p.size(); ++i) {
    for (const v1::TensorFrame* f : {&p[i], &y[i]}) {
      absl::StatusOr<std::optional<ReceivedTensor>> dropped = assembler.Accept(*f, kJob);
      ASSERT_TRUE(dropped.ok()) << "frame " << i << ": " << dropped.status();
      EXPECT_FALSE(dropped->has_value());
    }
  }
  absl::StatusOr<std::optional<ReceivedTensor>> good =
      FeedAll(assembler, EncodeTensorFrames(0, Activation(3), WireTensor::Raw(Ramp({40})), 64));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(good->has_value());
}

TEST(FrameCodecTest, Accept_OtherTensorMidStreamWhileIncomplete_InvalidArgument) {
  std::vector<v1::TensorFrame> first =
      EncodeTensorFrames(0, Activation(1), WireTensor::Raw(Ramp({100})), 64);
  std::vector<v1::TensorFrame> second =
      EncodeTensorFrames(0, Activation(2), WireTensor::Raw(Ramp({100})), 64);
  FrameAssembler assembler;
  ASSERT_TRUE(assembler.Accept(first[0], kJob).ok());
  EXPECT_TRUE(
      IsInvalid(assembler.Accept(second[1], kJob), "it arrived while ACTIVATION of unit 1"));
}

TEST(FrameCodecTest, Accept_HeaderChangesWithinTensor_InvalidArgument) {
  std::vector<v1::TensorFrame> frames =
      EncodeTensorFrames(0, Activation(3), WireTensor::Raw(Ramp({4, 25})), 64);
  frames[1].clear_shape();
  frames[1].add_shape(100);
  FrameAssembler assembler;
  ASSERT_TRUE(assembler.Accept(frames[0], kJob).ok());
  EXPECT_TRUE(IsInvalid(assembler.Accept(frames[1], kJob),
                        "header changed within the tensor: codec raw, shape [100], total_bytes "
                        "400 after codec raw, shape [4, 25], total_bytes 400"));
}

TEST(FrameCodecTest, Accept_UnspecifiedKind_InvalidArgument) {
  v1::TensorFrame f = OneFrame(3, {2});
  f.mutable_tensor()->set_kind(v1::TENSOR_KIND_UNSPECIFIED);
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob),
                        "frame of TENSOR_KIND_UNSPECIFIED of unit 3, micro-batch 1, iteration 7 "
                        "(job j-1) from stage 0: tensor kind is TENSOR_KIND_UNSPECIFIED"));
}

TEST(FrameCodecTest, Accept_UnknownKind_InvalidArgumentSpellingTheNumber) {
  v1::TensorFrame f = OneFrame(3, {2});
  f.mutable_tensor()->set_kind(static_cast<v1::TensorKind>(99));
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob),
                        "frame of tensor kind 99 of unit 3, micro-batch 1, iteration 7 (job j-1) "
                        "from stage 0: tensor kind 99 is unknown"));
}

TEST(FrameCodecTest, Accept_NegativeIteration_InvalidArgument) {
  v1::TensorFrame f = OneFrame(3, {2});
  f.set_iteration(-5);
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob), "iteration -5 is negative"));
}

TEST(FrameCodecTest, Accept_SourceStageOutOfRange_InvalidArgument) {
  FrameAssembler assembler;
  for (int stage : {2, -1}) {
    v1::TensorFrame f = OneFrame(3, {2});
    f.set_source_stage(stage);
    EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob), "source stage " + std::to_string(stage) +
                                                         " is outside [0, 2) for job j-1"));
  }
}

TEST(FrameCodecTest, Accept_WrongJob_InvalidArgument) {
  v1::TensorFrame f = OneFrame(3, {2});
  f.set_job_id("j-0");
  FrameAssembler assembler;
  EXPECT_TRUE(
      IsInvalid(assembler.Accept(f, kJob), "wrong job \"j-0\"; this worker runs job \"j-1\""));
}

TEST(FrameCodecTest, Accept_NoJobAssigned_InvalidArgument) {
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(OneFrame(3, {2}), AcceptedJob{}),
                        "this worker has no job assigned, so job \"j-1\" is not accepted"));
}

TEST(FrameCodecTest, Accept_RestOfRejectedTensor_DroppedSilentlyThenNextTensorWorks) {
  std::vector<v1::TensorFrame> bad =
      EncodeTensorFrames(0, Activation(3), WireTensor::Raw(Ramp({40})), 64);
  for (v1::TensorFrame& f : bad) f.set_job_id("j-0");
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(bad[0], kJob), "wrong job"));
  for (size_t i = 1; i < bad.size(); ++i) {
    absl::StatusOr<std::optional<ReceivedTensor>> dropped = assembler.Accept(bad[i], kJob);
    ASSERT_TRUE(dropped.ok()) << dropped.status();
    EXPECT_FALSE(dropped->has_value());
  }
  absl::StatusOr<std::optional<ReceivedTensor>> good =
      FeedAll(assembler, EncodeTensorFrames(0, Activation(3), WireTensor::Raw(Ramp({40})), 64));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(good->has_value());
}

// A real compressed payload of a finite tensor of `shape`.
WireTensor Encoded(const std::string& spec, const Shape& shape) {
  Tensor t = Tensor::Zeros(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = std::sin(0.37f * static_cast<float>(i)) * 2.f;
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(spec);
  PT_CHECK(codec.ok()) << codec.status();
  absl::StatusOr<std::string> payload = (*codec)->Encode(t, nullptr);
  PT_CHECK(payload.ok()) << payload.status();
  return WireTensor::Encoded(spec, *std::move(payload), shape);
}

TEST(FrameCodecTest, Encode_EncodedWire_HeaderCarriesSpecDecodedShapeAndPayloadSize) {
  const WireTensor wire = Encoded("piecewise:bits=3", {4, 25});
  std::vector<v1::TensorFrame> frames = EncodeTensorFrames(1, Activation(3), wire);
  ASSERT_EQ(frames.size(), 1u);
  const v1::TensorFrame& f = frames[0];
  EXPECT_EQ(f.dtype(), "f32");
  EXPECT_EQ(f.codec(), "piecewise:bits=3");
  EXPECT_EQ(std::vector<int64_t>(f.shape().begin(), f.shape().end()),
            (std::vector<int64_t>{4, 25}));
  EXPECT_EQ(f.total_bytes(), static_cast<int64_t>(wire.payload.size()));
  EXPECT_EQ(f.payload(), wire.payload);
}

TEST(FrameCodecTest, RoundTrip_EncodedPayloadInSeveralFrames_ByteExact) {
  for (const char* spec : {"piecewise:bits=3", "token_topk:keep=0.5+piecewise:bits=3"}) {
    SCOPED_TRACE(spec);
    const WireTensor sent = Encoded(spec, {8, 64});
    constexpr int64_t kTinyFrame = 16;
    std::vector<v1::TensorFrame> frames = EncodeTensorFrames(1, Activation(3), sent, kTinyFrame);
    const int64_t size = static_cast<int64_t>(sent.payload.size());
    ASSERT_GT(size, 3 * kTinyFrame);
    EXPECT_EQ(static_cast<int64_t>(frames.size()), (size + kTinyFrame - 1) / kTinyFrame);
    FrameAssembler assembler;
    for (size_t i = 0; i + 1 < frames.size(); ++i) {
      absl::StatusOr<std::optional<ReceivedTensor>> partial = assembler.Accept(frames[i], kJob);
      ASSERT_TRUE(partial.ok()) << partial.status();
      EXPECT_FALSE(partial->has_value());
    }
    absl::StatusOr<std::optional<ReceivedTensor>> done = assembler.Accept(frames.back(), kJob);
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_TRUE(done->has_value());
    const WireTensor& got = (*done)->wire;
    EXPECT_EQ((*done)->address, Activation(3));
    EXPECT_TRUE(got.encoded());
    EXPECT_TRUE(got.tensor.is_null());
    EXPECT_EQ(got.codec, spec);
    EXPECT_EQ(got.shape, (Shape{8, 64}));
    EXPECT_EQ(got.payload, sent.payload);  // Byte for byte.
    EXPECT_FALSE(assembler.in_progress());
  }
}

TEST(FrameCodecTest, Accept_EncodedThenRaw_BothComplete) {
  FrameAssembler assembler;
  absl::StatusOr<std::optional<ReceivedTensor>> encoded =
      FeedAll(assembler, EncodeTensorFrames(0, Activation(1), Encoded("fp16", {40}), 16));
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  ASSERT_TRUE(encoded->has_value());
  EXPECT_EQ((*encoded)->wire.codec, "fp16");
  absl::StatusOr<std::optional<ReceivedTensor>> raw = FeedAll(
      assembler, EncodeTensorFrames(0, Activation(2), WireTensor::Raw(Ramp({40})), kSmallFrame));
  ASSERT_TRUE(raw.ok()) << raw.status();
  ASSERT_TRUE(raw->has_value());
  EXPECT_FALSE((*raw)->wire.encoded());
  EXPECT_TRUE(BitwiseEqual((*raw)->wire.tensor, Ramp({40})));
}

TEST(FrameCodecTest, Accept_UnknownCodecSpec_InvalidArgumentNamingTensorAndCodec) {
  v1::TensorFrame f = EncodeTensorFrames(0, Activation(3), Encoded("piecewise:bits=3", {8}))[0];
  f.set_codec("zstd:level=3");
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob),
                        "frame of ACTIVATION of unit 3, micro-batch 1, iteration 7 (job j-1) from "
                        "stage 0: codec \"zstd:level=3\" is not supported"));
  EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob), "unknown codec \"zstd\""));
}

TEST(FrameCodecTest, Accept_EncodedTotalBytesOverLimit_InvalidArgument) {
  v1::TensorFrame f = EncodeTensorFrames(0, Activation(3), Encoded("fp16", {8}))[0];
  f.set_total_bytes(1025);
  FrameAssembler assembler(/*max_tensor_bytes=*/1024);
  EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob),
                        "total_bytes 1025 of a fp16 payload is over the data-plane limit of 1024 "
                        "bytes per tensor"));
}

TEST(FrameCodecTest, Accept_EncodedDecodedShapeOverLimit_InvalidArgument) {
  // A small payload claiming a huge decoded tensor: refused before decoding.
  v1::TensorFrame f = EncodeTensorFrames(0, Activation(3), Encoded("fp16", {8}))[0];
  f.clear_shape();
  f.add_shape(257);
  FrameAssembler assembler(/*max_tensor_bytes=*/1024);
  EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob),
                        "shape [257] is over the data-plane limit of 1024 bytes per tensor"));
}

TEST(FrameCodecTest, Accept_EncodedWithoutPayload_InvalidArgument) {
  v1::TensorFrame f = EncodeTensorFrames(0, Activation(3), Encoded("fp16", {8}))[0];
  f.set_total_bytes(0);
  f.clear_payload();
  FrameAssembler assembler;
  EXPECT_TRUE(IsInvalid(assembler.Accept(f, kJob),
                        "total_bytes 0 of a fp16 payload is below 1; a payload always has a "
                        "header"));
}

TEST(FrameCodecTest, Accept_CodecChangesWithinTensor_InvalidArgument) {
  std::vector<v1::TensorFrame> frames =
      EncodeTensorFrames(0, Activation(3), Encoded("fp16", {40}), 16);
  ASSERT_GE(frames.size(), 2u);
  frames[1].set_codec("bf16");
  FrameAssembler assembler;
  ASSERT_TRUE(assembler.Accept(frames[0], kJob).ok());
  EXPECT_TRUE(IsInvalid(assembler.Accept(frames[1], kJob),
                        "header changed within the tensor: codec bf16, shape [40]"));
  EXPECT_FALSE(assembler.in_progress());
}

// Two streams (one assembler each) start tensors that fit the mailbox's
// limit alone but not together: the second is refused before anything of
// it is allocated, until the first is done.
TEST(FrameCodecTest, Accept_TwoStreamsPartialsOverMailboxLimit_SecondRefusedUntilFirstPut) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 600});
  const std::vector<v1::TensorFrame> first =
      EncodeTensorFrames(0, Activation(1), WireTensor::Raw(Ramp({100})), 64);  // 400 bytes
  const std::vector<v1::TensorFrame> second =
      EncodeTensorFrames(1, Activation(2), WireTensor::Raw(Ramp({100})), 64);
  FrameAssembler stream_a, stream_b;
  ASSERT_TRUE(stream_a.Accept(first[0], kJob, ReserveIn(mailbox)).ok());
  EXPECT_EQ(mailbox.reserved(), 400);

  absl::StatusOr<std::optional<ReceivedTensor>> refused =
      stream_b.Accept(second[0], kJob, ReserveIn(mailbox));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_FALSE(stream_b.in_progress());
  EXPECT_EQ(mailbox.reserved(), 400);

  // The first completes and is stored with its reservation: 400 bytes wait,
  // none are reserved, and the second still does not fit.
  absl::StatusOr<std::optional<ReceivedTensor>> done = std::optional<ReceivedTensor>();
  for (size_t i = 1; i < first.size(); ++i) {
    done = stream_a.Accept(first[i], kJob, ReserveIn(mailbox));
  }
  ASSERT_TRUE(done.ok() && done->has_value()) << done.status();
  EXPECT_EQ((*done)->reservation.bytes(), 400);
  ASSERT_TRUE(mailbox
                  .Put((*done)->source_stage, (*done)->address, std::move((*done)->wire),
                       std::move((*done)->reservation))
                  .ok());
  EXPECT_EQ(mailbox.bytes(), 400);
  EXPECT_EQ(mailbox.reserved(), 0);
  EXPECT_EQ(stream_b.Accept(second[0], kJob, ReserveIn(mailbox)).status().code(),
            absl::StatusCode::kResourceExhausted);

  // Taken: now it fits.
  ASSERT_TRUE(mailbox.Take(0, Activation(1), absl::ZeroDuration()).ok());
  EXPECT_TRUE(FeedAllAdmitted(stream_b, second, mailbox).ok());
}

// A tensor abandoned part-way gives its bytes back: a rejected frame
// (here a header that changes), or its stream's assembler destroyed.
TEST(FrameCodecTest, Accept_PartialAbandoned_ReservationGivenBack) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 600});
  std::vector<v1::TensorFrame> frames =
      EncodeTensorFrames(0, Activation(3), WireTensor::Raw(Ramp({4, 25})), 64);  // 400 bytes
  {
    FrameAssembler stream;
    ASSERT_TRUE(stream.Accept(frames[0], kJob, ReserveIn(mailbox)).ok());
    EXPECT_EQ(mailbox.reserved(), 400);
    v1::TensorFrame changed = frames[1];
    changed.clear_shape();
    changed.add_shape(100);
    EXPECT_TRUE(IsInvalid(stream.Accept(changed, kJob, ReserveIn(mailbox)), "header changed"));
    EXPECT_EQ(mailbox.reserved(), 0);

    ASSERT_TRUE(stream.Accept(frames[0], kJob, ReserveIn(mailbox)).ok());
    EXPECT_EQ(mailbox.reserved(), 400);
  }  // The stream ends with the tensor incomplete.
  EXPECT_EQ(mailbox.reserved(), 0);
  EXPECT_EQ(mailbox.bytes(), 0);
}

// Abandon (a stream ending on a job change) frees the incomplete tensor at
// once, its stream still open; what follows of it is refused.
TEST(FrameCodecTest, Abandon_PartialTensor_ReservationGivenBackAtOnce) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 600});
  const std::vector<v1::TensorFrame> frames =
      EncodeTensorFrames(0, Activation(3), WireTensor::Raw(Ramp({4, 25})), 64);  // 400 bytes
  FrameAssembler stream;
  ASSERT_TRUE(stream.Accept(frames[0], kJob, ReserveIn(mailbox)).ok());
  EXPECT_EQ(mailbox.reserved(), 400);
  stream.Abandon();
  EXPECT_FALSE(stream.in_progress());
  EXPECT_EQ(mailbox.reserved(), 0);
  EXPECT_EQ(stream.Accept(frames[1], kJob, ReserveIn(mailbox)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mailbox.reserved(), 0);
}

TEST(FrameCodecTest, CheckSendable_GoodRawAndEncoded_Ok) {
  EXPECT_TRUE(CheckSendable(WireTensor::Raw(Ramp({3})), "t").ok());
  EXPECT_TRUE(CheckSendable(Encoded("piecewise:bits=3", {3}), "t").ok());
}

TEST(FrameCodecTest, CheckSendable_BadWire_InvalidArgumentNamingIt) {
  const std::pair<WireTensor, std::string> cases[] = {
      {WireTensor::Raw(Tensor()), "null tensor for the tensor"},
      {WireTensor::Encoded("zstd", "x", {1}), "the tensor: codec \"zstd\" is not a codec spec"},
      {WireTensor::Encoded("fp16", "", {1}), "the tensor: empty fp16 payload"},
      {WireTensor::Encoded("fp16", "x", {-1}), "the tensor: shape [-1] has a negative dimension"},
      // More dimensions than a receiver takes (it refused them only after
      // the whole tensor was sent).
      {WireTensor::Encoded("fp16", "x", Shape(9, 1)),
       "the tensor: shape [1, 1, 1, 1, 1, 1, 1, 1, 1] has 9 dimensions; a frame carries at most 8"},
      {WireTensor::Raw(Tensor::Zeros(Shape(9, 1))), "has 9 dimensions"},
  };
  for (const auto& [wire, fragment] : cases) {
    const absl::Status status = CheckSendable(wire, "the tensor");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(fragment), absl::string_view::npos) << status;
  }
}

TEST(FrameCodecTest, MakeFrameError_CopiesKeyIterationAndStatus) {
  v1::TensorFrame f = OneFrame(3, {2});
  v1::FrameError e = MakeFrameError(f, absl::InvalidArgumentError("bad"));
  EXPECT_EQ(e.tensor().kind(), v1::TENSOR_KIND_ACTIVATION);
  EXPECT_EQ(e.tensor().unit(), 3);
  EXPECT_EQ(e.tensor().micro_batch(), 1);
  EXPECT_EQ(e.iteration(), 7);
  EXPECT_EQ(e.error(), "INVALID_ARGUMENT: bad");
}

// Up to 64 replies wait per stream: each is kept small, and cut at a
// character's start (a proto3 string must be valid UTF-8 for the sender to
// parse the reply).
TEST(FrameCodecTest, MakeFrameError_LongTextCutAtACharacter) {
  const v1::TensorFrame f = OneFrame(3, {2});
  // "INVALID_ARGUMENT: x" is 19 bytes; then 2-byte characters, so byte
  // 4096 falls inside one.
  std::string message = "x";
  while (message.size() < 8192) message += "\xc3\xa9";
  const v1::FrameError e = MakeFrameError(f, absl::InvalidArgumentError(message));
  EXPECT_EQ(e.error().size(), kMaxFrameErrorBytes - 1);
  v1::FrameError parsed;
  EXPECT_TRUE(parsed.ParseFromString(e.SerializeAsString()));
  EXPECT_EQ(parsed.error(), e.error());
}

}  // namespace
}  // namespace pipetrain
