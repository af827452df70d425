// JobRunner without sockets: two runners joined by the in-process transport
// report to a fake coordinator link.
#include "worker/agent/job_runner.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/data_plane_keys.h"
#include "common/errno_status.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "coordinator/planner/device_links.h"
#include "coordinator/planner/partition.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "worker/agent/backoff.h"
#include "worker/data/corpus.h"
#include "worker/data/token_file.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/forwarding_backend.h"
#include "worker/model/gpt_model.h"
#include "worker/model/weights_io.h"
#include "worker/runtime/in_process_device_channel.h"
#include "worker/runtime/in_process_device_collective.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

// Records what runners send; thread-safe (runners call it from their threads).
class FakeLink : public CoordinatorLink {
 public:
  explicit FakeLink(int stages = 2) : stages_(stages) {}
  // A start barrier over `stages` distinct workers; other reports are kept.
  absl::StatusOr<v1::ReportProgressResponse> ReportProgress(
      const v1::ReportProgressRequest& r) override {
    std::lock_guard<std::mutex> lock(mu_);
    v1::ReportProgressResponse response;
    if (ended_) {  // kept, and answered as the coordinator answers once a job ended
      reports_.push_back(r);
      changed_.notify_all();
      return absl::FailedPreconditionError(
          absl::StrCat("job ", r.job_id(), " already ended (CANCELLED)"));
    }
    if (r.ready() && ready_fail_left_ > 0) {
      --ready_fail_left_;
      ++failed_;
      return absl::UnavailableError("the coordinator is not there");
    }
    if (r.ready()) {
      ready_.insert(r.worker_id());
      ready_reports_.push_back(r);
      response.set_all_ready(static_cast<int>(ready_.size()) >= stages_);
      return response;
    }
    if (!r.has_checkpoint() && r.error().empty() && fail_left_ > 0) {
      --fail_left_;
      ++failed_;
      return absl::Status(fail_code_, fail_message_);
    }
    if (r.has_checkpoint() && checkpoint_fail_left_ > 0) {
      --checkpoint_fail_left_;
      ++failed_;
      return absl::UnavailableError("the coordinator is not there");
    }
    response.set_stop_after_step(stop_after_step_);
    reports_.push_back(r);
    changed_.notify_all();
    return response;
  }
  absl::Status UploadWeights(const std::string& job_id, const std::vector<Parameter*>& params,
                             CallCancel* cancel) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (stall_uploads_) {
      // As a gRPC stream held by flow control: only a cancel ends it.
      bool cancelled = false;
      const CallCancel::Scope scope(cancel, [&] {
        std::lock_guard<std::mutex> inner(cancel_mu_);
        cancelled = true;
        cancel_cv_.notify_all();
      });
      if (!scope.active()) return absl::CancelledError("cancelled");
      ++uploads_stalled_;
      changed_.notify_all();
      lock.unlock();
      std::unique_lock<std::mutex> wait(cancel_mu_);
      cancel_cv_.wait(wait, [&] { return cancelled; });
      return absl::CancelledError("cancelled");
    }
    ++upload_attempts_;
    if (upload_fail_left_ > 0) {
      --upload_fail_left_;
      ++failed_;
      // A stream that ran a while before it broke (a large stage's).
      if (upload_fail_after_ > absl::ZeroDuration()) {
        lock.unlock();
        absl::SleepFor(upload_fail_after_);
        lock.lock();
      }
      // Part of the tensors got through before the stream broke.
      if (!params.empty()) uploaded_.push_back(params[0]->name);
      return absl::Status(upload_fail_code_, "the upload stream broke");
    }
    for (const Parameter* p : params) uploaded_.push_back(p->name);
    return absl::OkStatus();
  }
  // The next `n` weights uploads fail with `code` after the first tensor,
  // each `after` into its stream.
  void FailUploads(int n, absl::StatusCode code, absl::Duration after = absl::ZeroDuration()) {
    std::lock_guard<std::mutex> lock(mu_);
    upload_fail_left_ = n;
    upload_fail_code_ = code;
    upload_fail_after_ = after;
  }
  int upload_attempts() {
    std::lock_guard<std::mutex> lock(mu_);
    return upload_attempts_;
  }
  // Uploads block from now on until cancelled (CallCancel).
  void StallUploads() {
    std::lock_guard<std::mutex> lock(mu_);
    stall_uploads_ = true;
  }
  // Waits (bounded) until an upload is stalled.
  bool AwaitStalledUpload() {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(30), [&] { return uploads_stalled_ > 0; });
  }
  // Waits (bounded) until `n` reports arrived.
  bool AwaitReports(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(30), [&] { return reports_.size() >= n; });
  }
  std::vector<v1::ReportProgressRequest> reports() {
    std::lock_guard<std::mutex> lock(mu_);
    return reports_;
  }
  std::vector<v1::ReportProgressRequest> ready_reports() {
    std::lock_guard<std::mutex> lock(mu_);
    return ready_reports_;
  }
  std::vector<std::string> uploaded() {
    std::lock_guard<std::mutex> lock(mu_);
    return uploaded_;
  }
  // The next `n` iteration reports fail with `code` and `message` (not kept).
  void FailIterationReports(int n, absl::StatusCode code,
                            std::string message = "the coordinator is not there") {
    std::lock_guard<std::mutex> lock(mu_);
    fail_left_ = n;
    fail_code_ = code;
    fail_message_ = std::move(message);
  }
  // The next `n` start-barrier reports fail UNAVAILABLE.
  void FailReadyReports(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    ready_fail_left_ = n;
  }
  // Every report is answered "already ended" from now on (and kept).
  void EndTheJob() {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
  }
  // Iteration reports are answered with a re-plan after `step`
  // (ReportProgressResponse.stop_after_step) from now on.
  void StopAfterStep(int64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    stop_after_step_ = step;
  }
  // The next `n` checkpoint reports fail UNAVAILABLE (not kept).
  void FailCheckpointReports(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    checkpoint_fail_left_ = n;
  }
  int failed() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }

 private:
  bool ended_ = false;
  bool stall_uploads_ = false;
  int upload_attempts_ = 0;
  int upload_fail_left_ = 0;
  absl::StatusCode upload_fail_code_ = absl::StatusCode::kUnavailable;
  absl::Duration upload_fail_after_ = absl::ZeroDuration();
  int uploads_stalled_ = 0;
  std::mutex cancel_mu_;
  std::condition_variable cancel_cv_;
  int fail_left_ = 0;
  int checkpoint_fail_left_ = 0;
  int ready_fail_left_ = 0;
  int failed_ = 0;
  absl::StatusCode fail_code_ = absl::StatusCode::kUnavailable;
  std::string fail_message_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<v1::ReportProgressRequest> reports_;
  std::vector<std::string> uploaded_;
  std::vector<v1::ReportProgressRequest> ready_reports_;  // answered
  std::set<std::string> ready_;
  const int stages_;
  int64_t stop_after_step_ = 0;
};

// Polls `runner`'s observable state until its thread is done, for at most
// 30 s: false if it never was (the test fails instead of hanging).
bool AwaitFinished(const JobRunner& runner) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!runner.finished() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  return runner.finished();
}

// Lists a data-plane address per worker of `a` (replicas x stages x tensor
// ranks) and gives `a` its data-plane keys, as the coordinator does; the
// in-process fabric ignores both.
void SetPeers(v1::Assignment* a) {
  a->clear_peer_addresses();
  const int workers = AssignmentWorkerCount(*a);
  for (int w = 0; w < workers; ++w) a->add_peer_addresses(absl::StrCat("in-process:", w));
  const DataPlaneKeys keys =
      DeriveWorkerDataPlaneKeys("secret", DataPlaneJobId(*a), GlobalWorkerIndex(*a), workers);
  a->set_data_plane_receive_key(keys.receive_key);
  a->clear_data_plane_send_keys();
  for (const std::string& key : keys.send_keys) a->add_data_plane_send_keys(key);
}

v1::Assignment Assignment(int stage, int steps, bool weights, Schedule schedule) {
  v1::Assignment a;
  a.set_action(v1::Assignment::ACTION_RUN);
  a.set_job_id("job-r");
  a.set_plan_version(1);
  v1::JobSpec* spec = a.mutable_spec();
  spec->mutable_model()->set_n_layer(1);
  spec->mutable_model()->set_n_head(2);
  spec->mutable_model()->set_d_model(16);
  spec->mutable_training()->set_seq_len(8);
  spec->mutable_training()->set_batch_size(4);
  spec->mutable_training()->set_micro_batches(2);
  spec->mutable_training()->set_steps(steps);
  spec->mutable_data()->set_synthetic_bytes(5000);
  spec->mutable_parallelism()->set_stages(2);
  if (weights) {
    spec->mutable_output()->set_weights_path("w.st");  // the coordinator's to write
  }
  const std::vector<Range> ranges = {{0, 2}, {2, 4}};
  a.set_stage(stage);
  a.set_num_stages(2);
  a.mutable_backward_units()->set_begin(ranges[stage].begin);
  a.mutable_backward_units()->set_end(ranges[stage].end);
  *a.mutable_forward_units() = a.backward_units();
  *a.mutable_program() = CompilePrograms(ranges, 4, 2, schedule).value()[stage];
  SetPeers(&a);
  return a;
}

// Reports are sent again for 60 s, or for the worker's lease and one
// heartbeat when longer (at most a day), whatever the coordinator sent.
TEST(ReportRetryForLeaseTest, SixtySecondsOrTheLeaseAndAHeartbeat) {
  EXPECT_EQ(ReportRetryForLease(absl::Seconds(5), absl::Seconds(1)), absl::Seconds(60));
  EXPECT_EQ(ReportRetryForLease(absl::Seconds(300), absl::Seconds(2)), absl::Seconds(302));
  EXPECT_EQ(ReportRetryForLease(absl::ZeroDuration(), absl::Seconds(1)), absl::Seconds(60));
  EXPECT_EQ(ReportRetryForLease(absl::Hours(30), absl::Seconds(1)), absl::Hours(24));
  EXPECT_EQ(ReportRetryForLease(absl::InfiniteDuration(), absl::InfiniteDuration()),
            absl::Hours(24));
  EXPECT_EQ(ReportRetryForLease(absl::Hours(23), absl::InfiniteDuration()), absl::Hours(24));
  EXPECT_EQ(ReportRetryForLease(absl::Seconds(-3), absl::Seconds(1)), absl::Seconds(60));
}

// A report is sent again about 0.5 s, 1 s, 2 s and then 4 s apart, each
// wait scaled into [1 - jitter, 1] (STYLE.md item 8); exactly those
// without jitter.
TEST(ReportRetryBackoffTest, DoublesToEightTimesTheFirstWait_Jittered) {
  JobRunnerOptions options;
  options.retry_seed = 7;
  Backoff jittered(ReportRetryBackoff(options));
  options.retry_jitter = 0;
  Backoff exact(ReportRetryBackoff(options));
  for (const double base : {0.5, 1.0, 2.0, 4.0, 4.0, 4.0}) {
    const absl::Duration wait = jittered.Next();
    EXPECT_LE(wait, absl::Seconds(base));
    EXPECT_GE(wait, absl::Seconds(base / 2));
    EXPECT_EQ(exact.Next(), absl::Seconds(base));
  }
}

// Each runner's options draw a seed of their own: the stages of a job,
// which report at the same step boundary, no longer retry in lockstep
// after the coordinator went away (W calls at +0.5 s, +1.5 s, ...).
TEST(ReportRetryBackoffTest, TwoRunnersOptions_DifferentWaits) {
  const JobRunnerOptions a, b;
  EXPECT_NE(a.retry_seed, b.retry_seed);
  Backoff x(ReportRetryBackoff(a)), y(ReportRetryBackoff(b));
  bool differs = false;
  for (int i = 0; i < 5; ++i) differs = differs || x.Next() != y.Next();
  EXPECT_TRUE(differs);
}

// The start barrier polls at least 20 ms and a tenth of the time waited
// apart, at most 1 s, each wait scaled into [1 - jitter, 1] by the seed;
// the same for the same arguments.
TEST(StartBarrierPollDelayTest, GrowsWithTheWait_CappedAndJittered) {
  const std::pair<absl::Duration, absl::Duration> cases[] = {  // waited, the longest delay
      {absl::ZeroDuration(), absl::Milliseconds(20)},
      {absl::Milliseconds(150), absl::Milliseconds(20)},
      {absl::Seconds(1), absl::Milliseconds(100)},
      {absl::Seconds(5), absl::Milliseconds(500)},
      {absl::Seconds(10), absl::Seconds(1)},
      {absl::Minutes(10), absl::Seconds(1)},
      {absl::InfiniteDuration(), absl::Seconds(1)},
      {-absl::Seconds(1), absl::Milliseconds(20)}};
  for (const auto& [waited, base] : cases) {
    SCOPED_TRACE(absl::FormatDuration(waited));
    for (uint32_t poll = 0; poll < 100; ++poll) {
      const absl::Duration delay = StartBarrierPollDelay(waited, 7, poll, 0.5);
      EXPECT_LE(delay, base);
      EXPECT_GE(delay, base / 2);
      EXPECT_EQ(delay, StartBarrierPollDelay(waited, 7, poll, 0.5));
    }
    EXPECT_EQ(StartBarrierPollDelay(waited, 7, 0, 0.0), base);
  }
}

// Two workers' seeds give different waits for the same poll, so workers
// waiting together do not poll at the same instants.
TEST(StartBarrierPollDelayTest, TwoSeeds_DifferentDelays) {
  int differ = 0;
  for (uint32_t poll = 0; poll < 10; ++poll) {
    differ += StartBarrierPollDelay(absl::Minutes(1), 1, poll, 0.5) !=
              StartBarrierPollDelay(absl::Minutes(1), 2, poll, 0.5);
  }
  EXPECT_GE(differ, 9);
}

// Over the barrier's 10-minute wait a worker polls about once a second
// (20 ms apart before: 30,000 reports, each taking the coordinator's job
// lock), and one whose peers come after a short gap still sees them
// within about a tenth of it (or 20 ms).
TEST(StartBarrierPollDelayTest, TenMinutesWait_AboutOncePerSecond) {
  absl::Duration waited;
  int polls = 0;
  while (waited < absl::Minutes(10)) {
    const absl::Duration delay = StartBarrierPollDelay(waited, 11, polls++, 0.5);
    EXPECT_LE(delay, std::max(absl::Milliseconds(20), waited / 10));
    waited += delay;
  }
  EXPECT_GT(polls, 600);
  EXPECT_LT(polls, 1000);
}

