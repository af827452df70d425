#!/usr/bin/env bash
# The demo: installs what is missing, builds pipetrain, and runs
# `pipetrain up`: a coordinator and 4 worker processes on this machine train
# a small GPT-2 (2 layers, 4 heads, d_model 128) as a 4-stage 1F1B pipeline
# on generated English text, with a progress bar, and print where the
# weights, metrics and logs are. Extra arguments go to `pipetrain up`, e.g.
#   bash scripts/demo.sh --workers 2 --solver pipedream --steps 300
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd -P)"
# The build and the demo need Debian's packages only: not the tests' npm
# packages (the npm registry). Built from the checkout, but `up` runs from
# the caller's directory: relative paths among the arguments (--data,
# --loss-log, PIPETRAIN_DEMO_OUT) mean what they mean there.
PIPETRAIN_SETUP_BUILD_ONLY=1 bash "$root/scripts/setup.sh"
bin="$(cd "$root" && bazel build //cli:pipetrain >&2 && bazel info bazel-bin 2>/dev/null)/cli/pipetrain"
# Per user: `up` refuses an --out another user owns (its tokens would be
# theirs to read), so a shared /tmp/pipetrain-demo was the first user's.
out="${PIPETRAIN_DEMO_OUT:-/tmp/pipetrain-demo-$(id -u)}"
exec "$bin" up --out "$out" "$@"
