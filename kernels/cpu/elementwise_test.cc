#include "kernels/cpu/elementwise.h"

#include <cstdint>

#include "common/tensor.h"
#include "common/testing/gradient_check.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using testing::CheckGradients;
using testing::DotLoss;
using testing::RandomTensor;

// Not a multiple of any vector width, so the loops' scalar tails run too.
constexpr int kSize = 37;

TEST(AddTest, SeparateOutput_ElementwiseSum) {
  const Tensor a = RandomTensor({kSize}, 1);
  const Tensor b = RandomTensor({kSize}, 2);
  Tensor out = Tensor::Zeros({kSize});
  Add(a.data(), b.data(), kSize, out.data());
  // One fp32 addition per element: bit-identical to the naive sum.
  for (int i = 0; i < kSize; ++i) EXPECT_EQ(out[i], a[i] + b[i]) << i;
}

TEST(AddTest, OutputAliasesEitherInput_SameResult) {
  const Tensor a = RandomTensor({kSize}, 1);
  const Tensor b = RandomTensor({kSize}, 2);
  Tensor expected = Tensor::Zeros({kSize});
  Add(a.data(), b.data(), kSize, expected.data());
  Tensor into_a = a.Clone();
  Add(into_a.data(), b.data(), kSize, into_a.data());
  EXPECT_EQ(into_a.ToVector(), expected.ToVector());
  Tensor into_b = b.Clone();
  Add(a.data(), into_b.data(), kSize, into_b.data());
  EXPECT_EQ(into_b.ToVector(), expected.ToVector());
  Tensor doubled = a.Clone();
  Add(doubled.data(), doubled.data(), kSize, doubled.data());
  for (int i = 0; i < kSize; ++i) EXPECT_EQ(doubled[i], 2.0f * a[i]) << i;
}

TEST(AddTest, BothInputs_MatchFiniteDifferences) {
  // The residual's backward passes dy unchanged to both inputs.
  Tensor a = RandomTensor({kSize}, 1);
  Tensor b = RandomTensor({kSize}, 2);
  const Tensor dy = RandomTensor({kSize}, 3);
  Tensor out = Tensor::Zeros({kSize});
  auto loss = [&] {
    Add(a.data(), b.data(), kSize, out.data());
    return DotLoss(out, dy);
  };
  absl::Status status = CheckGradients(loss, {{"a", &a, dy}, {"b", &b, dy}});
  EXPECT_TRUE(status.ok()) << status;
}

TEST(AddInPlaceTest, Accumulates_ElementwiseSum) {
  const Tensor x = RandomTensor({kSize}, 4);
  Tensor acc = RandomTensor({kSize}, 5);
  const Tensor before = acc.Clone();
  AddInPlace(acc.data(), x.data(), kSize);
  for (int i = 0; i < kSize; ++i) EXPECT_EQ(acc[i], before[i] + x[i]) << i;
  AddInPlace(acc.data(), x.data(), kSize);
  for (int i = 0; i < kSize; ++i) EXPECT_EQ(acc[i], (before[i] + x[i]) + x[i]) << i;
}

TEST(AddInPlaceTest, AccumulatorAndAddend_MatchFiniteDifferences) {
  Tensor acc0 = RandomTensor({kSize}, 4);
  Tensor x = RandomTensor({kSize}, 5);
  const Tensor dy = RandomTensor({kSize}, 6);
  auto loss = [&] {
    Tensor acc = acc0.Clone();
    AddInPlace(acc.data(), x.data(), kSize);
    return DotLoss(acc, dy);
  };
  absl::Status status = CheckGradients(loss, {{"acc", &acc0, dy}, {"x", &x, dy}});
  EXPECT_TRUE(status.ok()) << status;
}

TEST(SubtractTest, SeparateOutput_ElementwiseDifference) {
  const Tensor a = RandomTensor({kSize}, 7);
  const Tensor b = RandomTensor({kSize}, 8);
  Tensor out = Tensor::Zeros({kSize});
  Subtract(a.data(), b.data(), kSize, out.data());
  // One fp32 subtraction per element, in this order (a - b, not b - a).
  for (int i = 0; i < kSize; ++i) EXPECT_EQ(out[i], a[i] - b[i]) << i;
}

TEST(SubtractTest, OutputAliasesEitherInput_SameResult) {
  const Tensor a = RandomTensor({kSize}, 7);
  const Tensor b = RandomTensor({kSize}, 8);
  Tensor expected = Tensor::Zeros({kSize});
  Subtract(a.data(), b.data(), kSize, expected.data());
  Tensor into_a = a.Clone();
  Subtract(into_a.data(), b.data(), kSize, into_a.data());
  EXPECT_EQ(into_a.ToVector(), expected.ToVector());
  Tensor into_b = b.Clone();
  Subtract(a.data(), into_b.data(), kSize, into_b.data());
  EXPECT_EQ(into_b.ToVector(), expected.ToVector());
  Tensor zeroed = a.Clone();
  Subtract(zeroed.data(), zeroed.data(), kSize, zeroed.data());
  for (int i = 0; i < kSize; ++i) EXPECT_EQ(zeroed[i], 0.0f) << i;
}

}  // namespace
}  // namespace pipetrain
