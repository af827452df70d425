#include "worker/transport/stream_hold.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(StreamHoldReleaseTest, CloseWithNoClaimedWrite_TheCloserRemovesIt) {
  StreamHoldRelease hold;
  hold.WriteClaimed();
  EXPECT_FALSE(hold.WriteStarted());  // no close asked yet: the hold stays
  EXPECT_TRUE(hold.CloseAsked());
}

// The window the class exists for: a writer claimed a write and the owner
// closes before it is started. The hold stays until the write starts, and
// that writer removes it.
TEST(StreamHoldReleaseTest, CloseWhileAWriteIsClaimed_TheWriterRemovesItOnceStarted) {
  StreamHoldRelease hold;
  hold.WriteClaimed();
  EXPECT_FALSE(hold.CloseAsked());
  EXPECT_TRUE(hold.WriteStarted());
}

TEST(StreamHoldReleaseTest, TwoClaimedWrites_TheLastStartedRemovesIt) {
  StreamHoldRelease hold;
  hold.WriteClaimed();
  hold.WriteClaimed();
  EXPECT_FALSE(hold.CloseAsked());
  EXPECT_FALSE(hold.WriteStarted());
  EXPECT_TRUE(hold.WriteStarted());
}

// Removed once only: a second close (several threads may close) and a
// write started later (an Enqueue after the close is refused before it
// claims one, but the class does not rely on it) do not remove it again.
TEST(StreamHoldReleaseTest, RemovedOnce) {
  StreamHoldRelease hold;
  EXPECT_TRUE(hold.CloseAsked());
  EXPECT_FALSE(hold.CloseAsked());
  hold.WriteClaimed();
  EXPECT_FALSE(hold.WriteStarted());
}

}  // namespace
}  // namespace pipetrain
