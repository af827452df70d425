#include "worker/checkpoint/unit_checkpoint.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/secrets.h"
#include "common/tensor.h"
#include "common/testing/in_child.h"
#include "gtest/gtest.h"
#include "worker/checkpoint/checkpoint_writer.h"

namespace pipetrain {
namespace {

GptConfig TinyModel() { return GptConfig{32, 8, 1, 2, 8}; }

// Unit `u` of TinyModel with distinct values; moments when `moments`.
UnitState MakeUnit(int u, float base, bool moments) {
  UnitState state;
  state.unit = u;
  float x = base;
  for (const ParameterShape& p : UnitParameterShapes(TinyModel(), u)) {
    Tensor t = Tensor::Zeros(Shape(p.shape.begin(), p.shape.end()));
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = x += 0.25f;
    state.values.push_back({p.name, t});
    if (moments) {
      state.m.push_back({p.name, Tensor::Filled(t.shape(), base + 1)});
      state.v.push_back({p.name, Tensor::Filled(t.shape(), base + 2)});
    }
  }
  return state;
}

class UnitCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/ckpt-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    mkdir(root_.c_str(), 0700);
    id_ = {"job-t-1", TinyModel(), 7};
  }
  // Writes `units` at step 5 under `dir` and returns the checkpoint as the
  // coordinator would record it.
  v1::ResumeFrom Write(const std::vector<UnitState>& units, const std::string& dir) {
    absl::StatusOr<std::vector<v1::UnitFile>> files =
        WriteStageCheckpoint(root_, dir, StageSnapshot{5, 5, units}, id_);
    EXPECT_TRUE(files.ok()) << files.status();
    v1::ResumeFrom from;
    from.set_step(5);
    from.set_dir(absl::StrCat(dir, "/", StepDirName(5)));
    if (files.ok()) {
      for (const v1::UnitFile& f : *files) *from.add_units() = f;
    }
    return from;
  }
  // Writes the one unit `state` (unit 1) under `dir`, then expects reading
  // it back to be DATA_LOSS naming `expected` and the file.
  void ExpectRefused(const UnitState& state, const std::string& dir, const std::string& expected) {
    const v1::ResumeFrom from = Write({state}, dir);
    ASSERT_EQ(from.units_size(), 1);
    absl::StatusOr<UnitState> read =
        ReadUnitCheckpoint(root_, from, from.units(0), id_, true, nullptr);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
    EXPECT_NE(read.status().message().find(expected), std::string::npos) << read.status();
    EXPECT_NE(read.status().message().find("unit-0001"), std::string::npos) << read.status();
  }
  // Units 0..3 (the whole tiny model), as Write.
  v1::ResumeFrom WriteAll() {
    std::vector<UnitState> units;
    for (int u = 0; u < NumUnits(TinyModel()); ++u) units.push_back(MakeUnit(u, u, true));
    return Write(units, "ck/job-t-1");
  }
  std::string PathOf(const v1::ResumeFrom& from, int unit) {
    return absl::StrCat(root_, "/", from.dir(), "/", from.units(unit).file());
  }
  std::string root_;
  CheckpointIdentity id_;
};

TEST_F(UnitCheckpointTest, RoundTripsValuesMomentsAndSteps) {
  const v1::ResumeFrom from = WriteAll();
  ASSERT_EQ(from.units_size(), 4);
  EXPECT_EQ(from.units(2).file(), "unit-0002.safetensors");
  EXPECT_EQ(from.units(2).sha256().size(), 64u);
  for (int u = 0; u < 4; ++u) {
    int64_t steps = -1;
    absl::StatusOr<UnitState> read =
        ReadUnitCheckpoint(root_, from, from.units(u), id_, /*with_moments=*/true, &steps);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(steps, 5);
    const UnitState want = MakeUnit(u, u, true);
    ASSERT_EQ(read->values.size(), want.values.size());
    for (size_t i = 0; i < want.values.size(); ++i) {
      EXPECT_EQ(read->values[i].name, want.values[i].name);
      EXPECT_EQ(read->values[i].tensor.ToVector(), want.values[i].tensor.ToVector());
      EXPECT_EQ(read->m[i].tensor.ToVector(), want.m[i].tensor.ToVector());
      EXPECT_EQ(read->v[i].tensor.ToVector(), want.v[i].tensor.ToVector());
    }
  }
  // Files are private to the operator.
  struct stat st;
  ASSERT_EQ(stat(PathOf(from, 0).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
}

// Unit 1 (attention) of TinyModel with error feedback of `replicas`
// replicas on its two matrices and PowerSGD's warm start of c_attn's.
UnitState WithFeedback(int replicas) {
  UnitState state = MakeUnit(1, 1, true);
  state.feedback.resize(static_cast<size_t>(replicas));
  for (int r = 0; r < replicas; ++r) {
    for (const NamedTensor& v : state.values) {
      if (v.tensor.shape().size() != 2) continue;
      state.feedback[static_cast<size_t>(r)].push_back(
          {v.name, Tensor::Filled(v.tensor.shape(), 0.5f + static_cast<float>(r))});
    }
  }
  state.warm_q.push_back({"h.0.attn.c_attn.weight", Tensor::Filled({24, 2}, 3.0f)});
  // c_proj split by rows over 2 ranks: each rank's Q has all 8 columns.
  state.warm_q_ranks.push_back({"h.0.attn.c_proj.weight", Tensor::Filled({2, 8, 2}, 4.0f)});
  return state;
}

TEST_F(UnitCheckpointTest, RoundTripsEveryReplicasErrorFeedbackAndWarmStarts) {
  const UnitState want = WithFeedback(3);
  ASSERT_EQ(want.feedback[0].size(), 2u);  // c_attn and c_proj
  const v1::ResumeFrom from = Write({want}, "fb");
  ASSERT_EQ(from.units_size(), 1);
  absl::StatusOr<UnitState> read =
      ReadUnitCheckpoint(root_, from, from.units(0), id_, true, nullptr);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->feedback.size(), 3u);
  for (size_t r = 0; r < 3; ++r) {
    ASSERT_EQ(read->feedback[r].size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(read->feedback[r][i].name, want.feedback[r][i].name);
      EXPECT_EQ(read->feedback[r][i].tensor.ToVector(), want.feedback[r][i].tensor.ToVector());
    }
  }
  ASSERT_EQ(read->warm_q.size(), 1u);
  EXPECT_EQ(read->warm_q[0].tensor.ToVector(), want.warm_q[0].tensor.ToVector());
  ASSERT_EQ(read->warm_q_ranks.size(), 1u);
  EXPECT_EQ(read->warm_q_ranks[0].tensor.shape(), (Shape{2, 8, 2}));
  EXPECT_EQ(read->warm_q_ranks[0].tensor.ToVector(), want.warm_q_ranks[0].tensor.ToVector());
  // Loading weights only (a forward unit) leaves the feedback out.
  read = ReadUnitCheckpoint(root_, from, from.units(0), id_, /*with_moments=*/false, nullptr);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->feedback.empty());
  EXPECT_TRUE(read->warm_q.empty());
  EXPECT_TRUE(read->warm_q_ranks.empty());
}

