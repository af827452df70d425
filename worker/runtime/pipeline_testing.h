// Test harness shared by the pipeline equivalence tests (testonly): the
// single-process reference run and an in-process pipeline run of the same
// training config, each for kIterations steps with validation passes, and
// what they produced (losses, validation losses, every weight copy).
#ifndef PIPETRAIN_WORKER_RUNTIME_PIPELINE_TESTING_H_
#define PIPETRAIN_WORKER_RUNTIME_PIPELINE_TESTING_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "coordinator/planner/device_links.h"
#include "coordinator/planner/partition.h"
#include "coordinator/planner/schedule_compiler.h"
#include "worker/checkpoint/unit_checkpoint.h"
#include "worker/data/dataset.h"
#include "worker/model/backend.h"
#include "worker/model/cpu_backend.h"
#include "worker/train/train_config.h"

namespace pipetrain {
namespace testing {

constexpr int kIterations = 10;

// 2 layers, d_model 32, seq 16, batch 8 in 4 micro-batches, validation every
// 4 steps over 7 windows.
TrainConfig SmallConfig();
// Generated English text, seq 16, 10% validation.
Dataset MakeDataset();
// `c` as the parallel equivalence tests train it: gradients clipped on
// every step (global norm 0.05), 3 warm-up steps then cosine decay to
// lr / 10.
TrainConfig WithClippingAndCosine(TrainConfig c);

// A checkpoint of a whole pipeline: every backward unit's Snapshot (the
// unsplit tensors and moments) by unit, after `step` steps.
struct PipelineCheckpoint {
  int64_t step = 0;
  int64_t optimizer_steps = 0;
  std::map<int, UnitState> units;
};

struct RunOutput {
  std::vector<float> losses;
  std::vector<float> val_losses;
  std::map<std::string, std::vector<float>> weights;  // every copy must agree
  // With device_members: tensors that went device to device, and the
  // stages in a device group.
  int64_t device_tensors = 0;
  std::vector<int> grouped_stages;
  // With replica_device_collectives: the sums the hubs carried (once per
  // sum, not per member).
  int64_t device_sums = 0;
  // Collectives of every runtime over the whole run, by purpose
  // (IterationResult::collectives).
  std::map<std::string, int64_t> collectives;
  std::map<std::string, int64_t> collective_bytes;  // wire bytes
  PipelineCheckpoint checkpoint;                    // with PipelineExtras::snapshot_after
  // Busy seconds of every runtime over the whole run, by phase
  // (IterationResult::phase_seconds).
  std::map<std::string, double> phase_seconds;
  // With PipelineExtras::traced_iteration: every runtime's trace of it and
  // the program it ran, by runtime.
  std::vector<v1::StepTrace> traces;
  std::vector<v1::Program> programs;
  // By runtime ((replica * stages + stage) * T + tensor rank): the AccTFM
  // partition counts of its last iteration (IterationResult
  // ::tensor_partitions; empty without partition tuning).
  std::vector<std::map<std::string, std::pair<int, int>>> last_partitions;
  // By runtime, as last_partitions: the most IterationResult::
  // activation_bytes_peak of any of its iterations.
  std::vector<int64_t> activation_bytes_peak;
};

// Expects `pipe` to equal `local` as data_parallel_testing.h defines it:
// losses and validation losses (3 passes, after steps 4, 8 and 10) within
// kDataParallelRelative, weights within `weights_relative` of each
// tensor's largest magnitude (the key bias to Adam's bound). `what` names
// the run in failures.
void ExpectRunMatchesLocal(const TrainConfig& c, const RunOutput& pipe, const RunOutput& local,
                           const std::string& what, double weights_relative);

// `resumed`, a run from a checkpoint after `step` steps (PipelineExtras::
// resume), against `whole`, a run of all kIterations steps: its losses and
// validation losses must be whole's after `step`, and its final weights
// whole's; bitwise when `weights_relative` is 0, else as
// ExpectRunMatchesLocal.
void ExpectResumedMatches(const TrainConfig& c, const RunOutput& resumed, const RunOutput& whole,
                          int step, const std::string& what, double weights_relative);

// LocalTrainer on `backend` for `iterations` steps.
RunOutput RunLocal(const TrainConfig& c, const Dataset& data, Backend* backend = CpuBackend(),
                   int iterations = kIterations);

// Data parallelism and its options for RunPipeline.
struct PipelineExtras {
  int replicas = 1;
  bool fuse_embedding_sync = false;  // rewrite as the coordinator does
  // Selective stage compression: these stages' data-parallel all-reduce
  // with PowerSGD of this rank (StageSetup).
  int dp_powersgd_rank = 0;
  std::string dp_quantizer;  // or this quantizer (StageSetup::data_parallel_quantizer)
  std::vector<int> dp_compressed_stages;
  int64_t dp_bucket_bytes = 0;  // > 0: StageSetup::data_parallel_bucket_bytes
  int max_feedback_replicas = 0;  // > 0: StageSetup::max_feedback_replicas
  int iterations = kIterations;
  // Tensor parallelism: every stage split across this many runtimes
  // (StageSetup::tensor_rank); the weights are gathered into the unsplit
  // tensors, and every tensor rank must report the same losses.
  int tensor_parallel = 1;
  std::string tensor_mode = "1d";  // StageSetup::tensor_mode ("3d": T = p^3)
  int tensor_partitions = 1;       // StageSetup::tensor_partitions
  std::vector<int> tensor_partitions_forward, tensor_partitions_backward;  // per unit
  int tensor_partition_tune_steps = 0;  // StageSetup::tensor_partition_tune_steps
  // The stages' links compressed as spec.compression says (MarkCompression,
  // as the coordinator marks the programs); empty: none.
  std::string forward_codec, backward_codec;
  // > 0: after this many steps every runtime of replica 0 that owns units
  // takes a Snapshot (its tensor ranks gather theirs, and every rank's copy
  // must agree bitwise), and with compressed data-parallel gradients the
  // other replicas' runtimes too (they send their error feedback and keep
  // nothing); RunOutput::checkpoint holds them.
  int snapshot_after = 0;
  // Non-null: every runtime first Restores the units it holds from it, and
  // the run trains steps resume->step .. iterations - 1 (losses and
  // validation passes of those only).
  const PipelineCheckpoint* resume = nullptr;
  // >= 0: every runtime traces this iteration (RunIteration's trace);
  // RunOutput::traces holds them.
  int64_t traced_iteration = -1;
  // With replicas > 1: each stage (at each tensor rank) not in
  // dp_compressed_stages sums its gradients through a collective of one
  // InProcessCollectiveHub of its replicas (StageSetup::device_collective),
  // as the GPUs of a ReplicaDeviceGroup would.
  bool replica_device_collectives = false;
};

// The pipeline of forward/backward ranges, one StageRuntime per stage on its
// own thread over an in-process fabric; stage s computes on backend_of(s)
// (the CPU when null). With `device_members` (one per stage), the training
// programs are marked by the coordinator's PlanDeviceLinks and the stages
// of its groups get channels of one InProcessDeviceHub for their
// LINK_PATH_DEVICE instructions. With `replicas` > 1 (data parallelism,
// StageSetup::replica) there are replicas x stages runtimes: replica r's
// stage s is transport stage r * stages + s, runs the replica's program of
// c.micro_batches / replicas micro-batches, and backend_of and
// device_members index the replica's stage s. The losses are assembled in
// the step's micro-batch order, and every copy of every weight, on every
// replica, must agree bitwise. With extras.tensor_parallel T > 1 each
// stage runs on T runtimes, tensor rank innermost (runtime (r * stages +
// s) * T + t), and device_members must be null. Failures are reported as
// test failures (EXPECT). `extras` as PipelineExtras says.
RunOutput RunPipeline(const TrainConfig& c, const Dataset& data, const std::vector<Range>& forward,
                      const std::vector<Range>& backward, Schedule schedule,
                      const std::function<Backend*(int stage)>& backend_of = nullptr,
                      const std::vector<DeviceLinkMember>* device_members = nullptr,
                      const PipelineExtras& extras = {});

}  // namespace testing
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_RUNTIME_PIPELINE_TESTING_H_
