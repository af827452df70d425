#include "common/testing/test_certificates.h"

#include <sys/wait.h>

#include <fstream>
#include <iterator>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace pipetrain::testing {
namespace {

std::string Tail(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

}  // namespace

absl::Status RunToEnd(const std::vector<std::string>& argv, const std::string& log) {
  absl::StatusOr<Subprocess> run = Subprocess::Spawn(argv, log);
  if (!run.ok()) return run.status();
  const std::optional<int> status = run->Wait(absl::Minutes(1));
  if (!status.has_value() || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    if (!status.has_value()) run->Terminate(absl::Seconds(1));
    return absl::InternalError(
        absl::StrCat(argv[0], " ", argv.size() > 1 ? argv[1] : "", " failed: ", Tail(log, 1000)));
  }
  return absl::OkStatus();
}

absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir) {
  TestCertificates c;
  const auto at = [&dir](const char* name) { return absl::StrCat(dir, "/", name); };
  c.ca = at("ca.pem");
  c.ca_key = at("ca.key");
  c.server_cert = at("server.pem");
  c.server_key = at("server.key");
  c.client_cert = at("client.pem");
  c.client_key = at("client.key");
  c.other_ca = at("other-ca.pem");
  c.other_key = at("other-ca.key");
  const std::string log = at("openssl.log");
  const std::string ext = at("server.ext");
  {
    std::ofstream out(ext);
    out << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", ext));
  }
  const auto self_signed = [&](const std::string& cert, const std::string& key, const char* cn) {
    return RunToEnd({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                     key, "-out", cert, "-days", "2", "-subj", absl::StrCat("/CN=", cn)},
                    log);
  };
  const auto signed_by_ca = [&](const std::string& cert, const std::string& key, const char* cn,
                                const std::string& extfile) -> absl::Status {
    const std::string csr = cert + ".csr";
    absl::Status made = RunToEnd({"/usr/bin/openssl", "req", "-newkey", "rsa:2048", "-nodes",
                                  "-keyout", key, "-out", csr, "-subj", absl::StrCat("/CN=", cn)},
                                 log);
    if (!made.ok()) return made;
    std::vector<std::string> sign = {
        "/usr/bin/openssl", "x509", "-req", "-in",   csr, "-CA", c.ca, "-CAkey", c.ca_key,
        "-CAcreateserial",  "-out", cert,   "-days", "2"};
    if (!extfile.empty()) sign.insert(sign.end(), {"-extfile", extfile});
    return RunToEnd(sign, log);
  };
  for (absl::Status made : {self_signed(c.ca, c.ca_key, "pipetrain-test-ca"),
                            signed_by_ca(c.server_cert, c.server_key, "localhost", ext),
                            signed_by_ca(c.client_cert, c.client_key, "pipetrain-coordinator", ""),
                            self_signed(c.other_ca, c.other_key, "another-ca")}) {
    if (!made.ok()) return made;
  }
  return c;
}

}  // namespace pipetrain::testing
