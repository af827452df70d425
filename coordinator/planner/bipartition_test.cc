#include "coordinator/planner/bipartition.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>

#include "common/philox.h"
#include "coordinator/planner/bipartition_interval.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

BiPartitionPlan MakePlan(std::vector<Range> forward, std::vector<Range> backward) {
  BiPartitionPlan plan;
  plan.forward = std::move(forward);
  plan.backward = std::move(backward);
  return plan;
}

// Ordered, covering, no idle worker (the validity definition in the header).
void ExpectValid(const BiPartitionProblem& p, const BiPartitionPlan& plan, uint64_t seed) {
  const int L = static_cast<int>(p.fwd.size());
  ASSERT_EQ(plan.forward.size(), p.speeds.size()) << "seed " << seed;
  ASSERT_EQ(plan.backward.size(), p.speeds.size()) << "seed " << seed;
  int f = 0, b = 0;
  for (size_t w = 0; w < p.speeds.size(); ++w) {
    EXPECT_EQ(plan.forward[w].begin, f) << "seed " << seed;
    EXPECT_EQ(plan.backward[w].begin, b) << "seed " << seed;
    EXPECT_LE(plan.forward[w].begin, plan.forward[w].end) << "seed " << seed;
    EXPECT_LE(plan.backward[w].begin, plan.backward[w].end) << "seed " << seed;
    EXPECT_TRUE(plan.forward[w].end > f || plan.backward[w].end > b)
        << "seed " << seed << " worker " << w << " idle";
    f = plan.forward[w].end;
    b = plan.backward[w].end;
  }
  EXPECT_EQ(f, L) << "seed " << seed;
  EXPECT_EQ(b, L) << "seed " << seed;
}

BiPartitionProblem PaperExample() {
  BiPartitionProblem p;
  p.fwd = {1, 3, 2, 3};
  p.bwd = {2, 6, 4, 6};
  p.activation_bytes = {1, 1, 1, 1};
  p.speeds = {1, 1, 1};
  p.bandwidth = 0;  // ample
  return p;
}

// bipartition.txt's example: F = {1,3,2,3}, B = {2,6,4,6}, 3 workers, ample
// bandwidth. Equal cuts (PipeDream) reach 12; separate cuts reach 9 with the
// paper's assignment D1: F{1} B{1,2}; D2: F{2,3} B{3}; D3: F{4} B{4}.
// Costs finite one by one whose sums over units and micro-batches are not
// (the solvers' bottlenecks went infinite and the memory check blamed an
// unlimited cluster): refused, as is a tiny speed that scales them past it.
TEST(BiPartitionTest, CostsAddingUpToInfinity_AreInvalidArgument) {
  BiPartitionProblem p = PaperExample();
  p.fwd[0] = p.fwd[1] = 1e308;
  absl::StatusOr<BiPartitionPlan> plan = SolveBiPartition(p);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_NE(plan.status().message().find("add up"), std::string::npos) << plan.status();
  p = PaperExample();
  p.speeds[0] = 1e-308;
  EXPECT_EQ(SolveBiPartition(p).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SolveBiPartition(PaperExample()).ok());
}

TEST(BiPartitionTest, PaperExample_PipeDreamTwelveBiPartitionNine) {
  const BiPartitionProblem p = PaperExample();
  std::vector<UnitCost> costs;
  for (int u = 0; u < 4; ++u) costs.push_back({"u", p.fwd[u], p.bwd[u]});
  EXPECT_EQ(BottleneckCost(costs, PipeDreamPartition(costs, 3).value()), 12);
  const BiPartitionPlan paper = MakePlan({{0, 1}, {1, 3}, {3, 4}}, {{0, 2}, {2, 3}, {3, 4}});
  EXPECT_EQ(PaperObjective(p, paper), 9);
  EXPECT_EQ(PaperObjective(p, MakePlan({{0, 2}, {2, 3}, {3, 4}}, {{0, 2}, {2, 3}, {3, 4}})), 12);
  const BiPartitionPlan plan = SolveBiPartition(p).value();
  EXPECT_EQ(plan.bottleneck, 9);
  EXPECT_EQ(PaperObjective(p, plan), 9);
  EXPECT_EQ(SolveBiPartitionReference(p).value().bottleneck, 9);
  EXPECT_EQ(BruteForceBiPartition(p).bottleneck, 9);
  EXPECT_EQ(SolveBiPartitionInterval(p, SplitSearch::kExhaustive).value().bottleneck, 9);
  EXPECT_EQ(SolveBiPartitionInterval(p, SplitSearch::kBinary).value().bottleneck, 9);
}

// The paper's assignment is the only plan reaching 9 here once the loads
// must be exactly 9 each: F = 9 + 18 = 27 = 3 * 9.
TEST(BiPartitionTest, PaperExample_SolversFindThePaperAssignment) {
  const BiPartitionProblem p = PaperExample();
  const BiPartitionPlan paper = MakePlan({{0, 1}, {1, 3}, {3, 4}}, {{0, 2}, {2, 3}, {3, 4}});
  for (const BiPartitionPlan& plan :
       {SolveBiPartition(p).value(), SolveBiPartitionReference(p).value(),
        SolveBiPartitionInterval(p, SplitSearch::kExhaustive).value()}) {
    EXPECT_EQ(plan.forward, paper.forward);
    EXPECT_EQ(plan.backward, paper.backward);
  }
}

// Charged for recomputing unit 2's forward (3) on D1, which runs its
// backward, the paper's plan costs 1 + (2 + 6) + 3 = 12 under the full
// objective, and no plan does better here (equal cuts reach 12 as well).
TEST(BiPartitionTest, PaperExample_FullObjectiveChargesTheRecomputeOfTheSplitUnit) {
  BiPartitionProblem p = PaperExample();
  p.objective = BiPartitionObjective::kFull;
  const BiPartitionPlan paper = MakePlan({{0, 1}, {1, 3}, {3, 4}}, {{0, 2}, {2, 3}, {3, 4}});
  EXPECT_EQ(FullObjective(p, paper), 12);
  EXPECT_EQ(BruteForceBiPartition(p).bottleneck, 12);
  EXPECT_EQ(SolveBiPartition(p).value().bottleneck, 12);
}

