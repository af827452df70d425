#!/bin/bash
# End-to-end checks of `pipetrain train-local` through the real binary:
# every bad flag or flag combination exits 2 and every bad input file exits 1,
# each with a message on stderr that names the problem and without crashing;
# a tiny run succeeds, writes its log and files, and resumes from its
# checkpoint. Prints "N passed, M failed" and fails if any case failed.
set -u

source "$(dirname "$0")/cli_test_lib.sh"

# A model small enough that any case which reaches training ends at once.
TINY_MODEL=(--steps 1 --layers 1 --d-model 32 --heads 2 --seq-len 16 --batch 2)
# And its generated text (with --data, --synthetic-bytes is refused).
TINY=("${TINY_MODEL[@]}" --synthetic-bytes 20000)

# --- Flags and flag combinations: exit 2 --------------------------------------
expect_exit heads_not_dividing 2 "--heads (3) must divide --d-model (128)" -- \
  train-local --heads 3 --d-model 128
expect_exit micro_batches_not_dividing 2 "train-local: --micro-batches: 3 must be >= 1 and divide --batch 8" -- \
  train-local --batch 8 --micro-batches 3
expect_exit seq_len_zero 2 "--seq-len must be >= 1, got 0" -- train-local --seq-len 0
expect_exit format_bogus 2 'unknown data format "bogus"' -- train-local --format bogus
# Flags for the other source of tokens were silently ignored.
expect_exit format_without_data 2 "--format uint16 reads a --data file; without --data the text is generated" -- \
  train-local --format uint16
echo "a little text to train on" >"$TMP/tiny-corpus.txt"
expect_exit synthetic_bytes_with_data 2 "--synthetic-bytes sizes generated text, and has no effect with --data" -- \
  train-local --data "$TMP/tiny-corpus.txt" --synthetic-bytes 5000
# --min-lr floors the cosine schedule: with the constant one it was ignored.
expect_exit min_lr_constant 2 "--min-lr is the cosine schedule's floor" -- \
  train-local --lr 1e-3 --min-lr 1e-4
expect_exit steps_negative 2 "steps: must be >= 0, got -1" -- train-local --steps -1
expect_exit lr_zero 2 "lr: must be > 0 and finite, got 0" -- train-local --lr 0
expect_exit lr_nan 2 "--lr: cannot parse 'nan'" -- train-local --lr nan
expect_exit steps_fraction 2 "--steps: cannot parse '1.5'" -- train-local --steps 1.5
expect_exit beta1_one 2 "beta1: must be in [0, 1), got 1" -- train-local --beta1 1
expect_exit decay_bogus 2 "weight decay policy" "got 'bogus'" -- train-local --decay bogus
expect_exit unknown_flag 2 "unknown flag --frobnicate" -- train-local --frobnicate 3
expect_exit missing_value 2 "--steps needs a value" -- train-local --steps
expect_exit positional 2 "unexpected argument 'extra'" -- train-local extra
mkdir -p "$TMP/a-dir"
expect_exit save_is_a_directory 2 "--save $TMP/a-dir is a directory; name a file" -- \
  train-local "${TINY[@]}" --save "$TMP/a-dir"
# A corpus too short for one window: the message starts with its path.
printf 'tiny' > "$TMP/tiny.txt"
expect_exit data_too_short 1 "$TMP/tiny.txt: train split has" -- \
  train-local "${TINY_MODEL[@]}" --data "$TMP/tiny.txt" --val-fraction 0
# An output that is one of the run's inputs is refused before training.
printf 'some text to train on, long enough for a window or two.' > "$TMP/book.txt"
expect_exit save_over_data 2 "--save $TMP/book.txt is --data $TMP/book.txt" -- \
  train-local "${TINY_MODEL[@]}" --data "$TMP/book.txt" --save "$TMP/book.txt"
if grep -q 'some text' "$TMP/book.txt"; then
  passed=$((passed + 1))
else
  fail save_over_data_untouched "the corpus was overwritten"
fi
# Outputs renamed into place: never over a device, FIFO or socket (as root,
# /dev/null itself would become a file), and never two outputs in one file.
mkfifo "$TMP/out.fifo"
expect_exit save_over_fifo 2 "--save $TMP/out.fifo is not a regular file" -- \
  train-local "${TINY[@]}" --save "$TMP/out.fifo"
expect_exit checkpoint_over_fifo 2 "--checkpoint $TMP/out.fifo is not a regular file" -- \
  train-local "${TINY[@]}" --checkpoint "$TMP/out.fifo"
if [[ -p "$TMP/out.fifo" ]]; then passed=$((passed + 1)); else fail fifo_kept "the FIFO was replaced"; fi
# A --log FIFO nobody reads is the command line's mistake, refused with the
# other outputs' checks: before, only once the data and the model were
# loaded (minutes for a large run), with exit 1.
expect_exit log_fifo_no_reader 2 \
  "train-local: --log $TMP/out.fifo is a FIFO with no reader; start its reader first" -- \
  train-local "${TINY[@]}" --log "$TMP/out.fifo"
