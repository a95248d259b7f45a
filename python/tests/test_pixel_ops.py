"""The pixel ops of docs/pipeline.md against ``torchvision.transforms.v2.functional``: each op
on real JPEGs (``../shared``'s ImageNet sample when present, else generated ones), decoded
and cropped by Sluice, is compared with torchvision's function applied to the same decoded
and cropped pixels (the same pipeline without the op), in process and through a real
``sluice cpu`` worker; the random ones (color_jitter, random_grayscale, gaussian_blur,
rand_augment, trivial_augment, auto_augment, random_erasing) are the seed's alone, draw in
torchvision's ranges, and survive a worker's kill; boxes follow rotate as torchvision's
``BoundingBoxes`` do; and a wrong argument is a ValueError naming the op, at construction."""

import math
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

import sluice

from conftest import ROOT, Worker, token_file

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


def shear(x, s, axis):
    """RandAugment's ShearX / ShearY at magnitude ``s`` (the tangent of the angle)."""
    deg = math.degrees(math.atan(s))
    return F.affine(x, angle=0.0, translate=[0, 0], scale=1.0,
                    shear=[deg, 0.0] if axis == "x" else [0.0, deg],
                    interpolation=F.InterpolationMode.NEAREST, center=[0, 0])


def translate(x, tx, ty):
    return F.affine(x, angle=0.0, translate=[tx, ty], scale=1.0, shear=[0.0, 0.0],
                    interpolation=F.InterpolationMode.NEAREST)


