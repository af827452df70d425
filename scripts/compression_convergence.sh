#!/usr/bin/env bash
# Convergence of the demo task (4 workers, uniform 1F1B, generated English
# text; `pipetrain up`'s defaults) under each compression setting. Runs
# `pipetrain up` once per row and seed and prints a markdown table: the mean
# over the last 20 steps' losses per seed (one step's loss is noisy), their
# mean, its change against the uncompressed rows' mean, the same for the
# validation loss after the last step, and the wire-byte
# ratios and compression error the workers' metrics report (first seed).
# "paired" is the mean ± standard error (in percentage points) over seeds
# of each seed's change against the uncompressed run of the same seed (the
# seed fixes the initial weights and the data order, which move the loss by
# more than most codecs).
#
#   bash scripts/compression_convergence.sh [steps] [seeds] [extra up flags]
#   e.g. bash scripts/compression_convergence.sh 300 "1 2 3" "--micro-batches 8"
#   ROWS=powersgd bash ...   only the rows whose name contains "powersgd"
#   ROWS=quantizer bash scripts/compression_convergence.sh 300 "1 2 3" "--data-parallel 2 --workers 6"
#                            the quantizers on the data-parallel all-reduce
#   ROWS=tp bash scripts/compression_convergence.sh 300 "1 2 3" "--tensor-parallel 2"
#                            AccTFM's compression of the tensor-parallel
#                            all-reduces against exact tensor parallelism
#   RANK=8 bash ...          PowerSGD rows at rank 8 (default 4)
#
# The "dp" rows run only when the extra flags have --data-parallel, the
# "tp" rows only with --tensor-parallel. Exits 1 when any run failed (its
# row then shows FAILED).
#
# Needs -c opt builds of //cli:pipetrain, //coordinator:pipetrain-coordinator
# and //worker:pipetrain-worker.
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-300}"
seeds="${2:-1 2 3}"
extra="${3:-}"
rank="${RANK:-4}"
[[ "$rank" =~ ^[1-9][0-9]*$ ]] || { echo "RANK must be a positive integer, not '$rank'" >&2; exit 1; }
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
  "fwd linear:bits=4|--forward-codec linear:bits=4"
  "fwd piecewise:bits=3 (4 bits)|--forward-codec piecewise:bits=3"
  "fwd token_topk:keep=0.5+piecewise:bits=3|--forward-codec token_topk:keep=0.5+piecewise:bits=3"
  "bwd fp16|--backward-codec fp16"
  "bwd piecewise:bits=3|--backward-codec piecewise:bits=3"
  "bwd powersgd:rank=$rank|--backward-codec powersgd:rank=$rank"
  "bwd powersgd:rank=$rank + EF|--backward-codec powersgd:rank=$rank --error-feedback"
  "bwd powersgd:rank=$rank + epilogue|--backward-codec powersgd:rank=$rank --epilogue-only"
  "bwd powersgd:rank=$rank + EF + epilogue|--backward-codec powersgd:rank=$rank --error-feedback --epilogue-only"
  # Data-parallel all-reduce (run with "--data-parallel 2" as the extra
  # flags; ROWS=dp): Optimus-CC's selective stage compression, the
  # planner's critical stages against every stage.
  "dp powersgd:rank=$rank + EF, critical stages|--dp-codec powersgd:rank=$rank"
  "dp powersgd:rank=$rank + EF, every stage|--dp-codec powersgd:rank=$rank --dp-stages all"
  # The quantizers on the data-parallel all-reduce (ROWS=quantizer).
  "dp quantizer bf16 + EF, critical stages|--dp-codec bf16"
  "dp quantizer bf16 + EF, every stage|--dp-codec bf16 --dp-stages all"
  "dp quantizer piecewise:bits=8 + EF, critical stages|--dp-codec piecewise:bits=8"
  "dp quantizer piecewise:bits=8 + EF, every stage|--dp-codec piecewise:bits=8 --dp-stages all"
  # Tensor-parallel all-reduces (run with "--tensor-parallel 2" as the
  # extra flags; ROWS=tp): AccTFM's hybrid compression, its parts alone and
  # together (the paper's 50 % token sparsity and 4-bit codes).
  "tp token_topk:keep=0.5|--tensor-compression token_topk:keep=0.5"
  "tp piecewise:bits=3|--tensor-compression piecewise:bits=3"
  "tp token_topk:keep=0.5+piecewise:bits=3|--tensor-compression token_topk:keep=0.5+piecewise:bits=3"
)

