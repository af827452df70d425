#include "cli/checkpoint_command.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/testing/file_access_override.h"
#include "coordinator/jobs/checkpoint_catalog.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/checkpoint_manifest.h"
#include "worker/checkpoint/unit_checkpoint.h"
#include "worker/model/gpt_model.h"

namespace pipetrain {
namespace {

// Two layers: six units, every unit kind.
GptConfig TinyModel() { return GptConfig{32, 8, 2, 2, 8}; }
constexpr char kJobId[] = "job-t-1";
constexpr uint64_t kSeed = 7;
constexpr char kJobDir[] = "ck/job-t-1";

v1::ModelSpec ModelSpecOf(const GptConfig& c) {
  v1::ModelSpec spec;
  spec.set_vocab_size(c.vocab_size);
  spec.set_max_seq_len(c.max_seq_len);
  spec.set_n_layer(c.n_layer);
  spec.set_n_head(c.n_head);
  spec.set_d_model(c.d_model);
  return spec;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
        names.push_back(e->d_name);
      }
    }
    closedir(d);
  }
  return names;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.size_bytes())) == 0;
}

class CheckpointExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    out_dir_ = root_ + "/out";
    ASSERT_EQ(mkdir(root_.c_str(), 0700), 0);
    ASSERT_EQ(mkdir(out_dir_.c_str(), 0700), 0);
    out_ = out_dir_ + "/model.safetensors";
  }

  // Every unit of TinyModel at `step`, random values (so bit patterns vary),
  // the head's wte a copy of the embedding's, as training keeps them.
  StageSnapshot MakeSnapshot(int64_t step) {
    std::mt19937 rng(static_cast<uint32_t>(step));
    std::normal_distribution<float> normal(0.0f, 0.02f);
    StageSnapshot snapshot{step, step, {}};
    for (int u = 0; u < NumUnits(TinyModel()); ++u) {
      UnitState unit;
      unit.unit = u;
      for (const ParameterShape& p : UnitParameterShapes(TinyModel(), u)) {
        Tensor t = Tensor::Zeros(Shape(p.shape.begin(), p.shape.end()));
        for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = normal(rng);
        if (u > 0 && p.name == "wte.weight") t = snapshot.units[0].values[0].tensor.Clone();
        unit.values.push_back({p.name, t});
        unit.m.push_back({p.name, Tensor::Filled(t.shape(), 0.5f)});
        unit.v.push_back({p.name, Tensor::Filled(t.shape(), 0.25f)});
      }
      snapshot.units.push_back(std::move(unit));
    }
    return snapshot;
  }

  // Writes `snapshot` as the stages would, then (when `manifest`) the
  // coordinator's manifest. Returns the checkpoint as recorded.
  v1::ResumeFrom WriteCheckpoint(const StageSnapshot& snapshot, bool manifest = true) {
    absl::StatusOr<std::vector<v1::UnitFile>> files =
        WriteStageCheckpoint(root_, kJobDir, snapshot, {kJobId, TinyModel(), kSeed});
    EXPECT_TRUE(files.ok()) << files.status();
    v1::ResumeFrom from;
    from.set_step(snapshot.step);
    from.set_dir(absl::StrCat(kJobDir, "/", StepDirName(snapshot.step)));
    for (const v1::UnitFile& f : *files) *from.add_units() = f;
    if (manifest) WriteManifest(from, kSeed);
    return from;
  }
  void WriteManifest(const v1::ResumeFrom& from, uint64_t seed) {
    absl::Status written =
        WriteCheckpointManifest(root_, kJobId, ModelSpecOf(TinyModel()), seed, from);
    EXPECT_TRUE(written.ok()) << written;
  }

  std::string StepPath(int64_t step) {
    return absl::StrCat(root_, "/", kJobDir, "/", StepDirName(step));
  }
  std::string UnitPath(int64_t step, int unit) {
    return absl::StrCat(StepPath(step), "/", UnitFileName(unit));
  }

  absl::StatusOr<CheckpointExport> Export(const std::string& dir) {
    absl::StatusOr<CheckpointLocation> at = LocateCheckpoint(dir);
    if (!at.ok()) return at.status();
    return ExportCheckpoint(*at, out_);
  }

  // The export failed with `code`, its message holds `fragment`, and
  // nothing was written (the output directory is empty).
  void ExpectFailure(const std::string& dir, absl::StatusCode code, const std::string& fragment) {
    absl::StatusOr<CheckpointExport> done = Export(dir);
    EXPECT_EQ(done.status().code(), code) << done.status();
    EXPECT_NE(done.status().message().find(fragment), std::string::npos) << done.status();
    EXPECT_EQ(ListDir(out_dir_), std::vector<std::string>{});
    EXPECT_EQ(RunCheckpoint({"export", dir, "--out", out_}), 1);
    EXPECT_EQ(ListDir(out_dir_), std::vector<std::string>{});
  }

  std::string root_, out_dir_, out_;
};

