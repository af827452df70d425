#include "common/flag_set.h"

#include <stdlib.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

// One flag of every type, bound to fields whose initial values are the
// defaults the tests expect to survive when a flag is not given.
class FlagSetTest : public ::testing::Test {
 protected:
  FlagSetTest() : flags_("usage: tool [flags]") {
    flags_.String("name", &name_, "a string");
    flags_.Int("count", &count_, "an int");
    flags_.Int64("steps", &steps_, "an int64");
    flags_.Uint64("seed", &seed_, "a uint64");
    flags_.Float("lr", &lr_, "a float");
    flags_.Double("frac", &frac_, "a double");
    flags_.Bool("verbose", &verbose_, "a bool defaulting to false");
    flags_.Bool("color", &color_, "a bool defaulting to true");
  }

  absl::Status Parse(const std::vector<std::string>& args) { return flags_.Parse(args); }

  FlagSet flags_;
  std::string name_ = "default";
  int count_ = 7;
  int64_t steps_ = 100;
  uint64_t seed_ = 1;
  float lr_ = 0.5f;
  double frac_ = 0.25;
  bool verbose_ = false;
  bool color_ = true;
};

TEST_F(FlagSetTest, Parse_NoArgs_KeepsDefaultsAndSetsNothing) {
  ASSERT_TRUE(Parse({}).ok());
  EXPECT_EQ(name_, "default");
  EXPECT_EQ(count_, 7);
  EXPECT_EQ(steps_, 100);
  EXPECT_EQ(seed_, 1u);
  EXPECT_EQ(lr_, 0.5f);
  EXPECT_EQ(frac_, 0.25);
  EXPECT_FALSE(verbose_);
  EXPECT_TRUE(color_);
  EXPECT_FALSE(flags_.IsSet("name"));
  EXPECT_FALSE(flags_.IsSet("count"));
  EXPECT_FALSE(flags_.help_requested());
}

TEST_F(FlagSetTest, Parse_EqualsForm_SetsEveryType) {
  ASSERT_TRUE(Parse({"--name=abc", "--count=-3", "--steps=5000000000",
                     "--seed=18446744073709551615", "--lr=0.001", "--frac=0.125"})
                  .ok());
  EXPECT_EQ(name_, "abc");
  EXPECT_EQ(count_, -3);
  EXPECT_EQ(steps_, int64_t{5000000000});
  EXPECT_EQ(seed_, UINT64_MAX);
  EXPECT_EQ(lr_, 0.001f);
  EXPECT_EQ(frac_, 0.125);
}

TEST(FlagSetCountOrAuto, ACountOrAutoAsZero_NothingElse) {
  int replicas = 1;
  FlagSet flags("usage: tool [flags]");
  flags.CountOrAuto("data", &replicas, "replicas or auto");
  EXPECT_TRUE(flags.Parse({"--data=3"}).ok());
  EXPECT_EQ(replicas, 3);
  EXPECT_TRUE(flags.Parse({"--data", "auto"}).ok());
  EXPECT_EQ(replicas, 0);
  for (const std::string bad : {"0", "-2", "Auto", "2x", ""}) {
    SCOPED_TRACE(bad);
    replicas = 5;
    const absl::Status status = flags.Parse({"--data=" + bad});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("--data: cannot parse '" + bad + "' (want a count >= 1 or auto)"));
    EXPECT_EQ(replicas, 5);
  }
  FlagSet shown("usage: tool [flags]");
  int automatic = 0;
  shown.CountOrAuto("data", &automatic, "replicas or auto");
  EXPECT_THAT(shown.Usage(), HasSubstr("auto"));
}

TEST_F(FlagSetTest, Parse_SpaceForm_SetsEveryType) {
  ASSERT_TRUE(Parse({"--name", "abc", "--count", "12", "--steps", "3", "--seed", "42", "--lr",
                     "1e-4", "--frac", "0.75"})
                  .ok());
  EXPECT_EQ(name_, "abc");
  EXPECT_EQ(count_, 12);
  EXPECT_EQ(steps_, 3);
  EXPECT_EQ(seed_, 42u);
  EXPECT_EQ(lr_, 1e-4f);
  EXPECT_EQ(frac_, 0.75);
}

TEST_F(FlagSetTest, Parse_SpaceFormValueStartingWithDashes_TakesItAsValue) {
  // The word after a non-bool flag is its value, whatever it looks like.
  ASSERT_TRUE(Parse({"--name", "--count"}).ok());
  EXPECT_EQ(name_, "--count");
  EXPECT_FALSE(flags_.IsSet("count"));
}

