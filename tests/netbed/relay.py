"""A seeded UDP relay that delays and reorders, for tests/cluster.rs (run inside a host).

    relay.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_MS REORDER_PERCENT SEED

Every datagram from a client to LISTEN is sent on to TARGET, and every answer back, DELAY_MS
later; REORDER_PERCENT of them are held DELAY_MS / 2 longer, so later ones overtake them
(the choice is seeded). Each client gets its own upstream socket, so the target sees one
peer per client, as without the relay. `tc netem` does not exist on this kernel.
"""

import heapq
import random
import select
import socket
import sys
import time


def udp(host, port=0):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    s.bind((host, port))
    s.setblocking(False)
    return s


def main():
    lhost, lport, thost, tport, delay_ms, reorder, seed = sys.argv[1:8]
    target = (thost, int(tport))
    delay, reorder = float(delay_ms) / 1000.0, float(reorder) / 100.0
    rnd = random.Random(int(seed))
    front = udp(lhost, int(lport))
    upstream = {}  # client address -> its socket toward the target
    client_of = {}  # upstream socket -> client address
    queue = []  # (due, seq, socket to send on, data, destination)
    seq = 0
    while True:
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else 1.0
        ready, _, _ = select.select([front, *upstream.values()], [], [], timeout)
        now = time.monotonic()
        for sock in ready:
            while True:
                try:
                    data, addr = sock.recvfrom(65535)
                except BlockingIOError:
                    break
                if sock is front:
                    up = upstream.get(addr)
                    if up is None:
                        up = udp(lhost)
                        upstream[addr] = up
                        client_of[up] = addr
                    out, dest = up, target
                else:
                    out, dest = front, client_of[sock]
                extra = delay / 2 if rnd.random() < reorder else 0.0
                seq += 1
                heapq.heappush(queue, (now + delay + extra, seq, out, data, dest))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, out, data, dest = heapq.heappop(queue)
            try:
                out.sendto(data, dest)
            except OSError:
                pass  # a full buffer drops the datagram, as a link would


if __name__ == "__main__":
    main()
