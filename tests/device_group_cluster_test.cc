// Device groups end to end, on the CPU (the CUDA issue, scope 5): a
// coordinator and four worker agents in one process, over gRPC on loopback.
// Each agent's backend is the CPU backend dressed as a GPU of its own
// (index k) that can make "NCCL ids" and join groups by handing out
// channels of one InProcessDeviceHub; NCCL itself needs two GPUs and is not
// exercised here. What is: workers report ids and GPUs at registration, the
// coordinator forms the group and marks device links, hands one worker's id
// to all members and uses it up, the agents join and train through the
// channels bitwise like single-process training, and the worker whose id
// was used reports a fresh one, which the next job's group carries. With
// two replicas, the replica device groups too: their collectives come from
// in-process hubs (InProcessCollectiveHub), one per id.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/coordinator_client.h"
#include "common/annotated_mutex.h"
#include "common/clock.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "coordinator/api/coordinator_metrics.h"
#include "coordinator/api/grpc_service.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/registry/worker_registry.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "tests/cluster_testing.h"
#include "worker/agent/worker_agent.h"
#include "worker/data/corpus.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/forwarding_backend.h"
#include "worker/runtime/in_process_device_channel.h"
#include "worker/runtime/data_parallel_testing.h"
#include "worker/runtime/in_process_device_collective.h"
#include "worker/train/local_trainer.h"
#include "worker/transport/data_plane_server.h"
#include "worker/transport/grpc_transport.h"

namespace pipetrain {
namespace {

constexpr int kWorkers = 4;

// One join of a device group, as a backend saw it.
struct Join {
  DeviceGroupSpec group;
  int stage = 0;
};

// One in-process hub per group id, as NCCL makes a communicator per id.
class Hubs {
 public:
  InProcessDeviceHub* For(const std::string& id) {
    AnnotatedMutexLock lock(&mu_);
    auto& hub = hubs_[id];
    if (hub == nullptr) hub = std::make_unique<InProcessDeviceHub>(kWorkers, absl::Seconds(30));
    return hub.get();
  }
  // Over every group: tensors sent, and sent but never received.
  int64_t sent() const {
    AnnotatedMutexLock lock(&mu_);
    int64_t n = 0;
    for (const auto& [id, hub] : hubs_) n += hub->sent();
    return n;
  }
  int64_t in_flight() const {
    AnnotatedMutexLock lock(&mu_);
    int64_t n = 0;
    for (const auto& [id, hub] : hubs_) n += hub->in_flight();
    return n;
  }
  // The replica groups' collectives: one hub per id too.
  InProcessCollectiveHub* CollectiveFor(const std::string& id, int members) {
    AnnotatedMutexLock lock(&mu_);
    auto& hub = collectives_[id];
    if (hub == nullptr) hub = std::make_unique<InProcessCollectiveHub>(members, absl::Seconds(30));
    return hub.get();
  }
  // Over every replica group: the sums, and the groups.
  int64_t sums() const {
    AnnotatedMutexLock lock(&mu_);
    int64_t n = 0;
    for (const auto& [id, hub] : collectives_) n += hub->sums();
    return n;
  }
  size_t replica_groups() const {
    AnnotatedMutexLock lock(&mu_);
    return collectives_.size();
  }

 private:
  mutable AnnotatedMutex mu_;
  std::map<std::string, std::unique_ptr<InProcessDeviceHub>> hubs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<InProcessCollectiveHub>> collectives_ ABSL_GUARDED_BY(mu_);
};

// The CPU backend posing as GPU `index` that can join device groups.
class FakeGpu : public ForwardingBackend {
 public:
  FakeGpu(int index, Hubs* hubs) : ForwardingBackend(CpuBackend()), index_(index), hubs_(hubs) {}

  DeviceFacts device_facts() const override {
    DeviceFacts facts;
    facts.index = index_;
    return facts;
  }
  absl::StatusOr<std::string> NewDeviceGroupId() override {
    AnnotatedMutexLock lock(&mu_);
    return absl::StrCat("fake-nccl-id-gpu", index_, "-", ++ids_made_);
  }
  absl::StatusOr<std::unique_ptr<DeviceChannel>> JoinDeviceGroup(const DeviceGroupSpec& group,
                                                                 int stage) override {
    absl::StatusOr<int> rank = DeviceGroupRank(group, stage);
    if (!rank.ok()) return rank.status();
    AnnotatedMutexLock lock(&mu_);
    joins_.push_back({group, stage});
    return hubs_->For(group.id)->ChannelFor(stage);
  }

