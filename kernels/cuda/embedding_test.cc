// Embedding CUDA kernels against the CPU reference (kernels/cpu/embedding.cc).
//
// Tolerance: none (atol = rtol = 0, i.e. bitwise equal). The forward pass is
// one fp32 addition per element on both sides. The backward pass adds the
// same gradient values onto the same starting values in the same order (row
// order for dwte, batch order for dwpe) with correctly rounded fp32
// additions and no multiplications, so nothing can be contracted or
// reordered. Bitwise equality with the CPU also shows the backward pass is
// deterministic (its summation order is fixed).
#include "kernels/cuda/embedding.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/philox.h"
#include "gtest/gtest.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

using testing::AllClose;
using testing::RandomNormal;

constexpr float kAtol = 0.0f;
constexpr float kRtol = 0.0f;

struct Shape {
  int batch;
  int seq_len;
  int c;        // channels
  int vocab;    // rows of wte
  int max_seq;  // rows of wpe, >= seq_len
};

// A single element; the CPU test's shape (vocab 11, so tokens repeat);
// GPT-2's 768 channels with 50 tokens over 99 positions (long groups of
// rows per token); widths that are not multiples of the 256-thread block
// and need more than one column block (768, 1000, 257); 516 and 2048 rows;
// a vocabulary larger than the number of tokens (most table rows get no
// gradient).
const Shape kShapes[] = {{1, 1, 1, 1, 1},
                         {2, 4, 8, 11, 6},
                         {3, 33, 768, 50, 40},
                         {4, 129, 1000, 97, 130},
                         {8, 256, 257, 5000, 300}};

std::string Name(const Shape& s, const char* tensor) {
  return "[batch " + std::to_string(s.batch) + ", seq " + std::to_string(s.seq_len) + ", c " +
         std::to_string(s.c) + ", vocab " + std::to_string(s.vocab) + "] " + tensor;
}

int64_t Rows(const Shape& s) { return static_cast<int64_t>(s.batch) * s.seq_len; }

// Token ids uniform in [0, vocab), a pure function of (seed, shape).
std::vector<int32_t> RandomTokens(uint64_t seed, const Shape& s) {
  std::vector<int32_t> tokens(static_cast<size_t>(Rows(s)));
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(
        UniformIndex(seed, static_cast<uint32_t>(i), 0, 0, static_cast<uint64_t>(s.vocab)));
  }
  return tokens;
}

class EmbeddingCudaTest : public testing::CudaTest {};

TEST_F(EmbeddingCudaTest, EmbeddingForwardCuda_Shapes_MatchesCpu) {
  for (const Shape& s : kShapes) {
    const std::vector<int32_t> tokens = RandomTokens(70, s);
    const std::vector<float> wte = RandomNormal(71, int64_t{s.vocab} * s.c, 0.0f, 0.02f);
    const std::vector<float> wpe = RandomNormal(72, int64_t{s.max_seq} * s.c, 0.0f, 0.01f);
    std::vector<float> want(Rows(s) * s.c);
    EmbeddingForward(tokens.data(), wte.data(), wpe.data(), s.batch, s.seq_len, s.c, want.data());

    auto tokens_d = DeviceBuffer<int32_t>::FromHost(tokens);
    auto wte_d = DeviceBuffer<float>::FromHost(wte);
    auto wpe_d = DeviceBuffer<float>::FromHost(wpe);
    auto out_d = DeviceBuffer<float>::Create(Rows(s) * s.c);
    ASSERT_TRUE(tokens_d.ok() && wte_d.ok() && wpe_d.ok() && out_d.ok());
    const absl::Status run = EmbeddingForwardCuda(tokens_d->data(), wte_d->data(), wpe_d->data(),
                                                  s.batch, s.seq_len, s.c, s.vocab, out_d->data());
    ASSERT_TRUE(run.ok()) << run;
    auto got = out_d->ToHost();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(AllClose(Name(s, "out"), *got, want, kAtol, kRtol));
  }
}

