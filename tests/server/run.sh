#!/usr/bin/env bash
# ctest entry for the node tests: run.sh TEST ARBITER. SKIP (exit 77) only when node is
# absent; the openai package comes from the committed lock file (npm ci) when missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v node >/dev/null; then echo "SKIP: node is not installed (scripts/install-deps.sh installs it)"; exit 77; fi
if [ ! -d "$here/node_modules/openai" ]; then
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
fi
exec node "$here/$1.mjs" "$2"
