// Activation streaming between two workers on loopback, next to a plain
// gRPC streaming baseline measured by the same program.
//
//  pipetrain   GrpcTransport::Send on one side, Mailbox::Take on the other:
//              framing (<= 4 MiB frames), the receiving DataPlaneServer's
//              reassembly into a Tensor and the mailbox hand-off included.
//  baseline    the same bytes as 4 MiB TensorFrame messages written on one
//              sync gRPC stream to a server that only reads and discards them.
// Both move `--total-mib` per tensor size; throughput counts payload bytes.
// The check column is OK when pipetrain reaches at least half the baseline.
//
//   bazel run //worker/transport:data_plane_benchmark -- [--total-mib 256]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "common/flag_set.h"
#include "grpcpp/grpcpp.h"
#include "proto/pipetrain/v1/dataplane.grpc.pb.h"
#include "worker/transport/data_plane_server.h"
#include "worker/transport/frame_codec.h"
#include "worker/transport/grpc_transport.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

// The baseline receiver: reads frames and drops them.
class DiscardService final : public v1::DataPlane::Service {
 public:
  grpc::Status Stream(grpc::ServerContext*,
                      grpc::ServerReaderWriter<v1::FrameError, v1::TensorFrame>* stream) override {
    v1::TensorFrame frame;
    while (stream->Read(&frame)) bytes_ += static_cast<int64_t>(frame.payload().size());
    return grpc::Status::OK;
  }
  std::atomic<int64_t> bytes_{0};
};

double BaselineGbps(const std::string& address, int64_t tensor_bytes, int count) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(kMaxFrameMessageBytes);
  auto stub = v1::DataPlane::NewStub(
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

double PipetrainGbps(GrpcTransport& sender, Mailbox& mailbox, int64_t tensor_bytes, int count,
                     int64_t iteration_base) {
  Tensor tensor = Tensor::Zeros({tensor_bytes / 4});
  const auto start = Clock::now();
  std::thread receiver([&] {
    for (int i = 0; i < count; ++i) {
      TensorAddress a{"bench", iteration_base + i, v1::ACTIVATION, 0, 0};
      if (!mailbox.Take(0, a, absl::Seconds(60)).ok()) std::abort();
    }
  });
  for (int i = 0; i < count; ++i) {
    TensorAddress a{"bench", iteration_base + i, v1::ACTIVATION, 0, 0};
    if (!sender.Send(1, a, tensor).ok()) std::abort();
  }
  receiver.join();
  return double(tensor_bytes) * count / Seconds(start) / 1e9;
}

int Run(const std::vector<std::string>& args) {
  int total_mib = 256;
  FlagSet flags("usage: data_plane_benchmark [--total-mib 256]");
  flags.Int("total-mib", &total_mib, "bytes moved per tensor size");
  if (!flags.Parse(args).ok() || total_mib < 1) return std::fprintf(stderr, "%s", flags.Usage().c_str()), 2;

  Mailbox mailbox;
  auto server = DataPlaneServer::Start("127.0.0.1:0", &mailbox).value();
  server->SetJob("bench", 2, "");  // one process: no proof needed
  GrpcTransport sender(0, {"", server->address()}, &mailbox);
  DiscardService discard;
  grpc::ServerBuilder builder;
  int baseline_port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &baseline_port);
  builder.SetMaxReceiveMessageSize(kMaxFrameMessageBytes);
  builder.RegisterService(&discard);
  auto baseline_server = builder.BuildAndStart();
  const std::string baseline = "127.0.0.1:" + std::to_string(baseline_port);

  std::printf("# loopback tensor streaming, payload GB/s (1e9 bytes/s); %d MiB per size\n",
              total_mib);
  std::printf("%12s %8s %14s %14s %8s %6s\n", "tensor_KiB", "count", "pipetrain_GBps",
              "baseline_GBps", "ratio", "check");
  bool ok = true;
  int64_t iteration = 0;
  for (int64_t kib : {64, 1024, 4096, 16384, 65536}) {
    const int64_t bytes = kib * 1024;
    const int count = std::max<int64_t>(2, (int64_t{total_mib} << 20) / bytes);
    PipetrainGbps(sender, mailbox, bytes, 1, iteration++);  // warm-up: connect, allocate
    const double ours = PipetrainGbps(sender, mailbox, bytes, count, iteration);
    iteration += count;
    BaselineGbps(baseline, bytes, 1);
    const double base = BaselineGbps(baseline, bytes, count);
    const bool row_ok = ours >= 0.5 * base;
    ok = ok && row_ok;
    std::printf("%12lld %8d %14.2f %14.2f %8.2f %6s\n", static_cast<long long>(kib), count, ours,
                base, ours / base, row_ok ? "OK" : "FAILED");
  }
  std::printf("# %s: pipetrain's data plane reaches at least half the plain gRPC stream\n",
              ok ? "OK" : "FAILED");
  sender.Shutdown();
  server->Shutdown();
  baseline_server->Shutdown();
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  return pipetrain::Run(std::vector<std::string>(argv + 1, argv + argc));
}
