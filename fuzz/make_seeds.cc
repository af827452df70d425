// Writes the binary seed files of fuzz/corpus/ (the text seeds, job specs,
// are written by hand). Run from the repository root after changing a
// format or fuzz/codec_specs.h, then commit the files:
//   bazel --output_base=$HOME/.cache/pipetrain-fuzz run --config=fuzz \
//     //fuzz:make_seeds -- "$PWD/fuzz/corpus"
// Deterministic: the same build writes the same bytes.
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/safetensors.h"
#include "common/tensor.h"
#include "coordinator/jobs/profile_cache.h"
#include "coordinator/planner/schedule_compiler.h"
#include "coordinator/planner/solve_plan.h"
#include "fuzz/codec_specs.h"
#include "kernels/compress/codec_spec.h"
#include "proto/pipetrain/v1/coordinator.pb.h"
#include "proto/pipetrain/v1/dataplane.pb.h"
#include "proto/pipetrain/v1/plan.pb.h"
#include "proto/pipetrain/v1/profile.pb.h"
#include "worker/checkpoint/unit_checkpoint.h"
#include "worker/data/token_file.h"
#include "worker/model/gpt_config.h"
#include "worker/profile/unit_profiler.h"
#include "worker/transport/frame_codec.h"
#include "worker/transport/transport.h"

namespace pipetrain {
namespace {

void WriteSeed(const std::string& dir, const std::string& name, const std::string& bytes) {
  const std::string path = absl::StrCat(dir, "/", name);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  PT_CHECK(f != nullptr) << "cannot create " << path << " (does the directory exist?)";
  PT_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size()) << path;
  PT_CHECK(std::fclose(f) == 0) << path;
}

std::string ReadBytes(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  PT_CHECK(f != nullptr) << path;
  std::string bytes;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) bytes.append(buffer, n);
  std::fclose(f);
  return bytes;
}

// A smooth, non-constant tensor: values that every codec keeps distinct.
Tensor Ramp(const Shape& shape) {
  Tensor t = Tensor::Zeros(shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data()[i] = 0.25f * static_cast<float>((i * 7) % 13) - 1.5f;
  }
  return t;
}

std::string Uint16(uint16_t v) { return {static_cast<char>(v & 0xff), static_cast<char>(v >> 8)}; }

std::string Uint64(uint64_t v) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}

// --- safetensors

// A file with `header` JSON and `data`, as the format lays it out.
std::string SafetensorsBytes(const std::string& header, const std::string& data) {
  return Uint64(header.size()) + header + data;
}

void SafetensorsSeeds(const std::string& dir) {
  const std::string tmp = dir + "/.tmp.safetensors";
  const absl::Status written = WriteSafetensors(
      tmp, {{"wte.weight", Ramp({4, 3})}, {"ln_f.bias", Ramp({3})}}, {{"format", "pt"}});
  PT_CHECK(written.ok()) << written;
  WriteSeed(dir, "f32_two_tensors_metadata.safetensors", ReadBytes(tmp));
  std::remove(tmp.c_str());
  // F16 1.0, -2.0; BF16 0.5, 3.0; F64 1.5; a scalar; an empty tensor.
  const std::string f16("\x00\x3c\x00\xc0", 4);
  const std::string bf16("\x00\x3f\x40\x40", 4);
  const std::string f64("\x00\x00\x00\x00\x00\x00\xf8\x3f", 8);
  WriteSeed(dir, "f16_bf16_f64.safetensors",
            SafetensorsBytes(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[4,8]},)"
                             R"("c":{"dtype":"F64","shape":[],"data_offsets":[8,16]},)"
                             R"("d":{"dtype":"F32","shape":[0,5],"data_offsets":[16,16]}})",
                             f16 + bf16 + f64));
}

// --- codecs

// Payloads of a few shapes for `spec` (Encode errors, e.g. a shape a codec
// does not take, are skipped).
std::vector<std::string> Payloads(const std::string& spec) {
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(spec);
  PT_CHECK(codec.ok()) << spec << ": " << codec.status();
  std::vector<std::string> out;
  for (const Shape& shape : {Shape{4, 8}, Shape{2, 3, 5}, Shape{7}}) {
    CodecState state;
    absl::StatusOr<std::string> payload = (*codec)->Encode(Ramp(shape), &state);
    if (payload.ok()) out.push_back(*std::move(payload));
  }
  return out;
}

void CodecSeeds(const std::string& dir) {
  for (size_t i = 0; i < kNumFuzzCodecSpecs; ++i) {
    const std::vector<std::string> payloads = Payloads(kFuzzCodecSpecs[i]);
    for (size_t j = 0; j < payloads.size(); ++j) {
      WriteSeed(dir, absl::StrCat("codec", i, "_", j),
                std::string(1, static_cast<char>(i)) + payloads[j]);
    }
  }
}

void CodecSpecSeeds(const std::string& dir) {
  const char* specs[] = {"fp16",
                         "linear:bits=4",
                         "piecewise:bits=2",
                         "elem_topk:keep=0.05",
                         "token_topk:keep=0.5+piecewise:bits=4",
                         "powersgd:rank=2"};
  int n = 0;
  for (const char* spec : specs) {
    const std::vector<std::string> payloads = Payloads(spec);
    PT_CHECK(!payloads.empty()) << spec;
    WriteSeed(dir, absl::StrCat("spec", n++), absl::StrCat(spec, "\n", payloads[0]));
  }
}

