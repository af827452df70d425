#!/bin/bash
# The cluster commands' conventions through the real binaries (issue 23,
# CLI): --version on all three binaries; --json on every listing (jobs,
# workers, job) parsed as JSON, complete across pages; $PIPETRAIN_COORDINATOR,
# $PIPETRAIN_TOKEN and $PIPETRAIN_CA taking effect, and flags overriding
# them; the exit code table (cli/exit_codes.h: 64 + the status code);
# --timeout; the generated completion scripts; `up`'s processes end with it
# (a closed stdout, and SIGKILL). A coordinator (and a TLS one)
# listen on port 0, read back from ports files; every process started is
# killed on exit.
set -u

source "$(dirname "$0")/cli_test_lib.sh"
R="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-pipetrain}"
COORDINATOR="$R/coordinator/pipetrain-coordinator"
WORKER="$R/worker/pipetrain-worker"
CLI_OK_OUT="$OUT"
unset PIPETRAIN_COORDINATOR PIPETRAIN_TOKEN PIPETRAIN_CA PIPETRAIN_TLS_CERT PIPETRAIN_TLS_KEY

# The leftover-process checks count with pgrep: without it they would
# count nothing, and pass.
if ! command -v pgrep >/dev/null; then
  echo "FAIL: pgrep is missing (Debian package procps; scripts/setup.sh installs it)"
  exit 1
fi
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT
# Waits (bounded, polling an observable condition) for a non-empty file.
await_file() { for _ in $(seq 1 600); do [[ -s "$1" ]] && return 0; sleep 0.05; done; return 1; }
port_of() { sed -E "s/.*\"$2\": *([0-9]+).*/\1/" "$1"; }
# check NAME PYTHON-EXPRESSION: the expression on the JSON in $OUT (as j).
check() {
  if python3 -c "import json,sys; j=json.load(open('$OUT')); sys.exit(0 if ($2) else 1)"; then
    passed=$((passed + 1))
  else
    fail "$1" "JSON check failed: $2 on $(head -c 400 "$OUT" | tr -d '\n')"
  fi
}
# ok NAME COMMAND...: the command succeeds.
ok() {
  local name=$1
  shift
  if "$@"; then passed=$((passed + 1)); else fail "$name" "'$*' failed"; fi
}

# --version: all three binaries, exit 0, one line with version, commit, date.
version_re='^[a-z-]+ [0-9]+\.[0-9]+\.[0-9]+ \(commit ([0-9a-f]{7,40}|unknown), built ([0-9]{4}-[0-9]{2}-[0-9]{2}|unknown)\)$'
for binary in "$BIN" "$COORDINATOR" "$WORKER"; do
  name=$(basename "$binary")
  "$binary" --version >"$OUT" 2>"$ERR"
  rc=$?
  if [[ $rc -ne 0 ]]; then
    fail "version_$name" "exit $rc"
  elif [[ $(wc -l <"$OUT") -ne 1 ]] || ! grep -qE "$version_re" "$OUT" ||
    ! grep -q "^$name " "$OUT"; then
    fail "version_$name" "stdout '$(cat "$OUT")' is not '$name X.Y.Z (commit C, built D)'"
  else
    passed=$((passed + 1))
  fi
done
expect_exit version_command 0 "pipetrain " "(commit " -- version
pipetrain_version=$(cat "$OUT")
expect_exit version_flag_same 0 "$pipetrain_version" -- --version

# The operator's flags that name the wrong thing are refused at start-up
# (exit 2), not at the first job: a --data-root that is no directory, and
# --advertise-address without the etcd cluster it is for.
BIN="$COORDINATOR" expect_exit coordinator_data_root_missing 2 \
  "--data-root: $TMP/no-such-root is not a directory this process can read" -- \
  --insecure --data-root="$TMP,$TMP/no-such-root" --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0
BIN="$COORDINATOR" expect_exit coordinator_advertise_without_etcd 2 \
  "--advertise-address names the leader's address to followers, so it needs --etcd-endpoints" -- \
  --insecure --advertise-address=10.0.0.1:7070 --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0
BIN="$COORDINATOR" expect_exit coordinator_etcd_tls_without_etcd 2 \
  "--etcd-ca, --etcd-cert and --etcd-key are for the etcd of --etcd-endpoints, which is not given" -- \
  --insecure --etcd-ca="$TMP/ca.pem" --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0
BIN="$COORDINATOR" expect_exit coordinator_etcd_prefix_without_etcd 2 \
  "--etcd-prefix and --leader-lease-seconds are for the etcd of --etcd-endpoints, which is not given" -- \
  --insecure --etcd-prefix=/mine/ --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0
BIN="$COORDINATOR" expect_exit coordinator_heartbeat_below_50ms 2 \
  "--heartbeat-seconds must be >= 0.05 (workers heartbeat at most every 50 ms)" -- \
  --insecure --heartbeat-seconds=0.01 --lease-seconds=0.04 --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0
BIN="$COORDINATOR" expect_exit coordinator_profile_timeout_out_of_range 2 \
  "--profile-timeout-seconds must be in [10, 86400]" -- \
  --insecure --profile-timeout-seconds=5 --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0
BIN="$COORDINATOR" expect_exit coordinator_etcd_cert_without_ca 2 \
  "--etcd-cert and --etcd-key need --etcd-ca (TLS)" -- \
  --insecure --etcd-endpoints=127.0.0.1:2379 --etcd-cert="$TMP/c.pem" --etcd-key="$TMP/c.key" \
  --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0
BIN="$COORDINATOR" expect_exit coordinator_etcd_ca_missing 2 \
  "--etcd-ca: cannot read $TMP/no-such-ca.pem" -- \
  --insecure --etcd-endpoints=127.0.0.1:2379 --etcd-ca="$TMP/no-such-ca.pem" \
  --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0
BIN="$COORDINATOR" expect_exit coordinator_network_without_unit 2 \
  '--network "10,50us": bandwidth needs a unit: Gbit, Mbit, GB or MB (per second)' -- \
  --insecure --network=10,50us --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0
BIN="$COORDINATOR" expect_exit coordinator_etcd_user_without_password 2 \
  "--etcd-user and --etcd-password-file go together" -- \
  --insecure --etcd-endpoints=127.0.0.1:2379 --etcd-user=pipetrain \
  --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0
BIN="$COORDINATOR" expect_exit coordinator_etcd_user_without_etcd 2 \
  "--etcd-user is for the etcd of --etcd-endpoints, which is not given" -- \
  --insecure --etcd-user=pipetrain --etcd-password-file="$TMP/user.token" \
  --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0
BIN="$COORDINATOR" expect_exit coordinator_etcd_https_without_ca 2 \
  "is https but no TLS is configured; give etcd's CA (--etcd-ca)" -- \
  --insecure --etcd-endpoints=https://127.0.0.1:2379 --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0
BIN="$WORKER" expect_exit worker_data_tls_partial 2 \
  "--data-tls-cert, --data-tls-key and --data-tls-ca go together" -- \
  --join-token=j --data-tls-ca="$TMP/ca.pem"
BIN="$COORDINATOR" expect_exit coordinator_worker_tls_partial 2 \
  "--worker-tls-ca, --worker-tls-cert and --worker-tls-key go together" -- \
  --insecure --worker-tls-ca="$TMP/ca.pem" --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0
BIN="$COORDINATOR" expect_exit coordinator_worker_tls_name_alone 2 \
  "--worker-tls-server-name names the workers' certificates" -- \
  --insecure --worker-tls-server-name=pipetrain-worker --grpc-address=127.0.0.1:0 \
  --http-address=127.0.0.1:0
# A --state-dir inside --output-dir is refused (jobs name files there),
# also one that does not exist yet, named through a link with a trailing
# slash (it is resolved through its parent).
# Under timeout: a coordinator that missed the overlap would serve on
# (exit 124 then fails the check).
mkdir -p "$TMP/overlap-out"
ln -sfn "$TMP/overlap-out" "$TMP/overlap-link"
printf '#!/bin/bash\nexec timeout 20 "%s" "$@"\n' "$COORDINATOR" >"$TMP/coordinator-20s.sh"
chmod +x "$TMP/coordinator-20s.sh"
BIN="$TMP/coordinator-20s.sh" expect_exit coordinator_state_dir_inside_output 2 \
  "--state-dir $TMP/overlap-link/state/ and --output-dir $TMP/overlap-out overlap" -- \
  --insecure --output-dir="$TMP/overlap-out" --state-dir="$TMP/overlap-link/state/" \
  --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0
