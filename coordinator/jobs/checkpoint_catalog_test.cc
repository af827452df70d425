#include "coordinator/jobs/checkpoint_catalog.h"

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "worker/checkpoint/checkpoint_manifest.h"

namespace pipetrain {
namespace {

// 1 layer: 4 units (embed, attn_0, mlp_0, head), checkpoints every step.
class CheckpointCatalogTest : public ::testing::Test {
 protected:
  CheckpointCatalogTest() : catalog_(Spec(), Model(), /*steps=*/1000) {}

  static v1::CheckpointSpec Spec() {
    v1::CheckpointSpec spec;
    spec.set_dir("ck");
    spec.set_interval_steps(1);
    spec.set_keep(2);
    return spec;
  }
  static GptConfig Model() {
    GptConfig model;
    model.n_layer = 1;
    return model;
  }
  // Stage 0 owns units [0, 2), stage 1 units [2, 4).
  static v1::UnitRange Owned(int stage) {
    v1::UnitRange r;
    r.set_begin(2 * stage);
    r.set_end(2 * stage + 2);
    return r;
  }
  // Stage `stage`'s report of its units at `step`; true if it completed it.
  bool Report(int stage, int64_t step) {
    absl::StatusOr<std::optional<v1::ResumeFrom>> added =
        catalog_.Add(ReportOf(stage, step), Owned(stage));
    EXPECT_TRUE(added.ok()) << added.status();
    return added.ok() && added->has_value();
  }
  static v1::CheckpointWritten ReportOf(int stage, int64_t step) {
    v1::CheckpointWritten report;
    report.set_step(step);
    for (int u = 2 * stage; u < 2 * stage + 2; ++u) {
      v1::UnitFile* f = report.add_units();
      f->set_unit(u);
      f->set_file(absl::StrFormat("unit-%04d.safetensors", u));
      f->set_bytes(100);
      f->set_sha256(std::string(64, 'a'));
    }
    return report;
  }
  std::vector<int64_t> AbandonedSteps() {
    std::vector<int64_t> steps;
    for (const v1::ResumeFrom& gone : catalog_.TakeAbandoned()) {
      EXPECT_EQ(gone.dir(), absl::StrFormat("ck/step-%08d", gone.step()));
      steps.push_back(gone.step());
    }
    return steps;
  }

