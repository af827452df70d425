#include "common/connection_hint.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pipetrain {

std::string CoordinatorConnectionHint(absl::string_view message, ClientTlsSetup setup) {
  if (absl::StrContains(message, "http1.x server")) {
    return "the address is an HTTP port (the coordinator's REST API, --http-address?); give its "
           "gRPC port (--grpc-address, 7070 by default)";
  }
  // OpenSSL's words for a TLS handshake answered in plaintext.
  if (setup.tls && absl::StrContains(message, "wrong version number")) {
    return absl::StrCat("the coordinator does not serve TLS there: drop --tls-ca",
                        setup.ca_from_env ? " (and $PIPETRAIN_CA)" : "",
                        ", or start it with --tls-cert and --tls-key");
  }
  if (setup.tls && absl::StrContains(message, "Peer name")) {
    return "the coordinator's certificate does not name the host given to --coordinator: add it "
           "to the certificate's subjectAltName (DNS: or IP:), or connect by a name it has";
  }
  if (setup.tls && absl::StrContains(message, "certificate verify failed")) {
    return "the coordinator's certificate is not signed by --tls-ca, or it (or its CA) has "
           "expired or is not valid yet";
  }
  // A TLS server closes a plaintext client's connection, and an mTLS one
  // a client without an accepted certificate, with no reason given.
  if (absl::StrContains(message, "Socket closed") ||
      absl::StrContains(message, "Connection reset by peer")) {
    if (!setup.tls) {
      return absl::StrCat("if the coordinator serves TLS, give its CA with --tls-ca",
                          setup.ca_from_env ? " (or $PIPETRAIN_CA)" : "");
    }
    if (!setup.client_certificate) {
      return "if the coordinator requires client certificates (--tls-client-ca), give one with "
             "--tls-cert and --tls-key";
    }
    return "if the coordinator requires client certificates, check that --tls-cert is signed "
           "by its --tls-client-ca and valid now";
  }
  return "";
}

}  // namespace pipetrain
