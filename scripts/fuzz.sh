#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan; .bazelrc
# --config=fuzz) and runs each for SECONDS, one after another, one process
# each, starting from a scratch copy of its seeds (fuzz/corpus/<target>), so
# the repository stays clean. docs/fuzzing.md explains the targets.
#   bash scripts/fuzz.sh              # every target, 600 s each
#   bash scripts/fuzz.sh 5            # every target, 5 s each (CI smoke run)
#   bash scripts/fuzz.sh 60 codec_fuzzer frame_fuzzer
# Prints one row per target (executions, exec/s, libFuzzer's final cov and
# ft, corpus files, crashes), then "fuzz: N targets, M crashes; build B s,
# runs R s" (the seconds the clang build and the runs took). A crash, hang
# (-timeout), out-of-memory or sanitizer report counts as a crash: the
# script prints the report, keeps the input (path printed) and exits 1.
# The build uses its own Bazel output base (PIPETRAIN_FUZZ_OUTPUT_BASE,
# default ~/.cache/pipetrain-fuzz), so it never invalidates the GCC build.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

TARGETS=(
  job_spec_json_fuzzer
  job_spec_yaml_fuzzer
  safetensors_fuzzer
  frame_fuzzer
  codec_fuzzer
  codec_spec_fuzzer
  token_file_fuzzer
  planner_json_fuzzer
  step_trace_fuzzer
  rest_fuzzer
  worker_registry_fuzzer
  job_manager_fuzzer
  store_restore_fuzzer
  unit_checkpoint_fuzzer
  profile_reply_fuzzer
  http_pieces_fuzzer
)

# TARGETS is kept by hand: check it against the pipetrain_fuzzer rules of
# fuzz/BUILD, so a new target cannot be left out of every run.
declared=$(sed -n '/^pipetrain_fuzzer(/,/^)/s/^ *name = "\([^"]*\)".*/\1/p' fuzz/BUILD | sort)
listed=$(printf '%s\n' "${TARGETS[@]}" | sort)
if [ -z "$declared" ] || [ "$declared" != "$listed" ]; then
  echo "fuzz: TARGETS in scripts/fuzz.sh does not match the pipetrain_fuzzer rules of fuzz/BUILD:" >&2
  comm -23 <(echo "$listed") <(echo "$declared") | sed 's/^/  only in scripts\/fuzz.sh: /' >&2
  comm -13 <(echo "$listed") <(echo "$declared") | sed 's/^/  only in fuzz\/BUILD: /' >&2
  exit 1
fi

seconds="${1:-600}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]" >&2
  exit 2
