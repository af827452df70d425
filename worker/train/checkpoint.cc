#include "worker/train/checkpoint.h"

#include <cstdlib>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/safetensors.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "spec/job_spec.h"
#include "worker/model/weights_io.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/train_config.h"

namespace pipetrain {
namespace {

constexpr char kFormat[] = "pipetrain-checkpoint";
constexpr char kMomentM[] = "optimizer.m.";
constexpr char kMomentV[] = "optimizer.v.";
// Version 2 adds data_sha256; version 1 files (without it) still resume.
constexpr char kVersion[] = "2";
constexpr char kDataSha256[] = "data_sha256";
// The tokens the run reads (CorpusSha256 of train and val) and where its
// train split ends: iteration i's samples are windows of the train split
// (Dataset), so other tokens or another --val-fraction give the steps
// after a resume other samples than the run it continues.
constexpr char kCorpusSha256[] = "corpus_sha256";
constexpr char kTrainTokens[] = "train_tokens";

// SHA-256 of the tensors' fp32 bytes in order: the file's data buffer, as
// WriteSafetensors lays it out (contiguous, in the order given) and
// ReadSafetensors returns it (ascending offsets).
std::string DataSha256(const std::vector<NamedTensor>& tensors) {
  std::vector<absl::string_view> pieces;
  pieces.reserve(tensors.size());
  for (const NamedTensor& t : tensors) {
    pieces.emplace_back(reinterpret_cast<const char*>(t.tensor.data()),
                        static_cast<size_t>(t.tensor.numel()) * sizeof(float));
  }
  return Sha256HexOfPieces(pieces);
}

// Metadata fields that must match between the checkpoint and the trainer.
std::vector<std::pair<std::string, std::string>> IdentityFields(const TrainConfig& c) {
  return {{"vocab_size", absl::StrCat(c.model.vocab_size)},
          {"max_seq_len", absl::StrCat(c.model.max_seq_len)},
          {"n_layer", absl::StrCat(c.model.n_layer)},
          {"n_head", absl::StrCat(c.model.n_head)},
          {"d_model", absl::StrCat(c.model.d_model)},
          {"seed", absl::StrCat(c.seed)}};
}

// What gives a step its samples: iteration i draws batch_size sequences of
// seq_len tokens (LocalTrainer::Step), so a run resumed with other values
// continues at the same step with other data than the run it continues.
// Checked when the file has them (files before they were written do not).
std::vector<std::pair<std::string, std::string>> SampleFields(const TrainConfig& c) {
  return {{"batch_size", absl::StrCat(c.batch_size)}, {"seq_len", absl::StrCat(c.seq_len)}};
}

// What sets the size of each update (the learning-rate curve, AdamW's
// hyperparameters, clipping), keyed by the flag that sets it: a resume
// may change them (to fine-tune, to stretch a run), but then the steps
// after it are not the uninterrupted run's, which RestoreCheckpoint says.
// `steps` places the cosine curve, so it counts only under that schedule.
struct UpdateField {
  const char* key;
  const char* flag;
  std::string value;
};
std::vector<UpdateField> UpdateFields(const TrainConfig& c) {
  const bool cosine = c.lr_schedule == LrSchedule::kCosine;
  std::vector<UpdateField> fields = {
      {"lr", "--lr", absl::StrCat(c.adam.lr)},
      {"beta1", "--beta1", absl::StrCat(c.adam.beta1)},
      {"beta2", "--beta2", absl::StrCat(c.adam.beta2)},
      {"eps", "--eps", absl::StrCat(c.adam.eps)},
      {"weight_decay", "--weight-decay", absl::StrCat(c.adam.weight_decay)},
      {"decay", "--decay", DecayPolicyName(c.decay)},
      {"grad_clip", "--grad-clip", absl::StrCat(c.grad_clip)},
      {"lr_schedule", "--lr-schedule", LrScheduleName(c.lr_schedule)},
      {"warmup_steps", "--warmup-steps", absl::StrCat(c.warmup_steps)}};
  if (cosine) {
    fields.push_back({"min_lr", "--min-lr", absl::StrCat(c.min_lr)});
    fields.push_back({"steps", "--steps", absl::StrCat(c.steps)});
  }
  return fields;
}

// One moment tensor per parameter, named with `prefix` (on the trainer's
// backend, like the moments themselves).
std::vector<Parameter> MomentViews(LocalTrainer& trainer, const char* prefix, bool m) {
  Backend* backend = trainer.model().backend();
  std::vector<Parameter> views;
  for (const Parameter* p : trainer.model().parameters()) {
    Parameter view;
    view.name = prefix + p->name;
    auto& moments = trainer.optimizer().moments();
    auto it = moments.find(p->name);
    if (it == moments.end()) {  // no step taken yet: zero moments
      it = moments.emplace(p->name, AdamWMoments{backend->Zeros(p->value.shape()),
                                                 backend->Zeros(p->value.shape())}).first;
    }
    view.value = m ? it->second.m : it->second.v;
    views.push_back(std::move(view));
  }
  return views;
}

// The parameters, then the m and v views: everything a checkpoint holds.
std::vector<Parameter*> CheckpointTensors(LocalTrainer& trainer, std::vector<Parameter>& m,
                                          std::vector<Parameter>& v) {
  std::vector<Parameter*> all = trainer.model().parameters();
  for (auto* views : {&m, &v}) {
    for (Parameter* p : ParameterPointers(*views)) all.push_back(p);
  }
  return all;
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& path, LocalTrainer& trainer, bool* diverged) {
  const TrainConfig& c = trainer.config();
  Backend* backend = trainer.model().backend();
  std::vector<Parameter> m = MomentViews(trainer, kMomentM, true);
  std::vector<Parameter> v = MomentViews(trainer, kMomentV, false);
  // Host copies (the tensors themselves on the CPU backend).
  std::vector<Parameter> host = HostParameterCopies(backend, CheckpointTensors(trainer, m, v));
  RETURN_IF_ERROR(backend->status());
  // As a job's checkpoints (unit_checkpoint.h): diverged weights must not
  // replace the last good file, the one --resume would take.
  if (absl::Status finite = CheckParametersFinite(host); !finite.ok()) {
    if (diverged != nullptr) *diverged = true;
    return absl::FailedPreconditionError(
        absl::StrCat("not writing the checkpoint of step ", trainer.step(), " to ", path, ": ",
                     finite.message(), " (training diverged; the file keeps what it held)"));
  }
  const std::vector<NamedTensor> tensors = ParameterValues(ParameterPointers(host));
  SafetensorsMetadata meta = {{"format", kFormat},
                              {"version", kVersion},
                              {kDataSha256, DataSha256(tensors)},
                              {"step", absl::StrCat(trainer.step())},
                              {"data_cursor", absl::StrCat(trainer.step())}};
  for (const UpdateField& field : UpdateFields(c)) meta[field.key] = field.value;
  for (const auto& [key, value] : IdentityFields(c)) meta[key] = value;
  for (const auto& [key, value] : SampleFields(c)) meta[key] = value;
  meta[kCorpusSha256] = trainer.corpus_sha256();
  meta[kTrainTokens] = absl::StrCat(trainer.dataset().train_tokens());
  return WriteSafetensors(path, tensors, meta);
}

absl::Status RestoreCheckpoint(const std::string& path, LocalTrainer* trainer,
                               std::vector<std::string>* update_changes) {
  // The header alone first: a file that is not this run's checkpoint (a
  // model's plain weights given to --resume, another model's) is refused
  // without reading its data. Then the tensors one at a time, never the
  // whole file at once: ReadSafetensors would hold the file's bytes beside
  // their fp32 copies, 24 bytes per parameter on top of the trainer's 16,
  // and a run that could save a checkpoint could not resume it.
  const auto no_tensors = [](std::string_view) { return false; };
  ASSIGN_OR_RETURN(SafetensorsContents contents, ReadSafetensorsTensors(path, no_tensors));
  auto meta = [&](const std::string& key) {
    auto it = contents.metadata.find(key);
    return it == contents.metadata.end() ? std::string() : it->second;
  };
  // A value from the file, quoted in a message the terminal shows: cut,
  // and its control bytes escaped (a shared checkpoint's metadata could
  // carry terminal escape sequences).
  auto quoted = [&](const std::string& key, size_t max_bytes = 32) {
    return absl::CHexEscape(meta(key).substr(0, max_bytes));
  };
  if (meta("format") != kFormat || (meta("version") != "1" && meta("version") != kVersion)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a pipetrain checkpoint (format '", quoted("format"), "', version '",
        quoted("version"), "'); to start from plain weights use --init-from"));
  }
  for (const auto& [key, mine] : IdentityFields(trainer->config())) {
    if (meta(key) != mine) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": checkpoint has ", key, "=",
                                                        quoted(key), " but this run has ", key, "=",
                                                        mine, "; pass the checkpoint's value"));
    }
  }
  for (const auto& [key, mine] : SampleFields(trainer->config())) {
    if (contents.metadata.count(key) > 0 && meta(key) != mine) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": checkpoint has ", key, "=", quoted(key), " but this run has ", key, "=", mine,
          "; pass the checkpoint's value (the steps after it draw their samples by it)"));
    }
  }
  // Checked when the file has them (files written before they were
  // recorded do not).
  if (contents.metadata.count(kCorpusSha256) > 0 &&
      meta(kCorpusSha256) != trainer->corpus_sha256()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": the checkpoint's run read other tokens (", kCorpusSha256, " ",
        quoted(kCorpusSha256, 64), ", this run's ", trainer->corpus_sha256(),
        "); resume with its --data, --format and --synthetic-bytes, as the steps after it draw "
        "their samples from the tokens"));
  }
  if (contents.metadata.count(kTrainTokens) > 0 &&
      meta(kTrainTokens) != absl::StrCat(trainer->dataset().train_tokens())) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": the checkpoint's run trained on the first ", quoted(kTrainTokens),
        " tokens of the corpus, this run on ", trainer->dataset().train_tokens(),
        "; resume with its --val-fraction, as the steps after it draw their samples from the "
        "train split"));
  }
  // A flipped bit in the values would otherwise resume silently from
  // weights that were never trained (the structure checks below see only
  // names, shapes and finiteness).
  // Only a file without one: the version sits in the header, outside the
  // checksum, so a changed version must not switch the check off.
  {
    ASSIGN_OR_RETURN(SafetensorsContents whole,
                     ReadSafetensorsTensors(path, [](std::string_view) { return true; }));
    // Replaced between the two reads: the checks above were another file's.
    if (whole.metadata != contents.metadata) {
      return absl::AbortedError(absl::StrCat(
          path, ": the file changed while it was read; resume again once it is written"));
    }
    contents = std::move(whole);
  }
  if (meta("version") == "1" && contents.metadata.count(kDataSha256) == 0) {
    PT_LOG(WARNING) << path << ": a version 1 checkpoint has no data checksum; resuming "
                    << "without verifying its values";
  } else if (DataSha256(contents.tensors) != meta(kDataSha256)) {
    return absl::DataLossError(
        absl::StrCat(path, ": its tensors' bytes do not match the checksum it was written with (",
                     kDataSha256, "): the file was damaged or changed after it was saved"));
  }
  int64_t step = 0;
  // A run has at most kMaxSteps steps (spec/job_spec.h); a larger count,
  // which SaveCheckpoint never writes, would overflow AdamW's step count.
  if (!absl::SimpleAtoi(meta("step"), &step) || step < 0 || step > kMaxSteps) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": bad step '", quoted("step"), "'"));
  }
  // The sample order continues at iteration `step` (LocalTrainer::Step
  // draws iteration step()); a file whose cursor says otherwise was not
  // written by SaveCheckpoint, and resuming it would not continue its run.
  if (meta("data_cursor") != meta("step")) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": data_cursor '", quoted("data_cursor"), "' differs from step ", step,
                     "; a checkpoint continues the sample order at its step"));
  }
  // AdamW's v is a mean of squares: a negative one (a file written by hand,
  // or m and v swapped) would turn the weights to NaN at the first step,
  // reported as divergence rather than as the file's fault.
  // Under either name ImportWeights takes (FindParameterTensor also finds a
  // "transformer."-prefixed one).
  for (const NamedTensor& t : contents.tensors) {
    if (!absl::StartsWith(t.name, kMomentV) &&
        !absl::StartsWith(t.name, absl::StrCat("transformer.", kMomentV))) {
      continue;
    }
    if (std::string bad = DescribeFirstNegative(t.tensor); !bad.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor ", absl::CHexEscape(t.name.substr(0, 96)), " ", bad, " (not resumable)"));
    }
  }
  // Check everything before writing anything, so a bad file changes nothing
  // (ImportWeights is all or nothing; on a device backend it writes host
  // copies, uploaded only after it succeeded).
  Backend* backend = trainer->model().backend();
  std::vector<Parameter> m = MomentViews(*trainer, kMomentM, true);
  std::vector<Parameter> v = MomentViews(*trainer, kMomentV, false);
  const std::vector<Parameter*> all = CheckpointTensors(*trainer, m, v);
  std::vector<Parameter> host = HostParameterCopies(backend, all);
  absl::Status status = ImportWeights(contents, ParameterPointers(host));
  if (!status.ok()) return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i]->value.on_device()) backend->CopyFromHost(host[i].value, &all[i]->value);
  }
  RETURN_IF_ERROR(backend->status());
  trainer->optimizer().set_steps_taken(step);
  if (update_changes != nullptr) {
    update_changes->clear();
    // A field the file lacks (written before it was recorded; min_lr and
    // steps under a constant schedule) is not compared. The file's value is
    // cut: the metadata is the file's, not ours.
    for (const UpdateField& field : UpdateFields(trainer->config())) {
      const auto it = contents.metadata.find(field.key);
      if (it == contents.metadata.end() || it->second == field.value) continue;
      update_changes->push_back(absl::StrCat(field.flag, " ", field.value,
                                             " (the checkpoint's run had ",
                                             absl::CHexEscape(it->second.substr(0, 32)), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
