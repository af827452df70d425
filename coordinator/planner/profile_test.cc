#include "coordinator/planner/profile.h"

#include "absl/strings/str_cat.h"
#include "coordinator/planner/bipartition.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace pipetrain {
namespace {

constexpr char kProfile[] = R"({"micro_batch_size": 4, "units": [
  {"name": "embed", "fwd_seconds": 0.0012, "bwd_seconds": 0.0025, "weight_bytes": 3145728,
   "activation_bytes": 131072, "stash_bytes": 262144, "transient_bytes": 524288},
  {"name": "head", "fwd_seconds": 0.002, "bwd_seconds": 0.004, "weight_bytes": 10,
   "activation_bytes": 4}]})";

TEST(ProfileTest, ParseProfile_ReadsTheDocumentedFormatAndRoundTrips) {
  ModelProfile p = ParseProfileJson(kProfile).value();
  EXPECT_EQ(p.micro_batch_size, 4);
  ASSERT_EQ(p.units.size(), 2u);
  EXPECT_EQ(p.units[0].name, "embed");
  EXPECT_EQ(p.units[0].stash_bytes, 262144);
  EXPECT_EQ(p.units[1].stash_bytes, 0);  // optional
  EXPECT_EQ(p.units[0].transient_bytes, 524288);
  EXPECT_EQ(p.units[1].transient_bytes, 0);  // optional
  ModelProfile again = ParseProfileJson(ProfileToJson(p)).value();
  EXPECT_EQ(again.units[0].transient_bytes, 524288);
  EXPECT_EQ(again.units[1].transient_bytes, 0);
  EXPECT_EQ(again.units[1].bwd_seconds, 0.004);
  EXPECT_TRUE(again.units[1].partition_seconds.empty());
  // AccTFM's measured partitions survive the round trip (a coordinator
  // keeps a job's profile as this JSON across restarts).
  p.units[1].partition_seconds[2] = {0.0011, 0.0021};
  p.units[1].partition_seconds[4] = {0.0006, 0.0012};
  again = ParseProfileJson(ProfileToJson(p)).value();
  EXPECT_EQ(again.units[1].partition_seconds, p.units[1].partition_seconds);
  // The timed optimizer step too (optional: 0 when absent).
  EXPECT_EQ(p.units[0].optimizer_seconds, 0);
  p.units[0].optimizer_seconds = 0.0007;
  again = ParseProfileJson(ProfileToJson(p)).value();
  EXPECT_EQ(again.units[0].optimizer_seconds, 0.0007);
  EXPECT_EQ(again.units[1].optimizer_seconds, 0);
  absl::StatusOr<ModelProfile> negative = ParseProfileJson(
      R"({"micro_batch_size": 1, "units": [{"name": "embed", "fwd_seconds": 1,
          "bwd_seconds": 1, "weight_bytes": 4, "activation_bytes": 4,
          "optimizer_seconds": -1}]})");
  EXPECT_EQ(negative.status().message(),
            "units[0].optimizer_seconds: must be a finite number >= 0");
}