fi
shift $(($# > 0 ? 1 : 0))
if [ $# -gt 0 ]; then TARGETS=("$@"); fi
for t in "${TARGETS[@]}"; do
  if ! grep -qxF "$t" <<< "$declared"; then
    echo "fuzz: no fuzz target $t in fuzz/BUILD; the targets: $(paste -sd ' ' <<< "$declared")" >&2
    exit 2
  fi
done

# The scratch corpora and logs: removed at the end, on failure and on Ctrl-C,
# but kept when a target crashed (the inputs to reproduce it).
work=$(mktemp -d "${TMPDIR:-/tmp}/pipetrain-fuzz.XXXXXX") || work=""
if [ -z "$work" ] || [ ! -d "$work" ]; then
  echo "fuzz: cannot create a work directory under ${TMPDIR:-/tmp}" >&2
  exit 1
fi
keep_work=0
trap '[ "$keep_work" -eq 1 ] || rm -rf "$work"' EXIT
# Without this, a fuzzer that exits on Ctrl-C counts as a crash and the
# next target starts.
trap 'echo "fuzz: interrupted" >&2; exit 130' INT TERM

output_base="${PIPETRAIN_FUZZ_OUTPUT_BASE:-$HOME/.cache/pipetrain-fuzz}"
# The second Bazel server exits after 15 idle minutes, not Bazel's 3 hours.
bazel_fuzz() { bazel --output_base="$output_base" --max_idle_secs=900 "$@"; }

labels=()
for t in "${TARGETS[@]}"; do labels+=("//fuzz:$t"); done
# --symlink_prefix=/: no bazel-* links in the workspace. Links into this
# output base would replace the main build's and make `bazel test //...`
# descend into it.
build_start=$SECONDS
if ! bazel_fuzz build --config=fuzz --symlink_prefix=/ "${labels[@]}"; then
  echo "fuzz: build failed"
  exit 1
fi
build_seconds=$((SECONDS - build_start))
run_start=$SECONDS
# Copies of this build's binaries, run from $work: the output base is
# shared by every checkout (its warm cache is what keeps CI's fuzz build
# short), and another checkout's build while these run would rewrite them
# in place, so the later targets would fuzz its code. Kept with a crash's
# inputs, so that the "reproduce with" line still names what crashed.
built="$(bazel_fuzz info --config=fuzz bazel-bin 2>/dev/null)/fuzz"
bin="$work/bin"
mkdir -p "$bin"
for t in "${TARGETS[@]}"; do
  if ! cp "$built/$t" "$bin/$t"; then
    echo "fuzz: cannot copy $built/$t (bazel info failed, or the build made no such binary)" >&2
    exit 1
  fi
done

# Readable stacks in sanitizer reports; a UBSan finding stops the run.
symbolizer=/usr/lib/llvm-14/bin/llvm-symbolizer
if [ -x "$symbolizer" ]; then export ASAN_SYMBOLIZER_PATH="$symbolizer"; fi
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

crashes=0
rows=()
for t in "${TARGETS[@]}"; do
  dir="$work/$t"
  mkdir -p "$dir/corpus" "$dir/artifacts" "$dir/tmp"
  cp -r "fuzz/corpus/$t/." "$dir/corpus/"
  echo "fuzz: running $t for $seconds s"
  # -timeout: one input running 10 s is a hang; memory is capped at
  # libFuzzer's default 2048 MB (-rss_limit_mb, and per malloc). TMPDIR:
  # the fuzzers that write files make their scratch directory there and
  # remove it at exit, which a crash, hang or out-of-memory skips; under
  # $work it goes with the rest (or stays with the crash's inputs).
  # Inputs up to libFuzzer's default (4 KiB, from the seeds), but for the
  # job manager's: uploading its whole model (a seed that SUCCEEDS) takes
  # about 61 KB.
  max_len=()
  if [ "$t" = job_manager_fuzzer ]; then max_len=(-max_len=131072); fi
  TMPDIR="$dir/tmp" "$bin/$t" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
    "${max_len[@]}" -artifact_prefix="$dir/artifacts/" "$dir/corpus" > "$dir/log" 2>&1
  rc=$?
  # The last status line: "#N DONE cov: C ft: F corp: ..." (or the last
  # pulse before a crash).
  status_line=$(grep -E '^#[0-9]+' "$dir/log" | tail -n 1)
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<< "$status_line")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<< "$status_line")
  execs=$(sed -nE 's/^stat::number_of_executed_units: +([0-9]+)/\1/p' "$dir/log")
  rate=$(sed -nE 's/^stat::average_exec_per_sec: +([0-9]+)/\1/p' "$dir/log")
  corpus=$(find "$dir/corpus" -type f | wc -l)
  found=$(find "$dir/artifacts" -type f | wc -l)
  if [ "$rc" -ne 0 ] && [ "$found" -eq 0 ]; then found=1; fi  # died without an artifact
  rows+=("$(printf '%-22s %8s %12s %8s %6s %7s %8s %8s' "$t" "$seconds" "${execs:-?}" \
    "${rate:-?}" "${cov:-?}" "${ft:-?}" "$corpus" "$found")")
  if [ "$found" -gt 0 ]; then
    crashes=$((crashes + found))
    keep_work=1
    echo "fuzz: $t FAILED (exit $rc); its report:"
    grep -E -A 40 '^==[0-9]+==|runtime error:|^ERROR: libFuzzer|deadly signal' "$dir/log" | head -n 80
    echo "fuzz: inputs kept in $dir/artifacts/ (full log $dir/log); reproduce with"
    echo "  $bin/$t $dir/artifacts/<file>"
  fi
done

echo
printf '%-22s %8s %12s %8s %6s %7s %8s %8s\n' target seconds executions exec/s cov ft corpus crashes
printf '%s\n' "${rows[@]}"
echo "machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1); commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "fuzz: ${#TARGETS[@]} targets, $crashes crashes; build $build_seconds s, runs $((SECONDS - run_start)) s"
[ "$crashes" -eq 0 ]
