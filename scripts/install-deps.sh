#!/usr/bin/env bash
# Installs arbiter's build and test dependencies from Debian 12's repositories (idempotent:
# only missing packages are fetched). CUDA (nvcc, cuBLAS) is optional and not installed here;
# chromium renders the matrix report in its browser test (tests/matrix); clang-14 and
# libclang-rt-14-dev build the libFuzzer harnesses (make fuzz-smoke, fuzz/).
set -euo pipefail
pkgs=(cmake g++ make pkg-config git nlohmann-json3-dev libpcre2-dev libopenblas-dev
      libgtest-dev libbenchmark-dev libtomlplusplus-dev xz-utils python3 chromium
      clang-14 libclang-rt-14-dev)
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
