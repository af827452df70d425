# The checks of the shell tests under tests/ (sourced; needs $T, a scratch
# directory of the test's own):
#   check NAME COMMAND...  runs COMMAND, its output kept in $T/out.txt and
#                          shown (after "FAIL: NAME") only when it fails
#   fails COMMAND...       succeeds when COMMAND fails
#   has FILE TEXT          succeeds when FILE contains the fixed string TEXT
#   report                 prints "N passed, M failed"; fails if any failed
# shellcheck shell=bash
pass=0 fail=0
check() {
  local name=$1; shift
  if "$@" > "$T/out.txt" 2>&1; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1)); echo "FAIL: $name"; cat "$T/out.txt"
  fi
}
fails() { ! "$@"; }
has() { grep -qF -- "$2" "$1"; }
report() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}
