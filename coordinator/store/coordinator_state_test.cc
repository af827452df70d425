#include "coordinator/store/coordinator_state.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/store/memory_store.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(CoordinatorStateTest, Initialize_EmptyStoreGetsVersion_OtherVersionRefused) {
  MemoryStore store;
  CoordinatorState state(&store);
  ASSERT_TRUE(state.Initialize().ok());
  ASSERT_TRUE(state.Initialize().ok());  // a restart on the same state
  ASSERT_TRUE(store.Commit({StoreWrite::Put("meta/version", "99")}).ok());
  const absl::Status refused = state.Initialize();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("layout version 99"), std::string::npos) << refused;
}

TEST(CoordinatorStateTest, DeletedProfile_NotLoaded) {
  MemoryStore store;
  CoordinatorState state(&store);
  ASSERT_TRUE(state.Initialize().ok());
  ASSERT_TRUE(state.SaveProfile("a", v1::ModelProfile()).ok());
  ASSERT_TRUE(state.SaveProfile("b", v1::ModelProfile()).ok());
  ASSERT_TRUE(state.DeleteProfile("a").ok());
  const auto loaded = state.LoadProfiles();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->size(), 1u);
  EXPECT_EQ(loaded->count("b"), 1u);
}

// Profiles come back in the order they were saved (a saved-again profile
// moves last; a new CoordinatorState on the same store, a restart, numbers
// on), with records saved before the numbering first in key order. A
// restarted coordinator's cache puts them back so and keeps its least
// recently used order; in key order, it evicted "a" first.
TEST(CoordinatorStateTest, LoadProfilesBySave_OldestSaveFirst_UnnumberedFirstInKeyOrder) {
  MemoryStore store;
  for (const char* old_key : {"profiles/z", "profiles/y"}) {
    ASSERT_TRUE(
        store.Commit({StoreWrite::Put(old_key, v1::ModelProfile().SerializeAsString())}).ok());
  }
  {
    CoordinatorState state(&store);
    for (const char* key : {"c", "a", "b"}) {
      ASSERT_TRUE(state.SaveProfile(key, v1::ModelProfile()).ok());
    }
  }
  CoordinatorState state(&store);  // restarted
  ASSERT_TRUE(state.SaveProfile("c", v1::ModelProfile()).ok());
  EXPECT_EQ(store.Get("meta/profile_sequence").value(), std::optional<std::string>("4"));
  const auto loaded = state.LoadProfilesBySave();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::vector<std::string> keys;
  for (const auto& [key, profile] : *loaded) {
    keys.push_back(key);
    EXPECT_EQ(profile.store_sequence(), 0) << key;  // the store's, not the caller's
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"y", "z", "a", "b", "c"}));
  const auto by_key = state.LoadProfiles();
  ASSERT_TRUE(by_key.ok()) << by_key.status();
  EXPECT_EQ(by_key->size(), 5u);
  EXPECT_EQ(by_key->at("c").store_sequence(), 0);
}

TEST(CoordinatorStateTest, SaveProfile_SequenceNotANumber_DataLossNamingIt) {
  MemoryStore store;
  CoordinatorState state(&store);
  ASSERT_TRUE(store.Commit({StoreWrite::Put("meta/profile_sequence", "x1")}).ok());
  const absl::Status status = state.SaveProfile("a", v1::ModelProfile());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("meta/profile_sequence holds \"x1\""), std::string::npos)
      << status;
  EXPECT_EQ(store.Get("profiles/a").value(), std::nullopt);
}

TEST(CoordinatorStateTest, DeletedWorker_NotLoaded) {
  MemoryStore store;
  CoordinatorState state(&store);
  ASSERT_TRUE(state.Initialize().ok());
  for (const auto& [id, address] :
       {std::pair<const char*, const char*>{"w-1", "10.0.0.1:7001"}, {"w-2", "10.0.0.2:7001"}}) {
    v1::Worker worker;
    worker.set_id(id);
    worker.set_data_address(address);
    ASSERT_TRUE(state.SaveWorker(worker).ok());
  }
  ASSERT_TRUE(state.DeleteWorker("w-1").ok());
  const auto loaded = state.LoadWorkers();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 1u);
  EXPECT_EQ((*loaded)[0].id(), "w-2");
}

