// The data plane's receive path: frame messages from a peer through
// ParseFrame (split into slices as gRPC hands them over), FrameAssembler,
// and every tensor they complete through DecodeWireTensor, as a worker's
// data-plane server and runtime handle them.
//
// Input: byte 0 sets the accepted job: num_stages = 1 + (bits 0-2), and bit
// 3 set means no job is assigned (job_id empty); otherwise the job is
// "fuzz-job". Then messages, each a byte that sets where it is cut into
// slices (a cut every 1 + (byte % 64) bytes; 0: one slice), a little-endian
// uint16 length and that many bytes (a serialized pipetrain.v1.TensorFrame
// is what a peer should send); messages ParseFrame rejects are answered with
// an error, as the server does.
//
// The assembler's size limit is 1 MiB here instead of the 4 GiB default:
// the checks are the same, and the fuzzer's 2 GB memory limit is not hit
// by tensors the real limit allows.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "proto/pipetrain/v1/dataplane.pb.h"
#include "worker/transport/frame_codec.h"
#include "worker/transport/frame_wire.h"
#include "worker/transport/transport.h"

namespace {
constexpr int64_t kFuzzMaxTensorBytes = int64_t{1} << 20;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  FuzzInput in(data, size);
  const uint8_t config = in.Byte();
  AcceptedJob job;
  job.num_stages = 1 + (config & 7);
  if ((config & 8) == 0) job.job_id = "fuzz-job";
  FrameAssembler assembler(kFuzzMaxTensorBytes);
  while (!in.empty()) {
    const uint8_t cut = in.Byte();
    const std::string_view message = in.LengthPrefixed();
    std::vector<absl::string_view> slices;
    const size_t step = cut == 0 ? message.size() + 1 : 1 + cut % 64;
    for (size_t at = 0; at < message.size(); at += step) {
      slices.emplace_back(message.data() + at, std::min(step, message.size() - at));
    }
    absl::StatusOr<FrameView> frame = ParseFrame(slices);
    if (!frame.ok()) {
      (void)MakeFrameError(v1::TensorFrame(), frame.status());
      continue;
    }
    absl::StatusOr<std::optional<ReceivedTensor>> accepted = assembler.Accept(*frame, job);
    if (!accepted.ok()) {
      (void)MakeFrameError(frame->header, accepted.status());
      continue;
    }
    if (!accepted->has_value()) continue;
    const ReceivedTensor& received = **accepted;
    (void)DecodeWireTensor(received.wire, received.address.DebugString());
  }
  return 0;
}
