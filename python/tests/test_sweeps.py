"""Sweeps that share one decode, as a team runs them: several `sluice.Loader`s with the same
data, pipeline and seed against one real `sluice cpu`, each still exactly once and in its own
order, with the pixels it would have had alone; a loader with another seed gets nothing of
theirs."""

import socket
import threading
import urllib.request

import numpy as np

import sluice
from conftest import Worker, token_file

PIPELINE = "decode | random_resized_crop 32 | hflip 0.5"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


def epochs(loader, n):
    """Every batch's ids and pixels (copied out) of epochs 0..n."""
    out = []
    for e in range(n):
        for images, labels in loader.epoch(e):
            out.append((list(images.ids), np.from_dlpack(images).copy(),
                        np.from_dlpack(labels).copy()))
    return out


def loader(dataset, w, token, **kwargs):
    return sluice.Loader(dataset=dataset, workers=[w.addr], batch_size=16, pipeline=PIPELINE,
                         token_file=str(token), trust_cert=w.cert, **kwargs)


def same(a, b):
    return len(a) == len(b) and all(
        ia == ib and np.array_equal(xa, xb) and np.array_equal(ya, yb)
        for (ia, xa, ya), (ib, xb, yb) in zip(a, b))


def test_concurrent_loaders_of_a_sweep_share_decodes_and_get_their_own_pixels(
        sluice_bin, dataset, tmp_path):
    token = token_file(tmp_path)
    port = free_port()
    w = Worker(sluice_bin, tmp_path / "state",
               ["--token-file", str(token), "--metrics-listen", f"127.0.0.1:{port}"])
    try:
        # Three jobs at once: two learning rates of one sweep (seed 5), and another seed.
        got = {}

        def run(name, seed):
            got[name] = epochs(loader(dataset, w, token, seed=seed, job_name=name), 2)

        threads = [threading.Thread(target=run, args=a)
                   for a in (("lr-1", 5), ("lr-2", 5), ("other-seed", 6))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
        assert set(got) == {"lr-1", "lr-2", "other-seed"}, "every loader finished"
        hits = metric(port, "sluice_cpu_share_hits_total")
        kept = metric(port, "sluice_cpu_share_kept_total")
        # Alone, with sharing off: what each would have had.
        alone_5 = epochs(loader(dataset, w, token, seed=5, job_name="solo", share=False), 2)
        alone_6 = epochs(loader(dataset, w, token, seed=6, job_name="solo", share=False), 2)
        after = metric(port, "sluice_cpu_share_hits_total")
    finally:
        w.stop()
    assert same(got["lr-1"], alone_5) and same(got["lr-2"], alone_5), \
        "a sweep's loaders get the batches, pixels and labels each would get alone"
    assert same(got["other-seed"], alone_6), "another seed gets its own pixels, none of theirs"
    assert not same(alone_5, alone_6)
    # 90 samples an epoch, 2 epochs (and the start of the third, begun early): while both
    # are open, the sweep's two loaders decode each sample once between them, the one keeping
    # it serving the other (one that went ahead before the other opened its epoch keeps what
    # nobody takes); the other seed's loader is a class of its own and keeps nothing.
    assert kept >= 90 and hits >= 0.5 * kept, (kept, hits)
    assert after == hits, "share=False is served nothing from the window"
