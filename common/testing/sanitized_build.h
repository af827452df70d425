// Whether this test binary is built with a sanitizer, for tests that use
// up every file descriptor: the sanitizers' own checks need descriptors
// (UBSan's vptr check tests memory through a pipe), and with none left
// they report a false error. Such tests run in the plain builds only:
//
//   if (kSanitizedBuild) GTEST_SKIP() << kNoDescriptorsUnderSanitizers;
#ifndef PIPETRAIN_COMMON_TESTING_SANITIZED_BUILD_H_
#define PIPETRAIN_COMMON_TESTING_SANITIZED_BUILD_H_

namespace pipetrain {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
inline constexpr char kNoDescriptorsUnderSanitizers[] =
    "the sanitizers need file descriptors this test uses up (run in the plain build)";

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_TESTING_SANITIZED_BUILD_H_
