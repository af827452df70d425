#include "coordinator/jobs/stored_job_check.h"

#include "google/protobuf/message.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

GptConfig OneLayer() {
  GptConfig model;
  model.n_layer = 1;
  model.n_head = 2;
  model.d_model = 16;
  model.vocab_size = 256;
  model.max_seq_len = 8;
  return model;  // 4 units
}

// Two replicas of two stages over 4 units.
v1::Plan TwoByTwo() {
  v1::Plan plan;
  plan.set_version(3);
  plan.set_data_parallel(2);
  for (int r = 0; r < 2; ++r) {
    for (int s = 0; s < 2; ++s) {
      v1::PlanStage* stage = plan.add_stages();
      stage->mutable_forward()->set_begin(2 * s);
      stage->mutable_forward()->set_end(2 * s + 2);
      *stage->mutable_backward() = stage->forward();
    }
  }
  return plan;
}

TEST(StoredPlanMismatch, FitsOrNamesWhatDoesNot) {
  EXPECT_EQ(StoredPlanMismatch(TwoByTwo(), 4), "");
  EXPECT_EQ(StoredPlanMismatch(TwoByTwo(), std::nullopt), "");
  EXPECT_EQ(StoredPlanMismatch(v1::Plan(), 4), "");  // not planned
  EXPECT_EQ(StoredPlanMismatch(TwoByTwo(), 3), "stage 1 has units [2, 4) of a model of 3");
  v1::Plan plan = TwoByTwo();
  plan.mutable_stages(0)->mutable_backward()->set_begin(-1);
  EXPECT_EQ(StoredPlanMismatch(plan, 4), "stage 0 has units [-1, 2) of a model of 4");
  // Degrees whose product overflowed an int (65536 x 65536 = 0) made
  // /metrics divide by zero.
  plan = TwoByTwo();
  plan.set_data_parallel(65536);
  plan.set_tensor_parallel(65536);
  EXPECT_EQ(StoredPlanMismatch(plan, std::nullopt), "data_parallel 65536 outside [0, 1024]");
  plan.set_data_parallel(2);
  EXPECT_EQ(StoredPlanMismatch(plan, std::nullopt), "tensor_parallel 65536 outside [0, 64]");
  plan.set_tensor_parallel(-1);
  EXPECT_EQ(StoredPlanMismatch(plan, std::nullopt), "tensor_parallel -1 outside [0, 64]");
  plan.set_tensor_parallel(3);
  EXPECT_EQ(StoredPlanMismatch(plan, std::nullopt),
            "4 stage entries for 6 replicas x tensor ranks");
  plan = TwoByTwo();
  plan.set_version(int64_t{1} << 62);
  EXPECT_EQ(StoredPlanMismatch(plan, 4), "plan version 4611686018427387904");
}

TEST(StoredProfileMismatch, OneUnitPerModelUnitNamedAlike) {
  const GptConfig model = OneLayer();
  ModelProfile profile;
  for (int u = 0; u < NumUnits(model); ++u) profile.units.push_back({UnitName(model, u)});
  EXPECT_EQ(StoredProfileMismatch(profile, model), "");
  // Six units for a model of four: a re-plan would ask the model for unit
  // 4's parameters, a CHECK.
  ModelProfile longer = profile;
  longer.units.push_back({"u"});
  longer.units.push_back({"u"});
  EXPECT_EQ(StoredProfileMismatch(longer, model), "the profile has 6 units, the model 4");
  ModelProfile renamed = profile;
  renamed.units[1].name = "x\x1b";
  EXPECT_EQ(StoredProfileMismatch(renamed, model),
            "the profile's unit 1 is \"x\\x1b\", the model's \"" + UnitName(model, 1) + "\"");
}

TEST(StoredCountersMismatch, CountsThatCannotOverflowWhenTheyGrow) {
  v1::Job job;
  job.set_plan_version(4);
  job.mutable_progress()->set_step(100);
  job.mutable_progress()->set_recoveries(2);
  v1::ResumeFrom checkpoint;
  checkpoint.set_step(100);
  EXPECT_EQ(StoredCountersMismatch(job, {checkpoint}, nullptr, 0), "");
  v1::Job bad = job;
  bad.mutable_progress()->set_step(INT64_MAX);
  EXPECT_EQ(StoredCountersMismatch(bad, {}, nullptr, 0),
            "progress.step 9223372036854775807 outside [0, 9007199254740992]");
  bad = job;
  bad.mutable_progress()->set_steps_redone(-1);
  EXPECT_EQ(StoredCountersMismatch(bad, {}, nullptr, 0),
            "progress.steps_redone -1 outside [0, 9007199254740992]");
  bad = job;
  bad.set_plan_version(INT64_MAX);
  EXPECT_NE(StoredCountersMismatch(bad, {}, nullptr, 0), "");
  bad = job;
  bad.mutable_progress()->set_recoveries(INT32_MAX);
  EXPECT_EQ(StoredCountersMismatch(bad, {}, nullptr, 0),
            "progress.recoveries 2147483647 outside [0, 1073741824]");
  checkpoint.set_step(INT64_MAX - 1);
  EXPECT_EQ(StoredCountersMismatch(job, {checkpoint}, nullptr, 0),
            "checkpoint step 9223372036854775806 outside [0, 9007199254740992]");
  checkpoint.set_step(100);
  EXPECT_EQ(StoredCountersMismatch(job, {}, &checkpoint, 1), "");
  EXPECT_EQ(StoredCountersMismatch(job, {}, nullptr, -1),
            "recoveries_without_progress -1 outside [0, 1073741824]");
  EXPECT_EQ(StoredCountersMismatch(job, {}, nullptr, INT32_MAX),
            "recoveries_without_progress 2147483647 outside [0, 1073741824]");
  checkpoint.set_step(-5);
  EXPECT_EQ(StoredCountersMismatch(job, {}, &checkpoint, 0),
            "init_checkpoint step -5 outside [0, 9007199254740992]");
}

