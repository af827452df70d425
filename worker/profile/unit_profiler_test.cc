#include "worker/profile/unit_profiler.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/tensor.h"
#include "coordinator/planner/profile.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/model/cpu_backend.h"
#include "worker/model/forwarding_backend.h"

namespace pipetrain {
namespace {

constexpr int kLayers = 2, kHeads = 2, kD = 16, kVocab = 32, kMaxSeq = 12;
constexpr int kSeq = 8, kBatch = 3;

v1::ProfileRequest SmallRequest() {
  v1::ProfileRequest request;
  v1::ModelSpec* model = request.mutable_model();
  model->set_n_layer(kLayers);
  model->set_n_head(kHeads);
  model->set_d_model(kD);
  model->set_vocab_size(kVocab);
  model->set_max_seq_len(kMaxSeq);
  request.set_seq_len(kSeq);
  request.set_micro_batch_size(kBatch);
  request.set_warmup(1);
  request.set_repetitions(3);
  request.set_seed(7);
  return request;
}

// The sizes every byte field must report, written out from the GPT-2 shapes
// (independent of the model code): {weight, activation, stash, peak}.
struct ExpectedBytes {
  double weight, activation, stash, peak;
};

std::vector<std::pair<std::string, ExpectedBytes>> Expected(int vocab, int max_seq) {
  const double d = kD, n = kBatch * kSeq, f = 4;                  // bytes per fp32 / int32
  const double x = n * d * f, tokens = n * f, stats = 2 * n * f;  // mean + rstd
  const double embed_w = (vocab + max_seq) * d * f;
  const double attn_w = (2 * d + d * 3 * d + 3 * d + d * d + d) * f;
  const double mlp_w = (2 * d + d * 4 * d + 4 * d + 4 * d * d + d) * f;
  const double head_w = (2 * d + vocab * d) * f;
  // Stash: x, ln_out, mean, rstd, then per kind qkv + probs + att | fc + gelu | probs.
  const double attn_stash = 2 * x + stats + 3 * x + kBatch * kHeads * kSeq * kSeq * f + x;
  const double mlp_stash = 2 * x + stats + 8 * x;
  const double head_stash = 2 * x + stats + n * vocab * f;
  // Peak: 4 weight copies + input + output + stash without x + dx.
  std::vector<std::pair<std::string, ExpectedBytes>> out;
  out.push_back({"embed", {embed_w, x, 0, 4 * embed_w + tokens + x}});
  for (int i = 0; i < kLayers; ++i) {
    const std::string layer = std::to_string(i);
    out.push_back({"attn_" + layer, {attn_w, x, attn_stash, 4 * attn_w + x + x + attn_stash}});
    out.push_back({"mlp_" + layer, {mlp_w, x, mlp_stash, 4 * mlp_w + x + x + mlp_stash}});
  }
  out.push_back({"head", {head_w, f, head_stash, 4 * head_w + x + tokens + f + head_stash}});
  return out;
}

void ExpectBytes(const v1::ModelProfile& profile,
                 const std::vector<std::pair<std::string, ExpectedBytes>>& expected) {
  ASSERT_EQ(profile.units_size(), static_cast<int>(expected.size()));
  for (int i = 0; i < profile.units_size(); ++i) {
    const v1::UnitProfile& u = profile.units(i);
    const ExpectedBytes& e = expected[i].second;
    SCOPED_TRACE(u.name());
    EXPECT_EQ(u.name(), expected[i].first);
    EXPECT_EQ(u.weight_bytes(), e.weight);
    EXPECT_EQ(u.activation_bytes(), e.activation);
    EXPECT_EQ(u.stash_bytes(), e.stash);
    EXPECT_EQ(u.peak_memory_bytes(), e.peak);
  }
}

TEST(ProfileUnitsTest, SmallModel_ReportsEveryUnitInPipelineOrder) {
  auto profile = ProfileUnits(SmallRequest());
  ASSERT_TRUE(profile.ok()) << profile.status();
  std::vector<std::string> names;
  for (const v1::UnitProfile& u : profile->units()) names.push_back(u.name());
  EXPECT_EQ(names,
            (std::vector<std::string>{"embed", "attn_0", "mlp_0", "attn_1", "mlp_1", "head"}));
  EXPECT_EQ(profile->micro_batch_size(), kBatch);
  EXPECT_EQ(profile->repetitions(), 3);
  EXPECT_EQ(profile->device_kind().rfind("cpu:", 0), 0u) << profile->device_kind();
  EXPECT_GT(profile->device_kind().size(), 4u);
}

TEST(ProfileUnitsTest, SmallModel_TimesArePositive) {
  auto profile = ProfileUnits(SmallRequest());
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->units_size(), 6);  // embed, 2 x (attn, mlp), head
  for (const v1::UnitProfile& u : profile->units()) {
    EXPECT_GT(u.fwd_seconds(), 0) << u.name();
    EXPECT_GT(u.bwd_seconds(), 0) << u.name();
    EXPECT_GT(u.optimizer_seconds(), 0) << u.name();  // every unit has parameters
  }
  // The data-parallel all-reduce through each quantizer, by its name.
  std::vector<std::string> codecs;
  for (const v1::CodecTiming& c : profile->codecs()) {
    codecs.push_back(c.codec());
    EXPECT_GT(c.all_reduce_seconds_per_byte(), 0) << c.codec();
    EXPECT_LT(c.all_reduce_seconds_per_byte(), 1e-6) << c.codec();  // 1 MB/s would be absurd
  }
  std::vector<std::string> profiled(std::begin(kProfiledQuantizers), std::end(kProfiledQuantizers));
  for (int rank : kProfiledPowerSgdRanks)
    profiled.push_back("powersgd:rank=" + std::to_string(rank));
  EXPECT_EQ(codecs, profiled);
}

TEST(ProfileUnitsTest, SmallModel_BytesMatchAnalyticSizes) {
  auto profile = ProfileUnits(SmallRequest());
  ASSERT_TRUE(profile.ok()) << profile.status();
  ExpectBytes(*profile, Expected(kVocab, kMaxSeq));
}

// transient_bytes, from what each unit's passes allocate beyond the stash
// (written out from the shapes, as Expected): the output; then attention's
// datt, dqkv, dln, dx and its [T, T] score scratch, the MLP's dact (4x),
// dln and dx, the head's dln and [n, vocab] logit gradient (dx comes after
// the logit gradient is freed); embed's backward allocates nothing.
TEST(ProfileUnitsTest, SmallModel_TransientBytesAreEachPassesPeakBeyondItsStash) {
  auto profile = ProfileUnits(SmallRequest());
  ASSERT_TRUE(profile.ok()) << profile.status();
  const double n = kBatch * kSeq, f = 4, x = n * kD * f;
  const std::vector<double> expected = {x,         x + 6 * x + kSeq * kSeq * f,
                                        x + 6 * x, x + 6 * x + kSeq * kSeq * f,
                                        x + 6 * x, f + x + n * kVocab * f};
  ASSERT_EQ(profile->units_size(), static_cast<int>(expected.size()));
  for (int i = 0; i < profile->units_size(); ++i) {
    EXPECT_EQ(profile->units(i).transient_bytes(), expected[i]) << profile->units(i).name();
  }
}

// The CPU backend, reading the host tensor counters' peak at every
// allocation and synchronization a unit makes through it: the most tensor
// memory held at once during a window, although MeasureTransientBytes
// resets the counters' peak partway through each unit.
class PeakSamplingCpu : public ForwardingBackend {
 public:
  PeakSamplingCpu() : ForwardingBackend(CpuBackend()) {}