// Integer costs and byte counts: every sum is exact, so solvers must agree
// exactly. Memory limits: none, generous, tight (often binding) or tiny
// (often infeasible).
BiPartitionProblem RandomProblem(uint64_t seed) {
  auto draw = [seed](uint32_t a, uint32_t b, uint64_t bound) {
    return static_cast<double>(UniformIndex(seed, a, b, 77, bound));
  };
  BiPartitionProblem p;
  const int L = 1 + static_cast<int>(draw(0, 0, 8));
  const int P = 1 + static_cast<int>(draw(0, 1, std::min(4, 2 * L)));
  double weights = 0;
  for (int u = 0; u < L; ++u) {
    p.fwd.push_back(draw(1, u, 10));
    p.bwd.push_back(draw(2, u, 20));
    p.activation_bytes.push_back(draw(3, u, 50));
    p.weight_bytes.push_back(draw(6, u, 30));
    p.stash_bytes.push_back(draw(7, u, 20));
    p.transient_bytes.push_back(draw(13, u, 3) == 0 ? draw(14, u, 40) : 0.0);
    weights += p.weight_bytes.back() + p.stash_bytes.back();
  }
  for (int w = 0; w < P; ++w) p.speeds.push_back(1 + draw(4, w, 4));
  p.bandwidth = draw(5, 0, 3) == 0 ? 0.0 : 1 + draw(5, 1, 8);
  p.latency_seconds = draw(8, 0, 2) == 0 ? 0.0 : draw(8, 1, 4);
  p.micro_batches = 1 + static_cast<int>(draw(9, 0, 4));
  p.schedule = draw(9, 1, 2) == 0 ? BiPartitionSchedule::kOneFOneB : BiPartitionSchedule::kGPipe;
  // Often a tied embedding (clamped to the ends' weights by the costs).
  p.tied_weight_bytes = draw(15, 0, 2) == 0 ? 0.0 : draw(15, 1, 30);
  // Sometimes copies of the stepped weights beside (a CPU worker's
  // checkpoint snapshot).
  if (draw(16, 0, 3) == 0) {
    for (int w = 0; w < P; ++w) p.stepped_weight_copies.push_back(draw(17, w, 4));
  }
  const int memory_mode = static_cast<int>(draw(10, 0, 4));
  if (memory_mode > 0) {
    const double scale = memory_mode == 1 ? 8.0 : memory_mode == 2 ? 4.0 / P + 1.0 : 1.0;
    for (int w = 0; w < P; ++w) {
      // Some workers unlimited (0), the others limited around scale * total.
      p.memory_bytes.push_back(draw(11, w, 4) == 0 ? 0.0 : 1 + draw(12, w, scale * weights + 1));
    }
  }
  return p;
}

// Everything an exact solver must reproduce: the optimum (or the memory
// error), a valid plan, and a bottleneck equal to the objective of the plan.
void ExpectMatchesBruteForce(const BiPartitionProblem& p,
                             const absl::StatusOr<BiPartitionPlan>& solved, double brute,
                             uint64_t seed, const char* solver) {
  if (brute == kInf) {
    EXPECT_EQ(solved.status().code(), absl::StatusCode::kResourceExhausted)
        << solver << " seed " << seed;
    return;
  }
  ASSERT_TRUE(solved.ok()) << solver << " seed " << seed << ": " << solved.status();
  ASSERT_EQ(solved->bottleneck, brute) << solver << " seed " << seed;
  EXPECT_EQ(Objective(p, *solved), brute) << solver << " seed " << seed;
  ExpectValid(p, *solved, seed);
}

struct Tally {
  int infeasible = 0, memory_binding = 0, bsa_differs = 0, compared = 0;
};

void CompareSolvers(BiPartitionObjective objective, Tally* tally) {
  for (uint64_t seed = 1; seed <= 600; ++seed) {
    BiPartitionProblem p = RandomProblem(seed);
    p.objective = objective;
    const double brute = BruteForceBiPartition(p).bottleneck;
    ExpectMatchesBruteForce(p, SolveBiPartition(p), brute, seed, "fast");
    ExpectMatchesBruteForce(p, SolveBiPartitionReference(p), brute, seed, "reference");
    ExpectMatchesBruteForce(p, SolveBiPartitionInterval(p, SplitSearch::kExhaustive), brute, seed,
                            "interval");
    const auto bsa = SolveBiPartitionInterval(p, SplitSearch::kBinary);
    ++tally->compared;
    if (bsa.ok() ? bsa->bottleneck != brute : brute != kInf) ++tally->bsa_differs;
    if (bsa.ok()) {
      EXPECT_GE(bsa->bottleneck, brute) << "seed " << seed;  // never beats exact
    }
    if (brute == kInf) {
      ++tally->infeasible;
    } else {
      BiPartitionProblem unlimited = p;
      unlimited.memory_bytes.clear();
      if (BruteForceBiPartition(unlimited).bottleneck < brute) ++tally->memory_binding;
    }
  }
}

TEST(BiPartitionTest, PaperObjective_FastEqualsBruteForceAndIntervalDpOn600Instances) {
  Tally tally;
  CompareSolvers(BiPartitionObjective::kPaper, &tally);
  // The generator covers the memory cases it is meant to.
  EXPECT_GE(tally.infeasible, 20);
  EXPECT_GE(tally.memory_binding, 20);
  // Reported, not asserted: BSA assumes a monotonicity that communication
  // and memory terms break.
  std::cout << "paper objective: BSA differs from the exact interval DP on " << tally.bsa_differs
            << " of " << tally.compared << " instances (" << tally.infeasible
            << " infeasible, memory binding on " << tally.memory_binding << ")\n";
  RecordProperty("bsa_differs", tally.bsa_differs);
}

