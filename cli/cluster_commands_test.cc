// The checks `pipetrain up` makes before it starts anything, and what
// `pipetrain submit` says when every attempt failed (against a canned gRPC
// coordinator on loopback).
#include "cli/cluster_commands.h"

#include <arpa/inet.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/exit_codes.h"
#include "common/coordinator_endpoints.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// Finishes at once; deletes itself when gRPC is done with it.
class Answer final : public grpc::ServerGenericBidiReactor {
 public:
  explicit Answer(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

// A coordinator on a loopback port of its own that refuses every call as a
// follower does (UNAVAILABLE naming the leader, kLeaderMetadataKey), but
// the first `unnamed`: UNAVAILABLE naming none, with `message`, as a leader
// whose state store failed mid-commit answers (the call may have taken
// effect). Its first call removes the file `remove_on_first_call` (if
// given) before it is answered.
class Refusing final : public grpc::CallbackGenericService {
 public:
  explicit Refusing(int unnamed, std::string message = "etcd commit timed out",
                    std::string remove_on_first_call = "")
      : unnamed_(unnamed),
        message_(std::move(message)),
        remove_on_first_call_(std::move(remove_on_first_call)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(this);
    server_ = builder.BuildAndStart();
  }
  ~Refusing() { server_->Shutdown(); }
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    const int call = calls_.fetch_add(1);
    if (call == 0 && !remove_on_first_call_.empty()) std::remove(remove_on_first_call_.c_str());
    if (call < unnamed_) {
      return new Answer(grpc::Status(grpc::StatusCode::UNAVAILABLE, message_));
    }
    context->AddTrailingMetadata(kLeaderMetadataKey, "10.0.0.7:7070");
    return new Answer(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   "this coordinator is a follower; the leader is 10.0.0.7:7070"));
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int calls() const { return calls_.load(); }

 private:
  const int unnamed_;
  const std::string message_;
  const std::string remove_on_first_call_;
  int port_ = 0;
  std::atomic<int> calls_{0};
  std::unique_ptr<grpc::Server> server_;
};

// `pipetrain submit` of an empty spec to `coordinator`, with `flags`; its
// exit code, and its stderr in *err. Five attempts, 15 s of backoff between
// them.
int Submit(const std::string& coordinator, std::string* err,
           const std::vector<std::string>& flags = {}) {
  const std::string spec = absl::StrCat(std::getenv("TEST_TMPDIR"), "/job.json");
  std::ofstream(spec, std::ios::trunc) << "{}";
  std::vector<std::string> args = {spec, "--coordinator", coordinator, "--timeout", "10s"};
  args.insert(args.end(), flags.begin(), flags.end());
  testing::internal::CaptureStderr();
  const int code = RunSubmit(args);
  *err = testing::internal::GetCapturedStderr();
  return code;
}

// A follower reads no request: when it refused every attempt, nothing was
// submitted, and submit says so. It said "may or may not have been
// created", as if an answer had been lost.
TEST(RunSubmitTest, EveryAttemptRefusedByAFollower_SaysNothingWasSubmitted) {
  Refusing follower(/*unnamed=*/0);
  std::string err;
  EXPECT_EQ(Submit(follower.address(), &err), ExitCodeFor(absl::StatusCode::kUnavailable));
  EXPECT_EQ(follower.calls(), 5);
  EXPECT_TRUE(absl::StrContains(err,
                                "pipetrain submit: nothing was submitted: every attempt was "
                                "refused by a coordinator that does not lead"))
      << err;
  EXPECT_FALSE(absl::StrContains(err, "may or may not have been created")) << err;
}

// One attempt whose outcome is unknown (UNAVAILABLE naming no leader) is
// enough for the job to exist, whatever the followers said after it.
TEST(RunSubmitTest, OneAttemptOfUnknownOutcome_TheJobMayOrMayNotExist) {
  Refusing coordinator(/*unnamed=*/1);
  std::string err;
  EXPECT_EQ(Submit(coordinator.address(), &err), ExitCodeFor(absl::StatusCode::kUnavailable));
  EXPECT_EQ(coordinator.calls(), 5);
  EXPECT_TRUE(absl::StrContains(err, "pipetrain submit: the job may or may not have been created"))
      << err;
  EXPECT_FALSE(absl::StrContains(err, "nothing was submitted")) << err;
}

// The token is read once: a retry that read --token-file again (gone
// here, as a process substitution <(...) is empty the second time) ended
// the submit with that local error (NOT_FOUND, exit 69) after the first
// attempt's unknown outcome, and did not say that the job may exist.
TEST(RunSubmitTest, TokenFileGoneAfterTheFirstAttempt_TheJobMayOrMayNotExist) {
  const std::string token = absl::StrCat(std::getenv("TEST_TMPDIR"), "/user.token");
  std::ofstream(token, std::ios::trunc) << "u-token\n";
  ASSERT_EQ(chmod(token.c_str(), 0600), 0);  // no warning naming --token-file
  Refusing coordinator(/*unnamed=*/5, "etcd commit timed out", /*remove_on_first_call=*/token);
  std::string err;
  EXPECT_EQ(Submit(coordinator.address(), &err, {"--token-file", token}),
            ExitCodeFor(absl::StatusCode::kUnavailable));
  EXPECT_EQ(coordinator.calls(), 5);
  EXPECT_TRUE(absl::StrContains(err, "pipetrain submit: the job may or may not have been created"))
      << err;
  EXPECT_FALSE(absl::StrContains(err, "--token-file")) << err;
}

// A loopback port bound but not listening: every connection is refused.
// Held until destroyed, so that nothing else takes the port meanwhile.
class RefusedPort {
 public:
  RefusedPort() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof(address);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), size), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size), 0);
    port_ = ntohs(address.sin_port);
  }
  ~RefusedPort() { close(fd_); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  const int fd_;
  int port_ = 0;
};

