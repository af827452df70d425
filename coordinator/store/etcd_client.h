// EtcdClient: the calls pipetrain makes to etcd's v3 gRPC API
// (proto/etcd/rpc.proto), shared by EtcdStore and LeaderElection.
//
// Transport only: each method sends one request and returns etcd's response
// or a Status; what the keys mean belongs to the callers.
//
// Endpoints: tried in order, starting with the last one that answered. A
// call that fails UNAVAILABLE at one endpoint (refused, reset, or an etcd
// member without a raft leader: every call, the login included, asks etcd
// to refuse it then, metadata "hasleader") moves on to the next, at most
// once round the list.
// A call with a deadline of its own (the leader's lease) gives the first
// endpoint half the time left and each other an equal share of the rest,
// and moves on when a share runs out too: a member whose host went silent
// keeps its connection open and answers nothing. One without (the store's)
// that runs past its attempt deadline returns, and the next call starts at
// the next endpoint, unless that endpoint never connected (a silent host)
// or the call is a Range (a read, safe to send again): then the next is
// tried within the same call. An attempt at an endpoint that is not connected
// first waits up to 1 s (at most half its deadline) for the connection, so a dead endpoint costs
// about a second before the next is tried, and a restarted etcd is found again within about a
// second. Plaintext, or TLS with EtcdOptions::credentials (etcd's CA, and a client certificate for
// an etcd that requires one: with --client-cert-auth and auth enabled, etcd takes its common name
// as the user). With EtcdOptions::user, the client logs in (Auth.Authenticate) at the first call
// and sends the token etcd gives as the metadata "token" on every call; a call etcd refuses for an
// invalid token (it expired, or etcd restarted) or a changed auth store logs in again and is sent
// once more. Where etcd's auth is off, calls go without a token (logged once), until etcd refuses
// one for the lack of a login.
//
// Every attempt has a deadline: the options' rpc_timeout, or the caller's
// `deadline` when that comes first, or the endpoint's share of it (above).
//
// Errors (the message names the method, the endpoint and etcd's words):
//   UNAVAILABLE       gRPC UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, or
//                     RESOURCE_EXHAUSTED from etcd (overloaded, or its
//                     database full: the message says how to free it) at every
//                     endpoint tried; retry.
//   RESOURCE_EXHAUSTED  a response over kMaxEtcdResponseBytes (the client's
//                     own limit; callers page).
//   INVALID_ARGUMENT  etcd refused the request (too many operations in a
//                     Txn, request too large, ...).
//   PERMISSION_DENIED, UNAUTHENTICATED  etcd has auth enabled and refuses
//                     this client (no certificate or user, a wrong password,
//                     or a user without read and write on the prefix).
//   NOT_FOUND         a lease that etcd does not know.
//   OUT_OF_RANGE      a revision etcd has compacted.
//   INTERNAL          anything else.
//
// Thread-safe: gRPC stubs are; the preferred endpoint is an atomic.
#ifndef PIPETRAIN_COORDINATOR_STORE_ETCD_CLIENT_H_
#define PIPETRAIN_COORDINATOR_STORE_ETCD_CLIENT_H_

#include <grpcpp/security/credentials.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "proto/etcd/rpc.grpc.pb.h"
#include "proto/etcd/rpc.pb.h"

