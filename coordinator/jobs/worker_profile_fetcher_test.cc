#include "coordinator/jobs/worker_profile_fetcher.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/annotated_mutex.h"
#include "common/clock.h"
#include "common/secrets.h"
#include "gtest/gtest.h"
#include "proto/pipetrain/v1/profile.grpc.pb.h"

namespace pipetrain {
namespace {

// Refuses the first `refusals` calls with `code` (UNAUTHENTICATED: as a
// worker that has not read its session yet does), then answers with a
// profile of one unit. With `host_wall` (a fake clock the test steps), a
// call whose deadline that clock has passed ends DEADLINE_EXCEEDED, as the
// caller's gRPC ends it on a host whose wall clock stepped: gRPC reads an
// absolute deadline on the wall clock, which the test cannot step.
class RefusingWorkerControl final : public v1::WorkerControlService::Service {
 public:
  RefusingWorkerControl(int refusals, grpc::StatusCode code, const Clock* host_wall = nullptr)
      : refusals_(refusals), code_(code), host_wall_(host_wall) {}
  grpc::Status Profile(grpc::ServerContext* context, const v1::ProfileRequest*,
                       v1::ModelProfile* profile) override {
    {
      AnnotatedMutexLock lock(&mu_);
      const auto [begin, end] = context->client_metadata().equal_range("authorization");
      for (auto it = begin; it != end; ++it)
        authorizations_.emplace_back(it->second.data(), it->second.size());
    }
    const int call = calls_.fetch_add(1);
    if (host_wall_ != nullptr && absl::FromChrono(context->deadline()) <= host_wall_->Now()) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "past the deadline");
    }
    if (call < refusals_) {
      return grpc::Status(code_, "no session yet");
    }
    profile->add_units();
    return grpc::Status::OK;
  }
  int calls() const { return calls_.load(); }
  // Every call's authorization header values, in order.
  std::vector<std::string> authorizations() {
    AnnotatedMutexLock lock(&mu_);
    return authorizations_;
  }

 private:
  const int refusals_;
  const grpc::StatusCode code_;
  const Clock* const host_wall_;
  std::atomic<int> calls_{0};
  AnnotatedMutex mu_;
  std::vector<std::string> authorizations_ ABSL_GUARDED_BY(mu_);
};

// On `on_port`, or on a free one (0). `port` is 0 when it could not listen.
struct Served {
  explicit Served(int refusals, grpc::StatusCode code = grpc::StatusCode::UNAUTHENTICATED,
                  int on_port = 0, const Clock* host_wall = nullptr)
      : service(refusals, code, host_wall) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(on_port),
                             grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Served() { server->Shutdown(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  RefusingWorkerControl service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

TEST(WorkerProfileFetcherTest, AsksAgainWhileTheWorkerHasNoSession) {
  Served worker(/*refusals=*/2);
  absl::StatusOr<v1::ModelProfile> profile =
      MakeWorkerProfileFetcher(absl::Seconds(30))(worker.address(), "token", {});
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->units_size(), 1);
  EXPECT_EQ(worker.service.calls(), 3);
  // Each call presents the HMAC of the session credential, never the
  // credential itself: the worker's data-plane port has no TLS
  // (secrets.h, WorkerControlCredential).
  const std::string hmac = HmacSha256Hex("token", "pipetrain worker-control v1");
  EXPECT_EQ(worker.service.authorizations(), std::vector<std::string>(3, "Bearer " + hmac));
}

TEST(WorkerProfileFetcherTest, GivesUpAfterTheRetries) {
  Served worker(/*refusals=*/1000);
  absl::StatusOr<v1::ModelProfile> profile =
      MakeWorkerProfileFetcher(absl::Seconds(30))(worker.address(), "token", {});
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(profile.status().message().find("no session yet"), std::string::npos);
  EXPECT_EQ(worker.service.calls(), kProfileSessionRetries + 1);
}

// A worker that could not answer once (UNAVAILABLE: a reset connection, a
// listener restarting) is asked again: the job was planned on the analytic
// profile instead.
TEST(WorkerProfileFetcherTest, Unavailable_AskedAgain) {
  Served worker(/*refusals=*/1, grpc::StatusCode::UNAVAILABLE);
  absl::StatusOr<v1::ModelProfile> profile =
      MakeWorkerProfileFetcher(absl::Seconds(30))(worker.address(), "token", {});
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->units_size(), 1);
  EXPECT_EQ(worker.service.calls(), 2);
}

// A worker whose listener is down at the first try (connection refused)
// and back before the retry answers it: the retry goes out on a new
// channel, not on the first one, which waits out gRPC's reconnect backoff
// (1 s) and would fail it at once.
TEST(WorkerProfileFetcherTest, ConnectionRefused_AskedAgainOnANewChannel) {
  int port = 0;
  {
    Served gone(/*refusals=*/0);  // a port nothing listens on once it is gone
    port = gone.port;
  }
  ASSERT_NE(port, 0);
  std::unique_ptr<Served> worker;
  int waits = 0;
  // One credentials object for every channel, as with --worker-tls-*.
  const WorkerChannelTls shared{grpc::InsecureChannelCredentials(), ""};
  CancellableProfileFetcher fetcher =
      MakeCancellableWorkerProfileFetcher(absl::Seconds(30), shared, [&] {
        // Before the first retry: the worker's listener is back.
        if (++waits == 1) worker = std::make_unique<Served>(0, grpc::StatusCode::OK, port);
      });
  absl::StatusOr<v1::ModelProfile> profile =
      fetcher.fetch("127.0.0.1:" + std::to_string(port), "token", {});
  ASSERT_NE(worker, nullptr);
  ASSERT_EQ(worker->port, port);  // else another process took the port meanwhile
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->units_size(), 1);
  EXPECT_EQ(waits, 1);
  EXPECT_EQ(worker->service.calls(), 1);
}