// The quantized all-reduce's measured cost: round trip, bounds, and the
// lookup by quantizer (another width: its family's 8-bit entry).
TEST(ProfileTest, ParseProfile_CodecTimingsRoundTripAndAreBounded) {
  ModelProfile p = ParseProfileJson(kProfile).value();
  EXPECT_TRUE(p.codec_all_reduce_seconds_per_byte.empty());
  EXPECT_EQ(QuantizedAllReduceSecondsPerByte(p, "bf16"), 0);  // not measured
  p.codec_all_reduce_seconds_per_byte = {{"bf16", 1e-9}, {"piecewise:bits=8", 5e-9}};
  const ModelProfile again = ParseProfileJson(ProfileToJson(p)).value();
  EXPECT_EQ(again.codec_all_reduce_seconds_per_byte, p.codec_all_reduce_seconds_per_byte);
  EXPECT_EQ(QuantizedAllReduceSecondsPerByte(again, "bf16"), 1e-9);
  EXPECT_EQ(QuantizedAllReduceSecondsPerByte(again, "piecewise:bits=3"), 5e-9);
  EXPECT_EQ(QuantizedAllReduceSecondsPerByte(again, "linear:bits=8"), 0);
  // PowerSGD: the line through ranks 1 and 8.
  EXPECT_EQ(PowerSgdAllReduceSecondsPerByte(again, 4), 0);  // not measured
  p.codec_all_reduce_seconds_per_byte["powersgd:rank=1"] = 1e-9;
  p.codec_all_reduce_seconds_per_byte["powersgd:rank=8"] = 8e-9;
  EXPECT_DOUBLE_EQ(PowerSgdAllReduceSecondsPerByte(p, 4), 4e-9);
  EXPECT_DOUBLE_EQ(PowerSgdAllReduceSecondsPerByte(p, 15), 15e-9);
  // Rank 8 measured faster than rank 1: on their line between them, and
  // never below rank 8's past it (it fell to 0, "free", for large ranks).
  p.codec_all_reduce_seconds_per_byte["powersgd:rank=8"] = 0.3e-9;
  EXPECT_DOUBLE_EQ(PowerSgdAllReduceSecondsPerByte(p, 8), 0.3e-9);
  EXPECT_DOUBLE_EQ(PowerSgdAllReduceSecondsPerByte(p, 1), 1e-9);
  EXPECT_GT(PowerSgdAllReduceSecondsPerByte(p, 4), 0.3e-9);
  for (int rank : {9, 12, 64, 1024}) {
    EXPECT_DOUBLE_EQ(PowerSgdAllReduceSecondsPerByte(p, rank), 0.3e-9) << rank;
  }
  const std::string units =
      R"("units": [{"name": "embed", "fwd_seconds": 1, "bwd_seconds": 1, "weight_bytes": 4,
          "activation_bytes": 4}])";
  auto parse = [&](const std::string& codecs) -> std::string {
    return std::string(ParseProfileJson(absl::StrCat(R"({"micro_batch_size": 1, )", units,
                                                     R"(, "codecs": )", codecs, "}"))
                           .status()
                           .message());
  };
  EXPECT_EQ(parse(R"([{"codec": "bf16", "all_reduce_seconds_per_byte": -1}])"),
            "codecs[0].all_reduce_seconds_per_byte: must be a finite number >= 0");
  EXPECT_EQ(parse(R"([{"codec": "bf16", "all_reduce_seconds_per_byte": 0.5}])"),
            "codecs[0].all_reduce_seconds_per_byte: must be at most 1e-3");
  EXPECT_EQ(parse(R"([{"codec": "bf16", "all_reduce_seconds_per_byte": 0},
                      {"codec": "bf16", "all_reduce_seconds_per_byte": 0}])"),
            "codecs[1].codec: must be a name of 1 to 64 bytes, each at most once");
  EXPECT_EQ(parse(R"([{"codec": "bf16", "seconds": 0}])"), "codecs[0].seconds: unknown field");
  // Entries the simulator never reads are refused, not kept unused: another
  // codec, a quantizer not written as MakeQuantizer names it (the lookup is
  // by that string), a PowerSGD rank other than the line's two.
  const std::string allowed =
      " is not a codec the simulator reads: name a quantizer as the profiler writes it (fp16, "
      "bf16, linear:bits=8, piecewise:bits=8), or powersgd:rank=1 or powersgd:rank=8";
  EXPECT_EQ(parse(R"([{"codec": "zstd", "all_reduce_seconds_per_byte": 0}])"),
            "codecs[0].codec: \"zstd\"" + allowed);
  EXPECT_EQ(parse(R"([{"codec": "linear:bits=08", "all_reduce_seconds_per_byte": 0}])"),
            "codecs[0].codec: \"linear:bits=08\"" + allowed);
  EXPECT_EQ(parse(R"([{"codec": "powersgd:rank=4", "all_reduce_seconds_per_byte": 0}])"),
            "codecs[0].codec: \"powersgd:rank=4\"" + allowed);
  EXPECT_EQ(parse(R"([{"codec": "bf16", "all_reduce_seconds_per_byte": 0},
                      {"codec": "linear:bits=4", "all_reduce_seconds_per_byte": 0},
                      {"codec": "piecewise:bits=8", "all_reduce_seconds_per_byte": 0},
                      {"codec": "powersgd:rank=8", "all_reduce_seconds_per_byte": 0}])"),
            "");
  EXPECT_EQ(parse(R"({"codec": "bf16"})"), "codecs: must be a list of at most 16 entries");
}

