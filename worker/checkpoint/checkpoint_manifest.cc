#include "worker/checkpoint/checkpoint_manifest.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint_manifest_file.h"
#include "common/confined_path.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "spec/job_spec.h"
#include "worker/checkpoint/unit_checkpoint.h"

namespace pipetrain {
namespace {

using nlohmann::json;

// Checks one manifest; every error names the manifest's path.
class ManifestParser {
 public:
  explicit ManifestParser(const std::string& path) : path_(path) {}

  absl::StatusOr<CheckpointManifest> Parse(std::string_view text);

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat(path_, ": ", what));
  }
  // object[key] when it is there and of the wanted type.
  absl::StatusOr<const json*> Field(const json& object, const char* key, const std::string& name,
                                    json::value_t type) const;
  // object[key] as an integer in [lo, hi].
  absl::StatusOr<uint64_t> Integer(const json& object, const char* key, const std::string& name,
                                   uint64_t lo, uint64_t hi) const;
  absl::StatusOr<GptConfig> Model(const json& manifest) const;
  absl::Status Units(const json& manifest, CheckpointManifest* out) const;
  absl::StatusOr<v1::UnitFile> Unit(const json& entry, const std::string& name,
                                    int num_units) const;

  const std::string& path_;
};

const char* TypeName(json::value_t type) {
  switch (type) {
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    default:
      return "of another type";
  }
}

// A non-negative JSON integer (text parses as number_unsigned; a document
// built in memory may hold number_integer). False for fractions and < 0.
bool AsUnsigned(const json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return true;
  }
  if (!value.is_number_integer() || value.get<int64_t>() < 0) return false;
  *out = static_cast<uint64_t>(value.get<int64_t>());
  return true;
}

absl::StatusOr<const json*> ManifestParser::Field(const json& object, const char* key,
                                                  const std::string& name,
                                                  json::value_t type) const {
  auto it = object.find(key);
  if (it == object.end()) return Error(absl::StrCat(name, " is missing"));
  if (it->type() != type) return Error(absl::StrCat(name, " must be ", TypeName(type)));
  return &*it;
}

absl::StatusOr<uint64_t> ManifestParser::Integer(const json& object, const char* key,
                                                 const std::string& name, uint64_t lo,
                                                 uint64_t hi) const {
  auto it = object.find(key);
  if (it == object.end()) return Error(absl::StrCat(name, " is missing"));
  uint64_t value = 0;
  if (!AsUnsigned(*it, &value)) return Error(absl::StrCat(name, " must be a non-negative integer"));
  if (value < lo || value > hi) {
    return Error(absl::StrCat(name, " must be in [", lo, ", ", hi, "], got ", value));
  }
  return value;
}

absl::StatusOr<GptConfig> ManifestParser::Model(const json& manifest) const {
  ASSIGN_OR_RETURN(const json* model, Field(manifest, "model", "model", json::value_t::object));
  const struct {
    const char* key;
    int limit;
    int GptConfig::*field;
  } sizes[] = {{"vocab_size", kMaxManifestVocabSize, &GptConfig::vocab_size},
               {"max_seq_len", kMaxSeqLen, &GptConfig::max_seq_len},
               {"n_layer", kMaxLayers, &GptConfig::n_layer},
               {"n_head", kMaxHeads, &GptConfig::n_head},
               {"d_model", kMaxDModel, &GptConfig::d_model}};
  GptConfig config;
  for (const auto& size : sizes) {
    ASSIGN_OR_RETURN(uint64_t value, Integer(*model, size.key, absl::StrCat("model.", size.key), 1,
                                             static_cast<uint64_t>(size.limit)));
    config.*size.field = static_cast<int>(value);
  }
  if (absl::Status valid = ValidateGptConfig(config); !valid.ok()) {
    return Error(absl::StrCat("model: ", valid.message()));
  }
  if (CountParameters(config) > kMaxParameters) {
    return Error(absl::StrCat("model has ", CountParameters(config), " parameters; the limit is ",
                              kMaxParameters));
  }
  return config;
}

absl::StatusOr<v1::UnitFile> ManifestParser::Unit(const json& entry, const std::string& name,
                                                  int num_units) const {
  if (!entry.is_object()) return Error(absl::StrCat(name, " must be an object"));
  v1::UnitFile file;
  ASSIGN_OR_RETURN(uint64_t unit, Integer(entry, "unit", absl::StrCat(name, ".unit"), 0,
                                          static_cast<uint64_t>(num_units - 1)));
  file.set_unit(static_cast<int>(unit));
  ASSIGN_OR_RETURN(const json* name_field,
                   Field(entry, "file", absl::StrCat(name, ".file"), json::value_t::string));
  const std::string& file_name = name_field->get_ref<const std::string&>();
  if (file_name != UnitFileName(file.unit())) {
    return Error(absl::StrCat(name, ".file is \"", file_name.substr(0, 64), "\"; unit ",
                              file.unit(), "'s file is ", UnitFileName(file.unit())));
  }
  file.set_file(file_name);
  ASSIGN_OR_RETURN(uint64_t bytes,
                   Integer(entry, "bytes", absl::StrCat(name, ".bytes"), 1,
                           static_cast<uint64_t>(std::numeric_limits<int64_t>::max())));
  file.set_bytes(static_cast<int64_t>(bytes));
  ASSIGN_OR_RETURN(const json* sha,
                   Field(entry, "sha256", absl::StrCat(name, ".sha256"), json::value_t::string));
  const std::string& hex = sha->get_ref<const std::string&>();
  if (!IsSha256Hex(hex)) {
    return Error(absl::StrCat(name, ".sha256 must be 64 lowercase hex digits"));
  }
  file.set_sha256(hex);
  return file;
}

