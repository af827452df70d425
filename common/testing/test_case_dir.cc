#include "common/testing/test_case_dir.h"

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pipetrain {

std::string TestCaseDir() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const char* tmp = std::getenv("TEST_TMPDIR");
  if (info == nullptr || tmp == nullptr) {
    ADD_FAILURE() << "TestCaseDir needs a running test case and TEST_TMPDIR";
    return tmp != nullptr ? tmp : "/nonexistent";
  }
  const std::string dir = absl::StrCat(tmp, "/", info->test_suite_name(), ".", info->name());
  static std::mutex mu;
  static std::string made;  // the case whose directory was emptied and created
  std::lock_guard<std::mutex> lock(mu);
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
