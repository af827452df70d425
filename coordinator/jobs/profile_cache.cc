#include "coordinator/jobs/profile_cache.h"

#include "absl/strings/str_cat.h"

namespace pipetrain {

std::string ProfileKey(const v1::ProfileRequest& r, const std::string& device_kind) {
  const v1::ModelSpec& m = r.model();
  std::string partitions;  // AccTFM's partition timings, when asked for
  for (int k : r.partitions()) absl::StrAppend(&partitions, partitions.empty() ? " K" : ",", k);
  return absl::StrCat("L", m.n_layer(), " H", m.n_head(), " D", m.d_model(), " V", m.vocab_size(),
                      " P", m.max_seq_len(), " T", r.seq_len(), " B", r.micro_batch_size(),
                      partitions, " @ ", device_kind);
}

ModelProfile FromProto(const v1::ModelProfile& p) {
  ModelProfile out;
  out.micro_batch_size = p.micro_batch_size();
  for (const v1::UnitProfile& u : p.units()) {
    out.units.push_back({u.name(), u.fwd_seconds(), u.bwd_seconds(), u.weight_bytes(),
                         u.activation_bytes(), u.stash_bytes()});
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

std::optional<v1::ModelProfile> ProfileCache::Get(const std::string& key) const {
  AnnotatedMutexLock lock(&mu_);
  auto it = profiles_.find(key);
  if (it == profiles_.end()) return std::nullopt;
  return it->second;
}

void ProfileCache::Put(const std::string& key, const v1::ModelProfile& profile) {
  AnnotatedMutexLock lock(&mu_);
  profiles_[key] = profile;
}

int ProfileCache::size() const {
  AnnotatedMutexLock lock(&mu_);
  return static_cast<int>(profiles_.size());
}

}  // namespace pipetrain