// A replica's residual missing, too many replicas, a warm start of another
// shape (whole or per rank): DATA_LOSS naming the file and the tensor.
TEST_F(UnitCheckpointTest, InconsistentErrorFeedback_IsDataLoss) {
  struct Case {
    std::string what;
    UnitState state;
    std::string expected;
  };
  std::vector<Case> cases;
  UnitState missing = WithFeedback(2);
  missing.feedback[1].pop_back();
  cases.push_back({"missing", missing, "feedback.1.h.0.attn.c_proj.weight is missing"});
  UnitState missing_first = WithFeedback(2);  // replica 1's alone: not skipped as none
  missing_first.feedback[0].pop_back();
  cases.push_back({"missing first", missing_first, "feedback.0.h.0.attn.c_proj.weight is missing"});
  UnitState too_many = MakeUnit(1, 1, true);
  too_many.feedback.resize(kMaxFeedbackReplicas + 1);
  cases.push_back({"too many", too_many, "bad feedback_replicas \"1025\""});
  UnitState bad_q = WithFeedback(1);
  bad_q.warm_q[0].tensor = Tensor::Filled({8, 2}, 1.0f);
  cases.push_back({"bad q", bad_q, "powersgd.q.h.0.attn.c_attn.weight is [8, 2]"});
  UnitState bad_ranks = WithFeedback(1);
  bad_ranks.warm_q_ranks[0].tensor = Tensor::Filled({2, 9, 2}, 1.0f);  // rows > its 8 columns
  cases.push_back(
      {"bad ranks q", bad_ranks, "powersgd.q.ranks.h.0.attn.c_proj.weight is [2, 9, 2]"});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ExpectRefused(c.state, "bad-" + std::to_string(&c - cases.data()), c.expected);
  }
}

// Bytes of the tensors of `list`.
int64_t BytesOf(const std::vector<NamedTensor>& list) {
  int64_t bytes = 0;
  for (const NamedTensor& t : list) bytes += t.tensor.size_bytes();
  return bytes;
}

// The host tensor bytes `read` allocated at its peak beyond those live
// before it.
int64_t PeakBytesOf(const std::function<void()>& read) {
  const int64_t live = CurrentHostTensorMemory().live_bytes;
  ResetHostTensorPeak();
  read();
  return CurrentHostTensorMemory().peak_bytes - live;
}

// A forward-only unit (no moments) of a file with 8 replicas' residuals
// decodes its weights alone: every tensor decoded (moments, residuals and
// warm starts) held about 10x the weights until Restore, where the plan
// budgets the weights.
TEST_F(UnitCheckpointTest, WithoutMoments_DecodesTheWeightsAlone) {
  const v1::ResumeFrom from = Write({WithFeedback(8)}, "fb8");
  ASSERT_EQ(from.units_size(), 1);
  const int64_t weights = BytesOf(MakeUnit(1, 1, true).values);
  absl::StatusOr<UnitState> read = absl::UnknownError("not read");
  const int64_t peak = PeakBytesOf([&] {
    read = ReadUnitCheckpoint(root_, from, from.units(0), id_, /*with_moments=*/false, nullptr);
  });
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(BytesOf(read->values), weights);
  EXPECT_TRUE(read->m.empty());
  EXPECT_TRUE(read->v.empty());
  EXPECT_TRUE(read->feedback.empty());
  EXPECT_TRUE(read->warm_q.empty());
  EXPECT_TRUE(read->warm_q_ranks.empty());
  EXPECT_LT(peak, weights * 5 / 2) << "weights " << weights;
}

// Replica 1 of 4 resumed from 8 replicas decodes the residuals of old
// replicas 1 and 5 alone (those Restore folds into it: r mod 4 == 1); the
// others' entries stay empty, so the peak is the weights, their moments,
// two residuals and the warm starts.
TEST_F(UnitCheckpointTest, ReplicaOfFewer_DecodesOnlyTheResidualsItFolds) {
  const UnitState want = WithFeedback(8);
  const v1::ResumeFrom from = Write({want}, "fb8");
  ASSERT_EQ(from.units_size(), 1);
  absl::StatusOr<UnitState> read = absl::UnknownError("not read");
  const int64_t peak = PeakBytesOf([&] {
    read = ReadUnitCheckpoint(root_, from, from.units(0), id_, /*with_moments=*/true, nullptr,
                              /*replica=*/1, /*replicas=*/4);
  });
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->feedback.size(), 8u);
  for (size_t r = 0; r < 8; ++r) {
    SCOPED_TRACE(r);
    if (r != 1 && r != 5) {
      EXPECT_TRUE(read->feedback[r].empty());
      continue;
    }
    ASSERT_EQ(read->feedback[r].size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(read->feedback[r][i].name, want.feedback[r][i].name);
      EXPECT_EQ(read->feedback[r][i].tensor.ToVector(), want.feedback[r][i].tensor.ToVector());
    }
  }
  EXPECT_EQ(read->m.size(), want.values.size());
  EXPECT_EQ(read->v.size(), want.values.size());
  EXPECT_EQ(read->warm_q.size(), 1u);
  EXPECT_EQ(read->warm_q_ranks.size(), 1u);
  const int64_t decoded = 3 * BytesOf(want.values) + 2 * BytesOf(want.feedback[0]) +
                          BytesOf(want.warm_q) + BytesOf(want.warm_q_ranks);
  EXPECT_LE(peak, decoded);
}

// A residual of a replica this one does not fold is not decoded, but its
// absence is still DATA_LOSS: every replica's residual of a parameter, or
// none.
TEST_F(UnitCheckpointTest, UnfoldedReplicasResidualMissing_IsDataLoss) {
  UnitState state = WithFeedback(8);
  state.feedback[2].pop_back();  // c_proj's of old replica 2
  const v1::ResumeFrom from = Write({state}, "fb8-missing");
  ASSERT_EQ(from.units_size(), 1);
  absl::StatusOr<UnitState> read =
      ReadUnitCheckpoint(root_, from, from.units(0), id_, true, nullptr, /*replica=*/1, 4);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_NE(read.status().message().find("feedback.2.h.0.attn.c_proj.weight is missing"),
            std::string::npos)
      << read.status();
}

