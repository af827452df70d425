#include "worker/agent/backoff.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(BackoffTest, Next_GrowsGeometricallyWithinJitterAndCaps) {
  Backoff backoff({absl::Milliseconds(100), absl::Seconds(1), 2.0, 0.5, 7});
  const double bases[] = {0.1, 0.2, 0.4, 0.8, 1.0, 1.0};
  for (double base : bases) {
    const double d = absl::ToDoubleSeconds(backoff.Next());
    EXPECT_LE(d, base);
    EXPECT_GE(d, base * 0.5);
  }
  EXPECT_EQ(backoff.attempts(), 6);
  backoff.Reset();
  EXPECT_LE(absl::ToDoubleSeconds(backoff.Next()), 0.1);
}

TEST(BackoffTest, SameSeed_SameDelays_DifferentSeed_DifferentDelays) {
  BackoffOptions seeded;
  seeded.seed = 1;
  Backoff a(seeded), b(seeded), c({absl::Milliseconds(100), absl::Seconds(5), 2.0, 0.5, 99});
  bool differs = false;
  for (int i = 0; i < 5; ++i) {
    const absl::Duration da = a.Next();
    EXPECT_EQ(da, b.Next());
    differs = differs || da != c.Next();
  }
  EXPECT_TRUE(differs);
}

// Options built as the worker builds them (WorkerAgentOptions::backoff's
// defaults) get seeds of their own: with one fixed seed, every worker drew
// the same jitter and, after a coordinator restart, retried in lockstep.
TEST(BackoffTest, DefaultOptions_DrawDifferentSeedsAndDelays) {
  const BackoffOptions x, y;
  EXPECT_NE(x.seed, y.seed);
  Backoff a(x), b(y);
  bool differs = false;
  for (int i = 0; i < 5; ++i) differs = differs || a.Next() != b.Next();
  EXPECT_TRUE(differs);
}

TEST(BackoffTest, NoJitter_IsExact) {
  Backoff backoff({absl::Milliseconds(10), absl::Seconds(1), 3.0, 0.0, 1});
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(10));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(30));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(90));
}

}  // namespace
}  // namespace pipetrain
