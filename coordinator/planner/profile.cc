#include "coordinator/planner/profile.h"

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/echo_input.h"
#include "common/json_unique_keys.h"
#include "common/status_macros.h"
#include "common/terminal_safe.h"
#include "kernels/compress/codec_spec.h"
#include "nlohmann/json.hpp"
#include "spec/job_spec.h"

namespace pipetrain {

namespace {

using nlohmann::json;

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// The keys each object of a profile file may hold, for ParseProfileJson
// and FirstUnknownProfileKey alike; never destroyed.
const std::set<std::string>& ProfileKeys() {
  static const auto* const keys = new std::set<std::string>{"micro_batch_size", "units", "codecs"};
  return *keys;
}
const std::set<std::string>& UnitKeys() {
  static const auto* const keys = new std::set<std::string>{
      "name",        "fwd_seconds",     "bwd_seconds",       "weight_bytes", "activation_bytes",
      "stash_bytes", "transient_bytes", "optimizer_seconds", "partitions"};
  return *keys;
}
const std::set<std::string>& PartitionKeys() {
  static const auto* const keys = new std::set<std::string>{"count", "fwd_seconds", "bwd_seconds"};
  return *keys;
}
const std::set<std::string>& CodecKeys() {
  static const auto* const keys = new std::set<std::string>{"codec", "all_reduce_seconds_per_byte"};
  return *keys;
}

// The first key of `object` (named `where`) outside `allowed`, named as
// the error shows it; "" when none, or when `object` is no object.
std::string UnknownKey(const json& object, const std::string& where,
                       const std::set<std::string>& allowed) {
  if (!object.is_object()) return "";
  for (const auto& [key, value] : object.items()) {
    if (allowed.count(key) == 0) {
      // Escaped and cut: a shared file's key may hold an escape sequence
      // for the terminal that shows the error, or be megabytes long.
      const std::string shown = EchoInput(key);
      return where.empty() ? shown : where + "." + shown;
    }
  }
  return "";
}

// Rejects keys outside `allowed`, so typos do not silently use defaults.
absl::Status OnlyKeys(const json& object, const std::string& where,
                      const std::set<std::string>& allowed) {
  if (!object.is_object()) return Invalid(where.empty() ? "(top level)" : where, "must be an object");
  if (const std::string key = UnknownKey(object, where, allowed); !key.empty()) {
    return Invalid(key, "unknown field");
  }
  return absl::OkStatus();
}

// `object[key]` when it is a list, else null.
const json* ListAt(const json& object, const std::string& key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it != object.end() && it->is_array() ? &*it : nullptr;
}

// What a field that is not there reads as (null); never destroyed, as
// static objects should not be.
const json& Absent() {
  static const json* const absent = new json();
  return *absent;
}

// The largest number a profile or cluster file may hold: sums and products
// of them (a plan's seconds over 2050 units and millions of micro-batches,
// bytes over its stages) stay far inside a double, where 1e308 in two units
// added up to infinity and broke every solver's arithmetic.
constexpr double kMaxFileNumber = 1e18;
static_assert(kMaxProfileUnits == 2 * kMaxLayers + 2, "profile.h's bound follows n_layer's");

// A required finite number in [0, kMaxFileNumber] (> 0 when `positive`).
absl::StatusOr<double> Number(const json& object, const std::string& key,
                              const std::string& where, bool positive, bool required = true,
                              double fallback = 0) {
  const std::string field = where.empty() ? key : where + "." + key;
  if (!object.contains(key)) {
    if (required) return Invalid(field, "missing");
    return fallback;
  }
  const json& v = object.at(key);
  if (!v.is_number()) return Invalid(field, "must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < 0 || (positive && d == 0)) {
    return Invalid(field, positive ? "must be a finite number > 0" : "must be a finite number >= 0");
  }
  if (d > kMaxFileNumber) return Invalid(field, "must be at most 1e18");
  return d;
}

// An optional whole number in [0, limit] (0 when absent).
absl::StatusOr<int> Count(const json& object, const std::string& key, const std::string& where,
                          int limit) {
  ASSIGN_OR_RETURN(const double value, Number(object, key, where, false, false, 0));
  if (value != std::floor(value) || value > limit) {
    return Invalid(where + "." + key, absl::StrCat("must be a whole number in [0, ", limit, "]"));
  }
  return static_cast<int>(value);
}

// A key given twice would otherwise have its last value win unseen.
absl::StatusOr<json> Parse(const std::string& text) { return ParseJsonUniqueKeys(text); }

// A name printed in plans and tables: 1 to `max_bytes` bytes without
// characters that act on a terminal (FirstTerminalControl: an escape
// sequence, a C1 control such as U+009B, a bidirectional override in a
// file would act on the terminal of whoever plans with it).
absl::Status CheckName(const json& name, size_t max_bytes, const std::string& field) {
  const std::string what =
      absl::StrCat("must be a string of 1 to ", max_bytes, " bytes without control characters");
  if (!name.is_string()) return Invalid(field, what);
  const std::string& text = name.get_ref<const std::string&>();
  if (text.empty() || text.size() > max_bytes) return Invalid(field, what);
  if (FirstTerminalControl(text).has_value()) return Invalid(field, what);
  return absl::OkStatus();
}

absl::StatusOr<UnitProfile> ParseUnit(const json& u, const std::string& where) {
  if (auto s = OnlyKeys(u, where, UnitKeys()); !s.ok()) return s;
  UnitProfile unit;
  if (!u.contains("name")) return Invalid(where + ".name", "missing string");
  RETURN_IF_ERROR(CheckName(u["name"], kMaxProfileUnitNameBytes, where + ".name"));
  unit.name = u["name"].get<std::string>();
  ASSIGN_OR_RETURN(unit.fwd_seconds, Number(u, "fwd_seconds", where, false));
  ASSIGN_OR_RETURN(unit.bwd_seconds, Number(u, "bwd_seconds", where, false));
  ASSIGN_OR_RETURN(unit.weight_bytes, Number(u, "weight_bytes", where, false));
  ASSIGN_OR_RETURN(unit.activation_bytes, Number(u, "activation_bytes", where, false));
  ASSIGN_OR_RETURN(unit.stash_bytes, Number(u, "stash_bytes", where, false, false, 0));
  ASSIGN_OR_RETURN(unit.transient_bytes, Number(u, "transient_bytes", where, false, false, 0));
  ASSIGN_OR_RETURN(unit.optimizer_seconds, Number(u, "optimizer_seconds", where, false, false, 0));
  // Optional: one of K micro-partitions' measured passes (K 2 or 4, once each).
  if (u.contains("partitions")) {
    const json& list = u["partitions"];
    if (!list.is_array() || list.size() > 2) {
      return Invalid(where + ".partitions", "must be a list of at most 2 entries");
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string at = absl::StrCat(where, ".partitions[", i, "]");
      if (auto s = OnlyKeys(list[i], at, PartitionKeys()); !s.ok()) return s;
      // Both arms lvalues: a prvalue arm would copy the value (recursively).
      const json& count = list[i].contains("count") ? list[i]["count"] : Absent();
      if (!count.is_number_integer() || (count.get<int64_t>() != 2 && count.get<int64_t>() != 4) ||
          unit.partition_seconds.count(count.get<int>()) > 0) {
        return Invalid(at + ".count", "must be 2 or 4, each at most once");
      }
      ASSIGN_OR_RETURN(const double fwd, Number(list[i], "fwd_seconds", at, false));
      ASSIGN_OR_RETURN(const double bwd, Number(list[i], "bwd_seconds", at, false));
      unit.partition_seconds[count.get<int>()] = {fwd, bwd};
    }
  }
  return unit;
}

}  // namespace

absl::StatusOr<ModelProfile> ParseProfileJson(const std::string& text) {
  auto parsed = Parse(text);
  if (!parsed.ok()) return parsed.status();
  const json& j = *parsed;
  if (auto s = OnlyKeys(j, "", ProfileKeys()); !s.ok()) return s;
  ModelProfile profile;
  double mbs = 0;
  ASSIGN_OR_RETURN(mbs, Number(j, "micro_batch_size", "", true));
  if (mbs != std::floor(mbs)) return Invalid("micro_batch_size", "must be an integer");
  if (mbs > std::numeric_limits<int>::max()) {
    return Invalid("micro_batch_size",
                   absl::StrCat(mbs, " is over the limit of ", std::numeric_limits<int>::max()));
  }
  profile.micro_batch_size = static_cast<int>(mbs);
  if (!j.contains("units") || !j["units"].is_array() || j["units"].empty()) {
    return Invalid("units", "must be a non-empty list");
  }
  if (j["units"].size() > static_cast<size_t>(kMaxProfileUnits)) {
    return Invalid(
        "units", absl::StrCat("holds ", j["units"].size(), " units; at most ", kMaxProfileUnits,
                              " (a model of ", kMaxLayers, " layers, spec.model.n_layer's bound)"));
  }
  std::set<std::string> unit_names;
  for (size_t i = 0; i < j["units"].size(); ++i) {
    auto unit = ParseUnit(j["units"][i], absl::StrCat("units[", i, "]"));
    if (!unit.ok()) return unit.status();
    // Plans and the timeline name units: two of one name would read as one.
    if (!unit_names.insert(unit->name).second) {
      return Invalid(absl::StrCat("units[", i, "].name"),
                     absl::StrCat("\"", unit->name, "\" names two units"));
    }
    profile.units.push_back(*unit);
  }
  if (j.contains("codecs")) {
    const json& codecs = j["codecs"];
    if (!codecs.is_array() || codecs.size() > kMaxProfileCodecs) {
      return Invalid("codecs", absl::StrCat("must be a list of at most ", kMaxProfileCodecs,
                                            " entries"));
    }
    for (size_t i = 0; i < codecs.size(); ++i) {
      const std::string at = absl::StrCat("codecs[", i, "]");
      if (auto s = OnlyKeys(codecs[i], at, CodecKeys()); !s.ok()) return s;
      const json& name = codecs[i].contains("codec") ? codecs[i]["codec"] : Absent();
      if (!name.is_string() || name.get<std::string>().empty() ||
          name.get<std::string>().size() > kMaxProfileCodecNameBytes ||
          profile.codec_all_reduce_seconds_per_byte.count(name.get<std::string>()) > 0) {
        return Invalid(at + ".codec",
                       absl::StrCat("must be a name of 1 to ", kMaxProfileCodecNameBytes,
                                    " bytes, each at most once"));
      }
      if (absl::Status known = CheckProfileCodecName(name.get<std::string>()); !known.ok()) {
        return Invalid(at + ".codec", std::string(known.message()));
      }
      ASSIGN_OR_RETURN(const double seconds,
                       Number(codecs[i], "all_reduce_seconds_per_byte", at, false));
      if (seconds > kMaxCodecSecondsPerByte) {
        return Invalid(at + ".all_reduce_seconds_per_byte",
                       "must be at most 1e-3");  // kMaxCodecSecondsPerByte, as written
      }
      profile.codec_all_reduce_seconds_per_byte[name.get<std::string>()] = seconds;
    }
  }
  return profile;
}

std::string FirstUnknownProfileKey(const std::string& text) {
  const absl::StatusOr<json> parsed = Parse(text);
  if (!parsed.ok()) return "";
  // The objects ParseProfileJson reads, in its order.
  std::string found = UnknownKey(*parsed, "", ProfileKeys());
  if (const json* units = ListAt(*parsed, "units")) {
    for (size_t i = 0; found.empty() && i < units->size(); ++i) {
      const std::string at = absl::StrCat("units[", i, "]");
      found = UnknownKey((*units)[i], at, UnitKeys());
      const json* partitions = ListAt((*units)[i], "partitions");
      for (size_t k = 0; found.empty() && partitions != nullptr && k < partitions->size(); ++k) {
        found =
            UnknownKey((*partitions)[k], absl::StrCat(at, ".partitions[", k, "]"), PartitionKeys());
      }
    }
  }
  if (const json* codecs = ListAt(*parsed, "codecs")) {
    for (size_t i = 0; found.empty() && i < codecs->size(); ++i) {
      found = UnknownKey((*codecs)[i], absl::StrCat("codecs[", i, "]"), CodecKeys());
    }
  }
  return found;
}

absl::Status CheckProfileCodecName(const std::string& name) {
  if (name == "powersgd:rank=1" || name == "powersgd:rank=8") return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<Codec>> quantizer = MakeQuantizer(name);
  if (quantizer.ok() && (*quantizer)->name() == name) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", absl::CHexEscape(name), "\" is not a codec the simulator reads: name a quantizer as ",
      "the profiler writes it (fp16, bf16, linear:bits=8, piecewise:bits=8), or ",
      "powersgd:rank=1 or powersgd:rank=8"));
}