// --- data-plane frames

// One message as frame_fuzzer reads it: its byte (bit 7 the stream, the
// rest the cut: 0 whole, 7 in slices of 8 bytes), length and bytes.
std::string FrameMessage(const v1::TensorFrame& frame, bool whole, int stream = 0) {
  const std::string bytes = frame.SerializeAsString();
  PT_CHECK(bytes.size() <= 0xffff) << "frame too large for a seed";
  return std::string(1, static_cast<char>((stream << 7) | (whole ? 0 : 7))) +
         Uint16(static_cast<uint16_t>(bytes.size())) + bytes;
}

// `frames` serialized as frame_fuzzer reads them, after its config byte
// (num_stages 2, job "fuzz-job"), on stream 0: every other message arrives
// whole, the others in slices of 8 bytes.
std::string FrameInput(const std::vector<std::vector<v1::TensorFrame>>& tensors) {
  std::string out(1, '\x01');
  int n = 0;
  for (const auto& frames : tensors) {
    for (const v1::TensorFrame& frame : frames) out += FrameMessage(frame, n++ % 2 == 0);
  }
  return out;
}

TensorAddress Address(v1::TensorKind kind, int micro_batch, int unit) {
  TensorAddress a;
  a.job_id = "fuzz-job";
  a.iteration = 3;  // frame_fuzzer opens the job at 3
  a.kind = kind;
  a.micro_batch = micro_batch;
  a.unit = unit;
  return a;
}

WireTensor Encoded(const std::string& spec, const Shape& shape) {
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(spec);
  PT_CHECK(codec.ok()) << codec.status();
  absl::StatusOr<std::string> payload = (*codec)->Encode(Ramp(shape), nullptr);
  PT_CHECK(payload.ok()) << spec << ": " << payload.status();
  return WireTensor::Encoded(spec, *std::move(payload), shape);
}

void FrameSeeds(const std::string& dir) {
  const auto raw = EncodeTensorFrames(0, Address(v1::TENSOR_KIND_ACTIVATION, 1, 2),
                                      WireTensor::Raw(Ramp({4, 8})),
                                      /*max_frame_bytes=*/48);
  WriteSeed(dir, "raw_in_three_frames", FrameInput({raw}));
  const auto grad = EncodeTensorFrames(1, Address(v1::TENSOR_KIND_ACTIVATION_GRAD, 0, 3),
                                       Encoded("piecewise:bits=3", {4, 8}), 16);
  WriteSeed(dir, "piecewise_in_frames", FrameInput({grad}));
  const auto weights = EncodeTensorFrames(1, Address(v1::TENSOR_KIND_UNIT_WEIGHTS, -1, 0),
                                          Encoded("token_topk:keep=0.5+fp16", {4, 8}));
  const auto empty = EncodeTensorFrames(0, Address(v1::TENSOR_KIND_EVAL_ACTIVATION, 0, 1),
                                        WireTensor::Raw(Tensor::Zeros({0, 8})));
  WriteSeed(dir, "three_tensors", FrameInput({raw, weights, empty}));
  const auto powersgd = EncodeTensorFrames(0, Address(v1::TENSOR_KIND_TIED_EMBEDDING_GRAD, 0, 0),
                                           Encoded("powersgd:rank=2", {6, 5}), 64);
  WriteSeed(dir, "powersgd_in_frames", FrameInput({powersgd}));
  // The mailbox's byte limit (768 in frame_fuzzer): two streams' tensors of
  // 400 bytes each, interleaved, do not fit together (the second is
  // refused at its first frame, "mailbox full"), and one of 840 bytes
  // (within the assembler's 1 KiB) is larger than the whole mailbox.
  const auto first = EncodeTensorFrames(0, Address(v1::TENSOR_KIND_ACTIVATION, 0, 1),
                                        WireTensor::Raw(Ramp({10, 10})), 160);
  const auto second = EncodeTensorFrames(0, Address(v1::TENSOR_KIND_ACTIVATION, 1, 1),
                                         WireTensor::Raw(Ramp({10, 10})), 160);
  const auto large = EncodeTensorFrames(0, Address(v1::TENSOR_KIND_ACTIVATION, 2, 1),
                                        WireTensor::Raw(Ramp({14, 15})), 4096);
  PT_CHECK(first.size() >= 2 && second.size() >= 2) << "the tensors must span frames";
  std::string limits(1, '\x01');
  limits += FrameMessage(first[0], true, 0) + FrameMessage(second[0], true, 1);
  for (size_t i = 1; i < first.size(); ++i) limits += FrameMessage(first[i], true, 0);
  for (size_t i = 1; i < second.size(); ++i) limits += FrameMessage(second[i], true, 1);
  for (const v1::TensorFrame& frame : large) limits += FrameMessage(frame, false, 0);
  WriteSeed(dir, "two_streams_over_the_byte_limit", limits);
}

// --- token files