if grep -q "^data:" "$ERR"; then
  fail log_fifo_no_reader_before_data "the data was loaded first"
else
  passed=$((passed + 1))
fi
expect_exit save_is_checkpoint 2 "--checkpoint $TMP/same.st is also --save $TMP/same.st; each output needs its own file" -- \
  train-local "${TINY[@]}" --save "$TMP/same.st" --checkpoint "$TMP/same.st"
expect_exit save_is_log 2 "--log $TMP/./same.st is also --save $TMP/same.st" -- \
  train-local "${TINY[@]}" --save "$TMP/same.st" --log "$TMP/./same.st"
if [[ -e "$TMP/same.st" ]]; then fail same_output_nothing_written "$TMP/same.st written"; else passed=$((passed + 1)); fi
# More threads than OpenBLAS runs: said, not silently fewer.
expect_exit threads_capped 0 "--threads 100000: OpenBLAS runs" "threads, its most" -- \
  train-local "${TINY[@]}" --threads 100000
expect_exit init_from_and_resume 2 "use either --init-from or --resume, not both" -- \
  train-local --init-from "$TMP/a.safetensors" --resume "$TMP/b.ckpt"
expect_exit eval_without_val 2 "--eval-interval needs --val-fraction > 0" -- \
  train-local --eval-interval 10 --val-fraction 0
expect_exit small_vocab_without_data 2 "--vocab must be >= 256" -- train-local --vocab 100
expect_exit device_bogus 2 "--device must be auto, cpu, cuda or cuda:N" "got 'gpu'" -- \
  train-local --device gpu
expect_exit gemm_bogus 2 "--gemm must be fp32, tf32 or bf16, got 'fp8'" -- train-local --gemm fp8
expect_exit tf32_on_cpu 2 "--gemm tf32 needs a CUDA device" -- train-local --device cpu --gemm tf32
expect_exit bf16_on_cpu 2 "--gemm bf16 needs a CUDA device" -- train-local --device cpu --gemm bf16
# auto is the CPU where no CUDA device is visible (none here, whatever the
# host has): the same usage error, before any data is read.
CUDA_VISIBLE_DEVICES= expect_exit bf16_auto_without_gpu 2 "--gemm bf16 needs a CUDA device" \
  "--device auto is the CPU here" -- train-local --device auto --gemm bf16
# The job spec's limits (docs/operations.md "Bounds"): refused before anything is
# allocated, not a CHECK or bad_alloc once the model is built.
expect_exit d_model_over_limit 2 "--d-model 1000000 is over the limit of 16384" -- \
  train-local --d-model 1000000
expect_exit vocab_over_limit 2 "--vocab 2000000000 is over the limit of 65536" -- \
  train-local --vocab 2000000000
expect_exit batch_over_limit 2 "--batch 2000000000 is over the limit of 65536" -- \
  train-local --batch 2000000000
expect_exit synthetic_over_limit 2 "--synthetic-bytes 100000000000 is over the limit" -- \
  train-local --synthetic-bytes 100000000000
expect_exit parameters_over_limit 2 "parameters, over the limit of 4294967296" -- \
  train-local --layers 256 --d-model 16384 --heads 16
# Output paths are checked before training, not after it.
expect_exit save_dir_missing 2 "--save $TMP/no-such-dir/w.safetensors: the directory" \
  "does not exist" -- train-local "${TINY[@]}" --save "$TMP/no-such-dir/w.safetensors"
expect_exit checkpoint_dir_missing 2 "--checkpoint $TMP/no-such-dir/ck" -- \
  train-local "${TINY[@]}" --checkpoint "$TMP/no-such-dir/ck"

# --- Data files: exit 1 ---------------------------------------------------------
# llm.c header words, little-endian: magic 20240520 = 0x0134D888, version 1.
MAGIC='\210\330\064\001'
V1='\001\000\000\000'
# write_header FILE MAGIC VERSION COUNT TOKENS: 1024-byte header, then TOKENS
# copies of the uint16 token 1.
write_header() {
  {
    printf "$2$3$4"
    head -c 1012 /dev/zero
    local i
    for ((i = 0; i < $5; i++)); do printf '\001\000'; done
  } >"$1"
}

expect_exit missing_file 1 "$TMP/missing.txt" "cannot open token file" -- \
  train-local "${TINY_MODEL[@]}" --data "$TMP/missing.txt"

: >"$TMP/empty.txt"
expect_exit empty_file 1 "$TMP/empty.txt" "token file is empty" -- \
  train-local "${TINY_MODEL[@]}" --data "$TMP/empty.txt"

