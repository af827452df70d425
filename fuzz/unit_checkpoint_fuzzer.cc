// Job checkpoints read back from disk (worker/checkpoint/): a unit file
// through ReadUnitCheckpoint (what a resuming worker and `pipetrain
// checkpoint export` do with it), or a manifest.json through
// ReadCheckpointManifest and ParseCheckpointManifest (export, and the
// coordinator's spec.init.from). A checkpoint is a file on a disk others
// can write: truncated, edited, or of another program. The input is
// written to a file under a scratch directory made once per process
// (removed at exit), as the readers take paths. A unit file is recorded
// with its own size and SHA-256, as the coordinator would record what the
// stage reported, so that inputs reach past the checksum to the parser and
// the checks after it.
//
// Input: byte 0, then the file's bytes.
//   bits 0-1  the unit read (of a 1-layer model of 4 units: embed, attn_0,
//             mlp_0, head; vocab 16, max_seq_len 8, 2 heads, d_model 8),
//             at step 3 of job "fuzz-job", seed 7 (the seeds' identity)
//   bit 2     with_moments (a resuming trainer's read; else export's)
//   bit 3     the recorded checksum is another file's (the file was
//             replaced after it was reported)
//   bit 4     the bytes are manifest.json instead of a unit file
//   bits 5-6  the reading layout's data-parallel degree, 1-4, and bit 7
//             its replica (0 or 1, mod the degree): the residuals read
//             are those of the old replicas that replica folds
//
// Checks beyond the sanitizers:
//  - a unit file read with a checksum that is not its own fails, DATA_LOSS;
//  - a unit file that loads holds exactly the unit's parameters, in order,
//    with their shapes (and moments of the same, when asked for after a
//    step), error feedback of the folded replicas among 1..1024 (every
//    parameter's or none, of the parameters' shapes; none of the others'), warm starts and measured
//    partition counts within the bounds unit_checkpoint.h documents (the counts parse back from
//    their own text), and every tensor's buffer holds the elements its shape declares (each is
//    read, so ASan sees a short one);
//  - a manifest that loads has one well-formed entry per unit of a model
//    within the JobSpec limits, and reading the file gives what parsing
//    its bytes gives.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/secrets.h"
#include "fuzz/fuzz_input.h"
#include "spec/job_spec.h"
#include "worker/checkpoint/checkpoint_manifest.h"
#include "worker/checkpoint/unit_checkpoint.h"

namespace {

using namespace pipetrain;

constexpr int64_t kStep = 3;

CheckpointIdentity Identity() { return {"fuzz-job", GptConfig{16, 8, 1, 2, 8}, 7}; }

// <scratch>/step-00000003/, made once; every input's file goes there.
struct Scratch {
  std::string root;
  std::string step_dir;
};

const Scratch& ScratchDir() {
  static const Scratch* scratch = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp", "/ckpt-fuzz.XXXXXX");
    PT_CHECK(mkdtemp(pattern.data()) != nullptr) << "cannot create " << pattern;
    auto* s = new Scratch{pattern, absl::StrCat(pattern, "/", StepDirName(kStep))};
    PT_CHECK(mkdir(s->step_dir.c_str(), 0700) == 0) << s->step_dir;
    std::atexit([] {  // leave /tmp as found
      const Scratch& d = ScratchDir();
      for (int u = 0; u < 4; ++u) unlink(absl::StrCat(d.step_dir, "/", UnitFileName(u)).c_str());
      unlink(absl::StrCat(d.step_dir, "/", kCheckpointManifestName).c_str());
      rmdir(d.step_dir.c_str());
      rmdir(d.root.c_str());
    });
    return s;
  }();
  return *scratch;
}

void WriteFile(const std::string& path, std::string_view bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  PT_CHECK(fd >= 0) << "cannot write " << path;
  PT_CHECK(write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size())) << path;
  close(fd);
}

// Traps unless `t` is a host tensor whose buffer holds its shape's elements
// (all read: ASan reports a buffer shorter than the shape declares).
void CheckTensor(const Tensor& t) {
  if (t.on_device() || t.numel() != NumElements(t.shape())) __builtin_trap();
  if (t.numel() > 0 && t.is_null()) __builtin_trap();
  volatile float sum = 0;
  for (int64_t i = 0; i < t.numel(); ++i) sum = sum + t[i];
}

