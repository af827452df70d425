#!/usr/bin/env bash
# Renders an SVG (or HTML) file to a PNG with headless Chromium, e.g. to look
# at a simulated pipeline timeline:
#
#   scripts/screenshot.sh docs/images/timeline-example.svg docs/images/timeline-example.png
#
# usage: scripts/screenshot.sh INPUT.svg|INPUT.html OUTPUT.png [WIDTH HEIGHT]
# Without WIDTH and HEIGHT, an SVG's own width and height attributes are used
# (else 1400 x 900). Installs Debian's chromium when /usr/bin/chromium is
# missing (needs root). Chromium runs offline: no sync, updates or QUIC.
set -euo pipefail

if [[ $# -ne 2 && $# -ne 4 ]]; then
  echo "usage: $0 INPUT.svg|INPUT.html OUTPUT.png [WIDTH HEIGHT]" >&2
  exit 2
fi
input=$1
output=$2
if [[ ! -f "$input" ]]; then
  echo "$0: no such file: $input" >&2
  exit 1
fi

# The first width="N" / height="N" of the file (the <svg> root element).
svg_size() {
  grep -o -m1 "<svg[^>]*" "$input" | grep -o " $1=\"[0-9.]*\"" | head -n1 | grep -o '[0-9]*' | head -n1
}

if [[ $# -eq 4 ]]; then
  width=$3
  height=$4
else
  width=$(svg_size width || true)
  height=$(svg_size height || true)
  width=${width:-1400}
  height=${height:-900}
fi

if [[ ! -x /usr/bin/chromium ]]; then
  echo "$0: installing chromium" >&2
  # A fresh machine has no package lists yet: install alone finds nothing.
  apt-get update -q >&2
  apt-get install -y chromium >&2
fi

# Percent-encoded: a space, # or ? in the path would break a bare file:// URL.
input_url=$(python3 -c 'import pathlib, sys; print(pathlib.Path(sys.argv[1]).resolve().as_uri())' "$input")
output_path=$(realpath -m "$output")
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT

/usr/bin/chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --hide-scrollbars --user-data-dir="$profile" --screenshot="$output_path" \
  --window-size="$width,$height" "$input_url" >"$profile/chromium.log" 2>&1 || {
  cat "$profile/chromium.log" >&2
  exit 1
}
if [[ ! -s "$output_path" ]]; then
  echo "$0: chromium wrote no screenshot; its log:" >&2
  cat "$profile/chromium.log" >&2
  exit 1
fi
echo "$output_path (${width}x${height})"
