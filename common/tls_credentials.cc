#include "common/tls_credentials.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/echo_input.h"
#include "common/logging.h"
#include "common/secrets.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

using X509Ptr = std::unique_ptr<X509, decltype(&X509_free)>;

// OpenSSL's passphrase callback: none. Without one, reading an encrypted
// key prompts on the terminal (a server waiting for input at start-up, or
// "Enter PEM pass phrase:" in a log), and gRPC could not use it anyway.
int NoPassphrase(char*, int, int, void*) { return 0; }

// "Jan  1 00:00:00 2099 GMT".
std::string TimeText(const ASN1_TIME* time) {
  std::unique_ptr<BIO, decltype(&BIO_free)> out(BIO_new(BIO_s_mem()), &BIO_free);
  if (out == nullptr || ASN1_TIME_print(out.get(), time) != 1) return "(unreadable)";
  char* data = nullptr;
  const long size = BIO_get_mem_data(out.get(), &data);
  return std::string(data, size > 0 ? static_cast<size_t>(size) : 0);
}

// The first certificate of a PEM file's contents, or INVALID_ARGUMENT
// naming the flag: gRPC only fails later (a server that "cannot serve",
// a client whose every call is UNAVAILABLE), without saying which file.
absl::StatusOr<X509Ptr> FirstCertificate(const std::string& flag, const std::string& path,
                                         const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), int(pem.size())),
                                                &BIO_free);
  X509Ptr cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr) : nullptr,
               &X509_free);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", path, " holds no PEM certificate (-----BEGIN CERTIFICATE)"));
  }
  return cert;
}

// A certificate and its key (--`cert_flag`, --`key_flag`): both parse, the key
// is the certificate's, and the certificate has not expired (`peer`, the
// other side of every handshake, would refuse it).
absl::Status CheckIdentityPair(const std::string& cert_flag, const std::string& cert_path,
                               const std::string& cert_pem, const std::string& key_flag,
                               const std::string& key_path, const std::string& key_pem,
                               const std::string& peer) {
  const std::string cert_label = absl::StrCat("--", cert_flag, ": ");
  const std::string key_label = absl::StrCat("--", key_flag, ": ");
  ASSIGN_OR_RETURN(X509Ptr cert, FirstCertificate(cert_flag, cert_path, cert_pem));
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(key_pem.data(), int(key_pem.size())), &BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr) : nullptr,
      &EVP_PKEY_free);
  // PKCS#8 ("BEGIN ENCRYPTED PRIVATE KEY") or the older "Proc-Type:
  // 4,ENCRYPTED" header.
  if (key == nullptr && absl::StrContains(key_pem, "ENCRYPTED")) {
    return absl::InvalidArgumentError(absl::StrCat(
        key_label, key_path,
        " is encrypted, and neither this program nor gRPC asks for a passphrase; decrypt it "
        "(openssl pkey -in ",
        key_path, " -out PLAIN.key) and keep the plain file readable by this user only"));
  }
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_label, key_path,
                     " holds no unencrypted PEM private key (-----BEGIN ... "
                     "PRIVATE KEY)"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(key_label, key_path,
                                                   " is not the key of the certificate in ",
                                                   cert_path, " (--", cert_flag, ")"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(cert_label, "the certificate in ", cert_path,
                                                   " has expired; ", peer,
                                                   " would refuse it: renew it"));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert.get())) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert_label, "the certificate in ", cert_path, " is not valid before ",
                     TimeText(X509_get0_notBefore(cert.get())), "; ", peer,
                     " would refuse it until then (or check this host's clock)"));
  }
  return absl::OkStatus();
}

// Calls `visit` with each PEM certificate of `pem`, in order, until it
// returns false or none is left (what does not parse ends the list).
void ForEachCertificate(const std::string& pem, const std::function<bool(const X509&)>& visit) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), int(pem.size())),
                                                &BIO_free);
  while (bio != nullptr) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr), &X509_free);
    if (cert == nullptr || !visit(*cert)) break;
  }
  ERR_clear_error();  // the read that ended the list
}

// Whether `cert` is valid now: not expired, not before its start.
bool ValidNow(const X509& cert) {
  return X509_cmp_current_time(X509_get0_notAfter(&cert)) >= 0 &&
         X509_cmp_current_time(X509_get0_notBefore(&cert)) <= 0;
}

// A CA file (--tls-ca, --tls-client-ca): at least one certificate, and
// not all of them expired or not yet valid (nothing could be verified
// against it); any one that is gets a warning, since a peer whose chain
// ends there is refused with only "certificate verify failed".
absl::Status CheckCaFile(const std::string& flag, const std::string& path, const std::string& pem) {
  RETURN_IF_ERROR(FirstCertificate(flag, path, pem).status());
  int valid = 0, read = 0;
  ForEachCertificate(pem, [&](const X509& cert) {
    ++read;
    if (ValidNow(cert)) {
      ++valid;
      return true;
    }
    const bool expired = X509_cmp_current_time(X509_get0_notAfter(&cert)) < 0;
    PT_LOG(WARNING) << "--" << flag << ": certificate " << read << " in " << path
                    << (expired ? " expired on " : " is not valid before ")
                    << TimeText(expired ? X509_get0_notAfter(&cert) : X509_get0_notBefore(&cert))
                    << "; peers whose chain ends there are refused";
    return true;
  });
  if (valid == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": every certificate in ", path,
                                                   " has expired or is not yet valid; nothing "
                                                   "could be verified against it"));
  }
  return absl::OkStatus();
}