write_header "$TMP/bad_magic.bin" '\071\060\000\000' "$V1" '\144\000\000\000' 100
expect_exit bad_magic 1 "bad magic: found 12345, expected 20240520" -- \
  train-local "${TINY_MODEL[@]}" --data "$TMP/bad_magic.bin" --format uint16-header

write_header "$TMP/version2.bin" "$MAGIC" '\002\000\000\000' '\144\000\000\000' 100
expect_exit header_version_2 1 "$TMP/version2.bin" "unsupported version 2" -- \
  train-local "${TINY_MODEL[@]}" --data "$TMP/version2.bin"

# The header announces 1000 tokens (0x03E8); 100 follow.
write_header "$TMP/truncated.bin" "$MAGIC" "$V1" '\350\003\000\000' 100
expect_exit header_truncated 1 "truncated: header says 1000 tokens, file holds 100" -- \
  train-local "${TINY_MODEL[@]}" --data "$TMP/truncated.bin" --format uint16-header

# A file past a third of this process's memory (a sparse 4 TiB one) is
# refused before its buffer is allocated, not a crash on a failed
# allocation or a kill by the kernel.
truncate -s 4T "$TMP/huge.bin"
expect_exit huge_file 1 "$TMP/huge.bin: 4398046511104 bytes exceeds the limit of" \
  "a third of this process's memory limit" -- \
  train-local "${TINY_MODEL[@]}" --data "$TMP/huge.bin" --format uint16
rm -f "$TMP/huge.bin"

{ for ((i = 0; i < 100; i++)); do printf '\001\000'; done; printf '\001'; } >"$TMP/odd.bin"
expect_exit raw_odd_size 1 "odd size of 201 bytes" -- \
  train-local "${TINY_MODEL[@]}" --data "$TMP/odd.bin" --format uint16

# 200 tokens of id 1 except id 300 (0x012C) at position 100.
{
  for ((i = 0; i < 200; i++)); do
    if [[ $i -eq 100 ]]; then printf '\054\001'; else printf '\001\000'; fi
  done
} >"$TMP/big_id.bin"
expect_exit token_beyond_vocab 1 "token at position 100 has id 300" "vocab size 256" -- \
  train-local "${TINY_MODEL[@]}" --data "$TMP/big_id.bin" --format uint16 --vocab 256

printf '0123456789' >"$TMP/small.txt"
expect_exit file_too_small 1 "need at least seq_len + 1 = 65" -- \
  train-local "${TINY_MODEL[@]}" --data "$TMP/small.txt" --seq-len 64

printf 'these are not safetensors bytes at all, just some text\n' >"$TMP/not.safetensors"
expect_exit init_from_not_safetensors 1 "$TMP/not.safetensors" "not a safetensors file" -- \
  train-local "${TINY[@]}" --init-from "$TMP/not.safetensors"

# Weights of a 256-token vocabulary start a model whose vocabulary is
# padded (for tensor ranks) to 258: the file's rows, then zeros. A file
# with more rows than the model is refused, naming both shapes.
expect_exit save_for_padding 0 -- train-local "${TINY[@]}" --save "$TMP/v256.safetensors"
expect_exit init_from_padded_vocab 0 "initialised from $TMP/v256.safetensors (" -- \
  train-local "${TINY[@]}" --vocab 258 --init-from "$TMP/v256.safetensors"
expect_exit save_padded 0 -- train-local "${TINY[@]}" --vocab 258 --save "$TMP/v258.safetensors"
expect_exit init_from_larger_vocab 1 "tensor 'wte.weight' has shape [258, 32] but the model expects [256, 32]" -- \
  train-local "${TINY[@]}" --init-from "$TMP/v258.safetensors"

expect_exit resume_missing 1 "NOT_FOUND" "$TMP/missing.ckpt" -- \
  train-local "${TINY[@]}" --resume "$TMP/missing.ckpt"

# A learning rate that blows the weights up: the run stops at the first
# non-finite loss, exit 1, and writes no --checkpoint of the broken weights.
expect_exit diverged 1 "training diverged: the loss of step" "is nan" -- \
  train-local "${TINY[@]}" --lr 1e30 --steps 20 --checkpoint "$TMP/diverged.ckpt"
if [[ -e "$TMP/diverged.ckpt" ]]; then
  fail diverged_no_checkpoint "a diverged run wrote its --checkpoint"
else
  passed=$((passed + 1))
fi
# Step 1's loss is finite (it came before the update that broke the
# weights), its validation pass's is not: the run stops there, as the
# coordinator fails a job, not a step later on the training loss.
expect_exit diverged_validation 1 "the validation loss: training diverged: the loss of step 1 " -- \
  train-local "${TINY[@]}" --lr 1e30 --steps 20 --eval-interval 1

