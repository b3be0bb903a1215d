#!/usr/bin/env bash
# WAN transport goodput (world/wan.h), as markdown tables:
#   (a) emulated links (latency + bandwidth inside the transport): all-reduce among 3 sites and a
#       send between 2, 16-64 MiB over 50/100/400 Mbit/s links; achieved / configured (goal >= 0.90);
#   (b) unthrottled loopback: a 256 MiB send through the transport vs a raw TCP socket
#       (goal >= 0.70).
# Sites are threads of one process, each with its own endpoint on 127.0.0.1.
#   bench/wan_bench.sh [BUILD_DIR] [extra wan_bench args, e.g. --part b --repeat-b 11]
# BUILD_DIR defaults to build/release. The default run takes about 1-2 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
[[ -f "$BUILD/build.ninja" ]] || cmake --preset release -B "$BUILD" >/dev/null
cmake --build "$BUILD" -j2 --target wan_bench >/dev/null
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
"$BUILD/bench/wan/wan_bench" --repeat 3 --repeat-b 7 "${@:2}"
