#include "coordinator/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/data_plane_limits.h"
#include "common/status_macros.h"
#include "coordinator/planner/bipartition.h"
#include "coordinator/planner/compression_marking.h"
#include "coordinator/planner/data_parallel_layout.h"
#include "coordinator/planner/data_plane_cost.h"
#include "coordinator/planner/fused_embedding_sync.h"
#include "coordinator/planner/host_sharing.h"
#include "coordinator/planner/schedule_compiler.h"
#include "coordinator/planner/selective_compression.h"
#include "coordinator/planner/solve_plan.h"
#include "coordinator/planner/tensor_cube_costs.h"
#include "coordinator/planner/tensor_partitions.h"
#include "coordinator/planner/timeline_render.h"
#include "kernels/compress/codec_spec.h"
#include "worker/runtime/feedback_limits.h"

namespace pipetrain {

namespace {

// Validation micro-batches per evaluation (CompileEvalPrograms).
int EvalMicroBatches(const ResolvedJobSpec& r) {
  if (r.train.eval_interval <= 0) return 0;
  const int per = r.train.batch_size / r.train.micro_batches;
  return (r.train.eval_windows + per - 1) / per;
}

// The slowest speed of `cluster`'s workers: the tensor groups' when
// `cluster` lists one per stage position. 1 for none, or for a speed not
// > 0, which the simulator refuses naming the worker.
double SlowestSpeed(const ClusterSpec& cluster) {
  if (cluster.workers.empty()) return 1;
  double slowest = cluster.workers.front().speed;
  for (const WorkerSpec& w : cluster.workers) slowest = std::min(slowest, w.speed);
  return slowest > 0 && std::isfinite(slowest) ? slowest : 1;
}

// What bounds one tensor of a plan on `replica` (MaxPlannedTensorBytes),
// for errors: the workers' --mailbox-limit where it is the smaller, so the
// operator knows which flag to raise.
std::string TensorLimitText(const ClusterSpec& replica) {
  const double limit = MaxPlannedTensorBytes(replica);
  if (limit < static_cast<double>(kMaxDataPlaneTensorBytes)) {
    return absl::StrCat("the smallest --mailbox-limit among the job's workers, ",
                        BytesAndGiB(limit), " (a worker's mailbox refuses a larger tensor)");
  }
  return absl::StrCat("the data plane's limit of ", BytesAndGiB(limit), " per tensor");
}

// A unit whose two passes run on different stages sends its weights to its
// forward stage after each step as ONE tensor (UNIT_WEIGHTS), which the
// receiver refuses above the data plane's per-tensor limit or its mailbox's
// (MaxPlannedTensorBytes): the job would fail at its first step, and again
// after each recovery re-planned the same ranges. Bi-Partition keeps such
// units whole (bipartition.h); a manual plan that splits one is refused
// here, naming it. `planned`: one tensor rank's unit costs, whose
// weight_bytes are what that rank sends.
absl::Status CheckWeightSyncs(const ResolvedJobSpec& r, const ModelProfile& planned,
                              const ClusterSpec& replica, const SolvedPlan& solved) {
  const BiPartitionProblem problem = MakeBiPartitionProblem(planned, replica);
  const int u = FirstOversizedWeightSync(problem, solved.forward, solved.backward);
  if (u < 0) return absl::OkStatus();
  size_t forward = 0, backward = 0;  // the unit's stages
  for (size_t s = 0; s < solved.forward.size(); ++s) {
    if (solved.forward[s].begin <= u && u < solved.forward[s].end) forward = s;
    if (solved.backward[s].begin <= u && u < solved.backward[s].end) backward = s;
  }
  const std::string what = absl::StrCat(
      "unit ", u, " (", planned.units[u].name, ") runs its forward pass on stage ", forward,
      " and its backward pass on stage ", backward, ", so after each step stage ", backward,
      " would send its weights to stage ", forward, " as one tensor of ",
      BytesAndGiB(problem.weight_bytes[u]), r.tensor_parallel > 1 ? " per tensor rank" : "",
      ", above ", TensorLimitText(replica));
  if (r.solver != kSolverManual) {
    return absl::InternalError(absl::StrCat("solver ", solved.solver, ": ", what));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("spec.parallelism.manual_stages: ", what,
                   "; give that unit equal forward and backward cuts (both passes on one stage)"));
}

// Each micro-batch a stage sends its forward range's output to the next
// and the gradient at its backward range's start to the one before
// (schedule_compiler.cc; a recompute's routed input is the same unit's
// output), each as one tensor of the unit's activation_bytes. A worker's
// mailbox refuses one above its --mailbox-limit, so the job would fail at
// its first step: refused here, naming the largest. Sized raw, which errs
// on the safe side: a codec shrinks the tensor, and GPUs of one host may
// pass it over NCCL instead (device_links.h, decided after planning). No
// cut avoids it (a model's activations are alike), nor do more workers:
// FAILED_PRECONDITION (the workers' flag), not RESOURCE_EXHAUSTED, which
// placement takes for memory and retries.
absl::Status CheckActivationSends(const ModelProfile& planned, const ClusterSpec& replica,
                                  const SolvedPlan& solved, bool fused_embedding_sync) {
  const int units = static_cast<int>(planned.units.size());
  int unit = -1;
  size_t stage = 0;
  bool gradient = false;
  auto consider = [&](int u, size_t s, bool grad) {
    if (unit < 0 || planned.units[u].activation_bytes > planned.units[unit].activation_bytes) {
      unit = u, stage = s, gradient = grad;
    }
  };
  for (size_t s = 0; s < solved.forward.size(); ++s) {
    const Range& f = solved.forward[s];
    const Range& b = solved.backward[s];
    if (f.begin < f.end && f.end < units) consider(f.end - 1, s, false);
    if (b.begin < b.end && b.begin > 0) consider(b.begin - 1, s, true);
  }
  if (unit >= 0 && planned.units[unit].activation_bytes > MaxPlannedTensorBytes(replica)) {
    const UnitProfile& u = planned.units[unit];
    const std::string what =
        gradient ? absl::StrCat("the gradient of unit ", unit, "'s (", u.name, ") output")
                 : absl::StrCat("the output of unit ", unit, " (", u.name, ")");
    return absl::FailedPreconditionError(absl::StrCat(
        "stage ", stage, " would send ", what, " as one tensor of ",
        BytesAndGiB(u.activation_bytes), " per micro-batch, above ", TensorLimitText(replica),
        "; raise the workers' --mailbox-limit above it, or make the micro-batches smaller "
        "(more spec.training.micro_batches)"));
  }
  // And the tied wte gradient (TIED_EMBEDDING_GRAD, one tensor rank's
  // vocab x dModel share, TiedGradientBytes), which the stages holding
  // embed's and head's backward swap each step (schedule_compiler.cc
  // EndOfIteration) unless the replicas' sync is fused: no cut that keeps
  // them apart avoids it.
  int embed_owner = -1, head_owner = -1;
  for (size_t s = 0; s < solved.backward.size(); ++s) {
    const Range& b = solved.backward[s];
    if (b.begin <= 0 && 0 < b.end) embed_owner = static_cast<int>(s);
    if (b.begin <= units - 1 && units - 1 < b.end) head_owner = static_cast<int>(s);
  }
  const double tied = TiedGradientBytes(planned);
  if (!fused_embedding_sync && embed_owner >= 0 && head_owner >= 0 && embed_owner != head_owner &&
      tied > MaxPlannedTensorBytes(replica)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stages ", embed_owner, " and ", head_owner,
        " would exchange the tied embedding's gradient as one tensor of ", BytesAndGiB(tied),
        " each step, above ", TensorLimitText(replica),
        "; raise the workers' --mailbox-limit above it, or keep embed and head on one stage"));
  }
  return absl::OkStatus();
}

}  // namespace