# This test runs the plain build (no --config=cuda): --device cuda says how
# to get CUDA, with the other flags' checks (exit 2, as up's --worker-device
# cuda; it was 1), and auto trains on the CPU.
expect_exit cuda_without_cuda_build 2 \
  "train-local: --device cuda: this binary was built without CUDA (rebuild with --config=cuda)" -- \
  train-local "${TINY[@]}" --device cuda
expect_exit cuda_n_without_cuda_build 2 "--device cuda:3: this binary was built without CUDA" -- \
  train-local "${TINY[@]}" --device cuda:3
expect_exit auto_is_cpu_here 0 "device cpu;" -- train-local "${TINY[@]}" --device auto
# up checks its workers' device flags before starting anything; cuda:each
# (a GPU per worker, for NCCL device groups) needs GPUs this process sees.
expect_exit up_each_gpu_without_cuda 2 "--worker-device cuda:each: no CUDA device visible" \
  "built without CUDA" -- up --out "$TMP/up-each" --worker-device cuda:each
expect_exit up_worker_device_bogus 2 "--worker-device/--worker-gemm" "got 'gpu'" -- \
  up --out "$TMP/up-bogus" --worker-device gpu
# --data-parallel takes a replica count or auto (the planner's choice), not 0.
expect_exit up_data_parallel_zero 2 "--data-parallel: cannot parse '0' (want a count >= 1 or auto)" -- \
  up --out "$TMP/up-dp0" --data-parallel 0
# --tensor-parallel auto searches T within an auto layout only.
expect_exit up_tensor_auto_needs_data_auto 2 "--tensor-parallel auto needs --data-parallel auto" -- \
  up --out "$TMP/up-tp-auto" --tensor-parallel auto
expect_exit up_tensor_parallel_zero 2 "--tensor-parallel: cannot parse '0'" -- \
  up --out "$TMP/up-tp0" --tensor-parallel 0
# GEMM attention is a CUDA backend's: refused for CPU workers and train-local.
expect_exit up_worker_attention_on_cpu 2 "--worker-attention" "needs a CUDA device" -- \
  up --out "$TMP/up-attention" --worker-device cpu --worker-attention gemm
# up's clipping and schedule flags go to spec.training, checked before
# anything starts; the message names up's flags, not the spec's fields.
expect_exit up_lr_schedule_bad 2 "up: INVALID_ARGUMENT: --lr-schedule: unknown schedule \"linear\"" -- \
  up --out "$TMP/up-schedule" --lr-schedule linear
expect_exit up_warmup_too_long 2 "--warmup-steps: must be in [0, --steps 10]" -- \
  up --out "$TMP/up-warmup" --steps 10 --warmup-steps 11
# auto is the CPU where up sees no GPU (this build has no CUDA): refused
# before any worker starts, saying why.
expect_exit up_worker_flash_auto_cpu 2 "--worker-device auto is the CPU here" \
  "--attention flash needs a CUDA device" -- up --out "$TMP/up-flash" --worker-attention flash
expect_exit attention_on_cpu 2 "--attention gemm needs a CUDA device" -- \
  train-local "${TINY[@]}" --attention gemm

# --- The command itself ---------------------------------------------------------
expect_exit no_args 2 "usage: pipetrain" --
expect_exit unknown_command 2 "unknown command 'frobnicate'" -- frobnicate

expect_exit help 0 -- train-local --help
if grep -qF -- "--micro-batches" "$OUT"; then
  passed=$((passed + 1))
else
  fail help_lists_flags "--help output lacks --micro-batches"
fi

# --- A --log that cannot be written ------------------------------------------------
# Its disk full (/dev/full), or its reader gone: the run stops at that step
# as an interrupt would, and still writes --checkpoint and --save; the
# failure is the exit code. Before, the error ended the run with neither.
rm -f "$TMP/full.ckpt" "$TMP/full.safetensors"
expect_exit log_write_fails 1 "cannot write the --log file /dev/full (No space left on device) at step 1; training stopped there" \
  "(--checkpoint and --save are written)" -- \
  train-local --layers 1 --d-model 32 --heads 2 --seq-len 16 --batch 2 --synthetic-bytes 20000 \
  --steps 3 --log /dev/full --checkpoint "$TMP/full.ckpt" --save "$TMP/full.safetensors"
for f in "$TMP/full.ckpt" "$TMP/full.safetensors"; do
  if [[ -s "$f" ]]; then
    passed=$((passed + 1))
  else
    fail log_write_fails_outputs "$f is missing or empty"
  fi
done
# --save is Hugging Face GPT-2 weights: its header carries the metadata the
# Hub's own file does, {"format": "pt"}, which older transformers loaders
# require.
if head -c 4096 "$TMP/full.safetensors" | grep -a -q '"__metadata__":{"format":"pt"}'; then
  passed=$((passed + 1))
else
  fail save_hf_metadata "$TMP/full.safetensors has no __metadata__ {\"format\":\"pt\"}"
