#include "coordinator/jobs/memory_budget.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/planner/bipartition.h"
#include "worker/runtime/feedback_limits.h"

namespace pipetrain {
namespace {

// What a worker's budget is, and the name of the memory it shares (empty:
// its own).
struct Budget {
  double bytes = 0;
  std::string shared;
  // A CPU worker with a limit of its own below its host's RAM: the RAM it
  // draws from (as `shared` names it for the others), which its limit
  // leaves the sharers less of.
  std::string claims_from;
  // Kept out of the plans from what it gets: a CPU worker's
  // DeviceInfo.memory_reserve_bytes (host memory), a GPU worker's
  // --gpu-memory-reserve. Its own limit still claims the whole from the
  // host's RAM: the reserve is memory it uses.
  double reserve = 0;
};

// What a plan may use of `budget` once `reserve` is kept out: at least a
// byte (0 would read as unlimited); an unlimited (0) budget stays so.
double LessReserve(double budget, double reserve) {
  return budget <= 0 ? budget : std::max(1.0, budget - reserve);
}

// A sharer's part of a memory of `bytes` that `sharers` workers share beside
// `claims` bytes of others' own limits on its host: at least a byte (0
// would read as unlimited, and nothing fits in it).
double SharerBudget(double bytes, double claims, int sharers) {
  return std::max(1.0, (bytes - claims) / sharers);
}

std::string HostRam(const v1::DeviceInfo& d) {
  return absl::StrCat("host ", d.hostname(), "'s RAM");
}

Budget BudgetOf(const v1::Worker& w, int64_t gpu_reserve = 0) {
  const v1::DeviceInfo& d = w.device();
  Budget b;
  if (!d.gpu_model().empty()) {
    b.bytes = static_cast<double>(d.gpu_memory_bytes());
    b.reserve = static_cast<double>(gpu_reserve);
    const std::string gpu =
        d.gpu_pci_bus_id().empty() ? absl::StrCat("#", d.gpu_index()) : d.gpu_pci_bus_id();
    if (!d.hostname().empty()) b.shared = absl::StrCat("GPU ", gpu, " of host ", d.hostname());
    return b;
  }
  const int64_t limit = d.memory_limit_bytes() > 0 ? d.memory_limit_bytes() : d.memory_bytes();
  b.bytes = static_cast<double>(limit);
  b.reserve = static_cast<double>(d.memory_reserve_bytes());
  if (!d.hostname().empty() && limit >= d.memory_bytes()) {
    b.shared = HostRam(d);
  } else if (!d.hostname().empty()) {
    b.claims_from = HostRam(d);
  }
  return b;
}

// `workers` counted as CPU ones (their host's RAM), their reserves kept or
// not.
std::vector<v1::Worker> OnTheirHosts(const std::vector<v1::Worker>& workers, bool keep_reserve) {
  std::vector<v1::Worker> on_the_host = workers;
  for (v1::Worker& w : on_the_host) {
    w.mutable_device()->clear_gpu_model();
    if (!keep_reserve) w.mutable_device()->clear_memory_reserve_bytes();
  }
  return on_the_host;
}

// A GPU worker's host copies of the weights it steps (its shard of them),
// by phase of its run (job_runner.cc RunJob). The phases follow one
// another: the starting weights or a checkpoint are read and restored
// before the first step, the gradients are summed on the host during a
// step, a checkpoint's copies are taken between steps and the final
// weights downloaded after the last one. What lasts through several
// phases is counted in each: compressed data-parallel residuals (from the
// first step on) and the writer's snapshot (written in the background
// while the next steps run, the last one included: job_runner.cc waits
// for it only after the final weights' upload).
struct GpuPosition {
  int replicas = 1, tensor = 1, replica = 0, rank = 0;
  bool compressed = false;   // data-parallel gradients through PowerSGD or a quantizer
  bool checkpoints = false;  // spec.checkpoint.interval_steps > 0
  bool Writer() const { return replica == 0 && rank == 0; }
  double Residuals() const { return compressed ? 1 : 0; }  // StageRuntime's dp_feedback_
};

GpuPosition PositionOf(const ResolvedJobSpec& r, int replica, int rank) {
  GpuPosition p;
  p.replicas = std::max(1, r.data_parallel);
  p.tensor = std::max(1, r.tensor_parallel);
  p.replica = replica;
  p.rank = rank;
  p.compressed =
      p.replicas > 1 && (r.data_parallel_powersgd_rank > 0 || !r.data_parallel_quantizer.empty());
  p.checkpoints = r.spec.checkpoint().interval_steps() > 0;
  return p;
}

// The replicas' residuals a stage's snapshot holds (GatherReplicaFeedback):
// each one's, or past kMaxFeedbackReplicasKept their sum.
int SnapshotResiduals(const GpuPosition& p) {
  if (!p.compressed) return 0;
  return p.replicas <= kMaxFeedbackReplicasKept ? p.replicas : 1;
}

// The writer's snapshot (StageRuntime::Snapshot): its stage's weights,
// both moments and the replicas' residuals, its ranks' gathered unsplit.
// With tensor ranks also the buffer its own shards' residuals arrive in
// (GatherReplicaFeedback's, SnapshotResiduals of them): the gathered
// unsplit ones are new tensors beside it. It is held through the call,
// and after it as long as the snapshot is wherever the snapshot keeps a
// view of it: the residual of a tensor every rank holds whole (a
// LayerNorm's, with a quantizer).
// At T = 1 the snapshot's residuals are those views, counted once.
double WriterSnapshot(const GpuPosition& p) {
  if (!p.Writer() || !p.checkpoints) return 0;
  const int residuals = SnapshotResiduals(p);
  return p.tensor * (3.0 + residuals) + (p.tensor > 1 ? residuals : 0);
}

// Before the first step, at every position and at once: spec.init.from's
// tensors, or a resume's weights and both moments of every unit, read
// unsplit (T shards each: the rank's shard is cut only at Restore), and
// beside them Restore's copy of the rank's part of every weight
// (ThisRanksPart). With compressed gradients a resume also reads the
// residuals this replica folds unsplit, the old replicas' r with r mod D
// == replica, and sums its shard of them. Counted for a checkpoint of this
// layout: one of them (replica 0 the sum past kMaxFeedbackReplicasKept);
// one written by more replicas (before an elastic change) may give it
// more. Only a job with checkpoints resumes, and an assignment carries
// spec.init.from or a resume, never both.
double StartCopies(const ResolvedJobSpec& r, const GpuPosition& p) {
  const double init = r.spec.init().from().empty() ? 0 : p.tensor + 1.0;
  if (!p.checkpoints) return init;
  const int folded =
      p.compressed && (p.replicas <= kMaxFeedbackReplicasKept || p.replica == 0) ? 1 : 0;
  return std::max(init, p.tensor * (3.0 + folded) + 1 + folded);
}

// During a step: with replicas, the gradients' sum on the host
// (AllReduceFlat: what no bucket carried, on a GPU without a replica device
// group every gradient, in one flat tensor; with a quantizer also what it
// dropped), beside the residuals and the writer's snapshot. Whether a
// position gets a replica device group is settled only when the plan is
// committed (replica_device_groups.h: one host, NCCL ids), so every
// replica is charged; for exact sums no more than its final download
// charges it anyway.
double StepCopies(const ResolvedJobSpec& r, const GpuPosition& p) {
  const double sum = p.replicas < 2 ? 0 : r.data_parallel_quantizer.empty() ? 1 : 2;
  return p.Residuals() + sum + WriterSnapshot(p);
}

// Between steps, while a checkpoint is taken: the writer its snapshot
// (with tensor ranks the residuals' buffer beside their gathered copies);
// with compressed gradients each other position the concatenated
// residuals it sends to replica 0 and, at replica 0, every replica's
// gathered for its rank 0, all freed before the next step.
double CheckpointCopies(const GpuPosition& p) {
  if (!p.checkpoints) return 0;
  if (p.Writer()) return p.Residuals() + WriterSnapshot(p);
  if (!p.compressed) return 0;
  return p.Residuals() + 1 + (p.replica == 0 ? SnapshotResiduals(p) : 0);
}

// After the last step: every position downloads the weights it steps (to
// check them finite, and their digest), and replica 0 with
// spec.output.weights_path again for the upload (UnsplitParameterCopies),
// which its rank 0 gathers unsplit (T shards); beside the residuals and
// the writer's last snapshot, which may still be written.
double LastStepCopies(const ResolvedJobSpec& r, const GpuPosition& p) {
  double upload = 0;
  if (p.replica == 0 && !r.spec.output().weights_path().empty()) {
    upload = p.rank == 0 ? p.tensor : 1;
  }
  return p.Residuals() + 1 + upload + WriterSnapshot(p);
}

// A GPU worker's host copies refused: it would need `need` for `copies` of
// the `stepped` bytes of weights it steps; `short_of` says what it (or
// its host) has instead. Turning checkpoints off is advice only to a job
// that takes them (`checkpoints`): one without is refused for its final
// weights or gradients' sum, which nothing in its spec turns off.
absl::Status HostCopiesRefused(const v1::Worker& w, int stage, double need, double copies,
                               double stepped, const std::string& short_of, bool checkpoints) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "GPU worker ", w.id(), " (stage ", stage, ") would need ", BytesAndGiB(need),
      " of host RAM for ", copies, " host copies of the ", BytesAndGiB(stepped),
      " of weights it steps (a checkpoint's snapshot or a resume's read of them and both AdamW "
      "moments, the data-parallel gradients' sum and residuals, the final weights, and any "
      "tensor ranks' gathers)",
      short_of, "; give its host more RAM (its pod a higher memory limit)",
      checkpoints ? ", split the model over more stages, or turn checkpoints off "
                    "(spec.checkpoint.intervalSteps 0)"
                  : " or split the model over more stages"));
}

}  // namespace

