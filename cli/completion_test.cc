#include "cli/completion.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::vector<CompletedCommand> TwoCommands() {
  return {
      {"jobs",
       "list jobs",
       {},
       {{"coordinator", "the coordinator's address [host:port]", false, "PIPETRAIN_COORDINATOR"},
        {"json", "print JSON", true, ""}}},
      {"checkpoint", "export checkpoints", {"export"}, {{"out", "file to write", false, ""}}},
  };
}

TEST(CompletionTest, BashCompletion_ListsCommandsFlagsAndValueFlags) {
  const std::string script = BashCompletion("pt", {"--help", "--version"}, TwoCommands());
  EXPECT_THAT(script, HasSubstr("_pt() {\n"));
  EXPECT_THAT(script, HasSubstr("compgen -W 'jobs checkpoint --help --version'"));
  EXPECT_THAT(script, HasSubstr("    'jobs')\n      flags='--coordinator --json --help'\n"
                                "      values='--coordinator'\n      ;;\n"));
  EXPECT_THAT(script, HasSubstr("    'checkpoint')\n      flags='--out --help'\n"
                                "      values='--out'\n      words='export'\n      ;;\n"));
  EXPECT_THAT(script, HasSubstr("complete -o default -F _pt pt\n"));
  // Right after a command with words, its words (and --help), not its flags.
  EXPECT_THAT(script, HasSubstr("if [[ $COMP_CWORD -eq 2 && -n \"$words\" ]]; then\n"
                                "    COMPREPLY=($(compgen -W \"$words --help\" -- \"$cur\"))\n"));
}

TEST(CompletionTest, ZshCompletion_DescribesCommandsAndEscapesHelp) {
  const std::string script = ZshCompletion("pt", {"--version"}, TwoCommands());
  EXPECT_THAT(script, HasSubstr("#compdef pt\n"));
  EXPECT_THAT(script, HasSubstr("    'jobs:list jobs'\n"));
  // ' closes and reopens the quotes; [ ] : are escaped for _arguments.
  EXPECT_THAT(script, HasSubstr("'--coordinator=[the coordinator'\\''s address \\[host\\:port\\] "
                                "(env $PIPETRAIN_COORDINATOR)]:coordinator:_files' \\\n"));
  EXPECT_THAT(script, HasSubstr("'--json[print JSON]' \\\n"));
  EXPECT_THAT(script, HasSubstr("'1:checkpoint:(export)' \\\n"));
  // The word before any flag.
  EXPECT_THAT(script, HasSubstr("    'checkpoint')\n      if (( CURRENT == 2 )); then\n"
                                "        compadd -- 'export' --help\n"));
  EXPECT_THAT(script, HasSubstr("compdef _pt pt\n"));
  EXPECT_THAT(script, Not(HasSubstr("--out[")));  // --out takes a value
}

}  // namespace
}  // namespace pipetrain
