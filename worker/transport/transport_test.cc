// WireTensor, DecodeWireTensor and the Send/Recv conveniences, driven
// through the in-process transport.
#include "worker/transport/transport.h"

#include <cmath>
#include <cstring>
#include <memory>

#include "common/logging.h"
#include "gtest/gtest.h"
#include "kernels/compress/codec_spec.h"
#include "kernels/compress/payload.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(60);  // Deadlines only; never waited out.

TensorAddress Activation(int unit) {
  return {"j-1", /*iteration=*/7, v1::TENSOR_KIND_ACTIVATION, /*micro_batch=*/1, unit};
}

Tensor Wave(const Shape& shape) {
  Tensor t = Tensor::Zeros(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = std::cos(0.21f * static_cast<float>(i)) * 3.f;
  return t;
}

// `t` encoded with `spec`, and the codec's own decoding of that payload.
struct Reference {
  WireTensor wire;
  Tensor decoded;
};

Reference Encode(const std::string& spec, const Tensor& t) {
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(spec);
  PT_CHECK(codec.ok()) << codec.status();
  absl::StatusOr<std::string> payload = (*codec)->Encode(t, nullptr);
  PT_CHECK(payload.ok()) << payload.status();
  absl::StatusOr<Tensor> decoded = (*codec)->Decode(*payload);
  PT_CHECK(decoded.ok()) << decoded.status();
  return {WireTensor::Encoded(spec, *payload, t.shape()), *std::move(decoded)};
}

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.size_bytes())) == 0;
}

TEST(WireTensorTest, Sizes_RawAndEncoded_DescribeWireAndDecodedBytes) {
  const WireTensor raw = WireTensor::Raw(Wave({3, 5}));
  EXPECT_FALSE(raw.encoded());
  EXPECT_EQ(raw.decoded_shape(), (Shape{3, 5}));
  EXPECT_EQ(raw.wire_bytes(), 60);
  EXPECT_EQ(raw.raw_bytes(), 60);

  const WireTensor encoded = WireTensor::Encoded("fp16", std::string(38, 'x'), {3, 5});
  EXPECT_TRUE(encoded.encoded());
  EXPECT_EQ(encoded.decoded_shape(), (Shape{3, 5}));
  EXPECT_EQ(encoded.wire_bytes(), 38);
  EXPECT_EQ(encoded.raw_bytes(), 60);
}

TEST(DecodeWireTensorTest, Encoded_SameValuesAsTheCodecsDecode) {
  for (const char* spec : {"piecewise:bits=3", "token_topk:keep=0.5+piecewise:bits=3"}) {
    SCOPED_TRACE(spec);
    const Reference ref = Encode(spec, Wave({8, 16}));
    absl::StatusOr<Tensor> decoded = DecodeWireTensor(ref.wire, "t");
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_TRUE(BitwiseEqual(*decoded, ref.decoded));
  }
}

TEST(DecodeWireTensorTest, UnknownCodec_InvalidArgumentNamingWhatAndCodec) {
  const WireTensor wire = WireTensor::Encoded("zstd", "payload", {2});
  absl::StatusOr<Tensor> decoded = DecodeWireTensor(wire, "unit 3's input");
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("unit 3's input: codec \"zstd\""), std::string::npos)
      << decoded.status();
}

TEST(DecodeWireTensorTest, ShapeOtherThanSent_InvalidArgument) {
  WireTensor wire = Encode("piecewise:bits=3", Wave({4, 4})).wire;
  wire.shape = {16};
  absl::StatusOr<Tensor> decoded = DecodeWireTensor(wire, "t");
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("announces shape [4, 4] but was sent as [16]"),
            std::string::npos)
      << decoded.status();
}

// Seen while writing fuzz/codec_spec_fuzzer (an input made by hand, then
// run through it): 30 bytes of elem_topk (keep 1e-12, so one kept element)
// announcing 2^39 elements made the receiver allocate 2 TiB, and the failed
// allocation aborted the worker. The frame's shape was [1]: the payload's
// is now checked against it first.
TEST(DecodeWireTensorTest, PayloadAnnouncingLargerShape_InvalidArgumentWithoutDecoding) {
  std::string payload;
  WriteHeader(CodecId::kElemTopK, {int64_t{1} << 39}, &payload);
  ByteWriter w(&payload);
  w.I64(1);    // kept elements
  w.U32(5);    // index
  w.F32(1.f);  // value
  const WireTensor wire = WireTensor::Encoded("elem_topk:keep=1e-12", payload, {1});
  absl::StatusOr<Tensor> decoded = DecodeWireTensor(wire, "t");
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("announces shape [549755813888] but was sent as [1]"),
            std::string::npos)
      << decoded.status();
}

TEST(InProcessTransportTest, SendWireEncoded_RecvWireByteIdenticalAndRecvDecodes) {
  InProcessFabric fabric(2);
  std::unique_ptr<Transport> sender = fabric.Connect(0);
  std::unique_ptr<Transport> receiver = fabric.Connect(1);
  const Reference ref = Encode("piecewise:bits=3", Wave({6, 32}));

  WireTensor sent = ref.wire;
  ASSERT_TRUE(sender->SendWire(1, Activation(1), sent).ok());
  sent.payload.assign(sent.payload.size(), '\0');  // The sender may reuse its buffer.
  absl::StatusOr<WireTensor> got = receiver->RecvWire(0, Activation(1), kPatience);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->codec, "piecewise:bits=3");
  EXPECT_EQ(got->shape, (Shape{6, 32}));
  EXPECT_EQ(got->payload, ref.wire.payload);

  ASSERT_TRUE(sender->SendWire(1, Activation(2), ref.wire).ok());
  absl::StatusOr<Tensor> decoded = receiver->Recv(0, Activation(2), kPatience);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(BitwiseEqual(*decoded, ref.decoded));
}

TEST(InProcessTransportTest, SendRaw_RecvGetsACopy) {
  InProcessFabric fabric(2);
  std::unique_ptr<Transport> sender = fabric.Connect(0);
  std::unique_ptr<Transport> receiver = fabric.Connect(1);
  Tensor t = Wave({5});
  const Tensor expected = t.Clone();
  ASSERT_TRUE(sender->Send(1, Activation(1), t).ok());
  t.Fill(0.f);  // Must not reach the receiver.
  absl::StatusOr<WireTensor> got = receiver->RecvWire(0, Activation(1), kPatience);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->encoded());
  EXPECT_TRUE(BitwiseEqual(got->tensor, expected));
}

TEST(InProcessTransportTest, RecvCorruptPayload_InvalidArgumentNamingTensorAndPeer) {
  InProcessFabric fabric(2);
  std::unique_ptr<Transport> sender = fabric.Connect(0);
  std::unique_ptr<Transport> receiver = fabric.Connect(1);
  ASSERT_TRUE(
      sender->SendWire(1, Activation(4), WireTensor::Encoded("fp16", "not a payload", {2})).ok());
  absl::StatusOr<Tensor> got = receiver->Recv(0, Activation(4), kPatience);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("ACTIVATION of unit 4, micro-batch 1, iteration 7 (job "
                                        "j-1) from stage 0: cannot decode its fp16 payload"),
            std::string::npos)
      << got.status();
}

TEST(InProcessTransportTest, SendWire_NoSuchStage_Unavailable) {
  InProcessFabric fabric(2);
  std::unique_ptr<Transport> sender = fabric.Connect(0);
  EXPECT_EQ(sender->SendWire(2, Activation(1), WireTensor::Raw(Wave({1}))).code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace pipetrain
