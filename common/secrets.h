// Secrets: how pipetrain makes, reads and compares the tokens that decide
// who may call what (docs/operations.md "Security").
//
//   std::string token = RandomToken();            // 256 bits from the OS
//   ASSIGN_OR_RETURN(std::string t, ReadSecretFile("--user-token-file", path));
//   if (!ConstantTimeEquals(presented, token)) ...
//   std::string proof = HmacSha256Hex(link_key, "pipetrain-dataplane-v2|job-1/1|2");
//
// Secrets are never logged: error messages name the flag or file, never the
// value. All functions are thread-safe.
#ifndef PIPETRAIN_COMMON_SECRETS_H_
#define PIPETRAIN_COMMON_SECRETS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX (Sha256Stream)

namespace pipetrain {

// Longest secret accepted from a flag, file or request (bytes): far above a
// 64-hex-digit token, far below anything that could hurt to hash or compare.
inline constexpr size_t kMaxSecretBytes = 4096;

// True when a and b are equal. The time taken depends only on the lengths,
// never on where the strings first differ, so a caller cannot find a token
// byte by byte from response times.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// `bytes` bytes from the kernel's CSPRNG (getrandom), as 2 * bytes lowercase
// hex digits. Requires 1 <= bytes <= 1024 (checked). getrandom does not fail
// for these sizes once the kernel's pool is initialised; if it ever does the
// process aborts rather than hand out a guessable token.
std::string RandomHex(int bytes);
// A fresh 256-bit token (64 hex digits).
inline std::string RandomToken() { return RandomHex(32); }

// HMAC-SHA256 of `message` under `key` (RFC 2104), as 64 lowercase hex digits.
std::string HmacSha256Hex(absl::string_view key, absl::string_view message);

// What the coordinator presents to a worker's WorkerControl service: an
// HMAC under the worker's session credential, not the credential itself.
// The call goes to the worker's data-plane port, which has no TLS; a copy
// read off the wire there is of no use at the coordinator, where only the
// session credential acts for the worker.
inline std::string WorkerControlCredential(absl::string_view session_credential) {
  return HmacSha256Hex(session_credential, "pipetrain worker-control v1");
}

// SHA-256 of `data`, lowercase hex (64 characters): checkpoint files'
// checksums (not a secret, but the same library).
std::string Sha256Hex(absl::string_view data);

// SHA-256 of the concatenation of `pieces`, without concatenating them
// (a training checkpoint's tensors: gigabytes).
std::string Sha256HexOfPieces(const std::vector<absl::string_view>& pieces);

// SHA-256 of data given piece by piece, for data not held whole at any
// time (a checkpoint file read back in chunks). Not thread-safe.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;

  void Update(absl::string_view data);
  // The digest of everything given, lowercase hex; call once, last.
  std::string FinishHex();

 private:
  ::evp_md_ctx_st* context_;  // OpenSSL's EVP_MD_CTX
};

// Whether `s` has Sha256Hex's form: 64 lowercase hex digits (a digest a
// peer or a file sends, checked before it is compared or shown).
bool IsSha256Hex(absl::string_view s);

// Whether every user of this machine may read the file at `path` (its
// mode has o+r); false when it cannot be stat'ed.
bool ReadableByOthers(const std::string& path);

// Logs a WARNING naming `flag`, `path` and its mode when ReadableByOthers:
// a token or private key anyone on the host can read is no secret. Group
// read is left alone (a Kubernetes Secret volume is 0440 with fsGroup).
void WarnIfReadableByOthers(absl::string_view flag, const std::string& path);

// Reads a secret from the file at `path`, without a trailing newline (what
// `openssl rand -hex 32 > file` or a Kubernetes Secret volume holds).
// `flag` names where the path came from, for messages; a file every user
// may read is used, with WarnIfReadableByOthers's warning.
// Errors: NOT_FOUND (cannot read; the message names flag and path, and says
// nothing about the contents), INVALID_ARGUMENT (a directory, empty, longer than
// kMaxSecretBytes, or containing whitespace, control or non-ASCII characters).
// What a secret is for: a token goes into a gRPC header (printable ASCII
// only); a password (etcd's) travels in a request body, where any byte but
// whitespace and control characters may stand.
enum class SecretUse { kHeaderToken, kPassword };

absl::StatusOr<std::string> ReadSecretFile(absl::string_view flag, const std::string& path,
                                           SecretUse use = SecretUse::kHeaderToken);

// `secret` without its trailing line end ("\n" or "\r\n", as a file or a
// Kubernetes Secret holds it), checked as ReadSecretFile checks a file's:
// INVALID_ARGUMENT "<where> is empty", "... holds more than N bytes" or
// "... contains whitespace, control or non-ASCII characters" (no such value may reach
// a gRPC header: the library aborts on it).
// A kPassword may hold bytes past 0x7e (UTF-8).
absl::StatusOr<std::string> CheckedSecret(absl::string_view where, std::string secret,
                                          SecretUse use = SecretUse::kHeaderToken);

// A secret given by value (--<flag>) or by file (--<flag>-file), not both;
// "" when neither. Errors: INVALID_ARGUMENT when both are given;
// CheckedSecret's for the value (where: "--<flag>"), ReadSecretFile's for
// the file.
absl::StatusOr<std::string> SecretFromFlags(absl::string_view flag, const std::string& value,
                                            const std::string& file);

// The token of an "authorization: Bearer <token>" value (an HTTP header or
// gRPC metadata; the scheme in any case): the token, or empty when `header`
// is not of that form.
absl::string_view BearerToken(absl::string_view header);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_SECRETS_H_
