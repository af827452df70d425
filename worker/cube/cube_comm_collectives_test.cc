// CollectivesCubeComm on the in-process transport runs the 3-D linear layer
// and LayerNorm as InProcessCubeComm does: bitwise for p = 2 (each sum is
// one addition), within rounding for p = 3 (ring order, not a left fold),
// and sends the paper's count for a product.
#include "worker/cube/cube_comm_collectives.h"

#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/cube/cube_layernorm.h"
#include "worker/cube/cube_linear.h"
#include "worker/cube/cube_test_util.h"
#include "worker/cube/cube_testing.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

using cube_test::kPaper;
using cube_test::Random;
using cube_test::ScatterAll;

// Every rank's outputs of one linear forward + backward (with bias) and one
// LayerNorm forward on the linear's output, by rank.
struct Outputs {
  std::vector<std::vector<float>> y, dx, dw, db, ln;
  std::vector<int64_t> forward_bytes;
};

using Body = std::function<absl::Status(CubeComm&, int rank, Outputs&)>;

Body Workload(int p) {
  const int64_t M = 2 * p * p, N = 3 * p, K = 2 * p * p;
  const CubeDirection d = kPaper;
  const CubeLinearDims dims{M, N, K, true};
  auto xs = ScatterAll(CubeOperand::kActivation, Random(M * N, 1), M, N, p, d);
  auto ws = ScatterAll(CubeOperand::kWeight, Random(N * K, 2), N, K, p, d);
  auto bs = ScatterAll(CubeOperand::kVector, Random(K, 3), 1, K, p, d.Swapped());
  auto dys = ScatterAll(CubeOperand::kActivation, Random(M * K, 4), M, K, p, d.Swapped());
  auto gs = ScatterAll(CubeOperand::kVector, Random(K, 5, 1.0f), 1, K, p, d.Swapped());
  return [=](CubeComm& comm, int r, Outputs& out) -> absl::Status {
    out.y[r].resize(dys[r].size());
    out.dx[r].resize(xs[r].size());
    out.dw[r].assign(ws[r].size(), 0.0f);
    out.db[r].assign(bs[r].size(), 0.0f);
    out.ln[r].resize(dys[r].size());
    absl::Status st =
        CubeLinearForward(comm, d, dims, xs[r], ws[r], bs[r], absl::MakeSpan(out.y[r]));
    if (st.ok()) {
      st = CubeLinearBackward(comm, d, dims, xs[r], ws[r], dys[r], absl::MakeSpan(out.dx[r]),
                              absl::MakeSpan(out.dw[r]), absl::MakeSpan(out.db[r]));
    }
    std::vector<float> mean(M / (p * p)), rstd(M / (p * p));
    if (st.ok()) {
      st = CubeLayerNormForward(comm, d.Swapped(), {M, K}, out.y[r], gs[r], gs[r],
                                absl::MakeSpan(out.ln[r]), absl::MakeSpan(mean),
                                absl::MakeSpan(rstd));
    }
    return st;
  };
}

Outputs Empty(int n) {
  Outputs o;
  for (auto* v : {&o.y, &o.dx, &o.dw, &o.db, &o.ln}) v->resize(n);
  o.forward_bytes.resize(n);
  return o;
}

Outputs RunInProcess(int p, const Body& body) {
  Outputs out = Empty(p * p * p);
  auto fabric = InProcessCubeFabric::Create(p);
  EXPECT_TRUE(fabric.ok());
  for (const absl::Status& s : (*fabric)->Run([&](InProcessCubeComm& comm) {
         return body(comm, CubeRankIndex(comm.coord(), p), out);
       })) {
    EXPECT_TRUE(s.ok()) << s;
  }
  return out;
}

// Every rank's status of `body` on its own thread; rank `silent` (if any)
// never calls it, as a member that died.
std::vector<absl::Status> RunEachRank(int p, const Body& body, Outputs& out,
                                      CollectiveOptions options = {}, int silent = -1) {
  const int n = p * p * p;
  InProcessFabric fabric(n);
  std::vector<int> stages(n);
  for (int r = 0; r < n; ++r) stages[r] = r;
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Transport> transport = fabric.Connect(r);
      CollectivesCubeComm comm(transport.get(), p, stages, "cube", options);
      comm.SetIteration(7);
      if (r == silent) return;
      status[r] = comm.status().ok() ? body(comm, r, out) : comm.status();
    });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

