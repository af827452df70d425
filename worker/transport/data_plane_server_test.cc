// DataPlaneServer against a raw gRPC client on loopback: a stream whose
// sender runs beyond the mailbox's run-ahead window, or whose tensor only
// lacks room in a full mailbox, is held (backpressure), not refused, and
// every way a hold can end; a tensor over the whole byte limit is still
// refused; a job change ends the old job's streams.
// Every wait is on a condition (Mailbox::AwaitHeld, a Take, a stream read).
#include "worker/transport/data_plane_server.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "common/data_plane_keys.h"
#include "gtest/gtest.h"
#include "proto/pipetrain/v1/dataplane.grpc.pb.h"
#include "worker/transport/data_plane_auth.h"
#include "worker/transport/frame_codec.h"
#include "worker/transport/mailbox.h"

namespace pipetrain {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(60);  // Deadlines only; never waited out.
constexpr char kJob[] = "j-1";
constexpr char kSecret[] = "5ecre7-of-j-1";  // the plan secret the keys derive from
// The server plays this worker of the job's two.
constexpr int kSelf = 1;

std::string ReceiveKey(const std::string& job) { return DataPlaneReceiveKey(kSecret, job, kSelf); }

// What worker `stage` of `job` proves its streams to the server with.
std::string ProofFrom(const std::string& job, int stage) {
  return StreamProof(DataPlaneLinkKey(ReceiveKey(job), job, stage), job, stage);
}
// The receiving stage is at this iteration; run-ahead 2 ends its window at 9.
constexpr int64_t kStageIteration = 7;
// For streams the server must end: a regression shows as their deadline,
// within the test's timeout.
constexpr absl::Duration kEndPatience = absl::Seconds(20);

using FrameStream = grpc::ClientReaderWriter<v1::TensorFrame, v1::FrameError>;

TensorAddress At(int64_t iteration, int unit) {
  return {kJob, iteration, v1::TENSOR_KIND_ACTIVATION, /*micro_batch=*/0, unit};
}

// A raw tensor of `floats` values that tell `seed` apart.
WireTensor Values(int64_t floats, float seed) {
  Tensor t = Tensor::Zeros({floats});
  for (int64_t i = 0; i < floats; ++i) t[i] = seed + static_cast<float>(i);
  return WireTensor::Raw(std::move(t));
}

class DataPlaneServerTest : public ::testing::Test {
 protected:
  void StartServer(MailboxLimits limits = {}) {
    mailbox_ = std::make_unique<Mailbox>(limits);
    mailbox_->OpenJob(kJob, kStageIteration);
    absl::StatusOr<std::unique_ptr<DataPlaneServer>> server =
        DataPlaneServer::Start("127.0.0.1:0", mailbox_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    server_->SetJob(kJob, 2, ReceiveKey(kJob));
    stub_ = v1::DataPlaneService::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    if (mailbox_ != nullptr) mailbox_->Shutdown();
  }

  // A stream proven as `stage` of the job.
  std::unique_ptr<FrameStream> Open(grpc::ClientContext& context, int stage = 0,
                                    absl::Duration patience = kPatience) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + patience));
    context.AddMetadata(kJobMetadataKey, kJob);
    context.AddMetadata(kStageMetadataKey, std::to_string(stage));
    context.AddMetadata(kProofMetadataKey, ProofFrom(kJob, stage));
    return stub_->Stream(&context);
  }

  static void Write(FrameStream& stream, const TensorAddress& address, const WireTensor& wire,
                    int stage = 0) {
    for (const v1::TensorFrame& frame : EncodeTensorFrames(stage, address, wire)) {
      ASSERT_TRUE(stream.Write(frame));
    }
  }

  // What the stage does when it reaches `iteration`: a Take moves the window.
  void StageReaches(int64_t iteration) {
    EXPECT_EQ(mailbox_->Take(0, At(iteration, 99), absl::ZeroDuration()).status().code(),
              absl::StatusCode::kDeadlineExceeded);
  }

  void ExpectTaken(const TensorAddress& address, const WireTensor& sent, int stage = 0) {
    absl::StatusOr<WireTensor> got = mailbox_->Take(stage, address, kPatience);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->tensor.ToVector(), sent.tensor.ToVector()) << address.DebugString();
  }

  // The streams of stage 0, every one it may hold open at once.
  struct AdmittedStreams {
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;  // Outlive their streams.
    std::vector<std::unique_ptr<FrameStream>> streams;
  };

  // Opens kMaxStreamsPerSourceStage streams of stage 0, each delivering
  // tensor i of kStageIteration: taken, so the server runs its reactor and
  // the stream holds its slot.
  AdmittedStreams OpenAdmittedStreams(absl::Duration patience = kPatience) {
    AdmittedStreams admitted;
    for (int i = 0; i < kMaxStreamsPerSourceStage; ++i) {
      admitted.contexts.push_back(std::make_unique<grpc::ClientContext>());
      admitted.streams.push_back(Open(*admitted.contexts.back(), 0, patience));
      const WireTensor sent = Values(4, static_cast<float>(i));
      Write(*admitted.streams.back(), At(kStageIteration, i), sent);
      ExpectTaken(At(kStageIteration, i), sent);
    }
    return admitted;
  }

  // The stream's next FrameError.
  static std::string NextError(FrameStream& stream) {
    v1::FrameError error;
    if (!stream.Read(&error)) return "(the stream ended)";
    return error.error();
  }

  std::unique_ptr<Mailbox> mailbox_;
  std::unique_ptr<DataPlaneServer> server_;  // Destroyed before the mailbox.
  std::unique_ptr<v1::DataPlaneService::Stub> stub_;
};

