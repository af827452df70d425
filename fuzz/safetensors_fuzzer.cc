// Safetensors files (weights imports, checkpoints): ReadSafetensors, which
// reads a path, and the readers that must agree with it: ParseSafetensors
// (the same bytes in memory), ReadSafetensorsShapes (the header alone: the
// coordinator checks a spec.init weights file's fit with it at submit) and
// ReadSafetensorsTensors (only the tensors a stage wants: what workers load
// at job start). The input is written to an in-memory file (memfd) and read
// back through /proc/self/fd, so a run costs no disk I/O.
//
// Input: the file's bytes (8-byte little-endian header length, JSON header,
// data buffer). The tensors ReadSafetensorsTensors is asked for are picked
// from the bytes (a hash of each name with the input's size).
//
// Beyond the sanitizers: the four readers accept exactly the same files;
// ParseSafetensors returns what ReadSafetensors does, bit for bit; the
// header reader lists the same names and shapes in the same order; the
// selective reader returns exactly the wanted tensors, in file order, each
// bitwise as ReadSafetensors reads it, with the same metadata.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

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

bool SameBits(const pipetrain::Tensor& a, const pipetrain::Tensor& b) {
  return a.shape() == b.shape() &&
         (a.numel() == 0 ||
          std::memcmp(a.data(), b.data(), static_cast<size_t>(a.numel()) * sizeof(float)) == 0);
}

void ExpectSameContents(const pipetrain::SafetensorsContents& got,
                        const pipetrain::SafetensorsContents& want, const char* reader) {
  PT_CHECK(got.metadata == want.metadata) << reader << ": other metadata";
  PT_CHECK(got.tensors.size() == want.tensors.size()) << reader << ": other tensor count";
  for (size_t i = 0; i < got.tensors.size(); ++i) {
    PT_CHECK(got.tensors[i].name == want.tensors[i].name) << reader << ": tensor " << i;
    PT_CHECK(SameBits(got.tensors[i].tensor, want.tensors[i].tensor))
        << reader << ": other values of " << want.tensors[i].name;
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

  const absl::StatusOr<SafetensorsContents> parsed =
      ParseSafetensors(std::string_view(reinterpret_cast<const char*>(data), size), file.path);
  PT_CHECK(parsed.ok() == contents.ok())
      << "ParseSafetensors: " << parsed.status() << "; ReadSafetensors: " << contents.status();

  const absl::StatusOr<std::vector<SafetensorsShape>> shapes = ReadSafetensorsShapes(file.path);
  PT_CHECK(shapes.ok() == contents.ok())
      << "ReadSafetensorsShapes: " << shapes.status() << "; ReadSafetensors: " << contents.status();

  const auto wanted = [size](std::string_view name) {
    return ((std::hash<std::string_view>{}(name) ^ size) & 1) == 0;
  };
  const absl::StatusOr<SafetensorsContents> selected = ReadSafetensorsTensors(file.path, wanted);
  PT_CHECK(selected.ok() == contents.ok()) << "ReadSafetensorsTensors: " << selected.status()
                                           << "; ReadSafetensors: " << contents.status();
  if (!contents.ok()) return 0;

  ExpectSameContents(*parsed, *contents, "ParseSafetensors");
  PT_CHECK(shapes->size() == contents->tensors.size()) << "ReadSafetensorsShapes: tensor count";
  SafetensorsContents want_selected;
  want_selected.metadata = contents->metadata;
  for (size_t i = 0; i < shapes->size(); ++i) {
    const NamedTensor& t = contents->tensors[i];
    PT_CHECK((*shapes)[i].name == t.name && (*shapes)[i].shape == t.tensor.shape())
        << "ReadSafetensorsShapes: tensor " << i;
    if (wanted(t.name)) want_selected.tensors.push_back(t);
  }
  ExpectSameContents(*selected, want_selected, "ReadSafetensorsTensors");
  return 0;
}
