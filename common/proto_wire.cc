#include "common/proto_wire.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace pipetrain {
namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;

constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

uint32_t Tag(int number, int wire_type) { return (static_cast<uint32_t>(number) << 3) | wire_type; }

}  // namespace

std::string WireString(int number, absl::string_view value) {
  std::string out;
  {
    StringOutputStream stream(&out);
    CodedOutputStream coded(&stream);
    coded.WriteTag(Tag(number, kLengthDelimited));
    coded.WriteVarint32(static_cast<uint32_t>(value.size()));
    coded.WriteRaw(value.data(), static_cast<int>(value.size()));
  }
  return out;
}

std::string WireVarint(int number, uint64_t value) {
  std::string out;
  {
    StringOutputStream stream(&out);
    CodedOutputStream coded(&stream);
    coded.WriteTag(Tag(number, kVarint));
    coded.WriteVarint64(value);
  }
  return out;
}

uint64_t WireFields::Varint(int number) const {
  auto it = varints.find(number);
  return it == varints.end() ? 0 : it->second.back();
}

std::string WireFields::String(int number) const {
  auto it = strings.find(number);
  return it == strings.end() ? "" : it->second.back();
}

std::vector<std::string> WireFields::Strings(int number) const {
  auto it = strings.find(number);
  return it == strings.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<WireFields> ParseWireFields(absl::string_view bytes) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                      static_cast<int>(bytes.size()));
  WireFields fields;
  while (uint32_t tag = in.ReadTag()) {
    const int number = static_cast<int>(tag >> 3);
    bool ok = true;
    switch (tag & 7) {
      case kVarint: {
        uint64_t value = 0;
        ok = in.ReadVarint64(&value);
        fields.varints[number].push_back(value);
        break;
      }
      case kLengthDelimited: {
        uint32_t length = 0;
        std::string value;
        ok = in.ReadVarint32(&length) && in.ReadString(&value, static_cast<int>(length));
        fields.strings[number].push_back(std::move(value));
        break;
      }
      case kFixed64: {
        uint64_t ignored = 0;
        ok = in.ReadLittleEndian64(&ignored);
        break;
      }
      case kFixed32: {
        uint32_t ignored = 0;
        ok = in.ReadLittleEndian32(&ignored);
        break;
      }
      default:
        ok = false;
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("malformed protobuf encoding at field ",
                                                     number, " (wire type ", tag & 7, ")"));
    }
  }
  if (!in.ConsumedEntireMessage()) {
    return absl::InvalidArgumentError("malformed protobuf encoding: a tag is cut short");
  }
  return fields;
}

}  // namespace pipetrain