  CheckpointCatalog catalog_;
};

// A stage that reports steps far ahead (a hostile job member, with valid
// names and checksums) keeps only its own entries there: the other
// stage's report of the current step is not displaced, and it completes.
TEST_F(CheckpointCatalogTest, StepsReportedFarAhead_DisplaceNoOtherStage) {
  for (int64_t step = 990; step < 1000; ++step) EXPECT_FALSE(Report(1, step));
  EXPECT_FALSE(Report(0, 1));
  EXPECT_TRUE(Report(1, 1));
  ASSERT_NE(catalog_.Latest(), nullptr);
  EXPECT_EQ(catalog_.Latest()->step(), 1);
  // Stage 1 keeps kMaxPendingCheckpoints incomplete steps (step 1 among
  // them when it reported it); the older of its far steps were dropped
  // for good (their directories to remove).
  std::vector<int64_t> dropped;
  for (int64_t step = 990; step < 1000 - (kMaxPendingCheckpoints - 1); ++step) {
    dropped.push_back(step);
  }
  EXPECT_EQ(AbandonedSteps(), dropped);
}

// A report must list units: an empty one would hold a pending step that
// counts against no stage's limit.
// Fields the coordinator does not know, in a member's report of its unit
// files, would ride into the stored job and every assignment that resumes
// from the checkpoint: they are dropped.
TEST_F(CheckpointCatalogTest, UnitFileUnknownFields_NotKept) {
  v1::CheckpointWritten report;
  report.set_step(1);
  for (int u = 0; u < 4; ++u) {
    v1::UnitFile* f = report.add_units();
    f->set_unit(u);
    f->set_file(absl::StrFormat("unit-%04d.safetensors", u));
    f->set_bytes(100);
    f->set_sha256(std::string(64, 'a'));
    f->GetReflection()->MutableUnknownFields(f)->AddLengthDelimited(99, std::string(1 << 16, 'u'));
  }
  v1::UnitRange all;
  all.set_begin(0);
  all.set_end(4);
  absl::StatusOr<std::optional<v1::ResumeFrom>> added = catalog_.Add(report, all);
  ASSERT_TRUE(added.ok()) << added.status();
  ASSERT_TRUE(added->has_value());
  ASSERT_EQ((*added)->units_size(), 4);
  for (const v1::UnitFile& f : (*added)->units()) {
    EXPECT_TRUE(f.GetReflection()->GetUnknownFields(f).empty()) << f.unit();
  }
  EXPECT_LT((*added)->ByteSizeLong(), 1000u);
}

TEST_F(CheckpointCatalogTest, ReportWithoutUnits_Refused) {
  v1::CheckpointWritten report;
  report.set_step(3);
  absl::StatusOr<std::optional<v1::ResumeFrom>> added = catalog_.Add(report, Owned(0));
  EXPECT_EQ(added.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(added.status().message(), "ReportProgressRequest.checkpoint.units: none listed");
}

// A stage's oldest incomplete step beyond its limit, and the incomplete
// steps older than one that completes, are abandoned; a step that is a
// complete checkpoint's is not, even when it was being done again.
TEST_F(CheckpointCatalogTest, IncompleteStepsThatCannotComplete_AreAbandoned) {
  const int64_t done = kMaxPendingCheckpoints + 2;
  for (int64_t step = 1; step <= done; ++step) EXPECT_FALSE(Report(0, step));
  EXPECT_EQ(AbandonedSteps(), (std::vector<int64_t>{1, 2}));  // 3 to 6 kept
  EXPECT_TRUE(Report(1, done));
  std::vector<int64_t> older;
  for (int64_t step = 3; step < done; ++step) older.push_back(step);
  EXPECT_EQ(AbandonedSteps(), older);
  EXPECT_FALSE(Report(0, done));  // done again (after a recovery): not new
  EXPECT_FALSE(Report(0, done + 2));
  EXPECT_TRUE(Report(1, done + 2));
  EXPECT_EQ(AbandonedSteps(), std::vector<int64_t>{});  // `done` is complete
  EXPECT_EQ(catalog_.Latest()->step(), done + 2);
}

// Holds says which complete checkpoints the catalog still has: not the
// expired ones (beyond keep 2), not a dropped one, not an incomplete step.
// Steps 5 and 6 complete; a recovery resumes from 5 (6's loss never came):
// 6 is forgotten, counts as incomplete, and its redo completes it anew.
TEST_F(CheckpointCatalogTest, ForgetAfter_LaterCheckpointsRedoneAndCompletedAnew) {
  ASSERT_FALSE(Report(0, 5));
  ASSERT_TRUE(Report(1, 5));
  ASSERT_FALSE(Report(0, 6));
  ASSERT_TRUE(Report(1, 6));
  const std::vector<v1::ResumeFrom> forgotten = catalog_.ForgetAfter(5);
  ASSERT_EQ(forgotten.size(), 1u);
  EXPECT_EQ(forgotten[0].step(), 6);
  EXPECT_EQ(forgotten[0].dir(),
            catalog_.Latest()->dir().substr(0, forgotten[0].dir().rfind('/')) + "/step-00000006");
  EXPECT_FALSE(catalog_.Holds(6));
  ASSERT_NE(catalog_.Latest(), nullptr);
  EXPECT_EQ(catalog_.Latest()->step(), 5);
  catalog_.ClearPending();  // the recovery's re-plan
  EXPECT_FALSE(Report(0, 6));
  EXPECT_TRUE(Report(1, 6));  // a new completion
  EXPECT_EQ(catalog_.Latest()->step(), 6);
  EXPECT_TRUE(catalog_.TakeIncomplete().empty());  // 6 is complete again
  EXPECT_TRUE(catalog_.ForgetAfter(6).empty());
}

// A forgotten step its redo never completes is swept at the job's end.
TEST_F(CheckpointCatalogTest, ForgetAfter_StepNeverRedone_HandedOverAsIncomplete) {
  ASSERT_FALSE(Report(0, 7));
  ASSERT_TRUE(Report(1, 7));
  ASSERT_FALSE(Report(0, 8));
  ASSERT_TRUE(Report(1, 8));
  const std::vector<v1::ResumeFrom> forgotten = catalog_.ForgetAfter(7);
  ASSERT_EQ(forgotten.size(), 1u);
  ASSERT_EQ(forgotten[0].step(), 8);
  const std::vector<v1::ResumeFrom> incomplete = catalog_.TakeIncomplete();
  ASSERT_EQ(incomplete.size(), 1u);
  EXPECT_EQ(incomplete[0].step(), 8);
}

// A stored list is taken only whole and well formed: a damaged or hostile
// store must not make the catalog expire (delete) another job's files.
TEST_F(CheckpointCatalogTest, RestoreComplete_OnlyTheJobsOwnWellFormedCheckpoints) {
  ASSERT_FALSE(Report(0, 3));
  ASSERT_TRUE(Report(1, 3));
  ASSERT_FALSE(Report(0, 4));
  ASSERT_TRUE(Report(1, 4));
  const std::vector<v1::ResumeFrom> good = catalog_.Complete();
  ASSERT_EQ(good.size(), 2u);
  CheckpointCatalog restored(Spec(), Model(), 1000);
  EXPECT_EQ(restored.RestoreComplete(good, 0), "");
  EXPECT_EQ(restored.Latest()->step(), 4);
  struct Case {
    const char* label;
    std::function<void(std::vector<v1::ResumeFrom>&)> damage;
    const char* reason;
  };
  const Case cases[] = {
      {"another job's directory",
       [](auto& c) { c[0].set_dir("checkpoints/job-other/step-00000003"); },
       "checkpoint of step 3 names directory \"checkpoints/job-other/step-00000003\", not "
       "\"ck/step-00000003\""},
      {"steps out of order", [](auto& c) { std::swap(c[0], c[1]); }, "steps must ascend"},
      {"a step past the job's", [](auto& c) { c[1].set_step(1000); }, "steps must ascend"},
      {"a unit missing", [](auto& c) { c[1].mutable_units()->RemoveLast(); },
       "lists 3 units; the model has 4"},
      {"another file", [](auto& c) { c[1].mutable_units(2)->set_file("../../x"); },
       "its unit 2 entry is not unit 2's file"},
      {"a bad checksum", [](auto& c) { c[0].mutable_units(0)->set_sha256("zz"); },
       "its unit 0 entry"},
  };
  for (const Case& c : cases) {
    std::vector<v1::ResumeFrom> damaged = good;
    c.damage(damaged);
    CheckpointCatalog catalog(Spec(), Model(), 1000);
    const std::string reason = catalog.RestoreComplete(damaged, 0);
    EXPECT_NE(reason.find(c.reason), std::string::npos) << c.label << ": " << reason;
    EXPECT_EQ(catalog.Latest(), nullptr) << c.label;  // nothing taken
  }
}

// With a cutoff, files written at or after it stay (the redo of a dropped
// step writes its units anew); the manifest too, unless it is to go
// whatever its time: a dropped checkpoint's manifest whose write ran late
// must not outlive the units it lists.
TEST(RemoveCheckpointDirTest, Cutoff_NewerFilesStay_TheManifestOnlyIfAsked) {
  for (const bool manifest_whatever_its_time : {false, true}) {
    const std::string out =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/remove-cutoff-", manifest_whatever_its_time);
    const std::string dir = out + "/ck/step-00000005";
    std::filesystem::create_directories(dir);
    const absl::Time now = absl::Now();
    const auto write = [&](const std::string& name, absl::Time mtime) {
      std::ofstream(dir + "/" + name) << "x";
      const timespec times[2] = {absl::ToTimespec(mtime), absl::ToTimespec(mtime)};
      ASSERT_EQ(utimensat(AT_FDCWD, (dir + "/" + name).c_str(), times, 0), 0) << name;
    };
    write("unit-0000.safetensors", now - absl::Seconds(60));  // the dropped step's
    write("unit-0001.safetensors", now);                      // the redo's
    write(kCheckpointManifestName, now);                      // written late
    v1::ResumeFrom from;
    from.set_step(5);
    from.set_dir("ck/step-00000005");
    ASSERT_TRUE(
        RemoveCheckpointDir(out, from, now - absl::Seconds(30), manifest_whatever_its_time).ok());
    const auto exists = [&](const std::string& name) {
      return std::filesystem::exists(dir + "/" + name);
    };
    EXPECT_FALSE(exists("unit-0000.safetensors")) << manifest_whatever_its_time;
    EXPECT_TRUE(exists("unit-0001.safetensors")) << manifest_whatever_its_time;
    EXPECT_EQ(exists(kCheckpointManifestName), !manifest_whatever_its_time);
  }
}

// A checkpoint dropped as unusable at this host's time T, on a file server
// whose clock is 20 minutes behind: its files read T - 20 min. The redo of
// the step, 10 minutes on, writes a unit dated T - 10 min. The bound taken
// from the files at the drop removes the dropped files and spares the
// redo's; T as the bound (this host's clock) deleted the redo's unit, and
// the step's manifest later named a missing file.
TEST(CheckpointFilesBoundTest, DroppedOnAClockAhead_RedoOnTheServersClockKept) {
  const std::string out = absl::StrCat(std::getenv("TEST_TMPDIR"), "/files-bound");
  const std::string dir = out + "/ck/step-00000010";
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& name, absl::Time mtime) {
    std::ofstream(dir + "/" + name) << "x";
    const timespec times[2] = {absl::ToTimespec(mtime), absl::ToTimespec(mtime)};
    ASSERT_EQ(utimensat(AT_FDCWD, (dir + "/" + name).c_str(), times, 0), 0) << name;
  };
  v1::ResumeFrom from;
  from.set_step(10);
  from.set_dir("ck/step-00000010");
  const absl::StatusOr<absl::Time> empty = CheckpointFilesBound(out, from);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, absl::InfinitePast());
  const absl::Time dropped_at = absl::Now();  // T
  const absl::Time server = dropped_at - absl::Minutes(20);
  write("unit-0000.safetensors", server - absl::Seconds(2));
  write("unit-0001.safetensors", server - absl::Seconds(1));
  write(kCheckpointManifestName, server);
  const absl::StatusOr<absl::Time> bound = CheckpointFilesBound(out, from);
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(*bound, server + absl::Nanoseconds(1));
  write("unit-0001.safetensors", server + absl::Minutes(10));  // the redo's
  ASSERT_TRUE(RemoveCheckpointDir(out, from, *bound, /*manifest_whatever_its_time=*/true).ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/unit-0000.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + kCheckpointManifestName));
  EXPECT_TRUE(std::filesystem::exists(dir + "/unit-0001.safetensors"))
      << "the redo's unit, written after the drop, was removed";
  std::filesystem::remove_all(dir);
  const absl::StatusOr<absl::Time> gone = CheckpointFilesBound(out, from);
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_EQ(*gone, absl::InfinitePast());
}

