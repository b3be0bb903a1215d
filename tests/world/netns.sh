#!/usr/bin/env bash
# A real network: three sites in network namespaces of their own, joined to the coordinator's by
# veth pairs on a bridge, every veth shaped by a tbf bandwidth cap (200 Mbit/s each way) — real
# kernel TCP between distinct addresses, mutual TLS and the token on. Each site's leader listens
# on 0.0.0.0 inside its namespace and advertises its own address. For each strategy (sync,
# diloco, streaming with int4, async) the world trains 6 steps (configs/tiny.toml); sync, diloco
# and streaming log exactly the losses of the same world run over loopback by `atoll launch`, and
# async (whose result depends on the order of the pushes) completes every step on every site.
# Needs root, ip and tc (skipped, exit 77, without them). Usage: netns.sh ATOLL MPIEXEC
set -euo pipefail
MPIEXEC=${2:?usage: $0 ATOLL MPIEXEC}
source "$(dirname "$0")/../e2e_lib.sh"
[[ $(id -u) == 0 ]] || { echo "SKIP: network namespaces need root" >&2; exit 77; }
command -v ip >/dev/null && command -v tc >/dev/null ||
  { echo "SKIP: no ip/tc (apt-get install iproute2)" >&2; exit 77; }
export PATH="$(dirname "$(command -v "$MPIEXEC")"):$PATH"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

