#include "worker/runtime/data_parallel_testing.h"

#include <algorithm>
#include <cmath>

#include "gtest/gtest.h"

namespace pipetrain {
namespace testing {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Fails naming entry `i` if |got[i] - want[i]| is not finite: std::max
// drops a NaN (it compares false), so a NaN would pass any bound on the
// largest difference. Returns whether it failed.
bool FailedNonFinite(const std::vector<float>& got, const std::vector<float>& want, size_t i,
                     const std::string& what) {
  if (std::isfinite(double{got[i]} - want[i])) return false;
  ADD_FAILURE() << what << ": entry " << i << " is " << got[i] << " against " << want[i];
  return true;
}

// max |a - b| <= relative * max |b| over the entries outside
// [skip_begin, skip_end), which are not compared (the key bias: see the
// header) but must still be finite.
void ExpectTensorClose(const std::vector<float>& got, const std::vector<float>& want,
                       const std::string& what, double relative, size_t skip_begin,
                       size_t skip_end) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0, worst = 0;
  for (float w : want) scale = std::max(scale, double{std::fabs(w)});
  for (size_t i = 0; i < want.size(); ++i) {
    if (FailedNonFinite(got, want, i, what)) return;
    if (skip_begin <= i && i < skip_end) continue;
    worst = std::max(worst, std::fabs(double{got[i]} - want[i]));
  }
  EXPECT_LE(worst, relative * scale)
      << what << ": max difference " << worst << " against max magnitude " << scale;
}

}  // namespace

void ExpectScaledClose(const std::vector<float>& got, const std::vector<float>& want,
                       double relative, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0, diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (FailedNonFinite(got, want, i, what)) return;
    scale = std::max(scale, std::fabs(double{want[i]}));
    diff = std::max(diff, std::fabs(double{got[i]} - want[i]));
  }
  EXPECT_LE(diff, relative * scale + 1e-9)
      << what << ": max difference " << diff << " at scale " << scale;
}

void ExpectLossesClose(const std::vector<float>& got, const std::vector<float>& want,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(std::fabs(double{got[i]} - want[i]), kDataParallelRelative * std::fabs(want[i]))
        << what << " " << i << ": " << got[i] << " vs " << want[i];
  }
}

void ExpectWeightsClose(const std::map<std::string, std::vector<float>>& got,
                        const std::map<std::string, std::vector<float>>& want, int d_model,
                        const std::string& what, double relative) {
  EXPECT_EQ(got.size(), want.size()) << what;
  const size_t d = d_model;
  for (const auto& [name, values] : want) {
    auto it = got.find(name);
    if (it == got.end()) {
      ADD_FAILURE() << what << ": no " << name;
      continue;
    }
    if (EndsWith(name, "attn.c_attn.bias")) {
      ExpectTensorClose(it->second, values, what + " " + name, relative, d, 2 * d);
    } else {
      ExpectTensorClose(it->second, values, what + " " + name, relative, 0, 0);
    }
  }
}

}  // namespace testing
}  // namespace pipetrain
