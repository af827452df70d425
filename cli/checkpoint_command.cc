#include "cli/checkpoint_command.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cli/output_paths.h"
#include "common/errno_status.h"
#include "common/flag_set.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/terminal_safe.h"
#include "worker/checkpoint/checkpoint_manifest.h"
#include "worker/checkpoint/unit_checkpoint.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {
namespace {

constexpr char kUsage[] =
    "usage: pipetrain checkpoint <subcommand>\n\n"
    "Subcommands (each has --help):\n"
    "  export DIR --out FILE   write a job checkpoint as Hugging Face GPT-2 safetensors\n";

constexpr char kExportUsage[] =
    "usage: pipetrain checkpoint export DIR --out FILE [--vocab N]\n\n"
    "Writes the weights of a job checkpoint as one Hugging Face GPT-2 safetensors file\n"
    "(the tensors `pipetrain train-local --save` writes). DIR is a checkpoint's\n"
    "step-NNNNNNNN directory (manifest.json and unit-NNNN.safetensors files), or a job's\n"
    "checkpoint directory holding step-* directories: then the newest one with a\n"
    "manifest.json is exported. Every unit file is checked against the manifest (size,\n"
    "SHA-256, unit, step, seed, model shape) before FILE is written; FILE is replaced\n"
    "atomically. Exit codes: 0 exported, 2 bad arguments, 1 a bad checkpoint or write\n"
    "(or a --vocab beyond the checkpoint's rows, found only once it is read).";

// `status` with `hint` appended to its message.
absl::Status WithHint(const absl::Status& status, absl::string_view hint) {
  return absl::Status(status.code(), absl::StrCat(status.message(), hint));
}

// Reads every unit file the manifest lists, verified (ReadUnitCheckpoint).
absl::StatusOr<std::vector<UnitState>> ReadUnits(const CheckpointLocation& at,
                                                 const CheckpointManifest& manifest) {
  v1::ResumeFrom from;
  from.set_step(manifest.step);
  from.set_dir(at.dir);
  for (const v1::UnitFile& f : manifest.units) *from.add_units() = f;
  const CheckpointIdentity identity{manifest.job_id, manifest.model, manifest.seed};
  std::vector<UnitState> units;
  for (const v1::UnitFile& f : manifest.units) {
    ASSIGN_OR_RETURN(UnitState unit,
                     ReadUnitCheckpoint(at.root, from, f, identity, /*with_moments=*/false,
                                        /*optimizer_steps=*/nullptr));
    units.push_back(std::move(unit));
  }
  return units;
}

// A warning when the head's tied copy of wte.weight is not bitwise the
// embedding's (stages on different devices may round their AdamW updates
// differently); empty when it is.
std::string TiedCopyWarning(const std::vector<UnitState>& units) {
  const Tensor* embed = nullptr;
  const Tensor* head = nullptr;
  for (const NamedTensor& t : units.front().values) {
    if (t.name == "wte.weight") embed = &t.tensor;
  }
  for (const NamedTensor& t : units.back().values) {
    if (t.name == "wte.weight") head = &t.tensor;
  }
  if (embed == nullptr || head == nullptr || embed->numel() != head->numel()) return "";
  int64_t differ = 0;
  double max_diff = 0;
  for (int64_t i = 0; i < embed->numel(); ++i) {
    const float a = (*embed)[i], b = (*head)[i];
    if (std::memcmp(&a, &b, sizeof(float)) == 0) continue;
    ++differ;
    max_diff = std::fmax(max_diff, std::fabs(static_cast<double>(a) - b));
  }
  if (differ == 0) return "";
  return absl::StrCat("the head's tied copy of wte.weight differs from the embedding's in ", differ,
                      " of ", embed->numel(), " elements (max |difference| ", max_diff,
                      "); exported the embedding's (unit 0)");
}

// Every parameter once, in unit order (GptModel::parameters()).
std::vector<NamedTensor> HfTensors(const std::vector<UnitState>& units) {
  std::vector<NamedTensor> tensors;
  std::set<std::string> seen;
  for (const UnitState& unit : units) {
    for (const NamedTensor& t : unit.values) {
      if (seen.insert(t.name).second) tensors.push_back(t);
    }
  }
  return tensors;
}

// The manifest and the unit files it lists, verified.
absl::StatusOr<std::vector<UnitState>> ReadCheckpoint(const CheckpointLocation& at,
                                                      CheckpointManifest* manifest) {
  ASSIGN_OR_RETURN(*manifest,
                   ReadCheckpointManifest(absl::StrCat(at.path(), "/", kCheckpointManifestName)));
  return ReadUnits(at, *manifest);
}

// `args` split into DIR words and flag words (--out and --vocab take the
// next word).
void SplitArgs(const std::vector<std::string>& args, std::vector<std::string>* words,
               std::vector<std::string>* flags) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].empty() || args[i][0] != '-') {
      words->push_back(args[i]);
      continue;
    }
    flags->push_back(args[i]);
    if ((args[i] == "--out" || args[i] == "--vocab") && i + 1 < args.size()) {
      flags->push_back(args[++i]);
    }
  }
}

