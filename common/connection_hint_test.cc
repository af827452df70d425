#include "common/connection_hint.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// gRPC's messages as the TLS audit saw them (gRPC 1.51, OpenSSL 3).
constexpr char kClosed[] =
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:7070: Socket "
    "closed";
constexpr char kPlainServer[] =
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:7070: Ssl "
    "handshake failed: SSL_ERROR_SSL: error:0A00010B:SSL routines::wrong version number";
constexpr char kHttp1[] =
    "failed to connect to all addresses; last error: INTERNAL: ipv4:127.0.0.1:8080: Trying to "
    "connect an http1.x server";

TEST(CoordinatorConnectionHintTest, EachKnownFailureNamesTheFlagsToCheck) {
  const ClientTlsSetup plain{false, false}, tls{true, false}, mtls{true, true};
  EXPECT_NE(CoordinatorConnectionHint(kHttp1, plain).find("--grpc-address"), std::string::npos);
  EXPECT_NE(CoordinatorConnectionHint(kClosed, plain).find("give its CA with --tls-ca"),
            std::string::npos);
  EXPECT_NE(CoordinatorConnectionHint(kClosed, tls).find("give one with --tls-cert and --tls-key"),
            std::string::npos);
  EXPECT_NE(CoordinatorConnectionHint(kClosed, mtls).find("signed by its --tls-client-ca"),
            std::string::npos);
  EXPECT_NE(CoordinatorConnectionHint(kPlainServer, tls).find("does not serve TLS there"),
            std::string::npos);
  EXPECT_NE(CoordinatorConnectionHint("Peer name 10.0.0.1 is not in peer certificate", tls)
                .find("subjectAltName"),
            std::string::npos);
  EXPECT_NE(CoordinatorConnectionHint("CERTIFICATE_VERIFY_FAILED: certificate verify failed", tls)
                .find("not signed by --tls-ca"),
            std::string::npos);
}

// $PIPETRAIN_CA is named only to a client that reads it (the CLI, not a
// worker).
TEST(CoordinatorConnectionHintTest, CaVariableNamedOnlyWhereItIsRead) {
  ClientTlsSetup worker{false, false}, cli{false, false, /*ca_from_env=*/true};
  EXPECT_EQ(CoordinatorConnectionHint(kClosed, worker).find("$PIPETRAIN_CA"), std::string::npos);
  EXPECT_NE(CoordinatorConnectionHint(kClosed, cli).find("--tls-ca (or $PIPETRAIN_CA)"),
            std::string::npos);
  worker.tls = cli.tls = true;
  EXPECT_EQ(CoordinatorConnectionHint(kPlainServer, worker),
            "the coordinator does not serve TLS there: drop --tls-ca, or start it with "
            "--tls-cert and --tls-key");
  EXPECT_NE(CoordinatorConnectionHint(kPlainServer, cli).find("(and $PIPETRAIN_CA)"),
            std::string::npos);
}

TEST(CoordinatorConnectionHintTest, OtherMessagesOrTheWrongSetup_NoHint) {
  EXPECT_EQ(CoordinatorConnectionHint("Connection refused", {true, true}), "");
  EXPECT_EQ(CoordinatorConnectionHint("Deadline Exceeded", {false, false}), "");
  // A TLS-only diagnosis is not offered to a plaintext client.
  EXPECT_EQ(CoordinatorConnectionHint(kPlainServer, {false, false}), "");
}

}  // namespace
}  // namespace pipetrain
