#include "coordinator/registry/worker_registry.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/build_identity.h"
#include "common/clock.h"
#include "common/proto_time.h"
#include "coordinator/store/coordinator_state.h"
#include "coordinator/store/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr char kToken[] = "s3cret";
const absl::Time kStart = absl::FromUnixSeconds(1700000000);

WorkerRegistry::Options MakeOptions(FakeClock* clock, std::string token = kToken) {
  WorkerRegistry::Options options;
  options.join_token = std::move(token);
  options.clock = clock;
  return options;  // heartbeat_interval 1 s, lease 5 s
}

// Worker n listens on 10.0.0.n:7001 on node-n.
v1::RegisterWorkerRequest Request(int n, std::string token = kToken) {
  v1::RegisterWorkerRequest request;
  request.set_join_token(std::move(token));
  request.set_data_address(absl::StrCat("10.0.0.", n, ":7001"));
  request.set_metrics_address(absl::StrCat("10.0.0.", n, ":9100"));
  request.set_node_name(absl::StrCat("node-", n));
  request.mutable_device()->set_cpu_cores(8);
  request.mutable_device()->set_gpu_model("H100");
  return request;
}

v1::HeartbeatRequest Beat(const std::string& id, int64_t incarnation,
                          const std::string& instruction = "") {
  v1::HeartbeatRequest request;
  request.set_worker_id(id);
  request.set_incarnation(incarnation);
  request.set_current_instruction(instruction);
  return request;
}

v1::WorkerState StateOf(const WorkerRegistry& registry, const std::string& id) {
  absl::StatusOr<v1::Worker> worker = registry.Get(id);
  EXPECT_TRUE(worker.ok()) << worker.status();
  return worker.ok() ? worker->state() : v1::WORKER_STATE_UNSPECIFIED;
}

// Records loss-listener calls. std::mutex and std::condition_variable rather
// than absl::Notification: TSan sees pthread hand-offs but not Debian's
// uninstrumented Abseil, and the test thread reads what the loop thread wrote.
class LossRecorder {
 public:
  struct Loss {
    std::string worker_id;
    std::string job_id;
    std::string reason;
    int64_t incarnation = 0;
  };

  WorkerRegistry::LossListener Listener() {
    return [this](const std::string& worker_id, const std::string& job_id,
                  const std::string& reason, int64_t incarnation) {
      std::lock_guard<std::mutex> lock(mu_);
      losses_.push_back({worker_id, job_id, reason, incarnation});
      changed_.notify_all();
    };
  }
  std::vector<Loss> losses() const {
    std::lock_guard<std::mutex> lock(mu_);
    return losses_;
  }
  // Waits until at least n losses are recorded; false after `timeout`.
  bool WaitFor(size_t n, absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                             [&] { return losses_.size() >= n; });
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<Loss> losses_;
};

// ------------------------------------------------------------------ Options

TEST(WorkerRegistryTest, ValidateOptions_Defaults_Ok) {
  EXPECT_TRUE(WorkerRegistry::ValidateOptions(WorkerRegistry::Options()).ok());
}

TEST(WorkerRegistryTest, ValidateOptions_ZeroInterval_InvalidArgument) {
  WorkerRegistry::Options options;
  options.heartbeat_interval = absl::ZeroDuration();
  const absl::Status status = WorkerRegistry::ValidateOptions(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("heartbeat_interval must be positive"));
}

TEST(WorkerRegistryTest, ValidateOptions_LeaseNotLongerThanInterval_InvalidArgument) {
  WorkerRegistry::Options options;
  options.lease = options.heartbeat_interval;
  const absl::Status status = WorkerRegistry::ValidateOptions(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("lease (1s) must be finite and longer than "
                                          "heartbeat_interval (1s)"));
}

// ----------------------------------------------------------------- Register

TEST(WorkerRegistryTest, Register_WrongToken_Unauthenticated) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  const auto response = registry.Register(Request(1, "guess"));
  EXPECT_EQ(response.status(),
            absl::UnauthenticatedError("join token rejected; give the worker the coordinator's "
                                       "join token (its --join-token or --join-token-file)"));
  EXPECT_THAT(registry.List(), IsEmpty());
}

TEST(WorkerRegistryTest, Register_MissingToken_Unauthenticated) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  const auto response = registry.Register(Request(1, ""));
  EXPECT_EQ(response.status(),
            absl::UnauthenticatedError("join token rejected; give the worker the coordinator's "
                                       "join token (its --join-token or --join-token-file)"));
}

TEST(WorkerRegistryTest, Register_TokenPrefix_Unauthenticated) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  EXPECT_EQ(registry.Register(Request(1, "s3c")).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(registry.Register(Request(1, "s3cret!")).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(WorkerRegistryTest, Register_RightToken_ReturnsIdIncarnationAndTimings) {
  FakeClock clock(kStart);
  WorkerRegistry registry(MakeOptions(&clock));
  const auto response = registry.Register(Request(1));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->worker_id(), "w-1");
  EXPECT_EQ(response->incarnation(), 1);
  EXPECT_EQ(response->heartbeat_interval_seconds(), 1.0);
  EXPECT_EQ(response->lease_seconds(), 5.0);

  const auto worker = registry.Get("w-1");
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(worker->incarnation(), 1);
  EXPECT_EQ(worker->data_address(), "10.0.0.1:7001");
  EXPECT_EQ(worker->metrics_address(), "10.0.0.1:9100");
  EXPECT_EQ(worker->node_name(), "node-1");
  EXPECT_EQ(worker->device().gpu_model(), "H100");
  EXPECT_EQ(worker->last_heartbeat().seconds(), 1700000000);
  EXPECT_EQ(worker->last_heartbeat().nanos(), 0);
}

// Registration bounds the device's known fields (about 1 KB a worker);
// protobuf keeps unknown ones, up to the 4 MiB request limit, which every
// listing and /metrics scrape then copied. They are not kept.
TEST(WorkerRegistryTest, Register_DeviceUnknownFields_NotKept) {
  FakeClock clock(kStart);
  WorkerRegistry registry(MakeOptions(&clock));
  v1::RegisterWorkerRequest request = Request(1);
  v1::DeviceInfo* device = request.mutable_device();
  device->GetReflection()->MutableUnknownFields(device)->AddLengthDelimited(
      99, std::string(1 << 20, 'u'));
  ASSERT_TRUE(registry.Register(request).ok());
  const auto worker = registry.Get("w-1");
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->device().gpu_model(), "H100");
  EXPECT_TRUE(worker->device().GetReflection()->GetUnknownFields(worker->device()).empty());
  EXPECT_LT(worker->ByteSizeLong(), 4096u);
}

TEST(WorkerRegistryTest, Register_EmptyJoinToken_OpenToAnyToken) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock, /*token=*/""));
  EXPECT_TRUE(registry.Register(Request(1, "")).ok());
  EXPECT_TRUE(registry.Register(Request(2, "anything")).ok());
  EXPECT_EQ(registry.List().size(), 2);
}

TEST(WorkerRegistryTest, Register_MissingDataAddress_InvalidArgumentNamingField) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  v1::RegisterWorkerRequest request = Request(1);
  request.clear_data_address();
  const auto response = registry.Register(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(),
              HasSubstr("RegisterWorkerRequest.data_address is empty"));
}

// The metrics address becomes a label on the coordinator's open /metrics,
// which dashboards match as a regular expression: only host:port or empty.
TEST(WorkerRegistryTest, Register_MetricsAddressNotHostPort_InvalidArgument) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  for (const std::string bad : {"w\"} 1", "10.0.0.1:9100\n", "host:port", "(a|b):1", ":9100",
                                "10.0.0.1:", "10.0.0.1:123456", "10.0.0.1:70000", "a b:1",
                                "[a-z]:1", "[[:1", "a]b:1", "a:b:1", "[]:1", "a%b:1"}) {
    v1::RegisterWorkerRequest request = Request(1);
    request.set_metrics_address(bad);
    const auto response = registry.Register(request);
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(response.status().message(), HasSubstr("RegisterWorkerRequest.metrics_address"));
  }
  int n = 2;
  for (const std::string good :
       {"", "10.0.0.2:9100", "[fd00::1]:9100", "[fe80::1%eth0]:9100", "worker-0.pods_a:0"}) {
    v1::RegisterWorkerRequest request = Request(n++);
    request.set_metrics_address(good);
    EXPECT_TRUE(registry.Register(request).ok()) << good;
  }
}

TEST(WorkerRegistryTest, Register_WrongTokenAndNoAddress_TokenCheckedFirst) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  v1::RegisterWorkerRequest request = Request(1, "guess");
  request.clear_data_address();
  EXPECT_EQ(registry.Register(request).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(WorkerRegistryTest, Register_DistinctAddresses_SequentialIdsFirstIncarnation) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  for (int n = 1; n <= 3; ++n) {
    const auto response = registry.Register(Request(n));
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->worker_id(), absl::StrCat("w-", n));
    EXPECT_EQ(response->incarnation(), 1);
  }
}

TEST(WorkerRegistryTest, Register_SameAddress_SameIdLargerIncarnation) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  v1::RegisterWorkerRequest again = Request(1);
  again.mutable_device()->set_gpu_model("A100");
  const auto response = registry.Register(again);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->worker_id(), "w-1");
  EXPECT_EQ(response->incarnation(), 2);
  ASSERT_EQ(registry.List().size(), 1);
  EXPECT_EQ(registry.List()[0].device().gpu_model(), "A100");
  EXPECT_EQ(registry.List()[0].state(), v1::WORKER_STATE_READY);
}

// ---------------------------------------------------------------- Heartbeat

TEST(WorkerRegistryTest, Heartbeat_SupersededIncarnation_FailedPrecondition) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  const absl::Status status = registry.Heartbeat(Beat("w-1", 1));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("incarnation 1 superseded by 2; re-register"));
  EXPECT_TRUE(registry.Heartbeat(Beat("w-1", 2)).ok());
}

TEST(WorkerRegistryTest, Heartbeat_NeverIssuedIncarnation_FailedPrecondition) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  const absl::Status status = registry.Heartbeat(Beat("w-1", 7));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("incarnation 7 was never issued (current is 1)"));
}

TEST(WorkerRegistryTest, Heartbeat_UnknownId_NotFound) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  for (const std::string id : {"w-9", "w-01", "1", "bogus"}) {
    const absl::Status status = registry.Heartbeat(Beat(id, 1));
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << id;
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("worker ", id, " is not registered")));
  }
}