std::vector<double> PlanMemoryBudgets(const std::vector<v1::Worker>& workers, std::string* shared,
                                      int64_t gpu_reserve_bytes) {
  std::vector<Budget> budgets;
  std::map<std::string, int> sharers;
  // Per host: the limits of the plan's workers there that have their own,
  // and how many: the RAM they may take is not there for the sharers.
  std::map<std::string, std::pair<double, int>> claimed;
  for (const v1::Worker& w : workers) {
    budgets.push_back(BudgetOf(w, gpu_reserve_bytes));
    const Budget& b = budgets.back();
    if (!b.shared.empty()) ++sharers[b.shared];
    if (!b.claims_from.empty()) {
      claimed[b.claims_from].first += b.bytes;
      ++claimed[b.claims_from].second;
    }
  }
  std::vector<double> out;
  for (const Budget& b : budgets) {
    if (b.shared.empty() || b.bytes <= 0) {  // its own, or unreported: unlimited
      out.push_back(LessReserve(b.bytes, b.reserve));
      continue;
    }
    out.push_back(
        LessReserve(SharerBudget(b.bytes, claimed[b.shared].first, sharers[b.shared]), b.reserve));
  }
  if (shared != nullptr) {
    std::vector<std::string> parts;
    for (const auto& [what, count] : sharers) {
      const int limited = claimed[what].second;
      if (count > 1 || limited > 0) {
        parts.push_back(absl::StrCat(
            what, " shared by ", count, count == 1 ? " worker" : " workers",
            limited > 0 ? absl::StrCat(" beside ", limited,
                                       limited == 1 ? " worker with a limit of its own"
                                                    : " workers with limits of their own")
                        : ""));
      }
    }
    *shared = absl::StrJoin(parts, ", ");
  }
  return out;
}

