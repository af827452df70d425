// The multi-tensor passes (multi_tensor_kernels.cuh), their own source run
// on the CPU through warp_emulation.h and launched batch by batch as
// multi_tensor.cu launches them: the sums of squares against double sums
// in element order (within the two orders' rounding bound) and bitwise
// the same wherever a tensor sits in the table (the emulation is the same
// run to run by construction; a GPU's runs are multi_tensor_test's); the scaling
// bitwise x * scale; the zeroing all +0; and nothing written past a
// tensor's end. 70 tensors make two launches' batches (64 + 6).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/emulation/warp_emulation.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/multi_tensor_kernels.cuh"

namespace pipetrain {
namespace {

using cuda_emulation::LaunchEmulated;

constexpr int kGuard = 8;  // floats after each tensor that must stay as they were
constexpr uint32_t kGuardBits = 0x7fc01234u;  // a NaN no pass writes

uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

uint64_t Bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

float FromBits(uint32_t b) {
  float v;
  std::memcpy(&v, &b, sizeof(v));
  return v;
}

// Sizes with every case of a batch's grid: empty, one element, a partial
// and a full block, one past it, several blocks. (The caps on a grid's
// blocks have a test of their own, with one tensor.)
const int64_t kSizes[] = {0, 1, 255, 256, 1024, 1025, 2049, 3};

// The table: count tensors cycling through kSizes, each followed by guards.
struct Table {
  std::vector<std::vector<float>> storage;
  std::vector<int64_t> counts;
  std::vector<float*> tensors;
};

Table MakeTable(int count, int rotate, int64_t only_size = -1) {
  Table t;
  for (int i = 0; i < count; ++i) {
    const int64_t n = only_size >= 0 ? only_size : kSizes[(i + rotate) % std::size(kSizes)];
    std::vector<float> values(static_cast<size_t>(n + kGuard));
    // Values follow the size's place in kSizes, so a rotated table holds
    // the same tensors at other places.
    uint64_t state = 0x9e3779b97f4a7c15ull * (i + rotate + 1);
    for (int64_t j = 0; j < n; ++j) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      values[j] = static_cast<float>(static_cast<int64_t>(state >> 40) - (1 << 23)) / (1 << 20);
    }
    for (int g = 0; g < kGuard; ++g) values[n + g] = FromBits(kGuardBits);
    t.counts.push_back(n);
    t.storage.push_back(std::move(values));
  }
  for (auto& v : t.storage) t.tensors.push_back(v.data());
  return t;
}

// SumsOfSquaresCuda's launches, emulated.
std::vector<double> Sums(const Table& t) {
  const int count = static_cast<int>(t.counts.size());
  std::vector<const float*> tensors(t.tensors.begin(), t.tensors.end());
  std::vector<double> partials(static_cast<size_t>(count) * kMaxSquaresBlocks, NAN);
  std::vector<double> sums(count, NAN);
  for (int first = 0; first < count; first += kTensorsPerLaunch) {
    TensorBatch<const float*> batch{};
    int64_t largest = 0;
    const int in_batch = FillBatch(tensors.data(), t.counts.data(), count, first, &batch, &largest);
    LaunchEmulated(SquaresBlocks(largest), in_batch, kSquaresThreads, 0,
                   [&] { SquaresPartialsKernel(batch, first, partials.data()); });
    LaunchEmulated(in_batch, 1, kSquaresThreads, 0,
                   [&] { SquaresTotalsKernel(batch, first, partials.data(), sums.data()); });
  }
  return sums;
}

// LaunchPerBatch's launches (ScaleAllCuda, ZeroAllCuda), emulated with
// 32 threads a block where the GPU runs kElementwiseThreads (256): the
// kernel strides by blockDim.x * gridDim.x whatever they are, and the
// emulation's cost grows with the threads a block (a barrier of them
// between blocks).
constexpr int kEmulatedElementwiseThreads = 32;
template <typename Op>
void Elementwise(Table& t, Op op) {
  const int count = static_cast<int>(t.counts.size());
  for (int first = 0; first < count; first += kTensorsPerLaunch) {
    TensorBatch<float*> batch{};
    int64_t largest = 0;
    const int in_batch =
        FillBatch(t.tensors.data(), t.counts.data(), count, first, &batch, &largest);
    if (largest == 0) continue;
    LaunchEmulated(ElementwiseBlocks(largest), in_batch, kEmulatedElementwiseThreads, 0,
                   [&] { ElementwiseKernel(batch, op); });
  }
}

void ExpectGuardsKept(const Table& t) {
  for (size_t i = 0; i < t.counts.size(); ++i) {
    for (int g = 0; g < kGuard; ++g) {
      ASSERT_EQ(Bits(t.storage[i][t.counts[i] + g]), kGuardBits) << "tensor " << i;
    }
  }
}

// Against double sums in element order. Positive terms: each order's
// relative error is at most n u (u = 2^-53), so the two differ by at most
// 2 n u of the sum.
void ExpectSumsNearElementOrder(const Table& table, const std::vector<double>& sums) {
  for (size_t i = 0; i < table.counts.size(); ++i) {
    double want = 0;
    for (int64_t j = 0; j < table.counts[i]; ++j) {
      want += double(table.storage[i][j]) * double(table.storage[i][j]);
    }
    const double bound = 2.0 * double(table.counts[i]) * 0x1p-53 * want;
    EXPECT_LE(std::fabs(sums[i] - want), bound) << "tensor " << i << " of " << table.counts[i];
  }
}

void ExpectScaledThenZeroed(Table& table) {
  const Table before = table;
  const float scale = 0.3f;
  Elementwise(table, ScaleOp{scale});
  ExpectGuardsKept(table);
  for (size_t i = 0; i < table.counts.size(); ++i) {
    for (int64_t j = 0; j < table.counts[i]; ++j) {
      ASSERT_EQ(Bits(table.storage[i][j]), Bits(before.storage[i][j] * scale))
          << "tensor " << i << " element " << j;
    }
  }
  Elementwise(table, ZeroOp{});
  ExpectGuardsKept(table);
  for (size_t i = 0; i < table.counts.size(); ++i) {
    for (int64_t j = 0; j < table.counts[i]; ++j) {
      ASSERT_EQ(Bits(table.storage[i][j]), 0u) << "tensor " << i << " element " << j;
    }
  }
}

TEST(MultiTensorEmulationTest, SumsOfSquares_WithinTheOrdersBound_SameBitsAnywhereInTheTable) {
  constexpr int kCount = 70;
  const Table table = MakeTable(kCount, 0);
  const std::vector<double> sums = Sums(table);
  ExpectSumsNearElementOrder(table, sums);
  // The same tensors with the table rotated by three: each sits at another
  // place, in another batch with other neighbours, and sums to the same bits.
  const Table rotated = MakeTable(kCount, 3);
  const std::vector<double> rotated_sums = Sums(rotated);
  for (int i = 0; i + 3 < kCount; ++i) {
    // (Bits, not values: the guards are NaN.)
    ASSERT_EQ(rotated.storage[i].size(), table.storage[i + 3].size());
    ASSERT_EQ(std::memcmp(rotated.storage[i].data(), table.storage[i + 3].data(),
                          rotated.storage[i].size() * sizeof(float)),
              0)
        << i;
    EXPECT_EQ(Bits(rotated_sums[i]), Bits(sums[i + 3])) << "tensor " << i + 3 << " moved to " << i;
  }
}

TEST(MultiTensorEmulationTest, Scale_BitwiseTheProduct_Zero_AllPositiveZero) {
  Table table = MakeTable(70, 0);
  ExpectScaledThenZeroed(table);
}

// One tensor past both caps on a grid's blocks (256 for the sums, 1024
// for the element-wise passes), so every thread strides over it (the
// element-wise passes with the emulation's 32 threads a block: over
// 1024 * 32 elements at a time).
TEST(MultiTensorEmulationTest, PastTheBlockCaps_EveryElementOnce) {
  constexpr int64_t kN = int64_t{1024} * kMaxSquaresBlocks + 1025;
  ASSERT_EQ(SquaresBlocks(kN), kMaxSquaresBlocks);
  ASSERT_EQ(ElementwiseBlocks(kN), kMaxElementwiseBlocks);
  Table table = MakeTable(1, 0, kN);
  ExpectSumsNearElementOrder(table, Sums(table));
  ExpectScaledThenZeroed(table);
}

}  // namespace
}  // namespace pipetrain
