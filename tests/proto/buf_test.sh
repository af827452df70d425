#!/usr/bin/env bash
# The protos under proto/pipetrain (and the stored records' state.proto)
# checked with buf (buf.yaml; docs/api.md,
# "Proto compatibility"):
#   1. buf lint: no findings (buf.yaml lists the exceptions and why).
#   2. buf breaking (FILE rules): the working tree's protos against those of
#      the baseline commit, the parent of HEAD (in CI, a clone of main: the
#      previous commit of main). An intentional break is declared in the
#      commit that makes it, by a line of its message starting with
#      "BREAKING-PROTO:"; while that commit is HEAD the baseline is HEAD
#      itself, so uncommitted changes on top are still checked. Without a
#      baseline (a shallow clone of depth 1, a first commit, no git) this
#      part is skipped with a message saying so.
#   3. The checks themselves, each run: a copy of the protos with one field
#      renumbered (of job.proto, and of the coordinator's stored records,
#      coordinator/store/state.proto, which breaking covers but lint does
#      not) must fail buf breaking against the working tree, and a copy with
#      an unprefixed enum value must fail buf lint.
# Runs under Bazel (//tests/proto:buf_test) or directly:
#   tests/proto/buf_test.sh
# Needs node on PATH and tools/openapi-check/node_modules (scripts/setup.sh
# installs both; @bufbuild/buf is pinned in tools/openapi-check/package.json).
set -u

if [ -n "${TEST_SRCDIR:-}" ]; then
  R="$TEST_SRCDIR/$TEST_WORKSPACE"
  T="$TEST_TMPDIR"
else
  R="$(cd "$(dirname "$0")/../.." && pwd)"
  T="$(mktemp -d)"
  trap 'rm -rf "$T"' EXIT
fi
# buf.yaml, the git history and node_modules are not Bazel inputs: find the
# source tree the runfiles link to.
SRC="$(cd "$(dirname "$(readlink -f "$R/proto/pipetrain/v1/job.proto")")/../../.." && pwd)"
BUF="$SRC/tools/openapi-check/node_modules/.bin/buf"
export BUF_CACHE_DIR="$T/buf-cache"

if ! command -v node > /dev/null || [ ! -x "$BUF" ]; then
  echo "FAIL: missing node (Debian package nodejs) or $BUF"
  echo "Run scripts/setup.sh (installs node and runs npm ci in tools/openapi-check)."
  exit 1
fi

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The coordinator's stored records (SQLite, etcd): not linted (buf.yaml),
# but a new build must read what an older one stored.
STATE_PROTO=coordinator/store/state.proto

