// `pipetrain checkpoint export DIR --out FILE`: a job checkpoint (DESIGN.md
// §11: one unit-NNNN.safetensors per unit and the coordinator's
// manifest.json, in a step-NNNNNNNN directory) as one Hugging Face GPT-2
// safetensors file: every parameter once under its HF name, the tensors and
// order `pipetrain train-local --save` and the coordinator's final weights
// file hold (GptModel::parameters(): unit order, wte.weight once, taken from
// the embedding, unit 0). The head's tied copy of wte.weight is read and
// checked like every tensor but not written.
//
// Nothing is trusted: the manifest is parsed with bounds
// (worker/checkpoint/checkpoint_manifest.h), and every unit file is verified against it
// (size, SHA-256, format, unit, step, seed, model shape, tensor shapes:
// worker/checkpoint/unit_checkpoint.h ReadUnitCheckpoint) before anything
// is written. The output is written atomically (temporary name, fsync,
// rename), so on any error no file appears at FILE and an existing FILE is
// left as it was.
//
// Exit codes: 0 exported; 2 bad flags or arguments; 1 any error reading the
// checkpoint or writing FILE (the message names the file).
//
// Thread-safe: the functions keep no state.
#ifndef PIPETRAIN_CLI_CHECKPOINT_COMMAND_H_
#define PIPETRAIN_CLI_CHECKPOINT_COMMAND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/flag_set.h"
#include "worker/checkpoint/checkpoint_manifest.h"

namespace pipetrain {

struct CheckpointExport {
  std::string job_id;
  int64_t step = 0;
  int64_t tensors = 0;     // written to the output
  int64_t parameters = 0;  // elements of those tensors
  int64_t bytes = 0;       // size of the output file
  int64_t cut_rows = 0;    // the token embedding's rows left out (the vocabulary's padding)
  // Oddities that did not stop the export (e.g. the head's tied wte copy
  // differing from the embedding's), one line each.
  std::vector<std::string> warnings;
};

// Reads and verifies the checkpoint at `at`, then writes its weights to
// `out`. Errors: from ReadCheckpointManifest (NOT_FOUND, DATA_LOSS) and
// ReadUnitCheckpoint (NOT_FOUND, DATA_LOSS, FAILED_PRECONDITION,
// UNIMPLEMENTED: a unit file another build wrote in a format version this
// one does not read), each naming the file; from WriteSafetensors for `out`. When `at.newest_of_job`,
// the message adds how to export an older checkpoint. Nothing is written to
// `out` unless every unit verified. `vocab` > 0 keeps the token
// embedding's first `vocab` rows (a vocabulary padded for tensor ranks
// back to the tokenizer's, e.g. 50304 -> 50257, as Hugging Face's GPT-2
// config expects); INVALID_ARGUMENT when it exceeds the checkpoint's
// vocabulary. 0 keeps every row.
absl::StatusOr<CheckpointExport> ExportCheckpoint(const CheckpointLocation& at,
                                                  const std::string& out, int64_t vocab = 0);

// The `checkpoint` command: `args` are the words after "checkpoint". Returns
// the exit code; messages go to stderr, the summary line to stdout.
int RunCheckpoint(const std::vector<std::string>& args);

// The flags of `checkpoint export`, described (for shell completion).
std::vector<FlagSet::Info> CheckpointExportFlagInfo();

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_CHECKPOINT_COMMAND_H_