void TokenFileSeeds(const std::string& dir) {
  // Byte 0: format (0 auto, 1 text, 2 uint16, 3 uint16-header; +4 for a
  // ".bin" name); byte 1: vocabulary (0: 256, 1: 50257).
  WriteSeed(dir, "text", std::string("\x01\x00", 2) + "the cat sat on the mat\n");
  std::string raw;
  for (uint16_t t : {17, 300, 50256, 0, 9}) raw += Uint16(t);
  WriteSeed(dir, "uint16_raw", std::string("\x02\x01", 2) + raw);
  WriteSeed(dir, "uint16_auto_bin", std::string("\x04\x01", 2) + raw);
  const std::string tmp = dir + "/.tmp.tokens";
  const absl::Status written =
      WriteUint16TokenFile(tmp, {17, 300, 50256, 0, 9}, /*with_header=*/true);
  PT_CHECK(written.ok()) << written;
  const std::string with_header = ReadBytes(tmp);
  std::remove(tmp.c_str());
  WriteSeed(dir, "uint16_header", std::string("\x03\x01", 2) + with_header);
  WriteSeed(dir, "uint16_header_auto", std::string("\x00\x01", 2) + with_header);
}

// --- planner JSON

void PlannerSeeds(const std::string& dir) {
  // Byte 0 mod 4: '0' profile, '1' cluster, '2' AccTFM profile, '3' both.
  const std::string profile =
      R"({"micro_batch_size": 2, "units": [)"
      R"({"name": "embed", "fwd_seconds": 1e-5, "bwd_seconds": 2e-5, "weight_bytes": 393216,)"
      R"( "activation_bytes": 262144, "stash_bytes": 0},)"
      R"({"name": "attn_0", "fwd_seconds": 0.0023, "bwd_seconds": 0.0037,)"
      R"( "weight_bytes": 1054720, "activation_bytes": 262144, "stash_bytes": 2099200},)"
      R"({"name": "head", "fwd_seconds": 0.004, "bwd_seconds": 0.008, "weight_bytes": 0,)"
      R"( "activation_bytes": 0}]})";
  const std::string cluster =
      R"({"workers": [{"name": "w0", "speed": 1.0, "memory_bytes": 17179869184},)"
      R"( {"name": "w1", "speed": 0.5}], "bandwidth_bytes_per_second": 1.25e9,)"
      R"( "latency_seconds": 5e-5})";
  // AccTFM: all-reduce times from the eq. 3 model, or given per layer.
  const std::string acctfm =
      R"({"layers": [{"name": "block0", "fwd_seconds": [0.004, 0.0022, 0.0012],)"
      R"( "bwd_seconds": [0.008, 0.0042, 0.0023], "output_bytes": 4194304},)"
      R"( {"name": "block1", "fwd_seconds": [0.005, 0.0026, 0.0014],)"
      R"( "bwd_seconds": [0.009, 0.0047, 0.0025], "output_bytes": 4194304}],)"
      R"( "allreduce": {"alpha_seconds": 5e-6, "beta_seconds_per_byte": 4e-11,)"
      R"( "group_size": 4, "algorithm": "recursive_doubling"}})";
  const std::string acctfm_measured =
      R"({"layers": [{"name": "block0", "fwd_seconds": [0.004, 0.0022, 0.0012],)"
      R"( "bwd_seconds": [0.008, 0.0042, 0.0023], "allreduce_seconds": [0.001, 0.0006, 0.0004],)"
      R"( "output_bytes": 4194304}]})";
  WriteSeed(dir, "profile.json", "0" + profile);
  WriteSeed(dir, "cluster.json", "1" + cluster);
  WriteSeed(dir, "acctfm.json", "2" + acctfm);
  WriteSeed(dir, "acctfm_measured.json", "2" + acctfm_measured);
  WriteSeed(dir, "profile_and_cluster",
            "3" + Uint16(static_cast<uint16_t>(profile.size())) + profile + cluster);
}

// step_trace_fuzzer: both workers' traces of step 10 of the target's
// programs, every instruction timed one after the other (0.1 ms each,
// receives half waiting, the second worker 2 ms later); the same with the
// first worker's last instructions left out; and both steps said to take
// 5e-324 s, every instruction 0 s (whose axis once had a tick step of 0).
void StepTraceSeeds(const std::string& dir) {
  const std::vector<v1::Program> programs =
      CompilePrograms({Range{0, 3}, Range{3, 6}}, 6, 4, Schedule::kOneFOneB).value();
  std::string traces[2];
  std::string shortened;
  std::string least[2];
  for (int w = 0; w < 2; ++w) {
    v1::StepTrace trace;
    trace.set_iteration(10);
    trace.mutable_start_time()->set_seconds(1800000000);
    trace.mutable_start_time()->set_nanos(w * 2000000);
    const int n = programs[w].instructions_size();
    trace.set_seconds(1e-4 * n);
    for (int i = 0; i < n; ++i) {
      v1::InstructionTiming* t = trace.add_instructions();
      t->set_instruction(i);
      t->set_start_seconds(1e-4 * i);
      t->set_end_seconds(1e-4 * (i + 1));
      if (programs[w].instructions(i).has_recv()) t->set_waited_seconds(5e-5);
    }
    traces[w] = trace.SerializeAsString();
    v1::StepTrace instant = trace;
    instant.set_seconds(std::numeric_limits<double>::denorm_min());
    for (v1::InstructionTiming& t : *instant.mutable_instructions()) {
      t.set_start_seconds(0);
      t.set_end_seconds(0);
      t.set_waited_seconds(0);
    }
    least[w] = instant.SerializeAsString();
    if (w == 0) {
      trace.mutable_instructions()->DeleteSubrange(n / 2, n - n / 2);
      shortened = trace.SerializeAsString();
    }
  }
  WriteSeed(dir, "two_workers",
            Uint16(static_cast<uint16_t>(traces[0].size())) + traces[0] + traces[1]);
  WriteSeed(dir, "first_half_timed",
            Uint16(static_cast<uint16_t>(shortened.size())) + shortened + traces[1]);
  WriteSeed(dir, "least_span",
            Uint16(static_cast<uint16_t>(least[0].size())) + least[0] + least[1]);
}

