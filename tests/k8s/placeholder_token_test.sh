#!/usr/bin/env bash
# The coordinator refuses to start (exit 2) with a join or user token that is
# still the placeholder earlier manifests published (REPLACE-ME...), and says
# how to create the Secret, or with one token for both; with real tokens from
# files it starts.
set -u
R="$TEST_SRCDIR/$TEST_WORKSPACE"
T="$TEST_TMPDIR"
COORDINATOR="$R/coordinator/pipetrain-coordinator"
pass=0 fail=0
check() {
  local name=$1; shift
  if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $name"; fi
}
pid=""
cleanup() { [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; wait 2>/dev/null; }
trap cleanup EXIT

printf 'REPLACE-ME-join-token\n' > "$T/placeholder-join"
printf 'REPLACE-ME-user-token\n' > "$T/placeholder-user"
printf 'replace-me\n' > "$T/lowercase"
printf '0f3a9c2e7b6d41a8\n' > "$T/real-join"
printf '5d1e8b7c3a2f9064\n' > "$T/real-user"

# Runs the coordinator with join token file $1 and user token file $2; its
# stderr goes to $T/err.txt, its exit code is returned. One that starts
# instead of refusing is stopped after 20 s (exit 124).
start() {
  timeout 20 "$COORDINATOR" --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0 \
    --join-token-file="$1" --user-token-file="$2" > /dev/null 2> "$T/err.txt"
}
JOIN_MSG='pipetrain-coordinator: the join token is the published placeholder "REPLACE-ME...", which anyone can read; generate real tokens and give them as files, e.g. on Kubernetes: openssl rand -hex 32 > join-token; openssl rand -hex 32 > user-token; kubectl create secret generic pipetrain-tokens --from-file=join-token --from-file=user-token (docs/operations.md, "Deploying on Kubernetes")'

start "$T/placeholder-join" "$T/real-user"; code=$?
echo "placeholder join token: exit $code: $(cat "$T/err.txt")"
check "placeholder join token: exit 2" test "$code" -eq 2
check "placeholder join token: the message" grep -qxF -- "$JOIN_MSG" "$T/err.txt"

start "$T/real-join" "$T/placeholder-user"; code=$?
echo "placeholder user token: exit $code"
check "placeholder user token: exit 2" test "$code" -eq 2
check "placeholder user token: the message" \
  grep -qF 'the user token is the published placeholder "REPLACE-ME..."' "$T/err.txt"

start "$T/real-join" "$T/lowercase"; code=$?
check "lowercase placeholder: exit 2" test "$code" -eq 2

# A '%' in the user token: REST percent-decodes the header, gRPC does not.
printf '5d1e%%41c3a2f9064\n' > "$T/percent-user"
start "$T/real-join" "$T/percent-user"; code=$?
check "user token with a %: exit 2" test "$code" -eq 2
check "user token with a %: the message" grep -qF "the user token contains '%'" "$T/err.txt"

# One token for both: every worker host could act as a user.
start "$T/real-join" "$T/real-join"; code=$?
check "join token = user token: exit 2" test "$code" -eq 2
check "join token = user token: the message" \
  grep -qF "the join token and the user token are the same" "$T/err.txt"

timeout 20 "$COORDINATOR" --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0 --insecure \
  --join-token=REPLACE-ME-join-token > /dev/null 2> "$T/err.txt"; code=$?
check "placeholder with --insecure: exit 2" test "$code" -eq 2

# Real tokens: it starts (writes its ports file) and stops on SIGTERM.
"$COORDINATOR" --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0 \
  --join-token-file="$T/real-join" --user-token-file="$T/real-user" \
  --ports-file="$T/ports.json" > /dev/null 2> "$T/real.txt" &
pid=$!
for _ in $(seq 1 600); do [ -s "$T/ports.json" ] && break; sleep 0.05; done
check "real tokens: the coordinator starts" test -s "$T/ports.json"
kill -TERM "$pid"; wait "$pid"; code=$?; pid=""
check "real tokens: exit 0 after SIGTERM" test "$code" -eq 0

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
