# Sourced by a device call's script (call-*-sNN.sh, session 30 on): unpacks the binaries that
# pack.sh put in $CARRY (default .carry/bNN of the caller), sets B (their directory), A (the
# arbiter binary, also at build-cuda/src/arbiter for tests that look there), the library path
# and /work/main, and opens the summary: s MESSAGE appends a timed line to $S, and on exit
# the results under /tmp/r go to $OUT/r.tgz and the summary is printed.
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
# .carry/ is git-ignored: it travels only when the run names it in `carry` (session 44 lost a
# start to a run without it). Say so at once rather than run every step without binaries.
[ -f "$CARRY/bin.tar.xz" ] || { echo "no $CARRY/bin.tar.xz here: pass carry [\"$CARRY\"] to run" >&2; exit 2; }
T0=$(date +%s)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C "$CARRY" -xJf "$CARRY/bin.tar.xz"
B=$PWD/$CARRY/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $A build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