BIN="$WORKER" expect_exit worker_listen_wildcard 2 \
  "--listen 0.0.0.0:7100 is a wildcard address, which the worker would advertise" -- \
  --join-token=j --listen=0.0.0.0:7100
BIN="$WORKER" expect_exit worker_metrics_wildcard 2 \
  "--metrics-address [::]:9100 is a wildcard address, which the worker would advertise" -- \
  --join-token=j --metrics-address=[::]:9100
# Where no GPU is visible auto is the CPU, so a GPU-only mode is a usage
# error before any work (exit 2), as train-local and `up` say.
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  BIN="$WORKER" expect_exit worker_auto_bf16_without_gpu 2 \
    "--gemm bf16 needs a CUDA device" "(--device auto is the CPU here" -- \
    --join-token=j --device=auto --gemm=bf16
fi
BIN="$WORKER" expect_exit worker_data_root_missing 2 \
  "--data-root: $TMP/no-such-root is not a directory this process can read" -- \
  --join-token=j --data-root="$TMP/no-such-root"

# A coordinator with a user token, and one worker registered with it.
echo u-token >"$TMP/user.token"
echo wrong >"$TMP/wrong.token"
"$COORDINATOR" --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0 \
  --ports-file="$TMP/c.ports" --join-token=j --user-token-file="$TMP/user.token" \
  >"$TMP/coordinator.log" 2>&1 &
pids+=($!)
ok coordinator_up await_file "$TMP/c.ports"
addr="127.0.0.1:$(port_of "$TMP/c.ports" grpc_port)"
"$WORKER" --coordinator="$addr" --join-token=j --ports-file="$TMP/w.ports" \
  >"$TMP/worker.log" 2>&1 &
pids+=($!)
ok worker_up await_file "$TMP/w.ports"
registered() {
  "$BIN" workers --json --coordinator="$addr" --token-file="$TMP/user.token" >"$OUT" 2>"$ERR" &&
    python3 -c "import json; exit(0 if json.load(open('$OUT'))['workers'] else 1)"
}
await_registered() { for _ in $(seq 1 600); do registered && return 0; sleep 0.05; done; return 1; }
ok worker_registered await_registered

# Environment variables: the address and token from the environment.
export PIPETRAIN_COORDINATOR="$addr" PIPETRAIN_TOKEN=u-token
expect_exit env_workers_json 0 '"workers"' -- workers --json
check workers_json 'len(j["workers"]) == 1 and j["workers"][0]["id"] != "" and j["workers"][0]["state"] == "WORKER_STATE_READY"'
# Each worker is listed with the build it registered (the coordinator
# takes only its own): the commit --version names.
worker_commit=$("$WORKER" --version | sed -E 's/.*\(commit ([^,]*),.*/\1/')
check workers_json_build "j['workers'][0]['build']['commit'] == '$worker_commit' and j['workers'][0]['build']['version'] != ''"
expect_exit workers_table 0 "DATA ADDRESS" "BUILD" "$worker_commit" -- workers

# A job that needs two stages waits QUEUED beside the one worker: jobs are
# listed without training anything.
cat >"$TMP/job.json" <<'JSON'
{"name": "cli-test", "model": {"nLayer": 2, "nHead": 2, "dModel": 16},
 "training": {"seqLen": 8, "batchSize": 2, "steps": 5},
 "data": {"syntheticBytes": 5000}, "parallelism": {"stages": 2}}
JSON
expect_exit submit 0 "QUEUED" -- submit "$TMP/job.json"
job_id=$(cut -d' ' -f1 "$OUT")
expect_exit jobs_json 0 '"jobs"' -- jobs --json
check jobs_json_lists_the_job "[x['id'] for x in j['jobs']] == ['$job_id'] and j['jobs'][0]['spec']['name'] == 'cli-test'"
# Paged: one job per call, every page read (three jobs, in submission order).
expect_exit submit_second 0 "QUEUED" -- submit "$TMP/job.json"
second_id=$(cut -d' ' -f1 "$OUT")
expect_exit submit_third 0 "QUEUED" -- submit "$TMP/job.json"
third_id=$(cut -d' ' -f1 "$OUT")
expect_exit jobs_json_paged 0 '"jobs"' -- jobs --json --page-size=1
check jobs_json_every_page "[x['id'] for x in j['jobs']] == ['$job_id', '$second_id', '$third_id']"
expect_exit workers_json_paged 0 '"workers"' -- workers --json --page-size=1
check workers_json_every_page 'len(j["workers"]) == 1'
expect_exit jobs_negative_page_size 2 "--page-size must be 0 or more, got -1" -- jobs --page-size=-1
expect_exit workers_negative_page_size 2 "--page-size must be 0 or more" -- workers --page-size=-2
# Flag combinations and empty ids are the command line's mistakes (2), found
# before any file is read or call made.
expect_exit tls_cert_without_key 2 "--tls-cert and --tls-key must be given together" -- \
  jobs --tls-cert="$TMP/no-such-cert.pem"
expect_exit tls_cert_without_ca 2 "need --tls-ca" -- \
  jobs --tls-cert="$TMP/no-such-cert.pem" --tls-key="$TMP/no-such-key.pem"
expect_exit job_empty_id 2 "the argument is empty" -- job ""
expect_exit cancel_empty_id 2 "the argument is empty" -- cancel ""
expect_exit jobs_table 0 "$job_id" "cli-test" -- jobs
# Columns line up under their headers however long the ids are.
if python3 -c "
import sys
lines = open('$OUT').read().splitlines()
col = lines[0].index('STATE')
sys.exit(0 if len(lines) == 4 and all(l[col:].startswith('QUEUED') for l in lines[1:]) else 1)"; then
  passed=$((passed + 1))
else
  fail jobs_table_aligned "STATE column misaligned: $(cat "$OUT")"
fi
expect_exit job_json 0 "\"$job_id\"" -- job "$job_id" --json
check job_json_is_the_job "j['id'] == '$job_id' and j['state'] == 'JOB_STATE_QUEUED'"
# The report of a job with no plan yet: its state and why it waits.
expect_exit job_report_queued 0 "job $job_id QUEUED, no step yet" "reason: waiting for 2 READY" \
  -- job "$job_id" --report
expect_exit job_report_not_json 2 "--report prints text on its own" -- job "$job_id" --report --json
# A timeline that cannot be written is the command line's mistake, found
# before anything is asked or printed.
expect_exit job_timeline_no_dir 2 "--timeline $TMP/no-such-dir/t.svg: the directory $TMP/no-such-dir does not exist" \
  -- job "$job_id" --timeline "$TMP/no-such-dir/t.svg"
ok job_timeline_no_dir_printed_nothing test ! -s "$OUT"
expect_exit job_timelines_one_file 2 "--measured-timeline $TMP/t.svg is also --timeline $TMP/t.svg; each output needs its own file" \
  -- job "$job_id" --timeline "$TMP/t.svg" --measured-timeline "$TMP/t.svg"
ok job_timelines_one_file_wrote_nothing test ! -e "$TMP/t.svg"
# A newline in PIPETRAIN_TOKEN (a Secret's file ends in one) is dropped;
# a control character inside is refused, not sent (gRPC would abort).
PIPETRAIN_TOKEN="$(cat "$TMP/user.token")"$'\n' expect_exit env_token_newline 0 '"jobs"' -- jobs --json
PIPETRAIN_TOKEN=$'u-\x01token' expect_exit env_token_control 67 "PIPETRAIN_TOKEN contains whitespace, control or non-ASCII characters" -- jobs
# A port gRPC would wrap is refused before the token goes anywhere.
expect_exit coordinator_port_out_of_range 2 "is not host:port with a port in [1, 65535]" -- \
  jobs --coordinator 127.0.0.1:99999
# Flags override the environment.
PIPETRAIN_COORDINATOR=127.0.0.1:1 expect_exit flag_beats_env_address 0 '"jobs"' -- \
  jobs --json --coordinator="$addr"
PIPETRAIN_TOKEN=wrong expect_exit flag_beats_env_token 0 '"jobs"' -- \
  jobs --json --token-file="$TMP/user.token"

# Exit codes: 64 + the status code of the failed call.
# A rejected token's error says where the CLI took it from.
PIPETRAIN_TOKEN=wrong expect_exit unauthenticated 80 "UNAUTHENTICATED" \
  "[the token sent was \$PIPETRAIN_TOKEN's]" -- jobs
unset PIPETRAIN_TOKEN
expect_exit no_token_unauthenticated 80 "UNAUTHENTICATED: missing credential" -- workers --json
export PIPETRAIN_TOKEN=u-token
expect_exit wrong_token_file_unauthenticated 80 "UNAUTHENTICATED" \
  "[the token sent was --token-file $TMP/wrong.token's]" -- jobs --token-file="$TMP/wrong.token"
