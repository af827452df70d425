// NCCL communicators (nccl_comm.h) and NCCL status conversion (nccl_status.h).
//
// What runs where:
// - Without a GPU (CI): status conversion, every argument and empty-handle
//   check, unique-id serialisation and creation (ncclGetUniqueId needs a
//   network interface, not a GPU; skipped if it fails where no device is
//   visible), the group scope, and the library version.
// - One GPU (NcclGpuTest): a one-rank communicator: AllReduceSum returns its
//   input exactly, in place too; a Send to self paired with a Recv from self
//   in one NcclGroup moves the data exactly. Two ranks on the same GPU in
//   two threads: either NCCL accepts it (then the all-reduce sum and the
//   exchange are checked exactly) or every rank's Create fails cleanly; the
//   test prints which ("[ NCCL ] two ranks on one GPU: ...").
// - Not shown by these tests: transports between distinct GPUs (NVLink,
//   PCIe P2P, shared memory), sums over more than two ranks, bandwidth.
#include "kernels/cuda/nccl_comm.h"

#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/nccl_status.h"
#include "kernels/cuda/parity_testing.h"
#include "kernels/cuda/stream.h"

// LeakSanitizer: NCCL 2.28's ncclGroupEnd of a group with no operations
// (the NcclGroupTest cases, which need no GPU) leaks its 160-byte group job
// inside libnccl. Only that allocation site is suppressed; leaks of
// communicators or buffers still fail the ASan run.
extern "C" const char* __lsan_default_suppressions() { return "leak:ncclGroupEndInternal\n"; }