TEST(JobRunnerTest, TwoStages_ReportEveryIterationUploadWeightsAndFinish) {
  InProcessFabric fabric(2);
  FakeLink link;
  std::vector<std::unique_ptr<JobRunner>> runners;
  for (int s = 0; s < 2; ++s) {
    auto factory = [&fabric](int stage, const std::vector<std::string>&, const JobCredential&) {
      return fabric.Connect(stage);
    };
    runners.push_back(std::make_unique<JobRunner>(Assignment(s, 3, true, Schedule::kOneFOneB),
                                                  &fabric.mailbox(s), factory, &link,
                                                  JobRunnerOptions{"w" + std::to_string(s), 1}));
  }
  for (auto& r : runners) r->Start();
  ASSERT_TRUE(link.AwaitReports(6));
  for (auto& r : runners) r->Stop();
  int finished = 0, with_losses = 0;
  for (const auto& r : link.reports()) {
    EXPECT_TRUE(r.error().empty()) << r.error();
    finished += r.finished();
    with_losses += r.micro_batch_losses_size() == 2;
  }
  EXPECT_EQ(finished, 2);     // each stage's last iteration
  EXPECT_EQ(with_losses, 3);  // the head stage, every iteration
  std::vector<std::string> names = link.uploaded();
  // One copy of the tied wte.weight, the embedding stage's (the head's
  // stage holds another: both went into one file, chunk by chunk).
  EXPECT_EQ(std::count(names.begin(), names.end(), "wte.weight"), 1);
  EXPECT_TRUE(runners[0]->finished() && runners[1]->finished());
}

// A report the coordinator could not take (UNAVAILABLE: a restart, a
// leader change) is sent again, and the stages train on; an error that
// says the report is wrong is not retried.
TEST(JobRunnerTest, UnavailableReports_SentAgain_OtherErrorsNot) {
  for (const absl::StatusCode code :
       {absl::StatusCode::kUnavailable, absl::StatusCode::kInvalidArgument}) {
    InProcessFabric fabric(2);
    FakeLink link;
    link.FailIterationReports(code == absl::StatusCode::kUnavailable ? 2 : 100, code);
    std::vector<std::unique_ptr<JobRunner>> runners;
    for (int s = 0; s < 2; ++s) {
      auto factory = [&fabric](int stage, const std::vector<std::string>&, const JobCredential&) {
        return fabric.Connect(stage);
      };
      runners.push_back(std::make_unique<JobRunner>(Assignment(s, 2, false, Schedule::kOneFOneB),
                                                    &fabric.mailbox(s), factory, &link,
                                                    JobRunnerOptions{"w" + std::to_string(s), 1}));
    }
    for (auto& r : runners) r->Start();
    if (code == absl::StatusCode::kUnavailable) {
      ASSERT_TRUE(link.AwaitReports(4));  // each stage's two iterations, once each
      for (auto& r : runners) r->Stop();
      EXPECT_EQ(link.failed(), 2);
      for (const auto& r : link.reports()) EXPECT_TRUE(r.error().empty()) << r.error();
      EXPECT_TRUE(runners[0]->finished() && runners[1]->finished());
    } else {
      // Only error reports get through this link (it refuses the others),
      // so one stored is a stage's error (or a peer's).
      ASSERT_TRUE(link.AwaitReports(1));
      for (auto& r : runners) r->Stop();
      EXPECT_GE(link.failed(), 1);  // a refused report is what ended it
      EXPECT_LE(link.failed(), 2);  // one attempt each, no retry
    }
  }
}

// A transport over `inner` that counts its aborts in `aborts`, and whose
// sends, by `mode`:
//   kDeliver      go to `inner`;
//   kStall        wait, as a gRPC send to a stalled peer does, until
//                 Abort() (or a minute): then ABORTED;
//   kUndelivered  are queued at once and never delivered (a peer that
//                 stalled): the destructor waits for them, as
//                 GrpcTransport's shutdown lets each peer's queued frames
//                 drain for a while, until Abort() (or a minute).
class AbortCounting : public Transport {
 public:
  enum class Mode { kDeliver, kStall, kUndelivered };
  AbortCounting(std::unique_ptr<Transport> inner, std::atomic<int>* aborts, Mode mode)
      : inner_(std::move(inner)), aborts_(aborts), mode_(mode) {}
  ~AbortCounting() override {
    if (mode_ != Mode::kUndelivered) return;
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait_for(lock, std::chrono::seconds(60), [this] { return aborted_; });
  }
  int stage() const override { return inner_->stage(); }
  absl::Status SendWire(int peer, const TensorAddress& address, const WireTensor& wire) override {
    if (mode_ == Mode::kDeliver) return inner_->SendWire(peer, address, wire);
    if (mode_ == Mode::kUndelivered) return absl::OkStatus();
    std::unique_lock<std::mutex> lock(mu_);
    ++waiting_;
    changed_.notify_all();
    changed_.wait_for(lock, std::chrono::seconds(60), [this] { return aborted_; });
    return aborted_ ? absl::AbortedError("aborted") : absl::DeadlineExceededError("stalled");
  }
  absl::StatusOr<WireTensor> RecvWire(int peer, const TensorAddress& address,
                                      absl::Duration timeout) override {
    return inner_->RecvWire(peer, address, timeout);
  }
  void Abort() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted_ = true;
      ++*aborts_;
      changed_.notify_all();
    }
    inner_->Abort();
  }
  // kStall: whether a send waits (within 30 s).
  bool AwaitWaiting() {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(30), [this] { return waiting_ > 0; });
  }

 private:
  std::unique_ptr<Transport> inner_;
  std::atomic<int>* const aborts_;
  const Mode mode_;
  std::mutex mu_;
  std::condition_variable changed_;
  int waiting_ = 0;
  bool aborted_ = false;
};

// Stop() aborts the transport of a job that has not completed: stage 0's
// first send waits for a peer that takes nothing, and the runner ends at
// once instead of after the transport's own timeout.
TEST(JobRunnerTest, Stop_AbortsARunnerBlockedInASend) {
  InProcessFabric fabric(2);
  FakeLink link(/*stages=*/1);
  std::atomic<AbortCounting*> stalled{nullptr};
  std::atomic<int> aborts{0};
  auto factory = [&](int stage, const std::vector<std::string>&, const JobCredential&) {
    auto t = std::make_unique<AbortCounting>(fabric.Connect(stage), &aborts,
                                             AbortCounting::Mode::kStall);
    stalled.store(t.get());
    return std::unique_ptr<Transport>(std::move(t));
  };
  JobRunner sender(Assignment(0, 3, false, Schedule::kGPipe), &fabric.mailbox(0), factory, &link,
                   JobRunnerOptions{"w", 1, absl::Seconds(60)});
  sender.Start();
  while (stalled.load() == nullptr) std::this_thread::yield();  // bounded: made at the start
  ASSERT_TRUE(stalled.load()->AwaitWaiting());  // alive: the runner is stuck in its send
  sender.Stop();
  EXPECT_TRUE(sender.finished());
  // The send ended by Abort, not by its own timeout (60 s). The runner's
  // way out aborts too, whatever Stop() did: Abort is idempotent.
  EXPECT_GE(aborts.load(), 1);
  for (const v1::ReportProgressRequest& r : link.reports()) {
    EXPECT_TRUE(r.error().empty()) << "a stopped job reports nothing: " << r.error();
  }
}

// A stage that fails (its receive times out) with sends queued for a
// stalled peer aborts its transport before tearing it down: the queued
// frames of a failed plan are of no use, and waiting for them (a minute
// here) would hold this worker from its next plan.
TEST(JobRunnerTest, FailedStage_AbortsItsQueuedSends) {
  InProcessFabric fabric(2);
  FakeLink link(/*stages=*/1);  // the barrier opens for stage 0 alone
  std::atomic<int> aborts{0};
  auto factory = [&](int stage, const std::vector<std::string>&, const JobCredential&) {
    return std::unique_ptr<Transport>(std::make_unique<AbortCounting>(
        fabric.Connect(stage), &aborts, AbortCounting::Mode::kUndelivered));
  };
  // GPipe: stage 0 sends its activations and then waits for gradients
  // that never come: its receive fails after 200 ms.
  JobRunner sender(Assignment(0, 3, false, Schedule::kGPipe), &fabric.mailbox(0), factory, &link,
                   JobRunnerOptions{"w", 1, absl::Milliseconds(200)});
  sender.Start();
  ASSERT_TRUE(AwaitFinished(sender));
  EXPECT_EQ(aborts.load(), 1);  // torn down by Abort, not after the wait for delivery
  ASSERT_FALSE(link.reports().empty());
  EXPECT_NE(link.reports().back().error().find("recv ACTIVATION_GRAD"), std::string::npos)
      << link.reports().back().error();
  sender.Stop();
}

// Stages that complete leave their transports to deliver (a peer may
// still be taking their last sends): no abort.
TEST(JobRunnerTest, CompletedStages_DoNotAbortTheirTransports) {
  InProcessFabric fabric(2);
  FakeLink link;
  std::atomic<int> aborts{0};
  std::vector<std::unique_ptr<JobRunner>> runners;
  for (int s = 0; s < 2; ++s) {
    auto factory = [&](int stage, const std::vector<std::string>&, const JobCredential&) {
      return std::unique_ptr<Transport>(std::make_unique<AbortCounting>(
          fabric.Connect(stage), &aborts, AbortCounting::Mode::kDeliver));
    };
    runners.push_back(std::make_unique<JobRunner>(Assignment(s, 2, false, Schedule::kOneFOneB),
                                                  &fabric.mailbox(s), factory, &link,
                                                  JobRunnerOptions{"w" + std::to_string(s), 1}));
  }
  for (auto& r : runners) r->Start();
  for (auto& r : runners) {
    ASSERT_TRUE(AwaitFinished(*r));
    EXPECT_TRUE(r->completed());
  }
  EXPECT_EQ(aborts.load(), 0);
  for (auto& r : runners) r->Stop();
}

TEST(JobRunnerTest, Stop_AbortsARunnerBlockedInAReceive) {
  InProcessFabric fabric(2);
  FakeLink link(/*stages=*/1);  // the barrier opens for the one runner here
  auto factory = [&fabric](int stage, const std::vector<std::string>&, const JobCredential&) {
    return fabric.Connect(stage);
  };
  // Only stage 1 runs: its first instruction waits for stage 0's activation
  // forever (deadline 60 s), until Stop() aborts it.
  JobRunner lonely(Assignment(1, 3, false, Schedule::kGPipe), &fabric.mailbox(1), factory, &link,
                   JobRunnerOptions{"w", 1, absl::Seconds(60)});
  lonely.Start();
  for (int i = 0; i < 3000 && lonely.current_instruction().rfind("recv", 0) != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));  // polls an observable state
  }
  EXPECT_EQ(lonely.current_instruction(), "recv ACTIVATION unit 1 mb 0 from stage 0");
  lonely.Stop();
  EXPECT_TRUE(lonely.finished());
  EXPECT_TRUE(link.reports().empty());  // a stop is not a failure to report
}

TEST(JobRunnerTest, BadSpec_IsReportedAsTheJobsError) {
  InProcessFabric fabric(2);
  FakeLink link;
  v1::Assignment a = Assignment(0, 3, false, Schedule::kGPipe);
  a.mutable_spec()->mutable_model()->set_n_head(3);
  JobRunner runner(
      a, &fabric.mailbox(0),
      [&fabric](int s, const std::vector<std::string>&, const JobCredential&) {
        return fabric.Connect(s);
      },
      &link, JobRunnerOptions{"w", 1});
  runner.Start();
  ASSERT_TRUE(link.AwaitReports(1));
  runner.Stop();
  EXPECT_NE(link.reports()[0].error().find("spec.model.n_head"), std::string::npos)
      << link.reports()[0].error();
}