TEST(ProfileTest, ParseCluster_DefaultsAndProblemConversion) {
  ClusterSpec c = ParseClusterJson(R"({"workers": [{"name": "a", "speed": 2},
      {"memory_bytes": 1024}], "bandwidth_bytes_per_second": 1.25e9})")
                      .value();
  ASSERT_EQ(c.workers.size(), 2u);
  EXPECT_EQ(c.workers[1].name, "w1");
  EXPECT_EQ(c.workers[1].speed, 1.0);
  EXPECT_EQ(c.latency_seconds, 0);
  BiPartitionProblem p = MakeBiPartitionProblem(ParseProfileJson(kProfile).value(), c);
  EXPECT_EQ(p.speeds, (std::vector<double>{2, 1}));
  EXPECT_EQ(p.activation_bytes, (std::vector<double>{131072, 4}));
  EXPECT_EQ(ParseClusterJson(ClusterToJson(c)).value().bandwidth_bytes_per_second, 1.25e9);
}

TEST(ProfileTest, MakeBiPartitionProblem_FillsMemoryAndLatencyFields) {
  const ClusterSpec c = ParseClusterJson(R"({"workers": [{"memory_bytes": 1e9},
      {"speed": 2}], "bandwidth_bytes_per_second": 1e8, "latency_seconds": 5e-5})")
                            .value();
  const BiPartitionProblem p = MakeBiPartitionProblem(ParseProfileJson(kProfile).value(), c);
  EXPECT_EQ(p.fwd, (std::vector<double>{0.0012, 0.002}));
  EXPECT_EQ(p.bwd, (std::vector<double>{0.0025, 0.004}));
  EXPECT_EQ(p.weight_bytes, (std::vector<double>{3145728, 10}));
  EXPECT_EQ(p.stash_bytes, (std::vector<double>{262144, 0}));
  EXPECT_EQ(p.transient_bytes, (std::vector<double>{524288, 0}));
  EXPECT_EQ(p.memory_bytes, (std::vector<double>{1e9, 0}));  // 0: unlimited
  EXPECT_EQ(p.bandwidth, 1e8);
  EXPECT_EQ(p.latency_seconds, 5e-5);
  // Left for the caller.
  EXPECT_EQ(p.micro_batches, 1);
  EXPECT_EQ(p.schedule, BiPartitionSchedule::kOneFOneB);
  EXPECT_EQ(p.objective, BiPartitionObjective::kPaper);
  EXPECT_TRUE(ValidateProblem(p).ok());
  // The profile's units fit: 2 workers solve it.
  BiPartitionProblem full = p;
  full.objective = BiPartitionObjective::kFull;
  full.micro_batches = 4;
  const BiPartitionPlan plan = SolveBiPartition(full).value();
  EXPECT_EQ(plan.bottleneck, FullObjective(full, plan));
}

// A shared file's unknown key is shown escaped (an escape sequence would
// act on the terminal that shows the error) and cut to 64 bytes.
TEST(ProfileTest, UnknownKey_ShownEscapedAndCut) {
  EXPECT_EQ(
      ParseProfileJson(R"({"micro_batch_size": 4, "\u001b]2;x\u0007": 1})").status().message(),
      "\\x1b]2;x\\x07: unknown field");
  const std::string long_key(1000, 'k');
  EXPECT_EQ(ParseProfileJson(absl::StrCat(R"({"micro_batch_size": 4, "units": [{"name": "x", ")",
                                          long_key, R"(": 1}]})"))
                .status()
                .message(),
            absl::StrCat("units[0].", long_key.substr(0, 64), "...: unknown field"));
}