TEST_F(FlagSetTest, Parse_NegativeNumberAfterFlag_IsTheValue) {
  ASSERT_TRUE(Parse({"--count", "-5"}).ok());
  EXPECT_EQ(count_, -5);
}

TEST_F(FlagSetTest, Parse_StringEqualsEmpty_SetsEmptyString) {
  ASSERT_TRUE(Parse({"--name="}).ok());
  EXPECT_EQ(name_, "");
  EXPECT_TRUE(flags_.IsSet("name"));
}

TEST_F(FlagSetTest, Parse_StringValueWithEquals_KeepsEverythingAfterFirstEquals) {
  ASSERT_TRUE(Parse({"--name=a=b"}).ok());
  EXPECT_EQ(name_, "a=b");
}

TEST_F(FlagSetTest, Parse_BareBool_SetsTrue) {
  ASSERT_TRUE(Parse({"--verbose"}).ok());
  EXPECT_TRUE(verbose_);
  EXPECT_TRUE(flags_.IsSet("verbose"));
}

TEST_F(FlagSetTest, Parse_BoolEqualsFalse_SetsFalse) {
  ASSERT_TRUE(Parse({"--color=false"}).ok());
  EXPECT_FALSE(color_);
  EXPECT_TRUE(flags_.IsSet("color"));
}

TEST_F(FlagSetTest, Parse_BoolEqualsTrue_SetsTrue) {
  ASSERT_TRUE(Parse({"--verbose=true"}).ok());
  EXPECT_TRUE(verbose_);
}

TEST_F(FlagSetTest, Parse_NoPrefixBool_SetsFalseAndMarksFlagSet) {
  ASSERT_TRUE(Parse({"--nocolor"}).ok());
  EXPECT_FALSE(color_);
  EXPECT_TRUE(flags_.IsSet("color"));
  EXPECT_FALSE(flags_.IsSet("nocolor"));
}

