#include "common/enum_names.h"

#include <set>
#include <string>

#include <gtest/gtest.h>

#include "proto/pipetrain/v1/coordinator.pb.h"
#include "proto/pipetrain/v1/job.pb.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {
namespace {

TEST(EnumNamesTest, EnumValuePrefix_CamelCaseName_UpperSnakeWithUnderscore) {
  EXPECT_EQ(EnumValuePrefix(*v1::JobState_descriptor()), "JOB_STATE_");
  EXPECT_EQ(EnumValuePrefix(*v1::TensorKind_descriptor()), "TENSOR_KIND_");
  EXPECT_EQ(EnumValuePrefix(*v1::Assignment::Action_descriptor()), "ACTION_");
}

TEST(EnumNamesTest, EnumShortName_PrefixedValue_PrefixStripped) {
  EXPECT_EQ(EnumShortName(v1::JOB_STATE_RUNNING), "RUNNING");
  EXPECT_EQ(EnumShortName(v1::WORKER_STATE_LOST), "LOST");
  EXPECT_EQ(EnumShortName(v1::TENSOR_KIND_ACTIVATION_GRAD), "ACTIVATION_GRAD");
  EXPECT_EQ(EnumShortName(v1::Assignment::ACTION_STOP), "STOP");
  EXPECT_EQ(EnumShortName(v1::LINK_PATH_WIRE), "WIRE");
}

TEST(EnumNamesTest, EnumShortName_UnspecifiedValue_FullName) {
  EXPECT_EQ(EnumShortName(v1::TENSOR_KIND_UNSPECIFIED), "TENSOR_KIND_UNSPECIFIED");
  EXPECT_EQ(EnumShortName(v1::LINK_PATH_UNSPECIFIED), "LINK_PATH_UNSPECIFIED");
  EXPECT_EQ(EnumShortName(v1::Assignment::ACTION_UNSPECIFIED), "ACTION_UNSPECIFIED");
}

// Every value of every pipetrain enum has a short name that is not empty and
// maps back to one value: the labels built from them cannot collide.
TEST(EnumNamesTest, EnumShortName_EveryValue_NonEmptyAndUnique) {
  for (const google::protobuf::EnumDescriptor* type :
       {v1::JobState_descriptor(), v1::WorkerState_descriptor(), v1::TensorKind_descriptor(),
        v1::LinkPath_descriptor(), v1::Assignment::Action_descriptor(),
        v1::JobView_descriptor()}) {
    std::set<std::string> seen;
    for (int i = 0; i < type->value_count(); ++i) {
      const std::string name = EnumShortName(*type, type->value(i)->number());
      EXPECT_FALSE(name.empty()) << type->value(i)->name();
      EXPECT_TRUE(seen.insert(name).second) << type->name() << ": " << name << " twice";
    }
  }
}

TEST(EnumNamesTest, EnumShortName_UnknownNumber_Decimal) {
  EXPECT_EQ(EnumShortName(static_cast<v1::TensorKind>(42)), "42");
}

}  // namespace
}  // namespace pipetrain
