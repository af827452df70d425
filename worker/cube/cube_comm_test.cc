// The cube's coordinates, the layouts of cube_layout.h and the in-process
// CubeComm of cube_testing.h.
#include "worker/cube/cube_comm.h"

#include <cstring>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "worker/cube/cube_layout.h"
#include "worker/cube/cube_test_util.h"
#include "worker/cube/cube_testing.h"

namespace pipetrain {
namespace {

using cube_test::ExpectAllOk;
using cube_test::Fabric;
using cube_test::kPaper;
// A value that names its rank and position, exact in fp32.
float Tagged(int rank, int64_t k) { return static_cast<float>(rank * 1000 + k); }

TEST(CubeCoordTest, RankIndex_LFastest_RoundTrips) {
  for (int p : {2, 3}) {
    for (int r = 0; r < p * p * p; ++r) EXPECT_EQ(CubeRankIndex(CubeCoordOf(r, p), p), r);
  }
  CubeCoord c;
  c.coords = {1, 0, 1};
  EXPECT_EQ(CubeRankIndex(c, 2), 5);
  EXPECT_EQ(c[CubeAxis::kX], 1);
  EXPECT_EQ(c[CubeAxis::kZ], 1);
}

TEST(CubeDirectionTest, Swapped_ExchangesInputAndOutput_TwiceIsIdentity) {
  const CubeDirection s = kPaper.Swapped();
  EXPECT_EQ(s.input, CubeAxis::kZ);
  EXPECT_EQ(s.weight, CubeAxis::kX);
  EXPECT_EQ(s.output, CubeAxis::kY);
  EXPECT_EQ(s.Swapped().ToString(), kPaper.ToString());
  EXPECT_TRUE(kPaper.Valid());
  EXPECT_FALSE((CubeDirection{CubeAxis::kX, CubeAxis::kX, CubeAxis::kZ}).Valid());
}

TEST(InProcessCubeFabricTest, Create_PBelowTwo_InvalidArgument) {
  auto fabric = InProcessCubeFabric::Create(1);
  ASSERT_EQ(fabric.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fabric.status().message().find("p = 1"), std::string::npos) << fabric.status();
}

class CubeCommTest : public ::testing::TestWithParam<std::tuple<int, CubeAxis>> {};

TEST_P(CubeCommTest, AllGather_ConcatenatesInCoordinateOrder) {
  const auto [p, axis] = GetParam();
  auto fabric = Fabric(p);
  const int64_t s = 3;
  ExpectAllOk(fabric->Run([&](InProcessCubeComm& comm) -> absl::Status {
    const CubeCoord c = comm.coord();
    std::vector<float> mine(s), out(p * s);
    for (int64_t k = 0; k < s; ++k) mine[k] = Tagged(CubeRankIndex(c, p), k);
    if (absl::Status st = comm.AllGather(axis, mine, absl::MakeSpan(out)); !st.ok()) return st;
    for (int m = 0; m < p; ++m) {
      CubeCoord peer = c;
      peer[axis] = m;
      for (int64_t k = 0; k < s; ++k) EXPECT_EQ(out[m * s + k], Tagged(CubeRankIndex(peer, p), k));
    }
    EXPECT_EQ(comm.sent_bytes(), 4 * (p - 1) * s);
    return absl::OkStatus();
  }));
}

TEST_P(CubeCommTest, ReduceScatterAndAllReduce_LeftFoldInCoordinateOrder_BitwiseOnEveryMember) {
  const auto [p, axis] = GetParam();
  auto fabric = Fabric(p);
  const int64_t s = 4;
  // Mixed magnitudes, so that the order of the sum shows in its bits.
  auto value = [](int rank, int64_t k) {
    return (k % 2 ? 1e7f : 1e-3f) * static_cast<float>((rank * 7 + k * 13) % 11 - 5) + 0.1f;
  };
  std::vector<std::vector<float>> all_reduced(p * p * p);
  ExpectAllOk(fabric->Run([&](InProcessCubeComm& comm) -> absl::Status {
    const CubeCoord c = comm.coord();
    const int rank = CubeRankIndex(c, p);
    std::vector<float> data(p * s), out(s);
    for (int64_t k = 0; k < p * s; ++k) data[k] = value(rank, k);
    if (absl::Status st = comm.ReduceScatter(axis, data, absl::MakeSpan(out)); !st.ok()) return st;
    for (int64_t k = 0; k < s; ++k) {
      const int64_t at = c[axis] * s + k;
      float want = 0;
      for (int m = 0; m < p; ++m) {
        CubeCoord peer = c;
        peer[axis] = m;
        want =
            m == 0 ? value(CubeRankIndex(peer, p), at) : want + value(CubeRankIndex(peer, p), at);
      }
      EXPECT_EQ(out[k], want) << "rank " << rank << " k " << k;
    }
    if (absl::Status st = comm.AllReduce(axis, absl::MakeSpan(data)); !st.ok()) return st;
    all_reduced[rank] = data;
    // ReduceScatter (p - 1) s, AllReduce of p s floats 2 (p - 1) s.
    EXPECT_EQ(comm.sent_bytes(), 4 * (p - 1) * s + 4 * 2 * (p - 1) * s);
    return absl::OkStatus();
  }));
  for (int r = 0; r < p * p * p; ++r) {
    CubeCoord first = CubeCoordOf(r, p);
    first[axis] = 0;
    EXPECT_EQ(0, std::memcmp(all_reduced[r].data(), all_reduced[CubeRankIndex(first, p)].data(),
                             all_reduced[r].size() * sizeof(float)))
        << "rank " << r;
  }
}

TEST_P(CubeCommTest, Broadcast_CopiesTheRoot_RootSendsTheBytes) {
  const auto [p, axis] = GetParam();
  auto fabric = Fabric(p);
  const int root = p - 1;
  ExpectAllOk(fabric->Run([&](InProcessCubeComm& comm) -> absl::Status {
    const CubeCoord c = comm.coord();
    std::vector<float> data = {Tagged(CubeRankIndex(c, p), 0), Tagged(CubeRankIndex(c, p), 1)};
    if (absl::Status st = comm.Broadcast(axis, root, absl::MakeSpan(data)); !st.ok()) return st;
    CubeCoord from = c;
    from[axis] = root;
    EXPECT_EQ(data[0], Tagged(CubeRankIndex(from, p), 0));
    EXPECT_EQ(data[1], Tagged(CubeRankIndex(from, p), 1));
    EXPECT_EQ(comm.sent_bytes(), c[axis] == root ? 4 * (p - 1) * 2 : 0);
    return absl::OkStatus();
  }));
}

INSTANTIATE_TEST_SUITE_P(Axes, CubeCommTest,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values(CubeAxis::kX, CubeAxis::kY,
                                                              CubeAxis::kZ)));

TEST(CubeCommTest, MembersCallDifferentCollectives_InternalOnEvery) {
  auto fabric = Fabric(2);
  const std::vector<absl::Status> status = fabric->Run([&](InProcessCubeComm& comm) {
    std::vector<float> data(comm.coord()[CubeAxis::kX] == 0 ? 2 : 4);
    return comm.AllReduce(CubeAxis::kX, absl::MakeSpan(data));
  });
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_NE(s.message().find("disagree"), std::string::npos) << s;
  }
}