PlanningWork EstimatePlanningWork(const ResolvedJobSpec& r) {
  const double units = 2.0 * r.train.model.n_layer + 2;
  if (r.data_parallel == kDataParallelAuto) {
    // Every layout of the workers is planned, and a recovery plans the
    // layouts of fewer workers again: the count with the most work, which
    // need not be the largest (264 workers have seven layouts where 265
    // have one).
    PlanningWork most;
    for (int workers = 1; workers <= r.layout_workers; ++workers) {
      PlanningWork total;
      for (const LayoutDegrees& degrees : AutoLayoutDegrees(r.spec, workers)) {
        ResolvedJobSpec layout = r;
        layout.data_parallel = degrees.data_parallel;
        layout.stages = degrees.stages;
        layout.tensor_parallel = degrees.tensor_parallel;
        const PlanningWork work = EstimatePlanningWork(layout);
        total.solver_steps += work.solver_steps;
        total.stage_micro_batches = std::max(total.stage_micro_batches, work.stage_micro_batches);
      }
      most.solver_steps = std::max(most.solver_steps, total.solver_steps);
      most.stage_micro_batches = std::max(most.stage_micro_batches, total.stage_micro_batches);
    }
    return most;
  }
  // An elastic job plans again on more stages than it starts with, up to
  // spec.elastic.max_workers (growing onto spare workers, a recovery): the
  // budget holds for the largest plan it may take, not only its first.
  const int stages = std::max(r.stages, r.spec.elastic().max_workers());
  PlanningWork work;
  work.solver_steps = SolverSteps(r.solver, stages, units);
  work.stage_micro_batches =
      static_cast<int64_t>(stages) * (r.train.micro_batches + EvalMicroBatches(r));
  return work;
}

