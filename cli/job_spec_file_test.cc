#include "cli/job_spec_file.h"

#include <cstdlib>
#include <fstream>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(JobSpecFileTest, Yaml_ParsesTypesAndNestedFields) {
  const std::string path = Write("job.yaml",
                                 "name: \"007\"\n"
                                 "model: {nLayer: 2, nHead: 4, dModel: 128}\n"
                                 "training:\n  seqLen: 64\n  batchSize: 16\n  lr: 1e-3\n"
                                 "parallelism:\n  stages: 2\n  solver: pipedream\n");
  v1::JobSpec spec = ReadJobSpecFile(path).value();
  EXPECT_EQ(spec.name(), "007");  // quoted: stays a string
  EXPECT_EQ(spec.model().n_layer(), 2);
  EXPECT_FLOAT_EQ(spec.training().lr(), 1e-3f);
  EXPECT_EQ(spec.parallelism().solver(), "pipedream");
}

TEST(JobSpecFileTest, Json_AcceptsOriginalFieldNames) {
  const std::string path =
      Write("job.json", R"({"model": {"n_layer": 3, "n_head": 2, "d_model": 8}})");
  EXPECT_EQ(ReadJobSpecFile(path).value().model().n_layer(), 3);
}

TEST(JobSpecFileTest, UnknownField_IsInvalidArgumentNamingIt) {
  const std::string path = Write("bad.yaml", "model: {nLayers: 2}\n");
  auto spec = ReadJobSpecFile(path);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("nLayers"), std::string::npos) << spec.status();
}

TEST(JobSpecFileTest, BrokenYaml_AndMissingFile_AreReported) {
  EXPECT_EQ(ReadJobSpecFile(Write("broken.yaml", "model: [1, 2\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadJobSpecFile("/nonexistent/job.yaml").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pipetrain
