// SqliteStore under SIGKILL: a child process commits numbered batches and
// acknowledges each one on a pipe after Commit returns; the parent kills it
// once it has read some acknowledgements, reopens the store and checks that
// every acknowledged batch is there and that no batch is there in part.
//
// SIGKILL leaves the kernel's page cache alone, so this checks atomicity and
// "OK means committed", not power-loss durability (synchronous=FULL's job).
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/store/sqlite_store.h"
#include "coordinator/store/store.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

constexpr int kKeysPerBatch = 4;
constexpr int kAcksBeforeKill = 20;
constexpr int kRounds = 3;

// Batch n puts kKeysPerBatch keys "batch/<n>/<j>", and replaces everything
// under "latest/" with kKeysPerBatch keys whose value is n: a torn batch
// would leave "latest/" with mixed values or a partial count.
std::vector<StoreWrite> BatchWrites(int n) {
  std::vector<StoreWrite> writes = {StoreWrite::DeletePrefix("latest/")};
  for (int j = 0; j < kKeysPerBatch; ++j) {
    writes.push_back(StoreWrite::Put(absl::StrFormat("batch/%08d/%d", n, j), absl::StrCat(n)));
    writes.push_back(StoreWrite::Put(absl::StrCat("latest/", j), absl::StrCat(n)));
  }
  return writes;
}

[[noreturn]] void ChildFail(const std::string& what) {
  fprintf(stderr, "crash test child: %s\n", what.c_str());
  _exit(2);
}

// The child: commits batches first, first + 1, ... until it is killed,
// writing each batch number to `ack_fd` once its Commit has returned OK.
[[noreturn]] void RunChild(const std::string& dir, int first, int ack_fd) {
  absl::StatusOr<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(dir);
  if (!store.ok()) ChildFail(store.status().ToString());
  for (int n = first;; ++n) {
    absl::Status status = (*store)->Commit(BatchWrites(n));
    if (!status.ok()) ChildFail(status.ToString());
    // 4 bytes: below PIPE_BUF, so each write is atomic.
    if (write(ack_fd, &n, sizeof(n)) != static_cast<ssize_t>(sizeof(n))) {
      ChildFail(absl::StrCat("ack write: errno ", errno));
    }
  }
}

// Reads one acknowledgement; false at end of file (the child is gone).
bool ReadAck(int fd, int* n) {
  size_t done = 0;
  char* out = reinterpret_cast<char*>(n);
  while (done < sizeof(*n)) {
    const ssize_t got = read(fd, out + done, sizeof(*n) - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      EXPECT_EQ(done, 0u) << "torn acknowledgement";
      return false;
    }
    done += static_cast<size_t>(got);
  }
  return true;
}

// Runs one child from batch `first`, kills it after kAcksBeforeKill
// acknowledgements and returns the last batch it acknowledged. A failed
// pipe or fork is a test failure (the caller stops on it), and then
// nothing is killed: kill(-1, SIGKILL) would end every process the test
// may signal (Bazel and the other tests with it).
int RunAndKillChild(const std::string& dir, int first) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << std::strerror(errno);
    return first - 1;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    close(fds[0]);
    close(fds[1]);
    return first - 1;
  }
  if (pid == 0) {
    close(fds[0]);
    RunChild(dir, first, fds[1]);
  }
  close(fds[1]);
  int acks = 0;
  int last = first - 1;
  for (int n; acks < kAcksBeforeKill && ReadAck(fds[0], &n); ++acks) {
    EXPECT_EQ(n, last + 1) << "acknowledgements out of order";
    last = n;
  }
  EXPECT_EQ(kill(pid, SIGKILL), 0);
  // Acknowledgements written between the last read and the kill count too.
  for (int n; ReadAck(fds[0], &n);) {
    EXPECT_EQ(n, last + 1) << "acknowledgements out of order";
    last = n;
  }
  close(fds[0]);
  int wstatus = 0;
  EXPECT_EQ(waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
      << "the child ended by itself (status " << wstatus << ") after " << acks
      << " acknowledgements; see its message above";
  EXPECT_EQ(acks, kAcksBeforeKill);
  return last;
}

// Checks the store after a kill: batches 0 .. M-1 present, each whole, and
// nothing else; "latest/" whole and from batch M-1. Returns M.
int CheckRecovered(const Store& store, int last_acknowledged) {
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> batches = store.Scan("batch/");
  EXPECT_TRUE(batches.ok()) << batches.status();
  std::map<int, int> keys_per_batch;
  for (const auto& [key, value] : *batches) {
    int n = -1;
    EXPECT_TRUE(absl::SimpleAtoi(value, &n)) << key;
    EXPECT_EQ(key.substr(0, 15), absl::StrFormat("batch/%08d/", n));
    ++keys_per_batch[n];
  }
  const int committed = static_cast<int>(keys_per_batch.size());
  for (const auto& [n, count] : keys_per_batch) {
    EXPECT_LT(n, committed) << "batch " << n << " present but an earlier one is missing";
    EXPECT_EQ(count, kKeysPerBatch) << "batch " << n << " is torn";
  }
  // Every acknowledged batch, and at most the one in flight beyond it.
  EXPECT_GE(committed, last_acknowledged + 1);
  EXPECT_LE(committed, last_acknowledged + 2);

  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> latest = store.Scan("latest/");
  EXPECT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->size(), static_cast<size_t>(kKeysPerBatch));
  for (const auto& [key, value] : *latest) EXPECT_EQ(value, absl::StrCat(committed - 1)) << key;
  return committed;
}