fi
# The message names only the outputs that were asked for.
expect_exit log_write_fails_save_only 1 "training stopped there, as an interrupt would (--save is written)" -- \
  train-local --layers 1 --d-model 32 --heads 2 --seq-len 16 --batch 2 --synthetic-bytes 20000 \
  --steps 3 --log /dev/full --save "$TMP/full.safetensors"

# --- Temporaries a killed run left --------------------------------------------------
# A run killed mid-write (SIGKILL past a grace period) leaves "<file>.tmp.*"
# of up to the checkpoint's size, which the next run to that file removes,
# saying so; a name that only starts alike stays.
echo "half a checkpoint" > "$TMP/killed.ckpt.tmp.4000000.7"
echo "half the weights" > "$TMP/killed.safetensors.tmp.4000001.2"
echo "not ours" > "$TMP/killed.ckpt.tmpfile"
expect_exit killed_run_temporaries 0 \
  "removed $TMP/killed.ckpt.tmp.4000000.7, left by a run killed while writing $TMP/killed.ckpt" \
  "removed $TMP/killed.safetensors.tmp.4000001.2, left by a run killed while writing $TMP/killed.safetensors" -- \
  train-local "${TINY[@]}" --checkpoint "$TMP/killed.ckpt" --save "$TMP/killed.safetensors"
if [[ ! -e "$TMP/killed.ckpt.tmp.4000000.7" && ! -e "$TMP/killed.safetensors.tmp.4000001.2" &&
      -e "$TMP/killed.ckpt.tmpfile" ]]; then
  passed=$((passed + 1))
else
  fail killed_run_temporaries_removed "$(ls "$TMP" | grep killed)"
fi

# --- A --checkpoint-interval write that fails -------------------------------------
# Files past 150 KiB refused (EFBIG; SIGXFSZ ignored): the checkpoint
# (~260 KB) cannot be written, the weights (~90 KB) can. The run stops at
# the first interval's failure as an interrupt would, and --save is still
# written; the failure is the exit code. Before, it ended with no --save.
cat >"$TMP/small_files.sh" <<EOF
#!/bin/bash
trap '' XFSZ
ulimit -f 150
exec "$BIN" "\$@"
EOF
chmod +x "$TMP/small_files.sh"
rm -f "$TMP/big.ckpt" "$TMP/fits.safetensors"
BIN="$TMP/small_files.sh" expect_exit checkpoint_interval_write_fails 1 \
  "at step 1; training stopped there, as an interrupt would (--save is written); --checkpoint not written either: " -- \
  train-local --layers 1 --d-model 32 --heads 2 --seq-len 16 --batch 2 --synthetic-bytes 20000 \
  --steps 3 --checkpoint "$TMP/big.ckpt" --checkpoint-interval 1 --save "$TMP/fits.safetensors"
if [[ -s "$TMP/fits.safetensors" && ! -e "$TMP/big.ckpt" ]]; then
  passed=$((passed + 1))
else
  fail checkpoint_interval_write_fails_outputs "want $TMP/fits.safetensors written, no $TMP/big.ckpt"
fi

# --- A tiny run, then a resume --------------------------------------------------
LOG="$TMP/log.jsonl"
RUN=(train-local --layers 1 --d-model 32 --heads 2 --seq-len 16 --batch 2
     --synthetic-bytes 20000 --log "$LOG" --checkpoint "$TMP/c.ckpt")
rm -f "$LOG" "$TMP/w.safetensors" "$TMP/c.ckpt"

expect_exit train_3_steps 0 -- "${RUN[@]}" --steps 3 --save "$TMP/w.safetensors"
if grep -qF "final: step 3" "$OUT"; then
  passed=$((passed + 1))
else
  fail train_final_line "stdout lacks 'final: step 3'"
fi

# check_log NAME LINES: the log has LINES lines, each a JSON object with every
# field, and line k reports step k.
check_log() {
  local name="$1" want="$2" lines
  lines=$(wc -l <"$LOG" 2>/dev/null || echo 0)
  if [[ $lines -ne $want ]]; then
    fail "$name" "log has $lines lines, want $want"
    return
  fi
  local k line key
  for ((k = 1; k <= want; k++)); do
    line=$(sed -n "${k}p" "$LOG")
    for key in "\"step\":$k," '"loss":' '"val_loss":' '"tokens_per_second":'; do
      if [[ "$line" != "{"*"}" || "$line" != *"$key"* ]]; then
        fail "$name" "log line $k lacks $key: $line"
        return
      fi
    done
  done
  passed=$((passed + 1))
}
check_log train_log_3_lines 3

for f in "$TMP/w.safetensors" "$TMP/c.ckpt"; do
  if [[ -s "$f" ]]; then
    passed=$((passed + 1))
  else
    fail train_outputs "$f is missing or empty"
  fi
done