  absl::StatusOr<std::unique_ptr<DeviceCollective>> JoinDeviceCollective(
      const DeviceCollectiveSpec& spec) override {
    RETURN_IF_ERROR(CheckDeviceCollectiveSpec(spec));
    AnnotatedMutexLock lock(&mu_);
    collective_joins_.push_back(spec);
    return hubs_->CollectiveFor(spec.id, spec.members)->CollectiveFor(spec.rank);
  }

  std::vector<Join> joins() const {
    AnnotatedMutexLock lock(&mu_);
    return joins_;
  }
  std::vector<DeviceCollectiveSpec> collective_joins() const {
    AnnotatedMutexLock lock(&mu_);
    return collective_joins_;
  }

 private:
  const int index_;
  Hubs* hubs_;
  mutable AnnotatedMutex mu_;
  int ids_made_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Join> joins_ ABSL_GUARDED_BY(mu_);
  std::vector<DeviceCollectiveSpec> collective_joins_ ABSL_GUARDED_BY(mu_);
};

v1::JobSpec Spec() {
  v1::JobSpec spec;
  spec.set_name("device-groups");
  spec.mutable_model()->set_n_layer(2);
  spec.mutable_model()->set_n_head(2);
  spec.mutable_model()->set_d_model(32);
  auto* t = spec.mutable_training();
  t->set_seq_len(16);
  t->set_batch_size(8);
  t->set_micro_batches(4);
  t->set_steps(6);
  t->set_lr(1e-3f);
  t->set_seed(5);
  spec.mutable_data()->set_synthetic_bytes(100000);
  spec.mutable_parallelism()->set_stages(kWorkers);
  spec.mutable_parallelism()->set_solver("uniform");
  spec.mutable_parallelism()->set_schedule("1f1b");
  return spec;
}

// train-local's losses of `spec`, and its final weights in `weights`
// when given.
std::vector<float> LocalLosses(const v1::JobSpec& spec,
                               std::map<std::string, std::vector<float>>* weights = nullptr) {
  ResolvedJobSpec job = ResolveJobSpec(spec).value();
  const CorpusSpec corpus{"", job.data_format, job.train.model.vocab_size, job.synthetic_bytes,
                          job.train.seed};
  Dataset data =
      Dataset::Create(LoadCorpus(corpus).value(), job.train.seq_len, job.val_fraction).value();
  auto trainer = LocalTrainer::Create(job.train, &data).value();
  std::vector<float> losses;
  for (int i = 0; i < job.train.steps; ++i) losses.push_back(trainer->Step().value().loss);
  if (weights != nullptr) {
    for (Parameter* p : trainer->model().parameters()) (*weights)[p->name] = p->value.ToVector();
  }
  return losses;
}

// A worker as worker/main.cc wires one, in this process.
struct Worker {
  explicit Worker(int index, Hubs* hubs) : gpu(index, hubs) {}
  FakeGpu gpu;
  Mailbox mailbox;
  std::unique_ptr<DataPlaneServer> data_plane;
  std::unique_ptr<WorkerAgent> agent;
};

class DeviceGroupClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
    jobs_.StartSchedulingLoop(absl::Milliseconds(20));
    for (int k = 0; k < kWorkers; ++k) {
      auto w = std::make_unique<Worker>(k, &hubs_);
      auto data_plane = DataPlaneServer::Start("127.0.0.1:0", &w->mailbox);
      ASSERT_TRUE(data_plane.ok()) << data_plane.status();
      w->data_plane = *std::move(data_plane);
      WorkerAgentOptions options;
      options.coordinator_address = address_;
      options.backend = &w->gpu;
      options.recv_timeout = absl::Seconds(30);
      Mailbox* mailbox = &w->mailbox;
      w->agent =
          std::make_unique<WorkerAgent>(options, w->data_plane.get(), mailbox,
                                        [mailbox](int stage, const std::vector<std::string>& peers,
                                                  const JobCredential& credential) {
                                          GrpcTransportOptions transport_options;
                                          transport_options.credential = credential;
                                          return std::unique_ptr<Transport>(new GrpcTransport(
                                              stage, peers, mailbox, std::move(transport_options)));
                                        });
      ASSERT_TRUE(w->agent->Start().ok());
      workers_.push_back(std::move(w));
    }
    stub_ = ConnectCoordinator(address_, "", "");
  }

