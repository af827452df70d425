// Two stages on loopback: each has a Mailbox, a DataPlaneServer filling it
// and a GrpcTransport sending to the other's server.
#include "worker/transport/grpc_transport.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/annotated_mutex.h"
#include "common/data_plane_keys.h"
#include "gtest/gtest.h"
#include "kernels/compress/codec_spec.h"
#include "proto/pipetrain/v1/dataplane.grpc.pb.h"
#include "worker/transport/data_plane_server.h"
#include "worker/transport/frame_codec.h"

namespace pipetrain {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(60);  // Deadlines only; never waited out.
constexpr char kPlanSecret[] = "5ecre7-of-j-1";

// Worker `worker`'s keys for `job` of two workers, as a coordinator gives them.
DataPlaneKeys KeysOf(const std::string& job, int worker) {
  return DeriveDataPlaneKeys(kPlanSecret, job, 2)[worker];
}

// What a sender of stage 0 of job j-1 sends when it opens a stream to stage 1.
void ProveStage0(grpc::ClientContext& context,
                 const std::string& link_key = KeysOf("j-1", 0).send_keys[1]) {
  context.AddMetadata(kJobMetadataKey, "j-1");
  context.AddMetadata(kStageMetadataKey, "0");
  context.AddMetadata(kProofMetadataKey, StreamProof(link_key, "j-1", 0));
}

TensorAddress Address(v1::TensorKind kind, int micro_batch, int unit,
                      const std::string& job = "j-1") {
  return {job, /*iteration=*/7, kind, micro_batch, unit};
}

// Every bit pattern is fair game (NaNs included): the data plane must not
// touch the values.
Tensor Pattern(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::Zeros(shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint32_t x = (static_cast<uint32_t>(i) + seed) * 2654435761u;
    x ^= x >> 15;
    std::memcpy(&t[i], &x, sizeof(x));
  }
  return t;
}

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.size_bytes())) == 0;
}

bool Contains(const absl::Status& status, const std::string& fragment) {
  return status.message().find(fragment) != absl::string_view::npos;
}

// Collects GrpcTransportOptions::on_peer_error reports; tests wait on it
// instead of sleeping.
class PeerErrors {
 public:
  void Add(const absl::Status& error) {
    AnnotatedMutexLock lock(&mu_);
    errors_.push_back(error);
  }
  size_t size() {
    AnnotatedMutexLock lock(&mu_);
    return errors_.size();
  }
  // The first report with `code`, waiting for it if needed.
  absl::Status WaitFor(absl::StatusCode code) {
    AnnotatedMutexLock lock(&mu_);
    auto seen = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return Find(code) != nullptr; };
    if (!mu_.AwaitWithTimeout(seen, kPatience)) {
      return absl::UnknownError("no such peer error reported");
    }
    return *Find(code);
  }

 private:
  const absl::Status* Find(absl::StatusCode code) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const absl::Status& e : errors_) {
      if (e.code() == code) return &e;
    }
    return nullptr;
  }
  AnnotatedMutex mu_;
  std::vector<absl::Status> errors_ ABSL_GUARDED_BY(mu_);
};

class GrpcTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int s = 0; s < 2; ++s) {
      mailboxes_[s] = std::make_unique<Mailbox>();
      absl::StatusOr<std::unique_ptr<DataPlaneServer>> server =
          DataPlaneServer::Start("127.0.0.1:0", mailboxes_[s].get());
      ASSERT_TRUE(server.ok()) << server.status();
      servers_[s] = *std::move(server);
      servers_[s]->SetJob("j-1", 2, KeysOf("j-1", s).receive_key);
      addresses_.push_back(servers_[s]->address());
    }
    for (int s = 0; s < 2; ++s) transports_[s] = MakeTransport(s, Options(s));
  }

  void TearDown() override {
    for (auto& t : transports_) t->Shutdown();
    for (auto& s : servers_) s->Shutdown();
    for (auto& m : mailboxes_) m->Shutdown();
  }

  // A sender's options: stage `self`'s keys of job j-1.
  GrpcTransportOptions Options(int self = 0) {
    GrpcTransportOptions options;
    options.credential = {"j-1", KeysOf("j-1", self).send_keys};
    options.connect_timeout = kPatience;
    options.on_peer_error = [this](int, const absl::Status& error) { peer_errors_.Add(error); };
    return options;
  }

  std::unique_ptr<GrpcTransport> MakeTransport(int stage, GrpcTransportOptions options) {
    return std::make_unique<GrpcTransport>(stage, addresses_, mailboxes_[stage].get(),
                                           std::move(options));
  }

  // Sends from stage 0 and checks stage 1 receives it unchanged.
  void ExpectDelivered(const TensorAddress& address, const Tensor& tensor) {
    ASSERT_TRUE(transports_[0]->Send(1, address, tensor).ok());
    absl::StatusOr<Tensor> got = transports_[1]->Recv(0, address, kPatience);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(BitwiseEqual(*got, tensor)) << address.DebugString();
  }

  std::unique_ptr<Mailbox> mailboxes_[2];
  std::unique_ptr<DataPlaneServer> servers_[2];
  std::vector<std::string> addresses_;
  std::unique_ptr<GrpcTransport> transports_[2];
  PeerErrors peer_errors_;
};