# --coordinator naming the REST port: gRPC's words, and what to give instead.
expect_exit coordinator_is_http_port 78 "is an HTTP port" "--grpc-address" -- \
  jobs --coordinator="127.0.0.1:$(port_of "$TMP/c.ports" http_port)"
expect_exit not_found_job 69 "NOT_FOUND" -- job no-such-job --json
expect_exit not_found_cancel 69 "NOT_FOUND" -- cancel no-such-job
expect_exit not_found_drain 69 "NOT_FOUND" -- drain no-such-worker
# The coordinator quotes an unknown id escaped (its \x1b), and the CLI
# prints that message terminal-safe (its backslash doubled); an id over 128
# bytes is refused before any lookup, quoted cut (a 20 KB id once made the
# answer's trailers too large for the client).
expect_exit not_found_escaped 69 "NOT_FOUND" 'no-\\x1b[31m-job' -- job $'no-\e[31m-job'
if grep -q $'\e' "$ERR"; then
  fail not_found_escaped_raw "stderr has a raw ESC"
else
  passed=$((passed + 1))
fi
expect_exit long_id 67 "INVALID_ARGUMENT" "job id" "is 2000 bytes; the limit is 128" -- \
  job "$(printf 'x%.0s' {1..2000})"
# Past the method's request bound (16 KiB), refused before it is parsed.
expect_exit huge_id 72 "RESOURCE_EXHAUSTED" "GetJob: a request of 20004 bytes" \
  "over this method's limit of 16384 bytes" -- job "$(printf 'x%.0s' {1..20000})"
sed 's/"nHead": 2/"nHead": 3/' "$TMP/job.json" >"$TMP/bad-heads.json"
expect_exit invalid_spec 67 "INVALID_ARGUMENT" -- submit "$TMP/bad-heads.json"
echo '{"model": {"nLayer": "two"}' >"$TMP/malformed.json"
expect_exit malformed_spec 67 "INVALID_ARGUMENT" -- submit "$TMP/malformed.json"
expect_exit missing_spec 69 "NOT_FOUND" -- submit "$TMP/no-such-file.json"
# The file may follow the flags (the spec is read before any call).
expect_exit missing_spec_after_flag 69 "NOT_FOUND" -- submit --follow "$TMP/no-such-file.json"
expect_exit usage_extra_word 2 "unexpected argument 'second'" -- cancel first second
expect_exit unavailable 78 "UNAVAILABLE" -- jobs --coordinator=127.0.0.1:1
PIPETRAIN_COORDINATOR=127.0.0.1:1 expect_exit env_address_used 78 "UNAVAILABLE" -- workers
expect_exit usage_unknown_flag 2 "unknown flag --no-such-flag" -- jobs --no-such-flag
expect_exit usage_missing_id 2 "missing argument" -- job
# --request-id: the same id and spec again is the same job, not a second
# one; another spec under it is ALREADY_EXISTS (64 + 6), naming the job.
expect_exit submit_request_id 0 "QUEUED" -- submit "$TMP/job.json" --request-id cli-req-1
request_job=$(cut -d' ' -f1 "$OUT")
expect_exit submit_request_id_again 0 "$request_job QUEUED" -- \
  submit "$TMP/job.json" --request-id cli-req-1
sed 's/"steps": 5/"steps": 6/' "$TMP/job.json" >"$TMP/job-6-steps.json"
expect_exit submit_request_id_other_spec 70 "ALREADY_EXISTS" "was submitted as job $request_job" -- \
  submit "$TMP/job-6-steps.json" --request-id cli-req-1
expect_exit submit_request_id_bad 67 "request_id: character" -- \
  submit "$TMP/job.json" --request-id "a b"
expect_exit submit_request_id_cancelled 0 "$request_job CANCELLED" -- cancel "$request_job"

# Ctrl-C on `submit --follow` stops the following, not the job, and says so
# (the job waits for workers this coordinator does not have).
"$BIN" "${CLI_PREFIX[@]}" submit --follow "$TMP/job.json" >"$TMP/follow-int.out" 2>"$TMP/follow-int.err" &
follow_pid=$!
pids+=("$follow_pid")
ok submit_follow_printed_id await_file "$TMP/follow-int.out"
# Why it waits is shown while it waits, not only when queue_timeout ends it.
said_why_queued() {
  for _ in $(seq 1 600); do grep -q "^QUEUED: waiting for" "$TMP/follow-int.err" && return 0; sleep 0.05; done
  return 1
}
ok submit_follow_says_why_it_waits said_why_queued
kill -INT "$follow_pid"
# Bounded: one that ignores Ctrl-C is killed, and fails the check below.
for _ in $(seq 1 600); do kill -0 "$follow_pid" 2>/dev/null || break; sleep 0.05; done
kill -KILL "$follow_pid" 2>/dev/null
wait "$follow_pid"
rc=$?
ok submit_follow_interrupted_exit_130 test "$rc" -eq 130
follow_id=$(cut -d' ' -f1 "$TMP/follow-int.out")
ok submit_follow_interrupted_said_so grep -q "job $follow_id keeps running (pipetrain cancel" \
  "$TMP/follow-int.err"
expect_exit submit_follow_job_still_queued 0 '"JOB_STATE_QUEUED"' -- job "$follow_id" --json
expect_exit submit_follow_job_cancelled 0 "$follow_id CANCELLED" -- cancel "$follow_id"
# Its stdout's reader gone (`| true`): it stops following as on Ctrl-C,
# exits 141 (128 + SIGPIPE) and names the job on stderr, which keeps running.
"$BIN" "${CLI_PREFIX[@]}" submit --follow "$TMP/job.json" 2>"$TMP/follow-pipe.err" </dev/null | true
rc=${PIPESTATUS[0]}
ok submit_follow_reader_gone_exit_141 test "$rc" -eq 141
ok submit_follow_reader_gone_said_so grep -q "keeps running (pipetrain cancel job-" "$TMP/follow-pipe.err"
pipe_id=$(sed -nE 's/.*job (job-[^ ]+) keeps running.*/\1/p' "$TMP/follow-pipe.err" | head -1)
[[ -n "$pipe_id" ]] && expect_exit submit_follow_reader_gone_job_cancelled 0 "$pipe_id CANCELLED" -- cancel "$pipe_id"

# --timeout: a listener that accepts connections and never answers. The
# call fails DEADLINE_EXCEEDED after the given deadline, not the default 10 s.
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
__import__("os").rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)' "$TMP/silent.port" &
pids+=($!)
ok silent_listener_up await_file "$TMP/silent.port"
silent="127.0.0.1:$(cat "$TMP/silent.port")"
start=$(date +%s%N)
expect_exit timeout_deadline 68 "DEADLINE_EXCEEDED" -- jobs --coordinator="$silent" --timeout=300ms
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
if [[ $elapsed_ms -lt 5000 ]]; then
  passed=$((passed + 1))
else
  fail timeout_honoured "took ${elapsed_ms} ms with --timeout=300ms"
fi
# Below gRPC's millisecond resolution a deadline could not be kept (a fast
# coordinator answered a 1ns one within the millisecond it became).
expect_exit timeout_below_resolution 2 "--timeout must be at least 1ms" -- jobs --timeout=1ns
expect_exit timeout_seconds 0 '"jobs"' -- jobs --json --timeout=30
expect_exit timeout_zero 2 "--timeout must be > 0" -- jobs --timeout=0
expect_exit timeout_junk 2 "--timeout: cannot parse 'soon'" -- jobs --timeout=soon
# Several coordinators: finding the leader is bounded by --timeout as well
# (it took 10 s whatever --timeout said), each listed one asked with a share
# of it, so a silent one does not hide the leader after it.
start=$(date +%s%N)
expect_exit timeout_leader_search 68 "DEADLINE_EXCEEDED: no coordinator of $silent, $silent led within 300ms" -- \
  jobs --coordinator="$silent,$silent" --timeout=300ms
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
if [[ $elapsed_ms -lt 5000 ]]; then
  passed=$((passed + 1))
else
  fail timeout_leader_search_honoured "took ${elapsed_ms} ms with --timeout=300ms"
fi
expect_exit leader_after_silent_one 0 '"jobs"' -- jobs --json --coordinator="$silent,$addr" --timeout=4s
# A malformed list is a usage error naming the flag, not an address.
expect_exit coordinator_empty_entry 2 '--coordinator: "a:1,,b:2" has an empty address' -- \
  jobs --coordinator=a:1,,b:2
