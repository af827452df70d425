// gRPC TLS credentials from PEM files, for the coordinator's port and its
// clients (workers, the CLI), including mutual TLS: a coordinator given a
// client CA accepts only clients whose certificate that CA signed, and a
// client given a certificate and key presents them (docs/operations.md
// "Security"). Tokens still apply on top of TLS.
//
// Every function reads its files when called; errors name the flag and the
// path (NOT_FOUND when a file cannot be opened, INVALID_ARGUMENT when it is
// a directory, empty or fails to read, and for flags given without their
// partner). The files are checked before gRPC sees them, which would only
// fail later without naming any (INVALID_ARGUMENT): a CA or certificate
// file must hold a PEM certificate, a key file an unencrypted PEM private
// key (no passphrase is ever asked for), the key must be the certificate's,
// that certificate must be valid now (not expired, not before its start),
// and a CA file must hold one valid now. Thread-safe.
#ifndef PIPETRAIN_COMMON_TLS_CREDENTIALS_H_
#define PIPETRAIN_COMMON_TLS_CREDENTIALS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pipetrain {

// The flags (without dashes) a server's TLS files came from, as errors
// name them.
struct ServerTlsFlags {
  std::string cert = "tls-cert";
  std::string key = "tls-key";
  std::string client_ca = "tls-client-ca";
};

// Server side. `cert` and `key` (both or neither; neither: plaintext) are
// the server's identity; `client_ca`, when given (needs cert and key),
// makes client certificates required and verified against it. `flags`
// names the flags in errors (the coordinator's --tls-cert ...; a worker's
// data plane's --data-tls-cert ...).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerTlsCredentials(
    const std::string& cert, const std::string& key, const std::string& client_ca,
    const ServerTlsFlags& flags = ServerTlsFlags());

// The flags (without dashes) a client's TLS files came from, and the
// server it talks to, as errors name them.
struct ClientTlsFlags {
  std::string ca = "tls-ca";
  std::string cert = "tls-cert";
  std::string key = "tls-key";
  std::string server = "the coordinator";
};

// Client side. `ca` (empty: plaintext) verifies the server; `cert` and
// `key` (both or neither; they need `ca`) are the client's identity for a
// server that requires one. `flags` names the flags in errors (the
// coordinator's own: --tls-ca ...; its etcd client's: --etcd-ca ...).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientTlsCredentials(
    const std::string& ca, const std::string& cert, const std::string& key,
    const ClientTlsFlags& flags = ClientTlsFlags());

// The rule of a mutual-TLS flag set (a CA, a certificate and its key, all
// three or none, and a server name only with them), for the worker's
// --data-tls-* and the coordinator's --worker-tls-*. `files` are the three
// files' flags (without dashes) and values, in the order errors list them;
// `server_name_flag`/`server_name` the name's; `whose`: whose certificates
// the name is checked on ("the peers'"); `why`: why the three go together.
// Returns whether TLS is on; INVALID_ARGUMENT naming the flags for a
// partial set, a name without the set, or a bad name (CheckTlsServerName).
absl::StatusOr<bool> CheckMutualTlsFlags(
    const std::vector<std::pair<std::string, std::string>>& files,
    const std::string& server_name_flag, const std::string& server_name, const std::string& whose,
    const std::string& why);

// OK when `name` may be checked as a server certificate's name in place of
// the address's host (a TLS target name override): 1 to 253 characters of
// A-Z a-z 0-9 . - (a DNS name, or an IP address). INVALID_ARGUMENT naming
// --`flag` otherwise.
absl::Status CheckTlsServerName(const std::string& flag, const std::string& name);

// The whole contents of the file at `path`. Errors name --`flag` and the
// path: NOT_FOUND when it cannot be opened; INVALID_ARGUMENT when it is a
// directory, empty, over kMaxPemFileBytes, or a read fails before its end.
absl::StatusOr<std::string> ReadFlagFile(const std::string& flag, const std::string& path);

// When a TLS file stops working, for pipetrain_tls_certificate_expiry_
// timestamp_seconds: for a certificate file (a flag ending in "-cert":
// --tls-cert, --etcd-cert, this process's own) its first certificate's
// notAfter; for a CA file (--tls-ca, --tls-client-ca, --etcd-ca) the
// earliest notAfter of the certificates valid now
// (peers whose chain ends at that one are refused from then on).
struct TlsCertificateExpiry {
  std::string flag;  // without dashes: "tls-cert"
  absl::Time not_after;
};

// One entry per {flag, path} of `files` with a non-empty path, read again;
// a file that cannot be read or holds no (valid) certificate is left out:
// the credentials' own check refuses it.
std::vector<TlsCertificateExpiry> TlsCertificateExpiries(
    const std::vector<std::pair<std::string, std::string>>& files);

// The largest PEM file read: a system CA bundle is some 200 KB.
inline constexpr size_t kMaxPemFileBytes = size_t{4} << 20;

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_TLS_CREDENTIALS_H_