  void TearDown() override {
    for (auto& w : workers_) w->agent->Stop();
    service_.Shutdown();
    if (server_ != nullptr) server_->Shutdown();  // null: SetUp failed there
    workers_.clear();
  }

  v1::Job RunJob(const v1::JobSpec& spec) {
    const std::string id = testing::SubmitJob(*stub_, spec);
    return testing::AwaitJob(*stub_, id, absl::Minutes(2), testing::Ended);
  }

  // The worker (by agent) whose id is `id` now, per the registry; -1 if none.
  int OwnerOfCurrentId(const std::string& id) {
    for (int k = 0; k < kWorkers; ++k) {
      if (registry_.NcclUniqueId(workers_[k]->agent->worker_id()).value_or("") == id) return k;
    }
    return -1;
  }

  WorkerRegistry registry_{WorkerRegistry::Options{.heartbeat_interval = absl::Milliseconds(50)}};
  AssignmentHub assignments_;
  // Weights files go under the test's temporary directory.
  JobManager jobs_{&registry_, &assignments_, RealClock(),
                   JobManagerOptions{.output_dir = ::testing::TempDir()}};
  CoordinatorMetrics metrics_{&registry_, &jobs_};
  const CallerAuth auth_{"", &registry_};  // users open: the test's own coordinator
  CoordinatorGrpcService service_{&registry_, &jobs_, &assignments_, &metrics_, &auth_};
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  Hubs hubs_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
};

TEST_F(DeviceGroupClusterTest, OneHostFourGpus_TrainsThroughTheGroupBitwise_IdsRenewed) {
  const v1::JobSpec spec = Spec();
  const std::vector<float> local = LocalLosses(spec);
  std::string first_id;
  for (int job = 0; job < 2; ++job) {
    SCOPED_TRACE(absl::StrCat("job ", job));
    const int64_t sent_before = hubs_.sent();
    const v1::Job done = RunJob(spec);
    ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.reason();
    ASSERT_EQ(done.progress().loss_history_size(), spec.training().steps());
    for (int i = 0; i < spec.training().steps(); ++i) {
      EXPECT_EQ(done.progress().loss_history(i), local[i]) << "iteration " << i << " (bitwise)";
    }
    // Four stages in a row: per micro-batch an activation and a gradient on
    // each of the three links, all device to device.
    EXPECT_EQ(hubs_.sent() - sent_before,
              int64_t{3} * 2 * spec.training().micro_batches() * spec.training().steps());
    EXPECT_EQ(hubs_.in_flight(), 0);
    // Every member joined this job's group with the same id, as its stage.
    std::string id;
    std::vector<int> stages_joined;
    for (auto& w : workers_) {
      const std::vector<Join> joins = w->gpu.joins();
      ASSERT_EQ(joins.size(), static_cast<size_t>(job + 1));
      const Join& j = joins.back();
      if (id.empty()) id = j.group.id;
      EXPECT_EQ(j.group.id, id);
      EXPECT_EQ(j.group.stages, (std::vector<int>{0, 1, 2, 3}));
      const std::vector<std::pair<int, int>> links = {{0, 1}, {1, 0}, {1, 2},
                                                      {2, 1}, {2, 3}, {3, 2}};
      EXPECT_EQ(j.group.links, links);
      stages_joined.push_back(j.stage);
    }
    std::sort(stages_joined.begin(), stages_joined.end());
    EXPECT_EQ(stages_joined, (std::vector<int>{0, 1, 2, 3}));
    EXPECT_TRUE(absl::StartsWith(id, "fake-nccl-id-gpu")) << id;
    // Used up: no worker offers that id any more.
    EXPECT_EQ(OwnerOfCurrentId(id), -1) << id;
    if (job == 0) {
      first_id = id;
    } else {
      EXPECT_NE(id, first_id) << "the second group reused a consumed id";
    }
    // The owner reports a fresh id with a heartbeat (every 50 ms) before the
    // next job; wait for the registry to hold one for every worker.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    bool all_have_ids = false;
    while (!all_have_ids && absl::Now() < deadline) {
      all_have_ids = true;
      for (auto& w : workers_) {
        all_have_ids &= !registry_.NcclUniqueId(w->agent->worker_id()).value_or("").empty();
      }
      if (!all_have_ids) absl::SleepFor(absl::Milliseconds(20));  // polls a remote state
    }
    ASSERT_TRUE(all_have_ids) << "a worker never reported a fresh NCCL id";
  }
}