absl::Status ManifestParser::Units(const json& manifest, CheckpointManifest* out) const {
  ASSIGN_OR_RETURN(const json* units, Field(manifest, "units", "units", json::value_t::array));
  const int num_units = NumUnits(out->model);
  if (units->size() > static_cast<size_t>(num_units)) {
    return Error(
        absl::StrCat("units lists ", units->size(), " files; the model has ", num_units, " units"));
  }
  out->units.assign(num_units, v1::UnitFile());
  std::vector<bool> seen(num_units, false);
  for (size_t i = 0; i < units->size(); ++i) {
    ASSIGN_OR_RETURN(v1::UnitFile file,
                     Unit((*units)[i], absl::StrCat("units[", i, "]"), num_units));
    if (seen[file.unit()]) return Error(absl::StrCat("unit ", file.unit(), " is listed twice"));
    seen[file.unit()] = true;
    out->units[file.unit()] = std::move(file);
  }
  for (int u = 0; u < num_units; ++u) {
    if (!seen[u]) {
      return Error(absl::StrCat("has no entry for unit ", u, " (", UnitFileName(u), ") of ",
                                num_units, "; the checkpoint is incomplete"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointManifest> ManifestParser::Parse(std::string_view text) {
  const json manifest = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded()) return Error("is not valid JSON (truncated or corrupt)");
  if (!manifest.is_object()) return Error("is not a JSON object");
  auto format = manifest.find("format");
  if (format == manifest.end() || !format->is_string() ||
      format->get_ref<const std::string&>() != kCheckpointManifestFormat) {
    return Error(absl::StrCat("is not a pipetrain checkpoint manifest (\"format\" must be \"",
                              kCheckpointManifestFormat, "\")"));
  }
  auto version = manifest.find("version");
  uint64_t version_number = 0;
  if (version == manifest.end() || !AsUnsigned(*version, &version_number) ||
      version_number != kCheckpointManifestVersion) {
    return Error(absl::StrCat("is a checkpoint manifest of another version (this program reads ",
                              "version ", kCheckpointManifestVersion, ")"));
  }
  CheckpointManifest out;
  ASSIGN_OR_RETURN(const json* job_id, Field(manifest, "job_id", "job_id", json::value_t::string));
  out.job_id = job_id->get<std::string>();
  if (out.job_id.size() > kMaxManifestJobIdBytes) {
    return Error(absl::StrCat("job_id is longer than ", kMaxManifestJobIdBytes, " bytes"));
  }
  ASSIGN_OR_RETURN(uint64_t step,
                   Integer(manifest, "step", "step", 1, static_cast<uint64_t>(kMaxSteps)));
  out.step = static_cast<int64_t>(step);
  ASSIGN_OR_RETURN(out.seed,
                   Integer(manifest, "seed", "seed", 0, std::numeric_limits<uint64_t>::max()));
  ASSIGN_OR_RETURN(out.model, Model(manifest));
  RETURN_IF_ERROR(Units(manifest, &out));
  return out;
}

}  // namespace

absl::StatusOr<CheckpointManifest> ParseCheckpointManifest(std::string_view text,
                                                           const std::string& path) {
  return ManifestParser(path).Parse(text);
}

absl::StatusOr<CheckpointManifest> ReadCheckpointManifest(const std::string& path) {
  // O_NONBLOCK: a FIFO opens at once (and is refused as not a regular file)
  // instead of blocking until some writer comes; regular files ignore it.
  // O_NOFOLLOW: the coordinator never writes the manifest as a link, and one
  // that is could lead out of the directory the caller resolved and
  // checked (an --output-dir's), as a linked step-* or unit file could.
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW));
  if (fd.get() < 0 && errno == ELOOP) {
    return absl::DataLossError(
        absl::StrCat(path, " is a symbolic link: a checkpoint's manifest is a file, never a link"));
  }
  if (fd.get() < 0 && errno == ENOENT) {
    return absl::NotFoundError(absl::StrCat(
        path,
        " is missing: the checkpoint is incomplete (the coordinator writes its manifest "
        "once every unit file is in) or this is not a checkpoint directory"));
  }
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path));
  }
  if (!S_ISREG(st.st_mode)) return absl::DataLossError(absl::StrCat(path, " is not a file"));
  if (st.st_size > kMaxCheckpointManifestBytes) {
    return absl::DataLossError(absl::StrCat(
        path, " is ", st.st_size, " bytes; a manifest is at most ", kMaxCheckpointManifestBytes));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = read(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
    if (n == 0) break;  // shrank while we read: the parse reports it
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return ParseCheckpointManifest(text, path);
}

bool ParseStepDirName(const std::string& name, int64_t* step) {
  constexpr char kPrefix[] = "step-";
  const size_t prefix = sizeof(kPrefix) - 1;
  if (name.size() <= prefix || name.size() > prefix + 18 || name.compare(0, prefix, kPrefix) != 0) {
    return false;
  }
  for (size_t i = prefix; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  return absl::SimpleAtoi(name.substr(prefix), step);
}

namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// The step-* directory in `dir` (a real path) with the highest step whose
// manifest.json exists, links neither followed nor listed; empty when none.
// A step directory it cannot look into, or whose manifest it cannot read,
// is an error, not skipped: it may hold the newest checkpoint, and an
// older one would be resumed, losing the steps since.
absl::StatusOr<std::string> NewestStepDir(const std::string& dir, const std::string& shown) {
  std::unique_ptr<DIR, int (*)(DIR*)> stream(opendir(dir.c_str()), closedir);
  if (stream == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat("cannot list ", shown));
  std::string newest;
  int64_t newest_step = -1;
  // A spec.checkpoint.dir that served two jobs holds both's steps: "the
  // newest" could then be another model's, so it is not guessed.
  std::set<std::string> jobs;
  for (;;) {
    errno = 0;  // readdir's end and its failure both return null
    const dirent* entry = readdir(stream.get());
    if (entry == nullptr && errno != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot list ", shown));
    }
    if (entry == nullptr) break;
    const std::string name = entry->d_name;
    int64_t step = 0;
    if (!ParseStepDirName(name, &step)) continue;
    const std::string step_dir = absl::StrCat(shown, "/", name);
    // `status`, same code, saying why it is not skipped.
    const auto unsure = [&](const absl::Status& status) {
      return absl::Status(status.code(), absl::StrCat(status.message(), "; ", step_dir,
                                                      " may hold the newest checkpoint in ", shown,
                                                      ", so none is picked: make it readable, or "
                                                      "name the step directory to use"));
    };
    absl::StatusOr<std::optional<bool>> holds =
        HoldsCheckpointManifest(dirfd(stream.get()), name, step_dir);
    if (!holds.ok()) return unsure(holds.status());
    if (!holds->value_or(false)) continue;
    const std::string manifest = absl::StrCat(dir, "/", name, "/", kCheckpointManifestName);
    absl::StatusOr<CheckpointManifest> read = ReadCheckpointManifest(manifest);
    if (absl::IsNotFound(read.status())) continue;  // removed since it was looked for
    // A damaged manifest names no job; reading the newest reports it.
    if (!read.ok() && !absl::IsDataLoss(read.status())) return unsure(read.status());
    if (read.ok()) jobs.insert(read->job_id);
    if (step <= newest_step) continue;
    newest = name;
    newest_step = step;
  }
  if (jobs.size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        shown, " holds checkpoints of ", jobs.size(), " jobs (", absl::StrJoin(jobs, ", "),
        "): name the step directory to use, e.g. ", shown, "/", newest));
  }
  return newest;
}

}  // namespace