TEST_F(GrpcTransportTest, Send_TenMiBAndSmallTensors_ArriveBitwiseEqual) {
  const Shape small_shapes[] = {{3}, {0}, {}, {5, 7}};
  for (int i = 0; i < 4; ++i) {
    ExpectDelivered(Address(v1::TENSOR_KIND_ACTIVATION, i, 2), Pattern(small_shapes[i], i));
  }
  const Tensor big = Pattern({10, 1024, 256}, 99);  // 10 MiB: three frames.
  constexpr int kRounds = 5;
  const absl::Time start = absl::Now();
  for (int round = 0; round < kRounds; ++round) {
    ExpectDelivered(Address(v1::TENSOR_KIND_ACTIVATION, 10 + round, 2), big);
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::cout << "[info] 10 MiB stage 0 -> stage 1 over loopback, Send to Recv, " << kRounds
            << " rounds: " << 1e3 * seconds / kRounds << " ms each, " << kRounds * 10 / seconds
            << " MiB/s\n";

  // And the other way, as gradients travel.
  const TensorAddress grad = Address(v1::TENSOR_KIND_ACTIVATION_GRAD, 0, 2);
  ASSERT_TRUE(transports_[1]->Send(0, grad, big).ok());
  absl::StatusOr<Tensor> got = transports_[0]->Recv(1, grad, kPatience);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(BitwiseEqual(*got, big));
}

TEST_F(GrpcTransportTest, SendWire_EncodedInSeveralFrames_ArrivesByteIdenticalAndRecvDecodes) {
  GrpcTransportOptions options = Options();
  options.max_frame_bytes = 64;  // Several frames per payload.
  std::unique_ptr<GrpcTransport> sender = MakeTransport(0, options);
  Tensor values = Tensor::Zeros({16, 48});
  for (int64_t i = 0; i < values.numel(); ++i) values[i] = std::sin(0.1f * i) * 4.f;
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec("piecewise:bits=3");
  ASSERT_TRUE(codec.ok()) << codec.status();
  absl::StatusOr<std::string> payload = (*codec)->Encode(values, nullptr);
  ASSERT_TRUE(payload.ok()) << payload.status();
  ASSERT_GT(payload->size(), 3 * 64u);
  const WireTensor sent = WireTensor::Encoded("piecewise:bits=3", *payload, values.shape());

  ASSERT_TRUE(sender->SendWire(1, Address(v1::TENSOR_KIND_ACTIVATION, 0, 5), sent).ok());
  absl::StatusOr<WireTensor> got =
      transports_[1]->RecvWire(0, Address(v1::TENSOR_KIND_ACTIVATION, 0, 5), kPatience);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->codec, "piecewise:bits=3");
  EXPECT_EQ(got->shape, (Shape{16, 48}));
  EXPECT_TRUE(got->tensor.is_null());
  EXPECT_EQ(got->payload, *payload);  // Byte for byte.

  ASSERT_TRUE(sender->SendWire(1, Address(v1::TENSOR_KIND_ACTIVATION, 1, 5), sent).ok());
  absl::StatusOr<Tensor> decoded =
      transports_[1]->Recv(0, Address(v1::TENSOR_KIND_ACTIVATION, 1, 5), kPatience);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  absl::StatusOr<Tensor> expected = (*codec)->Decode(*payload);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(BitwiseEqual(*decoded, *expected));
  sender->Shutdown();
  EXPECT_EQ(peer_errors_.size(), 0u) << "no frame was rejected, no stream broke";
}

// SendWireOwned sends straight from a tensor nobody else holds (several
// frames reference it until written); a tensor still shared with the caller
// is copied, so the caller's later writes do not reach the wire.
TEST_F(GrpcTransportTest, SendWireOwned_SoleOrSharedTensorAndPayload_ArriveAsSent) {
  GrpcTransportOptions options = Options();
  options.max_frame_bytes = 1000;  // Several frames per tensor.
  std::unique_ptr<GrpcTransport> sender = MakeTransport(0, options);
  const Tensor expected = Pattern({30, 100}, 11);
  ASSERT_TRUE(
      sender->SendOwned(1, Address(v1::TENSOR_KIND_ACTIVATION, 0, 8), expected.Clone()).ok());

  Tensor shared = expected.Clone();
  const Tensor callers_handle = shared;
  ASSERT_FALSE(shared.sole_owner());
  ASSERT_TRUE(
      sender->SendOwned(1, Address(v1::TENSOR_KIND_ACTIVATION, 1, 8), std::move(shared)).ok());
  Tensor writable = callers_handle;
  writable.Fill(-1.0f);  // After the send returned: must not change what arrives.

  const std::string payload(2500, 'p');
  ASSERT_TRUE(sender
                  ->SendWireOwned(1, Address(v1::TENSOR_KIND_ACTIVATION, 2, 8),
                                  WireTensor::Encoded("fp16", payload, {1250}))
                  .ok());
  for (int mb = 0; mb < 2; ++mb) {
    absl::StatusOr<Tensor> got =
        transports_[1]->Recv(0, Address(v1::TENSOR_KIND_ACTIVATION, mb, 8), kPatience);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(BitwiseEqual(*got, expected)) << "micro-batch " << mb;
  }
  absl::StatusOr<WireTensor> wire =
      transports_[1]->RecvWire(0, Address(v1::TENSOR_KIND_ACTIVATION, 2, 8), kPatience);
  ASSERT_TRUE(wire.ok()) << wire.status();
  EXPECT_EQ(wire->payload, payload);
  sender->Shutdown();
  EXPECT_EQ(peer_errors_.size(), 0u) << "no frame was rejected, no stream broke";
}

