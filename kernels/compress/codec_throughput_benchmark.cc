// Single-core encode/decode throughput of every codec (DESIGN.md §6) on a
// Gaussian activation tensor, and what each costs end to end on a link of a
// given speed, so a reader can see where compressing the wire pays.
//
// For each codec spec: one warm-up round trip (checked: payload size equals
// EncodedBytes, decoded shape equals the input's), then encode and decode
// are timed separately. One measurement repeats the call until at least
// --min_seconds have passed and divides by the calls made; the table shows
// the median of --repeats measurements. Everything runs on the calling
// thread. No codec calls OpenBLAS (PowerSGD's products sum in a fixed
// order, kernels/cpu/low_rank.h, so that every host encodes alike), so its
// settings are not shown.
//
// Clock: --clock=cpu (default) times with the thread's CPU time, so that
// other processes on a shared machine that preempt the benchmark do not read
// as codec cost; --clock=wall uses the steady wall clock. Either way the
// cpu% column shows thread CPU time / wall time (the lowest measurement of
// the row): near 100 the two clocks agree; well below, the machine was busy
// and even CPU-time figures may read somewhat low (shared caches).
//
// Link model (serial, no overlap of codec and transfer):
//   raw_ms   = raw bytes / link
//   codec_ms = encode + wire bytes / link + decode
// Compression pays when codec_ms < raw_ms, i.e. when the link is slower than
// breakeven = (raw - wire) / (encode + decode) bytes per second.
// GB/s means 1e9 bytes/s, the unit data_plane_benchmark reports; encode and
// decode GB/s count the raw fp32 bytes.
//
//   bazel run -c opt //kernels/compress:codec_throughput_benchmark --
//       [--shape 8,256,768] [--link_gbps 0.63] [--min_seconds 0.5] [--repeats 5]
//       [--clock cpu|wall] [--seed 20240601]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/flag_set.h"
#include "common/malloc_tuning.h"
#include "common/philox.h"
#include "common/tensor.h"
#include "kernels/compress/codec.h"
#include "kernels/compress/codec_spec.h"

