// The data plane's receive path: frame messages from a peer through
// ParseFrame (split into slices as gRPC hands them over), FrameAssembler
// admitting each tensor into a Mailbox (Reserve), and every tensor they
// complete through DecodeWireTensor and into the mailbox (Put with its
// reservation; a refused frame noted with NoteRefused), as a worker's
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
// The assembler's size limit is 1 MiB here instead of the 4 GiB default,
// and the mailbox holds at most 2 MiB and 8 tensors: the checks are the
// same, and the fuzzer's 2 GB memory limit is not hit by tensors the real
// limit allows.
//
// Checks beyond the sanitizers: the mailbox never holds more than its
// limits, and once the stream ends (Abandon) no reservation is left (a
// leaked one would keep room from every later tensor).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "proto/pipetrain/v1/dataplane.pb.h"
#include "worker/transport/frame_codec.h"
#include "worker/transport/frame_wire.h"
#include "worker/transport/mailbox.h"
#include "worker/transport/transport.h"

namespace {
// Small enough that inputs of a few KiB cross them: a tensor larger than the
// whole mailbox (up to the assembler's limit, above the mailbox's), and two
// streams' tensors that together do not fit.
constexpr int64_t kFuzzMaxTensorBytes = 1024;
constexpr pipetrain::MailboxLimits kFuzzMailboxLimits{
    .max_bytes = 768, .run_ahead_iterations = 2, .max_tensors = 8};
constexpr int kStreams = 2;  // assemblers sharing the mailbox, as a peer's streams do
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  FuzzInput in(data, size);
  const uint8_t config = in.Byte();
  AcceptedJob job;
  job.num_stages = 1 + (config & 7);
  if ((config & 8) == 0) job.job_id = "fuzz-job";
  Mailbox mailbox(kFuzzMailboxLimits);
  // At the seeds' iteration (make_seeds.cc: 3): opened at 0, the run-ahead
  // window of 2 refused every seed tensor at Reserve, and no seed reached
  // assembly, Put or decoding.
  if (!job.job_id.empty()) mailbox.OpenJob(job.job_id, 3);
  const FrameAssembler::Admission admit = [&mailbox](const TensorAddress& address, int64_t bytes) {
    return mailbox.Reserve(address, bytes);
  };
  FrameAssembler streams[kStreams] = {FrameAssembler(kFuzzMaxTensorBytes),
                                      FrameAssembler(kFuzzMaxTensorBytes)};
  while (!in.empty()) {
    // Bit 7: the stream; the rest: the slices.
    const uint8_t byte = in.Byte();
    FrameAssembler& assembler = streams[(byte >> 7) % kStreams];
    const uint8_t cut = byte & 0x7f;
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
    absl::StatusOr<std::optional<ReceivedTensor>> accepted = assembler.Accept(*frame, job, admit);
    absl::Status status = accepted.status();
    if (accepted.ok() && accepted->has_value()) {
      ReceivedTensor& received = **accepted;
      (void)DecodeWireTensor(received.wire, received.address.DebugString());
      status = mailbox.Put(received.source_stage, received.address, std::move(received.wire),
                           std::move(received.reservation));
    }
    if (!status.ok()) {
      const v1::TensorFrame& header = frame->header;
      mailbox.NoteRefused(header.source_stage(),
                          MakeAddress(header.job_id(), header.iteration(), header.tensor()),
                          status);
      (void)MakeFrameError(header, status);
    }
    if (mailbox.bytes() + mailbox.reserved() > kFuzzMailboxLimits.max_bytes ||
        mailbox.size() > static_cast<size_t>(kFuzzMailboxLimits.max_tensors)) {
      __builtin_trap();  // past the mailbox's limits
    }
  }
  for (FrameAssembler& assembler : streams) assembler.Abandon();  // the streams end
  if (mailbox.reserved() != 0) __builtin_trap();  // a reservation outlived its tensor
  mailbox.Shutdown();
  return 0;
}