TEST(WorkerRegistryTest, Heartbeat_NoIncarnation_InvalidArgument) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  EXPECT_EQ(registry.Heartbeat(Beat("w-1", 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Heartbeat(Beat("", 1)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(WorkerRegistryTest, Heartbeat_Live_RenewsLeaseAndStoresInstruction) {
  FakeClock clock(kStart);
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  clock.Advance(absl::Milliseconds(4500));
  ASSERT_TRUE(registry.Heartbeat(Beat("w-1", 1, "recv ACTIVATION mb 3 from stage 1")).ok());
  clock.Advance(absl::Seconds(4));  // 8.5 s after registering, 4 s after the heartbeat
  EXPECT_EQ(registry.CheckLeases(), 0);
  const auto worker = registry.Get("w-1");
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(worker->state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(worker->current_instruction(), "recv ACTIVATION mb 3 from stage 1");
  EXPECT_EQ(worker->last_heartbeat().seconds(), 1700000004);
  EXPECT_EQ(worker->last_heartbeat().nanos(), 500000000);
}

// ------------------------------------------------------------------- Leases

// A coordinator stalled past the lease (SIGSTOP, a paused VM) took no
// heartbeats meanwhile: its workers' leases restart rather than every
// worker becoming LOST and every job without checkpoints failing. They
// are judged again one lease later.
TEST(WorkerRegistryTest, RenewLeasesAfterStall_NoLossUntilAFreshLeasePasses) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));  // lease 5 s
  LossRecorder recorder;
  registry.SetLossListener(recorder.Listener());
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Register(Request(2)).ok());
  ASSERT_TRUE(registry.Assign({"w-1"}, "job-1").ok());
  ASSERT_TRUE(registry.Deregister("w-2", 1).ok());
  clock.Advance(absl::Seconds(9));  // stopped for 9 s
  registry.RenewLeasesAfterStall(absl::Seconds(9));
  EXPECT_EQ(registry.CheckLeases(), 0);
  EXPECT_EQ(registry.Get("w-1")->state(), v1::WORKER_STATE_ASSIGNED);
  EXPECT_EQ(registry.Get("w-2")->state(), v1::WORKER_STATE_LEFT);  // not brought back
  clock.Advance(absl::Milliseconds(5001));                         // and then truly silent
  EXPECT_EQ(registry.CheckLeases(), 1);
  EXPECT_EQ(recorder.losses().size(), 1u);
}

// Leases are judged on the lease clock (the coordinator's monotonic one),
// not the wall clock: a wall-clock step forward of an hour (NTP, a resumed
// laptop) marked every worker LOST at once, and one back hid a dead worker.
TEST(WorkerRegistryTest, CheckLeases_WallClockSteps_JudgedOnTheLeaseClock) {
  FakeClock wall(kStart), steady;
  WorkerRegistry::Options options = MakeOptions(&wall);
  options.lease_clock = &steady;
  WorkerRegistry registry(options);
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Register(Request(2)).ok());
  wall.Advance(absl::Hours(1));
  EXPECT_EQ(registry.CheckLeases(), 0);
  ASSERT_TRUE(registry.Heartbeat(Beat("w-1", 1)).ok());
  // The heartbeat's timestamp is the wall clock's.
  EXPECT_EQ(registry.Get("w-1")->last_heartbeat().seconds(), absl::ToUnixSeconds(kStart) + 3600);
  wall.Advance(-absl::Hours(2));
  steady.Advance(absl::Seconds(3));
  ASSERT_TRUE(registry.Heartbeat(Beat("w-1", 1)).ok());
  steady.Advance(absl::Seconds(3));  // w-2 silent 6 s, w-1 3 s
  EXPECT_EQ(registry.CheckLeases(), 1);
  EXPECT_EQ(StateOf(registry, "w-2"), v1::WORKER_STATE_LOST);
  EXPECT_EQ(StateOf(registry, "w-1"), v1::WORKER_STATE_READY);
}

TEST(WorkerRegistryTest, CheckerWasStalled_LaterThanHalfALeaseAfterItsPeriod) {
  const absl::Duration period = absl::Milliseconds(500), lease = absl::Seconds(5);
  EXPECT_FALSE(WorkerRegistry::CheckerWasStalled(period, period, lease));
  EXPECT_FALSE(WorkerRegistry::CheckerWasStalled(absl::Seconds(3), period, lease));
  EXPECT_TRUE(WorkerRegistry::CheckerWasStalled(absl::Milliseconds(3001), period, lease));
  EXPECT_TRUE(WorkerRegistry::CheckerWasStalled(absl::Seconds(9), period, lease));
}

TEST(WorkerRegistryTest, CheckLeases_ExactlyAtLease_StillLive) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(registry.CheckLeases(), 0);
  EXPECT_EQ(StateOf(registry, "w-1"), v1::WORKER_STATE_READY);
}

TEST(WorkerRegistryTest, CheckLeases_JustPastLease_LostOnce) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  clock.Advance(absl::Seconds(5) + absl::Nanoseconds(1));
  EXPECT_EQ(registry.CheckLeases(), 1);
  EXPECT_EQ(StateOf(registry, "w-1"), v1::WORKER_STATE_LOST);
  EXPECT_EQ(registry.CheckLeases(), 0);
}

TEST(WorkerRegistryTest, Heartbeat_AfterLost_FailedPreconditionToReRegister) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  clock.Advance(absl::Seconds(6));
  ASSERT_EQ(registry.CheckLeases(), 1);
  const absl::Status status = registry.Heartbeat(Beat("w-1", 1));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("worker w-1 (10.0.0.1:7001 on node-1) is LOST"));
  EXPECT_THAT(status.message(), HasSubstr("(its lease expired before this heartbeat arrived)"));
  EXPECT_THAT(status.message(), HasSubstr("re-register"));
}

TEST(WorkerRegistryTest, Register_AfterLost_SameIdReadyWithNewIncarnation) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  clock.Advance(absl::Seconds(6));
  ASSERT_EQ(registry.CheckLeases(), 1);
  const auto response = registry.Register(Request(1));
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->worker_id(), "w-1");
  EXPECT_EQ(response->incarnation(), 2);
  EXPECT_EQ(StateOf(registry, "w-1"), v1::WORKER_STATE_READY);
  EXPECT_TRUE(registry.Heartbeat(Beat("w-1", 2)).ok());
}

// ------------------------------------------------------------ Loss listener

TEST(WorkerRegistryTest, CheckLeases_AssignedWorkerLost_ListenerOnceWithJobAndReason) {
  FakeClock clock;
  LossRecorder recorder;
  WorkerRegistry registry(MakeOptions(&clock));
  registry.SetLossListener(recorder.Listener());
  for (int n = 1; n <= 3; ++n) ASSERT_TRUE(registry.Register(Request(n)).ok());
  ASSERT_TRUE(registry.Assign({"w-1", "w-2"}, "job-7").ok());
  clock.Advance(absl::Seconds(6));

  EXPECT_EQ(registry.CheckLeases(), 3);  // w-3 was READY: lost, but no job to tell
  EXPECT_EQ(registry.CheckLeases(), 0);
  const std::vector<LossRecorder::Loss> losses = recorder.losses();
  ASSERT_EQ(losses.size(), 2);
  EXPECT_EQ(losses[0].worker_id, "w-1");
  EXPECT_EQ(losses[0].job_id, "job-7");
  EXPECT_EQ(losses[0].reason,
            "worker w-1 (10.0.0.1:7001 on node-1) missed heartbeats for 6s (lease 5s); it crashed "
            "or was preempted; check its log");
  EXPECT_EQ(losses[1].worker_id, "w-2");
  EXPECT_EQ(losses[1].job_id, "job-7");
}

TEST(WorkerRegistryTest, Register_SupersedesAssigned_ListenerFiresForOldIncarnation) {
  FakeClock clock;
  LossRecorder recorder;
  WorkerRegistry registry(MakeOptions(&clock));
  registry.SetLossListener(recorder.Listener());
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Assign({"w-1"}, "job-7").ok());
  ASSERT_TRUE(registry.Register(Request(1)).ok());

  const std::vector<LossRecorder::Loss> losses = recorder.losses();
  ASSERT_EQ(losses.size(), 1);
  EXPECT_EQ(losses[0].worker_id, "w-1");
  EXPECT_EQ(losses[0].job_id, "job-7");
  EXPECT_THAT(losses[0].reason, HasSubstr("worker w-1 (10.0.0.1:7001 on node-1) registered "
                                          "again, superseding incarnation 1"));
  EXPECT_EQ(losses[0].incarnation, 1);  // the one gone, not the new 2
  const auto worker = registry.Get("w-1");
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(worker->state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(worker->job_id(), "");
}

// A retry naming the incarnation before the one it supersedes: the answer
// to the registration that made it was lost, the process did not restart
// (and the loss says so, not "check its log for why").
TEST(WorkerRegistryTest, Register_RetryAfterALostAnswer_LossSaysSo) {
  FakeClock clock;
  LossRecorder recorder;
  WorkerRegistry registry(MakeOptions(&clock));
  registry.SetLossListener(recorder.Listener());
  ASSERT_TRUE(registry.Register(Request(1)).ok());  // incarnation 1, its answer lost
  ASSERT_TRUE(registry.Assign({"w-1"}, "job-7").ok());
  v1::RegisterWorkerRequest retry = Request(1);
  retry.set_previous_incarnation(0);  // a new process: restarted
  ASSERT_TRUE(registry.Register(retry).ok());
  ASSERT_TRUE(registry.Assign({"w-1"}, "job-8").ok());
  retry.set_previous_incarnation(1);  // knew 1; 2's answer lost
  ASSERT_TRUE(registry.Register(retry).ok());
  const std::vector<LossRecorder::Loss> losses = recorder.losses();
  ASSERT_EQ(losses.size(), 2);
  EXPECT_THAT(losses[0].reason, HasSubstr("the worker process restarted"));
  EXPECT_THAT(losses[1].reason, HasSubstr("superseding incarnation 2 that was running job job-8; "
                                          "the answer to the registration that made it was lost"));
}

// A retry of the registration that made the current incarnation (the same
// registration_id; its answer was lost to a deadline) gets that
// incarnation and session back, READY or placed meanwhile: before, it made
// a new incarnation, leaving the first, which nobody held, READY to be
// placed, or ending the job placed on it. A new registration, one asking
// for a drain the first did not, or one after the incarnation was lost
// makes a new incarnation.
TEST(WorkerRegistryTest, Register_RetryOfTheSameRegistration_SameIncarnationAndSession) {
  FakeClock clock;
  LossRecorder recorder;
  WorkerRegistry registry(MakeOptions(&clock));
  registry.SetLossListener(recorder.Listener());
  v1::RegisterWorkerRequest request = Request(1);
  request.set_registration_id("r-1");
  const v1::RegisterWorkerResponse first = registry.Register(request).value();
  clock.Advance(absl::Seconds(2));
  const v1::RegisterWorkerResponse again = registry.Register(request).value();
  EXPECT_EQ(again.worker_id(), first.worker_id());
  EXPECT_EQ(again.incarnation(), first.incarnation());
  EXPECT_EQ(again.session_token(), first.session_token());
  EXPECT_EQ(again.lease_seconds(), first.lease_seconds());
  EXPECT_EQ(again.heartbeat_interval_seconds(), first.heartbeat_interval_seconds());
  EXPECT_TRUE(registry.AuthenticateSession(again.session_token()).ok());
  ASSERT_TRUE(registry.Assign({"w-1"}, "job-7").ok());
  EXPECT_EQ(registry.Register(request).value().incarnation(), first.incarnation());
  EXPECT_TRUE(recorder.losses().empty());
  EXPECT_EQ(registry.Get("w-1")->state(), v1::WORKER_STATE_ASSIGNED);
  EXPECT_EQ(registry.Get("w-1")->job_id(), "job-7");

  v1::RegisterWorkerRequest draining = request;
  draining.set_drained(true);
  const v1::RegisterWorkerResponse drained = registry.Register(draining).value();
  EXPECT_EQ(drained.incarnation(), first.incarnation() + 1);
  EXPECT_TRUE(registry.Get("w-1")->drained());
  EXPECT_EQ(recorder.losses().size(), 1u);  // job-7's worker superseded
  v1::RegisterWorkerRequest other = request;
  other.set_registration_id("r-2");
  EXPECT_EQ(registry.Register(other).value().incarnation(), first.incarnation() + 2);
  v1::RegisterWorkerRequest none = Request(1);
  EXPECT_EQ(registry.Register(none).value().incarnation(), first.incarnation() + 3);
  EXPECT_EQ(registry.Register(none).value().incarnation(), first.incarnation() + 4);
  clock.Advance(absl::Seconds(60));  // past the lease: LOST
  registry.CheckLeases();
  ASSERT_EQ(registry.Get("w-1")->state(), v1::WORKER_STATE_LOST);
  other.set_registration_id("r-3");
  ASSERT_EQ(registry.Register(other).value().incarnation(), first.incarnation() + 5);
  clock.Advance(absl::Seconds(60));
  registry.CheckLeases();
  EXPECT_EQ(registry.Register(other).value().incarnation(), first.incarnation() + 6);
}

// Once the incarnation heartbeats, its registration's answer provably
// arrived: the registration_id retires, and the same request makes a new
// incarnation with a new session. Before, it repeated the live session
// token for as long as the incarnation lived, to anyone with the join
// token and the id.
TEST(WorkerRegistryTest, Register_SameRegistrationAfterAHeartbeat_NewIncarnationAndSession) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  v1::RegisterWorkerRequest request = Request(1);
  request.set_registration_id("r-1");
  const v1::RegisterWorkerResponse first = registry.Register(request).value();
  ASSERT_TRUE(registry.Heartbeat(Beat(first.worker_id(), first.incarnation())).ok());
  const v1::RegisterWorkerResponse again = registry.Register(request).value();
  EXPECT_EQ(again.worker_id(), first.worker_id());
  EXPECT_EQ(again.incarnation(), first.incarnation() + 1);
  EXPECT_NE(again.session_token(), first.session_token());
  EXPECT_EQ(registry.AuthenticateSession(first.session_token()).status().code(),
            absl::StatusCode::kUnauthenticated);
  // The new incarnation's own retry within its deadline is answered again.
  EXPECT_EQ(registry.Register(request).value().session_token(), again.session_token());
}