// The first key ParseProfileJson refuses as unknown, at each level it
// reads (a newer build's profile, stored by its coordinator), named as its
// error names it; none in a profile it reads, nor in text that is no JSON.
TEST(ProfileTest, FirstUnknownProfileKey_NamesTheKeyTheParserRefuses) {
  EXPECT_EQ(FirstUnknownProfileKey(kProfile), "");
  ModelProfile full = ParseProfileJson(kProfile).value();
  full.units[1].partition_seconds[2] = {0.0011, 0.0021};
  full.codec_all_reduce_seconds_per_byte = {{"bf16", 1e-9}};
  EXPECT_EQ(FirstUnknownProfileKey(ProfileToJson(full)), "");
  EXPECT_EQ(FirstUnknownProfileKey("{"), "");
  EXPECT_EQ(FirstUnknownProfileKey(R"({"units": 3, "codecs": [1]})"), "");
  const std::string unit = R"({"name": "embed", "fwd_seconds": 1, "bwd_seconds": 1,
                              "weight_bytes": 4, "activation_bytes": 4)";
  const std::pair<std::string, std::string> cases[] = {
      {R"({"micro_batch_size": 1, "future_key": 1, "units": [)" + unit + "}]}", "future_key"},
      {R"({"micro_batch_size": 1, "units": [)" + unit + "}, " + unit + R"(, "future_key": 1}]})",
       "units[1].future_key"},
      {R"({"micro_batch_size": 1, "units": [)" + unit +
           R"(, "partitions": [{"count": 2, "fwd_seconds": 1, "bwd_seconds": 1, "x": 1}]}]})",
       "units[0].partitions[0].x"},
      {R"({"micro_batch_size": 1, "units": [)" + unit +
           R"(}], "codecs": [{"codec": "bf16", "all_reduce_seconds_per_byte": 0, "x": 1}]})",
       "codecs[0].x"},
      {R"({"micro_batch_size": 1, "units": [)" + unit + R"(, "\u001b]2;x\u0007": 1}]})",
       "units[0].\\x1b]2;x\\x07"},
  };
  for (const auto& [json, key] : cases) {
    EXPECT_EQ(FirstUnknownProfileKey(json), key) << json;
    EXPECT_EQ(ParseProfileJson(json).status().message(), key + ": unknown field") << json;
  }
}

