#!/usr/bin/env bash
# Byte-identity of trace data across a change: traces every shipped and fixture model at the
# named shapes on the given devices and records the sha256 of each trace's data rows (the
# lines that do not start with '#': the header names the build, commit and elapsed time,
# which are meant to change).
#
#   scripts/trace-identity.sh record ARBITER OUT.tsv [DEVICE...]   # e.g. ref cpu cuda:bf16
#   scripts/trace-identity.sh check  ARBITER OUT.tsv               # exit 1 on any difference
#
# DEVICE is ref, cpu or cuda:DTYPE. A record made by the binary before a change, checked with
# the binary after it (same machine: the cpu tier's kernels depend on the ISA), shows whether
# the change moved any logit. SHAPES overrides the shapes (default: all five named shapes),
# MODELS the models (paths under the repository root, space-separated; default: all below).
# Traces pass --allow-long-context: the prefill shapes run past TinyStories-656K's 512
# positions, and identity is what is checked here.
set -euo pipefail
mode=${1:?record|check}; bin=${2:?arbiter binary}; file=${3:?record file}; shift 3
root=$(cd "$(dirname "$0")/.." && pwd)
corpus=$root/models/corpus/stories.txt
models=(${MODELS:-models/TinyStories-656K models/stories260K/stories260K.gguf
        tests/fixtures/models/tiny-llama tests/fixtures/models/tiny-mistral
        tests/fixtures/models/tiny-qwen2 tests/fixtures/models/tiny-qwen3
        tests/fixtures/models/tiny-qwen3-moe tests/fixtures/models/tiny-mixtral
        tests/fixtures/models/tiny-qwen2-moe
        tests/fixtures/models/tiny-gemma2 tests/fixtures/models/tiny-gemma3
        tests/fixtures/models/tiny-granite-h tests/fixtures/models/tiny-granite-h-moe
        tests/fixtures/models/tiny-nemotron-h})
shapes=(${SHAPES:-w1 w8 w256 w1ctx512 w8ctx1536})
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

digest() {  # model shape device -> sha256 of the data rows
  local model=$1 shape=$2 device=$3 dev dtype args
  dev=${device%%:*}; dtype=${device#*:}
  args=(--device "$dev")
  [ "$dtype" != "$device" ] && args+=(--dtype "$dtype")
  "$bin" trace -m "$root/$model" --corpus "$corpus" --shape "$shape" --allow-long-context "${args[@]}" \
    -o "$tmp/t.tsv" --quiet >/dev/null
  grep -v '^#' "$tmp/t.tsv" | sha256sum | cut -d' ' -f1
}

case $mode in
  record)
    devices=("$@")
    [ ${#devices[@]} -gt 0 ] || devices=(ref cpu)
    : >"$file.part"
    for m in "${models[@]}"; do
      for s in "${shapes[@]}"; do
        for d in "${devices[@]}"; do
          printf '%s\t%s\t%s\t%s\n' "$m" "$s" "$d" "$(digest "$m" "$s" "$d")" >>"$file.part"
        done
      done
    done
    mv "$file.part" "$file"
    echo "recorded $(wc -l <"$file") traces in $file"
    ;;
  check)
    fail=0 n=0
    while IFS=$'\t' read -r m s d want; do
      got=$(digest "$m" "$s" "$d"); n=$((n + 1))
      if [ "$got" != "$want" ]; then echo "DIFFERS: $m $s $d"; fail=1; fi
    done <"$file"
    [ $fail -eq 0 ] && echo "identical: $n traces" || exit 1
    ;;
  *) echo "usage: $0 record|check ARBITER FILE [DEVICE...]" >&2; exit 2 ;;
esac