echo "pipetrain up --steps $steps $extra (defaults: 4 workers, 2 layers, d_model 128, seq 64, batch 16, 4 micro-batches, lr 1e-3); seeds $seeds; $(date -u +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo
echo "| compression | last-20-step loss per seed | mean | vs none | paired | final validation loss per seed | mean | vs none | paired | ACTIVATION raw/wire | ACTIVATION_GRAD raw/wire | grad error | DP all-reduce raw/wire | TP all-reduce raw/wire, error |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
ratio() { awk -v k="$1" '$1==k && /wire/ {gsub(/[()x,]/,"",$9); print $9 "x"; f=1} END {if (!f) print "1x"}' "$2"; }
base=""; vbase=""; failed=""
meanof() { printf '%s\n' "$@" | awk '/^[0-9.]+$/ {s += $1; n++} END {if (n) printf "%.4f", s / n; else print "-"}'; }
# paired BASE... -- VALUE...: mean ± standard error of 100 (v - b) / b over
# the pairs where both are numbers ("-" for none; no ± for one pair).
paired() {
  printf '%s\n' "$@" | awk '
    $0 == "--" {second = 1; next}
    !second {b[++nb] = $0; next}
    {v[++nv] = $0}
    END {
      for (i = 1; i <= nv && i <= nb; ++i) {
        if (b[i] !~ /^[0-9.]+$/ || v[i] !~ /^[0-9.]+$/ || b[i] + 0 <= 0) continue
        d[++n] = 100 * (v[i] - b[i]) / b[i]; s += d[n]
      }
      if (!n) {print "-"; exit}
      m = s / n
      if (n == 1) {printf "%+.1f%%", m; exit}
      for (i = 1; i <= n; ++i) ss += (d[i] - m) ^ 2
      printf "%+.1f%% ± %.1f", m, sqrt(ss / (n - 1) / n)
    }'
}
versus() { awk -v a="$1" -v b="$2" 'BEGIN {if (a + 0 > 0) printf "%+.1f%%", 100 * (a - b) / b; else print "-"}'; }
for row in "${rows[@]}"; do
  name="${row%%|*}"; flags="${row#*|}"
  if [[ -n "${ROWS:-}" && "$name" != none && "$name" != *"$ROWS"* ]]; then continue; fi
  # The data- and tensor-parallel rows need replicas or ranks to compress
  # for: without the extra flags that make them, they are left out.
  if [[ "$name" == "dp "* && "$extra" != *--data-parallel* ]]; then continue; fi
  if [[ "$name" == "tp "* && "$extra" != *--tensor-parallel* ]]; then continue; fi
  tails=(); vals=(); first=""
  for seed in $seeds; do
    log="$out/run-$seed.log"
    # shellcheck disable=SC2086
    if ! "$bin" up --steps "$steps" --seed "$seed" --out "$out/cluster" $extra $flags >"$log" 2>&1; then
      echo "row '$name' seed $seed failed:" >&2; tail -5 "$log" >&2; tails+=("FAILED"); vals+=("FAILED")
      failed=1; continue
    fi
    tails+=("$(sed -n 's/.*mean of the last [0-9]* steps \([0-9.]*\).*/\1/p' "$log")")
    vals+=("$(sed -n "s/^validation loss \([0-9.]*\) after step $steps\$/\1/p" "$log")")
    [[ -z "$first" ]] && first="$log"
  done
  mean=$(meanof "${tails[@]}"); vmean=$(meanof "${vals[@]}")
  if [[ -z "$base" ]]; then base="$mean"; vbase="$vmean"; base_tails=("${tails[@]}"); base_vals=("${vals[@]}"); fi
  delta=$(versus "$mean" "$base"); vdelta=$(versus "$vmean" "$vbase")
  pdelta=$(paired "${base_tails[@]}" -- "${tails[@]}"); pvdelta=$(paired "${base_vals[@]}" -- "${vals[@]}")
  err="-"; act="-"; grad="-"; dp="-"; tp="-"
  if [[ -n "$first" ]]; then
    err=$(awk '$1=="ACTIVATION_GRAD" && /error/ {print $NF}' "$first"); err="${err:--}"
    act=$(ratio ACTIVATION "$first"); grad=$(ratio ACTIVATION_GRAD "$first")
    if grep -q "collective:tensor_parallel_compressed" "$first"; then
      tp="$(ratio collective:tensor_parallel_compressed "$first"), $(awk '$1=="collective:tensor_parallel_compressed" {print $NF}' "$first")"
    fi
    if grep -q "collective:data_parallel" "$first"; then
      dp="$(ratio collective:data_parallel "$first")"
      stages=$(sed -n 's/^data-parallel all-reduce: .* on stages \(\[[0-9,]*\]\).*/\1/p' "$first")
      [[ -n "$stages" ]] && dp="$dp on $stages"
    fi
  fi
  echo "| $name | ${tails[*]} | $mean | $delta | $pdelta | ${vals[*]} | $vmean | $vdelta | $pvdelta | $act | $grad | $err | $dp | $tp |"
done
if [[ -n "$failed" ]]; then
  echo "some runs FAILED (their logs' last lines are above); the table is incomplete" >&2
  exit 1
fi
