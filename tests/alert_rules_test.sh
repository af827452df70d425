#!/usr/bin/env bash
# deploy/prometheus: promtool accepts the scrape config and the alert rules,
# the rules' unit tests (alerts_test.yml) pass, and a copy of the rules with
# a syntax error is rejected, so the check cannot pass vacuously. Every alert
# has a runbook_url whose anchor is a heading of docs/operations.md.
set -u
D="$TEST_SRCDIR/$TEST_WORKSPACE/deploy/prometheus"
OPERATIONS="$TEST_SRCDIR/$TEST_WORKSPACE/docs/operations.md"
T="$TEST_TMPDIR"
source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/check_lib.sh"  # check, fails, has, report
# Succeeds when `promtool check rules FILE` fails with a message matching PATTERN.
rejects() { ! promtool check rules "$1" > "$T/rejected.txt" 2>&1 && grep -q "$2" "$T/rejected.txt"; }

if ! command -v promtool > /dev/null; then
  echo "promtool is missing: run scripts/setup.sh (Debian package prometheus)"
  exit 1
fi

check "promtool check rules alerts.yml" promtool check rules "$D/alerts.yml"
check "promtool check config prometheus.yml" promtool check config "$D/prometheus.yml"
check "promtool test rules alerts_test.yml" promtool test rules "$D/alerts_test.yml"

# A colon dropped after "expr" turns the first rule into invalid YAML.
sed '0,/expr:/s/expr:/expr/' "$D/alerts.yml" > "$T/broken_syntax.yml"
check "broken copy differs" fails cmp -s "$D/alerts.yml" "$T/broken_syntax.yml"
check "promtool rejects a YAML syntax error" rejects "$T/broken_syntax.yml" "could not find expected ':'"
# Valid YAML, invalid PromQL: an unclosed parenthesis in an expression.
sed '0,/min_over_time(/s/min_over_time(/min_over_time((/' "$D/alerts.yml" > "$T/broken_promql.yml"
check "promtool rejects a PromQL error" rejects "$T/broken_promql.yml" "unclosed left parenthesis"

# Runbooks: one runbook_url per alert, each "docs/operations.md#anchor" with
# a heading whose GitHub anchor (lower case, spaces to dashes, punctuation
# dropped) is that anchor.
alerts=$(grep -c -- "- alert:" "$D/alerts.yml")
urls=$(grep -c "runbook_url: \"docs/operations.md#" "$D/alerts.yml")
check "every alert ($alerts) has a runbook_url ($urls)" test "$alerts" -eq "$urls" -a "$alerts" -ge 10
grep "^#" "$OPERATIONS" | sed -e 's/^#* *//' | tr 'A-Z' 'a-z' | sed -e 's/[^a-z0-9 _-]//g' -e 's/ /-/g' \
  > "$T/anchors.txt"
for anchor in $(sed -n 's/.*runbook_url: "docs\/operations.md#\([^"]*\)".*/\1/p' "$D/alerts.yml"); do
  check "docs/operations.md has the runbook #$anchor" grep -qx -- "$anchor" "$T/anchors.txt"
done
check "a made-up anchor is not found" fails grep -qx -- "pipetrainmadeupalert" "$T/anchors.txt"

report