TEST(CubeCommTest, WrongOutSize_InvalidArgument) {
  auto fabric = Fabric(2);
  std::vector<float> segment(3), out(5);
  const absl::Status s = fabric->comm(0).AllGather(CubeAxis::kY, segment, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(CubeCommTest, AMemberNeverCalls_DeadlineExceeded) {
  auto fabric = InProcessCubeFabric::Create(2, absl::Milliseconds(50));
  ASSERT_TRUE(fabric.ok());
  std::vector<float> data(2);
  const absl::Status s = (*fabric)->comm(0).AllReduce(CubeAxis::kZ, absl::MakeSpan(data));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("AllReduce along z"), std::string::npos) << s;
}

// Every element of an activation or weight is held by exactly one rank, and
// scatter then gather is the identity; a vector's pieces lie on the p^2
// diagonal ranks.
class CubeLayoutTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

CubeDirection DirectionOf(int index) {
  switch (index) {
    case 0:
      return kPaper;
    case 1:
      return kPaper.Swapped();
    default:
      return {CubeAxis::kX, CubeAxis::kZ, CubeAxis::kY};
  }
}

TEST_P(CubeLayoutTest, ScatterThenGather_Identity_EachElementOnce) {
  const auto [p, d] = GetParam();
  const CubeDirection direction = DirectionOf(d);
  const int64_t rows = 2 * p * p, cols = 3 * p * p;
  std::vector<float> full(rows * cols);
  for (size_t k = 0; k < full.size(); ++k) full[k] = static_cast<float>(k);
  for (CubeOperand operand : {CubeOperand::kActivation, CubeOperand::kWeight}) {
    std::vector<std::vector<float>> blocks;
    std::multiset<float> seen;
    for (int r = 0; r < p * p * p; ++r) {
      auto block = ScatterCubeBlock(operand, full, rows, cols, p, CubeCoordOf(r, p), direction);
      ASSERT_TRUE(block.ok()) << block.status();
      EXPECT_EQ(static_cast<int64_t>(block->size()), rows * cols / (p * p * p));
      seen.insert(block->begin(), block->end());
      blocks.push_back(*block);
    }
    EXPECT_EQ(seen, std::multiset<float>(full.begin(), full.end()));
    auto back = GatherCubeBlocks(operand, blocks, rows, cols, p, direction);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, full);
  }
  const std::vector<float> vec(full.begin(), full.begin() + cols);
  std::vector<std::vector<float>> pieces;
  int held = 0;
  for (int r = 0; r < p * p * p; ++r) {
    const CubeCoord c = CubeCoordOf(r, p);
    auto piece = ScatterCubeBlock(CubeOperand::kVector, vec, 1, cols, p, c, direction);
    ASSERT_TRUE(piece.ok()) << piece.status();
    const bool diagonal = c[direction.input] == c[direction.output];
    EXPECT_EQ(static_cast<int64_t>(piece->size()), diagonal ? cols / (p * p) : 0);
    held += diagonal;
    pieces.push_back(*piece);
  }
  EXPECT_EQ(held, p * p);
  auto back = GatherCubeBlocks(CubeOperand::kVector, pieces, 1, cols, p, direction);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, vec);
}