// A worker that stays unavailable is asked kProfileTransientRetries more
// times, then its error is returned.
TEST(WorkerProfileFetcherTest, UnavailableGivesUpAfterTheTransientRetries) {
  Served worker(/*refusals=*/1000, grpc::StatusCode::UNAVAILABLE);
  absl::StatusOr<v1::ModelProfile> profile =
      MakeWorkerProfileFetcher(absl::Seconds(30))(worker.address(), "token", {});
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(profile.status().message().find("no session yet"), std::string::npos);
  EXPECT_EQ(worker.service.calls(), kProfileTransientRetries + 1);
}

// A step of the wall clock while the fetch waits to ask again (NTP, an
// operator's date) leaves the retry its time: the deadline is on the
// monotonic clock, and the retry's gRPC deadline is the stepped wall
// clock's now plus the time left. (On the wall clock the retry ended
// DEADLINE_EXCEEDED at once, which the job manager takes for a wedged
// worker.)
TEST(WorkerProfileFetcherTest, WallClockSteppedForwardBeforeTheRetry_RetryAnswered) {
  FakeClock wall(absl::Now());  // gRPC reads the real one: they agree until the step
  FakeClock monotonic;
  Served worker(/*refusals=*/1, grpc::StatusCode::UNAVAILABLE, /*on_port=*/0, &wall);
  CancellableProfileFetcher fetcher = MakeCancellableWorkerProfileFetcher(
      absl::Seconds(30), {}, [&] { wall.Advance(absl::Hours(1)); }, &wall, &monotonic);
  absl::StatusOr<v1::ModelProfile> profile = fetcher.fetch(worker.address(), "token", {});
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->units_size(), 1);
  EXPECT_EQ(worker.service.calls(), 2);
}

// The timeout is counted on the monotonic clock: once it has passed there
// while the fetch waited, the retry ends DEADLINE_EXCEEDED.
TEST(WorkerProfileFetcherTest, TimeoutPassedOnTheMonotonicClock_DeadlineExceeded) {
  FakeClock wall(absl::Now());
  FakeClock monotonic;
  Served worker(/*refusals=*/1, grpc::StatusCode::UNAVAILABLE, /*on_port=*/0, &wall);
  CancellableProfileFetcher fetcher = MakeCancellableWorkerProfileFetcher(
      absl::Seconds(30), {}, [&] { monotonic.Advance(absl::Seconds(31)); }, &wall, &monotonic);
  absl::StatusOr<v1::ModelProfile> profile = fetcher.fetch(worker.address(), "token", {});
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kDeadlineExceeded) << profile.status();
}

// An error that asking again cannot change is returned at once.
TEST(WorkerProfileFetcherTest, InvalidArgument_NotAskedAgain) {
  Served worker(/*refusals=*/1, grpc::StatusCode::INVALID_ARGUMENT);
  absl::StatusOr<v1::ModelProfile> profile =
      MakeWorkerProfileFetcher(absl::Seconds(30))(worker.address(), "token", {});
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(worker.service.calls(), 1);
}

// Nor is DEADLINE_EXCEEDED: every try shares the fetch's deadline, so a
// real one leaves no time to ask again (here the worker sends it early).
TEST(WorkerProfileFetcherTest, DeadlineExceeded_NotAskedAgain) {
  Served worker(/*refusals=*/1, grpc::StatusCode::DEADLINE_EXCEEDED);
  absl::StatusOr<v1::ModelProfile> profile =
      MakeWorkerProfileFetcher(absl::Seconds(30))(worker.address(), "token", {});
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kDeadlineExceeded) << profile.status();
  EXPECT_EQ(worker.service.calls(), 1);
}