TEST(SqliteCrashTest, Sigkill_AcknowledgedBatchesSurviveAndNoneIsTorn) {
  std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/crashXXXXXX");
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  dir += "/state";
  int next = 0;
  // Later rounds reopen a store recovered from the previous kill.
  for (int round = 0; round < kRounds; ++round) {
    const int last = RunAndKillChild(dir, next);
    ASSERT_FALSE(::testing::Test::HasFailure()) << "round " << round;
    absl::StatusOr<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    next = CheckRecovered(**store, last);
    ASSERT_FALSE(::testing::Test::HasFailure()) << "round " << round;
    // The store closes here, before the next child needs the lock.
  }
  EXPECT_GE(next, kRounds * kAcksBeforeKill);
}

std::string NewTempDir(const char* name) {
  std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/", name, "XXXXXX");
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir;
}

// A coordinator killed during the first Open of a new state dir, at times
// spread over how long that Open takes here: every later Open must start
// with an empty store. (Before the database was built under a temporary
// name, a kill between creating coordinator.db and committing its tables
// left a file that every later start refused as DATA_LOSS.) Timing decides
// which step each kill lands in; no outcome may fail, whichever it is.
TEST(SqliteCrashTest, Sigkill_DuringTheFirstOpen_TheNextOpenStartsEmpty) {
  constexpr int kKills = 40;
  absl::Time start = absl::Now();
  {
    absl::StatusOr<std::unique_ptr<SqliteStore>> store =
        SqliteStore::Open(NewTempDir("timing") + "/state");
    ASSERT_TRUE(store.ok()) << store.status();
  }
  // Over the Open's duration and a little beyond, at least 1 us apart.
  const int64_t open_us = std::max<int64_t>(absl::ToInt64Microseconds(absl::Now() - start), 40);
  // Kills that came before the child's Open returned (it writes a byte to
  // a pipe then), and of those the ones inside Open (the store's directory,
  // which Open creates first, exists): at least one must, or nothing here
  // tested a cut Open (a kill before the child even started proves
  // nothing).
  int before_open_returned = 0, inside_open = 0;
  for (int i = 0; i < kKills; ++i) {
    const std::string dir = NewTempDir("first") + "/state";
    int opened[2], starting[2];
    ASSERT_EQ(pipe(opened), 0);
    ASSERT_EQ(pipe(starting), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(opened[0]);
      close(starting[0]);
      if (write(starting[1], "s", 1) != 1) ChildFail("cannot write to the pipe");
      absl::StatusOr<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(dir);
      if (!store.ok()) ChildFail(store.status().ToString());
      if (write(opened[1], "o", 1) != 1) ChildFail("cannot write to the pipe");
      pause();  // Killed here if the kill came after the Open.
      _exit(0);
    }
    close(opened[1]);
    close(starting[1]);
    // The delay counts from the child's start of Open, not from the fork:
    // on a loaded machine a new child may wait longer than a whole Open
    // to run, and every kill would land before it.
    char started = 0;
    ASSERT_EQ(read(starting[0], &started, 1), 1) << "the child did not start";
    close(starting[0]);
    usleep(static_cast<useconds_t>(open_us * 5 / 4 * i / kKills));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int wstatus = 0;
    ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(wstatus)) << "the child failed: see its message above";
    char byte = 0;
    // The child is gone: the read returns at once, 0 when it never wrote.
    if (read(opened[0], &byte, 1) != 1) {
      ++before_open_returned;
      struct stat started;
      if (stat(dir.c_str(), &started) == 0) ++inside_open;
    }
    close(opened[0]);
    absl::StatusOr<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(dir);
    ASSERT_TRUE(store.ok()) << "killed after " << open_us * 5 / 4 * i / kKills << " of " << open_us
                            << " us: " << store.status();
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> all = (*store)->Scan("");
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_TRUE(all->empty());
    ASSERT_EQ((*store)->Commit({StoreWrite::Put("k", "v")}), absl::OkStatus());
    struct stat st;
    EXPECT_NE(stat((dir + "/coordinator.db.new").c_str(), &st), 0) << "left behind";
  }
  std::printf("%d of %d kills came before the Open returned, %d of them inside it\n",
              before_open_returned, kKills, inside_open);
  EXPECT_GT(inside_open, 0);
}

}  // namespace
}  // namespace pipetrain
