// GPT-2 weights as safetensors with Hugging Face tensor names and layouts
// (Conv1D weights stored (in, out), the layout the units already use), so
// files interchange with the `transformers` GPT2Model/GPT2LMHeadModel.
//
// Functions take a parameter list rather than a whole model so a pipeline
// stage can load or save just the units it owns.
#ifndef PIPETRAIN_WORKER_MODEL_WEIGHTS_IO_H_
#define PIPETRAIN_WORKER_MODEL_WEIGHTS_IO_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/confined_path.h"
#include "common/safetensors.h"
#include "worker/model/unit.h"

namespace pipetrain {

// Parameter values (not gradients) under their names, sharing storage.
std::vector<NamedTensor> ParameterValues(const std::vector<Parameter*>& params);

// Host copies of `params`' values (name, value, is_matrix and shard; the values
// themselves, shared, when already on the host), for everything that reads
// weights on the host (files, uploads). `backend` holds the parameters; a
// device backend's copy errors show in its status().
std::vector<Parameter> HostParameterCopies(Backend* backend,
                                           const std::vector<Parameter*>& params);
// OK when every value of `params` (host copies, as HostParameterCopies
// makes) is finite; otherwise FAILED_PRECONDITION naming the first
// parameter that is not, the element (of this copy, a tensor-parallel
// shard's own numbering) and whether it is NaN or an infinity.
absl::Status CheckParametersFinite(const std::vector<Parameter>& params);
// Pointers to each element of `params` (which must outlive them).
std::vector<Parameter*> ParameterPointers(std::vector<Parameter>& params);

// Writes the parameters' values to `path` (atomically; see WriteSafetensors).
absl::Status SaveWeights(const std::string& path, const std::vector<Parameter*>& params,
                         const SafetensorsMetadata& metadata = {});

// `found` as parameter `name` of shape `want`, when CheckFitsParameter
// (gpt_config.h) allows it: `found` itself, or for a padded vocabulary a
// new tensor of its rows followed by zero rows (padded token ids never
// occur in the data), logged as a warning. A known limitation: through the
// tied head a zero row gives the padded tokens logit 0, far above a trained
// model's real logits (GPT-2's are well below 0), so they take most of the
// probability and the first steps' loss is far above the unpadded model's
// until training lowers them (llm.c instead leaves the padded columns out
// of the softmax). Its errors otherwise.
absl::StatusOr<Tensor> FitToParameter(const std::string& name, const Shape& want,
                                      const Tensor& found);

// OK when every value of `t`, the host tensor a run would start parameter
// `name` from, is finite; otherwise INVALID_ARGUMENT naming the tensor and
// the element: a NaN in a row no step reads (a position past seq_len)
// trains with finite losses to NaN weights.
absl::Status CheckStartingWeightsFinite(const std::string& name, const Tensor& t);

// Copies tensors from `contents` into `params`, all or nothing: every
// parameter is checked before any is written. Names may carry Hugging Face's
// "transformer." prefix. Extra tensors are ignored (HF files also hold the
// causal-mask buffers h.N.attn.bias/masked_bias and the tied lm_head.weight).
// A padded vocabulary takes the file's rows (FitToParameter).
// Errors (INVALID_ARGUMENT, naming the tensor): a parameter missing from the
// file, or there under both names; a shape that does not fit the model's (both shapes in the
// message); a NaN or infinite value (CheckStartingWeightsFinite).
absl::Status ImportWeights(const SafetensorsContents& contents,
                           const std::vector<Parameter*>& params);

// The tensor of parameter `name` in `contents`, under its name or with the
// "transformer." prefix; nullptr when under neither. INVALID_ARGUMENT when
// the file holds both (which one an import took was a silent choice).
absl::StatusOr<const Tensor*> FindParameterTensor(const SafetensorsContents& contents,
                                                  const std::string& name);

// The tensors of the parameters `names` from the safetensors file at
// `path`, each under its name or with the "transformer." prefix, and no
// others: ReadSafetensorsTensors (a file's other tensors are neither read
// nor converted). Errors as ReadSafetensors. With `opened` (a descriptor of
// the file, taken over: e.g. OpenRealPathNoLinks's after a root check), the
// file is read from it and `path` only names it.
absl::StatusOr<SafetensorsContents> ReadParameterTensors(const std::string& path,
                                                         const std::vector<std::string>& names,
                                                         ScopedFd opened = ScopedFd());

// ReadParameterTensors + ImportWeights; messages start with the path.
absl::Status LoadWeights(const std::string& path, const std::vector<Parameter*>& params);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_WEIGHTS_IO_H_
