#include "common/tensor.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

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

TEST(TensorTest, Filled_EveryElementAndAligned) {
  Tensor t = Tensor::Filled({4, 7}, -2.5f);
  EXPECT_EQ(t.numel(), 28);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t[i], -2.5f) << i;
  EXPECT_EQ(Tensor::Filled({0, 3}, 1.0f).numel(), 0);
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

// OnDevice tensors are views over memory a backend owns: shape and views
// work, host element access is refused (here the "device" memory is host
// memory, so a wrong access would silently read it instead of crashing).
TEST(TensorTest, OnDevice_KeepsShapeAndViews) {
  std::shared_ptr<float> storage(new float[6](), std::default_delete<float[]>());
  Tensor t = Tensor::OnDevice({2, 3}, storage);
  EXPECT_TRUE(t.on_device());
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.data(), storage.get());
  Tensor row = t.Slice(1, 2);
  EXPECT_TRUE(row.on_device());
  EXPECT_EQ(row.data(), storage.get() + 3);
  EXPECT_TRUE(t.Reshape({6}).on_device());
  EXPECT_FALSE(Tensor::Zeros({2}).on_device());
}

// OnHost wraps caller-owned host memory: host access works on it, and the
// deleter runs when the last view is gone.
TEST(TensorTest, OnHost_UsesTheStorageAndFreesItWithTheLastView) {
  bool freed = false;
  {
    std::shared_ptr<float> storage(new float[4]{1, 2, 3, 4}, [&freed](float* p) {
      freed = true;
      delete[] p;
    });
    float* raw = storage.get();
    Tensor t = Tensor::OnHost({2, 2}, std::move(storage));
    EXPECT_FALSE(t.on_device());
    EXPECT_EQ(t.data(), raw);
    EXPECT_EQ(t.ToVector(), (std::vector<float>{1, 2, 3, 4}));
    Tensor row = t.Slice(1, 2);
    t = Tensor();
    EXPECT_FALSE(freed);  // the slice still holds it
    EXPECT_EQ(row.ToVector(), (std::vector<float>{3, 4}));
  }
  EXPECT_TRUE(freed);
}

TEST(TensorTest, FirstNonFinite_IndexOfTheFirstNanOrInfinity) {
  EXPECT_EQ(FirstNonFinite(Tensor()), -1);
  Tensor t = Tensor::FromVector({2, 3}, {0, -1, std::numeric_limits<float>::max(), 4, 5, 6});
  EXPECT_EQ(FirstNonFinite(t), -1);
  t[4] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FirstNonFinite(t), 4);
  t[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(FirstNonFinite(t), 3);
  EXPECT_EQ(FirstNonFinite(t.Slice(1, 2)), 0);  // a view counts from its start
  t[0] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(FirstNonFinite(t), 0);
  EXPECT_EQ(DescribeFirstNonFinite(t), "holds an infinity at element 0");
  EXPECT_EQ(DescribeFirstNonFinite(t.Slice(1, 2)), "holds NaN at element 0");
  EXPECT_EQ(DescribeFirstNonFinite(Tensor::Zeros({3})), "");
}

TEST(TensorTest, HostTensorMemory_CountsOwnStorageUntilFreed_AndItsPeak) {
  const HostTensorMemory before = CurrentHostTensorMemory();
  ResetHostTensorPeak();
  EXPECT_EQ(CurrentHostTensorMemory().peak_bytes, before.live_bytes);
  {
    Tensor a = Tensor::Zeros({100});                   // 400 bytes
    Tensor view = a.Slice(10, 20);                     // shares a: nothing more
    Tensor b = Tensor::Filled({2, 50}, 1.0f).Clone();  // 400 + a freed 400
    EXPECT_EQ(CurrentHostTensorMemory().live_bytes, before.live_bytes + 800);
    std::shared_ptr<float> outside(new float[64](), std::default_delete<float[]>());
    Tensor c = Tensor::OnHost({64}, outside);  // the caller's memory: not counted
    EXPECT_EQ(CurrentHostTensorMemory().live_bytes, before.live_bytes + 800);
  }
  const HostTensorMemory after = CurrentHostTensorMemory();
  EXPECT_EQ(after.live_bytes, before.live_bytes);
  // a, the Filled temporary and its clone were live at once.
  EXPECT_EQ(after.peak_bytes, before.live_bytes + 1200);
  ResetHostTensorPeak();
  EXPECT_EQ(CurrentHostTensorMemory().peak_bytes, before.live_bytes);
}

TEST(TensorDeathTest, OnHost_NullStorage_Aborts) {
  EXPECT_DEATH(Tensor::OnHost({2}, nullptr), "Tensor::OnHost over null storage");
}

TEST(TensorDeathTest, HostMethods_OnDeviceTensor_Abort) {
  std::shared_ptr<float> storage(new float[2](), std::default_delete<float[]>());
  Tensor t = Tensor::OnDevice({2}, storage);
  EXPECT_DEATH(t.Fill(1.0f), "Fill of a device tensor");
  EXPECT_DEATH(t.ToVector(), "ToVector of a device tensor");
  EXPECT_DEATH(t.Clone(), "Clone of a device tensor");
  EXPECT_DEATH(FirstNonFinite(t), "FirstNonFinite reads host tensors");
  Tensor host = Tensor::Zeros({2});
  EXPECT_DEATH(host.CopyFrom(t), "host copy of a device tensor");
}

}  // namespace
}  // namespace pipetrain