TEST(ProfileTest, MalformedFiles_AreInvalidArgumentNamingTheField) {
  EXPECT_EQ(ParseProfileJson("{").status().message().rfind("not valid JSON: ", 0), 0u);
  const std::pair<const char*, const char*> cases[] = {
      // The last of two would win unseen.
      {R"({"micro_batch_size": 4, "micro_batch_size": 2, "units": [{}]})",
       "key \"micro_batch_size\" given twice in one object"},
      {R"({"units": []})", "micro_batch_size: missing"},
      {R"({"micro_batch_size": 4, "units": []})", "units: must be a non-empty list"},
      {R"({"micro_batch_size": 2.5, "units": [{}]})", "micro_batch_size: must be an integer"},
      // Found by fuzz/planner_json_fuzzer: converting this to int was undefined.
      {R"({"micro_batch_size": 4.4e119, "units": [{}]})", "micro_batch_size: must be at most 1e18"},
      {R"({"micro_batch_size": 4.4e17, "units": [{}]})",
       "micro_batch_size: 4.4e+17 is over the limit of 2147483647"},
      {R"({"micro_batch_size": 4, "unit": []})", "unit: unknown field"},
      {R"({"micro_batch_size": 4, "units": [{"name": "x", "fwd_seconds": -1, "bwd_seconds": 1,
          "weight_bytes": 0, "activation_bytes": 0}]})",
       "units[0].fwd_seconds: must be a finite number >= 0"},
      {R"({"micro_batch_size": 4, "units": [{"name": "x", "fwd_seconds": 1, "bwd_seconds": "1",
          "weight_bytes": 0, "activation_bytes": 0}]})",
       "units[0].bwd_seconds: must be a number"},
      {R"({"micro_batch_size": 4, "units": [{"name": "x", "fwd_seconds": 1, "bwd_seconds": 1,
          "weight_bytes": 0}]})",
       "units[0].activation_bytes: missing"},
      {R"({"micro_batch_size": 4, "units": [{"name": "x", "fwd_seconds": 1, "bwd_seconds": 1,
          "weight_bytes": 0, "activation_bytes": 0,
          "partitions": [{"count": 3, "fwd_seconds": 1, "bwd_seconds": 1}]}]})",
       "units[0].partitions[0].count: must be 2 or 4, each at most once"},
      {R"({"micro_batch_size": 4, "units": [{"name": "x", "fwd_seconds": 1, "bwd_seconds": 1,
          "weight_bytes": 0, "activation_bytes": 0,
          "partitions": [{"count": 2, "fwd_seconds": -1, "bwd_seconds": 1}]}]})",
       "units[0].partitions[0].fwd_seconds: must be a finite number >= 0"},
  };
  for (const auto& [json, message] : cases) {
    auto p = ParseProfileJson(json);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_EQ(p.status().message(), message) << json;
  }
  EXPECT_EQ(ParseClusterJson(R"({"workers": [{"speed": 0}]})").status().message(),
            "workers[0].speed: must be a finite number > 0");
  EXPECT_EQ(ParseClusterJson(R"({"workers": []})").status().message(),
            "workers: must be a non-empty list");
  EXPECT_EQ(ParseClusterJson(R"({"workers": [{"name": "x"}], "workers": [{"name": "y"}]})")
                .status()
                .message(),
            "key \"workers\" given twice in one object");
  EXPECT_EQ(ParseClusterJson(R"({"workers": [{"cores": 8}]})").status().message(),
            "workers[0].cores: unknown field");
  EXPECT_EQ(ParseClusterJson(R"({"workers": [{}], "links_emulated": 1})").status().message(),
            "links_emulated: must be true or false");
  EXPECT_EQ(
      ParseClusterJson(R"({"workers": [{}], "data_plane_overhead_seconds": 2})").status().message(),
      "data_plane_overhead_seconds: must be at most 1");
  EXPECT_EQ(ParseClusterJson(R"({"workers": [{}], "data_plane_bytes_per_second": -1})")
                .status()
                .message(),
            "data_plane_bytes_per_second: must be a finite number >= 0");
  // Registration's lower bound too: a near-zero rate is no measurement.
  for (const char* rate : {"1e-300", "0.5", "999"}) {
    EXPECT_EQ(ParseClusterJson(absl::StrCat(R"({"workers": [{}], "data_plane_overhead_seconds": )",
                                            R"(1e-4, "data_plane_bytes_per_second": )", rate, "}"))
                  .status()
                  .message(),
              "data_plane_bytes_per_second: must be 0 (not modelled) or at least 1e3")
        << rate;
  }
}