TEST_F(DataPlaneServerTest, Stream_SenderThreeIterationsAhead_HeldNotRefusedThenFiled) {
  StartServer();
  grpc::ClientContext context;
  std::unique_ptr<FrameStream> stream = Open(context);
  const WireTensor first = Values(4, 1.f);
  const WireTensor second = Values(4, 2.f);
  const WireTensor later = Values(4, 3.f);
  Write(*stream, At(kStageIteration + 3, 1), first);
  Write(*stream, At(kStageIteration + 3, 2), second);
  Write(*stream, At(kStageIteration + 6, 1), later);

  // The first is held and nothing is read behind it: the mailbox stays empty.
  ASSERT_TRUE(mailbox_->AwaitHeld(1, kPatience));
  EXPECT_EQ(mailbox_->size(), 0u);
  EXPECT_EQ(mailbox_->bytes(), 0);

  // One iteration on, the window reaches the first two. Taking them puts
  // the stage at iteration 10, so the third (13) is held in turn.
  StageReaches(kStageIteration + 1);
  ExpectTaken(At(kStageIteration + 3, 1), first);
  ExpectTaken(At(kStageIteration + 3, 2), second);
  ASSERT_TRUE(mailbox_->AwaitHeld(1, kPatience));
  EXPECT_EQ(mailbox_->size(), 0u);
  StageReaches(kStageIteration + 4);
  ExpectTaken(At(kStageIteration + 6, 1), later);

  // Nothing was refused: the stream ends without a FrameError.
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_EQ(NextError(*stream), "(the stream ended)");
  const grpc::Status finished = stream->Finish();
  EXPECT_TRUE(finished.ok()) << finished.error_message();
  EXPECT_EQ(mailbox_->held(), 0u);
}

// A Take of the held tensor itself moves the window and finds it at once.
TEST_F(DataPlaneServerTest, Stream_TakeOfTheHeldTensor_ReceivesIt) {
  StartServer();
  grpc::ClientContext context;
  std::unique_ptr<FrameStream> stream = Open(context);
  const WireTensor sent = Values(3, 5.f);
  Write(*stream, At(kStageIteration + 5, 1), sent);
  ASSERT_TRUE(mailbox_->AwaitHeld(1, kPatience));
  ExpectTaken(At(kStageIteration + 5, 1), sent);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
}