TEST_F(GrpcTransportTest, SendWire_UnknownCodecOrEmptyPayload_InvalidArgumentNothingSent) {
  const absl::Status unknown =
      transports_[0]->SendWire(1, Address(v1::TENSOR_KIND_ACTIVATION, 0, 6),
                               WireTensor::Encoded("zstd:level=3", "bytes", {2}));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(unknown,
                       "ACTIVATION of unit 6, micro-batch 0, iteration 7 (job j-1) to "
                       "stage 1: codec \"zstd:level=3\" is not a codec spec"))
      << unknown;
  const absl::Status empty = transports_[0]->SendWire(1, Address(v1::TENSOR_KIND_ACTIVATION, 1, 6),
                                                      WireTensor::Encoded("fp16", "", {2}));
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(empty, "empty fp16 payload")) << empty;
  // A raw tensor of more dimensions than a frame carries: refused here,
  // not sent whole for the peer to refuse.
  const absl::Status rank = transports_[0]->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 3, 6),
                                                 Tensor::Zeros({1, 1, 1, 1, 1, 1, 1, 1, 2}));
  EXPECT_EQ(rank.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(rank, "has 9 dimensions; a frame carries at most 8")) << rank;
  // The link is untouched: the next tensor goes through.
  ExpectDelivered(Address(v1::TENSOR_KIND_ACTIVATION, 2, 6), Pattern({4}, 6));
}

TEST_F(GrpcTransportTest, Send_ConcurrentThreadsToOnePeer_TensorsArriveIntact) {
  GrpcTransportOptions options = Options();
  options.max_frame_bytes = 4096;  // 16 frames per tensor: many chances to interleave.
  std::unique_ptr<GrpcTransport> sender = MakeTransport(0, options);
  constexpr int kPerThread = 10;
  const Shape shape = {64, 256};
  auto send_all = [&](int thread) {
    for (int i = 0; i < kPerThread; ++i) {
      const uint32_t seed = 100 * thread + i;
      absl::Status s =
          sender->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, i, thread), Pattern(shape, seed));
      EXPECT_TRUE(s.ok()) << s;
    }
  };
  std::thread a(send_all, 0), b(send_all, 1);
  a.join();
  b.join();
  for (int thread = 0; thread < 2; ++thread) {
    for (int i = 0; i < kPerThread; ++i) {
      absl::StatusOr<Tensor> got =
          transports_[1]->Recv(0, Address(v1::TENSOR_KIND_ACTIVATION, i, thread), kPatience);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(BitwiseEqual(*got, Pattern(shape, 100 * thread + i)));
    }
  }
  sender->Shutdown();
  EXPECT_EQ(peer_errors_.size(), 0u) << "no frame was rejected, no stream broke";
}

TEST_F(GrpcTransportTest, Stream_MalformedFramesFromRawClient_FrameErrorsAndServerKeepsWorking) {
  auto channel = grpc::CreateChannel(addresses_[1], grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::DataPlaneService::Stub> stub = v1::DataPlaneService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kPatience));
  ProveStage0(context);
  auto stream = stub->Stream(&context);

  const v1::TensorFrame good = EncodeTensorFrames(0, Address(v1::TENSOR_KIND_ACTIVATION, 0, 4),
                                                  WireTensor::Raw(Pattern({2, 2}, 1)))[0];
  v1::TensorFrame short_payload = good;
  short_payload.set_total_bytes(12);
  short_payload.set_payload(good.payload().substr(0, 12));
  v1::TensorFrame unknown_kind = good;
  unknown_kind.mutable_tensor()->set_kind(static_cast<v1::TensorKind>(99));
  v1::TensorFrame wrong_job = good;
  wrong_job.set_job_id("j-0");
  const std::pair<v1::TensorFrame, std::string> cases[] = {
      {short_payload, "total_bytes 12 does not match shape [2, 2] of f32 (16 bytes)"},
      {unknown_kind, "tensor kind 99 is unknown"},
      {wrong_job,
       "PERMISSION_DENIED: frame for job \"j-0\" stage 0 on a stream of job j-1 "
       "stage 0"},
  };
  for (const auto& [frame, fragment] : cases) {
    ASSERT_TRUE(stream->Write(frame));
    v1::FrameError error;
    ASSERT_TRUE(stream->Read(&error));
    EXPECT_EQ(error.tensor().unit(), 4);
    EXPECT_EQ(error.iteration(), 7);
    EXPECT_NE(error.error().find(fragment), std::string::npos) << error.error();
  }
  // Bytes that are not a TensorFrame (a job id that is not UTF-8 fails the
  // header's parse): an error without a tensor to name, the stream goes on.
  v1::TensorFrame not_utf8 = good;
  not_utf8.set_job_id("\xff\xfe");
  ASSERT_TRUE(stream->Write(not_utf8));
  v1::FrameError malformed;
  ASSERT_TRUE(stream->Read(&malformed));
  EXPECT_NE(malformed.error().find("malformed data-plane frame: its header fields do not parse"),
            std::string::npos)
      << malformed.error();
  // The same stream still carries a correct frame, and ends cleanly.
  ASSERT_TRUE(stream->Write(good));
  ASSERT_TRUE(stream->WritesDone());
  v1::FrameError none;
  EXPECT_FALSE(stream->Read(&none));
  grpc::Status finished = stream->Finish();
  EXPECT_TRUE(finished.ok()) << finished.error_message();
  EXPECT_TRUE(transports_[1]->Recv(0, Address(v1::TENSOR_KIND_ACTIVATION, 0, 4), kPatience).ok());

  // A new stream works too.
  ExpectDelivered(Address(v1::TENSOR_KIND_ACTIVATION, 1, 4), Pattern({100}, 2));
}

