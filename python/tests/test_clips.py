"""Clips (``mjpeg`` fields, JPEG frames back to back) from outside: clip folders made by
Pillow from a real image (a window moving over an ImageNet image; a generated image without
``../shared``), sharded with ``sluice shard --clips``, read through ``sluice.Loader`` and
compared frame by frame with Pillow's decode of the source frame each row names, under the
row's one crop box and flip; the same batches in process, over QUIC with a worker killed
mid-epoch, and over same-host shared memory; a broken frame stream skipped by name; and a
3D-conv model trained a step under Lightning."""

import json
import pathlib
import subprocess

import numpy as np
import pytest
from PIL import Image

import sluice
from conftest import ROOT, Worker, indexed_shard, token_file

IMAGENET = ROOT.parent / "shared" / "data" / "imagenet-sample"
CLIPS = 14


def source_image():
    files = sorted(IMAGENET.glob("*.JPEG")) if IMAGENET.exists() else []
    if files:
        return Image.open(files[11]).convert("RGB")
    print("../shared/data/imagenet-sample is absent: clips of a generated image")
    y, x = np.mgrid[0:300, 0:420]
    rgb = np.stack([x * 255 // 420, y * 255 // 300, (x * 3 + y * 5) % 256], -1)
    return Image.fromarray(rgb.astype(np.uint8))


def make_clips(root):
    """CLIPS clip folders in two class folders, 3 to 16 frames each (some shorter than the
    windows below), each frame a window of even size moving right over the image."""
    img = source_image()
    w, h = img.size
    fw, fh = (w * 3 // 4) & ~1, (h * 3 // 4) & ~1
    frames_of = {}
    for i in range(CLIPS):
        n = 3 + i
        key = f"c{i % 2}/clip{i:02d}"
        (root / key).mkdir(parents=True)
        frames_of[key] = []
        for k in range(n):
            x = ((w - fw) * k // (n - 1)) & ~1
            path = root / key / f"{k:04d}.jpg"
            img.crop((x, 0, x + fw, fh)).save(path, quality=90)
            frames_of[key].append(path)
    return frames_of


@pytest.fixture(scope="module")
def clips(sluice_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    frames_of = make_clips(d / "src")
    manifest = d / "shards" / "manifest.json"
    subprocess.run([sluice_bin, "shard", "--clips", str(d / "src"), "--output",
                    str(d / "shards" / "clips-%04d.tar"), "--max-count", "4", "--manifest",
                    str(manifest)], check=True, capture_output=True)
    listing = subprocess.run([sluice_bin, "inspect", str(d / "shards" / "clips-0000.tar")],
                             check=True, capture_output=True, text=True).stdout
    for line in listing.splitlines():
        if line.endswith(" frames") and not line.startswith("index"):
            _, key, frames = line.split("\t")
            assert frames == f"mjpeg: {len(frames_of[key])} frames", line
    return str(manifest), frames_of


def pillow_frame(path, g):
    """Pillow's decode of `path` under geometry `g`: the box resampled to the size (bilinear,
    as torchvision), then mirrored."""
    im = Image.open(path).convert("RGB")
    x0, y0, x1, y1 = g["box"]
    h, w = g["size"]
    whole = all(float(v).is_integer() for v in g["box"]) and (x1 - x0, y1 - y0) == (w, h)
    out = im.crop((int(x0), int(y0), int(x1), int(y1))) if whole else \
        im.resize((w, h), Image.BILINEAR, box=(x0, y0, x1, y1))
    if g["flip"]:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(out, dtype=np.int16)


def rows(loader, epoch=0):
    """Every row of an epoch: (batch, key, frames, box, flip, pixels N×T×H×W×3)."""
    out = []
    for b, (images, _) in enumerate(loader.epoch(epoch)):
        x = np.from_dlpack(images).copy()
        for r, (key, g, fr) in enumerate(zip(images.keys, images.geometry, images.frames)):
            assert g["frames"] == fr
            out.append((b, key, tuple(fr), tuple(g["box"]), g["flip"], x[r], g))
    return out


@pytest.mark.parametrize("pipeline, count, stride, exact", [
    ("decode | clip 4 stride=2 | center_crop 96 | hflip 0.5", 4, 2, True),
    ("decode field=mjpeg | clip 3 stride=3 | random_resized_crop 64 scale=0.2,1 | hflip 0.5",
     3, 3, False),
])
def test_every_frame_is_pillows_decode_of_its_source_frame_under_the_rows_one_crop(
        clips, pipeline, count, stride, exact):
    manifest, frames_of = clips
    loader = sluice.Loader(dataset=manifest, batch_size=4, pipeline=pipeline, seed=5,
                           threads=2)
    got = rows(loader)
    assert sorted(key for _, key, *_ in got) == sorted(frames_of), "each clip once"
    starts, worst = set(), (0, 0.0)
    for _, key, fr, box, flip, x, g in got:
        n = len(frames_of[key])
        assert x.shape[0] == count
        # Frames step by the stride from a start that fits; a short clip repeats its last.
        assert list(fr) == [min(fr[0] + t * stride, n - 1) for t in range(count)], (key, fr)
        assert fr[0] + (count - 1) * stride < n or fr[0] == 0, (key, fr)
        starts.add(fr[0])
        for t, k in enumerate(fr):
            diff = np.abs(x[t].astype(np.int16) - pillow_frame(frames_of[key][k], g))
            worst = (max(worst[0], int(diff.max())), max(worst[1], float(diff.mean())))
    assert len(starts) > 1, "random starts"
    if exact:
        assert worst[0] <= 1, f"center crops differ from Pillow by max {worst[0]}"
    else:
        # The window is decoded at a reduced DCT scale (as images are) where Pillow decodes
        # it whole and resamples: small differences, where another box or frame would differ
        # by tens on average (measured here: max 21, worst frame mean 1.6).
        assert worst[1] < 2.5, f"random crops differ by max {worst[0]}, mean {worst[1]:.2f}"
    # The same seed, the same clips, frames and crops; another epoch, others.
    again = rows(sluice.Loader(dataset=manifest, batch_size=4, pipeline=pipeline, seed=5))
    assert [r[:5] for r in again] == [r[:5] for r in got]
    other = rows(loader, epoch=1)
    assert {r[1:4] for r in other} != {r[1:4] for r in got}


def test_a_loader_that_does_not_shuffle_takes_each_clips_middle_frames(clips):
    manifest, frames_of = clips
    loader = sluice.Loader(dataset=manifest, batch_size=4, shuffle="none",
                           pipeline="decode | clip 4 | center_crop 64")
    for _, key, fr, *_ in rows(loader):
        n = len(frames_of[key])
        assert fr[0] == (max(n - 4, 0)) // 2, (key, n, fr)


def test_a_random_pixel_op_draws_once_per_clip(clips):
    """color_jitter (brightness alone) and random_grayscale on clips: every frame of a clip gets
    the same draw (one brightness factor, grey or not), while clips draw apart."""
    manifest, _ = clips
    base = "decode | clip 4 | center_crop 64"

    def frames(pipeline):
        loader = sluice.Loader(dataset=manifest, batch_size=4, pipeline=pipeline, seed=3)
        out = {}
        for batch, _ in loader.epoch(0):
            x = np.from_dlpack(batch).copy()
            for i, key in enumerate(batch.ids):
                out[key] = x[i].astype(np.float64)
        return out

    plain = frames(base)
    drawn = frames(f"{base} | color_jitter 0.5 | random_grayscale p=0.5")
    factors, greys = [], []
    for key, clip in drawn.items():
        grey = [bool((f[..., 0] == f[..., 1]).all() and (f[..., 1] == f[..., 2]).all())
                for f in clip]
        assert len(set(grey)) == 1, (key, grey)
        greys.append(grey[0])
        if grey[0]:
            continue
        per_frame = []
        for f, p in zip(clip, plain[key]):
            keep = (p >= 40) & (f < 250)
            per_frame.append(float(np.median(f[keep] / p[keep])))
        assert max(per_frame) - min(per_frame) < 0.03, (key, per_frame)
        factors.append(per_frame[0])
    assert any(greys) and not all(greys), greys
    assert max(factors) - min(factors) > 0.1, factors


def test_an_augment_and_an_erasing_draw_once_per_clip(clips):
    """rand_augment then random_erasing (p=1, zeros) on clips: every frame of a clip has its
    rectangle erased in the same place (one draw a clip), clips in different places, and the
    row's one geometry says where the augment moved the pixels when it did."""
    manifest, _ = clips
    pipeline = ("decode | clip 4 | center_crop 64 | rand_augment n=2 m=9 "
                "| random_erasing p=1 scale=0.1,0.2")
    loader = sluice.Loader(dataset=manifest, batch_size=4, pipeline=pipeline, seed=3)
    places, moved = set(), 0
    for batch, _ in loader.epoch(0):
        x = np.from_dlpack(batch).copy()
        for i, g in enumerate(batch.geometry):
            zero = [(f == 0).all(-1) for f in x[i]]
            # The rectangle is zero in every frame (other zeros may differ: a frame's black).
            both = np.logical_and.reduce(zero)
            rows_, cols = np.nonzero(both)
            assert rows_.size >= 0.1 * 64 * 64 * 0.9, (batch.ids[i], rows_.size)
            places.add((int(rows_.min()), int(cols.min())))
            moved += "affine" in g
    assert len(places) > 3, places
    assert moved > 0, "some clip drew a rotate, shear or translate"


def test_clips_over_quic_with_a_worker_killed_and_over_same_host_are_the_in_process_batches(
        clips, sluice_bin, tmp_path, monkeypatch):
    manifest, _ = clips
    pipeline = "decode | clip 4 stride=2 | random_resized_crop 48 | hflip 0.5"
    # One-sample units, so a worker holds some at every batch (the plan is the same for all).
    settings = dict(dataset=manifest, batch_size=2, pipeline=pipeline, seed=8,
                    max_unit_samples=1)
    local = rows(sluice.Loader(**settings))
    token = token_file(tmp_path)
    sockets = tmp_path / "sockets"
    a = Worker(sluice_bin, tmp_path / "a", ["--token-file", str(token)])
    b = Worker(sluice_bin, tmp_path / "b", ["--token-file", str(token)], same_host_dir=sockets)
    try:
        trust = tmp_path / "trust.pem"
        trust.write_text("".join(pathlib.Path(w.cert).read_text() for w in (a, b)))
        remote = dict(settings, token_file=str(token), trust_cert=str(trust))
        monkeypatch.setenv("SLUICE_SAME_HOST_DIR", str(tmp_path / "none"))
        # `a` is killed at the first batch where it holds units: they go to `b`. Its tiny
        # one-sample units may all be done before the first batch reaches this loop (about 1
        # run in 15 here): nothing was in flight to lose, so the epoch is run again.
        killed = False
        for _ in range(5):
            quic = sluice.Loader(workers=[a.addr, b.addr], **remote)
            got = []
            for n, (images, _) in enumerate(quic.epoch(0)):
                x = np.from_dlpack(images).copy()
                got += [(n, k, tuple(f), tuple(g["box"]), g["flip"], x[r])
                        for r, (k, g, f) in enumerate(zip(images.keys, images.geometry,
                                                          images.frames))]
                held = {w[0]: w[3] for w in quic.stats()["workers"]}
                if not killed and held.get(a.addr, 0) > 0:
                    a.proc.kill()
                    killed = True
            del quic
            if killed:
                break
        assert killed, "worker a never held a unit at a batch, in 5 epochs"
        same_host = sluice.Loader(workers=[b.addr], same_host="require", same_host_dir=sockets,
                                  **remote)
        shm = rows(same_host)
        del same_host
    finally:
        a.stop()
        log = b.stop()
    assert "same-host client connected" in log
    for name, run in [("QUIC with a worker killed", got), ("same-host", shm)]:
        assert [r[:5] for r in run] == [r[:5] for r in local], name
        for mine, theirs in zip(run, local):
            assert np.array_equal(mine[5], theirs[5]), (name, mine[1])


def test_a_checkpoint_mid_epoch_resumes_the_rest_with_the_same_frames_and_crops(clips):
    manifest, _ = clips
    settings = dict(dataset=manifest, batch_size=3, seed=2,
                    pipeline="decode | clip 4 stride=2 | random_resized_crop 40 | hflip 0.5")
    whole = [r[1:5] for r in rows(sluice.Loader(**settings), epoch=1)]
    first = sluice.Loader(**settings)
    epoch = first.epoch(1)
    got = []
    for _ in range(2):
        images, _ = next(epoch)
        got += [(k, tuple(f), tuple(g["box"]), g["flip"])
                for k, g, f in zip(images.keys, images.geometry, images.frames)]
    state = json.loads(json.dumps(first.state_dict()))
    del epoch, first
    second = sluice.Loader(**settings)
    second.load_state_dict(state)
    rest = []
    for images, _ in second:
        rest += [(k, tuple(f), tuple(g["box"]), g["flip"])
                 for k, g, f in zip(images.keys, images.geometry, images.frames)]
    assert got + rest == whole


def test_a_broken_frame_stream_is_skipped_by_name(clips, sluice_bin, tmp_path):
    _, frames_of = clips
    good = b"".join(p.read_bytes() for p in frames_of["c0/clip04"])
    cut = good[:-5000]
    manifest = indexed_shard(sluice_bin, tmp_path / "broken.tar", [
        ("good", [("mjpeg", good), ("cls", b"0")]),
        ("cut", [("mjpeg", cut), ("cls", b"1")]),
        ("junk", [("mjpeg", b"\xff\xd8" + b"\x00" * 300), ("cls", b"1")]),
    ])
    loader = sluice.Loader(dataset=manifest, batch_size=3,
                           pipeline="decode | clip 2 | center_crop 32")
    keys, skipped = [], []
    for images, _ in loader.epoch(0):
        keys += images.keys
        skipped += [why for _, why in images.skipped]
    assert keys == ["good"]
    assert len(skipped) == 2 and all("broken clip" in why for why in skipped), skipped
    assert any(why.startswith("cut:") and "frame 6" in why and "ends inside" in why
               for why in skipped), skipped


def test_a_clip_that_cannot_fit_a_frame_is_refused_when_the_loader_is_built(clips):
    manifest, _ = clips
    with pytest.raises(ValueError, match="fewer frames"):
        sluice.Loader(dataset=manifest, pipeline="decode | clip 1024 | center_crop 320")


def test_a_3d_conv_model_trains_a_step_on_clips_under_lightning(clips, tmp_path):
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning")
    import sluice.torch

    manifest, _ = clips
    loader = sluice.torch.Loader(manifest, batch_size=4, seed=1, threads=2,
                                 pipeline="decode | clip 4 stride=2 | random_resized_crop 32")

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv3d(3, 4, kernel_size=3, padding=1)
            self.head = torch.nn.Linear(4, 2)
            self.shapes = []

        def training_step(self, batch, _):
            x = batch["image"]  # N×T×3×H×W
            self.shapes.append((tuple(x.shape), tuple(batch["frames"].shape)))
            x = x.permute(0, 2, 1, 3, 4).float() / 255  # N×3×T×H×W, as Conv3d takes
            y = self.head(self.conv(x).mean(dim=(2, 3, 4)))
            return torch.nn.functional.cross_entropy(y, batch["label"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = Tiny()
    before = model.conv.weight.detach().clone()
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.fit(model, train_dataloaders=loader)
    assert model.shapes[0] == ((4, 4, 3, 32, 32), (4, 4)), model.shapes
    assert not torch.equal(before, model.conv.weight.detach()), "the step moved the weights"


def test_a_clip_pipeline_on_images_is_one_error_not_a_page_of_skips(dataset, caplog):
    """Every sample lacks the clip's field: the epoch ends with one error that names the
    field looked for and the ones the sample has, and no per-sample warning comes first."""
    import logging
    caplog.set_level(logging.WARNING, logger="sluice")
    loader = sluice.Loader(dataset=dataset, batch_size=8,
                           pipeline="decode | clip 4 | center_crop 32")
    with pytest.raises(sluice.SluiceError,
                       match=r"no image field \(looked for mjpeg/mjpg; the sample has jpg"):
        for _ in loader.epoch(0):
            pass
    noise = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert noise == [], noise[:3]
