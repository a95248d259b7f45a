"""The clip loader a user would write, on one core, to compare with `sluice bench cpu` on clips:
the same clips (from each of the first 40 images of the corpus, FRAMES JPEG frames of a window
of three quarters of the image moving across it, quality 90, back to back), each split into
its JPEG frames at their markers, the window's frames decoded with Pillow, then one
torchvision RandomResizedCrop and flip drawn per clip and applied to every frame.

    python bench/clip_reference.py [IMAGES_DIR] [--frames 32] [--clip 8] [--stride 2]
        [--size 112] [--seconds 10]

IMAGES_DIR defaults to ../shared/data/imagenet-sample. Prints frames/s (one core) for the
window's frames and for decoding every frame, as `sluice bench cpu --clip-frames` does.
Needs Pillow, torch and torchvision (the torch venv: SETUP_ONLY=1 bash
../shared/bench/anchors/run_all.sh).
"""

import argparse
import io
import pathlib
import random
import time

import torch
from PIL import Image
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F


def clips_from(images, frames):
    out = []
    for path in images:
        img = Image.open(path).convert("RGB")
        w, h = img.size
        fw, fh = max(w * 3 // 4, 1), max(h * 3 // 4, 1)
        data = bytearray()
        for k in range(frames):
            x = (w - fw) * k // max(frames - 1, 1)
            buf = io.BytesIO()
            img.crop((x, 0, x + fw, fh)).save(buf, "JPEG", quality=90)
            data += buf.getvalue()
        out.append(bytes(data))
    return out


def split_frames(data):
    """Frame byte ranges at SOI (FF D8 FF) ... EOI (FF D9): what a user's splitter does (it
    trusts that no FF D9 sits in a frame's headers)."""
    frames, at = [], 0
    while True:
        start = data.find(b"\xff\xd8\xff", at)
        if start < 0:
            return frames
        end = data.find(b"\xff\xd9", start) + 2
        frames.append(data[start:end])
        at = end


def load(clip, n, stride, size, rng):
    frames = split_frames(clip)
    span = (n - 1) * stride + 1
    first = rng.randrange(max(len(frames) - span, 0) + 1)
    taken = [frames[min(first + i * stride, len(frames) - 1)] for i in range(n)]
    video = torch.stack([F.pil_to_tensor(Image.open(io.BytesIO(f)).convert("RGB"))
                         for f in taken])  # T×3×H×W
    i, j, h, w = v2.RandomResizedCrop.get_params(video, scale=(0.08, 1.0),
                                                 ratio=(3 / 4, 4 / 3))
    video = F.resized_crop(video, i, j, h, w, [size, size], antialias=True)
    if rng.random() < 0.5:
        video = F.horizontal_flip(video)
    return video


def rate(clips, n, stride, size, seconds):
    rng = random.Random(0)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for clip in clips:
            load(clip, n, stride, size, rng)
            done += n
    return done / (time.perf_counter() - started)


def main():
    default = pathlib.Path(__file__).resolve().parents[2] / "shared/data/imagenet-sample"
    ap = argparse.ArgumentParser()
    ap.add_argument("images", nargs="?", default=str(default))
    ap.add_argument("--frames", type=int, default=32)
    ap.add_argument("--clip", type=int, default=8)
    ap.add_argument("--stride", type=int, default=2)
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    images = sorted(p for p in pathlib.Path(args.images).rglob("*")
                    if p.suffix.lower() in (".jpg", ".jpeg"))[:40]
    clips = clips_from(images, args.frames)
    window = rate(clips, args.clip, args.stride, args.size, args.seconds)
    every = rate(clips, args.frames, 1, args.size, args.seconds)
    print(f"reference\tthreads=1\t{window:.0f} frames/s ({args.clip} of {args.frames} frames "
          f"each, Pillow + torchvision)\tall {args.frames} frames: {every:.0f} frames/s")


if __name__ == "__main__":
    main()
