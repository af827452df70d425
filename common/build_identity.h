// A build of pipetrain as the wire carries it (coordinator.proto
// BuildIdentity), and when two builds count as the same: a worker reports
// its build when it registers and the coordinator refuses one that is not
// its own (coordinator/registry/worker_registry.h, Options::required_build).
// One cluster runs one build because replicas must round alike to end each
// step with bitwise equal weights, a job must equal train-local of the same
// build, and the wire protocol's meaning is the build's.
// Thread-safe (pure functions).
#ifndef PIPETRAIN_COMMON_BUILD_IDENTITY_H_
#define PIPETRAIN_COMMON_BUILD_IDENTITY_H_

#include <cstddef>
#include <string>

#include "common/build_info.h"
#include "proto/pipetrain/v1/coordinator.pb.h"

namespace pipetrain {

// The commit BuildInfo names when the binary was not stamped from a checkout.
inline constexpr char kUnknownCommit[] = "unknown";
// How many hex digits of the commit a stamp keeps.
inline constexpr size_t kStampedCommitDigits = 12;

// Whether `commit` names one (not "" nor kUnknownCommit).
bool CommitKnown(const std::string& commit);

// `info`'s version and commit.
v1::BuildIdentity ToBuildIdentity(const BuildInfo& info);
// This process's build (GetBuildInfo()).
v1::BuildIdentity ThisBuild();

// Same version, and the same commit unless either commit is unknown ("" or
// kUnknownCommit: an unstamped build, e.g. an image built without
// PIPETRAIN_COMMIT, says nothing about its commit). An absent build (a
// worker older than BuildIdentity) has an empty version, so it matches no
// release. Commits compare on their first kStampedCommitDigits digits when
// both have that many (tools/workspace_status.sh stamps 12; git prints more
// where 12 would be ambiguous, an image's .build-commit is cut to 12), and
// exactly otherwise: "3635b2d" and "3635b2d5aae6" differ.
bool SameBuild(const v1::BuildIdentity& a, const v1::BuildIdentity& b);

// "0.1.0 (commit 3635b2d1a2b3)"; "none" for an absent build. The fields are
// shown as they are: callers bound them first (at most 64 bytes each at
// registration).
std::string DescribeBuild(const v1::BuildIdentity& build);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_BUILD_IDENTITY_H_