namespace pipetrain {
namespace {

using ::pipetrain::testing::AllClose;
using ::pipetrain::testing::RandomNormal;

// Sizes for the data-moving cases: one element, a small odd size, and more
// than 2^20 elements with a remainder (past NCCL's chunking of large buffers).
constexpr int64_t kSizes[] = {1, 1000, (int64_t{1} << 20) + 3};

bool Contains(const absl::Status& status, const std::string& part) {
  return std::string(status.message()).find(part) != std::string::npos;
}

// An id for argument-check tests that never reach NCCL.
NcclUniqueId ZeroId() { return *NcclUniqueId::FromBytes(std::string(NCCL_UNIQUE_ID_BYTES, '\0')); }

// Whether the runtime finds no GPU (the caller skips). A runtime that
// cannot count them fails the test: CudaDeviceCount reads "no GPU" as 0, so
// its error is a fault a skip would hide (a failure before a skip reports
// the test failed).
bool NoCudaDevice() {
  const absl::StatusOr<int> count = CudaDeviceCount();
  EXPECT_TRUE(count.ok()) << count.status();
  return !count.ok() || *count == 0;
}

// --- nccl_status.h ---

absl::Status ReturnsThrough(ncclResult_t result) {
  NCCL_RETURN_IF_ERROR(result);
  return absl::OkStatus();
}

TEST(NcclStatusTest, NcclStatus_Success_Ok) {
  EXPECT_TRUE(NcclStatus(ncclSuccess, "ncclGroupStart()", "x.cc", 1).ok());
  EXPECT_TRUE(ReturnsThrough(ncclSuccess).ok());
}

TEST(NcclStatusTest, NcclStatus_Failure_InternalNamingCallAndResult) {
  const absl::Status status = NcclStatus(ncclInvalidUsage, "ncclSend(buf)", "x.cc", 12);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(Contains(status, "ncclSend(buf) failed at x.cc:12: ncclInvalidUsage (")) << status;
}

TEST(NcclStatusTest, NcclReturnIfError_Failure_ReturnsInternal) {
  const absl::Status status = ReturnsThrough(ncclSystemError);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(Contains(status, "result failed at")) << status;
  EXPECT_TRUE(Contains(status, "ncclSystemError")) << status;
}

TEST(NcclStatusTest, NcclResultName_UnknownValue_SaysUnknown) {
  EXPECT_STREQ(NcclResultName(ncclRemoteError), "ncclRemoteError");
  EXPECT_STREQ(NcclResultName(static_cast<ncclResult_t>(99)), "ncclResult(unknown)");
}

// --- Version ---

TEST(NcclVersionTest, NcclVersionString_BothSchemes_Decoded) {
  EXPECT_EQ(NcclVersionString(22809), "2.28.9");
  EXPECT_EQ(NcclVersionString(21903), "2.19.3");
  EXPECT_EQ(NcclVersionString(2708), "2.7.8");
}

TEST(NcclVersionTest, NcclVersionAtLeast_BothSchemes) {
  EXPECT_TRUE(NcclVersionAtLeast(22809, 2, 22));
  EXPECT_TRUE(NcclVersionAtLeast(22200, 2, 22));
  EXPECT_FALSE(NcclVersionAtLeast(22103, 2, 22));
  EXPECT_FALSE(NcclVersionAtLeast(2708, 2, 22));  // 2.7.8, the old scheme
  EXPECT_TRUE(NcclVersionAtLeast(2708, 2, 7));
  EXPECT_TRUE(NcclVersionAtLeast(30001, 2, 22));  // a later major
  EXPECT_FALSE(NcclVersionAtLeast(10901, 2, 0));
}

// Sets (or, with nullptr, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* before = std::getenv(name);
    had_ = before != nullptr;
    if (had_) before_ = before;
    if (value == nullptr) {
      unsetenv(name);
    } else {
      setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, before_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string before_;
};

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// The toolkit's NCCL here is 2.28: device groups are allowed, unless the
// environment asks split communicators to share their resources.
TEST(NcclVersionTest, CheckNcclForDeviceGroups_ThisLibrary_OkUnlessSharing) {
  // An empty configuration file instead of ~/.nccl.conf (the machine's
  // /etc/nccl.conf still counts: a machine that shares is refused).
  const std::string empty_conf = WriteFile("empty.conf", "");
  ScopedEnv conf("NCCL_CONF_FILE", empty_conf.c_str());
  const char* before = std::getenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
  const std::string saved = before == nullptr ? "" : before;
  unsetenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
  EXPECT_TRUE(CheckNcclForDeviceGroups().ok()) << CheckNcclForDeviceGroups();
  setenv("NCCL_COMM_SPLIT_SHARE_RESOURCES", "1", 1);
  const absl::Status sharing = CheckNcclForDeviceGroups();
  EXPECT_EQ(sharing.code(), absl::StatusCode::kFailedPrecondition) << sharing;
  EXPECT_NE(sharing.message().find("NCCL_COMM_SPLIT_SHARE_RESOURCES=1"), std::string::npos);
  setenv("NCCL_COMM_SPLIT_SHARE_RESOURCES", "0", 1);
  EXPECT_TRUE(CheckNcclForDeviceGroups().ok()) << CheckNcclForDeviceGroups();
  if (before == nullptr) {
    unsetenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
  } else {
    setenv("NCCL_COMM_SPLIT_SHARE_RESOURCES", saved.c_str(), 1);
  }
}

// NCCL also takes its settings from configuration files; the check must see
// what NCCL will see. (Made-up setting names keep the machine's own NCCL
// environment out of the way; /etc/nccl.conf is replaced by a test file.)
TEST(NcclSettingTest, EnvironmentThenUserFileThenSystemFile) {
  const std::string system_file = WriteFile(
      "system.conf", "PIPETRAIN_T_A=system\nPIPETRAIN_T_B=system\nPIPETRAIN_T_C=system\n");
  const std::string user_file =
      WriteFile("user.conf",
                "# PIPETRAIN_T_B=comment\nPIPETRAIN_T_B=user\nPIPETRAIN_T_B=second\n"
                " PIPETRAIN_T_C=padded name\nPIPETRAIN_T_D= 1 \n");
  ScopedEnv env_a("PIPETRAIN_T_A", "environment");
  ScopedEnv unset_b("PIPETRAIN_T_B", nullptr);
  ScopedEnv unset_c("PIPETRAIN_T_C", nullptr);
  ScopedEnv unset_d("PIPETRAIN_T_D", nullptr);
  NcclConfFiles files;
  files.system_file = system_file;
  files.home = "/nonexistent-home";
  {
    ScopedEnv conf("NCCL_CONF_FILE", user_file.c_str());
    EXPECT_EQ(NcclSetting("PIPETRAIN_T_A", files), "environment");
    EXPECT_EQ(NcclSetting("PIPETRAIN_T_B", files), "user");    // first line, comments skipped
    EXPECT_EQ(NcclSetting("PIPETRAIN_T_C", files), "system");  // " NAME" is another name
    EXPECT_EQ(NcclSetting("PIPETRAIN_T_D", files), " 1 ");     // the value as written
    EXPECT_EQ(NcclSetting("PIPETRAIN_T_NONE", files), std::nullopt);
  }
  {
    // An empty NCCL_CONF_FILE is ignored, as NCCL ignores it: the home
    // directory's .nccl.conf is read.
    ScopedEnv conf("NCCL_CONF_FILE", "");
    const std::string home = std::string(std::getenv("TEST_TMPDIR")) + "/home";
    mkdir(home.c_str(), 0700);
    WriteFile("home/.nccl.conf", "PIPETRAIN_T_B=home\n");
    files.home = home;
    EXPECT_EQ(NcclSetting("PIPETRAIN_T_B", files), "home");
    EXPECT_EQ(NcclSetting("PIPETRAIN_T_C", files), "system");
  }
}

TEST(NcclSettingTest, IntegerSettings_ReadAsNcclReadsThem) {
  EXPECT_TRUE(NcclIntegerSettingNonZero("1"));
  EXPECT_TRUE(NcclIntegerSettingNonZero(" 1 "));
  EXPECT_TRUE(NcclIntegerSettingNonZero("0x1"));
  EXPECT_TRUE(NcclIntegerSettingNonZero("-1"));
  EXPECT_FALSE(NcclIntegerSettingNonZero("0"));
  EXPECT_FALSE(NcclIntegerSettingNonZero("00"));
  EXPECT_FALSE(NcclIntegerSettingNonZero(""));
  EXPECT_FALSE(NcclIntegerSettingNonZero("yes"));                   // strtoll reads no digits: 0
  EXPECT_FALSE(NcclIntegerSettingNonZero("99999999999999999999"));  // out of range: default
  EXPECT_FALSE(NcclIntegerSettingNonZero("-2147483648"));           // NCCL's "undefined"
}

// The check reads the setting from a configuration file too.
TEST(NcclSettingTest, CheckNcclForDeviceGroups_SharingInConfFile_Refused) {
  ScopedEnv unset("NCCL_COMM_SPLIT_SHARE_RESOURCES", nullptr);
  const std::string conf = WriteFile("share.conf", "NCCL_COMM_SPLIT_SHARE_RESOURCES=1\n");
  ScopedEnv file("NCCL_CONF_FILE", conf.c_str());
  const absl::Status sharing = CheckNcclForDeviceGroups();
  EXPECT_EQ(sharing.code(), absl::StatusCode::kFailedPrecondition) << sharing;
  ScopedEnv env("NCCL_COMM_SPLIT_SHARE_RESOURCES", "0");  // The environment wins.
  EXPECT_TRUE(CheckNcclForDeviceGroups().ok()) << CheckNcclForDeviceGroups();
}

TEST(NcclVersionTest, NcclVersion_LoadedLibrary_SameMajorAsHeader) {
  const absl::StatusOr<std::string> version = NcclVersion();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(version->rfind(absl::StrCat(NCCL_MAJOR, "."), 0), 0u) << *version;
  std::cout << "[ NCCL ] library version " << *version << "\n";
}

// --- NcclUniqueId ---

TEST(NcclUniqueIdTest, FromBytes_ExactLength_RoundTrips) {
  std::string bytes(NCCL_UNIQUE_ID_BYTES, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);  // NULs too
  const absl::StatusOr<NcclUniqueId> id = NcclUniqueId::FromBytes(bytes);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->ToBytes(), bytes);
}

TEST(NcclUniqueIdTest, FromBytes_WrongLength_InvalidArgument) {
  for (const size_t length :
       {size_t{0}, size_t{NCCL_UNIQUE_ID_BYTES - 1}, size_t{NCCL_UNIQUE_ID_BYTES + 1}}) {
    const absl::Status status = NcclUniqueId::FromBytes(std::string(length, 'x')).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << length;
    const std::string expected = absl::StrCat(
        "got ", length, " bytes, an NCCL unique id has exactly ", NCCL_UNIQUE_ID_BYTES);
    EXPECT_TRUE(Contains(status, expected)) << status;
  }
}

TEST(NcclUniqueIdTest, Create_Twice_DistinctIdsThatRoundTrip) {
  absl::StatusOr<NcclUniqueId> first = NcclUniqueId::Create();
  if (!first.ok() && NoCudaDevice()) GTEST_SKIP() << "ncclGetUniqueId failed: " << first.status();
  ASSERT_TRUE(first.ok()) << first.status();
  const absl::StatusOr<NcclUniqueId> second = NcclUniqueId::Create();
  ASSERT_TRUE(second.ok()) << second.status();
  const std::string bytes = first->ToBytes();
  EXPECT_EQ(bytes.size(), size_t{NCCL_UNIQUE_ID_BYTES});
  EXPECT_NE(bytes, second->ToBytes());
  const absl::StatusOr<NcclUniqueId> copy = NcclUniqueId::FromBytes(bytes);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->ToBytes(), bytes);
}