// The reactor must finish (no read is in flight to fail) and its hold must
// go, so no later wake reaches a deleted reactor (ASan would see it).
TEST_F(DataPlaneServerTest, Stream_ClientCancelsWhileHeld_StreamEndsAndHoldGoes) {
  StartServer();
  {
    grpc::ClientContext context;
    std::unique_ptr<FrameStream> stream = Open(context);
    Write(*stream, At(kStageIteration + 3, 1), Values(4, 1.f));
    ASSERT_TRUE(mailbox_->AwaitHeld(1, kPatience));
    context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  ASSERT_TRUE(mailbox_->AwaitHeld(0, kPatience));
  StageReaches(kStageIteration + 3);  // would wake the hold, had it stayed
  EXPECT_EQ(mailbox_->size(), 0u);    // the held frame was dropped

  // The server still serves, and shuts down (it waits for every reactor).
  grpc::ClientContext context;
  std::unique_ptr<FrameStream> stream = Open(context);
  const WireTensor sent = Values(2, 8.f);
  Write(*stream, At(kStageIteration + 3, 2), sent);
  ExpectTaken(At(kStageIteration + 3, 2), sent);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
  server_->Shutdown();
}

TEST_F(DataPlaneServerTest, Shutdown_WhileStreamHeld_CancelsItAndReturns) {
  StartServer();
  grpc::ClientContext context;
  std::unique_ptr<FrameStream> stream = Open(context);
  Write(*stream, At(kStageIteration + 3, 1), Values(4, 1.f));
  ASSERT_TRUE(mailbox_->AwaitHeld(1, kPatience));
  server_->Shutdown();
  EXPECT_EQ(mailbox_->held(), 0u);
  const grpc::Status finished = stream->Finish();
  EXPECT_FALSE(finished.ok());
  // Cancelled by the shutdown, or the server gone: not a refusal of the frame.
  EXPECT_TRUE(finished.error_code() == grpc::StatusCode::CANCELLED ||
              finished.error_code() == grpc::StatusCode::UNAVAILABLE)
      << finished.error_code() << ": " << finished.error_message();
  EXPECT_EQ(mailbox_->size(), 0u);
}

// Stopping the job ends the hold: the frame is handled, and refused as
// before, so the sender learns of it instead of waiting.
TEST_F(DataPlaneServerTest, Stream_JobAbortedWhileHeld_FrameRefusedStreamReadsOn) {
  StartServer();
  grpc::ClientContext context;
  std::unique_ptr<FrameStream> stream = Open(context);
  Write(*stream, At(kStageIteration + 3, 1), Values(4, 1.f));
  ASSERT_TRUE(mailbox_->AwaitHeld(1, kPatience));
  mailbox_->AbortJob(kJob);
  EXPECT_NE(NextError(*stream).find("RESOURCE_EXHAUSTED: tensor for iteration 10 of job j-1 is "
                                    "beyond the run-ahead window (this stage is at iteration 7, "
                                    "peers may be 2 ahead); refused"),
            std::string::npos);
  EXPECT_EQ(mailbox_->held(), 0u);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
}

// A re-plan opens another data-plane job: a held frame of the old plan is
// then refused as another job's.
TEST_F(DataPlaneServerTest, Stream_NextPlanOpenedWhileHeld_FrameRefusedAsOtherJob) {
  StartServer();
  grpc::ClientContext context;
  std::unique_ptr<FrameStream> stream = Open(context);
  Write(*stream, At(kStageIteration + 3, 1), Values(4, 1.f));
  ASSERT_TRUE(mailbox_->AwaitHeld(1, kPatience));
  mailbox_->OpenJob("j-1/2", 0);
  const std::string error = NextError(*stream);
  EXPECT_NE(error.find("FAILED_PRECONDITION: tensor for job j-1 but this worker runs j-1/2"),
            std::string::npos)
      << error;
  EXPECT_EQ(mailbox_->held(), 0u);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
}

// Sends only the first frame of `wire` (cut into frames of 64 bytes): a
// peer that stops mid-tensor, leaving the server assembling it.
void WriteFirstFrame(FrameStream& stream, const TensorAddress& address, const WireTensor& wire) {
  const std::vector<v1::TensorFrame> frames =
      EncodeTensorFrames(/*source_stage=*/0, address, wire, /*max_frame_bytes=*/64);
  ASSERT_GT(frames.size(), 1u);
  ASSERT_TRUE(stream.Write(frames[0]));
}

// The stream's end, as its sender sees it (without closing its side, as a
// stalled peer would not). Replies come first: a frame that the server
// handled after the job changed was refused as the old job's.
void ExpectEndedAsOver(FrameStream& stream, const std::string& job) {
  v1::FrameError refused;
  while (stream.Read(&refused)) {
    EXPECT_NE(refused.error().find("job \"" + job + "\""), std::string::npos) << refused.error();
  }
  const grpc::Status status = stream.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_NE(status.error_message().find("job " + job + " is over on this worker"),
            std::string::npos)
      << status.error_message();
}

// A peer of an ended job that stops sending in the middle of a tensor: the
// server ends its streams when it moves on, so the half-assembled tensors
// (outside the mailbox's limit once their job is gone) are freed now, not
// when the peer closes its connection. Every stream of the job goes, the
// slots of the stage with them; the new job's streams are served.
TEST_F(DataPlaneServerTest, SetJob_AnotherJob_EndsStalledStreamsOfTheOld) {
  StartServer();
  AdmittedStreams admitted = OpenAdmittedStreams(kEndPatience);
  std::vector<std::unique_ptr<FrameStream>>& streams = admitted.streams;
  for (size_t i = 0; i < streams.size(); ++i) {
    WriteFirstFrame(*streams[i], At(kStageIteration, 100 + static_cast<int>(i)), Values(256, 1.f));
  }

  server_->SetJob("j-1/2", 2, ReceiveKey("j-1/2"));
  // The half-assembled tensors went within SetJob, not when (or whether)
  // the peers let their streams finish.
  EXPECT_EQ(mailbox_->reserved(), 0);
  for (auto& stream : streams) ExpectEndedAsOver(*stream, kJob);

  // The next job's streams come through.
  mailbox_->OpenJob("j-1/2", 0);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kPatience));
  context.AddMetadata(kJobMetadataKey, "j-1/2");
  context.AddMetadata(kStageMetadataKey, "0");
  context.AddMetadata(kProofMetadataKey, ProofFrom("j-1/2", 0));
  std::unique_ptr<FrameStream> next = stub_->Stream(&context);
  const TensorAddress address{"j-1/2", 0, v1::TENSOR_KIND_ACTIVATION, 0, 1};
  const WireTensor probe = Values(4, 9.f);
  Write(*next, address, probe);
  ExpectTaken(address, probe);
  ASSERT_TRUE(next->WritesDone());
  EXPECT_TRUE(next->Finish().ok());
}

