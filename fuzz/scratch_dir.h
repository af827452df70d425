// A scratch directory for fuzzers whose code under test writes or looks
// for files under an --output-dir: made once per process, emptied before
// each input (the code under test must not see the last input's files),
// removed at exit, so that /tmp is left as found.
#ifndef PIPETRAIN_FUZZ_SCRATCH_DIR_H_
#define PIPETRAIN_FUZZ_SCRATCH_DIR_H_

#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/logging.h"

namespace pipetrain {

// The names in `dir` (not . and ..).
inline std::vector<std::string> DirEntries(const std::string& dir) {
  std::vector<std::string> names;
  std::unique_ptr<DIR, int (*)(DIR*)> listing(opendir(dir.c_str()), closedir);
  PT_CHECK(listing != nullptr) << "cannot list " << dir;
  while (const dirent* entry = readdir(listing.get())) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  return names;
}

// Removes everything under `dir`, subdirectories included (links are
// removed, not followed); `dir` itself stays.
inline void EmptyDir(const std::string& dir) {
  for (const std::string& name : DirEntries(dir)) {
    nftw((dir + "/" + name).c_str(),
         [](const char* path, const struct stat*, int, FTW*) {
           remove(path);  // one that stays shows at the next input's listing
           return 0;
         },
         16, FTW_DEPTH | FTW_PHYS);
  }
}

// "$TMPDIR/<prefix>.XXXXXX" (/tmp without TMPDIR), made at the first call
// (whose prefix names it) and removed at exit.
inline const std::string& ScratchDir(const char* prefix) {
  static const std::string* dir = [prefix] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/" + prefix + ".XXXXXX";
    PT_CHECK(mkdtemp(pattern.data()) != nullptr) << "cannot create " << pattern;
    std::atexit([] {
      EmptyDir(*dir);
      rmdir(dir->c_str());
    });
    return new std::string(pattern);
  }();
  return *dir;
}

}  // namespace pipetrain

#endif  // PIPETRAIN_FUZZ_SCRATCH_DIR_H_