Outputs RunCollectives(int p, const Body& body) {
  Outputs out = Empty(p * p * p);
  const std::vector<absl::Status> status = RunEachRank(p, body, out);
  for (size_t r = 0; r < status.size(); ++r) EXPECT_TRUE(status[r].ok()) << r << ": " << status[r];
  return out;
}

TEST(CollectivesCubeCommTest, P2_BitwiseEqualToInProcess) {
  const Body body = Workload(2);
  const Outputs a = RunInProcess(2, body), b = RunCollectives(2, body);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(a.y[r], b.y[r]) << r;
    EXPECT_EQ(a.dx[r], b.dx[r]) << r;
    EXPECT_EQ(a.dw[r], b.dw[r]) << r;
    EXPECT_EQ(a.db[r], b.db[r]) << r;
    EXPECT_EQ(a.ln[r], b.ln[r]) << r;
  }
}

// Ring and left fold add three terms in different orders: a few ulps of the
// values (|x| <= ~20 here), well inside 1e-5 relative.
TEST(CollectivesCubeCommTest, P3_EqualToInProcessWithinRounding) {
  const Body body = Workload(3);
  const Outputs a = RunInProcess(3, body), b = RunCollectives(3, body);
  for (int r = 0; r < 27; ++r) {
    for (auto field : {&Outputs::y, &Outputs::dx, &Outputs::dw, &Outputs::db, &Outputs::ln}) {
      const auto& u = (a.*field)[r];
      const auto& v = (b.*field)[r];
      ASSERT_EQ(u.size(), v.size());
      for (size_t k = 0; k < u.size(); ++k) {
        EXPECT_NEAR(u[k], v[k], 1e-5 * (1 + std::fabs(u[k]))) << r << " " << k;
      }
    }
  }
}

TEST(CollectivesCubeCommTest, ForwardProduct_SendsThePapersCount) {
  const int p = 2, n = 8;
  const int64_t M = 8, N = 6, K = 8;
  const CubeLinearDims dims{M, N, K, false};
  auto xs = ScatterAll(CubeOperand::kActivation, Random(M * N, 1), M, N, p, kPaper);
  auto ws = ScatterAll(CubeOperand::kWeight, Random(N * K, 2), N, K, p, kPaper);
  InProcessFabric fabric(n);
  std::vector<int> stages = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<int64_t> sent(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Transport> transport = fabric.Connect(r);
      CollectivesCubeComm comm(transport.get(), p, stages, "cube");
      std::vector<float> y(M * K / n);
      EXPECT_TRUE(CubeLinearForward(comm, kPaper, dims, xs[r], ws[r], {}, absl::MakeSpan(y)).ok());
      sent[r] = comm.sent_bytes();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(sent[r], 4 * CubeLinearSent(dims, p).forward) << r;
}

// A member that never answers (its worker died): every other rank's
// linear and LayerNorm calls end DEADLINE_EXCEEDED within the collective
// timeout of each wait, none hangs and none reports success.
TEST(CollectivesCubeCommTest, AMemberNeverAnswers_EveryOtherRankDeadlineExceeded) {
  const Body body = Workload(2);
  Outputs out = Empty(8);
  CollectiveOptions options;
  options.timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  const std::vector<absl::Status> status = RunEachRank(2, body, out, options, /*silent=*/5);
  // Each rank fails at its first collective that waits on a rank that
  // stopped: a few timeouts at most, far below the 60 s default.
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  for (int r = 0; r < 8; ++r) {
    if (r == 5) continue;
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded) << r << ": " << status[r];
  }
}

TEST(CollectivesCubeCommTest, StageNotInCube_InvalidArgument) {
  InProcessFabric fabric(9);
  std::unique_ptr<Transport> transport = fabric.Connect(8);
  CollectivesCubeComm comm(transport.get(), 2, {0, 1, 2, 3, 4, 5, 6, 7}, "cube");
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(comm.status().message().find("stage 8 appears 0 times"), std::string::npos)
      << comm.status();
  std::vector<float> data(2);
  EXPECT_EQ(comm.AllReduce(CubeAxis::kX, absl::MakeSpan(data)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
