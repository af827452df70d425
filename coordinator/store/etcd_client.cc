#include "coordinator/store/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/loopback_channel.h"
#include "coordinator/store/store.h"

namespace pipetrain {
namespace {

// After etcd restarts, reconnect within this long rather than gRPC's default
// backoff of 1 s growing to two minutes.
constexpr int kInitialReconnectBackoffMs = 100;
constexpr int kMaxReconnectBackoffMs = 1000;
// How long an attempt waits for a channel that is not connected to connect
// before it is tried anyway (and fails at once, naming gRPC's reason).
constexpr absl::Duration kConnectTimeout = absl::Seconds(1);

std::string GrpcCodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// What an etcd with auth enabled wants of pipetrain.
constexpr absl::string_view kAuthHint =
    "; etcd has auth enabled: pipetrain authenticates by its client certificate (--etcd-cert, "
    "--etcd-key; etcd --client-cert-auth takes its common name as the user) or as --etcd-user "
    "with --etcd-password-file, and that user needs read and write on the prefix's keys";

// The Status for gRPC status `s` of `method` at `endpoint` (etcd_client.h
// lists the mapping).
absl::Status FromGrpc(const grpc::Status& s, absl::string_view method, const std::string& endpoint,
                      bool tls) {
  const std::string what = absl::StrCat("etcd ", method, " at ", endpoint, ": ", s.error_message(),
                                        " (gRPC ", GrpcCodeName(s.error_code()), ")");
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
      // A refused handshake looks like any broken connection ("Endpoint
      // read failed", "Socket closed"): name what TLS adds to check.
      return absl::UnavailableError(absl::StrCat(
          what, "; check that etcd is running and reachable, then retry",
          tls ? "; over TLS (--etcd-ca) also that this CA signed etcd's certificate, issued "
                "for the endpoint's host, and, where etcd has --client-cert-auth, that etcd "
                "trusts the client certificate (--etcd-cert)"
              : "; if etcd serves TLS (https client URLs), give its CA (--etcd-ca)"));
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      // gRPC's own "Received message larger than max": the caller pages.
      if (absl::StrContains(s.error_message(), "larger than max")) {
        return absl::ResourceExhaustedError(what);
      }
      // Its quota (--quota-backend-bytes, 2 GiB by default) reached: every
      // write is refused until an operator reclaims space.
      if (absl::StrContains(s.error_message(), "database space exceeded")) {
        return absl::UnavailableError(absl::StrCat(
            what,
            "; etcd's database is full (--quota-backend-bytes): compact and defragment it, then "
            "disarm its NOSPACE alarm (etcdctl compact, etcdctl defrag, etcdctl alarm disarm)"));
      }
      return absl::UnavailableError(absl::StrCat(what, "; etcd is overloaded, retry"));
    case grpc::StatusCode::INVALID_ARGUMENT:
      // With auth enabled, a call without a login is INVALID_ARGUMENT.
      if (absl::StrContains(s.error_message(), "user name is empty")) {
        return absl::UnauthenticatedError(absl::StrCat(what, kAuthHint));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          what, "; etcd refused the request (see its --max-txn-ops and --max-request-bytes)"));
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat(what, kAuthHint));
    case grpc::StatusCode::NOT_FOUND:
      return absl::NotFoundError(what);
    case grpc::StatusCode::OUT_OF_RANGE:
      return absl::OutOfRangeError(what);
    default:
      return absl::InternalError(what);
  }
}

// Whether another endpoint may answer where this one did not.
bool TryNextEndpoint(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE;
}

// The metadata etcd reads a login token from.
constexpr char kTokenMetadataKey[] = "token";
// The metadata that asks etcd to refuse a call while the member has no
// raft leader (etcd's rpctypes.MetadataRequireLeaderKey, value "true").
constexpr char kRequireLeaderMetadataKey[] = "hasleader";

constexpr absl::string_view kHttp = "http://";
constexpr absl::string_view kHttps = "https://";

// Schemes compare without case, as in URLs ("HTTPS://h:2379").
std::string StripScheme(const std::string& endpoint) {
  if (absl::StartsWithIgnoreCase(endpoint, kHttp)) return endpoint.substr(kHttp.size());
  if (absl::StartsWithIgnoreCase(endpoint, kHttps)) return endpoint.substr(kHttps.size());
  return endpoint;
}

}  // namespace

struct EtcdClient::Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth;
};