expect_exit coordinator_empty 2 '--coordinator: "" has an empty address' -- jobs --coordinator=
PIPETRAIN_COORDINATOR=, expect_exit coordinator_env_empty_entries 2 '--coordinator: "," has an empty address' -- jobs

# `up` and the processes it starts end together. Each run trains "forever"
# (100000 steps), so only the event under test ends it.
# processes_of DIR: how many processes name DIR in their command line.
processes_of() { pgrep -f -- "--ports-file=$1/" | wc -l; }
# ended DIR: waits (bounded, polling) until none is left.
ended() { for _ in $(seq 1 600); do [[ $(processes_of "$1") -eq 0 ]] && return 0; sleep 0.05; done; return 1; }
UP=(up --workers 2 --steps 100000 --checkpoint-interval 0 --eval-interval 0)
# Bad flags are refused before anything starts, naming the flag.
expect_exit up_no_workers 2 "--workers must be >= 1, got 0" -- up --workers 0 --out "$TMP/up-bad"
# Over the coordinator's planning budget (4 stages x (4096 + 16 validation
# micro-batches) > 16384): refused before anything starts, naming the flag.
expect_exit up_planning_budget 2 "--micro-batches: 4 stages x (4096 micro-batches + 16 validation" -- \
  up --workers 4 --batch 4096 --micro-batches 4096 --out "$TMP/up-bad"
expect_exit up_manual_solver 2 "--solver manual needs spec.parallelism.manual_stages" -- \
  up --workers 2 --solver manual --out "$TMP/up-bad"
expect_exit up_loss_log_is_out 2 "--loss-log $TMP/up-new is a directory; name a file" -- \
  up --workers 1 --out "$TMP/up-new" --loss-log "$TMP/up-new"
ok up_loss_log_is_out_created_nothing test ! -e "$TMP/up-new"
expect_exit up_dp_stages_empty_part 2 '--dp-stages: "" is not a stage number' -- \
  up --workers 2 --data-parallel 2 --dp-codec bf16 --dp-stages , --out "$TMP/up-bad"
expect_exit up_bad_emulated_link 2 '--emulate-link "0Gbit,1ms": bandwidth must be a positive' -- \
  up --workers 2 --emulate-link 0Gbit,1ms --out "$TMP/up-bad"
expect_exit up_missing_data 2 "--data $TMP/no-such-corpus.txt: No such file or directory" -- \
  up --workers 2 --data "$TMP/no-such-corpus.txt" --out "$TMP/up-bad"
expect_exit up_data_directory 2 "--data $TMP is a directory; name a text file" -- \
  up --workers 2 --data "$TMP" --out "$TMP/up-bad"
expect_exit up_data_device 2 "--data /dev/zero is not a regular file (a device or FIFO); name a text file" -- \
  up --workers 2 --data /dev/zero --out "$TMP/up-bad"
# The corpus's directory becomes the processes' comma-separated --data-root.
mkdir -p "$TMP/lr=3e-4,bs=32" && echo "some text" > "$TMP/lr=3e-4,bs=32/corpus.txt"
expect_exit up_data_dir_with_comma 2 "has a comma, which the coordinator's and workers' --data-root" -- \
  up --workers 2 --data "$TMP/lr=3e-4,bs=32/corpus.txt" --out "$TMP/up-bad"
# --loss-log is written when the job ends: a path that cannot be is refused
# before the run, not after it.
expect_exit up_loss_log_no_dir 2 "--loss-log $TMP/no-such-dir/l.txt: the directory $TMP/no-such-dir does not exist" -- \
  up --workers 2 --loss-log "$TMP/no-such-dir/l.txt" --out "$TMP/up-bad"
# Nor for more steps than the job keeps losses of: the log would start at
# a later step, read as step 1.
expect_exit up_loss_log_too_many_steps 2 "--loss-log: the coordinator keeps the losses of the last 10000 steps" -- \
  up --workers 2 --steps 10001 --loss-log "$TMP/l.txt" --out "$TMP/up-bad"
ok up_loss_log_too_many_steps_wrote_nothing test ! -e "$TMP/l.txt"
# Nor may it be the corpus: it was written over after the run.
for _ in $(seq 1 300); do echo "some words of text to train on"; done >"$TMP/corpus.txt"
cp "$TMP/corpus.txt" "$TMP/corpus-copy.txt"
expect_exit up_loss_log_is_data 2 "--loss-log $TMP/corpus.txt is --data $TMP/corpus.txt; writing it would destroy an input" -- \
  up --workers 2 --data "$TMP/corpus.txt" --loss-log "$TMP/corpus.txt" --out "$TMP/up-bad"
ok up_loss_log_data_kept cmp -s "$TMP/corpus.txt" "$TMP/corpus-copy.txt"
# Nor a file up writes in --out: the jobs' output directory, the lock (a
# second run got in), a log.
for own in output up.lock worker-0.log; do
  expect_exit "up_loss_log_is_own_${own//[.-]/_}" 2 "--loss-log $TMP/up-bad/$own is one of the files the command writes in --out $TMP/up-bad ($own)" -- \
    up --workers 2 --loss-log "$TMP/up-bad/$own" --out "$TMP/up-bad"
done
# --synthetic-bytes sizes generated text: with --data it was ignored.
expect_exit up_synthetic_bytes_with_data 2 "--synthetic-bytes sizes generated text, and has no effect with --data" -- \
  up --workers 2 --data "$TMP/corpus.txt" --synthetic-bytes 5000 --out "$TMP/up-bad"
# up trains byte-level text: a token file of GPT-2 ids failed every
# worker's load once the cluster had started.
printf 'abcd' >"$TMP/tokens.bin"
expect_exit up_token_file 2 "reads as a file of token ids" -- \
  up --workers 2 --data "$TMP/tokens.bin" --out "$TMP/up-bad"
# ...also behind a link whose own name says text (the workers read the
# file by its real path).
ln -s "$TMP/tokens.bin" "$TMP/tokens-link.txt"
expect_exit up_token_file_behind_a_link 2 "reads as a file of token ids" -- \
  up --workers 2 --data "$TMP/tokens-link.txt" --out "$TMP/up-bad"
expect_exit up_min_lr_constant 2 "--min-lr: the cosine schedule's floor, with no effect under --lr-schedule constant; set --lr-schedule to cosine or --min-lr to 0" -- \
  up --workers 2 --lr 1e-3 --min-lr 1e-4 --out "$TMP/up-bad"
# Nothing at all: not even --out is made before the flags are checked.
ok up_bad_started_nothing test ! -e "$TMP/up-bad"
# A CUDA device this machine lacks is refused up front too, not by the
# workers once they and the coordinator have started (exit 78).
expect_exit up_cuda_device_missing 2 "--worker-device cuda:4096: " -- \
  up --workers 1 --worker-device cuda:4096 --out "$TMP/up-cuda"
if grep -qF "built without CUDA" "$ERR"; then  # then plain cuda as well
  expect_exit up_cuda_without_cuda 2 "--worker-device cuda: this binary was built without CUDA" -- \
    up --workers 1 --worker-device cuda --out "$TMP/up-cuda"
fi
# 3-D tensor parallelism has no CUDA path: refused with GPU workers.
expect_exit up_3d_on_cuda 2 "--tensor-mode 3d runs on CPU workers only" -- \
  up --workers 8 --data-parallel 1 --tensor-parallel 8 --tensor-mode 3d --worker-device cuda:each --out "$TMP/up-cuda"
ok up_cuda_started_nothing test ! -e "$TMP/up-cuda"
# An --out that cannot be made is named with the reason, as a usage error.
touch "$TMP/a-file"
expect_exit up_out_not_creatable 2 "--out $TMP/a-file/out: cannot create it: Not a directory" -- \
  up --workers 1 --out "$TMP/a-file/out"
# --out gets the tokens and the ports files that say where they go: one that
# another user owns or others may write in is refused before anything
# starts, and so is one another run holds.
mkdir -p "$TMP/up-shared" && chmod 1777 "$TMP/up-shared"
expect_exit up_out_world_writable 2 "--out $TMP/up-shared: mode 1777 lets its group or others write in it" -- \
  up --workers 1 --out "$TMP/up-shared"
ok up_out_world_writable_untouched test ! -e "$TMP/up-shared/up.lock"
# ... and so is one whose parent others may write in (not sticky): they
# could rename it and put their own in its place after the checks.
mkdir -p "$TMP/up-group" && chmod 0775 "$TMP/up-group"
expect_exit up_out_parent_group_writable 2 "(uid $(id -u), mode 0775) lets another user rename it" -- \
  up --workers 1 --out "$TMP/up-group/run"