std::vector<double> HostRamBudgets(const std::vector<v1::Worker>& workers) {
  // The corpus bound (a third of this) is one of the things the reserve is
  // kept for, not taken out of it again.
  return PlanMemoryBudgets(OnTheirHosts(workers, /*keep_reserve=*/false));
}

double GpuHostCopiesAt(const ResolvedJobSpec& resolved, int replica, int rank) {
  // The phases do not overlap (what lasts through several is counted in
  // each): the most of them, not their sum.
  const GpuPosition p = PositionOf(resolved, replica, rank);
  return std::max({StartCopies(resolved, p), StepCopies(resolved, p), CheckpointCopies(p),
                   LastStepCopies(resolved, p)});
}

absl::Status CheckGpuHostCopies(const std::vector<v1::Worker>& workers,
                                const std::vector<int>& stages,
                                const std::vector<double>& stepped_weight_bytes,
                                const std::vector<double>& copies, bool checkpoints) {
  // What a CPU worker's plan may hold of the same RAM: the host copies are
  // planned memory, so the reserve stays out of it.
  const std::vector<v1::Worker> on_hosts = OnTheirHosts(workers, /*keep_reserve=*/true);
  const std::vector<double> host = PlanMemoryBudgets(on_hosts);
  // The GPU workers that share their host's RAM pool their shares: each
  // one's need is the most of its phases, and they differ by position (a
  // writer's snapshot of its stage, a tensor rank 0's gather of the final
  // weights, beside others' shard), so equal shares refused 8 GPUs of a
  // 128 GiB host the final weights' gather that their sum holds. A CPU
  // sharer keeps its share (its plan may fill it).
  struct Pool {
    double need = 0, has = 0;
    int workers = 0;
    size_t neediest = 0;
  };
  std::map<std::string, Pool> pools;
  std::vector<std::string> pool_of(workers.size());
  std::vector<double> need(workers.size(), 0);
  for (size_t i = 0; i < workers.size(); ++i) {
    need[i] = copies[i] * stepped_weight_bytes[i];
    if (workers[i].device().gpu_model().empty() || host[i] <= 0) continue;
    pool_of[i] = BudgetOf(on_hosts[i]).shared;
    if (pool_of[i].empty()) continue;
    Pool& p = pools[pool_of[i]];
    if (p.workers == 0 || need[i] > need[p.neediest]) p.neediest = i;
    p.need += need[i];
    p.has += host[i];
    ++p.workers;
  }
  for (size_t i = 0; i < workers.size(); ++i) {
    if (workers[i].device().gpu_model().empty() || host[i] <= 0) continue;
    const Pool* p = pool_of[i].empty() ? nullptr : &pools[pool_of[i]];
    if (p == nullptr || p->workers == 1) {
      if (need[i] <= host[i]) continue;
      const v1::DeviceInfo& d = workers[i].device();
      return HostCopiesRefused(
          workers[i], stages[i], need[i], copies[i], stepped_weight_bytes[i],
          absl::StrCat(" but has ", BytesAndGiB(host[i]),
                       d.hostname().empty() ? "" : absl::StrCat(" of ", HostRam(d)),
                       " (its limit or share, less its --memory-reserve)"),
          checkpoints);
    }
    if (p->need <= p->has) continue;
    const size_t n = p->neediest;
    return HostCopiesRefused(
        workers[n], stages[n], need[n], copies[n], stepped_weight_bytes[n],
        absl::StrCat(", and the plan's ", p->workers, " GPU workers sharing ", pool_of[i],
                     " would need ", BytesAndGiB(p->need), " in all, but have ",
                     BytesAndGiB(p->has),
                     " of it (less the plan's CPU workers' shares there, the limits of those with "
                     "their own, and their --memory-reserve)"),
        checkpoints);
  }
  return absl::OkStatus();
}

