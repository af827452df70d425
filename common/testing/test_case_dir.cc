#include "common/testing/test_case_dir.h"

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::mutex made_mu;
std::string made;  // the directory emptied and created for the running case

// Forgets it as each case starts: a case run again (--gtest_repeat, or a
// shuffled round's first case that was the last round's last) gets its
// directory emptied again.
class ForgetMadeDir : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(made_mu);
    made.clear();
  }
};

// Registered before RUN_ALL_TESTS (a static initializer of this file, which
// every user of TestCaseDir links).
[[maybe_unused]] const bool registered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new ForgetMadeDir);
  return true;
}();

}  // namespace

std::string TestCaseDir() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const char* tmp = std::getenv("TEST_TMPDIR");
  if (info == nullptr || tmp == nullptr) {
    ADD_FAILURE() << "TestCaseDir needs a running test case and TEST_TMPDIR";
    return tmp != nullptr ? tmp : "/nonexistent";
  }
  const std::string dir = absl::StrCat(tmp, "/", info->test_suite_name(), ".", info->name());
  std::lock_guard<std::mutex> lock(made_mu);
  if (made != dir) {
    std::error_code error;
    std::filesystem::remove_all(dir, error);
    std::filesystem::create_directories(dir, error);
    EXPECT_FALSE(error) << dir << ": " << error.message();
    made = dir;
  }
  return dir;
}

}  // namespace pipetrain