TEST_F(CheckpointExportTest, ExportCheckpoint_StepDir_WritesEachParameterOnceBitwise) {
  const StageSnapshot snapshot = MakeSnapshot(10);
  WriteCheckpoint(snapshot);
  absl::StatusOr<CheckpointExport> done = Export(StepPath(10));
  ASSERT_TRUE(done.ok()) << done.status();

  absl::StatusOr<SafetensorsContents> file = ReadSafetensors(out_);
  ASSERT_TRUE(file.ok()) << file.status();
  // What Hugging Face's loaders look for (transformers before 4.48 and its
  // Flax loader refuse a file without it), and nothing of the checkpoint's
  // own metadata.
  EXPECT_EQ(file->metadata, (SafetensorsMetadata{{"format", "pt"}}));
  // Exactly the tensors, in the order, that train-local --save writes.
  absl::StatusOr<std::unique_ptr<GptModel>> model = GptModel::Create(TinyModel(), 1);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::string> want_names, names;
  for (const Parameter* p : (*model)->parameters()) want_names.push_back(p->name);
  for (const NamedTensor& t : file->tensors) names.push_back(t.name);
  EXPECT_EQ(names, want_names);
  // Each value bitwise that of its unit; wte.weight from unit 0.
  for (const UnitState& unit : snapshot.units) {
    for (const NamedTensor& t : unit.values) {
      const Tensor* got = file->Find(t.name);
      ASSERT_NE(got, nullptr) << t.name;
      EXPECT_TRUE(SameBits(*got, t.tensor)) << t.name << " of unit " << unit.unit;
    }
  }
  EXPECT_EQ(done->job_id, kJobId);
  EXPECT_EQ(done->step, 10);
  EXPECT_EQ(done->tensors, static_cast<int64_t>(want_names.size()));
  EXPECT_EQ(done->parameters, CountParameters(TinyModel()));
  EXPECT_EQ(done->bytes, static_cast<int64_t>(ReadFile(out_).size()));
  EXPECT_EQ(done->warnings, std::vector<std::string>{});
  EXPECT_EQ(ListDir(out_dir_), std::vector<std::string>{"model.safetensors"});
}

// --vocab N keeps the token embedding's first N rows (a vocabulary padded
// for tensor ranks back to the tokenizer's); every other tensor as it was.
TEST_F(CheckpointExportTest, ExportCheckpoint_Vocab_CutsThePaddedRowsOnly) {
  const StageSnapshot snapshot = MakeSnapshot(10);
  WriteCheckpoint(snapshot);
  const int64_t rows = TinyModel().vocab_size;
  absl::StatusOr<CheckpointLocation> at = LocateCheckpoint(StepPath(10));
  ASSERT_TRUE(at.ok()) << at.status();
  absl::StatusOr<CheckpointExport> done = ExportCheckpoint(*at, out_, rows - 3);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->cut_rows, 3);
  absl::StatusOr<SafetensorsContents> file = ReadSafetensors(out_);
  ASSERT_TRUE(file.ok()) << file.status();
  const Tensor& wte = snapshot.units[0].values[0].tensor;
  EXPECT_TRUE(SameBits(*file->Find("wte.weight"), wte.Slice(0, rows - 3).Clone()));
  for (const UnitState& unit : snapshot.units) {
    for (const NamedTensor& t : unit.values) {
      if (t.name == "wte.weight") continue;
      EXPECT_TRUE(SameBits(*file->Find(t.name), t.tensor)) << t.name;
    }
  }
  EXPECT_EQ(done->parameters, CountParameters(TinyModel()) - 3 * TinyModel().d_model);
  // The whole vocabulary is the same as none; more than it is refused.
  EXPECT_EQ(ExportCheckpoint(*at, out_, rows).value().cut_rows, 0);
  EXPECT_EQ(ExportCheckpoint(*at, out_, rows + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  testing::internal::CaptureStdout();
  EXPECT_EQ(
      RunCheckpoint({"export", StepPath(10), "--out", out_, "--vocab", std::to_string(rows - 3)}),
      0);
  EXPECT_NE(testing::internal::GetCapturedStdout().find("(3 padded vocabulary rows left out)"),
            std::string::npos);
  testing::internal::CaptureStderr();
  EXPECT_EQ(RunCheckpoint({"export", StepPath(10), "--out", out_, "--vocab", "-1"}), 2);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("--vocab must be >= 0"), std::string::npos);
}

