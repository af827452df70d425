// Certificates for tests of TLS, made with /usr/bin/openssl (Debian's
// openssl package) under a directory of the test's, valid for two days:
// a CA; a server certificate for 127.0.0.1 and localhost and a client
// certificate, both signed by it (neither restricts its key usage, so the
// server certificate also serves as a client's, as a worker's does on
// the data plane); and a second, self-signed CA that signed neither (with
// its key, a certificate of a stranger).
#ifndef PIPETRAIN_COMMON_TESTING_TEST_CERTIFICATES_H_
#define PIPETRAIN_COMMON_TESTING_TEST_CERTIFICATES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipetrain::testing {

// Each PEM file's path.
struct TestCertificates {
  std::string ca, ca_key;
  std::string server_cert, server_key;  // CN localhost; SAN IP:127.0.0.1, DNS:localhost
  std::string client_cert, client_key;  // CN pipetrain-coordinator
  std::string other_ca, other_key;      // self-signed, CN another-ca
};

// Makes them under `dir` (which must exist); INTERNAL with openssl's
// output when a step fails.
absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir);

// Runs `argv` (argv[0] an absolute path) to its end, within a minute,
// writing its output to `log`; INTERNAL with the log's tail unless it
// exits 0.
absl::Status RunToEnd(const std::vector<std::string>& argv, const std::string& log);

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_COMMON_TESTING_TEST_CERTIFICATES_H_
