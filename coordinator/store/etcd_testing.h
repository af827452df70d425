// EtcdProcess: a real single-member etcd on loopback for tests (the etcd
// store's, and the highly available coordinators' end to end). Needs
// Debian's etcd-server (/usr/bin/etcd) or PIPETRAIN_ETCD naming a binary;
// Start fails, naming the package, without one.
#ifndef PIPETRAIN_COORDINATOR_STORE_ETCD_TESTING_H_
#define PIPETRAIN_COORDINATOR_STORE_ETCD_TESTING_H_

#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "common/testing/test_certificates.h"
#include "coordinator/store/etcd_client.h"

namespace pipetrain {

// Debian's path; PIPETRAIN_ETCD names another etcd binary.
inline constexpr char kDefaultEtcdBinary[] = "/usr/bin/etcd";
inline constexpr char kEtcdPackage[] = "etcd-server";
// etcd is up within a second or two; this is for a loaded machine.
inline constexpr absl::Duration kEtcdStartTimeout = absl::Seconds(60);

inline std::string EtcdBinary() {
  const char* binary = getenv("PIPETRAIN_ETCD");
  return binary != nullptr ? binary : kDefaultEtcdBinary;
}

inline std::string EtcdTestTmpDir() {
  const char* dir = getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// Where etcd's logs go: kept by Bazel when it gives an outputs dir.
inline std::string EtcdLogDir() {
  const char* dir = getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  return dir != nullptr ? dir : EtcdTestTmpDir();
}

// A port on 127.0.0.1 that was free a moment ago (see the file comment).
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t size = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &size) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// Polls `done` until it holds or `timeout` has passed; returns whether it
// holds.
inline bool EtcdWaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

inline std::string EtcdLogTail(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

// ---------------------------------------------------------------------------
// Certificates for an etcd over TLS (common/testing/test_certificates.h):
// a CA, etcd's server certificate for 127.0.0.1 and a client certificate,
// both signed by it, and a second CA that signed neither.
using EtcdTestCertificates = testing::TestCertificates;

inline absl::StatusOr<EtcdTestCertificates> MakeEtcdTestCertificates(const std::string& dir) {
  return testing::MakeTestCertificates(dir);
}

// etcd's own auth for tests: adds root (required to enable auth) and
// `user` (with `password`) whose role of the same name reads and writes the
// keys under `prefix`, then enables auth: etcdctl's steps, through its API.
inline absl::Status EnableEtcdAuth(const std::string& endpoint,
                                   std::shared_ptr<grpc::ChannelCredentials> credentials,
                                   const std::string& prefix, const std::string& user,
                                   const std::string& password) {
  auto auth = etcdserverpb::Auth::NewStub(grpc::CreateChannel(endpoint, credentials));
  const auto call =
      [](const char* what,
         const std::function<grpc::Status(grpc::ClientContext*)>& rpc) -> absl::Status {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status s = rpc(&context);
    if (s.ok()) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(what, ": ", s.error_message()));
  };
  etcdserverpb::AuthRoleAddRequest role;
  role.set_name(user);
  etcdserverpb::AuthRoleAddResponse role_added;
  etcdserverpb::AuthRoleGrantPermissionRequest grant;
  grant.set_name(user);
  grant.mutable_perm()->set_permtype(authpb::Permission::READWRITE);
  grant.mutable_perm()->set_key(prefix);
  grant.mutable_perm()->set_range_end(EtcdPrefixEnd(prefix));
  etcdserverpb::AuthRoleGrantPermissionResponse granted;
  etcdserverpb::AuthEnableResponse enabled;
  for (absl::Status step : {
           call("RoleAdd", [&](auto* c) { return auth->RoleAdd(c, role, &role_added); }),
           call("RoleGrantPermission",
                [&](auto* c) { return auth->RoleGrantPermission(c, grant, &granted); }),
       }) {
    if (!step.ok()) return step;
  }
  for (const auto& [name, password, user_role] :
       {std::tuple<std::string, std::string, std::string>{"root", "root-password", "root"},
        {user, password, user}}) {
    etcdserverpb::AuthUserAddRequest add;
    add.set_name(name);
    add.set_password(password);
    etcdserverpb::AuthUserAddResponse added;
    etcdserverpb::AuthUserGrantRoleRequest give;
    give.set_user(name);
    give.set_role(user_role);
    etcdserverpb::AuthUserGrantRoleResponse given;
    absl::Status step = call("UserAdd", [&](auto* c) { return auth->UserAdd(c, add, &added); });
    if (step.ok()) {
      step = call("UserGrantRole", [&](auto* c) { return auth->UserGrantRole(c, give, &given); });
    }
    if (!step.ok()) return step;
  }
  return call("AuthEnable", [&](auto* c) {
    return auth->AuthEnable(c, etcdserverpb::AuthEnableRequest(), &enabled);
  });
}

// ---------------------------------------------------------------------------
// An etcd process of the test's own.

// An etcd serving its clients over TLS (PEM files).
struct EtcdServerTls {
  std::string cert_file;  // etcd's --cert-file and --key-file
  std::string key_file;
  // Non-empty: etcd --client-cert-auth --trusted-ca-file, so a client
  // must present a certificate this CA signed.
  std::string client_ca_file;
  // What Start's readiness probe connects with (etcd's CA, and a client
  // certificate where one is required).
  std::shared_ptr<grpc::ChannelCredentials> probe_credentials;
};

class EtcdProcess {
 public:
  // Starts a single-member etcd with a new data dir; returns once it
  // answers. FAILED_PRECONDITION naming the package when etcd is missing.
  // With `tls` its client URL is https.
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(
      const std::string& name, std::optional<EtcdServerTls> tls = std::nullopt) {
    if (access(EtcdBinary().c_str(), X_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd not found at ", EtcdBinary(), ": these tests run a real etcd; install Debian 12's ",
          kEtcdPackage, " package (apt-get install -y ", kEtcdPackage,
          "), or set PIPETRAIN_ETCD to an etcd binary"));
    }
    std::unique_ptr<EtcdProcess> etcd(new EtcdProcess(name));
    etcd->tls_ = std::move(tls);
    absl::Status started;
    for (int attempt = 0; attempt < 3; ++attempt) {  // New ports if one was taken.
      etcd->client_port_ = FreePort();
      etcd->peer_port_ = FreePort();
      started = etcd->Launch();
      if (started.ok()) return etcd;
    }
    return started;
  }

