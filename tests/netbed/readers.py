"""Many readers of whole objects over HTTP, for tests/cluster.rs (run inside a host).

    readers.py SECONDS READERS URL [URL ...]

READERS threads each read whole objects in turn (reader k starts at URL k and walks the
list) for SECONDS, discarding the bytes. Prints one JSON line: bytes read per second.
"""

import http.client
import json
import sys
import threading
import time
from urllib.parse import urlsplit


def main():
    seconds, readers, urls = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    deadline = time.monotonic() + seconds
    totals = [0] * readers

    def read(k):
        i = k
        conns = {}
        while time.monotonic() < deadline:
            u = urlsplit(urls[i % len(urls)])
            i += 1
            conn = conns.get(u.netloc)
            if conn is None:
                conn = conns[u.netloc] = http.client.HTTPConnection(u.netloc, timeout=30)
            conn.request("GET", u.path)
            resp = conn.getresponse()
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                totals[k] += len(chunk)
                if time.monotonic() >= deadline:
                    conn.close()
                    conns.pop(u.netloc, None)
                    break

    started = time.monotonic()
    threads = [threading.Thread(target=read, args=(k,)) for k in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"bytes_per_s": sum(totals) / (time.monotonic() - started)}), flush=True)


if __name__ == "__main__":
    main()