// Holds a failure's report until released (an unreachable coordinator
// being retried), and says when one arrived.
class HeldErrorReportLink : public CoordinatorLink {
 public:
  absl::StatusOr<v1::ReportProgressResponse> ReportProgress(
      const v1::ReportProgressRequest& r) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!r.error().empty()) {
      error_arrived_ = true;
      changed_.notify_all();
      changed_.wait(lock, [&] { return released_; });
    }
    return v1::ReportProgressResponse();
  }
  absl::Status UploadWeights(const std::string&, const std::vector<Parameter*>&,
                             CallCancel*) override {
    return absl::OkStatus();
  }
  bool AwaitErrorReport() {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(30), [&] { return error_arrived_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool error_arrived_ = false;
  bool released_ = false;
};

// Heartbeats show what a runner does: one that failed and is reporting it
// does not say "starting" (it did before, for up to a minute of retries).
TEST(JobRunnerTest, ReportingAFailure_InstructionSaysEndingNotStarting) {
  InProcessFabric fabric(2);
  HeldErrorReportLink link;
  v1::Assignment a = Assignment(0, 3, false, Schedule::kGPipe);
  a.mutable_spec()->mutable_model()->set_n_head(3);  // refused: a failure to report
  JobRunner runner(
      a, &fabric.mailbox(0),
      [&fabric](int s, const std::vector<std::string>&, const JobCredential&) {
        return fabric.Connect(s);
      },
      &link, JobRunnerOptions{"w", 1});
  EXPECT_EQ(runner.current_instruction(), "starting");
  runner.Start();
  ASSERT_TRUE(link.AwaitErrorReport());
  EXPECT_TRUE(absl::StartsWith(runner.current_instruction(), "ending:"))
      << runner.current_instruction();
  link.Release();
  runner.Stop();
  EXPECT_EQ(runner.current_instruction(), "idle");
}

// The production transport (GrpcTransport) needs this worker's address in
// the peer list: an assignment without one fails the job with
// INVALID_ARGUMENT before any transport is made, instead of reaching that
// transport's CHECK.
// Runs `a`, which must be refused, with a transport factory that counts
// its calls (and returns null where GrpcTransport would CHECK-fail on too
// few peers): the error the job reports, and how many transports it made.
std::pair<std::string, int> RefusedAssignment(const v1::Assignment& a) {
  InProcessFabric fabric(2);
  FakeLink link(/*stages=*/1);
  std::atomic<int> made{0};
  JobRunner runner(
      a, &fabric.mailbox(0),
      [&](int s, const std::vector<std::string>& peers,
          const JobCredential&) -> std::unique_ptr<Transport> {
        ++made;
        if (s >= static_cast<int>(peers.size())) return nullptr;
        return fabric.Connect(s);
      },
      &link, JobRunnerOptions{"w", 1});
  runner.Start();
  EXPECT_TRUE(link.AwaitReports(1));
  runner.Stop();
  return {link.reports().empty() ? "" : link.reports()[0].error(), made.load()};
}

TEST(JobRunnerTest, NoPeerAddresses_InvalidArgumentBeforeAnyTransport) {
  v1::Assignment a = Assignment(0, 3, false, Schedule::kGPipe);
  a.clear_peer_addresses();
  const auto [error, made] = RefusedAssignment(a);
  EXPECT_EQ(made, 0);
  EXPECT_EQ(error.rfind("INVALID_ARGUMENT: assignment: stage 0 of 2", 0), 0u) << error;
  EXPECT_NE(error.find("with 0 peer addresses (want replicas x stages x tensor ranks)"),
            std::string::npos)
      << error;
}

// The layout is checked before the corpus is loaded (up to a third of the
// worker's memory, and hashed): a malformed assignment reported the data
// file's error, after loading it, instead of its own.
TEST(JobRunnerTest, BadLayoutAndAMissingDataFile_TheLayoutIsReported) {
  v1::Assignment a = Assignment(0, 3, false, Schedule::kGPipe);
  a.clear_peer_addresses();
  a.mutable_spec()->mutable_data()->set_path("no/such/corpus.txt");
  const auto [error, made] = RefusedAssignment(a);
  EXPECT_EQ(made, 0);
  EXPECT_EQ(error.rfind("INVALID_ARGUMENT: assignment: stage 0 of 2", 0), 0u) << error;
}

// Layout factors whose product wraps int64 to 0 (2^21 x 2^21 x 2^22 = 2^64)
// "matched" an empty peer list; each factor is now bounded on its own, so
// the job fails with INVALID_ARGUMENT naming the field, before any
// transport (GrpcTransport would CHECK-fail on the empty list).
TEST(JobRunnerTest, LayoutFactorsWrappingToZero_InvalidArgumentBeforeAnyTransport) {
  v1::Assignment a = Assignment(0, 3, false, Schedule::kGPipe);
  a.set_replicas(1 << 21);
  a.set_num_stages(1 << 21);
  a.set_tensor_parallel(1 << 22);
  a.clear_peer_addresses();
  const auto [error, made] = RefusedAssignment(a);
  EXPECT_EQ(made, 0);
  EXPECT_EQ(error, "INVALID_ARGUMENT: assignment: num_stages 2097152 is out of range [1, 1024]");
}

TEST(CheckAssignmentLayoutTest, EachFactorAndTheirProductAreBounded) {
  v1::Assignment a = Assignment(0, 3, false, Schedule::kGPipe);
  EXPECT_TRUE(CheckAssignmentLayout(a).ok());
  v1::Assignment replicas = a;
  replicas.set_replicas(1025);
  EXPECT_EQ(CheckAssignmentLayout(replicas).message(),
            "assignment: replicas 1025 is out of range [0, 1024]");
  v1::Assignment tensor = a;
  tensor.set_tensor_parallel(65);
  EXPECT_EQ(CheckAssignmentLayout(tensor).message(),
            "assignment: tensor_parallel 65 is out of range [0, 64]");
  v1::Assignment negative = a;
  negative.set_num_stages(-2);
  EXPECT_EQ(CheckAssignmentLayout(negative).message(),
            "assignment: num_stages -2 is out of range [1, 1024]");
  v1::Assignment product = a;  // each factor within its bound, not their product
  product.set_replicas(64);
  product.set_num_stages(32);
  SetPeers(&product);
  EXPECT_EQ(CheckAssignmentLayout(product).message(),
            "assignment: 64 replicas x 32 stages x 1 tensor ranks is 2048 workers; at most 1024");
  EXPECT_EQ(CheckAssignmentLayout(product).code(), absl::StatusCode::kInvalidArgument);
}

// A one-stage job of Assignment()'s model: the whole model on stage 0.
v1::Assignment OneStageAssignment(int steps, bool weights = false) {
  v1::Assignment a = Assignment(0, steps, weights, Schedule::kGPipe);
  a.mutable_spec()->mutable_parallelism()->set_stages(1);
  a.set_num_stages(1);
  SetPeers(&a);
  a.mutable_backward_units()->set_begin(0);
  a.mutable_backward_units()->set_end(4);
  *a.mutable_forward_units() = a.backward_units();
  *a.mutable_program() = CompilePrograms({{0, 4}}, 4, 2, Schedule::kGPipe).value()[0];
  return a;
}

// Connects each runner to its stage of `fabric` (which must outlive them).
TransportFactory FabricTransports(InProcessFabric& fabric) {
  return [&fabric](int s, const std::vector<std::string>&, const JobCredential&) {
    return fabric.Connect(s);
  };
}

// Runs `a` alone (stage 0 of an in-process fabric of one) with `options`
// until its first report, and returns that report.
v1::ReportProgressRequest FirstReportOfOneStage(const v1::Assignment& a, JobRunnerOptions options) {
  InProcessFabric fabric(1);
  FakeLink link(1);
  JobRunner runner(a, &fabric.mailbox(0), FabricTransports(fabric), &link, std::move(options));
  runner.Start();
  EXPECT_TRUE(link.AwaitReports(1));
  runner.Stop();
  return link.reports().empty() ? v1::ReportProgressRequest() : link.reports()[0];
}

// A fresh directory under TEST_TMPDIR.
std::string FreshDir(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  EXPECT_EQ(mkdir(dir.c_str(), 0700), 0) << dir;
  return dir;
}

// spec.data.path "x.bin" is a link to an extension-less (content-addressed)
// uint16 file. `train-local --data x.bin` reads it as uint16 (its format
// is detected from the name given); so must the worker, which opens the
// link's real path under its --data-root: as text, this vocabulary of 64
// would not even load ("text format needs a byte vocabulary").
TEST(JobRunnerTest, DataPathLinkNamedBin_LoadsAsUint16LikeTrainLocal) {
  const std::string root = FreshDir("data-link");
  std::vector<uint16_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 64);
  ASSERT_TRUE(WriteUint16TokenFile(root + "/3f9a0c1e", tokens, /*with_header=*/false).ok());
  ASSERT_EQ(symlink("3f9a0c1e", (root + "/x.bin").c_str()), 0);
  v1::Assignment a = OneStageAssignment(1);
  a.mutable_spec()->mutable_model()->set_vocab_size(64);
  a.mutable_spec()->mutable_data()->clear_synthetic_bytes();
  a.mutable_spec()->mutable_data()->set_path("x.bin");
  JobRunnerOptions options{"w", 1};
  options.data_roots = {root};
  const v1::ReportProgressRequest report = FirstReportOfOneStage(a, options);
  EXPECT_EQ(report.error(), "");
  EXPECT_TRUE(report.finished());
  EXPECT_EQ(report.micro_batch_losses_size(), 2);
}

// An error quoting bytes that are not UTF-8 (here a --data-root named in
// Latin-1; a peer's gRPC status message can carry any bytes too) is
// reported as UTF-8: the report's error is a proto string the coordinator
// refuses to parse otherwise, and the failure would be lost.
TEST(JobRunnerTest, ErrorQuotingBytesNotUtf8_ReportedEscapedAndParses) {
  const std::string root = FreshDir("data-caf\xe9");
  v1::Assignment a = OneStageAssignment(1);
  a.mutable_spec()->mutable_data()->clear_synthetic_bytes();
  a.mutable_spec()->mutable_data()->set_path("missing.bin");
  JobRunnerOptions options{"w", 1};
  options.data_roots = {root};
  const v1::ReportProgressRequest report = FirstReportOfOneStage(a, options);
  ASSERT_FALSE(report.error().empty());
  EXPECT_TRUE(absl::StrContains(report.error(), "data-caf\\xe9")) << report.error();
  v1::ReportProgressRequest parsed;
  EXPECT_TRUE(parsed.ParseFromString(report.SerializeAsString()));
  EXPECT_EQ(parsed.error(), report.error());
}

// Both reports' errors (a failed job's, a failed checkpoint's) go through
// ReportableError: a checkpoint root named in Latin-1 in a write's error
// made CheckpointWritten.error unparsable, the report was lost, and a job
// waiting at a step boundary for that checkpoint's report waited for good.
TEST(JobRunnerTest, ReportableError_EscapedToUtf8AndCutOnACharacterBoundary) {
  const std::string error =
      ReportableError(absl::InternalError("cannot create step-00000005 under /data/caf\xe9"));
  EXPECT_EQ(error, "INTERNAL: cannot create step-00000005 under /data/caf\\xe9");
  v1::CheckpointWritten written;
  written.set_error(error);
  v1::CheckpointWritten parsed;
  EXPECT_TRUE(parsed.ParseFromString(written.SerializeAsString()));
  const std::string long_error = ReportableError(absl::InternalError(std::string(5000, 'a')));
  EXPECT_EQ(long_error.size(), 4096u + std::string(" [...]").size());
  EXPECT_TRUE(absl::EndsWith(long_error, " [...]"));
}

// A job's failure reason is read by people (`pipetrain job ID`): the
// errno a status carries for code (common/errno_status.h) stays out of it,
// where ToString would end it with "[type.pipetrain/errno='28']".
TEST(JobRunnerTest, ReportableError_ErrnoPayloadLeftOut) {
  const absl::Status full = ErrnoStatus(ENOSPC, "cannot write step-00000005/unit-0.safetensors");
  EXPECT_EQ(ReportableError(full),
            "RESOURCE_EXHAUSTED: cannot write step-00000005/unit-0.safetensors: "
            "No space left on device");
}

// A data file past a third of the worker's memory limit (text takes 3x its
// size while it loads) fails the job, naming the limit, before its buffer
// is allocated: any size was read whole, and a failed allocation threw.
TEST(JobRunnerTest, DataFilePastAThirdOfTheMemoryLimit_ResourceExhausted) {
  char real[PATH_MAX];  // the error names the file's real path
  ASSERT_NE(realpath(FreshDir("data-big").c_str(), real), nullptr);
  const std::string root = real;
  ASSERT_TRUE(WriteBytesFile(root + "/book.txt", std::string(3001, 'a')).ok());
  v1::Assignment a = OneStageAssignment(1);
  a.mutable_spec()->mutable_data()->clear_synthetic_bytes();
  a.mutable_spec()->mutable_data()->set_path("book.txt");
  JobRunnerOptions options{"w", 1};
  options.data_roots = {root};
  options.memory_limit_bytes = 9000;
  const v1::ReportProgressRequest report = FirstReportOfOneStage(a, options);
  EXPECT_EQ(report.error(),
            absl::StrCat("RESOURCE_EXHAUSTED: spec.data.path: ", root,
                         "/book.txt: 3001 bytes exceeds the limit of 3000 bytes for "
                         "a token file (a third of this worker's memory limit of "
                         "9000 bytes: --memory-limit, else its cgroup's limit or "
                         "RAM); use a smaller file"));
  // At a third, it loads and trains.
  options.memory_limit_bytes = 9003;
  const v1::ReportProgressRequest fits = FirstReportOfOneStage(a, options);
  EXPECT_EQ(fits.error(), "");
  EXPECT_TRUE(fits.finished());
}

// Generated text peaks at 3x its size as a file does, but had no limit: a
// worker with --memory-limit 1G generated 1 GiB of it and grew to 3.1 GB.
TEST(JobRunnerTest, GeneratedTextPastAThirdOfTheMemoryLimit_ResourceExhausted) {
  v1::Assignment a = OneStageAssignment(1);
  a.mutable_spec()->mutable_data()->set_synthetic_bytes(3001);
  JobRunnerOptions options{"w", 1};
  options.memory_limit_bytes = 9000;
  const v1::ReportProgressRequest report = FirstReportOfOneStage(a, options);
  EXPECT_EQ(report.error(),
            "RESOURCE_EXHAUSTED: spec.data.synthetic_bytes: 3001 bytes of generated text exceeds "
            "the limit of 3000 bytes (a third of this worker's memory limit of 9000 bytes: "
            "--memory-limit, else its cgroup's limit or RAM); use less generated text");
  a.mutable_spec()->mutable_data()->set_synthetic_bytes(3000);
  const v1::ReportProgressRequest fits = FirstReportOfOneStage(a, options);
  EXPECT_EQ(fits.error(), "");
  EXPECT_TRUE(fits.finished());
}

// Workers of a plan on one host share its RAM: each holds its corpus to a
// third of the share the plan gave it (Assignment.host_memory_budget_bytes),
// not of the whole RAM every one of them reports.
TEST(JobRunnerTest, GeneratedTextPastAThirdOfTheHostShare_ResourceExhaustedNamingTheShare) {
  v1::Assignment a = OneStageAssignment(1);
  a.mutable_spec()->mutable_data()->set_synthetic_bytes(3001);
  a.set_host_memory_budget_bytes(9000);
  JobRunnerOptions options{"w", 1};
  options.memory_limit_bytes = 36000;  // the host's RAM, shared by four
  const v1::ReportProgressRequest report = FirstReportOfOneStage(a, options);
  EXPECT_EQ(report.error(),
            "RESOURCE_EXHAUSTED: spec.data.synthetic_bytes: 3001 bytes of generated text exceeds "
            "the limit of 3000 bytes (a third of this worker's share of its host's memory, 9000 "
            "bytes: the plan's workers on the host share its RAM); use less generated text");
  // A share of 2 bytes (the others' limits claim the host's RAM) bounds
  // the corpus too: a third of it, 0, read as no bound.
  a.set_host_memory_budget_bytes(2);
  const v1::ReportProgressRequest tiny = FirstReportOfOneStage(a, options);
  EXPECT_NE(tiny.error().find("exceeds the limit of 1 bytes (a third of this worker's share"),
            std::string::npos)
      << tiny.error();
  // A share above the worker's own limit, or out of bounds, changes nothing.
  for (double budget : {1e6, -1.0, std::numeric_limits<double>::quiet_NaN(), 1e300}) {
    a.set_host_memory_budget_bytes(budget);
    const v1::ReportProgressRequest fits = FirstReportOfOneStage(a, options);
    EXPECT_EQ(fits.error(), "") << budget;
    EXPECT_TRUE(fits.finished()) << budget;
  }
}

