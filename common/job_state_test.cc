#include "common/job_state.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(JobStateTest, IsTerminal_ExactlyTheThreeEndStates) {
  const google::protobuf::EnumDescriptor* states = v1::JobState_descriptor();
  int terminal = 0;
  for (int i = 0; i < states->value_count(); ++i) {
    const auto state = static_cast<v1::JobState>(states->value(i)->number());
    const bool ended = state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
                       state == v1::JOB_STATE_CANCELLED;
    EXPECT_EQ(IsTerminal(state), ended) << states->value(i)->name();
    terminal += IsTerminal(state) ? 1 : 0;
  }
  EXPECT_EQ(terminal, 3);
  EXPECT_FALSE(IsTerminal(v1::JOB_STATE_RECOVERING));
}

}  // namespace
}  // namespace pipetrain