std::vector<size_t> RoomiestWorkers(const std::vector<v1::Worker>& workers, int count,
                                    const std::vector<v1::Worker>& beside,
                                    int64_t gpu_reserve_bytes) {
  constexpr double kUnlimited = std::numeric_limits<double>::infinity();
  std::vector<Budget> budgets;
  for (const v1::Worker& w : workers) budgets.push_back(BudgetOf(w, gpu_reserve_bytes));
  // A divided memory among the chosen workers, as PlanMemoryBudgets
  // divides it: each sharer gets (its bytes - the claims) / sharers, less
  // its reserve; the smallest that of the sharer with the fewest bytes and
  // the largest reserve (bounded below by both).
  struct Divided {
    int sharers = 0;
    double fewest_bytes = kUnlimited;  // of the sharers with a budget
    double claims = 0;                 // own limits chosen on that host
    double largest_reserve = 0;        // of the sharers
    double Share() const {
      return sharers == 0 ? kUnlimited : SharerBudget(fewest_bytes, claims, sharers);
    }
    double Least() const {
      return sharers == 0 ? kUnlimited : LessReserve(Share(), largest_reserve);
    }
  };
  // A worker's own budget (not divided), less its reserve.
  const auto own_of = [](const Budget& b) {
    return b.bytes > 0 ? LessReserve(b.bytes, b.reserve) : kUnlimited;
  };
  std::map<std::string, Divided> divided;
  double own_min = kUnlimited;  // the smallest budget that is not divided
  // Adds a chosen worker (or one of `beside`) to the memories it divides.
  const auto add = [&](const Budget& b) {
    const double whole = b.bytes > 0 ? b.bytes : kUnlimited;
    if (!b.shared.empty()) {
      Divided& d = divided[b.shared];
      ++d.sharers;
      d.fewest_bytes = std::min(d.fewest_bytes, whole);
      if (b.bytes > 0) d.largest_reserve = std::max(d.largest_reserve, b.reserve);
    } else {
      own_min = std::min(own_min, own_of(b));
      if (!b.claims_from.empty()) divided[b.claims_from].claims += b.bytes;
    }
  };
  for (const v1::Worker& w : beside) add(BudgetOf(w, gpu_reserve_bytes));
  std::vector<bool> taken(workers.size(), false);
  std::vector<size_t> chosen;
  while (static_cast<int>(chosen.size()) < count && chosen.size() < workers.size()) {
    // The smallest divided share over every memory but one: the two
    // smallest suffice.
    std::string lowest_name;
    double lowest = kUnlimited, second = kUnlimited;
    for (const auto& [name, d] : divided) {
      const double share = d.Least();
      if (share < lowest) {
        second = lowest;
        lowest = share;
        lowest_name = name;
      } else if (share < second) {
        second = share;
      }
    }
    const auto others = [&](const std::string& name) {
      return name == lowest_name ? second : lowest;
    };
    size_t best = workers.size();
    double best_worst = -1, best_own = -1;
    for (size_t i = 0; i < workers.size(); ++i) {
      if (taken[i]) continue;
      const Budget& b = budgets[i];
      const double whole = b.bytes > 0 ? b.bytes : kUnlimited;
      // The smallest budget of the chosen workers with i among them (a
      // sharer or a claim changes only its own memory's share), and i's.
      double worst = own_min, own = own_of(b);
      const std::string& touched = !b.shared.empty() ? b.shared : b.claims_from;
      if (!touched.empty()) {
        auto it = divided.find(touched);
        Divided d = it == divided.end() ? Divided() : it->second;
        if (!b.shared.empty()) {
          ++d.sharers;
          d.fewest_bytes = std::min(d.fewest_bytes, whole);
          if (b.bytes > 0) {  // unreported: unlimited, as PlanMemoryBudgets
            d.largest_reserve = std::max(d.largest_reserve, b.reserve);
            own = LessReserve(d.Share(), b.reserve);
          }
        } else {
          d.claims += b.bytes;
        }
        worst = std::min({worst, others(touched), d.Least(), own});
      } else {
        worst = std::min({worst, lowest, own});
      }
      if (worst > best_worst || (worst == best_worst && own > best_own)) {
        best = i, best_worst = worst, best_own = own;
      }
    }
    taken[best] = true;
    chosen.push_back(best);
    add(budgets[best]);
  }
  return chosen;
}

}  // namespace pipetrain
