#include "cli/output_paths.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/interrupt.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::string TempDir() { return std::getenv("TEST_TMPDIR"); }

bool Exists(const std::string& path) {
  struct stat info;
  return lstat(path.c_str(), &info) == 0;
}

std::string Contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(WriteFilesOrNoneTest, EveryFileWritten) {
  const std::string a = TempDir() + "/all-a.txt", b = TempDir() + "/all-b.txt";
  ASSERT_TRUE(WriteFilesOrNone({{a, "one"}, {b, "two"}}).ok());
  EXPECT_EQ(Contents(a), "one");
  EXPECT_EQ(Contents(b), "two");
}

// A later file that cannot be opened: the earlier ones are removed, and the
// error names the path with its errno's code.
TEST(WriteFilesOrNoneTest, LaterFileFails_EarlierRemoved) {
  const std::string a = TempDir() + "/none-a.txt";
  const std::string missing = TempDir() + "/no-such-dir/b.txt";
  const absl::Status status = WriteFilesOrNone({{a, "one"}, {missing, "two"}});
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_NE(status.message().find("cannot write " + missing), std::string::npos) << status;
  EXPECT_FALSE(Exists(a));
}

// A write that fails after the open (/dev/full: ENOSPC) removes the files
// written before it, and never the device itself.
TEST(WriteFilesOrNoneTest, DeviceWriteFails_DeviceKeptOthersRemoved) {
  ASSERT_EQ(access("/dev/full", W_OK), 0) << "Linux has a writable /dev/full";
  const std::string a = TempDir() + "/full-a.txt";
  const absl::Status status = WriteFilesOrNone({{a, "one"}, {"/dev/full", "two"}});
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_FALSE(Exists(a));
  EXPECT_TRUE(Exists("/dev/full"));
}

// A link the user keeps is written through in place, which cannot be
// undone: only once every other file is staged, so a later file that
// fails leaves the link's target as it was.
TEST(WriteFilesOrNoneTest, LaterFileFails_LinkTargetUntouched) {
  const std::string target = TempDir() + "/latest-target.json";
  const std::string link = TempDir() + "/latest.json";
  std::ofstream(target) << "kept";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  const absl::Status status =
      WriteFilesOrNone({{link, "replaced"}, {TempDir() + "/no-such-dir/t.svg", "svg"}});
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_EQ(Contents(target), "kept");
  ASSERT_TRUE(WriteFilesOrNone({{link, "replaced"}}).ok());
  EXPECT_EQ(Contents(target), "replaced");
}

// A failure later on leaves an existing file as it was, not removed or
// truncated, and no temporary behind; a success replaces it whole.
TEST(WriteFilesOrNoneTest, LaterFileFails_ExistingFileUntouched_NoTemporaryLeft) {
  const std::string dir = TempDir() + "/keep";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const std::string kept = dir + "/kept.svg";
  ASSERT_TRUE(WriteFilesOrNone({{kept, "old"}}).ok());
  EXPECT_FALSE(WriteFilesOrNone({{kept, "new"}, {dir + "/no/x", "y"}}).ok());
  EXPECT_EQ(Contents(kept), "old");
  ASSERT_TRUE(WriteFilesOrNone({{kept, "new"}}).ok());
  EXPECT_EQ(Contents(kept), "new");
  int entries = 0;
  for (DIR* d = opendir(dir.c_str()); d != nullptr;) {
    const dirent* e = readdir(d);
    if (e == nullptr) {
      closedir(d);
      break;
    }
    entries += e->d_name[0] != '.';
  }
  EXPECT_EQ(entries, 1);  // kept.svg alone
}

