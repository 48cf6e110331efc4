#!/usr/bin/env bash
# Session 33, call B: every kernel a decode step can run launched with the most-shared L1/shared
# split (launch_decode_k): the norms, RoPE and KV stores, the elementwise ops, the Mamba2 step
# kernels and Qwen2-MoE's sigmoid gate took the driver's split until now. test_cuda and the
# cuda op tests; w1 traces of four fixtures from arbiter_old (b329cec, call A's routing) and
# arbiter (the same bits?); the two binaries alternating on synth bf16 decode of dense, Gemma,
# hybrid and MoE presets. No change beyond noise: not landed (the diff: launch-split-s33.diff).
set -u
CARRY=.carry/b33b
source "$(dirname "$0")/call-common.sh"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 150 $B/test_ops --gtest_filter='*cuda*' > "$R/test_ops.log" 2>&1; s "test_ops cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
C=models/corpus/stories.txt
for f in tiny-gemma3 tiny-granite-h tiny-nemotron-h tiny-qwen2-moe; do
  for b in arbiter_old arbiter; do
    timeout 60 $B/$b trace -m tests/fixtures/models/$f --device cuda --dtype bf16 --shape w1 --corpus $C -o $R/tr-$f-$b.tsv > /dev/null 2>&1
    s "trace $f w1 $b rc=$? data rows sha $(grep -v '^#' $R/tr-$f-$b.tsv | sha256sum | cut -c1-16) ($(grep -vc '^#' $R/tr-$f-$b.tsv) rows)"
  done
done
bench() {  # preset binary round
  timeout 120 $B/$2 bench --synth $1 --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-$1-$2-$3.txt 2>&1
  s "$1 $2 #$3 rc=$? $(grep -E '^\| tg128' $R/bench-$1-$2-$3.txt | tr -s ' ')"
}
for m in qwen3-0.6b llama-3.2-1b gemma3-1b granite-4.0-h-1b granite-4.0-h-tiny nemotron-3-nano-30b-a3b qwen3-30b-a3b; do
  bench $m arbiter_old 1; bench $m arbiter 1
done
for m in qwen3-0.6b gemma3-1b granite-4.0-h-1b granite-4.0-h-tiny; do
  bench $m arbiter 2; bench $m arbiter_old 2
done
