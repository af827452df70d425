// The security issue's acceptance, end to end on real processes:
//   - specs at and just beyond every documented bound, and an UploadWeights
//     chunk of an absurd shape, leave the coordinator up and answering
//     /healthz (planning runs for the specs that fit, on registered workers);
//   - after kill -9 and a restart of the coordinator, a new job is not
//     harmed by the workers' memory of earlier jobs;
//   - a job needing more workers than exist does not delay a later job that
//     fits, and fails after its queue timeout with a reason;
//   - a stranger's data-plane streams are refused and the job it attacks
//     computes exactly what it computes undisturbed.
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/coordinator_client.h"
#include "cli/local_cluster.h"
#include "common/build_identity.h"
#include "common/grpc_credentials.h"
#include "common/ports_file.h"
#include "gtest/gtest.h"
#include "proto/pipetrain/v1/dataplane.grpc.pb.h"
#include "spec/spec_bounds_testing.h"
#include "tests/cluster_testing.h"
#include "worker/transport/data_plane_auth.h"
#include "worker/transport/frame_codec.h"

namespace pipetrain {
namespace {

constexpr absl::Duration kJobTimeout = absl::Minutes(3);

// GET /healthz on the coordinator, with a 2 s client timeout: true on 200.
bool Healthy(const LocalCluster& cluster) {
  httplib::Client client("127.0.0.1", cluster.http_port());
  client.set_connection_timeout(2);
  client.set_read_timeout(2);
  httplib::Result result = client.Get("/healthz");
  return result && result->status == 200;
}

std::unique_ptr<grpc::ClientContext> Context(const std::string& session = "") {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  AddBearer(*context, session);
  return context;
}

// A small job: 2 stages, 2 layers of width 32, `steps` steps.
v1::JobSpec SmallJob(int steps, int stages = 2) {
  v1::JobSpec spec;
  spec.set_name("small");
  spec.mutable_model()->set_n_layer(2);
  spec.mutable_model()->set_n_head(2);
  spec.mutable_model()->set_d_model(32);
  spec.mutable_training()->set_seq_len(16);
  spec.mutable_training()->set_batch_size(8);
  spec.mutable_training()->set_micro_batches(2);
  spec.mutable_training()->set_steps(steps);
  spec.mutable_training()->set_seed(11);
  spec.mutable_data()->set_synthetic_bytes(50000);
  spec.mutable_parallelism()->set_stages(stages);
  return spec;
}

std::vector<float> Losses(const v1::Job& job) {
  return std::vector<float>(job.progress().loss_history().begin(),
                            job.progress().loss_history().end());
}

// Registers a worker process of our own that computes nothing: enough for
// the coordinator to plan and assign jobs to it.
struct FakeWorker {
  std::string id, session;
};

FakeWorker RegisterFake(v1::CoordinatorService::Stub& raw, int port) {
  v1::RegisterWorkerRequest request;
  request.set_join_token("test-join-token");
  request.set_data_address(absl::StrCat("127.0.0.1:", port));
  request.mutable_device()->set_memory_bytes(int64_t{1} << 30);
  request.mutable_device()->set_memory_limit_bytes(int64_t{256} << 20);
  request.mutable_device()->set_measured_gflops(100);
  *request.mutable_build() = ThisBuild();  // the coordinator's: one build
  v1::RegisterWorkerResponse response;
  const grpc::Status s = raw.RegisterWorker(Context().get(), request, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return {response.worker_id(), response.session_token()};
}

void Beat(v1::CoordinatorService::Stub& raw, const FakeWorker& w) {
  v1::HeartbeatRequest beat;
  beat.set_worker_id(w.id);
  beat.set_incarnation(1);
  v1::HeartbeatResponse response;
  EXPECT_TRUE(raw.Heartbeat(Context(w.session).get(), beat, &response).ok());
}

TEST(HardeningClusterTest, SpecsAtAndBeyondEveryBound_CoordinatorStaysUp) {
  auto cluster = testing::StartTestCluster("bounds", /*workers=*/0);
  ASSERT_NE(cluster, nullptr);
  auto stub = ConnectCoordinator(cluster->grpc_address(), "", cluster->user_token());
  auto raw = v1::CoordinatorService::NewStub(
      grpc::CreateChannel(cluster->grpc_address(), grpc::InsecureChannelCredentials()));
  const FakeWorker w1 = RegisterFake(*raw, 1), w2 = RegisterFake(*raw, 2);
  int planned = 0;
  for (const SpecBound& bound : SpecBounds()) {
    SCOPED_TRACE(bound.field);
    Beat(*raw, w1);
    Beat(*raw, w2);
    v1::SubmitJobRequest at;
    *at.mutable_spec() = bound.At();
    v1::Job job;
    const grpc::Status accepted = stub->SubmitJob(Context().get(), at, &job);
    EXPECT_TRUE(accepted.ok()) << accepted.error_message();
    // Planned at once when two workers suffice (it then RUNs, or FAILs when
    // it does not fit their 256 MiB); cancelled so the next one finds them.
    // A worker may still be held by the previous job's profiling fetch
    // (cancelling does not cut it short): the job is placed once it returns.
    job = testing::AwaitJob(*stub, job.id(), kJobTimeout, [](const v1::Job& j) {
      return j.state() != v1::JOB_STATE_QUEUED || !absl::StrContains(j.reason(), "but held for");
    });
    if (job.state() != v1::JOB_STATE_QUEUED) ++planned;
    v1::CancelJobRequest cancel;
    cancel.set_id(job.id());
    (void)stub->CancelJob(Context().get(), cancel, &job);
    EXPECT_TRUE(Healthy(*cluster));

    v1::SubmitJobRequest beyond;
    *beyond.mutable_spec() = bound.Beyond();
    const grpc::Status refused = stub->SubmitJob(Context().get(), beyond, &job);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(absl::StartsWith(refused.error_message(), bound.beyond_message))
        << refused.error_message();
    EXPECT_TRUE(Healthy(*cluster));
  }
  EXPECT_GE(planned, 10);  // most bounds were planned, not just queued

  v1::SubmitJobRequest huge;
  *huge.mutable_spec() = BoundsBaseSpec();
  huge.mutable_spec()->mutable_model()->set_n_layer(1000000000);
  v1::Job job;
  const grpc::Status refused = stub->SubmitJob(Context().get(), huge, &job);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(), "spec.model.n_layer: 1000000000 exceeds the limit of 256");
  EXPECT_TRUE(Healthy(*cluster));

  // An UploadWeights chunk claiming a [2^20, 2^20] tensor (4 TiB) for a
  // job the worker runs: refused before anything is allocated.
  Beat(*raw, w1);
  Beat(*raw, w2);
  const std::string id = testing::SubmitJob(*stub, SmallJob(5));
  // After profiling (which fails on these fake workers: the analytic
  // profile then plans it).
  const v1::Job placed = testing::AwaitJob(*stub, id, kJobTimeout, [](const v1::Job& j) {
    return j.state() == v1::JOB_STATE_RUNNING || testing::Ended(j);
  });
  ASSERT_EQ(placed.state(), v1::JOB_STATE_RUNNING) << placed.reason();
  auto upload_context = Context(w1.session);
  v1::UploadWeightsResponse upload_response;
  auto writer = raw->UploadWeights(upload_context.get(), &upload_response);
  v1::WeightsChunk chunk;
  chunk.set_worker_id(w1.id);
  chunk.set_job_id(id);
  chunk.set_tensor_name("wte.weight");
  chunk.add_shape(int64_t{1} << 20);
  chunk.add_shape(int64_t{1} << 20);
  chunk.add_values(1.0f);
  writer->Write(chunk);
  writer->WritesDone();
  const grpc::Status upload = writer->Finish();
  EXPECT_EQ(upload.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(upload.error_message(), "the chunk says [1048576, 1048576]"))
      << upload.error_message();
  EXPECT_TRUE(Healthy(*cluster));
  EXPECT_EQ(cluster->coordinator().Wait(absl::ZeroDuration()), std::nullopt);  // still running
}

// The coordinator binary refuses a worker of another build by default:
// another release, or one too old to say (no build). Its own build
// registers and is listed with it.
TEST(HardeningClusterTest, WorkerOfAnotherBuild_RefusedNamingBothBuilds) {
  auto cluster = testing::StartTestCluster("builds", /*workers=*/0);
  ASSERT_NE(cluster, nullptr);
  auto raw = v1::CoordinatorService::NewStub(
      grpc::CreateChannel(cluster->grpc_address(), grpc::InsecureChannelCredentials()));
  v1::BuildIdentity other_release = ThisBuild();
  other_release.set_version("0.0.0-other");
  for (const v1::BuildIdentity& other : {other_release, v1::BuildIdentity()}) {
    v1::RegisterWorkerRequest request;
    request.set_join_token("test-join-token");
    request.set_data_address("127.0.0.1:9");
    *request.mutable_build() = other;
    v1::RegisterWorkerResponse response;
    const grpc::Status refused = raw->RegisterWorker(Context().get(), request, &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_TRUE(
        absl::StrContains(refused.error_message(),
                          absl::StrCat("runs build ", DescribeBuild(other),
                                       ", not the coordinator's ", DescribeBuild(ThisBuild()))))
        << refused.error_message();
  }
  const FakeWorker same = RegisterFake(*raw, 1);
  auto stub = ConnectCoordinator(cluster->grpc_address(), "", cluster->user_token());
  v1::ListWorkersResponse listed;
  const grpc::Status list = stub->ListWorkers(Context().get(), v1::ListWorkersRequest(), &listed);
  ASSERT_TRUE(list.ok()) << list.error_message();
  ASSERT_EQ(listed.workers_size(), 1);
  EXPECT_EQ(listed.workers(0).id(), same.id);
  EXPECT_TRUE(SameBuild(listed.workers(0).build(), ThisBuild()));
  EXPECT_EQ(listed.workers(0).build().commit(), ThisBuild().commit());
  EXPECT_TRUE(Healthy(*cluster));
}

TEST(HardeningClusterTest, CoordinatorKilledAndRestarted_NewJobUnharmed) {
  auto cluster = testing::StartTestCluster("restart", 2);
  ASSERT_NE(cluster, nullptr);
  auto stub = ConnectCoordinator(cluster->grpc_address(), "", cluster->user_token());
  // The reference: the job on a fresh cluster.
  const v1::Job reference =
      testing::AwaitJob(*stub, testing::SubmitJob(*stub, SmallJob(8)), kJobTimeout, testing::Ended);
  ASSERT_EQ(reference.state(), v1::JOB_STATE_SUCCEEDED) << reference.reason();
  // A long job is running (the workers hold its id) when the coordinator dies.
  const std::string running = testing::SubmitJob(*stub, SmallJob(100000));
  const v1::Job before_kill = testing::AwaitJob(*stub, running, kJobTimeout, [](const v1::Job& j) {
    return testing::Ended(j) || j.progress().step() >= 2;
  });
  ASSERT_EQ(before_kill.state(), v1::JOB_STATE_RUNNING) << before_kill.reason();
  ASSERT_GE(before_kill.progress().step(), 2);
  ASSERT_TRUE(cluster->KillAndRestartCoordinator().ok());
  stub = ConnectCoordinator(cluster->grpc_address(), "", cluster->user_token());
  // The workers find out (their credentials died with it) and register again.
  const std::string id = testing::SubmitJob(*stub, SmallJob(8));
  EXPECT_NE(id, reference.id());
  EXPECT_NE(id, running);
  const v1::Job job = testing::AwaitJob(*stub, id, kJobTimeout, testing::Ended);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(Losses(job), Losses(reference));  // bitwise: nothing of the old job leaked in
}

TEST(HardeningClusterTest, JobNeedingMoreWorkers_DoesNotDelayOneThatFits_ThenTimesOut) {
  auto cluster = testing::StartTestCluster("queue", 2);
  ASSERT_NE(cluster, nullptr);
  auto stub = ConnectCoordinator(cluster->grpc_address(), "", cluster->user_token());
  ASSERT_TRUE(testing::AwaitReadyWorkers(*stub, 2));
  v1::JobSpec big = SmallJob(5, /*stages=*/3);
  // Long enough for the small job's profiling on a loaded machine.
  big.mutable_scheduling()->mutable_queue_timeout()->set_seconds(8);
  const std::string big_id = testing::SubmitJob(*stub, big);
  const std::string small_id = testing::SubmitJob(*stub, SmallJob(5));
  // The small job starts (once profiled) while the big one still waits in
  // the queue ahead of it: it is not held behind it.
  const v1::Job small = testing::AwaitJob(*stub, small_id, kJobTimeout, [](const v1::Job& j) {
    return j.state() == v1::JOB_STATE_RUNNING || testing::Ended(j);
  });
  const v1::Job waiting = testing::GetJob(*stub, big_id);
  EXPECT_TRUE(small.state() == v1::JOB_STATE_RUNNING || small.state() == v1::JOB_STATE_SUCCEEDED)
      << v1::JobState_Name(small.state()) << ": " << small.reason();
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_QUEUED) << waiting.reason();
  EXPECT_EQ(testing::AwaitJob(*stub, small_id, kJobTimeout, testing::Ended).state(),
            v1::JOB_STATE_SUCCEEDED);
  const v1::Job failed = testing::AwaitJob(*stub, big_id, kJobTimeout, testing::Ended);
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.reason(),
            "not placed within spec.scheduling.queue_timeout (8s): waiting for 3 READY workers "
            "(2 ready); add workers or ask for fewer stages");
}

TEST(HardeningClusterTest, StrangerOpensDataPlaneStreams_RefusedAndJobUnharmed) {
  auto cluster = testing::StartTestCluster("stranger", 2);
  ASSERT_NE(cluster, nullptr);
  auto stub = ConnectCoordinator(cluster->grpc_address(), "", cluster->user_token());
  // Long enough for the stranger's streams below to land while it runs.
  constexpr int kSteps = 60;
  const v1::Job reference = testing::AwaitJob(*stub, testing::SubmitJob(*stub, SmallJob(kSteps)),
                                              kJobTimeout, testing::Ended);
  ASSERT_EQ(reference.state(), v1::JOB_STATE_SUCCEEDED) << reference.reason();

  const std::string id = testing::SubmitJob(*stub, SmallJob(kSteps));
  // A step done: every worker has taken the job (RUNNING alone says the
  // coordinator sent the assignments, not that they have arrived).
  const v1::Job running = testing::AwaitJob(*stub, id, kJobTimeout, [](const v1::Job& j) {
    return testing::Ended(j) || (j.state() == v1::JOB_STATE_RUNNING && j.progress().step() >= 1);
  });
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.reason();
  // The data plane names a job by id and plan version (DataPlaneJobId).
  const std::string data_job = absl::StrCat(id, "/", running.plan_version());
  int refused = 0;
  for (int worker = 0; worker < 2; ++worker) {
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/stranger";
    absl::StatusOr<int> port =
        ReadPort(absl::StrCat(dir, "/worker-", worker, ".ports"), "data_port");
    ASSERT_TRUE(port.ok()) << port.status();
    auto data = v1::DataPlaneService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", *port), grpc::InsecureChannelCredentials()));
    // What a stranger can know: the job id (ListJobs shows it), the stages,
    // the tensor keys; not a worker's data-plane keys.
    const std::vector<std::string> proofs = {"", "0000",
                                             StreamProof("guess", data_job, 1 - worker)};
    for (const std::string& proof : proofs) {
      auto context = Context();
      context->AddMetadata(kJobMetadataKey, data_job);
      context->AddMetadata(kStageMetadataKey, absl::StrCat(1 - worker));
      if (!proof.empty()) context->AddMetadata(kProofMetadataKey, proof);
      auto stream = data->Stream(context.get());
      for (int it = 0; it < 20; ++it) {
        v1::TensorKey key;
        key.set_kind(worker == 0 ? v1::TENSOR_KIND_ACTIVATION_GRAD : v1::TENSOR_KIND_ACTIVATION);
        key.set_micro_batch(0);
        key.set_unit(3);
        TensorAddress address = MakeAddress(data_job, it, key);
        for (const v1::TensorFrame& frame : EncodeTensorFrames(
                 1 - worker, address, WireTensor::Raw(Tensor::Zeros({8, 16, 32})))) {
          if (!stream->Write(frame)) break;
        }
      }
      stream->WritesDone();
      v1::FrameError error;
      while (stream->Read(&error)) {
      }
      const grpc::Status status = stream->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
      if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) ++refused;
    }
  }
  EXPECT_EQ(refused, 6);
  const v1::Job job = testing::AwaitJob(*stub, id, kJobTimeout, testing::Ended);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(Losses(job), Losses(reference));
}

}  // namespace
}  // namespace pipetrain