// --- REST requests (rest_fuzzer.cc: uint16-length-prefixed requests, the
// last one the rest; its server's token)

constexpr char kRestToken[] = "fuzz-token-5b1d2a7c9e3f4061";

std::string HttpRequestBytes(const std::string& method, const std::string& target,
                             const std::string& body, bool with_token) {
  std::string head = absl::StrCat(method, " ", target, " HTTP/1.1\r\nHost: coordinator\r\n");
  if (with_token) absl::StrAppend(&head, "Authorization: Bearer ", kRestToken, "\r\n");
  if (method == "POST") {
    absl::StrAppend(&head, "Content-Type: application/json\r\nContent-Length: ", body.size(),
                    "\r\n");
  }
  return absl::StrCat(head, "\r\n", body);
}

std::string RequestSequence(const std::vector<std::string>& requests) {
  std::string out;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i + 1 < requests.size()) out += Uint16(static_cast<uint16_t>(requests[i].size()));
    out += requests[i];
  }
  return out;
}

void RestSeeds(const std::string& dir) {
  const std::string spec =
      R"({"name": "seed", "model": {"nLayer": 4, "nHead": 2, "dModel": 64},)"
      R"( "training": {"seqLen": 32, "batchSize": 8, "microBatches": 4, "steps": 20},)"
      R"( "parallelism": {"stages": 2}})";
  const std::string submit = HttpRequestBytes("POST", "/v1/jobs", spec, true);
  WriteSeed(dir, "submit_then_reads",
            RequestSequence({submit,
                             HttpRequestBytes("GET", "/v1/jobs/job-1?view=JOB_VIEW_FULL", "", true),
                             HttpRequestBytes("GET", "/v1/jobs?pageSize=1", "", true),
                             HttpRequestBytes("POST", "/v1/jobs/job-1:cancel", "", true)}));
  WriteSeed(
      dir, "plan_and_timelines",
      RequestSequence({submit, HttpRequestBytes("GET", "/v1/jobs/job-1/plan", "", true),
                       HttpRequestBytes("GET", "/v1/jobs/job-1/timeline.svg", "", true),
                       HttpRequestBytes("GET", "/v1/jobs/job-1/measured-timeline.svg", "", true)}));
  WriteSeed(dir, "workers_metrics_and_no_token",
            RequestSequence({HttpRequestBytes("GET", "/v1/workers?pageSize=2", "", true),
                             HttpRequestBytes("POST", "/v1/workers/w-1:drain", "", true),
                             HttpRequestBytes("GET", "/metrics", "", false),
                             HttpRequestBytes("POST", "/v1/jobs", spec, false)}));
  WriteSeed(
      dir, "refused_bodies",
      RequestSequence({HttpRequestBytes("POST", "/v1/jobs", R"({"model": {"nLayer": "x"}})", true),
                       "POST /v1/jobs HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n",
                       "POST /v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999\r\n\r\n",
                       "GET /v1/jobs/%6aob-1 HTTP/1.1\r\nHost: t\r\nRange: bytes=0-1,2-3\r\n"
                       "Expect: 100-continue\r\n\r\n"}));
  // Paths under the fuzzer's --data-root and --output-dir: a job naming
  // one of each kind, accepted (it would read corpus.txt and write its
  // weights and checkpoints there), then a data path and a weights path
  // outside the roots, refused, and an init.from of a checkpoint that
  // does not exist, refused.
  const auto spec_with = [](const std::string& path_fields) {
    return absl::StrCat(R"({"model": {"nLayer": 4, "nHead": 2, "dModel": 64},)"
                        R"( "training": {"seqLen": 32, "batchSize": 8, "microBatches": 4,)"
                        R"( "steps": 20}, "parallelism": {"stages": 2}, )",
                        path_fields, "}");
  };
  WriteSeed(
      dir, "confined_paths",
      RequestSequence(
          {HttpRequestBytes("POST", "/v1/jobs",
                            spec_with(R"("data": {"path": "corpus.txt"},)"
                                      R"( "output": {"weightsPath": "runs/w.safetensors"},)"
                                      R"( "checkpoint": {"intervalSteps": 5, "dir": "runs/ck"})"),
                            true),
           HttpRequestBytes("POST", "/v1/jobs", spec_with(R"("data": {"path": "/etc/passwd"})"),
                            true),
           HttpRequestBytes("POST", "/v1/jobs",
                            spec_with(R"("output": {"weightsPath": "../w.safetensors"})"), true),
           HttpRequestBytes("POST", "/v1/jobs",
                            spec_with(R"("init": {"from": "runs/ck/step-00000005"})"), true)}));
  // Lines near httplib's 8 KiB limits, without and with the token: it
  // also raises libFuzzer's default input size limit to this seed's, so
  // that long requests are explored.
  const std::string long_id(8100, 'a');
  std::string escaped_id;
  for (int i = 0; i < 2700; ++i) escaped_id += "%61";
  std::string ranges = "bytes=0-0";
  for (int i = 0; i < 2000; ++i) ranges += ",0-0";
  WriteSeed(
      dir, "long_lines",
      RequestSequence({HttpRequestBytes("GET", "/v1/jobs/" + long_id, "", false),
                       HttpRequestBytes("GET", "/v1/jobs/" + long_id, "", true),
                       HttpRequestBytes("POST", "/v1/jobs/" + escaped_id + ":cancel", "", true),
                       "GET /v1/workers HTTP/1.1\r\nHost: t\r\nRange: " + ranges + "\r\n\r\n"}));
}