namespace pipetrain {
namespace {

// Loopback gRPC payload throughput of pipetrain's data plane (GB/s): the
// median of data_plane_benchmark's pipetrain_GBps at 4 and 16 MiB tensors
// (brackets of the default 6 MiB), three runs on the shared 2-core
// development VM (AMD EPYC); single runs ranged 0.49-0.83. Pass --link_gbps
// for any other link.
constexpr double kDefaultLinkGbps = 0.63;

const char* const kSpecs[] = {
    "fp16",
    "bf16",
    "linear:bits=4",
    "linear:bits=8",
    "piecewise:bits=3",
    "piecewise:bits=4",
    "token_topk:keep=0.5",
    "token_topk:keep=0.5+piecewise:bits=3",
    "elem_topk:keep=0.1",
    "powersgd:rank=4",
};

struct Options {
  Shape shape;
  double link_gbps = kDefaultLinkGbps;
  double min_seconds = 0.5;
  bool cpu_clock = true;  // --clock=cpu; false: wall
  int repeats = 5;
  uint64_t seed = 20240601;
};

// Accepts "8,256,768", "8x256x768" or "[8, 256, 768]"; every dim >= 1.
absl::StatusOr<Shape> ParseShape(const std::string& text) {
  Shape shape;
  for (absl::string_view part : absl::StrSplit(text, absl::ByAnyChar(",x[] "), absl::SkipEmpty())) {
    int64_t dim = 0;
    if (!absl::SimpleAtoi(part, &dim) || dim < 1) {
      return absl::InvalidArgumentError("--shape \"" + text + "\": dimension \"" +
                                        std::string(part) + "\" is not an integer >= 1");
    }
    shape.push_back(dim);
  }
  if (shape.empty() || shape.size() > 8) {
    return absl::InvalidArgumentError("--shape \"" + text + "\": needs 1 to 8 dimensions");
  }
  return shape;
}

// --- Machine facts ---

std::string CpuInfoField(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return line.substr(std::min(colon + 2, line.size()));
  }
  return "unknown";
}

bool CpuInfoHasFlag(const std::string& flag) {
  const std::string flags = " " + CpuInfoField("flags") + " ";
  return flags.find(" " + flag + " ") != std::string::npos;
}

void PrintMachine(const Options& options) {
  std::printf("# codec throughput, one thread; CPU: %s; %u logical CPUs, %s cores per socket\n",
              CpuInfoField("model name").c_str(), std::thread::hardware_concurrency(),
              CpuInfoField("cpu cores").c_str());
  std::printf("# avx512f in /proc/cpuinfo: %s\n", CpuInfoHasFlag("avx512f") ? "yes" : "no");
  // -c opt defines NDEBUG and optimises; --config=asan optimises (-O1) but
  // keeps asserts and instruments every access.
#if defined(__OPTIMIZE__) && defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
  const char* optimised = "yes";
#else
  const char* optimised = "NO (timings meaningless; build with -c opt, no sanitizers)";
#endif
  std::string load = "unknown";
  std::getline(std::ifstream("/proc/loadavg"), load);
  std::printf("# optimised build: %s; /proc/loadavg at start: %s\n", optimised, load.c_str());
  std::printf("# tensor %s fp32 N(0,1) (Philox seed %llu); median of %d runs of >= %.2f s each\n",
              ShapeToString(options.shape).c_str(),
              static_cast<unsigned long long>(options.seed), options.repeats,
              options.min_seconds);
  std::printf("# clock: %s\n", options.cpu_clock ? "thread CPU time (--clock=cpu)"
                                                   : "wall time (--clock=wall)");
  std::printf("# link %.3f GB/s (1e9 B/s); raw_ms = raw/link; codec_ms = enc + wire/link + dec;\n"
              "# breakeven = link speed below which the codec pays (GB/s); cpu%% = thread CPU\n"
              "# time / wall time of the timed loops (the lowest of a row; < 95: the\n"
              "# machine was busy and the figures are less reliable)\n",
              options.link_gbps);
}

// --- Timing ---

using Clock = std::chrono::steady_clock;

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Timing {
  double seconds_per_call = -1;  // on the chosen clock; -1 if a call failed
  double cpu_fraction = 1;       // thread CPU time / wall time
};

// Repeats `op` until `min_seconds` have passed on the chosen clock.
Timing TimeCalls(const std::function<bool()>& op, double min_seconds, bool cpu_clock) {
  Timing t;
  int64_t calls = 0;
  const auto wall_start = Clock::now();
  const double cpu_start = ThreadCpuSeconds();
  double wall = 0, cpu = 0;
  do {
    if (!op()) return t;
    ++calls;
    wall = std::chrono::duration<double>(Clock::now() - wall_start).count();
    cpu = ThreadCpuSeconds() - cpu_start;
  } while ((cpu_clock ? cpu : wall) < min_seconds);
  t.seconds_per_call = (cpu_clock ? cpu : wall) / static_cast<double>(calls);
  t.cpu_fraction = wall > 0 ? cpu / wall : 1;
  return t;
}

// The median seconds per call of `repeats` measurements; the lowest CPU
// fraction among them.
Timing MedianTiming(const std::function<bool()>& op, const Options& options) {
  std::vector<double> runs;
  Timing result;
  for (int i = 0; i < options.repeats; ++i) {
    const Timing t = TimeCalls(op, options.min_seconds, options.cpu_clock);
    if (t.seconds_per_call < 0) return t;
    runs.push_back(t.seconds_per_call);
    result.cpu_fraction = std::min(result.cpu_fraction, t.cpu_fraction);
  }
  std::sort(runs.begin(), runs.end());
  result.seconds_per_call = runs[runs.size() / 2];
  return result;
}

// --- One codec ---

struct Row {
  std::string spec;
  int64_t raw_bytes = 0;
  int64_t wire_bytes = 0;
  double encode_s = -1;
  double decode_s = -1;
  double cpu_fraction = 1;
  double rel_rmse = 0;  // ||decode(encode(x)) - x|| / ||x||
  std::string error;    // empty when the round trip checked out
};

double RelativeRmse(const Tensor& x, const Tensor& y) {
  double err = 0, norm = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double d = double{y[i]} - double{x[i]};
    err += d * d;
    norm += double{x[i]} * double{x[i]};
  }
  return norm > 0 ? std::sqrt(err / norm) : 0;
}

// The warm-up round trip: fills row->wire_bytes, row->rel_rmse and `payload`.
// Returns what went wrong, or "" when the round trip checks out.
std::string CheckRoundTrip(const Codec& codec, const Tensor& x, CodecState* state, Row* row,
                           std::string* payload) {
  auto encoded = codec.Encode(x, state);
  if (!encoded.ok()) return "encode: " + encoded.status().ToString();
  *payload = *std::move(encoded);
  row->wire_bytes = static_cast<int64_t>(payload->size());
  const int64_t expected = codec.EncodedBytes(x.shape());
  if (row->wire_bytes != expected) {
    return "payload size " + std::to_string(row->wire_bytes) + " != EncodedBytes " +
           std::to_string(expected);
  }
  auto decoded = codec.Decode(*payload);
  if (!decoded.ok()) return "decode: " + decoded.status().ToString();
  if (decoded->shape() != x.shape()) return "decoded shape " + ShapeToString(decoded->shape());
  row->rel_rmse = RelativeRmse(x, *decoded);
  return "";
}

Row MeasureCodec(const std::string& spec, const Tensor& x, const Options& options) {
  Row row;
  row.spec = spec;
  row.raw_bytes = x.size_bytes();
  auto codec = MakeCodec(spec);
  if (!codec.ok()) {
    row.error = codec.status().ToString();
    return row;
  }
  // One link's state, as a sender keeps it (PowerSGD warm-starts from it).
  CodecState state;
  std::string payload;
  row.error = CheckRoundTrip(**codec, x, &state, &row, &payload);
  if (!row.error.empty()) return row;
  const Codec& c = **codec;
  const Timing encode = MedianTiming([&] { return c.Encode(x, &state).ok(); }, options);
  const Timing decode = MedianTiming([&] { return c.Decode(payload).ok(); }, options);
  row.encode_s = encode.seconds_per_call;
  row.decode_s = decode.seconds_per_call;
  row.cpu_fraction = std::min(encode.cpu_fraction, decode.cpu_fraction);
  if (row.encode_s < 0 || row.decode_s < 0) row.error = "a timed call failed";
  return row;
}

