#!/bin/bash
# End-to-end checks of `pipetrain plan` through the real binary: the paper's
# example (bipartition.txt Fig. 5-7) gives pipedream 12 and bipartition 9
# with the paper's assignment; the JSON has the documented fields; --svg and
# --trace write files; auto reports its candidates; --data D plans D
# data-parallel replicas with each stage's all-reduce, --data auto lists every
# layout and picks the fastest; acctfm reads its own profile format; and every
# bad input exits non-zero naming the problem
# (flags 2, files and infeasible plans 1). Prints "N passed, M failed".
set -u

source "$(dirname "$0")/cli_test_lib.sh"
CLI_PREFIX=(plan)
CLI_OK_OUT="$OUT"  # plan prints its results on stdout

# check NAME PYTHON-EXPRESSION: evaluates the expression on the JSON in $OUT (as j).
check() {
  if python3 -c "import json,sys; j=json.load(open('$OUT')); sys.exit(0 if ($2) else 1)"; then
    passed=$((passed + 1))
  else
    fail "$1" "JSON check failed: $2 on $(tr -d '\n ' <"$OUT")"
  fi
}

# The paper's example: 4 layers, F = {1,3,2,3}, B = {2,6,4,6}, no transfers.
cat >"$TMP/paper.json" <<'JSON'
{"micro_batch_size": 1, "units": [
 {"name": "l1", "fwd_seconds": 1, "bwd_seconds": 2, "weight_bytes": 0, "activation_bytes": 0, "stash_bytes": 0},
 {"name": "l2", "fwd_seconds": 3, "bwd_seconds": 6, "weight_bytes": 0, "activation_bytes": 0, "stash_bytes": 0},
 {"name": "l3", "fwd_seconds": 2, "bwd_seconds": 4, "weight_bytes": 0, "activation_bytes": 0, "stash_bytes": 0},
 {"name": "l4", "fwd_seconds": 3, "bwd_seconds": 6, "weight_bytes": 0, "activation_bytes": 0, "stash_bytes": 0}]}
JSON
P=(--profile "$TMP/paper.json" --workers 3 --micro-batches 4)

# --tensor T: DistPar's layout per linear layer of one block. 16 tokens of a
# d_model 2048 block on 4 devices split every weight (column or row).
expect_exit tensor_layouts 0 '"layout"' -- --tensor 4 --d-model 2048 --seq-len 16 --json
check tensor_four_layers 'len(j["layers"]) == 4 and j["devices"] == 4'
check tensor_weights_split 'all(l["layout"] in ("column", "row") for l in j["layers"])'
check tensor_no_worse_than_megatron 'j["cost"] <= j["fixed_scheme_costs"]["megatron"]'
expect_exit tensor_cube_text 0 'vs cube' -- --tensor 8
# A 3-D cube job needs p^2, not T, to divide d_model: T 8 (p 2) on d_model
# 36 with 6 heads is a valid job, so the cube gets a cost while Megatron's
# column split of 108 qkv columns 8 ways is not possible.
expect_exit tensor_cube_d_model 0 '"layout"' -- --tensor 8 --d-model 36 --heads 6 \
  --micro-batch-size 4 --seq-len 256 --json
check tensor_cube_d_model_costs 'j["fixed_scheme_costs"]["cube"] is not None and j["fixed_scheme_costs"]["megatron"] is None'
expect_exit tensor_cube_d_model_text 0 'vs cube' -- --tensor 8 --d-model 36 --heads 6 \
  --micro-batch-size 4 --seq-len 256
# 1001 tokens: 8 devices split no rows, so the all-data and all-cube
# schemes are not possible (cost null), and none is chosen.
expect_exit tensor_indivisible_text 0 'vs data       (data,data,data,data): not possible' \
  -- --tensor 8 --seq-len 1001
expect_exit tensor_indivisible 0 '"layout"' -- --tensor 8 --seq-len 1001 --json
check tensor_indivisible_null 'j["fixed_scheme_costs"]["data"] is None and j["fixed_scheme_costs"]["cube"] is None'
check tensor_indivisible_chosen 'all(l["layout"] not in ("data", "cube") for l in j["layers"])'
# --heads counts with --tensor: 12 heads on 8 devices reach the attention
# core gathered, 16 by columns.
expect_exit tensor_heads 0 'S(1) -> B  all-gather' -- --tensor 8 --heads 12 --distpar-beta 1
expect_exit tensor_too_small 2 '--tensor must be a group of >= 2 devices' -- --tensor 1
expect_exit tensor_too_large 2 '--tensor 2147483647 is over 64 devices' -- --tensor 2147483647
expect_exit tensor_negative_bandwidth 2 '--bandwidth-gbps -10 is outside [0, ' \
  -- --tensor 4 --bandwidth-gbps -10