  Tensor Zeros(const Shape& shape) override { return Sampled(inner()->Zeros(shape)); }
  Tensor Empty(const Shape& shape) override { return Sampled(inner()->Empty(shape)); }
  void Synchronize() override {
    inner()->Synchronize();
    Sample();
  }

  // Starts a window at the bytes live now.
  void StartWindow() {
    ResetHostTensorPeak();
    start_ = peak_ = CurrentHostTensorMemory().live_bytes;
  }
  // The most bytes held at once since StartWindow, above those live then.
  int64_t PeakAboveStart() const { return peak_ - start_; }

 private:
  Tensor Sampled(Tensor t) {
    Sample();
    return t;
  }
  void Sample() { peak_ = std::max(peak_, CurrentHostTensorMemory().peak_bytes); }

  int64_t start_ = 0, peak_ = 0;
};

// The coordinator checks that the worker that profiles a job has room for
// 4 x weight_bytes + stash_bytes + transient_bytes of a unit: the profiler
// must hold one micro-batch's stash at a time, not the previous timed
// pass's beside the next one's. Beyond that sum it holds the unit's output
// and output gradient (2 x activation_bytes). Long sequences make every
// stash larger than 2 x weight_bytes + activation_bytes, so that a second
// stash would break the bound.
TEST(ProfileUnitsTest, LongSequences_PeakHoldsOneStashAtATime) {
  constexpr int kLongSeq = 64;
  v1::ProfileRequest request = SmallRequest();
  request.mutable_model()->set_n_layer(1);
  request.mutable_model()->set_max_seq_len(kLongSeq);
  request.set_seq_len(kLongSeq);
  request.set_micro_batch_size(4);
  request.add_partitions(2);
  PeakSamplingCpu backend;
  std::vector<int64_t> peaks;  // per unit, above the bytes live as it starts
  auto profile = ProfileUnits(
      request,
      [&backend, &peaks](int index, const std::string&) {
        if (index > 0) peaks.push_back(backend.PeakAboveStart());
        backend.StartWindow();
        return absl::OkStatus();
      },
      &backend);
  ASSERT_TRUE(profile.ok()) << profile.status();
  peaks.push_back(backend.PeakAboveStart());
  ASSERT_EQ(peaks.size(), 4u);  // embed, attn_0, mlp_0, head
  for (int i = 0; i < profile->units_size(); ++i) {
    const v1::UnitProfile& u = profile->units(i);
    SCOPED_TRACE(u.name());
    const double bound =
        4 * u.weight_bytes() + u.stash_bytes() + u.transient_bytes() + 2 * u.activation_bytes();
    EXPECT_LE(static_cast<double>(peaks[i]), bound);
    if (u.name() == "attn_0" || u.name() == "mlp_0") {  // the bound would catch a second stash
      EXPECT_GT(u.stash_bytes() - u.activation_bytes(),
                2 * u.weight_bytes() + u.activation_bytes());
    }
  }
}

TEST(ProfileUnitsTest, UnsetVocabAndMaxSeqLen_UseDefaults) {
  v1::ProfileRequest request = SmallRequest();
  request.mutable_model()->clear_vocab_size();
  request.mutable_model()->clear_max_seq_len();
  auto profile = ProfileUnits(request);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ExpectBytes(*profile, Expected(256, kSeq));
}

TEST(ProfileUnitsTest, ZeroCounts_UseDocumentedDefaults) {
  v1::ProfileRequest request = SmallRequest();
  request.set_warmup(0);
  request.set_repetitions(0);
  auto profile = ProfileUnits(request);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->repetitions(), kDefaultProfileRepetitions);
  EXPECT_EQ(kDefaultProfileRepetitions, 5);
  EXPECT_EQ(kDefaultProfileWarmup, 2);
}

