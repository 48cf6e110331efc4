#!/usr/bin/env bash
# The main job: the default correctness matrix (matrix/default.toml, docs/matrix.md). It
# traces the shipped model on the f64 reference tier and on every candidate tier (the cuda
# arms say SKIP without a GPU), judges each candidate against the reference with an A/A
# control and a noise floor, and writes report.md, report.html and results.json. The output
# opens with the report's path; the exit code is the matrix verdict (0 pass, 1 fail,
# 2 inconclusive, 3 incomparable, 4 unreadable).
set -euo pipefail
ARBITER=${1:-build/src/arbiter}
OUT=${OUT:-out/matrix}
set +e
"$ARBITER" matrix run matrix/default.toml -o "$OUT" --quiet
rc=$?
set -e
echo
echo "open $OUT/report.html in a browser; rerun the same command to resume (finished traces are kept)"
exit $rc