// `list` holds exactly `params`' names and shapes, in order.
void CheckParameters(const std::vector<NamedTensor>& list,
                     const std::vector<ParameterShape>& params) {
  if (list.size() != params.size()) __builtin_trap();
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].name != params[i].name) __builtin_trap();
    if (list[i].tensor.shape() != Shape(params[i].shape.begin(), params[i].shape.end())) {
      __builtin_trap();
    }
    CheckTensor(list[i].tensor);
  }
}

// The parameter of `params` named `name`, else trap.
const ParameterShape& ParameterNamed(const std::vector<ParameterShape>& params,
                                     const std::string& name) {
  for (const ParameterShape& p : params) {
    if (p.name == name) return p;
  }
  __builtin_trap();
}

// `replica` of `replicas`: the residuals decoded are those of the old
// replicas r with r mod replicas == replica, every parameter's or none.
void CheckUnit(const UnitState& state, int unit, bool with_moments, int64_t steps, int replica,
               int replicas) {
  const GptConfig model = Identity().model;
  const std::vector<ParameterShape> params = UnitParameterShapes(model, unit);
  if (state.unit != unit || steps < 0) __builtin_trap();
  CheckParameters(state.values, params);
  if (with_moments && steps > 0) {
    CheckParameters(state.m, params);
    CheckParameters(state.v, params);
  } else if (!state.m.empty() || !state.v.empty() || !state.feedback.empty() ||
             !state.warm_q.empty() || !state.warm_q_ranks.empty() || !state.link_warm_q.empty() ||
             state.tuned_partitions.has_value()) {
    __builtin_trap();  // nothing but the weights was asked for
  }
  if (state.feedback.size() > static_cast<size_t>(kMaxFeedbackReplicas)) __builtin_trap();
  const size_t folded = state.feedback.size() > static_cast<size_t>(replica)
                            ? state.feedback[static_cast<size_t>(replica)].size()
                            : 0;
  for (size_t r = 0; r < state.feedback.size(); ++r) {
    const std::vector<NamedTensor>& residuals = state.feedback[r];
    // Every folded replica's residuals alike, none of the others'.
    if (residuals.size() != (static_cast<int>(r % replicas) == replica ? folded : 0)) {
      __builtin_trap();
    }
    for (const NamedTensor& e : residuals) {
      const ParameterShape& p = ParameterNamed(params, e.name);
      if (e.tensor.shape() != Shape(p.shape.begin(), p.shape.end())) __builtin_trap();
      CheckTensor(e.tensor);
    }
  }
  for (const NamedTensor& q : state.warm_q) {  // [cols, 1..1024]
    const ParameterShape& p = ParameterNamed(params, q.name);
    const Shape& s = q.tensor.shape();
    if (p.shape.size() != 2 || s.size() != 2 || s[0] != p.shape[1] || s[1] < 1 || s[1] > 1024) {
      __builtin_trap();
    }
    CheckTensor(q.tensor);
  }
  for (const NamedTensor& q : state.warm_q_ranks) {  // [2..1024, 1..cols, 1..1024]
    const ParameterShape& p = ParameterNamed(params, q.name);
    const Shape& s = q.tensor.shape();
    if (p.shape.size() != 2 || s.size() != 3 || s[0] < 2 || s[0] > 1024 || s[1] < 1 ||
        s[1] > p.shape[1] || s[2] < 1 || s[2] > 1024) {
      __builtin_trap();
    }
    CheckTensor(q.tensor);
  }
  for (const LinkWarmStart& link : state.link_warm_q) {
    const Shape& s = link.q.shape();
    if (link.replica < 0 || link.replica >= kMaxFeedbackReplicas || link.peer < 0 ||
        link.peer >= 1024 || !v1::TensorKind_IsValid(link.kind) || link.unit < 0 ||
        link.unit >= NumUnits(model) || s.size() != 2 || s[0] < 1 || s[0] > model.d_model ||
        s[1] < 1 || s[1] > 65536) {
      __builtin_trap();
    }
    CheckTensor(link.q);
  }
  if (state.tuned_partitions.has_value()) {  // as ParseTunedPartitions bounds it
    const TunedPartitions& t = *state.tuned_partitions;
    const int units = NumUnits(model);
    if (t.tensor_parallel < 2 || t.tensor_parallel > 1024 || t.samples < 1 ||
        t.samples > (1 << 20) || t.forward_begin < 0 || t.forward_begin > t.forward_end ||
        t.forward_end > units || t.backward_begin < 0 || t.backward_begin > t.backward_end ||
        t.backward_end > units || static_cast<int>(t.forward.size()) != units ||
        static_cast<int>(t.backward.size()) != units) {
      __builtin_trap();
    }
    for (int u = 0; u < units; ++u) {
      for (int k : {t.forward[u], t.backward[u]}) {
        if (k != 1 && k != 2 && k != 4) __builtin_trap();
      }
    }
    // What was read is what its writer would write back.
    absl::StatusOr<TunedPartitions> again = ParseTunedPartitions(FormatTunedPartitions(t), model);
    if (!again.ok() || !(*again == t)) __builtin_trap();
  }
}