// A start_iteration at or past the last step ran nothing and reported
// nothing (the job hung); now the job fails naming the field.
TEST(JobRunnerTest, StartIterationPastTheSteps_ReportedAsTheJobsError) {
  v1::Assignment a = OneStageAssignment(3);
  a.set_start_iteration(std::numeric_limits<int64_t>::max());
  const v1::ReportProgressRequest report = FirstReportOfOneStage(a, JobRunnerOptions{"w", 1});
  EXPECT_EQ(report.error(),
            "INVALID_ARGUMENT: assignment: start_iteration 9223372036854775807 is out of range "
            "[0, 3) (spec.training.steps 3)");
}

TEST(CheckStartIterationTest, InRangeAndTheResumeStep) {
  v1::Assignment a = OneStageAssignment(3);
  EXPECT_TRUE(CheckStartIteration(a, 3).ok());
  a.set_start_iteration(2);
  EXPECT_TRUE(CheckStartIteration(a, 3).ok());
  a.set_start_iteration(3);
  EXPECT_EQ(CheckStartIteration(a, 3).message(),
            "assignment: start_iteration 3 is out of range [0, 3) (spec.training.steps 3)");
  a.set_start_iteration(-1);
  EXPECT_EQ(CheckStartIteration(a, 3).code(), absl::StatusCode::kInvalidArgument);
  // With a resume: the checkpoint's step, and no other.
  a.set_start_iteration(2);
  a.mutable_resume()->set_step(2);
  EXPECT_TRUE(CheckStartIteration(a, 3).ok());
  a.mutable_resume()->set_step(1);
  EXPECT_EQ(CheckStartIteration(a, 3).message(),
            "assignment: start_iteration 2 but resume.step 1; a resumed job starts at its "
            "checkpoint's step");
}

// Only a checkpoint that is itself bad is reported unusable (which makes
// the coordinator drop it): one missing its files is; one this worker
// cannot reach because its --checkpoint-root does not open is not, and
// counts as a peer failure (the job recovers and tries it again), so one
// worker's volume trouble does not throw a good checkpoint away.
TEST(JobRunnerTest, ResumeLoadFailure_UnusableOnlyWhenTheCheckpointIsBad) {
  v1::Assignment a = OneStageAssignment(3);
  a.set_start_iteration(2);
  a.mutable_resume()->set_step(2);
  a.mutable_resume()->set_dir("ck/step-00000002");  // lists no unit files
  JobRunnerOptions options{"w", 1};
  options.checkpoint_root = FreshDir("resume-load-failures");
  v1::ReportProgressRequest report = FirstReportOfOneStage(a, options);
  EXPECT_TRUE(report.checkpoint_unusable()) << report.error();
  EXPECT_TRUE(absl::StrContains(report.error(), "DATA_LOSS")) << report.error();

  options.checkpoint_root += "/not-mounted";
  report = FirstReportOfOneStage(a, options);
  EXPECT_FALSE(report.checkpoint_unusable()) << report.error();
  EXPECT_TRUE(report.peer_failure()) << report.error();
  EXPECT_TRUE(absl::StrContains(report.error(), "cannot open --checkpoint-root")) << report.error();
}

// A device that failed (out of memory while the runtime was set up, or
// while the moments were uploaded) fails the load whatever it reads: the
// worker's trouble, not the checkpoint's, which the coordinator would drop
// (and delete) on an "unusable" report.
class OutOfDeviceMemory : public ForwardingBackend {
 public:
  OutOfDeviceMemory() : ForwardingBackend(CpuBackend()) {}
  absl::Status status() const override {
    return absl::ResourceExhaustedError("out of device memory");
  }
};

TEST(JobRunnerTest, ResumeLoadFailure_OnAFailedDevice_NotTheCheckpoints) {
  v1::Assignment a = OneStageAssignment(3);
  a.set_start_iteration(2);
  a.mutable_resume()->set_step(2);
  a.mutable_resume()->set_dir("ck/step-00000002");  // lists no unit files
  OutOfDeviceMemory backend;
  JobRunnerOptions options{"w", 1};
  options.checkpoint_root = FreshDir("resume-load-device-failure");
  options.backend = &backend;
  const v1::ReportProgressRequest report = FirstReportOfOneStage(a, options);
  EXPECT_TRUE(absl::StrContains(report.error(), "has no file for unit 0")) << report.error();
  EXPECT_FALSE(report.checkpoint_unusable()) << report.error();
}

// A resume from unit files another build wrote (another format version,
// after an upgrade or a rollback: ReadUnitCheckpoint's UNIMPLEMENTED) fails
// the stage, but not as the checkpoint's fault: the coordinator would drop
// the checkpoint and delete its files, and with them the job's way back to
// the build that reads them.
TEST(JobRunnerTest, ResumeFromAnotherBuildsFormatVersion_NotReportedUnusable) {
  v1::Assignment a = OneStageAssignment(3);
  a.mutable_spec()->mutable_checkpoint()->set_interval_steps(1);
  a.mutable_spec()->mutable_checkpoint()->set_dir("ck");
  JobRunnerOptions options{"w", 1};
  options.checkpoint_root = FreshDir("resume-another-version");
  v1::Assignment resumed = a;
  resumed.set_start_iteration(1);
  resumed.mutable_resume()->set_step(1);
  resumed.mutable_resume()->set_dir("ck/step-00000001");
  {
    InProcessFabric fabric(1);
    FakeLink link(1);
    JobRunner runner(a, &fabric.mailbox(0), FabricTransports(fabric), &link, options);
    runner.Start();
    ASSERT_TRUE(link.AwaitReports(5));  // checkpoints at steps 1 and 2, then 3 iterations
    runner.Stop();
    for (const v1::ReportProgressRequest& r : link.reports()) {
      if (r.has_checkpoint() && r.checkpoint().step() == 1) {
        *resumed.mutable_resume()->mutable_units() = r.checkpoint().units();
      }
    }
  }
  ASSERT_EQ(resumed.resume().units_size(), 4);
  // As written, it resumes.
  v1::ReportProgressRequest report = FirstReportOfOneStage(resumed, options);
  EXPECT_EQ(report.error(), "");
  // Unit 0 of format version 2, whole: its record's size and SHA-256 match.
  v1::UnitFile* unit = resumed.mutable_resume()->mutable_units(0);
  const std::string path =
      absl::StrCat(options.checkpoint_root, "/ck/step-00000001/", unit->file());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = bytes.find("\"version\":\"1\"");
  ASSERT_NE(at, std::string::npos) << path;
  bytes.replace(at, 13, "\"version\":\"2\"");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  unit->set_sha256(Sha256Hex(bytes));
  report = FirstReportOfOneStage(resumed, options);
  EXPECT_TRUE(absl::StartsWith(report.error(), "UNIMPLEMENTED: ")) << report.error();
  EXPECT_TRUE(absl::StrContains(report.error(),
                                "is a unit checkpoint of format version 2; this build reads "
                                "version 1 only (written by another pipetrain build"))
      << report.error();
  EXPECT_FALSE(report.checkpoint_unusable()) << report.error();
  EXPECT_FALSE(report.peer_failure()) << report.error();
}

// The steps come from the assignment's spec before ResolveJobSpec bounds
// them: a start just below INT64_MAX was in range of steps INT64_MAX, and
// the mailbox's window was opened there.
TEST(CheckStartIterationTest, StepsOutsideTheSpecsBounds_Refused) {
  v1::Assignment a = OneStageAssignment(3);
  a.set_start_iteration(std::numeric_limits<int64_t>::max() - 1);
  EXPECT_EQ(CheckStartIteration(a, std::numeric_limits<int64_t>::max()).message(),
            "assignment: spec.training.steps 9223372036854775807 is out of range [1, 100000000]");
  a.set_start_iteration(0);
  EXPECT_EQ(CheckStartIteration(a, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckStartIteration(a, kMaxSteps).ok());
  EXPECT_EQ(CheckStartIteration(a, kMaxSteps + 1).code(), absl::StatusCode::kInvalidArgument);
}

// A backend that fails mid-job (the CPU cannot, so a stand-in reports
// INTERNAL after its first GELU): the job's error is reported, then the
// failure hook gets the backend's error, once.
class FailsAfterFirstGelu : public ForwardingBackend {
 public:
  FailsAfterFirstGelu() : ForwardingBackend(CpuBackend()) {}
  void GeluForward(const float* x, int64_t n, float* y) override {
    gelus_.fetch_add(1);
    inner()->GeluForward(x, n, y);
  }
  absl::Status status() const override {
    return gelus_.load() > 1 ? absl::InternalError("device lost") : absl::OkStatus();
  }

 private:
  std::atomic<int> gelus_{0};
};

TEST(JobRunnerTest, BackendFailure_ReportsTheJobThenCallsTheHookOnce) {
  InProcessFabric fabric(1);
  FakeLink link(1);
  v1::Assignment a = OneStageAssignment(3);
  FailsAfterFirstGelu backend;
  std::mutex mu;
  std::vector<absl::Status> failures;
  JobRunnerOptions options{"w", 1};
  options.backend = &backend;
  options.on_backend_failure = [&](const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    failures.push_back(s);
  };
  JobRunner runner(a, &fabric.mailbox(0), FabricTransports(fabric), &link, options);
  runner.Start();
  ASSERT_TRUE(link.AwaitReports(1));
  while (!runner.finished()) std::this_thread::yield();  // bounded: the job has failed
  runner.Stop();
  EXPECT_NE(link.reports()[0].error().find("device lost"), std::string::npos)
      << link.reports()[0].error();
  // Recovered from as a lost peer (this worker exits to be restarted), not
  // the job's own failure: INTERNAL alone would fail a checkpointed job.
  EXPECT_TRUE(link.reports()[0].peer_failure());
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].message(), "device lost");
}

// Makes the first tensor's first weight NaN in the update of step `step`,
// as an infinite gradient element would (its step's loss stays finite).
class NanWeightsAtStep : public ForwardingBackend {
 public:
  explicit NanWeightsAtStep(int64_t step) : ForwardingBackend(CpuBackend()), step_(step) {}
  void AdamWUpdateAll(const std::vector<AdamWTensor>& tensors, int64_t step,
                      const AdamWConfig& config) override {
    inner()->AdamWUpdateAll(tensors, step, config);
    if (step == step_ && !tensors.empty()) tensors[0].param[0] = std::nanf("");
  }

 private:
  const int64_t step_;
};

// The last step's loss is finite while its update broke the weights: the
// job fails naming the tensor; nothing is uploaded or reported finished.
TEST(JobRunnerTest, LastStepMakesNanWeights_FailsBeforeUploadingOrFinishing) {
  InProcessFabric fabric(1);
  FakeLink link(1);
  v1::Assignment a = OneStageAssignment(3, /*weights=*/true);
  NanWeightsAtStep backend(3);
  JobRunnerOptions options{"w", 1};
  options.backend = &backend;
  JobRunner runner(a, &fabric.mailbox(0), FabricTransports(fabric), &link, options);
  runner.Start();
  ASSERT_TRUE(link.AwaitReports(3));
  while (!runner.finished()) std::this_thread::yield();  // bounded: the job has failed
  runner.Stop();
  const std::vector<v1::ReportProgressRequest> reports = link.reports();
  ASSERT_EQ(reports.size(), 3u);
  for (int it = 0; it < 2; ++it) {
    EXPECT_EQ(reports[it].iteration(), it);
    EXPECT_TRUE(reports[it].error().empty()) << reports[it].error();
    ASSERT_EQ(reports[it].micro_batch_losses_size(), 2);
    EXPECT_TRUE(std::isfinite(reports[it].micro_batch_losses(0)));
  }
  EXPECT_NE(reports[2].error().find("training diverged: after step 3, "), std::string::npos)
      << reports[2].error();
  EXPECT_NE(reports[2].error().find(" holds NaN at element 0"), std::string::npos)
      << reports[2].error();
  EXPECT_FALSE(reports[2].peer_failure());
  for (const v1::ReportProgressRequest& r : reports) EXPECT_FALSE(r.finished());
  EXPECT_TRUE(link.uploaded().empty());
}

// Makes the first tensor's first second moment infinite in the update of
// step `step`, as AdamW does for a finite gradient element past about 8e19
// (grad_clip 0): that weight element freezes, and the weights and every
// step's loss stay finite.
class InfMomentAtStep : public ForwardingBackend {
 public:
  explicit InfMomentAtStep(int64_t step) : ForwardingBackend(CpuBackend()), step_(step) {}
  void AdamWUpdateAll(const std::vector<AdamWTensor>& tensors, int64_t step,
                      const AdamWConfig& config) override {
    inner()->AdamWUpdateAll(tensors, step, config);
    if (step == step_ && !tensors.empty()) tensors[0].v[0] = INFINITY;
  }

 private:
  const int64_t step_;
};

// No loss tells that divergence, only the refused checkpoint of its step:
// the job fails there ("training diverged", its own failure, not a peer's),
// as train-local ends at that checkpoint, instead of training on with every
// later checkpoint refused and ending SUCCEEDED. The refusal is no
// checkpoint write error (no disk to free, no checkpoint_failed recovery).
TEST(JobRunnerTest, CheckpointRefusedForAnInfiniteMoment_FailsTheJobAsDiverged) {
  v1::Assignment a = OneStageAssignment(5);
  a.mutable_spec()->mutable_checkpoint()->set_interval_steps(1);
  a.mutable_spec()->mutable_checkpoint()->set_dir("ck");
  InfMomentAtStep backend(2);
  JobRunnerOptions options{"w", 1};
  options.backend = &backend;
  options.checkpoint_root = FreshDir("checkpoint-inf-moment");
  InProcessFabric fabric(1);
  FakeLink link(1);
  JobRunner runner(a, &fabric.mailbox(0), FabricTransports(fabric), &link, options);
  runner.Start();
  ASSERT_TRUE(AwaitFinished(runner));  // on its own: nothing stops it
  runner.Stop();
  std::vector<int64_t> iterations, written, refused;
  std::vector<v1::ReportProgressRequest> errors;
  for (const v1::ReportProgressRequest& r : link.reports()) {
    EXPECT_FALSE(r.finished());
    if (r.has_checkpoint()) {
      (r.checkpoint().error().empty() ? written : refused).push_back(r.checkpoint().step());
    } else if (!r.error().empty()) {
      errors.push_back(r);
    } else {
      iterations.push_back(r.iteration());
      for (float loss : r.micro_batch_losses()) EXPECT_TRUE(std::isfinite(loss));
    }
  }
  EXPECT_EQ(written, (std::vector<int64_t>{1}));
  EXPECT_EQ(refused, (std::vector<int64_t>{}));
  // Step 3's iteration may have run while step 2's checkpoint was written;
  // the failure is reported before step 3's is taken, and nothing after.
  ASSERT_GE(iterations.size(), 2u);
  ASSERT_LE(iterations.size(), 3u);
  for (size_t i = 0; i < iterations.size(); ++i) EXPECT_EQ(iterations[i], static_cast<int64_t>(i));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(errors[0].error(),
                               "FAILED_PRECONDITION: training diverged: not writing the checkpoint "
                               "of step 2: moment v of "))
      << errors[0].error();
  EXPECT_TRUE(absl::StrContains(errors[0].error(), " holds an infinity at element 0"))
      << errors[0].error();
  EXPECT_FALSE(errors[0].peer_failure());
  EXPECT_FALSE(errors[0].checkpoint_unusable());
  EXPECT_EQ(link.reports().back().error(), errors[0].error());
}

