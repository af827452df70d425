// Every metric the alert rules in deploy/prometheus/alerts.yml and the
// Grafana dashboard dashboards/pipetrain.json query is exported: a local
// cluster runs a short two-stage job, and the names found in their PromQL
// must all appear in the coordinator's or a worker's /metrics. A rule on a
// misspelt or removed metric would otherwise never fire, and a panel would
// stay empty, silently.
#include <sys/stat.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "cli/coordinator_client.h"
#include "cli/local_cluster.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cluster_testing.h"

namespace pipetrain {
namespace {

using NameSet = std::set<std::string, std::less<>>;

constexpr absl::string_view kPrefix = "pipetrain_";
constexpr absl::string_view kHistogramSuffixes[] = {"_bucket", "_sum", "_count"};

bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':'; }

size_t Indent(absl::string_view line) { return line.find_first_not_of(' '); }

// Adds each identifier of `promql` that starts with "pipetrain_". Label
// values are quoted and never start an identifier: the quote is skipped
// with the string's contents.
void AddMetricNames(absl::string_view promql, NameSet& names) {
  for (size_t i = 0; i < promql.size();) {
    if (promql[i] == '"') {
      const size_t close = promql.find('"', i + 1);
      i = close == absl::string_view::npos ? promql.size() : close + 1;
    } else if (IsNameChar(promql[i])) {
      size_t end = i;
      while (end < promql.size() && IsNameChar(promql[end])) ++end;
      const absl::string_view word = promql.substr(i, end - i);
      if (absl::StartsWith(word, kPrefix)) names.insert(std::string(word));
      i = end;
    } else {
      ++i;
    }
  }
}

// The metric names in the `expr:` values of a rules file: an inline value,
// or a block (`expr: |`) of the following lines indented deeper than the
// key (`expr: |-`, `expr: >` and the other block indicators too).
// Comments, labels and annotations are not PromQL and are skipped.
NameSet PromqlMetricNames(const std::string& rules_yaml) {
  NameSet names;
  std::istringstream in(rules_yaml);
  std::string line;
  size_t block_indent = std::string::npos;  // npos: not inside an expr block
  while (std::getline(in, line)) {
    const size_t indent = Indent(line);
    if (indent == std::string::npos) continue;  // blank lines stay in a block
    if (block_indent != std::string::npos && indent > block_indent) {
      AddMetricNames(line, names);
      continue;
    }
    block_indent = std::string::npos;
    absl::string_view rest = absl::string_view(line).substr(indent);
    absl::ConsumePrefix(&rest, "- ");
    if (!absl::ConsumePrefix(&rest, "expr:")) continue;
    // A block scalar: "|" or ">", with any chomping or indentation
    // indicator ("|-", ">+", "|2"); an inline value never starts so.
    const absl::string_view value = absl::StripAsciiWhitespace(rest);
    if (absl::StartsWith(value, "|") || absl::StartsWith(value, ">")) {
      block_indent = indent;
    } else {
      AddMetricNames(rest, names);
    }
  }
  return names;
}

// Appends the "expr" of each target of `panels`, and of the panels nested in
// (collapsed) rows. Members of the wrong type are skipped: this reads what
// Grafana would query, it does not validate the schema.
void AddPanelExprs(const nlohmann::json& panels, std::vector<std::string>& queries) {
  if (!panels.is_array()) return;
  for (const nlohmann::json& panel : panels) {
    if (!panel.is_object()) continue;
    if (panel.contains("panels")) AddPanelExprs(panel["panels"], queries);
    if (!panel.contains("targets") || !panel["targets"].is_array()) continue;
    for (const nlohmann::json& target : panel["targets"]) {
      if (target.is_object() && target.contains("expr") && target["expr"].is_string()) {
        queries.push_back(target["expr"].get<std::string>());
      }
    }
  }
}

// Appends the query of each "query" template variable: a string, or an
// object whose "query" is (the Prometheus variable editor's form).
void AddVariableQueries(const nlohmann::json& dashboard, std::vector<std::string>& queries) {
  if (!dashboard.contains("templating") || !dashboard["templating"].is_object()) return;
  const nlohmann::json& templating = dashboard["templating"];
  if (!templating.contains("list") || !templating["list"].is_array()) return;
  const nlohmann::json& list = templating["list"];
  for (const nlohmann::json& variable : list) {
    if (!variable.is_object() || !variable.contains("type") || variable["type"] != "query" ||
        !variable.contains("query")) {
      continue;
    }
    const nlohmann::json& query = variable["query"];
    if (query.is_string()) {
      queries.push_back(query.get<std::string>());
    } else if (query.is_object() && query.contains("query") && query["query"].is_string()) {
      queries.push_back(query["query"].get<std::string>());
    }
  }
}

// The PromQL a Grafana dashboard sends: target exprs and variable queries.
// INVALID_ARGUMENT naming `path` when the text is not a JSON object.
absl::StatusOr<std::vector<std::string>> DashboardQueries(const std::string& path,
                                                          const std::string& text) {
  // Without exceptions: a parse error yields a "discarded" value.
  const nlohmann::json dashboard = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!dashboard.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a JSON object; check it with `jq . ", path, "`"));
  }
  std::vector<std::string> queries;
  if (dashboard.contains("panels")) AddPanelExprs(dashboard["panels"], queries);
  AddVariableQueries(dashboard, queries);
  return queries;
}