void CheckManifest(const CheckpointManifest& m) {
  if (m.job_id.size() > kMaxManifestJobIdBytes || m.step < 1 || m.step > kMaxSteps) {
    __builtin_trap();
  }
  if (!ValidateGptConfig(m.model).ok() || CountParameters(m.model) > kMaxParameters) {
    __builtin_trap();
  }
  if (static_cast<int>(m.units.size()) != NumUnits(m.model)) __builtin_trap();
  for (int u = 0; u < NumUnits(m.model); ++u) {
    const v1::UnitFile& f = m.units[u];
    if (f.unit() != u || f.file() != UnitFileName(u) || f.bytes() < 1 || f.sha256().size() != 64) {
      __builtin_trap();
    }
    for (char c : f.sha256()) {
      if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) __builtin_trap();
    }
  }
}

bool SameManifest(const CheckpointManifest& a, const CheckpointManifest& b) {
  if (a.job_id != b.job_id || a.step != b.step || a.seed != b.seed ||
      a.units.size() != b.units.size()) {
    return false;
  }
  const GptConfig &x = a.model, &y = b.model;
  if (x.vocab_size != y.vocab_size || x.max_seq_len != y.max_seq_len || x.n_layer != y.n_layer ||
      x.n_head != y.n_head || x.d_model != y.d_model) {
    return false;
  }
  for (size_t i = 0; i < a.units.size(); ++i) {
    if (a.units[i].SerializeAsString() != b.units[i].SerializeAsString()) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Scratch& scratch = ScratchDir();
  FuzzInput in(data, size);
  const uint8_t mode = in.Byte();
  const std::string_view bytes = in.Rest();

  if (mode & 16) {
    const std::string path = absl::StrCat(scratch.step_dir, "/", kCheckpointManifestName);
    WriteFile(path, bytes);
    const absl::StatusOr<CheckpointManifest> read = ReadCheckpointManifest(path);
    const absl::StatusOr<CheckpointManifest> parsed = ParseCheckpointManifest(bytes, path);
    if (read.ok() != parsed.ok()) __builtin_trap();
    if (!read.ok()) {
      if (read.status().code() != absl::StatusCode::kDataLoss) __builtin_trap();
      return 0;
    }
    CheckManifest(*read);
    if (!SameManifest(*read, *parsed)) __builtin_trap();
    return 0;
  }

  const int unit = mode & 3;
  const bool with_moments = mode & 4;
  WriteFile(absl::StrCat(scratch.step_dir, "/", UnitFileName(unit)), bytes);
  v1::ResumeFrom from;
  from.set_step(kStep);
  from.set_dir(StepDirName(kStep));
  v1::UnitFile expected;
  expected.set_unit(unit);
  expected.set_file(UnitFileName(unit));
  expected.set_bytes(static_cast<int64_t>(bytes.size()));
  const bool replaced = mode & 8;
  expected.set_sha256(Sha256Hex(std::string(bytes) + (replaced ? "#" : "")));
  // The new layout's data-parallel degree (1..4) and this replica of it
  // (0 or 1): a resume decodes only the residuals it folds.
  const int replicas = 1 + ((mode >> 5) & 3);
  const int replica = ((mode >> 7) & 1) % replicas;
  int64_t steps = -1;
  const absl::StatusOr<UnitState> state = ReadUnitCheckpoint(
      scratch.root, from, expected, Identity(), with_moments, &steps, replica, replicas);
  if (replaced && state.status().code() != absl::StatusCode::kDataLoss) __builtin_trap();
  if (state.ok()) CheckUnit(*state, unit, with_moments, steps, replica, replicas);
  return 0;
}
