#include "coordinator/store/store.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pipetrain {
namespace {

// Messages quote at most this much of a bad key: enough to find the caller,
// without pasting a 512-byte key into a log line.
constexpr size_t kQuotedKeyBytes = 64;

std::string Quote(const std::string& key) {
  absl::string_view shown(key);
  const bool cut = shown.size() > kQuotedKeyBytes;
  if (cut) shown = shown.substr(0, kQuotedKeyBytes);
  return absl::StrCat("\"", absl::CHexEscape(shown), cut ? "...\"" : "\"");
}

}  // namespace

absl::Status CheckStoreKey(const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("store key is empty");
  if (key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("store key ", Quote(key), " is ", key.size(),
                                                   " bytes; the limit is ", kMaxKeyBytes));
  }
  // Printable ASCII: ' ' (0x20) through '~' (0x7e). This keeps keys readable
  // in logs and lets every backend order them by plain byte comparison.
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat("store key ", Quote(key), " has byte 0x",
                                                     absl::Hex(c, absl::kZeroPad2), " at offset ",
                                                     i, "; keys are printable ASCII (0x20-0x7e)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckStoredEntry(absl::string_view where, absl::string_view key, size_t value_bytes) {
  // Built only for an error: this runs for every entry read.
  const auto shown = [key] {
    return absl::StrCat("\"", absl::CHexEscape(key.substr(0, 64)),
                        key.size() > 64 ? "...\"" : "\"");
  };
  if (!CheckStoreKey(std::string(key.substr(0, kMaxKeyBytes + 1))).ok()) {
    return absl::DataLossError(absl::StrCat(
        where, " holds key ", shown(), ", which no write makes (printable ASCII, at most ",
        kMaxKeyBytes, " bytes): damaged, or written by another program; remove it"));
  }
  if (value_bytes > kMaxValueBytes) {
    return absl::DataLossError(absl::StrCat(
        where, " holds ", value_bytes, " bytes at key ", shown(), ", over the ", kMaxValueBytes,
        " any write allows: damaged, or written by another program; remove it"));
  }
  return absl::OkStatus();
}

absl::Status CheckStoreWrites(const std::vector<StoreWrite>& writes) {
  for (size_t i = 0; i < writes.size(); ++i) {
    const StoreWrite& w = writes[i];
    absl::Status key = CheckStoreKey(w.key);
    if (!key.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("write #", i, ": ", key.message()));
    }
    if (w.kind == StoreWrite::Kind::kPut && w.value.size() > kMaxValueBytes) {
      return absl::InvalidArgumentError(absl::StrCat("write #", i, ": value of key ", w.key, " is ",
                                                     w.value.size(), " bytes; the limit is ",
                                                     kMaxValueBytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
