#include "worker/data/corpus.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// Job.data_sha256 is documented as the SHA-256 of the tokens as two
// little-endian bytes each: pinned to the standard digests of those bytes.
TEST(CorpusSha256Test, HashesEachTokenAsTwoLittleEndianBytes) {
  // SHA-256("") and SHA-256(01 02 03 04).
  EXPECT_EQ(CorpusSha256({}), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(CorpusSha256({0x0201, 0x0403}),
            "9f64a747e1b97f131fabb6b447296c9b6f0201e79fb3c5356e6c77e89b6a806a");
  EXPECT_NE(CorpusSha256({0x0102, 0x0304}), CorpusSha256({0x0201, 0x0403}));
}

TEST(CorpusSha256Test, GeneratedTextOfTheSameSeedHashesTheSame) {
  const CorpusSpec spec{"", DataFormat::kAuto, 256, 3000, 7};
  EXPECT_EQ(CorpusSha256(LoadCorpus(spec).value()), CorpusSha256(LoadCorpus(spec).value()));
  CorpusSpec other = spec;
  other.seed = 8;
  EXPECT_NE(CorpusSha256(LoadCorpus(spec).value()), CorpusSha256(LoadCorpus(other).value()));
}

}  // namespace
}  // namespace pipetrain