expect_exit resume_to_5 0 "resumed from $TMP/c.ckpt at step 3" -- \
  "${RUN[@]}" --steps 5 --resume "$TMP/c.ckpt"
check_log resume_log_5_lines 5
# The resumed steps are the uninterrupted run's: the losses of steps 4 and
# 5 equal those of a straight 5-step run (a resume that restarted from
# fresh weights would print the message and differ here).
STRAIGHT="$TMP/straight.jsonl"
rm -f "$STRAIGHT"
expect_exit straight_5 0 -- train-local --layers 1 --d-model 32 --heads 2 --seq-len 16 --batch 2 \
  --synthetic-bytes 20000 --log "$STRAIGHT" --steps 5
resumed=$(sed -n '4,5p' "$LOG" | grep -o '"loss":[^,]*')
straight=$(sed -n '4,5p' "$STRAIGHT" | grep -o '"loss":[^,]*')
if [[ $(wc -l <<<"$resumed") -eq 2 && -n "$resumed" && "$resumed" == "$straight" ]]; then
  passed=$((passed + 1))
else
  fail resume_equals_straight "resumed losses [$resumed] differ from the straight run's [$straight]"
fi
# --steps counts from the start: a checkpoint already there trains nothing,
# and says so.
expect_exit resume_past_steps 0 "nothing to train: the checkpoint is at step 5, and --steps 4" -- \
  "${RUN[@]}" --steps 4 --resume "$TMP/c.ckpt"
# Having trained nothing, it leaves --checkpoint as it was (not rewritten
# under this run's settings), and says so.
before=$(sha256sum <"$TMP/c.ckpt")
expect_exit resume_past_steps_checkpoint_kept 0 \
  "no step trained in this run: --checkpoint $TMP/c.ckpt left as it was" -- \
  "${RUN[@]}" --steps 4 --resume "$TMP/c.ckpt" --checkpoint "$TMP/c.ckpt"
if [[ "$(sha256sum <"$TMP/c.ckpt")" == "$before" ]]; then
  passed=$((passed + 1))
else
  fail resume_past_steps_checkpoint_unchanged "c.ckpt was rewritten"
fi
# Another learning rate may be asked for on resume, and the run says that
# the steps from there are not the checkpoint's run's (--checkpoint is
# dropped: c.ckpt stays the 5-step run's).
expect_exit resume_other_lr 0 "warning: this run's updates differ from the checkpoint's run" \
  "--lr 0.0001 (the checkpoint's run had 0.0003)" -- \
  train-local --layers 1 --d-model 32 --heads 2 --seq-len 16 --batch 2 --synthetic-bytes 20000 \
  --steps 6 --lr 1e-4 --resume "$TMP/c.ckpt"

# A --log that a full disk left with a torn last line (a run stopped by
# ENOSPC can write part of a record, with no newline): a run appending to it
# starts a line of its own, so every line but the torn one, kept as it was,
# parses as JSON. Its first record was glued to the torn one before.
TORN="$TMP/torn.jsonl"
printf '{"step": 3, "lo' >"$TORN"
expect_exit torn_log_appended 0 -- train-local "${TINY[@]}" --log "$TORN"
if python3 - "$TORN" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().split("\n")
assert len(lines) == 3 and lines[0] == '{"step": 3, "lo' and lines[2] == "", lines
assert json.loads(lines[1])["step"] == 1, lines
PY
then
  passed=$((passed + 1))
else
  fail torn_log_line_kept_apart "$TORN holds: $(cat "$TORN")"
fi

# --grad-clip has the job spec's bound (spec.training.grad_clip).
expect_exit grad_clip_over_limit 2 "--grad-clip 1e+07 is over the limit of 1e+06" -- \
  train-local --grad-clip 1e7

# A micro-batch whose logits would pass 2^31 elements (cuBLAS and the
# kernels' launches take int sizes) is refused naming the flag: --seq-len,
# as a micro-batch is already one sequence.
expect_exit logits_past_int 2 "--seq-len: one sequence of 32768 tokens needs a tensor of 2147483648 elements (the logits)" -- \
  train-local --vocab 65536 --seq-len 32768 --batch 1 --layers 1 --d-model 16 --heads 2

# What ProcessMemoryLimit (worker/agent/device_info.cc) finds, in bytes:
# the least of MemTotal and the first memory limit of this process's
# cgroups (v2 memory.max; v1 memory.limit_in_bytes below 2^60), read from
# its own cgroup's file, else the one at the top of the mount.
process_memory_limit() {
  local limit id controllers path own top value
  limit=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) * 1024 ))
  while IFS=: read -r id controllers path; do
    if [[ $id == 0 && -z $controllers ]]; then
      own=/sys/fs/cgroup$path/memory.max top=/sys/fs/cgroup/memory.max
    elif [[ $controllers == *memory* ]]; then
      own=/sys/fs/cgroup/memory$path/memory.limit_in_bytes
      top=/sys/fs/cgroup/memory/memory.limit_in_bytes
    else
      continue
    fi
    [[ -e $own ]] || own=$top
    value=$(head -n 1 "$own" 2>/dev/null)
    [[ $value =~ ^[0-9]+$ ]] && (( value > 0 && value < (1 << 60) )) || continue
    (( value < limit )) && limit=$value
    break
  done </proc/self/cgroup
  echo "$limit"
}