// Bounds that keep the solvers' sums finite and the tables unambiguous.
TEST(ProfileTest, OutOfBoundNumbersCountsAndNames_AreRefusedNamingTheField) {
  EXPECT_EQ(ParseProfileJson(R"({"micro_batch_size": 4, "units": [{"name": "x",
      "fwd_seconds": 1e308, "bwd_seconds": 1, "weight_bytes": 0, "activation_bytes": 0}]})")
                .status()
                .message(),
            "units[0].fwd_seconds: must be at most 1e18");
  std::string many = R"({"micro_batch_size": 1, "units": [)";
  for (int u = 0; u <= kMaxProfileUnits; ++u) {
    many += absl::StrCat(u > 0 ? "," : "", R"({"name": "u", "fwd_seconds": 1, "bwd_seconds": 1,
        "weight_bytes": 0, "activation_bytes": 0})");
  }
  many += "]}";
  EXPECT_EQ(ParseProfileJson(many).status().message(),
            "units: holds 515 units; at most 514 (a model of 256 layers, spec.model.n_layer's "
            "bound)");
  // Unit names are printed in plans: bounded, printable, distinct.
  const auto unit_named = [](const std::string& first, const std::string& second) {
    return absl::StrCat(R"({"micro_batch_size": 1, "units": [{"name": )", first,
                        R"(, "fwd_seconds": 1, "bwd_seconds": 1, "weight_bytes": 0,
        "activation_bytes": 0}, {"name": )",
                        second, R"(, "fwd_seconds": 1, "bwd_seconds": 1, "weight_bytes": 0,
        "activation_bytes": 0}]})");
  };
  const std::string unit_name_rule =
      "must be a string of 1 to 128 bytes without control characters";
  EXPECT_EQ(ParseProfileJson(unit_named(R"("a")", R"("\u001b[31mred")")).status().message(),
            "units[1].name: " + unit_name_rule);
  EXPECT_EQ(ParseProfileJson(unit_named(R"("")", R"("b")")).status().message(),
            "units[0].name: " + unit_name_rule);
  // C1 controls (U+009B: CSI on xterm) and bidirectional overrides act on a
  // terminal too.
  EXPECT_EQ(ParseProfileJson(unit_named(R"("a")", R"("\u009b2J")")).status().message(),
            "units[1].name: " + unit_name_rule);
  EXPECT_EQ(ParseProfileJson(unit_named(R"("a")", R"("exe.\u202ejpg")")).status().message(),
            "units[1].name: " + unit_name_rule);
  EXPECT_EQ(ParseProfileJson(unit_named(R"("a")", "\"" + std::string(129, 'x') + "\""))
                .status()
                .message(),
            "units[1].name: " + unit_name_rule);
  EXPECT_EQ(ParseProfileJson(unit_named(R"("attn_0")", R"("attn_0")")).status().message(),
            "units[1].name: \"attn_0\" names two units");
  EXPECT_TRUE(ParseProfileJson(unit_named(R"("a")", "\"" + std::string(128, 'x') + "\"")).ok());
  std::string workers = R"({"workers": [)";
  for (int w = 0; w <= kMaxStages; ++w) workers += w > 0 ? ",{}" : "{}";
  workers += "]}";
  EXPECT_EQ(ParseClusterJson(workers).status().message(),
            "workers: holds 1025 workers; at most 1024 (a job's bound)");
  const std::pair<const char*, const char*> clusters[] = {
      {R"({"workers": [{"speed": 1e-300}]})", "workers[0].speed: must be in [1e-6, 1e6]"},
      {R"({"workers": [{}], "bandwidth_bytes_per_second": 1e-300})",
       "bandwidth_bytes_per_second: must be 0 (unlimited) or at least 1"},
      {R"({"workers": [{"name": 5}]})",
       "workers[0].name: must be a string of 1 to 253 bytes without control characters"},
      {R"({"workers": [{"name": ""}]})",
       "workers[0].name: must be a string of 1 to 253 bytes without control characters"},
      {R"({"workers": [{"name": "a\u001b[31m"}]})",
       "workers[0].name: must be a string of 1 to 253 bytes without control characters"},
      {R"({"workers": [{"memory_bytes": 1.5}]})",
       "workers[0].memory_bytes: must be a whole number of bytes"},
      {R"({"workers": [{"host": "n1", "host_cores": 8}, {"host": "n1", "host_cores": 64}]})",
       "workers[1].host_cores: 64 for host \"n1\", which workers[0] gives 8 cores; a host has "
       "one count"},
      {R"({"workers": [{"name": "a"}, {"name": "a"}]})",
       "workers[1].name: \"a\" names two workers"},
      {R"({"workers": [{}], "data_plane_overhead_seconds": 0.5})",
       "data_plane_bytes_per_second: the data plane's cost needs both "
       "data_plane_overhead_seconds and data_plane_bytes_per_second (or neither)"},
  };
  for (const auto& [json, message] : clusters) {
    EXPECT_EQ(ParseClusterJson(json).status().message(), message) << json;
  }
}

TEST(ProfileTest, ParseCluster_HostsRoundTripAndAreBounded) {
  ClusterSpec c = ParseClusterJson(R"({"workers": [
      {"name": "a", "host": "vm", "host_cores": 2, "compute_threads": 1},
      {"name": "b", "gpu": true}]})")
                      .value();
  EXPECT_EQ(c.workers[0].host, "vm");
  EXPECT_EQ(c.workers[0].host_cores, 2);
  EXPECT_EQ(c.workers[0].compute_threads, 1);
  EXPECT_EQ(c.workers[1].host, "");  // not known: no sharing modelled
  EXPECT_EQ(c.workers[1].host_cores, 0);
  const ClusterSpec again = ParseClusterJson(ClusterToJson(c)).value();
  EXPECT_EQ(again.workers[0].host, "vm");
  EXPECT_EQ(again.workers[0].host_cores, 2);
  EXPECT_EQ(again.workers[0].compute_threads, 1);
  EXPECT_FALSE(again.workers[0].gpu);
  EXPECT_TRUE(again.workers[1].gpu);
  EXPECT_EQ(ParseClusterJson(R"({"workers": [{"gpu": 1}]})").status().message(),
            "workers[0].gpu: must be true or false");
  EXPECT_EQ(ParseClusterJson(R"({"workers": [{"host_cores": 1.5}]})").status().message(),
            "workers[0].host_cores: must be a whole number in [0, 65536]");
  EXPECT_EQ(ParseClusterJson(R"({"workers": [{"compute_threads": 70000}]})").status().message(),
            "workers[0].compute_threads: must be a whole number in [0, 65536]");
  EXPECT_EQ(ParseClusterJson(R"({"workers": [{"host": 3}]})").status().message(),
            "workers[0].host: must be a string of at most 253 bytes");
}

