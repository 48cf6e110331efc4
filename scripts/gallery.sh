#!/usr/bin/env bash
# Screenshots of the matrix report for docs/gallery.md: the top of the default matrix's
# report and of a failing one (docs/gallery/failing.toml), taken by headless Chromium at
# 1280x1600. Run from the repository root after a build:
#   scripts/gallery.sh [ARBITER_BINARY] [PREFIX]     (defaults: build/src/arbiter, after)
# writes docs/gallery/PREFIX-default.png and docs/gallery/PREFIX-failing.png.
set -euo pipefail
bin=${1:-build/src/arbiter}
prefix=${2:-after}
chromium=$(command -v chromium || command -v chromium-browser || true)
[ -n "$chromium" ] || { echo "gallery.sh: chromium not installed (apt-get install chromium)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
shoot() {  # shoot SPEC NAME
  "$bin" matrix run "$1" -o "$work/$2" --quiet >/dev/null || true  # a failing matrix exits 1
  "$chromium" --headless --no-sandbox --disable-gpu --no-first-run --hide-scrollbars \
    --user-data-dir="$work/profile" --window-size=1280,1600 \
    --screenshot="docs/gallery/$prefix-$2.png" "file://$work/$2/report.html" >/dev/null 2>&1
  echo "docs/gallery/$prefix-$2.png: $(stat -c %s "docs/gallery/$prefix-$2.png") bytes"
}
shoot matrix/default.toml default
shoot docs/gallery/failing.toml failing