P=at$(($$ % 100000))        # interface and namespace names: at most 15 characters
NET=10.213.$(($$ % 250))    # a /24 of this run
BR=${P}br
COORD_PID=
cleanup() {
  [[ -n $COORD_PID ]] && kill "$COORD_PID" 2>/dev/null
  for s in 0 1 2; do ip netns pids "${P}n$s" 2>/dev/null | xargs -r kill -9 2>/dev/null || true; done
  wait 2>/dev/null || true
  for s in 0 1 2; do ip netns del "${P}n$s" 2>/dev/null || true; done
  ip link del "$BR" 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT

# The network: a bridge with the coordinator's address, and per site a namespace, a veth pair
# (one end in the namespace, the other on the bridge) and a tbf cap on both ends.
ip link add "$BR" type bridge || { echo "SKIP: cannot make a bridge here" >&2; exit 77; }
ip addr add "$NET.254/24" dev "$BR"
ip link set "$BR" up
for s in 0 1 2; do
  ns=${P}n$s
  ip netns add "$ns" || { echo "SKIP: cannot make a network namespace here" >&2; exit 77; }
  ip link add "${P}h$s" type veth peer name "${P}s$s"
  ip link set "${P}s$s" netns "$ns"
  ip link set "${P}h$s" master "$BR" up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip addr add "$NET.$((s + 1))/24" dev "${P}s$s"
  ip netns exec "$ns" ip link set "${P}s$s" up
  ip netns exec "$ns" tc qdisc add dev "${P}s$s" root tbf rate 200mbit burst 256kb latency 100ms &&
    tc qdisc add dev "${P}h$s" root tbf rate 200mbit burst 256kb latency 100ms ||
    { echo "SKIP: no tbf qdisc (sch_tbf) here" >&2; exit 77; }
done
# Site to site across the bridge (a host whose firewall drops bridged traffic, as Docker's
# FORWARD policy can, would hang the sites: skipped instead). A listener in site 0's namespace.
ip netns exec "${P}n0" "$ATOLL" coordinator --listen "$NET.1:0" --sites 1 --state "$T/probe" \
  --insecure >"$T/probe.addr" 2>"$T/probe.err" &
probe=$!
coordinator_address "$T/probe.addr" "$probe" "$T/probe.err"
port=${ADDR##*:}
reach=0
ip netns exec "${P}n2" timeout 5 bash -c "exec 3<>/dev/tcp/$NET.1/$port" 2>/dev/null && reach=1
kill "$probe" 2>/dev/null; wait "$probe" 2>/dev/null || true
((reach)) || { echo "SKIP: site 2's namespace cannot reach site 0's over the bridge (a firewall?)" >&2; exit 77; }

"$ATOLL" certs --out "$T/certs" --sites 3 >/dev/null 2>&1 || fail "atoll certs failed"

W=(--config configs/tiny.toml --set data.dir="$DATA" --set train.steps=6 --set world.sites=3
   --set world.ranks_per_site=1 --set train.batch_size=6 --set train.micro_batch_size=1
   --set world.heartbeat_s=0.5 --set world.diloco.inner_steps=2)
declare -A EXTRA=(
  [sync]="--set world.strategy=sync"
  [diloco]="--set world.strategy=diloco --set world.codec=int8"
  [streaming]="--set world.strategy=streaming --set world.streaming.fragments=2 --set world.streaming.overlap_steps=0 --set world.codec=int4"
  [async]="--set world.strategy=async --set world.codec=bf16")

for strategy in sync diloco streaming async; do
  read -r -a X <<<"${EXTRA[$strategy]}"
  D=$T/$strategy
  mkdir -p "$D"
  "$ATOLL" coordinator --listen "$NET.254:0" --sites 3 --state "$D" --certs "$T/certs" \
    --heartbeat-s 0.5 >"$D/addr" 2>"$D/coord.err" &
  COORD_PID=$!
  coordinator_address "$D/addr" "$COORD_PID" "$D/coord.err"
  [[ $ADDR == "$NET.254:"* ]] || fail "$strategy: the coordinator printed '$ADDR': $(cat "$D/coord.err")"
  pids=()
  for s in 0 1 2; do
    # Each mpirun its own OpenMPI session directory: started at once, they race to make a shared
    # one ("orte_session_dir failed"), as launch avoids too.
    mkdir -p "$D/ompi-$s"
    ip netns exec "${P}n$s" env OMPI_MCA_orte_tmpdir_base="$D/ompi-$s" \
      timeout 150 "$MPIEXEC" -n 1 "$ATOLL" train "${W[@]}" "${X[@]}" -q --site "$s" \
      --coordinator "$ADDR" --certs "$T/certs" --wan-listen 0.0.0.0:7100 \
      --wan-advertise "$NET.$((s + 1)):7100" --out "$D/site-$s" --checkpoint-dir "$D" \
      >"$D/s$s.out" 2>"$D/s$s.err" &
    pids+=($!)
  done
  for s in 0 1 2; do
    wait "${pids[$s]}" || fail "$strategy: site $s failed: $(grep -m5 -i "error" "$D/s$s.err")"
  done
  kill "$COORD_PID"; wait "$COORD_PID" 2>/dev/null || true; COORD_PID=
  for s in 0 1 2; do
    [[ $(grep -c "\"site\":$s" "$D/site-$s/metrics.jsonl") == 6 ]] ||
      fail "$strategy: site $s did not log 6 steps"
    column loss "$D/site-$s/metrics.jsonl" | grep -qvE '^[0-9.eE+-]+$' &&
      fail "$strategy: site $s logged a loss that is not a number"
  done
  [[ -f $D/checkpoint/model.safetensors ]] || fail "$strategy: no checkpoint"
  if [[ $strategy != async ]]; then
    expect_exit 0 timeout 120 "$ATOLL" launch "${W[@]}" "${X[@]}" -q --insecure --out "$T/ref-$strategy"
    for s in 0 1 2; do
      [[ $(column loss "$D/site-$s/metrics.jsonl") == $(column loss "$T/ref-$strategy/site-$s/metrics.jsonl") ]] ||
        fail "$strategy: site $s's losses over the namespaces differ from loopback's"
    done
    echo "$strategy: 3 sites in namespaces, TLS, tbf 200 Mbit/s: the losses of the loopback run"
  else
    [[ -s $D/ops.jsonl ]] || fail "async: no operation log"
    echo "async: 3 sites in namespaces, TLS, tbf 200 Mbit/s: 6 steps each, $(grep -c '"t":"update"' "$D/ops.jsonl") updates logged"
  fi
done
echo "PASS: netns"