TEST_F(EmbeddingCudaTest, EmbeddingBackwardCuda_Shapes_MatchesCpuAndAccumulates) {
  for (const Shape& s : kShapes) {
    const std::vector<int32_t> tokens = RandomTokens(80, s);
    const std::vector<float> dout = RandomNormal(81, Rows(s) * s.c, 0.0f, 1.0f);
    // dwte and dwpe start non-zero: both sides must add to them.
    std::vector<float> dwte = RandomNormal(82, int64_t{s.vocab} * s.c, 0.0f, 1.0f);
    std::vector<float> dwpe = RandomNormal(83, int64_t{s.max_seq} * s.c, 0.0f, 1.0f);
    auto dwte_d = DeviceBuffer<float>::FromHost(dwte);
    auto dwpe_d = DeviceBuffer<float>::FromHost(dwpe);
    EmbeddingBackward(tokens.data(), dout.data(), s.batch, s.seq_len, s.c, dwte.data(),
                      dwpe.data());

    const TokenRowGroups grouped = GroupRowsByToken(tokens.data(), Rows(s), s.vocab);
    auto index_d = DeviceBuffer<int32_t>::FromHost(grouped.index);
    auto dout_d = DeviceBuffer<float>::FromHost(dout);
    ASSERT_TRUE(index_d.ok() && dout_d.ok() && dwte_d.ok() && dwpe_d.ok());
    const absl::Status run =
        EmbeddingBackwardCuda(index_d->data(), grouped.groups, dout_d->data(), s.batch, s.seq_len,
                              s.c, dwte_d->data(), dwpe_d->data());
    ASSERT_TRUE(run.ok()) << run;
    auto dwte_got = dwte_d->ToHost();
    auto dwpe_got = dwpe_d->ToHost();
    ASSERT_TRUE(dwte_got.ok() && dwpe_got.ok());
    EXPECT_TRUE(AllClose(Name(s, "dwte"), *dwte_got, dwte, kAtol, kRtol));
    // Rows of wpe beyond seq_len get no gradient on either side.
    EXPECT_TRUE(AllClose(Name(s, "dwpe"), *dwpe_got, dwpe, kAtol, kRtol));
  }
}

// Rows 1 and 4 carry ids outside [0, vocab): the GPU neither reads nor
// writes outside the tables, marks those rows NaN in the forward pass, and
// drops them from dwte (not from dwpe) in the backward pass.
class EmbeddingCudaBadTokenTest : public testing::CudaTest {
 protected:
  static constexpr Shape kShape = {2, 3, 5, 4, 3};
  const std::vector<int32_t> tokens_ = {0, -1, 3, 1, 4, 0};
  // The same with the bad ids replaced by 0, for the CPU reference.
  const std::vector<int32_t> clean_ = {0, 0, 3, 1, 0, 0};
  static bool IsBadRow(int64_t row) { return row == 1 || row == 4; }
};

TEST_F(EmbeddingCudaBadTokenTest, EmbeddingForwardCuda_OutOfRangeToken_NanRow) {
  const Shape s = kShape;
  const std::vector<float> wte = RandomNormal(90, int64_t{s.vocab} * s.c, 0.0f, 1.0f);
  const std::vector<float> wpe = RandomNormal(91, int64_t{s.max_seq} * s.c, 0.0f, 1.0f);
  std::vector<float> want(Rows(s) * s.c);
  EmbeddingForward(clean_.data(), wte.data(), wpe.data(), s.batch, s.seq_len, s.c, want.data());

  auto tokens_d = DeviceBuffer<int32_t>::FromHost(tokens_);
  auto wte_d = DeviceBuffer<float>::FromHost(wte);
  auto wpe_d = DeviceBuffer<float>::FromHost(wpe);
  auto out_d = DeviceBuffer<float>::Create(Rows(s) * s.c);
  ASSERT_TRUE(tokens_d.ok() && wte_d.ok() && wpe_d.ok() && out_d.ok());
  ASSERT_TRUE(EmbeddingForwardCuda(tokens_d->data(), wte_d->data(), wpe_d->data(), s.batch,
                                   s.seq_len, s.c, s.vocab, out_d->data())
                  .ok());
  auto got = out_d->ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  for (int64_t row = 0; row < Rows(s); ++row) {
    for (int j = 0; j < s.c; ++j) {
      const float value = (*got)[row * s.c + j];
      if (IsBadRow(row)) {
        EXPECT_TRUE(std::isnan(value)) << "row " << row << " column " << j << ": " << value;
      } else {
        EXPECT_EQ(value, want[row * s.c + j]) << "row " << row << " column " << j;
      }
    }
  }
}

