#!/usr/bin/env bash
# Packs binaries of this machine's build for a device call: DIR/bin.tar.xz holds stage/ with
# the stripped binaries and every shared library they load that is not glibc's or CUDA's
# (the device machine has its own CUDA, not Debian's OpenBLAS, PCRE2, cmark ...). A call's
# script unpacks it with `tar -C DIR -xJf DIR/bin.tar.xz` and sets LD_LIBRARY_PATH=DIR/stage.
# OpenBLAS (4 MB compressed, with gfortran and quadmath) does not fit beside two CUDA binaries
# and the work tree in a call's 64 MiB: in its place goes a stub libopenblas.so.0 whose
# cblas_sgemm aborts with a message (the cpu tier's default GEMM is its own, ARBITER_CPU_GEMM
# =blas the only caller). FULL_BLAS=1 carries the real one.
# Usage: [BUILD=build-cuda] [EXTRA="file ..."] [FULL_BLAS=1] pack.sh DIR NAME... (NAME: a
# target of BUILD).
set -euo pipefail
DIR=$1; shift
BUILD=${BUILD:-build-cuda}
S=$(mktemp -d)/stage; mkdir -p "$S"
for n in "$@"; do
  f=$(find "$BUILD" -type f -name "$n" -perm -u+x | head -1)
  [ -n "$f" ] || { echo "pack.sh: no binary '$n' under $BUILD" >&2; exit 1; }
  cp "$f" "$S/"
done
for f in ${EXTRA:-}; do cp "$f" "$S/"; done
# Libraries: everything ldd resolves except the C runtime and the CUDA driver/toolkit.
for b in "$S"/*; do
  ldd "$b" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so|/usr/local/cuda|libcuda\.so' |
  while read -r l; do cp -L "$l" "$S/"; done
if [ -z "${FULL_BLAS:-}" ]; then
  rm -f "$S"/libopenblas.so.0 "$S"/libgfortran.so.* "$S"/libquadmath.so.*
  printf '%s\n' '#include <stdio.h>' '#include <stdlib.h>' 'void openblas_set_num_threads(int n) { (void)n; }' \
    'void cblas_sgemm(void) { fputs("libopenblas.so.0 is a stub on this machine (pack.sh)\n", stderr); abort(); }' |
    gcc -shared -fPIC -x c -o "$S/libopenblas.so.0" -Wl,-soname,libopenblas.so.0 -
fi
strip --strip-unneeded "$S"/* 2>/dev/null || true
mkdir -p "$DIR"
XZ_OPT=-9e tar -C "$(dirname "$S")" -cJf "$DIR/bin.tar.xz" stage  # -9e: two builds of one binary share its dictionary
du -h "$DIR/bin.tar.xz"
