// Activation streaming between two endpoints on loopback: pipetrain's data
// plane next to two plain gRPC streams measured by the same program.
//
//  pipetrain   GrpcTransport::SendOwned on one side (tensors made before
//              the clock starts and handed over, as the runtime and the
//              collectives hand over their fresh copies; from a TensorPool,
//              so that freeing them once sent is not timed), Mailbox::Take on
//              the other: framing (<= 4 MiB frames), the receiving
//              DataPlaneServer's parse and copy into a Tensor (pooled
//              memory), and the mailbox hand-off to another thread included;
//              that thread checks each tensor's first and last element.
//  plain       the same bytes as 4 MiB TensorFrame protobuf messages written
//              on one sync gRPC stream to a server that parses and drops
//              them: what a straightforward gRPC service does.
//  tuned       the fastest plain stream we know how to write that delivers
//              the bytes into the receiver's memory: --tuned-message-mib
//              messages built from zero-copy slices of the sender's buffer
//              (no protobuf, no copy), written with the callback API to a
//              raw-bytes server that copies each message into one reused
//              buffer (as any receiver of tensors must: gRPC's slices are
//              its own), unparsed.
//  drop        the same stream to a server that drops the messages unread:
//              what gRPC alone carries here, for reference (no receiver of
//              tensors can do this little).
// Each column moves `--total-mib` per tensor size; throughput counts
// payload bytes, best of `--repeats` runs (after one warm-up per size).
// The check column is OK when pipetrain reaches --goal (default 0.9) of
// the tuned stream; the footer says whether every row did.
//
//   bazel run -c opt //worker/transport:data_plane_benchmark --
//       [--total-mib 256] [--repeats 3] [--tuned-message-mib 4] [--goal 0.9]
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sys/utsname.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/flag_set.h"
#include "common/malloc_tuning.h"
#include "proto/pipetrain/v1/dataplane.grpc.pb.h"
#include "worker/transport/data_plane_server.h"
#include "worker/transport/frame_codec.h"
#include "worker/transport/grpc_transport.h"
#include "worker/transport/tensor_pool.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

// --- plain: protobuf messages on a sync stream ---------------------------

class ParseAndDropService final : public v1::DataPlaneService::Service {
 public:
  grpc::Status Stream(grpc::ServerContext*,
                      grpc::ServerReaderWriter<v1::FrameError, v1::TensorFrame>* stream) override {
    v1::TensorFrame frame;
    while (stream->Read(&frame)) {
    }
    return grpc::Status::OK;
  }
};

double PlainGbps(const std::string& address, int64_t tensor_bytes, int count) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(kMaxFrameMessageBytes);
  auto stub = v1::DataPlaneService::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  std::string chunk(std::min<int64_t>(tensor_bytes, kMaxFramePayloadBytes), 'x');
  grpc::ClientContext context;
  const auto start = Clock::now();
  auto stream = stub->Stream(&context);
  for (int i = 0; i < count; ++i) {
    for (int64_t off = 0; off < tensor_bytes; off += kMaxFramePayloadBytes) {
      v1::TensorFrame frame;
      frame.set_payload(chunk.data(), std::min<int64_t>(chunk.size(), tensor_bytes - off));
      stream->Write(frame);
    }
  }
  stream->WritesDone();
  stream->Finish();  // returns once the server has read everything
  return double(tensor_bytes) * count / Seconds(start) / 1e9;
}

// --- tuned: zero-copy raw bytes, callback API -----------------------------

// Copies each message into `sink` (when given, else drops it unread).
class DropReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit DropReactor(std::string* sink) : sink_(sink) { StartRead(&message_); }
  void OnReadDone(bool ok) override {
    if (ok) {
      if (sink_ != nullptr) {
        std::vector<grpc::Slice> slices;
        (void)message_.Dump(&slices);
        size_t at = 0;
        for (const grpc::Slice& slice : slices) {
          const size_t n = std::min(slice.size(), sink_->size() - at);
          std::memcpy(sink_->data() + at, slice.begin(), n);
          at += n;
        }
      }
      StartRead(&message_);
    } else {
      Finish(grpc::Status::OK);
    }
  }
  void OnDone() override { delete this; }

 private:
  std::string* const sink_;
  grpc::ByteBuffer message_;
};

// One stream at a time (the benchmark runs them one after another), so one
// sink buffer serves all.
class RawDropService final
    : public v1::DataPlaneService::WithRawCallbackMethod_Stream<v1::DataPlaneService::Service> {
 public:
  explicit RawDropService(bool copy) : sink_(copy ? int64_t{64} << 20 : 0, '\0') {}
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Stream(
      grpc::CallbackServerContext*) override {
    return new DropReactor(sink_.empty() ? nullptr : &sink_);
  }

 private:
  std::string sink_;
};

