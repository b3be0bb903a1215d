"""Hostile and broken clients against `atoll coordinator`, from a gRPC stack that is not atoll's
(Debian's python3-grpcio; protobuf messages encoded by hand). Each is refused; a well-formed
client still gets the same membership afterwards (its reply's bytes hashed before and after).

Usage: hostile_clients.py HOST:PORT CERTS_DIR OTHER_CERTS_DIR
Prints one line per case; exits 1 on the first case that is not refused as expected.
"""
import hashlib
import os
import socket
import sys
import time

import grpc

ADDR, CERTS, OTHER = sys.argv[1], sys.argv[2], sys.argv[3]
TOKEN = open(os.path.join(CERTS, "token")).read().strip()


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(num, value):
    if isinstance(value, int):
        return varint(num << 3) + varint(value)
    return varint(num << 3 | 2) + varint(len(value)) + value


def read(d, name):
    with open(os.path.join(d, name), "rb") as f:
        return f.read()


def channel(party="site-1", certs=CERTS, tls=True):
    if not tls:
        return grpc.insecure_channel(ADDR)
    creds = grpc.ssl_channel_credentials(
        root_certificates=read(CERTS, "ca.pem"),  # trusts this world's CA
        private_key=read(certs, party + ".key"),
        certificate_chain=read(certs, party + ".pem"))
    return grpc.secure_channel(ADDR, creds, options=[("grpc.ssl_target_name_override",
                                                      "coordinator")])


def call(ch, method, request, token=TOKEN, timeout=5):
    rpc = ch.unary_unary("/atl.coord.Coordinator/" + method)
    metadata = [("x-atoll-token", token)] if token is not None else []
    return rpc(request, metadata=metadata, timeout=timeout)


def peek(site=1):
    return call(channel("site-%d" % site), "Peek", field(1, site))


def expect(name, code, fn):
    try:
        fn()
    except grpc.RpcError as e:
        if e.code() == code:
            print("refused as expected: %s: %s (%s)" % (name, e.code().name, e.details()))
            return
        print("FAIL: %s: %s (%s), expected %s" % (name, e.code().name, e.details(), code.name))
        sys.exit(1)
    print("FAIL: %s was accepted" % name)
    sys.exit(1)


before = hashlib.sha256(peek()).hexdigest()
print("a well-formed client's Peek: membership hash %s" % before[:16])

expect("plaintext to the TLS port", grpc.StatusCode.UNAVAILABLE,
       lambda: call(channel(tls=False), "Peek", field(1, 1)))
expect("no token", grpc.StatusCode.UNAUTHENTICATED,
       lambda: call(channel(), "Peek", field(1, 1), token=None))
expect("a wrong token", grpc.StatusCode.UNAUTHENTICATED,
       lambda: call(channel(), "Peek", field(1, 1), token="f" * len(TOKEN)))
# RegisterRequest: version (checked after the certificate), site 0, an address, hash, incarnation.
register = field(1, 9999) + field(2, 0) + field(3, b"10.0.0.0:7100") + field(4, 1) + field(5, 7)
expect("site 1's certificate claiming site 0", grpc.StatusCode.PERMISSION_DENIED,
       lambda: call(channel("site-1"), "Register", register))
expect("the coordinator's own certificate claiming site 1", grpc.StatusCode.PERMISSION_DENIED,
       lambda: call(channel("coordinator"), "Heartbeat", field(1, 1)))
expect("a client certificate of another CA (with the right token)", grpc.StatusCode.UNAVAILABLE,
       lambda: call(channel("site-1", certs=OTHER), "Peek", field(1, 1)))
expect("garbage for a message", grpc.StatusCode.INTERNAL,
       lambda: call(channel(), "Peek", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"))

# Below gRPC: garbage bytes on the port, and a connection that opens and never sends. The
# coordinator answers a well-formed client meanwhile, and after.
host, port = ADDR.rsplit(":", 1)
junk = socket.create_connection((host, int(port)), timeout=5)
junk.sendall(os.urandom(4096))
silent = socket.create_connection((host, int(port)), timeout=5)
time.sleep(0.5)
during = hashlib.sha256(peek()).hexdigest()
junk.close()
time.sleep(0.5)
after = hashlib.sha256(peek(site=0)).hexdigest()
silent.close()
print("garbage bytes and a silent connection: the coordinator still answers")
if not (before == during == after):
    print("FAIL: the membership changed (%s -> %s, %s)" % (before[:16], during[:16], after[:16]))
    sys.exit(1)
print("the membership is unchanged (hash %s)" % during[:16])

# Oversized: a Heartbeat with a 2 MiB unknown field (a valid identity and token) is over the
# method's limit; a message over the transport's 1 GiB never reaches a handler.
heartbeat = field(1, 1) + field(3, 7)
expect("a 2 MiB Heartbeat", grpc.StatusCode.RESOURCE_EXHAUSTED,
       lambda: call(channel(), "Heartbeat", heartbeat + field(99, b"x" * (2 << 20))))
n = (1 << 30) + 16  # one copy of it and gRPC's: about 2 GiB in this process, briefly
big = b"".join([field(1, 1), varint(99 << 3 | 2), varint(n), bytes(n)])
expect("a message over 1 GiB", grpc.StatusCode.RESOURCE_EXHAUSTED,
       lambda: call(channel(), "PsPush", big, timeout=60))
del big

# Replays: site 1's process (incarnation 7) registers; then messages of an earlier process of
# site 1 (incarnation 6) are refused (ALREADY_EXISTS: the site is held by another process), and a replay of the live process's own Register is answered
# as the retry it may be, changing nothing.
def register(site, incarnation):
    return field(1, 2) + field(2, site) + field(3, b"127.0.0.1:710%d" % site) + field(4, 5) + \
        field(5, incarnation)


# Register waits for the initial quorum: both sites at once.
metadata = [("x-atoll-token", TOKEN)]
futures = [channel("site-%d" % s).unary_unary("/atl.coord.Coordinator/Register").future(
    register(s, 7), metadata=metadata, timeout=20) for s in (0, 1)]
for f in futures:
    f.result()
register1 = register(1, 7)
registered = hashlib.sha256(peek()).hexdigest()
stale = register(1, 6)
expect("a Register replayed from an earlier process of site 1", grpc.StatusCode.ALREADY_EXISTS,
       lambda: call(channel(), "Register", stale))
expect("a Heartbeat of an earlier process of site 1", grpc.StatusCode.ALREADY_EXISTS,
       lambda: call(channel(), "Heartbeat", field(1, 1) + field(3, 6)))
expect("a Round of an earlier process of site 1", grpc.StatusCode.ALREADY_EXISTS,
       lambda: call(channel(), "Round", field(1, 1) + field(2, 0) + field(3, 6)))
call(channel(), "Register", register1)
print("a replay of the live process's own Register: answered as a retry")
if hashlib.sha256(peek()).hexdigest() != registered:
    print("FAIL: a replay changed the membership")
    sys.exit(1)
print("the membership is unchanged by the replays (hash %s)" % registered[:16])
print("PASS")