// The same refusal at a drain's or join's step boundary (stop_after_step):
// reported as the checkpoint's write error, it sent the job into a
// "checkpoint_failed" recovery at the coordinator, which then dropped the
// "training diverged" that followed (the job RECOVERING), and the job could
// train on from the checkpoint before. Only the divergence is reported.
TEST(JobRunnerTest, BoundaryCheckpointRefusedForAnInfiniteMoment_OnlyDivergedReported) {
  v1::Assignment a = OneStageAssignment(5);
  a.mutable_spec()->mutable_checkpoint()->set_interval_steps(1);
  a.mutable_spec()->mutable_checkpoint()->set_dir("ck");
  InfMomentAtStep backend(2);
  JobRunnerOptions options{"w", 1};
  options.backend = &backend;
  options.checkpoint_root = FreshDir("checkpoint-inf-moment-boundary");
  InProcessFabric fabric(1);
  FakeLink link(1);
  link.StopAfterStep(2);
  JobRunner runner(a, &fabric.mailbox(0), FabricTransports(fabric), &link, options);
  runner.Start();
  ASSERT_TRUE(AwaitFinished(runner));  // on its own: nothing stops it
  runner.Stop();
  std::vector<int64_t> iterations, written;
  std::vector<v1::ReportProgressRequest> errors;
  for (const v1::ReportProgressRequest& r : link.reports()) {
    EXPECT_FALSE(r.finished());
    if (r.has_checkpoint()) {
      EXPECT_TRUE(r.checkpoint().error().empty()) << r.checkpoint().error();
      written.push_back(r.checkpoint().step());
    } else if (!r.error().empty()) {
      errors.push_back(r);
    } else {
      iterations.push_back(r.iteration());
    }
  }
  EXPECT_EQ(written, (std::vector<int64_t>{1}));
  EXPECT_EQ(iterations, (std::vector<int64_t>{0, 1}));  // the stage stops at the boundary
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(errors[0].error(),
                               "FAILED_PRECONDITION: training diverged: not writing the checkpoint "
                               "of step 2: moment v of "))
      << errors[0].error();
  EXPECT_FALSE(errors[0].peer_failure());
  EXPECT_FALSE(errors[0].checkpoint_unusable());
  EXPECT_EQ(link.reports().back().error(), errors[0].error());
}

// The same refusal of the checkpoint of the step before the last (3 steps,
// step 2's), known while the last step runs, its weights finite: the job
// fails as diverged before the final weights upload, not behind it (a
// diverged model of GBs sent for minutes; and an upload that failed hid
// the divergence). Whether the check before the last step or the one
// before the upload sees it, nothing is uploaded.
TEST(JobRunnerTest, LastCheckpointRefusedForAnInfiniteMoment_FailsAsDivergedBeforeUploading) {
  v1::Assignment a = OneStageAssignment(3, /*weights=*/true);
  a.mutable_spec()->mutable_checkpoint()->set_interval_steps(1);
  a.mutable_spec()->mutable_checkpoint()->set_dir("ck");
  InfMomentAtStep backend(2);
  JobRunnerOptions options{"w", 1};
  options.backend = &backend;
  options.checkpoint_root = FreshDir("checkpoint-inf-moment-last");
  InProcessFabric fabric(1);
  FakeLink link(1);
  JobRunner runner(a, &fabric.mailbox(0), FabricTransports(fabric), &link, options);
  runner.Start();
  ASSERT_TRUE(AwaitFinished(runner));  // on its own: nothing stops it
  runner.Stop();
  EXPECT_EQ(link.upload_attempts(), 0);
  EXPECT_TRUE(link.uploaded().empty());
  EXPECT_FALSE(runner.completed());
  std::vector<int64_t> iterations, written;
  std::vector<v1::ReportProgressRequest> errors;
  for (const v1::ReportProgressRequest& r : link.reports()) {
    EXPECT_FALSE(r.finished());
    if (r.has_checkpoint()) {
      EXPECT_TRUE(r.checkpoint().error().empty()) << r.checkpoint().error();
      written.push_back(r.checkpoint().step());
    } else if (!r.error().empty()) {
      errors.push_back(r);
    } else {
      iterations.push_back(r.iteration());
    }
  }
  EXPECT_EQ(written, (std::vector<int64_t>{1}));
  EXPECT_EQ(iterations, (std::vector<int64_t>{0, 1}));  // the last one is never reported
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(errors[0].error(),
                               "FAILED_PRECONDITION: training diverged: not writing the checkpoint "
                               "of step 2: moment v of "))
      << errors[0].error();
  EXPECT_FALSE(errors[0].peer_failure());
  EXPECT_FALSE(errors[0].checkpoint_unusable());
  EXPECT_EQ(link.reports().back().error(), errors[0].error());
}

// spec.init.from weights with a NaN in a row no step reads (the last
// position, past seq_len) would train with finite losses to NaN weights:
// the stage refuses them before the first step, naming the tensor.
TEST(JobRunnerTest, InitWeightsWithNan_ReportedAsTheJobsErrorBeforeAnyStep) {
  v1::Assignment a = OneStageAssignment(3);
  a.mutable_spec()->mutable_model()->set_max_seq_len(12);
  const GptConfig model = ResolveJobSpec(a.spec()).value().train.model;
  ASSERT_GT(model.max_seq_len, a.spec().training().seq_len());
  std::unique_ptr<GptModel> weights = GptModel::Create(model, 1).value();
  for (Parameter* p : weights->parameters()) {
    if (p->name == "wpe.weight") p->value[p->value.numel() - 1] = std::nanf("");
  }
  const std::string root = FreshDir("init-nan");
  ASSERT_TRUE(SaveWeights(root + "/init.safetensors", weights->parameters()).ok());
  a.set_init_weights("init.safetensors");
  JobRunnerOptions options{"w", 1};
  options.checkpoint_root = root;
  // Without the check the first report is step 1's, and the job fails only
  // after its last step (LastStepMakesNanWeights).
  const v1::ReportProgressRequest first = FirstReportOfOneStage(a, options);
  EXPECT_NE(first.error().find("tensor 'wpe.weight' holds NaN at element " +
                               std::to_string(model.max_seq_len * model.d_model - 1) +
                               ": weights of a diverged run cannot start one"),
            std::string::npos)
      << first.error();
}

// The start barrier's report the coordinator could not take (a leader
// change) is sent again: the stages start and train.
// The two stages of a 2-step 1F1B job over `fabric`, reporting to `link`.
std::vector<std::unique_ptr<JobRunner>> TwoStageRunners(InProcessFabric& fabric, FakeLink& link) {
  std::vector<std::unique_ptr<JobRunner>> runners;
  for (int s = 0; s < 2; ++s) {
    runners.push_back(std::make_unique<JobRunner>(
        Assignment(s, 2, false, Schedule::kOneFOneB), &fabric.mailbox(s), FabricTransports(fabric),
        &link, JobRunnerOptions{"w" + std::to_string(s), 1}));
  }
  return runners;
}

TEST(JobRunnerTest, UnavailableStartBarrier_SentAgain) {
  InProcessFabric fabric(2);
  FakeLink link;
  link.FailReadyReports(2);
  std::vector<std::unique_ptr<JobRunner>> runners = TwoStageRunners(fabric, link);
  for (auto& r : runners) r->Start();
  ASSERT_TRUE(link.AwaitReports(4));  // each stage's two iterations
  for (auto& r : runners) r->Stop();
  EXPECT_EQ(link.failed(), 2);
  for (const auto& r : link.reports()) EXPECT_TRUE(r.error().empty()) << r.error();
}

// A report the coordinator could not take is sent again after the wait
// ReportRetryBackoff draws for the runner's seed, not after the same
// wait on every worker.
TEST(JobRunnerTest, UnavailableReport_SentAgainAfterTheSeedsJitteredWait) {
  std::set<std::string> waits;
  for (const uint64_t seed : {7, 8}) {
    SCOPED_TRACE(seed);
    JobRunnerOptions options{"w", 1};
    options.report_retry_backoff = absl::Milliseconds(1);
    options.retry_seed = seed;
    const std::string wait = absl::FormatDuration(Backoff(ReportRetryBackoff(options)).Next());
    InProcessFabric fabric(1);
    FakeLink link(1);
    link.FailIterationReports(1, absl::StatusCode::kUnavailable);
    JobRunner runner(OneStageAssignment(1), &fabric.mailbox(0), FabricTransports(fabric), &link,
                     options);
    ::testing::internal::CaptureStderr();
    runner.Start();
    const bool reported = link.AwaitReports(1);
    runner.Stop();
    const std::string log = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(reported);
    EXPECT_EQ(link.failed(), 1);
    EXPECT_TRUE(absl::StrContains(log, absl::StrCat("); again in ", wait, "\n"))) << wait << log;
    waits.insert(wait);
  }
  EXPECT_EQ(waits.size(), 2u);  // the two seeds' waits differ
}

// A stage that comes to the start barrier long after the others (a larger
// checkpoint to load, a slower mount) is waited for past the data plane's
// receive timeout: giving up there was a peer failure, and every recovery
// met the same gap until the job failed. Stage 1 starts 3 receive
// timeouts after stage 0 is at the barrier; both run their steps.
TEST(JobRunnerTest, StartBarrier_WaitsForASlowStagePastTheReceiveTimeout) {
  InProcessFabric fabric(2);
  FakeLink link;
  std::vector<std::unique_ptr<JobRunner>> runners;
  for (int s = 0; s < 2; ++s) {
    JobRunnerOptions options{"w" + std::to_string(s), 1};
    options.recv_timeout = absl::Seconds(1);
    runners.push_back(std::make_unique<JobRunner>(Assignment(s, 2, false, Schedule::kOneFOneB),
                                                  &fabric.mailbox(s), FabricTransports(fabric),
                                                  &link, options));
  }
  runners[0]->Start();
  // Stage 0 at the barrier (bounded poll), then stage 1, late.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (link.ready_reports().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_FALSE(link.ready_reports().empty());
  absl::SleepFor(absl::Seconds(3));  // the slow stage's load: not a synchronisation
  runners[1]->Start();
  ASSERT_TRUE(link.AwaitReports(4));  // each stage's two iterations
  for (auto& r : runners) r->Stop();
  for (const auto& r : link.reports()) EXPECT_TRUE(r.error().empty()) << r.error();
}

// The start barrier carries the digest of the tokens each stage loaded
// (the coordinator compares the stages' and keeps the first as the job's);
// a single stage, which passes no barrier, sends it with its first report.
TEST(JobRunnerTest, DataDigest_SentWithTheBarrierOrTheFirstReport) {
  const v1::Assignment two = Assignment(0, 2, false, Schedule::kOneFOneB);
  const std::string expected =
      CorpusSha256(LoadCorpus(CorpusSpec{"", DataFormat::kAuto, 256, 5000, 1}).value());
  ASSERT_EQ(expected.size(), 64u);
  InProcessFabric fabric(2);
  FakeLink link;
  std::vector<std::unique_ptr<JobRunner>> runners = TwoStageRunners(fabric, link);
  for (auto& r : runners) r->Start();
  ASSERT_TRUE(link.AwaitReports(4));
  for (auto& r : runners) r->Stop();
  std::set<std::string> ready;  // a stage asks until every stage is ready
  for (const auto& r : link.ready_reports()) {
    EXPECT_EQ(r.data_sha256(), expected);
    ready.insert(r.worker_id());
  }
  EXPECT_EQ(ready, (std::set<std::string>{"w0", "w1"}));
  for (const auto& r : link.reports()) EXPECT_EQ(r.data_sha256(), "");  // said once
  ASSERT_EQ(two.spec().data().synthetic_bytes(), 5000);                 // the corpus hashed above

  const v1::ReportProgressRequest first =
      FirstReportOfOneStage(OneStageAssignment(2), JobRunnerOptions{"w", 1});
  EXPECT_EQ(first.iteration(), 0);
  EXPECT_EQ(first.data_sha256(), expected);
}

// A plan after a recovery names the job's digest: a stage that reads other
// tokens (the file was replaced since) fails the job before any step,
// naming both digests, rather than train on them silently.
TEST(JobRunnerTest, DataDigestOtherThanTheJobs_ReportedAsTheJobsErrorBeforeAnyStep) {
  v1::Assignment a = OneStageAssignment(2);
  a.set_data_sha256(std::string(64, 'e'));
  const v1::ReportProgressRequest report = FirstReportOfOneStage(a, JobRunnerOptions{"w", 1});
  EXPECT_TRUE(absl::StartsWith(report.error(),
                               "FAILED_PRECONDITION: spec.data (generated text): "
                               "the tokens this worker read have SHA-256 "))
      << report.error();
  EXPECT_TRUE(absl::StrContains(report.error(), std::string(64, 'e'))) << report.error();
  EXPECT_FALSE(report.peer_failure());
  EXPECT_EQ(report.micro_batch_losses_size(), 0);
  // With the job's own digest it trains.
  a.set_data_sha256(
      CorpusSha256(LoadCorpus(CorpusSpec{"", DataFormat::kAuto, 256, 5000, 1}).value()));
  const v1::ReportProgressRequest trained = FirstReportOfOneStage(a, JobRunnerOptions{"w", 1});
  EXPECT_EQ(trained.error(), "");
  EXPECT_EQ(trained.iteration(), 0);
}