// notAfter as a time; nullopt if OpenSSL cannot read it.
std::optional<absl::Time> NotAfter(const X509& cert) {
  struct tm when {};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(&cert), &when) != 1) return std::nullopt;
  return absl::FromTimeT(timegm(&when));
}

}  // namespace

std::vector<TlsCertificateExpiry> TlsCertificateExpiries(
    const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<TlsCertificateExpiry> out;
  for (const auto& [flag, path] : files) {
    if (path.empty()) continue;
    absl::StatusOr<std::string> pem = ReadFlagFile(flag, path);
    if (!pem.ok()) continue;
    // --tls-cert and --etcd-cert are this process's own certificate (its
    // first, the leaf, counts); the others are CA files.
    const bool ca = !absl::EndsWith(flag, "-cert");
    std::optional<absl::Time> earliest;
    ForEachCertificate(*pem, [&](const X509& cert) {
      const std::optional<absl::Time> not_after = NotAfter(cert);
      if ((ValidNow(cert) || !ca) && not_after.has_value() &&
          (!earliest.has_value() || *not_after < *earliest)) {
        earliest = not_after;
      }
      return ca;  // the process's own: the first certificate only
    });
    if (earliest.has_value()) out.push_back({flag, *earliest});
  }
  return out;
}

absl::StatusOr<bool> CheckMutualTlsFlags(
    const std::vector<std::pair<std::string, std::string>>& files,
    const std::string& server_name_flag, const std::string& server_name, const std::string& whose,
    const std::string& why) {
  std::vector<std::string> names;
  int given = 0;
  for (const auto& [flag, path] : files) {
    names.push_back("--" + flag);
    given += path.empty() ? 0 : 1;
  }
  // "--a, --b and --c"
  std::string listed;
  for (size_t i = 0; i < names.size(); ++i) {
    listed += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  }
  if (given == 0) {
    if (!server_name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--", server_name_flag, " names ", whose,
                                                     " certificates, so it needs ", listed));
    }
    return false;
  }
  if (given != static_cast<int>(files.size())) {
    return absl::InvalidArgumentError(absl::StrCat(listed, " go together: ", why));
  }
  if (!server_name.empty()) RETURN_IF_ERROR(CheckTlsServerName(server_name_flag, server_name));
  return true;
}

absl::Status CheckTlsServerName(const std::string& flag, const std::string& name) {
  const bool allowed =
      !name.empty() && name.size() <= 253 && std::all_of(name.begin(), name.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-';
      });
  if (allowed) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, " \"", EchoInput(name, 64),
      "\" is not a server name: give 1 to 253 characters of letters, digits, '.' and '-'"));
}

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
  // Bounded: /dev/zero as a flag's file would grow this process without
  // end. (A FIFO, as from <(...), is read as any stream.)
  while (contents.size() <= kMaxPemFileBytes &&
         (in.read(chunk, sizeof(chunk)) || in.gcount() > 0)) {
    contents.append(chunk, in.gcount());
  }
  if (contents.size() > kMaxPemFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", path, " is over ",
                                                   kMaxPemFileBytes, " bytes; give a PEM file"));
  }
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
    const std::string& cert, const std::string& key, const std::string& client_ca,
    const ServerTlsFlags& flags) {
  if (cert.empty() && key.empty() && client_ca.empty()) return grpc::InsecureServerCredentials();
  if (cert.empty() || key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flags.cert, " and --", flags.key,
                                                   " must be given together (and --",
                                                   flags.client_ca, " needs them)"));
  }
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, ReadFlagFile(flags.cert, cert));
  ASSIGN_OR_RETURN(pair.private_key, ReadFlagFile(flags.key, key));
  WarnIfReadableByOthers("--" + flags.key, key);
  RETURN_IF_ERROR(CheckIdentityPair(flags.cert, cert, pair.cert_chain, flags.key, key,
                                    pair.private_key, "every client"));
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!client_ca.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs, ReadFlagFile(flags.client_ca, client_ca));
    RETURN_IF_ERROR(CheckCaFile(flags.client_ca, client_ca, options.pem_root_certs));
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientTlsCredentials(
    const std::string& ca, const std::string& cert, const std::string& key,
    const ClientTlsFlags& flags) {
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flags.cert, " and --", flags.key, " must be given together"));
  }
  if (ca.empty()) {
    if (!cert.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flags.cert, " and --", flags.key, " need --", flags.ca, " (TLS)"));
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadFlagFile(flags.ca, ca));
  RETURN_IF_ERROR(CheckCaFile(flags.ca, ca, options.pem_root_certs));
  if (!cert.empty()) {
    ASSIGN_OR_RETURN(options.pem_cert_chain, ReadFlagFile(flags.cert, cert));
    ASSIGN_OR_RETURN(options.pem_private_key, ReadFlagFile(flags.key, key));
    WarnIfReadableByOthers("--" + flags.key, key);
    RETURN_IF_ERROR(CheckIdentityPair(flags.cert, cert, options.pem_cert_chain, flags.key, key,
                                      options.pem_private_key, flags.server));
  }
  return grpc::SslCredentials(options);
}

}  // namespace pipetrain