// Holds every Profile call until the test's end: a profile of a large
// model that takes minutes. The first `unavailable` calls are answered
// UNAVAILABLE at once instead.
class HoldingWorkerControl final : public v1::WorkerControlService::Service {
 public:
  explicit HoldingWorkerControl(int unavailable = 0) : unavailable_(unavailable) {}
  grpc::Status Profile(grpc::ServerContext* context, const v1::ProfileRequest*,
                       v1::ModelProfile*) override {
    AnnotatedMutexLock lock(&mu_);
    if (++calls_ <= unavailable_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "reset");
    mu_.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return released_ || context->IsCancelled(); },
        absl::Seconds(20));  // bounded: an uncancelled fetch fails the test, not hangs it
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "held");
  }
  bool AwaitCall() {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_ > 0; },
                                absl::Seconds(30));
  }
  void Release() {
    AnnotatedMutexLock lock(&mu_);
    released_ = true;
  }
  int calls() {
    AnnotatedMutexLock lock(&mu_);
    return calls_;
  }

 private:
  const int unavailable_;
  AnnotatedMutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// A HoldingWorkerControl served on a port of its own; released and shut
// down at the end.
struct HeldWorker {
  explicit HeldWorker(int unavailable = 0) : service(unavailable) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~HeldWorker() {
    service.Release();
    server->Shutdown();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  HoldingWorkerControl service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

// cancel_all ends a fetch in flight at once (a coordinator shutting down),
// and any started after it.
TEST(WorkerProfileFetcherTest, CancelAll_EndsTheFetchInFlightAndLaterOnes) {
  HeldWorker worker;
  HoldingWorkerControl& service = worker.service;
  const std::string address = worker.address();
  CancellableProfileFetcher fetcher = MakeCancellableWorkerProfileFetcher(absl::Minutes(10));
  absl::StatusOr<v1::ModelProfile> profile;
  std::thread fetching([&] { profile = fetcher.fetch(address, "token", {}); });
  ASSERT_TRUE(service.AwaitCall());
  const absl::Time cancelled = absl::Now();
  fetcher.cancel_all();
  fetching.join();
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(15));  // not the server's 20 s hold
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kCancelled) << profile.status();
  const absl::StatusOr<v1::ModelProfile> later = fetcher.fetch(address, "token", {});
  EXPECT_EQ(later.status().code(), absl::StatusCode::kCancelled) << later.status();
}

// cancel_to ends the fetch in flight to that address (a worker known lost),
// not to another, and later fetches to it run as usual.
TEST(WorkerProfileFetcherTest, CancelTo_EndsTheFetchToThatAddressOnly) {
  HeldWorker worker;
  HoldingWorkerControl& service = worker.service;
  const std::string address = worker.address();
  CancellableProfileFetcher fetcher = MakeCancellableWorkerProfileFetcher(absl::Minutes(10));
  absl::StatusOr<v1::ModelProfile> profile;
  std::thread fetching([&] { profile = fetcher.fetch(address, "token", {}); });
  ASSERT_TRUE(service.AwaitCall());
  fetcher.cancel_to("127.0.0.1:1");  // another worker's: none in flight
  fetcher.cancel_to(address);
  fetching.join();
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kCancelled) << profile.status();
  service.Release();
  const absl::StatusOr<v1::ModelProfile> later = fetcher.fetch(address, "token", {});
  EXPECT_EQ(later.status().code(), absl::StatusCode::kUnavailable) << later.status();  // "held"
}

// A fetch that asks again after UNAVAILABLE is cancelled too, whether
// cancel_to finds it waiting to ask again or asking: it does not outlive
// the cancel by its wait, nor by a call to a worker known lost.
TEST(WorkerProfileFetcherTest, CancelTo_EndsAFetchThatWouldAskAgain) {
  HeldWorker worker(/*unavailable=*/1);
  HoldingWorkerControl& service = worker.service;
  const std::string address = worker.address();
  CancellableProfileFetcher fetcher = MakeCancellableWorkerProfileFetcher(absl::Minutes(10));
  absl::StatusOr<v1::ModelProfile> profile;
  std::thread fetching([&] { profile = fetcher.fetch(address, "token", {}); });
  ASSERT_TRUE(service.AwaitCall());  // the first, answered UNAVAILABLE
  fetcher.cancel_to(address);
  fetching.join();
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kCancelled) << profile.status();
  EXPECT_LE(service.calls(), 2);
}

}  // namespace
}  // namespace pipetrain