// A stored time must be one a coordinator could have made: from the epoch
// to a day past the restoring coordinator's clock, within the Timestamp's
// range, nanos in [0, 1e9). Year 10000 made every later job's JSON fail.
TEST(StoredTimesMismatch, FromTheEpochToADayAheadOfNow) {
  const absl::Time now = absl::FromUnixSeconds(1700000000);  // 2023-11-14T22:13:20Z
  v1::Job job;
  job.mutable_create_time()->set_seconds(1600000000);
  job.mutable_update_time()->set_seconds(1700000000 + 86400);  // a day ahead: the bound
  job.mutable_update_time()->set_nanos(999999999);
  job.add_plan_history()->mutable_time()->set_seconds(0);  // the epoch
  EXPECT_EQ(StoredTimesMismatch(job, now), "");
  const std::string range = " outside [1970-01-01T00:00:00Z, 2023-11-15T22:13:20Z]";
  v1::Job bad = job;
  bad.mutable_create_time()->set_seconds(253402300800);  // 10000-01-01
  EXPECT_EQ(StoredTimesMismatch(bad, now), "create_time (seconds 253402300800, nanos 0)" + range);
  bad = job;
  bad.mutable_update_time()->set_seconds(1700000000 + 86401);
  bad.mutable_update_time()->set_nanos(0);
  EXPECT_EQ(StoredTimesMismatch(bad, now), "update_time (seconds 1700086401, nanos 0)" + range);
  bad = job;
  bad.mutable_plan_history(0)->mutable_time()->set_seconds(-1);
  EXPECT_EQ(StoredTimesMismatch(bad, now), "plan_history[0].time (seconds -1, nanos 0)" + range);
  bad = job;
  bad.mutable_create_time()->set_nanos(1000000000);
  EXPECT_EQ(StoredTimesMismatch(bad, now),
            "create_time (seconds 1600000000, nanos 1000000000)" + range);
  bad.mutable_create_time()->set_nanos(-1);
  EXPECT_FALSE(StoredTimeFits(bad.create_time(), now));
  // A clock past 9999 (a day less than its end): the Timestamp's range binds.
  google::protobuf::Timestamp last;
  last.set_seconds(253402300799);
  EXPECT_TRUE(StoredTimeFits(last, absl::FromUnixSeconds(253402300799)));
  last.set_seconds(253402300800);
  EXPECT_FALSE(StoredTimeFits(last, absl::FromUnixSeconds(253402300799)));
}

// Sets field `number` of `m`, which this build does not know.
void AddUnknownField(google::protobuf::Message* m, int number) {
  m->GetReflection()->MutableUnknownFields(m)->AddVarint(number, 1);
}

// A spec field unknown to this build at any depth, named by its path and
// number, is found before a profile key unknown to it; a spec and profile
// this build wrote hold neither.
TEST(StoredFieldOfANewerBuild, NamesTheFirstUnknownSpecFieldThenProfileKey) {
  v1::JobSpec spec;
  spec.set_name("known");
  spec.mutable_parallelism()->set_stages(2);
  ModelProfile profile;
  profile.units.push_back(UnitProfile{.name = "embed"});
  const std::string profile_json = ProfileToJson(profile, /*indent=*/-1);
  EXPECT_EQ(StoredFieldOfANewerBuild(spec, profile_json), "");
  EXPECT_EQ(StoredFieldOfANewerBuild(spec, ""), "");  // no profile stored
  const std::string newer_profile =
      R"({"micro_batch_size":1,"units":[{"name":"embed","fwd_seconds":0,"bwd_seconds":0,)"
      R"("weight_bytes":0,"activation_bytes":0,"future_key":1}]})";
  EXPECT_EQ(StoredFieldOfANewerBuild(spec, newer_profile),
            "profile_json has key units[0].future_key");
  v1::JobSpec newer = spec;
  AddUnknownField(newer.mutable_parallelism(), 9999);
  EXPECT_EQ(StoredFieldOfANewerBuild(newer, newer_profile),
            "spec.parallelism has field number 9999");
  newer = spec;
  AddUnknownField(&newer, 77);
  EXPECT_EQ(StoredFieldOfANewerBuild(newer, profile_json), "spec has field number 77");
  newer = spec;
  newer.mutable_parallelism()->add_manual_stages();
  AddUnknownField(newer.mutable_parallelism()->add_manual_stages(), 88);
  EXPECT_EQ(StoredFieldOfANewerBuild(newer, profile_json),
            "spec.parallelism.manual_stages[1] has field number 88");
}

}  // namespace
}  // namespace pipetrain