# Input files: a directory, or a file larger than any profile, is refused
# before it is parsed (a FIFO blocked and /dev/zero grew plan without end).
expect_exit profile_directory 1 "profile file $TMP is not a regular file" -- --profile "$TMP" --workers 2
truncate -s 17M "$TMP/huge-profile.json"
expect_exit profile_oversized 1 "profile file $TMP/huge-profile.json is 17825792 bytes, over the limit of 16777216" -- \
  --profile "$TMP/huge-profile.json" --workers 2
expect_exit cluster_directory 1 "cluster file $TMP is not a regular file" -- \
  --profile "$TMP/paper.json" --cluster "$TMP"
# A file it cannot write is a bad command line, found before any planning:
# no plan printed, no other file written.
expect_exit svg_missing_dir 2 "--svg $TMP/none/t.svg: the directory $TMP/none does not exist" -- \
  "${P[@]}" --svg "$TMP/none/t.svg" --write-profile "$TMP/early-profile.json"
if [[ -s "$OUT" ]]; then fail svg_missing_dir_no_plan "a plan was printed: $(head -c 200 "$OUT")"; else passed=$((passed + 1)); fi
if [[ -e "$TMP/early-profile.json" ]]; then fail svg_missing_dir_no_profile "--write-profile written"; else passed=$((passed + 1)); fi
expect_exit trace_is_dir 2 "--trace $TMP is a directory; name a file" -- "${P[@]}" --trace "$TMP"
expect_exit write_profile_missing_dir 2 "--write-profile $TMP/none/p.json: the directory" -- \
  "${P[@]}" --write-profile "$TMP/none/p.json"
# An output that is an input, or another output: refused before planning
# (the all-or-none write would replace one with the other).
cp "$TMP/paper.json" "$TMP/own.json"
expect_exit write_profile_is_profile 2 "--write-profile $TMP/own.json is --profile $TMP/own.json; writing it would destroy an input" -- \
  --profile "$TMP/own.json" --workers 3 --write-profile "$TMP/own.json"
if cmp -s "$TMP/paper.json" "$TMP/own.json"; then passed=$((passed + 1)); else fail input_untouched "the profile changed"; fi
expect_exit svg_is_trace 2 "--trace $TMP/same.out is also --svg $TMP/same.out" -- \
  "${P[@]}" --svg "$TMP/same.out" --trace "$TMP/same.out"
# A file it cannot write only at the end (a directory unwritable to this
# user would do, but root writes anywhere): /dev/full fails the write
# itself (ENOSPC), and the files written before it are removed.
if [[ -w /dev/full ]]; then
  expect_exit svg_write_fails 1 "cannot write /dev/full" -- "${P[@]}" \
    --write-profile "$TMP/late-profile.json" --svg "$TMP/late.svg" --trace /dev/full
  for f in late-profile.json late.svg; do
    if [[ -e "$TMP/$f" ]]; then fail "svg_write_fails_removed_$f" "left behind"; else passed=$((passed + 1)); fi
  done
  if [[ -c /dev/full ]]; then passed=$((passed + 1)); else fail dev_full_not_removed "/dev/full is gone"; fi
fi
# The analytic model's flags with a measured profile would be ignored: refused.
expect_exit profile_gflops 2 '--gflops has no effect with --profile' -- "${P[@]}" --gflops 5
# The analytic model's shape is a flag error (exit 2), as in train-local.
expect_exit heads_not_dividing 2 'n_head (5) must divide d_model (768)' -- --layers 2 --heads 5 --workers 2
expect_exit paper_pipedream 0 '"solver": "pipedream"' -- "${P[@]}" --solver pipedream --json
check pipedream_is_12 'j["bottleneck_seconds"] == 12'
expect_exit paper_bipartition 0 '"solver": "bipartition"' -- "${P[@]}" --solver bipartition --json \
  --svg "$TMP/t.svg" --trace "$TMP/t.json"
check bipartition_is_9 'j["bottleneck_seconds"] == 9'
check paper_assignment '[(s["fwd"], s["bwd"]) for s in j["stages"]] == [([0,0],[0,1]), ([1,2],[2,2]), ([3,3],[3,3])]'
check fields 'all(k in j for k in ["solver","objective","bottleneck_seconds","stages","predicted_iteration_seconds","bubble_fraction","solve_seconds"]) and all(set(s) == {"worker","fwd","bwd","memory_bytes"} for s in j["stages"])'
check predicted_positive 'j["predicted_iteration_seconds"] > 0 and 0 <= j["bubble_fraction"] < 1'
if grep -q '<svg' "$TMP/t.svg" && python3 -c "import json; json.load(open('$TMP/t.json'))['traceEvents']"; then
  passed=$((passed + 1))
else
  fail svg_and_trace "missing or malformed $TMP/t.svg / $TMP/t.json"
