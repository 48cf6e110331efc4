#!/usr/bin/env bash
# arbiter and llama.cpp on the same GGUF file in the same call (issues 27 and 31): llama-bench's
# pp and tg next to `arbiter bench`, and with --concurrency, llama-batched-bench's aggregate
# decode next to `arbiter bench --concurrency`. The two engines alternate round by round (the
# host is noisy); the summary gives medians over the rounds and their ratio.
#
#   scripts/peer-bench.sh [--device cpu|cuda] [-m FILE.gguf | --preset qwen3-0.6b --dtype bf16]
#                         [-p 512] [-n 128] [-t THREADS] [--rounds 3]
#                         [--concurrency 1,8,64 [--conc-p 64] [--conc-n 32]]
#
# Without -m, `arbiter synth --preset P --dtype D --format gguf` writes the file (1-D tensors
# in F32, as llama.cpp's converter writes them). llama.cpp is built from the npm bundle as
# ../shared/PEERS.md says, into $PEERS (default ~/.cache/arbiter-peers), when
# $LLAMA_BUILD/bin has no llama-bench; with --device cuda, with GGML_CUDA for sm_90.
# Environment: ARBITER (default build/src/arbiter), LLAMA_BUILD (default $PEERS/llama.cpp/build),
# OUT (default out/peer-bench): the raw JSON of every run and summary.md land there.
set -euo pipefail
cd "$(dirname "$0")/.."
device=cpu model="" preset=qwen3-0.6b dtype=bf16 P=512 N=128 threads=$(nproc) rounds=3
conc="" conc_p=64 conc_n=32
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    -m) model=$2; shift 2 ;;
    --preset) preset=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    -p) P=$2; shift 2 ;;
    -n) N=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --concurrency) conc=$2; shift 2 ;;
    --conc-p) conc_p=$2; shift 2 ;;
    --conc-n) conc_n=$2; shift 2 ;;
    *) echo "peer-bench: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$device" in cpu) ngl=0 ;; cuda) ngl=99 ;; *) echo "peer-bench: --device cpu|cuda, not '$device'" >&2; exit 2 ;; esac
ARBITER=${ARBITER:-build/src/arbiter}
PEERS=${PEERS:-$HOME/.cache/arbiter-peers}
LLAMA_BUILD=${LLAMA_BUILD:-$PEERS/llama.cpp/build}
OUT=${OUT:-out/peer-bench}
mkdir -p "$OUT"
[ -x "$ARBITER" ] || { echo "peer-bench: no arbiter binary at $ARBITER (make build, or set ARBITER)" >&2; exit 2; }

# The peer, built offline from the npm package's git bundle (release v0.4.0, commit 80fb11a).
if [ ! -x "$LLAMA_BUILD/bin/llama-bench" ] || { [ -n "$conc" ] && [ ! -x "$LLAMA_BUILD/bin/llama-batched-bench" ]; }; then
  src=$(dirname "$LLAMA_BUILD")
  if [ ! -d "$src/.git" ]; then
    mkdir -p "$PEERS"
    (cd "$PEERS" && npm i -E --ignore-scripts node-llama-cpp@3.21.1 >/dev/null)
    git clone -q "$PEERS/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$src"
  fi
  cuda=()
  # A machine without the GPU driver builds it too: libcuda.so.1 is then missing at link time.
  [ "$device" = cuda ] && cuda=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real
                                -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined)
  # The native CPU build compiles ggml's AMX path on a host that has AMX; on the 2-vCPU dev VM
  # that path crashed on every quantized GGUF (segfault, SIGILL), with AMX tile data granted
  # by the kernel. Without AMX the same commit runs (docs/performance.md, session 25).
  noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  echo "peer-bench: building llama.cpp in $LLAMA_BUILD (about 15 minutes on 2 cores)" >&2
  cmake -S "$src" -B "$LLAMA_BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" "${cuda[@]}" >/dev/null
  cmake --build "$LLAMA_BUILD" -j"$(nproc)" --target llama-bench llama-batched-bench >/dev/null
fi

if [ -z "$model" ]; then
  model="$OUT/$preset-$dtype.gguf"
  [ -f "$model" ] || "$ARBITER" synth --preset "$preset" --dtype "$dtype" --format gguf --seed 0 -q -o "$model"