// --- Table ---

void PrintHeader() {
  std::printf("%-38s %8s %8s %7s %9s %9s %8s %8s %8s %8s %7s %10s %9s %5s %6s\n", "codec",
              "raw_MiB", "wire_MiB", "ratio", "enc_GBps", "dec_GBps", "enc_ms", "dec_ms",
              "raw_ms", "codec_ms", "speedup", "breakeven", "rel_rmse", "cpu%", "check");
}

void PrintRow(const Row& r, double link_gbps) {
  constexpr double kMiB = 1024.0 * 1024.0;
  if (!r.error.empty()) {
    std::printf("%-38s %8.2f  FAILED: %s\n", r.spec.c_str(), r.raw_bytes / kMiB, r.error.c_str());
    return;
  }
  const double raw = static_cast<double>(r.raw_bytes), wire = static_cast<double>(r.wire_bytes);
  const double link = link_gbps * 1e9;
  const double raw_s = raw / link, codec_s = r.encode_s + wire / link + r.decode_s;
  const double breakeven = wire < raw ? (raw - wire) / (r.encode_s + r.decode_s) / 1e9 : 0;
  std::printf("%-38s %8.2f %8.3f %7.2f %9.3f %9.3f %8.2f %8.2f %8.2f %8.2f %7.2f %10.3f %9.2e %5.0f %6s\n",
              r.spec.c_str(), raw / kMiB, wire / kMiB, raw / wire, raw / r.encode_s / 1e9,
              raw / r.decode_s / 1e9, r.encode_s * 1e3, r.decode_s * 1e3, raw_s * 1e3,
              codec_s * 1e3, raw_s / codec_s, breakeven, r.rel_rmse, 100 * r.cpu_fraction, "OK");
}

absl::StatusOr<Options> ParseOptions(const std::vector<std::string>& args) {
  Options options;
  std::string shape_text = "8,256,768";
  int64_t seed = static_cast<int64_t>(options.seed);
  std::string clock = "cpu";
  FlagSet flags(
      "usage: codec_throughput_benchmark [--shape 8,256,768] [--link_gbps G] "
      "[--min_seconds 0.5] [--repeats 5] [--clock cpu|wall] [--seed N]");
  flags.String("shape", &shape_text, "activation shape, e.g. 8,256,768 (rank >= 2 for token_topk)");
  flags.Double("link_gbps", &options.link_gbps, "link payload speed in GB/s (1e9 B/s)");
  flags.Double("min_seconds", &options.min_seconds, "minimum duration of one measurement");
  flags.Int("repeats", &options.repeats, "measurements per codec and direction (median shown)");
  flags.Int64("seed", &seed, "Philox seed of the Gaussian tensor");
  flags.String("clock", &clock, "cpu: thread CPU time (robust to other load); wall: wall time");
  absl::Status status = flags.Parse(args);
  if (status.ok() && options.link_gbps <= 0) {
    status = absl::InvalidArgumentError("--link_gbps must be > 0");
  } else if (status.ok() && (options.min_seconds < 0 || options.repeats < 1)) {
    status = absl::InvalidArgumentError("--min_seconds must be >= 0 and --repeats >= 1");
  } else if (status.ok() && clock != "cpu" && clock != "wall") {
    status = absl::InvalidArgumentError("--clock must be cpu or wall, got \"" + clock + "\"");
  }
  if (!status.ok() || flags.help_requested()) {
    return absl::InvalidArgumentError((status.ok() ? "" : status.ToString() + "\n") +
                                      flags.Usage());
  }
  options.seed = static_cast<uint64_t>(seed);
  options.cpu_clock = clock == "cpu";
  auto shape = ParseShape(shape_text);
  if (!shape.ok()) return shape.status();
  options.shape = *shape;
  return options;
}

int Run(const std::vector<std::string>& args) {
  auto options = ParseOptions(args);
  if (!options.ok()) {
    std::fprintf(stderr, "%s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  Tensor x = Tensor::Zeros(options->shape);
  FillNormal(options->seed, /*stream=*/0, 0.0f, 1.0f, x.data(), x.numel());
  PrintMachine(*options);
  PrintHeader();
  bool ok = true;
  for (const char* spec : kSpecs) {
    const Row row = MeasureCodec(spec, x, *options);
    ok = ok && row.error.empty();
    PrintRow(row, options->link_gbps);
    std::fflush(stdout);
  }
  std::printf("# %s (check: round trip succeeded, size == EncodedBytes, shape restored)\n",
              ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  pipetrain::TuneMallocForLargeBuffers();  // As pipetrain-worker does: malloc_tuning.h.
  return pipetrain::Run(std::vector<std::string>(argv + 1, argv + argc));
}
