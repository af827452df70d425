// Drives AssignmentStreams through a fake gRPC writer: no sockets and no gRPC
// threads, so TSan checks the stream's own synchronisation (Debian's gRPC is
// not TSan-instrumented; see tsan_options_testing.cc).
#include "coordinator/api/assignment_streams.h"

#include <grpcpp/impl/codegen/proto_utils.h>  // SerializationTraits of protobuf messages

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "coordinator/jobs/assignment_hub.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

constexpr absl::Duration kWait = absl::Seconds(30);  // only a deadline: never waited out

v1::Assignment RunAssignment(int64_t version) {
  v1::Assignment assignment;
  assignment.set_action(v1::Assignment::ACTION_RUN);
  assignment.set_job_id("job-1");
  assignment.set_plan_version(version);
  return assignment;
}

// Stands in for gRPC's side of a server-streaming call: records writes,
// cancels and the final status; the test completes writes (OnWriteDone) when
// it chooses, also after a cancel.
class FakeWriter final : public grpc::ServerCallbackWriter<grpc::ByteBuffer> {
 public:
  void Bind(grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor) {
    reactor_ = reactor;
    BindReactor(reactor);
  }

  void Finish(grpc::Status status) override {
    AnnotatedMutexLock lock(&mu_);
    EXPECT_FALSE(status_.has_value()) << "Finish called twice";
    EXPECT_FALSE(pending_) << "Finish called with a write in flight";
    status_ = std::move(status);
  }
  void SendInitialMetadata() override {}
  void Write(const grpc::ByteBuffer* bytes, grpc::WriteOptions) override {
    // The stream writes serialized assignments (its method is a raw one).
    grpc::ByteBuffer consumed(*bytes);
    v1::Assignment message;
    EXPECT_TRUE(grpc::SerializationTraits<v1::Assignment>::Deserialize(&consumed, &message).ok());
    AnnotatedMutexLock lock(&mu_);
    EXPECT_FALSE(pending_) << "two writes in flight";
    EXPECT_FALSE(status_.has_value()) << "Write after Finish";
    pending_ = true;
    versions_.push_back(message.plan_version());
    actions_.push_back(message.action());
  }
  void WriteAndFinish(const grpc::ByteBuffer*, grpc::WriteOptions, grpc::Status) override {
    ADD_FAILURE() << "WriteAndFinish is not used";
  }
  // The call's context->TryCancel(): only recorded, as gRPC runs no
  // reaction inline; the test then fails the write as gRPC would.
  void TryCancel() {
    AnnotatedMutexLock lock(&mu_);
    EXPECT_FALSE(status_.has_value()) << "cancel after Finish";
    ++cancels_;
  }

  // Completes the write in flight as gRPC would, outside the fake's lock.
  void CompleteWrite(bool ok) {
    {
      AnnotatedMutexLock lock(&mu_);
      ASSERT_TRUE(pending_);
      pending_ = false;
    }
    reactor_->OnWriteDone(ok);
  }

  // The version of the write in flight, once there is one (-1 on timeout).
  int64_t AwaitPendingWrite() {
    AnnotatedMutexLock lock(&mu_);
    auto pending = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_; };
    if (!mu_.AwaitWithTimeout(pending, kWait)) return -1;
    return versions_.back();
  }

  std::vector<int64_t> versions() {
    AnnotatedMutexLock lock(&mu_);
    return versions_;
  }
  std::vector<int> actions() {
    AnnotatedMutexLock lock(&mu_);
    return actions_;
  }
  bool pending() {
    AnnotatedMutexLock lock(&mu_);
    return pending_;
  }
  int cancels() {
    AnnotatedMutexLock lock(&mu_);
    return cancels_;
  }
  std::optional<grpc::Status> status() {
    AnnotatedMutexLock lock(&mu_);
    return status_;
  }

 private:
  grpc::internal::ServerReactor* reactor() override { return reactor_; }
  void CallOnDone() override {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor_ = nullptr;
  AnnotatedMutex mu_;
  bool pending_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int64_t> versions_ ABSL_GUARDED_BY(mu_);
  std::vector<int> actions_ ABSL_GUARDED_BY(mu_);
  int cancels_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<grpc::Status> status_ ABSL_GUARDED_BY(mu_);
};

