#include "common/malloc_tuning.h"

#include <malloc.h>

namespace pipetrain {

bool TuneMallocForLargeBuffers() {
  // glibc accepts an mmap threshold up to HEAP_MAX_SIZE / 2: 32 MiB on 64-bit.
  constexpr int kMaxMmapThresholdBytes = 32 << 20;
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, kMaxMmapThresholdBytes) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTrimThresholdBytes)) == 1;
  // A thread arena's heap never reaches the trim threshold, so each one keeps
  // up to kThreadArenaHeapBytes resident: their number bounds what stays.
  const bool arenas_set = mallopt(M_ARENA_MAX, kMallocArenaMax) == 1;
  return mmap_set && trim_set && arenas_set;
}

}  // namespace pipetrain