// A checkpoint's manifest is someone's file: a job id holding a terminal
// escape (here ESC [2J, clear the screen) was printed raw. It is printed
// inert now, in the success line or in an error quoting it.
TEST_F(CheckpointExportTest, RunCheckpoint_JobIdWithATerminalEscape_PrintedInert) {
  WriteCheckpoint(MakeSnapshot(10));
  const std::string manifest = StepPath(10) + "/manifest.json";
  std::ifstream in(manifest, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const std::string quoted = absl::StrCat("\"", kJobId, "\"");
  const size_t at = text.find(quoted);
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, quoted.size(), absl::StrCat("\"", kJobId, "\\u001b[2J\""));
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << text;
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  RunCheckpoint({"export", StepPath(10), "--out", out_});
  const std::string printed =
      testing::internal::GetCapturedStdout() + testing::internal::GetCapturedStderr();
  EXPECT_EQ(printed.find('\x1b'), std::string::npos) << printed;
  EXPECT_NE(printed.find(absl::StrCat(kJobId, "\\x1b[2J")), std::string::npos) << printed;
}

// A running job removes its older checkpoints as it writes new ones: the
// newest when located may be gone when read. Said so, not a worker's
// volume hint and "export an older one" (which goes first).
TEST_F(CheckpointExportTest, ExportCheckpoint_RemovedAfterItWasLocated_NotFoundSaysSo) {
  WriteCheckpoint(MakeSnapshot(10));
  absl::StatusOr<CheckpointLocation> at = LocateCheckpoint(absl::StrCat(root_, "/", kJobDir));
  ASSERT_TRUE(at.ok()) << at.status();
  ASSERT_TRUE(at->newest_of_job);
  ASSERT_EQ(system(("rm -rf '" + StepPath(10) + "'").c_str()), 0);
  absl::StatusOr<CheckpointExport> done = ExportCheckpoint(*at, out_, 0);
  EXPECT_EQ(done.status().code(), absl::StatusCode::kNotFound) << done.status();
  EXPECT_EQ(done.status().message(),
            StepPath(10) +
                " was removed while it was read (a running job keeps only its newest "
                "spec.checkpoint.keep checkpoints); copy it elsewhere first, or export again");
  EXPECT_EQ(ListDir(out_dir_), std::vector<std::string>{});
}

// An export interrupted mid-write left its temporary beside --out (up to
// the model's size) for good: the next export to that name removes what no
// living writer holds, and says so.
TEST_F(CheckpointExportTest, Export_RemovesAnInterruptedExportsTemporary) {
  WriteCheckpoint(MakeSnapshot(10));
  const std::string name = out_.substr(out_.rfind('/') + 1);
  const std::string abandoned = out_ + ".tmp.4000000.7";
  std::ofstream(abandoned, std::ios::binary) << "half a model";
  absl::StatusOr<CheckpointLocation> at = LocateCheckpoint(StepPath(10));
  ASSERT_TRUE(at.ok()) << at.status();
  absl::StatusOr<CheckpointExport> done = ExportCheckpoint(*at, out_, 0);
  ASSERT_TRUE(done.ok()) << done.status();
  struct stat info;
  EXPECT_NE(lstat(abandoned.c_str(), &info), 0) << abandoned << " is still there";
  ASSERT_EQ(done->warnings.size(), 1u);
  EXPECT_NE(done->warnings[0].find(name + ".tmp.4000000.7, left by an export that was interrupted"),
            std::string::npos)
      << done->warnings[0];
}

// --out in the checkpoint's own directory would replace one of its unit
// files: refused (2) before anything is written.
TEST_F(CheckpointExportTest, RunCheckpoint_OutInTheCheckpointDir_RefusedUntouched) {
  WriteCheckpoint(MakeSnapshot(10));
  const std::string unit = StepPath(10) + "/unit-0000.safetensors";
  std::ifstream before_in(unit, std::ios::binary);
  const std::string before((std::istreambuf_iterator<char>(before_in)),
                           std::istreambuf_iterator<char>());
  testing::internal::CaptureStderr();
  EXPECT_EQ(RunCheckpoint({"export", StepPath(10), "--out", unit}), 2);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("lies in the checkpoint directory"),
            std::string::npos);
  std::ifstream after_in(unit, std::ios::binary);
  const std::string after((std::istreambuf_iterator<char>(after_in)),
                          std::istreambuf_iterator<char>());
  EXPECT_EQ(after, before);
}