TEST_F(GrpcTransportTest, Send_PeerRejectsTensor_NextSendFailsWithPeersCodeAndText) {
  ExpectDelivered(Address(v1::TENSOR_KIND_ACTIVATION, 0, 2),
                  Pattern({8}, 0));  // the stream is open
  // A backslash in the receiver's text reaches the job's report once: the
  // CLI escapes what it prints, and escaping here too doubled it. (The
  // mailbox refuses the tensor; the data plane still accepts the job, so
  // the stream stays.)
  mailboxes_[1]->OpenJob("j\\2", 0);
  ASSERT_TRUE(
      transports_[0]->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 0, 1), Pattern({8}, 1)).ok());
  const absl::Status reported = peer_errors_.WaitFor(absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(reported, "tensor for job j-1 but this worker runs j\\2; refused"))
      << reported;

  absl::Status next =
      transports_[0]->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 1, 1), Pattern({8}, 2));
  EXPECT_EQ(next.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(next, "stage 1 (" + addresses_[1] +
                                 ") rejected a tensor sent earlier: "
                                 "FAILED_PRECONDITION: tensor for job j-1 but this worker runs"))
      << next;

  // Reported once; the stream stayed open.
  mailboxes_[1]->OpenJob("j-1", 7);
  ExpectDelivered(Address(v1::TENSOR_KIND_ACTIVATION, 2, 1), Pattern({8}, 3));
}

// The receiver's stage stopped the job (its worker is stopping) while this
// one still sends: the refusal is ABORTED here too, a lost peer to the
// sending stage (which recovers), not INTERNAL (which failed the job).
TEST_F(GrpcTransportTest, Send_PeersJobStopped_NextSendAborted) {
  ExpectDelivered(Address(v1::TENSOR_KIND_ACTIVATION, 0, 2),
                  Pattern({8}, 0));  // the stream is open
  mailboxes_[1]->AbortJob("j-1");
  ASSERT_TRUE(
      transports_[0]->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 1, 1), Pattern({8}, 1)).ok());
  const absl::Status reported = peer_errors_.WaitFor(absl::StatusCode::kAborted);
  EXPECT_TRUE(Contains(reported, "which was stopped on this worker; refused")) << reported;
  absl::Status next =
      transports_[0]->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 2, 1), Pattern({8}, 2));
  EXPECT_EQ(next.code(), absl::StatusCode::kAborted) << next;
  EXPECT_TRUE(Contains(next, "rejected a tensor sent earlier")) << next;
}

// A refusal that names a fault of the job's own (here FAILED_PRECONDITION)
// and then a break on the same stream: the next Send reports the refusal
// (a break alone reads as a lost peer, and the job would recover into the
// same fault), the one after it the break.
TEST_F(GrpcTransportTest, Send_RejectedThenBroken_RefusalFirstThenTheBreak) {
  ExpectDelivered(Address(v1::TENSOR_KIND_ACTIVATION, 0, 2),
                  Pattern({8}, 0));  // the stream is open
  mailboxes_[1]->OpenJob("j-other", 0);
  ASSERT_TRUE(
      transports_[0]->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 0, 1), Pattern({8}, 1)).ok());
  ASSERT_EQ(peer_errors_.WaitFor(absl::StatusCode::kFailedPrecondition).code(),
            absl::StatusCode::kFailedPrecondition);
  servers_[1]->SetJob("j-1/2", 2, KeysOf("j-1/2", 1).receive_key);
  ASSERT_EQ(peer_errors_.WaitFor(absl::StatusCode::kUnavailable).code(),
            absl::StatusCode::kUnavailable);
  const absl::Status refused =
      transports_[0]->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 1, 1), Pattern({8}, 2));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  const absl::Status broken =
      transports_[0]->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 2, 1), Pattern({8}, 3));
  EXPECT_EQ(broken.code(), absl::StatusCode::kUnavailable) << broken;
}

// The receiver moves on to another job (its next plan): the data plane ends
// the old job's stream at once, and the sender's next Send says so instead
// of its frames being refused one by one.
TEST_F(GrpcTransportTest, Send_PeerMovedToAnotherJob_StreamEndsAndNextSendSaysWhy) {
  ExpectDelivered(Address(v1::TENSOR_KIND_ACTIVATION, 0, 2),
                  Pattern({8}, 0));  // the stream is open
  servers_[1]->SetJob("j-1/2", 2, KeysOf("j-1/2", 1).receive_key);
  const absl::Status reported = peer_errors_.WaitFor(absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(reported, "the peer ended the stream")) << reported;

  absl::Status next =
      transports_[0]->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 1, 1), Pattern({8}, 2));
  EXPECT_EQ(next.code(), absl::StatusCode::kUnavailable) << next;
  EXPECT_TRUE(Contains(next, "job j-1 is over on this worker (it runs another job now)")) << next;
}

