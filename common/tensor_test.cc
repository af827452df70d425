#include "common/tensor.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(TensorTest, Zeros_AllocatesAlignedZeroedStorage) {
  Tensor t = Tensor::Zeros({3, 5});
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.rank(), 2);
  EXPECT_EQ(t.dim(-1), 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t[i], 0.0f);
}

TEST(TensorTest, Copy_IsShallowAndCloneIsDeep) {
  Tensor a = Tensor::FromVector({2, 2}, {1, 2, 3, 4});
  Tensor b = a;
  Tensor c = a.Clone();
  a[0] = 9;
  EXPECT_EQ(b[0], 9);
  EXPECT_EQ(c[0], 1);
  EXPECT_TRUE(a.SharesStorageWith(b));
  EXPECT_FALSE(a.SharesStorageWith(c));
}

TEST(TensorTest, SliceAndReshape_ViewTheSameStorage) {
  Tensor a = Tensor::FromVector({3, 2}, {0, 1, 2, 3, 4, 5});
  Tensor rows = a.Slice(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 2}));
  EXPECT_EQ(rows.ToVector(), (std::vector<float>{2, 3, 4, 5}));
  rows.Reshape({4})[3] = -1;
  EXPECT_EQ(a[5], -1);
}

TEST(TensorTest, ScalarShape_HasOneElement) {
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(ShapeToString({2, 0, 4}), "[2, 0, 4]");
  EXPECT_EQ(Tensor::Zeros({2, 0}).numel(), 0);
}

TEST(TensorDeathTest, Reshape_WrongCount_Aborts) {
  Tensor a = Tensor::Zeros({2, 3});
  EXPECT_DEATH(a.Reshape({4}), "cannot reshape \\[2, 3\\] to \\[4\\]");
}

}  // namespace
}  // namespace pipetrain