TEST_F(FlagSetTest, Parse_BoolBadValue_InvalidArgument) {
  absl::Status status = Parse({"--verbose=maybe"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--verbose: cannot parse 'maybe'");
  EXPECT_FALSE(flags_.IsSet("verbose"));
}

TEST_F(FlagSetTest, Parse_BoolFollowedBySeparateWord_WordIsPositional) {
  // A bare bool never consumes the next word: "--verbose false" is an error,
  // not a silent true.
  absl::Status status = Parse({"--verbose", "false"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "unexpected argument 'false'");
}

TEST_F(FlagSetTest, Parse_NoPrefixOnNonBool_UnknownFlag) {
  absl::Status status = Parse({"--nocount"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "unknown flag --nocount; did you mean --count? (see --help)");
}

TEST_F(FlagSetTest, Parse_NoPrefixWithValue_UnknownFlag) {
  absl::Status status = Parse({"--nocolor=true"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "unknown flag --nocolor; did you mean --color? (see --help)");
}

TEST_F(FlagSetTest, Parse_RepeatedFlag_LastValueWins) {
  ASSERT_TRUE(Parse({"--count=1", "--count", "2"}).ok());
  EXPECT_EQ(count_, 2);
}

TEST_F(FlagSetTest, IsSet_OnlyGivenFlags_True) {
  ASSERT_TRUE(Parse({"--lr", "0.1", "--verbose"}).ok());
  EXPECT_TRUE(flags_.IsSet("lr"));
  EXPECT_TRUE(flags_.IsSet("verbose"));
  EXPECT_FALSE(flags_.IsSet("frac"));
  EXPECT_FALSE(flags_.IsSet("name"));
  EXPECT_FALSE(flags_.IsSet("not-a-flag"));
}

TEST_F(FlagSetTest, IsSet_ValueEqualToDefault_StillTrue) {
  ASSERT_TRUE(Parse({"--count=7"}).ok());
  EXPECT_TRUE(flags_.IsSet("count"));
}

TEST_F(FlagSetTest, Parse_UnknownFlag_InvalidArgumentNamingIt) {
  absl::Status status = Parse({"--bogus=1"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "unknown flag --bogus (see --help)");
}

// A typo names the flag it is near (common/closest_name.h).
TEST_F(FlagSetTest, Parse_MisspeltFlag_SuggestsTheNearOne) {
  EXPECT_EQ(Parse({"--cuont=1"}).message(),
            "unknown flag --cuont; did you mean --count? (see --help)");
  EXPECT_EQ(Parse({"--verbos"}).message(),
            "unknown flag --verbos; did you mean --verbose? (see --help)");
}

TEST_F(FlagSetTest, Parse_UnknownFlagAfterGoodOnes_StopsThere) {
  absl::Status status = Parse({"--count=3", "--bogus", "--steps=9"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("--bogus"));
  EXPECT_EQ(count_, 3);
  EXPECT_EQ(steps_, 100);
}

TEST_F(FlagSetTest, Parse_MissingValueAtEnd_InvalidArgument) {
  absl::Status status = Parse({"--count"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--count needs a value");
  EXPECT_EQ(count_, 7);
  EXPECT_FALSE(flags_.IsSet("count"));
}

TEST_F(FlagSetTest, Parse_StringMissingValue_InvalidArgument) {
  absl::Status status = Parse({"--lr", "0.1", "--name"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--name needs a value");
}

TEST_F(FlagSetTest, Parse_FloatNotANumber_InvalidArgument) {
  absl::Status status = Parse({"--lr", "abc"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--lr: cannot parse 'abc'");
  EXPECT_FALSE(flags_.IsSet("lr"));
}

TEST_F(FlagSetTest, Parse_FloatEmptyValue_InvalidArgument) {
  absl::Status status = Parse({"--lr="});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--lr: cannot parse ''");
}

TEST_F(FlagSetTest, Parse_FloatNan_InvalidArgument) {
  absl::Status status = Parse({"--lr", "nan"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--lr: cannot parse 'nan'");
}

TEST_F(FlagSetTest, Parse_FloatInfinity_InvalidArgument) {
  absl::Status status = Parse({"--lr=inf"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--lr: cannot parse 'inf'");
}

TEST_F(FlagSetTest, Parse_FloatOverflowsToInfinity_InvalidArgument) {
  absl::Status status = Parse({"--lr=1e60"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--lr: cannot parse '1e60'");
}

TEST_F(FlagSetTest, Parse_DoubleNegativeInfinity_InvalidArgument) {
  absl::Status status = Parse({"--frac", "-inf"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--frac: cannot parse '-inf'");
}

TEST_F(FlagSetTest, Parse_DoubleNan_InvalidArgument) {
  absl::Status status = Parse({"--frac=NaN"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--frac: cannot parse 'NaN'");
}

TEST_F(FlagSetTest, Parse_IntWithFraction_InvalidArgument) {
  absl::Status status = Parse({"--steps", "1.5"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--steps: cannot parse '1.5'");
  EXPECT_FALSE(flags_.IsSet("steps"));
}

TEST_F(FlagSetTest, Parse_IntNotANumber_InvalidArgument) {
  absl::Status status = Parse({"--count=ten"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--count: cannot parse 'ten'");
}

TEST_F(FlagSetTest, Parse_IntOutOfRange_InvalidArgument) {
  absl::Status status = Parse({"--count", "99999999999"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--count: cannot parse '99999999999'");
}

TEST_F(FlagSetTest, Parse_Uint64Negative_InvalidArgument) {
  absl::Status status = Parse({"--seed=-1"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--seed: cannot parse '-1'");
}

TEST_F(FlagSetTest, Parse_Positional_InvalidArgument) {
  absl::Status status = Parse({"--count=1", "extra"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "unexpected argument 'extra'");
}

TEST_F(FlagSetTest, ParseCollectingPositional_WordsAnywhereAmongTheFlags) {
  std::vector<std::string> words;
  ASSERT_TRUE(flags_.Parse({"first", "--count", "4", "second", "--verbose", "-x"}, &words).ok());
  EXPECT_EQ(words, (std::vector<std::string>{"first", "second", "-x"}));
  EXPECT_EQ(count_, 4);  // "4" is --count's value, not a word
  EXPECT_TRUE(verbose_);
}

TEST_F(FlagSetTest, ParseCollectingPositional_HelpAndBadFlagsAsBefore) {
  std::vector<std::string> words;
  ASSERT_TRUE(flags_.Parse({"id", "-h"}, &words).ok());
  EXPECT_TRUE(flags_.help_requested());
  EXPECT_EQ(flags_.Parse({"id", "--"}, &words).message(), "unexpected argument '--'");
}

TEST_F(FlagSetTest, Parse_SingleDashFlag_InvalidArgument) {
  absl::Status status = Parse({"-count=1"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "unexpected argument '-count=1'");
}

TEST_F(FlagSetTest, Parse_BareDoubleDash_InvalidArgument) {
  absl::Status status = Parse({"--"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "unexpected argument '--'");
}

TEST_F(FlagSetTest, Parse_Help_StopsParsingAndRequestsHelp) {
  // Everything after --help is ignored, even words that would be errors.
  ASSERT_TRUE(Parse({"--count=3", "--help", "--bogus", "--steps=9"}).ok());
  EXPECT_TRUE(flags_.help_requested());
  EXPECT_EQ(count_, 3);
  EXPECT_EQ(steps_, 100);
}

TEST_F(FlagSetTest, Parse_ShortHelp_RequestsHelp) {
  ASSERT_TRUE(Parse({"-h"}).ok());
  EXPECT_TRUE(flags_.help_requested());
}

TEST_F(FlagSetTest, Parse_ErrorBeforeHelp_ReturnsErrorWithoutHelp) {
  absl::Status status = Parse({"--bogus", "--help"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(flags_.help_requested());
}

TEST_F(FlagSetTest, Usage_ListsEveryFlagSortedWithDefaults) {
  EXPECT_EQ(flags_.Usage(),
            "usage: tool [flags]\n"
            "\n"
            "Flags:\n"
            "  --color  a bool defaulting to true (default true)\n"
            "  --count  an int (default 7)\n"
            "  --frac  a double (default 0.25)\n"
            "  --lr  a float (default 0.5)\n"
            "  --name  a string (default \"default\")\n"
            "  --seed  a uint64 (default 1)\n"
            "  --steps  an int64 (default 100)\n"
            "  --verbose  a bool defaulting to false (default false)\n");
}

TEST_F(FlagSetTest, Usage_AfterParse_StillShowsOriginalDefaults) {
  ASSERT_TRUE(Parse({"--count=99", "--name=changed"}).ok());
  const std::string usage = flags_.Usage();
  EXPECT_THAT(usage, HasSubstr("  --count  an int (default 7)\n"));
  EXPECT_THAT(usage, HasSubstr("  --name  a string (default \"default\")\n"));
}

TEST(FlagSetUsageTest, Usage_SmallFloatDefault_ShownReadably) {
  float lr = 3e-4f;
  FlagSet flags("usage: x");
  flags.Float("lr", &lr, "learning rate");
  EXPECT_EQ(flags.Usage(), "usage: x\n\nFlags:\n  --lr  learning rate (default 0.0003)\n");
}

TEST(FlagSetUsageTest, DefaultText_ShownInsteadOfTheSentinelValue) {
  double beta = -1;  // a sentinel: "decided later"
  FlagSet flags("usage: x");
  flags.Double("beta", &beta, "a weight");
  flags.DefaultText("beta", "calibrated");
  EXPECT_EQ(flags.Usage(), "usage: x\n\nFlags:\n  --beta  a weight (default calibrated)\n");
  ASSERT_TRUE(flags.Parse({}).ok());
  EXPECT_EQ(beta, -1);  // the variable keeps its value
  EXPECT_FALSE(flags.IsSet("beta"));
}

TEST(FlagSetUsageTest, Parse_EmptyFlagSet_RejectsAnyFlag) {
  FlagSet flags("usage: x");
  absl::Status status = flags.Parse({"--anything"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "unknown flag --anything (see --help)");
}

// Sets an environment variable for one test and removes it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(FlagSetEnvTest, Parse_EnvSetAndFlagAbsent_TakesEnv) {
  ScopedEnv env("FLAG_SET_TEST_ADDR", "10.0.0.1:7070");
  std::string address = "127.0.0.1:7070";
  FlagSet flags("usage: x");
  flags.String("address", &address, "where");
  flags.FromEnv("address", "FLAG_SET_TEST_ADDR");
  ASSERT_TRUE(flags.Parse({}).ok());
  EXPECT_EQ(address, "10.0.0.1:7070");
  EXPECT_TRUE(flags.IsSet("address"));
  EXPECT_TRUE(flags.FromEnvironment("address"));
}

TEST(FlagSetEnvTest, Parse_EnvAndFlag_FlagWins) {
  ScopedEnv env("FLAG_SET_TEST_ADDR", "10.0.0.1:7070");
  std::string address;
  FlagSet flags("usage: x");
  flags.String("address", &address, "where");
  flags.FromEnv("address", "FLAG_SET_TEST_ADDR");
  ASSERT_TRUE(flags.Parse({"--address=h:1"}).ok());
  EXPECT_EQ(address, "h:1");
  EXPECT_FALSE(flags.FromEnvironment("address"));
}

TEST(FlagSetEnvTest, Parse_EnvEmptyOrUnset_KeepsDefault) {
  ScopedEnv env("FLAG_SET_TEST_EMPTY", "");
  std::string a = "default-a", b = "default-b";
  FlagSet flags("usage: x");
  flags.String("a", &a, "a");
  flags.String("b", &b, "b");
  flags.FromEnv("a", "FLAG_SET_TEST_EMPTY");
  flags.FromEnv("b", "FLAG_SET_TEST_UNSET_VARIABLE");
  ASSERT_TRUE(flags.Parse({}).ok());
  EXPECT_EQ(a, "default-a");
  EXPECT_EQ(b, "default-b");
  EXPECT_FALSE(flags.IsSet("a"));
}

TEST(FlagSetEnvTest, Parse_EnvDoesNotParse_InvalidArgumentNamingVariable) {
  ScopedEnv env("FLAG_SET_TEST_COUNT", "many");
  int count = 1;
  FlagSet flags("usage: x");
  flags.Int("count", &count, "how many");
  flags.FromEnv("count", "FLAG_SET_TEST_COUNT");
  absl::Status status = flags.Parse({});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "$FLAG_SET_TEST_COUNT (the default of --count): cannot parse 'many'");
  EXPECT_TRUE(flags.Parse({"--count=3"}).ok());  // the flag overrides a bad variable
  EXPECT_EQ(count, 3);
}

TEST(FlagSetEnvTest, Usage_FlagWithEnv_NamesVariable) {
  std::string address = "h:1";
  FlagSet flags("usage: x");
  flags.String("address", &address, "where");
  flags.FromEnv("address", "ADDR");
  EXPECT_EQ(flags.Usage(), "usage: x\n\nFlags:\n  --address  where (default \"h:1\"; env $ADDR)\n");
}

TEST(FlagSetDurationTest, Parse_UnitsAndPlainSeconds_SetDuration) {
  absl::Duration timeout = absl::Seconds(10);
  FlagSet flags("usage: x");
  flags.Duration("timeout", &timeout, "deadline");
  EXPECT_THAT(flags.Usage(), HasSubstr("--timeout  deadline (default 10s)"));
  ASSERT_TRUE(flags.Parse({"--timeout=250ms"}).ok());
  EXPECT_EQ(timeout, absl::Milliseconds(250));
  ASSERT_TRUE(flags.Parse({"--timeout", "1.5"}).ok());
  EXPECT_EQ(timeout, absl::Milliseconds(1500));
  ASSERT_TRUE(flags.Parse({"--timeout=2m"}).ok());
  EXPECT_EQ(timeout, absl::Minutes(2));
}

TEST(FlagSetDurationTest, Parse_NegativeInfiniteOrJunk_InvalidArgument) {
  absl::Duration timeout = absl::Seconds(10);
  FlagSet flags("usage: x");
  flags.Duration("timeout", &timeout, "deadline");
  for (const char* bad : {"-1s", "-2", "inf", "soon", "10 s"}) {
    absl::Status status = flags.Parse({std::string("--timeout=") + bad});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(status.message(), std::string("--timeout: cannot parse '") + bad + "'");
  }
  EXPECT_EQ(timeout, absl::Seconds(10));
}

TEST(FlagSetVersionTest, Parse_Version_StopsAndSetsVersionRequested) {
  std::string name;
  FlagSet flags("usage: x");
  flags.String("name", &name, "a name");
  flags.AddVersionFlag();
  ASSERT_TRUE(flags.Parse({"--version", "--unknown"}).ok());
  EXPECT_TRUE(flags.version_requested());
  EXPECT_FALSE(flags.help_requested());
  EXPECT_THAT(flags.Usage(), HasSubstr("  --version  print the version and exit\n"));
}

TEST(FlagSetVersionTest, Parse_VersionNotAdded_UnknownFlag) {
  FlagSet flags("usage: x");
  EXPECT_EQ(flags.Parse({"--version"}).message(), "unknown flag --version (see --help)");
}

TEST(FlagSetDescribeTest, Describe_ListsEveryFlagSortedWithKindAndEnv) {
  std::string address;
  bool json = false;
  int count = 0;
  FlagSet flags("usage: x");
  flags.String("zeta", &address, "an address");
  flags.Bool("json", &json, "print JSON");
  flags.Int("count", &count, "how many");
  flags.FromEnv("zeta", "ZETA");
  flags.AddVersionFlag();
  std::vector<std::string> names;
  for (const FlagSet::Info& info : flags.Describe()) names.push_back(info.name);
  EXPECT_EQ(names, (std::vector<std::string>{"count", "json", "version", "zeta"}));
  const std::vector<FlagSet::Info> infos = flags.Describe();
  EXPECT_FALSE(infos[0].is_bool);
  EXPECT_TRUE(infos[1].is_bool);
  EXPECT_EQ(infos[1].help, "print JSON");
  EXPECT_TRUE(infos[2].is_bool);
  EXPECT_EQ(infos[3].env, "ZETA");
}

}  // namespace
}  // namespace pipetrain
