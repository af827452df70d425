// JobManager: the trained weights: which stage owns each tensor, the
// uploaded chunks' checks, and writing the weights file. Contracts:
// job_manager.h.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/confined_path.h"
#include "common/enum_names.h"
#include "common/errno_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_manager_internal.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {

using job_manager_internal::InOutputDir;

namespace job_manager_internal {

absl::Status InOutputDir(const absl::Status& failed, const std::string& output_dir,
                         const std::string& name) {
  if (failed.ok()) return failed;
  return WithMessage(failed, absl::StrCat("spec.output.weights_path ", name, " under ",
                                          kOutputDirFlag, " ", output_dir, ": ", failed.message()));
}

}  // namespace job_manager_internal

namespace {

// Removes the temporaries of `name` in `dir_fd` that coordinators left when
// they died during an upload (safetensors.h: RemoveAbandonedTemporaries),
// each of them reserving the whole file's space: a coordinator that crashed
// in a loop would otherwise fill the disk, one temporary a crash.
void RemoveAbandonedWeightTemporaries(int dir_fd, const std::string& name,
                                      const std::string& job_id) {
  for (const std::string& removed : RemoveAbandonedTemporaries(dir_fd, name)) {
    PT_LOG(INFO) << "job " << job_id << ": removed " << removed
                 << ", left by a coordinator that stopped during an upload";
  }
}

// Whether `failed`, the weights file's creation's error (OpenConfinedParent's
// or SafetensorsFileWriter::Create's: an errno as absl::ErrnoToStatus maps
// it), is a passing shortage of the coordinator's that a later try gets
// past: EINTR, EAGAIN (UNAVAILABLE, as is a directory removed while it was
// made) or out of descriptors or memory (EMFILE, ENFILE, ENOMEM). These are
// RESOURCE_EXHAUSTED, as a full disk or quota (ENOSPC, EDQUOT) is, so they
// are told by the errno the status carries (ErrnoOf), never by its text; a
// disk that is full or fails (EIO: UNKNOWN) is no shortage.
bool IsPassingShortage(const absl::Status& failed) {
  if (absl::IsUnavailable(failed)) return true;
  const std::optional<int> error = ErrnoOf(failed);
  return error == EMFILE || error == ENFILE || error == ENOMEM;
}

// What an upload whose chunk could not be written for a passing shortage
// (IsPassingShortage) answers: UNAVAILABLE, which the worker retries,
// sending the stream again (JobRunner::UploadWeightsWithRetries).
absl::Status UploadAgainLater(const std::string& job_id, const absl::Status& failed) {
  return absl::UnavailableError(absl::StrCat("job ", job_id,
                                             ": cannot create the final weights file for now (",
                                             failed.message(), "); upload the weights again"));
}

}  // namespace

