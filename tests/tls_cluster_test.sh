#!/usr/bin/env bash
# gRPC with TLS end to end: a coordinator started with a self-signed
# certificate, a worker and the CLI trusting it (--tls-ca) train a job; a
# client without TLS is refused. Then mutual TLS: a coordinator that requires
# client certificates signed by a test CA (--tls-client-ca) takes a worker
# and the CLI presenting one (--tls-cert/--tls-key) and refuses the CLI
# without. Ports are chosen by the kernel (port 0) and read back from ports
# files; every process is killed on exit.
set -u
R="$TEST_SRCDIR/$TEST_WORKSPACE"
T="$TEST_TMPDIR"
pass=0 fail=0
check() { local name=$1; shift; if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $name"; fi; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
# Waits (bounded, polling an observable condition) for a non-empty file.
await_file() { for _ in $(seq 1 600); do [ -s "$1" ] && return 0; sleep 0.05; done; return 1; }
port_of() { sed -E "s/.*\"$2\": *([0-9]+).*/\1/" "$1"; }

openssl req -x509 -newkey rsa:2048 -nodes -keyout "$T/key.pem" -out "$T/cert.pem" -days 2 \
  -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
check "certificate generated" test -s "$T/cert.pem"

"$R/coordinator/pipetrain-coordinator" --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0 \
  --ports-file="$T/c.ports" --join-token=t --user-token=u --tls-cert="$T/cert.pem" --tls-key="$T/key.pem" \
  > "$T/coordinator.log" 2>&1 &
pids+=($!)
check "coordinator up" await_file "$T/c.ports"
addr="127.0.0.1:$(port_of "$T/c.ports" grpc_port)"
"$R/worker/pipetrain-worker" --coordinator="$addr" --tls-ca="$T/cert.pem" --join-token=t \
  --ports-file="$T/w.ports" > "$T/worker.log" 2>&1 &
pids+=($!)
check "worker up" await_file "$T/w.ports"

cat > "$T/job.json" <<'JSON'
{"model": {"nLayer": 1, "nHead": 2, "dModel": 16},
 "training": {"seqLen": 8, "batchSize": 2, "steps": 5},
 "data": {"syntheticBytes": 5000}, "parallelism": {"stages": 1}}
JSON
export PIPETRAIN_TOKEN=u  # the user token (the CLI also takes --token-file)
out=$("$R/cli/pipetrain" submit "$T/job.json" --coordinator="$addr" --tls-ca="$T/cert.pem" --follow 2>"$T/follow.err")
check "job over TLS succeeds" test "$(echo "$out" | tail -1 | cut -d' ' -f2)" = SUCCEEDED
# The report `up` prints goes to stderr with the progress.
check "--follow reports the final loss" grep -q "SUCCEEDED after 5 steps, final loss" "$T/follow.err"
check "--follow reports each worker's step" grep -q "per step, measured \[predicted\]" "$T/follow.err"
check "--follow reports the traced step's passes" \
  grep -q "passes in step 5 as the workers measured it \[predicted\]" "$T/follow.err"
job_id=$(echo "$out" | tail -1 | cut -d' ' -f1)
# Exactly "<id> SUCCEEDED" for scripts (docs/operations.md): no trailing space.
check "--follow's last line is the id and the state" test "$(echo "$out" | tail -1)" = "$job_id SUCCEEDED"
"$R/cli/pipetrain" job "$job_id" --report --coordinator="$addr" --tls-ca="$T/cert.pem" \
  >"$T/report.out" 2>&1
check "job --report: the outcome" grep -q "job $job_id SUCCEEDED after 5 steps, final loss" "$T/report.out"
check "job --report: the workers' step time" grep -q "step time: measured .* (the slowest worker's mean" "$T/report.out"
# The workers traced the 5-step plan's last step: its measured timeline.
"$R/cli/pipetrain" job "$job_id" --measured-timeline "$T/measured.svg" --coordinator="$addr" \
  --tls-ca="$T/cert.pem" >"$T/measured.out" 2>&1
check "job --measured-timeline: written" grep -q "measured timeline: $T/measured.svg" "$T/measured.out"
check "job --measured-timeline: the workers' step 5" grep -q "measured step 5 (workers" "$T/measured.svg"
"$R/cli/pipetrain" jobs --coordinator="$addr" > "$T/plain.out" 2>&1
check "plaintext client refused (UNAVAILABLE: exit 78)" test $? -eq 78
check "refusal says UNAVAILABLE" grep -q UNAVAILABLE "$T/plain.out"
check "and that the coordinator may want --tls-ca" grep -q "give its CA with --tls-ca" "$T/plain.out"

# Each TLS file's expiry is a gauge (the certificate was made for 2 days).
expiry_in_days() {  # $1: ports file, $2: its port's key, $3: flag; prints days to the gauge's value
  python3 - "$(port_of "$1" "$2")" "$3" <<'PY'
import re, sys, time, urllib.request
page = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
m = re.search(r'^pipetrain_tls_certificate_expiry_timestamp_seconds\{flag="%s"\} (\S+)$' % sys.argv[2], page, re.M)
print((float(m.group(1)) - time.time()) / 86400 if m else "none")
PY
}
in_two_days() { python3 -c "import sys; sys.exit(0 if '$1' != 'none' and 1.9 < float('$1') <= 2 else 1)"; }
days=$(expiry_in_days "$T/c.ports" http_port tls-cert)
check "coordinator: its certificate's expiry gauge, 2 days ahead (got $days)" in_two_days "$days"
days=$(expiry_in_days "$T/w.ports" metrics_port tls-ca)
check "worker: its CA file's expiry gauge, 2 days ahead (got $days)" in_two_days "$days"

# Mutual TLS: a CA of our own signs the clients' certificate.
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$T/ca.key" -out "$T/ca.pem" -days 2 \
  -subj "/CN=pipetrain test CA" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout "$T/client.key" -out "$T/client.csr" \
  -subj "/CN=pipetrain client" 2>/dev/null
openssl x509 -req -in "$T/client.csr" -CA "$T/ca.pem" -CAkey "$T/ca.key" -CAcreateserial \
  -out "$T/client.pem" -days 2 2>/dev/null
check "client certificate signed" test -s "$T/client.pem"
"$R/coordinator/pipetrain-coordinator" --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0 \
  --ports-file="$T/m.ports" --join-token=t --user-token=u --tls-cert="$T/cert.pem" \
  --tls-key="$T/key.pem" --tls-client-ca="$T/ca.pem" > "$T/mtls-coordinator.log" 2>&1 &
pids+=($!)
check "mTLS coordinator up" await_file "$T/m.ports"
maddr="127.0.0.1:$(port_of "$T/m.ports" grpc_port)"
"$R/worker/pipetrain-worker" --coordinator="$maddr" --tls-ca="$T/cert.pem" \
  --tls-cert="$T/client.pem" --tls-key="$T/client.key" --join-token=t \
  --ports-file="$T/mw.ports" > "$T/mtls-worker.log" 2>&1 &
pids+=($!)
check "mTLS worker up" await_file "$T/mw.ports"
out=$("$R/cli/pipetrain" submit "$T/job.json" --coordinator="$maddr" --tls-ca="$T/cert.pem" \
  --tls-cert="$T/client.pem" --tls-key="$T/client.key" --follow 2>/dev/null)
check "job over mutual TLS succeeds" test "$(echo "$out" | tail -1 | cut -d' ' -f2)" = SUCCEEDED
# Every mTLS flag of the CLI can come from the environment.
PIPETRAIN_CA="$T/cert.pem" PIPETRAIN_TLS_CERT="$T/client.pem" PIPETRAIN_TLS_KEY="$T/client.key" \
  PIPETRAIN_TOKEN=u "$R/cli/pipetrain" jobs --coordinator="$maddr" > "$T/env-mtls.out" 2>&1
check "mutual TLS from \$PIPETRAIN_TLS_CERT and _KEY" test $? -eq 0
"$R/cli/pipetrain" jobs --coordinator="$maddr" --tls-ca="$T/cert.pem" > "$T/nocert.out" 2>&1
check "client without a certificate refused (UNAVAILABLE: exit 78)" test $? -eq 78
check "its refusal says UNAVAILABLE" grep -q UNAVAILABLE "$T/nocert.out"
check "and that the coordinator may want a client certificate" \
  grep -q "give one with --tls-cert and --tls-key" "$T/nocert.out"
# A TLS client against a plaintext port: gRPC's "wrong version number",
# explained.
"$R/coordinator/pipetrain-coordinator" --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0 \
  --ports-file="$T/p.ports" --join-token=t --user-token=u > "$T/plain-coordinator.log" 2>&1 &
pids+=($!)
check "plaintext coordinator up" await_file "$T/p.ports"
"$R/cli/pipetrain" jobs --coordinator="127.0.0.1:$(port_of "$T/p.ports" grpc_port)" \
  --tls-ca="$T/cert.pem" > "$T/tls-to-plain.out" 2>&1
check "TLS client, plaintext coordinator (exit 78)" test $? -eq 78
check "its error says the coordinator does not serve TLS" \
  grep -q "does not serve TLS there" "$T/tls-to-plain.out"

# TLS covers gRPC only: a coordinator whose HTTP port listens beyond
# loopback says at start that REST takes the token in plaintext there.
"$R/coordinator/pipetrain-coordinator" --grpc-address=127.0.0.1:0 --http-address=0.0.0.0:0 \
  --ports-file="$T/open.ports" --join-token=t --user-token=u --tls-cert="$T/cert.pem" \
  --tls-key="$T/key.pem" --tls-client-ca="$T/ca.pem" > "$T/open-http.log" 2>&1 &
open_pid=$!
pids+=("$open_pid")
check "coordinator with HTTP beyond loopback up" await_file "$T/open.ports"
check "it warns that REST has no TLS nor client-certificate check" \
  grep -q "has no TLS and no client-certificate check" "$T/open-http.log"
check "no such warning with HTTP on loopback" \
  test "$(grep -c "has no TLS" "$T/mtls-coordinator.log")" -eq 0
kill -TERM "$open_pid"

# Bad TLS files are refused at start naming the flag (exit 2; the CLI's
# INVALID_ARGUMENT is 67), not as a port that "cannot serve" or calls that
# are UNAVAILABLE.
echo "not a certificate" > "$T/not.pem"
openssl req -new -key "$T/key.pem" -subj "/CN=localhost" -out "$T/expired.csr" 2>/dev/null
openssl x509 -req -in "$T/expired.csr" -signkey "$T/key.pem" -days -1 -out "$T/expired.pem" 2>/dev/null
# One that starts instead of refusing is stopped after 20 s (exit 124),
# so the case fails by name rather than the test hanging to its timeout.
bad_coordinator() {  # $1: the message expected; then the TLS flags
  local want=$1
  shift
  timeout 20 "$R/coordinator/pipetrain-coordinator" --grpc-address=127.0.0.1:0 \
    --http-address=127.0.0.1:0 --join-token=t --user-token=u "$@" > "$T/bad-tls.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && { echo "started instead of refusing: $(cat "$T/bad-tls.log")"; return 1; }
  [ $rc -eq 2 ] && grep -qF -- "$want" "$T/bad-tls.log" ||
    { echo "exit $rc: $(cat "$T/bad-tls.log")"; return 1; }
}
check "coordinator: another certificate's key (exit 2)" bad_coordinator \
  "--tls-key: $T/client.key is not the key of the certificate in $T/cert.pem" \
  --tls-cert="$T/cert.pem" --tls-key="$T/client.key"
check "coordinator: a certificate file without one (exit 2)" bad_coordinator \
  "--tls-cert: $T/not.pem holds no PEM certificate" --tls-cert="$T/not.pem" --tls-key="$T/key.pem"
check "coordinator: an expired certificate (exit 2)" bad_coordinator \
  "--tls-cert: the certificate in $T/expired.pem has expired" \
  --tls-cert="$T/expired.pem" --tls-key="$T/key.pem"
# An encrypted key: refused at once, with no passphrase prompt (it waited
# for one on a terminal, and gRPC could not have used the key anyway).
openssl pkey -in "$T/key.pem" -aes256 -passout pass:secret -out "$T/enc.key" 2>/dev/null
check "coordinator: an encrypted key (exit 2)" bad_coordinator \
  "--tls-key: $T/enc.key is encrypted" --tls-cert="$T/cert.pem" --tls-key="$T/enc.key"
check "no passphrase prompt" test "$(grep -c "pass phrase" "$T/bad-tls.log")" -eq 0
# A certificate not valid yet (as from a CA whose clock runs ahead).
mkdir -p "$T/ca-db" && : > "$T/ca-db/index.txt" && echo 01 > "$T/ca-db/serial"
cat > "$T/ca.cnf" <<CNF
[ca]
default_ca = d
[d]
database = $T/ca-db/index.txt
serial = $T/ca-db/serial
new_certs_dir = $T/ca-db
default_md = sha256
policy = p
[p]
commonName = supplied
CNF
openssl ca -batch -config "$T/ca.cnf" -cert "$T/cert.pem" -keyfile "$T/key.pem" \
  -in "$T/expired.csr" -startdate 20990101000000Z -enddate 20991231000000Z \
  -out "$T/future.pem" 2>/dev/null
check "coordinator: a certificate not valid yet (exit 2)" bad_coordinator \
  "--tls-cert: the certificate in $T/future.pem is not valid before Jan  1 00:00:00 2099 GMT" \
  --tls-cert="$T/future.pem" --tls-key="$T/key.pem"
# A client CA file whose every certificate expired verifies nobody.
check "coordinator: a client CA file of expired certificates (exit 2)" bad_coordinator \
  "--tls-client-ca: every certificate in $T/expired.pem has expired or is not yet valid" \
  --tls-cert="$T/cert.pem" --tls-key="$T/key.pem" --tls-client-ca="$T/expired.pem"
"$R/cli/pipetrain" jobs --coordinator="$addr" --tls-ca="$T/not.pem" > "$T/bad-ca.out" 2>&1
check "CLI: a CA file without a certificate (INVALID_ARGUMENT: exit 67)" test $? -eq 67
check "its error names the flag" grep -q -- "--tls-ca: $T/not.pem holds no PEM certificate" \
  "$T/bad-ca.out"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
