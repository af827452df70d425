#!/usr/bin/env bash
# The demo: installs what is missing, builds pipetrain, and runs
# `pipetrain up`: a coordinator and 4 worker processes on this machine train
# a small GPT-2 (2 layers, 4 heads, d_model 128) as a 4-stage 1F1B pipeline
# on generated English text, with a progress bar, and print where the
# weights, metrics and logs are. Extra arguments go to `pipetrain up`, e.g.
#   bash scripts/demo.sh --workers 2 --solver pipedream --steps 300
set -euo pipefail
cd "$(dirname "$0")/.."
# The build and the demo need Debian's packages only: not the tests' npm
# packages (the npm registry).
PIPETRAIN_SETUP_BUILD_ONLY=1 bash scripts/setup.sh
bazel build //cli:pipetrain
bin="$(bazel info bazel-bin 2>/dev/null)/cli/pipetrain"
# Per user: `up` refuses an --out another user owns (its tokens would be
# theirs to read), so a shared /tmp/pipetrain-demo was the first user's.
out="${PIPETRAIN_DEMO_OUT:-/tmp/pipetrain-demo-$(id -u)}"
exec "$bin" up --out "$out" "$@"
