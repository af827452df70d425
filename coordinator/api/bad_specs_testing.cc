#include "coordinator/api/bad_specs_testing.h"

namespace pipetrain {
namespace {

constexpr char kModel[] = R"("model": {"nLayer": 2, "nHead": 2, "dModel": 16})";
constexpr char kTraining[] = R"("training": {"seqLen": 8, "batchSize": 4, "steps": 10})";
constexpr char kParallelism[] = R"("parallelism": {"stages": 1})";

std::string Spec(const std::string& model, const std::string& training,
                 const std::string& parallelism, const std::string& extra = "") {
  std::string json = "{\"name\": \"test\"";
  for (const std::string* part : {&model, &training, &parallelism, &extra}) {
    if (!part->empty()) json += ", " + *part;
  }
  return json + "}";
}

}  // namespace

std::string ValidSpecJson() { return Spec(kModel, kTraining, kParallelism); }

std::vector<BadSpec> BadSpecs() {
  return {
      {"missing model", Spec("", kTraining, kParallelism), "spec.model: required"},
      {"zero layers",
       Spec(R"("model": {"nLayer": 0, "nHead": 2, "dModel": 16})", kTraining, kParallelism),
       "spec.model.n_layer"},
      {"heads not dividing d_model",
       Spec(R"("model": {"nLayer": 2, "nHead": 3, "dModel": 16})", kTraining, kParallelism),
       "spec.model.n_head"},
      {"micro-batches not dividing the batch",
       Spec(kModel, R"("training": {"seqLen": 8, "batchSize": 4, "steps": 10, "microBatches": 3})",
            kParallelism),
       "spec.training.micro_batches"},
      {"negative learning rate",
       Spec(kModel, R"("training": {"seqLen": 8, "batchSize": 4, "steps": 10, "lr": -0.1})",
            kParallelism),
       "spec.training.lr"},
      {"zero steps", Spec(kModel, R"("training": {"seqLen": 8, "batchSize": 4})", kParallelism),
       "spec.training.steps"},
      {"unknown solver",
       Spec(kModel, kTraining, R"("parallelism": {"stages": 1, "solver": "magic"})"),
       "spec.parallelism.solver"},
      {"unknown schedule",
       Spec(kModel, kTraining, R"("parallelism": {"stages": 1, "schedule": "zigzag"})"),
       "spec.parallelism.schedule"},
      {"data path climbing out of the data roots",
       Spec(kModel, kTraining, kParallelism, R"("data": {"path": "corpora/../../etc/shadow"})"),
       "spec.data.path"},
      {"absolute weights path",
       Spec(kModel, kTraining, kParallelism, R"("output": {"weightsPath": "/etc/x"})"),
       "spec.output.weights_path"},
      {"more stages than units", Spec(kModel, kTraining, R"("parallelism": {"stages": 7})"),
       "spec.parallelism.stages"},
      {"unknown JSON field",
       Spec(R"("model": {"nLayer": 2, "nHead": 2, "dModel": 16, "nLayers": 4})", kTraining,
            kParallelism),
       "nLayers", /*json_only=*/true},
      {"wrong type",
       Spec(kModel, R"("training": {"seqLen": 8, "batchSize": 4, "steps": "many"})", kParallelism),
       "steps", /*json_only=*/true},
  };
}

}  // namespace pipetrain