// An --out that cannot be written, or that the rename would put a file in
// place of, is the command line's mistake (2), found before the checkpoint
// is read; nothing is written and a FIFO stays a FIFO.
TEST_F(CheckpointExportTest, RunCheckpoint_OutNotAWritableFile_ExitTwoNothingWritten) {
  WriteCheckpoint(MakeSnapshot(10));
  const std::string fifo = out_dir_ + "/pipe";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  testing::internal::CaptureStderr();
  EXPECT_EQ(RunCheckpoint({"export", StepPath(10), "--out", out_dir_}), 2);
  EXPECT_EQ(RunCheckpoint({"export", StepPath(10), "--out", out_dir_ + "/no/x.safetensors"}), 2);
  EXPECT_EQ(RunCheckpoint({"export", StepPath(10), "--out", fifo}), 2);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--out " + out_dir_ + " is a directory; name a file"), std::string::npos)
      << err;
  EXPECT_NE(err.find("the directory " + out_dir_ + "/no does not exist"), std::string::npos) << err;
  EXPECT_NE(err.find("--out " + fifo + " is not a regular file"), std::string::npos) << err;
  struct stat info;
  ASSERT_EQ(lstat(fifo.c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode));
  EXPECT_EQ(ListDir(out_dir_), std::vector<std::string>{"pipe"});
}

// A checkpoint.dir two jobs used holds both's steps: the newest is not
// guessed (it may be another model's); the step directory must be named.
TEST_F(CheckpointExportTest, LocateCheckpoint_DirOfTwoJobs_RefusedNamingThem) {
  WriteCheckpoint(MakeSnapshot(5));
  const StageSnapshot other = MakeSnapshot(10);
  absl::StatusOr<std::vector<v1::UnitFile>> files =
      WriteStageCheckpoint(root_, kJobDir, other, {"job-other", TinyModel(), kSeed});
  ASSERT_TRUE(files.ok()) << files.status();
  v1::ResumeFrom from;
  from.set_step(10);
  from.set_dir(absl::StrCat(kJobDir, "/", StepDirName(10)));
  for (const v1::UnitFile& f : *files) *from.add_units() = f;
  ASSERT_TRUE(
      WriteCheckpointManifest(root_, "job-other", ModelSpecOf(TinyModel()), kSeed, from).ok());
  const absl::StatusOr<CheckpointLocation> at = LocateCheckpoint(absl::StrCat(root_, "/", kJobDir));
  ASSERT_FALSE(at.ok());
  EXPECT_EQ(at.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(at.status().message().find("holds checkpoints of 2 jobs"), std::string::npos)
      << at.status();
  EXPECT_TRUE(LocateCheckpoint(StepPath(10)).ok());  // named: fine
}

// A step-* entry that is a symbolic link (to a checkpoint elsewhere) is
// not taken for the job directory's newest step: it could lead out of the
// directory the coordinator checked under its --output-dir.
TEST_F(CheckpointExportTest, LocateCheckpoint_LinkedStepDir_NotFollowed) {
  WriteCheckpoint(MakeSnapshot(5));
  WriteCheckpoint(MakeSnapshot(10));
  const std::string elsewhere = absl::StrCat(root_, "/elsewhere");
  ASSERT_EQ(rename(StepPath(10).c_str(), elsewhere.c_str()), 0);
  ASSERT_EQ(symlink(elsewhere.c_str(), StepPath(99).c_str()), 0);
  const absl::StatusOr<CheckpointLocation> at = LocateCheckpoint(absl::StrCat(root_, "/", kJobDir));
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->dir, StepDirName(5));
}

// A step directory of a job's directory that cannot be looked into (here
// EACCES; EIO, ESTALE alike) may hold the newest checkpoint: an error
// naming it, not the newest step that could be read. It was skipped, and a
// job given the directory as spec.init.from resumed at step 5, losing the
// steps since; the CLI exported step 5 as the newest.
TEST_F(CheckpointExportTest, LocateCheckpoint_StepDirItCannotLookInto_ErrorNotAnOlderStep) {
  WriteCheckpoint(MakeSnapshot(5));
  WriteCheckpoint(MakeSnapshot(10));
  const std::string job_dir = absl::StrCat(root_, "/", kJobDir);
  ASSERT_EQ(chmod(StepPath(10).c_str(), 0), 0);
  absl::StatusOr<CheckpointLocation> at;
  int code = -1;
  testing::internal::CaptureStderr();
  {
    const WithoutFileAccessOverride unprivileged;
    ASSERT_TRUE(unprivileged.ok());
    at = LocateCheckpoint(job_dir);
    code = RunCheckpoint({"export", job_dir, "--out", out_});
  }
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_EQ(chmod(StepPath(10).c_str(), 0700), 0);
  ASSERT_FALSE(at.ok()) << "took " << at->dir;
  EXPECT_EQ(at.status().code(), absl::StatusCode::kPermissionDenied) << at.status();
  EXPECT_EQ(at.status().message(),
            absl::StrCat("cannot open ", StepPath(10), ": Permission denied; ", StepPath(10),
                         " may hold the newest checkpoint in ", job_dir,
                         ", so none is picked: make it readable, or name the step directory to "
                         "use"));
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find("pipetrain checkpoint export: PERMISSION_DENIED: cannot open " + StepPath(10) +
                     ": Permission denied; "),
            std::string::npos)
      << err;
  EXPECT_EQ(ListDir(out_dir_), std::vector<std::string>{});
}

