#include "common/philox.h"

#include <cmath>

#include "common/logging.h"

namespace pipetrain {
namespace {

constexpr uint32_t kMul0 = 0xD2511F53;
constexpr uint32_t kMul1 = 0xCD9E8D57;
constexpr uint32_t kWeyl0 = 0x9E3779B9;
constexpr uint32_t kWeyl1 = 0xBB67AE85;

inline void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

}  // namespace

PhiloxCounter Philox4x32(PhiloxCounter c, PhiloxKey k) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(kMul0, c[0], &hi0, &lo0);
    MulHiLo(kMul1, c[2], &hi1, &lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

uint64_t HashName(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

void FillNormal(uint64_t seed, uint64_t stream, float mean, float stddev, float* out,
                int64_t n) {
  const PhiloxKey key = KeyFromSeed(seed);
  constexpr float kTwoPi = 6.28318530717958647692f;
  // One Philox block yields four uniforms -> two Box-Muller pairs -> four
  // normals, so element i lives in block i / 4.
  for (int64_t block = 0; block * 4 < n; ++block) {
    PhiloxCounter bits = Philox4x32(
        {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
         static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
        key);
    float normals[4];
    for (int pair = 0; pair < 2; ++pair) {
      float u1 = UniformOpenZero(bits[2 * pair]);
      float u2 = UniformOpenZero(bits[2 * pair + 1]);
      float radius = std::sqrt(-2.0f * std::log(u1));
      normals[2 * pair] = radius * std::cos(kTwoPi * u2);
      normals[2 * pair + 1] = radius * std::sin(kTwoPi * u2);
    }
    for (int j = 0; j < 4 && block * 4 + j < n; ++j) {
      out[block * 4 + j] = mean + stddev * normals[j];
    }
  }
}

uint64_t UniformIndex(uint64_t seed, uint32_t a, uint32_t b, uint32_t c, uint64_t bound) {
  PT_CHECK(bound >= 1) << "UniformIndex bound 0";
  PhiloxCounter bits = Philox4x32({a, b, c, 0x5a4d504cu}, KeyFromSeed(seed));
  uint64_t r = (static_cast<uint64_t>(bits[0]) << 32) | bits[1];
  return r % bound;
}

}  // namespace pipetrain
