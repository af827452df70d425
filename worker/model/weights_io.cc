#include "worker/model/weights_io.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

const Tensor* FindWithOptionalPrefix(const SafetensorsContents& contents,
                                     const std::string& name) {
  const Tensor* t = contents.Find(name);
  return t != nullptr ? t : contents.Find("transformer." + name);
}

}  // namespace

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

absl::Status ImportWeights(const SafetensorsContents& contents,
                           const std::vector<Parameter*>& params) {
  std::vector<const Tensor*> sources;
  sources.reserve(params.size());
  for (const Parameter* p : params) {
    const Tensor* src = FindWithOptionalPrefix(contents, p->name);
    if (src == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("missing tensor '", p->name, "' (shape ",
                       ShapeToString(p->value.shape()), ")"));
    }
    if (src->shape() != p->value.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", p->name, "' has shape ", ShapeToString(src->shape()),
          " but the model expects ", ShapeToString(p->value.shape()),
          "; check --layers/--heads/--d-model/--vocab/--block-size"));
    }
    sources.push_back(src);
  }
  for (size_t i = 0; i < params.size(); ++i) params[i]->value.CopyFrom(*sources[i]);
  return absl::OkStatus();
}

absl::Status LoadWeights(const std::string& path, const std::vector<Parameter*>& params) {
  ASSIGN_OR_RETURN(SafetensorsContents contents, ReadSafetensors(path));
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

std::vector<Parameter*> ParameterPointers(std::vector<Parameter>& params) {
  std::vector<Parameter*> out;
  out.reserve(params.size());
  for (Parameter& p : params) out.push_back(&p);
  return out;
}

}  // namespace pipetrain
