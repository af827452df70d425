// For tests that check how code meets file modes: tests may run as root,
// whom a mode 000 directory does not stop.
//
//   const WithoutFileAccessOverride unprivileged;
//   ASSERT_TRUE(unprivileged.ok());
//   EXPECT_EQ(Submit(spec).status().code(), absl::StatusCode::kFailedPrecondition);
//
// While alive, the calling thread goes without CAP_DAC_OVERRIDE and
// CAP_DAC_READ_SEARCH (from its effective set; put back at the end), so
// that file modes stop it as they stop a process not run as root.
// Capabilities are per thread: only what runs on the caller's thread is
// affected.
#ifndef PIPETRAIN_COMMON_TESTING_FILE_ACCESS_OVERRIDE_H_
#define PIPETRAIN_COMMON_TESTING_FILE_ACCESS_OVERRIDE_H_

#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace pipetrain {

class WithoutFileAccessOverride {
 public:
  WithoutFileAccessOverride() {
    if (syscall(SYS_capget, &header_, saved_) != 0) return;
    __user_cap_data_struct dropped[2] = {saved_[0], saved_[1]};
    for (const int cap : {CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH}) {
      dropped[cap / 32].effective &= ~(1u << (cap % 32));
    }
    ok_ = syscall(SYS_capset, &header_, dropped) == 0;
  }
  ~WithoutFileAccessOverride() {
    if (ok_) syscall(SYS_capset, &header_, saved_);
  }
  WithoutFileAccessOverride(const WithoutFileAccessOverride&) = delete;
  WithoutFileAccessOverride& operator=(const WithoutFileAccessOverride&) = delete;
  // Whether the capabilities were dropped (and will be put back).
  bool ok() const { return ok_; }

 private:
  __user_cap_header_struct header_ = {_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct saved_[2] = {};
  bool ok_ = false;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_TESTING_FILE_ACCESS_OVERRIDE_H_
