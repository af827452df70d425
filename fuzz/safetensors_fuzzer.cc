// Safetensors files (weights imports, checkpoints): ReadSafetensors, which
// reads a path. The input is written to an in-memory file (memfd) and read
// back through /proc/self/fd, so a run costs no disk I/O.
//
// Input: the file's bytes (8-byte little-endian header length, JSON header,
// data buffer).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/logging.h"
#include "common/safetensors.h"

namespace {

// An in-memory file, created once; each run replaces its contents.
struct MemFile {
  int fd;
  std::string path;  // /proc/self/fd/<fd>
};

const MemFile& InMemoryFile() {
  static const MemFile* file = [] {
    const int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
    PT_CHECK(fd >= 0) << "memfd_create failed";
    return new MemFile{fd, "/proc/self/fd/" + std::to_string(fd)};
  }();
  return *file;
}

void Fill(const MemFile& file, const uint8_t* data, size_t size) {
  PT_CHECK(ftruncate(file.fd, static_cast<off_t>(size)) == 0);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = pwrite(file.fd, data + done, size - done, static_cast<off_t>(done));
    PT_CHECK(n > 0) << "write to the memfd failed";
    done += static_cast<size_t>(n);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  const MemFile& file = InMemoryFile();
  Fill(file, data, size);
  absl::StatusOr<SafetensorsContents> contents = ReadSafetensors(file.path);
  if (contents.ok()) {
    for (const NamedTensor& t : contents->tensors) (void)contents->Find(t.name);
  }
  return 0;
}
