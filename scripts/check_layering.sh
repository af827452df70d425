#!/usr/bin/env bash
# Layering: the code a worker runs must not depend on the coordinator. What
# both sides need lives below both (spec/, common/, proto/).
#   bash scripts/check_layering.sh
# Checks every file under worker/:
#   - sources (.h, .cc, .cu, .cuh, .inc, .ipp) must not #include
#     "coordinator/..." (nor "../coordinator/...");
#   - BUILD rules must not depend on a //coordinator target, directly or
#     through other packages (bazel query: visibility is no dependency).
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
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]([^">]*/)?coordinator/' worker \
  --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' --include='*.inc' \
  --include='*.ipp')

# The BUILD side from Bazel's own reading of the rules (a text scan missed
# rules made by a list comprehension or deps held in a variable): the
# worker/ rules that are not tests, testonly or benchmarks, and which of
# them name a //coordinator target among their deps (select() branches
# included); then whether any reaches one through other packages.
if ! command -v bazel >/dev/null; then
  echo "layering: bazel is not on PATH; it reads the BUILD files for this check" >&2
  exit 2
fi
rules='kind(rule, //worker/...) - tests(//worker/...) - attr(testonly, 1, //worker/...) - attr(name, "_benchmark$", //worker/...)'
query() { bazel query --noshow_progress --keep_going "$1" 2>"$query_err"; }
query_err=$(mktemp) || exit 2
trap 'rm -f "$query_err"' EXIT
if ! direct=$(query "let w = $rules in rdeps(\$w + //coordinator/..., //coordinator/..., 1) intersect \$w") ||
  ! reached=$(query "let w = $rules in deps(\$w) intersect //coordinator/..."); then
  cat "$query_err" >&2
  echo "layering: bazel query failed" >&2
  exit 2
fi
for rule in $direct; do
  violations+=("$rule depends on $(query "labels(deps, $rule) intersect //coordinator/..." | paste -sd ' ')")
done
if [ -z "$direct" ] && [ -n "$reached" ]; then
  violations+=("worker/ reaches $(paste -sd ' ' <<<"$reached") through other packages")
fi

for v in "${violations[@]}"; do echo "layering: $v"; done
echo "layering: ${#violations[@]} violations (worker/ must not depend on coordinator/)"
if [ "${#violations[@]}" -gt 0 ]; then exit 1; fi
exit 0
