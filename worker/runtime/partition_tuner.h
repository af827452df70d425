// Measured choice of AccTFM's partition counts (acctfm.txt §4.2) for a
// tensor-parallel stage whose job asked for Alg. 1's per-layer sizes
// (spec.parallelism.tensor_partitions 0).
//
// Why: Alg. 1 picks each layer's k from a cost model (measured compute per
// partition, eq. 3 all-reduces), and on a real machine the model misses
// costs that grow with k (each partition's hand-over to the all-reduce
// thread, the ring's copies and adds on the cores that also compute), so
// its plan can lose to a uniform k by a few per cent (docs/benchmarks.md).
// The tuner runs the plan's choice and the uniform sizes 1, 2 and 4 for a
// few steps each, as autotuners do, and keeps the one this stage's tensor
// ranks (and replicas) measured fastest.
//
// Schedule, over the runtime's own iteration count i (0, 1, ...; every
// rank of a group runs the same iterations, so they agree): i = 0 runs
// candidate 0 unmeasured (warm-up: first-touch allocations); iterations
// 1 .. C x steps run candidate (i - 1) / steps each, recording the stage's
// compute seconds (its forward, backward and recompute instructions, which
// include the all-reduce time the units wait for); after the last of them
// the caller sums every rank's totals (StageRuntime: over the tensor
// ranks, then over the replicas, so all of the stage's ranks see the same
// sums) and Decide keeps the smallest, ties to the earlier candidate (the
// plan's first). Later iterations run the choice. A resumed stage may
// Adopt the choice a checkpoint recorded instead (no iteration measures).
//
// Candidates differ only in how a micro-batch is cut; the losses stay
// within rounding of each other (tensor_parallel_equivalence_test).
// Not thread-safe: the interpreter's thread uses it.
#ifndef PIPETRAIN_WORKER_RUNTIME_PARTITION_TUNER_H_
#define PIPETRAIN_WORKER_RUNTIME_PARTITION_TUNER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain {

// Per unit of the model (model order), forward and backward counts.
struct PartitionCandidate {
  std::vector<int> forward, backward;
  bool operator==(const PartitionCandidate& o) const {
    return forward == o.forward && backward == o.backward;
  }
  std::string ToString() const;  // "forward [1,2,...] backward [...]"
};

class PartitionTuner {
 public:
  // `planned`: the plan's choice; `tunable[u]`: whether unit u's counts
  // may vary (an attention or MLP unit whose forward and backward passes
  // both run on this stage; the others keep the plan's counts in every
  // candidate); `samples`: the samples of a micro-batch. The candidates
  // are the plan's and uniform 1, 2 and 4 over the tunable units, each
  // count held as it runs, cut to gcd(count, samples)
  // (Unit::TensorParallelPartitions), duplicates dropped: uniform 4 on 2
  // samples runs as uniform 2, measured once, and a count that never runs
  // is never reported. Requires steps_per_candidate >= 1, samples >= 1 and
  // planned vectors of tunable's size.
  //
  // Why a unit must run both passes here to be tuned: its count decides
  // the bits of its output (a codec's scale per partition, the ring's
  // segments), and under Bi-Partition another stage runs its forward or
  // its recompute, with a tuner of its own that may choose otherwise: the
  // recompute would then not rebuild the forward that made the loss.
  PartitionTuner(PartitionCandidate planned, const std::vector<bool>& tunable, int samples,
                 int steps_per_candidate);

  const std::vector<PartitionCandidate>& candidates() const { return candidates_; }
  // Whether unit u's counts vary between candidates (`tunable` above).
  bool tunable(int u) const {
    return u >= 0 && u < static_cast<int>(tunable_.size()) && tunable_[u];
  }
  // The counts iteration i runs (the choice once decided).
  const PartitionCandidate& CandidateFor(int64_t i) const;
  // Records iteration i's compute seconds when it is a measured one.
  void Record(int64_t i, double compute_seconds);
  // True when iteration i is the last measured one: the caller sums
  // totals() over the group and calls Decide.
  bool DecidesAfter(int64_t i) const;
  // This rank's measured seconds per candidate.
  const std::vector<double>& totals() const { return totals_; }
  // Keeps the candidate with the smallest `group_totals` (one per
  // candidate), ties to the earlier; returns its index. Decided from then.
  int Decide(const std::vector<double>& group_totals);
  // Keeps `choice` without measuring (a resumed stage's checkpointed
  // choice, measured before on the same layout) and returns true: decided
  // from now on. False, and nothing changes, unless it has the planned
  // vectors' sizes and holds every count as the units run it on these
  // samples (PartitionsRun), as every candidate is: a count the units
  // would cut is not what was measured; nor unless it holds the plan's
  // counts for every unit that is not tunable (a record from before they
  // were kept, or from another layout of the stages).
  bool Adopt(const PartitionCandidate& choice);
  bool decided() const { return chosen_ >= 0; }
  int chosen() const { return chosen_; }
  // Iterations the tuning takes (1 + candidates x steps).
  int64_t tuning_iterations() const;

 private:
  std::vector<PartitionCandidate> candidates_;  // [0]: the plan's, as run
  std::vector<bool> tunable_;
  int samples_;
  int steps_;
  std::vector<double> totals_;
  int chosen_ = -1;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_RUNTIME_PARTITION_TUNER_H_