// StepDirsWithManifest fails closed, as Submit's check that a job
// overwrites no complete checkpoint needs: a directory it cannot list is
// an error, not "no checkpoints" (a missing one has none). Out of
// descriptors in a child whose limit is its lowest free descriptor, so
// that its next open fails. StepDirsWithoutManifest has none then.
TEST(StepDirsWithManifestTest, CompleteStepsListed_UnlistableDirectoryAnError) {
  const std::string out = absl::StrCat(std::getenv("TEST_TMPDIR"), "/with-manifest");
  for (const char* step : {"step-00000002", "step-00000004"}) {
    std::filesystem::create_directories(absl::StrCat(out, "/ck/", step));
  }
  std::ofstream(out + "/ck/step-00000002/" + kCheckpointManifestName) << "{}";
  std::ofstream(out + "/ck/step-00000006") << "a file, not a step directory";
  const absl::StatusOr<std::vector<v1::ResumeFrom>> complete = StepDirsWithManifest(out, "ck");
  ASSERT_TRUE(complete.ok()) << complete.status();
  ASSERT_EQ(complete->size(), 1u);
  EXPECT_EQ((*complete)[0].dir(), "ck/step-00000002");
  EXPECT_EQ((*complete)[0].step(), 2);
  const std::vector<v1::ResumeFrom> incomplete = StepDirsWithoutManifest(out, "ck");
  ASSERT_EQ(incomplete.size(), 1u);
  EXPECT_EQ(incomplete[0].dir(), "ck/step-00000004");
  const absl::StatusOr<std::vector<v1::ResumeFrom>> missing = StepDirsWithManifest(out, "none");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_TRUE(missing->empty());
  // Prints what both answer, for the expectation to match.
  const auto list_out_of_descriptors = [&out] {
    const int lowest_free = dup(0);
    close(lowest_free);
    const struct rlimit limit = {static_cast<rlim_t>(lowest_free),
                                 static_cast<rlim_t>(lowest_free)};
    if (lowest_free < 0 || setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(2);
    fprintf(stderr, "[%s] [%zu]\n", StepDirsWithManifest(out, "ck").status().ToString().c_str(),
            StepDirsWithoutManifest(out, "ck").size());
    _exit(0);
  };
  EXPECT_EXIT(list_out_of_descriptors(), ::testing::ExitedWithCode(0),
              "\\[RESOURCE_EXHAUSTED: cannot open the coordinator's --output-dir .*/with-manifest: "
              "Too many open files \\[type\\.pipetrain/errno='24'\\]\\] \\[0\\]");
}

// Makes system call `nr` fail with `error` in this process for good; every
// other call goes through (this process's own architecture's numbers: a
// test makes no other). False where the kernel or a sandbox refuses.
bool FailSyscall(long nr, int error) {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (error & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  const struct sock_fprog program = {static_cast<unsigned short>(std::size(filter)), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

// Whether FailSyscall works here, tried in a child (the filter stays).
bool SeccompFiltersWork() {
  const pid_t child = fork();
  if (child == 0) _exit(FailSyscall(__NR_getpid, EPERM) && syscall(__NR_getpid) == -1 ? 0 : 1);
  int status = 0;
  return child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) &&
         WEXITSTATUS(status) == 0;
}

// A step directory that cannot be listed is an error, for the caller to
// try again: read as empty, its unit files stayed, the directory was then
// not empty, and with `written_before` that passed for files kept on
// purpose, so an expired checkpoint was forgotten with its files on disk
// for good. Each failure in a child whose seccomp filter fails one call of
// the listing: a lowered descriptor limit cannot fail the listing's dup
// without failing the path walk first, which holds two descriptors at once
// as the listing does (the walk's last one and its dup). The descriptor
// dup'ed for a listing that failed is closed: the two lowest free ones are
// the same after.
TEST(RemoveCheckpointDirTest, UnlistableDirectory_AnErrorTheFilesKept) {
  if (!SeccompFiltersWork()) GTEST_SKIP() << "no seccomp filter can be installed here";
  const std::string out = absl::StrCat(std::getenv("TEST_TMPDIR"), "/unlistable");
  const std::string dir = out + "/ck/step-00000005";
  std::filesystem::create_directories(dir);
  const std::vector<std::string> units = {"unit-0000.safetensors", "unit-0001.safetensors"};
  for (const std::string& unit : units) std::ofstream(dir + "/" + unit) << "weights";
  v1::ResumeFrom from;
  from.set_step(5);
  from.set_dir("ck/step-00000005");
  struct Case {
    const char* call;
    long nr;
    int error;
    const char* code;
  };
  const Case cases[] = {
      {"dup", __NR_dup, EMFILE, "RESOURCE_EXHAUSTED"},
      {"fdopendir's fcntl", __NR_fcntl, ENOMEM, "RESOURCE_EXHAUSTED"},
      {"readdir's getdents64", __NR_getdents64, EIO, "UNKNOWN"},
  };
  // The two lowest free descriptors: the path walk's, the second the dup's.
  const auto lowest_free = [] {
    const int first = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const int second = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    close(first);
    close(second);
    return std::make_pair(first, second);
  };
  for (const Case& c : cases) {
    // Prints the status and whether a descriptor leaked.
    const auto remove_failing = [&out, &from, &c, &lowest_free] {
      const std::pair<int, int> before = lowest_free();
      if (before.second < 0 || !FailSyscall(c.nr, c.error)) _exit(2);
      // Every file is older than the bound: only the listing keeps them.
      const absl::Status removed = RemoveCheckpointDir(out, from, absl::InfiniteFuture());
      fprintf(stderr, "[%s] [%s]\n", removed.ToString().c_str(),
              lowest_free() == before ? "none leaked" : "leaked");
      _exit(0);
    };
    EXPECT_EXIT(remove_failing(), ::testing::ExitedWithCode(0),
                absl::StrCat("\\[", c.code, ": cannot list .*/unlistable/ck/step-00000005: ",
                             strerror(c.error), "\\] \\[none leaked\\]"))
        << c.call;
    for (const std::string& unit : units) {
      EXPECT_TRUE(std::filesystem::exists(dir + "/" + unit)) << c.call << ": " << unit;
    }
  }
  // Listed, the files and the directory go: a retry removes them.
  ASSERT_TRUE(RemoveCheckpointDir(out, from, absl::InfiniteFuture()).ok());
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// A manifest whose time cannot be read is an error, not "no manifest":
// read as none, an expired checkpoint's removal took this host's clock for
// its files' bound and kept it for every retry, and deleted a redo's unit
// written on a file server whose clock is behind. Out of descriptors in a
// child whose limit is its lowest free descriptor; the manifest's stat
// failing with EIO in a child whose seccomp filter fails newfstatat (the
// path walk's own stat of the name only refuses links and directories).
TEST(CheckpointManifestTimeTest, NoneOrItsTime_UnreadableAnError) {
  const std::string out = absl::StrCat(std::getenv("TEST_TMPDIR"), "/manifest-time");
  const std::string dir = out + "/ck/step-00000005";
  v1::ResumeFrom from;
  from.set_step(5);
  from.set_dir("ck/step-00000005");
  std::filesystem::create_directories(out);
  absl::StatusOr<std::optional<absl::Time>> time = CheckpointManifestTime(out, from);
  ASSERT_TRUE(time.ok()) << time.status();
  EXPECT_EQ(*time, std::nullopt) << "the directory is gone";
  std::filesystem::create_directories(dir);
  time = CheckpointManifestTime(out, from);
  ASSERT_TRUE(time.ok()) << time.status();
  EXPECT_EQ(*time, std::nullopt) << "no manifest";
  const absl::Time written = absl::FromUnixSeconds(1700000000) + absl::Nanoseconds(5);
  std::ofstream(dir + "/" + kCheckpointManifestName) << "{}";
  const timespec times[2] = {absl::ToTimespec(written), absl::ToTimespec(written)};
  ASSERT_EQ(utimensat(AT_FDCWD, (dir + "/" + kCheckpointManifestName).c_str(), times, 0), 0);
  time = CheckpointManifestTime(out, from);
  ASSERT_TRUE(time.ok()) << time.status();
  EXPECT_EQ(*time, std::optional<absl::Time>(written));
  // Prints what it answers, for the expectation to match.
  const auto print = [&out, &from] {
    const absl::StatusOr<std::optional<absl::Time>> t = CheckpointManifestTime(out, from);
    fprintf(stderr, "[%s]\n",
            t.ok() ? (t->has_value() ? "a time" : "none") : t.status().ToString().c_str());
  };
  const auto out_of_descriptors = [&print] {
    const int lowest_free = dup(0);
    close(lowest_free);
    const struct rlimit limit = {static_cast<rlim_t>(lowest_free),
                                 static_cast<rlim_t>(lowest_free)};
    if (lowest_free < 0 || setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(2);
    print();
    _exit(0);
  };
  EXPECT_EXIT(out_of_descriptors(), ::testing::ExitedWithCode(0),
              "\\[RESOURCE_EXHAUSTED: cannot open the coordinator's --output-dir "
              ".*/manifest-time: Too many open files");
  if (!SeccompFiltersWork()) GTEST_SKIP() << "no seccomp filter can be installed here";
  const auto stat_fails = [&print] {
    if (!FailSyscall(__NR_newfstatat, EIO)) _exit(2);
    print();
    _exit(0);
  };
  EXPECT_EXIT(stat_fails(), ::testing::ExitedWithCode(0),
              absl::StrCat("\\[UNKNOWN: cannot read .*/manifest-time/ck/step-00000005/",
                           kCheckpointManifestName, ": ", strerror(EIO)));
}

// The stored record's checkpoint bytes grow with keep and the model's
// units; the bound gives the largest keep that fits.
TEST(StoredCheckpointBytesTest, GrowsWithKeepAndUnits_BoundGivesTheLargestKeep) {
  v1::CheckpointSpec spec;
  spec.set_dir("checkpoints/job-1");
  spec.set_keep(2);
  const int64_t small = StoredCheckpointBytes(spec, 4);
  spec.set_keep(6);
  // keep + 2 records: the checkpoint a resume would take, held beyond keep
  // (SetReached), and an init.from one.
  EXPECT_EQ(StoredCheckpointBytes(spec, 4), small * 2);
  EXPECT_GT(StoredCheckpointBytes(spec, 514), StoredCheckpointBytes(spec, 4) * 100);
  const int keep = MaxStoredKeep(spec, 514);  // GPT-2 at 256 layers
  ASSERT_GE(keep, 1);
  spec.set_keep(keep);
  EXPECT_LE(StoredCheckpointBytes(spec, 514), kMaxStoredCheckpointBytes);
  spec.set_keep(keep + 1);
  EXPECT_GT(StoredCheckpointBytes(spec, 514), kMaxStoredCheckpointBytes);
}

// The newest complete checkpoint at or before the step the job's loss
// reached is a resume's, and is never expired: with a loss stage that
// writes no units (a forward-only head), checkpoints complete ahead of the
// loss, and expiring by keep alone deleted the last one a recovery could
// take (the job went back to step 0). Held beyond keep until the loss
// reaches a newer one; a recovery's ForgetAfter lowers the step reached.
TEST_F(CheckpointCatalogTest, ResumableCheckpoint_NeverExpiredWhileTheLossLagsBehind) {
  const auto steps = [](const std::vector<v1::ResumeFrom>& list) {
    std::vector<int64_t> out;
    for (const v1::ResumeFrom& c : list) out.push_back(c.step());
    return out;
  };
  catalog_.SetReached(1);
  for (int64_t step = 1; step <= 4; ++step) {
    EXPECT_FALSE(Report(0, step));
    EXPECT_TRUE(Report(1, step));
  }
  EXPECT_EQ(steps(catalog_.Complete()), (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(steps(catalog_.TakeExpired()), std::vector<int64_t>{2});
  EXPECT_EQ(catalog_.LatestAtOrBefore(1)->step(), 1);
  catalog_.SetReached(3);
  EXPECT_EQ(steps(catalog_.TakeExpired()), std::vector<int64_t>{1});
  EXPECT_EQ(steps(catalog_.Complete()), (std::vector<int64_t>{3, 4}));
  // Back to 3 after a recovery: 4 is forgotten (redone), 5 and 6 complete
  // before the loss passes 3 again: 3 stays.
  EXPECT_EQ(steps(catalog_.ForgetAfter(3)), std::vector<int64_t>{4});
  for (int64_t step = 4; step <= 6; ++step) {
    EXPECT_FALSE(Report(0, step));
    EXPECT_TRUE(Report(1, step));
  }
  EXPECT_EQ(steps(catalog_.Complete()), (std::vector<int64_t>{3, 5, 6}));
  EXPECT_EQ(steps(catalog_.TakeExpired()), std::vector<int64_t>{4});
  // Restored with the step reached as stored: the held one is kept.
  CheckpointCatalog restored(Spec(), Model(), /*steps=*/1000);
  ASSERT_EQ(restored.RestoreComplete(catalog_.Complete(), 3), "");
  EXPECT_FALSE(restored.Add(ReportOf(0, 7), Owned(0)).value().has_value());
  EXPECT_TRUE(restored.Add(ReportOf(1, 7), Owned(1)).value().has_value());
  EXPECT_EQ(steps(restored.Complete()), (std::vector<int64_t>{3, 6, 7}));
  EXPECT_EQ(steps(restored.TakeExpired()), std::vector<int64_t>{5});
}

TEST_F(CheckpointCatalogTest, Holds_OnlyCompleteOnesStillKept) {
  for (int64_t step = 1; step <= 3; ++step) {
    EXPECT_FALSE(Report(0, step));
    EXPECT_TRUE(Report(1, step));
  }
  EXPECT_FALSE(catalog_.Holds(1));  // expired
  EXPECT_TRUE(catalog_.Holds(2));
  EXPECT_TRUE(catalog_.Holds(3));
  EXPECT_FALSE(Report(0, 4));
  EXPECT_FALSE(catalog_.Holds(4));  // incomplete
  ASSERT_TRUE(catalog_.Drop(3).has_value());
  EXPECT_FALSE(catalog_.Holds(3));
  EXPECT_FALSE(catalog_.Drop(3).has_value());
}

// A report is a repeat when its units are recorded as it says, pending or
// complete; not once they are forgotten, nor with other bytes.
TEST_F(CheckpointCatalogTest, Repeats_OnlyWhatIsRecordedAsReported) {
  EXPECT_FALSE(catalog_.Repeats(ReportOf(0, 1)));
  EXPECT_FALSE(Report(0, 1));
  EXPECT_TRUE(catalog_.Repeats(ReportOf(0, 1)));   // pending
  EXPECT_FALSE(catalog_.Repeats(ReportOf(1, 1)));  // not yet
  EXPECT_TRUE(Report(1, 1));
  EXPECT_TRUE(catalog_.Repeats(ReportOf(0, 1)));  // complete
  EXPECT_TRUE(catalog_.Repeats(ReportOf(1, 1)));
  v1::CheckpointWritten other = ReportOf(1, 1);
  other.mutable_units(1)->set_sha256(std::string(64, 'b'));
  EXPECT_FALSE(catalog_.Repeats(other));
  other = ReportOf(1, 1);
  other.clear_units();
  EXPECT_FALSE(catalog_.Repeats(other));
  catalog_.ForgetAfter(0);  // a recovery from before step 1: redone
  EXPECT_FALSE(catalog_.Repeats(ReportOf(1, 1)));
}

// At the job's end: the steps with units reported that never completed,
// those a re-plan forgot (ClearPending) among them, but not one abandoned
// already (handed over then) nor a complete checkpoint's step.
TEST_F(CheckpointCatalogTest, TakeIncomplete_StepsNeverCompletedOrHandedOver) {
  EXPECT_FALSE(Report(0, 1));
  EXPECT_TRUE(Report(1, 1));
  EXPECT_FALSE(Report(0, 2));  // a recovery stops the job short of step 2
  catalog_.ClearPending();
  EXPECT_FALSE(Report(0, 1));  // redone: step 1 is complete already
  EXPECT_FALSE(Report(1, 3));
  EXPECT_FALSE(Report(0, 4));
  EXPECT_TRUE(Report(1, 4));  // step 3 abandoned
  EXPECT_EQ(AbandonedSteps(), std::vector<int64_t>{3});
  EXPECT_FALSE(Report(0, 5));
  std::vector<int64_t> steps;
  for (const v1::ResumeFrom& gone : catalog_.TakeIncomplete()) {
    EXPECT_EQ(gone.dir(), absl::StrFormat("ck/step-%08d", gone.step()));
    EXPECT_EQ(gone.units_size(), 0);
    steps.push_back(gone.step());
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 5}));
  EXPECT_TRUE(catalog_.TakeIncomplete().empty());  // handed over once
  EXPECT_TRUE(catalog_.Holds(4));
}

// A step whose writes failed (a full disk) keeps the files written before
// the failure: every stage failed (no units reported) or one did. It is
// handed over when a later step completes, or at the end; a complete step
// or one off the job's steps is left alone, and failures of many steps
// keep at most kMaxPendingCheckpoints of them (the oldest handed over).
// Before, a step every stage failed was in neither list.
TEST_F(CheckpointCatalogTest, FailedSteps_HandedOverOnceALaterOneCompletesOrAtTheEnd) {
  catalog_.Failed(1);  // both stages failed
  catalog_.Failed(1);
  EXPECT_FALSE(Report(0, 2));
  catalog_.Failed(2);  // stage 1 failed; stage 0's files are there
  EXPECT_FALSE(Report(0, 3));
  EXPECT_TRUE(Report(1, 3));
  EXPECT_EQ(AbandonedSteps(), (std::vector<int64_t>{1, 2}));
  catalog_.Failed(3);     // complete: left alone
  catalog_.Failed(5000);  // not a step of the job
  catalog_.Failed(4);
  std::vector<int64_t> steps;
  for (const v1::ResumeFrom& gone : catalog_.TakeIncomplete()) steps.push_back(gone.step());
  EXPECT_EQ(steps, std::vector<int64_t>{4});
  EXPECT_TRUE(catalog_.Holds(3));

  for (int64_t step = 10; step < 10 + kMaxPendingCheckpoints + 2; ++step) catalog_.Failed(step);
  EXPECT_EQ(AbandonedSteps(), (std::vector<int64_t>{10, 11}));
  EXPECT_FALSE(Report(0, 20));
  EXPECT_TRUE(Report(1, 20));
  EXPECT_EQ(AbandonedSteps(), (std::vector<int64_t>{12, 13, 14, 15}));
}

// The manifest's temporary is this write's alone: "manifest.json.tmp.<pid>"
// was unlinked and created again, so two coordinators of one pid (each pid
// 1 in its container, one volume) could rename each other's half-written
// manifest into place. Another writer's temporary under that old name is
// now left alone.
TEST(WriteCheckpointManifestTest, AnotherWritersTemporary_LeftAlone) {
  const std::string root = absl::StrCat(std::getenv("TEST_TMPDIR"), "/manifest-temp");
  const std::string step_dir = root + "/ck/step-00000005";
  std::filesystem::create_directories(step_dir);
  const std::string theirs = absl::StrCat(step_dir, "/manifest.json.tmp.", getpid());
  std::ofstream(theirs) << "another writer's, half written";
  v1::ResumeFrom from;
  from.set_step(5);
  from.set_dir("ck/step-00000005");
  for (int u = 0; u < 4; ++u) {  // one layer: embed, attention, MLP, head
    v1::UnitFile* unit = from.add_units();
    unit->set_unit(u);
    unit->set_file(absl::StrFormat("unit-%04d.safetensors", u));
    unit->set_bytes(10);
    unit->set_sha256(std::string(64, 'a'));
  }
  v1::ModelSpec model;
  model.set_n_layer(1);
  model.set_n_head(1);
  model.set_d_model(8);
  model.set_vocab_size(16);
  model.set_max_seq_len(8);
  ASSERT_TRUE(WriteCheckpointManifest(root, "job-1", model, 7, from).ok());
  std::ifstream in(theirs);
  const std::string left((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(left, "another writer's, half written");
  const absl::StatusOr<CheckpointManifest> manifest =
      ReadCheckpointManifest(step_dir + "/manifest.json");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step, 5);
  EXPECT_EQ(manifest->job_id, "job-1");
  // Only the manifest and that temporary: this write's own is gone.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(step_dir)) ++entries, (void)e;
  EXPECT_EQ(entries, 2);
}

}  // namespace
}  // namespace pipetrain