absl::StatusOr<CheckpointLocation> LocateCheckpoint(const std::string& dir) {
  std::unique_ptr<char, void (*)(void*)> real(realpath(dir.c_str(), nullptr), std::free);
  if (real == nullptr && errno == ENOENT) {
    return absl::NotFoundError(absl::StrCat(dir, ": no such directory"));
  }
  if (real == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat("cannot resolve ", dir));
  const std::string path = real.get();
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, " is not a directory"));
  }
  if (path == "/") return absl::InvalidArgumentError("/ is not a checkpoint directory");
  CheckpointLocation at;
  const size_t slash = path.rfind('/');
  const std::string name = path.substr(slash + 1);
  int64_t step = 0;
  if (ParseStepDirName(name, &step) || Exists(absl::StrCat(path, "/", kCheckpointManifestName))) {
    at.root = slash == 0 ? "/" : path.substr(0, slash);
    at.dir = name;
    return at;
  }
  ASSIGN_OR_RETURN(std::string newest, NewestStepDir(path, dir));
  if (newest.empty()) {
    return absl::NotFoundError(absl::StrCat(
        dir, "/", kCheckpointManifestName, " is missing and no step-* directory in ", dir,
        " has one: this is not a complete checkpoint (the coordinator writes the "
        "manifest once every unit file of a step is in)"));
  }
  at.root = path;
  at.dir = newest;
  at.newest_of_job = true;
  return at;
}

}  // namespace pipetrain