// The re-registration could not be saved, but the old incarnation is gone
// all the same: its job hears of it now (no later registration would, as
// the entry is no longer ASSIGNED), and the caller is told to retry.
TEST(WorkerRegistryTest, Register_SupersedesAssignedButPersistFails_LossStillReported) {
  FakeClock clock;
  LossRecorder recorder;
  bool fail = false;
  WorkerRegistry::Options options = MakeOptions(&clock);
  options.persist = [&fail](const v1::Worker&) {
    return fail ? absl::InternalError("disk full") : absl::OkStatus();
  };
  WorkerRegistry registry(options);
  registry.SetLossListener(recorder.Listener());
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Assign({"w-1"}, "job-7").ok());
  fail = true;
  EXPECT_EQ(registry.Register(Request(1)).status().code(), absl::StatusCode::kUnavailable);
  const std::vector<LossRecorder::Loss> losses = recorder.losses();
  ASSERT_EQ(losses.size(), 1);
  EXPECT_EQ(losses[0].job_id, "job-7");
  EXPECT_EQ(losses[0].incarnation, 1);
  EXPECT_TRUE(registry.ReadyWorkers().empty());  // the unsaved incarnation is nobody's
  fail = false;
  EXPECT_TRUE(registry.Register(Request(1)).ok());
  EXPECT_EQ(recorder.losses().size(), 1);  // reported once
  EXPECT_EQ(registry.ReadyWorkers(), std::vector<std::string>{"w-1"});
}

// A registration is saved off the registry's lock: while the store takes
// its time (an etcd election), other workers' heartbeats go on, or every
// lease would run out behind the save. The incarnation being saved is
// JOINING (placed nowhere) until the save is in.
TEST(WorkerRegistryTest, Register_SlowSave_HeartbeatsGoOnMeanwhile) {
  FakeClock clock;
  WorkerRegistry::Options options = MakeOptions(&clock);
  WorkerRegistry* registry = nullptr;
  std::optional<std::thread> beating;
  bool beat_during_save = false;
  v1::WorkerState state_during_save = v1::WORKER_STATE_UNSPECIFIED;
  options.persist = [&](const v1::Worker& w) {
    if (w.id() != "w-2") return absl::OkStatus();
    auto beat = std::make_shared<absl::Notification>();
    beating.emplace([registry, beat] {
      EXPECT_TRUE(registry->Heartbeat(Beat("w-1", 1, "idle")).ok());
      beat->Notify();
    });
    // Under the lock, the heartbeat would wait for this save to return.
    beat_during_save = beat->WaitForNotificationWithTimeout(absl::Seconds(30));
    if (beat_during_save) state_during_save = StateOf(*registry, "w-2");
    return absl::OkStatus();
  };
  WorkerRegistry built(options);
  registry = &built;
  ASSERT_TRUE(built.Register(Request(1)).ok());
  ASSERT_TRUE(built.Register(Request(2)).ok());
  beating->join();
  EXPECT_TRUE(beat_during_save);
  EXPECT_EQ(state_during_save, v1::WORKER_STATE_JOINING);
  EXPECT_EQ(StateOf(built, "w-2"), v1::WORKER_STATE_READY);
  EXPECT_EQ(built.ReadyWorkers(), (std::vector<std::string>{"w-1", "w-2"}));
}

// A save longer than the lease does not lose the registration: JOINING has
// no lease (it cannot heartbeat before Register returns), and the lease
// starts when the save is in.
TEST(WorkerRegistryTest, Register_SaveLongerThanTheLease_ReadyWithAFreshLease) {
  FakeClock clock;
  WorkerRegistry::Options options = MakeOptions(&clock);
  WorkerRegistry* registry = nullptr;
  int lost_during_save = -1;
  options.persist = [&](const v1::Worker&) {
    clock.Advance(absl::Seconds(60));  // the lease is 5 s
    lost_during_save = registry->CheckLeases();
    return absl::OkStatus();
  };
  WorkerRegistry built(options);
  registry = &built;
  ASSERT_TRUE(built.Register(Request(1)).ok());
  EXPECT_EQ(lost_during_save, 0);
  EXPECT_EQ(StateOf(built, "w-1"), v1::WORKER_STATE_READY);
  clock.Advance(absl::Seconds(4));
  EXPECT_EQ(built.CheckLeases(), 0);  // 4 s since the save, not 64
  EXPECT_EQ(StateOf(built, "w-1"), v1::WORKER_STATE_READY);
}

TEST(WorkerRegistryTest, Register_SupersedesReady_NoListener) {
  FakeClock clock;
  LossRecorder recorder;
  WorkerRegistry registry(MakeOptions(&clock));
  registry.SetLossListener(recorder.Listener());
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  EXPECT_THAT(recorder.losses(), IsEmpty());
}

// --------------------------------------------------------------- Deregister

TEST(WorkerRegistryTest, Deregister_Ready_LeftAndHeartbeatRejected) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Deregister("w-1", 1).ok());
  EXPECT_EQ(StateOf(registry, "w-1"), v1::WORKER_STATE_LEFT);
  EXPECT_TRUE(registry.Deregister("w-1", 1).ok());  // idempotent
  const absl::Status status = registry.Heartbeat(Beat("w-1", 1));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("is LEFT; re-register"));
  clock.Advance(absl::Seconds(60));
  EXPECT_EQ(registry.CheckLeases(), 0);  // LEFT is not live: never LOST
}

TEST(WorkerRegistryTest, Deregister_WrongWorkerOrIncarnation_Rejected) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  EXPECT_EQ(registry.Deregister("w-2", 1).code(), absl::StatusCode::kNotFound);
  const absl::Status status = registry.Deregister("w-1", 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("incarnation 1 superseded by 2"));
  EXPECT_EQ(StateOf(registry, "w-1"), v1::WORKER_STATE_READY);
}

TEST(WorkerRegistryTest, Deregister_Assigned_ListenerFires) {
  FakeClock clock;
  LossRecorder recorder;
  WorkerRegistry registry(MakeOptions(&clock));
  registry.SetLossListener(recorder.Listener());
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Assign({"w-1"}, "job-7").ok());
  ASSERT_TRUE(registry.Deregister("w-1", 1).ok());
  const std::vector<LossRecorder::Loss> losses = recorder.losses();
  ASSERT_EQ(losses.size(), 1);
  EXPECT_EQ(losses[0].job_id, "job-7");
  EXPECT_THAT(losses[0].reason, HasSubstr("worker w-1 (10.0.0.1:7001 on node-1) deregistered "
                                          "while running job job-7"));
}

TEST(WorkerRegistryTest, MarkLost_CurrentIncarnation_LostAtOnceListenerFiresHeartbeatRefused) {
  FakeClock clock;
  LossRecorder recorder;
  WorkerRegistry registry(MakeOptions(&clock));
  registry.SetLossListener(recorder.Listener());
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Register(Request(2)).ok());
  ASSERT_TRUE(registry.Assign({"w-1"}, "job-7").ok());
  registry.MarkLost("w-1", 1, "its assignment stream closed");
  registry.MarkLost("w-2", 1, "its assignment stream closed");  // READY: lost, no job
  EXPECT_EQ(registry.Get("w-1")->state(), v1::WORKER_STATE_LOST);
  EXPECT_EQ(registry.Get("w-2")->state(), v1::WORKER_STATE_LOST);
  const std::vector<LossRecorder::Loss> losses = recorder.losses();
  ASSERT_EQ(losses.size(), 1);
  EXPECT_EQ(losses[0].job_id, "job-7");
  EXPECT_THAT(losses[0].reason, HasSubstr("is gone: its assignment stream closed"));
  v1::HeartbeatRequest beat;
  beat.set_worker_id("w-1");
  beat.set_incarnation(1);
  // Its heartbeats still arrive (a proxy closed only the stream): the
  // refusal says why it is LOST, not that its lease expired.
  const absl::Status refused = registry.Heartbeat(beat);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("is LOST (its assignment stream closed)"));
  EXPECT_THAT(refused.message(), Not(HasSubstr("lease")));
}

TEST(WorkerRegistryTest, MarkLost_OldIncarnationOrUnknown_ChangesNothing) {
  FakeClock clock;
  LossRecorder recorder;
  WorkerRegistry registry(MakeOptions(&clock));
  registry.SetLossListener(recorder.Listener());
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Register(Request(1)).ok());  // incarnation 2
  registry.MarkLost("w-1", 1, "an old stream closed");
  registry.MarkLost("w-9", 1, "never registered");
  EXPECT_EQ(registry.Get("w-1")->state(), v1::WORKER_STATE_READY);
  EXPECT_TRUE(recorder.losses().empty());
}

// MakeOptions whose persist appends every saved record to `saved`, as a
// store would keep them.
WorkerRegistry::Options SavingOptions(FakeClock* clock, std::vector<v1::Worker>* saved) {
  WorkerRegistry::Options options = MakeOptions(clock);
  options.persist = [saved](const v1::Worker& w) {
    saved->push_back(w);
    return absl::OkStatus();
  };
  return options;
}

TEST(WorkerRegistryTest, Restore_KnownWorkersLostUntilTheyRegisterAgainUnderTheirIds) {
  FakeClock clock;
  std::vector<v1::Worker> saved;
  const WorkerRegistry::Options options = SavingOptions(&clock, &saved);
  {
    WorkerRegistry before(options);
    for (int n = 1; n <= 3; ++n) ASSERT_TRUE(before.Register(Request(n)).ok());
    ASSERT_TRUE(before.Register(Request(2)).ok());  // w-2 incarnation 2
  }
  ASSERT_EQ(saved.size(), 4u);
  // The latest record of each worker, as the store keeps it.
  std::map<std::string, v1::Worker> latest;
  for (const v1::Worker& w : saved) latest[w.id()] = w;
  std::vector<v1::Worker> restored;
  for (const auto& [id, w] : latest) restored.push_back(w);
  WorkerRegistry after(options);
  after.Restore(restored);
  EXPECT_TRUE(after.ReadyWorkers().empty());
  EXPECT_EQ(after.Get("w-2")->state(), v1::WORKER_STATE_LOST);
  const auto again = after.Register(Request(2));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->worker_id(), "w-2");
  EXPECT_EQ(again->incarnation(), 3);
  const auto fresh = after.Register(Request(9));  // a new address: the next id
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->worker_id(), "w-4");
}

// A drain is saved with the incarnation it covers. After a restart the
// process of that incarnation registering again (previous_incarnation) is
// drained even if it never heard of it; a new process (0) or one naming
// another incarnation is not.
TEST(WorkerRegistryTest, MarkDrained_SavedAndKeptForTheSameProcessAfterARestart) {
  FakeClock clock;
  MemoryStore store;
  CoordinatorState state(&store);
  ASSERT_TRUE(state.Initialize().ok());
  WorkerRegistry::Options options = MakeOptions(&clock);
  options.persist = [&state](const v1::Worker& w) { return state.SaveWorker(w); };
  {
    WorkerRegistry before(options);
    for (int n = 1; n <= 3; ++n) ASSERT_TRUE(before.Register(Request(n)).ok());
    EXPECT_EQ(before.MarkDrained("w-1", 2).code(), absl::StatusCode::kFailedPrecondition);
    for (const char* id : {"w-1", "w-2", "w-3"}) ASSERT_TRUE(before.MarkDrained(id, 1).ok());
    EXPECT_TRUE(before.Get("w-1")->drained());
  }
  const absl::StatusOr<std::vector<v1::Worker>> saved = state.LoadWorkers();
  ASSERT_TRUE(saved.ok()) << saved.status();
  for (const v1::Worker& w : *saved) EXPECT_TRUE(w.drained()) << w.id();
  WorkerRegistry after(options);
  after.Restore(*saved);
  v1::RegisterWorkerRequest same = Request(1);
  same.set_previous_incarnation(1);
  ASSERT_TRUE(after.Register(same).ok());
  EXPECT_TRUE(after.Get("w-1")->drained());
  ASSERT_TRUE(after.Register(Request(2)).ok());  // a new process
  EXPECT_FALSE(after.Get("w-2")->drained());
  v1::RegisterWorkerRequest other = Request(3);
  other.set_previous_incarnation(7);
  ASSERT_TRUE(after.Register(other).ok());
  EXPECT_FALSE(after.Get("w-3")->drained());
  // The same process registering once more (after incarnation 2, drained
  // by carrying the drain) stays drained.
  v1::RegisterWorkerRequest again = Request(1);
  again.set_previous_incarnation(2);
  ASSERT_TRUE(after.Register(again).ok());
  EXPECT_TRUE(after.Get("w-1")->drained());
}