TEST_F(EmbeddingCudaBadTokenTest, EmbeddingBackwardCuda_OutOfRangeToken_SkipsTableRow) {
  const Shape s = kShape;
  const std::vector<float> dout = RandomNormal(92, Rows(s) * s.c, 0.0f, 1.0f);
  std::vector<float> dwte = RandomNormal(93, int64_t{s.vocab} * s.c, 0.0f, 1.0f);
  std::vector<float> dwpe = RandomNormal(94, int64_t{s.max_seq} * s.c, 0.0f, 1.0f);
  auto dwte_d = DeviceBuffer<float>::FromHost(dwte);
  auto dwpe_d = DeviceBuffer<float>::FromHost(dwpe);
  // Expected dwpe: every row's gradient. Expected dwte: only the good rows'
  // (the bad rows' gradients are zeroed, so adding them to row 0 is exact).
  std::vector<float> unused_dwte = dwte;
  EmbeddingBackward(clean_.data(), dout.data(), s.batch, s.seq_len, s.c, unused_dwte.data(),
                    dwpe.data());
  std::vector<float> good_dout = dout;
  for (int64_t row = 0; row < Rows(s); ++row) {
    if (!IsBadRow(row)) continue;
    for (int j = 0; j < s.c; ++j) good_dout[row * s.c + j] = 0.0f;
  }
  std::vector<float> unused_dwpe = dwpe;
  EmbeddingBackward(clean_.data(), good_dout.data(), s.batch, s.seq_len, s.c, dwte.data(),
                    unused_dwpe.data());

  const TokenRowGroups grouped = GroupRowsByToken(tokens_.data(), Rows(s), s.vocab);
  ASSERT_EQ(grouped.dropped, 2);
  auto index_d = DeviceBuffer<int32_t>::FromHost(grouped.index);
  auto dout_d = DeviceBuffer<float>::FromHost(dout);
  ASSERT_TRUE(index_d.ok() && dout_d.ok() && dwte_d.ok() && dwpe_d.ok());
  ASSERT_TRUE(EmbeddingBackwardCuda(index_d->data(), grouped.groups, dout_d->data(), s.batch,
                                    s.seq_len, s.c, dwte_d->data(), dwpe_d->data())
                  .ok());
  auto dwte_got = dwte_d->ToHost();
  auto dwpe_got = dwpe_d->ToHost();
  ASSERT_TRUE(dwte_got.ok() && dwpe_got.ok());
  EXPECT_TRUE(AllClose("dwte with bad tokens", *dwte_got, dwte, kAtol, kRtol));
  EXPECT_TRUE(AllClose("dwpe with bad tokens", *dwpe_got, dwpe, kAtol, kRtol));
}

// Shape checks happen before any CUDA call, so these run without a GPU.
TEST(EmbeddingCudaArgumentsTest, EmbeddingForwardCuda_ZeroChannels_InvalidArgument) {
  const absl::Status status = EmbeddingForwardCuda(nullptr, nullptr, nullptr, 2, 3, 0, 10, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("EmbeddingForwardCuda: batch 2, seq_len 3, c 0, vocab 10"),
            std::string::npos)
      << status;
}

TEST(EmbeddingCudaArgumentsTest, EmbeddingBackwardCuda_NegativeBatch_InvalidArgument) {
  const absl::Status status =
      EmbeddingBackwardCuda(nullptr, 0, nullptr, -1, 3, 8, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("EmbeddingBackwardCuda: batch -1"), std::string::npos) << status;
}

TEST(EmbeddingCudaArgumentsTest, EmbeddingBackwardCuda_MoreGroupsThanRows_InvalidArgument) {
  const absl::Status status = EmbeddingBackwardCuda(nullptr, 7, nullptr, 2, 3, 8, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("groups 7"), std::string::npos) << status;
}

TEST(EmbeddingCudaArgumentsTest, EmbeddingBackwardCuda_RowsBeyondInt32_InvalidArgument) {
  const absl::Status status =
      EmbeddingBackwardCuda(nullptr, 1, nullptr, 1 << 16, 1 << 16, 8, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("<= 2147483647"), std::string::npos) << status;
}

TEST(EmbeddingCudaArgumentsTest, EmbeddingForwardCuda_NoTokens_OkWithoutLaunch) {
  EXPECT_TRUE(EmbeddingForwardCuda(nullptr, nullptr, nullptr, 0, 3, 8, 10, nullptr).ok());
  EXPECT_TRUE(EmbeddingForwardCuda(nullptr, nullptr, nullptr, 2, 0, 8, 10, nullptr).ok());
  EXPECT_TRUE(EmbeddingBackwardCuda(nullptr, 0, nullptr, 0, 3, 8, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace pipetrain
