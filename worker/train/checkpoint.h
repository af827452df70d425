// Training checkpoints: everything needed to continue a run exactly.
//
// One safetensors file holds the model parameters under their Hugging Face
// names (so the file also loads as plain GPT-2 weights), the AdamW moments
// as "optimizer.m.<name>" / "optimizer.v.<name>", and in __metadata__:
//   format=pipetrain-checkpoint, version=2, data_sha256 (SHA-256 of the data
//   buffer, lowercase hex), step (optimizer steps taken),
//   data_cursor (next iteration of the data order), seed, the model shape
//   (vocab_size, max_seq_len, n_layer, n_head, d_model), the sample
//   geometry (batch_size, seq_len), the tokens it read (corpus_sha256, the
//   CorpusSha256 of train and val) and where its train split ends
//   (train_tokens), and what sized its updates when it was
//   written: the AdamW hyperparameters (lr, beta1, beta2, eps,
//   weight_decay, decay), grad_clip, lr_schedule and warmup_steps, and
//   under the cosine schedule min_lr and steps.
// Writes are atomic (temp file + rename).
#ifndef PIPETRAIN_WORKER_TRAIN_CHECKPOINT_H_
#define PIPETRAIN_WORKER_TRAIN_CHECKPOINT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/train/local_trainer.h"

namespace pipetrain {

// FAILED_PRECONDITION ("training diverged") without writing when a value
// or moment is not finite, and then `*diverged` (if given) is set: a write
// error may map to FAILED_PRECONDITION too (EBUSY, EISDIR, ...).
absl::Status SaveCheckpoint(const std::string& path, LocalTrainer& trainer,
                            bool* diverged = nullptr);

// Restores parameters, moments and step into `trainer`, all or nothing.
// The header's metadata is checked first, without reading the data; then
// the tensors are read one at a time (never the whole file at once), and
// held, all of them (12 bytes a parameter: values and both moments), until
// they are checked and imported.
// Errors: NOT_FOUND (no file); DATA_LOSS when the tensors' bytes do not
// match data_sha256 (version 1 files, which have none, are restored with a
// warning) or the file shrinks while it is read; ABORTED when it is
// replaced between the header's read and the data's; INVALID_ARGUMENT when the file is not a
// pipetrain checkpoint, its data_cursor is not its step (the sample order
// continues at the step), or a tensor is missing, mis-shaped or not
// finite, or a second moment is negative (named);
// FAILED_PRECONDITION when the checkpoint's model shape, seed, batch_size,
// seq_len, corpus_sha256 or train_tokens differs from the trainer's (both
// values named, so the user can fix the flags; files written before the
// last four were recorded are not checked for them).
// Restored, `update_changes` (may be null) lists each setting that sizes
// the updates and differs from the checkpoint's, as "<flag> <this run's>
// (the checkpoint's run had <its>)": allowed, but the steps after the
// resume then differ from the uninterrupted run's (fields a file lacks
// are not compared).
absl::Status RestoreCheckpoint(const std::string& path, LocalTrainer* trainer,
                               std::vector<std::string>* update_changes = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRAIN_CHECKPOINT_H_
