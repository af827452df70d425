#!/usr/bin/env bash
# Bazel's --workspace_status_command (.bazelrc): the values //common:build_info
# stamps into every binary (`--version`, the pipetrain_build_info metric).
#   STABLE_GIT_COMMIT  the checked-out commit, abbreviated; outside a git
#                      checkout (an image's build stage, a source tarball)
#                      the hex id in the file .build-commit (the Dockerfiles
#                      write it from --build-arg PIPETRAIN_COMMIT), else
#                      "unknown". A stable key: a new commit re-stamps (and
#                      relinks) the binaries.
#   BUILD_DATE         the UTC date of the build. A volatile key: a changed
#                      date alone rebuilds nothing, so it is the date of the
#                      last build that re-stamped.
# Bazel runs this in the workspace root before every build; keep it quick.
commit=$(git rev-parse --short=12 HEAD 2>/dev/null) || commit=""
if [ -z "$commit" ] && [ -f .build-commit ]; then
  # Only a commit id: the file is stamped into every binary.
  commit=$(head -c 64 .build-commit | tr -d '[:space:]')
  case "$commit" in *[!0-9a-f]*) commit="" ;; esac
  commit=${commit:0:12}
fi
echo "STABLE_GIT_COMMIT ${commit:-unknown}"
echo "BUILD_DATE $(date -u +%Y-%m-%d)"
