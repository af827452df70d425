#!/usr/bin/env bash
# The coordinator's shutdown is bounded (--stop-timeout-seconds) and a further
# signal cuts it short: a leader whose jobs' file work hangs (here
# --test-hold-io-at-stop, as on a volume that stopped answering) exits with
# code 5 instead of holding its lease with its ports closed. The worker's
# stop is bounded the same way (its own cases at the end).
#
# Each wait for an exit is bounded (a coordinator that hangs is killed and
# the case fails); no wait stands in for an event.
set -uo pipefail

BIN="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-pipetrain}/coordinator/pipetrain-coordinator"
if [[ ! -x "$BIN" ]]; then
  BIN="${RUNFILES_DIR:-$0.runfiles}/pipetrain/coordinator/pipetrain-coordinator"
fi
if [[ ! -x "$BIN" ]]; then
  echo "cannot find pipetrain-coordinator in the runfiles" >&2
  exit 1
fi
WORKER="${BIN%/coordinator/pipetrain-coordinator}/worker/pipetrain-worker"
if [[ ! -x "$WORKER" ]]; then
  echo "cannot find pipetrain-worker in the runfiles" >&2
  exit 1
fi
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
passed=0
failed=0
pids=()
trap 'for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done' EXIT

fail() {
  echo "FAIL [$1]: $2" >&2
  [[ -f "$TMP/$1.log" ]] && sed 's/^/    /' "$TMP/$1.log" >&2
  failed=$((failed + 1))
}

