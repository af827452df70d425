#!/usr/bin/env bash
# The CUDA issue's GPU checks, run on a GPU machine from the bundle that
# scripts/gpu_bundle.sh builds (no Bazel needed there):
#   tar xzf gpu-bundle.tar.gz && bash gpu-bundle/run.sh OUTDIR [quick|bench|sanitize|collectives]
# OUTDIR must be new or empty. Writes into it: machine.txt (nvidia-smi, CUDA
# libraries), one log per test binary, the train-local and pipeline
# comparisons, the benchmark tables, and summary.txt with one line per
# check; then packs it all as OUTDIR.tgz beside it. Modes: none runs
# quick's checks and then bench's (sanitize and collectives only when
# named); "quick" skips the GPT-2 124M benchmarks; "bench" runs only them; "sanitize" runs only the kernel tests under compute-sanitizer
# (memcheck, racecheck, synccheck), when the machine has it; "collectives"
# runs only the data-parallel issue's collective benchmark on the machine's
# CPU cores (the development VM's 2 vCPUs bound it). Each step has a
# time limit, so one that hangs costs minutes, not the call, and the whole
# run stops starting steps RUN_BUDGET_S seconds (default 540) after it
# began: a step that would not fit is cut to the time left or noted as
# "NOT RUN ... (out of time)", and the archive is always written, inside
# the lent machine's 10-minute command limit. Exits non-zero if any check
# failed. summary.txt begins with the mode and the bundle's BUILD_INFO (the
# commit it was built from).
#
# On the lent device machine (it returns at most 8 files from $OUT; a new
# folder name for every call):
#   rm -rf /tmp/r1 /tmp/r1.tgz; tar xzf gpu-bundle.tar.gz &&
#   { timeout -k 10 580 bash gpu-bundle/run.sh /tmp/r1 quick; echo rc=$?; };
#   [ -f /tmp/r1.tgz ] || tar czf /tmp/r1.tgz -C /tmp r1; cp /tmp/r1.tgz /tmp/r1/summary.txt $OUT/
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: run.sh OUTDIR [quick|bench|sanitize|collectives]}
mode=${2:-}
case "$mode" in
  ""|quick|bench|sanitize|collectives) ;;
  *) echo "mode must be quick, bench, sanitize or collectives, not $mode" >&2; exit 2 ;;
esac
mkdir -p "$out"
out=$(cd "$out" && pwd -P)  # physical: `up` names its files by the real path
if [[ -n "$(ls -A "$out")" ]]; then echo "$out is not empty: use a new folder" >&2; exit 2; fi
rm -f "$out.tgz"  # an older run's archive must not pass for this one's
deadline=$((SECONDS + ${RUN_BUDGET_S:-540}))
# budget LIMIT: LIMIT seconds, or fewer if the run's deadline (less 35 s:
# a step's -k grace of up to 20 s, then packing the archive) comes first;
# fails when less than 10 s are left.
budget() {
  local left=$((deadline - SECONDS - 35))
  [[ $left -ge 10 ]] || return 1
  echo $(($1 < left ? $1 : left))
}
# The bundle's libraries, and the CUDA ones where the machine keeps them:
# NCCL is no part of the toolkit and may live elsewhere (e.g. a Python
# package's nvidia/nccl/lib).
libpath="$here/lib:/usr/local/cuda/lib64"
for name in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  if ! ls /usr/local/cuda/lib64/"$name" >/dev/null 2>&1; then
    found=$(find /usr/local /opt /usr/lib -name "$name" -print -quit 2>/dev/null)
    [[ -n "$found" ]] && libpath="$libpath:$(dirname "$found")"
  fi
