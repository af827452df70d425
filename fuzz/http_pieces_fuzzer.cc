// The HTTP server's framing when a request arrives in pieces, as a
// connection's reads deliver it (common/http_framing.h HttpRequestFramer,
// fed by the gate, common/http_gate.cc HttpGate::Frame: every read appends
// to the buffer and calls Update with all of it). rest_fuzzer sends each
// request whole; here the same bytes are cut at points the input chooses
// and fed to one framer prefix by prefix, and to a fresh framer at each
// prefix (all the bytes arriving in one read), then answered by an
// HttpServer (AnswerRequestBytes, no sockets) whose one route echoes what
// it parsed, so that a different framing shows as a different answer.
//
// Input: byte 0, then k little-endian uint16 cut points, then the bytes a
// client sends (the rest).
//   bits 0-2  k, the number of cuts (0..7); each is taken modulo the
//             length + 1, sorted, and repeats dropped
//   bits 3-4  the limits: 0 and 3 the server's defaults (head 16 KiB,
//             body 1 MiB, request line 1 KiB); 1 a server with a head of
//             1100 bytes and bodies of 64; 2 the framer alone with a head
//             of 64 bytes, bodies of 8 and request lines of 16 (each set
//             keeps the head limit above the request line's, as the
//             server's own do)
// The server's token is kToken (in the seeds); its route is /echo/<x>.
//
// Checks beyond the sanitizers:
//  - the framer fed prefix by prefix answers each prefix as a fresh framer
//    given that prefix at once does (the remembered search positions
//    change nothing), and stays decided once decided;
//  - the decision does not depend on the cuts: the same request length,
//    or a rejection of the same status and code, as the whole input at
//    once gets (the message may differ: a 431 names the head's size only
//    when its end has arrived);
//  - a prefix shorter than the request gets no answer from the server
//    (AnswerRequestBytes returns ""), and the request framed from the
//    pieces gets the same bytes as the whole input gets;
//  - "100 Continue" (TakeContinue) is due at most once, only while the
//    body is still to come.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/http_framing.h"
#include "common/http_server.h"
#include "common/logging.h"
#include "fuzz/fuzz_input.h"

namespace {

using namespace pipetrain;
using Progress = HttpRequestFramer::Progress;

constexpr char kToken[] = "fuzz-token-pieces";

// An HttpServer with `options` whose one route echoes the parsed request.
HttpServer* EchoServer(HttpServer::Options options) {
  options.bearer_token = kToken;
  auto* server = new HttpServer(options);  // lives as long as the process
  auto echo = [](const HttpRequest& r) {
    std::string query;
    for (const auto& [k, v] : r.query)
      absl::StrAppend(&query, absl::CEscape(k), "=", absl::CEscape(v), ";");
    return JsonResponse(
        200, absl::StrCat(r.method, " ", absl::CEscape(r.path), " [",
                          r.path_params.empty() ? "" : absl::CEscape(r.path_params[0]), "] ", query,
                          " body=", absl::CEscape(r.body)));
  };
  server->Get("/echo/([^/]*)", echo);
  server->Post("/echo/([^/]*)", echo);
  return server;
}

struct Config {
  HttpRequestLimits limits;
  HttpServer* server;  // null: the framer alone
};

const Config& ConfigFor(int choice) {
  static const Config kDefault{HttpRequestLimits{}, EchoServer({})};
  static const Config kSmall{{1100, 64, 1024},
                             EchoServer({.max_header_bytes = 1100, .max_body_bytes = 64})};
  static const Config kTiny{{64, 8, 16}, nullptr};
  return choice == 1 ? kSmall : choice == 2 ? kTiny : kDefault;
}

// The framer's decision, comparable between framers.
struct Decision {
  Progress progress;
  size_t request_bytes = 0;  // when kComplete
  HttpRejection rejection;   // when kRejected
};

Decision Decide(HttpRequestFramer& framer, absl::string_view bytes) {
  Decision d{framer.Update(bytes)};
  if (d.progress == Progress::kComplete) d.request_bytes = framer.request_bytes();
  if (d.progress == Progress::kRejected) d.rejection = framer.rejection();
  return d;
}

// Same decision; `exact` compares rejection messages too.
bool Same(const Decision& a, const Decision& b, bool exact) {
  return a.progress == b.progress && a.request_bytes == b.request_bytes &&
         a.rejection.status == b.rejection.status && a.rejection.code == b.rejection.code &&
         (!exact || a.rejection.message == b.rejection.message);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    SetMinLogSeverity(LogSeverity::kError);
    return true;
  }();
  (void)quiet;
  FuzzInput in(data, size);
  const uint8_t choice = in.Byte();
  std::vector<size_t> cuts;
  const int k = choice & 7;
  for (int i = 0; i < k; ++i) cuts.push_back(in.U16());
  const absl::string_view sent = [&] {
    const std::string_view rest = in.Rest();
    return absl::string_view(rest.data(), rest.size());
  }();
  for (size_t& c : cuts) c %= sent.size() + 1;
  cuts.push_back(sent.size());  // the last read ends the input
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  cuts.erase(std::remove(cuts.begin(), cuts.end(), size_t{0}), cuts.end());  // reads are not empty

  const Config& config = ConfigFor((choice >> 3) & 3);
  HttpRequestFramer whole_framer(config.limits);
  const Decision whole = Decide(whole_framer, sent);

  HttpRequestFramer pieces(config.limits);
  Decision decided{Progress::kNeedMore};
  size_t decided_at = 0;  // the prefix length at which `pieces` decided
  int continues = 0;
  for (size_t cut : cuts) {
    const absl::string_view prefix = sent.substr(0, cut);
    const Decision now = Decide(pieces, prefix);
    if (decided.progress != Progress::kNeedMore) {
      if (!Same(now, decided, true)) __builtin_trap();  // changed its mind
      continue;
    }
    HttpRequestFramer fresh(config.limits);
    if (!Same(now, Decide(fresh, prefix), true)) __builtin_trap();  // depends on earlier reads
    if (pieces.TakeContinue()) {
      if (now.progress != Progress::kNeedMore) __builtin_trap();
      ++continues;
    }
    if (config.server != nullptr && now.progress == Progress::kNeedMore &&
        !config.server->AnswerRequestBytes(prefix).empty()) {
      __builtin_trap();  // an incomplete request was answered
    }
    decided = now;
    decided_at = cut;
  }
  if (continues > 1) __builtin_trap();
  if (!Same(decided, whole, false)) __builtin_trap();  // depends on the cuts
  if (decided.progress == Progress::kComplete && decided_at < decided.request_bytes) {
    __builtin_trap();
  }
  if (config.server != nullptr && decided.progress == Progress::kComplete) {
    // What the gate hands a handler, answered; and the whole input's answer.
    const std::string handed =
        config.server->AnswerRequestBytes(sent.substr(0, decided.request_bytes));
    const std::string at_once = config.server->AnswerRequestBytes(sent);
    if (handed.empty() || handed != at_once) __builtin_trap();
  }
  return 0;
}
