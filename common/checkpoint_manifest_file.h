// Whether a job checkpoint's step directory is complete: it holds
// manifest.json, the file the coordinator writes once every unit of the
// step is in (coordinator/jobs/checkpoint_catalog.h WriteCheckpointManifest;
// docs/architecture.md "Elasticity and durable state"). The coordinator's
// catalog (which steps a job may resume from, which a sweep may remove) and
// a worker's LocateCheckpoint (worker/checkpoint/checkpoint_manifest.h, the
// newest step) must tell a complete checkpoint alike, and worker/ may not
// include coordinator/, so the one test lives here, below both.
//
// Thread-safe: no state.
#ifndef PIPETRAIN_COMMON_CHECKPOINT_MANIFEST_FILE_H_
#define PIPETRAIN_COMMON_CHECKPOINT_MANIFEST_FILE_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace pipetrain {

// The manifest's file name in a step directory.
inline constexpr char kCheckpointManifestName[] = "manifest.json";

// Whether the entry `name` of the directory open at `dir` is a directory
// that holds an entry kCheckpointManifestName, of any type (a file, a
// directory, a link, not followed): what it holds is for the reader to
// check (ReadCheckpointManifest reports such a manifest as damaged), so a
// damaged manifest still marks the step as written. nullopt when `name` is
// no directory (a symbolic link among them: not followed, it could lead out
// of the directory the caller resolved and checked) or is gone, also when
// it is removed or swapped for a link or a file meanwhile. Errors, the
// errno's code (EACCES PERMISSION_DENIED, EMFILE RESOURCE_EXHAUSTED, EIO
// UNKNOWN, ESTALE on NFS) with a message naming `shown` (the entry as the
// caller's messages name it): "cannot stat <shown>", "cannot open <shown>"
// or "cannot look for manifest.json in <shown>". Callers decide whether
// such a step is skipped: as "no manifest" a complete checkpoint could be
// removed or passed over.
absl::StatusOr<std::optional<bool>> HoldsCheckpointManifest(int dir, const std::string& name,
                                                            const std::string& shown);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_CHECKPOINT_MANIFEST_FILE_H_