done
export LD_LIBRARY_PATH="$libpath:${LD_LIBRARY_PATH:-}"
# Python (the comparisons) with the machine's own libraries, not the bundle's.
py() { env -u LD_LIBRARY_PATH python3 "$@"; }
bin="$here/bin"
summary="$out/summary.txt"
: >"$summary"
failed=0
note() { echo "$*" | tee -a "$summary"; }
check() {  # check NAME RC DETAIL
  if [[ $2 -eq 0 ]]; then note "PASS $1 $3"; else note "FAIL $1 (exit $2) $3"; failed=1; fi
}
out_of_time() { note "NOT RUN $1 (out of time: RUN_BUDGET_S=${RUN_BUDGET_S:-540})"; failed=1; }
finish() {
  note "run took $SECONDS s"
  # Model weights do not compress and are not needed to judge a check.
  tar czf "$out.tgz" --exclude='*.safetensors' -C "$(dirname "$out")" "$(basename "$out")"
  exit $failed
}
# limited ARGS...: `timeout ARGS...` run so that a signal to this script
# (Ctrl-C, an outer timeout) ends the step at once and still packs the
# archive. In the foreground it would not: timeout puts itself in a process
# group of its own, out of the terminal's reach, and bash runs a trap only
# once its foreground child has exited; `wait` is interrupted at once.
step_pid=""
limited() {
  timeout "$@" &
  step_pid=$!
  wait "$step_pid"
  local rc=$?
  step_pid=""
  return $rc
}
# sweep_cluster DIR: after an `up` step with --out DIR, kills what is left
# of its coordinator and workers. `up` starts each in a process group of
# its own, out of the step's timeout's reach: when the step timed out, `up`
# may be killed (-k) before its orderly stop (up to ~12 s) ends, and a
# worker left alive would hold the GPU for the seconds its own stop takes. They are
# found by their --ports-file, which `up` puts under DIR.
sweep_cluster() {
  pkill -KILL -f -- "--ports-file=$1/" 2>/dev/null || true
}
exec 3>&1 4>&2  # the trap runs inside a step's redirections: undone there
on_signal() {
  trap '' INT TERM
  exec 1>&3 2>&4
  if [[ -n "$step_pid" ]]; then
    kill -TERM "$step_pid" 2>/dev/null  # timeout passes it on to the step's group
    wait "$step_pid"
  fi
  note "INTERRUPTED by a signal after $SECONDS s: later checks not run"
  failed=1
  finish
}
trap on_signal INT TERM
note "mode=${mode:-all}; budget ${RUN_BUDGET_S:-540} s; bundle: $(tr '\n' ' ' <"$here/BUILD_INFO" 2>/dev/null || echo 'no BUILD_INFO')"
cp "$0" "$out/run.sh"

