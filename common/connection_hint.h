// What a failed gRPC connection to the coordinator most likely means, in
// the operator's terms (flags), from gRPC's own words: a TLS client
// against a plaintext port, a plaintext one against TLS, a certificate
// that is not accepted, the REST port given for the gRPC one. gRPC's
// messages ("Socket closed", "wrong version number") name none of that.
#ifndef PIPETRAIN_COMMON_CONNECTION_HINT_H_
#define PIPETRAIN_COMMON_CONNECTION_HINT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace pipetrain {

// How the caller connects: with TLS (--tls-ca), and with a client
// certificate (--tls-cert, --tls-key).
struct ClientTlsSetup {
  bool tls = false;
  bool client_certificate = false;
  // The client also reads its CA from $PIPETRAIN_CA (the CLI; a worker
  // reads --tls-ca only): hints name the variable only then.
  bool ca_from_env = false;
};

// A clause to append to the error ("" when gRPC's message matches none of
// the known cases): it says what to check, as a possibility, since a
// closed socket can also be a coordinator that just stopped.
std::string CoordinatorConnectionHint(absl::string_view grpc_message, ClientTlsSetup setup);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_CONNECTION_HINT_H_