# A directory holding a copy of proto/pipetrain and $STATE_PROTO as they are
# in the working tree (or, with a commit, as they were there) and the
# repository's buf.yaml, so that buf finds the same module root and rules as
# in the source tree.
copy_protos() {  # DIR [COMMIT]
  mkdir -p "$1"
  cp "$SRC/buf.yaml" "$1/buf.yaml"
  if [ $# -eq 1 ]; then
    mkdir -p "$1/proto" "$1/$(dirname "$STATE_PROTO")" && cp -r "$SRC/proto/pipetrain" "$1/proto/" &&
      cp "$SRC/$STATE_PROTO" "$1/$STATE_PROTO"
  else
    # A baseline from before the stored records were checked has none.
    local paths=(proto/pipetrain)
    if git -C "$SRC" cat-file -e "$2:$STATE_PROTO" 2>/dev/null; then paths+=("$STATE_PROTO"); fi
    # Through a file: a failed archive must not leave an empty baseline,
    # against which nothing would be breaking.
    if ! git -C "$SRC" archive -o "$1.tar" "$2" "${paths[@]}" || ! tar -x -C "$1" -f "$1.tar" ||
      [ -z "$(find "$1/proto" -name '*.proto' 2>/dev/null)" ]; then
      fail "no proto/pipetrain/*.proto could be taken from $2"
    fi
    rm -f "$1.tar"
  fi
}

# Every check runs on copies holding only proto/pipetrain and buf.yaml: in
# the source tree, buf would also walk Bazel's convenience symlinks
# (bazel-<directory name>, a different name in every clone) into external
# protos that do not build on their own.
copy_protos "$T/current"

# 1. Lint.
out=$(cd "$T/current" && "$BUF" lint 2>&1)
code=$?
if [ $code -ne 0 ] || [ -n "$out" ]; then
  fail "buf lint (exit $code):"
  echo "$out"
else
  echo "ok: buf lint: no findings"
fi

# 2. Breaking changes against the baseline.
baseline() {
  git -C "$SRC" rev-parse --verify --quiet 'HEAD^{commit}' > /dev/null || return 1
  if git -C "$SRC" log -1 --format=%B HEAD | grep -q '^BREAKING-PROTO:'; then
    echo HEAD
  else
    git -C "$SRC" rev-parse --verify --quiet 'HEAD~1^{commit}' > /dev/null || return 1
    echo HEAD~1
  fi
}
if ! git -C "$SRC" rev-parse --git-dir > /dev/null 2>&1; then
  echo "SKIPPED: buf breaking: $SRC is not a git checkout, so there is no previous commit to compare with"
elif ! base=$(baseline); then
  shallow=$(git -C "$SRC" rev-parse --is-shallow-repository 2>/dev/null)
  echo "SKIPPED: buf breaking: HEAD has no parent in this clone (shallow: $shallow);" \
    "clone with --depth 2 or more (or unshallow with git fetch --deepen=1) to compare with the previous commit"
else
  described=$(git -C "$SRC" log -1 --format='%h %s' "$base")
  if [ "$base" = HEAD ]; then
    echo "HEAD declares an intentional break:"
    git -C "$SRC" log -1 --format=%B HEAD | grep '^BREAKING-PROTO:' | sed 's/^/  /'
  fi
  if ! git -C "$SRC" cat-file -e "$base:proto/pipetrain" 2>/dev/null; then
    echo "SKIPPED: buf breaking: $base ($described) has no proto/pipetrain"
  else
    copy_protos "$T/baseline" "$base"
    out=$(cd "$T/current" && "$BUF" breaking . --against "$T/baseline" 2>&1)
    code=$?
    if [ $code -ne 0 ]; then
      fail "buf breaking against $base ($described), exit $code:"
      echo "$out"
      echo "An intentional break is declared by a line \"BREAKING-PROTO: <what breaks," \
        "what clients must do>\" in the message of the commit that makes it (docs/api.md," \
        "\"Proto compatibility\")."
    else
      echo "ok: buf breaking: no breaking change against $base ($described)"
    fi
  fi
fi

# 3a. A renumbered field (the first "= 1;" of job.proto) is a breaking change.
copy_protos "$T/renumbered"
sed -i '0,/ = 1;/s// = 1000;/' "$T/renumbered/proto/pipetrain/v1/job.proto"
if ! grep -q ' = 1000;' "$T/renumbered/proto/pipetrain/v1/job.proto"; then
  fail "could not renumber a field of job.proto in the copy (no \" = 1;\" left?)"
else
  out=$(cd "$T" && "$BUF" breaking renumbered --against current 2>&1)
  code=$?
  if [ $code -ne 100 ] || ! grep -q 'job.proto:.*Previously present field "1"' <<< "$out"; then
    fail "buf breaking accepted a copy with a renumbered field (exit $code): $out"
  else
    echo "ok: buf breaking rejects a renumbered field: $(head -1 <<< "$out")"
  fi
fi

# 3b. So is one of the stored records': a new build would read an older
# one's records into the wrong field.
copy_protos "$T/renumbered-state"
sed -i '0,/ = 1;/s// = 1000;/' "$T/renumbered-state/$STATE_PROTO"
if ! grep -q ' = 1000;' "$T/renumbered-state/$STATE_PROTO"; then
  fail "could not renumber a field of $STATE_PROTO in the copy (no \" = 1;\" left?)"
else
  out=$(cd "$T" && "$BUF" breaking renumbered-state --against current 2>&1)
  code=$?
  if [ $code -ne 100 ] || ! grep -q 'state.proto:.*Previously present field "1"' <<< "$out"; then
    fail "buf breaking accepted a copy with a renumbered field of $STATE_PROTO (exit $code): $out"
  else
    echo "ok: buf breaking rejects a renumbered stored-record field: $(head -1 <<< "$out")"
  fi
fi

# 3c. An enum value without its enum's prefix is a lint finding.
copy_protos "$T/unprefixed"
printf 'enum ScratchColor {\n  SCRATCH_COLOR_UNSPECIFIED = 0;\n  RED = 1;\n}\n' \
  >> "$T/unprefixed/proto/pipetrain/v1/job.proto"
out=$(cd "$T/unprefixed" && "$BUF" lint 2>&1)
code=$?
if [ $code -ne 100 ] || ! grep -q 'Enum value name "RED" should be prefixed with "SCRATCH_COLOR_"' <<< "$out"; then
  fail "buf lint accepted a copy with an unprefixed enum value (exit $code): $out"
else
  echo "ok: buf lint rejects an unprefixed enum value: $(head -1 <<< "$out")"
fi

if [ $failures -ne 0 ]; then
  echo "buf: $failures failed"
  exit 1
fi
echo "buf: all checks passed"