// A held stream (its sender beyond the window) ends too, its hold given
// back; a stream of the job that stays is untouched; ClearJob ends it.
TEST_F(DataPlaneServerTest, SetJob_HeldStreamOfTheOldJobEnds_ClearJobEndsTheRest) {
  StartServer();
  grpc::ClientContext held_context;
  std::unique_ptr<FrameStream> held = Open(held_context, 0, kEndPatience);
  Write(*held, At(kStageIteration + 3, 1), Values(4, 1.f));
  ASSERT_TRUE(mailbox_->AwaitHeld(1, kPatience));

  server_->SetJob(kJob, 2, ReceiveKey(kJob));  // The same job again: nothing ends.
  const WireTensor sent = Values(4, 2.f);
  grpc::ClientContext same_context;
  std::unique_ptr<FrameStream> same = Open(same_context, 0, kEndPatience);
  Write(*same, At(kStageIteration, 2), sent);
  ExpectTaken(At(kStageIteration, 2), sent);
  EXPECT_EQ(mailbox_->held(), 1u);

  server_->SetJob("j-2", 2, ReceiveKey("j-2"));
  ExpectEndedAsOver(*held, kJob);
  EXPECT_EQ(mailbox_->held(), 0u);
  ExpectEndedAsOver(*same, kJob);

  server_->SetJob(kJob, 2, ReceiveKey(kJob));
  grpc::ClientContext last_context;
  std::unique_ptr<FrameStream> last = Open(last_context, 0, kEndPatience);
  const WireTensor admitted = Values(4, 3.f);
  Write(*last, At(kStageIteration, 3), admitted);
  ExpectTaken(At(kStageIteration, 3), admitted);
  WriteFirstFrame(*last, At(kStageIteration, 4), Values(256, 4.f));
  server_->ClearJob();
  ExpectEndedAsOver(*last, kJob);
}

