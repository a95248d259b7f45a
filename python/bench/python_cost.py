"""The training process's CPU per image through Python, beside `sluice loadgen` (the Rust
loader) on the same worker, over QUIC or same-host shared memory. Usage:

    python python/bench/python_cost.py --dataset manifest.json --sluice target/release/sluice \
        --transport same-host --epochs 20

One `sluice cpu` worker (started here, on loopback) decodes; this process reads, so its CPU time
(user + sys, getrusage, every thread) is the client's alone. Start-up (building the loader to
its first batch: connecting, the first epoch's plan) is reported apart, as time and CPU; the
steady state is the CPU of the epochs after the first, per image. loadgen is measured the same
way from outside: a run of 1 epoch against one of 1 + epochs, the difference per image.
Variants: `sluice.Loader` with NumPy views of each batch, and `sluice.torch.Loader` dicts.
"""

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time


def cpu_self():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Worker:
    """`sluice cpu` on loopback, QUIC only or with a same-host socket folder."""

    def __init__(self, args, folder):
        token = os.path.join(folder, "token")
        with open(token, "w") as f:
            f.write("python-cost-bench-token\n")
        self.token, self.same_host_dir = token, os.path.join(folder, "sock")
        os.makedirs(self.same_host_dir, mode=0o755, exist_ok=True)
        same_host = (["--same-host-dir", self.same_host_dir] if args.transport == "same-host"
                     else ["--no-same-host"])
        self.proc = subprocess.Popen(
            [args.sluice, "cpu", "--listen", "127.0.0.1:0", "--threads", str(args.threads),
             "--state-dir", os.path.join(folder, "state"), "--token-file", token, *same_host],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            env={**os.environ, "RUST_LOG": "info"})
        self.addr = None
        while self.addr is None:
            line = self.proc.stderr.readline()
            if not line:
                sys.exit("sluice cpu exited before it listened")
            m = re.search(r"listen=(\S+)", line)
            self.addr = m and m.group(1)
        self.cert = os.path.join(folder, "state", "cert.pem")
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def python_cost(args, worker, variant):
    """(start-up seconds, start-up CPU seconds, steady CPU µs per image, images/s)."""
    import numpy as np
    import sluice
    import sluice.torch as st  # imported before the clock starts: start-up is Sluice's alone
    t0, c0 = time.monotonic(), cpu_self()
    common = dict(workers=[worker.addr], trust_cert=worker.cert, token_file=worker.token,
                  batch_size=args.batch_size, same_host_dir=worker.same_host_dir,
                  same_host="require" if args.transport == "same-host" else "off")
    if variant == "torch":
        loader = st.Loader(args.dataset, **common)
        epochs = (iter(loader) for _ in range(1 + args.epochs))
        size = lambda b: len(b["label"])  # noqa: E731
    else:
        loader = sluice.Loader(args.dataset, **common)
        epochs = (loader.epoch(e) for e in range(1 + args.epochs))

        def size(b):
            np.from_dlpack(b[0]), np.from_dlpack(b[1])  # what a step takes: zero-copy views
            return len(b[0])
    first = next(epochs)
    size(next(first))
    startup, startup_cpu = time.monotonic() - t0, cpu_self() - c0
    for b in first:
        size(b)
    t1, c1, images = time.monotonic(), cpu_self(), 0
    for epoch in epochs:
        for b in epoch:
            images += size(b)
    wall, cpu = time.monotonic() - t1, cpu_self() - c1
    del loader
    return startup, startup_cpu, cpu * 1e6 / images, images / wall


def loadgen_cost(args, worker):
    """(CPU seconds of a 1-epoch run, steady CPU µs per image, images/s) of `sluice loadgen`."""
    runs = []
    for epochs in (1, 1 + args.epochs):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [args.sluice, "loadgen", "--dataset", args.dataset, "--workers", worker.addr,
                   "--batch-size", str(args.batch_size), "--epochs", str(epochs),
                   "--trust-cert", worker.cert, "--token-file", worker.token, "--json", out.name,
                   "--same-host", "require" if args.transport == "same-host" else "off",
                   "--same-host-dir", worker.same_host_dir, "--no-prefetch-next-epoch"]
            c0, t0 = cpu_children(), time.monotonic()
            subprocess.run(cmd, check=True, capture_output=True)
            runs.append((cpu_children() - c0, time.monotonic() - t0, json.load(open(out.name))))
    (one_cpu, one_wall, _), (all_cpu, all_wall, report) = runs
    images = sum(r["delivered"] for r in report["ranks"]) * args.epochs / (1 + args.epochs)
    return one_cpu, (all_cpu - one_cpu) * 1e6 / images, images / (all_wall - one_wall)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--sluice", default="target/release/sluice")
    p.add_argument("--transport", choices=["quic", "same-host"], default="quic")
    p.add_argument("--epochs", type=int, default=20, help="measured, after a first one")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="the worker's decode threads")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        worker = Worker(args, folder)
        try:
            rows = []
            lg = loadgen_cost(args, worker)
            rows.append(("loadgen (Rust)", None, lg[0], lg[1], lg[2]))
            for variant in ("sluice", "torch"):
                s, sc, us, rate = python_cost(args, worker, variant)
                rows.append((f"python {variant}", s, sc, us, rate))
        finally:
            worker.stop()
    print(f"{args.transport}, batch {args.batch_size}, {args.epochs} epochs after the first:")
    for name, s, sc, us, rate in rows:
        start = f"start-up {s:.2f} s, " if s is not None else "1-epoch run "
        print(f"  {name:16} {us:7.1f} µs CPU/image ({us / rows[0][3]:.2f}x loadgen), "
              f"{rate:6.0f} images/s; {start}{sc:.2f} s CPU")


if __name__ == "__main__":
    main()