// A cancel that reached the coordinator before the stages' start barrier:
// each is answered "already ended" and stops quietly, reporting no error
// (nothing failed, and the job has nobody left to tell).
TEST(JobRunnerTest, JobEndedBeforeTheStartBarrier_StopsWithoutReportingAnError) {
  InProcessFabric fabric(2);
  FakeLink link;
  link.EndTheJob();
  std::vector<std::unique_ptr<JobRunner>> runners = TwoStageRunners(fabric, link);
  for (auto& r : runners) r->Start();
  for (auto& r : runners) ASSERT_TRUE(AwaitFinished(*r));
  const std::vector<v1::ReportProgressRequest> reports = link.reports();
  EXPECT_EQ(reports.size(), 2u);  // each stage's ready report, nothing after
  for (const auto& r : reports) {
    EXPECT_TRUE(r.ready());
    EXPECT_TRUE(r.error().empty()) << r.error();
  }
  for (auto& r : runners) r->Stop();
}

// An upload gRPC's flow control holds (the coordinator's host gone
// without a reset) is cut short by Stop: before, Stop waited out the
// upload's 10-minute deadline, and the worker's heartbeat thread, which
// stops runners, with it.
TEST(JobRunnerTest, StalledWeightsUpload_CancelledByStop) {
  InProcessFabric fabric(2);
  FakeLink link;
  link.StallUploads();
  std::vector<std::unique_ptr<JobRunner>> runners;
  for (int s = 0; s < 2; ++s) {
    auto factory = [&fabric](int stage, const std::vector<std::string>&, const JobCredential&) {
      return fabric.Connect(stage);
    };
    runners.push_back(std::make_unique<JobRunner>(Assignment(s, 2, true, Schedule::kOneFOneB),
                                                  &fabric.mailbox(s), factory, &link,
                                                  JobRunnerOptions{"w" + std::to_string(s), 1}));
  }
  for (auto& r : runners) r->Start();
  ASSERT_TRUE(link.AwaitStalledUpload());
  for (auto& r : runners) r->Stop();  // returns: the upload was cancelled
  for (auto& r : runners) EXPECT_TRUE(r->finished());
  EXPECT_TRUE(link.uploaded().empty());
  for (const v1::ReportProgressRequest& r : link.reports()) EXPECT_FALSE(r.finished());
}

// A checkpoint's report the coordinator could not take is sent again, as an
// iteration's is: a step boundary waits for every stage's.
TEST(JobRunnerTest, UnavailableCheckpointReports_SentAgain) {
  v1::Assignment a = OneStageAssignment(3);
  a.mutable_spec()->mutable_checkpoint()->set_interval_steps(1);
  a.mutable_spec()->mutable_checkpoint()->set_dir("ck");
  JobRunnerOptions options{"w", 1};
  options.checkpoint_root = FreshDir("checkpoint-retry");
  InProcessFabric fabric(1);
  FakeLink link(1);
  link.FailCheckpointReports(2);
  JobRunner runner(a, &fabric.mailbox(0), FabricTransports(fabric), &link, options);
  runner.Start();
  // Steps 1 and 2 are checkpointed (step 3 is the last), then 3 iterations.
  ASSERT_TRUE(link.AwaitReports(5));
  runner.Stop();
  std::vector<int64_t> checkpoints;
  for (const v1::ReportProgressRequest& r : link.reports()) {
    EXPECT_TRUE(r.error().empty()) << r.error();
    if (r.has_checkpoint()) checkpoints.push_back(r.checkpoint().step());
  }
  EXPECT_EQ(checkpoints, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(link.failed(), 2);
}

// A failed checkpoint's report carries its error escaped to UTF-8 (here a
// --checkpoint-root named in Latin-1, gone by the time of the write): the
// report parses at the coordinator, which a job waiting at a step boundary
// for it needs.
TEST(JobRunnerTest, FailedCheckpoint_ErrorQuotingBytesNotUtf8_ReportedEscapedAndParses) {
  v1::Assignment a = OneStageAssignment(2);
  a.mutable_spec()->mutable_checkpoint()->set_interval_steps(1);
  a.mutable_spec()->mutable_checkpoint()->set_dir("ck");
  JobRunnerOptions options{"w", 1};
  options.checkpoint_root = FreshDir("checkpoint-caf\xe9");
  ASSERT_EQ(rmdir(options.checkpoint_root.c_str()), 0);
  InProcessFabric fabric(1);
  FakeLink link(1);
  JobRunner runner(a, &fabric.mailbox(0), FabricTransports(fabric), &link, options);
  runner.Start();
  // Step 1's checkpoint (step 2 is the last), then 2 iterations.
  ASSERT_TRUE(link.AwaitReports(3));
  runner.Stop();
  int failed = 0;
  for (const v1::ReportProgressRequest& r : link.reports()) {
    if (!r.has_checkpoint()) continue;
    ++failed;
    EXPECT_TRUE(absl::StrContains(r.checkpoint().error(), "checkpoint-caf\\xe9"))
        << r.checkpoint().error();
    v1::ReportProgressRequest parsed;
    EXPECT_TRUE(parsed.ParseFromString(r.SerializeAsString()));
    EXPECT_EQ(parsed.checkpoint().error(), r.checkpoint().error());
  }
  EXPECT_EQ(failed, 1);
}

// At a step boundary the coordinator re-plans only once every stage's
// checkpoint report is in: one given up after a few attempts (the old
// limit was 4) left the job RUNNING with every stage idle. Reports are now
// sent again for report_retry_for, here through 12 failures; past it the
// error is returned.
TEST(JobRunnerTest, CheckpointReport_SentAgainThroughALongOutage) {
  v1::Assignment a = OneStageAssignment(2);
  a.mutable_spec()->mutable_checkpoint()->set_interval_steps(1);
  a.mutable_spec()->mutable_checkpoint()->set_dir("ck");
  JobRunnerOptions options{"w", 1};
  options.checkpoint_root = FreshDir("checkpoint-long-outage");
  options.report_retry_backoff = absl::Milliseconds(1);
  InProcessFabric fabric(1);
  FakeLink link(1);
  link.FailCheckpointReports(12);
  JobRunner runner(a, &fabric.mailbox(0), FabricTransports(fabric), &link, options);
  runner.Start();
  // Step 1 is checkpointed (step 2 is the last), then 2 iterations.
  ASSERT_TRUE(link.AwaitReports(3));
  runner.Stop();
  std::vector<int64_t> checkpoints;
  for (const v1::ReportProgressRequest& r : link.reports()) {
    if (r.has_checkpoint()) checkpoints.push_back(r.checkpoint().step());
  }
  EXPECT_EQ(checkpoints, (std::vector<int64_t>{1}));
  EXPECT_EQ(link.failed(), 12);

  // An outage longer than report_retry_for: the report is given up (the
  // run goes on; the coordinator never completes that checkpoint).
  InProcessFabric fabric2(1);
  FakeLink endless(1);
  endless.FailCheckpointReports(1 << 30);
  options.checkpoint_root = FreshDir("checkpoint-endless-outage");
  options.report_retry_for = absl::Milliseconds(30);
  JobRunner gives_up(a, &fabric2.mailbox(0), FabricTransports(fabric2), &endless, options);
  gives_up.Start();
  ASSERT_TRUE(endless.AwaitReports(2));  // the two iterations
  ASSERT_TRUE(AwaitFinished(gives_up));
  gives_up.Stop();
  for (const v1::ReportProgressRequest& r : endless.reports()) EXPECT_FALSE(r.has_checkpoint());
  EXPECT_GE(endless.failed(), 2);
  EXPECT_LT(endless.failed(), 100);
}

// The checkpoint of a step boundary (the coordinator's stop_after_step) is
// reported until answered, past report_retry_for: the coordinator re-plans
// only once it has every stage's, and nothing else ends that wait (the job
// stayed RUNNING with every stage idle after an outage longer than
// report_retry_for but shorter than the lease).
TEST(JobRunnerTest, BoundaryCheckpointReport_SentUntilAnswered) {
  v1::Assignment a = OneStageAssignment(4);
  a.mutable_spec()->mutable_checkpoint()->set_interval_steps(100);  // the boundary's only
  a.mutable_spec()->mutable_checkpoint()->set_dir("ck");
  JobRunnerOptions options{"w", 1};
  options.checkpoint_root = FreshDir("checkpoint-boundary-outage");
  options.report_retry_backoff = absl::Milliseconds(1);
  options.report_retry_for = absl::Milliseconds(20);  // a few tries a round
  InProcessFabric fabric(1);
  FakeLink link(1);
  link.StopAfterStep(2);
  link.FailCheckpointReports(40);
  JobRunner runner(a, &fabric.mailbox(0), FabricTransports(fabric), &link, options);
  runner.Start();
  ASSERT_TRUE(AwaitFinished(runner));
  runner.Stop();
  std::vector<int64_t> checkpoints;
  for (const v1::ReportProgressRequest& r : link.reports()) {
    if (r.has_checkpoint()) checkpoints.push_back(r.checkpoint().step());
  }
  EXPECT_EQ(checkpoints, (std::vector<int64_t>{2}));
  EXPECT_EQ(link.failed(), 40);
}

// The final weights' upload is sent again, whole, when the coordinator
// could not take it (UNAVAILABLE: unreachable for a while), as reports are; before, the stage
// failed the job at its very end. An error that says the upload is wrong is not retried: the stage
// reports it.
TEST(JobRunnerTest, WeightsUpload_SentAgainAfterUnavailable_OtherErrorsNot) {
  for (const absl::StatusCode code :
       {absl::StatusCode::kUnavailable, absl::StatusCode::kInvalidArgument}) {
    SCOPED_TRACE(absl::StatusCodeToString(code));
    JobRunnerOptions options{"w", 1};
    options.report_retry_backoff = absl::Milliseconds(1);
    InProcessFabric fabric(1);
    FakeLink link(1);
    link.FailUploads(3, code);
    JobRunner runner(OneStageAssignment(2, /*weights=*/true), &fabric.mailbox(0),
                     FabricTransports(fabric), &link, options);
    runner.Start();
    ASSERT_TRUE(AwaitFinished(runner));
    runner.Stop();
    std::vector<v1::ReportProgressRequest> reports = link.reports();
    ASSERT_FALSE(reports.empty());
    const v1::ReportProgressRequest& last = reports.back();
    if (code == absl::StatusCode::kUnavailable) {
      EXPECT_EQ(link.upload_attempts(), 4);
      EXPECT_TRUE(last.finished());
      EXPECT_TRUE(last.error().empty()) << last.error();
      // Three broken streams' first tensor each, then the whole upload.
      const std::vector<std::string> names = link.uploaded();
      ASSERT_GE(names.size(), 4u);
      const std::vector<std::string> whole(names.begin() + 3, names.end());
      ASSERT_GT(whole.size(), 1u);
      EXPECT_EQ(names[0], whole[0]);
      EXPECT_EQ(names[1], whole[0]);
      EXPECT_EQ(names[2], whole[0]);
      EXPECT_EQ(std::count(whole.begin(), whole.end(), "ln_f.weight"), 1);
    } else {
      EXPECT_EQ(link.upload_attempts(), 1);
      EXPECT_FALSE(last.finished());
      EXPECT_TRUE(absl::StrContains(last.error(), "the upload stream broke")) << last.error();
    }
  }
}

// An upload whose stream broke after running longer than the retry window
// (a large stage's, minutes long) is sent again: the window counts from the
// failure, not from the first attempt's start, which left the job failed
// at its very end.
TEST(JobRunnerTest, WeightsUpload_BrokenAfterALongStream_SentAgain) {
  JobRunnerOptions options{"w", 1};
  options.report_retry_backoff = absl::Milliseconds(1);
  options.report_retry_for = absl::Milliseconds(50);
  InProcessFabric fabric(1);
  FakeLink link(1);
  link.FailUploads(1, absl::StatusCode::kUnavailable, absl::Milliseconds(200));
  JobRunner runner(OneStageAssignment(2, /*weights=*/true), &fabric.mailbox(0),
                   FabricTransports(fabric), &link, options);
  runner.Start();
  ASSERT_TRUE(AwaitFinished(runner));
  runner.Stop();
  EXPECT_EQ(link.upload_attempts(), 2);
  const std::vector<v1::ReportProgressRequest> reports = link.reports();
  ASSERT_FALSE(reports.empty());
  EXPECT_TRUE(reports.back().finished());
  EXPECT_TRUE(reports.back().error().empty()) << reports.back().error();
}

// A coordinator short of descriptors or memory answers the upload
// UNAVAILABLE (job_manager_weights.cc) for as long as that lasts, a
// passing shortage. Past the retries the stage fails the job naming the
// upload, as a peer failure: a job with checkpoints recovers and uploads
// again, rather than end FAILED for its owner to resume by hand.
TEST(JobRunnerTest, WeightsUpload_UnavailablePastTheRetries_PeerFailureNamingTheUpload) {
  for (absl::StatusCode code :
       {absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded}) {
    SCOPED_TRACE(absl::StatusCodeToString(code));
    JobRunnerOptions options{"w", 1};
    options.report_retry_backoff = absl::Milliseconds(1);
    options.report_retry_for = absl::Milliseconds(20);
    InProcessFabric fabric(1);
    FakeLink link(1);
    link.FailUploads(1 << 30, code);
    JobRunner runner(OneStageAssignment(2, /*weights=*/true), &fabric.mailbox(0),
                     FabricTransports(fabric), &link, options);
    runner.Start();
    ASSERT_TRUE(AwaitFinished(runner));  // on its own: nothing stops it
    runner.Stop();
    EXPECT_GE(link.upload_attempts(), 2);  // sent again before it gave up
    EXPECT_FALSE(runner.completed());
    const std::vector<v1::ReportProgressRequest> reports = link.reports();
    ASSERT_FALSE(reports.empty());
    const v1::ReportProgressRequest& last = reports.back();
    EXPECT_FALSE(last.finished());
    EXPECT_EQ(last.error(), absl::StrCat(absl::StatusCodeToString(code),
                                         ": uploading the final weights to the coordinator: "
                                         "the upload stream broke"));
    EXPECT_TRUE(last.peer_failure());
    EXPECT_FALSE(last.checkpoint_unusable());
    for (size_t i = 0; i + 1 < reports.size(); ++i) EXPECT_TRUE(reports[i].error().empty());
  }
}

// on_completed runs once, after the last step's report and with
// completed() already true: an owner waiting for completed() under its own
// lock (WorkerAgent::AwaitDrained) is woken by it. A job that stops or
// fails never calls it.
TEST(JobRunnerTest, Completed_HookCalledOnceAfterTheLastReport) {
  InProcessFabric fabric(1);
  FakeLink link(1);
  std::atomic<int> calls{0};
  std::atomic<size_t> reports_seen{0};
  JobRunnerOptions options{"w", 1};
  JobRunner* observed = nullptr;
  std::atomic<bool> completed_when_called{false};
  options.on_completed = [&] {
    completed_when_called.store(observed->completed());
    reports_seen.store(link.reports().size());
    ++calls;
  };
  JobRunner runner(OneStageAssignment(3), &fabric.mailbox(0), FabricTransports(fabric), &link,
                   options);
  observed = &runner;
  runner.Start();
  ASSERT_TRUE(AwaitFinished(runner));
  runner.Stop();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(completed_when_called.load());
  ASSERT_EQ(link.reports().size(), 3u);
  EXPECT_TRUE(link.reports().back().finished());
  EXPECT_EQ(reports_seen.load(), 3u);  // the last report was taken first

  // Stopped before its end: never called.
  InProcessFabric second_fabric(2);
  FakeLink second_link(2);
  int stopped_calls = 0;
  JobRunnerOptions stopped{"w0", 1};
  stopped.on_completed = [&] { ++stopped_calls; };
  JobRunner waiting(Assignment(0, 2, false, Schedule::kGPipe), &second_fabric.mailbox(0),
                    FabricTransports(second_fabric), &second_link, stopped);
  waiting.Start();  // stage 1 never starts: it waits at the barrier
  waiting.Stop();
  EXPECT_FALSE(waiting.completed());
  EXPECT_EQ(stopped_calls, 0);
}

// A coordinator that no longer takes this worker's session (it restarted:
// UNAUTHENTICATED) would refuse an error report as well: the stage stops
// without one (it logged two ERROR lines on every worker after every
// restart, though the job then re-planned as it should).
TEST(JobRunnerTest, SessionRefused_StopsWithoutAnErrorReport) {
  InProcessFabric fabric(1);
  FakeLink link(1);
  link.FailIterationReports(100, absl::StatusCode::kUnauthenticated);
  JobRunner runner(OneStageAssignment(3), &fabric.mailbox(0), FabricTransports(fabric), &link,
                   JobRunnerOptions{"w", 1});
  runner.Start();
  ASSERT_TRUE(AwaitFinished(runner));
  runner.Stop();
  EXPECT_FALSE(runner.completed());
  EXPECT_EQ(link.failed(), 1);  // the first iteration's report, not retried
  EXPECT_TRUE(link.reports().empty()) << link.reports()[0].error();
}

// A runner of an incarnation the worker has registered past (a RUN it took
// as it registered again) has its reports refused as a stale runner's
// (coordinator/api/grpc_service.cc): the stage stops without an error
// report, which the coordinator would refuse alike. Before, it logged that
// the job failed on this worker and that the failure could not be reported.
TEST(JobRunnerTest, ReportRefusedAsAStaleRunners_StopsWithoutAnErrorReport) {
  InProcessFabric fabric(1);
  FakeLink link(1);
  link.FailIterationReports(
      100, absl::StatusCode::kFailedPrecondition,
      "worker w: report of a stale job runner (incarnation 1, the session's is 2); not taken");
  JobRunner runner(OneStageAssignment(3), &fabric.mailbox(0), FabricTransports(fabric), &link,
                   JobRunnerOptions{"w", 1});
  runner.Start();
  ASSERT_TRUE(AwaitFinished(runner));
  runner.Stop();
  EXPECT_FALSE(runner.completed());
  EXPECT_EQ(link.failed(), 1);  // the first iteration's report, not retried
  EXPECT_TRUE(link.reports().empty()) << link.reports()[0].error();
}

// A job that ends well leaves the hook alone.
TEST(JobRunnerTest, HealthyBackend_NeverCallsTheHook) {
  InProcessFabric fabric(2);
  FakeLink link;
  std::atomic<int> calls{0};
  std::vector<std::unique_ptr<JobRunner>> runners;
  for (int s = 0; s < 2; ++s) {
    JobRunnerOptions options{"w" + std::to_string(s), 1};
    options.on_backend_failure = [&](const absl::Status&) { ++calls; };
    runners.push_back(std::make_unique<JobRunner>(Assignment(s, 2, false, Schedule::kOneFOneB),
                                                  &fabric.mailbox(s), FabricTransports(fabric),
                                                  &link, options));
  }
  for (auto& r : runners) r->Start();
  for (auto& r : runners) {
    while (!r->finished()) std::this_thread::yield();  // bounded: 2 tiny steps
  }
  EXPECT_EQ(calls.load(), 0);
  // It did end well: no stage reported an error, and both finished.
  int finished = 0;
  for (const auto& r : link.reports()) {
    EXPECT_TRUE(r.error().empty()) << r.error();
    finished += r.finished();
  }
  EXPECT_EQ(finished, 2);
}

// --- Device groups: the CPU posing as GPUs, channels of an in-process hub.

// Counts the Abort and Flush calls of the channel it wraps; a Flush answers
// `flush_error` instead when that is not OK.
class CountingChannel : public DeviceChannel {
 public:
  CountingChannel(std::unique_ptr<DeviceChannel> inner, std::atomic<int>* aborts,
                  std::atomic<int>* flushes, absl::Status flush_error)
      : inner_(std::move(inner)),
        aborts_(aborts),
        flushes_(flushes),
        flush_error_(std::move(flush_error)) {}
  absl::Status Send(int peer, const Tensor& t) override { return inner_->Send(peer, t); }
  absl::StatusOr<Tensor> Recv(int peer, const Shape& shape) override {
    return inner_->Recv(peer, shape);
  }
  absl::Status Flush(absl::Duration timeout, const std::function<bool()>& cancelled) override {
    flushes_->fetch_add(1);
    if (!flush_error_.ok()) return flush_error_;
    return inner_->Flush(timeout, cancelled);
  }
  void Abort() override {
    aborts_->fetch_add(1);
    inner_->Abort();
  }

 private:
  std::unique_ptr<DeviceChannel> inner_;
  std::atomic<int>* aborts_;
  std::atomic<int>* flushes_;
  const absl::Status flush_error_;
};

class GroupedCpu : public ForwardingBackend {
 public:
  explicit GroupedCpu(InProcessDeviceHub* hub) : ForwardingBackend(CpuBackend()), hub_(hub) {}
  absl::StatusOr<std::unique_ptr<DeviceChannel>> JoinDeviceGroup(const DeviceGroupSpec& group,
                                                                 int stage) override {
    if (!DeviceGroupRank(group, stage).ok()) return DeviceGroupRank(group, stage).status();
    std::lock_guard<std::mutex> lock(mu_);
    join_deadline_ = group.join_deadline;
    join_cancelled_ = group.join_cancelled;
    cancelled_at_join_ = join_cancelled_ != nullptr && join_cancelled_();
    return std::unique_ptr<DeviceChannel>(
        new CountingChannel(hub_->ChannelFor(stage), &aborts, &flushes, flush_error));
  }
  // What the runner's join asked for: a deadline, and a cancel check that
  // was false then; `now` asks the check again.
  absl::Time join_deadline() {
    std::lock_guard<std::mutex> lock(mu_);
    return join_deadline_;
  }
  bool cancelled_at_join() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_at_join_;
  }
  bool cancelled_now() {
    std::lock_guard<std::mutex> lock(mu_);
    return join_cancelled_ != nullptr && join_cancelled_();
  }
  std::atomic<int> aborts{0};
  std::atomic<int> flushes{0};
  absl::Status flush_error;  // set before the runner starts

 private:
  InProcessDeviceHub* hub_;
  std::mutex mu_;
  absl::Time join_deadline_ = absl::InfiniteFuture();
  std::function<bool()> join_cancelled_;
  bool cancelled_at_join_ = true;
};