fi
expect_exit auto 0 '"candidates"' -- "${P[@]}" --solver auto --json
check auto_candidates 'set(j["candidates"]) == {"uniform","pipedream","bipartition"} and j["predicted_iteration_seconds"] == min(j["candidates"].values())'
expect_exit table 0 "WORKER" "units: 0=l1 1=l2 2=l3 3=l4" -- "${P[@]}"
# Workers sharing a host's cores: auto ranks the candidates by the shared-
# core simulation that gives its prediction, so it picks the fastest
# (pipedream here; the plain simulation preferred uniform, predicted 45 s).
cat >"$TMP/shared_profile.json" <<'JSON'
{"micro_batch_size": 1, "units": [
 {"name": "u0", "fwd_seconds": 1, "bwd_seconds": 1, "weight_bytes": 60, "activation_bytes": 0, "stash_bytes": 0},
 {"name": "u1", "fwd_seconds": 5, "bwd_seconds": 1, "weight_bytes": 0, "activation_bytes": 0, "stash_bytes": 0},
 {"name": "u2", "fwd_seconds": 1, "bwd_seconds": 1, "weight_bytes": 0, "activation_bytes": 0, "stash_bytes": 0},
 {"name": "u3", "fwd_seconds": 4, "bwd_seconds": 1, "weight_bytes": 0, "activation_bytes": 100, "stash_bytes": 0}]}
JSON
cat >"$TMP/shared_cluster.json" <<'JSON'
{"workers": [{"name": "w0", "speed": 2, "host": "b", "host_cores": 1, "compute_threads": 2},
             {"name": "w1", "speed": 2, "host": "a", "host_cores": 1, "compute_threads": 2},
             {"name": "w2", "speed": 2, "host": "b", "host_cores": 1, "compute_threads": 1}],
 "bandwidth_bytes_per_second": 12500, "latency_seconds": 0.001}
JSON
expect_exit auto_shared_host 0 '"candidates"' -- --profile "$TMP/shared_profile.json" \
  --cluster "$TMP/shared_cluster.json" --micro-batches 4 --solver auto --json
check auto_shared_host_fastest 'j["solver"] == "pipedream" and j["predicted_iteration_seconds"] == min(j["candidates"].values()) and j["candidates"]["uniform"] > j["candidates"]["pipedream"]'

# A cluster file with memory limits: 2 workers of 100 bytes cannot hold 4
# units of 60 weight bytes each (each stored 4 times on its backward owner).
sed 's/"weight_bytes": 0/"weight_bytes": 60/' "$TMP/paper.json" >"$TMP/heavy.json"
cat >"$TMP/small.json" <<'JSON'
{"workers": [{"name": "a", "speed": 1.0, "memory_bytes": 100}, {"name": "b", "speed": 2.0, "memory_bytes": 100}],
 "bandwidth_bytes_per_second": 1e9, "latency_seconds": 1e-5}
JSON
expect_exit memory_too_small 1 "RESOURCE_EXHAUSTED" -- --profile "$TMP/heavy.json" \
  --cluster "$TMP/small.json" --write-profile "$TMP/failed-profile.json" --svg "$TMP/failed.svg"
# A plan that fails writes no file (the profile was written first once).
for f in failed-profile.json failed.svg; do
  if [[ -e "$TMP/$f" ]]; then fail "memory_too_small_no_$f" "left behind"; else passed=$((passed + 1)); fi
done
expect_exit memory_too_small_uniform 1 "RESOURCE_EXHAUSTED" "worker a" -- \
  --profile "$TMP/heavy.json" --cluster "$TMP/small.json" --solver uniform

# Data parallelism: --data D lays the 4 workers out as D replicas of 4/D
# stages, --micro-batches counting a step's micro-batches over all replicas.
# Every unit has 60 weight bytes and 100 output bytes; 12500 B/s links with
# 1 ms latency, so a ring all-reduce takes 2(D-1) x 1 ms + 2(D-1)/D x
# bytes / 12500 s, and for D = 2 one exchange, 1 ms + bytes / 12500 s
# (Collectives::AllReduce). Each stage holds embed or head, so it runs two:
# the fused embedding sync of the wte (60 bytes) over its 2D = 4 owners
# (AllReduceInMemberOrder: 4 x 1 ms + 1.5 x 60 / 12500 s), and at its step
# the bucket of its other gradients (far below 4 MiB, so sent at the step).
sed 's/"activation_bytes": 0/"activation_bytes": 100/' "$TMP/heavy.json" >"$TMP/dp.json"
DP=(--profile "$TMP/dp.json" --workers 4 --bandwidth-gbps 0.0001 --latency-us 1000)
expect_exit data2 0 '"data_parallel": 2' -- "${DP[@]}" --micro-batches 8 --data 2 --json
check data2_layout 'j["stages_per_replica"] == 2 and j["micro_batches_per_replica"] == 4 and [s["replica_workers"] for s in j["stages"]] == [["w0", "w2"], ["w1", "w3"]] and [s["worker"] for s in j["stages"]] == ["w0,w2", "w1,w3"]'
check data2_fields 'all(set(s) == {"worker","fwd","bwd","memory_bytes","replica_workers","all_reduce_seconds"} for s in j["stages"]) and [(l["data"], l["stages"], l["chosen"]) for l in j["layouts"]] == [(2, 2, True)]'
check data2_all_reduce_closed_form 'all(abs(s["all_reduce_seconds"] - (1e-3 + 60 * (s["bwd"][1] - s["bwd"][0]) / 12500 + 4e-3 + 1.5 * 60 / 12500)) < 1e-12 for s in j["stages"])'
expect_exit data2_table 0 "ALL_REDUCE_S" "data parallel: 2 replicas x 2 stages on 4 workers, replicas [w0 w1] [w2 w3]; 8 micro-batches per step, 4 per replica" -- \
  "${DP[@]}" --micro-batches 8 --data 2
