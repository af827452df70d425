// The worker-facing half of the coordinator (coordinator/registry/
// worker_registry.h): what RegisterWorker, Heartbeat and DeregisterWorker do
// with a request once it reaches the registry, interleaved with what the
// coordinator does between requests (leases expiring, jobs assigning and
// releasing workers, losses), on a fresh registry of at most kMaxWorkers
// entries per input, on a fake clock.
//
// Input: operations until it ends (at most kMaxOperations), each a byte
// choosing one (its low 3 bits) and what it needs:
//   0 Register: a serialized RegisterWorkerRequest (uint16-length-prefixed);
//     bit 3 of the byte replaces its join_token with the right one, so that
//     inputs reach what comes after the token check; unless bit 4 is set,
//     its build is replaced with the registry's required one likewise
//   1 Heartbeat: a serialized HeartbeatRequest (uint16-length-prefixed)
//   2 Deregister: a worker number and an incarnation (a byte each)
//   3 time passes (a byte, x 100 ms), then CheckLeases
//   4 Assign two workers (a byte each) to a job, or Release it (bit 3)
//   5 MarkLost: a worker number and an incarnation
//   6 AuthenticateSession and IsStaleSession with a token (uint16-length-prefixed)
//   7 NcclUniqueId, then ConsumeNcclUniqueId with what it returned
// Worker numbers n name "w-<n % 10>".
//
// Checks beyond the sanitizers:
//  - a registration without the join token is UNAUTHENTICATED, never
//    admitted;
//  - an admitted worker's session token authenticates as that worker's id
//    and incarnation, and as nothing else once a newer incarnation
//    registered (the old credential is refused);
//  - a worker whose build is not the required one (SameBuild) is never
//    admitted;
//  - the registry never holds more than kMaxWorkers entries.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/build_identity.h"
#include "common/clock.h"
#include "coordinator/registry/worker_registry.h"
#include "fuzz/fuzz_input.h"

namespace {

constexpr int kMaxOperations = 64;
constexpr int kMaxWorkers = 6;
constexpr char kJoinToken[] = "join-fuzz-0c4e";

std::string WorkerName(uint8_t n) { return absl::StrCat("w-", n % 10); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  FakeClock clock;
  WorkerRegistry::Options options;
  options.join_token = kJoinToken;
  options.clock = &clock;
  options.max_workers = kMaxWorkers;
  v1::BuildIdentity required;
  required.set_version("0.1.0");
  required.set_commit("f0220bu11d00");
  options.required_build = required;
  WorkerRegistry registry(options);
  // Every credential handed out, with whom it was for.
  std::map<std::string, WorkerRegistry::SessionIdentity> issued;

  FuzzInput in(data, size);
  for (int op = 0; op < kMaxOperations && !in.empty(); ++op) {
    const uint8_t choice = in.Byte();
    switch (choice & 7) {
      case 0: {
        v1::RegisterWorkerRequest request;
        if (!in.ParseLengthPrefixed(request)) break;
        if (choice & 8) request.set_join_token(kJoinToken);
        if (!(choice & 16)) *request.mutable_build() = required;
        absl::StatusOr<v1::RegisterWorkerResponse> admitted = registry.Register(request);
        if (admitted.ok() && !SameBuild(request.build(), required)) {
          __builtin_trap();  // another build is refused
        }
        if (request.join_token() != kJoinToken &&
            (admitted.ok() || admitted.status().code() != absl::StatusCode::kUnauthenticated)) {
          __builtin_trap();  // the join token is checked first, always
        }
        if (admitted.ok()) {
          issued[admitted->session_token()] = {admitted->worker_id(), admitted->incarnation()};
        }
        break;
      }
      case 1: {
        v1::HeartbeatRequest request;
        if (!in.ParseLengthPrefixed(request)) break;
        (void)registry.Heartbeat(request);
        break;
      }
      case 2: {
        const std::string id = WorkerName(in.Byte());
        (void)registry.Deregister(id, in.Byte());
        break;
      }
      case 3:
        clock.Advance(absl::Milliseconds(100 * int64_t{in.Byte()}));
        (void)registry.CheckLeases();
        break;
      case 4:
        if (choice & 8) {
          registry.Release("job-fuzz");
        } else {
          const std::string first = WorkerName(in.Byte());
          (void)registry.Assign({first, WorkerName(in.Byte())}, "job-fuzz");
        }
        break;
      case 5: {
        const std::string id = WorkerName(in.Byte());
        registry.MarkLost(id, in.Byte(), "lost by the fuzzer");
        break;
      }
      case 6: {
        const std::string_view token = in.LengthPrefixed();
        (void)registry.AuthenticateSession(absl::string_view(token.data(), token.size()));
        // Every refusal asks this too (grpc_service CountRefusal).
        (void)registry.IsStaleSession(absl::string_view(token.data(), token.size()));
        break;
      }
      case 7: {
        const std::string id = WorkerName(in.Byte());
        absl::StatusOr<std::string> nccl = registry.NcclUniqueId(id);
        if (nccl.ok()) (void)registry.ConsumeNcclUniqueId(id, *nccl);
        break;
      }
    }
    if (registry.List().size() > static_cast<size_t>(kMaxWorkers)) __builtin_trap();
  }
  // Each credential names its worker's incarnation; only the newest
  // incarnation's is accepted.
  for (const auto& [token, identity] : issued) {
    absl::StatusOr<WorkerRegistry::SessionIdentity> who = registry.AuthenticateSession(token);
    if (!who.ok()) continue;
    if (who->worker_id != identity.worker_id || who->incarnation != identity.incarnation) {
      __builtin_trap();
    }
    absl::StatusOr<v1::Worker> worker = registry.Get(identity.worker_id);
    if (!worker.ok() || worker->incarnation() != identity.incarnation) __builtin_trap();
  }
  return 0;
}
