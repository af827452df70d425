// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
//
// A counter-based generator is a pure function of (key, counter): there is no
// hidden state to advance, so any worker can reproduce any element of any
// stream directly. pipetrain keys parameter initialisation by
// (seed, parameter name) and data order by (seed, iteration, sample index),
// which makes both independent of how the model is partitioned.
// All functions are pure and thread-safe.
#ifndef PIPETRAIN_COMMON_PHILOX_H_
#define PIPETRAIN_COMMON_PHILOX_H_

#include <array>
#include <cstdint>
#include <string_view>

namespace pipetrain {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// Ten rounds of Philox4x32 on `counter` under `key`.
PhiloxCounter Philox4x32(PhiloxCounter counter, PhiloxKey key);

// 64-bit FNV-1a of `text`: turns a parameter name into a stream id.
uint64_t HashName(std::string_view text);

// Key from a 64-bit seed.
inline PhiloxKey KeyFromSeed(uint64_t seed) {
  return {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
}

// Maps 32 random bits to a float uniform in (0, 1], never 0 (safe for log).
inline float UniformOpenZero(uint32_t bits) {
  return (static_cast<float>(bits >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

// Fills out[0..n) with N(mean, stddev^2) samples. Element i depends only on
// (seed, stream, i), so any slice can be generated on its own.
void FillNormal(uint64_t seed, uint64_t stream, float mean, float stddev, float* out,
                int64_t n);

// A uniform integer in [0, bound) for the draw (seed, a, b, c). bound >= 1.
// The modulo bias is below bound / 2^64, negligible for any data set.
uint64_t UniformIndex(uint64_t seed, uint32_t a, uint32_t b, uint32_t c, uint64_t bound);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_PHILOX_H_
