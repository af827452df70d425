// WorkerAgent against a scripted coordinator: what it does when the
// coordinator drops it and then refuses it.
#include "worker/agent/worker_agent.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/annotated_mutex.h"
#include "common/build_info.h"
#include "common/clock.h"
#include "common/coordinator_endpoints.h"
#include "common/data_plane_keys.h"
#include "common/metrics/metrics_testing.h"
#include "coordinator/planner/schedule_compiler.h"
#include "worker/agent/drain_retry.h"
#include "worker/agent/worker_metrics.h"
#include "worker/transport/data_plane_server.h"
#include "worker/transport/grpc_transport.h"
#include "worker/transport/mailbox.h"

namespace pipetrain {
namespace {

// The agent's transports as a worker makes them: gRPC, receiving into
// `mailbox`, with the job's credential.
TransportFactory GrpcTransports(Mailbox* mailbox) {
  return
      [mailbox](int stage, const std::vector<std::string>& peers, const JobCredential& credential) {
        GrpcTransportOptions transport_options;
        transport_options.credential = credential;
        return std::unique_ptr<Transport>(
            new GrpcTransport(stage, peers, mailbox, std::move(transport_options)));
      };
}

// A registration's answer: worker w-1, `incarnation`, its session token
// "w-1.<incarnation>.secret", heartbeats every `interval_seconds`.
grpc::Status RegisteredAsW1(v1::RegisterWorkerResponse* response, int64_t incarnation = 1,
                            double interval_seconds = 0.05) {
  response->set_worker_id("w-1");
  response->set_incarnation(incarnation);
  response->set_session_token(absl::StrCat("w-1.", incarnation, ".secret"));
  response->set_heartbeat_interval_seconds(interval_seconds);
  return grpc::Status::OK;
}

// A scripted coordinator served on a free port of 127.0.0.1 and a data plane
// receiving into `mailbox`, with the options an agent needs to reach them.
struct AgentRig {
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<DataPlaneServer> data_plane;
  WorkerAgentOptions options;  // coordinator_address and join_token set

  void Shutdown() {
    data_plane->Shutdown();
    server->Shutdown();
  }
};

// `coordinator` served on a free port of 127.0.0.1, whose address goes to
// `*address`; null if the server did not start.
std::unique_ptr<grpc::Server> ServeOnLoopback(v1::CoordinatorService::Service* coordinator,
                                              std::string* address) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(coordinator);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  *address = absl::StrCat("127.0.0.1:", port);
  return server;
}

absl::StatusOr<AgentRig> StartRig(v1::CoordinatorService::Service* coordinator, Mailbox* mailbox) {
  AgentRig rig;
  rig.server = ServeOnLoopback(coordinator, &rig.options.coordinator_address);
  if (rig.server == nullptr) return absl::UnavailableError("the coordinator did not start");
  absl::StatusOr<std::unique_ptr<DataPlaneServer>> data_plane =
      DataPlaneServer::Start("127.0.0.1:0", mailbox);
  if (!data_plane.ok()) return data_plane.status();
  rig.data_plane = *std::move(data_plane);
  rig.options.join_token = "join";
  return rig;
}

// A coordinator that never hands out an assignment: the fakes below
// script registrations and heartbeats on top of it.
class NoAssignmentsCoordinator : public v1::CoordinatorService::Service {
 public:
  grpc::Status WatchAssignments(grpc::ServerContext*, const v1::WatchAssignmentsRequest*,
                                grpc::ServerWriter<v1::Assignment>*) override {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no assignments here");
  }
};

// Registers the first worker, forgets it at its first heartbeat
// (FAILED_PRECONDITION, as a restarted coordinator does) and refuses every
// later registration with UNAUTHENTICATED (as after the join token changed).
class ForgetfulCoordinator final : public NoAssignmentsCoordinator {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    if (registrations_.fetch_add(1) > 0) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "join token not accepted");
    }
    return RegisteredAsW1(response);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    heartbeats_.fetch_add(1);
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "incarnation not current");
  }
  int registrations() const { return registrations_.load(); }
  int heartbeats() const { return heartbeats_.load(); }

 private:
  std::atomic<int> registrations_{0};
  std::atomic<int> heartbeats_{0};
};

// Registers w-1 with heartbeats every 2 s and the lease it is given.
class LeaseCoordinator final : public NoAssignmentsCoordinator {
 public:
  explicit LeaseCoordinator(double lease_seconds) : lease_seconds_(lease_seconds) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    response->set_lease_seconds(lease_seconds_);
    return RegisteredAsW1(response, 1, /*interval_seconds=*/2);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    return grpc::Status::OK;
  }

 private:
  const double lease_seconds_;
};

// The lease a registration gives reaches the runners' report retries: 60 s,
// or the lease and a heartbeat when longer (at most a day); a lease that
// is no duration (NaN, 0, negative) leaves the 60 s.
TEST(WorkerAgentTest, ReportRetryFor_TheRegistrationsLeaseAndAHeartbeat) {
  const struct {
    double lease_seconds;
    absl::Duration expected;
  } cases[] = {{300, absl::Seconds(302)},
               {5, absl::Seconds(60)},
               {0, absl::Seconds(60)},
               {-3, absl::Seconds(60)},
               {std::nan(""), absl::Seconds(60)},
               {1e300, absl::Hours(24)}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.lease_seconds);
    LeaseCoordinator coordinator(c.lease_seconds);
    Mailbox mailbox;
    absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
    ASSERT_TRUE(rig.ok()) << rig.status();
    WorkerAgent agent(rig->options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
    EXPECT_EQ(agent.ReportRetryFor(), absl::Seconds(60));  // before any registration
    ASSERT_TRUE(agent.Start().ok());
    EXPECT_EQ(agent.ReportRetryFor(), c.expected);
    agent.Stop();
    rig->Shutdown();
  }
}

// 10 minutes, longer for a stage whose weights take that at 4 MiB/s: a
// stage of 8 GiB gets about 34 minutes.
TEST(WeightsUploadDeadlineTest, TenMinutesOrTheBytesAtTheFloorRate) {
  EXPECT_EQ(WeightsUploadDeadline(0), absl::Minutes(10));
  EXPECT_EQ(WeightsUploadDeadline(int64_t{500} << 20), absl::Minutes(10));  // 125 s at 4 MiB/s
  EXPECT_EQ(WeightsUploadDeadline(int64_t{8} << 30), absl::Seconds(2048));
  EXPECT_EQ(WeightsUploadDeadline(-1), absl::Minutes(10));
}

TEST(WorkerAgentTest, RefusedReRegistrationIsReportedAndHeartbeatsStop) {
  ForgetfulCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  AnnotatedMutex mu;  // a hand-off TSan sees (absl::Notification's it does not)
  absl::Status refusal;
  bool refused = false;
  options.on_registration_refused = [&](const absl::Status& status) {
    AnnotatedMutexLock lock(&mu);
    refusal = status;
    refused = true;
  };
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  {
    AnnotatedMutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout([&] { return refused; }, absl::Seconds(30)));
  }
  EXPECT_EQ(refusal.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(refusal.message().find("join token not accepted"), std::string::npos)
      << refusal.message();
  EXPECT_EQ(coordinator.registrations(), 2);  // no retry: it cannot help
  EXPECT_EQ(coordinator.heartbeats(), 1);     // the heartbeat thread has ended
  agent.Stop();
  rig->Shutdown();
}

// Registers the worker, then holds its first heartbeat unanswered until
// Release() (a coordinator black-holed behind a live connection).
class StuckHeartbeatCoordinator final : public NoAssignmentsCoordinator {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    return RegisteredAsW1(response);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    AnnotatedMutexLock lock(&mu_);
    held_ = true;
    mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return released_; },
                         absl::Minutes(10));
    return grpc::Status::OK;
  }
  grpc::Status DeregisterWorker(grpc::ServerContext*, const v1::DeregisterWorkerRequest*,
                                v1::DeregisterWorkerResponse*) override {
    deregistrations_.fetch_add(1);
    return grpc::Status::OK;
  }
  bool AwaitHeld() {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_; },
                                absl::Seconds(30));
  }
  void Release() {
    AnnotatedMutexLock lock(&mu_);
    released_ = true;
  }
  int deregistrations() const { return deregistrations_.load(); }

 private:
  AnnotatedMutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> deregistrations_{0};
};

// Leave() cancels a heartbeat in flight: it waited for the call's whole
// deadline (here an hour), which the worker's stop bound includes, so a
// worker whose coordinator stopped answering exited without deregistering.
TEST(WorkerAgentTest, Leave_HeartbeatUnanswered_CancelledAndDeregisters) {
  StuckHeartbeatCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.rpc_timeout = absl::Hours(1);
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(coordinator.AwaitHeld());
  agent.Leave();  // returns while the coordinator still holds the heartbeat
  EXPECT_EQ(coordinator.deregistrations(), 1);
  coordinator.Release();
  agent.Stop();
  rig->Shutdown();
}

// The default 10 s RPC timeout, capped for a worker given a lease so that
// the beat after one given up still comes an interval before the lease
// ends; never under an interval, and uncapped without a lease.
TEST(HeartbeatDeadlineTest, RpcTimeoutCappedToLeaveAnIntervalBeforeTheLease) {
  const absl::Duration rpc = absl::Seconds(10);
  EXPECT_EQ(HeartbeatDeadline(rpc, absl::Seconds(5), absl::Seconds(1)), absl::Seconds(3));
  EXPECT_EQ(HeartbeatDeadline(rpc, absl::Seconds(11), absl::Seconds(1)), absl::Seconds(9));
  EXPECT_EQ(HeartbeatDeadline(rpc, absl::Seconds(60), absl::Seconds(1)), rpc);
  EXPECT_EQ(HeartbeatDeadline(rpc, absl::Seconds(5), absl::Seconds(2)), absl::Seconds(2));
  EXPECT_EQ(HeartbeatDeadline(rpc, absl::ZeroDuration(), absl::Seconds(1)), rpc);
  EXPECT_EQ(HeartbeatDeadline(absl::Seconds(2), absl::Seconds(5), absl::Seconds(1)),
            absl::Seconds(2));
}

// Registers w-1 with the coordinator's defaults (a heartbeat every second,
// a 5 s lease), then holds the first heartbeat's answer for up to a lease
// (its jobs lock held), noting whether the next beat came meanwhile.
class SlowFirstHeartbeatCoordinator final : public NoAssignmentsCoordinator {
 public:
  static constexpr absl::Duration kInterval = absl::Seconds(1);
  static constexpr absl::Duration kLease = absl::Seconds(5);

  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    response->set_lease_seconds(absl::ToDoubleSeconds(kLease));
    return RegisteredAsW1(response, 1, absl::ToDoubleSeconds(kInterval));
  }
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    AnnotatedMutexLock lock(&mu_);
    if (++beats_ > 1) return grpc::Status::OK;
    first_wait_ = absl::FromChrono(context->deadline()) - absl::Now();
    second_within_lease_ = mu_.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return beats_ > 1; }, kLease);
    first_answered_ = true;
    return grpc::Status::OK;
  }
  // Waits until the first beat is answered; then how long it was let wait
  // (its deadline, from its arrival) and whether the second came within a
  // lease of it.
  bool AwaitFirstAnswered(absl::Duration* first_wait, bool* second_within_lease) {
    AnnotatedMutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return first_answered_; },
                              absl::Seconds(60))) {
      return false;
    }
    *first_wait = first_wait_;
    *second_within_lease = second_within_lease_;
    return true;
  }

 private:
  AnnotatedMutex mu_;
  int beats_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration first_wait_ ABSL_GUARDED_BY(mu_);
  bool second_within_lease_ ABSL_GUARDED_BY(mu_) = false;
  bool first_answered_ ABSL_GUARDED_BY(mu_) = false;
};

