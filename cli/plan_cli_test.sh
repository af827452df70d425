#!/bin/bash
# End-to-end checks of `pipetrain plan` through the real binary: the paper's
# example (bipartition.txt Fig. 5-7) gives pipedream 12 and bipartition 9
# with the paper's assignment; the JSON has the documented fields; --svg and
# --trace write files; auto reports its candidates; acctfm reads its own
# profile format; and every bad input exits non-zero naming the problem
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

# A cluster file with memory limits: 2 workers of 100 bytes cannot hold 4
# units of 60 weight bytes each (each stored 4 times on its backward owner).
sed 's/"weight_bytes": 0/"weight_bytes": 60/' "$TMP/paper.json" >"$TMP/heavy.json"
cat >"$TMP/small.json" <<'JSON'
{"workers": [{"name": "a", "speed": 1.0, "memory_bytes": 100}, {"name": "b", "speed": 2.0, "memory_bytes": 100}],
 "bandwidth_bytes_per_second": 1e9, "latency_seconds": 1e-5}
JSON
expect_exit memory_too_small 1 "RESOURCE_EXHAUSTED" -- --profile "$TMP/heavy.json" \
  --cluster "$TMP/small.json"
expect_exit memory_too_small_uniform 1 "RESOURCE_EXHAUSTED" "worker a" -- \
  --profile "$TMP/heavy.json" --cluster "$TMP/small.json" --solver uniform

# Bad input: exit 1 with the file and field named.
echo '{"micro_batch_size": 1, "units": [{"name": "x", "fwd_seconds": -1, "bwd_seconds": 1, "weight_bytes": 0, "activation_bytes": 0, "stash_bytes": 0}]}' >"$TMP/negative.json"
expect_exit negative_cost 1 "negative.json" "units[0].fwd_seconds" -- --profile "$TMP/negative.json" --workers 1
echo '{"micro_batch_size": 1, "units": [' >"$TMP/broken.json"
expect_exit malformed_json 1 "broken.json" -- --profile "$TMP/broken.json" --workers 1
expect_exit missing_profile 1 "cannot read profile file" -- --profile "$TMP/nope.json" --workers 1
expect_exit too_many_workers 1 "INVALID_ARGUMENT" -- --profile "$TMP/paper.json" --workers 9
expect_exit unknown_solver 1 "unknown solver 'magic'" -- "${P[@]}" --solver magic
expect_exit unknown_objective 1 "unknown objective 'best'" -- "${P[@]}" --objective best
# Bad flags: exit 2.
expect_exit no_profile 2 "give --profile FILE or --layers N" -- --workers 2
expect_exit no_cluster 2 "give either --cluster or --workers" -- --profile "$TMP/paper.json"
expect_exit both_clusters 2 "give either --cluster or --workers" -- --profile "$TMP/paper.json" \
  --workers 2 --cluster "$TMP/small.json"
expect_exit bad_schedule 2 "unknown schedule 'zb'" -- "${P[@]}" --schedule zb
expect_exit negative_bandwidth 2 "must be >= 0" -- "${P[@]}" --bandwidth-gbps -1

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

finish