// Unit 1 with two replicas' warm starts of two pipeline links (PowerSGD
// of rank 2 on [.., d_model 8] tensors): kind 1 (ACTIVATION) of unit 1 to
// stage 1 and kind 2 (ACTIVATION_GRAD) of unit 1 to stage 0.
UnitState WithLinks() {
  UnitState state = MakeUnit(1, 1, true);
  for (int r = 0; r < 2; ++r) {
    state.link_warm_q.push_back({r, 1, 1, 1, Tensor::Filled({8, 2}, 1.0f + r)});
    state.link_warm_q.push_back({r, 0, 2, 1, Tensor::Filled({8, 2}, 3.0f + r)});
  }
  return state;
}

TEST_F(UnitCheckpointTest, RoundTripsEveryReplicasLinkWarmStarts) {
  const UnitState want = WithLinks();
  const v1::ResumeFrom from = Write({want}, "links");
  ASSERT_EQ(from.units_size(), 1);
  absl::StatusOr<UnitState> read =
      ReadUnitCheckpoint(root_, from, from.units(0), id_, true, nullptr);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->link_warm_q.size(), 4u);
  for (const LinkWarmStart& w : want.link_warm_q) {
    bool found = false;
    for (const LinkWarmStart& r : read->link_warm_q) {
      if (r.replica != w.replica || r.peer != w.peer || r.kind != w.kind || r.unit != w.unit) {
        continue;
      }
      found = true;
      EXPECT_EQ(r.q.shape(), w.q.shape());
      EXPECT_EQ(r.q.ToVector(), w.q.ToVector());
    }
    EXPECT_TRUE(found) << "replica " << w.replica << " peer " << w.peer << " kind " << w.kind;
  }
  // Loading weights only (a forward unit) leaves them out.
  read = ReadUnitCheckpoint(root_, from, from.units(0), id_, /*with_moments=*/false, nullptr);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->link_warm_q.empty());
}

// A link warm start wider than d_model, of a unit the model lacks, a peer
// or replica out of bounds: DATA_LOSS naming the file and the tensor.
TEST_F(UnitCheckpointTest, LinkWarmStartOutOfBounds_IsDataLoss) {
  struct Case {
    std::string what;
    LinkWarmStart link;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"wide", {0, 1, 1, 1, Tensor::Filled({9, 2}, 1.0f)}, "link.q.0.1.1.1 [9, 2]"},
      {"one-dimensional", {0, 1, 1, 1, Tensor::Filled({8}, 1.0f)}, "link.q.0.1.1.1 [8]"},
      {"unit", {0, 1, 1, 4, Tensor::Filled({8, 2}, 1.0f)}, "link.q.0.1.1.4"},
      {"peer", {0, 1024, 1, 1, Tensor::Filled({8, 2}, 1.0f)}, "link.q.0.1024.1.1"},
      {"replica",
       {kMaxFeedbackReplicas, 1, 1, 1, Tensor::Filled({8, 2}, 1.0f)},
       "link.q.1024.1.1.1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    UnitState state = MakeUnit(1, 1, true);
    state.link_warm_q.push_back(c.link);
    ExpectRefused(state, "bad-link-" + c.what, c.expected);
  }
}

// A link warm start sound but for a tensor kind this build does not know
// was written by a build that knows more kinds, and is not corrupt:
// UNIMPLEMENTED, which the worker does not report as the checkpoint's fault
// (DATA_LOSS made the coordinator delete it).
TEST_F(UnitCheckpointTest, LinkWarmStartOfAnUnknownTensorKind_UnimplementedNotDataLoss) {
  UnitState state = MakeUnit(1, 1, true);
  state.link_warm_q.push_back({0, 1, 99, 1, Tensor::Filled({8, 2}, 1.0f)});
  const v1::ResumeFrom from = Write({state}, "ck/kind");
  ASSERT_EQ(from.units_size(), 1);
  absl::StatusOr<UnitState> read =
      ReadUnitCheckpoint(root_, from, from.units(0), id_, true, nullptr);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kUnimplemented) << read.status();
  EXPECT_EQ(read.status().message(),
            absl::StrCat(PathOf(from, 0),
                         " holds a link warm start (tensor link.q.0.1.99.1) of tensor kind 99, "
                         "which this build does not know (it knows kinds 0..6) (written by another "
                         "pipetrain build; the checkpoint is kept: resume the job with a build "
                         "that reads it)"));
  // Weights alone (a forward unit) do not read the warm starts.
  read = ReadUnitCheckpoint(root_, from, from.units(0), id_, /*with_moments=*/false, nullptr);
  EXPECT_TRUE(read.ok()) << read.status();
}

// A link's numbers must be spelt as the writer spells them: "+1" would
// name peer 1's link a second time, and the later would replace the first.
TEST_F(UnitCheckpointTest, LinkWarmStartNotSpeltCanonically_IsDataLoss) {
  UnitState state = MakeUnit(1, 1, true);
  state.link_warm_q.push_back({0, 10, 1, 1, Tensor::Filled({8, 2}, 1.0f)});
  const v1::ResumeFrom from = Write({state}, "ck/plus");
  ASSERT_EQ(from.units_size(), 1);
  const std::string path = PathOf(from, 0);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const size_t at = bytes.find("link.q.0.10.1.1");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 15, "link.q.0.+1.1.1");  // same length: the header stays valid
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  v1::UnitFile unit = from.units(0);
  unit.set_sha256(Sha256Hex(bytes));  // as if the peer had recorded this file
  absl::StatusOr<UnitState> read = ReadUnitCheckpoint(root_, from, unit, id_, true, nullptr);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_NE(read.status().message().find("link.q.0.+1.1.1"), std::string::npos) << read.status();
}