fi
dev=(--device "$device")
[ "$device" = cuda ] && dev+=(--dtype bf16)
export GGML_NO_BACKTRACE=1
for r in $(seq 1 "$rounds"); do
  echo "peer-bench: round $r of $rounds" >&2
  "$ARBITER" bench -m "$model" "${dev[@]}" -t "$threads" -p "$P" -n "$N" -r 1 \
    --json-out "$OUT/arbiter-$r.json" >"$OUT/arbiter-$r.txt" 2>"$OUT/arbiter-$r.err"
  "$LLAMA_BUILD/bin/llama-bench" -m "$model" -p "$P" -n "$N" -r 1 -t "$threads" -ngl "$ngl" -o json \
    >"$OUT/llama-bench-$r.json" 2>"$OUT/llama-bench-$r.err"
  if [ -n "$conc" ]; then
    "$ARBITER" bench -m "$model" "${dev[@]}" -t "$threads" -p "$conc_p" -n "$conc_n" -r 1 --concurrency "$conc" \
      --json-out "$OUT/arbiter-conc-$r.json" >"$OUT/arbiter-conc-$r.txt" 2>"$OUT/arbiter-conc-$r.err"
    max=$(tr ',' '\n' <<<"$conc" | sort -n | tail -1)
    "$LLAMA_BUILD/bin/llama-batched-bench" -m "$model" -c $((max * (conc_p + conc_n) + 16)) -b 2048 -ub 512 \
      -npp "$conc_p" -ntg "$conc_n" -npl "$conc" -t "$threads" -ngl "$ngl" --output-format jsonl \
      >"$OUT/llama-batched-$r.jsonl" 2>"$OUT/llama-batched-$r.err"
  fi
done

python3 - "$OUT" "$rounds" "$model" "$device" "$threads" "$P" "$N" "$conc" "$conc_p" "$conc_n" >"$OUT/summary.md" <<'PY'
import json, statistics, sys
out, rounds, model, device, threads, P, N, conc, cp, cn = sys.argv[1:]
rounds = int(rounds)
med = lambda xs: statistics.median(xs) if xs else float("nan")
A = [json.load(open(f"{out}/arbiter-{r}.json")) for r in range(1, rounds + 1)]
L = [json.load(open(f"{out}/llama-bench-{r}.json")) for r in range(1, rounds + 1)]
def llama(kind):
    return [t["avg_ts"] for run in L for t in run if (t["n_gen"] == 0) == (kind == "pp")]
print(f"# arbiter and llama.cpp, same file, same call\n\n{model} on {device}, {threads} threads, "
      f"{rounds} alternating rounds; medians (scripts/peer-bench.sh)\n")
print("| test | arbiter tok/s | llama.cpp tok/s | arbiter / llama.cpp | arbiter, fraction of the limit |")
print("|---|---|---|---|---|")
for kind, n in (("pp", P), ("tg", N)):
    a = med([x[kind]["tok_s"]["median"] for x in A])
    l = med(llama(kind))
    frac = med([x["limits"]["prefill" if kind == "pp" else "decode"]["fraction"] or float("nan") for x in A])
    print(f"| {kind}{n} | {a:.1f} | {l:.1f} | {a / l:.2f} | {frac:.3f} |")
if conc:
    C = [json.load(open(f"{out}/arbiter-conc-{r}.json")) for r in range(1, rounds + 1)]
    B = [json.loads(line) for r in range(1, rounds + 1) for line in open(f"{out}/llama-batched-{r}.jsonl")
         if line.startswith("{")]
    print(f"\nContinuous batching: -p {cp} -n {cn} per stream; aggregate decode tok/s (llama-batched-bench's S_TG)\n")
    print("| streams | arbiter tok/s | llama.cpp tok/s | arbiter / llama.cpp | arbiter, fraction of the roofline (bound) |")
    print("|---|---|---|---|---|")
    for s in [int(x) for x in conc.split(",")]:
        lv = [l for c in C for l in c["levels"] if l["streams"] == s]
        a = med([l["decode_tok_s"]["median"] for l in lv])
        b = med([x["speed_tg"] for x in B if x["pl"] == s])
        fr = med([l["limits"]["fraction"] for l in lv if "limits" in l])
        bound = lv[0]["limits"]["bound"] if lv and "limits" in lv[0] else "-"
        print(f"| {s} | {a:.1f} | {b:.1f} | {a / b:.2f} | {fr:.3f} ({bound}) |")
PY
cat "$OUT/summary.md"