  ~EtcdProcess() { Kill(); }

  // SIGKILL: nothing is flushed that was not already.
  void Kill() {
    if (process_.has_value()) process_->Signal(SIGKILL);
    process_.reset();  // Reaps it.
  }

  // The same data dir and ports.
  absl::Status Restart() {
    Kill();
    return Launch();
  }

  std::string endpoint() const { return absl::StrCat("127.0.0.1:", client_port_); }

  // Options reaching it: over TLS with the probe's credentials when it
  // serves TLS.
  EtcdOptions Options(const std::string& prefix) const {
    EtcdOptions options;
    options.endpoints = {endpoint()};
    if (tls_.has_value()) options.credentials = tls_->probe_credentials;
    options.prefix = prefix;
    options.rpc_timeout = absl::Seconds(5);
    return options;
  }

 private:
  explicit EtcdProcess(std::string name)
      : name_(std::move(name)),
        data_dir_(absl::StrCat(EtcdTestTmpDir(), "/etcd-", name_)),
        log_path_(absl::StrCat(EtcdLogDir(), "/etcd-", name_, ".log")) {}

  // Spawns etcd and polls a Range until it answers.
  absl::Status Launch() {
    const std::string client =
        absl::StrCat(tls_.has_value() ? "https" : "http", "://127.0.0.1:", client_port_);
    const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
    std::vector<std::string> argv = {EtcdBinary(),
                                     "--name",
                                     name_,
                                     "--data-dir",
                                     data_dir_,
                                     "--listen-client-urls",
                                     client,
                                     "--advertise-client-urls",
                                     client,
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     absl::StrCat(name_, "=", peer),
                                     "--logger",
                                     "zap",
                                     "--log-outputs",
                                     "stderr"};
    if (tls_.has_value()) {
      argv.insert(argv.end(), {"--cert-file", tls_->cert_file, "--key-file", tls_->key_file});
      if (!tls_->client_ca_file.empty()) {
        argv.insert(argv.end(), {"--client-cert-auth", "--trusted-ca-file", tls_->client_ca_file});
      }
    }
    absl::StatusOr<Subprocess> spawned = Subprocess::Spawn(argv, log_path_);
    if (!spawned.ok()) return spawned.status();
    process_.emplace(std::move(*spawned));

    EtcdOptions options = Options("/");
    options.rpc_timeout = absl::Seconds(1);
    absl::StatusOr<std::unique_ptr<EtcdClient>> client_or = EtcdClient::Create(options);
    if (!client_or.ok()) return client_or.status();
    absl::Status answered = absl::UnavailableError("not asked yet");
    const bool up = EtcdWaitFor(
        [&] {
          if (process_->Poll().has_value()) return true;
          etcdserverpb::RangeRequest request;
          request.set_key("probe");
          etcdserverpb::RangeResponse response;
          answered = (*client_or)->Range(request, &response);
          // An etcd with auth enabled refuses the probe's anonymous Range
          // (no login), and is up.
          return answered.ok() || answered.code() == absl::StatusCode::kUnauthenticated ||
                 answered.code() == absl::StatusCode::kPermissionDenied;
        },
        kEtcdStartTimeout);
    if (process_->Poll().has_value()) {
      process_.reset();
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd exited at start-up; the end of ", log_path_, ":\n", EtcdLogTail(log_path_, 2000)));
    }
    if (!up) {
      return absl::DeadlineExceededError(absl::StrCat("etcd did not answer within ",
                                                      absl::FormatDuration(kEtcdStartTimeout), ": ",
                                                      answered.ToString(), "; see ", log_path_));
    }
    return absl::OkStatus();
  }

  const std::string name_;
  const std::string data_dir_;
  const std::string log_path_;
  std::optional<EtcdServerTls> tls_;
  int client_port_ = -1;
  int peer_port_ = -1;
  std::optional<Subprocess> process_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_STORE_ETCD_TESTING_H_
