#!/usr/bin/env bash
# `atoll launch --emit slurm`: the batch scripts it writes (DIR/slurm/coordinator.sbatch,
# site-N.sbatch, submit.sh) are run here as plain bash, outside Slurm, the way the nodes would
# run them: the coordinator's script first (it publishes DIR/coordinator.address), the sites'
# scripts after (they wait for it, listen on 0.0.0.0 and advertise 127.0.0.1). TLS on, with the
# certificates launch made. Checks: the scripts pass `bash -n` and carry their #SBATCH lines;
# every script exits 0; each site trained 6 steps and site 0's losses equal those of
# `atoll launch` running the same world itself; the coordinator's script ends once every site
# has; --emit with --fail-site is refused (exit 2).
# Usage: slurm_emit.sh ATOLL MPIEXEC
set -euo pipefail
MPIEXEC=${2:?usage: $0 ATOLL MPIEXEC}
source "$(dirname "$0")/../e2e_lib.sh"
command -v "$MPIEXEC" >/dev/null || { echo "SKIP: no $MPIEXEC" >&2; exit 77; }
export PATH="$(dirname "$(command -v "$MPIEXEC")"):$PATH"
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
# A failed check leaves no script running.
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$T"' EXIT

W=(--config configs/tiny.toml --set data.dir="$DATA" --set train.steps=6
   --set world.sites=2 --set world.ranks_per_site=1 --set world.strategy=sync)

expect_exit 2 "$ATOLL" launch "${W[@]}" --out "$T/bad" --emit slurm --fail-site 1@3
grep -q "emit slurm writes the run's scripts" "$T/err" || fail "no reason for the refusal: $(cat "$T/err")"

expect_exit 0 "$ATOLL" launch "${W[@]}" --out "$T/w" --emit slurm
D=$T/w/slurm
[[ $(cat "$T/out") == "$D/submit.sh" ]] || fail "launch printed '$(cat "$T/out")'"
for f in coordinator site-0 site-1; do
  [[ -x $D/$f.sbatch ]] || fail "no executable $D/$f.sbatch"
  bash -n "$D/$f.sbatch" || fail "$f.sbatch: not valid bash"
  grep -q '^#SBATCH --ntasks=' "$D/$f.sbatch" || fail "$f.sbatch: no #SBATCH lines"
done
grep -q 'sbatch site-1.sbatch' "$D/submit.sh" || fail "submit.sh does not submit site 1"
[[ -f $T/w/certs/ca.pem && ! -e $T/w/certs/ca.key ]] || fail "no certificates (or the CA key among them)"

# The nodes: this machine. Any free ports; the sites advertise loopback.
export ATOLL_COORDINATOR_HOST=127.0.0.1 ATOLL_WAN_HOST=127.0.0.1
export ATOLL_MPIRUN="$MPIEXEC" ATOLL_WAIT_S=60 ATOLL="$ATOLL"
timeout 150 bash "$D/coordinator.sbatch" >"$T/coord.out" 2>&1 &
coord=$!
pids=()
for s in 0 1; do
  # Own OpenMPI session directories: two mpiruns started at once on one machine race for a
  # shared one (on a cluster each site has its node).
  mkdir -p "$T/ompi-$s"
  OMPI_MCA_orte_tmpdir_base="$T/ompi-$s" timeout 150 bash "$D/site-$s.sbatch" >"$T/site-$s.out" 2>&1 &
  pids+=($!)
done
for s in 0 1; do
  wait "${pids[$s]}" || fail "site-$s.sbatch failed: $(tail -20 "$T/site-$s.out")"
done
wait "$coord" || fail "coordinator.sbatch failed: $(cat "$T/coord.out"; tail -5 "$T/w/coordinator.stderr")"
grep -q "every site has ended" "$T/coord.out" || fail "the coordinator's script: $(cat "$T/coord.out")"
for s in 0 1; do
  [[ $(cat "$T/w/site-$s/exit_status") == 0 ]] || fail "site $s: exit_status $(cat "$T/w/site-$s/exit_status")"
  [[ $(grep -c "\"site\":$s" "$T/w/site-$s/metrics.jsonl") == 6 ]] || fail "site $s did not train 6 steps"
done
[[ -f $T/w/checkpoint/model.safetensors ]] || fail "no final checkpoint"
grep -q "coordinator: listening on 127.0.0.1:" "$T/coord.out" || fail "address: $(cat "$T/coord.out")"
[[ ! -e $T/w/coordinator.address ]] || fail "the coordinator's job left its address behind"

# The same world run by launch itself: the same losses.
expect_exit 0 timeout 100 "$ATOLL" launch "${W[@]}" -q --out "$T/ref"
[[ $(column loss "$T/w/site-0/metrics.jsonl") == $(column loss "$T/ref/site-0/metrics.jsonl") ]] ||
  fail "the scripts' world trained otherwise than launch's: $(column loss "$T/w/site-0/metrics.jsonl") vs $(column loss "$T/ref/site-0/metrics.jsonl")"
echo "PASS: slurm_emit"
