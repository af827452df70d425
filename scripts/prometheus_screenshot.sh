#!/usr/bin/env bash
# Trains a small job with `pipetrain up` while a Prometheus on loopback
# scrapes the coordinator and the workers every second, then renders
# Prometheus's graph of pipetrain_job_loss with headless Chromium:
#
#   scripts/prometheus_screenshot.sh [OUTPUT.png] [extra `pipetrain up` flags]
#
# Default output docs/images/prometheus-loss.png; default job: 2 workers,
# 300 steps. Prometheus starts first and finds the targets through a
# file_sd file written once `pipetrain up` has written its ports files, so
# the graph covers the whole job. Everything runs in a temporary directory
# and is stopped on exit (also on failure or Ctrl-C).
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: $0 [OUTPUT.png] [extra \`pipetrain up\` flags]"
case "${1:-}" in
  -h | --help) echo "$usage"; exit 0 ;;
  -*) echo "$usage" >&2; exit 2 ;;  # a flag would be taken for the output file
esac
output=${1:-docs/images/prometheus-loss.png}
shift || true
# The job lasts some 15 s: a 30 s window shows its curve wide (PROMETHEUS_RANGE=5m etc.).
range=${PROMETHEUS_RANGE:-30s}

# The workers `up` starts, to wait for each one's ports file: --workers
# (default 2 here); the last one given wins, as in pipetrain's flag parsing.
workers=2
previous=""
for arg in "$@"; do
  if [[ "$previous" == --workers ]]; then workers=$arg; fi
  if [[ "$arg" == --workers=* ]]; then workers=${arg#--workers=}; fi
  if [[ "$arg" == --out || "$arg" == --out=* ]]; then
    echo "$0: --out is this script's (a temporary directory it watches)" >&2
    exit 2
  fi
  previous=$arg
done
if ! [[ "$workers" =~ ^[1-9][0-9]*$ ]]; then
  echo "$0: --workers must be a count of 1 or more, not '$workers'" >&2
  exit 2
fi

# command:Debian package. Only prometheus comes with scripts/setup.sh.
missing=()
for tool in /usr/bin/prometheus:prometheus /usr/bin/chromium:chromium python3:python3 curl:curl jq:jq; do
  if ! command -v "${tool%%:*}" >/dev/null; then missing+=("${tool#*:}"); fi
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "$0: needs Debian's ${missing[*]}: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi

bazel build //cli:pipetrain //coordinator:pipetrain-coordinator //worker:pipetrain-worker >&2
bin="$(bazel info bazel-bin 2>/dev/null)/cli/pipetrain"

work=$(mktemp -d)
up_pid="" prom_pid=""
cleanup() {
  # pipetrain up stops its coordinator and workers on SIGTERM.
  for pid in $up_pid $prom_pid; do kill "$pid" 2>/dev/null || true; done
  for pid in $up_pid $prom_pid; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# Polls `$@` every 0.2 s for up to $1 seconds; fails naming $2.
await() {
  local seconds=$1 what=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    if ((SECONDS >= deadline)); then
      echo "$0: timed out after ${seconds}s waiting for $what (logs in $work)" >&2
      trap - EXIT  # keep the logs for a look; still stop the processes
      for pid in $up_pid $prom_pid; do kill "$pid" 2>/dev/null || true; done
      exit 1
    fi
    sleep 0.2
  done
}

# Prometheus cannot listen on port 0 and report the port, so take one the
# kernel says is free. Another process may grab it before Prometheus binds;
# then Prometheus exits and the next attempt picks another port.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: pipetrain
    file_sd_configs:
      - files: ["$work/targets.json"]
EOF
echo '[]' >"$work/targets.json"

ready() { curl -sf "http://127.0.0.1:$port/-/ready" >/dev/null || ! kill -0 "$prom_pid" 2>/dev/null; }
for _ in 1 2 3; do
  port=$(free_port)
  /usr/bin/prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$port" >"$work/prometheus.log" 2>&1 &
  prom_pid=$!
  await 30 "Prometheus to become ready" ready
  kill -0 "$prom_pid" 2>/dev/null && break
  grep -q "address already in use" "$work/prometheus.log" || {
    cat "$work/prometheus.log" >&2
    exit 1
  }
  prom_pid=""
done
[[ -n "$prom_pid" ]] || { echo "$0: every port picked for Prometheus was taken" >&2; exit 1; }
echo "Prometheus at http://127.0.0.1:$port" >&2

"$bin" up --workers 2 --steps 300 --out "$work/up" --keep-running "$@" >"$work/up.log" 2>&1 &
up_pid=$!
# Every worker's, not the last one's: they start at once and may be ready in
# any order. (Each file appears whole: pipetrain renames it into place.)
ports_written() {
  local i
  [[ -f "$work/up/coordinator.ports" ]] || return 1
  for ((i = 0; i < workers; i++)); do [[ -f "$work/up/worker-$i.ports" ]] || return 1; done
}
await 60 "the cluster's ports files" ports_written

# The targets, written whole and renamed so Prometheus never reads half a file.
jq -s '[{targets: ([.[0].http_port] + (.[1:] | map(.metrics_port)) | map("127.0.0.1:\(.)"))}]' \
  "$work/up/coordinator.ports" "$work"/up/worker-*.ports >"$work/targets.tmp"
mv "$work/targets.tmp" "$work/targets.json"

# `pipetrain up` buffers its stdout in a file, so watch the coordinator's
# job counts instead of its output.
coordinator_port=$(jq .http_port "$work/up/coordinator.ports")
ended_jobs() {
  curl -sf "http://127.0.0.1:$coordinator_port/metrics" |
    grep -E '^pipetrain_jobs\{state="(SUCCEEDED|FAILED|CANCELLED)"\} [1-9]'
}
job_done() { ended_jobs >/dev/null || ! kill -0 "$up_pid" 2>/dev/null; }
await 600 "the job to finish" job_done
ended_jobs | grep -q SUCCEEDED || {
  echo "$0: the job did not succeed; pipetrain up's output and logs are in $work/up" >&2
  exit 1
}
# Two more scrapes, so the last step's loss is stored.
sleep 2

# Debian's Prometheus ships only the classic UI: /graph redirects to
# /classic/graph and drops the query, so ask for the classic page directly.
url="http://127.0.0.1:$port/classic/graph?g0.expr=pipetrain_job_loss&g0.tab=0&g0.range_input=$range"
output_path=$(realpath -m "$output")
mkdir -p "$(dirname "$output_path")"
# The flags of scripts/screenshot.sh, plus a virtual-time budget so the page
# fetches the data and draws the graph before the screenshot.
/usr/bin/chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --hide-scrollbars --user-data-dir="$work/chromium" --screenshot="$output_path" \
  --window-size=1400,900 --virtual-time-budget=10000 "$url" >"$work/chromium.log" 2>&1 || {
  cat "$work/chromium.log" >&2
  exit 1
}
[[ -s "$output_path" ]] || { echo "$0: chromium wrote no screenshot" >&2; exit 1; }
echo "$output_path ($url)"
