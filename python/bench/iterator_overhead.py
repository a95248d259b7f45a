"""Samples/s through the Python iterator beside `sluice loadgen` (the Rust loader), on the same
running workers, alternating runs so both see the same machine. Usage:

    python python/bench/iterator_overhead.py --dataset manifest.json \
        --workers 127.0.0.1:7100 --trust-cert cert.pem --sluice target/release/sluice

With `--device cuda:0` (both built with the `cuda` feature, torch with CUDA installed), both
sides take device batches and wait for each batch's copy, as a training step would.
"""

import argparse
import json
import subprocess
import tempfile
import time

import numpy as np

import sluice


def python_rate(args, epoch):
    loader = sluice.Loader(dataset=args.dataset, workers=args.workers, batch_size=args.batch_size,
                           trust_cert=args.trust_cert, token_file=args.token_file,
                           device=args.device)
    if args.device == "cpu":
        take, wait = np.from_dlpack, lambda: None
    else:
        import torch
        take, wait = torch.from_dlpack, torch.cuda.current_stream().synchronize
    started, n = time.time(), 0
    for images, labels in loader.epoch(epoch):
        take(images)  # what a training step would take: a zero-copy view
        take(labels)
        wait()  # on a GPU: the copy has landed (loadgen waits for it too)
        n += len(images)
    return n / (time.time() - started)


def rust_rate(args, epoch):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [args.sluice, "loadgen", "--dataset", args.dataset, "--workers", ",".join(args.workers),
               "--batch-size", str(args.batch_size), "--epochs", "1", "--first-epoch", str(epoch),
               "--trust-cert", args.trust_cert, "--device", args.device, "--json", out.name]
        if args.token_file:
            cmd += ["--token-file", args.token_file]
        subprocess.run(cmd, check=True, capture_output=True)
        return json.load(open(out.name))["ranks"][0]["samples_per_s"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--workers", nargs="+", required=True)
    p.add_argument("--trust-cert", required=True)
    p.add_argument("--token-file")
    p.add_argument("--sluice", default="target/release/sluice")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cpu", help="cpu or cuda:N")
    args = p.parse_args()
    py, rs = [], []
    for r in range(args.rounds):
        rs.append(rust_rate(args, 2 * r))
        py.append(python_rate(args, 2 * r + 1))
        print(f"round {r}: rust {rs[-1]:.0f} samples/s, python {py[-1]:.0f} samples/s")
    print(f"{args.device} median: rust {np.median(rs):.0f}, python {np.median(py):.0f}, "
          f"python/rust {np.median(py) / np.median(rs):.3f}")


if __name__ == "__main__":
    main()