expect_exit data_auto 0 '"layouts"' -- "${DP[@]}" --micro-batches 8 --data auto --json
check data_auto_candidates '[(l["data"], l["stages"]) for l in j["layouts"]] == [(1, 4), (2, 2), (4, 1)] and sum(l["chosen"] for l in j["layouts"]) == 1'
check data_auto_chosen_is_fastest 'min(j["layouts"], key=lambda l: (l["step_seconds"], l["data"]))["chosen"] and [l for l in j["layouts"] if l["chosen"]][0]["data"] == j["data_parallel"] and min(l["step_seconds"] for l in j["layouts"]) == j["predicted_iteration_seconds"]'
check data_auto_distpar 'all(l["distpar_cost"] == l["distpar_computation"] + l["distpar_communication"] and l["distpar_computation"] > 0 for l in j["layouts"])'
expect_exit data_auto_table 0 "DISTPAR_COST" "STEP_S" "CHOSEN" "ties to the smaller D" -- \
  "${DP[@]}" --micro-batches 8 --data auto
# Bandwidth 0 is the cluster format's "unlimited", said so (not "0 B/s").
expect_exit data_unlimited_link 0 "over the cluster's link (unlimited bandwidth" -- \
  "${P[@]}" --micro-batches 3 --data 3
# The same 4 workers on one host of 2 cores, one compute thread each (as
# workers register): 4 replicas compute 4 threads on 2 cores, so that
# layout's compute takes twice as long, as a job would plan it.
cat >"$TMP/shared.json" <<'JSON'
{"workers": [{"name": "w0", "host": "vm", "host_cores": 2, "compute_threads": 1},
             {"name": "w1", "host": "vm", "host_cores": 2, "compute_threads": 1},
             {"name": "w2", "host": "vm", "host_cores": 2, "compute_threads": 1},
             {"name": "w3", "host": "vm", "host_cores": 2, "compute_threads": 1}],
 "bandwidth_bytes_per_second": 12500, "latency_seconds": 1e-3}
JSON
expect_exit data_auto_shared_host 0 "4 x 1: compute x2.00, its replicas' threads sharing a host's cores" -- \
  --profile "$TMP/dp.json" --cluster "$TMP/shared.json" --micro-batches 8 --data auto
expect_exit data_auto_shared_host_json 0 '"compute_stretch"' -- \
  --profile "$TMP/dp.json" --cluster "$TMP/shared.json" --micro-batches 8 --data auto --json
check data_auto_shared_host_stretch '[l["compute_stretch"] for l in j["layouts"]] == [1, 1, 2]'

# Weights so heavy that any all-reduce costs more than the pipeline: auto
# keeps one replica and says there is nothing to all-reduce.
sed 's/"weight_bytes": 60/"weight_bytes": 6000000/' "$TMP/dp.json" >"$TMP/dp_heavy.json"
expect_exit data_auto_one_replica 0 "1 replica of 4 stages on 4 workers (pipeline only: no gradient all-reduce)" -- \
  --profile "$TMP/dp_heavy.json" --workers 4 --bandwidth-gbps 0.0001 --latency-us 1000 --micro-batches 8 --data auto

# Six micro-batches over 4 workers: only D = 1 and 2 are layouts.
expect_exit data_auto_divides_micro_batches 0 '"layouts"' -- "${DP[@]}" --micro-batches 6 --data auto --json
check data_auto_skips_4 '[l["data"] for l in j["layouts"]] == [1, 2]'
# What the flags show cannot be a layout is a bad command line (2), named
# by its flags; a --cluster file's count is the planner's to check (1,
# its spec field names translated).
expect_exit data_not_dividing_workers 2 "--data 3 must divide --workers 4" -- \
  "${DP[@]}" --micro-batches 6 --data 3
expect_exit data_not_dividing_micro_batches 2 "--data 4 must divide --micro-batches 6" -- \
  "${DP[@]}" --micro-batches 6 --data 4
expect_exit data_not_dividing_cluster 1 "INVALID_ARGUMENT" "parallelism.data = 3 does not divide the 2 workers" "--data" -- \
  --profile "$TMP/dp.json" --cluster "$TMP/small.json" --micro-batches 6 --data 3
expect_exit data_auto_nothing_fits 1 "RESOURCE_EXHAUSTED" "no data-parallel layout of the 2 workers" "1 x 2: no plan fits" "2 x 1: no plan fits" -- \
  --profile "$TMP/heavy.json" --cluster "$TMP/small.json" --data auto