double QuantizedAllReduceSecondsPerByte(const ModelProfile& profile, const std::string& quantizer) {
  const auto& costs = profile.codec_all_reduce_seconds_per_byte;
  if (auto it = costs.find(quantizer); it != costs.end()) return it->second;
  const std::string family = quantizer.substr(0, quantizer.find(':'));
  if (auto it = costs.find(family + ":bits=8"); it != costs.end()) return it->second;
  return 0;
}

double PowerSgdAllReduceSecondsPerByte(const ModelProfile& profile, int rank) {
  const auto& costs = profile.codec_all_reduce_seconds_per_byte;
  auto one = costs.find("powersgd:rank=1"), eight = costs.find("powersgd:rank=8");
  if (one == costs.end() || eight == costs.end()) return 0;
  const double slope = (eight->second - one->second) / 7.0;
  // Between the two measurements, on their line (at least the smaller, so
  // above 0). Past rank 8 the GEMMs only grow: a rank 8 measured faster
  // than rank 1 (timing noise on a small matrix, or a worker's say) was
  // extended downward, to 0 ("not modelled", so free) for large ranks.
  if (rank <= 8) return one->second + slope * (rank - 1);
  return eight->second + std::max(0.0, slope) * (rank - 8);
}

absl::StatusOr<ClusterSpec> ParseClusterJson(const std::string& text) {
  auto parsed = Parse(text);
  if (!parsed.ok()) return parsed.status();
  const json& j = *parsed;
  if (auto s = OnlyKeys(j, "",
                        {"workers", "bandwidth_bytes_per_second", "latency_seconds",
                         "links_emulated", "data_plane_overhead_seconds",
                         "data_plane_bytes_per_second"});
      !s.ok()) {
    return s;
  }
  ClusterSpec cluster;
  ASSIGN_OR_RETURN(cluster.bandwidth_bytes_per_second,
            Number(j, "bandwidth_bytes_per_second", "", false, false, 0));
  // Below a byte per second, a transfer's seconds leave a double.
  if (cluster.bandwidth_bytes_per_second > 0 && cluster.bandwidth_bytes_per_second < 1) {
    return Invalid("bandwidth_bytes_per_second", "must be 0 (unlimited) or at least 1");
  }
  ASSIGN_OR_RETURN(cluster.latency_seconds, Number(j, "latency_seconds", "", false, false, 0));
  if (j.contains("links_emulated")) {
    if (!j["links_emulated"].is_boolean()) {
      return Invalid("links_emulated", "must be true or false");
    }
    cluster.links_emulated = j["links_emulated"].get<bool>();
  }
  // The data plane's cost per message (DeviceInfo.data_plane_*, as a
  // worker logs it at start-up); the bounds are the registration's.
  ASSIGN_OR_RETURN(cluster.data_plane_overhead_seconds,
                   Number(j, "data_plane_overhead_seconds", "", false, false, 0));
  ASSIGN_OR_RETURN(cluster.data_plane_bytes_per_second,
                   Number(j, "data_plane_bytes_per_second", "", false, false, 0));
  if (cluster.data_plane_overhead_seconds > 1) {
    return Invalid("data_plane_overhead_seconds", "must be at most 1");
  }
  // As registration_limits.h's kMinDataPlaneBytesPerSecond: a rate below
  // 1e3 B/s is no measured data plane, and a near-zero one would make every
  // transfer's seconds absurd (1e-300 B/s overflows them).
  if (cluster.data_plane_bytes_per_second > 0 && cluster.data_plane_bytes_per_second < 1e3) {
    return Invalid("data_plane_bytes_per_second", "must be 0 (not modelled) or at least 1e3");
  }
  if (cluster.data_plane_bytes_per_second > 1e13) {
    return Invalid("data_plane_bytes_per_second", "must be at most 1e13");
  }
  // One without the other is not modelled (AddDataPlaneCost): refused
  // rather than silently dropped.
  if ((cluster.data_plane_overhead_seconds > 0) != (cluster.data_plane_bytes_per_second > 0)) {
    return Invalid(cluster.data_plane_overhead_seconds > 0 ? "data_plane_bytes_per_second"
                                                           : "data_plane_overhead_seconds",
                   "the data plane's cost needs both data_plane_overhead_seconds and "
                   "data_plane_bytes_per_second (or neither)");
  }
  if (!j.contains("workers") || !j["workers"].is_array() || j["workers"].empty()) {
    return Invalid("workers", "must be a non-empty list");
  }
  if (j["workers"].size() > static_cast<size_t>(kMaxStages)) {
    return Invalid("workers", absl::StrCat("holds ", j["workers"].size(), " workers; at most ",
                                           kMaxStages, " (a job's bound)"));
  }
  std::set<std::string> names;
  for (size_t i = 0; i < j["workers"].size(); ++i) {
    const json& w = j["workers"][i];
    const std::string where = absl::StrCat("workers[", i, "]");
    if (auto s = OnlyKeys(w, where,
                          {"name", "speed", "memory_bytes", "host", "host_cores",
                           "compute_threads", "gpu"});
        !s.ok()) {
      return s;
    }
    WorkerSpec worker;
    worker.name = absl::StrCat("w", i);
    if (w.contains("name")) {
      RETURN_IF_ERROR(CheckName(w["name"], 253, where + ".name"));
      worker.name = w["name"].get<std::string>();
    }
    if (!names.insert(worker.name).second) {
      return Invalid(where + ".name", absl::StrCat("\"", worker.name, "\" names two workers"));
    }
    ASSIGN_OR_RETURN(worker.speed, Number(w, "speed", where, true, false, 1.0));
    // A unit's seconds over its worker's speed stay inside a double.
    if (worker.speed < 1e-6 || worker.speed > 1e6) {
      return Invalid(where + ".speed", "must be in [1e-6, 1e6]");
    }
    ASSIGN_OR_RETURN(worker.memory_bytes, Number(w, "memory_bytes", where, false, false, 0));
    if (worker.memory_bytes != std::floor(worker.memory_bytes)) {  // 1.5 printed as "2 bytes"
      return Invalid(where + ".memory_bytes", "must be a whole number of bytes");
    }
    // The host whose cores it computes on, as workers register it (the
    // registration's bounds: a DNS name's length, 65536 cores or threads).
    if (w.contains("host")) {
      if (!w["host"].is_string() || w["host"].get<std::string>().size() > 253) {
        return Invalid(where + ".host", "must be a string of at most 253 bytes");
      }
      worker.host = w["host"].get<std::string>();
    }
    ASSIGN_OR_RETURN(worker.host_cores, Count(w, "host_cores", where, 65536));
    // One host, one count: which of two won depended on the order a layout
    // visited its workers in, and `--data auto` ranked layouts on either.
    if (!worker.host.empty() && worker.host_cores > 0) {
      for (size_t other = 0; other < cluster.workers.size(); ++other) {
        const WorkerSpec& o = cluster.workers[other];
        if (o.host == worker.host && o.host_cores > 0 && o.host_cores != worker.host_cores) {
          return Invalid(where + ".host_cores",
                         absl::StrCat(worker.host_cores, " for host \"", EchoInput(worker.host),
                                      "\", which workers[", other, "] gives ", o.host_cores,
                                      " cores; a host has one count"));
        }
      }
    }
    ASSIGN_OR_RETURN(worker.compute_threads, Count(w, "compute_threads", where, 65536));
    if (w.contains("gpu")) {
      if (!w["gpu"].is_boolean()) return Invalid(where + ".gpu", "must be true or false");
      worker.gpu = w["gpu"].get<bool>();
    }
    cluster.workers.push_back(worker);
  }
  // A worker that names a host but not its cores takes the count the
  // others give it (its threads counted against the host, as a registered
  // worker's are: each registers its host's count).
  std::map<std::string, int> host_cores;
  for (const WorkerSpec& w : cluster.workers) {
    if (!w.host.empty() && w.host_cores > 0) host_cores[w.host] = w.host_cores;
  }
  for (WorkerSpec& w : cluster.workers) {
    auto known = host_cores.find(w.host);
    if (w.host_cores == 0 && known != host_cores.end()) w.host_cores = known->second;
  }
  return cluster;
}