TEST(CoordinatorStateTest, WorkersJobsAndProfiles_RoundTrip) {
  MemoryStore store;
  CoordinatorState state(&store);
  ASSERT_TRUE(state.Initialize().ok());
  v1::Worker worker;
  worker.set_id("w-3");
  worker.set_data_address("10.0.0.3:7001");
  worker.set_incarnation(4);
  worker.set_state(v1::WORKER_STATE_ASSIGNED);  // not kept: a restart starts from LOST
  worker.set_job_id("job-1");
  worker.mutable_device()->set_cpu_model("test cpu");
  worker.mutable_build()->set_version("0.1.0");
  worker.mutable_build()->set_commit("3635b2d5aae6");
  ASSERT_TRUE(state.SaveWorker(worker).ok());
  const auto workers = state.LoadWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].id(), "w-3");
  EXPECT_EQ((*workers)[0].incarnation(), 4);
  EXPECT_EQ((*workers)[0].device().cpu_model(), "test cpu");
  EXPECT_EQ((*workers)[0].build().version(), "0.1.0");
  EXPECT_EQ((*workers)[0].build().commit(), "3635b2d5aae6");
  EXPECT_EQ((*workers)[0].state(), v1::WORKER_STATE_UNSPECIFIED);
  EXPECT_EQ((*workers)[0].job_id(), "");
  // A worker that deregistered is kept LEFT, with when it was last heard.
  worker.set_state(v1::WORKER_STATE_LEFT);
  worker.mutable_last_heartbeat()->set_seconds(1700000000);
  ASSERT_TRUE(state.SaveWorker(worker).ok());
  const auto left = state.LoadWorkers();
  ASSERT_TRUE(left.ok()) << left.status();
  ASSERT_EQ(left->size(), 1u);
  EXPECT_EQ((*left)[0].state(), v1::WORKER_STATE_LEFT);
  EXPECT_EQ((*left)[0].last_heartbeat().seconds(), 1700000000);

  store::StoredJob job;
  job.mutable_job()->set_id("job-a-1");
  job.mutable_job()->mutable_progress()->add_loss_history(2.5f);
  job.add_checkpoints()->set_step(10);
  ASSERT_TRUE(state.SaveJob(job).ok());
  job.mutable_job()->set_id("job-a-2");
  ASSERT_TRUE(state.SaveJob(job).ok());
  ASSERT_TRUE(state.DeleteJob("job-a-1").ok());
  const auto jobs = state.LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].job().id(), "job-a-2");
  EXPECT_EQ((*jobs)[0].job().progress().loss_history(0), 2.5f);
  EXPECT_EQ((*jobs)[0].checkpoints(0).step(), 10);

  v1::ModelProfile profile;
  profile.set_device_kind("cpu");
  ASSERT_TRUE(state.SaveProfile("L2 H2 D32 @ cpu", profile).ok());
  const auto profiles = state.LoadProfiles();
  ASSERT_TRUE(profiles.ok());
  ASSERT_EQ(profiles->count("L2 H2 D32 @ cpu"), 1u);
}

TEST(CoordinatorStateTest, UnparsableJob_IsDataLossNamingTheKey) {
  MemoryStore store;
  CoordinatorState state(&store);
  ASSERT_TRUE(store.Commit({StoreWrite::Put("jobs/job-x", "\xff\xff not a proto")}).ok());
  const absl::Status status = state.LoadJobs().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("jobs/job-x"), std::string::npos) << status;
}

// A saved record with one byte changed inside its message, which still
// parses (a step count): DATA_LOSS naming the key, for each table. A
// record saved before records were sealed is read as it is.
// A job record under another key than its id's would never be saved over
// nor deleted, and could come back in place of the job's own: left out.
TEST(CoordinatorStateTest, JobUnderAnotherKeyThanItsId_NotLoaded) {
  MemoryStore store;
  CoordinatorState state(&store);
  store::StoredJob job;
  job.mutable_job()->set_id("job-2");
  ASSERT_TRUE(state.SaveJob(job).ok());
  const std::string sealed = store.Get("jobs/job-2").value().value();
  ASSERT_TRUE(store.Commit({StoreWrite::Put("jobs/job-1", sealed)}).ok());
  const auto jobs = state.LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ(jobs->at(0).job().id(), "job-2");
}

// The same for workers: a copy under another key was never deleted, and
// brought the worker back after every restart.
TEST(CoordinatorStateTest, WorkerUnderAnotherKeyThanItsId_NotLoaded) {
  MemoryStore store;
  CoordinatorState state(&store);
  v1::Worker worker;
  worker.set_id("w-2");
  worker.set_data_address("10.0.0.2:7001");
  ASSERT_TRUE(state.SaveWorker(worker).ok());
  const std::string sealed = store.Get("workers/w-2").value().value();
  ASSERT_TRUE(store.Commit({StoreWrite::Put("workers/w-1", sealed)}).ok());
  const auto workers = state.LoadWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ(workers->at(0).id(), "w-2");
}

TEST(CoordinatorStateTest, RecordChangedAfterItsSave_IsDataLossNamingTheKey) {
  MemoryStore store;
  CoordinatorState state(&store);
  store::StoredJob job;
  job.mutable_job()->set_id("job-1");
  job.mutable_job()->mutable_progress()->set_step(100);
  ASSERT_TRUE(state.SaveJob(job).ok());
  v1::Worker worker;
  worker.set_id("w-1");
  worker.set_incarnation(3);
  ASSERT_TRUE(state.SaveWorker(worker).ok());
  v1::ModelProfile profile;
  profile.set_micro_batch_size(2);
  ASSERT_TRUE(state.SaveProfile("p", profile).ok());
  ASSERT_EQ(state.LoadJobs().value().at(0).job().progress().step(), 100);

  for (const std::string key : {"jobs/job-1", "workers/w-1", "profiles/p"}) {
    SCOPED_TRACE(key);
    const std::string saved = store.Get(key).value().value();
    std::string changed = saved;
    changed.back() ^= 0x01;  // the last field's varint: still parses
    ASSERT_TRUE(store.Commit({StoreWrite::Put(key, changed)}).ok());
    absl::Status status = key[0] == 'j'   ? state.LoadJobs().status()
                          : key[0] == 'w' ? state.LoadWorkers().status()
                                          : state.LoadProfiles().status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_NE(status.message().find(key + " does not match its checksum"), std::string::npos)
        << status;
    ASSERT_TRUE(store.Commit({StoreWrite::Put(key, saved)}).ok());
  }
  // Unsealed (an earlier version's record): read as it is.
  job.mutable_job()->mutable_progress()->set_step(7);
  ASSERT_TRUE(store.Commit({StoreWrite::Put("jobs/job-1", job.SerializeAsString())}).ok());
  EXPECT_EQ(state.LoadJobs().value().at(0).job().progress().step(), 7);
  // A seal cut short.
  ASSERT_TRUE(
      store.Commit({StoreWrite::Put("jobs/job-1", std::string("\0pt-sha256:ab", 13))}).ok());
  EXPECT_EQ(state.LoadJobs().status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace pipetrain
