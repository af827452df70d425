// The planner's JSON inputs (`pipetrain plan --profile/--cluster`, and
// --solver acctfm's profile): ParseProfileJson, ParseClusterJson and
// ParseAccTfmProfileJson. A profile and cluster that both parse are turned
// into the Bi-Partition problem, as the command does before solving.
//
// Input: byte 0 picks the reader (mod 4): 0 profile, 1 cluster, 2 AccTFM
// profile, 3 profile and cluster; for 0-2 the rest is the JSON, for 3 a
// uint16-length-prefixed profile followed by the cluster.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cli/acctfm_profile.h"
#include "coordinator/planner/profile.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  FuzzInput in(data, size);
  switch (in.Byte() % 4) {
    case 0:
      (void)ParseProfileJson(std::string(in.Rest()));
      break;
    case 1:
      (void)ParseClusterJson(std::string(in.Rest()));
      break;
    case 2:
      (void)ParseAccTfmProfileJson(std::string(in.Rest()));
      break;
    default: {
      absl::StatusOr<ModelProfile> profile = ParseProfileJson(std::string(in.LengthPrefixed()));
      absl::StatusOr<ClusterSpec> cluster = ParseClusterJson(std::string(in.Rest()));
      if (profile.ok() && cluster.ok()) (void)MakeBiPartitionProblem(*profile, *cluster);
      break;
    }
  }
  return 0;
}