absl::Status CheckPlanningBudget(const ResolvedJobSpec& r) {
  const PlanningWork work = EstimatePlanningWork(r);
  const bool grows =
      r.data_parallel != kDataParallelAuto && r.spec.elastic().max_workers() > r.stages;
  const std::string stages =
      r.data_parallel == kDataParallelAuto
          ? absl::StrCat("the layouts of up to ", r.layout_workers,
                         " workers (spec.parallelism.data 0; a recovery plans those of fewer)")
      : grows ? absl::StrCat(r.spec.elastic().max_workers(), " stages (spec.elastic.max_workers)")
              : absl::StrCat(r.stages, " stages");
  if (work.solver_steps > kMaxSolverSteps) {
    // Only solvers cheaper than the one asked for are advice.
    const std::string cheaper = r.solver == kSolverUniform     ? ""
                                : r.solver == kSolverPipeDream ? "solver uniform, or "
                                                               : "solver pipedream or uniform, or ";
    return absl::ResourceExhaustedError(absl::StrCat(
        "spec.parallelism: solver ", r.solver, " for ", stages, " of ",
        2 * r.train.model.n_layer + 2, " units needs about ", work.solver_steps,
        " steps, above the coordinator's planning budget of ", kMaxSolverSteps, "; use ", cheaper,
        "fewer stages", grows ? " (a lower spec.elastic.max_workers)" : ""));
  }
  if (work.stage_micro_batches > kMaxStageMicroBatches) {
    // Named by the larger part: eval_windows of 65536 (within its bound)
    // was refused naming micro_batches.
    const bool validation = EvalMicroBatches(r) > r.train.micro_batches;
    return absl::ResourceExhaustedError(absl::StrCat(
        validation ? "spec.training.eval_windows: " : "spec.training.micro_batches: ", stages,
        " x (", r.train.micro_batches, " micro-batches + ", EvalMicroBatches(r),
        " validation micro-batches) = ", work.stage_micro_batches,
        " exceeds the planning budget of ", kMaxStageMicroBatches,
        "; use fewer (larger) micro-batches or validation windows",
        grows ? ", or a lower spec.elastic.max_workers" : ""));
  }
  return absl::OkStatus();
}