TEST(BiPartitionTest, FullObjective_FastEqualsBruteForceOn600Instances) {
  Tally tally;
  CompareSolvers(BiPartitionObjective::kFull, &tally);
  EXPECT_GE(tally.infeasible, 20);
  EXPECT_GE(tally.memory_binding, 20);
  std::cout << "full objective: BSA differs from the exact interval DP on " << tally.bsa_differs
            << " of " << tally.compared << " instances\n";
  RecordProperty("bsa_differs", tally.bsa_differs);
}

// Units that wait on tensor-parallel all-reduces (fwd_comm, bwd_comm, not
// divided by speed): the exact solvers still find brute force's optimum.
TEST(BiPartitionTest, CommSeconds_ExactSolversEqualBruteForce) {
  for (auto objective : {BiPartitionObjective::kPaper, BiPartitionObjective::kFull}) {
    for (uint64_t seed = 1; seed <= 300; ++seed) {
      BiPartitionProblem p = RandomProblem(seed);
      p.objective = objective;
      for (uint32_t u = 0; u < p.fwd.size(); ++u) {
        p.fwd_comm.push_back(static_cast<double>(UniformIndex(seed, 20, u, 77, 6)));
        p.bwd_comm.push_back(static_cast<double>(UniformIndex(seed, 21, u, 77, 12)));
      }
      const double brute = BruteForceBiPartition(p).bottleneck;
      ExpectMatchesBruteForce(p, SolveBiPartition(p), brute, seed, "fast");
      ExpectMatchesBruteForce(p, SolveBiPartitionReference(p), brute, seed, "reference");
      ExpectMatchesBruteForce(p, SolveBiPartitionInterval(p, SplitSearch::kExhaustive), brute,
                              seed, "interval");
    }
  }
}

// Beyond brute force: up to 24 units and 6 workers, with communication
// from negligible to dominant (activations up to 200x a unit's compute),
// against the plain prefix DP. Integer costs again, so equality is exact.
TEST(BiPartitionTest, FastEqualsReferenceDpOnLargerInstances) {
  int infeasible = 0;
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    auto draw = [seed](uint32_t a, uint32_t b, uint64_t bound) {
      return static_cast<double>(UniformIndex(seed, a, b, 91, bound));
    };
    BiPartitionProblem p;
    const int L = 9 + static_cast<int>(draw(0, 0, 16));
    const int P = 2 + static_cast<int>(draw(0, 1, 5));
    const double activation_scale = std::pow(10.0, draw(0, 2, 4));  // 1 .. 1000
    double weights = 0;
    for (int u = 0; u < L; ++u) {
      p.fwd.push_back(1 + draw(1, u, 20));
      p.bwd.push_back(1 + draw(2, u, 40));
      p.activation_bytes.push_back(activation_scale * (1 + draw(3, u, 20)));
      p.weight_bytes.push_back(draw(4, u, 100));
      p.stash_bytes.push_back(draw(5, u, 50));
      p.transient_bytes.push_back(draw(12, u, 4) == 0 ? draw(13, u, 100) : 0.0);
      weights += p.weight_bytes.back();
    }
    for (int w = 0; w < P; ++w) p.speeds.push_back(1 + draw(6, w, 3));
    p.bandwidth = draw(7, 0, 4) == 0 ? 0.0 : 1 + draw(7, 1, 10);
    p.latency_seconds = draw(8, 0, 3);
    p.micro_batches = 1 + static_cast<int>(draw(9, 0, 8));
    if (draw(10, 0, 2) == 0) {
      for (int w = 0; w < P; ++w) p.memory_bytes.push_back(1 + draw(11, w, 8 * weights / P));
    }
    for (BiPartitionObjective objective :
         {BiPartitionObjective::kPaper, BiPartitionObjective::kFull}) {
      p.objective = objective;
      const auto reference = SolveBiPartitionReference(p);
      const auto fast = SolveBiPartition(p);
      ASSERT_EQ(fast.status().code(), reference.status().code()) << "seed " << seed;
      if (!reference.ok()) {
        ++infeasible;
        continue;
      }
      EXPECT_EQ(fast->bottleneck, reference->bottleneck)
          << "seed " << seed << (objective == BiPartitionObjective::kFull ? " full" : " paper");
      EXPECT_EQ(Objective(p, *fast), fast->bottleneck) << "seed " << seed;
      ExpectValid(p, *fast, seed);
    }
  }
  EXPECT_GE(infeasible, 10);
  EXPECT_LE(infeasible, 150);
}

// The weight sync rule by its definition, independent of BiPartitionCosts'
// SyncsFit: the least objective (of the problem without the limit) over the
// plans that give every unit above max_weight_sync_bytes one worker for both
// passes; +inf when none fits.
double BruteForceKeepingOversizedUnitsWhole(const BiPartitionProblem& p) {
  BiPartitionProblem unlimited = p;
  unlimited.max_weight_sync_bytes = kInf;
  const int L = static_cast<int>(p.fwd.size()), P = static_cast<int>(p.speeds.size());
  BiPartitionPlan plan = MakePlan(std::vector<Range>(P), std::vector<Range>(P));
  double best = kInf;
  std::function<void(int, int, int)> place = [&](int k, int f, int b) {
    if (k == P) {
      if (f != L || b != L) return;
      std::vector<int> forward_owner(L), backward_owner(L);
      for (int w = 0; w < P; ++w) {
        for (int u = plan.forward[w].begin; u < plan.forward[w].end; ++u) forward_owner[u] = w;
        for (int u = plan.backward[w].begin; u < plan.backward[w].end; ++u) backward_owner[u] = w;
      }
      for (int u = 0; u < L; ++u) {
        if (p.weight_bytes[u] > p.max_weight_sync_bytes && forward_owner[u] != backward_owner[u]) {
          return;
        }
      }
      best = std::min(best, Objective(unlimited, plan));
      return;
    }
    for (int f2 = f; f2 <= L; ++f2) {
      for (int b2 = b; b2 <= L; ++b2) {
        if (f2 == f && b2 == b) continue;
        plan.forward[k] = {f, f2};
        plan.backward[k] = {b, b2};
        place(k + 1, f2, b2);
      }
    }
  };
  place(0, 0, 0);
  return best;
}

