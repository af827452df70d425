// The data plane's receive path: TensorFrames from a peer through
// FrameAssembler, and every tensor they complete through DecodeWireTensor,
// as a worker's data-plane server and runtime handle them.
//
// Input: byte 0 sets the accepted job: num_stages = 1 + (bits 0-2), and bit
// 3 set means no job is assigned (job_id empty); otherwise the job is
// "fuzz-job". Then frames, each a little-endian uint16 length and that many
// bytes of a serialized pipetrain.v1.TensorFrame; pieces that do not parse
// are skipped.
//
// The assembler's size limit is 1 MiB here instead of the 4 GiB default:
// the checks are the same, and the fuzzer's 2 GB memory limit is not hit
// by tensors the real limit allows.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "fuzz/fuzz_input.h"
#include "proto/pipetrain/v1/dataplane.pb.h"
#include "worker/transport/frame_codec.h"
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
    const std::string_view piece = in.LengthPrefixed();
    v1::TensorFrame frame;
    if (!frame.ParseFromArray(piece.data(), static_cast<int>(piece.size()))) continue;
    absl::StatusOr<std::optional<ReceivedTensor>> accepted = assembler.Accept(frame, job);
    if (!accepted.ok()) {
      (void)MakeFrameError(frame, accepted.status());
      continue;
    }
    if (!accepted->has_value()) continue;
    const ReceivedTensor& received = **accepted;
    (void)DecodeWireTensor(received.wire, received.address.DebugString());
  }
  return 0;
}
