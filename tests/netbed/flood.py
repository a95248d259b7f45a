"""Slow clients and garbage datagrams, for tests/cluster.rs (run inside a test-bed host).

    flood.py HTTP_HOST HTTP_PORT CONNECTIONS UDP_HOST UDP_PORT DATAGRAMS WAIT_SECS

Opens CONNECTIONS TCP connections to the storage node, each sending half a request head and
then nothing (slowloris); sends DATAGRAMS random 1,200-byte UDP datagrams (seeded) to the
CPU worker's QUIC port; then watches for up to WAIT_SECS how long the server takes to close
each slow connection. Prints one JSON line: opened, closed, the slowest close in seconds, and
the datagrams sent.
"""

import json
import random
import resource
import socket
import sys
import time


def main():
    http_host, http_port, n, udp_host, udp_port, datagrams, wait = sys.argv[1:8]
    n, datagrams, wait = int(n), int(datagrams), float(wait)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n + 64)), hard))
    conns = []
    for _ in range(n):
        s = socket.create_connection((http_host, int(http_port)), timeout=5)
        s.sendall(b"GET /v1/train/slow HTTP/1.1\r\nHost: slow\r\n")
        s.setblocking(False)
        conns.append((s, time.monotonic()))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rnd = random.Random(7)
    for _ in range(datagrams):
        udp.sendto(rnd.randbytes(1200), (udp_host, int(udp_port)))
    closed = {}
    deadline = time.monotonic() + wait
    while len(closed) < n and time.monotonic() < deadline:
        for i, (s, opened) in enumerate(conns):
            if i in closed:
                continue
            try:
                if s.recv(65536) == b"":
                    closed[i] = time.monotonic() - opened
            except BlockingIOError:
                pass
            except OSError:
                closed[i] = time.monotonic() - opened
        time.sleep(0.05)
    print(json.dumps({
        "opened": n,
        "closed": len(closed),
        "slowest_close_s": max(closed.values(), default=None),
        "datagrams": datagrams,
    }), flush=True)


if __name__ == "__main__":
    main()