// Assignment() with its activations and gradients marked for the device
// group of both stages (one host, GPUs 0 and 1).
v1::Assignment GroupAssignment(int stage, int steps) {
  v1::Assignment a = Assignment(stage, steps, false, Schedule::kOneFOneB);
  std::vector<v1::Program> programs = {Assignment(0, steps, false, Schedule::kOneFOneB).program(),
                                       Assignment(1, steps, false, Schedule::kOneFOneB).program()};
  const DeviceLinkPlan plan = PlanDeviceLinks({{"h", 0, "id-0"}, {"h", 1, "id-1"}}, &programs);
  *a.mutable_program() = programs[stage];
  *a.mutable_device_group() = plan.groups.at(0).group;
  return a;
}

// Runs one runner per assignment of `assignments`, worker k on backends[k]
// and fabric's mailbox k (with `checkpoint_root` as --checkpoint-root), to
// the end, then stops them.
template <typename BackendPtr>
void RunToTheEnd(const std::vector<v1::Assignment>& assignments,
                 const std::vector<BackendPtr>& backends, InProcessFabric& fabric, FakeLink& link,
                 const std::string& checkpoint_root = "") {
  std::vector<std::unique_ptr<JobRunner>> runners;
  for (size_t k = 0; k < assignments.size(); ++k) {
    JobRunnerOptions options{"w" + std::to_string(k), 1};
    options.backend = backends[k].get();
    options.checkpoint_root = checkpoint_root;
    runners.push_back(std::make_unique<JobRunner>(assignments[k],
                                                  &fabric.mailbox(static_cast<int>(k)),
                                                  FabricTransports(fabric), &link, options));
  }
  for (auto& r : runners) r->Start();
  for (auto& r : runners) {
    while (!r->finished()) std::this_thread::yield();  // bounded: 2 tiny steps
  }
  for (auto& r : runners) r->Stop();
}

// Two stages of a 2-step job in one device group, each on its GroupedCpu
// (set their fields before Run), run to the end and stopped.
struct GroupedJob {
  InProcessFabric fabric{2};
  InProcessDeviceHub hub{2, absl::Seconds(30)};
  FakeLink link;
  std::vector<std::unique_ptr<GroupedCpu>> backends;

  GroupedJob() {
    for (int s = 0; s < 2; ++s) backends.push_back(std::make_unique<GroupedCpu>(&hub));
  }
  void Run(int steps = 2) {
    RunToTheEnd({GroupAssignment(0, steps), GroupAssignment(1, steps)}, backends, fabric, link);
  }
};

TEST(JobRunnerTest, DeviceGroup_TrainsThroughTheChannelAndNeverAborts) {
  GroupedJob job;
  job.Run();
  FakeLink& link = job.link;
  InProcessDeviceHub& hub = job.hub;
  const auto& backends = job.backends;
  for (const auto& r : link.reports()) EXPECT_TRUE(r.error().empty()) << r.error();
  EXPECT_EQ(link.reports().size(), 4u);
  // Per step: 2 micro-batches, an activation down and a gradient up each.
  EXPECT_EQ(hub.sent(), 2 * 2 * 2);
  EXPECT_EQ(backends[0]->aborts.load() + backends[1]->aborts.load(), 0);
  // Each stage flushed its channel once, after its last step.
  EXPECT_EQ(backends[0]->flushes.load(), 1);
  EXPECT_EQ(backends[1]->flushes.load(), 1);
  // The join was bounded (by the receive timeout) and not cancelled.
  EXPECT_LT(backends[0]->join_deadline(), absl::InfiniteFuture());
  EXPECT_FALSE(backends[0]->cancelled_at_join());
}

// A re-plan's step boundary (the coordinator's stop_after_step) ends each
// stage as the last step does: its device transfers flushed, none aborted.
// The abort it had could cut off a transfer a slower peer still took, which
// then waited with no deadline, and the boundary's checkpoint never came.
TEST(JobRunnerTest, DeviceGroup_StopsAtABoundary_FlushedNotAborted) {
  GroupedJob job;
  job.link.StopAfterStep(1);
  job.Run(/*steps=*/3);
  const std::vector<v1::ReportProgressRequest> reports = job.link.reports();
  ASSERT_EQ(reports.size(), 2u);  // step 1 from each stage, then they stopped
  for (const auto& r : reports) {
    EXPECT_TRUE(r.error().empty()) << r.error();
    EXPECT_EQ(r.iteration(), 0);
    EXPECT_FALSE(r.finished());
  }
  EXPECT_EQ(job.backends[0]->aborts.load() + job.backends[1]->aborts.load(), 0);
  EXPECT_EQ(job.backends[0]->flushes.load(), 1);
  EXPECT_EQ(job.backends[1]->flushes.load(), 1);
}

// Stage 1 alone waits in a device receive for stage 0, which never comes:
// the hub would hold it for 20 s; Stop() aborts the channel at once.
TEST(JobRunnerTest, Stop_AbortsARunnerBlockedInADeviceReceive) {
  InProcessFabric fabric(2);
  InProcessDeviceHub hub(2, absl::Seconds(20));
  FakeLink link(/*stages=*/1);
  GroupedCpu backend(&hub);
  JobRunnerOptions options{"w", 1, absl::Seconds(60)};
  options.backend = &backend;
  auto connect = FabricTransports(fabric);
  JobRunner lonely(GroupAssignment(1, 3), &fabric.mailbox(1), connect, &link, options);
  lonely.Start();
  for (int i = 0; i < 3000 && lonely.current_instruction().rfind("recv", 0) != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));  // polls an observable state
  }
  EXPECT_EQ(lonely.current_instruction(), "recv ACTIVATION unit 1 mb 0 from stage 0");
  const absl::Time start = absl::Now();
  lonely.Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(lonely.finished());
  EXPECT_GE(backend.aborts.load(), 1);
  // A join still waiting would have been cancelled by the stop.
  EXPECT_FALSE(backend.cancelled_at_join());
  EXPECT_TRUE(backend.cancelled_now());
  EXPECT_TRUE(link.reports().empty());  // a stop is not a failure to report
}

// A stage whose last transfers never complete (a peer that never takes its
// send) fails the job with an error saying so, instead of finishing.
TEST(JobRunnerTest, DeviceGroup_LastFlushFails_ReportedAsTheJobsError) {
  GroupedJob job;
  job.backends[0]->flush_error =
      absl::DeadlineExceededError("device channel flush: not done by the deadline");
  job.Run();
  FakeLink& link = job.link;
  const auto& backends = job.backends;
  // Stage 1 may finish, or fail too once stage 0's failure aborted the
  // (shared) hub; stage 0 reports the flush's error and never finishes.
  int stage0_errors = 0;
  for (const auto& r : link.reports()) {
    if (r.worker_id() != "w0") continue;
    EXPECT_FALSE(r.finished()) << "stage 0 must not report finished";
    if (r.error().empty()) continue;
    ++stage0_errors;
    EXPECT_NE(r.error().find("the last step's transfers did not complete"), std::string::npos)
        << r.error();
    EXPECT_NE(r.error().find("not done by the deadline"), std::string::npos) << r.error();
  }
  EXPECT_EQ(stage0_errors, 1);
  EXPECT_EQ(backends[0]->flushes.load(), 1);
}

