#include "coordinator/jobs/profile_cache.h"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

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

// ProfileForAttentions' inputs: a measured profile of two units and, by
// kind, sizes that tell the kinds apart (attention's probabilities are
// stashed on CPU and GEMM attention, not with flash).
ModelProfile TwoUnits(double stash, double transient) {
  ModelProfile p;
  p.units.push_back({"block0.attn", 1.0, 2.0, 1000, 64, stash});
  p.units.back().transient_bytes = transient;
  p.units.push_back({"block0.mlp", 1.0, 2.0, 4000, 64, 300});
  p.units.back().transient_bytes = 30;
  return p;
}

ModelProfile SizesOf(AnalyticAttention kind) {
  switch (kind) {
    case AnalyticAttention::kCpu:
      return TwoUnits(900, 40);
    case AnalyticAttention::kCudaGemm:
      return TwoUnits(900, 700);
    case AnalyticAttention::kCudaFlash:
      return TwoUnits(90, 8);
  }
  return {};
}

// A re-plan that adds a CPU spare to a job profiled on flash-attention GPUs
// sizes the attention stash for the CPU, which keeps the probabilities.
TEST(ProfileForAttentionsTest, AnotherKindPlaced_MemoryRaisedToItsSizes) {
  const ModelProfile flash = TwoUnits(100, 10);  // measured on flash
  std::string note;
  const ModelProfile out = ProfileForAttentions(
      flash, AnalyticAttention::kCudaFlash,
      {AnalyticAttention::kCudaFlash, AnalyticAttention::kCpu}, SizesOf, &note);
  ASSERT_EQ(out.units.size(), 2u);
  // Measured 100 on flash, whose shape gives 90: the CPU's 900 + 10.
  EXPECT_EQ(out.units[0].stash_bytes, 910);
  EXPECT_EQ(out.units[0].transient_bytes, 42);  // 10 + 40 - 8
  EXPECT_EQ(out.units[1].stash_bytes, 300);     // no attention: as measured
  EXPECT_EQ(out.units[1].transient_bytes, 30);
  EXPECT_EQ(out.units[0].fwd_seconds, 1.0);  // times kept
  EXPECT_EQ(out.units[0].weight_bytes, 1000);
  EXPECT_EQ(note, "; stash and transient memory also sized for CPU attention (analytic)");
}

// Every placed worker of another kind than the profile's: the measured
// sizes moved to that kind's, not the profile's larger ones (a fitting
// spare is not refused); units without attention keep their measurement.
TEST(ProfileForAttentionsTest, ProfileKindNotPlaced_MovedToThePlacedKinds) {
  ModelProfile cpu = TwoUnits(950, 45);  // measured on a CPU
  cpu.units[1].stash_bytes = 500;        // the MLP's above its shape's 300
  std::string note;
  const ModelProfile out = ProfileForAttentions(
      cpu, AnalyticAttention::kCpu, {AnalyticAttention::kCudaFlash, AnalyticAttention::kCudaFlash},
      SizesOf, &note);
  EXPECT_EQ(out.units[0].stash_bytes, 140);     // 950 - 900 + 90
  EXPECT_EQ(out.units[0].transient_bytes, 13);  // 45 - 40 + 8
  EXPECT_EQ(out.units[1].stash_bytes, 500);     // no attention: as measured
  EXPECT_EQ(note,
            "; stash and transient memory sized for CUDA flash attention (analytic), not the "
            "profile's CPU");
}

// A measurement below the profiled kind's shape moves no lower than the
// other kind's shape: flash measured at 50 (its shape 90) gives the CPU
// its 900, not 860.
TEST(ProfileForAttentionsTest, MeasuredBelowItsShape_TheOtherKindsShapeAtLeast) {
  const ModelProfile flash = TwoUnits(50, 10);
  const ModelProfile out = ProfileForAttentions(flash, AnalyticAttention::kCudaFlash,
                                                {AnalyticAttention::kCpu}, SizesOf, nullptr);
  EXPECT_EQ(out.units[0].stash_bytes, 900);
}

// The profile's own kind only: unchanged, and nothing noted.
TEST(ProfileForAttentionsTest, SameKind_Unchanged) {
  const ModelProfile flash = TwoUnits(100, 10);
  std::string note = "stale";
  const ModelProfile out = ProfileForAttentions(flash, AnalyticAttention::kCudaFlash,
                                                {AnalyticAttention::kCudaFlash}, SizesOf, &note);
  EXPECT_EQ(out.units[0].stash_bytes, 100);
  EXPECT_EQ(out.units[0].transient_bytes, 10);
  EXPECT_EQ(note, "");
}

