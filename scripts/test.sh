#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test.
#   bash scripts/test.sh                 # all tests (what CI runs)
#   bash scripts/test.sh --config=asan   # the same under ASan + UBSan
#   bash scripts/test.sh --config=tsan   # the same under ThreadSanitizer
# Ends with a line "tests: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
log=$(mktemp)
bazel test "$@" //... 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' "$log")
rm -f "$log"
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi  # e.g. a build error
echo "tests: $passed passed, $failed failed"
exit "$status"