ok up_out_parent_group_writable_untouched test ! -e "$TMP/up-group/run/up.lock"
# Nothing left behind: not even the directory it made before the checks.
ok up_out_refused_dir_removed test ! -e "$TMP/up-group/run"
if [[ $(id -u) -eq 0 ]]; then  # only root can hand a directory to another user
  mkdir -p "$TMP/up-theirs" && chmod 755 "$TMP/up-theirs" && chown 4242 "$TMP/up-theirs"
  expect_exit up_out_another_users 2 "--out $TMP/up-theirs: owned by uid 4242, not by this user (uid 0)" -- \
    up --workers 1 --out "$TMP/up-theirs"
  ok up_out_another_users_untouched test ! -e "$TMP/up-theirs/up.lock"
fi
mkdir -p "$TMP/up-locked" && chmod 700 "$TMP/up-locked"
# Holds the lock as another `up` would (flock on up.lock), until killed.
python3 -c '
import fcntl, os, sys, time
f = open(sys.argv[1] + "/up.lock", "w"); fcntl.flock(f, fcntl.LOCK_EX)
f.write("%d\n" % os.getpid()); f.flush(); open(sys.argv[1] + "/held", "w").write("1")
time.sleep(600)' "$TMP/up-locked" &
locker=$!
pids+=("$locker")
ok up_lock_held await_file "$TMP/up-locked/held"
expect_exit up_out_in_use 2 "--out $TMP/up-locked: in use by another \`pipetrain up\` (pid $locker)" -- \
  up --workers 1 --out "$TMP/up-locked"
ok up_out_in_use_started_nothing test ! -e "$TMP/up-locked/coordinator.ports"
# A run to its end leaves the plan's predicted step and the workers'
# measured one (a 3-step plan traces its last) as SVG beside its logs.
expect_exit up_timelines 0 "timelines: predicted $TMP/up-short/timeline-predicted.svg, measured (step 3) $TMP/up-short/timeline-measured.svg" -- \
  up --workers 1 --steps 3 --checkpoint-interval 0 --eval-interval 0 --out "$TMP/up-short" \
  --loss-log "$TMP/up-short/losses.txt"
ok up_measured_timeline grep -q "measured step 3 (workers" "$TMP/up-short/timeline-measured.svg"
# One worker sends nothing: one line says so (it printed a heading over an
# empty table); the metrics address, dead once up has returned, is not
# printed, the logs directory is.
ok up_one_worker_links_line grep -qx "links: no tensor sent by all workers" "$OUT"
ok up_no_dead_metrics_url test "$(grep -c "metrics: http" "$OUT")" -eq 0
ok up_logs_line grep -qx "logs: $TMP/up-short" "$OUT"
# --loss-log in the --out directory up creates: allowed, written.
ok up_loss_log_in_new_out test "$(wc -l <"$TMP/up-short/losses.txt")" -eq 3
# The weights go to the output directory in --out, and a --loss-log there
# may not replace them.
ok up_weights_in_output grep -qx "weights: $TMP/up-short/output/weights.safetensors" "$OUT"
expect_exit up_loss_log_is_weights 2 "--loss-log $TMP/up-short/output/weights.safetensors is one of the files the command writes in the output directory $TMP/up-short/output (weights.safetensors)" -- \
  up --workers 1 --loss-log "$TMP/up-short/output/weights.safetensors" --out "$TMP/up-short"
# A --loss-log that cannot take the losses fails the run, naming why, after
# its report (the final flush of a full disk went unchecked: exit 0).
if [[ -w /dev/full ]]; then
  expect_exit up_loss_log_full 72 "--loss-log: cannot write /dev/full: No space left on device" -- \
    up --workers 1 --steps 3 --checkpoint-interval 0 --eval-interval 0 --loss-log /dev/full --out "$TMP/up-full"
fi
# A --loss-log FIFO: its reader (cat) gets the losses; with none, the run
# fails after its report, naming why (a blocking open waited for ever with
# the cluster up, past Ctrl-C).
mkfifo "$TMP/losses.fifo"
cat "$TMP/losses.fifo" >"$TMP/losses-read.txt" &
cat_pid=$!
expect_exit up_loss_log_fifo_read 0 "logs: $TMP/up-fifo" -- \
  up --workers 1 --steps 3 --checkpoint-interval 0 --eval-interval 0 --loss-log "$TMP/losses.fifo" --out "$TMP/up-fifo"
wait "$cat_pid"
ok up_loss_log_fifo_reader_got_them test "$(wc -l <"$TMP/losses-read.txt")" -eq 3
expect_exit up_loss_log_fifo_no_reader 73 "--loss-log: $TMP/losses.fifo is a FIFO with no reader; start its reader first, or name a regular file" -- \
  up --workers 1 --steps 3 --checkpoint-interval 0 --eval-interval 0 --loss-log "$TMP/losses.fifo" --out "$TMP/up-fifo"
# A closed stdout (`up | head`) ends the run as Ctrl-C does: the cluster is
# stopped before up exits, so nothing is left once the pipeline returns.
"$BIN" "${UP[@]}" --out "$TMP/up-pipe" 2>&1 | head -c 1 >/dev/null
if [[ -s "$TMP/up-pipe/coordinator.ports" && $(processes_of "$TMP/up-pipe") -eq 0 ]]; then
  passed=$((passed + 1))
else
  fail up_stdout_closed "$(processes_of "$TMP/up-pipe") processes left: $(pgrep -af -- "$TMP/up-pipe/")"
  pkill -KILL -f -- "--ports-file=$TMP/up-pipe/"
fi
# Only stdout closed (`up | true`): the progress goes to stderr and stdout
# has nothing until the job's end, so SIGPIPE alone came only after the
# 100000 steps. up notices at its next poll and stops as on Ctrl-C.
"$BIN" "${UP[@]}" --out "$TMP/up-true" 2>"$TMP/up-true.err" | true
rc=${PIPESTATUS[0]}
ok up_stdout_reader_gone_exit_141 test "$rc" -eq 141  # 128 + SIGPIPE
ok up_stdout_reader_gone_said_so grep -q "interrupted; stopping the cluster" "$TMP/up-true.err"
ok up_stdout_reader_gone_nothing_left test "$(processes_of "$TMP/up-true")" -eq 0
# Killed outright, up cleans nothing up: the kernel sends its children
# SIGTERM (SpawnOptions::exit_with_parent), and they end.
"$BIN" "${UP[@]}" --out "$TMP/up-kill" >"$TMP/up-kill.out" 2>&1 &
up_pid=$!
pids+=("$up_pid")
ok up_started await_file "$TMP/up-kill/worker-1.ports"
kill -KILL "$up_pid"
if ended "$TMP/up-kill"; then
  passed=$((passed + 1))
else
  fail up_killed "its processes outlived it: $(pgrep -af -- "$TMP/up-kill/")"
  pkill -KILL -f -- "--ports-file=$TMP/up-kill/"