TEST(ProfileUnitsTest, RepeatedAndReseeded_ByteFieldsIdentical) {
  auto first = ProfileUnits(SmallRequest());
  auto second = ProfileUnits(SmallRequest());
  v1::ProfileRequest reseeded = SmallRequest();
  reseeded.set_seed(12345);
  auto third = ProfileUnits(reseeded);
  ASSERT_TRUE(first.ok() && second.ok() && third.ok());
  for (const v1::ModelProfile* other : {&*second, &*third}) {
    ASSERT_EQ(other->units_size(), first->units_size());
    for (int i = 0; i < first->units_size(); ++i) {
      const v1::UnitProfile &a = first->units(i), &b = other->units(i);
      SCOPED_TRACE(a.name());
      EXPECT_EQ(a.name(), b.name());
      EXPECT_EQ(a.weight_bytes(), b.weight_bytes());
      EXPECT_EQ(a.activation_bytes(), b.activation_bytes());
      EXPECT_EQ(a.stash_bytes(), b.stash_bytes());
      EXPECT_EQ(a.peak_memory_bytes(), b.peak_memory_bytes());
      EXPECT_EQ(a.transient_bytes(), b.transient_bytes());
    }
  }
}

TEST(ProfileUnitsTest, Progress_CalledOncePerUnitInOrder) {
  std::vector<std::pair<int, std::string>> calls;
  auto profile = ProfileUnits(SmallRequest(), [&calls](int index, const std::string& name) {
    calls.emplace_back(index, name);
    return absl::OkStatus();
  });
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(calls.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(calls[i].first, i);
    EXPECT_EQ(calls[i].second, profile->units(i).name());
  }
}

// An error from the progress callback (a worker shutting down) ends the
// profile before the next unit, with that error.
TEST(ProfileUnitsTest, ProgressError_EndsTheProfileBeforeTheNextUnit) {
  int calls = 0;
  auto profile = ProfileUnits(SmallRequest(), [&calls](int index, const std::string&) {
    ++calls;
    return index == 2 ? absl::CancelledError("shutting down") : absl::OkStatus();
  });
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(profile.status().message(), "shutting down");
  EXPECT_EQ(calls, 3);
}

