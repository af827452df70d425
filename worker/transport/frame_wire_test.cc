#include "worker/transport/frame_wire.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

v1::TensorFrame Header() {
  v1::TensorFrame header;
  header.set_job_id("job-1");
  header.set_iteration(7);
  header.mutable_tensor()->set_kind(v1::TENSOR_KIND_ACTIVATION);
  header.mutable_tensor()->set_unit(3);
  header.mutable_tensor()->set_micro_batch(1);
  header.set_source_stage(2);
  header.set_dtype("f32");
  header.add_shape(2);
  header.add_shape(5);
  header.set_codec("raw");
  header.set_total_bytes(40);
  header.set_offset(8);
  return header;
}

std::string Bytes(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(i * 7 + 1));
  return s;
}

std::string Joined(const FrameView& frame) {
  std::string s;
  for (absl::string_view p : frame.payload) s.append(p.data(), p.size());
  return s;
}

// Cuts `bytes` into pieces at every `step` bytes, as gRPC's slices might be.
std::vector<absl::string_view> Cut(const std::string& bytes, size_t step) {
  std::vector<absl::string_view> pieces;
  for (size_t i = 0; i < bytes.size(); i += step) {
    pieces.push_back(absl::string_view(bytes).substr(i, step));
  }
  return pieces;
}

TEST(FrameWireTest, EncodedHeaderPlusPayload_IsTheProtobufSerialization) {
  const std::string payload = Bytes(32);
  const std::string wire = EncodeFrameHeader(Header(), 32) + payload;
  v1::TensorFrame parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  v1::TensorFrame expected = Header();
  expected.set_payload(payload);
  EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString());
}

TEST(FrameWireTest, ParseFrame_AnySlicing_ReturnsHeaderAndPayloadViews) {
  const std::string payload = Bytes(300);
  const std::string wire = EncodeFrameHeader(Header(), 300) + payload;
  for (size_t step : {size_t{1}, size_t{3}, size_t{64}, wire.size()}) {
    const std::vector<absl::string_view> pieces = Cut(wire, step);
    absl::StatusOr<FrameView> frame = ParseFrame(pieces);
    ASSERT_TRUE(frame.ok()) << frame.status();
    EXPECT_EQ(frame->header.SerializeAsString(), Header().SerializeAsString()) << step;
    EXPECT_EQ(frame->payload_bytes, 300);
    EXPECT_EQ(Joined(*frame), payload);
    // Views, not copies: each piece points into the input.
    EXPECT_GE(frame->payload.front().data(), wire.data());
    EXPECT_LT(frame->payload.back().data(), wire.data() + wire.size());
  }
}

// Protobuf keeps fields it does not know; a receiver echoes a rejected
// frame's tensor key in its FrameError, so 1 MiB of unknown fields in the
// key became 1 MiB per queued reply. They are dropped at the parse.
TEST(FrameWireTest, ParseFrame_UnknownFields_Dropped) {
  v1::TensorFrame header = Header();
  v1::TensorKey* key = header.mutable_tensor();
  key->GetReflection()->MutableUnknownFields(key)->AddLengthDelimited(99,
                                                                      std::string(32 << 10, 'u'));
  header.GetReflection()->MutableUnknownFields(&header)->AddVarint(98, 7);
  const std::string wire = EncodeFrameHeader(header, 0);
  const std::vector<absl::string_view> pieces = {wire};
  absl::StatusOr<FrameView> frame = ParseFrame(pieces);
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->header.SerializeAsString(), Header().SerializeAsString());
}

TEST(FrameWireTest, ParseFrame_ProtobufSerializedFrame_FieldsInAnyOrderAreRead) {
  v1::TensorFrame frame = Header();
  frame.set_payload(Bytes(16));
  // Payload first, then the header's fields: still one valid message.
  v1::TensorFrame payload_only;
  payload_only.set_payload(frame.payload());
  v1::TensorFrame header_only = Header();
  const std::string wire = payload_only.SerializeAsString() + header_only.SerializeAsString();
  absl::StatusOr<FrameView> parsed = ParseFrame(Cut(wire, 5));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->header.SerializeAsString(), Header().SerializeAsString());
  EXPECT_EQ(Joined(*parsed), frame.payload());
}