// --- NcclComm argument checks (no GPU) ---

TEST(NcclCommTest, Create_BadArguments_InvalidArgument) {
  const NcclUniqueId id = ZeroId();
  const struct {
    int nranks, rank, device;
    const char* message;
  } cases[] = {
      {0, 0, 0, "nranks is 0; a communicator needs >= 1 rank"},
      {2, -1, 0, "rank -1 is outside [0, 2)"},
      {2, 2, 0, "rank 2 is outside [0, 2)"},
      {1, 0, -1, "device -1 is negative"},
  };
  for (const auto& c : cases) {
    const absl::Status status = NcclComm::Create(id, c.nranks, c.rank, c.device).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(Contains(status, c.message)) << status;
  }
}

// No such device on any machine: CUDA fails before NCCL is reached (no
// driver: cudaGetDevice; a GPU machine: cudaSetDevice).
TEST(NcclCommTest, Create_NoSuchDevice_InternalNamingRank) {
  const absl::Status status = NcclComm::Create(ZeroId(), 1, 0, 1000).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_TRUE(Contains(status, "NcclComm::Create(rank 0 of 1, device 1000): cudaGetDevice") ||
              Contains(status, "NcclComm::Create(rank 0 of 1, device 1000): cudaSetDevice"))
      << status;
}