// The stop check is asked before each pass within a unit: a caller gone
// (the coordinator's deadline) ends the profile within a pass, in the
// first unit here, not after the rest of it; once per pass of a unit that
// runs to its end.
TEST(ProfileUnitsTest, StopCheckError_EndsTheProfileWithinTheUnit) {
  v1::ProfileRequest request = SmallRequest();
  request.set_warmup(2);
  request.set_repetitions(3);
  int units = 0, checks = 0;
  auto profile = ProfileUnits(
      request,
      [&units](int, const std::string&) {
        ++units;
        return absl::OkStatus();
      },
      CpuBackend(),
      [&checks]() {
        return ++checks == 4 ? absl::CancelledError("the caller went away") : absl::OkStatus();
      });
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(profile.status().message(), "the caller went away");
  EXPECT_EQ(units, 1);  // the first unit's fourth check: before its second timed pass
  EXPECT_EQ(checks, 4);
  checks = 0;
  ASSERT_TRUE(ProfileUnits(request, nullptr, CpuBackend(), [&checks]() {
                ++checks;
                return absl::OkStatus();
              }).ok());
  // Per unit: 2 warm-up and 3 timed passes, the transient and the
  // optimizer's (partitions: none asked).
  EXPECT_EQ(checks, 6 * (2 + 3 + 2));
}

struct InvalidCase {
  const char* label;
  void (*mutate)(v1::ProfileRequest*);
  const char* message_start;  // the field the error must name
};

// AccTFM's Alg. 1 wants measured compute per partition size: every unit
// reports one timing per requested count, in order, each positive.
TEST(ProfileUnitsTest, Partitions_TimedPerCountForEveryUnit) {
  v1::ProfileRequest request = SmallRequest();
  request.set_micro_batch_size(4);
  request.add_partitions(4);
  request.add_partitions(2);
  auto profile = ProfileUnits(request);
  ASSERT_TRUE(profile.ok()) << profile.status();
  for (const v1::UnitProfile& unit : profile->units()) {
    ASSERT_EQ(unit.partitions_size(), 2) << unit.name();
    EXPECT_EQ(unit.partitions(0).count(), 4);
    EXPECT_EQ(unit.partitions(1).count(), 2);
    for (const v1::PartitionTiming& t : unit.partitions()) {
      EXPECT_GT(t.fwd_seconds(), 0) << unit.name();
      EXPECT_GT(t.bwd_seconds(), 0) << unit.name();
    }
  }
  // Without the request, no timings.
  EXPECT_EQ(ProfileUnits(SmallRequest())->units(0).partitions_size(), 0);
}

