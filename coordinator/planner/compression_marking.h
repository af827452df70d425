// Compression marking: the last pass of compiling a job's programs. It writes
// the job's spec.compression into the Send instructions (plan.proto,
// Instruction.Send: codec, error_feedback, flush_residual, epilogue), so
// that a worker applies codecs per send exactly as its program says, and
// into the Recv instructions, so that its receiver decodes only that codec.
//
// Rules (DESIGN.md §6; Optimus-CC §5):
//  - ACTIVATION sends get the forward codec, except those a Bi-Partition
//    recompute of units [a, b) must see exactly as the forward did: the
//    outputs of units a .. b - 2, and unit a - 1's unless both the forward
//    of unit a and the recompute decode the same payload (over a lossy
//    link the forward would have run on other values than the recompute,
//    which the backward then mixes); ACTIVATION_GRAD sends the
//    backward codec; TIED_EMBEDDING_GRAD and UNIT_WEIGHTS stay raw (the tied
//    gradient must be summed exactly on both holders, and weight copies must
//    stay bitwise equal to their owner's).
//  - epilogue: an ACTIVATION_GRAD send with no Forward instruction after it
//    in its program, i.e. in the stage's cool-down phase (1F1B: the last
//    P - s - 1 backward passes of stage s, plus the one that ends the steady
//    phase; GPipe: every backward send, as all follow the forwards). These
//    are the sends on the critical path (§5.2, Fig. 6). Marked whether or
//    not epilogue_only is set, so a reader of the program sees the phase.
//  - epilogue_only: only epilogue ACTIVATION_GRAD sends get the backward
//    codec.
//  - error_feedback (§5.1): every compressed ACTIVATION_GRAD send keeps its
//    link's residual; per (peer, unit) link the last such send of the
//    iteration is flush_residual: the residual is added into it and none is
//    kept, so no residual crosses the optimizer step (the paper carries the
//    last error into the next iteration; we do not, so that an iteration's
//    update depends on that iteration's gradients only and a plan change
//    never has to migrate residuals).
//
//  - every Recv gets the codec of the Send it receives (the same tensor,
//    from its peer_stage to this program's stage), "none" for a raw one, so
//    that the receiver refuses a frame encoded otherwise (plan.proto,
//    Instruction.Recv.codec). `programs` are indexed by stage, as
//    peer_stage counts.
//
// Requires a resolved CompressionSpec (job_spec.h: "none" or a valid codec
// spec in forward/backward). Idempotent: it recomputes every field.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_COMPRESSION_MARKING_H_
#define PIPETRAIN_COORDINATOR_PLANNER_COMPRESSION_MARKING_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/pipetrain/v1/job.pb.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

void MarkCompression(const v1::CompressionSpec& compression, std::vector<v1::Program>* programs);

// For the simulator (SimulationCosts::codec_wire_fraction): per codec spec
// of `compression` (forward and backward, "none" skipped), the codec's
// encoded size of an activation [micro_batch_size, seq_len, d_model] over
// its fp32 size, headers included (Codec::EncodedBytes, the size the
// worker sends). Requires positive dimensions and valid specs, as a
// resolved job spec has (INVALID_ARGUMENT otherwise).
absl::StatusOr<std::map<std::string, double>> LinkCodecWireFractions(
    const v1::CompressionSpec& compression, int64_t micro_batch_size, int64_t seq_len,
    int64_t d_model);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_COMPRESSION_MARKING_H_