TEST(NcclCommTest, Accessors_Empty_DescribeNoCommunicator) {
  NcclComm comm;
  EXPECT_FALSE(comm.valid());
  EXPECT_EQ(comm.get(), nullptr);
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 0);
  EXPECT_EQ(comm.device(), -1);
  EXPECT_TRUE(comm.Destroy().ok());
  comm.Abort();  // a no-op
  EXPECT_FALSE(comm.valid());
}

TEST(NcclCommTest, Operations_NegativeCount_InvalidArgument) {
  NcclComm comm;
  float x = 0.0f;
  const absl::Status all_reduce = comm.AllReduceSum(&x, &x, -1, nullptr);
  EXPECT_EQ(all_reduce.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(all_reduce, "NcclComm::AllReduceSum: count -1 is negative")) << all_reduce;
  const absl::Status send = comm.Send(&x, -2, 0, nullptr);
  EXPECT_EQ(send.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(send, "NcclComm::Send: count -2 is negative")) << send;
  const absl::Status recv = comm.Recv(&x, -3, 0, nullptr);
  EXPECT_EQ(recv.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(recv, "NcclComm::Recv: count -3 is negative")) << recv;
}

TEST(NcclCommTest, Operations_NullBuffer_InvalidArgument) {
  NcclComm comm;
  float x = 0.0f;
  const absl::Status send_null = comm.AllReduceSum(nullptr, &x, 4, nullptr);
  EXPECT_EQ(send_null.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(send_null, "NcclComm::AllReduceSum: send is null with count 4"))
      << send_null;
  const absl::Status recv_null = comm.AllReduceSum(&x, nullptr, 4, nullptr);
  EXPECT_TRUE(Contains(recv_null, "NcclComm::AllReduceSum: recv is null with count 4"))
      << recv_null;
  EXPECT_TRUE(Contains(comm.Send(nullptr, 1, 0, nullptr), "NcclComm::Send: send is null"));
  EXPECT_TRUE(Contains(comm.Recv(nullptr, 1, 0, nullptr), "NcclComm::Recv: recv is null"));
}