// A manifest that cannot be read (EACCES here) in a job's directory is an
// error too: its job is unknown, so the two-jobs check cannot be made.
TEST_F(CheckpointExportTest, LocateCheckpoint_ManifestItCannotRead_ErrorNamingIt) {
  WriteCheckpoint(MakeSnapshot(5));
  WriteCheckpoint(MakeSnapshot(10));
  const std::string manifest = StepPath(5) + "/manifest.json";
  ASSERT_EQ(chmod(manifest.c_str(), 0), 0);
  absl::StatusOr<CheckpointLocation> at;
  {
    const WithoutFileAccessOverride unprivileged;
    ASSERT_TRUE(unprivileged.ok());
    at = LocateCheckpoint(absl::StrCat(root_, "/", kJobDir));
  }
  ASSERT_EQ(chmod(manifest.c_str(), 0600), 0);
  ASSERT_FALSE(at.ok()) << "took " << at->dir;
  EXPECT_EQ(at.status().code(), absl::StatusCode::kPermissionDenied) << at.status();
  // The manifest by its resolved path, the step directory as given.
  EXPECT_NE(at.status().message().find("/step-00000005/manifest.json: Permission denied; " +
                                       StepPath(5) + " may hold the newest checkpoint in "),
            std::string::npos)
      << at.status();
  EXPECT_TRUE(LocateCheckpoint(absl::StrCat(root_, "/", kJobDir)).ok());
}

// A manifest.json that is a symbolic link is not read, whatever it points
// to: the coordinator resolving spec.init.from would otherwise parse (and
// quote in its errors) a file from outside the directory it checked.
TEST_F(CheckpointExportTest, LinkedManifest_NotFollowed) {
  WriteCheckpoint(MakeSnapshot(5));
  const std::string manifest = StepPath(5) + "/manifest.json";
  const std::string elsewhere = absl::StrCat(root_, "/elsewhere.json");
  ASSERT_EQ(rename(manifest.c_str(), elsewhere.c_str()), 0);
  ASSERT_TRUE(ReadCheckpointManifest(elsewhere).ok());  // a valid manifest
  ASSERT_EQ(symlink(elsewhere.c_str(), manifest.c_str()), 0);
  const absl::StatusOr<CheckpointManifest> read = ReadCheckpointManifest(manifest);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_NE(read.status().message().find("is a symbolic link"), std::string::npos) << read.status();
}

TEST_F(CheckpointExportTest, RunCheckpoint_JobDir_ExportsNewestStepWithManifest) {
  WriteCheckpoint(MakeSnapshot(5));
  const StageSnapshot newest = MakeSnapshot(10);
  WriteCheckpoint(newest);
  WriteCheckpoint(MakeSnapshot(15), /*manifest=*/false);  // incomplete: skipped
  const std::string job_dir = absl::StrCat(root_, "/", kJobDir);

  absl::StatusOr<CheckpointLocation> at = LocateCheckpoint(job_dir + "/");
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->dir, "step-00000010");
  EXPECT_TRUE(at->newest_of_job);

  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int code = RunCheckpoint({"export", "--out", out_, job_dir});
  const std::string out = testing::internal::GetCapturedStdout();
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_EQ(code, 0) << err;
  EXPECT_NE(err.find("using " + StepPath(10) + ", the newest checkpoint in"), std::string::npos)
      << err;
  const int64_t bytes = static_cast<int64_t>(ReadFile(out_).size());
  EXPECT_EQ(out, absl::StrCat("exported step 10 of job job-t-1: 28 tensors, ",
                              CountParameters(TinyModel()), " parameters, ", bytes, " bytes to ",
                              out_, "\n"));
  absl::StatusOr<SafetensorsContents> file = ReadSafetensors(out_);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(SameBits(*file->Find("h.1.mlp.c_fc.weight"), newest.units[4].values[2].tensor));
}