// A beat answered late is given up in time for the next to keep the lease:
// with the default 10 s RPC timeout the worker waited for the answer, sent
// its next beat past the 5 s lease, and was marked LOST though healthy.
TEST(WorkerAgentTest, Heartbeat_AnswerHeldPastTheLease_NextBeatSentWithinIt) {
  SlowFirstHeartbeatCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  ASSERT_EQ(rig->options.rpc_timeout, absl::Seconds(10));
  WorkerAgent agent(rig->options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  absl::Duration first_wait;
  bool second_within_lease = false;
  ASSERT_TRUE(coordinator.AwaitFirstAnswered(&first_wait, &second_within_lease));
  // What the worker let the first beat wait leaves it an interval to send
  // the next within the lease.
  EXPECT_LE(first_wait,
            SlowFirstHeartbeatCoordinator::kLease - SlowFirstHeartbeatCoordinator::kInterval)
      << first_wait;
  EXPECT_TRUE(second_within_lease);
  agent.Stop();
  rig->Shutdown();
}

// Forgets the worker at its first heartbeat (a restarted coordinator) and
// takes it back at its next registration; its first assignment stream
// ends at once, the next ones stay open until the server stops. Counts
// the streams opened.
class RestartedCoordinator final : public v1::CoordinatorService::Service {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    const int n = registrations_.fetch_add(1) + 1;
    return RegisteredAsW1(response, n);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse*) override {
    if (request->incarnation() == 2) {
      AnnotatedMutexLock lock(&mu_);
      ++heartbeats_of_2_;
    }
    if (request->incarnation() == 1) {
      // Forgotten only once the first stream has opened (and broken): the
      // test is about a stream that broke before the registration, and a
      // stream opened after it belongs to the new incarnation.
      AnnotatedMutexLock lock(&mu_);
      mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return streams_ >= 1; },
                           absl::Seconds(30));
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "incarnation not current");
    }
    return grpc::Status::OK;
  }
  grpc::Status WatchAssignments(grpc::ServerContext* context,
                                const v1::WatchAssignmentsRequest* request,
                                grpc::ServerWriter<v1::Assignment>*) override {
    {
      AnnotatedMutexLock lock(&mu_);
      ++streams_;
      if (streams_ == 1) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting");
    }
    while (!context->IsCancelled()) {  // open until the agent or the server ends it
      AnnotatedMutexLock lock(&mu_);
      mu_.AwaitWithTimeout([] { return false; }, absl::Milliseconds(20));
    }
    AnnotatedMutexLock lock(&mu_);
    // The real coordinator marks the incarnation LOST when its stream is
    // cancelled (AssignmentStream::OnCancel).
    if (request->incarnation() == 2 && !agent_stopping_) ++cancelled_streams_of_2_;
    return grpc::Status::OK;
  }
  bool AwaitStreams(int n) {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return streams_ >= n; },
                                absl::Seconds(30));
  }
  bool AwaitHeartbeatOfIncarnation2() {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return heartbeats_of_2_ >= 1; },
        absl::Seconds(30));
  }
  // Whether a stream of incarnation 2 ends cancelled within `wait`.
  bool AwaitCancelledStreamOfIncarnation2(absl::Duration wait) {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_streams_of_2_ > 0; }, wait);
  }
  void AgentStopping() {
    AnnotatedMutexLock lock(&mu_);
    agent_stopping_ = true;
  }

 private:
  std::atomic<int> registrations_{0};
  AnnotatedMutex mu_;
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
  int heartbeats_of_2_ ABSL_GUARDED_BY(mu_) = 0;
  int cancelled_streams_of_2_ ABSL_GUARDED_BY(mu_) = 0;
  bool agent_stopping_ ABSL_GUARDED_BY(mu_) = false;
};

// The assignment stream broke and the agent waits out a long backoff; it
// then registers again (the coordinator forgot it): the stream reopens at
// once, not after the backoff (a restarted coordinator's jobs wait for it).
TEST(WorkerAgentTest, StreamBrokeThenRegisteredAgain_StreamReopensWithoutWaitingTheBackoff) {
  RestartedCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.backoff.initial = absl::Minutes(10);  // longer than the test waits
  options.backoff.max = absl::Minutes(10);
  options.backoff.jitter = 0;
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  EXPECT_TRUE(coordinator.AwaitStreams(2));
  agent.Stop();
  rig->Shutdown();
}

// The registration after a coordinator restart wakes the watch loop,
// which opens the new incarnation's stream while the heartbeat loop is
// still finishing that registration (here: before it goes on). The
// heartbeat loop must not cancel that stream as if it were the old one:
// the coordinator would count the new incarnation lost. (A negative check:
// the stream's cancel would arrive within milliseconds; it is given 2 s.)
TEST(WorkerAgentTest, RegisteredAgainWhileTheNewStreamOpens_TheNewStreamIsNotCancelled) {
  RestartedCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.backoff.initial = absl::Minutes(10);
  options.backoff.max = absl::Minutes(10);
  options.backoff.jitter = 0;
  options.on_registration_change = [&](bool registered) {
    if (registered) coordinator.AwaitStreams(2);  // the new stream is open
  };
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(coordinator.AwaitStreams(2));
  // Heartbeats of the new incarnation come after the point where the old
  // stream is cancelled.
  ASSERT_TRUE(coordinator.AwaitHeartbeatOfIncarnation2());
  EXPECT_FALSE(coordinator.AwaitCancelledStreamOfIncarnation2(absl::Seconds(2)));
  coordinator.AgentStopping();
  agent.Stop();
  rig->Shutdown();
}

// Answers a registration only once the test lets it (the agent is stopped
// meanwhile), and counts heartbeats and deregistrations. With
// `first_unavailable`, the first answer is UNAVAILABLE (an unreachable
// coordinator) and later ones come at once. Records each registration's
// `drained` and counts DrainWorker calls.
class SlowRegistrationCoordinator final : public NoAssignmentsCoordinator {
 public:
  explicit SlowRegistrationCoordinator(bool first_unavailable = false)
      : first_unavailable_(first_unavailable) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    AnnotatedMutexLock lock(&mu_);
    drained_.push_back(request->drained());
    registration_ids_.push_back(request->registration_id());
    registering_ = true;
    mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return answer_; },
                         absl::Seconds(30));
    if (first_unavailable_ && drained_.size() == 1) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused");
    }
    return RegisteredAsW1(response);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    heartbeats_.fetch_add(1);
    return grpc::Status::OK;
  }
  grpc::Status DeregisterWorker(grpc::ServerContext*, const v1::DeregisterWorkerRequest* request,
                                v1::DeregisterWorkerResponse*) override {
    if (request->worker_id() == "w-1") deregistrations_.fetch_add(1);
    return grpc::Status::OK;
  }
  bool AwaitRegistering() {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return registering_; },
                                absl::Seconds(30));
  }
  void Answer() {
    AnnotatedMutexLock lock(&mu_);
    answer_ = true;
  }
  grpc::Status DrainWorker(grpc::ServerContext*, const v1::DrainWorkerRequest* request,
                           v1::Worker* response) override {
    drains_.fetch_add(1);
    response->set_id(request->worker_id());
    return grpc::Status::OK;
  }
  int heartbeats() const { return heartbeats_.load(); }
  int deregistrations() const { return deregistrations_.load(); }
  int drains() const { return drains_.load(); }
  std::vector<bool> drained() {
    AnnotatedMutexLock lock(&mu_);
    return drained_;
  }
  std::vector<std::string> registration_ids() {
    AnnotatedMutexLock lock(&mu_);
    return registration_ids_;
  }

 private:
  const bool first_unavailable_;
  AnnotatedMutex mu_;
  std::vector<bool> drained_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> registration_ids_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> drains_{0};
  bool registering_ ABSL_GUARDED_BY(mu_) = false;
  bool answer_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> heartbeats_{0};
  std::atomic<int> deregistrations_{0};
};

// Stop() (a signal) while the registration is on its way: Start() starts
// no heartbeats or watch, deregisters what it got, and says CANCELLED; no
// READY worker without a process is left at the coordinator.
TEST(WorkerAgentTest, StoppedWhileRegistering_DeregistersAndStartsNothing) {
  SlowRegistrationCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgent agent(rig->options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  absl::Status started;
  std::thread starter([&] { started = agent.Start(); });
  ASSERT_TRUE(coordinator.AwaitRegistering());
  agent.Stop();
  coordinator.Answer();
  starter.join();
  EXPECT_EQ(started.code(), absl::StatusCode::kCancelled) << started;
  EXPECT_EQ(coordinator.deregistrations(), 1);
  EXPECT_EQ(coordinator.heartbeats(), 0);
  agent.Stop();  // again, as the destructor does: nothing more
  EXPECT_EQ(coordinator.deregistrations(), 1);
  rig->Shutdown();
}

// A drain asked for (SIGTERM) while the registration is on its way: the
// coordinator must still learn it, or it places a job on a worker that is
// leaving. The registration already sent says not drained, so the agent
// drains right after it.
TEST(WorkerAgentTest, DrainAskedWhileRegistering_DrainedOnceRegistered) {
  SlowRegistrationCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgent agent(rig->options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  absl::Status started;
  std::thread starter([&] { started = agent.Start(); });
  ASSERT_TRUE(coordinator.AwaitRegistering());
  EXPECT_EQ(agent.RequestDrain(), absl::OkStatus());
  coordinator.Answer();
  starter.join();
  ASSERT_EQ(started, absl::OkStatus());
  EXPECT_EQ(coordinator.drained(), std::vector<bool>({false}));
  EXPECT_EQ(coordinator.drains(), 1);
  agent.Stop();
  rig->Shutdown();
}

// The coordinator unreachable at the first attempt, a drain asked for
// before the next: that registration says drained (no DrainWorker needed).
TEST(WorkerAgentTest, DrainAskedWhileRetryingTheRegistration_TheNextSaysDrained) {
  SlowRegistrationCoordinator coordinator(/*first_unavailable=*/true);
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.backoff.initial = absl::Milliseconds(10);
  options.backoff.jitter = 0;
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  absl::Status started;
  std::thread starter([&] { started = agent.Start(); });
  ASSERT_TRUE(coordinator.AwaitRegistering());
  EXPECT_EQ(agent.RequestDrain(), absl::OkStatus());
  coordinator.Answer();  // the first UNAVAILABLE, the retry at once
  starter.join();
  ASSERT_EQ(started, absl::OkStatus());
  EXPECT_EQ(coordinator.drained(), std::vector<bool>({false, true}));
  EXPECT_EQ(coordinator.drains(), 0);
  // The retry is the same registration (the coordinator answers a retry
  // whose first attempt went through with the incarnation it made).
  const std::vector<std::string> ids = coordinator.registration_ids();
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0].size(), 32u);
  EXPECT_EQ(ids[1], ids[0]);
  agent.Stop();
  rig->Shutdown();
}

// Registers incarnation n at the n-th registration and forgets incarnation
// 1 at its first heartbeat (a restarted coordinator), so that the agent
// registers again; records the registrations and the incarnations
// deregistered. Registration n is answered as the subclass says
// (Attempt(n), called with mu_ held).
class ReRegistrationCoordinator : public NoAssignmentsCoordinator {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    AnnotatedMutexLock lock(&mu_);
    registrations_.push_back(*request);
    const int n = static_cast<int>(registrations_.size());
    const grpc::Status attempt = Attempt(n);
    if (!attempt.ok()) return attempt;
    return RegisteredAsW1(response, n);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse*) override {
    if (request->incarnation() == 1) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "incarnation not current");
    }
    return grpc::Status::OK;
  }
  grpc::Status DeregisterWorker(grpc::ServerContext*, const v1::DeregisterWorkerRequest* request,
                                v1::DeregisterWorkerResponse*) override {
    AnnotatedMutexLock lock(&mu_);
    if (request->worker_id() == "w-1") deregistered_.push_back(request->incarnation());
    return grpc::Status::OK;
  }
  bool AwaitRegistrations(int n) {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                                    mu_) { return static_cast<int>(registrations_.size()) >= n; },
                                absl::Seconds(30));
  }
  std::vector<v1::RegisterWorkerRequest> registrations() {
    AnnotatedMutexLock lock(&mu_);
    return registrations_;
  }
  std::vector<int64_t> deregistered() {
    AnnotatedMutexLock lock(&mu_);
    return deregistered_;
  }

 protected:
  virtual grpc::Status Attempt(int n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  AnnotatedMutex mu_;

 private:
  std::vector<v1::RegisterWorkerRequest> registrations_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> deregistered_ ABSL_GUARDED_BY(mu_);
};