// A file in a directory the command creates itself passes while that
// directory is missing; any other missing directory is refused.
TEST(CheckWritableParentTest, MissingDirectory_OkOnlyWhenTheCommandCreatesIt) {
  const std::string out = TempDir() + "/created-later";
  EXPECT_TRUE(CheckWritableParent("--loss-log", out + "/l.txt", out).ok());
  EXPECT_TRUE(CheckWritableParent("--loss-log", out + "/l.txt", out + "/").ok());
  const absl::Status missing = CheckWritableParent("--loss-log", out + "/l.txt");
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.message(),
            "--loss-log " + out + "/l.txt: the directory " + out + " does not exist");
  EXPECT_FALSE(CheckWritableParent("--loss-log", out + "/sub/l.txt", out).ok());
  // The created directory itself, or any "x/", names a directory: refused
  // before the run, not by the write after it.
  for (const std::string& dir : {out, out + "/", out + "//", TempDir() + "/"}) {
    const absl::Status is_dir = CheckWritableParent("--loss-log", dir, out);
    EXPECT_EQ(is_dir.message(), "--loss-log " + dir + " is a directory; name a file") << dir;
  }
  // Once it exists, it is checked as any other: here, a file in its place.
  std::ofstream(out) << "not a directory";
  const absl::Status file = CheckWritableParent("--loss-log", out + "/l.txt", out);
  EXPECT_EQ(file.message(), "--loss-log " + out + "/l.txt: " + out + " is not a directory");
}

// As a user who may not write the directories (as root, access() allows
// everything): a file written in place needs only itself writable, a file
// made or renamed into a directory needs the directory. Run in a child
// that drops to nobody when the test runs as root; the checks' messages
// (empty for OK) come back through a pipe, one per line.
// A link to a file not there yet, written through (kThroughLinks): the
// write creates the target, so the target's directory is what must take a
// new file, not the link's.
TEST(CheckWritableParentTest, DanglingLinkWrittenThrough_TargetsDirectoryChecked) {
  const std::string dir = TempDir() + "/dangling";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(symlink("latest-run.svg", (dir + "/latest.svg").c_str()), 0);
  EXPECT_TRUE(
      CheckWritableParent("--timeline", dir + "/latest.svg", "", OutputWrite::kThroughLinks).ok());
  ASSERT_TRUE(WriteFilesOrNone({{dir + "/latest.svg", "svg"}}).ok());
  EXPECT_EQ(Contents(dir + "/latest-run.svg"), "svg");
  ASSERT_EQ(symlink("gone/x.svg", (dir + "/nowhere.svg").c_str()), 0);
  const absl::Status nowhere =
      CheckWritableParent("--timeline", dir + "/nowhere.svg", "", OutputWrite::kThroughLinks);
  EXPECT_EQ(nowhere.code(), absl::StatusCode::kInvalidArgument) << nowhere;
  EXPECT_EQ(nowhere.message(), absl::StrCat("--timeline ", dir, "/nowhere.svg: the directory ", dir,
                                            "/gone does not exist"));
}

