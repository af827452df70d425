#include "common/data_plane_keys.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/secrets.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

constexpr char kSecret[] = "plan-secret";

TEST(DataPlaneKeysTest, DataPlaneJobId_JobSlashVersion) {
  EXPECT_EQ(DataPlaneJobId("job-7", 3), "job-7/3");
}

// The header's two formulas, computed apart from the library.
TEST(DataPlaneKeysTest, Keys_AreTheDocumentedHmacs) {
  const std::vector<DataPlaneKeys> keys = DeriveDataPlaneKeys(kSecret, "j/2", 3);
  ASSERT_EQ(keys.size(), 3u);
  for (int b = 0; b < 3; ++b) {
    const std::string receive =
        HmacSha256Hex(kSecret, absl::StrCat("pipetrain-dataplane-v2-receive|j/2|", b));
    EXPECT_EQ(keys[b].receive_key, receive);
    EXPECT_EQ(receive.size(), kDataPlaneKeyBytes);
    for (int a = 0; a < 3; ++a) {
      ASSERT_EQ(keys[a].send_keys.size(), 3u);
      EXPECT_EQ(keys[a].send_keys[b],
                HmacSha256Hex(receive, absl::StrCat("pipetrain-dataplane-v2-link|j/2|", a)));
      // What the receiver derives to check a's streams.
      EXPECT_EQ(keys[a].send_keys[b], DataPlaneLinkKey(keys[b].receive_key, "j/2", a));
    }
  }
}

// Every key of a plan differs from every other, and from the next plan's.
TEST(DataPlaneKeysTest, Keys_AllDistinctAcrossWorkersAndPlans) {
  std::set<std::string> seen;
  size_t count = 0;
  for (const char* job : {"j/1", "j/2"}) {
    for (const DataPlaneKeys& k : DeriveDataPlaneKeys(kSecret, job, 4)) {
      seen.insert(k.receive_key);
      seen.insert(k.send_keys.begin(), k.send_keys.end());
      count += 1 + k.send_keys.size();
    }
  }
  EXPECT_EQ(seen.size(), count);
  EXPECT_TRUE(DeriveDataPlaneKeys(kSecret, "j/1", 0).empty());
}

TEST(DataPlaneKeysTest, OneWorkersKeys_AsAllWorkersKeys) {
  const std::vector<DataPlaneKeys> all = DeriveDataPlaneKeys(kSecret, "j/3", 5);
  for (int w = 0; w < 5; ++w) {
    const DataPlaneKeys one = DeriveWorkerDataPlaneKeys(kSecret, "j/3", w, 5);
    EXPECT_EQ(one.receive_key, all[w].receive_key);
    EXPECT_EQ(one.send_keys, all[w].send_keys);
  }
}

}  // namespace
}  // namespace pipetrain
