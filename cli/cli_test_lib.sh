# Shared by the CLI's shell tests (plan_cli_test.sh, train_local_cli_test.sh):
# source it, then call expect_exit for each case and finish at the end.
#
#   BIN        the pipetrain binary from the test's runfiles
#   TMP        a scratch directory; OUT and ERR hold the last run's output
#   CLI_PREFIX words put before every expect_exit's ARGS (e.g. (plan))
#   CLI_OK_OUT where a successful run's FRAGMENTs must appear: "$ERR"
#              (default) or "$OUT"
#   passed, failed   counters; fail NAME WHY counts a failure and shows stderr

BIN="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-pipetrain}/cli/pipetrain"
if [[ ! -x "$BIN" ]]; then
  BIN="${RUNFILES_DIR:-$0.runfiles}/pipetrain/cli/pipetrain"
fi
if [[ ! -x "$BIN" ]]; then
  echo "cannot find the pipetrain binary in the runfiles" >&2
  exit 1
fi
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
OUT="$TMP/stdout.txt"
ERR="$TMP/stderr.txt"
CLI_PREFIX=()
CLI_OK_OUT="$ERR"
passed=0
failed=0

fail() {
  echo "FAIL [$1]: $2" >&2
  echo "  stderr was:" >&2
  sed 's/^/    /' "$ERR" >&2
  failed=$((failed + 1))
}

# True (0) when stderr shows a crash, a CHECK failure or a sanitizer report.
crashed() {
  grep -qE 'Check failed|Sanitizer|runtime error:|terminate called' "$ERR"
}

# expect_exit NAME CODE FRAGMENT... -- ARGS...
# Runs `pipetrain CLI_PREFIX... ARGS` and expects exit status CODE, no signal,
# no crash text, and each FRAGMENT (a fixed string) on stderr, or for CODE 0
# in CLI_OK_OUT.
expect_exit() {
  local name="$1" code="$2"
  shift 2
  local fragments=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do
    fragments+=("$1")
    shift
  done
  shift  # the "--"
  "$BIN" "${CLI_PREFIX[@]}" "$@" >"$OUT" 2>"$ERR" </dev/null
  local rc=$?
  if [[ $rc -ge 128 ]]; then
    fail "$name" "killed by a signal (exit $rc)"
    return
  fi
  if [[ $rc -ne $code ]]; then
    fail "$name" "exit $rc, want $code"
    return
  fi
  if crashed; then
    fail "$name" "crash or sanitizer text on stderr"
    return
  fi
  local where="$ERR"
  [[ $code -eq 0 ]] && where="$CLI_OK_OUT"
  local fragment
  for fragment in "${fragments[@]}"; do
    if ! grep -qF -- "$fragment" "$where"; then
      fail "$name" "$( [[ $where == "$OUT" ]] && echo stdout || echo stderr ) lacks '$fragment'"
      return
    fi
  done
  passed=$((passed + 1))
}

# Prints "N passed, M failed"; the test's status: failure if any case failed.
finish() {
  echo "$passed passed, $failed failed"
  [[ $failed -eq 0 ]]
}