# start NAME FLAGS...: a coordinator on loopback ports; sets `pid`, and
# returns once it serves (its ports file is written last) or fails.
start() {
  local name="$1"
  shift
  "$BIN" --insecure --grpc-address=127.0.0.1:0 --http-address=127.0.0.1:0 \
    --ports-file="$TMP/$name.ports" "$@" >"$TMP/$name.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 1 1200); do
    [[ -s "$TMP/$name.ports" ]] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# await_line NAME TEXT: bounded (60 s) wait for TEXT in NAME's log; fails
# at once when `pid` ended without writing it.
await_line() {
  for _ in $(seq 1 1200); do
    grep -qF -- "$2" "$TMP/$1.log" && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      grep -qF -- "$2" "$TMP/$1.log"
      return
    fi
    sleep 0.05
  done
  return 1
}

# await_exit NAME SECONDS: bounded wait for `pid` to end; sets `rc` (the
# exit status, or "hung" when it was killed at the bound).
await_exit() {
  local ticks=$(($2 * 20))
  for _ in $(seq 1 "$ticks"); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid"
    wait "$pid" 2>/dev/null
    rc=hung
    return
  fi
  wait "$pid"
  rc=$?
}

# expect NAME WANT_RC FRAGMENT...: rc is WANT_RC and the log has each
# (fixed-string) FRAGMENT.
expect() {
  local name="$1" want="$2"
  shift 2
  if [[ "$rc" != "$want" ]]; then
    fail "$name" "exit $rc, want $want"
    return
  fi
  local fragment
  for fragment in "$@"; do
    if ! grep -qF -- "$fragment" "$TMP/$name.log"; then
      fail "$name" "its log lacks '$fragment'"
      return
    fi
  done
  passed=$((passed + 1))
}

# Out of bounds: refused at start.
for bad in 0 0.5 3601; do
  "$BIN" --insecure --stop-timeout-seconds="$bad" >"$TMP/bad_$bad.log" 2>&1
  rc=$?
  expect "bad_$bad" 2 "--stop-timeout-seconds must be in [1, 3600]"
done

# Nothing held: a clean exit, the bound never fires.
if start clean --stop-timeout-seconds=1; then
  kill -TERM "$pid"
  await_exit clean 30
  expect clean 0 "received SIGTERM; shutting down"
  if grep -qF "did not end within" "$TMP/clean.log"; then fail clean "the bound fired"; fi
else
  fail clean "did not start"
fi

# The jobs' file work held: past the servers' 5 s grace and the 1 s bound,
# the process exits without it, saying what it waited for.
if start held --stop-timeout-seconds=1 --test-hold-io-at-stop; then
  kill -TERM "$pid"
  await_exit held 30
  expect held 5 "the shutdown did not end within 6s (--stop-timeout-seconds 1 after the servers' grace)" \
    "it still waits for the job manager's last saves" "exiting without it (exit code 5)"
else
  fail held "did not start"
fi

# A second signal during the held shutdown: exits at once (the bound is an
# hour). The first must be taken before the second is sent: two pending
# SIGTERMs would be one.
if start second --stop-timeout-seconds=3600 --test-hold-io-at-stop; then
  kill -TERM "$pid"
  if await_line second "received SIGTERM; shutting down"; then
    kill -INT "$pid"
    await_exit second 30
    expect second 5 "received SIGINT again (--stop-timeout-seconds 3600 after the servers' grace)" \
      "exiting without it (exit code 5)"
  else
    fail second "never said it was shutting down"
  fi
else
  fail second "did not start"
fi

# The worker's stop is bounded too (its --stop-timeout-seconds), first
# registration attempt included, and a further signal cuts it short. A
# coordinator stopped with SIGSTOP still completes TCP handshakes but never
# answers, so each worker's first attempt waits out its 10 s deadline, which
# Leave does not cut short.
coordinator_pid=
if start stopped; then
  coordinator_pid=$pid
  grpc_port=$(grep -o '"grpc_port": *[0-9]*' "$TMP/stopped.ports" | grep -o '[0-9]*$')
  kill -STOP "$coordinator_pid"
fi

# start_worker NAME FLAGS...: a worker of the stopped coordinator; sets
# `pid`, and returns once it serves its data plane (its ports file).
start_worker() {
  local name="$1"
  shift
  "$WORKER" --coordinator="127.0.0.1:$grpc_port" --device=cpu --drain-timeout-seconds=0 \
    --listen=127.0.0.1:0 --metrics-address=127.0.0.1:0 --ports-file="$TMP/$name.ports" \
    "$@" >"$TMP/$name.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 1 1200); do
    [[ -s "$TMP/$name.ports" ]] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# await_attempt: bounded (60 s) wait until a registration attempt is in
# flight: a connection to the stopped coordinator's port, which the worker's
# channel opens for its first call only. A signal before it would find the
# worker not registering yet, and its stop short. An ESTABLISHED (01)
# socket to 127.0.0.1:PORT, as IPv4 or (gRPC's dual-stack sockets) as
# ::ffff:127.0.0.1, whose address ends the same.
await_attempt() {
  local want
  want=$(printf '0100007F:%04X' "$grpc_port")
  for _ in $(seq 1 1200); do
    awk -v want="$want" '$4 == "01" && substr($3, length($3) - 12) == want { found = 1 }
      END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

if [[ -z "$coordinator_pid" ]]; then
  fail stopped "did not start"
else
  # Past the 1 s bound (and the deregistration's 2 s) while the attempt
  # still waits: exit 5, naming it. It used to wait the attempt out.
  if start_worker worker_held --stop-timeout-seconds=1 && await_attempt; then
    kill -TERM "$pid"
    await_exit worker_held 30
    expect worker_held 5 "the stop did not end within 1 s (--stop-timeout-seconds)" \
      "it still waited for a registration attempt in flight" "exiting without it (exit code 5)"
  else
    fail worker_held "did not start"
  fi

  # A second signal during the stop exits at once (the bound is an hour).
  # Sent once the first was taken: two pending signals would be one.
  if start_worker worker_second --stop-timeout-seconds=3600 && await_attempt; then
    kill -TERM "$pid"
    if await_line worker_second "received SIGTERM; leaving"; then
      kill -INT "$pid"
      await_exit worker_second 30
      expect worker_second 5 "received SIGINT again while stopping" \
        "exiting without it (exit code 5)"
    else
      fail worker_second "never said it was leaving"
    fi
  else
    fail worker_second "did not start"
  fi

  # A further SIGHUP does not cut the stop short (a lost ssh session sends
  # two within milliseconds): the stop goes on, and a SIGTERM after it
  # does. It used to exit 5 on the second SIGHUP.
  if start_worker worker_hangup --stop-timeout-seconds=3600 && await_attempt; then
    kill -HUP "$pid"
    if await_line worker_hangup "received SIGHUP; leaving"; then
      kill -HUP "$pid"
      if await_line worker_hangup "received SIGHUP while stopping"; then
        kill -TERM "$pid"
        await_exit worker_hangup 30
        expect worker_hangup 5 "received SIGTERM again while stopping" \
          "exiting without it (exit code 5)"
      else
        await_exit worker_hangup 30
        fail worker_hangup "exit $rc: the second SIGHUP was not let pass"
      fi
    else
      fail worker_hangup "never said it was leaving"
    fi
  else
    fail worker_hangup "did not start"
  fi
fi

# A further signal during the deregistration does not skip it (without
# the call the coordinator shows the worker LOST, not LEFT): the worker
# exits once the call ended. This coordinator is stopped once the worker
# registered, so that the call waits out its 2 s deadline and the signal
# lands within it. Either exit is right after the call: 5 for the signal,
# or 0 when the rest of the stop ended first. It used to exit 5 at once,
# without the call.
if start live; then
  live_pid=$pid
  grpc_port=$(grep -o '"grpc_port": *[0-9]*' "$TMP/live.ports" | grep -o '[0-9]*$')
  if start_worker worker_deregister --stop-timeout-seconds=3600 &&
    await_line worker_deregister "registered as"; then
    kill -STOP "$live_pid"
    kill -TERM "$pid"
    if await_line worker_deregister "received SIGTERM; leaving"; then
      kill -INT "$pid"
      await_exit worker_deregister 30
      [[ "$rc" == 0 || "$rc" == 5 ]] && rc="0 or 5"
      if grep -qF "still waited for the deregistration" "$TMP/worker_deregister.log"; then
        fail worker_deregister "it exited during the deregistration"
      else
        expect worker_deregister "0 or 5" "could not deregister"
      fi
    else
      fail worker_deregister "never said it was leaving"
    fi
  else
    fail worker_deregister "did not register"
  fi
else
  fail live "did not start"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