// The byte limit is not a window: a tensor over it is refused at once, and
// a held one is refused when the window reaches it. Nothing is buffered.
TEST_F(DataPlaneServerTest, Stream_TensorsOverByteLimit_RefusedHeldOrNot) {
  StartServer(MailboxLimits{.max_bytes = 1024});
  grpc::ClientContext context;
  std::unique_ptr<FrameStream> stream = Open(context);
  // Larger than the whole limit, said as such (not "mailbox full": no
  // wait would let it in).
  const std::string full =
      "RESOURCE_EXHAUSTED: a tensor of 2048 bytes is larger than this worker's whole mailbox "
      "limit of 1024 bytes (--mailbox-limit); refused: raise the limit above it";
  Write(*stream, At(kStageIteration, 1), Values(512, 1.f));  // 2048 bytes
  std::string error = NextError(*stream);
  EXPECT_NE(error.find(full), std::string::npos) << error;
  EXPECT_EQ(mailbox_->held(), 0u);

  Write(*stream, At(kStageIteration + 3, 2), Values(512, 2.f));
  ASSERT_TRUE(mailbox_->AwaitHeld(1, kPatience));
  StageReaches(kStageIteration + 1);
  error = NextError(*stream);
  EXPECT_NE(error.find(full), std::string::npos) << error;
  EXPECT_EQ(mailbox_->bytes(), 0);

  // The stage waiting for a refused tensor hears why at once, not at its
  // receive timeout.
  const absl::StatusOr<WireTensor> waited =
      mailbox_->Take(0, At(kStageIteration, 1), absl::Hours(1));
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kResourceExhausted) << waited.status();
  EXPECT_NE(waited.status().message().find("this worker refused it: a tensor of 2048 bytes"),
            std::string::npos)
      << waited.status();

  // Within the limit, the same stream still delivers.
  const WireTensor small = Values(4, 3.f);
  Write(*stream, At(kStageIteration + 1, 3), small);
  ExpectTaken(At(kStageIteration + 1, 3), small);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
}

// A stage that takes slower than its peer sends (GPipe) fills its mailbox:
// room for 3 tensors, 6 streamed on one stream, all of the stage's current
// iteration. The 4th waits unread, held for room (nothing refused), and
// each Take lets the next one in; all 6 arrive in order, with no FrameError.
// Before, the 4th was refused (RESOURCE_EXHAUSTED) and the job failed.
TEST_F(DataPlaneServerTest, Stream_SixTensorsIntoRoomForThree_HeldForRoomAllArrive) {
  StartServer(MailboxLimits{.max_bytes = 48});  // 3 tensors of 4 floats
  grpc::ClientContext context;
  std::unique_ptr<FrameStream> stream = Open(context);
  std::vector<WireTensor> sent;
  for (int unit = 1; unit <= 6; ++unit) {
    sent.push_back(Values(4, static_cast<float>(10 * unit)));
    Write(*stream, At(kStageIteration, unit), sent.back());
  }

  // The first 3 are in; the 4th is held, unread, and nothing is reserved for it.
  ASSERT_TRUE(mailbox_->AwaitHeld(1, kPatience));
  EXPECT_EQ(mailbox_->size(), 3u);
  EXPECT_EQ(mailbox_->bytes(), 48);
  EXPECT_EQ(mailbox_->reserved(), 0);
  for (int unit = 1; unit <= 6; ++unit) ExpectTaken(At(kStageIteration, unit), sent[unit - 1]);

  ASSERT_TRUE(stream->WritesDone());
  EXPECT_EQ(NextError(*stream), "(the stream ended)");
  const grpc::Status finished = stream->Finish();
  EXPECT_TRUE(finished.ok()) << finished.error_message();
  EXPECT_EQ(mailbox_->held(), 0u);
  EXPECT_EQ(mailbox_->bytes(), 0);
}

