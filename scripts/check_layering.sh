#!/usr/bin/env bash
# Layering: the code a worker runs must not depend on the coordinator. What
# both sides need lives below both (spec/, common/, proto/).
#   bash scripts/check_layering.sh
# Checks every file under worker/:
#   - sources (.h, .cc, .cu, .cuh) must not #include "coordinator/...";
#   - BUILD rules must not name a //coordinator label (visibility aside).
# Tests, benchmarks and test helpers may use the coordinator's planner to
# build the plans they run: sources named *_test.cc, *_benchmark.cc,
# *_testing.{h,cc}, and cc_test, testonly or *_benchmark rules are exempt.
# Prints one line per offender, then "layering: N violations"; exits 1 when
# there is one.
set -uo pipefail
cd "$(dirname "$0")/.."

exempt_source() {
  case "$1" in
    *_test.cc | *_benchmark.cc | *_testing.h | *_testing.cc) return 0 ;;
  esac
  return 1
}

violations=()

while IFS= read -r hit; do
  file="${hit%%:*}"
  rest="${hit#*:}"
  if ! exempt_source "$file"; then violations+=("$file:${rest%%:*}: ${rest#*:}"); fi
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]coordinator/' worker \
  --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh')

# One rule is the text from a line opening "kind(" in column 0 to the next
# such line. A //coordinator label counts unless it sits in the visibility
# attribute or the rule is a test, testonly or a benchmark.
build_files=$(find worker -name BUILD -o -name BUILD.bazel | sort)
if [ -n "$build_files" ]; then
  while IFS= read -r hit; do
    violations+=("$hit")
  done < <(awk '
    function flush() {
      if (n > 0 && kind != "cc_test" && !testonly && name !~ /_benchmark$/)
        for (i = 0; i < n; i++) print hits[i]
      n = 0; kind = ""; name = ""; testonly = 0; attr = ""
    }
    FNR == 1 { flush() }
    /^[A-Za-z_][A-Za-z0-9_]*\(/ { flush(); kind = $0; sub(/\(.*/, "", kind) }
    /^[[:space:]]+[a-z_]+[[:space:]]*=/ {
      attr = $0; sub(/^[[:space:]]+/, "", attr); sub(/[[:space:]]*=.*/, "", attr)
    }
    attr == "name" && name == "" && match($0, /"[^"]*"/) {
      name = substr($0, RSTART + 1, RLENGTH - 2)
    }
    /^[[:space:]]+testonly[[:space:]]*=[[:space:]]*(True|1)/ { testonly = 1 }
    /"@?\/\/coordinator[\/:"]/ && attr != "visibility" {
      line = $0; sub(/^[[:space:]]+/, "", line)
      hits[n++] = FILENAME ":" FNR ": " line
    }
    END { flush() }
  ' $build_files)
fi

for v in "${violations[@]}"; do echo "layering: $v"; done
echo "layering: ${#violations[@]} violations (worker/ must not depend on coordinator/)"
if [ "${#violations[@]}" -gt 0 ]; then exit 1; fi
exit 0
