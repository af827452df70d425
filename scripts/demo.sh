#!/usr/bin/env bash
# The demo: installs what is missing, builds `pipetrain`, and trains a small
# GPT-2 (2 layers, 4 heads, d_model 128) on generated English text with the
# single-process reference trainer. Extra arguments go to train-local, e.g.
#   bash scripts/demo.sh --steps 200 --data my.txt
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bazel build //cli:pipetrain
bin="$(bazel info bazel-bin 2>/dev/null)/cli/pipetrain"
out="${PIPETRAIN_DEMO_OUT:-/tmp/pipetrain-demo}"
mkdir -p "$out"
rm -f "$out/train.jsonl"
"$bin" train-local --steps 600 --lr 1e-3 --batch 16 --eval-interval 100 \
  --log "$out/train.jsonl" --save "$out/weights.safetensors" \
  --checkpoint "$out/checkpoint.safetensors" "$@"
echo "log: $out/train.jsonl  weights: $out/weights.safetensors  checkpoint: $out/checkpoint.safetensors"