double CpuSteppedWeightCopies(const ResolvedJobSpec& r) {
  const int replicas = std::max(1, r.data_parallel);
  const int tensor = std::max(1, r.tensor_parallel);
  const bool dp_compressed =
      replicas > 1 && (r.data_parallel_powersgd_rank > 0 || !r.data_parallel_quantizer.empty());
  // Data-parallel compression keeps one residual per gradient between
  // steps (each rank its shards').
  double copies = dp_compressed ? 1 : 0;
  if (r.spec.checkpoint().interval_steps() > 0) {
    // Each stage's writer (replica 0, tensor rank 0) snapshots its weights
    // and both moments while a checkpoint is written, and with compression
    // every replica's residuals (their sum past kMaxFeedbackReplicasKept);
    // rank 0 gathers its stage's ranks'. Budgeted for every position: the
    // replicas' least memory plans them.
    const int residuals = !dp_compressed ? 0 : replicas <= kMaxFeedbackReplicasKept ? replicas : 1;
    copies += static_cast<double>(tensor) * (3 + residuals);
    // With tensor ranks the residuals of the writer's own shards arrive in
    // one buffer (GatherReplicaFeedback), held beside their unsplit copies
    // through the snapshot, and after it wherever a tensor held whole keeps
    // a view of it: 1 per residual kept.
    if (tensor > 1) copies += residuals;
  }
  if (tensor > 1 && !r.spec.output().weights_path().empty()) {
    // After the last step, rank 0 (replica 0's) gathers its stage's sharded
    // parameters unsplit for the final weights' upload, T times its shards
    // beside them (UnsplitParameterCopies), while the previous step's
    // checkpoint may still be written from its snapshot. Unbudgeted, a plan
    // packed to its limit could be killed at the end, losing the run.
    copies += tensor;
  }
  if (tensor > 1 && !r.spec.init().from().empty()) {
    // Each rank reads its stage's tensors of spec.init.from unsplit (T
    // shards' worth) before it keeps its own shard of each: before the
    // first step, when none of the copies above is held yet (no snapshot,
    // no residual), so the most of the two.
    copies = std::max(copies, static_cast<double>(tensor));
  }
  return copies;
}