TEST(CheckWritableParentTest, WrittenInPlace_NeedsTheFileWritable_NotItsDirectory) {
  // In /tmp: nobody cannot reach TEST_TMPDIR under root's home.
  char dir_template[] = "/tmp/pipetrain-output-paths-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  // Removed however the test ends.
  const std::unique_ptr<const std::string, void (*)(const std::string*)> cleanup(
      &dir, [](const std::string* d) {
        chmod(d->c_str(), 0700);
        for (const char* name : {"/read-only", "/link"}) unlink((*d + name).c_str());
        rmdir(d->c_str());
      });
  std::ofstream(dir + "/read-only") << "kept";
  ASSERT_EQ(chmod((dir + "/read-only").c_str(), 0444), 0);
  ASSERT_EQ(symlink("/dev/null", (dir + "/link").c_str()), 0);
  // Searchable, not writable, by nobody and by its owner alike (the test
  // may run as another user than root).
  ASSERT_EQ(chmod(dir.c_str(), 0555), 0);
  const std::vector<std::pair<std::string, OutputWrite>> checks = {
      {"/dev/null", OutputWrite::kAppended},     // --log /dev/null: OK
      {"/dev/null", OutputWrite::kRenamed},      // a device is written in place
      {"/dev/new.log", OutputWrite::kAppended},  // a new file needs /dev
      {dir + "/read-only", OutputWrite::kAppended},
      {dir + "/read-only", OutputWrite::kRenamed},  // renamed over: the directory
      {dir + "/link", OutputWrite::kThroughLinks},  // written through: /dev/null
      {dir + "/link", OutputWrite::kRenamed},       // replaced: the directory
  };
  int results[2];
  ASSERT_EQ(pipe(results), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(results[0]);
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(2);
    std::string out;
    for (const auto& [path, how] : checks) {
      out += std::string(CheckWritableParent("--log", path, "", how).message()) + "\n";
    }
    _exit(write(results[1], out.data(), out.size()) == static_cast<ssize_t>(out.size()) ? 0 : 3);
  }
  close(results[1]);
  std::string got;
  char buffer[4096];
  for (ssize_t n; (n = read(results[0], buffer, sizeof buffer)) > 0;) got.append(buffer, n);
  close(results[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(got, absl::StrCat("\n",  //
                              "\n",  //
                              "--log /dev/new.log: the directory /dev is not writable\n", "--log ",
                              dir, "/read-only is not writable\n",  //
                              "--log ", dir, "/read-only: the directory ", dir,
                              " is not writable\n",  //
                              "\n",                  //
                              "--log ", dir, "/link: the directory ", dir, " is not writable\n"));
}

TEST(CheckNotAnInputTest, SameFileAsAnInput_Refused) {
  const std::string input = TempDir() + "/profile.json";
  ASSERT_TRUE(WriteFilesOrNone({{input, "{}"}}).ok());
  const absl::Status status =
      CheckNotAnInput("--write-profile", TempDir() + "/./profile.json", {{"--profile", input}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--write-profile " + TempDir() + "/./profile.json is --profile " +
                                  input + "; writing it would destroy an input");
  EXPECT_TRUE(CheckNotAnInput("--svg", TempDir() + "/new.svg", {{"--profile", input}}).ok());
}

// In the directory (by inode: other spellings and links to it included;
// by name while it does not exist), a name the command writes itself is
// refused; other names, and the same name elsewhere, pass.
TEST(CheckNotOwnedFileTest, OwnNameInTheDirectory_Refused) {
  const auto owned = [](absl::string_view name) { return name == "up.lock"; };
  const std::string out = TempDir() + "/owned-out";
  ASSERT_EQ(mkdir(out.c_str(), 0700), 0);
  const absl::Status refused =
      CheckNotOwnedFile("--loss-log", out + "/../owned-out/up.lock", "--out", out, owned);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(), "--loss-log " + out +
                                   "/../owned-out/up.lock is one of the files the command writes "
                                   "in --out " +
                                   out + " (up.lock); name another file");
  const std::string link = TempDir() + "/owned-link";
  ASSERT_EQ(symlink(out.c_str(), link.c_str()), 0);
  EXPECT_FALSE(CheckNotOwnedFile("--loss-log", link + "/up.lock", "--out", out, owned).ok());
  EXPECT_TRUE(CheckNotOwnedFile("--loss-log", out + "/losses.txt", "--out", out, owned).ok());
  EXPECT_TRUE(CheckNotOwnedFile("--loss-log", TempDir() + "/up.lock", "--out", out, owned).ok());
  const std::string later = TempDir() + "/owned-later";
  EXPECT_FALSE(
      CheckNotOwnedFile("--loss-log", later + "/up.lock", "--out", later + "/", owned).ok());
  EXPECT_TRUE(CheckNotOwnedFile("--loss-log", later + "/x.txt", "--out", later, owned).ok());
  EXPECT_TRUE(CheckNotOwnedFile("--loss-log", "", "--out", later, owned).ok());
  // Other spellings of it while it does not exist (`up --out ./run
  // --loss-log run/up.lock` in a fresh directory renamed the log over the
  // lock), and a link on the way to it.
  EXPECT_FALSE(CheckNotOwnedFile("--loss-log", later + "/./up.lock", "--out", later, owned).ok());
  EXPECT_FALSE(CheckNotOwnedFile("--loss-log", TempDir() + "/./owned-later/up.lock", "--out",
                                 later + "/.", owned)
                   .ok());
  EXPECT_FALSE(
      CheckNotOwnedFile("--loss-log", later + "/sub/../up.lock", "--out", later, owned).ok());
  EXPECT_FALSE(
      CheckNotOwnedFile("--loss-log", link + "/../owned-later/up.lock", "--out", later, owned)
          .ok());
  EXPECT_TRUE(CheckNotOwnedFile("--loss-log", later + "/sub/up.lock", "--out", later, owned).ok());
  // A link to such a file (written through) is refused too.
  std::ofstream(out + "/up.lock") << "";
  const std::string to_lock = TempDir() + "/to-lock.txt";
  ASSERT_EQ(symlink((out + "/up.lock").c_str(), to_lock.c_str()), 0);
  EXPECT_FALSE(CheckNotOwnedFile("--loss-log", to_lock, "--out", out, owned).ok());
}

TEST(RemoveIfRegularTest, RegularRemoved_LinkAndDirectoryKept) {
  const std::string file = TempDir() + "/regular.txt", link = TempDir() + "/link.txt";
  const std::string dir = TempDir() + "/a-dir";
  ASSERT_TRUE(WriteFilesOrNone({{file, "x"}}).ok());
  ASSERT_EQ(symlink(file.c_str(), link.c_str()), 0);
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  RemoveIfRegular(link);
  RemoveIfRegular(dir);
  EXPECT_TRUE(Exists(link));
  EXPECT_TRUE(Exists(dir));
  EXPECT_TRUE(Exists(file));
  RemoveIfRegular(file);
  EXPECT_FALSE(Exists(file));
}

TEST(CheckReplaceableFileTest, AbsentRegularOrLink_Ok_FifoAndDevice_Refused) {
  const std::string file = TempDir() + "/replaceable.txt", link = TempDir() + "/to-null";
  const std::string fifo = TempDir() + "/replace.fifo";
  ASSERT_TRUE(WriteFilesOrNone({{file, "x"}}).ok());
  ASSERT_EQ(symlink("/dev/null", link.c_str()), 0);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(CheckReplaceableFile("--save", "").ok());
  EXPECT_TRUE(CheckReplaceableFile("--save", TempDir() + "/absent").ok());
  EXPECT_TRUE(CheckReplaceableFile("--save", file).ok());
  EXPECT_TRUE(CheckReplaceableFile("--save", link).ok());  // the link is replaced, not /dev/null
  const absl::Status fifo_status = CheckReplaceableFile("--save", fifo);
  EXPECT_EQ(fifo_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fifo_status.message(),
            "--save " + fifo +
                " is not a regular file (a device, FIFO, socket or directory); name a file");
  EXPECT_FALSE(CheckReplaceableFile("--out", "/dev/null").ok());
}

// A FIFO nobody reads would hang the open of --log (past SIGINT); one
// with a reader is a log's consumer (`--log >(tee x)`, `cat fifo &`), whose
// write end comes back open, so that the reader does not see the end of
// its input before the log's own stream is open. Files and devices: -1.
TEST(OpenFifoWriteEndTest, ReaderlessFifo_Refused_ReadFifoHeldOpen_OthersNone) {
  const std::string fifo = TempDir() + "/log.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const absl::StatusOr<int> refused = OpenFifoWriteEnd("--log", fifo);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_EQ(refused.status().message(),
            "--log " + fifo +
                " is a FIFO with no reader; start its reader first, or name a regular file");
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  const absl::StatusOr<int> held = OpenFifoWriteEnd("--log", fifo);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_GE(*held, 0);
  EXPECT_EQ(write(*held, "step 1\n", 7), 7);
  char got[16] = {};
  EXPECT_EQ(read(reader, got, sizeof(got)), 7);
  EXPECT_STREQ(got, "step 1\n");
  close(*held);
  close(reader);
  EXPECT_EQ(OpenFifoWriteEnd("--log", "").value_or(-2), -1);
  EXPECT_EQ(OpenFifoWriteEnd("--log", TempDir() + "/absent.log").value_or(-2), -1);
  EXPECT_EQ(OpenFifoWriteEnd("--log", "/dev/null").value_or(-2), -1);
}

// Written in place, a FIFO with a reader gets the text; one nobody reads is
// FAILED_PRECONDITION at once (its blocking open waited for ever, past
// Ctrl-C, with `up`'s cluster still running).
TEST(WriteFilesOrNoneTest, Fifo_ReaderGetsTheText_NoReaderRefusedAtOnce) {
  const std::string fifo = TempDir() + "/losses.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const absl::Status refused = WriteFilesOrNone({{fifo, "1.5\n"}});
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(refused.message(),
            fifo + " is a FIFO with no reader; start its reader first, or name a regular file");
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  ASSERT_TRUE(WriteFilesOrNone({{fifo, "1.5\n"}}).ok());
  char got[8] = {};
  EXPECT_EQ(read(reader, got, sizeof(got)), 4);
  EXPECT_STREQ(got, "1.5\n");
  close(reader);
}

// A FIFO whose reader takes nothing held the write for ever, and with it
// `up` and its cluster: Ctrl-C and SIGTERM only set the interrupt, and
// SA_RESTART resumed the blocking write. The write now asks `stop` while the
// FIFO is full, and ends CANCELLED once an interrupt is pending.
TEST(WriteFilesOrNoneTest, FifoReaderStalls_Interrupted_Cancelled) {
  const std::string fifo = TempDir() + "/stalled.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // The reader, never read while the write runs: O_RDWR opens without
  // waiting for a writer, and the write end then finds a reader.
  const int held = open(fifo.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(held, 0);
  const std::string text(200 << 10, 'x');  // more than a pipe holds (64 KiB)
  std::promise<absl::Status> wrote;
  std::future<absl::Status> result = wrote.get_future();
  std::thread writer([&] {
    wrote.set_value(WriteFilesOrNone({{fifo, text}}, [] { return Interrupted(); }));
  });
  Interrupt(SIGINT);
  // A bound on a hang, not a timing check: the blocking write never ended.
  EXPECT_EQ(result.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "the write still waits for the stalled reader";
  // So that a write still waiting ends, and the test with it.
  char drain[4096];
  while (result.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
    (void)!read(held, drain, sizeof drain);
  }
  writer.join();
  close(held);
  const absl::Status status = result.get();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  // How much the pipe took depends on the kernel's pipe size.
  EXPECT_TRUE(absl::StartsWith(
      status.message(), "cannot write " + fifo + ": stopped while its reader took nothing ("))
      << status;
  EXPECT_TRUE(absl::EndsWith(status.message(), " of 204800 bytes written)")) << status;
}

TEST(CheckDistinctOutputsTest, SameFileByNameOrLink_Refused_DistinctOk) {
  const std::string a = TempDir() + "/distinct-a", b = TempDir() + "/distinct-b";
  const std::string hard = TempDir() + "/distinct-hard";
  ASSERT_TRUE(WriteFilesOrNone({{a, "x"}}).ok());
  ASSERT_EQ(link(a.c_str(), hard.c_str()), 0);
  EXPECT_TRUE(CheckDistinctOutputs({{"--save", a}, {"--log", b}, {"--checkpoint", ""}}).ok());
  // Two new files under one name, spelt differently.
  const absl::Status spelt =
      CheckDistinctOutputs({{"--save", TempDir() + "/new.st"}, {"--log", TempDir() + "/./new.st"}});
  EXPECT_EQ(spelt.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spelt.message(), "--log " + TempDir() + "/./new.st is also --save " + TempDir() +
                                 "/new.st; each output needs its own file");
  // One existing file through a hard link.
  EXPECT_FALSE(CheckDistinctOutputs({{"--save", a}, {"--checkpoint", hard}}).ok());
}

}  // namespace
}  // namespace pipetrain