absl::Status CheckEtcdOptions(const EtcdOptions& options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd endpoints are empty; give at least one host:port");
  }
  const bool tls = options.credentials != nullptr;
  for (const std::string& endpoint : options.endpoints) {
    if (absl::StartsWithIgnoreCase(endpoint, "unix:") ||
        absl::StartsWithIgnoreCase(endpoint, "unix-abstract:")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoint \"", endpoint, "\": unix sockets are not supported; give host:port"));
    }
    // A scheme must agree with the credentials: TLS to an endpoint
    // written http:// (or the reverse) is a mistake in one of the two.
    if (absl::StartsWithIgnoreCase(endpoint, kHttps) && !tls) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint \"", endpoint,
                       "\" is https but no TLS is configured; give etcd's CA "
                       "(--etcd-ca)"));
    }
    if (absl::StartsWithIgnoreCase(endpoint, kHttp) && tls) {
      return absl::InvalidArgumentError(absl::StrCat("etcd endpoint \"", endpoint,
                                                     "\" is http but TLS is configured "
                                                     "(--etcd-ca); write https:// or host:port"));
    }
    const std::string address = StripScheme(endpoint);
    if (absl::StrContains(address, "://")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoint \"", endpoint, "\": only http:// and https:// are understood"));
    }
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint \"", endpoint, "\" is not host:port"));
    }
  }
  absl::Status prefix = CheckStoreKey(options.prefix);
  if (!prefix.ok())
    return absl::InvalidArgumentError(absl::StrCat("etcd prefix: ", prefix.message()));
  if (options.user.empty() != options.password.empty()) {
    return absl::InvalidArgumentError(
        "etcd user and password go together (--etcd-user, --etcd-password-file)");
  }
  if (options.rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd rpc_timeout must be positive");
  }
  if (options.max_txn_ops < 1) return absl::InvalidArgumentError("etcd max_txn_ops must be >= 1");
  if (options.max_request_bytes < kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd max_request_bytes must be >= ", kMaxKeyBytes));
  }
  if (options.scan_page_keys < 1) {
    return absl::InvalidArgumentError("etcd scan_page_keys must be >= 1");
  }
  if (options.compaction_interval_commits < 1 || options.compaction_interval_bytes < 1 ||
      options.kept_revisions < 1) {
    return absl::InvalidArgumentError(
        "etcd compaction_interval_commits, compaction_interval_bytes and kept_revisions must be "
        ">= 1");
  }
  return absl::OkStatus();
}

std::string EtcdPrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
  if (end.empty()) return std::string(1, '\0');
  end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
  return end;
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdOptions options) {
  absl::Status valid = CheckEtcdOptions(options);
  if (!valid.ok()) return valid;
  std::vector<std::unique_ptr<Endpoint>> endpoints;
  for (const std::string& endpoint : options.endpoints) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxEtcdResponseBytes);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kInitialReconnectBackoffMs);
    auto e = std::make_unique<Endpoint>();
    e->address = StripScheme(endpoint);
    e->channel = CreateCustomChannelSkippingLoopbackProxy(
        e->address,
        options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials(),
        args);
    e->kv = etcdserverpb::KV::NewStub(e->channel);
    e->lease = etcdserverpb::Lease::NewStub(e->channel);
    e->auth = etcdserverpb::Auth::NewStub(e->channel);
    endpoints.push_back(std::move(e));
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options), std::move(endpoints)));
}

EtcdClient::EtcdClient(EtcdOptions options, std::vector<std::unique_ptr<Endpoint>> endpoints)
    : options_(std::move(options)), endpoints_(std::move(endpoints)) {}

EtcdClient::~EtcdClient() = default;