TEST(ProfileUnitsTest, InvalidRequest_InvalidArgumentNamingField) {
  const InvalidCase cases[] = {
      {"seq_len 0", [](v1::ProfileRequest* r) { r->set_seq_len(0); }, "request.seq_len: "},
      {"seq_len > max", [](v1::ProfileRequest* r) { r->set_seq_len(kMaxSeq + 1); },
       "request.seq_len: 13 must be <= request.model.max_seq_len 12"},
      {"micro_batch 0", [](v1::ProfileRequest* r) { r->set_micro_batch_size(0); },
       "request.micro_batch_size: must be >= 1, got 0"},
      {"warmup -1", [](v1::ProfileRequest* r) { r->set_warmup(-1); },
       "request.warmup: must be in [0, 1000], got -1"},
      {"warmup 1001", [](v1::ProfileRequest* r) { r->set_warmup(1001); },
       "request.warmup: must be in [0, 1000], got 1001"},
      {"repetitions -2", [](v1::ProfileRequest* r) { r->set_repetitions(-2); },
       "request.repetitions: must be in [1, 1000], got -2"},
      {"repetitions 1e9", [](v1::ProfileRequest* r) { r->set_repetitions(1000000000); },
       "request.repetitions: must be in [1, 1000], got 1000000000"},
      {"n_layer 0", [](v1::ProfileRequest* r) { r->mutable_model()->set_n_layer(0); },
       "request.model: n_layer must be >= 1"},
      {"n_head 3", [](v1::ProfileRequest* r) { r->mutable_model()->set_n_head(3); },
       "request.model: n_head (3) must divide d_model (16)"},
      {"vocab 0", [](v1::ProfileRequest* r) { r->mutable_model()->set_vocab_size(0); },
       "request.model: vocab_size must be >= 1"},
      {"huge micro-batch", [](v1::ProfileRequest* r) { r->set_micro_batch_size(1 << 28); },
       "request.micro_batch_size: 268435456 sequences of 8 tokens"},
      {"overflowing products",
       [](v1::ProfileRequest* r) {
         *r->mutable_model() = v1::ModelSpec();
         r->mutable_model()->set_n_layer(1);
         r->mutable_model()->set_n_head(1);
         r->mutable_model()->set_d_model(1);
         r->mutable_model()->set_vocab_size(2);
         r->set_seq_len(1 << 30);
         r->set_micro_batch_size(1 << 30);
       },
       "request.micro_batch_size: 1073741824 sequences of 1073741824 tokens"},
      {"too many layers",
       [](v1::ProfileRequest* r) {
         r->mutable_model()->set_n_layer(std::numeric_limits<int32_t>::max());
       },
       "request.model: n_layer 2147483647 exceeds 256"},
      {"more layers than a job may have",
       [](v1::ProfileRequest* r) { r->mutable_model()->set_n_layer(257); },
       "request.model: n_layer 257 exceeds 256, a job's spec.model.n_layer bound"},
      {"partitions 3", [](v1::ProfileRequest* r) { r->add_partitions(3); },
       "request.partitions: 3 is not 2 or 4"},
      {"partitions not dividing the micro-batch",
       [](v1::ProfileRequest* r) { r->add_partitions(2); },
       "request.partitions: 2 is not 2 or 4, does not divide micro_batch_size 3, or is repeated"},
      {"partitions repeated",
       [](v1::ProfileRequest* r) {
         r->set_micro_batch_size(4);
         r->add_partitions(2);
         r->add_partitions(2);
       },
       "request.partitions: 2 is not 2 or 4, does not divide micro_batch_size 4, or is repeated"},
      {"huge model",
       [](v1::ProfileRequest* r) {
         r->mutable_model()->set_d_model(1 << 16);
         r->mutable_model()->set_vocab_size(1 << 16);
       },
       "request.model: a parameter tensor"},
  };
  for (const InvalidCase& c : cases) {
    SCOPED_TRACE(c.label);
    v1::ProfileRequest request = SmallRequest();
    c.mutate(&request);
    int progress_calls = 0;
    auto profile = ProfileUnits(request, [&](int, const std::string&) {
      ++progress_calls;
      return absl::OkStatus();
    });
    ASSERT_FALSE(profile.ok());
    EXPECT_EQ(profile.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(profile.status().message()).rfind(c.message_start, 0), 0u)
        << profile.status();
    EXPECT_EQ(progress_calls, 0);
  }
}

// The profiler runs each unit whole, never one tensor rank's share, so a
// long context's attention scores are bounded as one device's: the message
// says so, and that a job split over tensor ranks plans on the analytic
// profile (the coordinator quotes it as the plan's profile source).
TEST(ProfileUnitsTest, WholeUnitTensorPastIntRange_SaysUnitsAreProfiledWhole) {
  v1::ProfileRequest request = SmallRequest();
  request.mutable_model()->set_max_seq_len(32768);
  request.set_seq_len(32768);
  request.set_micro_batch_size(1);  // 2 heads x 32768^2 scores = 2^31
  const absl::StatusOr<v1::ModelProfile> profile = ProfileUnits(request);
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(profile.status().message(),
            "request.micro_batch_size: 1 sequences of 32768 tokens need a tensor of 2147483648 "
            "elements (the attention scores), above 2^31 - 1, in a unit profiled whole (no "
            "tensor rank's share: a job split over tensor ranks is planned on the analytic "
            "profile); lower micro_batch_size or seq_len");
}