// The registration again was sent once more (the same registration_id,
// said drained) and the incarnation that answer named was deregistered.
void ExpectSentAgainDrainedAndDeregistered(ReRegistrationCoordinator& coordinator) {
  const std::vector<v1::RegisterWorkerRequest> registrations = coordinator.registrations();
  ASSERT_EQ(registrations.size(), 3u);
  EXPECT_EQ(registrations[2].registration_id(), registrations[1].registration_id());
  EXPECT_FALSE(registrations[1].drained());
  EXPECT_TRUE(registrations[2].drained());
  EXPECT_EQ(coordinator.deregistered(), std::vector<int64_t>({3}));
}

// Holds the registration again until Release(), as a coordinator whose
// store is slow, while that incarnation may commit.
class HeldReRegistrationCoordinator final : public ReRegistrationCoordinator {
 public:
  void Release() {
    AnnotatedMutexLock lock(&mu_);
    released_ = true;
  }

 private:
  grpc::Status Attempt(int n) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (n == 2) {
      mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return released_; },
                           absl::Minutes(10));
    }
    return grpc::Status::OK;
  }
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// Fails registration `failing` UNAVAILABLE, as an attempt whose deadline
// passed does (it may have committed); every other one is answered.
class FailedRegistrationCoordinator final : public ReRegistrationCoordinator {
 public:
  explicit FailedRegistrationCoordinator(int failing) : failing_(failing) {}

 private:
  grpc::Status Attempt(int n) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (n != failing_) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the save timed out");
  }
  const int failing_;
};

// Leave() while the registration again (after the coordinator dropped the
// worker) is held: it waited for the call's whole deadline (here an hour;
// the shutdown's watchdog allows seconds, so the process exited without
// deregistering). Now it cancels the call, sends it once more (the same
// registration_id, said drained) and deregisters the incarnation that
// answer names: the registry answers with the one the held attempt made,
// or supersedes it.
TEST(WorkerAgentTest, Leave_ReRegistrationHeld_CancelledSentAgainAndDeregistered) {
  HeldReRegistrationCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.rpc_timeout = absl::Hours(1);
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(coordinator.AwaitRegistrations(2));
  AnnotatedMutex mu;
  bool left = false;
  std::thread leaver([&] {
    agent.Leave();
    AnnotatedMutexLock lock(&mu);
    left = true;
  });
  bool left_in_time = false;
  {
    AnnotatedMutexLock lock(&mu);
    left_in_time = mu.AwaitWithTimeout([&] { return left; }, absl::Seconds(30));
  }
  coordinator.Release();  // also ends a Leave that waits for the held call
  leaver.join();
  EXPECT_TRUE(left_in_time) << "Leave waited for the held registration";
  ExpectSentAgainDrainedAndDeregistered(coordinator);
  agent.Stop();
  rig->Shutdown();
}

// Leave() while the registration again waits out its backoff after an
// attempt that failed (a deadline: the coordinator may have committed it):
// that registration is sent once more, said drained, and the incarnation
// its answer names is the one deregistered. Before, the loop just stopped,
// and what the failed attempt made stayed READY until its lease ended.
TEST(WorkerAgentTest, Leave_AfterAFailedReRegistration_SentAgainAndDeregistered) {
  FailedRegistrationCoordinator coordinator(/*failing=*/2);
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.backoff.initial = absl::Hours(1);  // Leave comes during it
  options.backoff.max = absl::Hours(1);
  options.backoff.jitter = 0;
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(coordinator.AwaitRegistrations(2));
  ASSERT_TRUE(agent.AwaitRegistrationBackoffForTesting(absl::Seconds(30)));
  agent.Leave();
  ExpectSentAgainDrainedAndDeregistered(coordinator);
  agent.Stop();
  rig->Shutdown();
}

// The same on Start's path: stopped while the first registration waits out
// its backoff after an attempt that failed, the agent sends it once more,
// drained, and Start deregisters what that names.
TEST(WorkerAgentTest, StoppedWhileStartBacksOff_SentAgainAndDeregistered) {
  FailedRegistrationCoordinator coordinator(/*failing=*/1);
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.backoff.initial = absl::Hours(1);
  options.backoff.max = absl::Hours(1);
  options.backoff.jitter = 0;
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  absl::Status started = absl::UnknownError("not returned");
  std::thread starter([&] { started = agent.Start(); });
  ASSERT_TRUE(agent.AwaitRegistrationBackoffForTesting(absl::Seconds(30)));
  agent.Leave();
  starter.join();
  EXPECT_EQ(started.code(), absl::StatusCode::kCancelled) << started;
  const std::vector<v1::RegisterWorkerRequest> registrations = coordinator.registrations();
  ASSERT_EQ(registrations.size(), 2u);
  EXPECT_EQ(registrations[1].registration_id(), registrations[0].registration_id());
  EXPECT_FALSE(registrations[0].drained());
  EXPECT_TRUE(registrations[1].drained());
  EXPECT_EQ(coordinator.deregistered(), std::vector<int64_t>({2}));
  agent.Stop();
  rig->Shutdown();
}

// Registers incarnation n at the n-th registration and records whether it
// said drained. A drain is refused as the real coordinator refuses a LOST
// worker's (its lease ran out meanwhile), and from then on incarnation 1's
// heartbeats are refused, so that the agent registers again.
class LostWhileDrainingCoordinator final : public NoAssignmentsCoordinator {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    AnnotatedMutexLock lock(&mu_);
    drained_.push_back(request->drained());
    registration_ids_.push_back(request->registration_id());
    const int n = static_cast<int>(drained_.size());
    return RegisteredAsW1(response, n);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse*) override {
    if (request->incarnation() == 1 && lost_.load()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "worker w-1 is LOST");
    }
    return grpc::Status::OK;
  }
  grpc::Status DrainWorker(grpc::ServerContext*, const v1::DrainWorkerRequest*,
                           v1::Worker*) override {
    lost_.store(true);
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "worker w-1 is LOST; drain it once it is READY");
  }
  bool AwaitRegistrations(int n) {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return static_cast<int>(drained_.size()) >= n; },
        absl::Seconds(30));
  }
  std::vector<bool> drained() {
    AnnotatedMutexLock lock(&mu_);
    return drained_;
  }
  std::vector<std::string> registration_ids() {
    AnnotatedMutexLock lock(&mu_);
    return registration_ids_;
  }

 private:
  AnnotatedMutex mu_;
  std::vector<bool> drained_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> registration_ids_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> lost_{false};
};

// A drain the coordinator refused (the worker was LOST, or the coordinator
// restarted and forgot it) is still asked for: the next registration says
// drained, so the worker does not come back READY to be given a job while
// it is leaving.
TEST(WorkerAgentTest, DrainRefusedThenRegisteredAgain_TheRegistrationSaysDrained) {
  LostWhileDrainingCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.backoff.initial = absl::Milliseconds(10);
  options.backoff.jitter = 0;
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  EXPECT_EQ(agent.RequestDrain().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(coordinator.AwaitRegistrations(2));
  EXPECT_EQ(coordinator.drained(), std::vector<bool>({false, true}));
  // A registration after a loss is a new one, not a retry.
  const std::vector<std::string> ids = coordinator.registration_ids();
  ASSERT_GE(ids.size(), 2u);
  EXPECT_NE(ids[1], ids[0]);
  agent.Stop();
  rig->Shutdown();
}

// Restarts as it is asked to drain w-1: that drain, and every later call
// carrying incarnation 1's session (its heartbeats too), is refused as the
// real coordinator refuses a session it no longer takes, so that the agent
// registers again. Answers registration n as incarnation n, holding the
// second until Release(), and grants a drain sent with a current session.
// Records each registration's `drained` and the session each drain carried.
class RestartedWhileDrainingCoordinator final : public NoAssignmentsCoordinator {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    AnnotatedMutexLock lock(&mu_);
    drained_.push_back(request->drained());
    const int n = static_cast<int>(drained_.size());
    if (n == 2) {
      mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return released_; },
                           absl::Seconds(30));
    }
    return RegisteredAsW1(response, n);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse*) override {
    AnnotatedMutexLock lock(&mu_);
    if (request->incarnation() == 1 && restarted_) return StaleSession();
    return grpc::Status::OK;
  }
  grpc::Status DrainWorker(grpc::ServerContext* context, const v1::DrainWorkerRequest* request,
                           v1::Worker* response) override {
    const auto bearer = context->client_metadata().find("authorization");
    const std::string session = bearer == context->client_metadata().end()
                                    ? ""
                                    : std::string(bearer->second.data(), bearer->second.size());
    AnnotatedMutexLock lock(&mu_);
    drain_sessions_.push_back(session);
    if (session == "Bearer w-1.1.secret") {
      restarted_ = true;
      return StaleSession();
    }
    response->set_id(request->worker_id());
    response->set_drained(true);
    return grpc::Status::OK;
  }
  void Release() {
    AnnotatedMutexLock lock(&mu_);
    released_ = true;
  }
  std::vector<bool> drained() {
    AnnotatedMutexLock lock(&mu_);
    return drained_;
  }
  std::vector<std::string> drain_sessions() {
    AnnotatedMutexLock lock(&mu_);
    return drain_sessions_;
  }

 private:
  // WorkerRegistry::AuthenticateSession's refusal.
  static grpc::Status StaleSession() {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "session credential not recognised: it is malformed, or its worker "
                        "incarnation is not current (the coordinator restarted, or the worker "
                        "registered again); register again");
  }
  AnnotatedMutex mu_;
  bool restarted_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<bool> drained_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> drain_sessions_ ABSL_GUARDED_BY(mu_);
};

// A drain refused because the coordinator restarted (this worker's session
// is stale) passes, as DrainAfterDelay decides: once the heartbeat loop has
// registered again (said drained), the drain asked again is granted. Asked
// before that, it is refused again: the shutdown waits for the
// registration (AwaitRegisteredAgain). The worker used to leave undrained,
// and to deregister with the stale session (LOST, not LEFT).
TEST(WorkerAgentTest, DrainRefusedForAStaleSession_AskedAgainOnceRegisteredAgain_Granted) {
  RestartedWhileDrainingCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  // The held registration must not time out and be retried meanwhile.
  options.rpc_timeout = absl::Seconds(60);
  options.backoff.initial = absl::Milliseconds(10);
  options.backoff.jitter = 0;
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  // No drain refused yet: nothing to wait for.
  EXPECT_EQ(agent.AwaitRegisteredAgain(absl::ZeroDuration()), absl::OkStatus());
  const absl::Status first = agent.RequestDrain();
  EXPECT_EQ(first.code(), absl::StatusCode::kUnauthenticated) << first;
  EXPECT_TRUE(IsStaleSessionRefusal(first));
  ASSERT_TRUE(AsksDrainAfterDelay(first, /*hurried=*/false));
  // The registration again is held: the old session is refused again.
  EXPECT_EQ(agent.RequestDrain().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(agent.AwaitRegisteredAgain(absl::ZeroDuration()).code(),
            absl::StatusCode::kDeadlineExceeded);
  coordinator.Release();
  ASSERT_EQ(agent.AwaitRegisteredAgain(absl::Seconds(30)), absl::OkStatus());
  ::testing::internal::CaptureStderr();
  const absl::Status again = agent.RequestDrain();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(again, absl::OkStatus());
  EXPECT_TRUE(absl::StrContains(log, "drained: no job is placed on this worker")) << log;
  EXPECT_EQ(coordinator.drain_sessions(),
            std::vector<std::string>(
                {"Bearer w-1.1.secret", "Bearer w-1.1.secret", "Bearer w-1.2.secret"}));
  // The registration again said drained (the first ask set it).
  EXPECT_EQ(coordinator.drained(), std::vector<bool>({false, true}));
  agent.Stop();
  rig->Shutdown();
}

// Registers w-1, then restarts as it is asked to drain it: that drain, and
// every later heartbeat of incarnation 1, is refused for the stale
// session, and every registration again is refused (the restarted
// coordinator no longer takes the join token).
class RestartedThenRefusingCoordinator final : public NoAssignmentsCoordinator {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    if (registrations_.fetch_add(1) > 0) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "join token not accepted");
    }
    return RegisteredAsW1(response);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    return restarted_.load() ? StaleSession() : grpc::Status::OK;
  }
  grpc::Status DrainWorker(grpc::ServerContext*, const v1::DrainWorkerRequest*,
                           v1::Worker*) override {
    restarted_.store(true);
    return StaleSession();
  }
  int registrations() const { return registrations_.load(); }

 private:
  static grpc::Status StaleSession() {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "session credential not recognised: register again");
  }
  std::atomic<bool> restarted_{false};
  std::atomic<int> registrations_{0};
};

