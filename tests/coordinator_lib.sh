# What the shell tests that start `atoll coordinator` by hand share (sourced by tests/e2e_lib.sh
# and tests/security/hostile_clients.sh; the caller defines fail MESSAGE, which exits).

# coordinator_address OUT PID ERR [SECONDS]: waits until the coordinator of pid PID has printed
# its address (the first line of OUT; its stderr in ERR) and sets ADDR; fails if it exits first
# or has not printed it within SECONDS (120). A start takes 0.2 s on an idle machine; one took
# over 10 s with a build running beside the suite (2026-11-29).
coordinator_address() {
  local i
  ADDR=
  for ((i = 0; i < ${4:-120} * 10; i++)); do
    if [[ -f $1 && $(wc -l <"$1") -ge 1 ]]; then
      ADDR=$(head -1 "$1")
      return 0
    fi
    kill -0 "$2" 2>/dev/null || fail "the coordinator exited before printing its address: $(tail -5 "$3")"
    sleep 0.1
  done
  fail "the coordinator printed no address within ${4:-120} s: $(tail -5 "$3")"
}
