// The coordinator's side of WorkerControl.Profile: a ProfileFetcher
// (job_manager.h) that calls a worker at its data-plane address (the worker
// serves WorkerControl on that port, with the data plane's TLS when it has
// one), presenting an HMAC of the worker's session credential
// (WorkerControlCredential, common/secrets.h), which WorkerControl requires;
// the credential itself never crosses that port.
#ifndef PIPETRAIN_COORDINATOR_JOBS_WORKER_PROFILE_FETCHER_H_
#define PIPETRAIN_COORDINATOR_JOBS_WORKER_PROFILE_FETCHER_H_

#include <grpcpp/security/credentials.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/jobs/job_manager.h"

namespace pipetrain {

// A fetcher whose calls fail with DEADLINE_EXCEEDED after `timeout`; other
// errors are the worker's (INVALID_ARGUMENT for a bad request) or
// UNAVAILABLE when it cannot be reached. Some are asked again, about
// 50 ms, 100 ms, ... apart (jittered, backoff.h), while the next try can
// start within `timeout` and no cancel (below) came:
// - UNAUTHENTICATED up to kProfileSessionRetries times: a worker learns its
//   session from RegisterWorker's response, and a job planned at once on a
//   worker that just registered can ask before that response has been read;
// - UNAVAILABLE up to kProfileTransientRetries times, each on a new
//   channel: a reset connection or a listener restarting fails a call at
//   once, and the job was then planned on the analytic profile (Profile is
//   a read: asking twice is harmless). The failed channel would wait out
//   gRPC's reconnect backoff (1 s) and fail the retry at once.
// DEADLINE_EXCEEDED is not asked again: every try shares the one deadline.
// Then the worker's error is returned.
// `timeout` runs on the monotonic clock, so a step of the wall clock (NTP,
// an operator's date) while a fetch waits to ask again neither fails the
// next try at once (job_manager_profiling.cc would take that for a wedged
// worker) nor stretches the fetch; each try's gRPC deadline, which gRPC
// reads on the wall clock, is the wall clock's now plus the time left.
inline constexpr int kProfileSessionRetries = 4;
inline constexpr int kProfileTransientRetries = 2;
// How the coordinator reaches workers' ports: with the data plane's mutual
// TLS (the coordinator's --worker-tls-ca, --worker-tls-cert and
// --worker-tls-key; `server_name`: --worker-tls-server-name, checked in
// place of the address's host when set), or plaintext (null credentials).
struct WorkerChannelTls {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string server_name;
};
ProfileFetcher MakeWorkerProfileFetcher(absl::Duration timeout, WorkerChannelTls tls = {});

// The same, with `cancel_all`, which ends every fetch in flight, and any
// started later, CANCELLED at once (thread-safe): a coordinator shutting
// down must not wait out a large model's profile (minutes), holding its
// etcd lease with its ports closed.
// `cancel_to` ends the fetches under way to one address CANCELLED (asking,
// or waiting to ask again), for a worker known lost; later ones run as
// usual.
// `before_asking_again`, for tests, runs on the fetching thread after each
// wait, before the fetch checks for a cancel and asks again: a test can
// (re)start the worker there instead of racing the jittered wait, or step
// a clock.
// `wall_clock` and `monotonic_clock` (not owned; must outlive the fetcher;
// RealClock() and MonotonicClock() when null), for tests, time the
// fetches as above. The waits between tries still run on real time.
struct CancellableProfileFetcher {
  ProfileFetcher fetch;
  std::function<void()> cancel_all;
  std::function<void(const std::string& address)> cancel_to;
};
CancellableProfileFetcher MakeCancellableWorkerProfileFetcher(
    absl::Duration timeout, WorkerChannelTls tls = {},
    std::function<void()> before_asking_again = nullptr, Clock* wall_clock = nullptr,
    Clock* monotonic_clock = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_WORKER_PROFILE_FETCHER_H_