// A stage's measured AccTFM partition counts (StageRuntime::Snapshot puts
// them with its first backward unit) come back as written, and only with
// the unit's moments (a forward unit loads weights alone).
TEST_F(UnitCheckpointTest, RoundTripsTunedPartitions) {
  UnitState state = MakeUnit(1, 1, true);
  state.tuned_partitions = TunedPartitions{2, 4, 0, 2, 1, 3, {1, 2, 4, 1}, {1, 1, 2, 1}};
  const v1::ResumeFrom from = Write({state, MakeUnit(2, 2, true)}, "tuned");
  ASSERT_EQ(from.units_size(), 2);
  absl::StatusOr<UnitState> read =
      ReadUnitCheckpoint(root_, from, from.units(0), id_, true, nullptr);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->tuned_partitions.has_value());
  EXPECT_TRUE(*read->tuned_partitions == *state.tuned_partitions)
      << FormatTunedPartitions(*read->tuned_partitions);
  read = ReadUnitCheckpoint(root_, from, from.units(1), id_, true, nullptr);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->tuned_partitions.has_value());
  read = ReadUnitCheckpoint(root_, from, from.units(0), id_, /*with_moments=*/false, nullptr);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->tuned_partitions.has_value());
}

// Recorded counts outside their bounds: DATA_LOSS naming the file and
// what is wrong.
TEST_F(UnitCheckpointTest, TunedPartitionsOutOfBounds_IsDataLoss) {
  struct Case {
    std::string what;
    TunedPartitions tuned;
    std::string expected;
  };
  const std::vector<int> ones = {1, 1, 1, 1};
  const std::vector<Case> cases = {
      {"one rank", {1, 4, 0, 2, 1, 3, ones, ones}, "tensor ranks 2..1024"},
      {"ranks", {1025, 4, 0, 2, 1, 3, ones, ones}, "tensor ranks 2..1024"},
      {"samples", {2, 0, 0, 2, 1, 3, ones, ones}, "samples 1..1048576"},
      {"range end", {2, 4, 0, 5, 1, 3, ones, ones}, "a unit range outside the model"},
      {"reversed", {2, 4, 0, 2, 3, 1, ones, ones}, "ends before it begins"},
      {"count 3", {2, 4, 0, 2, 1, 3, {1, 3, 1, 1}, ones}, "unit 1's counts"},
      {"count 8", {2, 4, 0, 2, 1, 3, ones, {1, 1, 8, 1}}, "unit 2's counts"},
      {"units", {2, 4, 0, 2, 1, 3, {1, 1, 1}, {1, 1, 1}}, "4 forward/backward pairs"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    UnitState state = MakeUnit(1, 1, true);
    state.tuned_partitions = c.tuned;
    ExpectRefused(state, "bad-tuned-" + std::to_string(&c - cases.data()), c.expected);
  }
}

// Only the writer's canonical spelling parses: a sign, a leading zero, a
// second space, a missing or extra count, or more text than the writer
// could write are refused.
TEST(TunedPartitionsTest, OnlyCanonicalTextParses) {
  const GptConfig model = TinyModel();  // 4 units
  const std::string good = "2 4 0 2 1 3 1/1 2/1 4/2 1/1";
  absl::StatusOr<TunedPartitions> parsed = ParseTunedPartitions(good, model);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(FormatTunedPartitions(*parsed), good);
  for (const std::string& bad : std::vector<std::string>{
           "+2 4 0 2 1 3 1/1 2/1 4/2 1/1", "2 04 0 2 1 3 1/1 2/1 4/2 1/1",
           "2 4 0 2 1 3  1/1 2/1 4/2 1/1", "2 4 0 2 1 3 1/1 2/1 4/2 1", "2 4 0 2 1 3 1/1 2/1 4/2",
           "2 4 0 2 1 3 1/1 2/1 4/2 1/1 1/1", "2 4 0 2 1 3 1/1 2/1 4/2 1/1/1", "",
           // Megabytes of spaces: refused by length before it is split.
           good + std::string(1 << 20, ' ')}) {
    SCOPED_TRACE(bad.substr(0, 40));
    const absl::Status status = ParseTunedPartitions(bad, model).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("tuned_partitions \""), std::string::npos) << status;
  }
}

// A writer killed mid-write left its temporary in the step directory; the
// step written again (a redo after recovery) removes it, so a kept
// checkpoint does not carry it. A temporary of another unit file stays
// (its own writer removes it).
TEST_F(UnitCheckpointTest, RedoneStep_RemovesTheTemporaryADeadWriterLeft) {
  const std::string step_dir = absl::StrCat(root_, "/ck/job-t-1/", StepDirName(5));
  ASSERT_EQ(system(absl::StrCat("mkdir -p ", step_dir).c_str()), 0);
  const std::string dead = UnitFileName(1) + ".tmp.999999.1";
  const std::string other = UnitFileName(3) + ".tmp.999999.2";
  for (const std::string& name : {dead, other}) {
    std::ofstream(absl::StrCat(step_dir, "/", name)) << "half a unit file";
  }
  Write({MakeUnit(1, 1, true)}, "ck/job-t-1");
  struct stat st;
  EXPECT_NE(stat(absl::StrCat(step_dir, "/", dead).c_str(), &st), 0);
  EXPECT_EQ(stat(absl::StrCat(step_dir, "/", other).c_str(), &st), 0);
  EXPECT_EQ(stat(absl::StrCat(step_dir, "/", UnitFileName(1)).c_str(), &st), 0);
}

// A unit file replaced by a FIFO is refused at once (DATA_LOSS, not a
// file), not opened until a writer comes: that wedged the worker, which
// stayed READY and hung the next job placed on it.
TEST_F(UnitCheckpointTest, FifoUnitFile_IsDataLossWithoutBlocking) {
  const v1::ResumeFrom from = WriteAll();
  const std::string path = PathOf(from, 1);
  ASSERT_EQ(unlink(path.c_str()), 0);
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  absl::StatusOr<UnitState> read =
      ReadUnitCheckpoint(root_, from, from.units(1), id_, true, nullptr);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_NE(read.status().message().find("is not a file"), std::string::npos) << read.status();
}

// A unit file that is a symbolic link is refused, and the message names
// what it is (not a field of some request): export shows it as it is.
TEST_F(UnitCheckpointTest, SymlinkedUnitFile_RefusedNamingIt) {
  const v1::ResumeFrom from = WriteAll();
  const std::string path = PathOf(from, 1);
  ASSERT_EQ(rename(path.c_str(), (path + ".real").c_str()), 0);
  ASSERT_EQ(symlink((path + ".real").c_str(), path.c_str()), 0);
  absl::StatusOr<UnitState> read =
      ReadUnitCheckpoint(root_, from, from.units(1), id_, true, nullptr);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("checkpoint unit file: \"unit-0001.safetensors\" "
                                         "exists and is a symbolic link"),
            std::string::npos)
      << read.status();
}