// Random instances with a weight sync limit that some units are above
// (weights 0..29, limits 1..28): every solver and the brute force against
// the rule's own definition, and no solved plan splits such a unit.
TEST(BiPartitionTest, WeightSyncLimit_SolversEqualBruteForceKeepingLargeUnitsWhole) {
  int binding = 0, infeasible = 0, only_sync_infeasible = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    BiPartitionProblem p = RandomProblem(seed);
    p.max_weight_sync_bytes = 1 + static_cast<double>(UniformIndex(seed, 18, 0, 77, 28));
    BiPartitionProblem unlimited = p;
    unlimited.max_weight_sync_bytes = kInf;
    for (BiPartitionObjective objective :
         {BiPartitionObjective::kPaper, BiPartitionObjective::kFull}) {
      p.objective = unlimited.objective = objective;
      const double brute = BruteForceBiPartition(p).bottleneck;
      ASSERT_EQ(brute, BruteForceKeepingOversizedUnitsWhole(p)) << "seed " << seed;
      const double without = BruteForceBiPartition(unlimited).bottleneck;
      binding += brute > without;
      infeasible += brute == kInf;
      BiPartitionProblem roomy = p;
      roomy.memory_bytes.clear();
      only_sync_infeasible += BruteForceBiPartition(roomy).bottleneck == kInf;
      const absl::StatusOr<BiPartitionPlan> fast = SolveBiPartition(p);
      ExpectMatchesBruteForce(p, fast, brute, seed, "fast");
      ExpectMatchesBruteForce(p, SolveBiPartitionReference(p), brute, seed, "reference");
      ExpectMatchesBruteForce(p, SolveBiPartitionInterval(p, SplitSearch::kExhaustive), brute, seed,
                              "interval");
      if (fast.ok()) {
        EXPECT_EQ(FirstOversizedWeightSync(p, fast->forward, fast->backward), -1)
            << "seed " << seed;
      }
    }
  }
  std::cout << "weight sync limit: binds on " << binding << " of 600 solves (" << infeasible
            << " infeasible, " << only_sync_infeasible << " whatever the memory)\n";
  // The limit binds often, and alone leaves no plan now and then (more
  // workers than units, all of them too large to sync).
  EXPECT_GE(binding, 50);
  EXPECT_GE(only_sync_infeasible, 10);
}

// bipartition.txt's example with unit 1 (the paper plan's split unit: its
// forward on D2, its backward on D1) above the weight sync limit: no solver
// splits it, and the optimum is the best plan that keeps it whole.
TEST(BiPartitionTest, WeightSyncLimit_PaperExampleKeepsTheLargeUnitWhole) {
  BiPartitionProblem p = PaperExample();
  p.weight_bytes = {0, 10, 0, 0};
  p.max_weight_sync_bytes = 10;  // at the limit: may be split
  EXPECT_EQ(SolveBiPartition(p).value().bottleneck, 9);
  p.max_weight_sync_bytes = 9;
  const double best = BruteForceKeepingOversizedUnitsWhole(p);
  EXPECT_GT(best, 9);
  EXPECT_EQ(BruteForceBiPartition(p).bottleneck, best);
  for (const BiPartitionPlan& plan :
       {SolveBiPartition(p).value(), SolveBiPartitionReference(p).value(),
        SolveBiPartitionInterval(p, SplitSearch::kExhaustive).value()}) {
    EXPECT_EQ(plan.bottleneck, best);
    EXPECT_EQ(FirstOversizedWeightSync(p, plan.forward, plan.backward), -1);
  }
  const BiPartitionPlan paper = MakePlan({{0, 1}, {1, 3}, {3, 4}}, {{0, 2}, {2, 3}, {3, 4}});
  EXPECT_EQ(FirstOversizedWeightSync(p, paper.forward, paper.backward), 1);
  EXPECT_EQ(PaperObjective(p, paper), kInf);
  EXPECT_EQ(FullObjective(p, paper), kInf);
}

// More workers than units leaves some unit's passes on two workers: with
// every unit too large to sync, no plan, whatever the memory.
TEST(BiPartitionTest, WeightSyncLimit_NoPlanKeepsEveryUnitWhole_ResourceExhausted) {
  BiPartitionProblem p;
  p.fwd = {1, 1};
  p.bwd = {1, 1};
  p.activation_bytes = {0, 0};
  p.weight_bytes = {10, 10};
  p.speeds = {1, 1, 1};
  p.max_weight_sync_bytes = 5;
  const absl::Status solved = SolveBiPartition(p).status();
  EXPECT_EQ(solved.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(solved.message(),
            "no plan keeps both passes of every unit whose weights are above the data plane's "
            "limit of 5 bytes (0.00 GiB) per tensor on one worker (units 0, 1): 3 workers for 2 "
            "units leave some unit's passes on two workers; use at most 2 workers");
  EXPECT_EQ(SolveBiPartitionReference(p).status(), solved);
  EXPECT_EQ(SolveBiPartitionInterval(p, SplitSearch::kExhaustive).status(), solved);
  p.speeds = {1, 1};
  EXPECT_TRUE(SolveBiPartition(p).ok());
}

TEST(BiPartitionTest, NeverWorseThanEqualCuts) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    BiPartitionProblem p = RandomProblem(seed);
    const int L = static_cast<int>(p.fwd.size());
    if (static_cast<int>(p.speeds.size()) > L) continue;  // pipedream needs a unit per worker
    p.speeds.assign(p.speeds.size(), 1.0);
    p.bandwidth = 0;
    p.memory_bytes.clear();
    std::vector<UnitCost> costs;
    for (int u = 0; u < L; ++u) costs.push_back({"u", p.fwd[u], p.bwd[u]});
    const double equal = BottleneckCost(costs, PipeDreamPartition(costs, p.speeds.size()).value());
    EXPECT_LE(SolveBiPartition(p).value().bottleneck, equal) << "seed " << seed;
  }
}