fi
# A coordinator that dies under up ends the run saying how, and where its
# log is (up printed gRPC's "connection refused" alone).
"$BIN" "${UP[@]}" --out "$TMP/up-coord" >"$TMP/up-coord.out" 2>&1 &
up_pid=$!
pids+=("$up_pid")
ok up_coord_started await_file "$TMP/up-coord/worker-1.ports"
# submitted FILE: up's "job ..." line is in FILE (the job was submitted).
submitted() { for _ in $(seq 1 600); do grep -q "^job job-" "$1" && return 0; sleep 0.05; done; return 1; }
ok up_coord_job_submitted submitted "$TMP/up-coord.out"
pkill -KILL -f -- "--ports-file=$TMP/up-coord/coordinator[.]ports"
wait "$up_pid"
rc=$?
ok up_coordinator_died_exit_78 test "$rc" -eq 78  # 64 + UNAVAILABLE
ok up_coordinator_died_said_how grep -q "the coordinator ended: killed by signal 9 (SIGKILL); its log: $TMP/up-coord/coordinator.log" "$TMP/up-coord.out"
ok up_coordinator_died_nothing_left ended "$TMP/up-coord"
# A worker that dies is news at once, on stderr (a job still waiting for
# it said nothing for up to its queue timeout).
"$BIN" "${UP[@]}" --out "$TMP/up-worker" >"$TMP/up-worker.out" 2>"$TMP/up-worker.err" &
up_pid=$!
pids+=("$up_pid")
ok up_worker_started await_file "$TMP/up-worker/worker-1.ports"
ok up_worker_job_submitted submitted "$TMP/up-worker.err"
pkill -KILL -f -- "--ports-file=$TMP/up-worker/worker-1[.]ports"
said_worker_ended() { grep -q "worker-1 ended: killed by signal 9 (SIGKILL)" "$TMP/up-worker.err"; }
await_said() { for _ in $(seq 1 600); do said_worker_ended && return 0; sleep 0.05; done; return 1; }
ok up_worker_died_said_at_once await_said
# Ended already when the job had no plan yet (below): no such process.
kill -TERM "$up_pid" 2>/dev/null
wait "$up_pid"
ok up_worker_died_nothing_left ended "$TMP/up-worker"
# A worker that ends before the job's first plan, which needs every worker,
# ends the run at once (78, as a worker that did not start), naming it and
# its log, the job cancelled: up starts no other, and the job waited for it
# until its queue timeout, an hour. This worker writes its ports file, as
# one whose registration is then refused does, and exits 1; up finds it
# first in $TEST_SRCDIR (FindSiblingBinary), beside the real coordinator.
fake_root="$TMP/fake-srcdir/pipetrain"
mkdir -p "$fake_root/coordinator" "$fake_root/worker"
ln -s "$COORDINATOR" "$fake_root/coordinator/pipetrain-coordinator"
cat >"$fake_root/worker/pipetrain-worker" <<'FAKE'
#!/bin/bash
for arg in "$@"; do [[ $arg == --ports-file=* ]] && ports=${arg#--ports-file=}; done
echo '{"data_port": 1, "metrics_port": 1}' >"$ports.tmp" && mv "$ports.tmp" "$ports"
echo "fake worker: registration refused" >&2
exit 1
FAKE
chmod +x "$fake_root/worker/pipetrain-worker"
# Bounded by timeout (exit 124; its SIGTERM stops up's cluster) only so that
# a regression fails rather than holding the test for the hour.
TEST_SRCDIR="$TMP/fake-srcdir" timeout 120 "$BIN" up --workers 1 --steps 3 \
  --checkpoint-interval 0 --eval-interval 0 --out "$TMP/up-fake" >"$OUT" 2>"$ERR" </dev/null
rc=$?
ok up_worker_died_before_plan_exit_78 test "$rc" -eq 78  # 64 + UNAVAILABLE
ok up_worker_died_before_plan_named grep -qF \
  "worker-0 ended: exit code 1; its log: $TMP/up-fake/worker-0.log; job job-" "$ERR"
ok up_worker_died_before_plan_cancelled grep -qF \
  "cannot start without it (its first plan needs every worker), so it was cancelled" "$ERR"
ok up_worker_died_before_plan_nothing_left ended "$TMP/up-fake"

# With --keep-running, up still watches its cluster after the job: a
# coordinator that dies ends up (78), saying how, rather than "cluster
# running" staying up beside a dead address and a zombie.
# Its --out used before, by a run with more workers: their ports files
# go, and the logs are this run's only.
mkdir -m 0700 "$TMP/up-keep"
echo '{"metrics_port": 1}' >"$TMP/up-keep/worker-5.ports"
echo "a stale line of an earlier run" >"$TMP/up-keep/worker-0.log"
"$BIN" up --workers 1 --steps 3 --checkpoint-interval 0 --eval-interval 0 --keep-running \
  --out "$TMP/up-keep" >"$TMP/up-keep.out" 2>&1 &
up_pid=$!
pids+=("$up_pid")
running() { for _ in $(seq 1 1200); do grep -q "^cluster running: " "$1" && return 0; sleep 0.05; done; return 1; }
ok up_keep_running_said running "$TMP/up-keep.out"
# Jobs name their files under the coordinator's --output-dir, --out/output:
# weights named up.lock leave the run's lock (holding up's pid) alone, and
# so a second `up` on this --out is still refused.
cat >"$TMP/up-lock-job.json" <<'JSON'
{"name": "weights-named-up-lock", "model": {"nLayer": 1, "nHead": 1, "dModel": 8},
 "training": {"seqLen": 4, "batchSize": 1, "steps": 3},
 "data": {"syntheticBytes": 5000}, "parallelism": {"stages": 1},
 "checkpoint": {"intervalSteps": 1}, "output": {"weightsPath": "up.lock"}}
JSON
keep_addr=$(sed -nE 's/^cluster running: --coordinator ([^ ]+) .*/\1/p' "$TMP/up-keep.out")
expect_exit up_keep_weights_named_up_lock 0 "SUCCEEDED" -- submit "$TMP/up-lock-job.json" \
  --follow --coordinator="$keep_addr" --token-file="$TMP/up-keep/user.token"
ok up_keep_lock_untouched grep -qx "$up_pid" "$TMP/up-keep/up.lock"
ok up_keep_weights_in_output test -s "$TMP/up-keep/output/up.lock"
expect_exit up_keep_out_still_locked 2 "--out $TMP/up-keep: in use by another \`pipetrain up\` (pid $up_pid)" -- \
  up --workers 1 --steps 1 --checkpoint-interval 0 --eval-interval 0 --out "$TMP/up-keep"
pkill -KILL -f -- "--ports-file=$TMP/up-keep/coordinator[.]ports"
wait "$up_pid"
rc=$?
ok up_keep_running_coordinator_died_exit_78 test "$rc" -eq 78  # 64 + UNAVAILABLE
ok up_keep_running_coordinator_died_said_how grep -q "the coordinator ended: killed by signal 9 (SIGKILL); its log: $TMP/up-keep/coordinator.log" "$TMP/up-keep.out"
ok up_keep_running_nothing_left ended "$TMP/up-keep"
ok up_reused_out_stale_ports_gone test ! -e "$TMP/up-keep/worker-5.ports"
ok up_reused_out_log_fresh test "$(grep -c "a stale line" "$TMP/up-keep/worker-0.log")" -eq 0

# up_stopped_by NAME SIGNAL CODE: up, once its workers are up, sent SIGNAL,
# stops its cluster as on Ctrl-C, says so and exits CODE (128 + SIGNAL).
up_stopped_by() {
  local name="$1" signal="$2" code="$3"
  "$BIN" "${UP[@]}" --out "$TMP/up-$name" >"$TMP/up-$name.out" 2>&1 &
  up_pid=$!
  pids+=("$up_pid")
  ok "up_${name}_started" await_file "$TMP/up-$name/worker-1.ports"
  kill "-$signal" "$up_pid"
  wait "$up_pid"
  rc=$?
  ok "up_${name}_exit_$code" test "$rc" -eq "$code"
  ok "up_${name}_said_so" grep -q "interrupted; stopping the cluster" "$TMP/up-$name.out"
  ok "up_${name}_nothing_left" test "$(processes_of "$TMP/up-$name")" -eq 0
}
# SIGTERM (a supervisor stopping it): 143, which a script can tell from
# Ctrl-C's 130. SIGHUP (its terminal closed): 129.
up_stopped_by term TERM 143
up_stopped_by hup HUP 129
# Under nohup SIGHUP stays ignored (the kernel's view: SigIgn has it,
# SigCgt not), so the run outlives its terminal.
nohup "$BIN" "${UP[@]}" --out "$TMP/up-nohup" >"$TMP/up-nohup.out" 2>&1 &
up_pid=$!
pids+=("$up_pid")
ok up_nohup_started await_file "$TMP/up-nohup/worker-1.ports"
sighup_ignored() {
  python3 - "$1" <<'PY'
import sys
fields = dict(l.split(':', 1) for l in open(f'/proc/{sys.argv[1]}/status') if ':' in l)
ignored, caught = int(fields['SigIgn'], 16), int(fields['SigCgt'], 16)
sys.exit(0 if ignored & 1 and not caught & 1 and caught & (1 << 14) else 1)  # SIGHUP, SIGTERM
PY
}
ok up_nohup_sighup_ignored sighup_ignored "$up_pid"
kill -HUP "$up_pid"
kill -TERM "$up_pid"
wait "$up_pid"
rc=$?
ok up_nohup_terminated_exit_143 test "$rc" -eq 143
ok up_nohup_nothing_left test "$(processes_of "$TMP/up-nohup")" -eq 0
# Ctrl-C at a terminal sends SIGINT to the whole foreground process group
# (here: kill -INT to up's own group). up's children are in groups of their
# own, so only up sees it and stops them in order: cancel the job, then
# the workers, then the coordinator, which is sent SIGTERM, never SIGINT.
python3 -c 'import os, sys; os.setpgid(0, 0); os.execv(sys.argv[1], sys.argv[1:])' \
  "$BIN" "${UP[@]}" --out "$TMP/up-int" >"$TMP/up-int.out" 2>&1 &
up_pid=$!
pids+=("$up_pid")
ok up_int_started await_file "$TMP/up-int/worker-1.ports"
own_groups=yes
seen=0
for p in $(pgrep -f -- "--ports-file=$TMP/up-int/"); do
  seen=$((seen + 1))
  [[ $(ps -o pgid= -p "$p" | tr -d ' ') != "$up_pid" ]] || own_groups="no: $p"
done
ok up_children_own_groups test "$own_groups" = yes
ok up_children_all_seen test "$seen" -eq 3  # the coordinator and 2 workers
kill -INT -- "-$up_pid"
for _ in $(seq 1 1200); do kill -0 "$up_pid" 2>/dev/null || break; sleep 0.05; done
wait "$up_pid"
rc=$?
ok up_interrupted_exit_130 test "$rc" -eq 130
ok up_interrupted_said_so grep -q "interrupted; stopping the cluster" "$TMP/up-int.out"
ok up_interrupted_stopped_coordinator grep -q "received SIGTERM; shutting down" \
  "$TMP/up-int/coordinator.log"
lacks() { ! grep -q "$1" "$2"; }
ok up_interrupted_no_sigint_to_coordinator lacks "received SIGINT" "$TMP/up-int/coordinator.log"
if ended "$TMP/up-int"; then
  passed=$((passed + 1))
else
  fail up_interrupted_ended "its processes outlived it: $(pgrep -af -- "$TMP/up-int/")"
  pkill -KILL -f -- "--ports-file=$TMP/up-int/"
fi

# $PIPETRAIN_CA: a TLS coordinator is reached with the CA from the
# environment; --tls-ca overrides it; a missing CA file is named.
if command -v openssl >/dev/null; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$TMP/key.pem" -out "$TMP/cert.pem" -days 2 \
    -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
  "$COORDINATOR" --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0 \
    --ports-file="$TMP/t.ports" --join-token=j --user-token-file="$TMP/user.token" \
    --tls-cert="$TMP/cert.pem" --tls-key="$TMP/key.pem" >"$TMP/tls-coordinator.log" 2>&1 &
  pids+=($!)
  ok tls_coordinator_up await_file "$TMP/t.ports"
  tls_addr="127.0.0.1:$(port_of "$TMP/t.ports" grpc_port)"
  expect_exit tls_without_ca 78 "UNAVAILABLE" -- jobs --coordinator="$tls_addr"
  PIPETRAIN_CA="$TMP/cert.pem" expect_exit env_ca_used 0 '"jobs": []' -- \
    jobs --json --coordinator="$tls_addr"
  check empty_jobs_json 'j == {"jobs": []}'
  PIPETRAIN_CA="$TMP/cert.pem" expect_exit env_ca_for_plaintext_fails 78 "UNAVAILABLE" -- \
    jobs --coordinator="$addr"
  PIPETRAIN_CA="$TMP/cert.pem" expect_exit flag_beats_env_ca_plaintext 0 '"jobs"' -- \
    jobs --json --coordinator="$addr" --tls-ca=
  # Mutual TLS set up in the environment, turned off by the flag: the
  # variables' certificate and key go with it.
  PIPETRAIN_CA="$TMP/cert.pem" PIPETRAIN_TLS_CERT="$TMP/cert.pem" PIPETRAIN_TLS_KEY="$TMP/key.pem" \
    expect_exit flag_beats_env_mutual_tls 0 '"jobs"' -- jobs --json --coordinator="$addr" --tls-ca=
  expect_exit typed_cert_needs_ca 2 "need --tls-ca" -- \
    jobs --coordinator="$addr" --tls-cert="$TMP/cert.pem" --tls-key="$TMP/key.pem"
  PIPETRAIN_CA="$TMP/no-such-ca.pem" expect_exit flag_beats_env_ca_tls 0 '"jobs": []' -- \
    jobs --json --coordinator="$tls_addr" --tls-ca="$TMP/cert.pem"
else
  echo "openssl not found: the TLS cases of \$PIPETRAIN_CA are skipped" >&2
fi
PIPETRAIN_CA="$TMP/no-such-ca.pem" expect_exit env_ca_missing_file 69 "no-such-ca.pem" -- jobs

# Completion: generated scripts that parse and name every command and each
# command's flags (as its --help lists them).
expect_exit completion_help 0 "usage: pipetrain completion bash|zsh" -- completion --help
ok completion_help_on_stdout grep -q "usage: pipetrain completion" "$OUT"
expect_exit completion_bad_shell 2 "usage: pipetrain completion bash|zsh" -- completion fish
ok completion_mistake_on_stderr grep -q "usage: pipetrain completion" "$ERR"
expect_exit completion_bash 0 "complete -o default -F _pipetrain pipetrain" -- completion bash
cp "$OUT" "$TMP/completion.bash"
ok bash_accepts_completion bash -n "$TMP/completion.bash"
"$BIN" --help >"$TMP/help.txt"
commands=$(sed -n '/^Commands/,/^$/p' "$TMP/help.txt" | awk 'NR > 1 && NF {print $1}')
ok help_lists_commands test "$(echo "$commands" | wc -l)" -ge 12
# `help COMMAND` is `COMMAND --help`; an unknown one is a usage error.
"$BIN" submit --help >"$TMP/submit-help.txt" 2>/dev/null
expect_exit help_submit 0 -- help submit
ok help_submit_is_submit_help cmp -s "$OUT" "$TMP/submit-help.txt"
expect_exit help_unknown 2 "pipetrain help: unknown command 'nosuch'" -- help nosuch
expect_exit help_help 0 -- help --help
ok help_help_is_usage cmp -s "$OUT" "$TMP/help.txt"
for c in $commands; do
  if ! grep -qF "    '$c')" "$TMP/completion.bash"; then
    fail "completion_has_$c" "the bash script has no case for '$c'"
    continue
  fi
  passed=$((passed + 1))
  "$BIN" "$c" --help >"$TMP/c-help.txt" 2>/dev/null
  # Those with flags must list them, or the loop below checks nothing.
  case "$c" in
    checkpoint | completion | version) ;;  # subcommands or no flags
    *)
      if ! grep -qE '^  --[a-z0-9-]+' "$TMP/c-help.txt"; then
        fail "help_flags_$c" "'$c --help' listed no flag"
        continue
      fi
      ;;
  esac
  for flag in $(grep -oE '^  --[a-z0-9-]+' "$TMP/c-help.txt"); do
    if ! sed -n "/^    '$c')/,/;;/p" "$TMP/completion.bash" | grep -qE -- "$flag([^a-z0-9-]|\$)"; then
      fail "completion_$c$flag" "the bash script lacks $flag for '$c'"
    fi
  done