absl::Status JobManager::AddWeightsChunk(const v1::WeightsChunk& c) {
  // A worker checks its weights before it uploads them (JobRunner), so a
  // NaN or infinity here is a fault or a lie: it must not reach the file
  // of a job that then says SUCCEEDED. Checked off the lock, before the
  // offset is (so the message adds nothing to it: the sum could overflow).
  for (int i = 0; i < c.values_size(); ++i) {
    if (!std::isfinite(c.values(i))) {
      // The tensor's element only where the sum cannot overflow.
      const bool in_range = c.offset() >= 0 && c.offset() <= INT64_MAX - i;
      return absl::InvalidArgumentError(absl::StrCat(
          "WeightsChunk.values: ",
          absl::CHexEscape(absl::string_view(c.tensor_name()).substr(0, 128)), " holds ",
          c.values(i), " at index ", i, " of the chunk at offset ", c.offset(),
          in_range ? absl::StrCat(" (element ", c.offset() + i, ")") : std::string(),
          "; weights must be finite"));
    }
  }
  std::shared_ptr<SafetensorsFileWriter> file;
  std::shared_ptr<WeightsFileCreation> creation;
  size_t index = 0;
  std::string weights_path;  // spec.output.weights_path, for errors
  {
    AnnotatedMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(JobRecord * record, ForWorkerLocked(c.worker_id(), c.job_id()));
    RETURN_IF_ERROR(CheckUploadingLocked(*record));
    // Complete, and the file being synced off the lock: a late chunk would
    // open a second file, reserving the whole model's size beside it, and
    // could fail a job whose weights are whole. (FinishWeights sent again
    // stays harmless: it writes nothing.)
    if (record->writing_weights) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", record->job.id(),
                       "'s weights are complete and being written; no chunk is taken now"));
    }
    // The job's progress once its steps are done (JobSummary::without_step):
    // a large model's upload may take longer than the stall alert's wait.
    record->last_step_time = elapsed_clock_->Now();
    if (c.tensor_name().empty()) {  // names the stream only (coordinator.proto)
      if (c.values_size() > 0) {
        return absl::InvalidArgumentError("a weights chunk with values must name its tensor");
      }
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(CheckWeightsChunkLocked(*record, c));
    // The model's shape, checked above: never a size the client chose.
    const int64_t numel = NumElements(record->weight_owner.at(c.tensor_name()).second);
    // Compared without a sum: offset + values_size could overflow (a chunk at
    // 2^63 - k would wrap below the tensor's start).
    if (c.offset() < 0 || c.offset() > numel || c.values_size() > numel - c.offset()) {
      return absl::InvalidArgumentError(absl::StrCat("chunk of ", c.tensor_name(), " at ",
                                                     c.offset(), " + ", c.values_size(),
                                                     " exceeds its ", numel, " elements"));
    }
    // The job asks for no file: checked, and nothing kept.
    if (record->resolved.spec.output().weights_path().empty()) return absl::OkStatus();
    weights_path = record->resolved.spec.output().weights_path();
    // A stage sends each tensor's chunks in order (one run); chunks
    // scattered with gaps would each keep a run in memory (numel / 2 of
    // them for a worker sending every other value). Bounded per tensor and,
    // as a worker may scatter over every tensor, for the job (job_manager.h).
    const auto covered = record->weights_covered.find(c.tensor_name());
    const bool new_run =
        c.values_size() > 0 && (covered == record->weights_covered.end() ||
                                !covered->second.Touches(c.offset(), c.offset() + c.values_size()));
    if (new_run && covered != record->weights_covered.end() &&
        covered->second.runs() >= kMaxWeightsRuns) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunks of ", c.tensor_name(), " arrive scattered over more than ",
                       kMaxWeightsRuns, " separate ranges; send a tensor's chunks in order"));
    }
    const int64_t max_runs = static_cast<int64_t>(record->weight_owner.size()) + kMaxWeightsRuns;
    if (new_run && record->weights_runs >= max_runs) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunks of job ", record->job.id(), "'s weights arrive scattered over more than ",
          max_runs, " separate ranges (one a tensor and ", kMaxWeightsRuns,
          " more); send each tensor's chunks in order"));
    }
    if (record->weights_file != nullptr) {
      file = record->weights_file;
      index = record->weights_index.at(c.tensor_name());
    } else {
      if (record->weights_creation == nullptr) {
        record->weights_creation = NewWeightsFileCreationLocked(*record);
      }
      creation = record->weights_creation;
    }
  }
  if (creation != nullptr) {
    // Off the lock: reserving the file's bytes may take long (see
    // WeightsFileCreation), and reports, heartbeats' drain checks and
    // every other job's calls take that lock.
    absl::StatusOr<std::shared_ptr<SafetensorsFileWriter>> created = CreateWeightsFile(*creation);
    // Out of descriptors or memory for a moment: a job that trained to its
    // last step failed for it, every step lost. This upload fails instead
    // (the uploads waiting on `creation` too), and is sent again.
    const bool passing = !created.ok() && IsPassingShortage(created.status());
    AnnotatedMutexLock lock(&mu_);
    JobRecord* record = FindLocked(c.job_id());
    // The job moved on meanwhile (ended, re-planned): nothing to record,
    // and the file (unused) goes with `creation`.
    if (record == nullptr || record->weights_creation != creation) {
      return passing ? UploadAgainLater(c.job_id(), created.status()) : created.status();
    }
    if (passing) {
      // Nothing was written: the next chunk starts a creation afresh.
      record->weights_creation.reset();
      return UploadAgainLater(c.job_id(), created.status());
    }
    if (!created.ok()) {
      const absl::Status failed = created.status();
      EndLocked(*record, v1::JOB_STATE_FAILED,
                absl::StrCat("cannot write the final weights: ", failed.message()));
      return failed;
    }
    if (record->weights_file == nullptr) {
      record->weights_file = *created;
      record->weights_index = creation->index;
    }
    file = record->weights_file;
    index = record->weights_index.at(c.tensor_name());
  }
  // Straight to the file, outside the lock (a slow disk holds up this
  // upload, and those on its strand, not the manager): the coordinator
  // keeps none of the weights in memory.
  const absl::Status written =
      InOutputDir(file->Write(index, c.offset(), c.values().data(), c.values_size()),
                  options_.output_dir, weights_path);
  AnnotatedMutexLock lock(&mu_);
  JobRecord* record = FindLocked(c.job_id());
  // The job moved on meanwhile (ended, re-planned): nothing to record.
  if (record == nullptr || record->weights_file != file) return written;
  if (!written.ok()) {
    // A disk that fails (or fills) fails the job now, saying why.
    EndLocked(*record, v1::JOB_STATE_FAILED,
              absl::StrCat("cannot write the final weights: ", written.message()));
    return written;
  }
  CoveredRanges& covered = record->weights_covered[c.tensor_name()];
  const int runs_before = covered.runs();
  covered.Add(c.offset(), c.offset() + c.values_size());
  record->weights_runs += covered.runs() - runs_before;  // a chunk may join runs
  return absl::OkStatus();
}