// The job's checkpoint directory moved to another volume behind a link:
// every checkpoint of the job is behind it, so reading is UNAVAILABLE (the
// worker's trouble: the job recovers and keeps the checkpoint), not
// INVALID_ARGUMENT, which the coordinator takes for this checkpoint being
// unusable and drops it, then the next, then trains from step 0. A link at
// the step directory itself is still the checkpoint's.
TEST_F(UnitCheckpointTest, JobCheckpointDirBehindALink_UnavailableAndKept) {
  const v1::ResumeFrom from = WriteAll();  // under ck/job-t-1
  const std::string ck = root_ + "/ck";
  ASSERT_EQ(rename(ck.c_str(), (ck + "-moved").c_str()), 0);
  ASSERT_EQ(symlink("ck-moved", ck.c_str()), 0);
  absl::StatusOr<UnitState> read =
      ReadUnitCheckpoint(root_, from, from.units(1), id_, true, nullptr);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kUnavailable) << read.status();
  EXPECT_TRUE(absl::StrContains(read.status().message(), "the checkpoint is kept"))
      << read.status();

  ASSERT_EQ(unlink(ck.c_str()), 0);
  ASSERT_EQ(rename((ck + "-moved").c_str(), ck.c_str()), 0);
  // With a step-00000000 left in the job's directory too (a job's first
  // step directory, say), which the probe must not mistake for the link.
  ASSERT_EQ(mkdir(absl::StrCat(ck, "/job-t-1/", StepDirName(0)).c_str(), 0700), 0);
  const std::string step = absl::StrCat(root_, "/", from.dir());
  ASSERT_EQ(rename(step.c_str(), (step + ".real").c_str()), 0);
  ASSERT_EQ(symlink((step + ".real").c_str(), step.c_str()), 0);
  read = ReadUnitCheckpoint(root_, from, from.units(1), id_, true, nullptr);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << read.status();
}

TEST_F(UnitCheckpointTest, TruncatedFile_IsDataLoss) {
  const v1::ResumeFrom from = WriteAll();
  ASSERT_EQ(truncate(PathOf(from, 1).c_str(), from.units(1).bytes() - 10), 0);
  absl::StatusOr<UnitState> read =
      ReadUnitCheckpoint(root_, from, from.units(1), id_, true, nullptr);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_NE(read.status().message().find("unit-0001"), std::string::npos);
}

// A file of another size than recorded is refused from its size, before
// it is read: here a (sparse) one past the 64 GiB any unit file may have,
// which was read whole only to be refused.
TEST_F(UnitCheckpointTest, GrownFile_IsDataLossBeforeItIsRead) {
  const v1::ResumeFrom from = WriteAll();
  const off_t size = (off_t{64} << 30) + 1;
  ASSERT_EQ(truncate(PathOf(from, 1).c_str(), size), 0);
  absl::StatusOr<UnitState> read =
      ReadUnitCheckpoint(root_, from, from.units(1), id_, true, nullptr);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_EQ(read.status().message(),
            absl::StrCat(PathOf(from, 1), " is ", size, " bytes; the checkpoint recorded ",
                         from.units(1).bytes(), " (truncated or replaced)"));
}

// A file recorded at a size past what a worker reads back whole is this
// reader's limit, not corruption: RESOURCE_EXHAUSTED, which does not have
// the coordinator drop (and delete) the checkpoint (DATA_LOSS did).
TEST_F(UnitCheckpointTest, RecordedPastTheReadLimit_ResourceExhaustedNotDataLoss) {
  v1::ResumeFrom from = WriteAll();
  const off_t size = off_t{kMaxReadableUnitFileBytes} + 1;
  ASSERT_EQ(truncate(PathOf(from, 1).c_str(), size), 0);
  from.mutable_units(1)->set_bytes(size);
  absl::StatusOr<UnitState> read =
      ReadUnitCheckpoint(root_, from, from.units(1), id_, true, nullptr);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kResourceExhausted) << read.status();
  EXPECT_EQ(
      read.status().message(),
      absl::StrCat(PathOf(from, 1), " is ", size, " bytes, above the ", kMaxReadableUnitFileBytes,
                   " a worker reads back whole; a unit this large cannot be resumed (its "
                   "error-feedback residuals: fewer compressed replicas)"));
}

TEST_F(UnitCheckpointTest, FlippedByte_IsDataLoss) {
  const v1::ResumeFrom from = WriteAll();
  const std::string path = PathOf(from, 2);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() - 3] ^= 0x10;  // inside the last tensor's data
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  absl::StatusOr<UnitState> read =
      ReadUnitCheckpoint(root_, from, from.units(2), id_, true, nullptr);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_NE(read.status().message().find("SHA-256"), std::string::npos);
}

