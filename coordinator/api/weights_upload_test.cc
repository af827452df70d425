// Drives the UploadWeights reactor through a fake gRPC reader over a real
// JobManager: no sockets and no gRPC threads, so TSan checks the hand-offs
// between the "gRPC" thread (the test) and the service's executor.
#include "coordinator/api/weights_upload.h"

#include <limits>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "common/clock.h"
#include "coordinator/api/bad_specs_testing.h"
#include "coordinator/api/caller_auth.h"
#include "coordinator/api/coordinator_metrics.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/registry/worker_registry.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace pipetrain {
namespace {

constexpr absl::Duration kWait = absl::Seconds(30);  // only a deadline: never waited out

// Stands in for gRPC's side of a client-streaming call: the reactor's reads
// wait here until the test delivers a chunk or the end of the stream.
class FakeReader final : public grpc::ServerCallbackReader<v1::WeightsChunk> {
 public:
  void Bind(grpc::ServerReadReactor<v1::WeightsChunk>* reactor) {
    reactor_ = reactor;
    BindReactor(reactor);
  }

  void Finish(grpc::Status status) override {
    AnnotatedMutexLock lock(&mu_);
    EXPECT_FALSE(status_.has_value()) << "Finish called twice";
    EXPECT_EQ(target_, nullptr) << "Finish called with a read in flight";
    status_ = std::move(status);
  }
  void SendInitialMetadata() override {}
  void Read(v1::WeightsChunk* message) override {
    AnnotatedMutexLock lock(&mu_);
    EXPECT_EQ(target_, nullptr) << "two reads in flight";
    target_ = message;
  }

  // Waits for the reactor's next read, fills it with `chunk` and reports it
  // done, as gRPC would. False if no read came before the deadline.
  bool Deliver(const v1::WeightsChunk& chunk) { return Complete(&chunk); }
  // Ends the client's side of the stream.
  bool EndStream() { return Complete(nullptr); }

  // Whether the reactor finished the call already (no wait).
  bool Finished() {
    AnnotatedMutexLock lock(&mu_);
    return status_.has_value();
  }

  // The call's status once the reactor finished it.
  std::optional<grpc::Status> AwaitStatus() {
    AnnotatedMutexLock lock(&mu_);
    auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return status_.has_value(); };
    mu_.AwaitWithTimeout(finished, kWait);
    return status_;
  }

 private:
  bool Complete(const v1::WeightsChunk* chunk) {
    {
      AnnotatedMutexLock lock(&mu_);
      auto reading = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return target_ != nullptr; };
      if (!mu_.AwaitWithTimeout(reading, kWait)) return false;
      if (chunk != nullptr) *target_ = *chunk;
      target_ = nullptr;
    }
    reactor_->OnReadDone(chunk != nullptr);
    return true;
  }

  grpc::internal::ServerReactor* reactor() override { return reactor_; }
  void CallOnDone() override {}

  grpc::ServerReadReactor<v1::WeightsChunk>* reactor_ = nullptr;
  AnnotatedMutex mu_;
  v1::WeightsChunk* target_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::optional<grpc::Status> status_ ABSL_GUARDED_BY(mu_);
};

v1::WeightsChunk Chunk(const std::string& job, int64_t offset) {
  v1::WeightsChunk chunk;
  chunk.set_worker_id("w-1");
  chunk.set_job_id(job);
  chunk.set_tensor_name("wpe.weight");  // [max_seq_len 8, d_model 16] in ValidSpecJson()
  chunk.add_shape(8);
  chunk.add_shape(16);
  chunk.set_offset(offset);
  for (int i = 0; i < 4; ++i) chunk.add_values(static_cast<float>(offset + i));
  return chunk;
}

class WeightsUploadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::RegisterWorkerRequest worker;
    worker.set_data_address("127.0.0.1:9001");
    absl::StatusOr<v1::RegisterWorkerResponse> registered = workers_.Register(worker);
    ASSERT_TRUE(registered.ok()) << registered.status();
    authorization_ = "Bearer " + registered->session_token();
    absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(ValidSpecJson());
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<v1::Job> job = jobs_.Submit(*spec);
    ASSERT_TRUE(job.ok()) << job.status();
    jobs_.AwaitBackgroundWork();
    ASSERT_EQ(jobs_.Get(job->id())->state(), v1::JOB_STATE_RUNNING);
    job_id_ = job->id();
  }

  // Starts an upload call bound to `reader` with w-1's credential, or with
  // `authorization`.
  grpc::ServerReadReactor<v1::WeightsChunk>* Start(FakeReader& reader) {
    return Start(reader, authorization_);
  }
  grpc::ServerReadReactor<v1::WeightsChunk>* Start(FakeReader& reader,
                                                   const std::string& authorization) {
    grpc::ServerReadReactor<v1::WeightsChunk>* reactor = NewWeightsUpload(
        &context_, authorization, &auth_, &metrics_, &jobs_,
        [this](const std::string&) { return &executor_; }, &open_);
    reader.Bind(reactor);
    return reactor;
  }

  FakeClock clock_;
  WorkerRegistry workers_{WorkerRegistry::Options{.clock = &clock_}};
  AssignmentHub hub_;
  JobManager jobs_{&workers_, &hub_, &clock_};
  CoordinatorMetrics metrics_{&workers_, &jobs_};
  const CallerAuth auth_{"", &workers_};
  OpenUploads open_;
  std::string authorization_;  // w-1's session credential
  std::string job_id_;
  grpc::CallbackServerContext context_;
  SerialExecutor executor_;  // last: joined first
};

