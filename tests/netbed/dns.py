"""A DNS server for one zone of A records, for tests/pool_membership.rs (run inside a host).

    dns.py LISTEN_HOST RECORDS_FILE

Answers queries over UDP port 53: a name listed in RECORDS_FILE (one `name address` a line,
read again for every query, so the test changes the answers by rewriting it) gets all its A
records, with a TTL of 0; a name not listed gets NXDOMAIN; any other type (AAAA) of a listed
name gets an empty answer. Enough of RFC 1035 for a stub resolver (glibc's getaddrinfo).
"""

import socket
import struct
import sys


def records(path):
    out = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    out.setdefault(parts[0].lower().rstrip("."), []).append(parts[1])
    except OSError:
        pass
    return out


def question(packet):
    """(name, qtype, end of the question section) of a query."""
    labels, at = [], 12
    while packet[at] != 0:
        n = packet[at]
        labels.append(packet[at + 1:at + 1 + n].decode("ascii", "replace"))
        at += 1 + n
    qtype, _ = struct.unpack("!HH", packet[at + 1:at + 5])
    return ".".join(labels).lower(), qtype, at + 5


def answer(packet, path):
    ident, flags = struct.unpack("!HH", packet[:4])
    name, qtype, end = question(packet)
    known = records(path)
    addrs = known.get(name)
    rcode = 0 if addrs is not None else 3
    answers = b""
    count = 0
    if addrs and qtype == 1:
        for a in addrs:
            # A pointer to the question's name, type A, class IN, TTL 0, four bytes.
            answers += struct.pack("!HHHIH", 0xC00C, 1, 1, 0, 4) + socket.inet_aton(a)
            count += 1
    # A response, recursion desired copied, recursion available, authoritative.
    header = struct.pack("!HHHHHH", ident, 0x8000 | 0x0400 | (flags & 0x0100) | 0x0080 | rcode,
                         1, count, 0, 0)
    return header + packet[12:end] + answers


def main():
    host, path = sys.argv[1:3]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, 53))
    print(f"dns serving {host}:53", flush=True)
    while True:
        packet, peer = s.recvfrom(512)
        try:
            s.sendto(answer(packet, path), peer)
        except (IndexError, struct.error):
            continue  # not a query we understand: no answer, as a lost datagram


if __name__ == "__main__":
    main()