done
# The script completes: commands, then flags of the command.
bash -c "source '$TMP/completion.bash'; COMP_WORDS=(pipetrain wor); COMP_CWORD=1; _pipetrain;
  echo \"\${COMPREPLY[*]}\"; COMP_WORDS=(pipetrain workers --js); COMP_CWORD=2; _pipetrain;
  echo \"\${COMPREPLY[*]}\"" >"$TMP/completed.txt"
ok bash_completes_words test "$(cat "$TMP/completed.txt")" = "workers
--json"
# After `checkpoint`, its subcommand, not the flags that follow it.
bash -c "source '$TMP/completion.bash'; COMP_WORDS=(pipetrain checkpoint -); COMP_CWORD=2; _pipetrain;
  echo \"\${COMPREPLY[*]}\"" >"$TMP/completed-checkpoint-dash.txt"
ok bash_checkpoint_dash_no_out test "$(cat "$TMP/completed-checkpoint-dash.txt")" = "--help"
bash -c "source '$TMP/completion.bash'; COMP_WORDS=(pipetrain checkpoint ''); COMP_CWORD=2; _pipetrain;
  echo \"\${COMPREPLY[*]}\"" >"$TMP/completed-checkpoint.txt"
ok bash_checkpoint_word test "$(cat "$TMP/completed-checkpoint.txt")" = "export --help"
bash -c "source '$TMP/completion.bash'; COMP_WORDS=(pipetrain checkpoint export --o); COMP_CWORD=3; _pipetrain;
  echo \"\${COMPREPLY[*]}\"" >"$TMP/completed-checkpoint-out.txt"
ok bash_checkpoint_export_out test "$(cat "$TMP/completed-checkpoint-out.txt")" = "--out"
expect_exit completion_zsh 0 "#compdef pipetrain" "compdef _pipetrain pipetrain" -- completion zsh
if command -v zsh >/dev/null; then
  cp "$OUT" "$TMP/completion.zsh"
  ok zsh_accepts_completion zsh -n "$TMP/completion.zsh"
