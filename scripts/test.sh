#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test.
#   bash scripts/test.sh                 # all tests (what CI runs)
#   bash scripts/test.sh --config=asan   # the same under ASan + UBSan
#   bash scripts/test.sh --config=tsan   # the same under ThreadSanitizer
# Where the CUDA toolkit is installed (/usr/local/cuda/bin/nvcc), it then
# builds and tests the CUDA backend too (--config=cuda, CUDA_TARGETS below);
# without a GPU those tests skip their GPU cases (where nvidia-smi lists
# GPUs, a skip fails the run, but a two-GPU case on a one-GPU machine).
# Ends with a line "tests: N passed, M failed; GPU tests: ...", then checks
# the layering and (without arguments) the coordinator image's libraries,
# runs each fuzz target for 5 s (scripts/fuzz.sh) and ends with "fuzz: N
# targets, M crashes; build B s, runs R s".
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
log=$(mktemp)
# The logs are only counted here, never kept: remove them on Ctrl-C too.
trap 'rm -f "$log" "${cuda_log:-}"' EXIT
bazel test "$@" //... 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
source scripts/cuda_targets.sh
gpu="CUDA toolkit not found: CUDA targets not built"
if [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda_log=$(mktemp)
  # Not from the cache: whether a case may skip depends on this machine's
  # GPUs, which the cache does not know.
  bazel test "$@" --config=cuda --cache_test_results=no "${CUDA_TARGETS[@]}" 2>&1 |
    tee "$cuda_log"
  cuda_status=${PIPESTATUS[0]}
  if [ "$status" -eq 0 ]; then status=$cuda_status; fi
  # One result line per CUDA test target; gtest prints "[  SKIPPED ] Suite.Case
  # (N ms)" once per skipped case (the summary repeats them without a time).
  targets=$(grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT)' "$cuda_log" |
    cut -d' ' -f1 | sort -u)
  skipped=0
  multi=0  # of them, cases that need two GPUs (named TwoGpus_)
  for t in $targets; do
    test_log="bazel-testlogs/${t#//}"
    test_log="${test_log/://}/test.log"
    if [ -f "$test_log" ]; then
      n=$(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$test_log")
      skipped=$((skipped + n))
      n=$(grep -cE '^\[  SKIPPED \] [^ ]*\.TwoGpus_.* \([0-9]+ ms\)$' "$test_log")
      multi=$((multi + n))
    fi
  done
  gpu="GPU tests: $(echo "$targets" | grep -c .) targets built, $skipped cases skipped"
  # As scripts/gpu_run.sh: where the driver lists GPUs nothing may skip (a
  # skip there hides a check), but the two-GPU cases on a one-GPU machine.
  gpus=$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  hiding=$skipped
  if [ "$gpus" -lt 2 ]; then hiding=$((skipped - multi)); fi
  if [ "$gpus" -eq 0 ]; then
    if [ "$skipped" -gt 0 ]; then gpu="$gpu (no GPU)"; fi
  elif [ "$hiding" -gt 0 ]; then
    gpu="$gpu on a machine with $gpus GPU(s): that fails the run"
    if [ "$status" -eq 0 ]; then status=1; fi
  fi
  cat "$cuda_log" >> "$log"
  rm -f "$cuda_log"
  # The GPU bundle's target list and flags (analysis only, no compiling):
  # it is built only when a GPU is lent, too late to find it broken.
  if ! bash scripts/gpu_bundle.sh --check && [ "$status" -eq 0 ]; then status=1; fi
fi
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' "$log")
rm -f "$log"
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi  # e.g. a build error
echo "tests: $passed passed, $failed failed; $gpu"
if ! bash scripts/check_layering.sh && [ "$status" -eq 0 ]; then status=1; fi
# The coordinator image's packages against the libraries the binary links
# (the default configuration's binary: not under a sanitizer's flags).
if [ "$#" -eq 0 ] && ! bash scripts/check_image_libraries.sh && [ "$status" -eq 0 ]; then
  status=1
fi
# libFuzzer smoke run (docs/fuzzing.md): a crash or a failed build fails CI.
if ! bash scripts/fuzz.sh 5 && [ "$status" -eq 0 ]; then status=1; fi
exit "$status"
