#!/usr/bin/env bash
# 3-D against 1-D tensor parallelism in jobs (issue 22's "3-D against 1-D"):
# `pipetrain up` with 8 workers as one tensor-parallel stage, 1-D (Megatron)
# and 3-D (a 2x2x2 cube), on emulated links, for two model shapes. Prints
# per run the measured and predicted step time and the tensor-parallel
# bytes (raw, and sent over the links) of all 8 workers.
#   bash scripts/tensor_mode_compare.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-12}"
if ! bazel build //cli:pipetrain >/dev/null 2>&1; then
  echo "tensor_mode_compare: bazel build //cli:pipetrain failed; rerun it to see why" >&2
  exit 1
fi
bin="$(bazel info bazel-bin 2>/dev/null)/cli/pipetrain"
# Each run's --out: removed after it, on an error and on Ctrl-C, but kept
# (and named) when the run fails, for its logs.
out=""
trap '[ -z "$out" ] || rm -rf "$out"' EXIT
trap 'exit 130' INT TERM
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
# d_model batch micro-batches: micro-batch rows M = batch / micro x 128.
for shape in "256 16 2" "512 16 4"; do
  read -r d batch micro <<<"$shape"
  for link in 1Gbit,0.5ms 10Gbit,0.05ms; do
    for mode in 1d 3d; do
      out="$(mktemp -d /tmp/pipetrain-tm.XXXXXX)"
      log="$("$bin" up --workers 8 --tensor-parallel 8 --tensor-mode "$mode" \
        --emulate-link "$link" --steps "$steps" --eval-interval 0 --checkpoint-interval 0 \
        --batch "$batch" --micro-batches "$micro" --d-model "$d" --heads 8 --seq-len 128 \
        --out "$out" 2>&1)" || {
        echo "$log" | tail -5
        echo "tensor_mode_compare: pipetrain up failed; its logs are in $out" >&2
        out=""
        exit 1
      }
      echo "d_model $d, batch $batch in $micro micro-batches, $link, $mode:"
      echo "$log" | grep -E "SUCCEEDED|step time:|collective:tensor_parallel" | sed 's/^/  /'
      rm -rf "$out"
      out=""
    done
  done
done