TEST_F(GrpcTransportTest, Recv_NeverSent_DeadlineExceededNamingPeerAndTensor) {
  absl::StatusOr<Tensor> got =
      transports_[1]->Recv(0, Address(v1::TENSOR_KIND_ACTIVATION, 3, 9), absl::Milliseconds(200));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(got.status(),
                       "waited 200ms for ACTIVATION of unit 9, micro-batch 3, "
                       "iteration 7 (job j-1) from stage 0"))
      << got.status();
  EXPECT_TRUE(Contains(got.status(), "(stage 0's data plane is at " + addresses_[0] + ")"))
      << got.status();
}

TEST_F(GrpcTransportTest, Send_NothingListensAtPeer_UnavailableNamingPeer) {
  // A port that was just free and is closed again: nothing listens there.
  Mailbox unused;
  absl::StatusOr<std::unique_ptr<DataPlaneServer>> gone =
      DataPlaneServer::Start("127.0.0.1:0", &unused);
  ASSERT_TRUE(gone.ok()) << gone.status();
  const std::string dead_address = (*gone)->address();
  gone->reset();

  GrpcTransportOptions options = Options();
  options.connect_timeout = absl::Milliseconds(300);
  GrpcTransport transport(0, {addresses_[0], dead_address}, mailboxes_[0].get(), options);
  absl::Status sent = transport.Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 0, 1), Pattern({4}, 1));
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(sent, "cannot connect to stage 1 (" + dead_address + ") within 300ms"))
      << sent;
}

TEST_F(GrpcTransportTest, Send_PeerRestarted_OneUnavailableThenReconnects) {
  ExpectDelivered(Address(v1::TENSOR_KIND_ACTIVATION, 0, 1), Pattern({8}, 1));
  // The restarted server binds the same port again, as a restarted worker
  // with a fixed data-plane address would.
  const int port = servers_[1]->port();
  servers_[1]->Shutdown();
  const absl::Status broke = peer_errors_.WaitFor(absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(broke, "the stream to stage 1 (" + addresses_[1] + ") broke")) << broke;

  absl::Status sent =
      transports_[0]->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 1, 1), Pattern({8}, 2));
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(sent, "the stream to stage 1 (" + addresses_[1] + ") broke")) << sent;

  absl::StatusOr<std::unique_ptr<DataPlaneServer>> restarted =
      DataPlaneServer::Start("127.0.0.1:" + std::to_string(port), mailboxes_[1].get());
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  servers_[1] = *std::move(restarted);
  servers_[1]->SetJob("j-1", 2, KeysOf("j-1", 1).receive_key);
  ExpectDelivered(Address(v1::TENSOR_KIND_ACTIVATION, 2, 1), Pattern({8}, 3));
}

// A stream to a peer broke with nothing left unsent (the last frames
// handed to gRPC, then lost): nothing was logged, and this stage's receive
// timeout blamed the peer alone. It now names its own broken stream.
TEST_F(GrpcTransportTest, Recv_TimesOutAfterOwnStreamBroke_MessageSaysSo) {
  ExpectDelivered(Address(v1::TENSOR_KIND_ACTIVATION, 0, 1), Pattern({8}, 1));
  servers_[1]->Shutdown();
  const absl::Status broke = peer_errors_.WaitFor(absl::StatusCode::kUnavailable);
  ASSERT_EQ(broke.code(), absl::StatusCode::kUnavailable) << broke;
  const absl::Status timed_out =
      transports_[0]
          ->Recv(1, Address(v1::TENSOR_KIND_ACTIVATION, 0, 2), absl::Milliseconds(100))
          .status();
  EXPECT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded) << timed_out;
  EXPECT_TRUE(Contains(timed_out, "this stage's own sends broke")) << timed_out;
  EXPECT_TRUE(Contains(timed_out, "(the stream to stage 1 (" + addresses_[1] + ") broke"))
      << timed_out;
}

TEST_F(GrpcTransportTest, Shutdown_RightAfterSend_DeliversQueuedTensorFirst) {
  const Tensor big = Pattern({3, 1024, 1024}, 5);  // 12 MiB.
  ASSERT_TRUE(transports_[0]->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 0, 1), big).ok());
  transports_[0]->Shutdown();
  absl::StatusOr<Tensor> got =
      transports_[1]->Recv(0, Address(v1::TENSOR_KIND_ACTIVATION, 0, 1), absl::ZeroDuration());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(BitwiseEqual(*got, big));
}

TEST_F(GrpcTransportTest, SendAndRecv_AfterShutdown_Aborted) {
  transports_[0]->Shutdown();
  EXPECT_EQ(
      transports_[0]->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 0, 1), Pattern({1}, 1)).code(),
      absl::StatusCode::kAborted);
  EXPECT_EQ(
      transports_[0]->Recv(1, Address(v1::TENSOR_KIND_ACTIVATION, 0, 1), kPatience).status().code(),
      absl::StatusCode::kAborted);
}

