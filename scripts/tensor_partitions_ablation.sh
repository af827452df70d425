#!/usr/bin/env bash
# AccTFM's partition ablation (issue 22): step time of a tensor-parallel
# stage with k = 1, 2, 4 partitions per micro-batch and with k = 0 (Alg. 1
# per layer on the measured profile, then checked by measurement against
# the uniform sizes: spec.parallelism.tensor_partitions_tune_steps), under
# emulated links. The window `up` measures starts at step STEPS/10, after
# the tuning's 9 steps when STEPS >= 90.
#   bash scripts/tensor_partitions_ablation.sh [STEPS] [T] [LINKS...]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-90}"
tensor="${2:-2}"
shift $(($# > 2 ? 2 : $#))
links=("$@")
[ ${#links[@]} -gt 0 ] || links=(1Gbit,0.5ms 10Gbit,0.05ms)
if ! bazel build //cli:pipetrain >/dev/null 2>&1; then
  echo "tensor_partitions_ablation: bazel build //cli:pipetrain failed; rerun it to see why" >&2
  exit 1
fi
bin="$(bazel info bazel-bin 2>/dev/null)/cli/pipetrain"
# Each run's --out: removed after it, on an error and on Ctrl-C, but kept
# (and named) when the run fails, for its logs.
out=""
trap '[ -z "$out" ] || rm -rf "$out"' EXIT
trap 'exit 130' INT TERM
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for link in "${links[@]}"; do
  for k in 1 2 4 0; do
    out="$(mktemp -d /tmp/pipetrain-ablation.XXXXXX)"
    log="$("$bin" up --workers "$tensor" --tensor-parallel "$tensor" --tensor-partitions "$k" \
      --solver bipartition --emulate-link "$link" --steps "$steps" --eval-interval 0 \
      --checkpoint-interval 0 --batch 16 --micro-batches 2 --d-model 512 --heads 8 \
      --seq-len 128 --out "$out" 2>&1)" || {
      echo "$log" | tail -5
      echo "tensor_partitions_ablation: pipetrain up failed; its logs are in $out" >&2
      out=""
      exit 1
    }
    echo "T = $tensor, $link, k = $k:"
    echo "$log" | grep -E "step time:|tensor partitions|tensor-parallel all-reduces" | sed 's/^/  /'
    rm -rf "$out"
    out=""
  done
done