// The communication term by hand: 2 units, 2 workers, all costs 1,
// activations {10, 5}, bandwidth 2. Cutting both passes after unit 1 sends
// a(1) twice: (10 + 10) / 2 = 10. All forwards on worker 1 and all backwards
// on worker 2 cut nowhere inside the model (s1 = L, s2 = 0): bottleneck 2,
// which the paper objective, ignoring recompute and the hand-over of
// stashed activations (the full objective's job), calls optimal.
TEST(BiPartitionTest, PaperObjective_CountsBothCutsActivations) {
  BiPartitionProblem p;
  p.fwd = {1, 1};
  p.bwd = {1, 1};
  p.activation_bytes = {10, 5};
  p.speeds = {1, 1};
  p.bandwidth = 2;
  const BiPartitionPlan same_cut = MakePlan({{0, 1}, {1, 2}}, {{0, 1}, {1, 2}});
  EXPECT_EQ(PaperObjective(p, same_cut), 10);
  const BiPartitionPlan split = MakePlan({{0, 2}, {2, 2}}, {{0, 0}, {0, 2}});
  EXPECT_EQ(PaperObjective(p, split), 2);
  EXPECT_EQ(SolveBiPartition(p).value().bottleneck, 2);
  p.speeds = {1, 0.5};  // a slow second worker: its backward costs 4 there
  EXPECT_EQ(PaperObjective(p, split), 4);
}

// Five units, two workers; worker 0: F = [0, 3), B = [0, 1); worker 1:
// F = [3, 5), B = [1, 5). Units 1 and 2 run forward on worker 0 and
// backward (with recompute) on worker 1.
BiPartitionProblem FiveUnits() {
  BiPartitionProblem p;
  p.fwd = {1, 2, 4, 8, 16};
  p.bwd = {100, 200, 400, 800, 1600};
  p.activation_bytes = {10, 20, 40, 80, 160};
  p.weight_bytes = {1000, 2000, 4000, 8000, 16000};
  p.stash_bytes = {3, 5, 7, 11, 13};
  p.speeds = {1, 2};
  p.bandwidth = 10;
  p.latency_seconds = 0.5;
  p.micro_batches = 4;
  p.objective = BiPartitionObjective::kFull;
  return p;
}

BiPartitionProblem FiveUnitsGPipe() {
  BiPartitionProblem p = FiveUnits();
  p.schedule = BiPartitionSchedule::kGPipe;
  return p;
}

const BiPartitionPlan kFiveUnitPlan = MakePlan({{0, 3}, {3, 5}}, {{0, 1}, {1, 5}});

TEST(BiPartitionCostsTest, Compute_AddsRecomputeOfSplitUnitsOnTheBackwardOwner) {
  const BiPartitionCosts costs(FiveUnits());
  EXPECT_EQ(costs.Compute(0, {0, 3}, {0, 1}), 1 + 2 + 4 + 100);
  // (8 + 16) + (200 + 400 + 800 + 1600) + recompute of units 1, 2: (2 + 4); speed 2.
  EXPECT_EQ(costs.Compute(1, {3, 5}, {1, 5}), (24 + 3000 + 6) / 2.0);
  BiPartitionProblem paper = FiveUnits();
  paper.objective = BiPartitionObjective::kPaper;
  EXPECT_EQ(BiPartitionCosts(paper).Compute(1, {3, 5}, {1, 5}), (24 + 3000) / 2.0);
}

TEST(BiPartitionCostsTest, Compute_CommSecondsAddedAfterTheSpeed) {
  BiPartitionProblem p = FiveUnits();
  p.fwd_comm = {0.5, 1, 1, 1, 1};
  p.bwd_comm = {2, 2, 2, 2, 2};
  const BiPartitionCosts costs(p);
  EXPECT_EQ(costs.Compute(0, {0, 3}, {0, 1}), 1 + 2 + 4 + 100 + (0.5 + 1 + 1 + 2));
  // Speed 2 halves the compute, not the waits (the recompute's included).
  EXPECT_EQ(costs.Compute(1, {3, 5}, {1, 5}), (24 + 3000 + 6) / 2.0 + (2 + 8 + 2));
  p.fwd_comm = {1};
  EXPECT_EQ(ValidateProblem(p).code(), absl::StatusCode::kInvalidArgument);
}

TEST(BiPartitionCostsTest, Inbound_CountsEachReceivedTensorAndWeightSync) {
  const BiPartitionCosts costs(FiveUnits());
  // Worker 0 receives the gradient at unit 0's output (a[0] = 10) and the
  // weights of units 1 and 2, whose backward runs elsewhere, amortised over
  // m = 4: (0.5 + 10/10) + ((0.5 + 200) + (0.5 + 400)) / 4.
  EXPECT_EQ(costs.Inbound(0, {0, 3}, {0, 1}), 1.5 + 601.0 / 4);
  // Worker 1 receives the forward input a[2] = 40 and the routed input a[0]
  // = 10 of its first recomputed unit (unit 1, its B starts before its F);
  // B ends at L: no gradient; F \ B empty: no weight sync.
  EXPECT_EQ(costs.Inbound(1, {3, 5}, {1, 5}), (0.5 + 4) + (0.5 + 1));
  // A run of B \ F right after F gets its input locally.
  EXPECT_EQ(costs.Inbound(1, {1, 2}, {1, 4}), (0.5 + 1) + (0.5 + 8));
  // After a gap behind F it does not (the schedule compiler routes it).
  EXPECT_EQ(costs.Inbound(1, {1, 2}, {3, 4}), (0.5 + 1) + (0.5 + 8) + (0.5 + 4) + (0.5 + 200) / 4);
  // Empty F: the backward range's input always comes from elsewhere.
  EXPECT_EQ(costs.Inbound(1, {2, 2}, {2, 4}), (0.5 + 8) + (0.5 + 2));
  EXPECT_EQ(FullObjective(FiveUnits(), kFiveUnitPlan),
            std::max({107.0, 1.5 + 601.0 / 4, 3030 / 2.0, 6.0}));
}

