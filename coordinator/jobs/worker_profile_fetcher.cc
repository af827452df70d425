#include "coordinator/jobs/worker_profile_fetcher.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/annotated_mutex.h"
#include "common/grpc_credentials.h"
#include "common/loopback_channel.h"
#include "common/secrets.h"
#include "proto/pipetrain/v1/profile.grpc.pb.h"

namespace pipetrain {
namespace {

// The calls in flight, shared by a fetcher and its cancel_all.
struct InFlight {
  AnnotatedMutex mu;
  std::map<grpc::ClientContext*, std::string> calls ABSL_GUARDED_BY(mu);  // to their addresses
  bool cancelled ABSL_GUARDED_BY(mu) = false;
};

}  // namespace

ProfileFetcher MakeWorkerProfileFetcher(absl::Duration timeout, WorkerChannelTls tls) {
  return MakeCancellableWorkerProfileFetcher(timeout, std::move(tls)).fetch;
}

CancellableProfileFetcher MakeCancellableWorkerProfileFetcher(absl::Duration timeout,
                                                              WorkerChannelTls tls) {
  auto in_flight = std::make_shared<InFlight>();
  CancellableProfileFetcher out;
  out.cancel_all = [in_flight] {
    AnnotatedMutexLock lock(&in_flight->mu);
    in_flight->cancelled = true;
    for (const auto& [call, address] : in_flight->calls) call->TryCancel();
  };
  out.cancel_to = [in_flight](const std::string& to) {
    AnnotatedMutexLock lock(&in_flight->mu);
    for (const auto& [call, address] : in_flight->calls) {
      if (address == to) call->TryCancel();
    }
  };
  out.fetch = [timeout, in_flight, tls = std::move(tls)](
                  const std::string& address, const std::string& session_token,
                  const v1::ProfileRequest& request) -> absl::StatusOr<v1::ModelProfile> {
    grpc::ChannelArguments args;
    if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
    SkipProxyForLoopback(address, &args);  // `up`'s workers: not via $http_proxy
    auto stub = v1::WorkerControlService::NewStub(grpc::CreateCustomChannel(
        address, tls.credentials != nullptr ? tls.credentials : grpc::InsecureChannelCredentials(),
        args));
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration wait = absl::Milliseconds(50);
    for (int attempt = 0;; ++attempt) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(deadline));
      AddBearer(context, WorkerControlCredential(session_token));  // not the credential itself
      {
        AnnotatedMutexLock lock(&in_flight->mu);
        if (in_flight->cancelled) {
          return absl::CancelledError(
              absl::StrCat("profile from ", address, ": the coordinator is shutting down"));
        }
        in_flight->calls.emplace(&context, address);
      }
      v1::ModelProfile profile;
      grpc::Status s = stub->Profile(&context, request, &profile);
      {
        AnnotatedMutexLock lock(&in_flight->mu);
        in_flight->calls.erase(&context);
      }
      if (s.ok()) return profile;
      // The worker may not have read its session yet (see the header).
      if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED && attempt < kProfileSessionRetries &&
          absl::Now() + wait < deadline) {
        absl::SleepFor(wait);
        wait *= 2;
        continue;
      }
      // A refused TLS handshake is UNAVAILABLE too: name what must agree.
      const std::string tls_hint =
          s.error_code() == grpc::StatusCode::UNAVAILABLE && tls.credentials != nullptr
              ? " (with --worker-tls-*: the worker's certificate must chain to "
                "--worker-tls-ca and name its address's host or --worker-tls-server-name, and "
                "its --data-tls-ca must accept --worker-tls-cert)"
              : "";
      return absl::Status(
          static_cast<absl::StatusCode>(s.error_code()),
          // The worker's text may be any bytes: the job manager makes the
          // error UTF-8 before it saves it (FinishProfiling).
          absl::StrCat("profile from ", address, ": ", s.error_message(), tls_hint));
    }
  };
  return out;
}

}  // namespace pipetrain
