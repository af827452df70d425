#include "common/secrets.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <iterator>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace pipetrain {

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string RandomHex(int bytes) {
  PT_CHECK(bytes >= 1 && bytes <= 1024) << "RandomHex(" << bytes << ")";
  std::string raw(bytes, '\0');
  size_t filled = 0;
  while (filled < raw.size()) {
    const ssize_t n = getrandom(raw.data() + filled, raw.size() - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    PT_CHECK(n > 0) << "getrandom failed (errno " << errno << "); refusing to make a weak token";
    filled += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(raw);
}

std::string Sha256Hex(absl::string_view data) { return Sha256HexOfPieces({data}); }

bool IsSha256Hex(absl::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f');
         });
}

std::string Sha256HexOfPieces(const std::vector<absl::string_view>& pieces) {
  Sha256Stream sha;
  for (absl::string_view piece : pieces) sha.Update(piece);
  return sha.FinishHex();
}

// OpenSSL's digest calls fail only for a broken library or out of memory,
// which no input can cause.
Sha256Stream::Sha256Stream() : context_(EVP_MD_CTX_new()) {
  PT_CHECK(context_ != nullptr && EVP_DigestInit_ex(context_, EVP_sha256(), nullptr) == 1);
}

Sha256Stream::~Sha256Stream() { EVP_MD_CTX_free(context_); }

void Sha256Stream::Update(absl::string_view data) {
  PT_CHECK(EVP_DigestUpdate(context_, data.data(), data.size()) == 1);
}

std::string Sha256Stream::FinishHex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  PT_CHECK(EVP_DigestFinal_ex(context_, digest, &length) == 1);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), length));
}

std::string HmacSha256Hex(absl::string_view key, absl::string_view message) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  // HMAC() with a caller buffer cannot fail for SHA-256 with valid pointers;
  // a null result would mean OpenSSL is broken, which no input can cause.
  const unsigned char* done =
      HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest, &length);
  PT_CHECK(done != nullptr && length == 32) << "OpenSSL HMAC-SHA256 failed";
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), length));
}

bool ReadableByOthers(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && (st.st_mode & S_IROTH) != 0;
}

void WarnIfReadableByOthers(absl::string_view flag, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || (st.st_mode & S_IROTH) == 0) return;
  PT_LOG(WARNING) << flag << ": " << path << " may be read by every user of this machine (mode "
                  << absl::StrFormat("%04o", st.st_mode & 07777) << "); chmod o-r it";
}

absl::StatusOr<std::string> ReadSecretFile(absl::string_view flag, const std::string& path,
                                           SecretUse use) {
  // A directory opens as a stream that reads nothing: it would be "empty".
  if (struct stat st; stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " is a directory; name the file holding the token"));
  }
  WarnIfReadableByOthers(flag, path);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(flag, ": cannot read ", path, "; check the path and its permissions"));
  }
  std::string secret;
  char c;
  // Up to the limit, a line end ("\r\n") and one byte more: a file with
  // anything after a full-length token's line end is too long, not cut.
  while (secret.size() < kMaxSecretBytes + 3 && in.get(c)) secret.push_back(c);
  return CheckedSecret(absl::StrCat(flag, ": ", path), std::move(secret), use);
}

absl::StatusOr<std::string> CheckedSecret(absl::string_view where, std::string secret,
                                          SecretUse use) {
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) return absl::InvalidArgumentError(absl::StrCat(where, " is empty"));
  if (secret.size() > kMaxSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " holds more than ", kMaxSecretBytes, " bytes"));
  }
  // gRPC takes only printable ASCII in a header value (it aborts on any
  // other byte, a UTF-8 byte-order mark included), and REST trims spaces. A
  // password (a request body) may hold UTF-8.
  const bool header = use == SecretUse::kHeaderToken;
  for (char ch : secret) {
    const unsigned char u = static_cast<unsigned char>(ch);
    if (u <= 0x20 || u == 0x7f || (header && u > 0x7f)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, header ? " contains whitespace, control or non-ASCII characters; a token is one "
                          "word of printable ASCII"
                        : " contains whitespace or control characters; a password is one word"));
    }
  }
  return secret;
}

absl::StatusOr<std::string> SecretFromFlags(absl::string_view flag, const std::string& value,
                                            const std::string& file) {
  if (!value.empty() && !file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " and --", flag, "-file are exclusive; give one"));
  }
  if (!file.empty()) return ReadSecretFile(absl::StrCat("--", flag, "-file"), file);
  if (value.empty()) return value;
  // As a file's: a space kept in the value would match over gRPC and not
  // over REST (the HTTP library trims the header), and a control character
  // would abort gRPC when sent.
  return CheckedSecret(absl::StrCat("--", flag), value);
}

absl::string_view BearerToken(absl::string_view header) {
  // The scheme is case-insensitive (RFC 7235 §2.1); the token is not.
  constexpr absl::string_view kPrefix = "bearer ";
  if (!absl::StartsWithIgnoreCase(header, kPrefix)) return {};
  return header.substr(kPrefix.size());
}

}  // namespace pipetrain