// No connection was ever made, so no request was sent: nothing was
// submitted, which is certain. It said "may or may not have been created",
// and users went looking for a job that could not exist.
TEST(RunSubmitTest, NoCoordinatorListening_SaysNothingWasSubmitted) {
  RefusedPort refused;
  std::string err;
  EXPECT_EQ(Submit(refused.address(), &err), ExitCodeFor(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(absl::StrContains(err, "attempt 4 of 5")) << err;
  EXPECT_TRUE(absl::StrContains(err,
                                "pipetrain submit: nothing was submitted: no attempt could "
                                "connect to a coordinator; run this command again once one is up"))
      << err;
  EXPECT_FALSE(absl::StrContains(err, "may or may not have been created")) << err;
}

// gRPC's words for a connection never made, but from a coordinator (which
// may quote a client of its own): the call reached it, and may have taken
// effect.
TEST(RunSubmitTest, ConnectFailureWordsFromACoordinator_TheJobMayOrMayNotExist) {
  Refusing coordinator(/*unnamed=*/5,
                       "failed to connect to all addresses; last error: UNAVAILABLE: "
                       "ipv4:10.0.0.9:2379: Connection refused");
  std::string err;
  EXPECT_EQ(Submit(coordinator.address(), &err), ExitCodeFor(absl::StatusCode::kUnavailable));
  EXPECT_EQ(coordinator.calls(), 5);
  EXPECT_TRUE(absl::StrContains(err, "pipetrain submit: the job may or may not have been created"))
      << err;
  EXPECT_FALSE(absl::StrContains(err, "nothing was submitted")) << err;
}

// A coordinator cycling its page tokens (A, B, A, ...) ends the listing
// with INTERNAL instead of reading forever; a list read to its end is OK.
TEST(ReadAllPagesTest, CycleOfTokens_Internal) {
  const std::vector<std::string> cycle = {"A", "B", "A", "B"};
  size_t calls = 0;
  const absl::Status status = ReadAllPages([&](const std::string&) -> absl::StatusOr<std::string> {
    return cycle[std::min(calls++, cycle.size() - 1)];
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_EQ(calls, 3u);
  std::vector<std::string> asked;
  const std::vector<std::string> pages = {"p1", "p2", ""};
  EXPECT_TRUE(ReadAllPages([&](const std::string& token) -> absl::StatusOr<std::string> {
                asked.push_back(token);
                return pages[asked.size() - 1];
              }).ok());
  EXPECT_EQ(asked, (std::vector<std::string>{"", "p1", "p2"}));
}

// `up` in a container (or a systemd scope) of 16 GiB on a 64 GiB host:
// its 4 workers share the limit, less an eighth for the coordinator and
// overhead; each reported all 16 GiB, and 64 GiB were admitted.
TEST(SharedCgroupMemoryLimitTest, ALimitBelowTheHostsRamIsShared) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  EXPECT_EQ(SharedCgroupMemoryLimit(16 * kGiB, 64 * kGiB, 4), std::to_string(14 * kGiB / 4));
  EXPECT_EQ(SharedCgroupMemoryLimit(0, 64 * kGiB, 4), "");          // no limit
  EXPECT_EQ(SharedCgroupMemoryLimit(64 * kGiB, 64 * kGiB, 4), "");  // the host's RAM
  EXPECT_EQ(SharedCgroupMemoryLimit(80 * kGiB, 64 * kGiB, 4), "");
  EXPECT_EQ(SharedCgroupMemoryLimit(16 * kGiB, 0, 1), std::to_string(14 * kGiB));
}

TEST(CheckWorkerDeviceHereTest, CudaWithoutCudaBuild_FailedPreconditionNamingTheFlag) {
  for (const std::string device : {"cuda", "cuda:0", "cuda:3"}) {
    const absl::Status status = CheckWorkerDeviceHere(device, /*built_with_cuda=*/false, 0);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << device;
    EXPECT_EQ(status.message(), "--worker-device " + device +
                                    ": this binary was built without CUDA (rebuild with "
                                    "--config=cuda), or use --worker-device cpu or auto");
  }
}

TEST(CheckWorkerDeviceHereTest, NoGpuVisible_FailedPrecondition) {
  const absl::Status status = CheckWorkerDeviceHere("cuda", true, 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "--worker-device cuda: no CUDA device visible (check nvidia-smi and "
            "CUDA_VISIBLE_DEVICES)");
}

TEST(CheckWorkerDeviceHereTest, IndexBeyondTheVisibleDevices_FailedPreconditionWithTheRange) {
  const absl::Status status = CheckWorkerDeviceHere("cuda:2", true, 2);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "--worker-device cuda:2: only 2 CUDA device(s) visible, cuda:0 to cuda:1");
}

TEST(CheckWorkerDeviceHereTest, VisibleDevice_Ok) {
  EXPECT_TRUE(CheckWorkerDeviceHere("cuda", true, 1).ok());
  EXPECT_TRUE(CheckWorkerDeviceHere("cuda:1", true, 2).ok());
}

// Checked elsewhere: auto, cpu, cuda:each, and (by ValidateDeviceFlags)
// anything malformed.
TEST(CheckWorkerDeviceHereTest, OtherValues_LeftToTheirOwnChecks) {
  for (const std::string device : {"auto", "cpu", "cuda:each", "cuda:-1", "gpu"}) {
    EXPECT_TRUE(CheckWorkerDeviceHere(device, false, 0).ok()) << device;
  }
}

// A gone worker's last instruction is kept by the coordinator; the table
// must not show it as what the worker does now.
TEST(WorkerDoingTest, GoneWorkersShowTheirLastInstructionAsLast) {
  v1::Worker w;
  w.set_current_instruction("forward unit 3");
  w.set_state(v1::WORKER_STATE_ASSIGNED);
  EXPECT_EQ(WorkerDoing(w), "forward unit 3");
  w.set_drained(true);
  EXPECT_EQ(WorkerDoing(w), "drained; forward unit 3");
  w.set_state(v1::WORKER_STATE_LOST);
  EXPECT_EQ(WorkerDoing(w), "lost; last: forward unit 3");
  w.set_state(v1::WORKER_STATE_LEFT);
  EXPECT_EQ(WorkerDoing(w), "left; last: forward unit 3");
  w.clear_current_instruction();
  EXPECT_EQ(WorkerDoing(w), "left");
  w.set_current_instruction("idle");  // it went without a job: nothing was cut short
  EXPECT_EQ(WorkerDoing(w), "left");
}

}  // namespace
}  // namespace pipetrain