TEST_F(CheckpointExportTest, LocateCheckpoint_NineDigitStep_ComparesNumerically) {
  for (const char* step : {"step-99999999", "step-100000000", "step-7x"}) {
    const std::string dir = absl::StrCat(root_, "/", step);
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
    WriteFile(dir + "/manifest.json", "{}");
  }
  absl::StatusOr<CheckpointLocation> at = LocateCheckpoint(root_);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->dir, "step-100000000");
}

TEST_F(CheckpointExportTest, ExportCheckpoint_MissingManifest_NotFoundNamingIt) {
  WriteCheckpoint(MakeSnapshot(10), /*manifest=*/false);
  ExpectFailure(StepPath(10), absl::StatusCode::kNotFound, StepPath(10) + "/manifest.json");
  ExpectFailure(root_ + "/" + kJobDir, absl::StatusCode::kNotFound, "/manifest.json is missing");
}

TEST_F(CheckpointExportTest, ExportCheckpoint_UnitMissingFromManifest_DataLoss) {
  v1::ResumeFrom from = WriteCheckpoint(MakeSnapshot(10));
  from.mutable_units()->DeleteSubrange(2, 1);
  WriteManifest(from, kSeed);
  ExpectFailure(StepPath(10), absl::StatusCode::kDataLoss,
                "has no entry for unit 2 (unit-0002.safetensors) of 6");
}

TEST_F(CheckpointExportTest, ExportCheckpoint_MissingUnitFile_NotFoundNamingIt) {
  WriteCheckpoint(MakeSnapshot(10));
  ASSERT_EQ(unlink(UnitPath(10, 5).c_str()), 0);
  ExpectFailure(StepPath(10), absl::StatusCode::kNotFound, "unit-0005.safetensors");
}

TEST_F(CheckpointExportTest, ExportCheckpoint_CorruptUnitFile_DataLossNamingIt) {
  WriteCheckpoint(MakeSnapshot(10));
  std::string bytes = ReadFile(UnitPath(10, 3));
  bytes[bytes.size() - 5] ^= 0x01;
  WriteFile(UnitPath(10, 3), bytes);
  ExpectFailure(StepPath(10), absl::StatusCode::kDataLoss,
                UnitPath(10, 3) + ": SHA-256 differs from the one recorded");
}

TEST_F(CheckpointExportTest, ExportCheckpoint_TruncatedUnitFile_DataLossAndOldOutputKept) {
  WriteCheckpoint(MakeSnapshot(10));
  ASSERT_EQ(truncate(UnitPath(10, 1).c_str(), 100), 0);
  WriteFile(out_, "an earlier export");
  absl::StatusOr<CheckpointExport> done = Export(StepPath(10));
  EXPECT_EQ(done.status().code(), absl::StatusCode::kDataLoss) << done.status();
  EXPECT_NE(done.status().message().find(UnitPath(10, 1) + " is 100 bytes"), std::string::npos)
      << done.status();
  EXPECT_EQ(ReadFile(out_), "an earlier export");
  EXPECT_EQ(ListDir(out_dir_), std::vector<std::string>{"model.safetensors"});
}

TEST_F(CheckpointExportTest, ExportCheckpoint_ManifestOfAnotherFormat_DataLoss) {
  WriteCheckpoint(MakeSnapshot(10));
  nlohmann::json manifest = nlohmann::json::parse(ReadFile(StepPath(10) + "/manifest.json"));
  manifest["format"] = "someone-elses-manifest";
  WriteFile(StepPath(10) + "/manifest.json", manifest.dump());
  ExpectFailure(StepPath(10), absl::StatusCode::kDataLoss,
                StepPath(10) + "/manifest.json: is not a pipetrain checkpoint manifest");
}

TEST_F(CheckpointExportTest, ExportCheckpoint_ManifestOfAnotherSeed_FailedPrecondition) {
  const v1::ResumeFrom from = WriteCheckpoint(MakeSnapshot(10));
  WriteManifest(from, kSeed + 1);
  ExpectFailure(StepPath(10), absl::StatusCode::kFailedPrecondition,
                "unit-0000.safetensors is a checkpoint of another model: seed 7");
}

TEST_F(CheckpointExportTest, ExportCheckpoint_CorruptNewestInJobDir_FailsWithHint) {
  WriteCheckpoint(MakeSnapshot(5));
  WriteCheckpoint(MakeSnapshot(10));
  ASSERT_EQ(truncate(UnitPath(10, 0).c_str(), 10), 0);
  ExpectFailure(root_ + "/" + kJobDir, absl::StatusCode::kDataLoss,
                "step-00000010 is the newest checkpoint with a manifest; to export an older one, "
                "name its step-* directory");
}

