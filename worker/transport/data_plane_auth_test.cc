#include "worker/transport/data_plane_auth.h"

#include <string>
#include <vector>

#include "common/data_plane_keys.h"
#include "common/secrets.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

constexpr char kPlanSecret[] = "0123456789abcdef0123456789abcdef";
constexpr char kJob[] = "job-x/1";
constexpr int kWorkers = 4;

const std::vector<DataPlaneKeys>& Keys() {
  static const std::vector<DataPlaneKeys>* keys =
      new std::vector<DataPlaneKeys>(DeriveDataPlaneKeys(kPlanSecret, kJob, kWorkers));
  return *keys;
}

// Worker `source`'s proof of its stream to `target`, made with its own key.
std::string ProofOf(int source, int target) {
  return StreamProof(Keys()[source].send_keys[target], kJob, source);
}

// What worker `self` of the job decides about a stream's metadata.
absl::StatusOr<int> Check(int self, const std::string& sent_stage, const std::string& proof,
                          const std::string& sent_job = kJob) {
  return VerifyStreamOpen(kJob, kWorkers, Keys()[self].receive_key, sent_job, sent_stage, proof);
}

TEST(DataPlaneAuthTest, RightProof_ReturnsTheSender) {
  for (int a = 0; a < kWorkers; ++a) {
    for (int b = 0; b < kWorkers; ++b) {
      const std::string proof = ProofOf(a, b);
      EXPECT_EQ(proof.size(), 64u);
      absl::StatusOr<int> stage = Check(b, std::to_string(a), proof);
      ASSERT_TRUE(stage.ok()) << a << " -> " << b << ": " << stage.status();
      EXPECT_EQ(*stage, a);
    }
  }
}

// The message the header documents, computed apart from StreamProof: a
// sender built elsewhere can rely on it.
TEST(DataPlaneAuthTest, Proof_IsTheDocumentedHmac) {
  const std::string link = Keys()[2].send_keys[1];
  EXPECT_EQ(StreamProof(link, kJob, 2), HmacSha256Hex(link, "pipetrain-dataplane-v2|job-x/1|2"));
  EXPECT_EQ(StreamProof(link, "job-x/12", 12),
            HmacSha256Hex(link, "pipetrain-dataplane-v2|job-x/12|12"));
}

// The point of per-link keys: worker w holds its receive key, its send
// keys, and every link key it can derive from them; none of it proves a
// stream from another worker a to a third worker b. (Under the v1 scheme
// every worker held the job's one secret, which proved any stage.)
TEST(DataPlaneAuthTest, WorkerOfTheJob_CannotSpeakForAnother) {
  for (int w = 0; w < kWorkers; ++w) {
    std::vector<std::string> held = Keys()[w].send_keys;
    held.push_back(Keys()[w].receive_key);
    for (int a = 0; a < kWorkers; ++a) {
      held.push_back(DataPlaneLinkKey(Keys()[w].receive_key, kJob, a));
    }
    for (int a = 0; a < kWorkers; ++a) {
      for (int b = 0; b < kWorkers; ++b) {
        if (a == w || b == w) continue;
        for (const std::string& key : held) {
          EXPECT_EQ(Check(b, std::to_string(a), StreamProof(key, kJob, a)).status().code(),
                    absl::StatusCode::kUnauthenticated)
              << "worker " << w << " passed as " << a << " to " << b;
        }
        // Nor its own proof to b, relabelled as a's.
        EXPECT_EQ(Check(b, std::to_string(a), ProofOf(w, b)).status().code(),
                  absl::StatusCode::kUnauthenticated);
      }
    }
  }
}

TEST(DataPlaneAuthTest, WrongProofStageOrJob_Refused) {
  const std::string proof = ProofOf(2, 1);
  // The proof of stage 2 does not open a stream as stage 0, nor to
  // another receiver; other secrets and jobs give other proofs.
  EXPECT_EQ(Check(1, "0", proof).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Check(3, "2", proof).status().code(), absl::StatusCode::kUnauthenticated);
  const std::vector<DataPlaneKeys> other_plan = DeriveDataPlaneKeys("another secret", kJob, 4);
  EXPECT_EQ(Check(1, "2", StreamProof(other_plan[2].send_keys[1], kJob, 2)).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Check(1, "2", "").status().code(), absl::StatusCode::kUnauthenticated);
  // A proof made with the right key but for another job, sent as this job's.
  EXPECT_EQ(Check(1, "2", StreamProof(Keys()[2].send_keys[1], "job-x/2", 2)).status().code(),
            absl::StatusCode::kUnauthenticated);
  // Stage 2's own proof, but not the canonical "2".
  for (const char* stage : {"", "-1", "4", "x", " 2", "+2", "02", "2 "}) {
    EXPECT_EQ(Check(1, stage, proof).status().code(), absl::StatusCode::kUnauthenticated) << stage;
  }
  EXPECT_EQ(Check(1, "2", proof, "job-x/2").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(VerifyStreamOpen("", 0, "", kJob, "2", proof).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Check(1, "", "", "").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(DataPlaneAuthTest, ReceiverWithoutKey_AcceptsAnyStageOfItsJob) {
  EXPECT_EQ(VerifyStreamOpen("job-1", 2, "", "job-1", "1", "").value_or(-1), 1);
}

}  // namespace
}  // namespace pipetrain
