"""Fixtures: the `sluice` binary (SLUICE_BIN, else the workspace's target/debug/sluice), a small
generated dataset, and `sluice cpu` daemons started for real on loopback."""

import contextlib
import os
import pathlib
import re
import subprocess
import threading
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def sluice_bin():
    path = pathlib.Path(os.environ.get("SLUICE_BIN", ROOT / "target" / "debug" / "sluice"))
    if not path.exists():
        pytest.fail(f"no sluice binary at {path}: run `cargo build` or set SLUICE_BIN")
    return str(path)


def synth_manifest(sluice_bin, d, classes, per_class, prefix, seed=None):
    """`classes` × `per_class` generated JPEGs in folder `d`, 10 per shard named
    `<prefix>-NNNNNN.tar`: the manifest's path."""
    seeded = ["--seed", str(seed)] if seed is not None else []
    subprocess.run([sluice_bin, "synth", "--output", str(d / "images"), "--classes",
                    str(classes), "--per-class", str(per_class), *seeded],
                   check=True, capture_output=True)
    manifest = d / "shards" / "manifest.json"
    subprocess.run([sluice_bin, "shard", "--input", str(d / "images"), "--output",
                    str(d / "shards" / f"{prefix}-%06d.tar"), "--max-count", "10", "--manifest",
                    str(manifest)], check=True, capture_output=True)
    return str(manifest)


@pytest.fixture(scope="session")
def dataset(sluice_bin, tmp_path_factory):
    """90 generated JPEGs in 3 classes, 10 per shard: the manifest's path."""
    return synth_manifest(sluice_bin, tmp_path_factory.mktemp("data"), 3, 30, "s")


@pytest.fixture(scope="session")
def small(sluice_bin, tmp_path_factory):
    """30 generated JPEGs in 2 classes, 10 per shard: a second, smaller source for mixtures."""
    return synth_manifest(sluice_bin, tmp_path_factory.mktemp("small"), 2, 15, "small", seed=9)


class Worker:
    def __init__(self, sluice_bin, state, extra, same_host_dir=None):
        self.state = state
        # QUIC only unless a socket folder is given: the machine's /run/sluice stays untouched.
        same_host = ["--same-host-dir", str(same_host_dir)] if same_host_dir else ["--no-same-host"]
        self.proc = subprocess.Popen(
            [sluice_bin, "cpu", "--listen", "127.0.0.1:0", "--threads", "1", *same_host,
             "--state-dir", str(state), *extra],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            env={**os.environ, "RUST_LOG": "info"})
        deadline = time.time() + 60
        self.addr = None
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            m = re.search(r"listen=(\S+)", line)
            if m:
                self.addr = m.group(1)
                break
        assert self.addr, "sluice cpu did not log its address"
        self.cert = str(state / "cert.pem")
        # Its log is read as it comes: a full pipe would stop the worker at its next line.
        self.lines = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr),
                                       daemon=True)
        self.reader.start()

    def stop(self):
        """Stops the worker; returns what it logged after its address."""
        self.proc.kill()
        self.proc.wait()
        self.reader.join(timeout=10)
        return "".join(self.lines)


@contextlib.contextmanager
def storage_node(sluice_bin, root):
    """A `sluice storage` process serving `root` (one bucket per subfolder) on loopback;
    yields its host:port."""
    proc = subprocess.Popen([sluice_bin, "storage", "--data", str(root), "--listen",
                             "127.0.0.1:0"], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    try:
        deadline = time.time() + 60
        addr = None
        while addr is None and time.time() < deadline:
            m = re.search(r"listen=(\S+)", proc.stderr.readline())
            addr = m and m.group(1)
        assert addr, "sluice storage did not log its address"
        yield addr
    finally:
        proc.kill()
        proc.wait()


def token_file(tmp_path):
    """The cluster token the tests' workers and loaders share, in tmp_path/token."""
    token = tmp_path / "token"
    token.write_text("python-test-token-1234\n")
    return token


@contextlib.contextmanager
def two_workers(sluice_bin, tmp_path):
    """Two `sluice cpu` daemons (`a`, `b`) with one token; yields (a, b, token file)."""
    token = token_file(tmp_path)
    pool = [Worker(sluice_bin, tmp_path / name, ["--token-file", str(token)]) for name in "ab"]
    try:
        yield (*pool, token)
    finally:
        for w in pool:
            w.stop()


@pytest.fixture
def worker(sluice_bin, tmp_path):
    """A `sluice cpu` with the token in tmp_path/token."""
    token = token_file(tmp_path)
    w = Worker(sluice_bin, tmp_path / "state", ["--token-file", str(token)])
    w.token_file = str(token)
    yield w
    w.stop()


def first_jpeg(dataset):
    """The bytes of one JPEG of the `dataset` fixture's images."""
    return next((pathlib.Path(dataset).parent.parent / "images").rglob("*.jpg")).read_bytes()


def indexed_shard(sluice_bin, path, samples):
    """Writes `samples` ([(key, [(extension, bytes), ...]), ...]) as one tar shard at `path`
    (the way any tar writer would), indexes it with `sluice index`, and returns the manifest's
    path."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for key, fields in samples:
            for ext, data in fields:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    manifest = path.with_suffix(".json")
    subprocess.run([sluice_bin, "index", str(path), "--output", str(manifest)], check=True,
                   capture_output=True)
    return str(manifest)