// After a drain refused for a stale session, the shutdown waits for the
// heartbeat loop to register again; when that registration is refused, the
// loop gives up, and the wait ends at once with the refusal. It used to
// wait out the whole drain timeout (60 s by default, up to a day), then
// warn "not registered again" without naming the refusal.
TEST(WorkerAgentTest, AwaitRegisteredAgain_RegistrationRefused_EndsWithTheRefusal) {
  RestartedThenRefusingCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  AnnotatedMutex mu;
  bool refused = false;
  options.on_registration_refused = [&](const absl::Status&) {
    AnnotatedMutexLock lock(&mu);
    refused = true;
  };
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  const absl::Status first = agent.RequestDrain();
  ASSERT_TRUE(IsStaleSessionRefusal(first)) << first;
  // Ends when the loop gives up (a heartbeat of 50 ms from now), well
  // before this bound, which only a regression waits out.
  const absl::Status registered = agent.AwaitRegisteredAgain(absl::Seconds(20));
  EXPECT_EQ(registered.code(), absl::StatusCode::kUnauthenticated) << registered;
  EXPECT_TRUE(absl::StrContains(registered.message(),
                                "the coordinator refused this worker's registration again: "))
      << registered;
  EXPECT_TRUE(absl::StrContains(registered.message(), "join token not accepted")) << registered;
  {
    AnnotatedMutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout([&] { return refused; }, absl::Seconds(30)));
  }
  // Asked again, it answers so at once: no registration comes.
  EXPECT_EQ(agent.AwaitRegisteredAgain(absl::ZeroDuration()), registered);
  EXPECT_EQ(coordinator.registrations(), 2);
  agent.Stop();
  rig->Shutdown();
}

// Refuses every registration for what it says (a --node-name over the
// bound, say, or the worker's build): the same request would be refused
// again.
class RefusingCoordinator final : public NoAssignmentsCoordinator {
 public:
  explicit RefusingCoordinator(grpc::Status refusal) : refusal_(std::move(refusal)) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse*) override {
    registrations_.fetch_add(1);
    return refusal_;
  }
  int registrations() const { return registrations_.load(); }

 private:
  const grpc::Status refusal_;
  std::atomic<int> registrations_{0};
};

// Start() says so at once (the worker exits 1 naming the field, or both
// builds) instead of retrying forever, never ready.
TEST(WorkerAgentTest, RegistrationRefusedForItsContentOrBuild_StartFailsAtOnce) {
  for (const grpc::Status& refusal :
       {grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     "RegisterWorkerRequest.node_name is 300 bytes, more than 253"),
        grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                     "the worker at 10.0.0.1:7001 runs build 0.1.0 (commit 1c20cae00000), not "
                     "the coordinator's 0.1.0 (commit 3635b2d1a2b3)")}) {
    SCOPED_TRACE(refusal.error_message());
    RefusingCoordinator coordinator(refusal);
    Mailbox mailbox;
    absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
    ASSERT_TRUE(rig.ok()) << rig.status();
    WorkerAgentOptions options = rig->options;
    options.backoff.initial = absl::Milliseconds(10);
    options.backoff.max = absl::Milliseconds(10);
    WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
    AnnotatedMutex mu;  // a hand-off TSan sees
    absl::Status started;
    bool returned = false;
    std::thread starter([&] {
      absl::Status status = agent.Start();
      AnnotatedMutexLock lock(&mu);
      started = std::move(status);
      returned = true;
    });
    bool in_time = false;
    {
      AnnotatedMutexLock lock(&mu);
      in_time = mu.AwaitWithTimeout([&] { return returned; }, absl::Seconds(30));
    }
    // Stopped if it retries on (it would never return): CANCELLED then.
    if (!in_time) agent.Stop();
    starter.join();
    AnnotatedMutexLock lock(&mu);
    EXPECT_EQ(static_cast<int>(started.code()), static_cast<int>(refusal.error_code())) << started;
    EXPECT_EQ(started.message(), refusal.error_message());
    EXPECT_EQ(coordinator.registrations(), 1);
    agent.Stop();
    rig->Shutdown();
  }
}

// A worker whose start-up was refused (it never registered) and that then
// shuts down asks for no drain and says nothing was drained: it logged
// "drained: no job is placed on this worker from now on".
TEST(WorkerAgentTest, RequestDrain_StartRefused_OkWithoutSayingDrained) {
  RefusingCoordinator coordinator(
      grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "join token rejected"));
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgent agent(rig->options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_EQ(agent.Start().code(), absl::StatusCode::kUnauthenticated);
  ::testing::internal::CaptureStderr();
  const absl::Status drained = agent.RequestDrain();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(drained, absl::OkStatus());
  EXPECT_FALSE(absl::StrContains(log, "drained")) << log;
  EXPECT_EQ(coordinator.registrations(), 1);
  agent.Stop();
  rig->Shutdown();
}

// Answers every registration UNIMPLEMENTED, as a gRPC server without the
// coordinator's service does (a worker's --listen port, etcd), counting the
// attempts under the caller's `mu`, so that a test waits for Start() to
// return or for a second attempt, whichever comes first.
class NotACoordinator final : public NoAssignmentsCoordinator {
 public:
  NotACoordinator(AnnotatedMutex* mu, int* attempts) : mu_(mu), attempts_(attempts) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse*) override {
    AnnotatedMutexLock lock(mu_);
    ++*attempts_;
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "unknown service pipetrain.v1.CoordinatorService");
  }

 private:
  AnnotatedMutex* const mu_;
  int* const attempts_;
};

// --coordinator naming something that serves gRPC but not the coordinator:
// Start() fails at once (the worker exits 1) naming the address, instead of
// backing off and retrying forever, never ready. The backoff is short, so
// an agent that retries makes a second attempt at once, which ends the wait.
TEST(WorkerAgentTest, Start_AddressDoesNotServeTheCoordinator_FailsAtOnceNamingIt) {
  AnnotatedMutex mu;  // a hand-off TSan sees
  int attempts = 0;
  NotACoordinator coordinator(&mu, &attempts);
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.backoff.initial = absl::Milliseconds(1);
  options.backoff.max = absl::Milliseconds(1);
  options.backoff.jitter = 0;
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  absl::Status started;
  bool returned = false;
  std::thread starter([&] {
    absl::Status status = agent.Start();
    AnnotatedMutexLock lock(&mu);
    started = std::move(status);
    returned = true;
  });
  {
    AnnotatedMutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout([&] { return returned || attempts >= 2; }, absl::Seconds(30)));
  }
  agent.Leave();  // ends a Start() that retries (CANCELLED)
  starter.join();
  AnnotatedMutexLock lock(&mu);
  EXPECT_EQ(attempts, 1);
  EXPECT_EQ(started.code(), absl::StatusCode::kUnimplemented) << started;
  EXPECT_EQ(started.message(),
            absl::StrCat(options.coordinator_address,
                         " does not serve the coordinator's API (RegisterWorker: unknown service "
                         "pipetrain.v1.CoordinatorService): --coordinator must name a "
                         "coordinator's --grpc-address, not a worker's --listen port, etcd or "
                         "another gRPC service"));
  agent.Stop();
  rig->Shutdown();
}

// With several coordinators listed, one that answers UNIMPLEMENTED (a
// proxy's 404 in front of it during a rollout, here a worker's --listen
// port) is passed over for the next: the first registration refused the
// worker, naming the next address, though that one led.
TEST(WorkerAgentTest, Start_FirstListedAddressNotACoordinator_RegistersWithTheNext) {
  LeaseCoordinator coordinator(/*lease_seconds=*/300);
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.coordinator_address =
      absl::StrCat(rig->data_plane->address(), ",", rig->options.coordinator_address);
  options.backoff.initial = absl::Milliseconds(1);
  options.backoff.max = absl::Milliseconds(1);
  options.backoff.jitter = 0;
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  const absl::Status started = agent.Start();
  EXPECT_TRUE(started.ok()) << started;
  agent.Stop();
  rig->Shutdown();
}

// The same against a real server without the service: the rig's data plane
// (a worker's --listen port), whose gRPC answers the unknown method itself.
TEST(WorkerAgentTest, Start_CoordinatorIsAWorkersListenPort_FailsAtOnce) {
  NoAssignmentsCoordinator unused;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&unused, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.coordinator_address = rig->data_plane->address();
  options.backoff.initial = absl::Hours(1);  // a retrying agent waits here until Leave()
  options.backoff.max = absl::Hours(1);
  options.backoff.jitter = 0;
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  AnnotatedMutex mu;
  absl::Status started;
  bool returned = false;
  std::thread starter([&] {
    absl::Status status = agent.Start();
    AnnotatedMutexLock lock(&mu);
    started = std::move(status);
    returned = true;
  });
  bool in_time = false;
  {
    AnnotatedMutexLock lock(&mu);
    in_time = mu.AwaitWithTimeout([&] { return returned; }, absl::Seconds(30));
  }
  if (!in_time) agent.Leave();  // a retrying Start() returns CANCELLED then
  starter.join();
  AnnotatedMutexLock lock(&mu);
  EXPECT_EQ(started.code(), absl::StatusCode::kUnimplemented) << started;
  EXPECT_TRUE(absl::StartsWith(
      started.message(),
      absl::StrCat(options.coordinator_address, " does not serve the coordinator's API")))
      << started;
  agent.Stop();
  rig->Shutdown();
}

// Answers the registration again (the second) UNIMPLEMENTED, as a proxy in
// front of the coordinator (nginx, Envoy, Istio) answers a 404 during a
// rollout; every other one is answered.
class ProxyRolloutCoordinator final : public ReRegistrationCoordinator {
 private:
  grpc::Status Attempt(int n) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (n != 2) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "Received http2 header with status: 404");
  }
};

// A worker that registered fine meets UNIMPLEMENTED when registering again:
// the address served the coordinator, so it backs off and retries, keeping
// its stage. Before, that was a refusal: the worker exited 1 mid-rollout.
TEST(WorkerAgentTest, ReRegistrationAnsweredUnimplemented_RetriedNotRefused) {
  ProxyRolloutCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.backoff.initial = absl::Milliseconds(1);
  options.backoff.max = absl::Milliseconds(1);
  options.backoff.jitter = 0;
  AnnotatedMutex mu;  // a hand-off TSan sees
  bool refused = false, registered_again = false;
  options.on_registration_refused = [&](const absl::Status&) {
    AnnotatedMutexLock lock(&mu);
    refused = true;
  };
  options.on_registration_change = [&](bool registered) {
    AnnotatedMutexLock lock(&mu);
    if (registered) registered_again = true;
  };
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  {
    // One or the other ends the registration again, from the heartbeat thread.
    AnnotatedMutexLock lock(&mu);
    ASSERT_TRUE(
        mu.AwaitWithTimeout([&] { return refused || registered_again; }, absl::Seconds(30)));
    EXPECT_FALSE(refused);
    EXPECT_TRUE(registered_again);
  }
  EXPECT_TRUE(agent.AwaitRegistrationBackoffForTesting(absl::Seconds(30)));
  const std::vector<v1::RegisterWorkerRequest> registrations = coordinator.registrations();
  ASSERT_EQ(registrations.size(), 3u);
  // The same registration, retried.
  EXPECT_EQ(registrations[2].registration_id(), registrations[1].registration_id());
  agent.Stop();
  rig->Shutdown();
}