TEST(ProfileToFileJsonTest, Profile_WritesTheFileFormatKeysInDocumentedOrder) {
  auto profile = ProfileUnits(SmallRequest());
  ASSERT_TRUE(profile.ok()) << profile.status();
  const auto file = nlohmann::ordered_json::parse(ProfileToFileJson(*profile));
  std::vector<std::string> top, unit_keys;
  for (const auto& [key, value] : file.items()) top.push_back(key);
  EXPECT_EQ(top, (std::vector<std::string>{"micro_batch_size", "units", "codecs"}));
  ASSERT_EQ(file["codecs"].size(), 6u);
  EXPECT_EQ(file["codecs"][1]["codec"], "bf16");
  EXPECT_GT(file["codecs"][1]["all_reduce_seconds_per_byte"].get<double>(), 0);
  EXPECT_EQ(file["micro_batch_size"], kBatch);
  ASSERT_EQ(file["units"].size(), 6u);
  for (const auto& [key, value] : file["units"][0].items()) unit_keys.push_back(key);
  EXPECT_EQ(unit_keys, (std::vector<std::string>{"name", "fwd_seconds", "bwd_seconds",
                                                 "weight_bytes", "activation_bytes", "stash_bytes",
                                                 "transient_bytes", "optimizer_seconds"}));
  const auto& head = file["units"][5];
  EXPECT_EQ(head["name"], "head");
  ASSERT_TRUE(head["activation_bytes"].is_number_integer()) << head.dump();
  EXPECT_EQ(head["activation_bytes"].get<int64_t>(), 4);
  EXPECT_EQ(head["weight_bytes"].get<int64_t>(), (2 * kD + kVocab * kD) * 4);
}

TEST(ProfileToFileJsonTest, FractionalBytes_WrittenAsFloatingNumber) {
  v1::ModelProfile profile;
  profile.set_micro_batch_size(2);
  v1::UnitProfile* unit = profile.add_units();
  unit->set_name("embed");
  unit->set_weight_bytes(1.5);
  unit->set_fwd_seconds(0.25);
  const auto file = nlohmann::json::parse(ProfileToFileJson(profile));
  EXPECT_TRUE(file["units"][0]["weight_bytes"].is_number_float());
  EXPECT_EQ(file["units"][0]["weight_bytes"].get<double>(), 1.5);
  EXPECT_EQ(file["units"][0]["fwd_seconds"].get<double>(), 0.25);
  EXPECT_EQ(file["units"][0]["stash_bytes"].get<int64_t>(), 0);
  EXPECT_FALSE(file["units"][0].contains("optimizer_seconds"));  // not timed: left out
}

TEST(ProfileToFileJsonTest, Profile_ParsesWithThePlannerReader) {
  auto profile = ProfileUnits(SmallRequest());
  ASSERT_TRUE(profile.ok()) << profile.status();
  auto parsed = ParseProfileJson(ProfileToFileJson(*profile));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->micro_batch_size, kBatch);
  ASSERT_EQ(parsed->units.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    const v1::UnitProfile& u = profile->units(i);
    SCOPED_TRACE(u.name());
    EXPECT_EQ(parsed->units[i].name, u.name());
    EXPECT_EQ(parsed->units[i].fwd_seconds, u.fwd_seconds());
    EXPECT_EQ(parsed->units[i].bwd_seconds, u.bwd_seconds());
    EXPECT_EQ(parsed->units[i].weight_bytes, u.weight_bytes());
    EXPECT_EQ(parsed->units[i].activation_bytes, u.activation_bytes());
    EXPECT_EQ(parsed->units[i].stash_bytes, u.stash_bytes());
    EXPECT_EQ(parsed->units[i].transient_bytes, u.transient_bytes());
  }
}

// AccTFM's partition timings travel in the file too: without them the
// planner fell back to fwd_seconds / K, the measurement lost.
TEST(ProfileToFileJsonTest, PartitionTimings_ReadBackByThePlanner) {
  v1::ModelProfile profile;
  profile.set_micro_batch_size(4);
  v1::UnitProfile* unit = profile.add_units();
  unit->set_name("attn_0");
  unit->set_fwd_seconds(0.004);
  unit->set_bwd_seconds(0.008);
  v1::PartitionTiming* two = unit->add_partitions();
  two->set_count(2);
  two->set_fwd_seconds(0.0025);
  two->set_bwd_seconds(0.0045);
  auto parsed = ParseProfileJson(ProfileToFileJson(profile));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->units.size(), 1u);
  ASSERT_EQ(parsed->units[0].partition_seconds.count(2), 1u);
  EXPECT_EQ(parsed->units[0].partition_seconds.at(2).first, 0.0025);
  EXPECT_EQ(parsed->units[0].partition_seconds.at(2).second, 0.0045);
}

TEST(ProfileToFileJsonTest, InvalidUtf8Name_ReplacedNotThrown) {
  v1::ModelProfile profile;
  profile.set_micro_batch_size(1);
  profile.add_units()->set_name(std::string("bad\xff", 4));
  const nlohmann::json file = nlohmann::json::parse(ProfileToFileJson(profile));
  EXPECT_EQ(file["units"][0]["name"], "bad\xef\xbf\xbd");
}

}  // namespace
}  // namespace pipetrain