absl::StatusOr<CompiledPlan> PlanJob(const ResolvedJobSpec& r, const std::string& job_id,
                                     int64_t version, const ModelProfile& profile,
                                     const ClusterSpec& measured_cluster,
                                     const std::string& profile_source) {
  const int replicas = std::max(1, r.data_parallel);
  const int tensor = std::max(1, r.tensor_parallel);
  // Workers of a stage position compute in lockstep: where they share too
  // few cores, their compute takes longer than the profile measured alone
  // (host_sharing.h), and so does the data plane's work beside it: the
  // links the plan models carry that cost (data_plane_cost.h).
  const ComputeStretch stretch =
      LockstepComputeStretch(measured_cluster, replicas, r.stages, tensor);
  ClusterSpec cluster = measured_cluster;
  AddDataPlaneCost(stretch.factor, &cluster);
  if (static_cast<int>(cluster.workers.size()) != r.stages * replicas * tensor) {
    return absl::InvalidArgumentError(absl::StrCat(cluster.workers.size(), " workers for ",
                                                   replicas, " replicas of ", r.stages,
                                                   " stages of ", tensor, " tensor ranks"));
  }
  RETURN_IF_ERROR(CheckReplicaDevices(cluster, replicas, r.stages, tensor));
  if (r.train.micro_batches % replicas != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.training.micro_batches: ", r.train.micro_batches, " not divisible by ",
                     replicas, " replicas"));
  }
  // One replica's plan serves all: position s gets the slowest speed and
  // the least memory among the replicas' workers there, so the plan fits
  // and its prediction holds for the slowest replica (replicas wait for
  // each other in the gradient all-reduce).
  // Tensor parallelism: a stage's ranks plan as one worker (the slowest).
  // Every replica and tensor rank makes the plan's sends: the smallest
  // mailbox among all the job's workers bounds them (the merged clusters
  // keep workers and links only).
  ClusterSpec replica = ReplicaStageCluster(TensorGroupCluster(cluster, tensor), replicas);
  replica.mailbox_limit_bytes = cluster.mailbox_limit_bytes;
  PlanOptions options;
  options.solver = r.solver;
  options.objective = r.objective;
  options.micro_batches = r.train.micro_batches / replicas;  // each replica's share
  options.data_parallel = replicas;
  options.cpu_stepped_weight_copies = CpuSteppedWeightCopies(r);
  ASSIGN_OR_RETURN(options.schedule, ParseSchedule(r.schedule));
  for (const v1::ManualStage& s : r.spec.parallelism().manual_stages()) {
    options.manual_forward.push_back({s.forward_begin(), s.forward_end()});
    options.manual_backward.push_back({s.backward_begin(), s.backward_end()});
  }
  // The lockstep stretch applies to compute only: the collectives' waits
  // are not stretched (their data plane's share is in the link), so this
  // comes before the tensor-parallel costs add them.
  const ModelProfile computed = StretchCompute(profile, stretch.factor);
  // Tensor parallelism: AccTFM's partitions per unit (the job's count, or
  // Alg. 1's choice), then each unit's cost on one rank of its group. Its
  // all-reduces overlap the group's compute, not the profiler's: both are
  // timed with the compute at the groups' speed (the slowest position's,
  // where they differ), and the waits stay out of the speed scaling
  // (TensorParallelCostsOf's comm seconds).
  const double group_speed = SlowestSpeed(replica);
  const ModelProfile at_group_speed = StretchCompute(computed, 1 / group_speed);
  std::vector<int> partitions_forward, partitions_backward;
  ModelProfile planned = computed;
  std::vector<TensorParallelUnitLanes> tensor_passes;  // for the timeline
  if (tensor > 1 && r.tensor_mode == "3d") {
    // A p x p x p cube per stage: no AccTFM partitions and no compression
    // (the spec refuses them), the cube's collectives fully exposed.
    partitions_forward.assign(computed.units.size(), 1);
    partitions_backward = partitions_forward;
    const int64_t samples = int64_t{r.train.batch_size} / r.train.micro_batches;
    ASSIGN_OR_RETURN(
        tensor_passes,
        CubeTensorParallelUnitPasses(at_group_speed, tensor, samples, r.train.seq_len,
                                     r.train.model.d_model, r.train.model.n_head,
                                     cluster.bandwidth_bytes_per_second, cluster.latency_seconds));
    planned = TensorParallelCostsOf(computed, tensor, tensor_passes, group_speed);
  } else if (tensor > 1) {
    // AccTFM's hybrid compression shrinks the block units' all-reduces.
    const int64_t tokens = int64_t{r.train.batch_size} / r.train.micro_batches * r.train.seq_len;
    ASSIGN_OR_RETURN(const double wire_fraction,
                     TensorParallelWireFraction(r.tensor_compression, tokens, r.train.seq_len,
                                                r.train.model.d_model));
    // And its coding takes CPU time, as the profile measured the codec:
    // CPU work of the group's, so at its speed like the compute the
    // all-reduces overlap (then, in the waits, not divided again).
    ASSIGN_OR_RETURN(
        const double measured_coding,
        TensorParallelCodingSecondsPerByte(r.tensor_compression, r.train.seq_len, profile));
    const double coding = measured_coding / group_speed;
    // Through a codec the block units' all-reduces run the ring; without
    // one, as Collectives::AllReduce chooses by size.
    ASSIGN_OR_RETURN(const bool encoded, TensorParallelEncoded(r.tensor_compression));
    // A fixed count splits the block units; embed and head are never
    // partitioned (1), as in Alg. 1's choice.
    partitions_forward.assign(computed.units.size(), 1);
    for (size_t u = 0; u < computed.units.size(); ++u) {
      if (IsTensorParallelBlockUnit(computed.units[u])) {
        partitions_forward[u] = std::max(1, r.tensor_partitions);
      }
    }
    partitions_backward = partitions_forward;
    if (r.tensor_partitions == 0) {
      ASSIGN_OR_RETURN(
          TensorPartitionPlan chosen,
          ChooseTensorPartitions(at_group_speed, tensor, cluster.bandwidth_bytes_per_second,
                                 cluster.latency_seconds, wire_fraction, coding, encoded));
      partitions_forward = chosen.forward;
      partitions_backward = chosen.backward;
    }
    // A micro-batch of `samples` runs gcd(K, samples) partitions
    // (Unit::TensorParallelPartitions: a partition is whole samples):
    // priced and recorded as the workers run them. Alg. 1 above chose
    // among 1, 2 and 4 without this cut, which only binds for micro-batches
    // of fewer than 4 samples (or 6, 10, ...).
    const int samples = r.train.batch_size / r.train.micro_batches;
    for (std::vector<int>* counts : {&partitions_forward, &partitions_backward}) {
      for (int& k : *counts) k = std::gcd(k, samples);
    }
    ASSIGN_OR_RETURN(tensor_passes,
                     TensorParallelUnitPasses(at_group_speed, tensor, partitions_forward,
                                              partitions_backward,
                                              cluster.bandwidth_bytes_per_second,
                                              cluster.latency_seconds, wire_fraction, coding,
                                              encoded, tokens));
    planned = TensorParallelCostsOf(computed, tensor, tensor_passes, group_speed);
  }
  // Stage positions on one host's cores also take from each other where
  // their compute overlaps (host_sharing.h): the prediction and the
  // timeline come from that simulation, and so does auto's choice among
  // the solvers. It runs the programs as workers get them, with
  // spec.compression's codecs on their sends (their bytes shrunk by each
  // codec's wire fraction).
  SimulationCosts costs = SimulationCostsFromProfile(planned, replica, TiedGradientBytes(planned));
  costs.data_parallel = replicas;
  // Clipping holds every stage's step for the stages' norm exchange, after
  // the tensor ranks' own round on their link (simulator.h).
  costs.grad_clip = r.train.grad_clip > 0;
  if (costs.grad_clip && tensor > 1) costs.grad_clip_tensor_seconds = cluster.latency_seconds;
  ASSIGN_OR_RETURN(
      costs.codec_wire_fraction,
      LinkCodecWireFractions(r.spec.compression(), r.train.batch_size / r.train.micro_batches,
                             r.train.seq_len, r.train.model.d_model));
  // The share of the units' costs that is compute (the rest: tensor-
  // parallel all-reduces waited for), at the groups' speed.
  double compute = 0, total = 0;
  for (size_t u = 0; u < planned.units.size(); ++u) {
    const UnitProfile& unit = planned.units[u];
    compute += (at_group_speed.units[u].fwd_seconds + at_group_speed.units[u].bwd_seconds) / tensor;
    total += (unit.fwd_seconds + unit.bwd_seconds) / group_speed + unit.fwd_comm_seconds +
             unit.bwd_comm_seconds;
  }
  const double compute_share = tensor > 1 && total > 0 ? std::min(1.0, compute / total) : 1.0;
  // The programs as the workers get them: the tied embedding's sync fused
  // (priced as eq. 16's one all-reduce, not eq. 15's exchange and ring),
  // and the links' codecs marked.
  const bool fuse_sync = replicas > 1 && r.spec.parallelism().fused_embedding_sync();
  const auto as_run =
      [&](const std::vector<v1::Program>& programs) -> absl::StatusOr<std::vector<v1::Program>> {
    std::vector<v1::Program> out = programs;
    if (fuse_sync) RETURN_IF_ERROR(FuseEmbeddingSyncOfPrograms(&out).status());
    MarkCompression(r.spec.compression(), &out);
    return out;
  };
  options.simulate =
      [&](const std::vector<v1::Program>& programs) -> absl::StatusOr<SimulationResult> {
    ASSIGN_OR_RETURN(const std::vector<v1::Program> run, as_run(programs));
    return SimulateWithSharedCores(run, costs, cluster, replicas, r.stages, tensor, stretch.factor,
                                   compute_share, nullptr);
  };
  ASSIGN_OR_RETURN(SolvedPlan solved, SolvePlan(planned, replica, options));
  RETURN_IF_ERROR(CheckWeightSyncs(r, planned, replica, solved));
  RETURN_IF_ERROR(CheckActivationSends(planned, replica, solved, fuse_sync));
  double overlap_stretch = 1;
  std::vector<int> dp_compressed_stages;  // selective stage compression's
  {
    ASSIGN_OR_RETURN(const std::vector<v1::Program> compressed, as_run(solved.programs));
    ASSIGN_OR_RETURN(solved.simulation,
                     SimulateWithSharedCores(compressed, costs, cluster, replicas, r.stages, tensor,
                                             stretch.factor, compute_share, &overlap_stretch));
    if (r.data_parallel_powersgd_rank > 0 || !r.data_parallel_quantizer.empty()) {
      // Selective stage compression: the stages named, or those whose
      // all-reduce the simulation puts on the critical path; then the
      // prediction with their all-reduces' bytes shrunk to PowerSGD's or
      // the quantizer's.
      std::vector<double> fractions;
      if (r.data_parallel_powersgd_rank > 0) {
        // Each tensor rank compresses its own shards. A 3-D cube's blocks
        // ([N / p, K / p^2] weights, vectors on its diagonal) are not 1-D
        // splits: those are still priced as whole matrices, which
        // under-counts what their ranks send.
        const int split_ranks = r.tensor_mode == "3d" ? 1 : tensor;
        fractions = PowerSgdByteFractions(r.train.model, solved.backward,
                                          r.data_parallel_powersgd_rank, split_ranks);
      } else {
        ASSIGN_OR_RETURN(const std::unique_ptr<Codec> codec, MakeCodec(r.data_parallel_quantizer));
        fractions = QuantizerByteFractions(r.train.model, solved.backward, *codec);
      }
      // The codec's own CPU time per byte, as the profile measured it, on
      // the lane and, where the host has no core to spare, taken from
      // compute (simulator.h).
      const double cpu_per_byte =
          r.data_parallel_quantizer.empty()
              ? PowerSgdAllReduceSecondsPerByte(profile, r.data_parallel_powersgd_rank)
              : QuantizedAllReduceSecondsPerByte(profile, r.data_parallel_quantizer);
      const std::vector<bool> no_spare_core =
          PositionsWithoutSpareCore(cluster, replicas, r.stages, tensor);
      auto simulate = [&](const std::vector<int>& stages) {
        SimulationCosts trial = costs;
        trial.all_reduce_byte_fraction.assign(r.stages, 1.0);
        trial.all_reduce_cpu_seconds_per_byte.assign(r.stages, 0.0);
        trial.all_reduce_cpu_shared = no_spare_core;
        for (int s : stages) {
          trial.all_reduce_byte_fraction[s] = fractions[s];
          trial.all_reduce_cpu_seconds_per_byte[s] = cpu_per_byte;
        }
        return SimulateWithSharedCores(compressed, trial, cluster, replicas, r.stages, tensor,
                                       stretch.factor, compute_share, &overlap_stretch);
      };
      for (int s : r.spec.compression().data_parallel().stages()) {
        if (s < r.stages) dp_compressed_stages.push_back(s);  // a re-plan onto fewer drops the rest
      }
      if (r.spec.compression().data_parallel().stages().empty()) {
        ASSIGN_OR_RETURN(const CompressedStages chosen,
                         ChooseCompressedStages(simulate, fractions));
        dp_compressed_stages = chosen.stages;
      }
      // Once more for the chosen stages: the greedy's last trial may have
      // been one it did not keep (and overlap_stretch is the last call's).
      ASSIGN_OR_RETURN(solved.simulation, simulate(dp_compressed_stages));
    }
    solved.all_reduce_seconds = solved.simulation.all_reduce_seconds;
  }
  // The groups' all-reduces on their own lane of the timeline.
  TensorParallelLanesDrawn lanes_drawn;
  if (!tensor_passes.empty()) {
    lanes_drawn = AddTensorParallelLanes(tensor_passes, &solved.simulation);
  }
  CompiledPlan out;
  out.programs = std::move(solved.programs);
  if (replicas > 1 && r.spec.parallelism().fused_embedding_sync()) {
    ASSIGN_OR_RETURN(const bool fused, FuseEmbeddingSync(solved.backward, &out.programs));
    (void)fused;  // one owner: nothing to fuse
  }
  MarkCompression(r.spec.compression(), &out.programs);
  if (r.train.eval_interval > 0) {
    // Workers skip the micro-batches beyond the validation windows their
    // dataset has (all hold the same dataset, so they skip the same ones).
    const int per = r.train.batch_size / r.train.micro_batches;
    const int eval_micro_batches = (r.train.eval_windows + per - 1) / per;
    ASSIGN_OR_RETURN(out.eval_programs,
                     CompileEvalPrograms(solved.forward, static_cast<int>(profile.units.size()),
                                         eval_micro_batches));
    // Validation activations go raw; this names that on their receives.
    MarkCompression(r.spec.compression(), &out.eval_programs);
  }
  v1::Plan& plan = out.plan;
  plan.set_job_id(job_id);
  plan.set_version(version);
  plan.set_solver(solved.solver);
  plan.set_objective(solved.objective);
  plan.set_schedule(r.schedule);
  plan.set_micro_batches(options.micro_batches);
  plan.set_data_parallel(replicas);
  plan.set_tensor_parallel(tensor);
  for (int k : partitions_forward) plan.add_tensor_partitions_forward(k);
  for (int k : partitions_backward) plan.add_tensor_partitions_backward(k);
  if (r.data_parallel_powersgd_rank > 0 || !r.data_parallel_quantizer.empty()) {
    for (int s : dp_compressed_stages) plan.add_data_parallel_compressed_stages(s);
    plan.set_data_parallel_powersgd_rank(r.data_parallel_powersgd_rank);
    plan.set_data_parallel_quantizer(r.data_parallel_quantizer);
  }
  std::vector<std::string> names;  // the timeline's lanes: each stage's workers
  for (const WorkerSpec& w : replica.workers) names.push_back(w.name);
  for (size_t g = 0; g < cluster.workers.size(); ++g) {
    const int s = static_cast<int>(g) / tensor % r.stages;  // tensor rank innermost
    v1::PlanStage* stage = plan.add_stages();
    stage->set_worker_id(cluster.workers[g].name);
    *stage->mutable_forward() = ToUnitRange(solved.forward[s]);
    *stage->mutable_backward() = ToUnitRange(solved.backward[s]);
    const SimulationResult& sim = solved.simulation;
    if (static_cast<size_t>(s) < sim.busy_seconds.size() &&
        static_cast<size_t>(s) < sim.idle_seconds.size()) {
      stage->set_predicted_busy_seconds(sim.busy_seconds[s]);
      stage->set_predicted_idle_seconds(sim.idle_seconds[s]);
    }
  }
  plan.set_bottleneck_seconds(solved.bottleneck_seconds);
  plan.set_predicted_iteration_seconds(solved.simulation.iteration_seconds);
  plan.set_bubble_fraction(solved.simulation.bubble_fraction);
  plan.set_solve_seconds(solved.solve_seconds);
  plan.set_profile_source(absl::StrCat(
      profile_source, "; links modelled at ", measured_cluster.bandwidth_bytes_per_second / 1e9,
      " GB/s and ", measured_cluster.latency_seconds * 1e6, " us latency",
      measured_cluster.links_origin.empty() ? "" : " (" + measured_cluster.links_origin + ")",
      DescribeDataPlaneCost(measured_cluster, stretch.factor), DescribeComputeStretch(stretch),
      overlap_stretch > 1.005
          ? absl::StrFormat("; stages computing at once on shared cores: up to x%.2f",
                            overlap_stretch)
          : ""));
  TimelineSvgOptions svg;
  svg.title = absl::StrCat("job ", job_id, ": ", solved.solver, " plan, predicted iteration");
  if (lanes_drawn.micro_batches_drawn < lanes_drawn.micro_batches) {
    absl::StrAppend(&svg.title, "; tensor-parallel all-reduces drawn for the first ",
                    lanes_drawn.micro_batches_drawn, " of ", lanes_drawn.micro_batches,
                    " micro-batches");
  }
  plan.set_timeline_svg(TimelineSvg(solved.simulation, names, svg));
  plan.set_chrome_trace_json(ChromeTraceJson(solved.simulation, names));
  for (const auto& [solver, seconds] : solved.candidates)
    (*plan.mutable_candidates())[solver] = seconds;
  for (const auto& [solver, why] : solved.candidates_skipped)
    (*plan.mutable_candidates_skipped())[solver] = why;
  return out;
}

}  // namespace pipetrain