// --- worker registry operations (worker_registry_fuzzer.cc: an operation
// byte, then what it needs)

std::string RegisterOp(const std::string& address, bool with_token) {
  v1::RegisterWorkerRequest request;
  request.set_data_address(address);
  request.set_node_name("node-a");
  request.mutable_device()->set_cpu_model("AMD EPYC");
  request.mutable_device()->set_cpu_cores(2);
  const std::string bytes = request.SerializeAsString();
  return std::string(1, static_cast<char>(with_token ? 8 : 0)) +
         Uint16(static_cast<uint16_t>(bytes.size())) + bytes;
}

std::string HeartbeatOp(const std::string& id, int64_t incarnation) {
  v1::HeartbeatRequest request;
  request.set_worker_id(id);
  request.set_incarnation(incarnation);
  request.set_current_instruction("FORWARD unit 1 micro-batch 0");
  const std::string bytes = request.SerializeAsString();
  return std::string(1, 1) + Uint16(static_cast<uint16_t>(bytes.size())) + bytes;
}

std::string Op(int op, std::initializer_list<int> bytes) {
  std::string out(1, static_cast<char>(op));
  for (int b : bytes) out.push_back(static_cast<char>(b));
  return out;
}

void WorkerRegistrySeeds(const std::string& dir) {
  // Two workers join, one heartbeats, both are assigned, one re-registers
  // (a new incarnation), leases run out, one deregisters.
  WriteSeed(dir, "join_assign_reregister_expire",
            RegisterOp("10.0.0.1:9001", true) + RegisterOp("10.0.0.2:9001", true) +
                HeartbeatOp("w-1", 1) + Op(4, {1, 2}) + RegisterOp("10.0.0.1:9001", true) +
                Op(3, {30}) + Op(12, {}) + Op(2, {2, 1}) + Op(7, {1}));
  // A registration without the token, a malformed heartbeat, a lost worker
  // and a forged session token.
  WriteSeed(dir, "refused_and_lost",
            RegisterOp("10.0.0.3:9001", false) + RegisterOp("10.0.0.3:9001", true) +
                HeartbeatOp("", 0) + HeartbeatOp("w-1", 7) + Op(5, {1, 1}) + Op(6, {}) +
                Uint16(15) + "v1.w-1.1.forged");
  // More addresses than the registry holds: eviction of the departed.
  std::string many;
  for (int i = 0; i < 9; ++i) {
    many += RegisterOp(absl::StrCat("10.0.1.", i, ":9001"), true);
    if (i % 3 == 2) many += Op(2, {i, 1});
  }
  WriteSeed(dir, "more_workers_than_room", many);
}

// --- job manager operations (job_manager_fuzzer.cc: an operation byte,
// then what it needs; bit 3 addresses a request from the job's worker,
// bit 4 picks the second one)

std::string ProgressOp(int worker, const v1::ReportProgressRequest& request) {
  const std::string bytes = request.SerializeAsString();
  return std::string(1, static_cast<char>(8 | (worker << 4))) +
         Uint16(static_cast<uint16_t>(bytes.size())) + bytes;
}

std::string ProgressOp(int worker, int64_t iteration, bool last_stage) {
  v1::ReportProgressRequest request;
  request.set_iteration(iteration);
  if (last_stage) {
    request.add_micro_batch_losses(5.5f);
    request.add_micro_batch_losses(5.25f);
  }
  request.set_busy_seconds(0.01);
  request.set_idle_seconds(0.002);
  return ProgressOp(worker, request);
}

// Both stages of SmallJobSpec's 3 steps report ready and iterations 0 and 1.
std::string ReadyAndTwoSteps() {
  v1::ReportProgressRequest ready;
  ready.set_ready(true);
  std::string run = ProgressOp(0, ready) + ProgressOp(1, ready);
  for (int64_t it = 0; it < 2; ++it) run += ProgressOp(0, it, false) + ProgressOp(1, it, true);
  return run;
}