TEST(BiPartitionCostsTest, Inbound_UnlimitedBandwidthStillPaysLatency) {
  BiPartitionProblem p = FiveUnits();
  p.bandwidth = 0;
  const BiPartitionCosts costs(p);
  EXPECT_EQ(costs.Inbound(0, {0, 3}, {0, 1}), 0.5 + (0.5 + 0.5) / 4);
  EXPECT_EQ(costs.Inbound(1, {3, 5}, {1, 5}), 0.5 + 0.5);
  EXPECT_EQ(BiPartitionCosts(p).PaperCut(0, {0, 3}, {0, 1}), 0);
}

TEST(BiPartitionCostsTest, Memory_WeightsOptimizerStateAndStashPerSchedule) {
  BiPartitionProblem p = FiveUnits();
  // Worker 0: weights of F ∪ B = units 0..2 (7000), optimizer state and
  // gradient 3 * w(B) = 3000, the gradient buffers of the forward-only
  // units 1 and 2 (6000), stash of F ∩ B = unit 0 (3) times
  // n_0 = min(m = 4, P - 0 = 2) = 2 for 1F1B, and the peak of a
  // forward-only pass: the larger stash of units 1 and 2 (7), filled and
  // dropped.
  EXPECT_EQ(BiPartitionCosts(p).Memory(0, {0, 3}, {0, 1}), 7000 + 3000 + 6000 + 2 * 3 + 7);
  // Worker 1 (n_1 = min(4, 1) = 1): units 1..4 (30000) + 3 * 30000 + stash
  // of units 3, 4, and once that of units 1, 2 (recomputed: B \ F).
  EXPECT_EQ(BiPartitionCosts(p).Memory(1, {3, 5}, {1, 5}), 30000 + 90000 + 1 * 24 + 12);
  p.schedule = BiPartitionSchedule::kGPipe;  // n_i = m = 4
  EXPECT_EQ(BiPartitionCosts(p).Memory(0, {0, 3}, {0, 1}), 7000 + 3000 + 6000 + 4 * 3 + 7);
  EXPECT_EQ(BiPartitionCosts(p).Memory(1, {3, 5}, {1, 5}), 30000 + 90000 + 4 * 24 + 12);
}

// A worker holding both ends of the model shares wte's value between them,
// and steps it once when both are in B (one pair of moments; two
// gradients): the tied bytes, at most either end's weights, come off.
TEST(BiPartitionCostsTest, Memory_BothEndsOnOneWorker_TiedWeightsCountedOnce) {
  BiPartitionProblem p = FiveUnits();
  p.tied_weight_bytes = 600;
  const BiPartitionCosts costs(p);
  const double all = 31000 + 3 * 31000 + 2 * (3 + 5 + 7 + 11 + 13);
  EXPECT_EQ(costs.Memory(0, {0, 5}, {0, 5}), all - 3 * 600);
  // Both held, the embedding stepped elsewhere: the value only.
  // Unit 0 forward only: its gradient buffer (1000) and its stash as its
  // pass's peak (3) besides.
  EXPECT_EQ(costs.Memory(0, {0, 5}, {1, 5}),
            31000 + 3 * 30000 + 2 * (5 + 7 + 11 + 13) - 600 + 1000 + 3);
  // One end: nothing shared.
  EXPECT_EQ(costs.Memory(0, {0, 4}, {0, 4}), 15000 + 3 * 15000 + 2 * (3 + 5 + 7 + 11));
  // At most the smaller end's weights (which keeps memory_i monotone).
  p.tied_weight_bytes = 5000;
  EXPECT_EQ(BiPartitionCosts(p).Memory(0, {0, 5}, {0, 5}), all - 3 * 1000);
  p.tied_weight_bytes = -1;
  EXPECT_FALSE(ValidateProblem(p).ok());
}

// Copies of the weights a worker steps beside memory_i's (c_i: a CPU
// worker's checkpoint snapshot of its weights and both AdamW moments): the
// tied wte's twice when it steps both ends (the snapshot copies each
// unit's parameters, the head's shared wte among them), nothing for units
// it only runs forward.
TEST(BiPartitionCostsTest, Memory_SteppedWeightCopies_ChargedOnTheBackwardRange) {
  BiPartitionProblem p = FiveUnits();
  p.tied_weight_bytes = 600;
  const double without = BiPartitionCosts(p).Memory(0, {0, 5}, {0, 5});
  const double forward_only = BiPartitionCosts(p).Memory(0, {0, 3}, {0, 1});
  const double second = BiPartitionCosts(p).Memory(1, {0, 5}, {0, 5});
  p.stepped_weight_copies = {3, 0};
  const BiPartitionCosts costs(p);
  EXPECT_EQ(costs.Memory(0, {0, 5}, {0, 5}), without + 3 * 31000);
  EXPECT_EQ(costs.Memory(0, {0, 3}, {0, 1}), forward_only + 3 * 1000);
  EXPECT_EQ(costs.Memory(1, {0, 5}, {0, 5}), second);
  p.stepped_weight_copies = {3};
  EXPECT_FALSE(ValidateProblem(p).ok());
  p.stepped_weight_copies = {-1, 0};
  EXPECT_FALSE(ValidateProblem(p).ok());
  p.stepped_weight_copies = {std::nan(""), 0};
  EXPECT_FALSE(ValidateProblem(p).ok());
}

// A run of B \ F right after F recomputes from F's last output, kept from
// each forward pass to its backward pass: n_i of them, one of which is in
// the first recomputed unit's stash (its input).
TEST(BiPartitionCostsTest, Memory_KeepsFsLastOutputForARecomputeRightAfterF) {
  BiPartitionProblem p = FiveUnits();
  // Worker 0 (n_0 = 2): weights of units 0..2 (7000), 3 * 7000, stash of
  // unit 0 twice, of units 1 and 2 once, and one more of unit 0's output.
  EXPECT_EQ(BiPartitionCosts(p).Memory(0, {0, 1}, {0, 3}), 7000 + 21000 + 2 * 3 + 12 + 1 * 10);
  // B \ F after a gap, or before F: a routed input, not kept from F. Unit
  // 0 forward only: its gradient (1000), and its pass's peak is its stash
  // (3), below unit 2's recomputed stash (7) held besides.
  EXPECT_EQ(BiPartitionCosts(p).Memory(0, {0, 1}, {2, 3}), 5000 + 12000 + 7 + 1000 + 3);
  p.schedule = BiPartitionSchedule::kGPipe;  // n_0 = 4
  EXPECT_EQ(BiPartitionCosts(p).Memory(0, {0, 1}, {0, 3}), 7000 + 21000 + 4 * 3 + 12 + 3 * 10);
}