class AssignmentStreamsTest : public ::testing::Test {
 protected:
  // Opens a stream for w-1 and binds it to `writer`, as gRPC does after the
  // method returns; the stream cancels its call through `writer`.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Open(FakeWriter& writer, int64_t incarnation = 1) {
    grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor =
        streams_.Open("w-1", incarnation, [&writer] { writer.TryCancel(); });
    writer.Bind(reactor);
    return reactor;
  }

  AssignmentHub hub_;
  // Who the set heard went away (the watcher-gone listener).
  std::vector<std::pair<std::string, int64_t>> gone_;
  AssignmentStreams streams_{&hub_, [this](const std::string& worker, int64_t incarnation) {
                               gone_.emplace_back(worker, incarnation);
                             }};
};

TEST_F(AssignmentStreamsTest, Open_WorkerHasAssignment_WritesItFirst) {
  hub_.Set("w-1", RunAssignment(1));
  FakeWriter writer;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor = Open(writer);
  EXPECT_EQ(writer.versions(), std::vector<int64_t>({1}));
  writer.CompleteWrite(true);
  EXPECT_FALSE(writer.pending());  // nothing newer
  EXPECT_EQ(streams_.size(), 1);
  streams_.Shutdown();
  reactor->OnDone();
  EXPECT_EQ(streams_.size(), 0);
}

TEST_F(AssignmentStreamsTest, Set_WhileWriteInFlight_SendsOnlyTheLatestAfterIt) {
  FakeWriter writer;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor = Open(writer);
  EXPECT_TRUE(writer.versions().empty());
  hub_.Set("w-1", RunAssignment(1));
  hub_.Set("w-1", RunAssignment(2));
  hub_.Set("w-1", RunAssignment(3));
  hub_.Set("w-2", RunAssignment(9));  // another worker's: not ours
  EXPECT_EQ(writer.versions(), std::vector<int64_t>({1}));
  writer.CompleteWrite(true);
  EXPECT_EQ(writer.versions(), std::vector<int64_t>({1, 3}));
  writer.CompleteWrite(true);
  streams_.Shutdown();
  reactor->OnDone();
}

TEST_F(AssignmentStreamsTest, Supersede_OlderIncarnation_FinishesAborted) {
  FakeWriter old_writer, new_writer;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* old_stream = Open(old_writer, 1);
  grpc::ServerWriteReactor<grpc::ByteBuffer>* new_stream = Open(new_writer, 2);  // supersedes 1
  ASSERT_TRUE(old_writer.status().has_value());
  EXPECT_EQ(old_writer.status()->error_code(), grpc::StatusCode::ABORTED);
  EXPECT_TRUE(absl::StrContains(old_writer.status()->error_message(),
                                "incarnation 1 was superseded by incarnation 2"))
      << old_writer.status()->error_message();
  old_stream->OnDone();
  streams_.Supersede("w-1", 2);  // not older than itself
  EXPECT_FALSE(new_writer.status().has_value());
  streams_.Shutdown();
  new_stream->OnDone();
}

// A worker watches on one stream: a second watch of the same incarnation
// ends the first (each held a copy of the assignment: a worker opening
// thousands grew the coordinator without end), and no watcher is lost.
TEST_F(AssignmentStreamsTest, SecondWatchOfAnIncarnation_EndsTheFirst) {
  FakeWriter first_writer, second_writer;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* first = Open(first_writer, 1);
  grpc::ServerWriteReactor<grpc::ByteBuffer>* second = Open(second_writer, 1);
  ASSERT_TRUE(first_writer.status().has_value());
  EXPECT_EQ(first_writer.status()->error_code(), grpc::StatusCode::ABORTED);
  EXPECT_TRUE(absl::StrContains(first_writer.status()->error_message(),
                                "opened another watch, which replaces this one"))
      << first_writer.status()->error_message();
  first->OnCancel();  // the client learns of its end: not a watcher gone
  first->OnDone();
  EXPECT_TRUE(gone_.empty());
  EXPECT_EQ(streams_.size(), 1);
  hub_.Set("w-1", RunAssignment(5));
  EXPECT_EQ(second_writer.versions(), std::vector<int64_t>({5}));
  second_writer.CompleteWrite(true);
  streams_.Shutdown();
  second->OnDone();
}