// The names in a Prometheus text exposition: every sample's name, and every
// family named by a "# TYPE" line, with its type.
struct Exposition {
  NameSet samples;
  std::map<std::string, std::string, std::less<>> families;  // name -> type
};

void AddExposition(const std::string& text, Exposition& out) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "# TYPE ")) {
      std::istringstream words(line.substr(7));
      std::string name, type;
      words >> name >> type;
      out.families[name] = type;
    } else if (!line.empty() && line[0] != '#') {
      out.samples.insert(line.substr(0, line.find_first_of("{ ")));
    }
  }
}

// Whether `name`, as PromQL would select it, has samples: a sample name, or
// name_bucket/_sum/_count of a histogram or summary family.
bool IsExported(absl::string_view name, const Exposition& exposition) {
  if (exposition.samples.count(name) > 0) return true;
  for (absl::string_view suffix : kHistogramSuffixes) {
    absl::string_view base = name;
    if (!absl::ConsumeSuffix(&base, suffix)) continue;
    const auto it = exposition.families.find(base);
    if (it != exposition.families.end() && (it->second == "histogram" || it->second == "summary")) {
      return true;
    }
  }
  return false;
}

std::vector<std::string> Missing(const NameSet& referenced, const Exposition& exposition) {
  std::vector<std::string> missing;
  for (const std::string& name : referenced) {
    if (!IsExported(name, exposition)) missing.push_back(name);
  }
  return missing;
}

std::string ReadRunfile(const std::string& path) {
  const std::string full =
      std::string(std::getenv("TEST_SRCDIR")) + "/" + std::getenv("TEST_WORKSPACE") + "/" + path;
  std::ifstream in(full);
  EXPECT_TRUE(in.good()) << "cannot read " << full << ": check the test's data";
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(MetricNamesTest, PromqlMetricNames_BlockAndInlineExpr_OnlyPromqlNames) {
  const std::string rules =
      "# pipetrain_in_comment\n"
      "groups:\n"
      "  - name: g\n"
      "    rules:\n"
      "      - alert: A\n"
      "        expr: |\n"
      "          rate(pipetrain_a_total{kind=\"pipetrain_label_value\"}[5m])\n"
      "\n"
      "            / on (instance) pipetrain_b_seconds_bucket > 0\n"
      "        for: 1m\n"
      "        annotations:\n"
      "          description: see pipetrain_in_annotation\n"
      "      - expr: up + pipetrain_c\n"
      "        record: pipetrain:recorded\n"
      "      - alert: D\n"
      "        expr: |-\n"
      "          pipetrain_d > 0\n"
      "      - alert: E\n"
      "        expr: >+\n"
      "          pipetrain_e\n"
      "          > 1\n";
  EXPECT_EQ(PromqlMetricNames(rules), (NameSet{"pipetrain_a_total", "pipetrain_b_seconds_bucket",
                                               "pipetrain_c", "pipetrain_d", "pipetrain_e"}));
}

TEST(MetricNamesTest, Missing_MadeUpAndHistogramNames_OnlyMadeUpReported) {
  Exposition exposition;
  AddExposition(
      "# HELP pipetrain_rpc_duration_seconds h\n"
      "# TYPE pipetrain_rpc_duration_seconds histogram\n"
      "pipetrain_rpc_duration_seconds_count{method=\"A\"} 1\n"
      "# TYPE pipetrain_job_loss gauge\n"
      "pipetrain_job_loss 2.5\n",
      exposition);
  const NameSet referenced = {"pipetrain_job_loss", "pipetrain_rpc_duration_seconds_count",
                              "pipetrain_rpc_duration_seconds_bucket", "pipetrain_job_loss_sum",
                              "pipetrain_made_up_metric_total"};
  EXPECT_EQ(Missing(referenced, exposition),
            (std::vector<std::string>{"pipetrain_job_loss_sum", "pipetrain_made_up_metric_total"}));
}

TEST(MetricNamesTest, DashboardQueries_RowsAndVariables_ExprsAndQueriesOnly) {
  const std::string dashboard = R"json({
    "description": "pipetrain_in_description",
    "panels": [
      {"type": "timeseries", "targets": [{"expr": "pipetrain_a", "legendFormat": "pipetrain_x"}]},
      {"type": "row", "collapsed": true,
       "panels": [{"targets": [{"expr": "rate(pipetrain_b_total[$__rate_interval])"}]}]},
      {"type": "text", "options": {"content": "pipetrain_in_text"}}
    ],
    "templating": {"list": [
      {"type": "datasource", "name": "datasource", "query": "prometheus"},
      {"type": "query", "name": "w", "query": "label_values(pipetrain_c, instance)"},
      {"type": "query", "name": "s",
       "query": {"qryType": 1, "query": "label_values(pipetrain_d{instance=~\"$w\"}, stage)"}}
    ]}
  })json";
  absl::StatusOr<std::vector<std::string>> queries = DashboardQueries("d.json", dashboard);
  ASSERT_TRUE(queries.ok()) << queries.status();
  NameSet names;
  for (const std::string& query : *queries) AddMetricNames(query, names);
  EXPECT_EQ(names, (NameSet{"pipetrain_a", "pipetrain_b_total", "pipetrain_c", "pipetrain_d"}));
}

