#include "common/malloc_tuning.h"

#include <malloc.h>

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/testing/in_child.h"
#include "common/testing/sanitized_build.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// VmRSS from /proc/self/status, in bytes; -1 if it cannot be read.
int64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    const std::vector<std::string> fields =
        absl::StrSplit(line, ' ', absl::SkipEmpty());  // "VmRSS:", "1234", "kB"
    int64_t kib = 0;
    if (fields.size() == 3 && absl::SimpleAtoi(fields[1], &kib)) return kib * 1024;
  }
  return -1;
}

// kThreads threads each allocate (and write) 48 MiB in blocks below the mmap
// threshold, all hold them at once, so that each thread takes an arena of
// its own up to the limit, then free them and end.
void AllocateAndFreeInThreads() {
  constexpr int kThreads = 16;
  constexpr int kBlocks = 6;
  constexpr size_t kBlockBytes = 8 << 20;
  std::mutex mu;
  std::condition_variable all_hold;
  int holding = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      std::vector<void*> blocks;
      for (int b = 0; b < kBlocks; ++b) {
        blocks.push_back(malloc(kBlockBytes));
        memset(blocks.back(), 1, kBlockBytes);
      }
      {
        std::unique_lock<std::mutex> lock(mu);
        if (++holding == kThreads) all_hold.notify_all();
        all_hold.wait(lock, [&] { return holding == kThreads; });
      }
      for (void* block : blocks) free(block);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// What stays resident after threads freed their buffers is bounded as the
// header says for the thread arenas: after malloc_trim(0), which returns
// the main heap's free top, one heap per thread arena. (The 768 MiB
// allocated here cannot reach the main heap's 1 GiB part of the bound,
// so only the arenas' part is checked.) With
// glibc's default arena limit (8 per core) each of the 16 threads kept its
// 48 MiB: 723 MiB after malloc_trim(0). In a child: the arena settings stay
// for the process.
TEST(TuneMallocForLargeBuffersTest, ThreadsFreedBuffers_ResidentWithinDocumentedBound) {
  if (kSanitizedBuild) GTEST_SKIP() << "the sanitizers replace glibc's malloc";
  const std::string said = InChild([] {
    if (!TuneMallocForLargeBuffers()) return std::string("mallopt refused a setting");
    const int64_t before = ResidentBytes();
    AllocateAndFreeInThreads();
    const int64_t freed = ResidentBytes();
    malloc_trim(0);
    const int64_t trimmed = ResidentBytes();
    if (before < 0 || freed < 0 || trimmed < 0) return std::string("no VmRSS");
    return absl::StrCat((freed - before) / kMiB, " ", (trimmed - before) / kMiB);
  });
  RecordProperty("retained_mib_freed_trimmed", said);  // in test.xml
  const std::vector<std::string> mib = absl::StrSplit(said, ' ');
  int64_t freed_mib = 0, trimmed_mib = 0;
  ASSERT_TRUE(mib.size() == 2 && absl::SimpleAtoi(mib[0], &freed_mib) &&
              absl::SimpleAtoi(mib[1], &trimmed_mib))
      << said;
  // 8 MiB of margin for what else the threads left (their stacks, which
  // glibc caches for new threads).
  constexpr int64_t kMarginMiB = 8;
  EXPECT_LE(trimmed_mib, (kMallocArenaMax - 1) * kThreadArenaHeapBytes / kMiB + kMarginMiB)
      << "MiB: " << said;
}

}  // namespace
}  // namespace pipetrain