// A stopped job's send to a stalled peer (it holds the first frame and
// reads no further) waits for room in a full queue; Abort ends it with
// ABORTED at once instead of after queue_wait_timeout (a minute here), and
// everything after it too.
TEST_F(GrpcTransportTest, Abort_EndsASendWaitingForRoomAndLaterOnes) {
  mailboxes_[1]->OpenJob("j-1", 7);  // iteration 10 is past its window: held, stream unread
  GrpcTransportOptions options = Options();
  options.max_queued_bytes_per_peer = int64_t{1} << 20;
  options.queue_wait_timeout = kPatience;
  std::unique_ptr<GrpcTransport> sender = MakeTransport(0, options);
  absl::Status last;
  std::thread sending([&] {
    for (int i = 0; last.ok(); ++i) {  // until the queue is full and stays so
      TensorAddress address = Address(v1::TENSOR_KIND_ACTIVATION, i, 4);
      address.iteration = 10;
      last = sender->Send(1, address, Pattern({256, 1024}, i));  // 1 MiB
    }
  });
  ASSERT_TRUE(sender->AwaitSendsWaitingForRoom(1, kPatience));
  sender->Abort();
  sending.join();
  // The waiting Send ends "the job stopped"; rarely (1 run in 40 here) it
  // had got room just before the Abort (the queue drained a little
  // further), and the next Send found the transport aborted instead.
  EXPECT_EQ(last.code(), absl::StatusCode::kAborted) << last;
  EXPECT_TRUE(Contains(last, "the job stopped; not sending to stage 1") ||
              Contains(last, "transport shut down; not sending to stage 1"))
      << last;
  EXPECT_TRUE(sender->AwaitSendsWaitingForRoom(0, kPatience));
  EXPECT_EQ(sender->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 0, 1), Pattern({1}, 1)).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(sender->Recv(1, Address(v1::TENSOR_KIND_ACTIVATION, 0, 1), kPatience).status().code(),
            absl::StatusCode::kAborted);
  sender->Shutdown();  // drains nothing: the stream was cancelled
}

TEST_F(GrpcTransportTest, SendAndRecv_PeerOutsidePlanOrNullTensor_InvalidArgument) {
  absl::Status sent =
      transports_[0]->Send(2, Address(v1::TENSOR_KIND_ACTIVATION, 0, 1), Pattern({1}, 1));
  EXPECT_EQ(sent.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(sent, "peer stage 2 is outside [0, 2)")) << sent;
  EXPECT_EQ(transports_[0]
                ->Recv(-1, Address(v1::TENSOR_KIND_ACTIVATION, 0, 1), kPatience)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(transports_[0]->Send(1, Address(v1::TENSOR_KIND_ACTIVATION, 0, 1), Tensor()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DataPlaneServerTest, Start_AddressWithoutPort_InvalidArgument) {
  Mailbox mailbox;
  absl::StatusOr<std::unique_ptr<DataPlaneServer>> server =
      DataPlaneServer::Start("localhost", &mailbox);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(server.status(), "\"localhost\" is not host:port")) << server.status();
}

TEST(DataPlaneServerTest, Start_PortAlreadyServed_UnavailableNotShared) {
  Mailbox first_mailbox, second_mailbox;
  absl::StatusOr<std::unique_ptr<DataPlaneServer>> first =
      DataPlaneServer::Start("127.0.0.1:0", &first_mailbox);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = (*first)->address();
  absl::StatusOr<std::unique_ptr<DataPlaneServer>> second =
      DataPlaneServer::Start(taken, &second_mailbox);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(second.status(), "could not start the data-plane server on " + taken))
      << second.status();
}

// A process that is not one of the job's workers: without a worker's keys
// its stream is refused before it can send anything, and the job's own
// traffic is unharmed.
TEST_F(GrpcTransportTest, Stream_WithoutOrWithWrongProof_RefusedAndJobUnharmed) {
  auto channel = grpc::CreateChannel(addresses_[1], grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::DataPlaneService::Stub> stub = v1::DataPlaneService::NewStub(channel);
  const v1::TensorFrame injected = EncodeTensorFrames(0, Address(v1::TENSOR_KIND_ACTIVATION, 0, 4),
                                                      WireTensor::Raw(Pattern({2, 2}, 9)))[0];
  for (const std::string how : {"none", "wrong secret", "other job"}) {
    SCOPED_TRACE(how);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kPatience));
    if (how == "wrong secret") ProveStage0(context, "guess");
    if (how == "other job") {
      context.AddMetadata(kJobMetadataKey, "j-9");
      context.AddMetadata(kStageMetadataKey, "0");
      context.AddMetadata(kProofMetadataKey, StreamProof(KeysOf("j-9", 0).send_keys[1], "j-9", 0));
    }
    auto stream = stub->Stream(&context);
    stream->Write(injected);  // may or may not be taken before the refusal
    stream->WritesDone();
    v1::FrameError error;
    EXPECT_FALSE(stream->Read(&error));
    const grpc::Status finished = stream->Finish();
    EXPECT_EQ(finished.error_code(), how == "other job" ? grpc::StatusCode::FAILED_PRECONDITION
                                                        : grpc::StatusCode::UNAUTHENTICATED)
        << finished.error_message();
  }
  EXPECT_EQ(mailboxes_[1]->size(), 0u);                                // nothing was filed
  ExpectDelivered(Address(v1::TENSOR_KIND_ACTIVATION, 0, 4),
                  Pattern({2, 2}, 1));  // the real tensor
}