namespace pipetrain {

// Where etcd is and how pipetrain uses it.
struct EtcdOptions {
  // "host:port" of each etcd member's client URL. An "http://" in front
  // is accepted and dropped without credentials, an "https://" with them.
  // At least one.
  std::vector<std::string> endpoints;
  // TLS to every endpoint (ClientTlsCredentials, common/tls_credentials.h:
  // etcd's CA, and a client certificate and key where etcd requires one).
  // Null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Non-empty: log in to etcd as this user with `password` (etcd auth
  // enabled, users with passwords). Send passwords over TLS only: etcd
  // takes them in the clear.
  std::string user;
  std::string password;
  // Every key pipetrain writes starts with this; coordinators that share it
  // share state and elect one leader among themselves. Printable ASCII.
  std::string prefix = "/pipetrain/";
  // Deadline of each attempt at each endpoint.
  absl::Duration rpc_timeout = absl::Seconds(5);
  // etcd's --max-txn-ops (default 128): the most operations one Txn may
  // carry. Raise both together.
  int max_txn_ops = 128;
  // etcd's --max-request-bytes (default 1.5 MiB). Raise both together.
  size_t max_request_bytes = 1536 * 1024;
  // Scan reads this many keys per Range at most (fewer where values are
  // large; see EtcdStore).
  int scan_page_keys = 256;
  // EtcdStore compacts etcd's history every this many Commits, or sooner
  // once its Commits since the last compaction carried this many bytes,
  // keeping the last kept_revisions revisions, or fewer where its latest
  // Commits carry more than compaction_interval_bytes (see EtcdStore).
  // All >= 1.
  int compaction_interval_commits = 1000;
  int64_t compaction_interval_bytes = int64_t{256} << 20;
  int64_t kept_revisions = 1000;
};

// The largest response the client accepts. A value pipetrain writes is at
// most kMaxValueBytes (store.h), far below; Scan pages stay under it.
inline constexpr int kMaxEtcdResponseBytes = 16 << 20;

// OK, or INVALID_ARGUMENT naming the bad field.
absl::Status CheckEtcdOptions(const EtcdOptions& options);

// The least key above every key that starts with `prefix`: etcd's range_end
// for a prefix. "\0" (etcd: "every key >= key") when there is none, that is
// for "" and for strings of 0xff bytes only.
std::string EtcdPrefixEnd(const std::string& prefix);

class EtcdClient {
 public:
  // Channels are created here and connect lazily: this does not contact
  // etcd. INVALID_ARGUMENT from CheckEtcdOptions.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(EtcdOptions options);

  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const EtcdOptions& options() const { return options_; }

  absl::Status Range(const etcdserverpb::RangeRequest& request,
                     etcdserverpb::RangeResponse* response,
                     absl::Time deadline = absl::InfiniteFuture()) const;
  absl::Status Txn(const etcdserverpb::TxnRequest& request, etcdserverpb::TxnResponse* response,
                   absl::Time deadline = absl::InfiniteFuture()) const;
  absl::Status Compact(const etcdserverpb::CompactionRequest& request,
                       absl::Time deadline = absl::InfiniteFuture()) const;
  absl::Status LeaseGrant(const etcdserverpb::LeaseGrantRequest& request,
                          etcdserverpb::LeaseGrantResponse* response,
                          absl::Time deadline = absl::InfiniteFuture()) const;
  absl::Status LeaseRevoke(const etcdserverpb::LeaseRevokeRequest& request,
                           absl::Time deadline = absl::InfiniteFuture()) const;
  // One renewal on a LeaseKeepAlive stream of its own: write the request,
  // read one response, close. A stream per renewal keeps every renewal under
  // a deadline, so an etcd that stops answering cannot hang the caller.
  // response->ttl() <= 0 means the lease no longer exists.
  absl::Status LeaseKeepAliveOnce(const etcdserverpb::LeaseKeepAliveRequest& request,
                                  etcdserverpb::LeaseKeepAliveResponse* response,
                                  absl::Time deadline = absl::InfiniteFuture()) const;

  // "etcd:host1:2379,host2:2379".
  std::string Describe() const;

 private:
  struct Endpoint;

  EtcdClient(EtcdOptions options, std::vector<std::unique_ptr<Endpoint>> endpoints);

  // Whether a call that timed out at a connected endpoint (it may have been
  // applied there) may be sent to the next one within the same call.
  enum class Resend { kOnlyUnsent, kAfterTimeout };
  // Runs `attempt` against each endpoint in turn (see the file comment).
  template <typename Attempt>
  absl::Status Call(const char* method, absl::Time deadline, const Attempt& attempt,
                    Resend resend = Resend::kOnlyUnsent) const;
  // One attempt at `e` with the login token (logging in first where there
  // is none, and once more where etcd refuses the token).
  template <typename Attempt>
  grpc::Status AttemptAt(const Endpoint& e, absl::Time deadline, const Attempt& attempt) const;
  // The cached token, or a new one from Authenticate at `e`.
  grpc::Status TokenAt(const Endpoint& e, absl::Time deadline, std::string* token) const;

  const EtcdOptions options_;
  const std::vector<std::unique_ptr<Endpoint>> endpoints_;
  // Where the next call starts: the last endpoint that answered.
  mutable std::atomic<size_t> preferred_{0};
  // The login token (options_.user); "" before a login and after etcd
  // refused it.
  // Held by the one thread logging in (TokenAt), across its Authenticate.
  mutable AnnotatedMutex login_mu_;
  mutable AnnotatedMutex token_mu_;
  mutable std::string token_ ABSL_GUARDED_BY(token_mu_);
  // etcd said its auth is off: calls go without a token until one is
  // refused for the lack of a login.
  mutable bool auth_off_ ABSL_GUARDED_BY(token_mu_) = false;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_STORE_ETCD_CLIENT_H_