expect_exit data_zero 2 "--data: cannot parse '0' (want a count >= 1 or auto)" -- "${DP[@]}" --data 0
expect_exit data_word 2 "--data: cannot parse 'many' (want a count >= 1 or auto)" -- "${DP[@]}" --data many

# --tensor-parallel auto: the layouts of the workers as a job with
# parallelism.data 0 and tensor 0 searches them (job_layout.h), T among
# the divisors of the 4 heads; the choice is the fastest simulated step.
TP=(--layers 2 --heads 4 --d-model 128 --vocab 256 --seq-len 64 --micro-batch-size 4 --workers 4
    --bandwidth-gbps 10 --data auto)
expect_exit tensor_search 0 "chosen by spec.parallelism.data 0 and tensor 0 (auto)" ", 1 x 1 x 4 " \
  "chosen: " -- "${TP[@]}" --tensor-parallel auto
expect_exit tensor_search_json 0 '"layouts"' -- "${TP[@]}" --tensor-parallel auto --json
check tensor_search_every_t 'sorted({l["tensor"] for l in j["layouts"]}) == [1, 2, 4]'
check tensor_search_fastest 'j["predicted_step_seconds"] == min(l["step_seconds"] for l in j["layouts"])'
check tensor_search_chosen '[(l["data"], l["stages"], l["tensor"]) for l in j["layouts"] if l["chosen"]] == [(j["data_parallel"], j["stages_per_replica"], j["tensor_parallel"])]'
expect_exit tensor_search_fixed_t_json 0 '"layouts"' -- "${TP[@]}" --tensor-parallel 2 --json
check tensor_search_fixed_t '{l["tensor"] for l in j["layouts"]} == {2} and j["not_tried"] == []'
# GPT-2's vocabulary splits over no T: the line says so, and how to pad it.
expect_exit tensor_search_gpt2_vocab 0 "not tried: T 2 (tensor parallelism of 2 does not divide model.vocab_size 50257 (pad it to a multiple of 2" -- \
  "${TP[@]}" --vocab 50257 --tensor-parallel auto
expect_exit tensor_search_needs_data_auto 2 "--tensor-parallel needs --data auto and --layers N" -- \
  --layers 2 --workers 4 --tensor-parallel auto
# The files are written before the layout is printed: one that cannot be
# written leaves stdout empty (a table followed by exit 1 read as a plan).
if [[ -w /dev/full ]]; then
  expect_exit tensor_search_write_fails 1 "cannot write /dev/full" -- "${TP[@]}" \
    --tensor-parallel 2 --json --write-profile /dev/full
  if [[ -s "$OUT" ]]; then fail tensor_search_write_fails_stdout "printed before failing"; else passed=$((passed + 1)); fi
fi
expect_exit tensor_search_not_with_tensor 2 "give one" -- "${TP[@]}" --tensor 2 --tensor-parallel 2
# The search reads links and memory from --cluster as every mode does: the
# flags it would ignore are refused (they were accepted and ignored).
expect_exit tensor_search_cluster_with_bandwidth 2 "--bandwidth-gbps has no effect with --cluster" -- \
  --layers 2 --heads 4 --d-model 128 --vocab 256 --seq-len 64 --micro-batch-size 4 \
  --cluster "$TMP/small.json" --bandwidth-gbps 100 --data auto --tensor-parallel auto
expect_exit tensor_search_no_layout 1 "pipetrain plan: INVALID_ARGUMENT: --workers: no layout of 7 workers" "split the model (--tensor-parallel)" "and --micro-batches 4" -- \
  --layers 2 --heads 4 --d-model 128 --vocab 256 --seq-len 64 --workers 7 --data auto --tensor-parallel auto
# A failed search leaves a --write-profile file already there as it was
# (it was replaced, then removed).
echo keep >"$TMP/kept-profile.json"
expect_exit tensor_search_keeps_file 1 "no layout of 7 workers" -- \
  --layers 2 --heads 4 --d-model 128 --vocab 256 --seq-len 64 --workers 7 --data auto --tensor-parallel auto \
  --write-profile "$TMP/kept-profile.json"
if [[ "$(cat "$TMP/kept-profile.json" 2>/dev/null)" == keep ]]; then
  passed=$((passed + 1))
else
  fail tensor_search_kept_file "the --write-profile file already there was replaced or removed"
fi

