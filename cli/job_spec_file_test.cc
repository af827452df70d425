#include "cli/job_spec_file.h"

#include <cstdlib>
#include <fstream>
#include <string>

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

// Plain YAML numbers keep their value: a uint64 seed above INT64_MAX is
// not rounded through a double, and "nan" or "inf" is not turned into
// JSON null (which would quietly leave the field at its default).
TEST(JobSpecFileTest, Yaml_LargeSeedExact_NonFiniteNotNull) {
  const std::string path = Write("seed.yaml", "training: {seed: 12345678901234567890}\n");
  EXPECT_EQ(ReadJobSpecFile(path).value().training().seed(), 12345678901234567890ull);
  EXPECT_EQ(YamlToJson("name: nan\n").value(), R"({"name":"nan"})");
  EXPECT_EQ(ReadJobSpecFile(Write("lr.yaml", "training: {lr: inf}\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
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
  const std::string broken = Write("broken.yaml", "model: [1, 2\n");
  const absl::Status status = ReadJobSpecFile(broken).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message().rfind(broken + ": ", 0), 0u) << status;  // names the file
  EXPECT_EQ(ReadJobSpecFile("/nonexistent/job.yaml").status().code(),
            absl::StatusCode::kNotFound);
}

// A byte-order mark is not part of the text; a string that is not UTF-8
// is named so, not by the JSON library's byte index.
TEST(JobSpecFileTest, ByteOrderMarkSkipped_NonUtf8Named) {
  EXPECT_EQ(ReadJobSpecFile(Write("bom.json", "\xEF\xBB\xBF{\"model\": {\"nLayer\": 3}}"))
                .value()
                .model()
                .n_layer(),
            3);
  EXPECT_EQ(ReadJobSpecFile(Write("bom.yaml", "\xEF\xBB\xBFmodel: {nLayer: 4}\n"))
                .value()
                .model()
                .n_layer(),
            4);
  const std::string bad = Write("latin1.yaml", "name: \"\xff\xfe\"\n");
  EXPECT_EQ(ReadJobSpecFile(bad).status().message(),
            bad + ": YAML: a string in it is not valid UTF-8; a job spec is UTF-8 text");
}

// Neither a directory nor a file past the coordinator's request limit is
// read as a spec (a FIFO or /dev/zero blocked or grew the CLI without end:
// common/bounded_file_test.cc).
TEST(JobSpecFileTest, DirectoryOrOversizedFile_RefusedNamingWhy) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const absl::Status directory = ReadJobSpecFile(dir).status();
  EXPECT_EQ(directory.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(directory.message().find("is not a regular file"), std::string::npos) << directory;
  const std::string big = Write("big.json", std::string(kMaxJobSpecFileBytes + 1, ' '));
  const absl::Status oversized = ReadJobSpecFile(big).status();
  EXPECT_EQ(oversized.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(oversized.message().find("over the limit of 4194304"), std::string::npos) << oversized;
}

// Found by fuzz/job_spec_yaml_fuzzer: a byte that is not UTF-8 made the JSON
// printer throw past YamlToJson, which terminated the process.
TEST(JobSpecFileTest, YamlToJson_NotUtf8_InvalidArgument) {
  auto json = YamlToJson("name: a\xff\n");
  EXPECT_EQ(json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(json.status().message().find("not valid UTF-8"), std::string::npos) << json.status();
}

// Nine levels of ten aliases each would expand to 10^9 nodes.
TEST(JobSpecFileTest, YamlToJson_AliasBomb_InvalidArgumentNamingTheLimit) {
  std::string yaml = "a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n";
  for (int level = 1; level <= 9; ++level) {
    const std::string previous = "*a" + std::to_string(level - 1);
    yaml += "a" + std::to_string(level) + ": &a" + std::to_string(level) + " [" + previous;
    for (int i = 1; i < 10; ++i) yaml += ", " + previous;
    yaml += "]\n";
  }
  auto json = YamlToJson(yaml);
  EXPECT_EQ(json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(json.status().message().find("more than 100000 nodes"), std::string::npos)
      << json.status();
  // Four levels (10^4 nodes) are within the limit.
  EXPECT_TRUE(YamlToJson(yaml.substr(0, yaml.find("a4:"))).ok());
}

// Few nodes, much text: a 1 MiB anchored string used 5000 times would copy
// 5 GB into the JSON (bad_alloc, and the CLI ended on std::terminate); the
// text is budgeted as well as the nodes. The anchor and 14 uses fit.
TEST(JobSpecFileTest, YamlToJson_AliasedLongString_InvalidArgumentNamingTheLimit) {
  const std::string anchored = "s: &s \"" + std::string(1 << 20, 'x') + "\"\n";
  std::string yaml = anchored + "b: [*s";
  for (int i = 1; i < 5000; ++i) yaml += ", *s";
  yaml += "]\n";
  auto json = YamlToJson(yaml);
  EXPECT_EQ(json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(json.status().message().find("more than 16777216 bytes of text"), std::string::npos)
      << json.status();
  std::string fits = anchored + "b: [*s";
  for (int i = 1; i < 14; ++i) fits += ", *s";
  EXPECT_TRUE(YamlToJson(fits + "]\n").ok());
}

// Found by fuzz/job_spec_yaml_fuzzer: an alias inside its own anchor made
// the conversion recurse until the stack overflowed.
TEST(JobSpecFileTest, YamlToJson_AliasInsideItsAnchor_InvalidArgument) {
  auto json = YamlToJson("model: &m {need: [*m]}\n");
  EXPECT_EQ(json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(json.status().message().find("nested more than 64 levels deep"), std::string::npos)
      << json.status();
  EXPECT_EQ(YamlToJson(std::string(65, '[') + std::string(65, ']')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(YamlToJson(std::string(64, '[') + std::string(64, ']')).ok());
}

// Protobuf's JSON parser keeps the last of two keys: a .json file naming
// one twice is refused as a YAML one is (the README promises each key once).
TEST(JobSpecFileTest, JsonFile_DuplicateKey_InvalidArgumentNamingIt) {
  const std::string path = Write("twice.json", R"({"model": {"nLayer": 2, "nLayer": 3}})");
  const absl::StatusOr<v1::JobSpec> spec = ReadJobSpecFile(path);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(), path + ": JSON: key \"nLayer\" given twice in one object");
  EXPECT_EQ(
      ReadJobSpecFile(Write("once.json", R"({"model": {"nLayer": 3}})")).value().model().n_layer(),
      3);
}

// Protobuf takes a field under either name and keeps the last: two
// spellings of one field are a key given twice, in YAML and JSON alike.
TEST(JobSpecFileTest, OneFieldUnderBothNames_InvalidArgumentNamingBoth) {
  const std::string want =
      "keys \"batchSize\" and \"batch_size\" name one field (protobuf takes both spellings); "
      "give it once";
  const std::string yaml = Write("both.yaml", "training: {batchSize: 8, batch_size: 16}\n");
  EXPECT_EQ(ReadJobSpecFile(yaml).status().message(), yaml + ": YAML: " + want);
  const std::string json =
      Write("both.json", R"({"training": {"batchSize": 8, "batch_size": 16}})");
  EXPECT_EQ(ReadJobSpecFile(json).status().message(), json + ": JSON: " + want);
  // Either name alone is the field.
  EXPECT_EQ(ReadJobSpecFile(Write("snake.yaml", "training: {batch_size: 16}\n"))
                .value()
                .training()
                .batch_size(),
            16);
}

// What protobuf's lenient parser takes but JSON is not (single quotes,
// bare keys, trailing commas) would slip past the duplicate check: a .json
// file is strict JSON.
TEST(JobSpecFileTest, JsonFile_NotStrictJson_InvalidArgument) {
  for (const char* text : {"{'training': {'steps': 7, 'steps': 3}}",
                           "{training: {steps: 7, steps: 3}}", R"({"training": {"steps": 7,}})"}) {
    const std::string path = Write("lenient.json", text);
    const absl::Status status = ReadJobSpecFile(path).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(status.message().rfind(path + ": JSON: not valid JSON", 0), 0u) << status;
  }
}

// Valid JSON nested far deeper than any spec: refused by the spec's own
// parser, not by a crash on the way (the field-name check walks without
// recursion).
TEST(JobSpecFileTest, JsonFile_NestedAMillionDeep_RefusedWithoutACrash) {
  const std::string path = Write(
      "deep.json", "{\"name\": " + std::string(1000000, '[') + std::string(1000000, ']') + "}");
  EXPECT_EQ(ReadJobSpecFile(path).status().code(), absl::StatusCode::kInvalidArgument);
}

// yaml-cpp kept the last of two keys and the first of two documents,
// silently; YAML itself requires unique keys.
TEST(JobSpecFileTest, YamlToJson_DuplicateKeyOrSecondDocument_InvalidArgumentNamingIt) {
  auto twice = YamlToJson("training:\n  steps: 10\n  seq_len: 8\n  steps: 20\n");
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(twice.status().message(), "YAML: line 4: key \"steps\" given twice in one mapping");
  auto documents = YamlToJson("model: {n_layer: 2}\n---\nmodel: {n_layer: 4}\n");
  EXPECT_EQ(documents.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(documents.status().message(),
            "YAML: the file holds more than one document (separated by ---); a job spec is one: "
            "submit each job from its own file");
  // Found by job_spec_yaml_fuzzer: every document was built before they
  // were counted. A million of them are refused without building them.
  std::string separators;
  for (int i = 0; i < 1000000; ++i) separators += "---\n";
  EXPECT_EQ(YamlToJson(separators).status().code(), absl::StatusCode::kInvalidArgument);
  // The fuzzer's own input: a lone "," never ended YAML::LoadAll.
  EXPECT_EQ(YamlToJson(",").status().code(), absl::StatusCode::kInvalidArgument)
      << YamlToJson(",").status();
  auto complex_key = YamlToJson("? [a, b]\n: 1\n");
  EXPECT_EQ(complex_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(complex_key.status().message(),
            "YAML: line 1: a key must be a name, not a list or map");
  // One document with its markers, and the same key in two mappings, pass.
  EXPECT_TRUE(YamlToJson("---\nmodel: {n_layer: 2}\ntraining: {n_layer: 2}\n...\n").ok());
  EXPECT_TRUE(YamlToJson("").ok());
}

}  // namespace
}  // namespace pipetrain