// A unit file whose checksum matches its record but that holds a NaN (or
// a negative second moment) was not written by WriteStageCheckpoint;
// resuming from it would train on NaN. DATA_LOSS naming the tensor.
TEST_F(UnitCheckpointTest, NonFiniteOrNegativeVInAMatchingFile_IsDataLoss) {
  struct Case {
    std::string tensor;
    float value;
    std::string expected;
  };
  for (const Case& c : {Case{"h.0.attn.c_attn.bias", std::nanf(""), "holds NaN"},
                        Case{"optimizer.m.h.0.attn.c_attn.bias", INFINITY, "an infinity"},
                        Case{"optimizer.v.h.0.attn.c_attn.bias", -1e-3f, "negative value"}}) {
    SCOPED_TRACE(c.tensor);
    v1::ResumeFrom from = WriteAll();
    const std::string path = PathOf(from, 1);
    absl::StatusOr<SafetensorsContents> contents = ReadSafetensors(path);
    ASSERT_TRUE(contents.ok()) << contents.status();
    bool found = false;
    for (NamedTensor& t : contents->tensors) {
      if (t.name != c.tensor) continue;
      t.tensor.data()[1] = c.value;
      found = true;
    }
    ASSERT_TRUE(found) << c.tensor;
    ASSERT_TRUE(WriteSafetensors(path, contents->tensors, contents->metadata).ok());
    std::string bytes;
    {
      std::ifstream in(path, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    from.mutable_units(1)->set_sha256(Sha256Hex(bytes));  // the record matches the file
    from.mutable_units(1)->set_bytes(static_cast<int64_t>(bytes.size()));
    absl::StatusOr<UnitState> read =
        ReadUnitCheckpoint(root_, from, from.units(1), id_, true, nullptr);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
    EXPECT_NE(read.status().message().find(c.tensor + " "), std::string::npos) << read.status();
    EXPECT_NE(read.status().message().find(c.expected), std::string::npos) << read.status();
  }
}

// A stage takes at most one optimizer step an iteration, so a file at
// step 5 with more (INT64_MAX would overflow AdamW's count at its first
// step) was not written by one. A file with fewer resumes.
TEST_F(UnitCheckpointTest, MoreOptimizerStepsThanIterations_IsDataLoss) {
  for (int64_t steps : {int64_t{4}, int64_t{5}, int64_t{6}, INT64_MAX}) {
    SCOPED_TRACE(steps);
    const std::string dir = absl::StrCat("ck/steps-", steps);
    absl::StatusOr<std::vector<v1::UnitFile>> files =
        WriteStageCheckpoint(root_, dir, StageSnapshot{5, steps, {MakeUnit(1, 1, true)}}, id_);
    ASSERT_TRUE(files.ok()) << files.status();
    v1::ResumeFrom from;
    from.set_step(5);
    from.set_dir(absl::StrCat(dir, "/", StepDirName(5)));
    *from.add_units() = (*files)[0];
    int64_t read_steps = -1;
    absl::StatusOr<UnitState> read =
        ReadUnitCheckpoint(root_, from, from.units(0), id_, true, &read_steps);
    if (steps <= 5) {
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_EQ(read_steps, steps);
      continue;
    }
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
    EXPECT_NE(read.status().message().find(
                  absl::StrCat("bad optimizer_steps \"", steps, "\" (want 0 .. step 5)")),
              std::string::npos)
        << read.status();
  }
}

// A unit file this worker cannot open for a reason of its own (here a
// socket, ENXIO; in life a FUSE mount whose daemon died, ENOTCONN) is
// UNAVAILABLE: absl maps those errnos to NOT_FOUND or FAILED_PRECONDITION,
// which the job runner reports as an unusable checkpoint, and the
// coordinator then deleted a good one.
TEST_F(UnitCheckpointTest, UnitFileThatDoesNotOpenForTheReader_IsUnavailable) {
  const v1::ResumeFrom from = WriteAll();
  const std::string path = PathOf(from, 1);
  ASSERT_EQ(unlink(path.c_str()), 0);
  // Bound by a relative name: the sandbox's absolute path may pass
  // sockaddr_un's 108 bytes.
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  const std::string dir = path.substr(0, path.rfind('/'));
  ASSERT_EQ(chdir(dir.c_str()), 0);
  const int sock = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name = path.substr(path.rfind('/') + 1);
  std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", name.c_str());
  const int bound = bind(sock, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  close(sock);
  ASSERT_EQ(chdir(cwd), 0);
  ASSERT_EQ(bound, 0) << strerror(errno);
  const absl::Status read =
      ReadUnitCheckpoint(root_, from, from.units(1), id_, true, nullptr).status();
  EXPECT_EQ(read.code(), absl::StatusCode::kUnavailable) << read;
  EXPECT_NE(read.message().find("not the checkpoint's"), std::string::npos) << read;
}

TEST_F(UnitCheckpointTest, MissingFile_IsNotFound) {
  const v1::ResumeFrom from = WriteAll();
  ASSERT_EQ(unlink(PathOf(from, 3).c_str()), 0);
  EXPECT_EQ(ReadUnitCheckpoint(root_, from, from.units(3), id_, true, nullptr).status().code(),
            absl::StatusCode::kNotFound);
}

// A step directory missing as a whole is this worker's trouble (another
// volume than the coordinator's), not the checkpoint's: UNAVAILABLE, which
// the job runner does not report as an unusable checkpoint.
TEST_F(UnitCheckpointTest, MissingStepDirectory_IsUnavailableNamingTheRoot) {
  v1::ResumeFrom from = WriteAll();
  from.set_dir("checkpoints/j/step-99999999");
  const absl::Status read =
      ReadUnitCheckpoint(root_, from, from.units(0), id_, true, nullptr).status();
  EXPECT_EQ(read.code(), absl::StatusCode::kUnavailable) << read;
  EXPECT_NE(read.message().find("is this worker's --checkpoint-root the volume"), std::string::npos)
      << read;
}

// A root that does not open (gone since the start-up check, or too many
// open files) is this reader's trouble too: UNAVAILABLE, not the
// FAILED_PRECONDITION that reports another model's checkpoint (which the
// coordinator answers by dropping it).
TEST_F(UnitCheckpointTest, RootDoesNotOpen_IsUnavailable) {
  const v1::ResumeFrom from = WriteAll();
  const absl::Status read =
      ReadUnitCheckpoint(root_ + "/unmounted", from, from.units(0), id_, true, nullptr).status();
  EXPECT_EQ(read.code(), absl::StatusCode::kUnavailable) << read;
  EXPECT_NE(read.message().find("cannot open this worker's --checkpoint-root"), std::string::npos)
      << read;
}

TEST_F(UnitCheckpointTest, OtherModelShape_IsFailedPrecondition) {
  const v1::ResumeFrom from = WriteAll();
  CheckpointIdentity other = id_;
  other.model.max_seq_len = 16;  // same unit shapes for attention, another model
  absl::StatusOr<UnitState> read =
      ReadUnitCheckpoint(root_, from, from.units(1), other, true, nullptr);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();
  EXPECT_NE(read.status().message().find("max_seq_len"), std::string::npos);
  other = id_;
  other.seed = 8;
  EXPECT_EQ(ReadUnitCheckpoint(root_, from, from.units(1), other, true, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A unit file of another format version, whole (its record's size and
// SHA-256 match), was written by another build: after an upgrade that
// raised the version, or read by an older build after a rollback. Not
// corrupt: UNIMPLEMENTED naming both versions, which the worker does not
// report as the checkpoint's fault (DATA_LOSS made the coordinator delete
// it, and the job's way back with it). A version no writer spells is
// still DATA_LOSS.
TEST_F(UnitCheckpointTest, OtherFormatVersion_UnimplementedNamingBothNotDataLoss) {
  struct Case {
    std::string version;
    absl::StatusCode code;
  };
  for (const Case& c : {Case{"2", absl::StatusCode::kUnimplemented},
                        Case{"9", absl::StatusCode::kUnimplemented},
                        Case{"0", absl::StatusCode::kDataLoss},
                        Case{"x", absl::StatusCode::kDataLoss}}) {
    SCOPED_TRACE(c.version);
    v1::ResumeFrom from = WriteAll();
    const std::string path = PathOf(from, 1);
    std::string bytes;
    {
      std::ifstream in(path, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    const size_t at = bytes.find("\"version\":\"1\"");
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, 13, "\"version\":\"" + c.version + "\"");  // same length
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    from.mutable_units(1)->set_sha256(Sha256Hex(bytes));  // the record matches the file
    const absl::Status read =
        ReadUnitCheckpoint(root_, from, from.units(1), id_, true, nullptr).status();
    EXPECT_EQ(read.code(), c.code) << read;
    if (c.code != absl::StatusCode::kUnimplemented) continue;
    EXPECT_EQ(read.message(),
              absl::StrCat(path, " is a unit checkpoint of format version ", c.version,
                           "; this build reads version 1 only (written by another pipetrain "
                           "build; the checkpoint is kept: resume the job with a build that "
                           "reads it)"));
  }
}

// A later format version may store what this build's safetensors reader
// refuses before the metadata is looked at: an integer tensor (I8), a
// metadata value that is not a string. Whole (its record's size and
// SHA-256 match), such a file is still another build's: UNIMPLEMENTED
// naming the version, as for a file this reader parses. In version 1 the
// same file is corrupt: DATA_LOSS naming what the reader refused.
TEST_F(UnitCheckpointTest, OtherFormatVersionTheReaderRefuses_UnimplementedNotDataLoss) {
  struct Case {
    std::string version;
    std::string extra_metadata;  // beside format, version, unit and step
    absl::StatusCode code;
    std::string refused;  // for DATA_LOSS: what the message names
  };
  for (const Case& c :
       {Case{"2", "", absl::StatusCode::kUnimplemented, ""},
        Case{"2", R"(,"layers":[1,2])", absl::StatusCode::kUnimplemented, ""},
        Case{"1", "", absl::StatusCode::kDataLoss, "unsupported dtype \"I8\""},
        Case{"1", R"(,"layers":[1,2])", absl::StatusCode::kDataLoss, "\"layers\" must be a string"},
        Case{"0", "", absl::StatusCode::kDataLoss, "unsupported dtype \"I8\""}}) {
    SCOPED_TRACE(c.version + c.extra_metadata);
    v1::ResumeFrom from = WriteAll();
    const std::string path = PathOf(from, 1);
    const std::string header =
        absl::StrCat(R"({"__metadata__":{"format":"pipetrain-unit-checkpoint","version":")",
                     c.version, R"(","unit":"1","step":"5")", c.extra_metadata,
                     R"(},"optimizer.count":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})");
    std::string bytes(8, '\0');
    for (size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    bytes += header + std::string("\x01\x02\x03\x04", 4);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    from.mutable_units(1)->set_bytes(static_cast<int64_t>(bytes.size()));
    from.mutable_units(1)->set_sha256(Sha256Hex(bytes));  // the record matches the file
    const absl::Status read =
        ReadUnitCheckpoint(root_, from, from.units(1), id_, true, nullptr).status();
    EXPECT_EQ(read.code(), c.code) << read;
    if (c.code == absl::StatusCode::kUnimplemented) {
      EXPECT_EQ(read.message(),
                absl::StrCat(path,
                             " is a unit checkpoint of format version 2; this build reads "
                             "version 1 only (written by another pipetrain build; the "
                             "checkpoint is kept: resume the job with a build that reads "
                             "it)"));
    } else {
      EXPECT_NE(read.message().find(c.refused), absl::string_view::npos) << read;
      EXPECT_NE(read.message().find(path), absl::string_view::npos) << read;
    }
  }
}

TEST_F(UnitCheckpointTest, RecordNamingAnotherUnitOrStep_IsDataLoss) {
  v1::ResumeFrom from = WriteAll();
  v1::UnitFile swapped = from.units(1);
  swapped.set_unit(2);  // unit 2's name, unit 1's file contents: name check
  EXPECT_EQ(ReadUnitCheckpoint(root_, from, swapped, id_, true, nullptr).status().code(),
            absl::StatusCode::kDataLoss);
  v1::UnitFile out_of_range = from.units(1);
  out_of_range.set_unit(99);
  EXPECT_EQ(ReadUnitCheckpoint(root_, from, out_of_range, id_, true, nullptr).status().code(),
            absl::StatusCode::kDataLoss);
  from.set_step(6);  // the files say 5
  EXPECT_EQ(ReadUnitCheckpoint(root_, from, from.units(1), id_, true, nullptr).status().code(),
            absl::StatusCode::kDataLoss);
}

// A diverged stage's snapshot (a NaN weight, an infinite moment, residual
// or warm start) writes nothing, so the previous checkpoint stays the latest complete one.
TEST_F(UnitCheckpointTest, NonFiniteState_IsRefusedAndWritesNothing) {
  enum Where { kWeight, kMoment, kFeedback, kWarmStart, kLinkWarmStart };
  struct Case {
    Where where;
    float value;
    std::string expected;
  };
  for (const Case& c :
       {Case{kWeight, std::nanf(""), "weight"}, Case{kMoment, INFINITY, "moment v of"},
        Case{kWeight, -INFINITY, "an infinity"},
        Case{kFeedback, std::nanf(""), "replica 1's error feedback of"},
        Case{kWarmStart, INFINITY, "warm start of h.0.attn.c_attn.weight"},
        Case{kLinkWarmStart, std::nanf(""), "a link's warm start (replica 1"}}) {
    SCOPED_TRACE(c.expected);
    std::vector<UnitState> units = {MakeUnit(0, 0, true), MakeUnit(1, 1, true)};
    if (c.where == kFeedback || c.where == kWarmStart) units[1] = WithFeedback(2);
    if (c.where == kLinkWarmStart) units[1] = WithLinks();
    Tensor& t = c.where == kMoment          ? units[1].v[0].tensor
                : c.where == kFeedback      ? units[1].feedback[1][0].tensor
                : c.where == kWarmStart     ? units[1].warm_q[0].tensor
                : c.where == kLinkWarmStart ? units[1].link_warm_q[2].q
                                            : units[1].values[1].tensor;
    t.data()[t.numel() - 1] = c.value;
    absl::StatusOr<std::vector<v1::UnitFile>> files =
        WriteStageCheckpoint(root_, "ck/job-t-1", StageSnapshot{5, 5, units}, id_);
    EXPECT_EQ(files.status().code(), absl::StatusCode::kFailedPrecondition) << files.status();
    EXPECT_NE(files.status().message().find(c.expected), std::string::npos) << files.status();
    EXPECT_NE(files.status().message().find("of unit 1"), std::string::npos) << files.status();
    // Told from the write's other FAILED_PRECONDITION errors by its mark,
    // not its words: the same code and message made anew are not it.
    EXPECT_TRUE(IsSnapshotNotFinite(files.status())) << files.status();
    EXPECT_FALSE(IsSnapshotNotFinite(absl::FailedPreconditionError(files.status().message())));
    struct stat st;
    EXPECT_NE(stat(absl::StrCat(root_, "/ck/job-t-1/", StepDirName(5)).c_str(), &st), 0)
        << "a unit file of the refused checkpoint was written";
  }
}

// A stage that stops while its checkpoint is written: the write ends after
// the unit file in progress, CANCELLED, and writes nothing more (a STOP
// and the job's recovery waited for the whole write, whose report nobody
// takes; an ended job's swept step directory was created again).
TEST_F(UnitCheckpointTest, StoppedDuringTheWrite_CancelledAfterTheCurrentUnit) {
  const std::vector<UnitState> units = {MakeUnit(0, 0, true), MakeUnit(1, 1, true),
                                        MakeUnit(2, 2, true)};
  const std::string step_dir = absl::StrCat(root_, "/ck/stopped/", StepDirName(5));
  struct stat st;
  // Stopped once unit 0's file is in place.
  const auto unit0_written = [&] {
    return stat(absl::StrCat(step_dir, "/", UnitFileName(0)).c_str(), &st) == 0;
  };
  absl::StatusOr<std::vector<v1::UnitFile>> files =
      WriteStageCheckpoint(root_, "ck/stopped", StageSnapshot{5, 5, units}, id_, unit0_written);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kCancelled) << files.status();
  EXPECT_TRUE(absl::StrContains(files.status().message(), "stopped after 1 of 3 unit files"))
      << files.status();
  EXPECT_TRUE(unit0_written());
  EXPECT_NE(stat(absl::StrCat(step_dir, "/", UnitFileName(1)).c_str(), &st), 0);
  // Stopped within a unit file (before its second tensor): that file and
  // its temporary are gone, nothing else is written.
  int asked = 0;
  files = WriteStageCheckpoint(root_, "ck/stopped-within", StageSnapshot{5, 5, units}, id_,
                               [&asked] { return ++asked > 2; });
  EXPECT_EQ(files.status().code(), absl::StatusCode::kCancelled) << files.status();
  EXPECT_TRUE(absl::StrContains(files.status().message(), "the writer stopped before"))
      << files.status();
  const std::string within = absl::StrCat(root_, "/ck/stopped-within/", StepDirName(5));
  EXPECT_TRUE(std::filesystem::is_empty(within)) << within;
  // Stopped before the first unit: not even the step directory.
  files = WriteStageCheckpoint(root_, "ck/stopped-early", StageSnapshot{5, 5, units}, id_,
                               [] { return true; });
  EXPECT_EQ(files.status().code(), absl::StatusCode::kCancelled);
  EXPECT_NE(stat(absl::StrCat(root_, "/ck/stopped-early").c_str(), &st), 0);
}

// A unit file that cannot be written (past the file size limit here,
// EFBIG, as a full disk's ENOSPC or a quota's EDQUOT) names its step
// directory and this worker's --checkpoint-root: the coordinator shows the
// message as the job's checkpoint_error, and "cannot write
// unit-0000.safetensors" alone did not say which volume was full.
TEST_F(UnitCheckpointTest, UnitFileNotWritten_ErrorNamesTheStepDirectoryAndTheRoot) {
  const std::string said = InChild([this]() -> std::string {
    // The hard limit kept: raising it takes privilege a runner may lack.
    struct rlimit limit;
    if (getrlimit(RLIMIT_FSIZE, &limit) != 0) return "cannot read the file size limit";
    limit.rlim_cur = 0;
    if (signal(SIGXFSZ, SIG_IGN) == SIG_ERR || setrlimit(RLIMIT_FSIZE, &limit) != 0) {
      return "cannot limit the file size";
    }
    const StageSnapshot snapshot{5, 5, {MakeUnit(0, 0, true)}};
    return WriteStageCheckpoint(root_, "ck/full", snapshot, id_).status().ToString();
  });
  EXPECT_EQ(said, absl::StrCat("OUT_OF_RANGE: checkpoint ck/full/step-00000005 under this "
                               "worker's --checkpoint-root ",
                               root_, ": cannot write unit-0000.safetensors: File too large"));
}

TEST_F(UnitCheckpointTest, EscapingDir_IsRefusedAndWritesNothing) {
  StageSnapshot snapshot{5, 5, {MakeUnit(0, 0, true)}};
  EXPECT_EQ(WriteStageCheckpoint(root_, "../escape", snapshot, id_).status().code(),
            absl::StatusCode::kInvalidArgument);
  struct stat st;
  EXPECT_NE(stat(absl::StrCat(root_, "/../escape").c_str(), &st), 0);
}

TEST_F(UnitCheckpointTest, Writer_ReportsEachSnapshotInOrder) {
  std::vector<int64_t> steps;
  {
    CheckpointWriter writer(
        root_, "w", id_,
        [&](int64_t step, double seconds, const absl::StatusOr<std::vector<v1::UnitFile>>& files) {
          EXPECT_TRUE(files.ok()) << files.status();
          EXPECT_GE(seconds, 0);
          steps.push_back(step);
        });
    for (int64_t s : {2, 4, 6}) writer.Submit(StageSnapshot{s, s, {MakeUnit(1, s, true)}});
    writer.Wait();
    EXPECT_EQ(steps, (std::vector<int64_t>{2, 4, 6}));
  }
}

TEST_F(UnitCheckpointTest, Writer_UnwritableRoot_ReportsTheError) {
  absl::Status reported;
  {
    CheckpointWriter writer(
        root_ + "/no/such/root", "w", id_,
        [&](int64_t, double, const absl::StatusOr<std::vector<v1::UnitFile>>& f) {
          reported = f.status();
        });
    writer.Submit(StageSnapshot{1, 1, {MakeUnit(0, 0, true)}});
  }
  EXPECT_EQ(reported.code(), absl::StatusCode::kFailedPrecondition) << reported;
  // Which directory could not be made, not some other failure.
  EXPECT_NE(reported.message().find("/no/such/root"), absl::string_view::npos) << reported;
  // The write's own trouble, not a diverged stage's.
  EXPECT_FALSE(IsSnapshotNotFinite(reported));
}

}  // namespace
}  // namespace pipetrain
