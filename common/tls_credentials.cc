#include "common/tls_credentials.h"

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {

absl::StatusOr<std::string> ReadFlagFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--", flag, ": cannot read ", path, "; check the path and permissions"));
  }
  // Read through the istream, not `<< in.rdbuf()`, which leaves `in`'s
  // state alone: a directory (EISDIR) or a read error passed as "" or
  // partial contents, and TLS failed later without naming the flag.
  std::string contents;
  char chunk[4096];
  while (in.read(chunk, sizeof(chunk)) || in.gcount() > 0) contents.append(chunk, in.gcount());
  if (in.bad() || !in.eof()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, ": cannot read ", path, " (a directory, or a read error); give a PEM file"));
  }
  if (contents.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", path, " is empty; give a PEM file"));
  }
  return contents;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerTlsCredentials(
    const std::string& cert, const std::string& key, const std::string& client_ca) {
  if (cert.empty() && key.empty() && client_ca.empty()) return grpc::InsecureServerCredentials();
  if (cert.empty() || key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key must be given together (and --tls-client-ca needs them)");
  }
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, ReadFlagFile("tls-cert", cert));
  ASSIGN_OR_RETURN(pair.private_key, ReadFlagFile("tls-key", key));
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!client_ca.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs, ReadFlagFile("tls-client-ca", client_ca));
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientTlsCredentials(
    const std::string& ca, const std::string& cert, const std::string& key) {
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key must be given together");
  }
  if (ca.empty()) {
    if (!cert.empty()) {
      return absl::InvalidArgumentError("--tls-cert and --tls-key need --tls-ca (TLS)");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadFlagFile("tls-ca", ca));
  if (!cert.empty()) {
    ASSIGN_OR_RETURN(options.pem_cert_chain, ReadFlagFile("tls-cert", cert));
    ASSIGN_OR_RETURN(options.pem_private_key, ReadFlagFile("tls-key", key));
  }
  return grpc::SslCredentials(options);
}

}  // namespace pipetrain
