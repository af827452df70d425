#!/bin/bash
# The benchmarks' flag handling through the real binaries: --help prints the
# usage on stdout and exits 0 without benchmarking, and each flag value that
# once reached a CHECK, a .value() abort or an empty vector's first element
# exits 2 with a message naming the flag. No case runs a benchmark. Prints
# "N passed, M failed" and fails if any case failed.
#
# Arguments (runfiles paths, from the BUILD rule): bubble_benchmark,
# simulator_accuracy_benchmark, collective_benchmark, data_plane_benchmark,
# train_step_benchmark.
set -u

if [[ $# -ne 5 ]]; then
  echo "usage: $0 BUBBLE SIMULATOR_ACCURACY COLLECTIVE DATA_PLANE TRAIN_STEP" >&2
  exit 1
fi
BUBBLE="$1"
SIMULATOR="$2"
COLLECTIVE="$3"
DATA_PLANE="$4"
TRAIN_STEP="$5"

TMP="${TEST_TMPDIR:-$(mktemp -d)}"
OUT="$TMP/stdout.txt"
ERR="$TMP/stderr.txt"
# A run that parses its flags and stops takes milliseconds; one still going
# after this long is benchmarking, and is ended (with the members it forked:
# timeout signals its whole process group) so that it fails its own case
# rather than the whole test at its timeout.
GUARD_SECONDS=20
passed=0
failed=0

fail() {
  echo "FAIL [$1]: $2" >&2
  echo "  stderr was:" >&2
  sed 's/^/    /' "$ERR" >&2
  failed=$((failed + 1))
}

# expect NAME CODE WHERE FRAGMENT -- BINARY ARGS...
# Runs BINARY ARGS and expects exit status CODE, no crash text on stderr and
# FRAGMENT (a fixed string) in WHERE: "stdout" or "stderr".
expect() {
  local name="$1" code="$2" where="$3" fragment="$4"
  shift 5  # NAME CODE WHERE FRAGMENT --
  timeout -k 5 "$GUARD_SECONDS" "$@" >"$OUT" 2>"$ERR" </dev/null
  local rc=$?
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    fail "$name" "still running after ${GUARD_SECONDS} s: it benchmarked instead of stopping"
    return
  fi
  if [[ $rc -ge 128 ]]; then
    fail "$name" "killed by a signal (exit $rc)"
    return
  fi
  if [[ $rc -ne $code ]]; then
    fail "$name" "exit $rc, want $code"
    return
  fi
  if grep -qE 'Check failed|Sanitizer|runtime error:|terminate called' "$ERR"; then
    fail "$name" "crash or sanitizer text on stderr"
    return
  fi
  local file="$ERR"
  [[ $where == stdout ]] && file="$OUT"
  if ! grep -qF -- "$fragment" "$file"; then
    fail "$name" "$where lacks '$fragment'"
    return
  fi
  passed=$((passed + 1))
}

# --- --help: the usage on stdout, exit 0, nothing benchmarked -----------------
expect bubble_help 0 stdout "usage: bubble_benchmark" -- "$BUBBLE" --help
expect simulator_help 0 stdout "usage: simulator_accuracy_benchmark" -- "$SIMULATOR" --help
expect collective_help 0 stdout "usage: collective_benchmark" -- "$COLLECTIVE" --help
expect data_plane_help 0 stdout "usage: data_plane_benchmark" -- "$DATA_PLANE" -h
expect train_step_help 0 stdout "usage: train_step_benchmark" -- "$TRAIN_STEP" --help
# Help wins over a bad value given before it.
expect bubble_help_after_bad_value 0 stdout "usage: bubble_benchmark" -- \
  "$BUBBLE" --stages 1 --help

# --- simulator_accuracy_benchmark: bad values exit 2 before any work ----------
expect simulator_seq_len_zero 2 stderr "--seq-len must be >= 1, got 0" -- \
  "$SIMULATOR" --seq-len 0
expect simulator_d_model_not_heads 2 stderr \
  "--d-model must be a multiple of 4 (the heads, fixed at 4), got 6" -- "$SIMULATOR" --d-model 6
expect simulator_objective_unknown 2 stderr "--objective must be paper or full, got 'fast'" -- \
  "$SIMULATOR" --objective fast
expect simulator_workers_zero 2 stderr "--workers must be >= 1, got 0" -- "$SIMULATOR" --workers 0
expect simulator_workers_over_units 2 stderr "--workers 5 exceeds the model's 4 units" -- \
  "$SIMULATOR" --layers 1 --workers 5
expect simulator_layers_zero 2 stderr "--layers must be >= 1, got 0" -- "$SIMULATOR" --layers 0
expect simulator_micro_batches_zero 2 stderr "--micro-batches must be >= 1, got 0" -- \
  "$SIMULATOR" --micro-batches 0
expect simulator_iterations_zero 2 stderr "--iterations must be >= 1, got 0" -- \
  "$SIMULATOR" --iterations 0
# Refused by the checks the benchmark calls rather than its own.
expect simulator_seq_len_tensor_too_large 2 stderr "above 2^31 - 1" -- "$SIMULATOR" --seq-len 20000
expect simulator_layers_over_profiler_bound 2 stderr "n_layer 300 exceeds 256" -- \
  "$SIMULATOR" --layers 300

# --- train_step_benchmark: bad values exit 2 before any work ------------------
expect train_step_threads_zero 2 stderr "--threads must be >= 1" -- "$TRAIN_STEP" --threads 0
expect train_step_sgemm_n_negative 2 stderr "--sgemm-n must be in [0, 46340], got -1" -- \
  "$TRAIN_STEP" --sgemm-n -1

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
