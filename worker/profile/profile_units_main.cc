// profile_units: profiles every unit of a GPT-2 model on this machine and
// prints the result as a table, or with --json as the profile file the
// planner reads (docs/formats.md; `pipetrain plan --profile FILE`).
//
//   profile_units --n-layer 2 --n-head 4 --d-model 128 --vocab 256
//       --seq-len 64 --micro-batch 4 [--warmup 2] [--repetitions 5]
//       [--seed 1] [--threads 1] [--max-seq-len 0] [--json] > profile.json
//
// Progress goes to stderr, the profile to stdout. Exit status: 0 on success,
// 2 for bad flags or an invalid model, 1 for any other failure.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/flag_set.h"
#include "common/malloc_tuning.h"
#include "kernels/cpu/blas.h"
#include "worker/profile/unit_profiler.h"

namespace pipetrain {
namespace {

struct Flags {
  int n_layer = 2;
  int n_head = 4;
  int d_model = 128;
  int vocab = 256;
  int max_seq_len = 0;
  int seq_len = 64;
  int micro_batch = 4;
  int warmup = kDefaultProfileWarmup;
  int repetitions = kDefaultProfileRepetitions;
  uint64_t seed = 1;
  int threads = 1;
  bool json = false;
};

void BindFlags(FlagSet* flags, Flags* f) {
  flags->Int("n-layer", &f->n_layer, "transformer blocks");
  flags->Int("n-head", &f->n_head, "attention heads (must divide --d-model)");
  flags->Int("d-model", &f->d_model, "model width");
  flags->Int("vocab", &f->vocab, "vocabulary size");
  flags->Int("max-seq-len", &f->max_seq_len, "position-embedding rows (0: --seq-len)");
  flags->Int("seq-len", &f->seq_len, "tokens per sequence");
  flags->Int("micro-batch", &f->micro_batch, "sequences per micro-batch");
  flags->Int("warmup", &f->warmup, "untimed runs per unit (0: default 2)");
  flags->Int("repetitions", &f->repetitions,
             "timed runs per unit; the median is reported "
             "(0: default 5)");
  flags->Uint64("seed", &f->seed, "parameter and synthetic-batch seed");
  flags->Int("threads", &f->threads, "OpenBLAS threads");
  flags->Bool("json", &f->json, "print the planner's profile JSON instead of a table");
}

v1::ProfileRequest MakeRequest(const Flags& f) {
  v1::ProfileRequest request;
  v1::ModelSpec* model = request.mutable_model();
  model->set_n_layer(f.n_layer);
  model->set_n_head(f.n_head);
  model->set_d_model(f.d_model);
  model->set_vocab_size(f.vocab);
  if (f.max_seq_len != 0) model->set_max_seq_len(f.max_seq_len);
  request.set_seq_len(f.seq_len);
  request.set_micro_batch_size(f.micro_batch);
  request.set_warmup(f.warmup);
  request.set_repetitions(f.repetitions);
  request.set_seed(f.seed);
  return request;
}

constexpr double kMiB = 1024.0 * 1024.0;

void PrintTable(const v1::ModelProfile& profile) {
  std::printf("%-10s %12s %12s %12s %14s %12s %14s %14s\n", "unit", "fwd_ms", "bwd_ms",
              "weight_MiB", "activation_MiB", "stash_MiB", "transient_MiB", "peak_est_MiB");
  for (const v1::UnitProfile& u : profile.units()) {
    std::printf("%-10s %12.4f %12.4f %12.3f %14.3f %12.3f %14.3f %14.3f\n", u.name().c_str(),
                u.fwd_seconds() * 1e3, u.bwd_seconds() * 1e3, u.weight_bytes() / kMiB,
                u.activation_bytes() / kMiB, u.stash_bytes() / kMiB, u.transient_bytes() / kMiB,
                u.peak_memory_bytes() / kMiB);
  }
  std::printf(
      "# device %s, micro-batch %d, median of %d timed runs; peak_est is an estimate "
      "from tensor sizes, not a measurement\n",
      profile.device_kind().c_str(), profile.micro_batch_size(), profile.repetitions());
}

int Run(const std::vector<std::string>& args) {
  Flags f;
  FlagSet flags(
      "usage: profile_units [--n-layer N --n-head H --d-model D --vocab V "
      "--seq-len T --micro-batch B] [--json]");
  BindFlags(&flags, &f);
  absl::Status parsed = flags.Parse(args);
  if (flags.help_requested()) return std::printf("%s", flags.Usage().c_str()), 0;
  if (parsed.ok() && f.threads < 1) parsed = absl::InvalidArgumentError("--threads must be >= 1");
  if (!parsed.ok()) {
    std::fprintf(stderr, "profile_units: %s\n", std::string(parsed.message()).c_str());
    return 2;
  }
  SetBlasThreads(f.threads);
  const v1::ProfileRequest request = MakeRequest(f);
  const int units = 2 * f.n_layer + 2;
  auto profile = ProfileUnits(request, [units](int index, const std::string& name) {
    std::fprintf(stderr, "profiling unit %d/%d: %s\n", index + 1, units, name.c_str());
    return absl::OkStatus();
  });
  if (!profile.ok()) {
    std::fprintf(stderr, "profile_units: %s\n", std::string(profile.status().message()).c_str());
    return profile.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (f.json) {
    std::fputs(ProfileToFileJson(*profile).c_str(), stdout);
  } else {
    PrintTable(*profile);
  }
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  pipetrain::ConfigureBlasOrReexec(argv);
  pipetrain::TuneMallocForLargeBuffers();  // As pipetrain-worker does: malloc_tuning.h.
  return pipetrain::Run(std::vector<std::string>(argv + 1, argv + argc));
}