# Bad input: exit 1 with the file and field named.
echo '{"micro_batch_size": 1, "units": [{"name": "x", "fwd_seconds": -1, "bwd_seconds": 1, "weight_bytes": 0, "activation_bytes": 0, "stash_bytes": 0}]}' >"$TMP/negative.json"
expect_exit negative_cost 1 "negative.json" "units[0].fwd_seconds" -- --profile "$TMP/negative.json" --workers 1
echo '{"micro_batch_size": 1, "units": [' >"$TMP/broken.json"
expect_exit malformed_json 1 "broken.json" -- --profile "$TMP/broken.json" --workers 1
expect_exit missing_profile 1 "cannot read profile file" -- --profile "$TMP/nope.json" --workers 1
expect_exit too_many_workers 1 "INVALID_ARGUMENT" -- --profile "$TMP/paper.json" --workers 9
# Bad flags: exit 2.
expect_exit unknown_solver 2 "unknown solver 'magic'; use uniform, pipedream, bipartition" -- \
  "${P[@]}" --solver magic
expect_exit unknown_objective 2 "unknown objective 'best'; use paper or full" -- \
  "${P[@]}" --objective best
# The job spec's bounds: a plan's memory grows with micro-batches x workers.
expect_exit micro_batches_over_limit 2 "--micro-batches 100000000 is outside [1, 4096]" -- \
  "${P[@]}" --micro-batches 100000000
expect_exit micro_batches_zero 2 "--micro-batches 0 is outside [1, 4096]" -- \
  "${P[@]}" --micro-batches 0
expect_exit layers_over_limit 2 "--layers 100000 is outside [0, 256]" -- --layers 100000 --workers 2
expect_exit seq_len_over_limit 2 "--seq-len 2000000000 is outside [1, 32768]" -- \
  --layers 2 --workers 2 --seq-len 2000000000
expect_exit tensor_negative_seq_len 2 "--seq-len -32 is outside" -- \
  --tensor 2 --seq-len -32 --micro-batch-size -1
# A mode refuses the flags it would ignore.
expect_exit tensor_with_svg 2 "--svg has no effect with --tensor" -- --tensor 2 --svg "$TMP/t.svg"
expect_exit tensor_with_solver 2 "--solver has no effect with --tensor" -- --tensor 2 --solver auto
# --gflops calibrates beta only with --bandwidth-gbps; --distpar-beta sets
# it instead; a d_model that neither T (1-D) nor, for T = p^3, p^2 (the
# cube) divides is no layout a job could run.
expect_exit tensor_gflops_alone 2 "--gflops has no effect with --tensor without --bandwidth-gbps" \
  -- --tensor 2 --gflops 5
expect_exit tensor_beta_and_calibration 2 "--distpar-beta sets beta" -- --tensor 2 \
  --distpar-beta 1 --gflops 5 --bandwidth-gbps 10
expect_exit tensor_not_dividing 2 "--tensor 5 must divide --d-model 768" -- --tensor 5
expect_exit tensor_cube_not_dividing 2 \
  "--tensor 8 must divide --d-model 30 (each device takes an equal share), or for the 3-D cube (8 = 2^3) p^2 = 4 must" \
  -- --tensor 8 --d-model 30 --heads 6
expect_exit acctfm_with_layers 2 "--layers has no effect with --solver acctfm" -- \
  --profile "$TMP/paper.json" --solver acctfm --layers 3
expect_exit tensor_search_with_svg 2 "--svg has no effect with --tensor-parallel" -- \
  --layers 2 --heads 4 --d-model 128 --vocab 256 --seq-len 64 --workers 4 --data auto \
  --tensor-parallel auto --svg "$TMP/t.svg"
# A cluster file has the links and memory; one pipeline has no layouts to
# cost. Both were accepted and ignored: the same plan, a different belief.
expect_exit cluster_with_bandwidth 2 "--bandwidth-gbps has no effect with --cluster" -- \
  --profile "$TMP/paper.json" --cluster "$TMP/small.json" --bandwidth-gbps 1
expect_exit cluster_with_memory 2 "--memory-gib has no effect with --cluster" -- \
  --profile "$TMP/paper.json" --cluster "$TMP/small.json" --memory-gib 1
expect_exit one_pipeline_with_beta 2 "--distpar-beta has no effect with --data 1" -- \
  --layers 2 --workers 2 --distpar-beta 2
expect_exit no_profile 2 "give --profile FILE or --layers N" -- --workers 2
expect_exit no_cluster 2 "give either --cluster or --workers" -- --profile "$TMP/paper.json"
expect_exit both_clusters 2 "give either --cluster or --workers" -- --profile "$TMP/paper.json" \
  --workers 2 --cluster "$TMP/small.json"
expect_exit bad_schedule 2 "unknown schedule 'zb'" -- "${P[@]}" --schedule zb
expect_exit negative_bandwidth 2 "--bandwidth-gbps -1 is outside [0, " -- "${P[@]}" --bandwidth-gbps -1
# -1 is the flag's "calibrate" sentinel, but only while unset.
expect_exit negative_beta 2 "--distpar-beta must be >= 0, got -1" -- "${P[@]}" --data auto --distpar-beta -1