# A micro-batch whose activations kept for the backward pass this process's
# memory is refused before the data is read, naming the flags that shrink
# it; it was a CHECK on a failed allocation or the OOM killer (exit >= 128)
# once the data was read. The attention's probabilities alone are
# 2 x 16 x 4096^2 floats a layer, 512 GiB over 256 layers, about 547 GiB
# with the rest and the weights: a process that may use more than 512 GiB
# might fit it and start a step that takes all of it, so the case is
# skipped there (train_config_test pins the check's arithmetic).
if (( $(process_memory_limit) > 512 * (1 << 30) )); then
  echo "activations_past_memory skipped: this process may use more than 512 GiB" >&2
else
  expect_exit activations_past_memory 2 "GiB of activations for its backward" "--batch" \
    "--micro-batches" "--seq-len" -- \
    train-local --layers 256 --d-model 256 --heads 16 --seq-len 4096 --batch 2 --steps 1
fi

# SIGTERM (a supervisor, a preempted batch job) stops the run as Ctrl-C
# does: after the current step, with --checkpoint written, and exits 143
# (128 + SIGTERM), as a shell reports a process that signal ended. It
# killed the run outright before, with no checkpoint.
# stop_by_signal NAME SIGNAL EXIT: a long run with --checkpoint every step,
# signalled once its first checkpoint is written ($TMP/NAME.{ckpt,out,err}),
# must exit EXIT saying it wrote the checkpoint.
stop_by_signal() {
  local name=$1 signal=$2 want=$3 pid rc
  rm -f "$TMP/$name.ckpt"
  "$BIN" train-local "${TINY[@]}" --steps 1000000 --checkpoint "$TMP/$name.ckpt" \
    --checkpoint-interval 1 >"$TMP/$name.out" 2>"$TMP/$name.err" &
  pid=$!
  for _ in $(seq 1 1200); do [[ -s "$TMP/$name.ckpt" ]] && break; sleep 0.05; done
  kill "-$signal" "$pid"
  wait "$pid"
  rc=$?
  if [[ $rc -eq $want ]] && grep -q "interrupted (SIG$signal); checkpoint written" "$TMP/$name.err"; then
    passed=$((passed + 1))
  else
    cp "$TMP/$name.err" "$ERR"
    fail "sig${signal,,}_exit_${want}_checkpoint_written" "exit $rc"
  fi
}
stop_by_signal term TERM 143
# A terminal's hangup (an ssh session lost) stops it the same way: 129.
stop_by_signal hup HUP 129
# And without a last validation pass (tens of seconds for a large model
# after the signal that asked to stop).
if grep -q "^final: step" "$TMP/term.out" && ! grep -q "val_loss" "$TMP/term.out"; then
  passed=$((passed + 1))
else
  cp "$TMP/term.out" "$ERR"
  fail sigterm_no_final_validation "stdout: $(tail -n 2 "$TMP/term.out")"
fi
# The checkpoint loads, and holds at least the step it was awaited for.
expect_exit sigterm_checkpoint_loads 0 "nothing to train: the checkpoint is at step" -- \
  train-local "${TINY[@]}" --resume "$TMP/term.ckpt" --steps 1

# fill_fifo FIFO: writes to FIFO, whose reader (held by this shell) never
# reads, until it takes not one byte more: the next write of a run waits.
fill_fifo() {
  python3 - "$1" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK)
for size in (1 << 16, 1):  # whole pages, then the last one's tail
    try:
        while True:
            os.write(fd, b"x" * size)
    except BlockingIOError:
        pass
