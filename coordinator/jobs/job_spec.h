// A submitted JobSpec resolved into the configuration a pipeline job runs
// with: every default documented in proto/pipetrain/v1/job.proto made
// explicit, every field validated, and the single-process trainer's
// TrainConfig derived from it.
//
// Every rejection is INVALID_ARGUMENT whose message starts with the proto
// path of the offending field ("spec.training.micro_batches: ..."), so the
// REST and gRPC front ends can return it verbatim. All functions here are
// thread-safe: they share no state.
#ifndef PIPETRAIN_COORDINATOR_JOBS_JOB_SPEC_H_
#define PIPETRAIN_COORDINATOR_JOBS_JOB_SPEC_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kernels/compress/codec_spec.h"
#include "proto/pipetrain/v1/job.pb.h"
#include "worker/data/token_file.h"
#include "worker/train/train_config.h"

namespace pipetrain {

// Accepted values of spec.parallelism.solver and .schedule.
inline constexpr char kSolverUniform[] = "uniform";
inline constexpr char kSolverPipeDream[] = "pipedream";
inline constexpr char kSolverBiPartition[] = "bipartition";
inline constexpr char kSolverAuto[] = "auto";
inline constexpr char kSolverManual[] = "manual";
inline constexpr char kObjectivePaper[] = "paper";
inline constexpr char kObjectiveFull[] = "full";
inline constexpr char kSchedule1F1B[] = "1f1b";
inline constexpr char kScheduleGPipe[] = "gpipe";
// spec.compression.forward/backward "send raw fp32" is kCodecNone
// (kernels/compress/codec_spec.h).

// A JobSpec with every default filled in, plus the configs derived from it.
struct ResolvedJobSpec {
  // Defaults made explicit: has_* is true for every optional field, and data
  // is always present.
  v1::JobSpec spec;
  // Model, hyperparameters and evaluation; threads keeps TrainConfig's
  // default (a JobSpec does not set it).
  TrainConfig train;
  DataFormat data_format = DataFormat::kAuto;  // parsed spec.data.format
  double val_fraction = 0;                     // spec.data.val_fraction
  int64_t synthetic_bytes = 0;                 // spec.data.synthetic_bytes (path empty)
  int stages = 0;                              // spec.parallelism.stages
  std::string solver;     // uniform | pipedream | bipartition | auto | manual
  std::string objective;  // paper | full
  std::string schedule;                        // "1f1b" | "gpipe"
};

// Fills the defaults of job.proto and validates `spec`.
//
// Defaults: model.vocab_size 256, model.max_seq_len = training.seq_len,
// data.format "auto", data.val_fraction 0.1, data.synthetic_bytes 2000000,
// training.micro_batches 1, lr 3e-4, beta1 0.9, beta2 0.95, eps 1e-8,
// weight_decay 0.1, decay "matrices", seed 1, eval_interval 0 (never),
// eval_windows 16, parallelism.solver "uniform",
// parallelism.schedule "1f1b", parallelism.objective "paper",
// compression.forward and .backward "none" (an empty codec too),
// compression.error_feedback and .epilogue_only false.
//
// Compression: forward and backward are "none" or a codec spec that
// kernels/compress/codec_spec.h accepts (its message, naming the codec
// parameter, follows the field path: "spec.compression.backward: powersgd:
// rank 0 is out of range ..."); error_feedback and epilogue_only need a
// backward codec.
//
// Solver "manual" requires one manual_stages entry per stage whose forward
// ranges, and separately backward ranges, follow each other from unit 0 to
// the last unit, no stage with both empty; other solvers reject
// manual_stages.
//
// Required: model (n_layer, n_head, d_model >= 1, n_head divides d_model),
// training (seq_len, batch_size, steps >= 1), parallelism (1 <= stages <=
// 2 * n_layer + 2 units).
//
// Filesystem checks: a non-empty spec.data.path must name a readable regular
// file, and the directory of a non-empty spec.output.weights_path must exist.
// Both are checked on the coordinator's own filesystem, which it shares with
// the local workers that read the corpus (`pipetrain up`); a remote worker on
// another filesystem may still fail later when it loads the file.
//
// Errors: INVALID_ARGUMENT, message "<proto path>: <what is wrong>", e.g.
// "spec.training.micro_batches: 3 must divide spec.training.batch_size 8".
// The first violation found is reported.
absl::StatusOr<ResolvedJobSpec> ResolveJobSpec(const v1::JobSpec& spec);

// Parses a JobSpec from proto3 canonical JSON; lowerCamel ("nLayer") and
// original ("n_layer") field names are both accepted, as are the strings
// "NaN"/"Infinity" for floats (ResolveJobSpec rejects them). Only parses: the
// result is not validated.
// Errors: INVALID_ARGUMENT "spec: <protobuf's parser message>" for malformed
// JSON, unknown fields and values of the wrong type (the parser's message
// names the field).
absl::StatusOr<v1::JobSpec> JobSpecFromJson(std::string_view json);

// Canonical (lowerCamel) JSON of `spec`, indented. Fields without presence
// that hold their zero value are omitted, as proto3 JSON does; optional fields
// that are set are printed even when zero, so the result parses back to an
// equal message. Printing a JobSpec cannot fail in practice (it holds no Any);
// should protobuf ever report an error, the result is empty.
std::string JobSpecToJson(const v1::JobSpec& spec);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_JOB_SPEC_H_