void JobManager::RecordWeightOwners(JobRecord& record, int stage) {
  // Replica 0's tensor rank 0 uploads its stage's gathered weights.
  if (stage >= StagesPerReplica(record) || stage % TensorRanks(record) != 0) return;
  const v1::UnitRange& units = record.plan.stages(stage).backward();
  for (int u = units.begin(); u < units.end(); ++u) {
    for (ParameterShape& p : UnitParameterShapes(record.resolved.train.model, u)) {
      record.weight_owner.try_emplace(p.name, stage, Shape(p.shape.begin(), p.shape.end()));
    }
  }
}

absl::Status JobManager::CheckWeightsChunkLocked(const JobRecord& record,
                                                 const v1::WeightsChunk& c) const {
  auto owner = record.weight_owner.find(c.tensor_name());
  if (owner == record.weight_owner.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("UploadWeights: job ", record.job.id(), " has no tensor \"",
                     absl::CHexEscape(absl::string_view(c.tensor_name()).substr(0, 128)), "\""));
  }
  const int stage = record.stage_of.at(c.worker_id());
  const auto& [owning_stage, shape] = owner->second;
  // The tied wte.weight is the first stage's that holds it: the
  // embedding's (a head's stage holds a copy, and does not send it).
  if (owning_stage != stage) {
    return absl::PermissionDeniedError(absl::StrCat("UploadWeights: ", c.tensor_name(),
                                                    " belongs to stage ", owning_stage, ", not to ",
                                                    c.worker_id(), "'s stage ", stage));
  }
  if (!std::equal(c.shape().begin(), c.shape().end(), shape.begin(), shape.end())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UploadWeights: ", c.tensor_name(), " has shape [", absl::StrJoin(shape, ", "),
        "] in this model; the chunk says [",
        absl::StrJoin(c.shape().begin(), c.shape().begin() + std::min(c.shape_size(), 8), ", "),
        c.shape_size() > 8 ? ", ..." : "", "]"));
  }
  return absl::OkStatus();
}

absl::Status JobManager::CheckUploadingLocked(const JobRecord& record) const {
  if (record.job.state() == v1::JOB_STATE_RUNNING) return absl::OkStatus();
  // A stopped plan's stage still uploading: the job's next plan trains on
  // and uploads the weights; these would open a file (and complete it) for
  // a job that is not running.
  return absl::FailedPreconditionError(
      absl::StrCat("job ", record.job.id(), " is ", EnumShortName(record.job.state()),
                   "; its weights are uploaded by the stages of its next plan"));
}

absl::Status JobManager::FinishWeights(const std::string& worker_id, const std::string& job_id) {
  AnnotatedMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobRecord * record, ForWorkerLocked(worker_id, job_id));
  RETURN_IF_ERROR(CheckUploadingLocked(*record));
  record->stages[record->stage_of.at(worker_id)].weights_done = true;
  MaybeCompleteLocked(*record);
  return absl::OkStatus();
}