// A failed save is UNAVAILABLE whatever the store said: its own
// FAILED_PRECONDITION (an etcd fence: "not the leader") must not read as
// "that incarnation is gone" (JobManager::Drain then reported it drained).
TEST(WorkerRegistryTest, MarkDrained_SaveRefused_Unavailable) {
  FakeClock clock;
  WorkerRegistry::Options options = MakeOptions(&clock);
  std::atomic<bool> refuse{false};  // read on the registry's store thread
  options.persist = [&refuse](const v1::Worker&) {
    return refuse ? absl::FailedPreconditionError("not the leader") : absl::OkStatus();
  };
  WorkerRegistry registry(options);
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  refuse = true;
  const absl::Status drained = registry.MarkDrained("w-1", 1);
  EXPECT_EQ(drained.code(), absl::StatusCode::kUnavailable) << drained;
  EXPECT_EQ(drained.message(), "state store: not the leader");
}

// A registration retried because its answer was lost, or because its save
// failed (UNAVAILABLE, the entry left LOST at the new incarnation), names the
// same previous incarnation again: the drain it carried is kept. Before, the
// retry compared that incarnation with the one the lost attempt made, and
// the worker became placeable again.
TEST(WorkerRegistryTest, MarkDrained_KeptThroughARetriedRegistration) {
  for (const bool save_fails_first : {false, true}) {
    SCOPED_TRACE(save_fails_first ? "the first save failed" : "the first answer was lost");
    FakeClock clock;
    WorkerRegistry::Options options = MakeOptions(&clock);
    int saves_to_fail = 0;
    options.persist = [&saves_to_fail](const v1::Worker&) {
      if (saves_to_fail == 0) return absl::OkStatus();
      --saves_to_fail;
      return absl::UnavailableError("store down");
    };
    WorkerRegistry registry(options);
    ASSERT_TRUE(registry.Register(Request(1)).ok());
    ASSERT_TRUE(registry.MarkDrained("w-1", 1).ok());
    v1::RegisterWorkerRequest again = Request(1);
    again.set_previous_incarnation(1);
    saves_to_fail = save_fails_first ? 1 : 0;
    const absl::Status first = registry.Register(again).status();
    EXPECT_EQ(first.ok(), !save_fails_first) << first;
    EXPECT_TRUE(registry.Get("w-1")->drained());
    const absl::StatusOr<v1::RegisterWorkerResponse> retried = registry.Register(again);
    ASSERT_TRUE(retried.ok()) << retried.status();
    EXPECT_EQ(retried->incarnation(), 3);
    EXPECT_TRUE(registry.Get("w-1")->drained());
    EXPECT_EQ(registry.Get("w-1")->state(), v1::WORKER_STATE_READY);
  }
}

// Ids and incarnations a later registration adds one to: past 2^53 (the
// largest INT64_MAX) the record is skipped, so no addition overflows.
TEST(WorkerRegistryTest, Restore_NumbersThatWouldOverflowAreSkipped) {
  FakeClock clock;
  std::vector<v1::Worker> saved;
  const WorkerRegistry::Options options = SavingOptions(&clock, &saved);
  {
    WorkerRegistry before(options);
    for (int n = 1; n <= 3; ++n) ASSERT_TRUE(before.Register(Request(n)).ok());
  }
  ASSERT_EQ(saved.size(), 3u);
  saved[0].set_id("w-9223372036854775807");
  saved[1].set_incarnation(INT64_MAX);
  WorkerRegistry after(options);
  after.Restore(saved);
  EXPECT_FALSE(after.Get("w-9223372036854775807").ok());
  EXPECT_FALSE(after.Get("w-2").ok());
  EXPECT_EQ(after.Get("w-3")->state(), v1::WORKER_STATE_LOST);
  const auto fresh = after.Register(Request(1));  // its record skipped: a new id
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->worker_id(), "w-4");
  const auto second = after.Register(Request(2));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->worker_id(), "w-5");
  EXPECT_EQ(second->incarnation(), 1);
}

// A record saved before RegisterWorker checked the metrics address comes
// back without one it would refuse now (the address is a label on the open
// /metrics), and with one it would take.
TEST(WorkerRegistryTest, Restore_MetricsAddressRegisterWouldRefuse_Cleared) {
  FakeClock clock;
  std::vector<v1::Worker> saved;
  const WorkerRegistry::Options options = SavingOptions(&clock, &saved);
  {
    WorkerRegistry before(options);
    for (int n = 1; n <= 2; ++n) ASSERT_TRUE(before.Register(Request(n)).ok());
  }
  ASSERT_EQ(saved.size(), 2u);
  saved[0].set_metrics_address("[a-z]\"}:1");
  WorkerRegistry after(options);
  after.Restore(saved);
  EXPECT_EQ(after.Get("w-1")->metrics_address(), "");
  EXPECT_EQ(after.Get("w-2")->metrics_address(), "10.0.0.2:9100");
}

// Stored records that would share one entry ("w-01" parses as 1, and a
// number given twice) are not restored past the first: each entry counts
// once by state, and each address belongs to one entry.
TEST(WorkerRegistryTest, Restore_OtherSpellingsAndRepeatedIds_OneEntryEach) {
  FakeClock clock;
  std::vector<v1::Worker> saved;
  const WorkerRegistry::Options options = SavingOptions(&clock, &saved);
  {
    WorkerRegistry before(options);
    for (int n = 1; n <= 3; ++n) ASSERT_TRUE(before.Register(Request(n)).ok());
  }
  ASSERT_EQ(saved.size(), 3u);
  saved[1].set_id("w-01");  // another address, the same number as w-1
  saved[2].set_id("w-1");   // and the same id again
  WorkerRegistry after(options);
  after.Restore(saved);
  EXPECT_EQ(after.List().size(), 1u);
  EXPECT_EQ(after.CountByState()[v1::WORKER_STATE_LOST], 1);
  EXPECT_EQ(after.Get("w-1")->data_address(), saved[0].data_address());
  // The other addresses register as new workers, each its own.
  const auto second = after.Register(Request(2));
  const auto third = after.Register(Request(3));
  ASSERT_TRUE(second.ok() && third.ok());
  EXPECT_NE(second->worker_id(), third->worker_id());
  EXPECT_NE(second->worker_id(), "w-1");
  EXPECT_EQ(after.CountByState()[v1::WORKER_STATE_READY], 2);
}

// A worker that deregistered is LEFT after a restart, with its last
// heartbeat; it was LOST, which the PipetrainWorkerLost alert counts, and
// seemed to have been seen at the restart. Through the coordinator's store,
// as the coordinator keeps workers (a first version saved only in tests).
TEST(WorkerRegistryTest, Restore_DeregisteredWorkerStaysLeft) {
  FakeClock clock;
  MemoryStore store;
  CoordinatorState state(&store);
  ASSERT_TRUE(state.Initialize().ok());
  WorkerRegistry::Options options = MakeOptions(&clock);
  options.persist = [&state](const v1::Worker& w) { return state.SaveWorker(w); };
  google::protobuf::Timestamp last_heartbeat;
  {
    WorkerRegistry before(options);
    ASSERT_TRUE(before.Register(Request(1)).ok());
    ASSERT_TRUE(before.Register(Request(2)).ok());
    last_heartbeat = before.Get("w-1")->last_heartbeat();
    clock.Advance(absl::Seconds(10));
    ASSERT_TRUE(before.Deregister("w-1", 1).ok());
  }
  const absl::StatusOr<std::vector<v1::Worker>> restored = state.LoadWorkers();
  ASSERT_TRUE(restored.ok()) << restored.status();
  clock.Advance(absl::Minutes(5));
  WorkerRegistry after(options);
  after.Restore(*restored);
  EXPECT_EQ(after.Get("w-1")->state(), v1::WORKER_STATE_LEFT);
  EXPECT_EQ(after.Get("w-1")->last_heartbeat().seconds(), last_heartbeat.seconds());
  EXPECT_EQ(after.Get("w-2")->state(), v1::WORKER_STATE_LOST);
  EXPECT_EQ(after.Get("w-2")->last_heartbeat().seconds(),
            absl::ToUnixSeconds(clock.Now()));    // live when the old one stopped
  const auto again = after.Register(Request(1));  // it comes back later
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->worker_id(), "w-1");
  EXPECT_EQ(after.Get("w-1")->state(), v1::WORKER_STATE_READY);
}

// The stored records carry no session secret. A restored worker's session
// must not be the empty one, which anyone could present ("w-1.1.", its
// incarnation being public through ListWorkers), nor the old coordinator's.
TEST(WorkerRegistryTest, Restore_NoSessionUntilTheWorkerRegistersAgain) {
  FakeClock clock;
  std::vector<v1::Worker> saved;
  const WorkerRegistry::Options options = SavingOptions(&clock, &saved);
  std::string old_token;
  {
    WorkerRegistry before(options);
    const auto registered = before.Register(Request(1));
    ASSERT_TRUE(registered.ok());
    old_token = registered->session_token();
  }
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved[0].incarnation(), 1);
  WorkerRegistry after(options);
  after.Restore(saved);
  for (const std::string& token : {std::string("w-1.1."), old_token}) {
    EXPECT_EQ(after.AuthenticateSession(token).status().code(), absl::StatusCode::kUnauthenticated)
        << token;
  }
  // The worker's own session from before the restart: stale, not a
  // stranger's (metrics count them apart), within a lease of the restore
  // (its secret cannot be checked); an unknown worker's is not.
  EXPECT_TRUE(after.IsStaleSession(old_token));
  EXPECT_FALSE(after.IsStaleSession("w-2.1.abc"));
  EXPECT_FALSE(after.IsStaleSession("w-1.2.abc"));  // a later incarnation than it has
  EXPECT_FALSE(after.IsStaleSession("garbage"));
  clock.Advance(options.lease + absl::Seconds(1));
  EXPECT_FALSE(after.IsStaleSession(old_token));  // past the restart's burst: a stranger's
  const auto again = after.Register(Request(1));
  ASSERT_TRUE(again.ok());
  const auto identity = after.AuthenticateSession(again->session_token());
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_EQ(identity->worker_id, "w-1");
  EXPECT_EQ(identity->incarnation, 2);
  // Superseded by a registration: its own secret proves it stale; the
  // pre-restart token's cannot (that secret is gone).
  const auto third = after.Register(Request(1));
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(after.IsStaleSession(again->session_token()));
  EXPECT_FALSE(after.IsStaleSession("w-1.2.abc"));
  EXPECT_FALSE(after.IsStaleSession(old_token));
  // A stranger's incarnation at the end of int64: refused, without the
  // overflow `incarnation + 1` was (UBSan aborts on it in asan builds).
  EXPECT_FALSE(after.IsStaleSession("w-1.9223372036854775807.abc"));
}

TEST(WorkerRegistryTest, Register_PersistFails_UnavailableNothingAcknowledged) {
  FakeClock clock;
  WorkerRegistry::Options options = MakeOptions(&clock);
  options.persist = [](const v1::Worker&) { return absl::InternalError("disk on fire"); };
  WorkerRegistry registry(options);
  const auto response = registry.Register(Request(1));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(response.status().message().find("disk on fire"), std::string::npos);
}

// --------------------------------------------------------------- Assignment

