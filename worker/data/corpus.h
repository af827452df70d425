// The training corpus of a run: a token file, or generated English text
// when no path is given. train-local and pipeline workers load it the same
// way, so every worker of a job sees the same tokens.
#ifndef PIPETRAIN_WORKER_DATA_CORPUS_H_
#define PIPETRAIN_WORKER_DATA_CORPUS_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/token_file.h"

namespace pipetrain {

struct CorpusSpec {
  std::string path;                // empty: generated text
  DataFormat format = DataFormat::kAuto;
  int vocab_size = 256;
  int64_t synthetic_bytes = 2'000'000;
  uint64_t seed = 1;               // of the generated text
  // The name spec.data.path gave when `path` is its resolved real path:
  // the format is detected from it (TokenFileLoadOptions::name). Empty: path.
  std::string name;
  // TokenFileLoadOptions::max_bytes: the largest file loaded, and the
  // most text generated (which peaks at 3x its size too) (0: any).
  int64_t max_bytes = 0;
  // TokenFileLoadOptions::path_is_checked_real.
  bool path_is_checked_real = false;
  // TokenFileLoadOptions::stop (a file's read; generated text is made in
  // one go, at most max_bytes of it).
  const std::atomic<bool>* stop = nullptr;
};

// LoadTokenFile's errors for files (RESOURCE_EXHAUSTED past max_bytes, CANCELLED on stop);
// INVALID_ARGUMENT when generated text is asked for with vocab_size < 256 or synthetic_bytes < 1,
// RESOURCE_EXHAUSTED when over max_bytes.
absl::StatusOr<std::vector<uint16_t>> LoadCorpus(const CorpusSpec& spec);

// Job.data_sha256: the SHA-256 of `tokens`, each as two little-endian
// bytes, as 64 lowercase hex digits. The coordinator compares every
// worker's, so that no stage trains on other tokens than the job began with.
std::string CorpusSha256(const std::vector<uint16_t>& tokens);

// "generated English text, 2000000 bytes (seed 1)" or "book.txt, 1234 tokens".
std::string DescribeCorpus(const CorpusSpec& spec, size_t tokens);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_CORPUS_H_