TEST_F(WeightsUploadTest, TwoChunksThenEnd_StoresThemAndFinishesOk) {
  FakeReader reader;
  grpc::ServerReadReactor<v1::WeightsChunk>* reactor = Start(reader);
  ASSERT_TRUE(reader.Deliver(Chunk(job_id_, 0)));
  ASSERT_TRUE(reader.Deliver(Chunk(job_id_, 4)));
  ASSERT_TRUE(reader.EndStream());
  std::optional<grpc::Status> status = reader.AwaitStatus();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok()) << status->error_message();
  reactor->OnDone();
}

// One upload per worker at a time: a second while one is open ends
// UNAVAILABLE before reading (the worker retries it: the first is often its
// own broken stream, not yet closed here); once the first has its status, another
// may open, even before gRPC has run the first's OnDone (it may run it after
// the client has the status).
TEST_F(WeightsUploadTest, SecondUploadWhileOneIsOpen_UnavailableToRetry) {
  FakeReader first;
  grpc::ServerReadReactor<v1::WeightsChunk>* open = Start(first);
  ASSERT_TRUE(first.Deliver(Chunk(job_id_, 0)));
  FakeReader second;
  grpc::ServerReadReactor<v1::WeightsChunk>* refused = Start(second);
  std::optional<grpc::Status> status = second.AwaitStatus();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::UNAVAILABLE) << status->error_message();
  EXPECT_TRUE(absl::StrContains(status->error_message(), "has an upload open already"))
      << status->error_message();
  refused->OnDone();
  ASSERT_TRUE(first.Deliver(Chunk(job_id_, 4)));
  ASSERT_TRUE(first.EndStream());
  status = first.AwaitStatus();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok()) << status->error_message();
  FakeReader third;
  grpc::ServerReadReactor<v1::WeightsChunk>* again = Start(third);
  ASSERT_TRUE(third.Deliver(Chunk(job_id_, 8)));  // read: not refused
  open->OnDone();                                 // the first's, late: frees nothing of the third's
  FakeReader fourth;
  grpc::ServerReadReactor<v1::WeightsChunk>* fourth_call = Start(fourth);
  status = fourth.AwaitStatus();  // the third is still open
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::UNAVAILABLE) << status->error_message();
  fourth_call->OnDone();
  ASSERT_TRUE(third.EndStream());
  ASSERT_TRUE(third.AwaitStatus().has_value());
  again->OnDone();
}

// A stream the client abandons while its chunk waits on the strand (no
// read pending: a job's weights file being reserved, or a slow write, holds
// the strand) frees its worker's slot at once: the worker's retry is read,
// not refused UNAVAILABLE until the abandoned chunk's turn comes.
TEST_F(WeightsUploadTest, CancelledWhileItsChunkWaitsOnTheStrand_RetryNotRefused) {
  AnnotatedMutex gate_mu;
  bool open_gate = false;
  executor_.Post([&] {  // holds the strand until the test opens the gate
    AnnotatedMutexLock lock(&gate_mu);
    EXPECT_TRUE(gate_mu.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gate_mu) { return open_gate; }, kWait));
  });
  FakeReader first;
  grpc::ServerReadReactor<v1::WeightsChunk>* abandoned = Start(first);
  ASSERT_TRUE(first.Deliver(Chunk(job_id_, 0)));  // queued behind the gate
  abandoned->OnCancel();                          // as gRPC does when the client goes away
  FakeReader retry;
  grpc::ServerReadReactor<v1::WeightsChunk>* again = Start(retry);
  EXPECT_FALSE(retry.Finished()) << retry.AwaitStatus()->error_message();
  {
    AnnotatedMutexLock lock(&gate_mu);
    open_gate = true;
  }
  // The retry uploads the whole tensor and completes the stage.
  ASSERT_TRUE(retry.Deliver(Chunk(job_id_, 0)));
  ASSERT_TRUE(retry.Deliver(Chunk(job_id_, 4)));
  ASSERT_TRUE(retry.EndStream());
  const std::optional<grpc::Status> status = retry.AwaitStatus();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok()) << status->error_message();
  // Only then does the abandoned stream's read end (this fake's context is
  // never cancelled, so it ends as a finished stream would, refused now),
  // and its late close frees nothing of another's.
  ASSERT_TRUE(first.EndStream());
  ASSERT_TRUE(first.AwaitStatus().has_value());
  abandoned->OnDone();
  again->OnDone();
  FakeReader third;
  grpc::ServerReadReactor<v1::WeightsChunk>* later = Start(third);
  EXPECT_FALSE(third.Finished());  // its slot was free
  ASSERT_TRUE(third.EndStream());
  ASSERT_TRUE(third.AwaitStatus().has_value());
  later->OnDone();
}