// A worker of the job sending as another one (worker 2 of 3 claiming to
// be worker 0, towards worker 1): its keys prove only its own streams, so
// worker 1 refuses the stream and files nothing, while worker 0's own keys
// get the same tensor through. (With one secret per plan, worker 2 could
// prove any stage.)
TEST_F(GrpcTransportTest, Send_AsAnotherWorkerOfTheJob_RefusedWhileItsOwnKeysPass) {
  const std::vector<DataPlaneKeys> keys = DeriveDataPlaneKeys(kPlanSecret, "j-3", 3);
  servers_[1]->SetJob("j-3", 3, keys[1].receive_key);
  mailboxes_[1]->OpenJob("j-3", 0);
  const std::vector<std::string> peers = {addresses_[0], addresses_[1], addresses_[0]};
  const TensorAddress address = Address(v1::TENSOR_KIND_ACTIVATION, 0, 1, "j-3");
  const Tensor tensor = Pattern({8}, 4);

  GrpcTransportOptions impostor_options = Options();
  impostor_options.credential = {"j-3", keys[2].send_keys};
  GrpcTransport impostor(0, peers, mailboxes_[0].get(), impostor_options);
  // Queued before the refusal comes back (then the next Send says why:
  // the call's final status), or refused as it is queued; nothing is filed.
  absl::Status next = impostor.Send(1, address, tensor);
  if (next.ok()) {
    // The break ("the peer ended the stream", or "a write failed" when the
    // refusal lands mid-write).
    ASSERT_TRUE(Contains(peer_errors_.WaitFor(absl::StatusCode::kUnavailable), "broke"));
    next = impostor.Send(1, address, tensor);
  }
  EXPECT_EQ(next.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(next, "UNAUTHENTICATED")) << next;
  EXPECT_TRUE(Contains(next, "claiming stage 0 of job j-3 without its proof")) << next;
  EXPECT_EQ(mailboxes_[1]->size(), 0u);
  impostor.Shutdown();

  GrpcTransportOptions own_options = Options();
  own_options.credential = {"j-3", keys[0].send_keys};
  GrpcTransport sender(0, peers, mailboxes_[0].get(), own_options);
  ASSERT_TRUE(sender.Send(1, address, tensor).ok());
  absl::StatusOr<Tensor> got = transports_[1]->Recv(0, address, kPatience);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(BitwiseEqual(*got, tensor));
  sender.Shutdown();
}

// A stage may legally run more than the mailbox's run-ahead window ahead of
// its receiver (e.g. a last stage that only runs a forward pass): its
// tensors are held back, not refused, and arrive once the receiver gets
// there; the sender is never told of an error. Far-future tensors are not
// buffered meanwhile (data_plane_server_test.cc covers the holds' ends).
TEST_F(GrpcTransportTest, Send_ThreeIterationsAheadOfReceiver_HeldNotRefusedThenDelivered) {
  mailboxes_[1]->OpenJob("j-1", 7);  // the receiver is at iteration 7; its window ends at 9
  std::vector<std::pair<TensorAddress, Tensor>> sent;
  for (int i = 0; i < 4; ++i) {
    TensorAddress address = Address(v1::TENSOR_KIND_ACTIVATION, i, 4);
    address.iteration = 10 + i / 2;  // 10, 10, 11, 11; 1 MiB each
    sent.emplace_back(address, Pattern({256, 1024}, i));
    ASSERT_TRUE(transports_[0]->Send(1, address, sent.back().second).ok());
  }
  ASSERT_TRUE(mailboxes_[1]->AwaitHeld(1, kPatience));
  EXPECT_EQ(mailboxes_[1]->bytes(), 0);

  // The receiver reaches iteration 8: the window now takes 10, and taking
  // a tensor of 10 puts the receiver there, so 11 follows.
  TensorAddress now = Address(v1::TENSOR_KIND_ACTIVATION, 0, 0);
  now.iteration = 8;
  EXPECT_EQ(transports_[1]->Recv(0, now, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  for (int i = 0; i < 4; ++i) {
    const auto& [address, tensor] = sent[i];
    absl::StatusOr<Tensor> got = transports_[1]->Recv(0, address, kPatience);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(BitwiseEqual(*got, tensor)) << address.DebugString();
  }
  EXPECT_EQ(peer_errors_.size(), 0u);
  TensorAddress next = Address(v1::TENSOR_KIND_ACTIVATION, 0, 4);
  next.iteration = 12;
  ExpectDelivered(next, Pattern({2, 2}, 9));  // no rejection waits for this Send either
  EXPECT_EQ(mailboxes_[1]->held(), 0u);
}

// Data-plane peers that read every stream to its half-close and then hold
// it open: each answers (ends its call OK) only once `answer_at` streams
// have half-closed, all of them together, and never if `answer_at` is 0
// (silent peers: a host that vanished answers nothing either). Served on
// `peers` ports of one server; counts half-closes, answers and cancels.
class HalfCloseGate final : public grpc::CallbackGenericService {
 public:
  HalfCloseGate(int peers, int answer_at) : answer_at_(answer_at) {
    grpc::ServerBuilder builder;
    ports_.resize(peers);
    for (int& port : ports_) {
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    }
    builder.RegisterCallbackGenericService(this);
    server_ = builder.BuildAndStart();
  }
  ~HalfCloseGate() override {
    // Every call is answered or cancelled by now; the deadline is a backstop.
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + kPatience));
  }

  bool started() const { return server_ != nullptr; }
  std::vector<std::string> Addresses() const {
    std::vector<std::string> out;
    for (int port : ports_) out.push_back(absl::StrCat("127.0.0.1:", port));
    return out;
  }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new Peer(this);
  }

  int answered() {
    AnnotatedMutexLock lock(&mu_);
    return answered_;
  }
  int cancelled() {
    AnnotatedMutexLock lock(&mu_);
    return cancelled_;
  }
  // How many streams had half-closed when the first cancel came; -1 if none
  // came within kPatience.
  int HalfClosedAtFirstCancel() {
    AnnotatedMutexLock lock(&mu_);
    mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_ > 0; },
                         kPatience);
    return half_closed_at_first_cancel_;
  }
  bool AwaitCancelled(int count) {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_ == count; }, kPatience);
  }

 private:
  class Peer final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Peer(HalfCloseGate* gate) : gate_(gate) { StartRead(&frame_); }
    void OnReadDone(bool ok) override {
      if (ok) {
        StartRead(&frame_);
      } else {
        gate_->HalfClosed(this);
      }
    }
    void OnCancel() override { gate_->Cancelled(this); }
    void OnDone() override { delete this; }
    bool finished = false;  // guarded by the gate's mu_: Finish is called once

   private:
    HalfCloseGate* const gate_;
    grpc::ByteBuffer frame_;
  };

  void HalfClosed(Peer* peer) {
    std::vector<Peer*> answer;
    {
      AnnotatedMutexLock lock(&mu_);
      ++half_closed_;
      holding_.push_back(peer);
      if (half_closed_ != answer_at_) return;
      for (Peer* p : holding_) {
        if (p->finished) continue;
        p->finished = true;
        answer.push_back(p);
      }
      answered_ += static_cast<int>(answer.size());
      holding_.clear();
    }
    for (Peer* p : answer) p->Finish(grpc::Status::OK);
  }

  void Cancelled(Peer* peer) {
    {
      AnnotatedMutexLock lock(&mu_);
      if (cancelled_++ == 0) half_closed_at_first_cancel_ = half_closed_;
      if (peer->finished) return;
      peer->finished = true;
      holding_.erase(std::remove(holding_.begin(), holding_.end(), peer), holding_.end());
    }
    peer->Finish(grpc::Status::CANCELLED);
  }

  const int answer_at_;
  std::vector<int> ports_;
  std::unique_ptr<grpc::Server> server_;
  AnnotatedMutex mu_;
  std::vector<Peer*> holding_ ABSL_GUARDED_BY(mu_);  // half-closed, not answered
  int half_closed_ ABSL_GUARDED_BY(mu_) = 0;
  int answered_ ABSL_GUARDED_BY(mu_) = 0;
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  int half_closed_at_first_cancel_ ABSL_GUARDED_BY(mu_) = -1;
};