// Valid arguments (null is fine with count 0) reach the handle check.
TEST(NcclCommTest, Operations_EmptyHandle_FailedPrecondition) {
  NcclComm comm;
  float x = 0.0f;
  const absl::Status all_reduce = comm.AllReduceSum(nullptr, nullptr, 0, nullptr);
  EXPECT_EQ(all_reduce.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(all_reduce, "NcclComm::AllReduceSum on an empty communicator"))
      << all_reduce;
  EXPECT_EQ(comm.Send(&x, 1, 0, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(comm.Recv(&x, 1, 0, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(comm.Split(0, 0).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Needs no GPU: empty handles are skipped, and no NCCL call is made.
TEST(NcclCommTest, AbortAll_EmptyHandles_NoOp) {
  NcclComm a, b;
  NcclComm::AbortAll({&a, &b});
  NcclComm::AbortAll({});
  EXPECT_FALSE(a.valid());
  EXPECT_FALSE(b.valid());
}

TEST(NcclCommTest, CheckPeer_OutsideRanks_InvalidArgument) {
  EXPECT_TRUE(nccl_internal::CheckPeer("op", 0, 2).ok());
  EXPECT_TRUE(nccl_internal::CheckPeer("op", 1, 2).ok());
  for (const int peer : {-1, 2}) {
    const absl::Status status = nccl_internal::CheckPeer("NcclComm::Send", peer, 2);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(status, absl::StrCat("NcclComm::Send: peer ", peer, " is outside [0, 2)")))
        << status;
  }
}

// The wait for a non-blocking communicator (NcclComm::Create with limits),
// driven by a fake ncclCommGetAsyncError: no GPU needed.
TEST(NcclAwaitTest, InProgressThenSuccess_Ok) {
  int asked = 0;
  const absl::Status s = nccl_internal::AwaitNccl(
      [&] { return ++asked < 4 ? ncclInProgress : ncclSuccess; }, NcclJoinLimits{}, "init");
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(asked, 4);
}

TEST(NcclAwaitTest, Error_InternalNamingTheCallAndResult) {
  const absl::Status s = nccl_internal::AwaitNccl([] { return ncclSystemError; }, NcclJoinLimits{},
                                                  "ncclCommInitRankConfig");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(Contains(s, "ncclCommInitRankConfig failed: ncclSystemError")) << s;
}

TEST(NcclAwaitTest, NeverReady_DeadlineExceededAtTheDeadline) {
  NcclJoinLimits limits;
  limits.deadline = MonotonicClock()->Now() + absl::Milliseconds(20);
  EXPECT_TRUE(limits.limited());
  const absl::Status s =
      nccl_internal::AwaitNccl([] { return ncclInProgress; }, limits, "ncclCommInitRankConfig");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(MonotonicClock()->Now(), limits.deadline);
  EXPECT_TRUE(Contains(s, "not every rank joined by the deadline")) << s;
}

TEST(NcclAwaitTest, Cancelled_StopsWaiting) {
  int asked = 0;
  NcclJoinLimits limits;
  limits.cancelled = [&] { return asked >= 5; };
  const absl::Status s = nccl_internal::AwaitNccl(
      [&] {
        ++asked;
        return ncclInProgress;
      },
      limits, "init");
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(asked, 5);
  EXPECT_FALSE(NcclJoinLimits{}.limited());
}

// The generic wait the NCCL waits and the device channel's drain share.
TEST(PollWithinLimitsTest, PollError_ReturnedAsIs) {
  int asked = 0;
  const absl::Status s = PollWithinLimits(
      [&]() -> absl::StatusOr<bool> {
        if (++asked < 3) return false;
        return absl::UnavailableError("peer gone");
      },
      NcclJoinLimits{}, "drain", "not done");
  EXPECT_EQ(s, absl::UnavailableError("peer gone"));
  EXPECT_EQ(asked, 3);
}

TEST(PollWithinLimitsTest, Cancelled_MessageNamesWhatAndPending) {
  NcclJoinLimits limits;
  limits.cancelled = [] { return true; };
  int asked = 0;
  const absl::Status s = PollWithinLimits(
      [&]() -> absl::StatusOr<bool> {
        ++asked;
        return false;
      },
      limits, "device channel teardown", "not done");
  EXPECT_EQ(s, absl::CancelledError("device channel teardown: cancelled (not done)"));
  EXPECT_EQ(asked, 1);  // polled once before the limits are asked
}

TEST(NcclCommTest, CheckBuffer_ZeroCountNull_Ok) {
  EXPECT_TRUE(nccl_internal::CheckBuffer("op", "buf", nullptr, 0).ok());
}

// --- NcclGroup (no GPU) ---

TEST(NcclGroupTest, End_Twice_FailedPrecondition) {
  absl::StatusOr<NcclGroup> group = NcclGroup::Start();
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_TRUE(group->open());
  EXPECT_TRUE(group->End().ok());
  EXPECT_FALSE(group->open());
  const absl::Status again = group->End();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(again, "NcclGroup::End on a group already ended")) << again;
}

TEST(NcclGroupTest, Destructor_OpenGroup_EndsIt) {
  {
    absl::StatusOr<NcclGroup> group = NcclGroup::Start();
    ASSERT_TRUE(group.ok()) << group.status();
    NcclGroup moved = std::move(*group);
    EXPECT_FALSE(group->open());
    EXPECT_TRUE(moved.open());
  }
  // The group was ended exactly once: NCCL is no longer in a group.
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
}

// --- One GPU ---

class NcclGpuTest : public testing::CudaTest {
 protected:
  static absl::StatusOr<NcclComm> OneRankComm() {
    ASSIGN_OR_RETURN(NcclUniqueId id, NcclUniqueId::Create());
    return NcclComm::Create(id, 1, 0, 0);
  }
};

TEST_F(NcclGpuTest, Create_OneRank_ReportsRankSizeDevice) {
  absl::StatusOr<NcclComm> comm = OneRankComm();
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_TRUE(comm->valid());
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->device(), 0);
  EXPECT_TRUE(comm->Destroy().ok());
  EXPECT_FALSE(comm->valid());
}

// The raw communicator leaves the handle, which then frees nothing.
TEST_F(NcclGpuTest, Release_HandsOverTheCommunicator) {
  absl::StatusOr<NcclComm> comm = OneRankComm();
  ASSERT_TRUE(comm.ok()) << comm.status();
  const ncclComm_t raw = comm->get();
  EXPECT_EQ(comm->Release(), raw);
  EXPECT_FALSE(comm->valid());
  EXPECT_EQ(comm->device(), -1);
  EXPECT_EQ(comm->Release(), nullptr);
  EXPECT_EQ(ncclCommDestroy(raw), ncclSuccess);
}

TEST_F(NcclGpuTest, Send_PeerOutsideRanks_InvalidArgument) {
  absl::StatusOr<NcclComm> comm = OneRankComm();
  ASSERT_TRUE(comm.ok()) << comm.status();
  float x = 0.0f;  // only checked for null: the peer check fails first
  const absl::Status send = comm->Send(&x, 1, 1, nullptr);
  EXPECT_EQ(send.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(send, "NcclComm::Send: peer 1 is outside [0, 1)")) << send;
  const absl::Status recv = comm->Recv(&x, 1, -1, nullptr);
  EXPECT_EQ(recv.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(recv, "NcclComm::Recv: peer -1 is outside [0, 1)")) << recv;
}

// A one-rank sum is the input itself: exact equality (atol = rtol = 0).
TEST_F(NcclGpuTest, AllReduceSum_OneRank_EqualsInput) {
  absl::StatusOr<NcclComm> comm = OneRankComm();
  ASSERT_TRUE(comm.ok()) << comm.status();
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  for (const int64_t n : kSizes) {
    const std::vector<float> input = RandomNormal(/*seed=*/100 + n, n, 0.0f, 1.0f);
    absl::StatusOr<DeviceBuffer<float>> send = DeviceBuffer<float>::FromHost(input);
    absl::StatusOr<DeviceBuffer<float>> recv = DeviceBuffer<float>::Create(n);
    ASSERT_TRUE(send.ok() && recv.ok()) << send.status() << recv.status();
    ASSERT_TRUE(comm->AllReduceSum(send->data(), recv->data(), n, stream->get()).ok());
    ASSERT_TRUE(stream->Synchronize().ok());
    absl::StatusOr<std::vector<float>> out = recv->ToHost();
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(AllClose(absl::StrCat("all-reduce n=", n), *out, input, 0.0f, 0.0f));
  }
}

TEST_F(NcclGpuTest, AllReduceSum_InPlace_EqualsInput) {
  absl::StatusOr<NcclComm> comm = OneRankComm();
  ASSERT_TRUE(comm.ok()) << comm.status();
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  for (const int64_t n : kSizes) {
    const std::vector<float> input = RandomNormal(/*seed=*/200 + n, n, 0.0f, 1.0f);
    absl::StatusOr<DeviceBuffer<float>> buffer = DeviceBuffer<float>::FromHost(input);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    const absl::Status reduced =
        comm->AllReduceSum(buffer->data(), buffer->data(), n, stream->get());
    ASSERT_TRUE(reduced.ok()) << reduced;
    ASSERT_TRUE(stream->Synchronize().ok());
    absl::StatusOr<std::vector<float>> out = buffer->ToHost();
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(AllClose(absl::StrCat("in-place all-reduce n=", n), *out, input, 0.0f, 0.0f));
  }
}

// NCCL allows a rank to send to itself when the matching receive is in the
// same group.
TEST_F(NcclGpuTest, SendRecv_SelfInOneGroup_MovesDataExactly) {
  absl::StatusOr<NcclComm> comm = OneRankComm();
  ASSERT_TRUE(comm.ok()) << comm.status();
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  for (const int64_t n : kSizes) {
    const std::vector<float> input = RandomNormal(/*seed=*/300 + n, n, 0.0f, 1.0f);
    absl::StatusOr<DeviceBuffer<float>> send = DeviceBuffer<float>::FromHost(input);
    absl::StatusOr<DeviceBuffer<float>> recv = DeviceBuffer<float>::Create(n);
    ASSERT_TRUE(send.ok() && recv.ok()) << send.status() << recv.status();
    {
      absl::StatusOr<NcclGroup> group = NcclGroup::Start();
      ASSERT_TRUE(group.ok()) << group.status();
      ASSERT_TRUE(comm->Send(send->data(), n, 0, stream->get()).ok());
      ASSERT_TRUE(comm->Recv(recv->data(), n, 0, stream->get()).ok());
      const absl::Status ended = group->End();
      ASSERT_TRUE(ended.ok()) << ended;
    }
    ASSERT_TRUE(stream->Synchronize().ok());
    absl::StatusOr<std::vector<float>> out = recv->ToHost();
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(AllClose(absl::StrCat("self send/recv n=", n), *out, input, 0.0f, 0.0f));
  }
}

// A split with one color is a communicator of its own (same rank and
// size) that works while the original does, and outlives it; kNoColor
// gives an empty one.
TEST_F(NcclGpuTest, Split_OneRank_IndependentCommunicatorOrNone) {
  absl::StatusOr<NcclComm> comm = OneRankComm();
  ASSERT_TRUE(comm.ok()) << comm.status();
  absl::StatusOr<NcclComm> none = comm->Split(NcclComm::kNoColor, 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->valid());
  absl::StatusOr<NcclComm> part = comm->Split(/*color=*/3, /*key=*/0);
  ASSERT_TRUE(part.ok()) << part.status();
  ASSERT_TRUE(part->valid());
  EXPECT_NE(part->get(), comm->get());
  EXPECT_EQ(part->rank(), 0);
  EXPECT_EQ(part->size(), 1);
  EXPECT_EQ(part->device(), 0);
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const int64_t n = 1000;
  const std::vector<float> input = RandomNormal(/*seed=*/400, n, 0.0f, 1.0f);
  absl::StatusOr<DeviceBuffer<float>> buffer = DeviceBuffer<float>::FromHost(input);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ASSERT_TRUE(comm->AllReduceSum(buffer->data(), buffer->data(), n, stream->get()).ok());
  ASSERT_TRUE(comm->Destroy().ok());
  ASSERT_TRUE(part->AllReduceSum(buffer->data(), buffer->data(), n, stream->get()).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  absl::StatusOr<std::vector<float>> out = buffer->ToHost();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(AllClose("all-reduce on the split", *out, input, 0.0f, 0.0f));
}

// A limited (non-blocking) one-rank communicator joins at once and works.
TEST_F(NcclGpuTest, Create_WithLimits_NonBlockingJoinAndOperationsWork) {
  NcclJoinLimits limits;
  limits.deadline = MonotonicClock()->Now() + absl::Seconds(60);
  absl::StatusOr<NcclUniqueId> id = NcclUniqueId::Create();
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<NcclComm> comm = NcclComm::Create(*id, 1, 0, 0, limits);
  ASSERT_TRUE(comm.ok()) << comm.status();
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const std::vector<float> input = RandomNormal(/*seed=*/500, 1000, 0.0f, 1.0f);
  absl::StatusOr<DeviceBuffer<float>> buffer = DeviceBuffer<float>::FromHost(input);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ASSERT_TRUE(comm->AllReduceSum(buffer->data(), buffer->data(), 1000, stream->get()).ok());
  absl::StatusOr<NcclComm> part = comm->Split(0, 0);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_TRUE(part->valid());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_TRUE(AllClose("non-blocking all-reduce", buffer->ToHost().value(), input, 0.0f, 0.0f));
  EXPECT_TRUE(comm->Destroy().ok());
  EXPECT_TRUE(part->Destroy().ok());
}

// A limited split gives a non-blocking part whose operations work, and
// AbortAll ends parent and part in one group, leaving both handles empty.
TEST_F(NcclGpuTest, Split_WithLimits_NonBlockingPartWorks_AbortAllEmptiesBoth) {
  NcclJoinLimits limits;
  limits.deadline = MonotonicClock()->Now() + absl::Seconds(60);
  limits.cancelled = [] { return false; };
  absl::StatusOr<NcclUniqueId> id = NcclUniqueId::Create();
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<NcclComm> comm = NcclComm::Create(*id, 1, 0, 0, limits);
  ASSERT_TRUE(comm.ok()) << comm.status();
  absl::StatusOr<NcclComm> part = comm->Split(/*color=*/0, /*key=*/0, limits);
  ASSERT_TRUE(part.ok()) << part.status();
  ASSERT_TRUE(part->valid());
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const std::vector<float> input = RandomNormal(/*seed=*/501, 777, 0.0f, 1.0f);
  absl::StatusOr<DeviceBuffer<float>> buffer = DeviceBuffer<float>::FromHost(input);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ASSERT_TRUE(part->AllReduceSum(buffer->data(), buffer->data(), 777, stream->get()).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_TRUE(
      AllClose("all-reduce on the limited split", buffer->ToHost().value(), input, 0.0f, 0.0f));
  int device_before = -1;
  ASSERT_EQ(cudaGetDevice(&device_before), cudaSuccess);
  NcclComm::AbortAll({&*comm, &*part});
  EXPECT_FALSE(comm->valid());
  EXPECT_FALSE(part->valid());
  int device_after = -1;
  ASSERT_EQ(cudaGetDevice(&device_after), cudaSuccess);
  EXPECT_EQ(device_after, device_before);
}

// --- One GPU, two ranks ---

// Runs fn(rank) on one thread per rank and joins them: init, the first
// collective (which connects the ranks) and destroy each wait for the other
// rank on the host, so two ranks cannot be driven from one thread.
template <typename Fn>
void OnEachRank(int nranks, Fn fn) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank) threads.emplace_back(fn, rank);
  for (std::thread& thread : threads) thread.join();
}

// One rank's side of the two-rank test. The buffers and stream are made on
// the test thread and outlive every phase, so no kernel outlives its memory.
struct RankState {
  absl::StatusOr<NcclComm> comm;
  CudaStream stream;
  DeviceBuffer<float> send, sum, received;
  absl::Status queued;
  std::vector<float> sum_host, received_host;
};

absl::Status PrepareRank(int64_t n, uint64_t seed, RankState& state) {
  ASSIGN_OR_RETURN(state.stream, CudaStream::Create());
  ASSIGN_OR_RETURN(state.send, DeviceBuffer<float>::FromHost(RandomNormal(seed, n, 0.0f, 1.0f)));
  ASSIGN_OR_RETURN(state.sum, DeviceBuffer<float>::Create(n));
  ASSIGN_OR_RETURN(state.received, DeviceBuffer<float>::Create(n));
  return absl::OkStatus();
}

// Queues the all-reduce and the exchange with the other rank; waits for none.
absl::Status QueueRankOps(RankState& state) {
  NcclComm& comm = *state.comm;
  const int64_t n = state.send.size();
  const cudaStream_t stream = state.stream.get();
  RETURN_IF_ERROR(comm.AllReduceSum(state.send.data(), state.sum.data(), n, stream));
  ASSIGN_OR_RETURN(NcclGroup group, NcclGroup::Start());
  RETURN_IF_ERROR(comm.Send(state.send.data(), n, 1 - comm.rank(), stream));
  RETURN_IF_ERROR(comm.Recv(state.received.data(), n, 1 - comm.rank(), stream));
  return group.End();
}

absl::Status FinishRankOps(RankState& state) {
  RETURN_IF_ERROR(state.stream.Synchronize());
  ASSIGN_OR_RETURN(state.sum_host, state.sum.ToHost());
  ASSIGN_OR_RETURN(state.received_host, state.received.ToHost());
  return absl::OkStatus();
}

// Recent NCCL rejects two ranks of one communicator on one GPU
// (ncclInvalidUsage, "Duplicate GPU detected"); older ones allowed it. Both
// outcomes pass if clean; the printed line says which one this NCCL chose.
// No phase can leave a thread waiting for a rank that gave up: both ranks
// make identical calls, so NCCL fails them alike, and the ops run only if
// both ranks joined, and are waited for only if both ranks queued them.
TEST_F(NcclGpuTest, Create_TwoRanksOneGpu_WorkOrFailCleanly) {
  constexpr int64_t kCount = (int64_t{1} << 20) + 3;
  absl::StatusOr<NcclUniqueId> id = NcclUniqueId::Create();
  ASSERT_TRUE(id.ok()) << id.status();
  RankState ranks[2];
  for (int r = 0; r < 2; ++r) {
    const absl::Status prepared = PrepareRank(kCount, 400 + r, ranks[r]);
    ASSERT_TRUE(prepared.ok()) << prepared;
  }

  OnEachRank(2, [&](int r) { ranks[r].comm = NcclComm::Create(*id, 2, r, 0); });
  const bool joined = ranks[0].comm.ok() && ranks[1].comm.ok();
  if (!joined) {
    for (RankState& rank : ranks) {
      if (rank.comm.ok()) {
        rank.comm->Abort();  // its peer is gone: destroying would wait for it
        continue;
      }
      EXPECT_EQ(rank.comm.status().code(), absl::StatusCode::kInternal) << rank.comm.status();
      EXPECT_TRUE(Contains(rank.comm.status(), "ncclCommInitRank")) << rank.comm.status();
    }
    std::cout << "[ NCCL ] two ranks on one GPU: rejected by NCCL (rank 0: "
              << ranks[0].comm.status() << "; rank 1: " << ranks[1].comm.status() << ")\n";
    RecordProperty("two_ranks_one_gpu", "rejected");
    return;
  }

  OnEachRank(2, [&](int r) { ranks[r].queued = QueueRankOps(ranks[r]); });
  const bool queued = ranks[0].queued.ok() && ranks[1].queued.ok();
  if (queued) OnEachRank(2, [&](int r) { ranks[r].queued = FinishRankOps(ranks[r]); });
  if (!queued) {
    OnEachRank(2, [&](int r) { ranks[r].comm->Abort(); });
  } else {
    OnEachRank(2, [&](int r) { ranks[r].queued.Update(ranks[r].comm->Destroy()); });
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(ranks[r].queued.ok()) << "rank " << r << ": " << ranks[r].queued;
  }

  const std::vector<float> a = RandomNormal(400, kCount, 0.0f, 1.0f);
  const std::vector<float> b = RandomNormal(401, kCount, 0.0f, 1.0f);
  std::vector<float> sum(a.size());
  for (size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];  // one fp32 add: order-free
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(AllClose(absl::StrCat("rank ", r, " sum"), ranks[r].sum_host, sum, 0.0f, 0.0f));
  }
  EXPECT_TRUE(AllClose("rank 0 received", ranks[0].received_host, b, 0.0f, 0.0f));
  EXPECT_TRUE(AllClose("rank 1 received", ranks[1].received_host, a, 0.0f, 0.0f));
  std::cout << "[ NCCL ] two ranks on one GPU: supported; all-reduce and exchange exact\n";
  RecordProperty("two_ranks_one_gpu", "supported");
}

}  // namespace
}  // namespace pipetrain