// The profile's kind not known (state stored before it was kept): the
// most of the profile's and the placed kinds' sizes.
TEST(ProfileForAttentionsTest, ProfileKindUnknown_MostOfBoth) {
  const ModelProfile measured = TwoUnits(100, 800);
  std::string note;
  const ModelProfile out =
      ProfileForAttentions(measured, std::nullopt, {AnalyticAttention::kCudaGemm}, SizesOf, &note);
  EXPECT_EQ(out.units[0].stash_bytes, 900);
  EXPECT_EQ(out.units[0].transient_bytes, 800);
  EXPECT_EQ(note, "; stash and transient memory also sized for CUDA GEMM attention (analytic)");
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

// A profile is measured with the worker's modes and threads: workers that
// compute otherwise get another key; the GPUs of a host share one.
TEST(ProfileKeyTest, DeviceKey_ModesAndThreadsPartOfIt_DeviceOrdinalNot) {
  v1::DeviceInfo gpu;
  gpu.set_gpu_model("NVIDIA H100");
  gpu.set_backend("cuda:0 (NVIDIA H100), fp32 GEMMs");
  EXPECT_EQ(ProfileDeviceKey(gpu), "cuda:NVIDIA H100 | fp32 GEMMs");
  v1::DeviceInfo other_ordinal = gpu;
  other_ordinal.set_backend("cuda:3 (NVIDIA H100), fp32 GEMMs");
  EXPECT_EQ(ProfileDeviceKey(other_ordinal), ProfileDeviceKey(gpu));
  v1::DeviceInfo flash = gpu;
  flash.set_backend("cuda:0 (NVIDIA H100), bf16 GEMMs (aligned-copies), flash attention (wmma)");
  EXPECT_EQ(ProfileDeviceKey(flash),
            "cuda:NVIDIA H100 | bf16 GEMMs (aligned-copies), flash attention (wmma)");
  v1::DeviceInfo cpu;
  cpu.set_cpu_model("Xeon");
  cpu.set_backend("cpu");
  cpu.set_compute_threads(1);
  v1::DeviceInfo wide = cpu;
  wide.set_compute_threads(16);
  EXPECT_EQ(ProfileDeviceKey(cpu), "cpu:Xeon | 1 threads");
  EXPECT_NE(ProfileDeviceKey(wide), ProfileDeviceKey(cpu));
  v1::DeviceInfo older;  // reported neither
  older.set_cpu_model("Xeon");
  EXPECT_EQ(ProfileDeviceKey(older), "cpu:Xeon");
  // Another build's kernels: another profile.
  v1::BuildIdentity build;
  build.set_version("0.1.0");
  build.set_commit("abc1234");
  EXPECT_EQ(ProfileDeviceKey(cpu, build), "cpu:Xeon | 1 threads | build 0.1.0 (abc1234)");
  v1::BuildIdentity next = build;
  next.set_commit("def5678");
  EXPECT_NE(ProfileDeviceKey(cpu, next), ProfileDeviceKey(cpu, build));
  EXPECT_NE(ProfileKey(Request(), ProfileDeviceKey(wide)),
            ProfileKey(Request(), ProfileDeviceKey(cpu)));
}

// How a worker runs attention, from its backend's description: the sizes
// its profile is checked against and completed with (a device profile's
// transient bytes are not measured).
TEST(ProfileKeyTest, AnalyticAttentionOf_FromTheBackendDescription) {
  v1::DeviceInfo device;
  device.set_backend("cpu");
  EXPECT_EQ(AnalyticAttentionOf(device), AnalyticAttention::kCpu);
  device.set_backend("cuda:0 (NVIDIA H100), fp32 GEMMs");  // reference attention
  EXPECT_EQ(AnalyticAttentionOf(device), AnalyticAttention::kCudaGemm);
  device.set_backend("cuda:1 (NVIDIA H100), tf32 GEMMs, GEMM attention");
  EXPECT_EQ(AnalyticAttentionOf(device), AnalyticAttention::kCudaGemm);
  device.set_backend("cuda:0 (NVIDIA H100), bf16 GEMMs (aligned-copies), flash attention (mma)");
  EXPECT_EQ(AnalyticAttentionOf(device), AnalyticAttention::kCudaFlash);
  device.clear_backend();  // an older worker's report
  EXPECT_EQ(AnalyticAttentionOf(device), AnalyticAttention::kCpu);
}

// The state store takes printable ASCII keys only: a device name with a
// UTF-8 or control byte is escaped in the key, which stays distinct; a
// plain one is kept as it is (the keys stored before stay valid).
TEST(ProfileKeyTest, DeviceKindEscapedToPrintableAscii) {
  const std::string odd = ProfileKey(Request(), "cuda:H100 \xc2\xae\x1b[31m");
  for (const char c : odd) {
    EXPECT_TRUE(c >= 0x20 && c <= 0x7e) << "byte " << int(static_cast<unsigned char>(c));
  }
  EXPECT_NE(odd, ProfileKey(Request(), "cuda:H100 "));
  EXPECT_NE(odd.find("@ cuda:H100 \\302\\256\\033[31m"), std::string::npos) << odd;
  EXPECT_NE(ProfileKey(Request(), "cpu:AMD EPYC 7B13").find(" @ cpu:AMD EPYC 7B13"),
            std::string::npos);
  // The longest name a worker may report (256 bytes), every byte escaped
  // 4x: cut to the store's key limit, two such names still apart.
  const std::string longest(256, '\xff');
  std::string other = longest;
  other.back() = '\xfe';
  const std::string key = ProfileKey(Request(), longest);
  EXPECT_LE(key.size() + std::string("profiles/").size(), 512u) << key;  // Store's kMaxKeyBytes
  EXPECT_NE(key, ProfileKey(Request(), other));
  EXPECT_EQ(key, ProfileKey(Request(), longest));
}

// Over its capacity the cache drops the least recently used profile (a
// Get counts as a use), and says which, for the store to drop too.
TEST(ProfileCacheTest, OverCapacity_EvictsTheLeastRecentlyUsed) {
  ProfileCache cache(2);
  v1::ModelProfile p;
  EXPECT_TRUE(cache.Put("a", p).empty());
  EXPECT_TRUE(cache.Put("b", p).empty());
  ASSERT_TRUE(cache.Get("a").has_value());  // "b" is now the oldest use
  EXPECT_EQ(cache.Put("c", p), std::vector<std::string>{"b"});
  EXPECT_EQ(cache.size(), 2);
  EXPECT_TRUE(cache.Get("a").has_value());
  EXPECT_FALSE(cache.Get("b").has_value());
  EXPECT_TRUE(cache.Put("c", p).empty());  // an update evicts nothing
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

// Measured transients are kept; those not measured (0: a device backend)
// take the model's sizes where given.
TEST(FromProtoTest, TransientBytes_UnmeasuredTakeTheModelsSizes) {
  v1::ModelProfile p;
  p.add_units()->set_transient_bytes(500);
  p.add_units();
  ModelProfile sizes;
  sizes.units.resize(2);
  sizes.units[0].transient_bytes = 900;
  sizes.units[1].transient_bytes = 700;
  const ModelProfile with_sizes = FromProto(p, &sizes);
  ASSERT_EQ(with_sizes.units.size(), 2u);
  EXPECT_EQ(with_sizes.units[0].transient_bytes, 500);
  EXPECT_EQ(with_sizes.units[1].transient_bytes, 700);
  const ModelProfile alone = FromProto(p);
  EXPECT_EQ(alone.units[0].transient_bytes, 500);
  EXPECT_EQ(alone.units[1].transient_bytes, 0);
}

// A worker's answer as CheckWorkerProfile wants it: the request's
// micro-batch size and partitions, one unit per name.
v1::ModelProfile GoodProfile(const v1::ProfileRequest& request,
                             const std::vector<std::string>& names) {
  v1::ModelProfile p;
  p.set_micro_batch_size(request.micro_batch_size());
  p.set_repetitions(5);
  for (const std::string& name : names) {
    v1::UnitProfile* u = p.add_units();
    u->set_name(name);
    u->set_fwd_seconds(1e-3);
    u->set_bwd_seconds(2e-3);
    u->set_weight_bytes(4096);
    u->set_activation_bytes(8192);
    for (int k : request.partitions()) {
      v1::PartitionTiming* t = u->add_partitions();
      t->set_count(k);
      t->set_fwd_seconds(1e-3 / k);
      t->set_bwd_seconds(2e-3 / k);
    }
  }
  v1::CodecTiming* c = p.add_codecs();
  c->set_codec("bf16");
  c->set_all_reduce_seconds_per_byte(1e-9);
  return p;
}

// Each way a worker's profile can be unfit to plan with is refused with the
// field named; the well-formed one passes.
TEST(CheckWorkerProfileTest, EachBadField_InvalidArgumentNamingIt) {
  v1::ProfileRequest request = Request();
  request.add_partitions(2);
  const std::vector<std::string> names = {"embed", "h.0.attn", "h.0.mlp", "head"};
  EXPECT_TRUE(CheckWorkerProfile(GoodProfile(request, names), request, names).ok());
  struct Case {
    const char* field;
    std::function<void(v1::ModelProfile&)> spoil;
  };
  const Case cases[] = {
      {"micro_batch_size", [](v1::ModelProfile& p) { p.set_micro_batch_size(8); }},
      {"units has 5 entries", [](v1::ModelProfile& p) { *p.add_units() = p.units(0); }},
      {"units has 3 entries", [](v1::ModelProfile& p) { p.mutable_units()->RemoveLast(); }},
      {"units[1].name", [](v1::ModelProfile& p) { p.mutable_units(1)->set_name("h.9.attn"); }},
      {"units[2].fwd_seconds",
       [](v1::ModelProfile& p) { p.mutable_units(2)->set_fwd_seconds(NAN); }},
      {"units[0].bwd_seconds",
       [](v1::ModelProfile& p) { p.mutable_units(0)->set_bwd_seconds(-1); }},
      {"units[3].optimizer_seconds",
       [](v1::ModelProfile& p) { p.mutable_units(3)->set_optimizer_seconds(INFINITY); }},
      {"units[0].weight_bytes",
       [](v1::ModelProfile& p) { p.mutable_units(0)->set_weight_bytes(1e16); }},
      {"units[1].stash_bytes",
       [](v1::ModelProfile& p) { p.mutable_units(1)->set_stash_bytes(-4); }},
      {"units[0].partitions has 0",
       [](v1::ModelProfile& p) { p.mutable_units(0)->clear_partitions(); }},
      {"units[1].partitions[0].count",
       [](v1::ModelProfile& p) { p.mutable_units(1)->mutable_partitions(0)->set_count(4); }},
      {"units[1].partitions[0].bwd_seconds",
       [](v1::ModelProfile& p) {
         p.mutable_units(1)->mutable_partitions(0)->set_bwd_seconds(NAN);
       }},
      {"codecs[1].codec", [](v1::ModelProfile& p) { *p.add_codecs() = p.codecs(0); }},
      {"codecs[0].codec \"zstd\" is not a codec the simulator reads",
       [](v1::ModelProfile& p) { p.mutable_codecs(0)->set_codec("zstd"); }},
      {"codecs[0].all_reduce_seconds_per_byte",
       [](v1::ModelProfile& p) { p.mutable_codecs(0)->set_all_reduce_seconds_per_byte(1); }},
      // A codec costed as free would make every stage's compression pay.
      {"codecs[0].all_reduce_seconds_per_byte is 0, under 1e-13",
       [](v1::ModelProfile& p) { p.mutable_codecs(0)->set_all_reduce_seconds_per_byte(0); }},
      {"repetitions", [](v1::ModelProfile& p) { p.set_repetitions(-1); }},
      {"device_kind", [](v1::ModelProfile& p) { p.set_device_kind(std::string(300, 'x')); }},
      // The store's number for the record, not the worker's to give.
      {"store_sequence is set", [](v1::ModelProfile& p) { p.set_store_sequence(7); }},
  };
  for (const Case& c : cases) {
    v1::ModelProfile p = GoodProfile(request, names);
    c.spoil(p);
    const absl::Status status = CheckWorkerProfile(p, request, names);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(status.message().find(c.field), std::string::npos) << status.message();
  }
}

// Held to the model's sizes: a worker cannot cache a profile whose weights,
// activations, stash or transient would make other users' plans of the
// model refuse (over twice) or overcommit (under half) memory. Times are the worker's to measure.
TEST(CheckWorkerProfileTest, SizesOtherThanTheModels_InvalidArgumentNamingThem) {
  v1::ProfileRequest request = Request();
  request.add_partitions(2);
  const std::vector<std::string> names = {"embed", "h.0.attn", "h.0.mlp", "head"};
  ModelProfile sizes;
  for (const std::string& name : names) {
    UnitProfile u;
    u.name = name;
    u.weight_bytes = 4096;
    u.activation_bytes = 8192;
    u.stash_bytes = 1000;
    u.transient_bytes = 3000;
    // 1e10 forward, 2e10 backward FLOPs (the times are FLOPs at 1 GFLOP/s).
    u.fwd_seconds = 1e10 / kModelSizesFlopsPerSecond;
    u.bwd_seconds = 2e10 / kModelSizesFlopsPerSecond;
    sizes.units.push_back(u);
  }
  sizes.units[0].fwd_seconds = 0;  // an embedding's lookup: no FLOPs counted
  v1::ModelProfile good = GoodProfile(request, names);
  for (auto& u : *good.mutable_units()) {  // within twice
    u.set_stash_bytes(1500);
    u.set_transient_bytes(6000);
  }
  EXPECT_TRUE(CheckWorkerProfile(good, request, names, &sizes).ok());
  struct Case {
    const char* field;
    std::function<void(v1::ModelProfile&)> spoil;
  };
  const Case cases[] = {
      {"units[3].weight_bytes is 1e+15, not the model's 4096",
       [](v1::ModelProfile& p) { p.mutable_units(3)->set_weight_bytes(1e15); }},
      {"units[0].activation_bytes is 8193",
       [](v1::ModelProfile& p) { p.mutable_units(0)->set_activation_bytes(8193); }},
      {"units[2].stash_bytes is 2001, over twice the model's 1000",
       [](v1::ModelProfile& p) { p.mutable_units(2)->set_stash_bytes(2001); }},
      {"units[1].transient_bytes is 6001, over twice the model's 3000",
       [](v1::ModelProfile& p) { p.mutable_units(1)->set_transient_bytes(6001); }},
      // Nor under half: other users' plans would take the memory for free.
      {"units[2].stash_bytes is 0, under half the model's 1000",
       [](v1::ModelProfile& p) { p.mutable_units(2)->set_stash_bytes(0); }},
      {"units[1].transient_bytes is 1, under half the model's 3000",
       [](v1::ModelProfile& p) { p.mutable_units(1)->set_transient_bytes(1); }},
      // 1e10 FLOPs in 1e-8 s is 1e18 FLOP/s; zero time, infinitely fast.
      {"units[1].fwd_seconds is 1e-08 s for 1e+10 FLOPs: faster than 1e+17 FLOP/s",
       [](v1::ModelProfile& p) { p.mutable_units(1)->set_fwd_seconds(1e-8); }},
      {"units[3].bwd_seconds is 0 s for 2e+10 FLOPs",
       [](v1::ModelProfile& p) { p.mutable_units(3)->set_bwd_seconds(0); }},
      // One of 2 partitions: half the unit's FLOPs, held to the same rate
      // (tensor-parallel plans cost the partitions by these).
      {"units[1].partitions[0].fwd_seconds is 1e-09 s for 5e+09 FLOPs: faster than 1e+17 FLOP/s",
       [](v1::ModelProfile& p) {
         p.mutable_units(1)->mutable_partitions(0)->set_fwd_seconds(1e-9);
       }},
      {"units[2].partitions[0].bwd_seconds is 0 s for 1e+10 FLOPs",
       [](v1::ModelProfile& p) { p.mutable_units(2)->mutable_partitions(0)->set_bwd_seconds(0); }},
  };
  // At the bound, and a unit without FLOPs at 0 s, pass; so do half the
  // model's sizes, and a transient not measured (0).
  v1::ModelProfile fastest = good;
  fastest.mutable_units(2)->set_stash_bytes(500);
  fastest.mutable_units(1)->set_transient_bytes(1500);
  fastest.mutable_units(3)->set_transient_bytes(0);
  fastest.mutable_units(1)->set_fwd_seconds(1e10 / kMaxProfileFlopsPerSecond);
  fastest.mutable_units(0)->set_fwd_seconds(0);
  fastest.mutable_units(1)->mutable_partitions(0)->set_fwd_seconds(5e9 / kMaxProfileFlopsPerSecond);
  fastest.mutable_units(0)->mutable_partitions(0)->set_fwd_seconds(0);
  EXPECT_TRUE(CheckWorkerProfile(fastest, request, names, &sizes).ok());
  for (const Case& c : cases) {
    v1::ModelProfile p = good;
    c.spoil(p);
    const absl::Status status = CheckWorkerProfile(p, request, names, &sizes);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(status.message().find(c.field), std::string::npos) << status.message();
  }
}

}  // namespace
}  // namespace pipetrain