// Answers the first registration with a session token gRPC cannot send as
// metadata (it ends in a line end), every later one as RegisteredAsW1;
// records the registrations and the first heartbeat's authorization.
class BadSessionTokenCoordinator final : public NoAssignmentsCoordinator {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    AnnotatedMutexLock lock(&mu_);
    registrations_.push_back(*request);
    const grpc::Status answered = RegisteredAsW1(response);
    if (registrations_.size() == 1) response->set_session_token("w-1.1.\n");
    return answered;
  }
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    const auto bearer = context->client_metadata().find("authorization");
    AnnotatedMutexLock lock(&mu_);
    if (!authorization_.has_value()) {
      authorization_ = bearer == context->client_metadata().end()
                           ? ""
                           : std::string(bearer->second.data(), bearer->second.size());
    }
    return grpc::Status::OK;
  }
  // The first heartbeat's authorization; nullopt when none came in 30 s.
  std::optional<std::string> AwaitHeartbeatAuthorization() {
    AnnotatedMutexLock lock(&mu_);
    mu_.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return authorization_.has_value(); },
        absl::Seconds(30));
    return authorization_;
  }
  std::vector<v1::RegisterWorkerRequest> registrations() {
    AnnotatedMutexLock lock(&mu_);
    return registrations_;
  }

 private:
  AnnotatedMutex mu_;
  std::vector<v1::RegisterWorkerRequest> registrations_ ABSL_GUARDED_BY(mu_);
  std::optional<std::string> authorization_ ABSL_GUARDED_BY(mu_);
};

// A registration answered with a session token that is not one word of
// printable ASCII is a failed attempt: backed off and retried under a new
// registration id (with the same id the coordinator answers the same
// incarnation and token again, renewing an incarnation nobody holds), and
// the next answer's token is the one the worker sends. Before, the token
// went into the heartbeat's metadata as it was, and gRPC aborted the
// process.
TEST(WorkerAgentTest, Start_SessionTokenNotPrintable_RetriedNotSent) {
  BadSessionTokenCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.backoff.initial = absl::Milliseconds(1);
  options.backoff.max = absl::Milliseconds(1);
  options.backoff.jitter = 0;
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  const absl::Status started = agent.Start();
  ASSERT_TRUE(started.ok()) << started;
  const std::vector<v1::RegisterWorkerRequest> registrations = coordinator.registrations();
  ASSERT_EQ(registrations.size(), 2u);
  EXPECT_NE(registrations[1].registration_id(), registrations[0].registration_id());
  EXPECT_TRUE(agent.AwaitRegistrationBackoffForTesting(absl::Seconds(30)));
  EXPECT_EQ(coordinator.AwaitHeartbeatAuthorization(), "Bearer w-1.1.secret");
  agent.Stop();
  rig->Shutdown();
}

// Registers the worker; its first heartbeat's answer says it is drained,
// the second is refused as by a restarted coordinator (register again);
// records each registration.
class DrainingCoordinator final : public NoAssignmentsCoordinator {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    AnnotatedMutexLock lock(&mu_);
    registrations_.push_back(*request);
    response->set_worker_id("w-1");
    response->set_incarnation(static_cast<int64_t>(registrations_.size()));
    response->set_session_token("w-1.secret");
    response->set_heartbeat_interval_seconds(0.05);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse* response) override {
    const int n = heartbeats_.fetch_add(1);
    if (n == 1) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no worker w-1: restarted");
    response->set_drained(n == 0);
    return grpc::Status::OK;
  }
  // Waits (bounded) for `n` registrations; returns those there are.
  std::vector<v1::RegisterWorkerRequest> AwaitRegistrations(size_t n) {
    AnnotatedMutexLock lock(&mu_);
    mu_.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return registrations_.size() >= n; },
        absl::Seconds(30));
    return registrations_;
  }

 private:
  std::atomic<int> heartbeats_{0};
  AnnotatedMutex mu_;
  std::vector<v1::RegisterWorkerRequest> registrations_ ABSL_GUARDED_BY(mu_);
};

// A drain outlives a coordinator restart: told it is drained, the process
// says so when it registers again.
TEST(WorkerAgentTest, DrainedThenDropped_RegistersAgainAsDrained) {
  DrainingCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  // The readiness hook hears the drop and the new registration, in order.
  AnnotatedMutex mu;
  std::vector<bool> changes;
  WorkerAgentOptions options = rig->options;
  options.on_registration_change = [&](bool registered) {
    AnnotatedMutexLock lock(&mu);
    changes.push_back(registered);
  };
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  const std::vector<v1::RegisterWorkerRequest> registrations = coordinator.AwaitRegistrations(2);
  {
    AnnotatedMutexLock lock(&mu);
    EXPECT_TRUE(mu.AwaitWithTimeout([&] { return changes.size() >= 2; }, absl::Seconds(30)));
    EXPECT_EQ(changes, (std::vector<bool>{false, true}));
  }
  agent.Stop();
  rig->Shutdown();
  ASSERT_GE(registrations.size(), 2u);
  EXPECT_FALSE(registrations[0].drained());  // a new process
  // Every registration names this process's build (what --version prints).
  for (const v1::RegisterWorkerRequest& r : registrations) {
    EXPECT_EQ(r.build().version(), GetBuildInfo().version);
    EXPECT_EQ(r.build().commit(), GetBuildInfo().commit);
  }
  EXPECT_EQ(registrations[0].previous_incarnation(), 0);
  EXPECT_TRUE(registrations[1].drained());
  // The incarnation it held: the coordinator's store may know it drained.
  EXPECT_EQ(registrations[1].previous_incarnation(), 1);
}

// A coordinator that registers the worker and then, asked to drain or
// deregister it, answers as a follower after a failover: UNAVAILABLE naming
// the leader. `leader` records what reaches it.
class DeposedCoordinator final : public NoAssignmentsCoordinator {
 public:
  explicit DeposedCoordinator(std::string leader) : leader_(std::move(leader)) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    return RegisteredAsW1(response, 1, 60);
  }
  grpc::Status DrainWorker(grpc::ServerContext* context, const v1::DrainWorkerRequest*,
                           v1::Worker*) override {
    context->AddTrailingMetadata(kLeaderMetadataKey, leader_);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "this coordinator follows");
  }
  grpc::Status DeregisterWorker(grpc::ServerContext* context, const v1::DeregisterWorkerRequest*,
                                v1::DeregisterWorkerResponse*) override {
    context->AddTrailingMetadata(kLeaderMetadataKey, leader_);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "this coordinator follows");
  }

 private:
  const std::string leader_;
};

class NewLeader final : public NoAssignmentsCoordinator {
 public:
  grpc::Status DrainWorker(grpc::ServerContext*, const v1::DrainWorkerRequest* request,
                           v1::Worker* response) override {
    drains.fetch_add(1);
    response->set_id(request->worker_id());
    response->set_drained(true);
    return grpc::Status::OK;
  }
  grpc::Status DeregisterWorker(grpc::ServerContext*, const v1::DeregisterWorkerRequest*,
                                v1::DeregisterWorkerResponse*) override {
    deregistrations.fetch_add(1);
    return grpc::Status::OK;
  }
  std::atomic<int> drains{0}, deregistrations{0};
};

// Right after a failover a worker's drain (SIGTERM) and goodbye may reach
// the old leader, now a follower: they follow the leader it names, as every
// other call does, instead of leaving without a drain.
TEST(WorkerAgentTest, DrainAndDeregisterAfterAFailover_FollowTheNamedLeader) {
  NewLeader leader;
  std::string leader_address;
  std::unique_ptr<grpc::Server> leader_server = ServeOnLoopback(&leader, &leader_address);
  ASSERT_NE(leader_server, nullptr);
  DeposedCoordinator deposed(leader_address);
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&deposed, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.coordinator_address = absl::StrCat(options.coordinator_address, ",", leader_address);
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  const absl::Status drained = agent.RequestDrain();
  EXPECT_TRUE(drained.ok()) << drained;
  EXPECT_EQ(leader.drains.load(), 1);
  agent.Stop();  // deregisters
  EXPECT_EQ(leader.deregistrations.load(), 1);
  rig->Shutdown();
  leader_server->Shutdown();
}

// A leader that registers the worker (heartbeats every 60 s) and then, at
// its first heartbeat, answers as a follower after a failover: UNAVAILABLE
// naming `leader`.
class FailedOverCoordinator final : public NoAssignmentsCoordinator {
 public:
  explicit FailedOverCoordinator(std::string leader) : leader_(std::move(leader)) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    return RegisteredAsW1(response, 1, /*interval_seconds=*/60);
  }
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    context->AddTrailingMetadata(kLeaderMetadataKey, leader_);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "this coordinator follows");
  }
  // Open until the agent ends it: a stream that failed would move the
  // agent on to the leader before its heartbeat was refused.
  grpc::Status WatchAssignments(grpc::ServerContext* context, const v1::WatchAssignmentsRequest*,
                                grpc::ServerWriter<v1::Assignment>*) override {
    while (!context->IsCancelled()) {
      AnnotatedMutexLock lock(&mu_);
      mu_.AwaitWithTimeout([] { return false; }, absl::Milliseconds(20));
    }
    return grpc::Status::OK;
  }

 private:
  const std::string leader_;
  AnnotatedMutex mu_;
};

// Counts the heartbeats it answers.
class HeartbeatCountingLeader final : public NoAssignmentsCoordinator {
 public:
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    AnnotatedMutexLock lock(&mu);
    ++beats;
    return grpc::Status::OK;
  }
  grpc::Status DeregisterWorker(grpc::ServerContext*, const v1::DeregisterWorkerRequest*,
                                v1::DeregisterWorkerResponse*) override {
    return grpc::Status::OK;
  }
  AnnotatedMutex mu;  // a hand-off TSan sees
  int beats ABSL_GUARDED_BY(mu) = 0;
};

// A heartbeat a follower refused naming the leader is sent again to it at
// once, not an interval (60 s here) later: after a failover, or after a
// beat that timed out at the leader moved to the next address, the leader
// went unheard for two or three intervals of its lease.
TEST(WorkerAgentTest, HeartbeatRefusedNamingTheLeader_SentToItAtOnce) {
  HeartbeatCountingLeader leader;
  std::string leader_address;
  std::unique_ptr<grpc::Server> leader_server = ServeOnLoopback(&leader, &leader_address);
  ASSERT_NE(leader_server, nullptr);
  FailedOverCoordinator old_leader(leader_address);
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&old_leader, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  options.coordinator_address = absl::StrCat(options.coordinator_address, ",", leader_address);
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  {
    AnnotatedMutexLock lock(&leader.mu);
    EXPECT_TRUE(leader.mu.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(leader.mu) { return leader.beats > 0; },
        absl::Seconds(30)));
  }
  agent.Stop();
  rig->Shutdown();
  leader_server->Shutdown();
}

