#!/usr/bin/env bash
# Convergence of the demo task (4 workers, uniform 1F1B, 4 micro-batches,
# generated English text) under each compression setting: runs
# `pipetrain up` once per row and prints a markdown table of the final loss,
# its change against the uncompressed run, and the wire-byte ratios the
# workers' metrics report. Usage:
#   bash scripts/compression_convergence.sh [steps]    (default 300)
# Needs a built //cli:pipetrain (-c opt) and the coordinator/worker binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-300}"
bin=bazel-out/k8-opt/bin/cli/pipetrain
[[ -x "$bin" ]] || { echo "build first: bazel build -c opt //cli:pipetrain //coordinator:pipetrain-coordinator //worker:pipetrain-worker" >&2; exit 1; }
if grep -q avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX; fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# name | flags
rows=(
  "none|"
  "fwd fp16|--forward-codec fp16"
  "fwd bf16|--forward-codec bf16"
  "fwd piecewise:bits=3 (4 bits)|--forward-codec piecewise:bits=3"
  "fwd linear:bits=4|--forward-codec linear:bits=4"
  "fwd token_topk:keep=0.5+piecewise:bits=3|--forward-codec token_topk:keep=0.5+piecewise:bits=3"
  "bwd fp16|--backward-codec fp16"
  "bwd piecewise:bits=3|--backward-codec piecewise:bits=3"
  "bwd powersgd:rank=4|--backward-codec powersgd:rank=4"
  "bwd powersgd:rank=4 + EF|--backward-codec powersgd:rank=4 --error-feedback"
  "bwd powersgd:rank=4 + epilogue|--backward-codec powersgd:rank=4 --epilogue-only"
  "bwd powersgd:rank=4 + EF + epilogue|--backward-codec powersgd:rank=4 --error-feedback --epilogue-only"
)

echo "pipetrain up --steps $steps (4 workers, 2 layers, d_model 128, seq 64, batch 16, 4 micro-batches); $(date -u +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo
echo "| compression | final loss | vs none | ACTIVATION raw/wire | ACTIVATION_GRAD raw/wire | grad error |"
echo "|---|---|---|---|---|---|"
base=""
for row in "${rows[@]}"; do
  name="${row%%|*}"; flags="${row#*|}"
  log="$out/run.log"
  # shellcheck disable=SC2086
  if ! "$bin" up --steps "$steps" --out "$out/cluster" $flags >"$log" 2>&1; then
    echo "| $name | FAILED (see below) | | | | |"; tail -5 "$log" >&2; continue
  fi
  loss=$(sed -n 's/.*final loss \([0-9.]*\).*/\1/p' "$log")
  [[ -z "$base" ]] && base="$loss"
  ratio() { awk -v k="$1" '$1==k && /wire/ {gsub(/[()x,]/,"",$9); print $9 "x"; f=1} END {if (!f) print "1x"}' "$log"; }
  err=$(awk '$1=="ACTIVATION_GRAD" && /error/ {print $NF}' "$log")
  delta=$(awk -v a="$loss" -v b="$base" 'BEGIN {printf "%+.2f%%", 100 * (a - b) / b}')
  echo "| $name | $loss | $delta | $(ratio ACTIVATION) | $(ratio ACTIVATION_GRAD) | ${err:--} |"
done