// Both stages' last iteration (2), reported finished: an iteration is
// counted once, so a separate report of it said "finished" to no effect.
std::string LastStepFinished() {
  std::string run;
  for (int worker : {0, 1}) {
    v1::ReportProgressRequest finished;
    finished.set_iteration(2);
    finished.set_finished(true);
    finished.set_weights_digest(std::string(64, 'd'));  // a SHA-256 in hex, as checked
    if (worker == 1) {                                  // the loss stage
      finished.add_micro_batch_losses(5.5f);
      finished.add_micro_batch_losses(5.25f);
    }
    run += ProgressOp(worker, finished);
  }
  return run;
}

void JobManagerSeeds(const std::string& dir) {
  std::string run = ReadyAndTwoSteps();
  v1::WeightsChunk chunk;
  chunk.set_tensor_name("wte.weight");
  chunk.add_shape(256);
  chunk.add_shape(16);
  for (int i = 0; i < 16; ++i) chunk.add_values(0.01f * i);
  const std::string chunk_bytes = chunk.SerializeAsString();
  run += std::string(1, 9) + Uint16(static_cast<uint16_t>(chunk_bytes.size())) + chunk_bytes;
  run += std::string(1, 10) + std::string(1, 26);  // both workers finish their weights
  run += LastStepFinished();                       // FAILED: the upload is incomplete
  WriteSeed(dir, "ready_steps_finish_weights", run);

  // The whole model uploaded (every tensor from both workers: the owner's
  // chunk is taken, the other's refused), both finish, and the job
  // SUCCEEDS: its weights file committed into the output directory, the
  // path the fuzzer's end check covers. The model is SmallJobSpec's
  // (coordinator/jobs/small_spec_testing.h), about 30 KB of values, so
  // scripts/fuzz.sh lets this target's inputs grow past libFuzzer's default.
  const GptConfig small{/*vocab_size=*/256, /*max_seq_len=*/8, /*n_layer=*/1, /*n_head=*/2,
                        /*d_model=*/16};
  std::string whole = ReadyAndTwoSteps();
  std::set<std::string> uploaded;
  for (int u = 0; u < NumUnits(small); ++u) {
    for (const ParameterShape& p : UnitParameterShapes(small, u)) {
      if (!uploaded.insert(p.name).second) continue;  // the tied wte, once
      v1::WeightsChunk tensor;
      tensor.set_tensor_name(p.name);
      int64_t n = 1;
      for (int64_t d : p.shape) {
        tensor.add_shape(d);
        n *= d;
      }
      for (int64_t i = 0; i < n; ++i) tensor.add_values(0.001f * static_cast<float>(i % 100));
      const std::string bytes = tensor.SerializeAsString();
      PT_CHECK(bytes.size() <= 0xffff) << p.name << " too large for a seed";
      for (const char op : {9, 25}) {  // from worker 0, then worker 1
        whole += std::string(1, op) + Uint16(static_cast<uint16_t>(bytes.size())) + bytes;
      }
    }
  }
  whole += std::string(1, 10) + std::string(1, 26);
  whole += LastStepFinished();
  WriteSeed(dir, "whole_model_succeeds", whole);

  v1::ReportProgressRequest ready;
  ready.set_ready(true);
  v1::ReportProgressRequest failed;
  failed.set_iteration(1);
  failed.set_error("worker w-2: CUDA error");
  failed.set_peer_failure(true);
  WriteSeed(dir, "lost_drained_failed_cancelled",
            ProgressOp(0, ready) + std::string(1, 11) + std::string(1, 12) + std::string(1, 7) +
                std::string(1, 60) + ProgressOp(1, failed) + std::string(1, 13) +
                std::string(1, 14) + ProgressOp(0, 1, false));
}

// --- unit checkpoints (unit_checkpoint_fuzzer.cc: a mode byte, bits 0-1
// the unit, bit 2 with moments, bit 4 a manifest; then the file). The
// identity, step and directory names are the fuzzer's.