// Data parallelism on the same four GPUs: two replicas of two stages. Each
// replica's stages form a device group (activations GPU to GPU) and each
// stage's replicas a replica device group (gradient sums), four groups
// with four different ids, all used up. The losses and the exported
// weights are train-local's to 1e-5 (data_parallel_testing.h: the
// replicas' partial sums are added in another order). The weights show a
// gradient D times too large or too small (unclipped, through AdamW's eps),
// which 6 steps' losses do not (they moved by 3e-7 for a gradient twice
// too large).
TEST_F(DeviceGroupClusterTest, TwoReplicasOnOneHost_DeviceAndReplicaGroups) {
  v1::JobSpec spec = Spec();
  spec.mutable_parallelism()->set_stages(2);
  spec.mutable_parallelism()->set_data(2);
  spec.mutable_output()->set_weights_path("two-replicas.safetensors");
  std::map<std::string, std::vector<float>> local_weights;
  const std::vector<float> local = LocalLosses(spec, &local_weights);
  const v1::Job done = RunJob(spec);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.reason();
  ASSERT_EQ(done.progress().loss_history_size(), spec.training().steps());
  for (int i = 0; i < spec.training().steps(); ++i) {
    EXPECT_NEAR(done.progress().loss_history(i), local[i], 1e-5 * std::abs(local[i]))
        << "iteration " << i;
  }
  auto file = ReadSafetensors(done.weights_path());
  ASSERT_TRUE(file.ok()) << file.status();
  std::map<std::string, std::vector<float>> weights;
  for (const auto& t : file->tensors) weights[t.name] = t.tensor.ToVector();
  testing::ExpectWeightsClose(weights, local_weights, spec.model().d_model(), "weights");
  // Per replica and step, 2 micro-batches across the one boundary, an
  // activation and a gradient each.
  EXPECT_EQ(hubs_.sent(), int64_t{2} * 2 * 2 * spec.training().steps());
  EXPECT_EQ(hubs_.in_flight(), 0);
  EXPECT_EQ(hubs_.replica_groups(), 2u);
  // At least one sum per stage and step (the buckets of a tiny model).
  EXPECT_GE(hubs_.sums(), int64_t{2} * spec.training().steps());
  std::map<std::string, std::vector<int>> ranks_by_id;
  std::set<std::string> ids;
  for (auto& w : workers_) {
    const std::vector<Join> joins = w->gpu.joins();
    ASSERT_EQ(joins.size(), 1u);
    const int first = joins[0].stage / 2 * 2;  // members numbered by worker
    EXPECT_EQ(joins[0].group.stages, (std::vector<int>{first, first + 1}));
    ids.insert(joins[0].group.id);
    const std::vector<DeviceCollectiveSpec> collective_joins = w->gpu.collective_joins();
    ASSERT_EQ(collective_joins.size(), 1u);
    EXPECT_EQ(collective_joins[0].members, 2);
    ranks_by_id[collective_joins[0].id].push_back(collective_joins[0].rank);
    ids.insert(collective_joins[0].id);
  }
  EXPECT_EQ(ids.size(), 4u) << "two groups share an NCCL id";
  ASSERT_EQ(ranks_by_id.size(), 2u);
  for (auto& [id, ranks] : ranks_by_id) {
    std::sort(ranks.begin(), ranks.end());
    EXPECT_EQ(ranks, (std::vector<int>{0, 1})) << id;
  }
  for (const std::string& id : ids) EXPECT_EQ(OwnerOfCurrentId(id), -1) << id << " not used up";
  // The owners report fresh ids with a heartbeat (every 50 ms), so a next
  // job can group again.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  bool all_have_ids = false;
  while (!all_have_ids && absl::Now() < deadline) {
    all_have_ids = true;
    for (auto& w : workers_) {
      all_have_ids &= !registry_.NcclUniqueId(w->agent->worker_id()).value_or("").empty();
    }
    if (!all_have_ids) absl::SleepFor(absl::Milliseconds(20));  // polls a remote state
  }
  EXPECT_TRUE(all_have_ids) << "a replica group's id owner never reported a fresh NCCL id";
}

}  // namespace
}  // namespace pipetrain