// Writes `count` messages, each the same zero-copy slices, then half-closes
// and waits for the server to finish the call.
class RawWriter final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RawWriter(grpc::GenericStub* stub, const std::string& method, grpc::ByteBuffer message,
            int64_t count)
      : message_(std::move(message)), left_(count) {
    stub->PrepareBidiStreamingCall(&context_, method, grpc::StubOptions(), this);
    AddHold();
    StartRead(&reply_);
    StartCall();
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (ok) {
      Next();
    } else {
      RemoveHold();
    }
  }
  void OnReadDone(bool) override {}
  void OnDone(const grpc::Status&) override { done_.Notify(); }
  void Wait() { done_.WaitForNotification(); }

 private:
  void Next() {
    if (left_-- > 0) {
      StartWrite(&message_);
    } else {
      StartWritesDone();
      RemoveHold();
    }
  }
  grpc::ClientContext context_;
  grpc::ByteBuffer message_;
  grpc::ByteBuffer reply_;
  int64_t left_;
  absl::Notification done_;
};

double TunedGbps(const std::string& address, const std::string& buffer, int64_t tensor_bytes,
                 int count, int64_t message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetMaxReceiveMessageSize(-1);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  grpc::GenericStub stub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  const int64_t size = std::min(message_bytes, tensor_bytes);
  const grpc::Slice slice(buffer.data(), static_cast<size_t>(size), grpc::Slice::STATIC_SLICE);
  const int64_t messages = (tensor_bytes * count + size - 1) / size;
  const std::string method =
      absl::StrCat("/", v1::DataPlaneService::service_full_name(), "/Stream");
  const auto start = Clock::now();
  RawWriter writer(&stub, method, grpc::ByteBuffer(&slice, 1), messages);
  writer.Wait();
  return double(size) * messages / Seconds(start) / 1e9;
}

// --- pipetrain -------------------------------------------------------------

