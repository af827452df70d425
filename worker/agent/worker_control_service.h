// WorkerControlService: the worker's control RPCs (proto/pipetrain/v1/
// profile.proto), served beside the data plane on the same port. Today one
// method: Profile, which runs the unit profiler (worker/profile/
// unit_profiler.h) on this machine for the coordinator's planner.
//
// Callers: only the coordinator. Every call must present an HMAC of the
// worker's current session credential (WorkerControlCredential,
// common/secrets.h; SessionCredential::Check), which only the coordinator
// that issued the credential and this worker can compute; anything else,
// the credential itself included (it must not cross this port, plaintext
// without data-plane TLS), is UNAUTHENTICATED before any work starts.
//
// Profiles run one at a time on a thread of the service's own (OpenBLAS's
// thread pool is shared and parallel profiles would time each other); a
// second caller waits, at most kMaxPendingProfiles calls run or wait at once
// (RESOURCE_EXHAUSTED beyond), and a call whose caller has gone (deadline,
// cancel) while it waited is not run. The coordinator asks only READY
// workers, so a profile does not compete with a job. Each profile runs on a
// backend of its own from the factory (the worker's --device choice): a CUDA
// backend is used by one thread at a time, and the job thread has its own.
//
// A callback service: gRPC's synchronous services share the server's few
// threads (common/grpc_server_limits.h) with server reflection, which needs
// no credential, so a client holding reflection streams open would
// otherwise have the coordinator's profile refused RESOURCE_EXHAUSTED.
#ifndef PIPETRAIN_WORKER_AGENT_WORKER_CONTROL_SERVICE_H_
#define PIPETRAIN_WORKER_AGENT_WORKER_CONTROL_SERVICE_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <utility>

#include "absl/status/statusor.h"
#include "common/annotated_mutex.h"
#include "common/log_rate_limiter.h"
#include "common/serial_executor.h"
#include "proto/pipetrain/v1/profile.grpc.pb.h"
#include "worker/agent/session_credential.h"
#include "worker/model/backend_select.h"

namespace pipetrain {

// Makes the backend one profile runs on.
using ProfileBackendFactory = std::function<absl::StatusOr<SelectedBackend>()>;

// Calls running or waiting at once; the coordinator makes one per worker
// it profiles. One refused for this bound (RESOURCE_EXHAUSTED) is not
// retried: that job is planned on the analytic profile.
inline constexpr int kMaxPendingProfiles = 4;

// The most bytes of a ProfileRequest (a model's shape and a few counts: a
// few dozen bytes); RESOURCE_EXHAUSTED past it.
inline constexpr size_t kMaxProfileRequestBytes = 16 << 10;

// Profile takes its request as bytes, parsed after the caller's credential
// passed and the bytes fit kMaxProfileRequestBytes (common/raw_request.h):
// any host reaching --listen may call it, and gRPC's own parse of an 8 MiB
// request (the data plane's bound) of unknown fields grew it about 16
// times before the refusal.
class WorkerControlService final : public v1::WorkerControlService::WithRawCallbackMethod_Profile<
                                       v1::WorkerControlService::CallbackService> {
 public:
  // `session` is not owned and must outlive the service (non-null,
  // checked). The default `make_backend` profiles on the CPU. The service
  // must outlive the server it is registered with (its destructor runs the
  // profiles still waiting).
  explicit WorkerControlService(const SessionCredential* session,
                                ProfileBackendFactory make_backend = nullptr);

  // UNAUTHENTICATED without the session credential; RESOURCE_EXHAUSTED when
  // kMaxPendingProfiles calls run or wait already, or the request is over
  // kMaxProfileRequestBytes; INVALID_ARGUMENT when its bytes are no
  // ProfileRequest; CANCELLED when the caller
  // went away while the call waited; INVALID_ARGUMENT for a bad request (the
  // profiler's message, naming the field); the backend's error if it cannot
  // be made or fails; otherwise OK with the profile.
  grpc::ServerUnaryReactor* Profile(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;

  // Before the server shuts down (it waits for every call): a profile
  // running ends CANCELLED before its next unit, and those waiting are
  // answered so without running. A profile also ends when its caller goes.
  void Stop();

 private:
  // Runs one profile on the profiler thread.
  grpc::Status RunProfile(const v1::ProfileRequest& request, grpc::CallbackServerContext* context,
                          v1::ModelProfile* response);

  const SessionCredential* const session_;
  const ProfileBackendFactory make_backend_;
  AnnotatedMutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;               // calls running or waiting
  LogRateLimiter refused_log_{10, absl::Seconds(10)};  // refused calls' log lines
  std::atomic<bool> stopping_{false};
  SerialExecutor profiler_;  // last: its destructor runs waiting calls first
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_WORKER_CONTROL_SERVICE_H_