TEST_F(CheckpointExportTest, ExportCheckpoint_TiedCopyDiffers_WarnsAndTakesUnitZero) {
  StageSnapshot snapshot = MakeSnapshot(10);
  UnitState& head = snapshot.units.back();
  head.values.back().tensor.data()[3] += 1.0f;  // the head's wte.weight
  WriteCheckpoint(snapshot);
  absl::StatusOr<CheckpointExport> done = Export(StepPath(10));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->warnings.size(), 1u);
  EXPECT_NE(done->warnings[0].find("differs from the embedding's in 1 of 256 elements"),
            std::string::npos)
      << done->warnings[0];
  absl::StatusOr<SafetensorsContents> file = ReadSafetensors(out_);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(SameBits(*file->Find("wte.weight"), snapshot.units[0].values[0].tensor));
}

TEST_F(CheckpointExportTest, LocateCheckpoint_NotADirectory_Errors) {
  EXPECT_EQ(LocateCheckpoint(root_ + "/nothing").status().code(), absl::StatusCode::kNotFound);
  WriteFile(root_ + "/file", "x");
  EXPECT_EQ(LocateCheckpoint(root_ + "/file").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunCheckpoint({"export", root_ + "/file", "--out", out_}), 1);
}

TEST(RunCheckpointTest, RunCheckpoint_BadArguments_ExitTwo) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(RunCheckpoint({}), 2);
  EXPECT_EQ(RunCheckpoint({"import"}), 2);
  EXPECT_EQ(RunCheckpoint({"export", "dir"}), 2);                          // no --out
  EXPECT_EQ(RunCheckpoint({"export", "--out", "x"}), 2);                   // no DIR
  EXPECT_EQ(RunCheckpoint({"export", "a", "b", "--out", "x"}), 2);         // two DIRs
  EXPECT_EQ(RunCheckpoint({"export", "dir", "--out", "x", "--frob"}), 2);  // unknown flag
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--out FILE is required"), std::string::npos) << err;
  EXPECT_NE(err.find("missing the checkpoint directory DIR"), std::string::npos) << err;
  EXPECT_NE(err.find("unknown flag --frob"), std::string::npos) << err;
  testing::internal::CaptureStdout();
  EXPECT_EQ(RunCheckpoint({"export", "--help"}), 0);
  EXPECT_EQ(RunCheckpoint({"--help"}), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("usage: pipetrain checkpoint export DIR --out FILE"), std::string::npos);
}

// ---- the manifest reader -----------------------------------------------------

// A manifest of TinyModel as the coordinator writes it.
nlohmann::json ValidManifest() {
  nlohmann::json m = {
      {"format", "pipetrain-checkpoint-manifest"},
      {"version", 1},
      {"job_id", "j"},
      {"step", 10},
      {"seed", 7},
      {"model",
       {{"vocab_size", 32}, {"max_seq_len", 8}, {"n_layer", 2}, {"n_head", 2}, {"d_model", 8}}},
      {"units", nlohmann::json::array()}};
  for (int u = 0; u < NumUnits(TinyModel()); ++u) {
    m["units"].push_back({{"unit", u},
                          {"file", UnitFileName(u)},
                          {"bytes", 100 + u},
                          {"sha256", std::string(64, 'a')}});
  }
  return m;
}

absl::Status ParseText(const std::string& text) {
  return ParseCheckpointManifest(text, "m.json").status();
}
absl::Status Parse(const nlohmann::json& manifest) { return ParseText(manifest.dump()); }

TEST(CheckpointManifestTest, ParseCheckpointManifest_Valid_ReadsEveryField) {
  absl::StatusOr<CheckpointManifest> m = ParseCheckpointManifest(ValidManifest().dump(), "m");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->job_id, "j");
  EXPECT_EQ(m->step, 10);
  EXPECT_EQ(m->seed, 7u);
  EXPECT_EQ(m->model.n_layer, 2);
  EXPECT_EQ(m->model.d_model, 8);
  ASSERT_EQ(m->units.size(), 6u);
  EXPECT_EQ(m->units[4].unit(), 4);
  EXPECT_EQ(m->units[4].bytes(), 104);
}