// Registers the worker, accepts its heartbeats, sends `assignment` on the
// first assignment stream (later ones end at once) and records the
// progress reports, answering the start barrier's at once.
class ScriptedCoordinator final : public v1::CoordinatorService::Service {
 public:
  explicit ScriptedCoordinator(v1::Assignment assignment, double heartbeat_interval_seconds = 1)
      : assignment_(std::move(assignment)),
        heartbeat_interval_seconds_(heartbeat_interval_seconds) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    return RegisteredAsW1(response, 1, heartbeat_interval_seconds_);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    return grpc::Status::OK;
  }
  // The first stream stays open until Close or the agent cancels it, as a
  // coordinator's does (an ended stream makes the agent reconnect, and
  // every reconnect passes through its lock).
  grpc::Status WatchAssignments(grpc::ServerContext* context, const v1::WatchAssignmentsRequest*,
                                grpc::ServerWriter<v1::Assignment>* writer) override {
    if (watches_.fetch_add(1) != 0) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no more assignments");
    }
    writer->Write(assignment_);
    AnnotatedMutexLock lock(&mu_);
    // Cancellation is not a mutex condition: checked every 20 ms.
    while (!closing_ && !context->IsCancelled()) {
      mu_.AwaitWithTimeout(
          [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closing_ || !pushed_.empty(); },
          absl::Milliseconds(20));
      for (const v1::Assignment& next : pushed_) writer->Write(next);
      pushed_.clear();
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no more assignments");
  }
  grpc::Status DeregisterWorker(grpc::ServerContext*, const v1::DeregisterWorkerRequest*,
                                v1::DeregisterWorkerResponse*) override {
    AnnotatedMutexLock lock(&mu_);
    deregistered_ = true;
    return grpc::Status::OK;
  }
  // Waits (bounded) for the agent's DeregisterWorker.
  bool AwaitDeregistered() {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return deregistered_; }, absl::Seconds(30));
  }
  grpc::Status ReportProgress(grpc::ServerContext*, const v1::ReportProgressRequest* request,
                              v1::ReportProgressResponse* response) override {
    AnnotatedMutexLock lock(&mu_);
    reports_.push_back(*request);
    response->set_all_ready(request->ready());  // a one-stage job's barrier
    if (request->finished() && hold_finished_) {
      finished_arrived_ = true;
      // Bounded: Close releases it before the server shuts down.
      mu_.AwaitWithTimeout([this]()
                               ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return release_finished_; },
                           absl::Seconds(60));
    }
    return grpc::Status::OK;
  }
  // Waits (bounded) for the first report.
  std::optional<v1::ReportProgressRequest> AwaitFirstReport() {
    AnnotatedMutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout([this]()
                                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !reports_.empty(); },
                              absl::Seconds(30))) {
      return std::nullopt;
    }
    return reports_.front();
  }
  // The job's last report (finished) is answered only after
  // ReleaseFinishedReport; AwaitFinishedReport waits (bounded) for it.
  void HoldFinishedReport() {
    AnnotatedMutexLock lock(&mu_);
    hold_finished_ = true;
  }
  bool AwaitFinishedReport() {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_arrived_; },
        absl::Seconds(30));
  }
  void ReleaseFinishedReport() {
    AnnotatedMutexLock lock(&mu_);
    release_finished_ = true;
  }
  // Sends `next` on the open assignment stream (after the first).
  void Push(v1::Assignment next) {
    AnnotatedMutexLock lock(&mu_);
    pushed_.push_back(std::move(next));
  }
  // What DrainWorker answers from now on (it accepts every drain).
  void SetDrainAnswer(v1::Worker answer) {
    AnnotatedMutexLock lock(&mu_);
    drain_answer_ = std::move(answer);
  }
  grpc::Status DrainWorker(grpc::ServerContext*, const v1::DrainWorkerRequest* request,
                           v1::Worker* response) override {
    AnnotatedMutexLock lock(&mu_);
    *response = drain_answer_;
    response->set_id(request->worker_id());
    response->set_drained(true);
    return grpc::Status::OK;
  }
  // Ends the open assignment stream and any held report (before the
  // server shuts down).
  void Close() {
    AnnotatedMutexLock lock(&mu_);
    closing_ = true;
    release_finished_ = true;
  }

 private:
  const v1::Assignment assignment_;
  const double heartbeat_interval_seconds_;
  std::atomic<int> watches_{0};
  AnnotatedMutex mu_;
  std::vector<v1::ReportProgressRequest> reports_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::Assignment> pushed_ ABSL_GUARDED_BY(mu_);
  v1::Worker drain_answer_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool deregistered_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_finished_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_arrived_ ABSL_GUARDED_BY(mu_) = false;
  bool release_finished_ ABSL_GUARDED_BY(mu_) = false;
};

// Gives `a` data-plane keys for its layout (one CheckAssignmentLayout
// accepts), as a coordinator does.
void SetKeys(v1::Assignment& a) {
  a.clear_data_plane_send_keys();
  const DataPlaneKeys keys = DeriveWorkerDataPlaneKeys(
      "secret", DataPlaneJobId(a), GlobalWorkerIndex(a), AssignmentWorkerCount(a));
  a.set_data_plane_receive_key(keys.receive_key);
  for (const std::string& key : keys.send_keys) a.add_data_plane_send_keys(key);
}

// A RUN of a one-layer job "job-1" plan 1 (stage 0 of 2, no peers listed,
// so no keys either: tests that run it list them with SetKeys).
v1::Assignment RunAssignment() {
  v1::Assignment a;
  a.set_action(v1::Assignment::ACTION_RUN);
  a.set_job_id("job-1");
  a.set_plan_version(1);
  v1::JobSpec* spec = a.mutable_spec();
  spec->mutable_model()->set_n_layer(1);
  spec->mutable_model()->set_n_head(2);
  spec->mutable_model()->set_d_model(16);
  spec->mutable_training()->set_seq_len(8);
  spec->mutable_training()->set_batch_size(4);
  spec->mutable_training()->set_micro_batches(2);
  spec->mutable_training()->set_steps(2);
  spec->mutable_data()->set_synthetic_bytes(5000);
  spec->mutable_parallelism()->set_stages(2);
  a.set_num_stages(2);
  return a;
}

// RunAssignment as a one-stage job that runs to its end (its program, its
// keys; a one-stage job sends nothing, so its peer address is never used).
v1::Assignment OneStageRunAssignment() {
  v1::Assignment a = RunAssignment();
  a.mutable_spec()->mutable_parallelism()->set_stages(1);
  a.set_num_stages(1);
  a.add_peer_addresses("127.0.0.1:1");
  SetKeys(a);
  a.mutable_backward_units()->set_begin(0);
  a.mutable_backward_units()->set_end(4);
  *a.mutable_forward_units() = a.backward_units();
  *a.mutable_program() = CompilePrograms({{0, 4}}, 4, 2, Schedule::kGPipe).value()[0];
  return a;
}

