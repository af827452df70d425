#include "cli/flag_names.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace {

bool InWord(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
}

}  // namespace

std::string NameFlags(absl::string_view message, FlagNames flags) {
  std::string out;
  size_t i = 0;
  while (i < message.size()) {
    if (!InWord(message[i])) {
      out.push_back(message[i++]);
      continue;
    }
    size_t end = i;
    while (end < message.size() && InWord(message[end])) ++end;
    size_t word_end = end;
    while (word_end > i && message[word_end - 1] == '.') --word_end;
    const absl::string_view word = message.substr(i, word_end - i);
    absl::string_view replaced = word;
    for (const auto& [field, flag] : flags) {
      if (word == field) {
        replaced = flag;
        break;
      }
    }
    absl::StrAppend(&out, replaced, message.substr(word_end, end - word_end));
    i = end;
  }
  return out;
}

absl::Status NameFlags(const absl::Status& status, FlagNames flags) {
  if (status.ok()) return status;
  return absl::Status(status.code(), NameFlags(status.message(), flags));
}

}  // namespace pipetrain
