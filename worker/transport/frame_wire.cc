#include "worker/transport/frame_wire.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pipetrain {
namespace {

// Protobuf wire format (protobuf.dev "Encoding"): a field is a varint tag,
// (field_number << 3) | wire_type, then its value.
constexpr int kPayloadField = v1::TensorFrame::kPayloadFieldNumber;
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;
constexpr int kMaxVarintBytes = 10;
constexpr uint64_t kMaxFieldNumber = (uint64_t{1} << 29) - 1;

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

absl::Status Malformed(absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("malformed data-plane frame: ", problem));
}

// Reads the bytes of consecutive pieces as one sequence.
class PieceReader {
 public:
  explicit PieceReader(absl::Span<const absl::string_view> pieces) : pieces_(pieces) {
    for (absl::string_view p : pieces_) remaining_ += p.size();
    SkipEmptyPieces();
  }

  bool done() const { return remaining_ == 0; }
  uint64_t remaining() const { return remaining_; }

  // False if the input ends first or the varint is longer than 10 bytes.
  bool Varint(uint64_t* value) {
    *value = 0;
    for (int i = 0; i < kMaxVarintBytes && !done(); ++i) {
      const uint8_t byte = static_cast<uint8_t>(pieces_[piece_][offset_]);
      Advance(1);
      *value |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  // Appends views of the next `n` bytes to `out`; false (and nothing
  // taken) if fewer remain.
  bool Take(uint64_t n, std::vector<absl::string_view>* out) {
    if (n > remaining_) return false;
    while (n > 0) {
      const absl::string_view rest = pieces_[piece_].substr(offset_);
      const size_t size = static_cast<size_t>(std::min<uint64_t>(n, rest.size()));
      out->push_back(rest.substr(0, size));
      Advance(size);
      n -= size;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    offset_ += n;
    remaining_ -= n;
    SkipEmptyPieces();
  }
  void SkipEmptyPieces() {
    while (piece_ < pieces_.size() && offset_ == pieces_[piece_].size()) {
      ++piece_;
      offset_ = 0;
    }
  }

  absl::Span<const absl::string_view> pieces_;
  size_t piece_ = 0;
  size_t offset_ = 0;
  uint64_t remaining_ = 0;
};

void AppendViews(const std::vector<absl::string_view>& views, std::string* out) {
  for (absl::string_view v : views) out->append(v.data(), v.size());
}

// Copies one non-payload field (its tag already read) into `header`.
absl::Status CopyField(uint64_t tag, PieceReader& in, std::string* header) {
  AppendVarint(tag, header);
  std::vector<absl::string_view> value;
  uint64_t number = 0;
  switch (tag & 7) {
    case kVarint:
      if (!in.Varint(&number)) return Malformed("a varint field is truncated or over 10 bytes");
      AppendVarint(number, header);
      return absl::OkStatus();
    case kFixed64:
    case kFixed32:
      if (!in.Take((tag & 7) == kFixed64 ? 8 : 4, &value)) {
        return Malformed("a fixed-size field runs past the end");
      }
      AppendViews(value, header);
      return absl::OkStatus();
    case kLengthDelimited:
      if (!in.Varint(&number)) return Malformed("a field's length is truncated or over 10 bytes");
      if (!in.Take(number, &value)) {
        return Malformed(absl::StrCat("field ", tag >> 3, " of ", number,
                                      " bytes runs past the end (", in.remaining(), " left)"));
      }
      AppendVarint(number, header);
      AppendViews(value, header);
      return absl::OkStatus();
    default:
      return Malformed(absl::StrCat("field ", tag >> 3, " has wire type ", tag & 7,
                                    " (groups and reserved types are not used by TensorFrame)"));
  }
}

}  // namespace

std::string EncodeFrameHeader(const v1::TensorFrame& header, int64_t payload_bytes) {
  PT_CHECK(header.payload().empty()) << "the payload travels after the header";
  PT_CHECK(payload_bytes >= 0) << payload_bytes;
  std::string bytes = header.SerializeAsString();
  AppendVarint((uint64_t{kPayloadField} << 3) | kLengthDelimited, &bytes);
  AppendVarint(static_cast<uint64_t>(payload_bytes), &bytes);
  return bytes;
}

absl::StatusOr<FrameView> ParseFrame(absl::Span<const absl::string_view> pieces) {
  PieceReader in(pieces);
  FrameView frame;
  std::string header;
  bool has_payload = false;
  while (!in.done()) {
    uint64_t tag = 0;
    if (!in.Varint(&tag)) return Malformed("a field tag is truncated or over 10 bytes");
    const uint64_t field = tag >> 3;
    if (field == 0 || field > kMaxFieldNumber) {
      return Malformed(absl::StrCat("field number ", field, " is outside [1, 2^29)"));
    }
    if (field != kPayloadField) {
      if (absl::Status s = CopyField(tag, in, &header); !s.ok()) return s;
      if (header.size() > kMaxFrameHeaderBytes) {
        return Malformed(absl::StrCat("its header fields take over ", kMaxFrameHeaderBytes,
                                      " bytes (field ", field, " ends at ", header.size(), ")"));
      }
      continue;
    }
    if ((tag & 7) != kLengthDelimited) {
      return Malformed(absl::StrCat("the payload (field ", kPayloadField, ") has wire type ",
                                    tag & 7, ", not length-delimited"));
    }
    if (has_payload) return Malformed("the payload (field 10) appears twice");
    has_payload = true;
    uint64_t size = 0;
    if (!in.Varint(&size)) return Malformed("the payload's length is truncated or over 10 bytes");
    if (!in.Take(size, &frame.payload)) {
      return Malformed(absl::StrCat("a payload of ", size, " bytes runs past the end (",
                                    in.remaining(), " left)"));
    }
    frame.payload_bytes = static_cast<int64_t>(size);
  }
  if (!frame.header.ParseFromString(header)) {
    return Malformed("its header fields do not parse as a pipetrain.v1.TensorFrame");
  }
  // Fields this version does not know would otherwise be kept, and echoed
  // in a FrameError (MakeFrameError copies the tensor key): 8 MiB of them
  // per rejected frame, held past the mailbox's byte limit.
  frame.header.DiscardUnknownFields();
  return frame;
}

}  // namespace pipetrain