TEST(WorkerRegistryTest, Assign_AllReady_AssignedWithJob) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  for (int n = 1; n <= 3; ++n) ASSERT_TRUE(registry.Register(Request(n)).ok());
  ASSERT_TRUE(registry.Assign({"w-3", "w-1"}, "job-a").ok());
  EXPECT_THAT(registry.ReadyWorkers(), ElementsAre("w-2"));
  const auto worker = registry.Get("w-3");
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(worker->state(), v1::WORKER_STATE_ASSIGNED);
  EXPECT_EQ(worker->job_id(), "job-a");
}

TEST(WorkerRegistryTest, Assign_OneNotReady_NothingAssigned) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  for (int n = 1; n <= 3; ++n) ASSERT_TRUE(registry.Register(Request(n)).ok());
  ASSERT_TRUE(registry.Assign({"w-2"}, "job-a").ok());
  const absl::Status status = registry.Assign({"w-1", "w-2", "w-3"}, "job-b");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("worker w-2 (10.0.0.2:7001 on node-2) is ASSIGNED (job job-a), not READY"));
  EXPECT_THAT(registry.ReadyWorkers(), ElementsAre("w-1", "w-3"));
}

TEST(WorkerRegistryTest, Assign_BadArguments_Rejected) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  const absl::Status unknown = registry.Assign({"w-1", "w-5"}, "job-a");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("worker w-5 is not registered"));
  const absl::Status twice = registry.Assign({"w-1", "w-1"}, "job-a");
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.message(), HasSubstr("worker w-1 is listed twice"));
  EXPECT_EQ(registry.Assign({}, "job-a").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Assign({"w-1"}, "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(registry.ReadyWorkers(), ElementsAre("w-1"));
}

TEST(WorkerRegistryTest, Release_Job_AssignedBackToReadyLostStayLostWithoutTheJob) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  for (int n = 1; n <= 3; ++n) ASSERT_TRUE(registry.Register(Request(n)).ok());
  ASSERT_TRUE(registry.Assign({"w-1", "w-2"}, "job-a").ok());
  ASSERT_TRUE(registry.Assign({"w-3"}, "job-b").ok());
  clock.Advance(absl::Seconds(3));
  ASSERT_TRUE(registry.Heartbeat(Beat("w-1", 1)).ok());
  ASSERT_TRUE(registry.Heartbeat(Beat("w-3", 1)).ok());
  clock.Advance(absl::Seconds(3));
  ASSERT_EQ(registry.CheckLeases(), 1);  // w-2
  // Until the job is released, a lost worker shows the job it was lost from.
  EXPECT_EQ(registry.Get("w-2").value().job_id(), "job-a");

  registry.Release("job-a");
  const std::vector<v1::Worker> workers = registry.List();
  ASSERT_EQ(workers.size(), 3);
  EXPECT_EQ(workers[0].state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(workers[0].job_id(), "");
  EXPECT_EQ(workers[1].state(), v1::WORKER_STATE_LOST);
  EXPECT_EQ(workers[1].job_id(), "");  // the job has ended: not shown as current
  EXPECT_EQ(workers[1].current_instruction(), "");
  EXPECT_EQ(workers[2].state(), v1::WORKER_STATE_ASSIGNED);
  EXPECT_EQ(workers[2].job_id(), "job-b");
}

// A worker released while its last report was the job's work is not
// offered for the next job until a heartbeat says it is idle (a hung one
// never does, and is LOST after its lease); one that reported nothing, or
// idle, is offered at once.
TEST(WorkerRegistryTest, Release_WorkerLastSeenWorking_NotReadyForAJobUntilHeardIdle) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  for (int n = 1; n <= 3; ++n) ASSERT_TRUE(registry.Register(Request(n)).ok());
  ASSERT_TRUE(registry.Assign({"w-1", "w-2", "w-3"}, "job-a").ok());
  ASSERT_TRUE(registry.Heartbeat(Beat("w-1", 1, "backward [0, 6) mb 0")).ok());
  ASSERT_TRUE(registry.Heartbeat(Beat("w-2", 1, "idle")).ok());  // its stage had finished
  registry.Release("job-a");
  EXPECT_EQ(StateOf(registry, "w-1"), v1::WORKER_STATE_READY);
  EXPECT_EQ(registry.Get("w-1").value().current_instruction(),
            "stopping job job-a (no heartbeat since)");
  EXPECT_THAT(registry.ReadyWorkers(), ElementsAre("w-2", "w-3"));
  // Still at the job's work (a heartbeat sent before the STOP arrived), or
  // between its steps: not yet.
  ASSERT_TRUE(registry.Heartbeat(Beat("w-1", 1, "forward [0, 6) mb 1")).ok());
  ASSERT_TRUE(registry.Heartbeat(Beat("w-1", 1, "between steps")).ok());
  ASSERT_TRUE(registry.Heartbeat(Beat("w-1", 1, "stopping job job-a")).ok());
  EXPECT_THAT(registry.ReadyWorkers(), ElementsAre("w-2", "w-3"));
  ASSERT_TRUE(registry.Heartbeat(Beat("w-1", 1, "idle")).ok());
  EXPECT_THAT(registry.ReadyWorkers(), ElementsAre("w-1", "w-2", "w-3"));

  // A new process under the id runs nothing: offered at once.
  ASSERT_TRUE(registry.Assign({"w-3"}, "job-b").ok());
  ASSERT_TRUE(registry.Heartbeat(Beat("w-3", 1, "recv ACTIVATION unit 1 mb 0 from stage 0")).ok());
  registry.Release("job-b");
  EXPECT_THAT(registry.ReadyWorkers(), ElementsAre("w-1", "w-2"));
  ASSERT_TRUE(registry.Register(Request(3)).ok());
  EXPECT_THAT(registry.ReadyWorkers(), ElementsAre("w-1", "w-2", "w-3"));
}

v1::HeartbeatRequest BeatAfter(const std::string& id, const std::string& instruction,
                               const std::string& last_job) {
  v1::HeartbeatRequest request = Beat(id, 1, instruction);
  request.set_last_job_id(last_job);
  return request;
}

// An idle heartbeat the worker sent before it took a job's assignment,
// still in flight when that job ended, said nothing of the job: it cleared
// the stopping mark (and counted for the late checkpoint sweep) while the
// stage might still be running. Only an idle heartbeat naming the job
// released (HeartbeatRequest.last_job_id) does now; one from a worker that
// sends no last_job_id (older) counts as before.
TEST(WorkerRegistryTest, Release_IdleHeartbeatFromBeforeTheJob_NeitherReadiesNorCountsAsStopped) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  for (int n = 1; n <= 2; ++n) ASSERT_TRUE(registry.Register(Request(n)).ok());
  ASSERT_TRUE(registry.Assign({"w-1", "w-2"}, "job-b").ok());
  ASSERT_TRUE(registry.Heartbeat(BeatAfter("w-1", "forward [0, 6) mb 0", "job-b")).ok());
  ASSERT_TRUE(registry.Heartbeat(Beat("w-2", 1, "forward [6, 12) mb 0")).ok());
  clock.Advance(absl::Seconds(1));
  const absl::Time ended = clock.Now();
  registry.Release("job-b");
  EXPECT_TRUE(registry.ReadyWorkers().empty());
  // Sent while w-1 was idle after job-a, before it took job-b's RUN.
  ASSERT_TRUE(registry.Heartbeat(BeatAfter("w-1", "idle", "job-a")).ok());
  ASSERT_TRUE(registry.Heartbeat(BeatAfter("w-1", "idle", "")).ok());  // or before any job
  EXPECT_TRUE(registry.ReadyWorkers().empty());
  EXPECT_FALSE(registry.StoppedSince("w-1", ended));
  ASSERT_TRUE(registry.Heartbeat(BeatAfter("w-1", "idle", "job-b")).ok());
  EXPECT_THAT(registry.ReadyWorkers(), ElementsAre("w-1"));
  EXPECT_TRUE(registry.StoppedSince("w-1", ended));
  // No last_job_id at all: every idle heartbeat counts, as before.
  ASSERT_TRUE(registry.Heartbeat(Beat("w-2", 1, "idle")).ok());
  EXPECT_THAT(registry.ReadyWorkers(), ElementsAre("w-1", "w-2"));
  EXPECT_TRUE(registry.StoppedSince("w-2", ended));
}

// StoppedSince: an idle heartbeat at or after the instant, or a worker
// that is gone (LOST, LEFT, unknown); not a busy heartbeat, nor an idle one
// from before.
TEST(WorkerRegistryTest, StoppedSince_IdleHeartbeatAfterTheInstantOrGone) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  for (int n = 1; n <= 2; ++n) ASSERT_TRUE(registry.Register(Request(n)).ok());
  ASSERT_TRUE(registry.Heartbeat(Beat("w-1", 1, "idle")).ok());
  clock.Advance(absl::Seconds(1));
  const absl::Time ended = clock.Now();
  EXPECT_FALSE(registry.StoppedSince("w-1", ended));  // idle before the instant only
  ASSERT_TRUE(registry.Heartbeat(Beat("w-1", 1, "stopping job job-a")).ok());
  EXPECT_FALSE(registry.StoppedSince("w-1", ended));
  ASSERT_TRUE(registry.Heartbeat(Beat("w-1", 1, "idle")).ok());
  EXPECT_TRUE(registry.StoppedSince("w-1", ended));
  EXPECT_FALSE(registry.StoppedSince("w-2", ended));
  ASSERT_TRUE(registry.Deregister("w-2", 1).ok());
  EXPECT_TRUE(registry.StoppedSince("w-2", ended));
  EXPECT_TRUE(registry.StoppedSince("w-9", ended));
}

// A worker restored LOST was live when the old coordinator stopped: its
// process may still be writing for a job that ended just before. It counts
// as stopped only once it registered again and said it is idle (the late
// checkpoint sweep ran at once on a restored coordinator); a restored LEFT
// one has stopped.
TEST(WorkerRegistryTest, StoppedSince_RestoredLost_NotUntilItRegistersAgainAndIsIdle) {
  FakeClock clock;
  std::vector<v1::Worker> saved;
  const WorkerRegistry::Options options = SavingOptions(&clock, &saved);
  {
    WorkerRegistry before(options);
    for (int n = 1; n <= 2; ++n) ASSERT_TRUE(before.Register(Request(n)).ok());
    ASSERT_TRUE(before.Deregister("w-2", 1).ok());
  }
  ASSERT_EQ(saved.size(), 3u);  // w-1, w-2, then w-2 LEFT: as a store keeps them
  saved.erase(saved.begin() + 1);
  WorkerRegistry after(options);
  after.Restore(saved);
  ASSERT_EQ(after.Get("w-1")->state(), v1::WORKER_STATE_LOST);
  ASSERT_EQ(after.Get("w-2")->state(), v1::WORKER_STATE_LEFT);
  const absl::Time ended = clock.Now();
  clock.Advance(absl::Seconds(1));
  EXPECT_FALSE(after.StoppedSince("w-1", ended));
  EXPECT_TRUE(after.StoppedSince("w-2", ended));
  const auto again = after.Register(Request(1));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(after.StoppedSince("w-1", ended));  // registered, not yet idle
  ASSERT_TRUE(after.Heartbeat(Beat("w-1", again->incarnation(), "idle")).ok());
  EXPECT_TRUE(after.StoppedSince("w-1", ended));
}

// ------------------------------------------------------------------ Queries

TEST(WorkerRegistryTest, CountByState_MixedStates_EveryStateCounted) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  for (int n = 1; n <= 4; ++n) ASSERT_TRUE(registry.Register(Request(n)).ok());
  ASSERT_TRUE(registry.Assign({"w-1"}, "job-a").ok());
  ASSERT_TRUE(registry.Deregister("w-2", 1).ok());
  clock.Advance(absl::Seconds(3));
  ASSERT_TRUE(registry.Heartbeat(Beat("w-1", 1)).ok());
  ASSERT_TRUE(registry.Heartbeat(Beat("w-4", 1)).ok());
  clock.Advance(absl::Seconds(3));
  ASSERT_EQ(registry.CheckLeases(), 1);  // w-3

  const std::map<v1::WorkerState, int> expected = {{v1::WORKER_STATE_JOINING, 0},
                                                   {v1::WORKER_STATE_READY, 1},
                                                   {v1::WORKER_STATE_ASSIGNED, 1},
                                                   {v1::WORKER_STATE_LOST, 1},
                                                   {v1::WORKER_STATE_LEFT, 1}};
  EXPECT_EQ(registry.CountByState(), expected);
}

