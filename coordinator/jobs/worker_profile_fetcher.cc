#include "coordinator/jobs/worker_profile_fetcher.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/annotated_mutex.h"
#include "common/clock.h"
#include "common/grpc_credentials.h"
#include "common/loopback_channel.h"
#include "common/secrets.h"
#include "proto/pipetrain/v1/profile.grpc.pb.h"
#include "worker/agent/backoff.h"

namespace pipetrain {
namespace {

// The calls in flight, shared by a fetcher and its cancel_all.
struct InFlight {
  AnnotatedMutex mu;
  std::map<grpc::ClientContext*, std::string> calls ABSL_GUARDED_BY(mu);  // to their addresses
  // Every fetch under way, asking or waiting to ask again: its flag (set
  // by cancel_all, or by cancel_to with its address) to its address.
  std::map<bool*, std::string> fetches ABSL_GUARDED_BY(mu);
  bool cancelled ABSL_GUARDED_BY(mu) = false;
};

// Whether the worker may answer if asked again: it had not read its
// session yet (see the header), or the call did not reach it (a reset
// connection, a listener restarting). Profile is a read, so asking twice is
// harmless. Not DEADLINE_EXCEEDED: every try shares the fetch's deadline,
// so no time is left to ask again.
bool Retryable(grpc::StatusCode code, int session_retries, int transient_retries) {
  switch (code) {
    case grpc::StatusCode::UNAUTHENTICATED:
      return session_retries < kProfileSessionRetries;
    case grpc::StatusCode::UNAVAILABLE:
      return transient_retries < kProfileTransientRetries;
    default:
      return false;
  }
}

// Waits `wait` before a fetch asks again, or less once `cancelled` (its
// flag in in_flight.fetches) is set.
void WaitUnlessCancelled(InFlight& in_flight, const bool& cancelled, absl::Duration wait) {
  AnnotatedMutexLock lock(&in_flight.mu);
  in_flight.mu.AwaitWithTimeout([&cancelled] { return cancelled; }, wait);
}

}  // namespace

ProfileFetcher MakeWorkerProfileFetcher(absl::Duration timeout, WorkerChannelTls tls) {
  return MakeCancellableWorkerProfileFetcher(timeout, std::move(tls)).fetch;
}

CancellableProfileFetcher MakeCancellableWorkerProfileFetcher(
    absl::Duration timeout, WorkerChannelTls tls, std::function<void()> before_asking_again,
    Clock* wall_clock, Clock* monotonic_clock) {
  if (wall_clock == nullptr) wall_clock = RealClock();
  if (monotonic_clock == nullptr) monotonic_clock = MonotonicClock();
  auto in_flight = std::make_shared<InFlight>();
  CancellableProfileFetcher out;
  out.cancel_all = [in_flight] {
    AnnotatedMutexLock lock(&in_flight->mu);
    in_flight->cancelled = true;
    for (const auto& [call, address] : in_flight->calls) call->TryCancel();
    for (const auto& [flag, address] : in_flight->fetches) *flag = true;
  };
  out.cancel_to = [in_flight](const std::string& to) {
    AnnotatedMutexLock lock(&in_flight->mu);
    for (const auto& [call, address] : in_flight->calls) {
      if (address == to) call->TryCancel();
    }
    for (const auto& [flag, address] : in_flight->fetches) {
      if (address == to) *flag = true;
    }
  };
  out.fetch = [timeout, in_flight, tls = std::move(tls),
               before_asking_again = std::move(before_asking_again), wall_clock, monotonic_clock](
                  const std::string& address, const std::string& session_token,
                  const v1::ProfileRequest& request) -> absl::StatusOr<v1::ModelProfile> {
    // A new channel, for the first try and each one after UNAVAILABLE: the
    // failed channel waits out gRPC's reconnect backoff (see the header).
    const auto connect = [&tls, &address] {
      grpc::ChannelArguments args;
      // A subchannel of its own: from gRPC's shared pool a retry's new
      // channel could get the old one's, still in its reconnect backoff.
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
      // `up`'s workers: not via $http_proxy.
      return v1::WorkerControlService::NewStub(CreateCustomChannelSkippingLoopbackProxy(
          address,
          tls.credentials != nullptr ? tls.credentials : grpc::InsecureChannelCredentials(),
          args));
    };
    std::unique_ptr<v1::WorkerControlService::Stub> stub = connect();
    // On the monotonic clock: a wall-clock step while waiting to ask again
    // must not end (or stretch) the fetch (see the header).
    const absl::Time deadline = monotonic_clock->Now() + timeout;
    // Jittered, with a fresh seed per fetch: a job planned on many workers
    // profiles them together.
    BackoffOptions waits;
    waits.initial = absl::Milliseconds(50);
    waits.max = absl::Seconds(1);
    Backoff backoff(waits);
    int session_retries = 0, transient_retries = 0;
    bool cancelled = false;  // under in_flight->mu
    {
      AnnotatedMutexLock lock(&in_flight->mu);
      in_flight->fetches.emplace(&cancelled, address);
    }
    const absl::Cleanup unlist = [&] {
      AnnotatedMutexLock lock(&in_flight->mu);
      in_flight->fetches.erase(&cancelled);
    };
    while (true) {
      grpc::ClientContext context;
      // gRPC takes a wall-clock deadline: the time left, from now.
      context.set_deadline(
          absl::ToChronoTime(wall_clock->Now() + (deadline - monotonic_clock->Now())));
      AddBearer(context, WorkerControlCredential(session_token));  // not the credential itself
      {
        AnnotatedMutexLock lock(&in_flight->mu);
        if (in_flight->cancelled) {
          return absl::CancelledError(
              absl::StrCat("profile from ", address, ": the coordinator is shutting down"));
        }
        if (cancelled) {
          return absl::CancelledError(absl::StrCat("profile from ", address, ": cancelled"));
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
      if (Retryable(s.error_code(), session_retries, transient_retries)) {
        const absl::Duration wait = backoff.Next();
        if (monotonic_clock->Now() + wait < deadline) {
          WaitUnlessCancelled(*in_flight, cancelled, wait);  // a cancel: the loop's check returns
          if (before_asking_again) before_asking_again();
          if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
            ++session_retries;  // the connection works: keep it
          } else {
            ++transient_retries;
            stub = connect();
          }
          continue;
        }
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
