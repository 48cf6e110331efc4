#!/usr/bin/env bash
# Installs arbiter's build and test dependencies from Debian 12's repositories (idempotent:
# only missing packages are fetched). CUDA (nvcc, cuBLAS) is optional and not installed here;
# chromium renders the matrix report in its browser test (tests/matrix); nodejs + npm run the
# server's tests with the official openai client (tests/server, `npm ci` from its lock file);
# clang-14 and libclang-rt-14-dev build the libFuzzer harnesses (make fuzz-smoke, make fuzz; fuzz/).
# parallel runs `matrix plan`'s lines (the README tour); slurm-wlm and munge let
# tests/matrix/slurm.sh start a single-node Slurm for `matrix plan --slurm` (ctest matrix_slurm).
set -euo pipefail
pkgs=(cmake g++ make pkg-config git nlohmann-json3-dev libpcre2-dev libopenblas-dev
      libgtest-dev libbenchmark-dev libtomlplusplus-dev libcpp-httplib-dev libcmark-dev libssl-dev xz-utils python3 chromium
      clang-14 libclang-rt-14-dev parallel slurm-wlm munge)
# A machine may already have node from elsewhere (with its own npm): Debian's then stays out.
command -v node >/dev/null && command -v npm >/dev/null || pkgs+=(nodejs npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "[deps] installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The openai client for tests/server, pinned by its package-lock.json (idempotent).
server_tests="$(cd "$(dirname "$0")/../tests/server" && pwd)"
if [ ! -d "$server_tests/node_modules/openai" ]; then
  (cd "$server_tests" && npm ci --no-audit --no-fund --loglevel=error)
fi
