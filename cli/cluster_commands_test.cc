// The checks `pipetrain up` makes before it starts anything, and what
// `pipetrain submit` says when every attempt failed (against a canned gRPC
// coordinator on loopback).
#include "cli/cluster_commands.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
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
// the first `unnamed`: UNAVAILABLE naming none, as a leader whose state
// store failed mid-commit answers (the call may have taken effect).
class Refusing final : public grpc::CallbackGenericService {
 public:
  explicit Refusing(int unnamed) : unnamed_(unnamed) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(this);
    server_ = builder.BuildAndStart();
  }
  ~Refusing() { server_->Shutdown(); }
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    if (calls_.fetch_add(1) < unnamed_) {
      return new Answer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "etcd commit timed out"));
    }
    context->AddTrailingMetadata(kLeaderMetadataKey, "10.0.0.7:7070");
    return new Answer(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   "this coordinator is a follower; the leader is 10.0.0.7:7070"));
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int calls() const { return calls_.load(); }

 private:
  const int unnamed_;
  int port_ = 0;
  std::atomic<int> calls_{0};
  std::unique_ptr<grpc::Server> server_;
};

// `pipetrain submit` of an empty spec to `coordinator`; its exit code, and
// its stderr in *err. Five attempts, 15 s of backoff between them.
int Submit(const std::string& coordinator, std::string* err) {
  const std::string spec = absl::StrCat(std::getenv("TEST_TMPDIR"), "/job.json");
  std::ofstream(spec, std::ios::trunc) << "{}";
  testing::internal::CaptureStderr();
  const int code = RunSubmit({spec, "--coordinator", coordinator, "--timeout", "10s"});
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

// A binary without CUDA refuses cuda and cuda:N up front (the workers
// would refuse them only once started), naming the flag and the remedy.
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
