#!/usr/bin/env bash
# Hostile and broken peers against a coordinator with mutual TLS and the token, from a client that
# is not atoll's (tests/security/hostile_clients.py: Debian's python3-grpcio): plaintext, no or a
# wrong token, a site's valid certificate claiming another site, the coordinator's certificate
# posing as a site, another CA's certificate, a message that is not one, garbage bytes on the port,
# a connection that never sends, a 2 MiB Heartbeat (over the method's limit), a message over the
# transport's 1 GiB, and messages replayed from an earlier process of a registered site. Each is
# refused, the coordinator logs the refusals, and the membership a well-formed client sees is
# unchanged (hashed). (Refusals in the TLS handshake are
# gRPC's and are not in atoll's log.)
# Usage: hostile_clients.sh ATOLL
set -euo pipefail
ATOLL=${1:?usage: $0 ATOLL}
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$(dirname "$0")/../coordinator_lib.sh"
T=$(mktemp -d "${TMPDIR:-/tmp}/atoll_hostile.XXXXXX")
PY=/usr/bin/python3
"$PY" -c "import grpc" 2>/dev/null || { echo "SKIP: $PY has no grpc (apt-get install python3-grpcio)"; exit 77; }

COORD_PID=
cleanup() { [[ -n $COORD_PID ]] && kill "$COORD_PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$T"; }
trap cleanup EXIT

"$ATOLL" certs --out "$T/certs" --sites 2 >/dev/null 2>&1 || fail "atoll certs failed"
"$ATOLL" certs --out "$T/other" --sites 2 >/dev/null 2>&1 || fail "atoll certs (another CA) failed"
"$ATOLL" coordinator --listen 127.0.0.1:0 --sites 2 --state "$T/coord" --certs "$T/certs" \
  --heartbeat-s 30 >"$T/addr" 2>"$T/coord.err" &
COORD_PID=$!
coordinator_address "$T/addr" "$COORD_PID" "$T/coord.err"

"$PY" "$(dirname "$0")/hostile_clients.py" "$ADDR" "$T/certs" "$T/other" >"$T/py.out" 2>&1 ||
  fail "$(cat "$T/py.out")"
cat "$T/py.out"
kill -0 "$COORD_PID" || fail "the coordinator died: $(tail -5 "$T/coord.err")"
grep -q "before reading its call: missing or wrong token" "$T/coord.err" ||
  fail "the coordinator did not log the token refusals: $(cat "$T/coord.err")"
grep -q 'its certificate is for \\"site-1\\" but it claims to be site-0\|its certificate is for "site-1" but it claims to be site-0' "$T/coord.err" ||
  fail "the coordinator did not log the impostor: $(cat "$T/coord.err")"
grep -q "a Heartbeat request of 2097162 bytes, over the 65536 allowed" "$T/coord.err" ||
  fail "the coordinator did not log the oversized Heartbeat: $(cat "$T/coord.err")"
echo "PASS: hostile clients"
