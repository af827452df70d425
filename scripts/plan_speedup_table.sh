#!/bin/bash
# Simulated iteration time of each solver for 2-8 workers (docs/benchmarks.md,
# "Bi-Partition speedup"): prints a markdown table per profile.
#   bash scripts/plan_speedup_table.sh [PIPETRAIN_BINARY]
# Profiles: an analytic GPT-2 124M (vocabulary 50257, seq_len 1024, one
# sequence per micro-batch, 100 GFLOP/s per worker) and the measured CPU
# profiles in docs/profiles/; each on equal workers and on mixed workers
# (speeds 1, 2, 1, 2, ...). Links 10 Gbit/s, 50 us; 8 micro-batches, 1F1B.
set -euo pipefail
if [[ $# -ge 1 ]]; then
  BIN="$1"
  # As the shell would run it: a bare name from PATH, a relative path from
  # here (before the cd below).
  if [[ "$BIN" != */* ]]; then
    BIN="$(command -v -- "$BIN" || true)"
  elif [[ "$BIN" != /* ]]; then
    BIN="$PWD/$BIN"
  fi
  # Else every row below fails, with a Python traceback, after half a table.
  if [[ ! -f "$BIN" || ! -x "$BIN" ]]; then
    echo "plan_speedup_table: $1 is not an executable pipetrain binary" >&2
    echo "usage: scripts/plan_speedup_table.sh [PIPETRAIN_BINARY]" >&2
    exit 2
  fi
fi
cd "$(dirname "$0")/.."
if [[ $# -eq 0 ]]; then
  if ! bazel build -c opt //cli:pipetrain >/dev/null 2>&1; then
    echo "plan_speedup_table: bazel build -c opt //cli:pipetrain failed; rerun it to see why" >&2
    exit 1
  fi
  BIN="$(bazel info -c opt bazel-bin 2>/dev/null)/cli/pipetrain"
fi
COMMON=(--micro-batches 8 --schedule 1f1b --json)
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
for p in 2 3 4 5 6 7 8; do
  for kind in equal mixed; do
    python3 - "$p" "$kind" >"$TMP/$kind$p.json" <<'PY'
import json, sys
p, kind = int(sys.argv[1]), sys.argv[2]
speed = lambda i: 1.0 if kind == "equal" else [1.0, 2.0][i % 2]
print(json.dumps({"workers": [{"name": f"w{i}", "speed": speed(i), "memory_bytes": 0}
                              for i in range(p)],
                  "bandwidth_bytes_per_second": 1.25e9, "latency_seconds": 5e-5}))
PY
  done
done

table() {
  local title="$1" kind="$2"
  shift 2
  echo
  echo "$title"
  echo
  echo "| workers | uniform s | pipedream s | bipartition (paper) s | bipartition (full) s | best of them | full vs pipedream |"
  echo "|---|---|---|---|---|---|---|"
  for p in 2 3 4 5 6 7 8; do
    local row=()
    for args in "--solver uniform" "--solver pipedream" "--solver bipartition --objective paper" \
                "--solver bipartition --objective full"; do
      # shellcheck disable=SC2086
      row+=("$("$BIN" plan "$@" --cluster "$TMP/$kind$p.json" "${COMMON[@]}" $args |
               python3 -c 'import json,sys; print("%.4g" % json.load(sys.stdin)["predicted_iteration_seconds"])')")
    done
    python3 - "$p" "${row[@]}" <<'PY'
import sys
p, u, pd, bp, bf = sys.argv[1], *map(float, sys.argv[2:])
names = ["uniform", "pipedream", "bipartition (paper)", "bipartition (full)"]
best = names[[u, pd, bp, bf].index(min(u, pd, bp, bf))]
print(f"| {p} | {u:.4g} | {pd:.4g} | {bp:.4g} | {bf:.4g} | {best} | {pd / bf:.3f}x |")
PY
  done
}

for kind in equal mixed; do
  table "GPT-2 124M, analytic (vocab 50257, T 1024, 1 sequence per micro-batch, 100 GFLOP/s), $kind workers:" \
    "$kind" --layers 12 --d-model 768 --heads 12 --vocab 50257 --seq-len 1024 \
    --micro-batch-size 1 --gflops 100
  for f in docs/profiles/*.json; do
    table "measured: $f, $kind workers:" "$kind" --profile "$f"
  done
done