void UnitCheckpointSeeds(const std::string& dir) {
  const CheckpointIdentity identity{"fuzz-job", GptConfig{16, 8, 1, 2, 8}, 7};
  constexpr int64_t kStep = 3;
  // Every unit with its moments; the attention unit also with two
  // replicas' error feedback and PowerSGD warm starts (whole and per
  // rank), the MLP unit with a pipeline link's warm start and the
  // partition counts its stage measured.
  std::vector<UnitState> units;
  for (int u = 0; u < NumUnits(identity.model); ++u) {
    UnitState state;
    state.unit = u;
    for (const ParameterShape& p : UnitParameterShapes(identity.model, u)) {
      const Shape shape(p.shape.begin(), p.shape.end());
      state.values.push_back({p.name, Ramp(shape)});
      state.m.push_back({p.name, Tensor::Filled(shape, 0.01f)});
      state.v.push_back({p.name, Tensor::Filled(shape, 0.001f)});
    }
    units.push_back(std::move(state));
  }
  UnitState& attn = units[1];
  attn.feedback.resize(2);
  for (auto& replica : attn.feedback) {
    replica.push_back({attn.values[2].name, Ramp(attn.values[2].tensor.shape())});  // c_attn.weight
  }
  attn.warm_q.push_back({attn.values[2].name, Ramp({24, 2})});          // [cols, rank]
  attn.warm_q_ranks.push_back({attn.values[4].name, Ramp({2, 8, 2})});  // c_proj.weight
  units[2].link_warm_q.push_back(
      LinkWarmStart{0, 1, v1::TENSOR_KIND_ACTIVATION_GRAD, 2, Ramp({8, 2})});
  // The MLP unit is also a stage's first backward unit that measured its
  // AccTFM partition counts (units 1-3 forward, 2-4 backward, T 2, 4 samples).
  units[2].tuned_partitions = TunedPartitions{2, 4, 1, 3, 2, 4, {1, 2, 4, 1}, {1, 1, 2, 1}};
  // A checkpoint before the first optimizer step: weights only.
  UnitState fresh = units[0];
  fresh.m.clear();
  fresh.v.clear();

  const std::string scratch = ".tmp-checkpoint";
  auto write = [&](const StageSnapshot& snapshot) {
    absl::StatusOr<std::vector<v1::UnitFile>> files =
        WriteStageCheckpoint(dir, scratch, snapshot, identity);
    PT_CHECK(files.ok()) << files.status();
    std::vector<std::string> bytes;
    const std::string step_dir = absl::StrCat(dir, "/", scratch, "/", StepDirName(kStep));
    for (const v1::UnitFile& f : *files) {
      const std::string path = absl::StrCat(step_dir, "/", f.file());
      bytes.push_back(ReadBytes(path));
      std::remove(path.c_str());
    }
    std::remove(step_dir.c_str());
    std::remove(absl::StrCat(dir, "/", scratch).c_str());
    return std::make_pair(*files, bytes);
  };
  const auto [files, bytes] = write(StageSnapshot{kStep, kStep, units});
  for (size_t u = 0; u < bytes.size(); ++u) {
    WriteSeed(dir, absl::StrCat("unit", u, "_moments"),
              std::string(1, static_cast<char>(u | 4)) + bytes[u]);
  }
  WriteSeed(dir, "unit1_weights_only", std::string(1, 1) + bytes[1]);
  const auto fresh_files = write(StageSnapshot{kStep, 0, {fresh}});
  WriteSeed(dir, "unit0_before_first_step", std::string(1, 4) + fresh_files.second[0]);

  // manifest.json as coordinator/jobs/checkpoint_catalog.cc writes it (its
  // writer is private to coordinator/jobs), for the files above.
  const GptConfig& m = identity.model;
  std::string entries;
  for (const v1::UnitFile& f : files) {
    absl::StrAppend(&entries, entries.empty() ? "" : ",\n", "  {\"unit\": ", f.unit(),
                    ", \"file\": \"", f.file(), "\", \"bytes\": ", f.bytes(), ", \"sha256\": \"",
                    f.sha256(), "\"}");
  }
  const std::string manifest = absl::StrCat(
      "{\"format\": \"pipetrain-checkpoint-manifest\", \"version\": 1, \"job_id\": \"",
      identity.job_id, "\", \"step\": ", kStep, ", \"seed\": ", identity.seed,
      ",\n \"model\": {\"vocab_size\": ", m.vocab_size, ", \"max_seq_len\": ", m.max_seq_len,
      ", \"n_layer\": ", m.n_layer, ", \"n_head\": ", m.n_head, ", \"d_model\": ", m.d_model,
      "},\n \"units\": [\n", entries, "]}\n");
  WriteSeed(dir, "manifest", std::string(1, 16) + manifest);
}

// --- profile replies (profile_reply_fuzzer.cc: byte 0 bit 0 for the
// tensor-parallel job, then a serialized ModelProfile)

// A worker's real answer (ProfileUnits) to the fuzzer's job's request,
// with its times replaced by fixed ones so that the seed is the same on
// every run; checked as the coordinator checks it.
std::string ProfileReply(bool tensor_parallel) {
  v1::ProfileRequest request;
  request.mutable_model()->set_n_layer(1);
  request.mutable_model()->set_n_head(2);
  request.mutable_model()->set_d_model(16);
  request.mutable_model()->set_vocab_size(256);
  request.mutable_model()->set_max_seq_len(8);
  request.set_seq_len(8);
  request.set_micro_batch_size(4);
  request.set_warmup(1);
  request.set_repetitions(1);
  if (tensor_parallel) {
    request.add_partitions(2);
    request.add_partitions(4);
  }
  absl::StatusOr<v1::ModelProfile> profile = ProfileUnits(request);
  PT_CHECK(profile.ok()) << profile.status();
  profile->set_device_kind("cpu:AMD EPYC");
  profile->set_repetitions(5);
  for (int u = 0; u < profile->units_size(); ++u) {
    v1::UnitProfile* unit = profile->mutable_units(u);
    unit->set_fwd_seconds(1e-4 * (u + 1));
    unit->set_bwd_seconds(2e-4 * (u + 1));
    unit->set_optimizer_seconds(1e-5 * (u + 1));
    for (v1::PartitionTiming& t : *unit->mutable_partitions()) {
      t.set_fwd_seconds(unit->fwd_seconds() / t.count() * 1.2);
      t.set_bwd_seconds(unit->bwd_seconds() / t.count() * 1.2);
    }
  }
  for (int i = 0; i < profile->codecs_size(); ++i) {
    profile->mutable_codecs(i)->set_all_reduce_seconds_per_byte(1e-9 * (i + 1));
  }
  const GptConfig model{256, 8, 1, 2, 16};
  std::vector<std::string> names;
  for (int u = 0; u < NumUnits(model); ++u) names.push_back(UnitName(model, u));
  const ModelProfile sizes = AnalyticProfile(model, 8, 4, 1e9);
  const absl::Status fit = CheckWorkerProfile(*profile, request, names, &sizes);
  PT_CHECK(fit.ok()) << "the profiler's answer is refused: " << fit;
  return profile->SerializeAsString();
}