std::string ProfileToJson(const ModelProfile& p, int indent) {
  json units = json::array();
  for (const UnitProfile& u : p.units) {
    json unit = {{"name", u.name},
                 {"fwd_seconds", u.fwd_seconds},
                 {"bwd_seconds", u.bwd_seconds},
                 {"weight_bytes", u.weight_bytes},
                 {"activation_bytes", u.activation_bytes},
                 {"stash_bytes", u.stash_bytes}};
    if (u.transient_bytes > 0) unit["transient_bytes"] = u.transient_bytes;
    if (u.optimizer_seconds > 0) unit["optimizer_seconds"] = u.optimizer_seconds;
    if (!u.partition_seconds.empty()) {
      json partitions = json::array();
      for (const auto& [count, seconds] : u.partition_seconds) {
        partitions.push_back(
            {{"count", count}, {"fwd_seconds", seconds.first}, {"bwd_seconds", seconds.second}});
      }
      unit["partitions"] = std::move(partitions);
    }
    units.push_back(std::move(unit));
  }
  json out = {{"micro_batch_size", p.micro_batch_size}, {"units", units}};
  if (!p.codec_all_reduce_seconds_per_byte.empty()) {
    json codecs = json::array();
    for (const auto& [codec, seconds] : p.codec_all_reduce_seconds_per_byte) {
      codecs.push_back({{"codec", codec}, {"all_reduce_seconds_per_byte", seconds}});
    }
    out["codecs"] = std::move(codecs);
  }
  return out.dump(indent);
}