template <typename Attempt>
absl::Status EtcdClient::Call(const char* method, absl::Time deadline, const Attempt& attempt,
                              Resend resend) const {
  const size_t n = endpoints_.size();
  const size_t first = preferred_.load() % n;
  grpc::Status last;
  size_t tried = first;
  // A caller's own deadline (the leader's lease) is shared by the endpoints
  // still to try, and one whose attempt ran out moves on: a member whose
  // host went silent keeps its connection open, and each call there waits
  // for its deadline; with the whole deadline spent there, a leader with
  // a healthy quorum let its lease run out. Calls without one (the
  // store's) give each endpoint one attempt's deadline, rpc_timeout: one
  // endpoint's for a write, up to every endpoint's for a read (below).
  const bool bounded = deadline != absl::InfiniteFuture();
  for (size_t i = 0; i < n; ++i) {
    tried = (first + i) % n;
    const Endpoint& e = *endpoints_[tried];
    absl::Time attempt_deadline = std::min(absl::Now() + options_.rpc_timeout, deadline);
    if (bounded && n - i > 1) {
      // The first, the endpoint that answered last, half the time left (a
      // slow but healthy cluster still answers there); the others equal
      // shares of what remains.
      const absl::Duration left = deadline - absl::Now();
      const absl::Duration share = i == 0 ? left / 2 : left / static_cast<int64_t>(n - i);
      attempt_deadline = std::min(attempt_deadline, absl::Now() + share);
    }
    // A fail-fast call on a channel that is not connected fails at once and
    // does not drive the connection attempt (gRPC's backup poller would,
    // every 5 s): wait here for the connection, which polls it.
    bool connected = true;
    if (e.channel->GetState(/*try_to_connect=*/true) != GRPC_CHANNEL_READY) {
      // At most half the attempt's time, so that the call itself can still
      // fail with gRPC's reason ("Connection refused") rather than a
      // deadline.
      const absl::Duration wait = std::min(kConnectTimeout, (attempt_deadline - absl::Now()) / 2);
      connected = e.channel->WaitForConnected(absl::ToChronoTime(absl::Now() + wait));
    }
    last = AttemptAt(e, attempt_deadline, attempt);
    if (last.ok()) {
      preferred_.store(tried);
      return absl::OkStatus();
    }
    const bool timed_out = last.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    const bool share_ran_out = bounded && timed_out;
    // A call that timed out on a channel that never connected (a member
    // whose host went silent: its handshake never completes) never reached
    // the member, so another may take it, bounded or not. Without this, a
    // fresh client (a newly elected leader's store) whose first endpoint
    // was silent failed its first call, and the coordinator exited.
    const bool never_sent = timed_out && !connected &&
                            e.channel->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY;
    // A read that timed out at a member that is connected but does not
    // answer (overloaded, or its host stalled after the handshake) goes to
    // the next one too: sending it again changes nothing. Without this, a
    // newly elected coordinator's start-up reads (the state's version, the
    // workers, the jobs) failed at such a first member, and it exited; the
    // next leader's did the same, while the other members were healthy.
    const bool resendable = timed_out && resend == Resend::kAfterTimeout;
    if (!(TryNextEndpoint(last) || share_ran_out || never_sent || resendable) ||
        absl::Now() >= deadline) {
      break;
    }
  }
  if (last.error_code() == grpc::StatusCode::UNAVAILABLE ||
      last.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    preferred_.store((tried + 1) % n);
  }
  return FromGrpc(last, method, endpoints_[tried]->address, options_.credentials != nullptr);
}

template <typename Attempt>
grpc::Status EtcdClient::AttemptAt(const Endpoint& e, absl::Time deadline,
                                   const Attempt& attempt) const {
  for (int round = 0;; ++round) {
    std::string token;
    if (!options_.user.empty()) {
      const grpc::Status logged_in = TokenAt(e, deadline, &token);
      if (!logged_in.ok()) return logged_in;
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    if (!token.empty()) context.AddMetadata(kTokenMetadataKey, token);
    // A member without a raft leader answers UNAVAILABLE at once (the next
    // endpoint is tried) instead of holding the call for its election.
    context.AddMetadata(kRequireLeaderMetadataKey, "true");
    grpc::Status s = attempt(e, &context);
    // etcd checks a call's login before applying it, so each refusal below
    // applied nothing and the call may be sent once more:
    //  - a token it no longer knows (expired, or etcd restarted and lost
    //    its simple tokens): drop it (unless another thread replaced it
    //    already) and log in again;
    //  - "revision of auth store is old": its users or roles changed
    //    between the token check and the apply;
    //  - no login while etcd's auth was off and is on now: log in.
    const bool relogin = !options_.user.empty() && round == 0 &&
                         (absl::StrContains(s.error_message(), "invalid auth token") ||
                          absl::StrContains(s.error_message(), "revision of auth store is old") ||
                          absl::StrContains(s.error_message(), "user name is empty"));
    if (relogin) {
      AnnotatedMutexLock lock(&token_mu_);
      if (token_ == token) token_.clear();
      auth_off_ = false;
      continue;
    }
    return s;
  }
}

grpc::Status EtcdClient::TokenAt(const Endpoint& e, absl::Time deadline, std::string* token) const {
  // Who needs a token when there is none waits for one login rather than
  // each logging in (a burst of password checks on etcd after it
  // restarted): login_mu_ is held across the Authenticate below, token_mu_
  // never is (lock order: login_mu_, then token_mu_).
  const auto cached = [&]() {
    AnnotatedMutexLock lock(&token_mu_);
    if (token_.empty() && !auth_off_) return false;
    *token = token_;
    return true;
  };
  if (cached()) return grpc::Status::OK;
  AnnotatedMutexLock login(&login_mu_);
  if (cached()) return grpc::Status::OK;  // another thread logged in meanwhile
  etcdserverpb::AuthenticateRequest request;
  request.set_name(options_.user);
  request.set_password(options_.password);
  etcdserverpb::AuthenticateResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  // As every call (AttemptAt): etcd's Authenticate waits for a linearizable
  // read, which a member without a raft leader holds until the deadline,
  // and a login's DEADLINE_EXCEEDED at a connected endpoint does not move
  // on. So a new client (a newly elected coordinator's store) whose first
  // endpoint had lost its leader failed, and the coordinator exited, one
  // after another. Asked, such a member refuses at once (UNAVAILABLE "no
  // leader") and the next endpoint is tried.
  context.AddMetadata(kRequireLeaderMetadataKey, "true");
  const grpc::Status s = e.auth->Authenticate(&context, request, &response);
  // etcd's auth is off (never enabled, or `etcdctl auth disable`): calls
  // need no token, so go on without one, as etcd's own client does, rather
  // than stop the coordinator; a refusal for no login turns it back on.
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
      absl::StrContains(s.error_message(), "authentication is not enabled")) {
    AnnotatedMutexLock lock(&token_mu_);
    if (!auth_off_) {
      PT_LOG(WARNING) << "etcd at " << e.address << " has auth disabled; calls go without "
                      << "logging in as " << options_.user;
    }
    auth_off_ = true;
    token->clear();
    return grpc::Status::OK;
  }
  if (!s.ok()) {
    // A wrong user or password comes back INVALID_ARGUMENT: it is about
    // who this client is.
    if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          absl::StrCat("logging in as ", options_.user, ": ", s.error_message()));
    }
    return s;
  }
  if (response.token().empty()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat("logging in as ", options_.user,
                                     ": etcd gave no token (is its auth enabled?)"));
  }
  AnnotatedMutexLock lock(&token_mu_);
  token_ = response.token();
  auth_off_ = false;
  *token = token_;
  return grpc::Status::OK;
}