// A job that fails (here its backend) aborts its channel: its peers may
// never match what is queued.
TEST(JobRunnerTest, FailedJob_AbortsItsDeviceChannel) {
  InProcessFabric fabric(2);
  InProcessDeviceHub hub(2, absl::Seconds(20));
  FakeLink link;
  class FailingGroupedCpu : public GroupedCpu {
   public:
    using GroupedCpu::GroupedCpu;
    absl::Status status() const override { return absl::InternalError("device lost"); }
  };
  GroupedCpu healthy(&hub);
  FailingGroupedCpu failing(&hub);
  std::vector<std::unique_ptr<JobRunner>> runners;
  for (int s = 0; s < 2; ++s) {
    JobRunnerOptions options{"w" + std::to_string(s), 1};
    options.backend = s == 0 ? static_cast<Backend*>(&failing) : &healthy;
    runners.push_back(std::make_unique<JobRunner>(GroupAssignment(s, 2), &fabric.mailbox(s),
                                                  FabricTransports(fabric), &link, options));
  }
  for (auto& r : runners) r->Start();
  while (!runners[0]->finished()) std::this_thread::yield();  // fails at its first instruction
  EXPECT_GE(failing.aborts.load(), 1);
  for (auto& r : runners) r->Stop();  // stage 1, waiting on the aborted hub, ends too
  ASSERT_FALSE(link.reports().empty());
  EXPECT_NE(link.reports()[0].error().find("device lost"), std::string::npos)
      << link.reports()[0].error();
}

// A stage in a device group whose replica group join then fails: the
// channel it joined dies with the failed job, and a later Stop() must not
// touch it (it would abort freed memory: ASan reports a use after free).
TEST(JobRunnerTest, DeviceGroupThenReplicaJoinFails_StopLeavesTheDeadChannelAlone) {
  InProcessFabric fabric(2);
  InProcessDeviceHub hub(2, absl::Seconds(20));
  FakeLink link(/*stages=*/1);
  GroupedCpu backend(&hub);
  JobRunnerOptions options{"w", 1};
  options.backend = &backend;
  v1::Assignment a = GroupAssignment(0, 2);
  a.set_replicas(1);
  a.mutable_replica_device_group()->set_nccl_unique_id("id-r");
  a.mutable_replica_device_group()->add_replicas(1);  // not replica 0: the join refuses it
  JobRunner runner(a, &fabric.mailbox(0), FabricTransports(fabric), &link, options);
  runner.Start();
  ASSERT_TRUE(link.AwaitReports(1));
  while (!runner.finished()) std::this_thread::yield();  // bounded: the job has failed
  runner.Stop();
  EXPECT_EQ(backend.aborts.load(), 0);
  EXPECT_NE(link.reports()[0].error().find("replica_device_group lists 1 replicas"),
            std::string::npos)
      << link.reports()[0].error();
}

// A stage of a device group without the --checkpoint-root its job's
// checkpoints need fails before the start barrier, never reporting ready:
// past the barrier (marked ready) its failure failed the whole job, where
// a joiner outside a group is left out. (Before, it reported ready, then
// waited for the group's other member to join.)
TEST(JobRunnerTest, DeviceGroupWithoutCheckpointRoot_FailsBeforeReportingReady) {
  InProcessFabric fabric(2);
  InProcessDeviceHub hub(2, absl::Seconds(20));
  FakeLink link(/*stages=*/1);
  GroupedCpu backend(&hub);
  JobRunnerOptions options{"w", 1};
  options.backend = &backend;
  v1::Assignment a = GroupAssignment(0, 2);
  a.mutable_spec()->mutable_checkpoint()->set_interval_steps(1);
  JobRunner runner(a, &fabric.mailbox(0), FabricTransports(fabric), &link, options);
  runner.Start();
  ASSERT_TRUE(link.AwaitReports(1));
  runner.Stop();
  const std::vector<v1::ReportProgressRequest> reports = link.reports();
  ASSERT_FALSE(reports.empty());
  EXPECT_FALSE(reports[0].ready()) << "reported ready before failing its own setup";
  EXPECT_NE(reports[0].error().find("--checkpoint-root"), std::string::npos) << reports[0].error();
}

// A device group member reads the checkpoint or the weights it starts from
// before the start barrier: one it cannot use fails it before it reports
// ready. (Before, it read them after passing the barrier and joining the
// group, where its peers' first step waited for the read one receive
// timeout only, not the barrier's 10 minutes: a slow load failed the job's
// every recovery alike.)
TEST(JobRunnerTest, DeviceGroupMemberWithUnusableStartingUnits_FailsBeforeReportingReady) {
  const std::string root = FreshDir("group-unusable-start");
  const GptConfig model = ResolveJobSpec(GroupAssignment(0, 3).spec()).value().train.model;
  std::unique_ptr<GptModel> weights = GptModel::Create(model, 1).value();
  for (Parameter* p : weights->parameters()) p->value[0] = std::nanf("");
  ASSERT_TRUE(SaveWeights(root + "/nan.safetensors", weights->parameters()).ok());
  v1::Assignment resumed = GroupAssignment(0, 3);
  resumed.set_start_iteration(2);
  resumed.mutable_resume()->set_step(2);
  resumed.mutable_resume()->set_dir("ck/step-00000002");  // lists no unit files
  v1::Assignment init = GroupAssignment(0, 3);
  init.set_init_weights("nan.safetensors");
  const std::vector<std::pair<v1::Assignment, std::string>> cases = {
      {resumed, "DATA_LOSS: checkpoint ck/step-00000002 has no file for unit 0"},
      {init, "holds NaN at element 0"}};
  for (const auto& [a, error] : cases) {
    SCOPED_TRACE(error);
    InProcessFabric fabric(2);
    InProcessDeviceHub hub(2, absl::Seconds(20));
    FakeLink link(/*stages=*/1);  // its barrier passes at this stage's report
    GroupedCpu backend(&hub);
    JobRunnerOptions options{"w", 1};
    options.backend = &backend;
    options.checkpoint_root = root;
    JobRunner runner(a, &fabric.mailbox(0), FabricTransports(fabric), &link, options);
    runner.Start();
    ASSERT_TRUE(link.AwaitReports(1));
    runner.Stop();
    EXPECT_TRUE(link.ready_reports().empty()) << "reported ready before reading its units";
    const v1::ReportProgressRequest report = link.reports()[0];
    EXPECT_NE(report.error().find(error), std::string::npos) << report.error();
    EXPECT_EQ(report.checkpoint_unusable(), a.has_resume()) << report.error();
  }
}

// Resumed at step 1, a device group's members read the checkpoint before
// the start barrier (their ready reports carry the time it took), restore
// it once they joined the group, and train steps 1 and 2 as the run that
// never stopped did.
TEST(JobRunnerTest, DeviceGroupResume_ReadBeforeTheBarrier_TrainsAsTheUnbrokenRun) {
  const std::string root = FreshDir("group-resume");
  std::vector<v1::Assignment> unbroken;
  for (int s = 0; s < 2; ++s) {
    unbroken.push_back(GroupAssignment(s, 3));
    unbroken[s].mutable_spec()->mutable_checkpoint()->set_interval_steps(1);
    unbroken[s].mutable_spec()->mutable_checkpoint()->set_dir("ck");
  }
  GroupedJob first;
  RunToTheEnd(unbroken, first.backends, first.fabric, first.link, root);
  std::vector<v1::Assignment> resumed = unbroken;
  std::map<std::pair<std::string, int64_t>, std::vector<float>> losses;  // (worker, iteration)
  for (const v1::ReportProgressRequest& r : first.link.reports()) {
    ASSERT_TRUE(r.error().empty()) << r.error();
    if (!r.has_checkpoint()) {
      losses[{r.worker_id(), r.iteration()}].assign(r.micro_batch_losses().begin(),
                                                    r.micro_batch_losses().end());
    } else if (r.checkpoint().step() == 1) {
      for (v1::Assignment& a : resumed) {
        for (const v1::UnitFile& f : r.checkpoint().units()) *a.mutable_resume()->add_units() = f;
      }
    }
  }
  for (v1::Assignment& a : resumed) {
    a.set_start_iteration(1);
    a.mutable_resume()->set_step(1);
    a.mutable_resume()->set_dir("ck/step-00000001");
    a.mutable_spec()->clear_checkpoint();  // writes none over the unbroken run's
  }
  ASSERT_EQ(resumed[0].resume().units_size(), 4);
  GroupedJob second;
  RunToTheEnd(resumed, second.backends, second.fabric, second.link, root);
  const std::vector<v1::ReportProgressRequest> ready = second.link.ready_reports();
  ASSERT_FALSE(ready.empty());
  for (const v1::ReportProgressRequest& r : ready) {
    EXPECT_GT(r.resume_load_seconds(), 0) << r.worker_id() << " was ready before its load";
  }
  const std::vector<v1::ReportProgressRequest> reports = second.link.reports();
  ASSERT_EQ(reports.size(), 4u);  // each stage's steps 1 and 2
  for (const v1::ReportProgressRequest& r : reports) {
    EXPECT_TRUE(r.error().empty()) << r.error();
    EXPECT_GE(r.iteration(), 1);
    const std::vector<float> got(r.micro_batch_losses().begin(), r.micro_batch_losses().end());
    EXPECT_EQ(got, losses.at({r.worker_id(), r.iteration()}))
        << r.worker_id() << " iteration " << r.iteration();
  }
  EXPECT_EQ(losses.at({"w1", 2}).size(), 2u);  // the last stage's: compared above
}

// --- Replica device groups: the CPU posing as GPUs, collectives of an
// in-process hub.

// Counts the Abort and Flush calls of the collective it wraps.
class CountingCollective : public DeviceCollective {
 public:
  CountingCollective(std::unique_ptr<DeviceCollective> inner, std::atomic<int>* aborts,
                     std::atomic<int>* flushes)
      : inner_(std::move(inner)), aborts_(aborts), flushes_(flushes) {}
  absl::Status AllReduceSum(const std::vector<Tensor*>& tensors) override {
    return inner_->AllReduceSum(tensors);
  }
  absl::Status AwaitSums() override { return inner_->AwaitSums(); }
  absl::Status Flush(absl::Duration timeout, const std::function<bool()>& cancelled) override {
    flushes_->fetch_add(1);
    return inner_->Flush(timeout, cancelled);
  }
  void Abort() override {
    aborts_->fetch_add(1);
    inner_->Abort();
  }

 private:
  std::unique_ptr<DeviceCollective> inner_;
  std::atomic<int>* aborts_;
  std::atomic<int>* flushes_;
};

class ReplicaCpu : public ForwardingBackend {
 public:
  explicit ReplicaCpu(InProcessCollectiveHub* hub) : ForwardingBackend(CpuBackend()), hub_(hub) {}
  absl::StatusOr<std::unique_ptr<DeviceCollective>> JoinDeviceCollective(
      const DeviceCollectiveSpec& spec) override {
    RETURN_IF_ERROR(CheckDeviceCollectiveSpec(spec));
    return std::unique_ptr<DeviceCollective>(
        new CountingCollective(hub_->CollectiveFor(spec.rank), &aborts, &flushes));
  }
  std::atomic<int> aborts{0};
  std::atomic<int> flushes{0};

 private:
  InProcessCollectiveHub* hub_;
};

// Replica `replica` of 2 of a one-stage job whose replicas sum their
// gradients in a replica device group listing `listed` replicas.
v1::Assignment ReplicaAssignment(int replica, int listed) {
  v1::Assignment a = Assignment(0, 2, false, Schedule::kOneFOneB);
  a.mutable_spec()->mutable_parallelism()->set_stages(1);
  a.mutable_spec()->mutable_parallelism()->set_data(2);
  a.set_num_stages(1);
  a.set_replica(replica);
  a.set_replicas(2);
  SetPeers(&a);
  a.mutable_backward_units()->set_begin(0);
  a.mutable_backward_units()->set_end(4);
  *a.mutable_forward_units() = a.backward_units();
  *a.mutable_program() = CompilePrograms({{0, 4}}, 4, 1, Schedule::kOneFOneB).value()[0];
  a.add_optimizer_stages(0);
  a.mutable_replica_device_group()->set_nccl_unique_id("id-0");
  for (int r = 0; r < listed; ++r) a.mutable_replica_device_group()->add_replicas(r);
  return a;
}

// Two replicas, each joining the group and running to the end.
struct ReplicaJob {
  InProcessFabric fabric{2};
  InProcessCollectiveHub hub{2, absl::Seconds(30)};
  FakeLink link;
  std::vector<std::unique_ptr<ReplicaCpu>> backends;

  ReplicaJob() {
    for (int r = 0; r < 2; ++r) backends.push_back(std::make_unique<ReplicaCpu>(&hub));
  }
  void Run(int listed) {
    RunToTheEnd({ReplicaAssignment(0, listed), ReplicaAssignment(1, listed)}, backends, fabric,
                link);
  }
};

// Both replicas sum their gradients through the group's collective (one
// sum per step: the model's one bucket), flush it once after the last step
// and never abort it; the steps' losses are reported as usual.
TEST(JobRunnerTest, ReplicaGroup_SumsThroughTheCollectiveAndNeverAborts) {
  ReplicaJob job;
  job.Run(/*listed=*/2);
  for (const auto& r : job.link.reports()) EXPECT_TRUE(r.error().empty()) << r.error();
  EXPECT_EQ(job.link.reports().size(), 4u);
  EXPECT_EQ(job.hub.sums(), 2);
  for (const auto& backend : job.backends) {
    EXPECT_EQ(backend->flushes.load(), 1);
    EXPECT_EQ(backend->aborts.load(), 0);
  }
}

// A group that leaves a replica out would sum only some replicas'
// gradients: refused as the job's error before any step.
TEST(JobRunnerTest, ReplicaGroup_NotEveryReplica_ReportedAsTheJobsError) {
  ReplicaJob job;
  job.Run(/*listed=*/1);
  ASSERT_FALSE(job.link.reports().empty());
  for (const auto& r : job.link.reports()) {
    EXPECT_NE(r.error().find("replica_device_group lists 1 replicas; want 0 .. 1"),
              std::string::npos)
        << r.error();
  }
  EXPECT_EQ(job.hub.sums(), 0);
}

}  // namespace
}  // namespace pipetrain