// A worker's slot is held by a ticket: a stream that closes it late (its
// end behind other work, after the client abandoned it and the slot was
// freed early) frees nothing of a newer stream's.
TEST(OpenUploadsTest, CloseWithAStaleTicket_LeavesTheNewerStreamsSlot) {
  OpenUploads open;
  const std::optional<uint64_t> first = open.TryOpen("w-1");
  ASSERT_TRUE(first.has_value());
  EXPECT_FALSE(open.TryOpen("w-1").has_value());
  EXPECT_TRUE(open.TryOpen("w-2").has_value());  // another worker's
  open.Close("w-1", *first);
  const std::optional<uint64_t> second = open.TryOpen("w-1");
  ASSERT_TRUE(second.has_value());
  open.Close("w-1", *first);  // the first stream's end, late
  EXPECT_FALSE(open.TryOpen("w-1").has_value());
  open.Close("w-1", *second);
  EXPECT_TRUE(open.TryOpen("w-1").has_value());
}

TEST_F(WeightsUploadTest, ChunkPastTheTensor_FinishesInvalidArgument) {
  FakeReader reader;
  grpc::ServerReadReactor<v1::WeightsChunk>* reactor = Start(reader);
  ASSERT_TRUE(reader.Deliver(Chunk(job_id_, 126)));
  std::optional<grpc::Status> status = reader.AwaitStatus();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status->error_message(), "wpe.weight")) << status->error_message();
  reactor->OnDone();
}

// A stage checks its weights are finite before it uploads them; one that
// sends a NaN or an infinity anyway is refused, so the job's file never
// holds one.
TEST_F(WeightsUploadTest, NonFiniteValue_FinishesInvalidArgument) {
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    FakeReader reader;
    grpc::ServerReadReactor<v1::WeightsChunk>* reactor = Start(reader);
    v1::WeightsChunk chunk = Chunk(job_id_, 8);
    chunk.set_values(2, bad);
    ASSERT_TRUE(reader.Deliver(chunk));
    std::optional<grpc::Status> status = reader.AwaitStatus();
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(status->error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(absl::StrContains(status->error_message(), "wpe.weight holds "))
        << status->error_message();
    EXPECT_TRUE(
        absl::StrContains(status->error_message(),
                          " at index 2 of the chunk at offset 8 (element 10); weights must be "
                          "finite"))
        << status->error_message();
    reactor->OnDone();
  }
}

TEST_F(WeightsUploadTest, ChunkOfAnotherJob_FinishesInvalidArgument) {
  FakeReader reader;
  grpc::ServerReadReactor<v1::WeightsChunk>* reactor = Start(reader);
  ASSERT_TRUE(reader.Deliver(Chunk(job_id_, 0)));
  ASSERT_TRUE(reader.Deliver(Chunk("job-9", 4)));
  std::optional<grpc::Status> status = reader.AwaitStatus();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status->error_message(), "job job-9")) << status->error_message();
  reactor->OnDone();
}

TEST_F(WeightsUploadTest, UnknownJob_FinishesNotFound) {
  FakeReader reader;
  grpc::ServerReadReactor<v1::WeightsChunk>* reactor = Start(reader);
  ASSERT_TRUE(reader.Deliver(Chunk("job-9", 0)));
  std::optional<grpc::Status> status = reader.AwaitStatus();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::NOT_FOUND);
  reactor->OnDone();
}

TEST_F(WeightsUploadTest, NoOrWrongCredential_FinishesUnauthenticatedBeforeReading) {
  for (const std::string authorization : {"", "Bearer w-1.1.0000", "Basic x"}) {
    FakeReader reader;
    grpc::ServerReadReactor<v1::WeightsChunk>* reactor = Start(reader, authorization);
    std::optional<grpc::Status> status = reader.AwaitStatus();
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(status->error_code(), grpc::StatusCode::UNAUTHENTICATED) << authorization;
    reactor->OnDone();
  }
  EXPECT_EQ(jobs_.Get(job_id_)->state(), v1::JOB_STATE_RUNNING);
}

TEST_F(WeightsUploadTest, ChunkNamingAnotherWorker_FinishesPermissionDenied) {
  FakeReader reader;
  grpc::ServerReadReactor<v1::WeightsChunk>* reactor = Start(reader);
  v1::WeightsChunk chunk = Chunk(job_id_, 0);
  chunk.set_worker_id("w-2");
  ASSERT_TRUE(reader.Deliver(chunk));
  std::optional<grpc::Status> status = reader.AwaitStatus();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(absl::StrContains(status->error_message(), "w-2")) << status->error_message();
  reactor->OnDone();
}

TEST_F(WeightsUploadTest, EmptyStream_FinishesInvalidArgument) {
  FakeReader reader;
  grpc::ServerReadReactor<v1::WeightsChunk>* reactor = Start(reader);
  ASSERT_TRUE(reader.EndStream());
  std::optional<grpc::Status> status = reader.AwaitStatus();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status->error_message(), "no chunks")) << status->error_message();
  reactor->OnDone();
}

}  // namespace
}  // namespace pipetrain