std::string ClusterToJson(const ClusterSpec& c) {
  json workers = json::array();
  for (const WorkerSpec& w : c.workers) {
    json worker = {{"name", w.name}, {"speed", w.speed}, {"memory_bytes", w.memory_bytes}};
    if (!w.host.empty()) worker["host"] = w.host;
    if (w.host_cores > 0) worker["host_cores"] = w.host_cores;
    if (w.compute_threads > 0) worker["compute_threads"] = w.compute_threads;
    if (w.gpu) worker["gpu"] = true;
    workers.push_back(std::move(worker));
  }
  json out = {{"workers", workers},
              {"bandwidth_bytes_per_second", c.bandwidth_bytes_per_second},
              {"latency_seconds", c.latency_seconds}};
  if (c.links_emulated) out["links_emulated"] = true;
  if (c.data_plane_overhead_seconds > 0 || c.data_plane_bytes_per_second > 0) {
    out["data_plane_overhead_seconds"] = c.data_plane_overhead_seconds;
    out["data_plane_bytes_per_second"] = c.data_plane_bytes_per_second;
  }
  return out.dump(2);
}

BiPartitionProblem MakeBiPartitionProblem(const ModelProfile& profile, const ClusterSpec& cluster) {
  BiPartitionProblem p;
  for (const UnitProfile& u : profile.units) {
    p.fwd.push_back(u.fwd_seconds);
    p.bwd.push_back(u.bwd_seconds);
    p.fwd_comm.push_back(u.fwd_comm_seconds);
    p.bwd_comm.push_back(u.bwd_comm_seconds);
    p.activation_bytes.push_back(u.activation_bytes);
    p.weight_bytes.push_back(u.weight_bytes);
    p.stash_bytes.push_back(u.stash_bytes);
    p.transient_bytes.push_back(u.transient_bytes);
  }
  for (const WorkerSpec& w : cluster.workers) {
    p.speeds.push_back(w.speed);
    p.memory_bytes.push_back(w.memory_bytes);
    p.worker_names.push_back(w.name);
  }
  p.bandwidth = cluster.bandwidth_bytes_per_second;
  p.latency_seconds = cluster.latency_seconds;
  p.max_weight_sync_bytes = MaxPlannedTensorBytes(cluster);
  // The head's weights: wte and ln_f's 2·d floats (over-stating the tied
  // bytes by 8·d), as the simulator's tied gradient (TiedGradientBytes).
  if (profile.units.size() >= 2) p.tied_weight_bytes = profile.units.back().weight_bytes;
  return p;
}

}  // namespace pipetrain