# AccTFM: its own profile format (cli/acctfm_profile.h).
cat >"$TMP/acctfm.json" <<'JSON'
{"layers": [{"name": "b0", "fwd_seconds": [4, 2.2, 1.2], "bwd_seconds": [8, 4.2, 2.3], "output_bytes": 4e6},
            {"name": "b1", "fwd_seconds": [4, 2.2, 1.2], "bwd_seconds": [8, 4.2, 2.3], "output_bytes": 4e6}],
 "allreduce": {"alpha_seconds": 0.01, "beta_seconds_per_byte": 1e-6, "group_size": 4, "algorithm": "ring"}}
JSON
expect_exit acctfm 0 '"partition_sizes"' -- --profile "$TMP/acctfm.json" --solver acctfm --json
check acctfm_fields 'all(k in j for k in ["forward","backward","uniform"]) and set(j["uniform"]) == {"1","2","4"} and len(j["forward"]["partition_sizes"]) == 2 and j["forward"]["seconds"] <= min(j["uniform"].values())'
sed 's/"fwd_seconds": \[4, 2.2, 1.2\], //' "$TMP/acctfm.json" >"$TMP/acctfm_bad.json"
expect_exit acctfm_missing_field 1 "layers[0].fwd_seconds: missing" -- --profile "$TMP/acctfm_bad.json" --solver acctfm
# The eq. 3 model costs a layer by its output_bytes: without them a layer
# would all-reduce nothing; without the model nothing reads them.
sed 's/, "output_bytes": 4e6//' "$TMP/acctfm.json" >"$TMP/acctfm_no_bytes.json"
expect_exit acctfm_model_without_bytes 1 'layers[0].output_bytes: missing (the "allreduce" model' -- \
  --profile "$TMP/acctfm_no_bytes.json" --solver acctfm
sed 's/"output_bytes": 4e6/"output_bytes": 4e6, "allreduce_seconds": [1, 1, 1]/; /"allreduce"/d; s/}],$/}]}/' \
  "$TMP/acctfm.json" >"$TMP/acctfm_bytes_no_model.json"
expect_exit acctfm_bytes_without_model 1 'layers[0].output_bytes: given without an "allreduce" model' -- \
  --profile "$TMP/acctfm_bytes_no_model.json" --solver acctfm
sed 's/"algorithm": "ring"/"algorithm": 5/' "$TMP/acctfm.json" >"$TMP/acctfm_algorithm.json"
expect_exit acctfm_algorithm_number 1 "allreduce.algorithm" -- \
  --profile "$TMP/acctfm_algorithm.json" --solver acctfm
sed 's/"algorithm": "ring"/"algorithm": "ring", "algorithm": "tree"/' "$TMP/acctfm.json" \
  >"$TMP/acctfm_twice.json"
expect_exit acctfm_key_twice 1 'key "algorithm" given twice in one object' -- \
  --profile "$TMP/acctfm_twice.json" --solver acctfm
sed 's/"group_size": 4/"group_size": 1e12/' "$TMP/acctfm.json" >"$TMP/acctfm_group.json"
expect_exit acctfm_group_size_huge 1 "allreduce.group_size" "[1, 65536]" -- \
  --profile "$TMP/acctfm_group.json" --solver acctfm
expect_exit acctfm_with_svg 2 "--svg has no effect with --solver acctfm" -- \
  --profile "$TMP/acctfm.json" --solver acctfm --svg "$TMP/a.svg"

# --attention flash: the analytic profile's attention stash keeps B x H x T
# row statistics, not the B x H x T x T probabilities (solve_plan.h).
A=(--layers 2 --workers 1 --seq-len 256 --micro-batch-size 4)
expect_exit attention_reference 0 '"stages"' -- "${A[@]}" --json --write-profile "$TMP/probs.json"
expect_exit attention_flash 0 '"stages"' -- "${A[@]}" --attention flash --json \
  --write-profile "$TMP/flash.json"
if python3 -c "
import json, sys
p = json.load(open('$TMP/probs.json'))['units']; f = json.load(open('$TMP/flash.json'))['units']
rows = 4 * 12 * 256  # batch x heads x tokens
ok = (len(p) == len(f) > 0 and any(u['name'].startswith('attn_') for u in p) and
      all((pu['stash_bytes'] - fu['stash_bytes'] == 4 * rows * 255) == pu['name'].startswith('attn_')
          for pu, fu in zip(p, f)))
sys.exit(0 if ok else 1)"; then
  passed=$((passed + 1))
else
  fail attention_flash_stash "attention stash not B x H x T floats with --attention flash"
fi
expect_exit attention_unknown 2 '--attention "bogus": want auto, reference, gemm or flash' -- \
  "${A[@]}" --attention bogus
expect_exit attention_with_profile 2 "--attention shapes the analytic profile" -- \
  "${P[@]}" --attention flash

# A plan past the coordinator's planning budget (a job would be refused)
# says so on stderr, then plans; one within it says nothing.
expect_exit over_budget 0 '"stages"' -- --layers 96 --workers 64 --micro-batches 64 --json
if grep -qF "solver bipartition for 64 stages of 194 units is about 4.7e+08 solver steps, above \
the 4e+08 a coordinator plans for a job" "$ERR"; then
  passed=$((passed + 1))