INSTANTIATE_TEST_SUITE_P(Directions, CubeLayoutTest,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(0, 1, 2)));

TEST(CubeLayoutTest, PaperFigure4_BlocksOfRank_1_0_1) {
  // p = 2, M = 8, N = 4 (m = 2, n = 1), rank (i, j, l) = (1, 0, 1) under
  // the paper's directions: A_ijl = A[imp + jm, lnp] = rows 4..5, cols 2..3.
  CubeCoord c;
  c.coords = {1, 0, 1};
  auto a = CubeBlockOf(CubeOperand::kActivation, 8, 4, 2, c, kPaper);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->row0, 4);
  EXPECT_EQ(a->rows, 2);
  EXPECT_EQ(a->col0, 2);
  EXPECT_EQ(a->cols, 2);
  // B_lji = B[lnp, jkp + ik] with N = 4, K = 8 (k = 2): rows 2..3, cols 2..3.
  auto b = CubeBlockOf(CubeOperand::kWeight, 4, 8, 2, c, kPaper);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->row0, 2);
  EXPECT_EQ(b->col0, 2);
  EXPECT_EQ(b->cols, 2);
}

TEST(CubeLayoutTest, NotDivisible_InvalidArgumentNamingTheDimension) {
  CubeCoord c;
  auto a = CubeBlockOf(CubeOperand::kActivation, 6, 4, 2, c, kPaper);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("activation rows = 6"), std::string::npos) << a.status();
  auto w = CubeBlockOf(CubeOperand::kWeight, 4, 6, 2, c, kPaper);
  EXPECT_NE(w.status().message().find("weight cols = 6"), std::string::npos) << w.status();
  auto v = CubeBlockOf(CubeOperand::kVector, 1, 6, 2, c, kPaper);
  EXPECT_NE(v.status().message().find("vector length = 6"), std::string::npos) << v.status();
  auto small = CubeBlockOf(CubeOperand::kActivation, 8, 4, 1, c, kPaper);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("p = 1"), std::string::npos) << small.status();
}

}  // namespace
}  // namespace pipetrain