# The ops that move pixels, nearest neighbour and fill 0 as RandAugment calls them. The same
# float32 grid as torchvision's: a pixel may come from the neighbouring one where the source
# position lands on a half (rarely), so the bound is on the mean.
MOVES = [
    ("rotate 30", lambda x: F.rotate(x, 30.0), 0.1),
    ("rotate -115", lambda x: F.rotate(x, -115.0), 0.1),
    ("rotate 90", lambda x: F.rotate(x, 90.0), 0),
    ("rotate 180", lambda x: F.rotate(x, 180.0), 0),
    ("shear_x 0.3", lambda x: shear(x, 0.3, "x"), 0.1),
    ("shear_y -0.2", lambda x: shear(x, -0.2, "y"), 0.1),
    ("translate_x 10", lambda x: translate(x, 10, 0), 0),
    ("translate_y -7", lambda x: translate(x, 0, -7), 0),
    ("rotate 20 | shear_x 0.1 | translate_y 5",
     lambda x: translate(shear(F.rotate(x, 20.0), 0.1, "x"), 0, 5), 0.2),
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
    kw = dict(dict(batch_size=8, seed=7), **kw)
    loader = sluice.Loader(dataset=dataset, pipeline=pipeline, **kw)
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


@pytest.mark.parametrize("op,reference,mean_bound", MOVES, ids=[o[0] for o in MOVES])
def test_each_move_is_torchvisions(photos, op, reference, mean_bound):
    base = images(BASE, photos)
    got = images(f"{BASE} | {op}", photos)
    mean, most = compare(base, got, reference)
    print(f"{op}: mean |diff| {mean:.4f}, max {most}")
    assert mean <= mean_bound, (op, mean, most)


def rand_augment_candidates(x, m=9, bins=31):
    """Every image ``RandAugment(num_ops=1, magnitude=m)`` can make of ``x``: each of its 14
    ops at bin ``m``, with either sign, from torchvision's own table."""
    from torchvision.transforms import v2
    ra = v2.RandAugment(num_ops=1, magnitude=m, num_magnitude_bins=bins)
    h, w = x.shape[-2:]
    out = []
    for name, (mags, signed) in ra._AUGMENTATION_SPACE.items():
        table = mags(bins, h, w)
        values = [0.0] if table is None else [float(table[m])]
        if table is not None and signed:
            values.append(-values[0])
        for v in values:
            out.append((f"{name} {v:g}", ra._apply_image_or_video_transform(
                x, name, v, interpolation=v2.InterpolationMode.NEAREST, fill=ra._fill)))
    return out


def test_rand_augment_makes_one_of_torchvisions_images(photos):
    """``rand_augment n=1 m=9``: every sample is one of the images torchvision's RandAugment
    could make of the same crop (its op table, bins and signs), and the draws cover them."""
    base = images(BASE, photos)
    got = images(f"{BASE} | rand_augment n=1 m=9", photos)
    chosen = set()
    for k, x in base.items():
        scored = sorted(((got[k].int() - y.int()).abs().float().mean().item(), name)
                        for name, y in rand_augment_candidates(x))
        best, name = scored[0]
        assert best <= 0.1, f"sample {k}: nearest torchvision image {name} at {best:.3f}"
        chosen.add(name.split()[0])
    # 32 samples of 14 ops: most ops are seen (Identity and a no-op can coincide).
    assert len(chosen) >= 8, chosen


def test_erasing_after_normalize_writes_zeros_in_the_float_tensor(photos):
    norm = "normalize mean=0.485,0.456,0.406 std=0.229,0.224,0.225 | chw"
    base = images_raw(f"{BASE} | {norm}", photos)
    got = images_raw(f"{BASE} | {norm} | random_erasing p=1", photos)
    shares = []
    for k, x in base.items():
        y = got[k]
        assert y.shape == (3, 64, 64) and y.dtype == torch.float32
        changed = (x != y).any(0)
        rows, cols = changed.nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        box = (rows.min(), rows.max() + 1, cols.min(), cols.max() + 1)
        erased = y[:, box[0]:box[1], box[2]:box[3]]
        assert (erased == 0).all(), f"sample {k}: the erased rectangle is 0 in every channel"
        outside = y.clone()
        outside[:, box[0]:box[1], box[2]:box[3]] = x[:, box[0]:box[1], box[2]:box[3]]
        assert torch.equal(outside, x), f"sample {k}: only the rectangle changed"
        shares.append((box[1] - box[0]) * (box[3] - box[2]) / (64 * 64))
    assert len(shares) >= 28, f"p=1 erased {len(shares)} of 32"
    assert all(0.01 <= s <= 0.36 for s in shares), shares
    noisy = images_raw(f"{BASE} | {norm} | random_erasing p=1 value=random", photos)
    spread = torch.cat([(noisy[k] - base[k])[(noisy[k] != base[k])] for k in base])
    assert 0.8 <= float((spread - spread.mean()).std()) <= 2.5, "N(0, 1) noise, in normalized units"


def images_raw(pipeline, dataset, **kw):
    """Every sample's tensor as the loader made it (any dtype and layout), by sample id."""
    kw = dict(dict(batch_size=8, seed=7), **kw)
    loader = sluice.Loader(dataset=dataset, pipeline=pipeline, **kw)
    out = {}
    for batch, _ in loader.epoch(0):
        x = torch.from_numpy(np.from_dlpack(batch).copy())
        for i, sample in enumerate(batch.ids):
            out[sample] = x[i]
    return out


def test_boxes_follow_a_rotation_as_torchvisions_do(photos):
    """A box in source pixels, mapped by ``sluice.transform_boxes`` through a sample's
    geometry after ``rotate 30``, is the box torchvision's ``BoundingBoxes`` get from the same
    crop and rotation (within a pixel)."""
    from torchvision import tv_tensors
    loader = sluice.Loader(dataset=photos, batch_size=8, seed=7,
                           pipeline=f"{BASE} | rotate 30")
    checked = 0
    for batch, _ in loader.epoch(0):
        for g in batch.geometry:
            assert "affine" in g, g
            h, w = g["source"]
            # An object in the middle of the photo, in source pixels.
            box = np.array([[w * 0.35, h * 0.4, w * 0.6, h * 0.7]])
            got, keep = sluice.transform_boxes(box, g)
            assert keep.all()
            # torchvision: the same crop (box and size from the geometry), then rotate.
            x0, y0, x1, y1 = g["box"]
            oh, ow = g["size"]
            sx, sy = ow / (x1 - x0), oh / (y1 - y0)
            cropped = (box - [x0, y0, x0, y0]) * [sx, sy, sx, sy]
            cropped = np.clip(cropped, 0, [ow, oh, ow, oh])
            want = F.rotate(tv_tensors.BoundingBoxes(torch.tensor(cropped, dtype=torch.float32),
                                                     format="XYXY", canvas_size=(oh, ow)), 30.0)
            assert np.abs(got - want.numpy()).max() <= 1.0, (got, want)
            checked += 1
    assert checked == 32


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
    ("color_jitter 0.4 0.4 0.4 0.7", "color_jitter: 0.7 is not a hue amount in [0, 0.5]"),
    ("random_grayscale p=1.5", "random_grayscale: 1.5 is not a probability in [0, 1]"),
    ("gaussian_blur 4", "gaussian_blur: 4 is not an odd kernel size in [1, 255]"),
    ("rotate 400", "rotate: 400 is not an angle in degrees in [-360, 360]"),
    ("translate_x 1.5", "translate_x: 1.5 is not a whole number of pixels in [-16384, 16384]"),
    ("rand_augment n=2 m=31", "rand_augment: m=31 is not a whole number in [0, 30]"),
    ("trivial_augment bins=1", "trivial_augment: bins=1 is not a whole number in [2, 1000]"),
    ("auto_augment svhn", "auto_augment: policy \"svhn\" is not one Sluice has (imagenet)"),
    ("random_erasing p=2", "random_erasing: 2 is not a probability in [0, 1]"),
    ("random_erasing value=random",
     "random_erasing: value=random is noise in normalized units: put it after normalize"),
])
def test_a_wrong_argument_is_a_value_error_naming_the_op(photos, op, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        sluice.Loader(dataset=photos, batch_size=8, pipeline=f"{BASE} | {op}")


RANDOM = f"{BASE} | color_jitter 0.4 0.4 0.4 0.1 | random_grayscale p=0.2 | gaussian_blur 5"
AUGMENT = (f"{BASE} | rand_augment n=2 m=9 | trivial_augment | auto_augment imagenet "
           "| random_erasing p=0.5")


def test_a_fixed_sigma_blur_is_torchvisions(photos):
    """gaussian_blur with one sigma draws nothing: torchvision's gaussian_blur, to one step of a
    value where the float32 sums (ours in two passes) land on a half."""
    base = images(BASE, photos)
    got = images(f"{BASE} | gaussian_blur 5 sigma=1.3,1.3", photos)
    mean, most = compare(base, got, lambda x: F.gaussian_blur(x, [5, 5], [1.3, 1.3]))
    print(f"gaussian_blur 5 sigma=1.3: mean |diff| {mean:.4f}, max {most}")
    assert mean <= 0.05 and most <= 1


def test_random_grayscale_at_its_ends_and_in_between(photos):
    base = images(BASE, photos)
    assert all(torch.equal(a, b) for a, b in zip(
        images(f"{BASE} | random_grayscale p=0", photos).values(), base.values()))
    always = images(f"{BASE} | random_grayscale p=1", photos)
    mean, most = compare(base, always, lambda x: F.rgb_to_grayscale(x, num_output_channels=3))
    assert (mean, most) == (0, 0)
    half = images(f"{BASE} | random_grayscale p=0.5", photos)
    grey = sum(torch.equal(x[0], x[1]) and torch.equal(x[1], x[2]) for x in half.values())
    # 32 draws at p = 0.5 (a real photo is never grey by itself).
    assert 6 <= grey <= 26, grey


def test_color_jitter_brightness_is_a_brightness_in_its_range(photos):
    """Brightness alone (0.4: a factor in [0.6, 1.4] per sample): each image is torchvision's
    adjust_brightness of the un-jittered one at some factor of that range."""
    base = images(BASE, photos)
    got = images(f"{BASE} | color_jitter 0.4", photos)
    factors = []
    for k, x in base.items():
        y = got[k]
        keep = (x >= 40) & (y < 250)
        f = (y[keep].float() / x[keep].float()).median().item()
        factors.append(f)
        # The factor is known to about 1/40: the image matches torchvision's to a step.
        want = F.adjust_brightness(x, f)
        assert (y.int() - want.int()).abs().float().mean().item() <= 1.0, (k, f)
    assert all(0.58 <= f <= 1.42 for f in factors), factors
    assert max(factors) - min(factors) > 0.2, "the factor is drawn per sample"


@pytest.mark.parametrize("pipeline", [RANDOM, AUGMENT], ids=["colour", "augment"])
def test_random_ops_are_the_seeds_in_process_and_through_a_worker(photos, worker, pipeline):
    """The same seed gives the same pixels (in process, and from a QUIC worker); another seed,
    others."""
    first = images(pipeline, photos)
    again = images(pipeline, photos)
    assert all(torch.equal(first[k], again[k]) for k in first)
    remote = dict(workers=[worker.addr], token_file=worker.token_file, trust_cert=worker.cert)
    there = images(pipeline, photos, **remote)
    assert all(torch.equal(first[k], there[k]) for k in first)
    other = sluice.Loader(dataset=photos, batch_size=8, pipeline=pipeline, seed=8)
    differ = 0
    for batch, _ in other.epoch(0):
        x = torch.from_numpy(np.from_dlpack(batch).copy()).permute(0, 3, 1, 2)
        differ += sum(not torch.equal(x[i], first[s]) for i, s in enumerate(batch.ids))
    assert differ >= 30, f"only {differ} of 32 samples changed with the seed"


def test_random_ops_are_the_seeds_over_same_host_and_after_a_resume(photos, sluice_bin,
                                                                    tmp_path):
    """Every random op (and a late hflip): the in-process pixels from a same-host worker
    (shared memory), and from a loader resumed from a mid-epoch checkpoint."""
    import json
    pipeline = f"{RANDOM} | {AUGMENT.replace(BASE + ' | ', '')} | hflip"
    local = images(pipeline, photos, batch_size=4)
    # Resume: two batches, a checkpoint through JSON, a new loader for the rest.
    loader = sluice.Loader(dataset=photos, pipeline=pipeline, batch_size=4, seed=7)
    epoch = loader.epoch(0)
    got = {}
    for _ in range(2):
        batch, _ = next(epoch)
        x = torch.from_numpy(np.from_dlpack(batch).copy()).permute(0, 3, 1, 2)
        got.update((sample, x[i]) for i, sample in enumerate(batch.ids))
    state = json.loads(json.dumps(loader.state_dict()))
    del epoch, loader
    resumed = sluice.Loader(dataset=photos, pipeline=pipeline, batch_size=4, seed=7)
    resumed.load_state_dict(state)
    for batch, _ in resumed:
        x = torch.from_numpy(np.from_dlpack(batch).copy()).permute(0, 3, 1, 2)
        got.update((sample, x[i]) for i, sample in enumerate(batch.ids))
    assert got.keys() == local.keys()
    assert all(torch.equal(got[k], local[k]) for k in local), "resumed"
    # Same-host.
    token = token_file(tmp_path)
    sockets = tmp_path / "sockets"
    w = Worker(sluice_bin, tmp_path / "w", ["--token-file", str(token)], same_host_dir=sockets)
    try:
        shm = images(pipeline, photos, batch_size=4, workers=[w.addr], same_host="require",
                     same_host_dir=str(sockets), token_file=str(token), trust_cert=w.cert)
    finally:
        log = w.stop()
    assert "same-host client connected" in log
    assert shm.keys() == local.keys()
    assert all(torch.equal(shm[k], local[k]) for k in local), "same-host"


def test_random_ops_survive_a_worker_killed_mid_epoch(photos, sluice_bin, tmp_path):
    """Two QUIC workers, one killed at the first batch where it holds units: its units are made
    again on the other, with the same draws, so every image is the in-process one."""
    # Every random op, and an hflip written after the augments (as the ViT recipes write it).
    pipeline = f"{RANDOM} | {AUGMENT.replace(BASE + ' | ', '')} | hflip"
    settings = dict(batch_size=2, seed=7, max_unit_samples=8)
    local = images(pipeline, photos, **settings)
    token = token_file(tmp_path)
    a = Worker(sluice_bin, tmp_path / "a", ["--token-file", str(token)])
    b = Worker(sluice_bin, tmp_path / "b", ["--token-file", str(token)])
    try:
        trust = tmp_path / "trust.pem"
        trust.write_text("".join(pathlib.Path(w.cert).read_text() for w in (a, b)))
        killed, moved = False, 0
        # `a` is killed at the first batch where it holds units. Its one-sample units may all
        # be done by then (nothing in flight to lose): the epoch is run again, `a` restarted,
        # until the kill moved units.
        for _ in range(5):
            if killed:
                a = Worker(sluice_bin, tmp_path / "a", ["--token-file", str(token)])
                killed = False
            loader = sluice.Loader(dataset=photos, pipeline=pipeline, workers=[a.addr, b.addr],
                                   token_file=str(token), trust_cert=str(trust), **settings)
            got = {}
            epoch = loader.epoch(0)
            for batch, _ in epoch:
                x = torch.from_numpy(np.from_dlpack(batch).copy()).permute(0, 3, 1, 2)
                got.update((sample, x[i]) for i, sample in enumerate(batch.ids))
                held = {w[0]: w[3] for w in loader.stats()["workers"]}
                if not killed and held.get(a.addr, 0) > 0:
                    a.proc.kill()
                    killed = True
            # A killed worker's units move when it is declared lost (reassigned), or sooner,
            # when they stall, as hedges.
            report = epoch.report()
            moved = report["reassigned"] + report["hedged"]
            del epoch, loader
            assert got.keys() == local.keys()
            assert all(torch.equal(got[k], local[k]) for k in local)
            if moved:
                break
        assert moved, "the kill of worker a moved no unit, in 5 epochs"
    finally:
        a.stop()
        b.stop()


VIT_RECIPE = ("decode | random_resized_crop 224 | rand_augment n=2 m=9 | hflip 0.5 | normalize "
              "mean=0.485,0.456,0.406 std=0.229,0.224,0.225 | chw | random_erasing p=0.25")


def test_a_vit_trains_two_steps_on_the_randaugment_recipe(photos):
    """The issue's recipe, through ``sluice.torch`` as a training script writes it, into a
    (small) torchvision VisionTransformer: two optimizer steps, a finite loss, weights that
    moved, and the batch the model expects (float32, N×3×224×224, normalized)."""
    import sluice.torch as st
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(image_size=224, patch_size=32, num_layers=2, num_heads=2,
                              hidden_dim=64, mlp_dim=128, num_classes=10)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = st.Loader(photos, batch_size=8, pipeline=VIT_RECIPE, seed=1)
    losses = []
    for step, batch in enumerate(loader):
        x, y = batch["image"], batch["label"]
        assert x.dtype == torch.float32 and x.shape == (8, 3, 224, 224)
        # Normalized: about zero mean, nothing left in 0..255.
        assert -1.5 < float(x.mean()) < 1.5 and float(x.abs().max()) < 5
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step == 1:
            break
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses), losses
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