else
  fail over_budget_note "stderr lacks the budget note: $(head -c 400 "$ERR")"
fi
expect_exit within_budget 0 '"stages"' -- --layers 12 --workers 4 --json
if ! grep -qF "solver steps" "$ERR"; then
  passed=$((passed + 1))
else
  fail within_budget_note "a plan within the budget got the note: $(head -c 400 "$ERR")"
fi
# Stages x micro-batches past the coordinator's budget: noted the same way.
expect_exit over_micro_batch_budget 0 '"stages"' -- --layers 4 --workers 8 --micro-batches 4096 \
  --solver uniform --json
if grep -qF "8 stages x 4096 micro-batches = 32768, above the 16384 a coordinator plans for a job" \
  "$ERR"; then
  passed=$((passed + 1))
else
  fail over_micro_batch_budget_note "stderr lacks the budget note: $(head -c 400 "$ERR")"
fi
expect_exit within_micro_batch_budget 0 '"stages"' -- --layers 4 --workers 8 --micro-batches 2048 \
  --solver uniform --json
if ! grep -qF "micro-batches =" "$ERR"; then
  passed=$((passed + 1))
else
  fail within_micro_batch_budget_note "a plan within the budget got the note: $(head -c 400 "$ERR")"
fi

# Real-valued flags are bounded as a --cluster file's numbers are, and
# named (they once failed deep in the planner, or planned 0 s).
expect_exit memory_huge 2 "--memory-gib 1e+308 is outside [0, " -- --layers 12 --workers 2 \
  --memory-gib 1e308
expect_exit bandwidth_huge 2 "--bandwidth-gbps 1e+308 is outside [0, " -- --layers 12 --workers 2 \
  --bandwidth-gbps 1e308
expect_exit bandwidth_tiny 2 "is below 1 byte/s" -- --layers 12 --workers 2 --bandwidth-gbps 1e-300
expect_exit latency_huge 2 "--latency-us 1e+308 is outside [0, " -- --layers 12 --workers 2 \
  --latency-us 1e308
expect_exit gflops_huge 2 "--gflops 1e+308 is outside [1e-09, 1e+09]" -- --layers 12 --workers 2 \
  --gflops 1e308
expect_exit gflops_tiny 2 "--gflops 1e-308 is outside [1e-09, 1e+09]" -- --layers 12 --workers 2 \
  --gflops 1e-308
# --tensor-parallel's bound and divisibility are the command line's (exit 2).
expect_exit tensor_parallel_over 2 "--tensor-parallel 65 is outside [0, 64]" -- --layers 2 \
  --heads 4 --d-model 128 --vocab 256 --seq-len 64 --workers 4 --data auto --tensor-parallel 65
expect_exit tensor_parallel_divides 2 "--tensor-parallel 3 must divide --workers 4" -- --layers 2 \
  --heads 4 --d-model 128 --vocab 256 --seq-len 64 --workers 4 --data auto --tensor-parallel 3

# auto names a solver that gave no plan, and why: here pipedream's
# time-balanced cut puts u2's weights on worker a, over its memory, while
# uniform and bipartition fit.
cat >"$TMP/skip_profile.json" <<'JSON'
{"micro_batch_size": 1, "units": [
 {"name": "u0", "fwd_seconds": 0.5, "bwd_seconds": 0.5, "weight_bytes": 0, "activation_bytes": 0, "stash_bytes": 0},
 {"name": "u1", "fwd_seconds": 0.5, "bwd_seconds": 0.5, "weight_bytes": 0, "activation_bytes": 0, "stash_bytes": 0},
 {"name": "u2", "fwd_seconds": 0.5, "bwd_seconds": 0.5, "weight_bytes": 1000000, "activation_bytes": 0, "stash_bytes": 0},
 {"name": "u3", "fwd_seconds": 1.5, "bwd_seconds": 1.5, "weight_bytes": 0, "activation_bytes": 0, "stash_bytes": 0}]}
JSON
echo '{"workers": [{"name": "a", "memory_bytes": 1000000}, {"name": "b"}]}' >"$TMP/skip_cluster.json"
S=(--profile "$TMP/skip_profile.json" --cluster "$TMP/skip_cluster.json" --micro-batches 2)
expect_exit skipped_pipedream_alone 1 "RESOURCE_EXHAUSTED: worker a would need" -- "${S[@]}" \
  --solver pipedream
expect_exit skipped_candidate 0 '"candidates_skipped"' -- "${S[@]}" --solver auto --json
check skipped_candidate_named 'sorted(j["candidates"]) == ["bipartition", "uniform"] and list(j["candidates_skipped"]) == ["pipedream"] and j["candidates_skipped"]["pipedream"].startswith("RESOURCE_EXHAUSTED: worker a would need")'
expect_exit skipped_candidate_text 0 "candidate pipedream    skipped: RESOURCE_EXHAUSTED: worker a" \
  -- "${S[@]}" --solver auto

finish