// A worker that only recomputes and back-propagates a unit (its forward
// runs elsewhere) holds that unit's stash for the micro-batch it runs the
// backward of: counted once, whatever the schedule.
TEST(BiPartitionCostsTest, Memory_CountsTheRecomputedStashOfBMinusFOnce) {
  BiPartitionProblem p;
  p.fwd = {1, 1};
  p.bwd = {1, 1};
  p.activation_bytes = {0, 0};
  p.weight_bytes = {0, 0};
  p.stash_bytes = {0, 100};
  p.speeds = {1, 1};
  p.micro_batches = 4;
  EXPECT_EQ(BiPartitionCosts(p).Memory(1, {2, 2}, {1, 2}), 100);
  EXPECT_EQ(BiPartitionCosts(p).Memory(1, {1, 2}, {1, 2}), 100);      // n_1 = 1 in 1F1B
  EXPECT_EQ(BiPartitionCosts(p).Memory(0, {0, 2}, {0, 2}), 2 * 100);  // n_0 = 2
  p.schedule = BiPartitionSchedule::kGPipe;
  EXPECT_EQ(BiPartitionCosts(p).Memory(1, {2, 2}, {1, 2}), 100);
  EXPECT_EQ(BiPartitionCosts(p).Memory(1, {1, 2}, {1, 2}), 4 * 100);
}

// The largest transient of F ∪ B counts once, whatever the schedule, and
// from either range (the sparse table's levels at every width). A
// forward-only unit's (F \ B) pass fills its whole stash and drops it: its
// peak is transient + stash.
TEST(BiPartitionCostsTest, Memory_AddsTheLargestTransientOfTheWorkersUnits) {
  BiPartitionProblem p = FiveUnits();
  p.transient_bytes = {50, 400, 30, 20, 10};
  // Forward-only units 1 and 2: peaks 400 + 5 and 30 + 7.
  EXPECT_EQ(BiPartitionCosts(p).Memory(0, {0, 3}, {0, 1}), 7000 + 3000 + 6000 + 2 * 3 + 405);
  EXPECT_EQ(BiPartitionCosts(p).Memory(1, {3, 5}, {1, 5}), 30000 + 90000 + 1 * 24 + 12 + 400);
  EXPECT_EQ(BiPartitionCosts(p).Memory(1, {3, 5}, {3, 5}), 24000 + 72000 + 24 + 20);
  // Forward only: weights and gradient buffer, and the pass's peak.
  EXPECT_EQ(BiPartitionCosts(p).Memory(0, {0, 1}, {0, 0}), 2 * 1000 + 50 + 3);
  p.schedule = BiPartitionSchedule::kGPipe;
  EXPECT_EQ(BiPartitionCosts(p).Memory(0, {0, 3}, {0, 1}), 7000 + 3000 + 6000 + 4 * 3 + 405);
  // Every range of units against a plain maximum: both passes (the
  // transients alone), forward only (transient + stash), and forward only
  // around a backward range inside it (F \ B in two pieces).
  const BiPartitionCosts costs(p);
  for (int begin = 0; begin < 5; ++begin) {
    for (int end = begin + 1; end <= 5; ++end) {
      double largest = 0, largest_peak = 0, weights = 0;
      for (int u = begin; u < end; ++u) {
        largest = std::max(largest, p.transient_bytes[u]);
        largest_peak = std::max(largest_peak, p.transient_bytes[u] + p.stash_bytes[u]);
        weights += p.weight_bytes[u];
      }
      const BiPartitionCosts without(FiveUnitsGPipe());
      EXPECT_EQ(costs.Memory(0, {begin, end}, {begin, end}),
                without.Memory(0, {begin, end}, {begin, end}) + largest)
          << begin << ", " << end;
      EXPECT_EQ(costs.Memory(0, {begin, end}, {0, 0}), 2 * weights + largest_peak)
          << begin << ", " << end;
      if (end - begin < 3) continue;
      const Range inner = {begin + 1, end - 1};  // units begin and end - 1 forward only
      const double outer_peak = std::max(p.transient_bytes[begin] + p.stash_bytes[begin],
                                         p.transient_bytes[end - 1] + p.stash_bytes[end - 1]);
      double inner_largest = 0;
      for (int u = inner.begin; u < inner.end; ++u) {
        inner_largest = std::max(inner_largest, p.transient_bytes[u]);
      }
      EXPECT_EQ(costs.Memory(0, {begin, end}, inner) - without.Memory(0, {begin, end}, inner),
                std::max(outer_peak, inner_largest) -
                    std::max(p.stash_bytes[begin], p.stash_bytes[end - 1]))
          << begin << ", " << end;
    }
  }
}

TEST(BiPartitionCostsTest, MemoryLimit_MakesBothObjectivesInfinite) {
  BiPartitionProblem p = FiveUnits();
  p.memory_bytes = {16013, 0};  // exactly worker 0's need; worker 1 unlimited
  EXPECT_LT(FullObjective(p, kFiveUnitPlan), kInf);
  EXPECT_LT(PaperObjective(p, kFiveUnitPlan), kInf);
  p.memory_bytes = {16012, 0};
  EXPECT_EQ(FullObjective(p, kFiveUnitPlan), kInf);
  EXPECT_EQ(PaperObjective(p, kFiveUnitPlan), kInf);
}

