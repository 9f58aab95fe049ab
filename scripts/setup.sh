#!/usr/bin/env bash
# Installs the Debian packages qwentune needs to build and test. Idempotent: apt runs only when a
# package is missing. CUDA (nvcc, cuBLAS) is optional and never installed here.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libyaml-cpp-dev libsimdjson-dev
  libpcre2-dev libutf8proc-dev libopenblas-dev
  libsnappy-dev libzstd-dev zlib1g-dev
  libopenmpi-dev openmpi-bin
  chromium
)
# Packages that only need to provide a command (any install of it will do: e.g. Node.js from
# NodeSource ships npm inside its nodejs package, and Debian's npm would conflict with it).
declare -A by_command=([nodejs]=node [npm]=npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
for p in "${!by_command[@]}"; do
  command -v "${by_command[$p]}" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
