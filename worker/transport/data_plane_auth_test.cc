#include "worker/transport/data_plane_auth.h"

#include "common/secrets.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef";

TEST(DataPlaneAuthTest, RightProof_ReturnsTheStage) {
  const std::string proof = StreamProof(kSecret, "job-x-1", 2);
  EXPECT_EQ(proof.size(), 64u);
  absl::StatusOr<int> stage = VerifyStreamOpen("job-x-1", 4, kSecret, "job-x-1", "2", proof);
  ASSERT_TRUE(stage.ok()) << stage.status();
  EXPECT_EQ(*stage, 2);
}

// The message the header documents, computed apart from StreamProof: a
// sender built elsewhere can rely on it.
TEST(DataPlaneAuthTest, Proof_IsTheDocumentedHmac) {
  EXPECT_EQ(StreamProof(kSecret, "job-x-1", 2),
            HmacSha256Hex(kSecret, "pipetrain-dataplane-v1|job-x-1|2"));
  EXPECT_EQ(StreamProof(kSecret, "job-x-1", 12),
            HmacSha256Hex(kSecret, "pipetrain-dataplane-v1|job-x-1|12"));
}

TEST(DataPlaneAuthTest, WrongProofStageOrJob_Refused) {
  const std::string proof = StreamProof(kSecret, "job-x-1", 2);
  // The proof of stage 2 does not open a stream as stage 1; other secrets
  // and jobs give other proofs.
  EXPECT_EQ(VerifyStreamOpen("job-x-1", 4, kSecret, "job-x-1", "1", proof).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(VerifyStreamOpen("job-x-1", 4, kSecret, "job-x-1", "2",
                             StreamProof("another secret", "job-x-1", 2))
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(VerifyStreamOpen("job-x-1", 4, kSecret, "job-x-1", "2", "").status().code(),
            absl::StatusCode::kUnauthenticated);
  // A proof made for another job under the same secret, sent as this job's.
  EXPECT_EQ(
      VerifyStreamOpen("job-x-1", 4, kSecret, "job-x-1", "2", StreamProof(kSecret, "job-x-2", 2))
          .status()
          .code(),
      absl::StatusCode::kUnauthenticated);
  // Stage 2's own proof, but not the canonical "2".
  for (const char* stage : {"", "-1", "4", "x", " 2", "+2", "02", "2 "}) {
    EXPECT_EQ(VerifyStreamOpen("job-x-1", 4, kSecret, "job-x-1", stage, proof).status().code(),
              absl::StatusCode::kUnauthenticated)
        << stage;
  }
  EXPECT_EQ(VerifyStreamOpen("job-x-1", 4, kSecret, "job-x-2", "2", proof).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(VerifyStreamOpen("", 0, "", "job-x-1", "2", proof).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(VerifyStreamOpen("job-x-1", 4, kSecret, "", "", "").status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(DataPlaneAuthTest, ReceiverWithoutSecret_AcceptsAnyStageOfItsJob) {
  EXPECT_EQ(VerifyStreamOpen("job-1", 2, "", "job-1", "1", "").value_or(-1), 1);
}

}  // namespace
}  // namespace pipetrain