FlagSet ExportFlags(std::string& out, int64_t& vocab) {
  FlagSet flags(kExportUsage);
  flags.String("out", &out, "the safetensors file to write (required)");
  flags.Int64("vocab", &vocab,
              "keep the token embedding's first N rows: a vocabulary padded for tensor ranks "
              "back to the tokenizer's (e.g. 50257); 0 keeps them all");
  return flags;
}

int RunExport(const std::vector<std::string>& args) {
  std::string out;
  int64_t vocab = 0;
  FlagSet flags = ExportFlags(out, vocab);
  std::vector<std::string> words, flag_args;
  SplitArgs(args, &words, &flag_args);
  absl::Status parsed = flags.Parse(flag_args);
  if (flags.help_requested()) return std::printf("%s", flags.Usage().c_str()), 0;
  if (parsed.ok() && words.size() != 1) {
    parsed = absl::InvalidArgumentError(words.empty()
                                            ? "missing the checkpoint directory DIR (see --help)"
                                            : absl::StrCat("give one checkpoint directory, got ",
                                                           words.size(), " words (see --help)"));
  }
  if (parsed.ok() && out.empty()) parsed = absl::InvalidArgumentError("--out FILE is required");
  if (parsed.ok() && vocab < 0) parsed = absl::InvalidArgumentError("--vocab must be >= 0");
  // Before reading and checking the checkpoint, which may be gigabytes.
  if (parsed.ok()) parsed = CheckWritableParent("--out", out);
  if (parsed.ok()) parsed = CheckReplaceableFile("--out", out);
  if (!parsed.ok()) {
    std::fprintf(stderr, "pipetrain checkpoint export: %s\n",
                 std::string(parsed.message()).c_str());
    return 2;
  }
  absl::StatusOr<CheckpointLocation> at = LocateCheckpoint(words[0]);
  if (at.ok() && at->newest_of_job) {
    std::fprintf(stderr, "using %s, the newest checkpoint in %s with a manifest\n",
                 at->path().c_str(), words[0].c_str());
  }
  // --out in the checkpoint's own directory would replace one of the files
  // being exported (or leave a stranger there): refused before anything.
  if (at.ok()) {
    const size_t slash = out.find_last_of('/');
    const std::string out_dir =
        slash == std::string::npos ? "." : (slash == 0 ? "/" : out.substr(0, slash));
    struct stat a, b;
    if (stat(out_dir.c_str(), &a) == 0 && stat(at->path().c_str(), &b) == 0 &&
        a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
      std::fprintf(stderr,
                   "pipetrain checkpoint export: --out %s lies in the checkpoint directory %s, "
                   "whose files it would replace; write it elsewhere\n",
                   out.c_str(), at->path().c_str());
      return 2;
    }
  }
  absl::StatusOr<CheckpointExport> done =
      at.ok() ? ExportCheckpoint(*at, out, vocab) : absl::StatusOr<CheckpointExport>(at.status());
  // What a checkpoint's files say (its manifest's job id, a unit file's
  // metadata quoted in an error) is printed inert: the checkpoint may be
  // someone else's, and "Nothing is trusted" includes the terminal. No
  // payload (a reader's errno) ends the line.
  if (!done.ok()) {
    std::fprintf(stderr, "pipetrain checkpoint export: %s\n",
                 TerminalSafe(StatusTextForUsers(done.status())).c_str());
    return 1;
  }
  for (const std::string& warning : done->warnings) {
    std::fprintf(stderr, "warning: %s\n", TerminalSafe(warning).c_str());
  }
  std::printf("exported step %lld of job %s: %lld tensors, %lld parameters, %lld bytes to %s%s\n",
              static_cast<long long>(done->step), TerminalSafe(done->job_id).c_str(),
              static_cast<long long>(done->tensors), static_cast<long long>(done->parameters),
              static_cast<long long>(done->bytes), out.c_str(),
              done->cut_rows > 0
                  ? absl::StrCat(" (", done->cut_rows, " padded vocabulary rows left out)").c_str()
                  : "");
  return 0;
}

}  // namespace