// Runs an agent against a ScriptedCoordinator that assigns `a`, with
// `mailbox`, until the first progress report (nullopt: none within 30 s),
// then stops it.
std::optional<v1::ReportProgressRequest> FirstReportFromAgent(const v1::Assignment& a,
                                                              Mailbox& mailbox) {
  ScriptedCoordinator coordinator(a);
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  EXPECT_TRUE(rig.ok()) << rig.status();
  if (!rig.ok()) return std::nullopt;
  WorkerAgent agent(rig->options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  EXPECT_TRUE(agent.Start().ok());
  std::optional<v1::ReportProgressRequest> report = coordinator.AwaitFirstReport();
  coordinator.Close();
  agent.Stop();
  rig->Shutdown();
  return report;
}

// A drain (SIGTERM) waiting while the job's last step is reported: the
// wait ends as the job completes. Before, the runner's completion released
// nothing the wait was on, so it slept until the next heartbeat (up to 60 s
// here; with a coordinator unreachable, the RPC timeout) and, past its
// timeout, said the job had not let the worker go though it had ended.
TEST(WorkerAgentTest, AwaitDrained_JobCompletesWhileWaiting_EndsWithoutAHeartbeat) {
  const v1::Assignment a = OneStageRunAssignment();
  ScriptedCoordinator coordinator(a, /*heartbeat_interval_seconds=*/60);
  coordinator.HoldFinishedReport();
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgent agent(rig->options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(coordinator.AwaitFinishedReport());
  // The runner is in its last report: not completed, so the drain waits.
  // Released only once the drain waits: released before it has looked, it
  // would find the job completed and the test would show nothing.
  absl::Status drained = absl::UnknownError("not returned");
  absl::Duration waited;
  std::thread draining([&] {
    const absl::Time start = absl::Now();
    drained = agent.AwaitDrained(absl::Seconds(30));
    waited = absl::Now() - start;
  });
  EXPECT_TRUE(agent.AwaitDrainWaitingForTesting(absl::Seconds(30)));
  coordinator.ReleaseFinishedReport();
  draining.join();
  EXPECT_TRUE(drained.ok()) << drained;
  // Not a speed bound: unwoken, the wait lasts its whole 30 s (the next
  // heartbeat is 60 s away) and only then finds the job completed.
  EXPECT_LT(waited, absl::Seconds(15)) << "the job's completion did not end the wait";
  coordinator.Close();
  agent.Stop();
  rig->Shutdown();
}

// A drain waiting while the job hands this worker its next plan (the
// coordinator commits a re-plan that keeps a drained worker, then lets it
// go at the next boundary). Replacing the runner left runner_ empty while
// the old one stopped, and the wait took that for "the job let this worker
// go": the worker deregistered, and the job went through a worker-lost
// recovery instead of the drain's re-plan.
TEST(WorkerAgentTest, AwaitDrained_NextPlanReplacesTheRunner_WaitsOnUntilStopped) {
  const v1::Assignment a = OneStageRunAssignment();
  ScriptedCoordinator coordinator(a, /*heartbeat_interval_seconds=*/60);
  coordinator.HoldFinishedReport();
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgent agent(rig->options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  // Plan 1's runner is in its last report, held: its Stop (for plan 2)
  // waits on it, so the replacement lasts as long as this test holds it.
  ASSERT_TRUE(coordinator.AwaitFinishedReport());
  absl::Status drained = absl::UnknownError("not returned");
  std::thread draining([&] { drained = agent.AwaitDrained(absl::Seconds(3)); });
  v1::Assignment next = a;
  next.set_plan_version(2);
  SetKeys(next);
  coordinator.Push(next);
  // The watch thread has taken plan 2 and is stopping plan 1's runner
  // (bounded poll): without this, a plan never handled within the drain's
  // 3 s would pass as well.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (agent.InstructionAndLastJob().first != "stopping job job-1" && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  // EXPECT: the draining thread is joined before anything returns.
  EXPECT_EQ(agent.InstructionAndLastJob().first, "stopping job job-1");
  draining.join();
  EXPECT_EQ(drained.code(), absl::StatusCode::kDeadlineExceeded)
      << "the replacement of the runner ended the drain: " << drained;
  coordinator.ReleaseFinishedReport();
  // The job's STOP lets the worker go.
  std::thread draining_again([&] { drained = agent.AwaitDrained(absl::Seconds(30)); });
  v1::Assignment stop;
  stop.set_action(v1::Assignment::ACTION_STOP);
  stop.set_job_id(a.job_id());
  coordinator.Push(stop);
  draining_again.join();
  EXPECT_TRUE(drained.ok()) << drained;
  coordinator.Close();
  agent.Stop();
  rig->Shutdown();
}

// A STOP of another job: an assignment stream's first that runs nothing.
v1::Assignment StopOfAnotherJob() {
  v1::Assignment stop;
  stop.set_action(v1::Assignment::ACTION_STOP);
  stop.set_job_id("job-0");
  return stop;
}

// The coordinator's answer to DrainWorker for a worker assigned to `job`.
v1::Worker AssignedTo(const std::string& job) {
  v1::Worker worker;
  worker.set_state(v1::WORKER_STATE_ASSIGNED);
  worker.set_job_id(job);
  return worker;
}

// A drain of a worker that a job's plan (being made, or its RUN on the way)
// has taken: the coordinator answers ASSIGNED to that job, and the drain
// waits for the job's word (here its STOP) instead of leaving at once,
// which the job took for a lost worker (a recovery, counted) rather than a
// drain (a re-plan at its next boundary).
TEST(WorkerAgentTest, AwaitDrained_AssignedToAJobNotYetRun_WaitsForItsWordOrARecheck) {
  ScriptedCoordinator coordinator(StopOfAnotherJob(), /*heartbeat_interval_seconds=*/60);
  coordinator.SetDrainAnswer(AssignedTo("job-1"));
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgent agent(rig->options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(agent.RequestDrain().ok());
  absl::Status drained = agent.AwaitDrained(absl::Milliseconds(300));
  EXPECT_EQ(drained.code(), absl::StatusCode::kDeadlineExceeded)
      << "left while assigned to a job that had not run: " << drained;
  std::thread draining([&] { drained = agent.AwaitDrained(absl::Seconds(30)); });
  v1::Assignment stop;
  stop.set_action(v1::Assignment::ACTION_STOP);
  stop.set_job_id("job-1");
  coordinator.Push(stop);
  draining.join();
  EXPECT_TRUE(drained.ok()) << drained;

  // Another placement takes it, then is abandoned (a cancel while planning,
  // a plan refused for memory): the coordinator sends it no word, and asked
  // again it no longer says ASSIGNED. RecheckDrain ends the wait, which
  // otherwise lasted the whole drain timeout.
  coordinator.SetDrainAnswer(AssignedTo("job-2"));
  ASSERT_TRUE(agent.RequestDrain().ok());
  ASSERT_TRUE(agent.RecheckDrain().ok());  // still ASSIGNED: still waits
  EXPECT_EQ(agent.AwaitDrained(absl::Milliseconds(100)).code(),
            absl::StatusCode::kDeadlineExceeded);
  v1::Worker ready;
  ready.set_state(v1::WORKER_STATE_READY);
  coordinator.SetDrainAnswer(ready);
  ASSERT_TRUE(agent.RecheckDrain().ok());
  EXPECT_TRUE(agent.AwaitDrained(absl::ZeroDuration()).ok());
  coordinator.Close();
  agent.Stop();
  rig->Shutdown();
}

// A RUN of the next job taken while the old runner stops, and Leave (a
// shutdown) begins meanwhile: the worker has deregistered, so nothing of
// the new job may start (before, it opened the data plane and ran the job
// for a registration that was gone, inside Stop()'s watchdog).
TEST(WorkerAgentTest, LeaveWhileTheOldRunnerStops_TheNextJobNeverStarts) {
  const v1::Assignment a = OneStageRunAssignment();
  ScriptedCoordinator coordinator(a, /*heartbeat_interval_seconds=*/60);
  coordinator.HoldFinishedReport();
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgent agent(rig->options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  // job-1's runner is in its last report, held: its Stop waits on it.
  ASSERT_TRUE(coordinator.AwaitFinishedReport());
  v1::Assignment next = a;
  next.set_job_id("job-2");
  SetKeys(next);
  coordinator.Push(next);
  // The watch thread has taken job-2's RUN once it stops job-1 (bounded poll).
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (agent.InstructionAndLastJob().first != "stopping job job-1" && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_EQ(agent.InstructionAndLastJob().first, "stopping job job-1");
  std::thread leaving([&] { agent.Leave(); });
  ASSERT_TRUE(coordinator.AwaitDeregistered());
  coordinator.ReleaseFinishedReport();
  leaving.join();  // Leave joins the watch thread: Handle is done
  EXPECT_EQ(agent.InstructionAndLastJob(), (std::pair<std::string, std::string>{"idle", "job-1"}))
      << "job-2 started after the worker left";
  coordinator.Close();
  agent.Stop();
  rig->Shutdown();
}

// An assignment whose layout factors multiply to 2^64, which wraps to 0
// and "matched" its empty peer list: the agent computed the data plane's
// size from them in int (overflow), and the runner went on to the
// transport's CHECK (the worker died). Now the agent opens nothing for it
// and the runner reports INVALID_ARGUMENT as the job's error.
TEST(WorkerAgentTest, Handle_LayoutFactorsWrappingToZero_ReportedWithoutOpeningTheJob) {
  v1::Assignment a = RunAssignment();
  a.set_replicas(1 << 21);
  a.set_num_stages(1 << 21);
  a.set_tensor_parallel(1 << 22);
  Mailbox mailbox;
  const std::optional<v1::ReportProgressRequest> report = FirstReportFromAgent(a, mailbox);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->job_id(), "job-1");
  EXPECT_EQ(report->error(),
            "INVALID_ARGUMENT: assignment: num_stages 2097152 is out of range [1, 1024]");
}

// An assignment without data-plane keys (an older coordinator): the agent
// opens no data plane for it, and the job learns why from the runner's
// report. Before, the agent stopped its runner and reported nothing: the
// other stages blamed this one's start barrier, a one-stage job waited
// forever.
TEST(WorkerAgentTest, Handle_NoDataPlaneKeys_ReportedAsTheJobsError) {
  v1::Assignment a = RunAssignment();
  a.add_peer_addresses("127.0.0.1:1");
  a.add_peer_addresses("127.0.0.1:2");
  Mailbox mailbox;
  const std::optional<v1::ReportProgressRequest> report = FirstReportFromAgent(a, mailbox);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->job_id(), "job-1");
  EXPECT_TRUE(absl::StrContains(report->error(), "no data-plane keys")) << report->error();
}

// Keys of the wrong count or size (a peer list the keys do not cover would
// send unproven streams; a short key is no key): refused the same way.
TEST(WorkerAgentTest, Handle_MalformedDataPlaneKeys_ReportedAsTheJobsError) {
  v1::Assignment base = RunAssignment();
  base.add_peer_addresses("127.0.0.1:1");
  base.add_peer_addresses("127.0.0.1:2");
  SetKeys(base);
  ASSERT_TRUE(CheckDataPlaneKeys(base).ok());
  v1::Assignment one_short = base;
  one_short.mutable_data_plane_send_keys()->RemoveLast();
  v1::Assignment short_key = base;
  short_key.set_data_plane_send_keys(1, "abc");
  v1::Assignment no_receive_key = base;
  no_receive_key.clear_data_plane_receive_key();
  for (const v1::Assignment& a : {one_short, short_key, no_receive_key}) {
    EXPECT_EQ(CheckDataPlaneKeys(a).code(), absl::StatusCode::kFailedPrecondition);
  }
  Mailbox mailbox;
  const std::optional<v1::ReportProgressRequest> report = FirstReportFromAgent(one_short, mailbox);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->error(),
            "FAILED_PRECONDITION: the assignment's data-plane keys are malformed (want a 64-byte "
            "receive key and one send key of that size per worker, 2; got a receive key of 64 "
            "bytes and 1 send keys); not running it");
}

// Heartbeats name the job of the last assignment taken, read with the
// instruction (HeartbeatRequest.last_job_id): "" before any, then the
// job's, so that the coordinator tells "idle after job-1" from an idle
// heartbeat sent before this worker took job-1's assignment.
TEST(WorkerAgentTest, InstructionAndLastJob_NamesTheJobOfTheLastAssignmentTaken) {
  v1::Assignment a = RunAssignment();
  a.set_replicas(1 << 21);  // fails at once (as above), so the runner ends
  a.set_num_stages(1 << 21);
  a.set_tensor_parallel(1 << 22);
  ScriptedCoordinator coordinator(a);
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgent agent(rig->options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  EXPECT_EQ(agent.InstructionAndLastJob(), (std::pair<std::string, std::string>{"idle", ""}));
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(coordinator.AwaitFirstReport().has_value());
  // The runner reports before Handle, which started it, records it: poll
  // (bounded) for what a heartbeat would send.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (agent.InstructionAndLastJob().second.empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(agent.InstructionAndLastJob().second, "job-1");
  coordinator.Close();
  agent.Stop();
  rig->Shutdown();
}

// start_iteration INT64_MAX: the mailbox was opened there (its run-ahead
// window then overflows on the first tensor), and the runner ran no step
// and reported nothing, so the job hung. Now the mailbox stays closed to
// it and the job fails naming the field.
TEST(WorkerAgentTest, Handle_StartIterationPastTheSteps_ReportedWithoutOpeningTheMailbox) {
  v1::Assignment a = RunAssignment();
  a.add_peer_addresses("127.0.0.1:1");
  a.add_peer_addresses("127.0.0.1:2");
  SetKeys(a);
  a.set_start_iteration(std::numeric_limits<int64_t>::max());
  Mailbox mailbox;
  const std::optional<v1::ReportProgressRequest> report = FirstReportFromAgent(a, mailbox);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->error(),
            "INVALID_ARGUMENT: assignment: start_iteration 9223372036854775807 is out of range "
            "[0, 2) (spec.training.steps 2)");
  // Not opened: a tensor of the job is not measured against a window at
  // INT64_MAX (it is refused only because the stopped runner aborted it).
  TensorAddress address;
  address.job_id = "job-1/1";
  address.iteration = 1;
  EXPECT_EQ(mailbox.Admit(address, 16).code(), absl::StatusCode::kAborted);
}

// The start was checked against the spec's steps before they were bounded:
// steps INT64_MAX let a start of INT64_MAX - 1 open the mailbox there. The
// steps are held to [1, kMaxSteps] first, as ResolveJobSpec holds them.
TEST(WorkerAgentTest, Handle_UnboundedSteps_ReportedWithoutOpeningTheMailbox) {
  v1::Assignment a = RunAssignment();
  a.add_peer_addresses("127.0.0.1:1");
  a.add_peer_addresses("127.0.0.1:2");
  SetKeys(a);
  a.mutable_spec()->mutable_training()->set_steps(std::numeric_limits<int64_t>::max());
  a.set_start_iteration(std::numeric_limits<int64_t>::max() - 1);
  Mailbox mailbox;
  const std::optional<v1::ReportProgressRequest> report = FirstReportFromAgent(a, mailbox);
  ASSERT_TRUE(report.has_value());
  // The runner resolves the spec and reports that; the agent's own check
  // kept the mailbox closed (the window was not opened at INT64_MAX - 1).
  EXPECT_EQ(report->error(),
            "INVALID_ARGUMENT: spec.training.steps: 9223372036854775807 exceeds the limit of "
            "100000000");
  TensorAddress address;
  address.job_id = "job-1/1";
  address.iteration = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(mailbox.Admit(address, 16).code(), absl::StatusCode::kAborted);
}

// Registers incarnation n at the n-th registration and forgets incarnation
// 1 at its first heartbeat once incarnation 1's assignment stream is open.
// That stream sends `assignment` only after AgentRegisteredAgain (the
// agent has recorded incarnation 2) and then ends; a stream of incarnation
// 2 stays open until the agent cancels it.
class StaleStreamCoordinator final : public v1::CoordinatorService::Service {
 public:
  explicit StaleStreamCoordinator(v1::Assignment assignment) : assignment_(std::move(assignment)) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    AnnotatedMutexLock lock(&mu_);
    return RegisteredAsW1(response, ++registrations_);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse*) override {
    if (request->incarnation() != 1) return grpc::Status::OK;
    AnnotatedMutexLock lock(&mu_);
    mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return streams_of_1_ >= 1; },
                         absl::Seconds(30));
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "incarnation not current");
  }
  grpc::Status WatchAssignments(grpc::ServerContext* context,
                                const v1::WatchAssignmentsRequest* request,
                                grpc::ServerWriter<v1::Assignment>* writer) override {
    if (request->incarnation() == 1) {
      {
        AnnotatedMutexLock lock(&mu_);
        if (++streams_of_1_ > 1) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "again");
        mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return registered_again_; },
                             absl::Seconds(30));
      }
      writer->Write(assignment_);
      return grpc::Status::OK;
    }
    {
      AnnotatedMutexLock lock(&mu_);
      ++streams_of_2_;
    }
    while (!context->IsCancelled()) {  // open until the agent or the server ends it
      AnnotatedMutexLock lock(&mu_);
      mu_.AwaitWithTimeout([] { return false; }, absl::Milliseconds(20));
    }
    return grpc::Status::OK;
  }
  void AgentRegisteredAgain() {
    AnnotatedMutexLock lock(&mu_);
    registered_again_ = true;
  }
  bool AwaitStreamOfIncarnation2() {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return streams_of_2_ >= 1; }, absl::Seconds(30));
  }

 private:
  const v1::Assignment assignment_;
  AnnotatedMutex mu_;
  int64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
  int streams_of_1_ ABSL_GUARDED_BY(mu_) = 0;
  int streams_of_2_ ABSL_GUARDED_BY(mu_) = 0;
  bool registered_again_ ABSL_GUARDED_BY(mu_) = false;
};

