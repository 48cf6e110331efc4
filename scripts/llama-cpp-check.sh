#!/usr/bin/env bash
# Does llama.cpp run the GGUF files arbiter writes? (issue 26; a manual check: CI has no
# llama.cpp.) Writes synth checkpoints (dense, MoE, gemma, hybrids; f32, bf16, a quantize
# recipe) and `arbiter quantize` outputs into a temporary folder, runs llama.cpp's simple
# generator on each (8 greedy tokens on the CPU), and prints one line per file: ok, or FAIL
# (or known, for a file llama.cpp cannot run by design) with llama.cpp's first error line.
# Exit 1 when any file fails.
#
#   scripts/llama-cpp-check.sh LLAMA_BUILD_DIR [ARBITER]
#
# LLAMA_BUILD_DIR holds bin/llama-simple (or bin/llama-completion), e.g. a CPU build of
# llama.cpp 80fb11a (../shared/PEERS.md). ARBITER defaults to build-seed/src/arbiter.
# The results of a run are in docs/quantization.md §"llama.cpp runs arbiter's GGUF files".
set -uo pipefail
llama=${1:?llama.cpp build dir}
arbiter=${2:-build-seed/src/arbiter}
if [ -x "$llama/bin/llama-simple" ]; then
  cmd=("$llama/bin/llama-simple" -n 8); prompt=()  # its prompt is the last argument
elif [ -x "$llama/bin/llama-completion" ]; then
  cmd=("$llama/bin/llama-completion" -n 8 --temp 0 -no-cnv -t 2); prompt=(-p)
else
  echo "no llama-simple or llama-completion in $llama/bin" >&2
  exit 2
fi
export GGML_NO_BACKTRACE=1  # an abort would otherwise wait on a debugger attaching
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

files=()
synth() {  # preset dtype [layers]: a synth GGUF
  local f="$tmp/$1-$2${3:+-L$3}.gguf"
  if "$arbiter" synth --preset "$1" --dtype "$2" ${3:+--layers "$3"} --format gguf -o "$f" -q >/dev/null 2>&1; then
    files+=("$f")
  else
    echo "FAIL  $(basename "$f"): arbiter synth failed"
    fail=1
  fi
}
fail=0
for p in tiny tiny-moe tiny-gemma3 tiny-gemma2 tiny-granite-h; do
  for d in f32 bf16 q4_k_m; do synth "$p" "$d"; done
done
synth tiny-moe mxfp4
# tiny-nemotron-h's blocks are M E * -: an MoE Nemotron-H with a dense MLP block, which
# llama.cpp's nemotron_h_moe cannot hold (every FFN block is MoE there); its first three
# blocks (M E *) are what Nemotron 3 Nano is made of.
synth tiny-nemotron-h f32
for d in f32 bf16 q4_k_m; do synth tiny-nemotron-h "$d" 3; done
synth tiny-256 f32
for t in Q8_0 Q4_0 Q6_K Q4_K_M Q5_K_M MXFP4; do
  f="$tmp/tiny-256-f32-arbiter-$t.gguf"
  "$arbiter" quantize "$tmp/tiny-256-f32.gguf" -o "$f" --type "$t" >/dev/null 2>&1 && files+=("$f")
done

# Files llama.cpp cannot run by its own design (above), reported as "known", not failures.
known="tiny-nemotron-h-f32.gguf"
for f in "${files[@]}"; do
  name=$(basename "$f")
  if out=$(timeout 120 "${cmd[@]}" -m "$f" "${prompt[@]}" "Once upon a time" 2>&1 </dev/null); then
    printf 'ok    %s\n' "$name"
  else
    err=$(printf '%s\n' "$out" | grep -aE 'error loading model:|GGML_ASSERT|error|failed|abort' | head -1)
    err=${err:-$(printf '%s\n' "$out" | tail -1)}
    if [ "$name" = "$known" ]; then
      printf 'known %s: %s\n' "$name" "$err"
    else
      fail=1
      printf 'FAIL  %s: %s\n' "$name" "$err"
    fi
  fi
done
exit $fail