PY
}
# await_exit PID SECONDS: waits up to SECONDS (polled) for PID to end and
# sets rc to its exit status, or kills it and sets rc to 124.
await_exit() {
  local pid=$1
  for _ in $(seq 1 $(($2 * 20))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid"
    wait "$pid"
    rc=124
  else
    wait "$pid"
    rc=$?
  fi
}
# await_line FILE PATTERN: up to 60 s (polled) for a line of FILE to match.
await_line() {
  for _ in $(seq 1 1200); do grep -q -- "$2" "$1" && return 0; sleep 0.05; done
  return 1
}

# A --log FIFO or pipe whose reader stops reading (a stalled plotter): once
# the pipe was full, the run waited in write(2) for ever, SIGTERM and Ctrl-C
# did nothing, and --checkpoint was never written. Its record is dropped
# now, the run saying so, and it stops as on any signal. The pipe is full
# before the first record here, which the signal finds waiting.
mkfifo "$TMP/stalled.fifo"
exec 3<>"$TMP/stalled.fifo"
fill_fifo "$TMP/stalled.fifo"
"$BIN" train-local "${TINY[@]}" --steps 1000000 --log "$TMP/stalled.fifo" \
  --checkpoint "$TMP/stalled.ckpt" >"$TMP/stalled.out" 2>"$TMP/stalled.err" &
pid=$!
await_line "$TMP/stalled.err" "^step 1/"
kill -TERM "$pid"
await_exit "$pid" 20
exec 3<&-
if [[ $rc -eq 143 && -s "$TMP/stalled.ckpt" ]] &&
    grep -q "interrupted (SIGTERM); checkpoint written" "$TMP/stalled.err" &&
    grep -q -- "--log $TMP/stalled.fifo: the record of step 1 dropped" "$TMP/stalled.err"; then
  passed=$((passed + 1))
else
  cp "$TMP/stalled.err" "$ERR"
  fail sigterm_past_stalled_log_fifo "exit $rc (124: still running 20 s after SIGTERM)"
fi

# A --log FIFO whose reader runs (`cat run.fifo &`) gets every record: the
# write end opened with the flags' checks is the one written through. Closed
# and opened again, the reader (here opened first, without waiting for a
# writer) would read EOF in between, and go.
mkfifo "$TMP/read.fifo"
got=$(python3 - "$TMP/read.fifo" "$ERR" "$BIN" train-local "${TINY[@]}" --steps 3 \
  --log "$TMP/read.fifo" <<'PY'
import os, select, subprocess, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
run = subprocess.Popen(sys.argv[3:], stdout=subprocess.DEVNULL, stderr=open(sys.argv[2], "w"))
poller = select.poll()
poller.register(fd, select.POLLIN)
data = b""
while True:  # to EOF: every writer gone (or the run ended without one)
    if not poller.poll(100):
        if run.poll() is not None:
            break
        continue
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        continue
    if not chunk:
        break
    data += chunk
print(run.wait(), data.count(b"\n"))
PY
)
if [[ "$got" == "0 3" ]]; then
  passed=$((passed + 1))
else
  fail log_fifo_reader_gets_every_record "exit and records read: $got, want 0 3"
fi

# A second signal ends the run at once, here held at its exit by a stdout
# whose reader stopped reading (`train-local | stalled`); it was ignored.
mkfifo "$TMP/held.fifo"
exec 3<>"$TMP/held.fifo"
fill_fifo "$TMP/held.fifo"
"$BIN" train-local "${TINY[@]}" --steps 1000000 --checkpoint "$TMP/held.ckpt" \
  >"$TMP/held.fifo" 2>"$TMP/held.err" &
pid=$!
await_line "$TMP/held.err" "^step 1/"
kill -TERM "$pid"
await_line "$TMP/held.err" "checkpoint written"
kill -TERM "$pid"
await_exit "$pid" 20
exec 3<&-
if [[ $rc -eq 143 && -s "$TMP/held.ckpt" ]]; then
  passed=$((passed + 1))
else
  cp "$TMP/held.err" "$ERR"
  fail second_sigterm_ends_run "exit $rc (124: still running 20 s after the second SIGTERM)"
fi

# But not a second SIGHUP: a lost ssh session delivers the hang-up twice
# within milliseconds, and the run must still finish as the first asked.
# Held as above (stdout full) until its checkpoint is written; the second
# hang-up then comes, and the run, let go, still prints its final line.
mkfifo "$TMP/hup2.fifo"
exec 4<>"$TMP/hup2.fifo"
fill_fifo "$TMP/hup2.fifo"
"$BIN" train-local "${TINY[@]}" --steps 1000000 --checkpoint "$TMP/hup2.ckpt" 4<&- \
  >"$TMP/hup2.fifo" 2>"$TMP/hup2.err" &
pid=$!
await_line "$TMP/hup2.err" "^step 1/"
kill -HUP "$pid"
await_line "$TMP/hup2.err" "checkpoint written"
kill -HUP "$pid"
# A read end opened before the shell's read-write one closes (with none,
# the run's write says EPIPE), and the reader holds no write end: it reads
# to the run's end.
exec 5<"$TMP/hup2.fifo"
exec 4<&-
cat <&5 >"$TMP/hup2.out" &
reader=$!
exec 5<&-
await_exit "$pid" 20
wait "$reader"
# (The filler has no newline: the final line follows it.)
if [[ $rc -eq 129 && -s "$TMP/hup2.ckpt" ]] && grep -q "final: step" "$TMP/hup2.out"; then
  passed=$((passed + 1))
else
  cp "$TMP/hup2.err" "$ERR"
  fail second_sighup_not_the_end "exit $rc; stdout ends: $(tail -c 80 "$TMP/hup2.out")"
fi

finish