// Stage 0 of four, sending one small tensor to each of the gate's three
// peers (stages 1-3) so that each has a stream, then shutting down.
void SendToEachPeerThenShutDown(HalfCloseGate& gate, absl::Duration drain) {
  std::vector<std::string> addresses = {"127.0.0.1:1"};  // its own: never dialled
  for (const std::string& a : gate.Addresses()) addresses.push_back(a);
  Mailbox mailbox;
  GrpcTransportOptions options;
  options.connect_timeout = kPatience;
  options.shutdown_drain_timeout = drain;
  GrpcTransport transport(0, addresses, &mailbox, options);
  for (int peer = 1; peer <= 3; ++peer) {
    ASSERT_TRUE(
        transport.Send(peer, Address(v1::TENSOR_KIND_ACTIVATION, 0, peer), Pattern({4}, peer))
            .ok());
  }
  transport.Shutdown();
  mailbox.Shutdown();
}

// Shutdown closes every stream at once: peers that each finish their call
// only once all three streams half-closed are all answered within the
// drain. Closed one after another, the first stream waited out its drain
// for an answer that needed the others' half-close, and was cancelled.
TEST(GrpcTransportShutdownTest, PeersAnswerOnceAllHalfClosed_AllAnsweredNoneCancelled) {
  HalfCloseGate gate(/*peers=*/3, /*answer_at=*/3);
  ASSERT_TRUE(gate.started());
  SendToEachPeerThenShutDown(gate, /*drain=*/absl::Seconds(5));
  EXPECT_EQ(gate.answered(), 3);
  EXPECT_EQ(gate.cancelled(), 0);
}

// Silent peers (a host that vanished) cost one shared drain, not one each:
// every stream has half-closed before the deadline cancels the first.
TEST(GrpcTransportShutdownTest, ThreeSilentPeers_AllHalfClosedBeforeOneSharedDeadline) {
  HalfCloseGate gate(/*peers=*/3, /*answer_at=*/0);
  ASSERT_TRUE(gate.started());
  SendToEachPeerThenShutDown(gate, /*drain=*/absl::Seconds(1));
  EXPECT_EQ(gate.HalfClosedAtFirstCancel(), 3);
  EXPECT_TRUE(gate.AwaitCancelled(3));
  EXPECT_EQ(gate.answered(), 0);
}

TEST(GrpcTransportOptionsTest, HeldStreamWaits_AtLeastTheReceiveTimeout_DefaultsAsFloors) {
  GrpcTransportOptions patient;
  WaitForHeldStreamsAsLongAsReceivers(absl::Seconds(300), &patient);
  EXPECT_EQ(patient.queue_wait_timeout, absl::Seconds(300));
  EXPECT_EQ(patient.shutdown_drain_timeout, absl::Seconds(300));
  GrpcTransportOptions quick;
  WaitForHeldStreamsAsLongAsReceivers(absl::Seconds(1), &quick);
  EXPECT_EQ(quick.queue_wait_timeout, GrpcTransportOptions().queue_wait_timeout);
  EXPECT_EQ(quick.shutdown_drain_timeout, GrpcTransportOptions().shutdown_drain_timeout);
}

}  // namespace
}  // namespace pipetrain