absl::StatusOr<CheckpointExport> ExportCheckpoint(const CheckpointLocation& at,
                                                  const std::string& out, int64_t vocab) {
  CheckpointManifest manifest;
  absl::StatusOr<std::vector<UnitState>> units = ReadCheckpoint(at, &manifest);
  // A running job keeps only its newest spec.checkpoint.keep checkpoints:
  // the one being read may go meanwhile: its directory, or first the
  // manifest Locate found. Said so, not a worker's volume hint, nor
  // "export an older one", which goes first.
  const auto gone = [](const std::string& path) {
    struct stat info;
    return lstat(path.c_str(), &info) != 0 && errno == ENOENT;
  };
  if ((absl::IsNotFound(units.status()) || absl::IsUnavailable(units.status())) &&
      (gone(at.path()) ||
       (at.newest_of_job && gone(absl::StrCat(at.path(), "/", kCheckpointManifestName))))) {
    return absl::NotFoundError(absl::StrCat(
        at.path(),
        " was removed while it was read (a running job keeps only its newest "
        "spec.checkpoint.keep checkpoints); copy it elsewhere first, or export again"));
  }
  if (!units.ok() && at.newest_of_job) {
    return WithHint(units.status(),
                    absl::StrCat(" (", at.dir,
                                 " is the newest checkpoint with a manifest; to export an older "
                                 "one, name its step-* directory)"));
  }
  if (!units.ok()) return units.status();
  CheckpointExport result;
  result.job_id = manifest.job_id;
  result.step = manifest.step;
  if (std::string warning = TiedCopyWarning(*units); !warning.empty()) {
    result.warnings.push_back(std::move(warning));
  }
  std::vector<NamedTensor> tensors = HfTensors(*units);
  for (NamedTensor& t : tensors) {
    if (vocab == 0 || t.name != kTokenEmbeddingName) continue;
    const int64_t rows = t.tensor.shape()[0];
    if (vocab > rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--vocab ", vocab, " exceeds the checkpoint's vocabulary of ", rows, " rows"));
    }
    result.cut_rows = rows - vocab;
    t.tensor = t.tensor.Slice(0, vocab).Clone();
  }
  // An export interrupted mid-write (Ctrl-C, a closed terminal) left its
  // temporary beside --out, up to the whole model's size; nothing else
  // removes it (the coordinator cleans only its own weights files).
  for (const std::string& removed : RemoveAbandonedTemporariesOf(out)) {
    result.warnings.push_back(
        absl::StrCat("removed ", removed, ", left by an export that was interrupted"));
  }
  RETURN_IF_ERROR(WriteSafetensors(out, tensors, HfWeightsMetadata()));
  result.tensors = static_cast<int64_t>(tensors.size());
  for (const NamedTensor& t : tensors) result.parameters += t.tensor.numel();
  struct stat st;
  if (stat(out.c_str(), &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", out, " after writing it"));
  }
  result.bytes = st.st_size;
  return result;
}

std::vector<FlagSet::Info> CheckpointExportFlagInfo() {
  std::string out;
  int64_t vocab = 0;
  return ExportFlags(out, vocab).Describe();
}

int RunCheckpoint(const std::vector<std::string>& args) {
  if (args.empty()) return std::fprintf(stderr, "%s", kUsage), 2;
  const std::string& sub = args[0];
  if (sub == "--help" || sub == "-h" || sub == "help") return std::printf("%s", kUsage), 0;
  if (sub == "export") return RunExport(std::vector<std::string>(args.begin() + 1, args.end()));
  std::fprintf(stderr, "pipetrain checkpoint: unknown subcommand '%s'\n\n%s", sub.c_str(), kUsage);
  return 2;
}

}  // namespace pipetrain
