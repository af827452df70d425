// The REST API as any client reaches it (coordinator/api/rest_service.h):
// raw HTTP request bytes through the server's framing, httplib's parser,
// the bearer-token check, routing and the handlers, over a real worker
// registry (two READY workers), job manager and metrics on a fake clock,
// without sockets (HttpServer::AnswerRequestBytes). Planning runs on a
// BackgroundQueue emptied after each request, so a job submitted fitting
// two workers is RUNNING for the next one: its plan, timelines, the
// workers' pages and a drain are answered as for a real job. Each input
// starts from a fresh coordinator, so that a crash replays from its input
// alone. The coordinator has an --output-dir and a --data-root, as a
// deployed one does, so that the paths a spec names (spec.data.path,
// spec.output.weights_path, spec.checkpoint.dir, spec.init.from) are
// resolved and confined, not refused for want of a root: both under a
// scratch directory, <scratch>/roots/out (emptied before each input) and
// <scratch>/roots/data (holding corpus.txt, which a seed names). Nothing
// on the REST path writes files today (weights and checkpoints come from
// workers over gRPC): the check below guards that.
//
// Input: up to kMaxRequests requests, each uint16-length-prefixed but the
// last, which is the rest; they run in order against the same coordinator
// (a submit, then reads of what it made). The server's token is kToken.
//
// Checks beyond the sanitizers, for each request:
//  - a complete request is answered with a status line "HTTP/1.1 NNN"
//    (100 <= NNN < 600); one not complete yet gets nothing;
//  - authentication: a 2xx answer to a request that does not carry the
//    token in its head (request line and headers; the body does not count)
//    is the only public route's (/metrics, Prometheus text): no REST
//    method answers a caller without the token;
//  - confinement: <scratch> holds only roots/, roots/ only out/ and
//    data/, and data/ only corpus.txt with its first content: nothing a
//    request names is written one or two levels above the output
//    directory, beside it or into the data root (and no file there is
//    replaced).
#include <sys/stat.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "common/http_server.h"
#include "common/logging.h"
#include "coordinator/api/coordinator_metrics.h"
#include "coordinator/api/rest_service.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/background_queue_testing.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/registry/worker_registry.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/scratch_dir.h"

namespace {

constexpr int kMaxRequests = 4;
constexpr char kToken[] = "fuzz-token-5b1d2a7c9e3f4061";
constexpr char kCorpusName[] = "corpus.txt";
constexpr char kCorpusText[] = "a small corpus for spec.data.path\n";

// Traps unless `dir` holds exactly `names` (in any order).
void ExpectEntries(const std::string& dir, std::vector<std::string> names) {
  std::vector<std::string> found = pipetrain::DirEntries(dir);
  std::sort(found.begin(), found.end());
  std::sort(names.begin(), names.end());
  if (found != names) __builtin_trap();  // something written outside --output-dir
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  static const bool quiet = [] {
    SetMinLogSeverity(LogSeverity::kError);  // a job's every step is logged
    return true;
  }();
  (void)quiet;
  const std::string& scratch = ScratchDir("rest-fuzz");
  const std::string roots = scratch + "/roots";
  const std::string output_dir = roots + "/out", data_root = roots + "/data";
  static const bool made = [&] {
    PT_CHECK(mkdir(roots.c_str(), 0700) == 0 && mkdir(output_dir.c_str(), 0700) == 0 &&
             mkdir(data_root.c_str(), 0700) == 0);
    std::ofstream(data_root + "/" + kCorpusName) << kCorpusText;
    return true;
  }();
  (void)made;
  EmptyDir(output_dir);
  FakeClock clock;
  WorkerRegistry workers{WorkerRegistry::Options{.clock = &clock}};
  for (const char* address : {"10.0.0.1:9001", "10.0.0.2:9001"}) {
    v1::RegisterWorkerRequest request;
    request.set_data_address(address);
    if (!workers.Register(request).ok()) __builtin_trap();
  }
  AssignmentHub hub;
  BackgroundQueue background;  // outlives jobs
  JobManager jobs{&workers, &hub, &clock,
                  JobManagerOptions{.output_dir = output_dir,
                                    .data_roots = {data_root},
                                    .background_runner = background.Runner()}};
  CoordinatorMetrics metrics{&workers, &jobs};
  HttpServer server(HttpServer::Options{.bearer_token = kToken});
  RegisterRestRoutes(server, &workers, &jobs);
  ServePrometheus(server, metrics.registry(), [&metrics] { metrics.Refresh(); });

  FuzzInput in(data, size);
  for (int i = 0; i < kMaxRequests && !in.empty(); ++i) {
    const std::string_view piece = i + 1 < kMaxRequests ? in.LengthPrefixed() : in.Rest();
    const absl::string_view request(piece.data(), piece.size());
    const std::string response = server.AnswerRequestBytes(request);
    background.RunAll();             // a submitted job is planned before the next request
    if (response.empty()) continue;  // not complete: a connection would wait
    const int status = HttpStatusOf(response);
    if (status < 100 || status >= 600) __builtin_trap();
    // The token counts where a header can carry it: in the request's head,
    // not its body (a body holding it authenticates nothing).
    size_t head_end = request.size();
    for (const char* blank : {"\r\n\r\n", "\n\n", "\r\n\n", "\n\r\n"}) {
      head_end = std::min(head_end, request.find(blank));
    }
    const bool has_token = absl::StrContains(request.substr(0, head_end), kToken);
    const absl::string_view head = absl::string_view(response).substr(0, response.find("\r\n\r\n"));
    if (status >= 200 && status < 300 && !has_token &&
        !absl::StrContains(head, "Content-Type: text/plain; version=0.0.4")) {
      __builtin_trap();  // a REST method answered without the token
    }
  }
  ExpectEntries(scratch, {"roots"});
  ExpectEntries(roots, {"out", "data"});
  ExpectEntries(data_root, {kCorpusName});
  std::ifstream corpus(data_root + "/" + kCorpusName);
  const std::string text((std::istreambuf_iterator<char>(corpus)),
                         std::istreambuf_iterator<char>());
  if (text != kCorpusText) __builtin_trap();  // the data root's file was replaced
  return 0;
}