{
  date -u
  nvidia-smi || true
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ls -l /usr/local/cuda/lib64/ 2>&1 | grep -E "libcudart|libcublas|libnccl" || true
  ldd "$bin/pipetrain" | grep -E "not found|cuda|cublas|nccl" || true
} >"$out/machine.txt" 2>&1
missing=$(ldd "$bin"/* 2>/dev/null | grep "not found" | sort -u | tr -s ' \t' ' ')
check preflight_libraries "$([[ -z "$missing" ]]; echo $?)" "${missing:-every library found}"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
note "machine: $gpus GPU(s); $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
check gpu_present "$([[ $gpus -gt 0 ]]; echo $?)" "($gpus GPU(s) seen by nvidia-smi)"

# 0. compute-sanitizer over the kernels' parity tests: out-of-bounds
# accesses, shared-memory races and misplaced barriers that a parity test
# can pass by luck.
if [[ "$mode" == sanitize ]]; then
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [[ -z "$sanitizer" ]]; then
    note "NOT RUN compute_sanitizer: not on this machine"
    failed=1  # the mode checked nothing
  else
    mkdir -p "$out/sanitizer"
    # The kernels changed last first, in case the budget runs out.
    for name in flash_attention multi_tensor lm_head cross_entropy bf16_round attention \
      attention_gemm linear layernorm embedding gelu adamw elementwise quantize token_topk \
      half_codec powersgd; do
      for tool in memcheck racecheck synccheck; do
        log="$out/sanitizer/${name}_$tool.log"
        lim=$(budget 150) || { out_of_time "sanitizer_${tool}_$name"; continue; }
        limited -k 5 "$lim" "$sanitizer" --tool "$tool" --error-exitcode 99 \
          "$bin/${name}_test" >"$log" 2>&1
        check "sanitizer_${tool}_$name" $? "$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log")"
      done
    done
  fi
  finish
fi

# The data-parallel issue's all-reduce over the gRPC data plane, nccl-tests
# style (worker/collectives/collective_benchmark.cc): the ring against one
# point-to-point stream, loopback with 2, 4 and 8 member processes, and
# under emulated 1 and 10 Gbit/s links with 2 and 4; its goal lines say
# whether busbw reached 0.8 x point-to-point and 0.9 x the emulated link
# from 16 MiB up. Then, as time allows, the bf16-compressed all-reduce
# (--codec bf16, AllReduceEncoded) with 2 and 4 members. The ring runs on
# the CPU; then NCCL's all-reduce over the machine's GPUs in the same
# columns (kernels/cuda/nccl_all_reduce_benchmark.cc; with one GPU a local
# copy, busbw 0).
if [[ "$mode" == collectives ]]; then
  note "cpu: $(nproc) hardware threads; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  mkdir -p "$out/collectives"
  collective() {  # collective NAME FLAGS...
    local name=$1
    shift
    local lim log="$out/collectives/$name.txt"
    lim=$(budget 120) || { out_of_time "collectives_$name"; return; }
    limited -k 5 "$lim" "$bin/collective_benchmark" "$@" >"$log" 2>&1
    check "collectives_$name" $? "$(grep '^# goal\|^# check' "$log" | sed 's/^# //' | tr '\n' ' ')"
  }
  for n in 2 4 8; do
    collective "loopback_n$n" --members "$n" --max-mib "${COLLECTIVE_MAX_MIB:-256}" --iters 2
  done
  if lim=$(budget 120); then
    limited -k 5 "$lim" "$bin/nccl_all_reduce_benchmark" --max-mib "${COLLECTIVE_MAX_MIB:-256}" \
      >"$out/collectives/nccl.txt" 2>&1
    check collectives_nccl $? "$(grep '^# all-reduce\|^# check' "$out/collectives/nccl.txt" |
      sed 's/^# //' | tr '\n' ' ')"
  else out_of_time collectives_nccl; fi
  # The 10 Gbit/s rows sit near their goal (0.89-0.97 of the link at 16
  # MiB), where two timed all-reduces a size left the verdict to jitter:
  # they average five (about 0.1 s a size more); the 1 Gbit/s rows, far
  # from it, two.
  for link in 1Gbit,0.5ms 10Gbit,0.05ms; do
    iters=2
    [[ $link == 10Gbit* ]] && iters=5
    for n in 2 4; do
      collective "${link%%,*}_n$n" --members "$n" --max-mib "${COLLECTIVE_LINK_MAX_MIB:-64}" \
        --iters "$iters" --emulate-link "$link"
    done
  done
  # 4 members under 10 Gbit/s at 16 MiB, 16 cores (2026-11-29): 0.89-0.90
  # of the link with the ring's 1 MiB messages, 0.90 with 512 KiB, 0.94
  # with 256 KiB. So RingChunk now cuts a segment into 16 messages (256
  # KiB at that size; the rows above use it). These two rows cap the
  # messages at every size, for comparison.
  for kib in 256 512; do
    collective "10Gbit_n4_chunk${kib}k" --members 4 --max-mib "${COLLECTIVE_LINK_MAX_MIB:-64}" \
      --iters 5 --emulate-link 10Gbit,0.05ms --chunk-kib "$kib"
  done
  # 2 members exchange once (recursive doubling): 0.894-0.91 of the link at
  # 16 MiB with 1 MiB messages. Their messages are now 256 KiB
  # (CollectiveOptions::exchange_bytes; the 10Gbit_n2 row above); this row
  # keeps the old 1 MiB, for comparison.
  collective "10Gbit_n2_exchange1024k" --members 2 --max-mib "${COLLECTIVE_LINK_MAX_MIB:-64}" \
    --iters 5 --emulate-link 10Gbit,0.05ms --exchange-kib 1024
  for n in 2 4; do
    collective "bf16_n$n" --members "$n" --max-mib "${COLLECTIVE_LINK_MAX_MIB:-64}" --iters 2 \
      --codec bf16
  done
  cat "$out"/collectives/*.txt
  finish
fi

if [[ "$mode" != bench ]]; then
# Empty allocations filled with NaN on CUDA (worker/model/cuda_backend.h):
# an op leaving part of its output unwritten shows in every comparison.
export PIPETRAIN_POISON_EMPTY=1

# 1. Every CUDA test binary: kernel parity (every op and codec), units on
# both backends, the trainer and a 2-stage pipeline on CUDA, NCCL.
mkdir -p "$out/tests"
# test_binary NAME ENV BINARY: runs BINARY with the environment ENV
# (VAR=value, or "" for none), its log tests/NAME.log, and checks it.
test_binary() {
  local name=$1 env_var=$2 t=$3 lim tmp rc ran skipped bad multi hiding
  lim=$(budget 240) || { out_of_time "$name"; return; }
  tmp=$(mktemp -d)
  TEST_TMPDIR="$tmp" limited -k 5 "$lim" env $env_var "$t" >"$out/tests/$name.log" 2>&1
  rc=$?
  rm -rf "$tmp"
  ran=$(grep -cE '^\[       OK \]' "$out/tests/$name.log")
  skipped=$(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$out/tests/$name.log")
  bad=$(grep -cE '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$out/tests/$name.log")
  # On a machine with a GPU nothing may skip: a skip there hides a check;
  # but for the cases that need two GPUs (named TwoGpus_) on a one-GPU one.
  multi=$(grep -cE '^\[  SKIPPED \] [^ ]*\.TwoGpus_.* \([0-9]+ ms\)$' "$out/tests/$name.log")
  hiding=$skipped
  if [[ $gpus -lt 2 ]]; then hiding=$((skipped - multi)); fi
  if [[ $rc -eq 0 && $hiding -gt 0 && $gpus -gt 0 ]]; then rc=1; fi
  check "$name" "$rc" "($ran passed, $bad failed, $skipped skipped)"
}
for t in "$bin"/*_test; do test_binary "$(basename "$t")" "" "$t"; done
# linear_test again with the bias in cuBLASLt's epilogue
# (PIPETRAIN_BIAS_EPILOGUE=cublaslt, linear.h BiasEpilogue): every bf16
# parity case with aligned rows then takes that path.
test_binary linear_test_bias_epilogue PIPETRAIN_BIAS_EPILOGUE=cublaslt "$bin/linear_test"

# The issue's one-rank NCCL point, on its own line.
one_rank=$(grep -hE '^\[       OK \] NcclGpuTest\..*OneRank' "$out/tests/nccl_comm_test.log" 2>/dev/null)
check nccl_one_rank "$([[ -n "$one_rank" ]]; echo $?)" "($(echo "$one_rank" | grep -c OK) one-rank cases passed)"

# compare_loss_logs GOT WANT TOL WHAT [SAME]: two loss logs of 20 steps each
# (`up --loss-log`: one loss per line; `train-local --log`, *.jsonl: JSON
# lines, a NaN loss as null), every step within TOL relative, a NaN or Inf
# failing; with SAME, GOT must also equal that log bitwise (run to run).
# Prints the worst difference and what was equal.
compare_loss_logs() {
  py - "$@" <<'PY'
import json, math, sys
got_path, want_path, tol, what = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
same_path = sys.argv[5] if len(sys.argv) > 5 else None
def losses(path):
    if path.endswith(".jsonl"):
        return [math.nan if (v := json.loads(l)["loss"]) is None else v for l in open(path)]
    return [float(l) for l in open(path)]
got, want = losses(got_path), losses(want_path)
# A NaN or Inf anywhere fails (max() would skip a NaN after the first).
def rel(x, y):
    return abs(x - y) / abs(y) if math.isfinite(x) and math.isfinite(y) else math.inf
worst = max((rel(x, y) for x, y in zip(got, want)), default=math.inf)
finite = all(math.isfinite(v) for v in got + want)
ok = len(got) == len(want) == 20 and worst <= tol
line = f"steps {len(got)} vs {len(want)}; max relative |{what}| {worst:.3e}; all finite: {finite}"
if same_path is None:
    line += f"; bitwise: {got == want}"
else:
    same = losses(same_path)
    line += f"; run 1 == run 2: {got == same}"
    ok = ok and got == same
print(line)
sys.exit(0 if ok else 1)
PY
}

# 2. train-local on CUDA against the CPU, 20 steps in fp32 GEMM mode with
# the default attention (auto: the cuBLAS GEMM attention on CUDA), and
# twice on CUDA (bitwise: the logs print floats at round-trip precision).
model=(--layers 2 --d-model 128 --heads 4 --seq-len 64 --batch 16 --micro-batches 4
  --steps 20 --eval-interval 0 --threads 8)
if lim=$(budget 300); then
# The three runs under one limit (each runs even if another failed).
limited -k 5 "$lim" bash -c '
  rc=0
  "$1" train-local "${@:3}" --device cpu --log "$2/train_cpu.jsonl" >"$2/train_cpu.txt" 2>&1 || rc=1
  for run in 1 2; do
    "$1" train-local "${@:3}" --device cuda --log "$2/train_cuda$run.jsonl" \
      >"$2/train_cuda$run.txt" 2>&1 || rc=1
  done
  exit $rc' _ "$bin/pipetrain" "$out" "${model[@]}"
cpu_rc=$?
compare_loss_logs "$out/train_cuda1.jsonl" "$out/train_cpu.jsonl" 1e-4 "cuda - cpu" \
  "$out/train_cuda2.jsonl" >"$out/train_compare.txt" 2>&1
rc=$?
[[ $cpu_rc -ne 0 ]] && rc=1
check train_local_cuda_vs_cpu "$rc" "$(cat "$out/train_compare.txt")"
else out_of_time train_local_cuda_vs_cpu; fi

# 2b. The same on CUDA with the reference attention's row kernels
# (--attention reference, the default before 2026-11-29), against the CPU
# run of 2.
if [[ $(grep -c . "$out/train_cpu.jsonl" 2>/dev/null) != 20 ]]; then
  note "NOT RUN train_local_cuda_reference_attention_vs_cpu: no 20-step CPU reference from step 2"
  failed=1
elif lim=$(budget 150); then
limited -k 5 "$lim" "$bin/pipetrain" train-local "${model[@]}" --device cuda --attention reference \
  --log "$out/train_cuda_reference_attention.jsonl" >"$out/train_cuda_reference_attention.txt" 2>&1
reference_rc=$?
compare_loss_logs "$out/train_cuda_reference_attention.jsonl" "$out/train_cpu.jsonl" 1e-4 \
  "cuda reference attention - cpu" >"$out/train_reference_attention_compare.txt" 2>&1
rc=$?
[[ $reference_rc -ne 0 ]] && rc=1
check train_local_cuda_reference_attention_vs_cpu "$rc" \
  "$(cat "$out/train_reference_attention_compare.txt")"
else out_of_time train_local_cuda_reference_attention_vs_cpu; fi

# cuda_twice_vs_cpu NAME TAG TOL ENV [FLAGS...]: train-local on CUDA twice,
# with the environment ENV (VAR=value, or "" for none) and FLAGS after the
# model's: within TOL of the CPU run of 2 and bitwise run to run (logs
# train_cuda_TAG1.jsonl and 2, the comparison train_TAG_compare.txt).
cuda_twice_vs_cpu() {
  local name=$1 tag=$2 tol=$3 env_var=$4 lim
  shift 4
  if [[ $(grep -c . "$out/train_cpu.jsonl" 2>/dev/null) != 20 ]]; then
    note "NOT RUN $name: no 20-step CPU reference from step 2"
    failed=1
    return
  fi
  lim=$(budget 150) || { out_of_time "$name"; return; }
  limited -k 5 "$lim" bash -c '
    rc=0
    for run in 1 2; do
      env $4 "$1" train-local "${@:5}" --device cuda --log "$2/train_cuda_$3$run.jsonl" \
        >"$2/train_cuda_$3$run.txt" 2>&1 || rc=1
    done
    exit $rc' _ "$bin/pipetrain" "$out" "$tag" "$env_var" "${model[@]}" "$@"
  local train_rc=$? rc
  compare_loss_logs "$out/train_cuda_${tag}1.jsonl" "$out/train_cpu.jsonl" "$tol" "cuda $tag - cpu" \
    "$out/train_cuda_${tag}2.jsonl" >"$out/train_${tag}_compare.txt" 2>&1
  rc=$?
  [[ $train_rc -ne 0 ]] && rc=1
  check "$name" "$rc" "$(cat "$out/train_${tag}_compare.txt")"
}

# 2c. Flash attention (--attention flash, bf16 tensor cores in every GEMM
# mode) with bf16 GEMMs, twice: within 2e-2 of the CPU run of 2 (bf16
# rounding, as cuda_backend_test's bf16 cases) and bitwise run to run; once
# with each kernel (PIPETRAIN_FLASH_KERNEL, flash_attention.h): the WMMA
# kernels (the default; check name without a suffix) and the mma.sync ones.
cuda_twice_vs_cpu train_local_cuda_flash_attention_vs_cpu flash_wmma 2e-2 \
  PIPETRAIN_FLASH_KERNEL=wmma --gemm bf16 --attention flash
cuda_twice_vs_cpu train_local_cuda_flash_mma_attention_vs_cpu flash_mma 2e-2 \
  PIPETRAIN_FLASH_KERNEL=mma --gemm bf16 --attention flash

# 2d. Gradient clipping by the global norm on the device (the sums and the
# scaling, kernels/cuda/multi_tensor.h), fp32 GEMM mode: the CPU once and
# CUDA twice with --grad-clip 0.05, within 1e-4 and bitwise run to run;
# and the clipped CPU run must differ from step 2's unclipped one, or
# clipping never acted (AdamW's updates barely depend on the gradients'
# scale: 1e-4 to 5e-4 relative on the loss by step 5 on the CPU).
if [[ $(grep -c . "$out/train_cpu.jsonl" 2>/dev/null) != 20 ]]; then
  note "NOT RUN train_local_cuda_clipped_vs_cpu: no 20-step CPU reference from step 2"
  failed=1
elif lim=$(budget 150); then
limited -k 5 "$lim" bash -c '
  rc=0
  "$1" train-local "${@:3}" --device cpu --log "$2/train_clip_cpu.jsonl" \
    >"$2/train_clip_cpu.txt" 2>&1 || rc=1
  for run in 1 2; do
    "$1" train-local "${@:3}" --device cuda --log "$2/train_clip_cuda$run.jsonl" \
      >"$2/train_clip_cuda$run.txt" 2>&1 || rc=1
  done
  exit $rc' _ "$bin/pipetrain" "$out" "${model[@]}" --grad-clip 0.05
clip_rc=$?
compare_loss_logs "$out/train_clip_cuda1.jsonl" "$out/train_clip_cpu.jsonl" 1e-4 \
  "cuda - cpu, clipped" "$out/train_clip_cuda2.jsonl" >"$out/train_clip_compare.txt" 2>&1
rc=$?
# Clipping acted, on the CPU and on the device: each clipped run is away
# from its unclipped one by more than the 1e-4 the clipped CUDA run may be
# from the clipped CPU run. A device clip that did nothing (a skipped
# launch, a scale left at 1) would otherwise pass whenever the CPU's clip
# moved the loss by less than that tolerance.
py - "$out/train_clip_cpu.jsonl" "$out/train_cpu.jsonl" "$out/train_clip_cuda1.jsonl" \
  "$out/train_cuda1.jsonl" >>"$out/train_clip_compare.txt" 2>&1 <<'PY'
import json, sys
def losses(path):
    try:
        return [json.loads(l)["loss"] for l in open(path)]
    except (OSError, ValueError, KeyError):
        return []
ok = True
for name, (a, b) in (("cpu", sys.argv[1:3]), ("cuda", sys.argv[3:5])):
    clipped, plain = losses(a), losses(b)
    worst = max((abs(x - y) / abs(y) for x, y in zip(clipped, plain)), default=0.0)
    print(f"clipped - unclipped {name}: max relative {worst:.3e} (clipping acted if above 1e-4)")
    ok = ok and len(clipped) == len(plain) == 20 and worst > 1e-4
sys.exit(0 if ok else 1)
PY
[[ $? -ne 0 || $clip_rc -ne 0 ]] && rc=1
check train_local_cuda_clipped_vs_cpu "$rc" "$(tr '\n' ' ' <"$out/train_clip_compare.txt")"
else out_of_time train_local_cuda_clipped_vs_cpu; fi

# 2e. bf16 GEMMs with the bias in cuBLASLt's epilogue
# (PIPETRAIN_BIAS_EPILOGUE=cublaslt) and the default attention, as 2c.
cuda_twice_vs_cpu train_local_cuda_bias_epilogue_vs_cpu bias_epilogue 2e-2 \
  PIPETRAIN_BIAS_EPILOGUE=cublaslt --gemm bf16
# ...and the epilogue ran (it falls back to the seeded path silently, and
# the comparison above would pass as well): train-local says how many
# products took it.
if [[ -f "$out/train_cuda_bias_epilogue1.txt" ]]; then
  grep -q "device paths: bias epilogue: [1-9]" "$out/train_cuda_bias_epilogue1.txt"
  check bias_epilogue_taken $? "$(grep -h "device paths" "$out/train_cuda_bias_epilogue1.txt")"
fi

# 3. The 2-worker pipeline (two worker processes sharing the GPU) against
# single-process GPU training (one worker process holding every unit; the
# same job spec, so the same data, seed and optimizer), 1e-5 relative.
job=(--layers 2 --d-model 128 --heads 4 --seq-len 64 --batch 16 --micro-batches 4 --steps 20
  --eval-interval 0 --worker-device cuda)
up_rc=0
for workers in 1 2; do
  lim=$(budget 180) || { up_rc=1; note "NOT RUN up --workers $workers (out of time)"; continue; }
  limited -k 20 "$lim" "$bin/pipetrain" up --workers "$workers" "${job[@]}" \
    --loss-log "$out/up_${workers}_losses.txt" \
    --out "$out/up$workers" >"$out/up_$workers.txt" 2>&1 || up_rc=1
  sweep_cluster "$out/up$workers"
done
compare_loss_logs "$out/up_2_losses.txt" "$out/up_1_losses.txt" 1e-5 "2 workers - 1 worker" \
  >"$out/pipeline_compare.txt" 2>&1
rc=$?
[[ $up_rc -ne 0 ]] && rc=1
check pipeline_2_workers_cuda "$rc" "$(cat "$out/pipeline_compare.txt")"
grep -h "computing on" "$out"/up*/worker*.log 2>/dev/null | sort | uniq -c >>"$out/pipeline_compare.txt"

# 3b. Compression on CUDA workers: payloads are made and read on the GPU
# (Backend::EncodeOnDevice/DecodeOnDevice), error feedback's residual and
# PowerSGD's Q kept there (worker/runtime/device_link_encoder.h). The same
# job on CPU workers is the reference; the units' rounding differs slightly
# between the devices (and cuBLAS sums PowerSGD's products in another
# order), so a value near a quantization boundary may take the next level:
# the losses are compared at 1e-2 relative, not bitwise.
#   compressed_job NAME RATIO_PATTERN CODEC_FLAGS...
compressed_job() {
  local name=$1 pattern=$2
  shift 2
  local cjob=(--layers 2 --d-model 128 --heads 4 --seq-len 64 --batch 16 --micro-batches 4
    --steps 20 --eval-interval 0 --workers 2 "$@")
  local up_rc=0 rc device
  for device in cuda cpu; do
    lim=$(budget 180) || { up_rc=1; note "NOT RUN $name on $device (out of time)"; continue; }
    limited -k 20 "$lim" "$bin/pipetrain" up "${cjob[@]}" --worker-device "$device" \
      --loss-log "$out/${name}_${device}_losses.txt" --out "$out/${name}_$device" \
      >"$out/${name}_$device.txt" 2>&1 || up_rc=1
    sweep_cluster "$out/${name}_$device"
  done
  compare_loss_logs "$out/${name}_cuda_losses.txt" "$out/${name}_cpu_losses.txt" 1e-2 \
    "cuda - cpu" >"$out/${name}_compare.txt" 2>&1
  rc=$?
  [[ $up_rc -ne 0 ]] && rc=1
  grep -h "wire" "$out/${name}_cuda.txt" >>"$out/${name}_compare.txt" 2>/dev/null
  grep -q "$pattern" "$out/${name}_cuda.txt" || rc=1
  # The device encoders ran (a link they refuse falls back to the host's
  # silently, and would pass the comparison as well): each stage logs its
  # first payload encoded on the GPU per link.
  grep -h "encodes .* on the device" "$out/${name}_cuda"/worker*.log >>"$out/${name}_compare.txt" 2>/dev/null ||
    { rc=1; echo "no payload was encoded on the device" >>"$out/${name}_compare.txt"; }
  check "$name" "$rc" "$(head -1 "$out/${name}_compare.txt")"
}
compressed_job pipeline_compressed_cuda "ACTIVATION .*(8.0x)" \
  --forward-codec piecewise:bits=3 --backward-codec linear:bits=8
# Optimus-CC's compressed backpropagation: PowerSGD rank 4, lazy error
# propagation, epilogue only (the cool-down sends compressed).
compressed_job pipeline_powersgd_ef_cuda "ACTIVATION_GRAD .*wire" \
  --backward-codec powersgd:rank=4 --error-feedback --epilogue-only

# 3c-3e. NCCL between GPUs: `up` jobs with a GPU per worker
# (--worker-device cuda:each) against the 1-worker job of 3, 1e-5 relative
# (data parallelism adds the replicas' partial sums in another order).
# NCCL refuses two ranks on one GPU, so each needs a GPU per worker.
#   nccl_job NAME GPUS LABEL 'SAID[|SAID...]' UP_FLAGS...: every SAID must
#   appear in the workers' logs (the NCCL paths were taken).
nccl_job() {
  local name=$1 need=$2 label=$3 said=$4 rc up_rc pattern patterns
  shift 4
  if [[ $gpus -lt $need ]]; then
    note "NOT RUN $name: $gpus GPU(s); needs $need"
    return
  fi
  lim=$(budget 180) || { out_of_time "$name"; return; }
  limited -k 20 "$lim" "$bin/pipetrain" up "$@" "${job[@]}" --worker-device cuda:each \
    --loss-log "$out/${name}_losses.txt" --out "$out/$name" >"$out/$name.txt" 2>&1
  up_rc=$?
  sweep_cluster "$out/$name"
  compare_loss_logs "$out/${name}_losses.txt" "$out/up_1_losses.txt" 1e-5 "$label" \
    >"$out/${name}_compare.txt" 2>&1
  rc=$?
  [[ $up_rc -ne 0 ]] && rc=1
  IFS='|' read -ra patterns <<<"$said"
  for pattern in "${patterns[@]}"; do
    grep -h "$pattern" "$out/$name"/worker*.log >>"$out/${name}_compare.txt" 2>/dev/null || rc=1
  done
  check "$name" "$rc" "$(head -1 "$out/${name}_compare.txt")"
}
# 3c. Both stages in one device group (activations GPU to GPU).
nccl_job pipeline_2_workers_nccl 2 "NCCL 2 workers - 1 worker" "go device to device" --workers 2
# 3d. Two replicas of the whole model in a replica device group (their
# gradients summed by ncclAllReduce).
nccl_job data_parallel_2_replicas_nccl 2 "NCCL 2 replicas - 1 worker" \
  "gradient sums run on the device" --workers 2 --data-parallel 2
# 3e. Both at once: two replicas of two stages, each replica's activations
# through its own device group and each stage's gradients through its
# replica device group.
nccl_job data_parallel_2x2_nccl 4 "NCCL 2 replicas x 2 stages - 1 worker" \
  "go device to device|gradient sums run on the device" --workers 4 --data-parallel 2

unset PIPETRAIN_POISON_EMPTY  # the benchmarks measure without it
fi  # mode != bench

# 4. Benchmarks: GPT-2 124M training tokens/s and MFU in fp32, TF32 and bf16
# (H100 SXM spec peaks: 67 TFLOP/s fp32, 494.7 dense TF32, 989.4 dense
# BF16), each against the device's own measured GEMM rate in the same mode;
# the tables are printed too, so they are in the call's output as well.
if [[ "$mode" != quick ]]; then
  gpt2=(--layers 12 --d-model 768 --heads 12 --seq-len 1024 --vocab 50257 --batches 1,4,8
    --steps 3)
  # bench NAME GEMM PEAK [FLAGS...]: one train_step_benchmark run.
  bench() {
    local name=$1 gemm=$2 peak=$3
    shift 3
    local lim
    lim=$(budget 200) || { out_of_time "gpt2_124m_${name}_benchmark"; return; }
    # $operands, when set, picks the bf16 mode's operands (kernels/cuda/linear.h);
    # $flash the flash attention's kernels (kernels/cuda/flash_attention.h).
    limited -k 5 "$lim" env ${operands:+PIPETRAIN_BF16_OPERANDS=$operands} \
      ${flash:+PIPETRAIN_FLASH_KERNEL=$flash} ${epilogue:+PIPETRAIN_BIAS_EPILOGUE=$epilogue} \
      "$bin/train_step_benchmark" "${gpt2[@]}" --device cuda --gemm "$gemm" \
      --peak-tflops "$peak" "$@" --json "$out/bench_$name.json" >"$out/bench_$name.txt" 2>&1
    # With the device paths the run took (the bias epilogue's products):
    # an epilogue row whose count is 0 measured the seeded path.
    check "gpt2_124m_${name}_benchmark" $? "$(grep -E '^ +[0-9]' "$out/bench_$name.txt" |
      tail -1)$(grep -h '^# device paths' "$out/bench_$name.txt" | sed 's/^#/;/')"
  }
  # The default attention (auto: cuBLAS batched GEMMs on CUDA). bf16 first,
  # so the issue's row comes first if time runs short; bf16 tensor-core
  # GEMMs (--gemm bf16; H100/H200 SXM dense BF16 peak 989.4 TFLOP/s).
  operands= flash= epilogue=
  bench bf16 bf16 989.4
  # Flash attention (--attention flash; its parity tests are
  # flash_attention_test and cuda_backend_test's FlashAttention cases):
  # the mma.sync kernels, the candidate to replace the GEMM attention, then
  # the WMMA ones.
  flash=mma
  bench bf16_flash_mma_attention bf16 989.4 --attention flash
  flash=
  # The bias in cuBLASLt's epilogue instead of a seeding pass (linear.h
  # BiasEpilogue; about 3 GB less traffic a step, estimated).
  epilogue=cublaslt
  bench bf16_bias_epilogue bf16 989.4
  # Both candidates for the default at once (what the step would be if both
  # rows above win), then with llm.c's clipping too: the step the issue's
  # 235,000 tokens/s goal compares with.
  flash=mma
  bench bf16_mma_epilogue bf16 989.4 --attention flash
  bench bf16_mma_epilogue_clip bf16 989.4 --attention flash --grad-clip 1
  flash= epilogue=
  # GPT-2's clipping to global norm 1 each step, as llm.c's step does: the
  # norm and the scaling on the device (kernels/cuda/multi_tensor.h).
  bench bf16_grad_clip bf16 989.4 --grad-clip 1
  bench bf16_flash_attention bf16 989.4 --attention flash
  bench tf32 tf32 494.7
  bench fp32 fp32 67
  # The bf16 operand choices besides the default (the LM head's products
  # run over a padded vocabulary since 8ecb4ca, so padded copies should no
  # longer matter), then the reference row kernels once (8.8x slower a
  # step on an H200).
  for operands in padded-copies copies cublas; do bench "bf16_${operands//-/_}" bf16 989.4; done
  operands=
  bench bf16_reference_attention bf16 989.4 --attention reference
  cat "$out"/bench_*.txt
fi
finish
