#include "coordinator/jobs/profile_cache.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

v1::ProfileRequest Request() {
  v1::ProfileRequest r;
  r.mutable_model()->set_n_layer(2);
  r.mutable_model()->set_n_head(4);
  r.mutable_model()->set_d_model(64);
  r.set_seq_len(32);
  r.set_micro_batch_size(4);
  return r;
}

// A profile with partition timings is another measurement than one without:
// the key tells them apart, so a cached plain profile never stands in.
TEST(ProfileKeyTest, PartitionsAskedFor_PartOfTheKey) {
  v1::ProfileRequest with = Request();
  with.add_partitions(2);
  with.add_partitions(4);
  EXPECT_NE(ProfileKey(with, "cpu:x"), ProfileKey(Request(), "cpu:x"));
  EXPECT_NE(ProfileKey(with, "cpu:x").find(" K2,4 @ cpu:x"), std::string::npos)
      << ProfileKey(with, "cpu:x");
}

TEST(FromProtoTest, CodecTimings_KeptByName) {
  v1::ModelProfile p;
  v1::CodecTiming* c = p.add_codecs();
  c->set_codec("bf16");
  c->set_all_reduce_seconds_per_byte(1e-9);
  const ModelProfile got = FromProto(p);
  EXPECT_EQ(got.codec_all_reduce_seconds_per_byte, (std::map<std::string, double>{{"bf16", 1e-9}}));
}

TEST(FromProtoTest, PartitionTimings_KeptByCount) {
  v1::ModelProfile p;
  p.set_micro_batch_size(4);
  v1::UnitProfile* u = p.add_units();
  u->set_name("attn_0");
  u->set_fwd_seconds(0.4);
  u->set_bwd_seconds(0.8);
  v1::PartitionTiming* t = u->add_partitions();
  t->set_count(4);
  t->set_fwd_seconds(0.15);
  t->set_bwd_seconds(0.25);
  const ModelProfile got = FromProto(p);
  ASSERT_EQ(got.units.size(), 1u);
  EXPECT_EQ(got.units[0].fwd_seconds, 0.4);
  ASSERT_EQ(got.units[0].partition_seconds.count(4), 1u);
  EXPECT_EQ(got.units[0].partition_seconds.at(4).first, 0.15);
  EXPECT_EQ(got.units[0].partition_seconds.at(4).second, 0.25);
  EXPECT_EQ(got.units[0].partition_seconds.count(2), 0u);
}

}  // namespace
}  // namespace pipetrain
