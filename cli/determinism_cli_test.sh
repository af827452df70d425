#!/usr/bin/env bash
# Two separate `pipetrain train-local` processes with the same seed and a
# fixed OpenBLAS thread count must log bitwise-identical losses (the JSON
# numbers print every float to its shortest exact form); a different seed
# must not.
set -u
bin="$TEST_SRCDIR/$TEST_WORKSPACE/cli/pipetrain"
pass=0 fail=0
check() {  # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $name"; fi
}
run() {  # run LOGFILE SEED
  "$bin" train-local --steps 8 --layers 2 --d-model 64 --heads 4 --seq-len 32 --batch 4 \
    --micro-batches 2 --threads 2 --synthetic-bytes 100000 --seed "$2" --log "$1" \
    >/dev/null 2>&1
}
losses() { sed -E 's/.*"loss":([^,]+),.*/\1/' "$1"; }

run "$TEST_TMPDIR/a.jsonl" 5; check "first run exits 0" test $? -eq 0
run "$TEST_TMPDIR/b.jsonl" 5; check "second run exits 0" test $? -eq 0
run "$TEST_TMPDIR/c.jsonl" 6; check "other-seed run exits 0" test $? -eq 0
check "8 steps logged" test "$(wc -l < "$TEST_TMPDIR/a.jsonl")" -eq 8
check "same seed, identical losses" test "$(losses "$TEST_TMPDIR/a.jsonl")" = "$(losses "$TEST_TMPDIR/b.jsonl")"
check "other seed, different losses" test "$(losses "$TEST_TMPDIR/a.jsonl")" != "$(losses "$TEST_TMPDIR/c.jsonl")"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