TEST(WorkerRegistryTest, List_MoreThanNineWorkers_OrderedByIdNumber) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  for (int n = 1; n <= 11; ++n) ASSERT_TRUE(registry.Register(Request(n)).ok());
  std::vector<std::string> listed;
  for (const v1::Worker& worker : registry.List()) listed.push_back(worker.id());
  const std::vector<std::string> expected = {"w-1", "w-2", "w-3", "w-4",  "w-5", "w-6",
                                             "w-7", "w-8", "w-9", "w-10", "w-11"};
  EXPECT_EQ(listed, expected);
  EXPECT_EQ(registry.ReadyWorkers(), expected);
}

TEST(WorkerRegistryTest, Get_UnknownId_NotFound) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  const auto worker = registry.Get("w-1");
  EXPECT_EQ(worker.status(), absl::NotFoundError("worker w-1 is not registered"));
}

// --------------------------------------------------------- NCCL unique ids

v1::RegisterWorkerRequest RequestWithNcclId(int n, const std::string& id) {
  v1::RegisterWorkerRequest request = Request(n);
  request.mutable_device()->set_gpu_index(n);
  request.mutable_device()->set_nccl_unique_id(id);
  return request;
}

v1::HeartbeatRequest BeatWithNcclId(const std::string& worker, int64_t incarnation,
                                    const std::string& id) {
  v1::HeartbeatRequest request = Beat(worker, incarnation);
  request.set_nccl_unique_id(id);
  return request;
}

TEST(WorkerRegistryTest, NcclUniqueId_FromRegistration_KeptButNeverListed) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(RequestWithNcclId(1, "id-a")).ok());
  EXPECT_EQ(registry.NcclUniqueId("w-1").value(), "id-a");
  const v1::Worker worker = registry.Get("w-1").value();
  EXPECT_EQ(worker.device().gpu_index(), 1);  // the other device facts stay
  EXPECT_EQ(worker.device().gpu_model(), "H100");
  EXPECT_EQ(worker.device().nccl_unique_id(), "");
  ASSERT_EQ(registry.List().size(), 1u);
  EXPECT_EQ(registry.List()[0].device().nccl_unique_id(), "");
}

TEST(WorkerRegistryTest, NcclUniqueId_WithoutOne_Empty) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  EXPECT_EQ(registry.NcclUniqueId("w-1").value(), "");
  EXPECT_FALSE(registry.ConsumeNcclUniqueId("w-1", ""));
}

TEST(WorkerRegistryTest, NcclUniqueId_UnknownWorker_NotFound) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  EXPECT_EQ(registry.NcclUniqueId("w-1").status(),
            absl::NotFoundError("worker w-1 is not registered"));
  EXPECT_FALSE(registry.ConsumeNcclUniqueId("w-1", "id-a"));
}

TEST(WorkerRegistryTest, Heartbeat_WithNcclId_ReplacesItWithoutOne_KeepsIt) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(RequestWithNcclId(1, "id-a")).ok());
  ASSERT_TRUE(registry.Heartbeat(Beat("w-1", 1)).ok());
  EXPECT_EQ(registry.NcclUniqueId("w-1").value(), "id-a");
  ASSERT_TRUE(registry.Heartbeat(BeatWithNcclId("w-1", 1, "id-b")).ok());
  EXPECT_EQ(registry.NcclUniqueId("w-1").value(), "id-b");
  EXPECT_EQ(registry.Get("w-1")->device().nccl_unique_id(), "");
}

TEST(WorkerRegistryTest, Heartbeat_RejectedWithNcclId_IdNotStored) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(RequestWithNcclId(1, "id-a")).ok());
  ASSERT_TRUE(registry.Register(RequestWithNcclId(1, "id-b")).ok());  // incarnation 2
  EXPECT_EQ(registry.Heartbeat(BeatWithNcclId("w-1", 1, "id-old")).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry.NcclUniqueId("w-1").value(), "id-b");
}

TEST(WorkerRegistryTest, ConsumeNcclUniqueId_Current_ClearsOnceUntilAFreshOneArrives) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(RequestWithNcclId(1, "id-a")).ok());
  EXPECT_TRUE(registry.ConsumeNcclUniqueId("w-1", "id-a"));
  EXPECT_EQ(registry.NcclUniqueId("w-1").value(), "");
  EXPECT_FALSE(registry.ConsumeNcclUniqueId("w-1", "id-a"));
  // A worker repeating the consumed id does not get it handed out again.
  ASSERT_TRUE(registry.Heartbeat(BeatWithNcclId("w-1", 1, "id-a")).ok());
  EXPECT_EQ(registry.NcclUniqueId("w-1").value(), "");
  ASSERT_TRUE(registry.Heartbeat(BeatWithNcclId("w-1", 1, "id-b")).ok());
  EXPECT_EQ(registry.NcclUniqueId("w-1").value(), "id-b");
}

TEST(WorkerRegistryTest, ConsumeNcclUniqueId_ReplacedSinceRead_KeepsTheFreshOne) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(RequestWithNcclId(1, "id-a")).ok());
  ASSERT_TRUE(registry.Heartbeat(BeatWithNcclId("w-1", 1, "id-b")).ok());
  EXPECT_FALSE(registry.ConsumeNcclUniqueId("w-1", "id-a"));
  EXPECT_EQ(registry.NcclUniqueId("w-1").value(), "id-b");
}

TEST(WorkerRegistryTest, Register_NewIncarnation_ReplacesNcclIdButNotWithAConsumedOne) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(RequestWithNcclId(1, "id-a")).ok());
  ASSERT_TRUE(registry.ConsumeNcclUniqueId("w-1", "id-a"));
  // The same process re-registering before it learnt that id-a was used.
  ASSERT_TRUE(registry.Register(RequestWithNcclId(1, "id-a")).ok());
  EXPECT_EQ(registry.NcclUniqueId("w-1").value(), "");
  ASSERT_TRUE(registry.Register(RequestWithNcclId(1, "id-c")).ok());
  EXPECT_EQ(registry.NcclUniqueId("w-1").value(), "id-c");
  ASSERT_TRUE(registry.Register(Request(1)).ok());  // now without NCCL
  EXPECT_EQ(registry.NcclUniqueId("w-1").value(), "");
}

// ---------------------------------------------------------- AwaitReadyCount

TEST(WorkerRegistryTest, AwaitReadyCount_EnoughReady_True) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  for (int n = 1; n <= 2; ++n) ASSERT_TRUE(registry.Register(Request(n)).ok());
  EXPECT_TRUE(registry.AwaitReadyCount(2, absl::ZeroDuration()));
  EXPECT_TRUE(registry.AwaitReadyCount(0, absl::ZeroDuration()));
}

TEST(WorkerRegistryTest, AwaitReadyCount_TooFew_FalseAfterTimeout) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Assign({"w-1"}, "job-a").ok());  // registered, but not READY
  EXPECT_FALSE(registry.AwaitReadyCount(1, absl::Milliseconds(10)));
}

TEST(WorkerRegistryTest, AwaitReadyCount_OtherThreadRegisters_True) {
  FakeClock clock;
  WorkerRegistry registry(MakeOptions(&clock));
  std::thread registrar([&registry] {
    for (int n = 1; n <= 3; ++n) EXPECT_TRUE(registry.Register(Request(n)).ok());
  });
  // A generous bound on the wait, not a timing assertion.
  EXPECT_TRUE(registry.AwaitReadyCount(3, absl::Seconds(10)));
  registrar.join();
}

// ----------------------------------------------------------- Staleness loop

TEST(WorkerRegistryTest, StalenessLoop_ClockAdvanced_MarksLostAndNotifies) {
  FakeClock clock;
  LossRecorder recorder;
  WorkerRegistry::Options options = MakeOptions(&clock);
  options.heartbeat_interval = absl::Milliseconds(10);  // loop wakes every 5 ms of real time
  WorkerRegistry registry(options);
  registry.SetLossListener(recorder.Listener());
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Assign({"w-1"}, "job-7").ok());
  registry.StartStalenessLoop();
  clock.Advance(absl::Seconds(6));

  ASSERT_TRUE(recorder.WaitFor(1, absl::Seconds(10)));
  registry.Stop();
  const std::vector<LossRecorder::Loss> losses = recorder.losses();
  ASSERT_EQ(losses.size(), 1);
  EXPECT_EQ(losses[0].worker_id, "w-1");
  EXPECT_EQ(losses[0].job_id, "job-7");
  EXPECT_THAT(losses[0].reason,
              HasSubstr("worker w-1 (10.0.0.1:7001 on node-1) missed heartbeats"));
  EXPECT_EQ(StateOf(registry, "w-1"), v1::WORKER_STATE_LOST);
}

TEST(WorkerRegistryTest, StalenessLoop_StartStopRepeated_NoOpsAndRestarts) {
  FakeClock clock;
  LossRecorder recorder;  // outlives the registry, whose loop calls it
  WorkerRegistry registry(MakeOptions(&clock));
  registry.Stop();  // not running: no-op
  registry.StartStalenessLoop();
  registry.StartStalenessLoop();  // running: no-op
  registry.Stop();
  registry.Stop();
  registry.StartStalenessLoop();
  // The restarted loop works: it finds a silent worker lost.
  registry.SetLossListener(recorder.Listener());
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Assign({"w-1"}, "job-7").ok());
  clock.Advance(absl::Seconds(6));
  ASSERT_TRUE(recorder.WaitFor(1, absl::Seconds(10)));
  EXPECT_EQ(StateOf(registry, "w-1"), v1::WORKER_STATE_LOST);
  // The destructor stops the restarted loop.
}

// -------------------------------------------------------------- Concurrency

// Registrars, a lister, an assigner and a clock all work at once while the
// staleness loop runs; run under --config=tsan to check the locking.
TEST(WorkerRegistryTest, Concurrency_MixedCallsWhileLoopRuns_ConsistentEnd) {
  FakeClock clock;
  LossRecorder recorder;
  WorkerRegistry::Options options = MakeOptions(&clock);
  options.heartbeat_interval = absl::Milliseconds(2);
  WorkerRegistry registry(options);
  registry.SetLossListener(recorder.Listener());
  registry.StartStalenessLoop();

  constexpr int kRegistrars = 4;
  constexpr int kWorkersEach = 10;
  constexpr int kRounds = 20;
  std::vector<std::thread> registrars;
  for (int t = 0; t < kRegistrars; ++t) {
    registrars.emplace_back([&registry, t] {
      for (int round = 1; round <= kRounds; ++round) {
        for (int w = 0; w < kWorkersEach; ++w) {
          const auto response = registry.Register(Request(t * kWorkersEach + w + 1));
          ASSERT_TRUE(response.ok()) << response.status();
          EXPECT_EQ(response->incarnation(), round);
          EXPECT_TRUE(
              registry.Heartbeat(Beat(response->worker_id(), response->incarnation(), "step"))
                  .ok());
        }
      }
    });
  }
  std::atomic<bool> done{false};
  std::thread lister([&registry, &done] {
    while (!done.load()) {
      int64_t previous = 0;
      for (const v1::Worker& worker : registry.List()) {
        const int64_t number = std::stoll(worker.id().substr(2));
        EXPECT_GT(number, previous);
        previous = number;
      }
      (void)registry.CountByState();
      (void)registry.ReadyWorkers();
    }
  });
  std::thread assigner([&registry, &done] {
    for (int job = 0; !done.load(); ++job) {
      std::vector<std::string> ready = registry.ReadyWorkers();
      if (ready.size() < 2) continue;
      ready.resize(2);
      const std::string job_id = absl::StrCat("job-", job);
      // A registrar may re-register one of them between the two calls; its
      // new incarnation is JOINING until saved, and Assign then refuses the
      // whole set. Nothing else may make it fail.
      const absl::Status assigned = registry.Assign(ready, job_id);
      if (!assigned.ok()) {
        EXPECT_EQ(assigned.code(), absl::StatusCode::kFailedPrecondition) << assigned;
        EXPECT_THAT(assigned.message(), HasSubstr("is JOINING")) << assigned;
      }
      registry.Release(job_id);
    }
  });
  std::thread ticker([&clock] {
    for (int i = 0; i < 1000; ++i) clock.Advance(absl::Milliseconds(1));  // 1 s < lease
  });
  for (std::thread& thread : registrars) thread.join();
  ticker.join();
  done.store(true);
  lister.join();
  assigner.join();
  registry.Stop();

  const std::vector<v1::Worker> workers = registry.List();
  ASSERT_EQ(workers.size(), kRegistrars * kWorkersEach);
  for (const v1::Worker& worker : workers) {
    EXPECT_EQ(worker.incarnation(), kRounds) << worker.id();
    EXPECT_EQ(worker.state(), v1::WORKER_STATE_READY) << worker.id();
  }
  EXPECT_EQ(registry.CountByState()[v1::WORKER_STATE_READY], kRegistrars * kWorkersEach);
  // Only re-registrations of assigned workers can have told the listener.
  for (const LossRecorder::Loss& loss : recorder.losses()) {
    EXPECT_THAT(loss.reason, HasSubstr("registered again")) << loss.reason;
  }
  clock.Advance(absl::Seconds(6));
  EXPECT_EQ(registry.CheckLeases(), kRegistrars * kWorkersEach);
}

