"""Does a model learn from Sluice's batches? A small CNN (two conv + BatchNorm layers) trained
with SGD for a few epochs on a class-sorted ImageFolder dataset (20 classes of 100), fed by
Sluice, against the same images in uniformly shuffled batches.

    python examples/order_training_check.py --sluice target/release/sluice

Needs torch (CPU is enough) and the sluice module (`pip install ./python`) in the
same Python; not part of CI. Prints held-out accuracy per feeding and its ratio to the
uniformly shuffled baseline:
- sluice, shuffled shards: `sluice shard` as is (seeded sample order) and the plan's mixing;
- sluice, --no-shuffle shards: class-sorted shards, mixed by the plan alone;
- no mixing: class-sorted shards read one unit at a time (mix_units=1, mix_buffer=0), which
  is what Sluice delivered before the order was part of the plan.
"""

import argparse
import os
import subprocess
import tempfile

import numpy as np
import torch
from torch import nn

import sluice

PIPELINE = "decode | resize 36 | center_crop 32"
CLASSES, PER_CLASS, HELD_OUT = 20, 100, 20
BATCH = 64


def run(sluice_bin, *args):
    subprocess.run([sluice_bin, *args], check=True, capture_output=True)


def make_data(sluice_bin, root):
    run(sluice_bin, "synth", "--output", f"{root}/train", "--classes", str(CLASSES),
        "--per-class", str(PER_CLASS), "--seed", "0")
    run(sluice_bin, "synth", "--output", f"{root}/test", "--classes", str(CLASSES),
        "--per-class", str(HELD_OUT), "--seed", "1")
    manifests = {}
    for name, src, extra in [("shuffled", "train", []), ("sorted", "train", ["--no-shuffle"]),
                             ("test", "test", [])]:
        manifest = f"{root}/{name}/m.json"
        run(sluice_bin, "shard", "--input", f"{root}/{src}", "--output",
            f"{root}/{name}/s-%06d.tar", "--max-count", "200", "--manifest", manifest, *extra)
        manifests[name] = manifest
    return manifests


def to_tensors(images, labels):
    x = torch.from_dlpack(images).permute(0, 3, 1, 2).float().div(255.0)
    return x.sub(0.5).div(0.25), torch.from_dlpack(labels).clone()


def sluice_batches(manifest, epoch, seed, **kw):
    loader = sluice.Loader(dataset=manifest, batch_size=BATCH, pipeline=PIPELINE, seed=seed,
                           threads=2, **kw)
    for images, labels in loader.epoch(epoch):
        yield to_tensors(images, labels)


def all_samples(manifest):
    xs, ys = [], []
    for x, y in sluice_batches(manifest, 0, 0):
        xs.append(x)
        ys.append(y)
    return torch.cat(xs), torch.cat(ys)


def uniform_batches(data, epoch, seed):
    x, y = data
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(len(y), generator=g)
    for i in range(0, len(y), BATCH):
        idx = order[i:i + BATCH]
        yield x[idx], y[idx]


def model():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, CLASSES))


def train(batches_of_epoch, test, epochs, seed):
    torch.manual_seed(seed)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    distinct = []
    for epoch in range(epochs):
        net.train()
        for x, y in batches_of_epoch(epoch):
            distinct.append(len(set(y.tolist())))
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    net.eval()
    with torch.no_grad():
        x, y = test
        accuracy = (net(x).argmax(1) == y).float().mean().item()
    return accuracy, float(np.mean(distinct))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sluice", default="target/release/sluice", help="the sluice binary")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3,
                   help="seeds per feeding (seed, seed+1, ...): one run's accuracy is noisy")
    p.add_argument("--workdir", help="keep the data here (default: a temporary folder)")
    a = p.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    root = a.workdir or tempfile.mkdtemp(prefix="sluice-order-")
    manifests = make_data(a.sluice, root)
    test = all_samples(manifests["test"])
    train_data = all_samples(manifests["shuffled"])
    feeds = [
        ("uniform shuffle (baseline)", lambda e, s: uniform_batches(train_data, e, s)),
        ("sluice, shuffled shards", lambda e, s: sluice_batches(manifests["shuffled"], e, s)),
        ("sluice, --no-shuffle shards", lambda e, s: sluice_batches(manifests["sorted"], e, s)),
        ("no mixing (sorted, one unit)", lambda e, s: sluice_batches(
            manifests["sorted"], e, s, mix_units=1, mix_buffer=0)),
    ]
    baseline = None
    print(f"{'feeding':32} {'accuracy':>8} {'± sd':>6} {'vs uniform':>10} {'classes/batch':>13}"
          f"  (mean of {a.repeats} seeds, {a.epochs} epochs)")
    for name, feed in feeds:
        runs = [train(lambda e: feed(e, seed), test, a.epochs, seed)
                for seed in range(a.seed, a.seed + a.repeats)]
        accuracy = float(np.mean([r[0] for r in runs]))
        spread = float(np.std([r[0] for r in runs]))
        distinct = float(np.mean([r[1] for r in runs]))
        baseline = baseline or accuracy
        print(f"{name:32} {accuracy:8.3f} {spread:6.3f} {accuracy / baseline:10.2f} "
              f"{distinct:13.2f}")


if __name__ == "__main__":
    main()