TEST(CheckpointManifestTest, ParseCheckpointManifest_BadFields_DataLossNamingThem) {
  const struct {
    const char* json_pointer;
    nlohmann::json value;
    const char* message;
  } cases[] = {
      {"/version", 2, "m.json: is a checkpoint manifest of another version"},
      {"/step", 0, "m.json: step must be in [1, 100000000], got 0"},
      {"/step", -3, "m.json: step must be a non-negative integer"},
      {"/step", 2.5, "m.json: step must be a non-negative integer"},
      {"/seed", "7", "m.json: seed must be a non-negative integer"},
      {"/job_id", 5, "m.json: job_id must be a string"},
      {"/job_id", std::string(257, 'j'), "job_id is longer than 256 bytes"},
      {"/model", nlohmann::json::array(), "m.json: model must be an object"},
      {"/model/n_layer", 257, "m.json: model.n_layer must be in [1, 256], got 257"},
      {"/model/vocab_size", 65537, "model.vocab_size must be in [1, 65536], got 65537"},
      {"/model/d_model", 16385, "model.d_model must be in [1, 16384]"},
      {"/model/n_head", 3, "m.json: model: n_head (3) must divide d_model (8)"},
      {"/model/max_seq_len", 65537, "model.max_seq_len must be in [1, 65536]"},
      {"/units", "all", "m.json: units must be an array"},
      {"/units/2", 2, "m.json: units[2] must be an object"},
      {"/units/2/unit", 6, "m.json: units[2].unit must be in [0, 5], got 6"},
      {"/units/2/unit", 1, "unit-0002.safetensors\"; unit 1's file is unit-0001.safetensors"},
      {"/units/2/file", "../x", "units[2].file is \"../x\"; unit 2's file is unit-0002"},
      {"/units/2/bytes", 0, "units[2].bytes must be in [1, 9223372036854775807], got 0"},
      {"/units/2/sha256", std::string(64, 'A'), "units[2].sha256 must be 64 lowercase hex"},
      {"/units/2/sha256", std::string(63, 'a'), "units[2].sha256 must be 64 lowercase hex"},
  };
  for (const auto& c : cases) {
    nlohmann::json manifest = ValidManifest();
    manifest[nlohmann::json::json_pointer(c.json_pointer)] = c.value;
    const absl::Status status = Parse(manifest);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << c.json_pointer << ": " << status;
    EXPECT_NE(status.message().find(c.message), std::string::npos)
        << c.json_pointer << ": " << status;
  }
}

TEST(CheckpointManifestTest, ParseCheckpointManifest_BadStructure_DataLoss) {
  nlohmann::json twice = ValidManifest();
  twice["units"][1]["unit"] = 0;
  twice["units"][1]["file"] = UnitFileName(0);
  EXPECT_NE(Parse(twice).message().find("unit 0 is listed twice"), std::string::npos);
  nlohmann::json extra = ValidManifest();
  extra["units"].push_back(extra["units"][0]);
  EXPECT_NE(Parse(extra).message().find("units lists 7 files; the model has 6 units"),
            std::string::npos);
  nlohmann::json no_step = ValidManifest();
  no_step.erase("step");
  EXPECT_NE(Parse(no_step).message().find("m.json: step is missing"), std::string::npos);
  nlohmann::json no_format = ValidManifest();
  no_format.erase("format");
  EXPECT_NE(Parse(no_format).message().find("is not a pipetrain checkpoint manifest"),
            std::string::npos);
  nlohmann::json huge = ValidManifest();  // 4.3e9 parameters: past kMaxParameters
  huge["model"]["vocab_size"] = 65536;
  huge["model"]["d_model"] = 16384;
  huge["model"]["n_layer"] = 256;
  huge["units"] = nlohmann::json::array();
  EXPECT_NE(Parse(huge).message().find("parameters; the limit is 4294967296"), std::string::npos)
      << Parse(huge);
  for (const char* text : {"", "{", "[1, 2]", "null", "{\"format\": 1}"}) {
    EXPECT_EQ(ParseText(text).code(), absl::StatusCode::kDataLoss) << text;
  }
  const std::string valid = ValidManifest().dump();
  EXPECT_EQ(ParseText(valid.substr(0, valid.size() / 2)).code(), absl::StatusCode::kDataLoss);
}

TEST(CheckpointManifestTest, ReadCheckpointManifest_MissingOrTooLarge_Errors) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  EXPECT_EQ(ReadCheckpointManifest(dir + "/none.json").status().code(),
            absl::StatusCode::kNotFound);
  WriteFile(dir + "/big.json", std::string(kMaxCheckpointManifestBytes + 1, ' '));
  EXPECT_EQ(ReadCheckpointManifest(dir + "/big.json").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadCheckpointManifest(dir).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace pipetrain