TEST(BiPartitionTest, MemoryLimit_SteersThePlan) {
  BiPartitionProblem p;
  p.fwd = {1, 4};
  p.bwd = {1, 4};
  p.activation_bytes = {0, 0};
  p.weight_bytes = {1, 10};
  p.speeds = {1, 1};
  // Unlimited: e.g. all forwards on worker 0, all backwards on worker 1: 5.
  EXPECT_EQ(SolveBiPartition(p).value().bottleneck, 5);
  // Worker 0 holds at most 5 bytes: unit 1 (10 bytes) never fits there, so
  // it takes both passes of unit 0 (1 + 3 * 1 = 4 bytes) and worker 1 the
  // rest: 8.
  p.memory_bytes = {5, 0};
  for (const BiPartitionPlan& plan :
       {SolveBiPartition(p).value(), SolveBiPartitionReference(p).value(),
        SolveBiPartitionInterval(p, SplitSearch::kExhaustive).value()}) {
    EXPECT_EQ(plan.bottleneck, 8);
    EXPECT_EQ(plan.forward, (std::vector<Range>{{0, 1}, {1, 2}}));
    EXPECT_EQ(plan.backward, (std::vector<Range>{{0, 1}, {1, 2}}));
  }
}

TEST(BiPartitionTest, NothingFits_IsResourceExhaustedNamingTheTightestWorker) {
  BiPartitionProblem p;
  p.fwd = {1, 1, 1};
  p.bwd = {1, 1, 1};
  p.activation_bytes = {0, 0, 0};
  p.weight_bytes = {10, 10, 10};
  p.speeds = {1, 1};
  // A backward owner holds 4 * 10 bytes per unit, so one worker holds two
  // backward units (80 bytes): on worker 1 that is 1.6x its 50 bytes, the
  // least overload possible (2x on worker 0).
  p.memory_bytes = {40, 50};
  const auto solved = SolveBiPartition(p);
  EXPECT_EQ(solved.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(solved.status().message().find("needs 80 bytes (0.00 GiB) on worker 1 (1.60x its "
                                           "memory_bytes 50 bytes (0.00 GiB)"),
            std::string::npos)
      << solved.status().message();
  // Named, when the problem names its workers (MakeBiPartitionProblem does).
  p.worker_names = {"a", "b"};
  EXPECT_NE(SolveBiPartition(p).status().message().find("on worker b (1.60x"), std::string::npos)
      << SolveBiPartition(p).status().message();
  p.worker_names.clear();
  EXPECT_EQ(SolveBiPartitionReference(p).status(), solved.status());
  EXPECT_EQ(SolveBiPartitionInterval(p, SplitSearch::kExhaustive).status(), solved.status());
}

TEST(BiPartitionTest, BadInput_IsInvalidArgument) {
  BiPartitionProblem p;
  p.fwd = {1, 2};
  p.bwd = {1};
  p.activation_bytes = {1, 1};
  p.speeds = {1};
  EXPECT_EQ(SolveBiPartition(p).status().code(), absl::StatusCode::kInvalidArgument);
  p.bwd = {1, -2};
  EXPECT_EQ(SolveBiPartition(p).status().message(), "unit 1: costs must be finite and >= 0");
  p.bwd = {1, 2};
  p.speeds = {1, 1, 1, 1, 1};
  EXPECT_EQ(SolveBiPartition(p).status().message(),
            "5 workers for 2 units: at most 2 * units workers can each get a range");
  p.speeds = {1, 0};
  EXPECT_EQ(SolveBiPartition(p).status().message(), "worker 1: speed must be > 0");
  p.speeds = {1, 1};
  const std::pair<std::function<void(BiPartitionProblem*)>, const char*> cases[] = {
      {[](BiPartitionProblem* q) { q->micro_batches = 0; }, "micro_batches must be >= 1, got 0"},
      {[](BiPartitionProblem* q) { q->weight_bytes = {1}; },
       "weight_bytes has 1 entries; want none or 2 (one per unit)"},
      {[](BiPartitionProblem* q) {
         q->stash_bytes = {1, NAN};
       },
       "unit 1: stash_bytes must be finite and >= 0"},
      {[](BiPartitionProblem* q) {
         q->transient_bytes = {-1, 0};
       },
       "unit 0: transient_bytes must be finite and >= 0"},
      {[](BiPartitionProblem* q) {
         q->memory_bytes = {1, -1};
       },
       "worker 1: memory_bytes must be finite and >= 0"},
      {[](BiPartitionProblem* q) {
         q->memory_bytes = {1, 2, 3};
       },
       "memory_bytes has 3 entries; want none or 2 (one per worker)"},
      // Below a byte no plan's memory ratio is finite (NoPlanFitsError
      // would name none).
      {[](BiPartitionProblem* q) {
         q->memory_bytes = {0, 5e-324};
       },
       "worker 1: memory_bytes must be 0 (unlimited) or at least 1, got 4.94066e-324"},
      {[](BiPartitionProblem* q) { q->latency_seconds = kInf; },
       "latency_seconds must be finite and >= 0"},
      {[](BiPartitionProblem* q) { q->bandwidth = NAN; },
       "bandwidth is NaN; use <= 0 for unlimited"},
      {[](BiPartitionProblem* q) { q->max_weight_sync_bytes = 0; },
       "max_weight_sync_bytes must be > 0 (+inf: no limit), got 0"},
  };
  for (const auto& [mutate, message] : cases) {
    BiPartitionProblem q = p;
    mutate(&q);
    for (const absl::Status& s :
         {SolveBiPartition(q).status(), SolveBiPartitionReference(q).status(),
          SolveBiPartitionInterval(q, SplitSearch::kExhaustive).status()}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
      EXPECT_EQ(s.message(), message);
    }
  }
}

TEST(BiPartitionIntervalTest, TooLarge_IsInvalidArgument) {
  BiPartitionProblem p;
  p.fwd.assign(64, 1);
  p.bwd.assign(64, 1);
  p.activation_bytes.assign(64, 1);
  p.speeds.assign(16, 1);
  const auto solved = SolveBiPartitionInterval(p, SplitSearch::kExhaustive);
  EXPECT_EQ(solved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(solved.status().message().find("use SolveBiPartition"), std::string::npos);
}

}  // namespace
}  // namespace pipetrain
