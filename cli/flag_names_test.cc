#include "cli/flag_names.h"

#include <utility>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

constexpr std::pair<absl::string_view, absl::string_view> kFlags[] = {
    {"spec.training.lr", "--lr"},
    {"spec.training.batch_size", "--batch"},
    {"micro_batches", "--micro-batches"},
};

TEST(FlagNamesTest, WholeFieldNamesBecomeFlags) {
  EXPECT_EQ(NameFlags("micro_batches: 3 must divide spec.training.batch_size 16", kFlags),
            "--micro-batches: 3 must divide --batch 16");
  // A sentence's full stop is not part of the name; brackets end it.
  EXPECT_EQ(NameFlags("see spec.training.lr.", kFlags), "see --lr.");
  EXPECT_EQ(NameFlags("(spec.training.lr) and micro_batches[2]", kFlags),
            "(--lr) and --micro-batches[2]");
}

TEST(FlagNamesTest, PartsAndOtherWords_Kept) {
  for (const char* kept :
       {"spec.training.lr_schedule: unknown", "spec.training.lrx", "xmicro_batches",
        "spec.training", "", "no fields here", "micro_batches_total", "a.micro_batches"}) {
    EXPECT_EQ(NameFlags(kept, kFlags), kept);
  }
}

TEST(FlagNamesTest, Status_CodeKept_OkUnchanged) {
  const absl::Status named =
      NameFlags(absl::InvalidArgumentError("spec.training.lr: must be > 0"), kFlags);
  EXPECT_EQ(named.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(named.message(), "--lr: must be > 0");
  EXPECT_TRUE(NameFlags(absl::OkStatus(), kFlags).ok());
}

}  // namespace
}  // namespace pipetrain