double PipetrainGbps(GrpcTransport& sender, Mailbox& mailbox, TensorPool& pool,
                     const Tensor& tensor, int count, int64_t iteration_base) {
  std::vector<Tensor> outgoing;
  for (int i = 0; i < count; ++i) {
    outgoing.push_back(pool.Take(tensor.shape()));
    outgoing.back().CopyFrom(tensor);
  }
  std::atomic<bool> intact{true};
  const auto start = Clock::now();
  std::thread receiver([&] {
    for (int i = 0; i < count; ++i) {
      TensorAddress a{"bench", iteration_base + i, v1::TENSOR_KIND_ACTIVATION, 0, 0};
      absl::StatusOr<WireTensor> got = mailbox.Take(0, a, absl::Seconds(60));
      if (!got.ok()) std::abort();
      const Tensor& t = got->tensor;
      const int64_t n = t.numel();
      if (n != tensor.numel() || t[0] != tensor[0] || t[n - 1] != tensor[n - 1]) intact = false;
    }
  });
  for (int i = 0; i < count; ++i) {
    TensorAddress a{"bench", iteration_base + i, v1::TENSOR_KIND_ACTIVATION, 0, 0};
    if (!sender.SendOwned(1, a, std::move(outgoing[i])).ok()) std::abort();
  }
  receiver.join();
  if (!intact) {
    std::fprintf(stderr, "a received tensor differs from the one sent\n");
    std::abort();
  }
  return double(tensor.size_bytes()) * count / Seconds(start) / 1e9;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

int Run(const std::vector<std::string>& args) {
  int total_mib = 256;
  int repeats = 3;
  int tuned_message_mib = 4;
  double goal = 0.9;
  std::string sizes_kib = "64,1024,4096,16384,65536";
  FlagSet flags(
      "usage: data_plane_benchmark [--total-mib 256] [--repeats 3] [--tuned-message-mib 4] "
      "[--goal 0.9] [--sizes-kib 64,1024,4096,16384,65536]");
  flags.Int("total-mib", &total_mib, "bytes moved per tensor size and column");
  flags.Int("repeats", &repeats, "timed runs per cell; the best is shown");
  flags.Int("tuned-message-mib", &tuned_message_mib, "message size of the tuned stream");
  flags.Double("goal", &goal, "pipetrain / tuned ratio a row must reach");
  flags.String("sizes-kib", &sizes_kib, "tensor sizes, comma-separated KiB (each <= 65536)");
  const bool parsed = flags.Parse(args).ok();
  if (flags.help_requested()) return std::printf("%s", flags.Usage().c_str()), 0;
  std::vector<int64_t> sizes;
  for (absl::string_view kib : absl::StrSplit(sizes_kib, ',')) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(kib, &value) || value > 65536) value = 0;
    sizes.push_back(value);
  }
  if (!parsed || total_mib < 1 || repeats < 1 || tuned_message_mib < 1 ||
      std::find_if(sizes.begin(), sizes.end(), [](int64_t k) { return k < 1; }) != sizes.end()) {
    std::fprintf(stderr, "%s", flags.Usage().c_str());
    return 2;
  }

  Mailbox mailbox;
  auto server = DataPlaneServer::Start("127.0.0.1:0", &mailbox).value();
  server->SetJob("bench", 2, "");  // one process: no proof needed
  GrpcTransportOptions options;
  options.credential.job_id = "bench";
  GrpcTransport sender(0, {"", server->address()}, &mailbox, options);

  ParseAndDropService plain_service;
  RawDropService tuned_service(/*copy=*/true);
  RawDropService drop_service(/*copy=*/false);
  int plain_port = 0;
  int tuned_port = 0;
  int drop_port = 0;
  grpc::ServerBuilder plain_builder;
  plain_builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &plain_port);
  plain_builder.SetMaxReceiveMessageSize(kMaxFrameMessageBytes);
  plain_builder.RegisterService(&plain_service);
  auto plain_server = plain_builder.BuildAndStart();
  grpc::ServerBuilder tuned_builder;
  tuned_builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &tuned_port);
  tuned_builder.SetMaxReceiveMessageSize(-1);
  tuned_builder.RegisterService(&tuned_service);
  auto tuned_server = tuned_builder.BuildAndStart();
  grpc::ServerBuilder drop_builder;
  drop_builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &drop_port);
  drop_builder.SetMaxReceiveMessageSize(-1);
  drop_builder.RegisterService(&drop_service);
  auto drop_server = drop_builder.BuildAndStart();
  const std::string drop = absl::StrCat("127.0.0.1:", drop_port);
  const std::string plain = absl::StrCat("127.0.0.1:", plain_port);
  const std::string tuned = absl::StrCat("127.0.0.1:", tuned_port);

  utsname machine{};
  uname(&machine);
  std::printf("# machine: %s, %u hardware threads, %s %s\n", CpuModel().c_str(),
              std::thread::hardware_concurrency(), machine.sysname, machine.release);
  std::printf(
      "# loopback tensor streaming, payload GB/s (1e9 bytes/s), best of %d; %d MiB per cell; "
      "tuned stream: %d MiB zero-copy messages\n",
      repeats, total_mib, tuned_message_mib);
  std::printf("%12s %8s %14s %10s %10s %9s %9s %6s\n", "tensor_KiB", "count", "pipetrain_GBps",
              "plain_GBps", "tuned_GBps", "drop_GBps", "vs_tuned", "check");
  const std::string buffer(int64_t{64} << 20, 'x');
  auto outgoing_pool = TensorPool::Create({.max_cached_bytes = int64_t{1} << 30});
  bool ok = true;
  int64_t iteration = 0;
  for (int64_t kib : sizes) {
    const int64_t bytes = kib * 1024;
    const int count = std::max<int64_t>(2, (int64_t{total_mib} << 20) / bytes);
    Tensor tensor = Tensor::Zeros({bytes / 4});
    for (int64_t i = 0; i < tensor.numel(); ++i) tensor[i] = static_cast<float>(i % 1000);
    PipetrainGbps(sender, mailbox, *outgoing_pool, tensor, 1,
                  iteration++);  // warm-up: connect, allocate
    PlainGbps(plain, bytes, 1);
    TunedGbps(tuned, buffer, bytes, 1, int64_t{tuned_message_mib} << 20);
    TunedGbps(drop, buffer, bytes, 1, int64_t{tuned_message_mib} << 20);
    double ours = 0, base = 0, best = 0, dropped = 0;
    for (int r = 0; r < repeats; ++r) {
      ours =
          std::max(ours, PipetrainGbps(sender, mailbox, *outgoing_pool, tensor, count, iteration));
      iteration += count;
      base = std::max(base, PlainGbps(plain, bytes, count));
      best =
          std::max(best, TunedGbps(tuned, buffer, bytes, count, int64_t{tuned_message_mib} << 20));
      dropped = std::max(dropped,
                         TunedGbps(drop, buffer, bytes, count, int64_t{tuned_message_mib} << 20));
    }
    const bool row_ok = ours >= goal * best;
    ok = ok && row_ok;
    std::printf("%12lld %8d %14.2f %10.2f %10.2f %9.2f %9.2f %6s\n", static_cast<long long>(kib),
                count, ours, base, best, dropped, ours / best, row_ok ? "OK" : "FAILED");
  }
  std::printf("# %s: pipetrain's data plane reaches %.0f%% of the tuned stream at every size\n",
              ok ? "OK" : "FAILED", goal * 100);
  sender.Shutdown();
  server->Shutdown();
  plain_server->Shutdown();
  tuned_server->Shutdown();
  drop_server->Shutdown();
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  // As the worker does (worker/main.cc): every column runs under it.
  if (!pipetrain::TuneMallocForLargeBuffers()) std::fprintf(stderr, "mallopt refused\n");
  return pipetrain::Run(std::vector<std::string>(argv + 1, argv + argc));
}
