// TestCaseDir: a directory of the running test case's own under
// $TEST_TMPDIR, for tests whose code under test names its files after ids
// that restart in every case (job-1, w-1): in one shared directory a case
// found the files an earlier case left (a manifest another job-1 wrote
// satisfied a check that this one's was written), and a repeated or
// shuffled run (--gtest_repeat, --gtest_shuffle) failed on them.
#ifndef PIPETRAIN_COMMON_TESTING_TEST_CASE_DIR_H_
#define PIPETRAIN_COMMON_TESTING_TEST_CASE_DIR_H_

#include <string>

namespace pipetrain {

// $TEST_TMPDIR/<suite>.<case> (a parameterised case's "/" kept as
// subdirectories), emptied and created the first time a case asks after it
// started (again when it runs again: --gtest_repeat), and the same path for
// the rest of that run of the case. Thread-safe.
// Requires a running gtest case and TEST_TMPDIR (bazel test sets it).
std::string TestCaseDir();

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_TESTING_TEST_CASE_DIR_H_
