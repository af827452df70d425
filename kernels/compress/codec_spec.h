// Codec spec strings, as a job spec or a flag names a codec:
//
//   "fp16" | "bf16" | "linear:bits=4" | "piecewise:bits=3" |
//   "elem_topk:keep=0.1" | "powersgd:rank=4" | "token_topk:keep=0.5" |
//   "token_topk:keep=0.5+piecewise:bits=4"   (kept tokens' values encoded by
//                                             the second codec)
//
// A spec is one or two stages joined by '+'; each stage is a codec name and
// optional comma-separated key=value parameters. Only token_topk may be
// followed by a second stage. Parsing checks the grammar, the names and the
// parameter names and ranges (bits: linear 2..16, piecewise 1..8 clusters;
// keep in (0, 1]; rank 1..kMaxSpecPowerSgdRank); errors are INVALID_ARGUMENT naming the stage
// and parameter ("piecewise: bits 12 is out of range 1..8").
#ifndef PIPETRAIN_KERNELS_COMPRESS_CODEC_SPEC_H_
#define PIPETRAIN_KERNELS_COMPRESS_CODEC_SPEC_H_

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/compress/codec.h"

namespace pipetrain {

// What a job spec (spec.compression.forward/backward) writes for "no codec:
// send raw fp32". Not a codec spec: ParseCodecSpec rejects it.
inline constexpr char kCodecNone[] = "none";

struct CodecStage {
  std::string name;
  std::map<std::string, double> params;
};

// The largest PowerSGD rank a spec may name. Encoding orthonormalises the
// rank columns (rows x rank^2 work), so a rank in the tens of thousands
// would hold a worker for hours on one tensor; 1024 is far above any
// rank that compresses (the factors outgrow the tensor at rank
// rows x cols / (rows + cols)).
inline constexpr int kMaxSpecPowerSgdRank = 1024;

// The longest spec ParseCodecSpec accepts.
inline constexpr size_t kMaxCodecSpecBytes = 256;

// INVALID_ARGUMENT as described above; also for a spec over
// kMaxCodecSpecBytes and for a parameter given twice.
absl::StatusOr<std::vector<CodecStage>> ParseCodecSpec(const std::string& spec);

// Builds the codec a valid spec names.
absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(const std::string& spec);

// A quantizer alone: one stage of fp16, bf16, linear or piecewise (what
// can carry a flat sum whose payloads are decoded before they are added,
// Collectives::AllReduceEncoded). INVALID_ARGUMENT for any other spec,
// saying what is accepted.
absl::StatusOr<std::unique_ptr<Codec>> MakeQuantizer(const std::string& spec);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_COMPRESS_CODEC_SPEC_H_