absl::Status EtcdClient::Range(const etcdserverpb::RangeRequest& request,
                               etcdserverpb::RangeResponse* response, absl::Time deadline) const {
  return Call(
      "Range", deadline,
      [&](const Endpoint& e, grpc::ClientContext* context) {
        return e.kv->Range(context, request, response);
      },
      Resend::kAfterTimeout);
}

absl::Status EtcdClient::Txn(const etcdserverpb::TxnRequest& request,
                             etcdserverpb::TxnResponse* response, absl::Time deadline) const {
  return Call("Txn", deadline, [&](const Endpoint& e, grpc::ClientContext* context) {
    return e.kv->Txn(context, request, response);
  });
}

absl::Status EtcdClient::Compact(const etcdserverpb::CompactionRequest& request,
                                 absl::Time deadline) const {
  etcdserverpb::CompactionResponse response;
  return Call("Compact", deadline, [&](const Endpoint& e, grpc::ClientContext* context) {
    return e.kv->Compact(context, request, &response);
  });
}

absl::Status EtcdClient::LeaseGrant(const etcdserverpb::LeaseGrantRequest& request,
                                    etcdserverpb::LeaseGrantResponse* response,
                                    absl::Time deadline) const {
  return Call("LeaseGrant", deadline, [&](const Endpoint& e, grpc::ClientContext* context) {
    return e.lease->LeaseGrant(context, request, response);
  });
}

absl::Status EtcdClient::LeaseRevoke(const etcdserverpb::LeaseRevokeRequest& request,
                                     absl::Time deadline) const {
  return Call("LeaseRevoke", deadline, [&](const Endpoint& e, grpc::ClientContext* context) {
    etcdserverpb::LeaseRevokeResponse response;
    return e.lease->LeaseRevoke(context, request, &response);
  });
}

absl::Status EtcdClient::LeaseKeepAliveOnce(const etcdserverpb::LeaseKeepAliveRequest& request,
                                            etcdserverpb::LeaseKeepAliveResponse* response,
                                            absl::Time deadline) const {
  return Call("LeaseKeepAlive", deadline, [&](const Endpoint& e, grpc::ClientContext* context) {
    std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::LeaseKeepAliveRequest,
                                             etcdserverpb::LeaseKeepAliveResponse>>
        stream = e.lease->LeaseKeepAlive(context);
    const bool answered = stream->Write(request) && stream->Read(response);
    stream->WritesDone();  // etcd then ends the stream.
    grpc::Status finished = stream->Finish();
    // The renewal happened once etcd answered, however the stream ended.
    if (answered) return grpc::Status::OK;
    if (finished.ok()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream ended without a response");
    }
    return finished;
  });
}

std::string EtcdClient::Describe() const {
  std::vector<std::string> addresses;
  for (const auto& e : endpoints_) addresses.push_back(e->address);
  return absl::StrCat("etcd:", absl::StrJoin(addresses, ","));
}

}  // namespace pipetrain
