#!/usr/bin/env bash
# `atoll launch` end to end: a world of 2 sites x 1 rank on this machine (the coordinator and two
# mpiruns as child processes), on configs/tiny.toml for 6 steps over emulated 5 ms / 200 Mbit/s
# links, once --insecure and once with the certificates launch makes (mutual TLS + token).
# Checks: exit 0 and the checkpoint path on stdout; each site's metrics.jsonl has 6 lines with its
# "site"; DIR/checkpoint/model.safetensors exists; site 0's loss and validation curve is the
# single-process one (same batch and micro-batch) within 1e-5 relative, and site 1 reports the same
# losses; a bad config exits 2, and world.sites = 1 is refused with a pointer to `atoll train`.
# Also: each site's mpirun has its own Open MPI session directory, a site that dies before it
# joins the world fails the launch at once, and train.checkpoint_every = -1 (no checkpoint) is no
# failure.
# Usage: launch_test.sh ATOLL MPIEXEC
set -euo pipefail
MPIEXEC=${2:?usage: $0 ATOLL MPIEXEC}
source "$(dirname "$0")/../e2e_lib.sh"
command -v "$MPIEXEC" >/dev/null || { echo "SKIP: no $MPIEXEC" >&2; exit 77; }
export PATH="$(dirname "$(command -v "$MPIEXEC")"):$PATH"
export OMP_WAIT_POLICY=passive

W=(--config configs/tiny.toml --set data.dir="$DATA" --set train.steps=6
   --set world.sites=2 --set world.ranks_per_site=1
   --set world.link.latency_ms=5 --set world.link.bandwidth_mbps=200)

# The single-process reference: the same global batch (4) and micro-batch (2).
"$ATOLL" train --config configs/tiny.toml --set data.dir="$DATA" --set train.steps=6 -q \
  --out "$T/one" >/dev/null

check_world() {
  local dir=$1 s
  [[ $(cat "$T/out") == "$dir/checkpoint" ]] || fail "launch printed '$(cat "$T/out")'"
  for s in 0 1; do
    [[ -f $dir/site-$s/metrics.jsonl ]] || fail "no $dir/site-$s/metrics.jsonl"
    [[ $(grep -c "\"site\":$s" "$dir/site-$s/metrics.jsonl") == 6 ]] ||
      fail "$dir/site-$s/metrics.jsonl: expected 6 lines with \"site\":$s: $(cat "$dir/site-$s/metrics.jsonl")"
  done
  [[ -f $dir/checkpoint/model.safetensors ]] || fail "no $dir/checkpoint/model.safetensors"
  [[ -f $dir/config.toml && -f $dir/coordinator.log ]] || fail "no config.toml or coordinator.log in $dir"
  close "$T/one/metrics.jsonl" "$dir/site-0/metrics.jsonl" 6
  [[ $(column loss "$dir/site-0/metrics.jsonl") == $(column loss "$dir/site-1/metrics.jsonl") ]] ||
    fail "sites 0 and 1 report different losses"
}

expect_exit 0 timeout 100 "$ATOLL" launch "${W[@]}" --insecure -q --out "$T/insecure"
check_world "$T/insecure"
[[ ! -e $T/insecure/certs ]] || fail "--insecure made certificates"

# Certificates made by launch (DIR/certs), and the live view's plain lines (stderr is no terminal).
expect_exit 0 timeout 100 "$ATOLL" launch "${W[@]}" --out "$T/tls"
check_world "$T/tls"
[[ -f $T/tls/certs/ca.pem && -f $T/tls/certs/token ]] || fail "launch made no certificates"
# The CA's key apart from what the sites read; each party's certificate names it.
[[ -f $T/tls/ca/ca.key && ! -e $T/tls/certs/ca.key && ! -e $T/tls/certs/ca ]] ||
  fail "the CA key is not kept apart: $(ls -R "$T/tls/certs" "$T/tls/ca" 2>&1)"
openssl x509 -in "$T/tls/certs/site-1.pem" -noout -subject | grep -q "CN *= *site-1" ||
  fail "site-1.pem does not name site-1: $(openssl x509 -in "$T/tls/certs/site-1.pem" -noout -subject)"
expect_err "coordinator at 127.0.0.1:"

# Bad configs: exit 2 before anything starts.
expect_exit 2 "$ATOLL" launch "${W[@]}" --set train.lr=-1 --insecure --out "$T/bad"
expect_err "train.lr"
expect_exit 2 "$ATOLL" launch --config configs/tiny.toml --insecure --out "$T/bad"
expect_err "atoll train"
# Each site's mpirun gets a session directory of its own, even under the user's own
# OMPI_MCA_orte_tmpdir_base: mpiruns sharing one race on it ("ompi.HOST.UID: File exists"), and a
# site died before it started. And a site that dies before it joins the world fails the launch
# at once, naming it: the others would wait for it until their timeouts. (ATOLL_MPIRUN: an mpirun
# that notes its session base, and whose site 0 dies at the start when FAIL_SITE0 is set.)
cat >"$T/mpirun" <<EOF
#!/usr/bin/env bash
site=\$(printf '%s\n' "\$@" | grep -A1 -x -- --site | tail -n 1)
echo "\$OMPI_MCA_orte_tmpdir_base" >"$T/session.\$site"
if [[ -n \${FAIL_SITE0:-} && \$site == 0 ]]; then echo "injected: site 0's mpirun dies" >&2; exit 1; fi
exec "$(command -v "$MPIEXEC")" "\$@"
EOF
chmod +x "$T/mpirun"
mkdir -p "$T/ompi"
expect_exit 0 env ATOLL_MPIRUN="$T/mpirun" OMPI_MCA_orte_tmpdir_base="$T/ompi" \
  timeout 100 "$ATOLL" launch "${W[@]}" --insecure -q --out "$T/sessions"
check_world "$T/sessions"
s0=$(cat "$T/session.0") s1=$(cat "$T/session.1")
[[ $s0 != "$s1" && $s0 == "$T/ompi/"* && $s1 == "$T/ompi/"* ]] ||
  fail "the sites' mpiruns share or leave the session base: '$s0' and '$s1'"
[[ -z $(ls -A "$T/ompi") ]] || fail "launch left $(ls -A "$T/ompi") in the session base"
# A session base that does not exist: launch goes on under TMPDIR (and mpirun makes its own).
# And train.checkpoint_every = -1: no checkpoint, which launch does not take for a failure (and
# prints no path for).
expect_exit 0 env OMPI_MCA_orte_tmpdir_base="$T/missing/ompi" \
  timeout 100 "$ATOLL" launch "${W[@]}" --set train.checkpoint_every=-1 --insecure -q \
  --out "$T/nobase"
[[ ! -s $T/out && ! -e $T/nobase/checkpoint ]] ||
  fail "checkpoint_every = -1: launch printed '$(cat "$T/out")' or wrote a checkpoint"
for s in 0 1; do
  [[ $(grep -c "\"site\":$s" "$T/nobase/site-$s/metrics.jsonl") == 6 ]] ||
    fail "checkpoint_every = -1: site $s did not log its 6 steps"
done
start=$SECONDS
expect_exit 1 env ATOLL_MPIRUN="$T/mpirun" FAIL_SITE0=1 \
  timeout 100 "$ATOLL" launch "${W[@]}" --insecure -q --out "$T/dies"
expect_err "site 0 failed"
expect_err "injected: site 0's mpirun dies"
((SECONDS - start < 30)) || fail "launch took $((SECONDS - start)) s to give up on a site that never joined"

echo "PASS: launch"