TEST(MetricNamesTest, DashboardQueries_NotJson_InvalidArgumentNamingFile) {
  absl::StatusOr<std::vector<std::string>> queries = DashboardQueries("d.json", "{\"panels\": [");
  EXPECT_EQ(queries.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(queries.status().message(), "d.json is not a JSON object"))
      << queries.status();
}

// Runs a short two-stage job on a local cluster once for the suite, then
// scrapes the coordinator and worker 0 (both workers export the same
// families, so one suffices).
class LiveClusterTest : public ::testing::Test {
 protected:
  struct Scraped {
    std::string coordinator;
    std::string worker;
    Exposition exposition;
  };

  static void SetUpTestSuite() {
    scraped_ = new Scraped;
    RunJobAndScrape(*scraped_);
  }
  static void TearDownTestSuite() {
    delete scraped_;
    scraped_ = nullptr;
  }

  void SetUp() override {
    ASSERT_FALSE(scraped_->coordinator.empty() || scraped_->worker.empty())
        << "the cluster's job or a scrape failed (see the suite's set-up failures)";
  }

  // Every name in `referenced` is exported; `what` names their source.
  static void ExpectAllExported(const NameSet& referenced, const std::string& what) {
    EXPECT_EQ(Missing(referenced, scraped_->exposition), std::vector<std::string>{})
        << what << " queries metrics nobody exports.\ncoordinator:\n"
        << scraped_->coordinator << "\nworker-0:\n" << scraped_->worker;
    // The same check on a name nobody exports fails, so it is not vacuous.
    EXPECT_EQ(Missing({"pipetrain_made_up_metric_total"}, scraped_->exposition),
              std::vector<std::string>{"pipetrain_made_up_metric_total"});
  }

  static Scraped* scraped_;

 private:
  static void RunJobAndScrape(Scraped& out) {
    // With TLS (a certificate of the test's own), so that the TLS files'
    // expiry gauge is exported too, as in a deployment that uses it.
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/names-tls";
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0) << dir;
    const std::string cert = dir + "/cert.pem", key = dir + "/key.pem";
    ASSERT_EQ(
        std::system(("openssl req -x509 -newkey rsa:2048 -nodes -keyout " + key + " -out " + cert +
                     " -days 2 -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 "
                     "2>/dev/null")
                        .c_str()),
        0)
        << "openssl (scripts/setup.sh installs it) could not make a test certificate";
    auto cluster = testing::StartTestCluster("names", 2, {"--tls-cert=" + cert, "--tls-key=" + key},
                                             {"--tls-ca=" + cert});
    ASSERT_NE(cluster, nullptr);
    auto stub = ConnectCoordinator(cluster->grpc_address(), cert, cluster->user_token());
    v1::JobSpec spec = testing::TinyJobSpec(/*steps=*/3, /*stages=*/2);
    spec.mutable_training()->set_micro_batches(2);
    // Compressed links in both directions, so that worker 0 (it sends
    // activations and receives gradients) exports every link metric.
    spec.mutable_compression()->set_forward("fp16");
    spec.mutable_compression()->set_backward("fp16");
    const std::string id = testing::SubmitJob(*stub, spec);
    const v1::Job job = testing::AwaitJob(*stub, id, absl::Seconds(60), testing::Ended);
    ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();

    out.coordinator = testing::ScrapeMetrics(cluster->http_port());
    AddExposition(out.coordinator, out.exposition);
    out.worker = testing::ScrapeMetrics(testing::WorkerMetricsPort("names", 0));
    AddExposition(out.worker, out.exposition);
  }
};

LiveClusterTest::Scraped* LiveClusterTest::scraped_ = nullptr;

TEST_F(LiveClusterTest, AlertRules_LiveCluster_EveryMetricExported) {
  const NameSet referenced = PromqlMetricNames(ReadRunfile("deploy/prometheus/alerts.yml"));
  ASSERT_GE(referenced.size(), 4u) << "the tokenizer found too few names in alerts.yml";
  ExpectAllExported(referenced, "alerts.yml");
}

TEST_F(LiveClusterTest, Dashboard_LiveCluster_EveryMetricExported) {
  const std::string path = "dashboards/pipetrain.json";
  absl::StatusOr<std::vector<std::string>> queries = DashboardQueries(path, ReadRunfile(path));
  ASSERT_TRUE(queries.ok()) << queries.status();
  NameSet referenced;
  for (const std::string& query : *queries) AddMetricNames(query, referenced);
  // Loss, throughput, steps, stage busy/idle, links, prediction, workers, RPCs...
  ASSERT_GE(referenced.size(), 12u) << "too few metric names found in " << path;
  ExpectAllExported(referenced, path);
}

}  // namespace
}  // namespace pipetrain
