#include "coordinator/jobs/profile_cache.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/secrets.h"
#include "common/status_macros.h"

namespace pipetrain {

std::string ProfileKey(const v1::ProfileRequest& r, const std::string& device_kind) {
  // Escaped, a 256-byte device name may grow 4x, past the store's key
  // limit: a long kind keeps its start and a digest of the whole (stable
  // across restarts, as stored keys must be).
  std::string kind = absl::CEscape(device_kind);
  if (kind.size() > kMaxProfileKindBytes) {
    kind = absl::StrCat(kind.substr(0, kMaxProfileKindBytes - 20), " #",
                        HmacSha256Hex("pipetrain profile key", device_kind).substr(0, 16));
  }
  const v1::ModelSpec& m = r.model();
  std::string partitions;  // AccTFM's partition timings, when asked for
  for (int k : r.partitions()) absl::StrAppend(&partitions, partitions.empty() ? " K" : ",", k);
  return absl::StrCat("L", m.n_layer(), " H", m.n_head(), " D", m.d_model(), " V", m.vocab_size(),
                      " P", m.max_seq_len(), " T", r.seq_len(), " B", r.micro_batch_size(),
                      partitions, " @ ", kind);
}

std::string ProfileDeviceKey(const v1::DeviceInfo& device, const v1::BuildIdentity& build) {
  std::string setup;
  const std::string& backend = device.backend();
  // "cuda:N (<name>), <modes>": the modes.
  if (absl::StartsWith(backend, "cuda:")) {
    if (const size_t modes = backend.find("), "); modes != std::string::npos) {
      setup = backend.substr(modes + 3);
    }
  }
  if (device.compute_threads() > 0) {
    absl::StrAppend(&setup, setup.empty() ? "" : ", ", device.compute_threads(), " threads");
  }
  std::string key =
      setup.empty() ? DeviceKind(device) : absl::StrCat(DeviceKind(device), " | ", setup);
  if (!build.version().empty() || !build.commit().empty()) {
    absl::StrAppend(&key, " | build ", build.version(), " (", build.commit(), ")");
  }
  return key;
}

AnalyticAttention AnalyticAttentionOf(const v1::DeviceInfo& device) {
  const std::string& backend = device.backend();
  if (!absl::StartsWith(backend, "cuda:")) return AnalyticAttention::kCpu;
  return absl::StrContains(backend, ", flash attention") ? AnalyticAttention::kCudaFlash
                                                         : AnalyticAttention::kCudaGemm;
}

ModelProfile FromProto(const v1::ModelProfile& p, const ModelProfile* model_sizes) {
  ModelProfile out;
  out.micro_batch_size = p.micro_batch_size();
  for (const v1::UnitProfile& u : p.units()) {
    out.units.push_back({u.name(), u.fwd_seconds(), u.bwd_seconds(), u.weight_bytes(),
                         u.activation_bytes(), u.stash_bytes()});
    out.units.back().transient_bytes = u.transient_bytes();
    const size_t index = out.units.size() - 1;
    if (u.transient_bytes() == 0 && model_sizes != nullptr && index < model_sizes->units.size()) {
      out.units.back().transient_bytes = model_sizes->units[index].transient_bytes;
    }
    out.units.back().optimizer_seconds = u.optimizer_seconds();
    for (const v1::PartitionTiming& t : u.partitions()) {
      out.units.back().partition_seconds[t.count()] = {t.fwd_seconds(), t.bwd_seconds()};
    }
  }
  for (const v1::CodecTiming& c : p.codecs()) {
    out.codec_all_reduce_seconds_per_byte[c.codec()] = c.all_reduce_seconds_per_byte();
  }
  return out;
}

const char* AnalyticAttentionName(AnalyticAttention attention) {
  switch (attention) {
    case AnalyticAttention::kCpu:
      return "CPU";
    case AnalyticAttention::kCudaGemm:
      return "CUDA GEMM";
    case AnalyticAttention::kCudaFlash:
      return "CUDA flash";
  }
  return "unknown";
}

ModelProfile ProfileForAttentions(const ModelProfile& profile,
                                  std::optional<AnalyticAttention> profiled,
                                  const std::vector<AnalyticAttention>& placed,
                                  const std::function<ModelProfile(AnalyticAttention)>& sizes_of,
                                  std::string* note) {
  if (note != nullptr) note->clear();
  std::set<AnalyticAttention> others;
  bool profiled_placed = false;
  for (AnalyticAttention kind : placed) {
    if (profiled.has_value() && kind == *profiled) {
      profiled_placed = true;
    } else {
      others.insert(kind);
    }
  }
  if (others.empty()) return profile;
  ModelProfile out = profile;
  // The profile's own sizes count where its kind runs, or may (not known).
  const bool keep_own = profiled_placed || !profiled.has_value();
  if (!keep_own) {
    for (UnitProfile& u : out.units) u.stash_bytes = u.transient_bytes = 0;
  }
  // Another kind's: the measured size moved by what the model's shape says
  // differs between the kinds (attention's probabilities; nothing in the
  // other units, whose measurement stays), never below that kind's shape
  // (a measurement under the profiled kind's shape must not understate
  // it); the profile's kind not known, the larger of the two.
  const std::optional<ModelProfile> own =
      profiled.has_value() ? std::optional<ModelProfile>(sizes_of(*profiled)) : std::nullopt;
  const auto other = [&](double measured, double theirs, double ours) {
    return own.has_value() ? std::max(theirs, measured + theirs - ours)
                           : std::max(measured, theirs);
  };
  std::vector<std::string> names;
  for (AnalyticAttention kind : others) {
    names.push_back(AnalyticAttentionName(kind));
    const ModelProfile sizes = sizes_of(kind);
    for (size_t i = 0; i < out.units.size() && i < sizes.units.size(); ++i) {
      const bool ours = own.has_value() && i < own->units.size();
      out.units[i].stash_bytes = std::max(
          out.units[i].stash_bytes, other(profile.units[i].stash_bytes, sizes.units[i].stash_bytes,
                                          ours ? own->units[i].stash_bytes : 0));
      out.units[i].transient_bytes =
          std::max(out.units[i].transient_bytes,
                   other(profile.units[i].transient_bytes, sizes.units[i].transient_bytes,
                         ours ? own->units[i].transient_bytes : 0));
    }
  }
  bool changed = false;
  for (size_t i = 0; i < out.units.size(); ++i) {
    changed = changed || out.units[i].stash_bytes != profile.units[i].stash_bytes ||
              out.units[i].transient_bytes != profile.units[i].transient_bytes;
  }
  if (note != nullptr && changed) {
    *note = keep_own ? absl::StrCat("; stash and transient memory also sized for ",
                                    absl::StrJoin(names, " and "), " attention (analytic)")
                     : absl::StrCat("; stash and transient memory sized for ",
                                    absl::StrJoin(names, " and "),
                                    " attention (analytic), not the profile's ",
                                    AnalyticAttentionName(*profiled));
  }
  return out;
}

namespace {

absl::Status BadProfile(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("worker profile: ", field, " ", why));
}

// Whether `value` (a time or a size) is finite and in [0, limit].
absl::Status CheckAmount(const std::string& field, double value, double limit) {
  if (!std::isfinite(value) || value < 0 || value > limit) {
    return BadProfile(field, absl::StrCat("is ", value, ", not a number in [0, ", limit, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckWorkerProfile(const v1::ModelProfile& profile, const v1::ProfileRequest& request,
                                const std::vector<std::string>& unit_names,
                                const ModelProfile* model_sizes) {
  if (profile.micro_batch_size() != request.micro_batch_size()) {
    return BadProfile("micro_batch_size",
                      absl::StrCat("is ", profile.micro_batch_size(), ", not the ",
                                   request.micro_batch_size(), " asked for"));
  }
  if (profile.units_size() != static_cast<int>(unit_names.size())) {
    return BadProfile("units",
                      absl::StrCat("has ", profile.units_size(), " entries; the model has ",
                                   unit_names.size(), " units"));
  }
  if (profile.repetitions() < 0) return BadProfile("repetitions", "is negative");
  // The store's numbering of its records (CoordinatorState::SaveProfile): a
  // worker has none to give, and a cached profile carrying one would differ
  // from the same profile loaded back from the store.
  if (profile.store_sequence() != 0) {
    return BadProfile("store_sequence", "is set; only the coordinator's store sets it");
  }
  if (profile.device_kind().size() > kMaxProfileDeviceKindBytes) {
    return BadProfile("device_kind",
                      absl::StrCat("is over ", kMaxProfileDeviceKindBytes, " bytes"));
  }
  for (int u = 0; u < profile.units_size(); ++u) {
    const v1::UnitProfile& unit = profile.units(u);
    const std::string at = absl::StrCat("units[", u, "]");
    if (unit.name() != unit_names[u]) {
      return BadProfile(at + ".name", absl::StrCat("is not \"", unit_names[u], "\""));
    }
    const std::pair<const char*, double> seconds[] = {
        {"fwd_seconds", unit.fwd_seconds()},
        {"bwd_seconds", unit.bwd_seconds()},
        {"optimizer_seconds", unit.optimizer_seconds()}};
    for (const auto& [name, value] : seconds) {
      RETURN_IF_ERROR(CheckAmount(at + "." + name, value, kMaxProfileSeconds));
    }
    const std::pair<const char*, double> bytes[] = {
        {"weight_bytes", unit.weight_bytes()},
        {"activation_bytes", unit.activation_bytes()},
        {"stash_bytes", unit.stash_bytes()},
        {"transient_bytes", unit.transient_bytes()},
        {"peak_memory_bytes", unit.peak_memory_bytes()}};
    for (const auto& [name, value] : bytes) {
      RETURN_IF_ERROR(CheckAmount(at + "." + name, value, kMaxProfileBytes));
    }
    const UnitProfile* model_unit =
        model_sizes != nullptr && u < static_cast<int>(model_sizes->units.size())
            ? &model_sizes->units[u]
            : nullptr;
    if (model_unit != nullptr) {
      const UnitProfile& expected = *model_unit;
      if (unit.weight_bytes() != expected.weight_bytes) {
        return BadProfile(
            at + ".weight_bytes",
            absl::StrCat("is ", unit.weight_bytes(), ", not the model's ", expected.weight_bytes));
      }
      if (unit.activation_bytes() != expected.activation_bytes) {
        return BadProfile(at + ".activation_bytes",
                          absl::StrCat("is ", unit.activation_bytes(), ", not the model's ",
                                       expected.activation_bytes));
      }
      const std::pair<const char*, std::pair<double, double>> within_twice[] = {
          {"stash_bytes", {unit.stash_bytes(), expected.stash_bytes}},
          {"transient_bytes", {unit.transient_bytes(), expected.transient_bytes}}};
      for (const auto& [name, sizes] : within_twice) {
        if (sizes.first > 2 * sizes.second) {
          return BadProfile(
              at + "." + name,
              absl::StrCat("is ", sizes.first, ", over twice the model's ", sizes.second));
        }
        // Nor under half (a transient of 0 is "not measured": the model's
        // stands in, FromProto): plans of the model would take its
        // activations for free and fit what runs out of memory.
        const bool unmeasured = std::string(name) == "transient_bytes" && sizes.first == 0;
        if (!unmeasured && 2 * sizes.first < sizes.second) {
          return BadProfile(
              at + "." + name,
              absl::StrCat("is ", sizes.first, ", under half the model's ", sizes.second));
        }
      }
      const std::pair<const char*, std::pair<double, double>> passes[] = {
          {"fwd_seconds", {unit.fwd_seconds(), expected.fwd_seconds}},
          {"bwd_seconds", {unit.bwd_seconds(), expected.bwd_seconds}}};
      for (const auto& [name, times] : passes) {
        const auto [seconds, at_reference] = times;
        const double flops = at_reference * kModelSizesFlopsPerSecond;
        if (flops > 0 && !(seconds > 0 && flops / seconds <= kMaxProfileFlopsPerSecond)) {
          return BadProfile(at + "." + name,
                            absl::StrCat("is ", seconds, " s for ", flops, " FLOPs: faster than ",
                                         kMaxProfileFlopsPerSecond, " FLOP/s, no measurement"));
        }
      }
    }
    if (unit.partitions_size() != request.partitions_size()) {
      return BadProfile(at + ".partitions",
                        absl::StrCat("has ", unit.partitions_size(), " entries; ",
                                     request.partitions_size(), " were asked for"));
    }
    for (int k = 0; k < unit.partitions_size(); ++k) {
      const v1::PartitionTiming& t = unit.partitions(k);
      const std::string where = absl::StrCat(at, ".partitions[", k, "]");
      if (t.count() != request.partitions(k)) {
        return BadProfile(where + ".count", absl::StrCat("is ", t.count(), ", not the ",
                                                         request.partitions(k), " asked for"));
      }
      RETURN_IF_ERROR(CheckAmount(where + ".fwd_seconds", t.fwd_seconds(), kMaxProfileSeconds));
      RETURN_IF_ERROR(CheckAmount(where + ".bwd_seconds", t.bwd_seconds(), kMaxProfileSeconds));
      if (model_unit == nullptr || t.count() < 1) continue;
      // One of `count` micro-partitions: about 1 / count of the unit's
      // FLOPs, bounded as the whole pass (tensor-parallel plans cost each
      // partition by these; near 0, Alg. 1 would take the most partitions
      // as free).
      const std::pair<const char*, std::pair<double, double>> partition_passes[] = {
          {"fwd_seconds", {t.fwd_seconds(), model_unit->fwd_seconds}},
          {"bwd_seconds", {t.bwd_seconds(), model_unit->bwd_seconds}}};
      for (const auto& [name, times] : partition_passes) {
        const auto [seconds, at_reference] = times;
        const double flops = at_reference * kModelSizesFlopsPerSecond / t.count();
        if (flops > 0 && !(seconds > 0 && flops / seconds <= kMaxProfileFlopsPerSecond)) {
          return BadProfile(where + "." + name,
                            absl::StrCat("is ", seconds, " s for ", flops, " FLOPs: faster than ",
                                         kMaxProfileFlopsPerSecond, " FLOP/s, no measurement"));
        }
      }
    }
  }
  if (profile.codecs_size() > static_cast<int>(kMaxProfileCodecs)) {
    return BadProfile("codecs", absl::StrCat("has over ", kMaxProfileCodecs, " entries"));
  }
  std::set<std::string> codecs;
  for (int i = 0; i < profile.codecs_size(); ++i) {
    const v1::CodecTiming& c = profile.codecs(i);
    const std::string at = absl::StrCat("codecs[", i, "]");
    if (c.codec().empty() || c.codec().size() > kMaxProfileCodecNameBytes ||
        !codecs.insert(c.codec()).second) {
      return BadProfile(at + ".codec",
                        absl::StrCat("must be a name of 1 to ", kMaxProfileCodecNameBytes,
                                     " bytes, each at most once"));
    }
    if (absl::Status known = CheckProfileCodecName(c.codec()); !known.ok()) {
      return BadProfile(at + ".codec", std::string(known.message()));
    }
    RETURN_IF_ERROR(CheckAmount(at + ".all_reduce_seconds_per_byte",
                                c.all_reduce_seconds_per_byte(), kMaxCodecSecondsPerByte));
    if (c.all_reduce_seconds_per_byte() < kMinProfileCodecSecondsPerByte) {
      return BadProfile(
          at + ".all_reduce_seconds_per_byte",
          absl::StrCat("is ", c.all_reduce_seconds_per_byte(), ", under ",
                       kMinProfileCodecSecondsPerByte, " (faster than 10 TB/s): no measurement"));
    }
  }
  return absl::OkStatus();
}

std::optional<v1::ModelProfile> ProfileCache::Get(const std::string& key) const {
  AnnotatedMutexLock lock(&mu_);
  auto it = profiles_.find(key);
  if (it == profiles_.end()) return std::nullopt;
  it->second.last_use = ++uses_;
  return it->second.profile;
}

std::vector<std::string> ProfileCache::Put(const std::string& key,
                                           const v1::ModelProfile& profile) {
  AnnotatedMutexLock lock(&mu_);
  profiles_[key] = Entry{profile, ++uses_};
  std::vector<std::string> evicted;
  while (profiles_.size() > std::max<size_t>(capacity_, 1)) {
    auto oldest = profiles_.begin();
    for (auto it = profiles_.begin(); it != profiles_.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    evicted.push_back(oldest->first);
    profiles_.erase(oldest);
  }
  return evicted;
}

int ProfileCache::size() const {
  AnnotatedMutexLock lock(&mu_);
  return static_cast<int>(profiles_.size());
}

}  // namespace pipetrain
