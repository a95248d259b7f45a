"""The augmentation recipe a PyTorch user runs today, on one core, to compare with `sluice bench
cpu --per-op` on the same recipe: Pillow decode, torchvision v2 RandomResizedCrop(224),
RandAugment(2, 9), RandomHorizontalFlip, ToImage + ToDtype(float32, scale) + Normalize, and
RandomErasing(0.25), image by image as a DataLoader worker does. Also times each op alone on
tensors already decoded and cropped, as the per-op lines of `sluice bench cpu` do.

    python bench/augment_reference.py [IMAGES_DIR] [--seconds 10]

IMAGES_DIR defaults to ../shared/data/imagenet-sample. Prints images/s for the recipe, for
the same without its pixel ops (decode, crop, flip, normalize), and ms per image for each op.
Needs Pillow, torch and torchvision (the torch venv: SETUP_ONLY=1 bash
../shared/bench/anchors/run_all.sh, or .ci/run's).
"""

import argparse
import io
import pathlib
import time

import torch
from PIL import Image
from torchvision.transforms import v2

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def rate(images, transform, seconds):
    """Images/s of `transform` over `images` (bytes), one pass to warm, then `seconds`."""
    for data in images[:20]:
        transform(data)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for data in images:
            transform(data)
            n += 1
            if time.perf_counter() - t0 >= seconds:
                break
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("images", nargs="?", default="../shared/data/imagenet-sample")
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    files = sorted(p for p in pathlib.Path(args.images).rglob("*")
                   if p.suffix.lower() in (".jpg", ".jpeg"))
    images = [p.read_bytes() for p in files]
    if not images:
        raise SystemExit(f"no JPEGs under {args.images}")

    def pil(data):
        return Image.open(io.BytesIO(data)).convert("RGB")

    head = [v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()]
    tail = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    plain = v2.Compose(head + tail)
    recipe = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandAugment(2, 9),
                         v2.RandomHorizontalFlip()] + tail + [v2.RandomErasing(0.25)])
    base = rate(images, lambda d: plain(pil(d)), args.seconds)
    full = rate(images, lambda d: recipe(pil(d)), args.seconds)
    print(f"torchvision\tthreads=1\t{full:.0f} images/s\t{1000 / full:.3f} ms/image\t"
          "Pillow decode | RandomResizedCrop(224) | RandAugment(2, 9) | RandomHorizontalFlip "
          "| ToDtype | Normalize | RandomErasing(0.25)")
    print(f"torchvision-plain\tthreads=1\t{base:.0f} images/s\t{1000 / base:.3f} ms/image\t"
          f"the recipe runs at {full / base:.2f} of it")

    # Each op alone, on uint8 tensors decoded and cropped beforehand (ops on tensors, as
    # RandAugment runs them after RandomResizedCrop).
    crop = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.PILToTensor()])
    tensors = [crop(pil(d)) for d in images[:200]]
    normalized = [v2.Normalize(MEAN, STD)(v2.ToDtype(torch.float32, scale=True)(t))
                  for t in tensors[:50]]
    ops = {
        "rand_augment n=2 m=9": (v2.RandAugment(2, 9), tensors),
        "trivial_augment": (v2.TrivialAugmentWide(), tensors),
        "auto_augment imagenet": (v2.AutoAugment(), tensors),
        "color_jitter 0.4 0.4 0.4 0.1": (v2.ColorJitter(0.4, 0.4, 0.4, 0.1), tensors),
        "gaussian_blur 23": (v2.GaussianBlur(23, (0.1, 2.0)), tensors),
        "random_erasing p=0.25 (after normalize)": (v2.RandomErasing(0.25), normalized),
    }
    for name, (op, inputs) in ops.items():
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < min(args.seconds, 3.0):
            op(inputs[n % len(inputs)])
            n += 1
        ms = (time.perf_counter() - t0) * 1000 / n
        print(f"torchvision-op\tthreads=1\t{ms:.3f} ms/image\t{name}")


if __name__ == "__main__":
    main()