// No wait lets in a tensor larger than the whole limit: refused at once
// even while the mailbox is full and another stream is held for room.
TEST_F(DataPlaneServerTest, Stream_TensorOverTheWholeLimitWhileFull_RefusedAtOnce) {
  StartServer(MailboxLimits{.max_bytes = 48});
  grpc::ClientContext context;
  std::unique_ptr<FrameStream> stream = Open(context);
  std::vector<WireTensor> sent;
  for (int unit = 1; unit <= 4; ++unit) {
    sent.push_back(Values(4, static_cast<float>(unit)));
    Write(*stream, At(kStageIteration, unit), sent.back());
  }
  ASSERT_TRUE(mailbox_->AwaitHeld(1, kPatience));

  grpc::ClientContext large_context;
  std::unique_ptr<FrameStream> large = Open(large_context, /*stage=*/1);
  Write(*large, At(kStageIteration, 9), Values(16, 9.f), /*stage=*/1);  // 64 bytes
  const std::string error = NextError(*large);
  EXPECT_NE(error.find("RESOURCE_EXHAUSTED: a tensor of 64 bytes is larger than this worker's "
                       "whole mailbox limit of 48 bytes (--mailbox-limit); refused"),
            std::string::npos)
      << error;
  EXPECT_EQ(mailbox_->held(), 1u);  // The other stream's, still.
  const absl::StatusOr<WireTensor> refused =
      mailbox_->Take(1, At(kStageIteration, 9), absl::Hours(1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();

  for (int unit = 1; unit <= 4; ++unit) ExpectTaken(At(kStageIteration, unit), sent[unit - 1]);
  for (FrameStream* done : {stream.get(), large.get()}) {
    ASSERT_TRUE(done->WritesDone());
    EXPECT_TRUE(done->Finish().ok());
  }
}

// Room given back by a stream, not by a Take, wakes a stream held for it:
// here a stream cancelled in the middle of a tensor, whose reservation goes
// when its reactor ends. Without that wake the held tensor would wait for a
// Take that never comes (the stage waits for that very tensor).
TEST_F(DataPlaneServerTest, Stream_StalledStreamCancelled_ItsRoomWakesAHeldStream) {
  StartServer(MailboxLimits{.max_bytes = 1024});
  const TensorAddress filler = At(kStageIteration, 50);
  ASSERT_TRUE(mailbox_->Put(/*source_stage=*/1, filler, Values(256, 0.f)).ok());  // 1024 bytes
  grpc::ClientContext stalled_context;
  std::unique_ptr<FrameStream> stalled = Open(stalled_context);
  WriteFirstFrame(*stalled, At(kStageIteration, 1), Values(192, 1.f));  // 768 bytes
  ASSERT_TRUE(mailbox_->AwaitHeld(1, kPatience));
  // The Take wakes the stalled stream on this thread: its first frame is
  // admitted, its bytes reserved, before the Take returns.
  ASSERT_TRUE(mailbox_->Take(1, filler, absl::ZeroDuration()).ok());
  EXPECT_EQ(mailbox_->held(), 0u);
  EXPECT_EQ(mailbox_->reserved(), 768);

  grpc::ClientContext held_context;
  std::unique_ptr<FrameStream> held = Open(held_context, /*stage=*/1);
  const WireTensor sent = Values(192, 2.f);
  Write(*held, At(kStageIteration, 2), sent, /*stage=*/1);
  ASSERT_TRUE(mailbox_->AwaitHeld(1, kPatience));

  stalled_context.TryCancel();
  EXPECT_EQ(stalled->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // Woken by the room given back, not by the Take below (which would wake
  // a hold of its own tensor anyway).
  ASSERT_TRUE(mailbox_->AwaitHeld(0, kPatience));
  ExpectTaken(At(kStageIteration, 2), sent, /*stage=*/1);
  ASSERT_TRUE(held->WritesDone());
  EXPECT_EQ(NextError(*held), "(the stream ended)");
  EXPECT_TRUE(held->Finish().ok());
}

// The finding's case (r21 1): a stage busy in its all-reduce, whose
// mailbox the stage before it filled with the next iteration's activations
// (within the run-ahead window). The chunk its all-reduce waits for comes
// from its replica (stage 1) and lacks room; held, it would wait for a Take
// of an activation that comes only after the all-reduce, and the stage
// would time out. The Take of the chunk wakes its stream, and the chunk is
// admitted past the limit; the 4th activation, which nobody waits for yet,
// stays held until a Take makes room.
TEST_F(DataPlaneServerTest, Stream_TakeOfAChunkHeldForRoom_AdmittedPastTheLimit) {
  StartServer(MailboxLimits{.max_bytes = 48});  // 3 tensors of 4 floats
  grpc::ClientContext context;
  std::unique_ptr<FrameStream> stream = Open(context);
  std::vector<WireTensor> sent;
  for (int unit = 1; unit <= 4; ++unit) {
    sent.push_back(Values(4, static_cast<float>(10 * unit)));
    Write(*stream, At(kStageIteration + 1, unit), sent.back());
  }
  ASSERT_TRUE(mailbox_->AwaitHeld(1, kPatience));
  grpc::ClientContext chunk_context;
  std::unique_ptr<FrameStream> chunks = Open(chunk_context, /*stage=*/1);
  const TensorAddress chunk{kJob, kStageIteration, v1::TENSOR_KIND_COLLECTIVE, 0, 1};
  const WireTensor chunk_sent = Values(4, 7.f);
  Write(*chunks, chunk, chunk_sent, /*stage=*/1);
  ASSERT_TRUE(mailbox_->AwaitHeld(2, kPatience));
  EXPECT_EQ(mailbox_->bytes(), 48);

  ExpectTaken(chunk, chunk_sent, /*stage=*/1);
  EXPECT_EQ(mailbox_->held(), 1u);  // The 4th activation, still.
  EXPECT_EQ(mailbox_->bytes(), 48);
  EXPECT_EQ(mailbox_->reserved(), 0);
  for (int unit = 1; unit <= 4; ++unit) ExpectTaken(At(kStageIteration + 1, unit), sent[unit - 1]);
  for (FrameStream* done : {stream.get(), chunks.get()}) {
    ASSERT_TRUE(done->WritesDone());
    EXPECT_EQ(NextError(*done), "(the stream ended)");
    EXPECT_TRUE(done->Finish().ok());
  }
  EXPECT_EQ(mailbox_->held(), 0u);
}

// A peer holding a stage's keys cannot open streams without bound: past
// kMaxStreamsPerSourceStage of one stage, a stream ends at once with
// RESOURCE_EXHAUSTED; other stages are unaffected, and a finished stream
// gives its slot back before its sender sees it end.
TEST_F(DataPlaneServerTest, Stream_PastTheStreamsOfAStage_ResourceExhaustedUntilOneEnds) {
  StartServer();
  AdmittedStreams admitted = OpenAdmittedStreams();
  std::vector<std::unique_ptr<FrameStream>>& streams = admitted.streams;
  {
    grpc::ClientContext context;
    std::unique_ptr<FrameStream> refused = Open(context);
    const grpc::Status status = refused->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    EXPECT_NE(status.error_message().find("stage 0 of job j-1 has 8 streams open"),
              std::string::npos)
        << status.error_message();
  }
  {
    grpc::ClientContext context;  // Another stage's stream is not counted with stage 0's.
    std::unique_ptr<FrameStream> other = Open(context, /*stage=*/1);
    const WireTensor sent = Values(4, 100);
    Write(*other, At(kStageIteration, 50), sent, /*stage=*/1);
    ExpectTaken(At(kStageIteration, 50), sent, /*stage=*/1);
    ASSERT_TRUE(other->WritesDone());
    EXPECT_TRUE(other->Finish().ok());
  }
  ASSERT_TRUE(streams[0]->WritesDone());
  ASSERT_TRUE(streams[0]->Finish().ok());
  grpc::ClientContext context;  // The slot it gave back.
  std::unique_ptr<FrameStream> again = Open(context);
  const WireTensor sent = Values(4, 200);
  Write(*again, At(kStageIteration, 60), sent);
  ExpectTaken(At(kStageIteration, 60), sent);
  ASSERT_TRUE(again->WritesDone());
  EXPECT_TRUE(again->Finish().ok());
  for (size_t i = 1; i < streams.size(); ++i) {
    ASSERT_TRUE(streams[i]->WritesDone());
    EXPECT_TRUE(streams[i]->Finish().ok());
  }
}

}  // namespace
}  // namespace pipetrain
