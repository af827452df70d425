// Synthetic English prose for tests and for the demo when no corpus is given.
//
// The text is built from a few hundred common English words and simple
// grammar templates (subject-verb-object clauses, adjectives, prepositional
// and time phrases, joined clauses, short quotes and questions) with number
// and tense agreement, capitalised sentence starts, and paragraphs of 3-7
// sentences separated by blank lines. Its byte statistics resemble ordinary
// English closely enough that a small byte-level GPT learns it quickly.
#ifndef PIPETRAIN_WORKER_DATA_SYNTHETIC_TEXT_H_
#define PIPETRAIN_WORKER_DATA_SYNTHETIC_TEXT_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace pipetrain {

// Returns exactly `num_bytes` bytes of prose, a pure function of `seed`
// (randomness from Philox4x32 keyed by the seed). Only printable ASCII
// (0x20-0x7e) and '\n' occur. The output for n bytes is a prefix of the
// output for any larger size with the same seed (so the final word may be
// cut short). Thread-safe.
std::string GenerateEnglishText(uint64_t seed, size_t num_bytes);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_SYNTHETIC_TEXT_H_