// A RUN read from incarnation 1's stream after the heartbeat thread
// registered again as incarnation 2 belongs to a session that is over: it
// is not run. Before, its runner took the agent's current incarnation, 2,
// and the coordinator took its reports as the new incarnation's. The
// registration's callback (before the heartbeat thread looks at the
// stream) holds until the watch thread, done with incarnation 1's stream,
// opens incarnation 2's.
TEST(WorkerAgentTest, Handle_RunFromTheStreamOfAnEarlierIncarnation_NotRun) {
  StaleStreamCoordinator coordinator(RunAssignment());
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerAgentOptions options = rig->options;
  std::atomic<bool> reopened{false};
  options.on_registration_change = [&](bool registered) {
    if (!registered) return;
    coordinator.AgentRegisteredAgain();
    reopened.store(coordinator.AwaitStreamOfIncarnation2());
  };
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(coordinator.AwaitStreamOfIncarnation2());
  EXPECT_EQ(agent.InstructionAndLastJob(), (std::pair<std::string, std::string>{"idle", ""}));
  agent.Stop();
  EXPECT_TRUE(reopened.load());
  rig->Shutdown();
}

// Refuses the first `registrations` registrations and then the first
// `heartbeats` heartbeats UNAVAILABLE (a coordinator shedding load), then
// answers both. Its `step_at`-th heartbeat refusal (0: none) moves `clock`
// on a minute and a second.
class OutageCoordinator final : public NoAssignmentsCoordinator {
 public:
  OutageCoordinator(int registrations, int heartbeats, FakeClock* clock, int step_at = 0)
      : registrations_(registrations), heartbeats_(heartbeats), clock_(clock), step_at_(step_at) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    AnnotatedMutexLock lock(&mu_);
    if (refused_registrations_ < registrations_) {
      ++refused_registrations_;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "shedding load");
    }
    return RegisteredAsW1(response);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    AnnotatedMutexLock lock(&mu_);
    if (refused_heartbeats_ < heartbeats_) {
      if (++refused_heartbeats_ == step_at_) clock_->Advance(absl::Seconds(61));
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "shedding load");
    }
    ++answered_;
    return grpc::Status::OK;
  }
  // Whether `n` heartbeats were answered within 30 s.
  bool AwaitAnswered(int n) {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return answered_ >= n; },
                                absl::Seconds(30));
  }

 private:
  const int registrations_;
  const int heartbeats_;
  FakeClock* const clock_;
  const int step_at_;
  AnnotatedMutex mu_;
  int refused_registrations_ ABSL_GUARDED_BY(mu_) = 0;
  int refused_heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int answered_ ABSL_GUARDED_BY(mu_) = 0;
};

int Occurrences(absl::string_view log, absl::string_view line) {
  int n = 0;
  for (size_t at = log.find(line); at != absl::string_view::npos; at = log.find(line, at + 1)) {
    ++n;
  }
  return n;
}

std::optional<double> CoordinatorCallFailures(const WorkerMetrics& metrics, const std::string& call,
                                              const std::string& code = "UNAVAILABLE") {
  return testing::SeriesValue(*metrics.registry(),
                              "pipetrain_worker_coordinator_call_failures_total",
                              {{"call", call}, {"code", code}});
}

// 20 heartbeats refused over a minute and a second of the agent's clock:
// each is counted by its code, but logged only at the first and a minute
// later, saying how many were not (a line a beat made a 10-minute outage
// of 4096 workers 2.5 M lines); the beat answered after them says how
// long it lasted. The assignment stream, ended at once again and again
// by this coordinator, is logged at most once a minute too.
TEST(WorkerAgentTest, HeartbeatsRefused_EachCountedLoggedOnceAMinute) {
  FakeClock clock;
  OutageCoordinator coordinator(/*registrations=*/0, /*heartbeats=*/20, &clock, /*step_at=*/10);
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerMetrics metrics;
  WorkerAgentOptions options = rig->options;
  options.metrics = &metrics;
  options.clock = &clock;
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ::testing::internal::CaptureStderr();
  const absl::Status started = agent.Start();
  // Beats go one at a time: the second answered was sent after the agent
  // took the first's answer.
  const bool answered = started.ok() && coordinator.AwaitAnswered(2);
  agent.Stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  rig->Shutdown();
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_TRUE(answered) << log;
  EXPECT_EQ(CoordinatorCallFailures(metrics, "heartbeat"), 20.0);
  EXPECT_EQ(Occurrences(log, "heartbeat failed"), 2) << log;
  EXPECT_TRUE(absl::StrContains(log,
                                "heartbeat failed: shedding load (logged once a minute until one "
                                "is answered) (8 similar messages not logged)"))
      << log;
  EXPECT_TRUE(
      absl::StrContains(log, "coordinator reachable again after 20 failed heartbeats over 1m1s"))
      << log;
  EXPECT_LE(Occurrences(log, "assignment stream ended"), 2) << log;
}

// Registration attempts refused: each counted, the first logged, and the
// registration that ends them says so.
TEST(WorkerAgentTest, RegistrationsRefused_EachCountedTheFirstLogged) {
  FakeClock clock;
  OutageCoordinator coordinator(/*registrations=*/3, /*heartbeats=*/0, &clock);
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerMetrics metrics;
  WorkerAgentOptions options = rig->options;
  options.metrics = &metrics;
  options.clock = &clock;
  options.backoff.initial = absl::Milliseconds(1);
  options.backoff.max = absl::Milliseconds(1);
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ::testing::internal::CaptureStderr();
  const absl::Status started = agent.Start();
  agent.Stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  rig->Shutdown();
  ASSERT_TRUE(started.ok()) << started;
  EXPECT_EQ(CoordinatorCallFailures(metrics, "register"), 3.0);
  EXPECT_EQ(Occurrences(log, "cannot register with"), 1) << log;
  EXPECT_TRUE(absl::StrContains(
      log, "coordinator reachable again after 3 failed registration attempts over 0"))
      << log;
}

// The coordinator's address listed twice (highly available coordinators,
// all out of reach): each refused beat moves on to the other address and
// is sent again at once, and that fails too. The moves were a line each,
// two a beat; they are logged once a minute. Every refused beat, the ones
// sent again included, is in the count that ends the outage, as in the
// metric (the resends' were left out).
TEST(WorkerAgentTest, HeartbeatsRefusedAtEveryListedAddress_MovesLoggedOnceAMinuteAllCounted) {
  FakeClock clock;
  OutageCoordinator coordinator(/*registrations=*/0, /*heartbeats=*/20, &clock, /*step_at=*/10);
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerMetrics metrics;
  WorkerAgentOptions options = rig->options;
  options.coordinator_address =
      absl::StrCat(options.coordinator_address, ",", options.coordinator_address);
  options.metrics = &metrics;
  options.clock = &clock;
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ::testing::internal::CaptureStderr();
  const absl::Status started = agent.Start();
  const bool answered = started.ok() && coordinator.AwaitAnswered(2);
  agent.Stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  rig->Shutdown();
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_TRUE(answered) << log;
  EXPECT_EQ(CoordinatorCallFailures(metrics, "heartbeat"), 20.0);
  EXPECT_TRUE(
      absl::StrContains(log, "coordinator reachable again after 20 failed heartbeats over 1m1s"))
      << log;
  // One at the first move, one a minute later (the stream's moves too).
  EXPECT_EQ(Occurrences(log, "is not the leader or does not answer"), 2) << log;
  EXPECT_EQ(Occurrences(log, "heartbeat failed"), 2) << log;
}

// Registers the worker; each assignment stream is ended by the coordinator
// (TryCancel, as it ends a superseded stream or one open at its shutdown).
class StreamCancellingCoordinator final : public NoAssignmentsCoordinator {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    return RegisteredAsW1(response, 1, /*interval_seconds=*/60);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status WatchAssignments(grpc::ServerContext* context, const v1::WatchAssignmentsRequest*,
                                grpc::ServerWriter<v1::Assignment>*) override {
    {
      AnnotatedMutexLock lock(&mu_);
      ++streams_;
    }
    context->TryCancel();
    return grpc::Status::CANCELLED;
  }
  // Whether `n` streams were opened within 30 s.
  bool AwaitStreams(int n) {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return streams_ >= n; },
                                absl::Seconds(30));
  }

 private:
  AnnotatedMutex mu_;
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
};

// A stream the coordinator cancelled is a failure like any other: only the
// worker's own cancel, to reopen as a new registration, is left out.
TEST(WorkerAgentTest, AssignmentStreamCancelledByTheCoordinator_Counted) {
  StreamCancellingCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerMetrics metrics;
  WorkerAgentOptions options = rig->options;
  options.metrics = &metrics;
  options.backoff.initial = absl::Milliseconds(1);
  options.backoff.max = absl::Milliseconds(1);
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ASSERT_TRUE(agent.Start().ok());
  // The first stream's end was counted before the second opened.
  const bool reopened = coordinator.AwaitStreams(2);
  agent.Stop();
  rig->Shutdown();
  ASSERT_TRUE(reopened);
  const std::optional<double> cancelled =
      CoordinatorCallFailures(metrics, "assignment_stream", "CANCELLED");
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_GE(*cancelled, 1.0);
}

// Registers incarnation 1, whose stream stays open, then forgets it at its
// heartbeat (as a restarted coordinator does): the worker registers again
// as 2 and cancels that stream itself to reopen it. Incarnation 2's first
// stream ends UNAVAILABLE ("coordinator gone"); later ones stay open.
class ReopeningCoordinator final : public NoAssignmentsCoordinator {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    AnnotatedMutexLock lock(&mu_);
    return RegisteredAsW1(response, ++registrations_);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse*) override {
    if (request->incarnation() != 1) return grpc::Status::OK;
    AnnotatedMutexLock lock(&mu_);
    mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return streams_of_1_ >= 1; },
                         absl::Seconds(30));
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "incarnation not current");
  }
  grpc::Status WatchAssignments(grpc::ServerContext* context,
                                const v1::WatchAssignmentsRequest* request,
                                grpc::ServerWriter<v1::Assignment>*) override {
    {
      AnnotatedMutexLock lock(&mu_);
      if (request->incarnation() == 1) {
        ++streams_of_1_;
      } else if (++streams_of_2_ == 1) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator gone");
      }
    }
    while (!context->IsCancelled()) {  // open until the agent or the server ends it
      AnnotatedMutexLock lock(&mu_);
      mu_.AwaitWithTimeout([] { return false; }, absl::Milliseconds(20));
    }
    return grpc::Status::OK;
  }
  // Whether incarnation 2 opened `n` streams within 30 s.
  bool AwaitStreamsOf2(int n) {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return streams_of_2_ >= n; }, absl::Seconds(30));
  }

 private:
  AnnotatedMutex mu_;
  int64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
  int streams_of_1_ ABSL_GUARDED_BY(mu_) = 0;
  int streams_of_2_ ABSL_GUARDED_BY(mu_) = 0;
};

// The worker's own cancel, reopening the stream as its new registration,
// is not a failure: not counted, and it does not use up the minute's
// warning, so the next stream's failure (a new outage) is logged at once.
TEST(WorkerAgentTest, StreamReopenedAfterRegisteringAgain_NotCountedNextEndLoggedAtOnce) {
  FakeClock clock;  // never stepped: all within one minute
  ReopeningCoordinator coordinator;
  Mailbox mailbox;
  absl::StatusOr<AgentRig> rig = StartRig(&coordinator, &mailbox);
  ASSERT_TRUE(rig.ok()) << rig.status();
  WorkerMetrics metrics;
  WorkerAgentOptions options = rig->options;
  options.metrics = &metrics;
  options.clock = &clock;
  options.backoff.initial = absl::Milliseconds(1);
  options.backoff.max = absl::Milliseconds(1);
  WorkerAgent agent(options, rig->data_plane.get(), &mailbox, GrpcTransports(&mailbox));
  ::testing::internal::CaptureStderr();
  const absl::Status started = agent.Start();
  // The failed stream's end was counted and logged before the next opened.
  const bool reopened = started.ok() && coordinator.AwaitStreamsOf2(2);
  agent.Stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  rig->Shutdown();
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_TRUE(reopened) << log;
  EXPECT_EQ(CoordinatorCallFailures(metrics, "assignment_stream", "CANCELLED"), std::nullopt);
  EXPECT_EQ(CoordinatorCallFailures(metrics, "assignment_stream"), 1.0);
  EXPECT_TRUE(absl::StrContains(log, "assignment stream ended (coordinator gone)")) << log;
}

}  // namespace
}  // namespace pipetrain