// --------------------------------------------------------------- Sessions

TEST(WorkerRegistrySessionTest, Register_IssuesCredentialNamingWorker) {
  FakeClock clock(kStart);
  WorkerRegistry registry(MakeOptions(&clock));
  absl::StatusOr<v1::RegisterWorkerResponse> r = registry.Register(Request(1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->session_token(), ::testing::StartsWith("w-1.1."));
  absl::StatusOr<WorkerRegistry::SessionIdentity> who =
      registry.AuthenticateSession(r->session_token());
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->worker_id, "w-1");
  EXPECT_EQ(who->incarnation, 1);
  EXPECT_EQ(registry.SessionToken("w-1").value_or(""), r->session_token());
}

TEST(WorkerRegistrySessionTest, WrongMalformedOrForeignSecret_Unauthenticated) {
  FakeClock clock(kStart);
  WorkerRegistry registry(MakeOptions(&clock));
  const std::string one = registry.Register(Request(1))->session_token();
  const std::string two = registry.Register(Request(2))->session_token();
  // w-2's secret under w-1's name: rejected, as are edits and junk.
  const std::string two_secret = two.substr(two.rfind('.') + 1);
  std::string wrong = one;
  wrong.back() = wrong.back() == '0' ? '1' : '0';
  for (const std::string& token :
       {std::string("w-1.1.") + two_secret, wrong, std::string(""), std::string("w-1.1"),
        std::string("w-1.x.abc"), std::string("w-9.1.") + two_secret, one + ".extra",
        std::string(5000, 'a')}) {
    absl::StatusOr<WorkerRegistry::SessionIdentity> who = registry.AuthenticateSession(token);
    EXPECT_EQ(who.status().code(), absl::StatusCode::kUnauthenticated) << token;
    EXPECT_THAT(who.status().message(), HasSubstr("register again"));
  }
}

TEST(WorkerRegistrySessionTest, NewIncarnation_OldCredentialDies) {
  FakeClock clock(kStart);
  WorkerRegistry registry(MakeOptions(&clock));
  const std::string first = registry.Register(Request(1))->session_token();
  const std::string second = registry.Register(Request(1))->session_token();
  EXPECT_NE(first, second);
  EXPECT_EQ(registry.AuthenticateSession(first).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(registry.AuthenticateSession(second)->incarnation, 2);
}

TEST(WorkerRegistryBoundsTest, OversizeField_InvalidArgumentNamingIt) {
  FakeClock clock(kStart);
  WorkerRegistry registry(MakeOptions(&clock));
  v1::RegisterWorkerRequest request = Request(1);
  request.mutable_device()->set_cpu_model(std::string(257, 'x'));
  absl::Status status = registry.Register(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("RegisterWorkerRequest.device.cpu_model: 257 bytes"));
  request = Request(1);
  request.set_node_name(std::string(254, 'n'));
  EXPECT_THAT(registry.Register(request).status().message(),
              HasSubstr("RegisterWorkerRequest.node_name"));
  request = Request(1);
  request.mutable_build()->set_commit(std::string(65, 'c'));
  EXPECT_THAT(registry.Register(request).status().message(),
              HasSubstr("RegisterWorkerRequest.build.commit: 65 bytes"));
  request = Request(1);
  request.mutable_build()->set_version(std::string(65, 'v'));
  EXPECT_THAT(registry.Register(request).status().message(),
              HasSubstr("RegisterWorkerRequest.build.version: 65 bytes"));
  request = Request(1);
  request.mutable_device()->set_measured_gflops(-1);
  EXPECT_THAT(registry.Register(request).status().message(),
              HasSubstr("measured_gflops: -1 is neither 0 (not measured) nor in [0.001, 1e+09]"));
  // A subnormal rate passes `> 0` and divides into infinite unit times.
  request = Request(1);
  request.mutable_device()->set_measured_gflops(5e-324);
  EXPECT_THAT(registry.Register(request).status().message(), HasSubstr("measured_gflops: 4.94"));
  request = Request(1);
  request.mutable_device()->set_data_plane_bytes_per_second(1e-300);
  EXPECT_THAT(registry.Register(request).status().message(),
              HasSubstr("data_plane_bytes_per_second: 1e-300 is neither 0"));
  request = Request(1);
  request.mutable_device()->set_data_plane_overhead_seconds(2);
  EXPECT_THAT(registry.Register(request).status().message(),
              HasSubstr("data_plane_overhead_seconds: 2 is outside [0, 1]"));
  // The planner takes the smallest mailbox limit as its largest tensor.
  request = Request(1);
  request.mutable_device()->set_mailbox_limit_bytes(-1);
  EXPECT_THAT(registry.Register(request).status().message(),
              HasSubstr("RegisterWorkerRequest.device.mailbox_limit_bytes: -1 is outside [0, "
                        "1.1259e+15]"));
  request = Request(1);
  request.mutable_device()->set_data_plane_bytes_per_second(NAN);
  EXPECT_THAT(registry.Register(request).status().message(),
              HasSubstr("data_plane_bytes_per_second: nan is neither 0 (not measured) nor in "
                        "[1000, 1e+13]"));
  EXPECT_THAT(registry.List(), IsEmpty());
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  EXPECT_THAT(registry.Heartbeat(Beat("w-1", 1, std::string(257, 'i'))).message(),
              HasSubstr("HeartbeatRequest.current_instruction"));
}

v1::BuildIdentity Build(const std::string& version, const std::string& commit) {
  v1::BuildIdentity build;
  build.set_version(version);
  build.set_commit(commit);
  return build;
}

v1::RegisterWorkerRequest RequestWithBuild(int n, const v1::BuildIdentity& build) {
  v1::RegisterWorkerRequest request = Request(n);
  *request.mutable_build() = build;
  return request;
}

// A worker of another build (commit, version, or none: older than
// BuildIdentity) is refused before anything is stored, naming both builds;
// a registered worker at that address keeps its incarnation.
TEST(WorkerRegistryBuildTest, RequiredBuild_OtherBuild_FailedPreconditionNamingBoth) {
  FakeClock clock(kStart);
  WorkerRegistry::Options options = MakeOptions(&clock);
  options.required_build = Build("0.1.0", "3635b2d1a2b3");
  std::vector<std::string> saved;
  options.persist = [&saved](const v1::Worker& w) {
    saved.push_back(absl::StrCat(w.id(), "/", w.incarnation()));
    return absl::OkStatus();
  };
  WorkerRegistry registry(options);
  for (const v1::BuildIdentity& other :
       {Build("0.1.0", "1c20cae00000"), Build("0.2.0", "3635b2d1a2b3"), v1::BuildIdentity()}) {
    const absl::Status refused = registry.Register(RequestWithBuild(1, other)).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("the worker at 10.0.0.1:7001 runs build ",
                                                          DescribeBuild(other))));
    EXPECT_THAT(refused.message(), HasSubstr("not the coordinator's 0.1.0 (commit 3635b2d1a2b3)"));
    EXPECT_THAT(refused.message(), HasSubstr("--allow-mixed-builds"));
  }
  EXPECT_THAT(registry.List(), IsEmpty());
  EXPECT_THAT(saved, IsEmpty());

  ASSERT_TRUE(registry.Register(RequestWithBuild(1, Build("0.1.0", "3635b2d1a2b3"))).ok());
  EXPECT_EQ(registry.Register(RequestWithBuild(1, Build("0.1.0", "1c20cae00000"))).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<v1::Worker> kept = registry.Get("w-1");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->incarnation(), 1);
  EXPECT_EQ(kept->state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(kept->build().commit(), "3635b2d1a2b3");
  EXPECT_THAT(saved, ElementsAre("w-1/1"));
}

// The same build registers, and so does one whose commit is unknown (an
// unstamped image) when the versions agree; Worker.build says which, and a
// warning says the unstamped one's commit went unchecked (it was silent).
TEST(WorkerRegistryBuildTest, RequiredBuild_SameOrUnknownCommit_RegisteredAndRecorded) {
  FakeClock clock(kStart);
  WorkerRegistry::Options options = MakeOptions(&clock);
  options.required_build = Build("0.1.0", "3635b2d1a2b3");
  WorkerRegistry registry(options);
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(registry.Register(RequestWithBuild(1, Build("0.1.0", "3635b2d1a2b3"))).ok());
  const std::string same = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(same, Not(HasSubstr("unstamped")));
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(registry.Register(RequestWithBuild(2, Build("0.1.0", "unknown"))).ok());
  const std::string unstamped = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(unstamped, HasSubstr("the worker at 10.0.0.2:7001 runs an unstamped build (0.1.0 "
                                   "(commit unknown)): only its version is checked against this "
                                   "coordinator's 0.1.0 (commit 3635b2d1a2b3)"));
  EXPECT_EQ(registry.Get("w-1")->build().commit(), "3635b2d1a2b3");
  EXPECT_EQ(registry.Get("w-2")->build().commit(), "unknown");
  EXPECT_EQ(registry.Get("w-2")->build().version(), "0.1.0");
}

// Without a required build (--allow-mixed-builds) every build registers and
// is recorded as reported.
TEST(WorkerRegistryBuildTest, NoRequiredBuild_AnyBuildRegisteredAndRecorded) {
  FakeClock clock(kStart);
  WorkerRegistry registry(MakeOptions(&clock));
  ASSERT_TRUE(registry.Register(RequestWithBuild(1, Build("0.1.0", "3635b2d1a2b3"))).ok());
  ASSERT_TRUE(registry.Register(RequestWithBuild(2, Build("0.2.0", "1c20cae00000"))).ok());
  ASSERT_TRUE(registry.Register(Request(3)).ok());
  EXPECT_EQ(registry.Get("w-2")->build().version(), "0.2.0");
  EXPECT_EQ(registry.Get("w-2")->build().commit(), "1c20cae00000");
  EXPECT_FALSE(registry.Get("w-3")->has_build());
}

// A worker whose data plane's TLS differs from what the coordinator is set
// up for is refused before anything is stored, naming the flags; matching
// ones register, with TLS or without.
TEST(WorkerRegistryDataPlaneTlsTest, Mismatch_FailedPreconditionNamingTheFlags) {
  FakeClock clock(kStart);
  for (const bool coordinator_tls : {false, true}) {
    SCOPED_TRACE(coordinator_tls);
    WorkerRegistry::Options options = MakeOptions(&clock);
    options.data_plane_tls = coordinator_tls;
    WorkerRegistry registry(options);
    v1::RegisterWorkerRequest other = Request(1);
    other.set_data_plane_tls(!coordinator_tls);
    const absl::Status refused = registry.Register(other).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("the worker at 10.0.0.1:7001 serves its data plane"));
    EXPECT_THAT(refused.message(),
                HasSubstr(coordinator_tls ? "start the worker with --data-tls-cert"
                                          : "give the coordinator --worker-tls-ca"));
    EXPECT_THAT(registry.List(), IsEmpty());
    v1::RegisterWorkerRequest same = Request(2);
    same.set_data_plane_tls(coordinator_tls);
    EXPECT_TRUE(registry.Register(same).ok());
  }
}