void ProfileReplySeeds(const std::string& dir) {
  WriteSeed(dir, "two_stages", std::string(1, 0) + ProfileReply(false));
  WriteSeed(dir, "tensor_parallel_partitions", std::string(1, 1) + ProfileReply(true));
  // One the coordinator refuses: the head's weights inflated.
  v1::ModelProfile inflated;
  PT_CHECK(inflated.ParseFromString(ProfileReply(false)));
  v1::UnitProfile* head = inflated.mutable_units(inflated.units_size() - 1);
  head->set_weight_bytes(head->weight_bytes() * 2);
  WriteSeed(dir, "refused_inflated_head", std::string(1, 0) + inflated.SerializeAsString());
}

// --- HTTP requests in pieces (http_pieces_fuzzer.cc: byte 0 the number
// of cuts and the limits, the cuts as uint16, then the bytes)

std::string Pieces(int limits, std::initializer_list<uint16_t> cuts, const std::string& bytes) {
  std::string out(1, static_cast<char>(cuts.size() | limits << 3));
  for (uint16_t c : cuts) out += Uint16(c);
  return out + bytes;
}

void HttpPiecesSeeds(const std::string& dir) {
  const std::string auth = "Authorization: Bearer fuzz-token-pieces\r\n";
  const std::string get =
      "GET /echo/a%20b?x=1&y=%2F HTTP/1.1\r\nHost: coordinator\r\n" + auth + "\r\n";
  // Cut inside the request line, a header and the blank line's CRLF CRLF.
  WriteSeed(dir, "get_in_pieces", Pieces(0, {5, 40, static_cast<uint16_t>(get.size() - 2)}, get));
  const std::string body = R"({"name": "seed"})";
  const std::string post = absl::StrCat(
      "POST /echo/jobs HTTP/1.1\r\nHost: coordinator\r\n", auth,
      "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
  // The head whole, then the body in two, then a second request on the
  // same connection (ignored).
  const uint16_t head = static_cast<uint16_t>(post.size() - body.size());
  WriteSeed(dir, "post_head_then_body",
            Pieces(0, {head, static_cast<uint16_t>(head + 3)},
                   post + "GET / HTTP/1.1\r\nHost: t\r\n\r\n"));
  const std::string expect = absl::StrCat("POST /echo/x HTTP/1.1\r\nHost: t\r\n", auth,
                                          "Expect: 100-continue\r\nContent-Length: 4\r\n\r\nbody");
  WriteSeed(dir, "expect_continue", Pieces(0, {static_cast<uint16_t>(expect.size() - 4)}, expect));
  WriteSeed(dir, "no_token_chunked",
            Pieces(0, {20},
                   "POST /echo/x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: "
                   "chunked\r\n\r\n4\r\nbody\r\n0\r\n\r\n"));
  // The small server: a body over its 64 bytes (413); a head over its 1100 (431).
  WriteSeed(dir, "small_body_over_limit",
            Pieces(1, {30},
                   absl::StrCat("POST /echo/x HTTP/1.1\r\nHost: t\r\n", auth,
                                "Content-Length: 65\r\n\r\n", std::string(65, 'b'))));
  WriteSeed(dir, "small_head_over_limit",
            Pieces(1, {600, 1099},
                   absl::StrCat("GET /echo/x HTTP/1.1\r\nHost: t\r\n", auth,
                                "X-Pad: ", std::string(1100, 'p'), "\r\n\r\n")));
  // The framer alone, tiny limits: line 16, head 64, body 8.
  WriteSeed(
      dir, "tiny_limits",
      Pieces(2, {3, 17, 30}, "POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 8\r\n\r\n12345678"));
  WriteSeed(dir, "tiny_long_line",
            Pieces(2, {10}, "GET /abcdefghijklmnop HTTP/1.1\r\nHost: t\r\n\r\n"));
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  using namespace pipetrain;
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR (fuzz/corpus; its subdirectories exist)\n");
    return 2;
  }
  const std::string root = argv[1];
  SafetensorsSeeds(root + "/safetensors_fuzzer");
  CodecSeeds(root + "/codec_fuzzer");
  CodecSpecSeeds(root + "/codec_spec_fuzzer");
  FrameSeeds(root + "/frame_fuzzer");
  TokenFileSeeds(root + "/token_file_fuzzer");
  PlannerSeeds(root + "/planner_json_fuzzer");
  StepTraceSeeds(root + "/step_trace_fuzzer");
  RestSeeds(root + "/rest_fuzzer");
  WorkerRegistrySeeds(root + "/worker_registry_fuzzer");
  JobManagerSeeds(root + "/job_manager_fuzzer");
  UnitCheckpointSeeds(root + "/unit_checkpoint_fuzzer");
  ProfileReplySeeds(root + "/profile_reply_fuzzer");
  HttpPiecesSeeds(root + "/http_pieces_fuzzer");
  return 0;
}