// The write was taken before the cancel landed.
TEST_F(AssignmentStreamsTest, Supersede_DuringWrite_FinishesAfterTheWrite) {
  hub_.Set("w-1", RunAssignment(1));
  FakeWriter writer;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor = Open(writer);
  streams_.Supersede("w-1", 2);
  EXPECT_EQ(writer.cancels(), 1);
  EXPECT_FALSE(writer.status().has_value());  // one operation at a time
  hub_.Set("w-1", RunAssignment(2));          // ending: not sent
  writer.CompleteWrite(true);
  ASSERT_TRUE(writer.status().has_value());
  EXPECT_EQ(writer.status()->error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(writer.versions(), std::vector<int64_t>({1}));
  reactor->OnDone();
}

// A client that never takes the write in flight (it grants no flow-control
// window) does not keep its superseded stream: the call is cancelled, gRPC
// fails the write, and the worker is left with its new stream only. The
// stream was ended on purpose: no watcher is reported gone.
TEST_F(AssignmentStreamsTest, Supersede_WriteNeverCompletes_StreamIsCancelled) {
  hub_.Set("w-1", RunAssignment(1));
  FakeWriter old_writer, new_writer;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* old_stream = Open(old_writer, 1);
  grpc::ServerWriteReactor<grpc::ByteBuffer>* new_stream = Open(new_writer, 1);  // replaces it
  ASSERT_EQ(old_writer.cancels(), 1);
  EXPECT_FALSE(old_writer.status().has_value());  // one operation at a time
  // What gRPC does after the cancel: fails the write, tells of the cancel.
  old_writer.CompleteWrite(false);
  ASSERT_TRUE(old_writer.status().has_value());
  EXPECT_EQ(old_writer.status()->error_code(), grpc::StatusCode::ABORTED);
  old_stream->OnCancel();
  old_stream->OnDone();
  EXPECT_EQ(streams_.size(), 1);
  EXPECT_TRUE(gone_.empty());
  EXPECT_EQ(new_writer.cancels(), 0);
  EXPECT_EQ(new_writer.versions(), std::vector<int64_t>({1}));
  new_writer.CompleteWrite(true);
  streams_.Shutdown();
  EXPECT_EQ(new_writer.cancels(), 0);  // nothing in flight: finished at once
  new_stream->OnDone();
  EXPECT_EQ(streams_.size(), 0);
}

// At shutdown a write in flight is not cancelled: the client is told
// UNAVAILABLE (a worker then moves on to the next coordinator; CANCELLED
// would keep it here), and the server's shutdown deadline bounds the wait.
TEST_F(AssignmentStreamsTest, Shutdown_WriteInFlight_NotCancelledFinishesUnavailable) {
  hub_.Set("w-1", RunAssignment(1));
  FakeWriter writer;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor = Open(writer);
  streams_.Shutdown();
  ASSERT_EQ(writer.cancels(), 0);
  EXPECT_FALSE(writer.status().has_value());
  writer.CompleteWrite(false);
  ASSERT_TRUE(writer.status().has_value());
  EXPECT_EQ(writer.status()->error_code(), grpc::StatusCode::UNAVAILABLE);
  reactor->OnCancel();
  reactor->OnDone();
  EXPECT_EQ(streams_.size(), 0);
  EXPECT_TRUE(gone_.empty());
}

TEST_F(AssignmentStreamsTest, Shutdown_EndsStreamsAndLaterOpensUnavailable) {
  FakeWriter writer, late_writer;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor = Open(writer);
  streams_.Shutdown();
  ASSERT_TRUE(writer.status().has_value());
  EXPECT_EQ(writer.status()->error_code(), grpc::StatusCode::UNAVAILABLE);
  reactor->OnDone();

  hub_.Set("w-1", RunAssignment(1));
  grpc::ServerWriteReactor<grpc::ByteBuffer>* late = Open(late_writer);
  ASSERT_TRUE(late_writer.status().has_value());
  EXPECT_EQ(late_writer.status()->error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(late_writer.versions().empty());
  late->OnDone();
  EXPECT_EQ(streams_.size(), 0);
}

TEST_F(AssignmentStreamsTest, OnCancel_FinishesCancelled) {
  FakeWriter writer;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor = Open(writer);
  reactor->OnCancel();
  ASSERT_TRUE(writer.status().has_value());
  EXPECT_EQ(writer.status()->error_code(), grpc::StatusCode::CANCELLED);
  reactor->OnDone();
  EXPECT_EQ(gone_, (std::vector<std::pair<std::string, int64_t>>{{"w-1", 1}}));
}

TEST_F(AssignmentStreamsTest, OnCancelAfterWeEndedIt_NoWatcherGone) {
  FakeWriter writer, newer;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor = Open(writer, 1);
  grpc::ServerWriteReactor<grpc::ByteBuffer>* second = Open(newer, 2);  // supersedes 1
  reactor->OnCancel();
  reactor->OnDone();
  streams_.Shutdown();
  second->OnCancel();  // cancelled by our own shutdown
  second->OnDone();
  EXPECT_TRUE(gone_.empty());
}

TEST_F(AssignmentStreamsTest, WriteFails_FinishesCancelled) {
  hub_.Set("w-1", RunAssignment(1));
  FakeWriter writer;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor = Open(writer);
  writer.CompleteWrite(false);
  ASSERT_TRUE(writer.status().has_value());
  EXPECT_EQ(writer.status()->error_code(), grpc::StatusCode::CANCELLED);
  reactor->OnDone();
}

TEST_F(AssignmentStreamsTest, OnDone_Unsubscribes) {
  FakeWriter writer;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor = Open(writer);
  reactor->OnCancel();
  reactor->OnDone();  // deletes the stream
  EXPECT_EQ(streams_.size(), 0);
  hub_.Set("w-1", RunAssignment(1));  // must not reach the deleted stream
  EXPECT_TRUE(writer.versions().empty());
}

// Assignments set on one thread while another completes writes, as gRPC's
// threads would: every write is newer than the one before and the last one
// set is always delivered.
TEST_F(AssignmentStreamsTest, ConcurrentSetsAndWriteCompletions_DeliverTheLatestInOrder) {
  constexpr int kSets = 300;
  FakeWriter writer;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor = Open(writer);
  std::thread setter([this] {
    for (int v = 1; v <= kSets; ++v) hub_.Set("w-1", RunAssignment(v));
  });
  std::thread completer([&writer] {
    for (int64_t version = 0; version != kSets;) {
      version = writer.AwaitPendingWrite();
      ASSERT_NE(version, -1) << "no write within the deadline";
      writer.CompleteWrite(true);
    }
  });
  setter.join();
  completer.join();
  const std::vector<int64_t> versions = writer.versions();
  ASSERT_FALSE(versions.empty());
  EXPECT_EQ(versions.back(), kSets);
  for (size_t i = 1; i < versions.size(); ++i) EXPECT_LT(versions[i - 1], versions[i]);
  streams_.Shutdown();
  ASSERT_TRUE(writer.status().has_value());
  reactor->OnDone();
}

// Shutdown racing with assignments being set and written.
TEST_F(AssignmentStreamsTest, ShutdownDuringWrites_FinishesExactlyOnce) {
  FakeWriter writer;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor = Open(writer);
  std::thread setter([this] {
    for (int v = 1; v <= 100; ++v) hub_.Set("w-1", RunAssignment(v));
  });
  std::thread stopper([this] { streams_.Shutdown(); });
  setter.join();
  stopper.join();
  if (writer.pending()) writer.CompleteWrite(true);  // the deferred Finish follows
  ASSERT_TRUE(writer.status().has_value());          // FakeWriter checks "exactly once"
  EXPECT_EQ(writer.status()->error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(writer.pending());
  reactor->OnDone();
}

}  // namespace
}  // namespace pipetrain