std::shared_ptr<JobManager::WeightsFileCreation> JobManager::NewWeightsFileCreationLocked(
    const JobRecord& record) const {
  auto creation = std::make_shared<WeightsFileCreation>();
  creation->output_dir = options_.output_dir;
  creation->name = record.resolved.spec.output().weights_path();
  creation->job_id = record.job.id();
  const GptConfig& model = record.resolved.train.model;
  for (int u = 0; u < NumUnits(model); ++u) {
    for (const ParameterShape& p : UnitParameterShapes(model, u)) {
      if (record.weight_owner.count(p.name) == 0 || creation->index.count(p.name) > 0) continue;
      creation->index[p.name] = creation->tensors.size();
      creation->tensors.push_back({p.name, p.shape});
    }
  }
  return creation;
}

absl::StatusOr<std::shared_ptr<SafetensorsFileWriter>> JobManager::CreateWeightsFile(
    WeightsFileCreation& creation) const {
  AnnotatedMutexLock lock(&creation.mu);
  if (creation.done) {
    if (!creation.status.ok()) return creation.status;
    return creation.file;
  }
  creation.done = true;
  if (options_.before_weights_file_created) options_.before_weights_file_created();
  const std::string& name = creation.name;
  // Walked again now (links may have appeared since submit); missing
  // directories under the output directory are created.
  absl::StatusOr<ConfinedParent> parent =
      OpenConfinedParent(creation.output_dir, kOutputDirFlag, "spec.output.weights_path", name,
                         /*create_dirs=*/true);
  if (!parent.ok()) {
    creation.status = parent.status();
    return creation.status;
  }
  RemoveAbandonedWeightTemporaries(parent->dir.get(), parent->name, creation.job_id);
  absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> writer = SafetensorsFileWriter::Create(
      parent->dir.get(), parent->name, creation.tensors, 0600, HfWeightsMetadata());
  if (!writer.ok()) {
    creation.status = InOutputDir(writer.status(), creation.output_dir, name);
    return creation.status;
  }
  creation.file = *std::move(writer);
  return creation.file;
}

void JobManager::RemoveAbandonedWeightsOf(const JobRecord& record) {
  const std::string& weights = record.resolved.spec.output().weights_path();
  if (weights.empty() || options_.output_dir.empty()) return;
  io_.Post([output_dir = options_.output_dir, weights, job_id = record.job.id()] {
    absl::StatusOr<ConfinedParent> parent =
        OpenConfinedParent(output_dir, kOutputDirFlag, "spec.output.weights_path", weights,
                           /*create_dirs=*/false);
    if (parent.ok() && parent->dir.get() >= 0) {
      RemoveAbandonedWeightTemporaries(parent->dir.get(), parent->name, job_id);
    }
  });
}

void JobManager::DropWeightsFile(JobRecord& record) {
  record.weights_creation.reset();
  record.weights_file.reset();
  record.weights_index.clear();
  record.weights_covered.clear();
  record.weights_runs = 0;
}

void JobManager::FinishWritingWeights(const std::string& job_id, const std::string& path,
                                      SafetensorsFileWriter& file) {
  // Cancelled while it waited its turn: not synced. One thread syncs every
  // job's file, and another job's commit would wait behind gigabytes of an
  // fsync whose file is thrown away.
  bool wanted;
  {
    AnnotatedMutexLock lock(&mu_);
    JobRecord* record = FindLocked(job_id);
    wanted = record != nullptr && !IsTerminal(record->job.state()) && record->writing_weights;
  }
  absl::Status synced;
  if (wanted) {
    if (options_.before_weights_synced) options_.before_weights_synced();
    synced = file.Sync();
  }
  AnnotatedMutexLock lock(&mu_);
  --background_in_flight_;
  JobRecord* record = FindLocked(job_id);
  if (!wanted || record == nullptr || IsTerminal(record->job.state())) {
    // Cancelled before or while it was synced: the file is not renamed in
    // (a file already under the name stays), and the temporary goes with
    // `file`.
    PT_LOG(INFO) << "job " << job_id << " ended while its weights were written; " << path
                 << " is left as it was";
    return;
  }
  record->writing_weights = false;
  // The rename under the lock, so a cancel comes before it (and the file is
  // not renamed) or after it (the job has SUCCEEDED).
  const absl::Status committed =
      InOutputDir(synced.ok() ? file.Commit() : synced, options_.output_dir,
                  record->resolved.spec.output().weights_path());
  if (!committed.ok()) {
    return EndLocked(*record, v1::JOB_STATE_FAILED,
                     absl::StrCat("cannot write the final weights: ", committed.message()));
  }
  record->job.set_weights_path(path);
  EndLocked(*record, v1::JOB_STATE_SUCCEEDED, "");
}

}  // namespace pipetrain