TEST(FrameWireTest, ParseFrame_EmptyPayloadAndEmptyMessage_AreValid) {
  const std::string wire = EncodeFrameHeader(Header(), 0);
  absl::StatusOr<FrameView> frame = ParseFrame(Cut(wire, 4));
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->payload_bytes, 0);
  EXPECT_TRUE(frame->payload.empty());
  absl::StatusOr<FrameView> empty = ParseFrame({});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->header.job_id(), "");
}

void ExpectMalformed(const std::string& wire, const std::string& problem) {
  absl::StatusOr<FrameView> frame = ParseFrame(Cut(wire, 3));
  ASSERT_FALSE(frame.ok()) << problem;
  EXPECT_EQ(frame.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(frame.status().message().find("malformed data-plane frame: " + problem),
            std::string::npos)
      << frame.status();
}

// Header fields are bounded before protobuf parses them: a packed shape of
// 8 MiB of one-byte entries would parse into 64 MiB of int64s.
TEST(FrameWireTest, ParseFrame_HeaderOverTheLimit_IsMalformedBeforeParsing) {
  std::string packed_shape = "\x32";            // field 6 (shape), length-delimited
  const size_t entries = kMaxFrameHeaderBytes;  // one byte each
  std::string length;
  for (uint64_t v = entries;; v >>= 7) {
    length += static_cast<char>((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
    if (v < 0x80) break;
  }
  packed_shape += length + std::string(entries, '\0');
  ExpectMalformed(packed_shape, "its header fields take over 65536 bytes (field 6");
  // At the limit, fields still parse (here the shape's own bound is the
  // frame codec's, checked after).
  std::string job = "\x0a";  // field 1 (job_id)
  const size_t id_bytes = kMaxFrameHeaderBytes - 4;
  length.clear();
  for (uint64_t v = id_bytes;; v >>= 7) {
    length += static_cast<char>((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
    if (v < 0x80) break;
  }
  job += length + std::string(id_bytes, 'j');
  ASSERT_LE(job.size(), kMaxFrameHeaderBytes);
  const std::vector<absl::string_view> pieces = {job};
  absl::StatusOr<FrameView> frame = ParseFrame(pieces);
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->header.job_id().size(), id_bytes);
}

TEST(FrameWireTest, ParseFrame_TruncatedPayload_IsMalformed) {
  const std::string wire = EncodeFrameHeader(Header(), 100) + Bytes(99);
  ExpectMalformed(wire, "a payload of 100 bytes runs past the end (99 left)");
}

TEST(FrameWireTest, ParseFrame_HugeDeclaredLength_IsMalformedWithoutAllocating) {
  std::string wire = "\x52";                           // field 10, length-delimited
  wire += "\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01";  // 2^64 - 1
  ExpectMalformed(wire, "a payload of 18446744073709551615 bytes runs past the end (0 left)");
}

TEST(FrameWireTest, ParseFrame_BadEncodings_AreMalformed) {
  ExpectMalformed("\x52\x02xx\x52\x00", "the payload (field 10) appears twice");
  ExpectMalformed("\x50\x05", "the payload (field 10) has wire type 0, not length-delimited");
  ExpectMalformed(std::string("\x00\x01", 2), "field number 0 is outside [1, 2^29)");
  ExpectMalformed("\x0b", "field 1 has wire type 3");  // a group
  ExpectMalformed("\x08", "a varint field is truncated");
  ExpectMalformed("\x08\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
                  "a varint field is truncated or over 10 bytes");
  ExpectMalformed("\x80", "a field tag is truncated");
  ExpectMalformed(
      "\x0a\x05"
      "ab",
      "field 1 of 5 bytes runs past the end (2 left)");
  ExpectMalformed("\x11\x01\x02", "a fixed-size field runs past the end");
  // job_id (field 1, a string) that is not UTF-8: protobuf refuses it.
  ExpectMalformed("\x0a\x02\xff\xfe", "its header fields do not parse");
}

}  // namespace
}  // namespace pipetrain
