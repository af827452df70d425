#include "worker/model/weights_io.h"

#include <cstring>
#include <functional>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {

absl::StatusOr<const Tensor*> FindParameterTensor(const SafetensorsContents& contents,
                                                  const std::string& name) {
  const Tensor* plain = contents.Find(name);
  const Tensor* prefixed = contents.Find("transformer." + name);
  if (plain != nullptr && prefixed != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("holds both '", name, "' and 'transformer.",
                                                   name,
                                                   "': which one to load is ambiguous; keep one"));
  }
  return plain != nullptr ? plain : prefixed;
}

absl::StatusOr<Tensor> FitToParameter(const std::string& name, const Shape& want,
                                      const Tensor& found) {
  RETURN_IF_ERROR(CheckFitsParameter(name, want, found.shape()));
  if (found.shape() == want) return found;
  PT_LOG(WARNING) << name << ": the file's " << found.shape()[0]
                  << " rows padded with zero rows to " << want[0]
                  << "; the padded tokens' logits (0) start far above a trained model's, so the "
                     "first steps' loss is well above the unpadded model's (see weights_io.h)";
  Tensor padded = Tensor::Zeros(want);
  std::memcpy(padded.data(), found.data(), static_cast<size_t>(found.size_bytes()));
  return padded;
}

std::vector<NamedTensor> ParameterValues(const std::vector<Parameter*>& params) {
  std::vector<NamedTensor> out;
  out.reserve(params.size());
  for (const Parameter* p : params) out.push_back({p->name, p->value});
  return out;
}

absl::Status SaveWeights(const std::string& path, const std::vector<Parameter*>& params,
                         const SafetensorsMetadata& metadata) {
  return WriteSafetensors(path, ParameterValues(params), metadata);
}

absl::Status CheckStartingWeightsFinite(const std::string& name, const Tensor& t) {
  const std::string bad = DescribeFirstNonFinite(t);
  if (bad.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("tensor '", name, "' ", bad, ": weights of a diverged run cannot start one"));
}

absl::Status ImportWeights(const SafetensorsContents& contents,
                           const std::vector<Parameter*>& params) {
  std::vector<Tensor> sources;
  sources.reserve(params.size());
  for (const Parameter* p : params) {
    ASSIGN_OR_RETURN(const Tensor* src, FindParameterTensor(contents, p->name));
    if (src == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("missing tensor '", p->name, "' (shape ",
                                                     ShapeToString(p->value.shape()), ")"));
    }
    absl::StatusOr<Tensor> fitted = FitToParameter(p->name, p->value.shape(), *src);
    if (!fitted.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          fitted.status().message(), "; check --layers/--heads/--d-model/--vocab/--block-size"));
    }
    RETURN_IF_ERROR(CheckStartingWeightsFinite(p->name, *fitted));
    sources.push_back(*std::move(fitted));
  }
  for (size_t i = 0; i < params.size(); ++i) params[i]->value.CopyFrom(sources[i]);
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsContents> ReadParameterTensors(const std::string& path,
                                                         const std::vector<std::string>& names,
                                                         ScopedFd opened) {
  // Only these tensors (either name form) are read and converted: a file's
  // other tensors (an HF lm_head, optimizer state, other stages' units)
  // cost nothing.
  std::set<std::string, std::less<>> wanted;
  for (const std::string& name : names) {
    wanted.insert(name);
    wanted.insert("transformer." + name);
  }
  auto want = [&wanted](std::string_view name) { return wanted.count(name) > 0; };
  if (opened.get() >= 0) return ReadSafetensorsTensorsFrom(std::move(opened), path, want);
  return ReadSafetensorsTensors(path, want);
}

absl::Status LoadWeights(const std::string& path, const std::vector<Parameter*>& params) {
  std::vector<std::string> names;
  for (const Parameter* p : params) names.push_back(p->name);
  ASSIGN_OR_RETURN(SafetensorsContents contents, ReadParameterTensors(path, names));
  absl::Status status = ImportWeights(contents, params);
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  }
  return absl::OkStatus();
}

std::vector<Parameter> HostParameterCopies(Backend* backend,
                                           const std::vector<Parameter*>& params) {
  std::vector<Parameter> copies;
  copies.reserve(params.size());
  for (const Parameter* p : params) {
    Parameter copy;
    copy.name = p->name;
    copy.value = p->value.on_device() ? backend->Download(p->value) : p->value;
    copy.is_matrix = p->is_matrix;
    copy.shard = p->shard;
    copies.push_back(std::move(copy));
  }
  return copies;
}

absl::Status CheckParametersFinite(const std::vector<Parameter>& params) {
  for (const Parameter& p : params) {
    const std::string bad = DescribeFirstNonFinite(p.value);
    if (!bad.empty()) return absl::FailedPreconditionError(absl::StrCat(p.name, " ", bad));
  }
  return absl::OkStatus();
}

std::vector<Parameter*> ParameterPointers(std::vector<Parameter>& params) {
  std::vector<Parameter*> out;
  out.reserve(params.size());
  for (Parameter& p : params) out.push_back(&p);
  return out;
}

}  // namespace pipetrain
