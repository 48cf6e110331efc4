#!/usr/bin/env bash
# The main job on the shipped default model: generate a story, then judge whether the cpu
# tier computes the same model as the f64 oracle (teacher-forced traces + compare).
set -euo pipefail
ARBITER=${1:-build/src/arbiter}
MODEL=models/TinyStories-656K
CORPUS=models/corpus/stories.txt
OUT=${OUT:-out/demo}
mkdir -p "$OUT"

echo "== arbiter generate (cpu tier, greedy)"
"$ARBITER" generate -m "$MODEL" -p "Once upon a time," -n 60 --device cpu

for dev in ref cpu; do
  echo "== arbiter trace --device $dev --shape w8"
  "$ARBITER" trace -m "$MODEL" --corpus "$CORPUS" --shape w8 --device "$dev" -o "$OUT/$dev.w8.tsv" --quiet
done
echo "== arbiter compare ref cpu"
set +e
"$ARBITER" compare "$OUT/ref.w8.tsv" "$OUT/cpu.w8.tsv"
rc=$?
set -e
echo "compare exit code: $rc (0 pass, 1 fail, 2 inconclusive, 3 incomparable, 4 unreadable)"
exit $rc
