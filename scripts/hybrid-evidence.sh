#!/usr/bin/env bash
# The investigation issue 24 was filed for, run end to end on a Mamba2 hybrid fixture: does
# a backend's w1 path (M = 1 matvecs, ssm_step on an empty state, single-key attention) differ
# from its w8 path by more than rounding? (docs/localize.md, "Worked example: a hybrid's w1
# against w8".)
#   1. traces of the hybrid at w1 and w8 on the reference (ref, f64) and on the side under
#      test, compared shape by shape: the NLL shift and the spread with their SEs;
#   2. the same side's w1 trace against its own w8 trace is not comparable position by
#      position (a w1 position sees one token, a w8 position up to eight), so the paths are
#      set side by side through their shifts against the reference;
#   3. opcheck of every op of the model on the side's tier, at width 1 (the decode path:
#      ssm_step, M = 1 matvecs, single-key attention) and width 8 (ssm_conv + ssm_scan);
#   4. the decision rule: the gap is rounding only if every op is within its dtype's bound.
# Usage, from the repository root: scripts/hybrid-evidence.sh [DEVICE [DTYPE]]
#   (default cuda bf16; cpu f32 runs it on any machine). Env: MODEL, OUT, ARBITER (binary).
set -uo pipefail
cd "$(dirname "$0")/.."
DEV=${1:-cuda}
DT=${2:-bf16}
A=${ARBITER:-build/src/arbiter}
MODEL=${MODEL:-tests/fixtures/models/tiny-granite-h}
OUT=${OUT:-out/hybrid-evidence}
C=models/corpus/stories.txt
mkdir -p "$OUT"
side="$DEV"
[ "$DEV" = cpu ] || side="$DEV:$DT"
dt_args=()
[ "$DEV" = cpu ] || dt_args=(--dtype "$DT")
for shape in w1 w8; do
  "$A" trace -m "$MODEL" --corpus $C --shape $shape --device ref -o "$OUT/ref.$shape.tsv" --quiet
  "$A" trace -m "$MODEL" --corpus $C --shape $shape --device "$DEV" "${dt_args[@]}" \
    -o "$OUT/side.$shape.tsv" --quiet
  echo "\$ arbiter compare ref.$shape.tsv side.$shape.tsv   # side = $side"
  "$A" compare "$OUT/ref.$shape.tsv" "$OUT/side.$shape.tsv"
  echo "compare exit code $?"
done >"$OUT/compare.txt" 2>&1
for w in 1 8; do
  echo "\$ arbiter opcheck -m $MODEL --device $DEV ${dt_args[*]} --positions 64 --width $w"
  "$A" opcheck -m "$MODEL" --device "$DEV" "${dt_args[@]}" --positions 64 --width $w
  echo "opcheck exit code $?"
done >"$OUT/opcheck.txt" 2>&1
grep -E "^\\\$|mean delta|  mean  |nll|decided|VERDICT|exit code" "$OUT/compare.txt"
grep -E "^\\\$|^ssm|^rmsnorm|^matmul|^attention|OPCHECK|exit code" "$OUT/opcheck.txt"