TEST(ProfileTest, ParseCluster_DataPlaneCostRoundTrips) {
  const ClusterSpec c = ParseClusterJson(R"({"workers": [{}], "links_emulated": true,
      "bandwidth_bytes_per_second": 1.25e8, "data_plane_overhead_seconds": 1.3e-4,
      "data_plane_bytes_per_second": 1.3e9})")
                            .value();
  EXPECT_TRUE(c.links_emulated);
  EXPECT_EQ(c.data_plane_overhead_seconds, 1.3e-4);
  EXPECT_EQ(c.data_plane_bytes_per_second, 1.3e9);
  const ClusterSpec again = ParseClusterJson(ClusterToJson(c)).value();
  EXPECT_TRUE(again.links_emulated);
  EXPECT_EQ(again.data_plane_overhead_seconds, 1.3e-4);
  EXPECT_EQ(again.data_plane_bytes_per_second, 1.3e9);
  // Absent: not emulated, not measured.
  const ClusterSpec plain = ParseClusterJson(R"({"workers": [{}]})").value();
  EXPECT_FALSE(plain.links_emulated);
  EXPECT_EQ(plain.data_plane_overhead_seconds, 0);
  EXPECT_EQ(ClusterToJson(plain).find("data_plane"), std::string::npos);
}

// A worker naming a host without its cores takes the count the host's
// other workers give (its threads then count against the host).
TEST(ParseClusterJsonTest, HostCoresGivenOnce_TakenByTheHostsOtherWorkers) {
  absl::StatusOr<ClusterSpec> cluster = ParseClusterJson(
      R"({"workers": [{"host": "n1", "compute_threads": 4}, {"host": "n1", "host_cores": 8},
                      {"host": "n2"}]})");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ(cluster->workers[0].host_cores, 8);
  EXPECT_EQ(cluster->workers[1].host_cores, 8);
  EXPECT_EQ(cluster->workers[2].host_cores, 0);  // no count known for n2
}

}  // namespace
}  // namespace pipetrain