fi
expect_exit completion_unknown_shell 2 "usage: pipetrain completion bash|zsh" -- completion fish
# submit --follow goes on through a coordinator restart: a coordinator with
# state runs a long job with checkpoints; it is killed (SIGKILL), then
# stopped (SIGTERM), and started again on the same ports each time; the
# follower finds it again and reports the end
# the job then gets (a cancel: CANCELLED, exit 1), not UNAVAILABLE (78).
mkdir -p "$TMP/restart-out" && chmod 700 "$TMP/restart-out"
restart_coordinator() {  # $1: gRPC port, $2: HTTP port (0: any)
  "$COORDINATOR" --grpc-address="127.0.0.1:$1" --http-address="127.0.0.1:$2" \
    --ports-file="$TMP/r.ports" --join-token=j --user-token-file="$TMP/user.token" \
    --state-dir="$TMP/restart-state" --output-dir="$TMP/restart-out" --restart-grace-seconds=30 \
    >>"$TMP/restart-coordinator.log" 2>&1 &
  coordinator_pid=$!
  pids+=($coordinator_pid)
}
restart_coordinator 0 0
ok restart_coordinator_up await_file "$TMP/r.ports"
raddr="127.0.0.1:$(port_of "$TMP/r.ports" grpc_port)"
rhttp=$(port_of "$TMP/r.ports" http_port)
"$WORKER" --coordinator="$raddr" --join-token=j --ports-file="$TMP/rw.ports" \
  --checkpoint-root="$TMP/restart-out" >"$TMP/restart-worker.log" 2>&1 &
pids+=($!)
ok restart_worker_up await_file "$TMP/rw.ports"
cat >"$TMP/long.json" <<'JSON'
{"name": "restart", "model": {"nLayer": 1, "nHead": 1, "dModel": 8},
 "training": {"seqLen": 4, "batchSize": 1, "steps": 100000000},
 "data": {"syntheticBytes": 5000}, "checkpoint": {"intervalSteps": 20},
 "parallelism": {"stages": 1}}
JSON
"$BIN" submit "$TMP/long.json" --follow --coordinator="$raddr" --token-file="$TMP/user.token" \
  >"$TMP/follow.out" 2>"$TMP/follow.err" &
follow_pid=$!
pids+=("$follow_pid")
ok follow_submitted await_file "$TMP/follow.out"
long_id=$(cut -d' ' -f1 "$TMP/follow.out")
# Polls the job's step through the CLI until it reaches $1 (bounded).
await_step() {
  for _ in $(seq 1 1200); do
    kill -0 "$follow_pid" 2>/dev/null || return 1
    if "$BIN" job "$long_id" --json --coordinator="$raddr" --token-file="$TMP/user.token" \
      >"$OUT" 2>"$ERR" && python3 -c "import json; j=json.load(open('$OUT')); \
exit(0 if j['state'] == 'JOB_STATE_RUNNING' and int(j['progress'].get('step', 0)) >= $1 else 1)"; then
      return 0
    fi
    sleep 0.05
  done
  return 1
}
ok restart_job_past_a_checkpoint await_step 25
kill -KILL "$coordinator_pid"
wait "$coordinator_pid" 2>/dev/null
restart_coordinator "${raddr##*:}" "$rhttp"
ok restart_job_runs_again await_step 30
# A graceful stop (SIGTERM) ends the calls it serves as CANCELLED: lost
# too, not the job's end.
kill -TERM "$coordinator_pid"
wait "$coordinator_pid" 2>/dev/null
restart_coordinator "${raddr##*:}" "$rhttp"
ok restart_after_sigterm_job_runs_again await_step 45
ok follow_still_running kill -0 "$follow_pid"
expect_exit restart_cancel 0 "CANCELLED" -- cancel "$long_id" --coordinator="$raddr" \
  --token-file="$TMP/user.token"
for _ in $(seq 1 600); do kill -0 "$follow_pid" 2>/dev/null || break; sleep 0.05; done
kill -KILL "$follow_pid" 2>/dev/null  # still following after 30 s: fails below
wait "$follow_pid"
follow_rc=$?
if [[ $follow_rc -eq 1 ]] && grep -q "^$long_id CANCELLED" "$TMP/follow.out" &&
  grep -q "looking for it" "$TMP/follow.err" && grep -q "found the coordinator again" "$TMP/follow.err"; then
  passed=$((passed + 1))
else
  fail follow_through_restart "exit $follow_rc; stdout: $(cat "$TMP/follow.out"); stderr: $(tail -c 600 "$TMP/follow.err")"
fi

# A follow that loses its job once submitted (here a coordinator restarted
# without its --state-dir, which forgot it) exits 3 saying the job was
# submitted: not NOT_FOUND's 69 (or UNAVAILABLE's 78), which a script could
# take for a submit that never got through, and submit the job again.
"$BIN" submit "$TMP/long.json" --follow --coordinator="$raddr" --token-file="$TMP/user.token" \
  >"$TMP/forgot.out" 2>"$TMP/forgot.err" &
follow_pid=$!
pids+=("$follow_pid")
ok forgot_submitted await_file "$TMP/forgot.out"
forgot_id=$(cut -d' ' -f1 "$TMP/forgot.out")
kill -KILL "$coordinator_pid"
wait "$coordinator_pid" 2>/dev/null
"$COORDINATOR" --grpc-address="$raddr" --http-address=127.0.0.1:0 --join-token=j \
  --user-token-file="$TMP/user.token" --ports-file="$TMP/forgot.ports" \
  >>"$TMP/restart-coordinator.log" 2>&1 &
coordinator_pid=$!
pids+=($coordinator_pid)
ok forgetful_coordinator_up await_file "$TMP/forgot.ports"
for _ in $(seq 1 1800); do kill -0 "$follow_pid" 2>/dev/null || break; sleep 0.05; done
kill -KILL "$follow_pid" 2>/dev/null  # still following after 90 s: fails below
wait "$follow_pid"
follow_rc=$?
if [[ $follow_rc -eq 3 && -n "$forgot_id" ]] && grep -q "NOT_FOUND" "$TMP/forgot.err" &&
  grep -q "job $forgot_id was submitted and may still be running" "$TMP/forgot.err"; then
  passed=$((passed + 1))
else
  fail follow_loses_its_job "exit $follow_rc; stderr: $(tail -c 600 "$TMP/forgot.err")"
fi

# SIGHUP (a closed terminal, or the reload habit) killed both daemons
# outright, with no drain and no deregistration; it now stops them as
# SIGTERM does, saying that nothing is reloaded.
"$COORDINATOR" --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0 \
  --ports-file="$TMP/hup-c.ports" --join-token=j --user-token=u >"$TMP/hup-c.log" 2>&1 &
hup_coordinator=$!
pids+=("$hup_coordinator")
ok hup_coordinator_up await_file "$TMP/hup-c.ports"
"$WORKER" --coordinator="127.0.0.1:$(port_of "$TMP/hup-c.ports" grpc_port)" --join-token=j \
  --ports-file="$TMP/hup-w.ports" >"$TMP/hup-w.log" 2>&1 &
hup_worker=$!
pids+=("$hup_worker")
ok hup_worker_up await_file "$TMP/hup-w.ports"
hup_registered() { for _ in $(seq 1 600); do grep -q "registered as" "$1" && return 0; sleep 0.05; done; return 1; }
ok hup_worker_registered hup_registered "$TMP/hup-w.log"
kill -HUP "$hup_worker"
wait "$hup_worker"
ok hup_worker_exit_0 test $? -eq 0
ok hup_worker_said_so grep -q "received SIGHUP; leaving (SIGHUP reloads nothing" "$TMP/hup-w.log"
ok hup_worker_deregistered grep -q "deregistered" "$TMP/hup-w.log"
kill -HUP "$hup_coordinator"
wait "$hup_coordinator"
ok hup_coordinator_exit_0 test $? -eq 0
ok hup_coordinator_said_so grep -q "received SIGHUP; shutting down (SIGHUP reloads nothing" \
  "$TMP/hup-c.log"

# -h is help wherever a command takes an id or a file, never that argument
# (no call is made: there is no coordinator here).
expect_exit cancel_dash_h 0 "usage: pipetrain cancel" -- cancel -h
expect_exit drain_dash_h 0 "usage: pipetrain drain" -- drain -h
expect_exit submit_dash_h 0 "usage: pipetrain submit" -- submit -h

finish