TEST(WorkerRegistryCapacityTest, Full_EvictsOldestGoneElseResourceExhausted) {
  FakeClock clock(kStart);
  WorkerRegistry::Options options = MakeOptions(&clock);
  options.max_workers = 2;
  WorkerRegistry registry(options);
  ASSERT_TRUE(registry.Register(Request(1)).ok());
  ASSERT_TRUE(registry.Register(Request(2)).ok());
  absl::Status full = registry.Register(Request(3)).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  // A known address still re-registers when full.
  EXPECT_TRUE(registry.Register(Request(2)).ok());
  ASSERT_TRUE(registry.Deregister("w-1", 1).ok());
  absl::StatusOr<v1::RegisterWorkerResponse> third = registry.Register(Request(3));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->worker_id(), "w-3");  // ids are never reused
  EXPECT_EQ(registry.Get("w-1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.CountByState()[v1::WORKER_STATE_LEFT], 0);
  EXPECT_EQ(registry.CountByState()[v1::WORKER_STATE_READY], 2);
}

// The registry's dropped records leave the store too: an evicted worker's
// at once, and at a restart those past max_workers, keeping the workers
// heard from last.
TEST(WorkerRegistryCapacityTest, EvictedAndOverTheLimitRestored_Forgotten) {
  FakeClock clock(kStart);
  std::vector<std::string> forgotten;
  WorkerRegistry::Options options = MakeOptions(&clock);
  options.max_workers = 2;
  options.forget = [&forgotten](const std::string& id) { forgotten.push_back(id); };
  {
    WorkerRegistry registry(options);
    ASSERT_TRUE(registry.Register(Request(1)).ok());
    ASSERT_TRUE(registry.Register(Request(2)).ok());
    ASSERT_TRUE(registry.Deregister("w-1", 1).ok());
    EXPECT_TRUE(forgotten.empty());
    ASSERT_TRUE(registry.Register(Request(3)).ok());  // evicts w-1
    EXPECT_EQ(forgotten, std::vector<std::string>{"w-1"});
  }
  forgotten.clear();
  std::vector<v1::Worker> saved;
  for (int n = 1; n <= 4; ++n) {
    v1::Worker w;
    w.set_id(absl::StrCat("w-", n));
    w.set_data_address(absl::StrCat("10.0.0.", n, ":7000"));
    w.set_incarnation(1);
    // w-3 heard from last, then w-1, w-4, w-2.
    const int order[] = {0, 30, 10, 40, 20};
    *w.mutable_last_heartbeat() = ToProtoTimestamp(kStart + absl::Seconds(order[n]));
    saved.push_back(w);
  }
  WorkerRegistry restored(options);
  restored.Restore(saved);
  EXPECT_TRUE(restored.Get("w-3").ok());
  EXPECT_TRUE(restored.Get("w-1").ok());
  EXPECT_EQ(restored.Get("w-4").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(restored.Get("w-2").status().code(), absl::StatusCode::kNotFound);
  std::sort(forgotten.begin(), forgotten.end());
  EXPECT_EQ(forgotten, (std::vector<std::string>{"w-2", "w-4"}));
}

// After a restart the LEFT entries, last seen at their stored heartbeats,
// are evicted before the other restored workers (perhaps live when the
// coordinator stopped). Before, every restored entry was seen "now", and
// the tie went to the lowest id: here w-1, which was running a job.
TEST(WorkerRegistryCapacityTest, Restored_EvictsTheLeftOneFirst) {
  FakeClock clock(kStart + absl::Hours(24));
  std::vector<std::string> forgotten;
  WorkerRegistry::Options options = MakeOptions(&clock);
  options.max_workers = 2;
  options.forget = [&forgotten](const std::string& id) { forgotten.push_back(id); };
  std::vector<v1::Worker> saved;
  for (int n = 1; n <= 2; ++n) {
    v1::Worker w;
    w.set_id(absl::StrCat("w-", n));
    w.set_data_address(absl::StrCat("10.0.0.", n, ":7000"));
    w.set_incarnation(1);
    w.set_state(n == 1 ? v1::WORKER_STATE_ASSIGNED : v1::WORKER_STATE_LEFT);
    *w.mutable_last_heartbeat() = ToProtoTimestamp(kStart + absl::Seconds(n));
    saved.push_back(w);
  }
  WorkerRegistry registry(options);
  registry.Restore(saved);
  ASSERT_TRUE(registry.Register(Request(3)).ok());
  EXPECT_EQ(forgotten, std::vector<std::string>{"w-2"});
  EXPECT_TRUE(registry.Get("w-1").ok());
}

// After a restart with the registry full and none LEFT, a restored worker
// not heard from yet is kept for a lease (it may be alive, its registration
// queued): a new address is refused meanwhile, and the restored one comes
// back under its id, drained still. Before, the new address evicted w-1
// (every restored entry seen at the restore, the tie to the lowest id), and
// w-1's process came back as w-4, undrained.
TEST(WorkerRegistryCapacityTest, RestoredUnheardWithinALease_NotEvicted_KeepsIdAndDrain) {
  FakeClock clock(kStart + absl::Hours(24));
  std::vector<std::string> forgotten;
  WorkerRegistry::Options options = MakeOptions(&clock);
  options.max_workers = 2;
  options.forget = [&forgotten](const std::string& id) { forgotten.push_back(id); };
  std::vector<v1::Worker> saved;
  for (int n = 1; n <= 2; ++n) {
    v1::Worker w;
    w.set_id(absl::StrCat("w-", n));
    w.set_data_address(Request(n).data_address());
    w.set_incarnation(1);
    *w.mutable_last_heartbeat() = ToProtoTimestamp(kStart + absl::Seconds(n));
    saved.push_back(w);
  }
  WorkerRegistry registry(options);
  registry.Restore(saved);
  ASSERT_TRUE(registry.MarkDrained("w-1", 1).ok());

  const absl::Status full = registry.Register(Request(3)).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_THAT(full.message(), HasSubstr("2 restored at its restart are kept for a lease, 5s"));
  EXPECT_THAT(forgotten, IsEmpty());

  v1::RegisterWorkerRequest same = Request(1);
  same.set_previous_incarnation(1);
  const absl::StatusOr<v1::RegisterWorkerResponse> back = registry.Register(same);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->worker_id(), "w-1");
  EXPECT_EQ(back->incarnation(), 2);
  const absl::StatusOr<v1::Worker> w1 = registry.Get("w-1");
  ASSERT_TRUE(w1.ok()) << w1.status();
  EXPECT_TRUE(w1->drained());

  // At exactly a lease w-2 is still awaited; past it, not heard from, it is
  // taken for lost and evicted like any LOST entry.
  clock.Advance(options.lease);
  EXPECT_EQ(registry.Register(Request(3)).status().code(), absl::StatusCode::kResourceExhausted);
  clock.Advance(absl::Nanoseconds(1));
  const absl::StatusOr<v1::RegisterWorkerResponse> third = registry.Register(Request(3));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->worker_id(), "w-3");
  EXPECT_EQ(forgotten, std::vector<std::string>{"w-2"});
  EXPECT_EQ(registry.Get("w-2").status().code(), absl::StatusCode::kNotFound);
}

// One LOST worker, w-1 at Request(1)'s address, restored into a registry
// that keeps one, on separate wall and lease clocks.
std::vector<v1::Worker> OneLostWorker() {
  v1::Worker w;
  w.set_id("w-1");
  w.set_data_address(Request(1).data_address());
  w.set_incarnation(1);
  *w.mutable_last_heartbeat() = ToProtoTimestamp(kStart);
  return {w};
}

// The lease after a restore is a duration, judged on the lease clock. Before,
// it was the wall clock's: stepped back an hour after the restart, the
// restored worker was kept for that hour and a lease (a new worker refused,
// the registry full), and unverifiable tokens naming it were still taken.
TEST(WorkerRegistryCapacityTest, RestoredUnheard_WallClockStepsBack_EvictedAfterALease) {
  FakeClock wall(kStart + absl::Hours(24)), steady;
  std::vector<std::string> forgotten;
  WorkerRegistry::Options options = MakeOptions(&wall);
  options.lease_clock = &steady;
  options.max_workers = 1;
  options.forget = [&forgotten](const std::string& id) { forgotten.push_back(id); };
  WorkerRegistry registry(options);
  registry.Restore(OneLostWorker());
  ASSERT_EQ(registry.Register(Request(2)).status().code(), absl::StatusCode::kResourceExhausted);

  steady.Advance(options.lease + absl::Milliseconds(1));
  wall.Advance(-absl::Hours(1));
  EXPECT_FALSE(registry.IsStaleSession("w-1.1.abc"));
  const absl::StatusOr<v1::RegisterWorkerResponse> second = registry.Register(Request(2));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->worker_id(), "w-2");
  EXPECT_EQ(forgotten, std::vector<std::string>{"w-1"});
  EXPECT_EQ(registry.Get("w-1").status().code(), absl::StatusCode::kNotFound);
}

// The converse: the wall clock stepped forward an hour does not end the
// lease after a restore. Before, it ended at once: the new address evicted
// w-1, whose live process then could only come back under a new id, its
// stored record and drain gone.
TEST(WorkerRegistryCapacityTest, RestoredUnheard_WallClockStepsForward_StillKeptForALease) {
  FakeClock wall(kStart + absl::Hours(24)), steady;
  std::vector<std::string> forgotten;
  WorkerRegistry::Options options = MakeOptions(&wall);
  options.lease_clock = &steady;
  options.max_workers = 1;
  options.forget = [&forgotten](const std::string& id) { forgotten.push_back(id); };
  WorkerRegistry registry(options);
  registry.Restore(OneLostWorker());

  steady.Advance(absl::Milliseconds(1));
  wall.Advance(absl::Hours(1));
  EXPECT_TRUE(registry.IsStaleSession("w-1.1.abc"));
  const absl::Status full = registry.Register(Request(2)).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_THAT(full.message(), HasSubstr("1 restored at its restart are kept for a lease, 5s"));
  EXPECT_THAT(forgotten, IsEmpty());

  v1::RegisterWorkerRequest same = Request(1);
  same.set_previous_incarnation(1);
  const absl::StatusOr<v1::RegisterWorkerResponse> back = registry.Register(same);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->worker_id(), "w-1");
  EXPECT_EQ(back->incarnation(), 2);
}

// Records that cannot be restored take none of the room: of two sharing an
// address the older is forgotten (an eviction whose delete failed), and the
// room goes to the next record. Before, the cut came first: w-3 was
// forgotten for the room w-2 then did not use, and w-2 stayed stored.
TEST(WorkerRegistryCapacityTest, Restore_DuplicateAddressForgotten_TakesNoRoom) {
  FakeClock clock(kStart);
  std::vector<std::string> forgotten;
  WorkerRegistry::Options options = MakeOptions(&clock);
  options.max_workers = 2;
  options.forget = [&forgotten](const std::string& id) { forgotten.push_back(id); };
  std::vector<v1::Worker> saved;
  for (int n = 1; n <= 3; ++n) {
    v1::Worker w;
    w.set_id(absl::StrCat("w-", n));
    // w-1 and w-2 share an address; w-1 is the newer.
    w.set_data_address(n == 3 ? "10.0.0.3:7000" : "10.0.0.1:7000");
    w.set_incarnation(1);
    *w.mutable_last_heartbeat() = ToProtoTimestamp(kStart - absl::Seconds(n));
    saved.push_back(w);
  }
  WorkerRegistry registry(options);
  registry.Restore(saved);
  EXPECT_TRUE(registry.Get("w-1").ok());
  EXPECT_TRUE(registry.Get("w-3").ok());
  EXPECT_EQ(registry.Get("w-2").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(forgotten, std::vector<std::string>{"w-2"});
}

}  // namespace
}  // namespace pipetrain
