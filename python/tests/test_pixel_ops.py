"""The pixel ops of docs/pipeline.md against ``torchvision.transforms.v2.functional``: each op
on real JPEGs (``../shared``'s ImageNet sample when present, else generated ones), decoded
and cropped by Sluice, is compared with torchvision's function applied to the same decoded
and cropped pixels (the same pipeline without the op), in process and through a real
``sluice cpu`` worker; and a wrong argument is a ValueError naming the op, at construction."""

import re
import shutil
import subprocess

import numpy as np
import pytest

import sluice

from conftest import ROOT

torch = pytest.importorskip("torch", reason="torch is not installed")
F = pytest.importorskip("torchvision.transforms.v2.functional",
                        reason="torchvision is not installed")

BASE = "decode | resize 72 | center_crop 64"
SHARED = ROOT.parent / "shared" / "data" / "imagenet-sample"

# (op as the pipeline writes it, torchvision's function on a uint8 CHW tensor, the largest
# mean |difference| allowed, the largest single difference allowed). Ops that are a table
# per value in Sluice (and an integer or float32 expression of one value in torchvision) are
# exact; the ones that mix values in float32 (a blend with a grey, HSV, a 3x3 sum) may differ
# in the last float bit and so by one step of a value, rarely.
OPS = [
    ("brightness 1.4", lambda x: F.adjust_brightness(x, 1.4), 0, 0),
    ("brightness 0.3", lambda x: F.adjust_brightness(x, 0.3), 0, 0),
    ("contrast 0.5", lambda x: F.adjust_contrast(x, 0.5), 0.05, 1),
    ("contrast 1.8", lambda x: F.adjust_contrast(x, 1.8), 0.05, 1),
    ("saturation 0.2", lambda x: F.adjust_saturation(x, 0.2), 0.05, 1),
    ("saturation 2.5", lambda x: F.adjust_saturation(x, 2.5), 0.05, 1),
    ("hue 0.2", lambda x: F.adjust_hue(x, 0.2), 0.05, 1),
    ("hue -0.35", lambda x: F.adjust_hue(x, -0.35), 0.05, 1),
    ("solarize 128", lambda x: F.solarize(x, 128), 0, 0),
    ("solarize 77.5", lambda x: F.solarize(x, 77.5), 0, 0),
    ("posterize 3", lambda x: F.posterize(x, 3), 0, 0),
    ("equalize", F.equalize, 0, 0),
    ("autocontrast", F.autocontrast, 0, 0),
    ("sharpness 0.3", lambda x: F.adjust_sharpness(x, 0.3), 0.05, 1),
    ("sharpness 2.5", lambda x: F.adjust_sharpness(x, 2.5), 0.05, 1),
    ("invert", F.invert, 0, 0),
    ("grayscale", lambda x: F.rgb_to_grayscale(x, num_output_channels=3), 0, 0),
    ("contrast 1.5 | hue 0.1 | posterize 5",
     lambda x: F.posterize(F.adjust_hue(F.adjust_contrast(x, 1.5), 0.1), 5), 0.05, 8),
]


@pytest.fixture(scope="module")
def photos(sluice_bin, tmp_path_factory):
    """32 real JPEGs in an image folder, sharded: the manifest's path."""
    tmp = tmp_path_factory.mktemp("photos")
    folder = tmp / "images" / "all"
    folder.mkdir(parents=True)
    files = sorted(SHARED.glob("*.JPEG"))[:32] if SHARED.is_dir() else []
    if len(files) == 32:
        for f in files:
            shutil.copy(f, folder / f.name)
    else:
        print(f"{SHARED} is absent: generated JPEGs stand in for the ImageNet sample")
        subprocess.run([sluice_bin, "synth", "--output", str(tmp / "images"), "--classes", "2",
                        "--per-class", "16"], check=True, capture_output=True)
    manifest = tmp / "shards" / "manifest.json"
    subprocess.run([sluice_bin, "shard", "--input", str(tmp / "images"), "--output",
                    str(tmp / "shards" / "p-%06d.tar"), "--max-count", "16", "--manifest",
                    str(manifest)], check=True, capture_output=True)
    return str(manifest)


def images(pipeline, dataset, **kw):
    """Every sample's image (CHW uint8 torch tensor), by sample id."""
    loader = sluice.Loader(dataset=dataset, batch_size=8, pipeline=pipeline, seed=7, **kw)
    out = {}
    for batch, _ in loader.epoch(0):
        x = torch.from_numpy(np.from_dlpack(batch).copy()).permute(0, 3, 1, 2)
        for i, sample in enumerate(batch.ids):
            out[sample] = x[i]
    return out


def compare(base, got, reference):
    diffs = []
    assert got.keys() == base.keys()
    for sample, x in base.items():
        want = reference(x.clone())
        assert want.dtype == torch.uint8 and want.shape == x.shape
        diffs.append((got[sample].int() - want.int()).abs())
    d = torch.stack(diffs)
    return d.float().mean().item(), d.max().item()


@pytest.mark.parametrize("op,reference,mean_bound,max_bound", OPS, ids=[o[0] for o in OPS])
def test_each_op_is_torchvisions_in_process(photos, op, reference, mean_bound, max_bound):
    base = images(BASE, photos)
    got = images(f"{BASE} | {op}", photos)
    mean, most = compare(base, got, reference)
    print(f"{op}: mean |diff| {mean:.4f}, max {most}")
    assert mean <= mean_bound and most <= max_bound, (op, mean, most)


def test_ops_are_torchvisions_through_a_worker(photos, worker):
    """The same pixels from a `sluice cpu` worker over QUIC as in process."""
    remote = dict(workers=[worker.addr], token_file=worker.token_file, trust_cert=worker.cert)
    pipeline = f"{BASE} | saturation 1.7 | equalize | sharpness 2"
    here = images(pipeline, photos)
    there = images(pipeline, photos, **remote)
    assert here.keys() == there.keys()
    assert all(torch.equal(here[k], there[k]) for k in here)
    base = images(BASE, photos)
    mean, _ = compare(base, there, lambda x: F.adjust_sharpness(
        F.equalize(F.adjust_saturation(x, 1.7)), 2))
    assert mean <= 0.05


@pytest.mark.parametrize("op,says", [
    ("brightness -1", "brightness: -1 is not a factor in [0, 1000]"),
    ("hue 0.7", "hue: 0.7 is not a hue factor in [-0.5, 0.5]"),
    ("posterize 9", "posterize: 9 is not a number of bits in [0, 8]"),
    ("solarize", "solarize needs a threshold"),
    ("equalize 1", "equalize takes no argument"),
])
def test_a_wrong_argument_is_a_value_error_naming_the_op(photos, op, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        sluice.Loader(dataset=photos, batch_size=8, pipeline=f"{BASE} | {op}")
