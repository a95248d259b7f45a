#!/usr/bin/env bash
# A training recipe's augmentations, Sluice's engine beside torchvision, side by side in one
# run on one core: the ViT recipe (random resized crop, RandAugment(2, 9), flip, normalize,
# RandomErasing(0.25)) through `sluice bench cpu --per-op` (with the same pipeline without
# its pixel ops, and each op alone), then bench/augment_reference.py (Pillow decode and
# torchvision v2 doing the same, image by image as a DataLoader worker). Prints both, and
# the ratios the issue asks for: Sluice's recipe over torchvision's, and Sluice's recipe
# over Sluice without it.
#
#   bash bench/augment.sh [SLUICE] [SECONDS]
#
# SLUICE defaults to target/release/sluice; PYTHON (default the CI torch venv,
# ~/.cache/sluice/venv-torch/bin/python) needs torch, torchvision and Pillow.
set -euo pipefail
cd "$(dirname "$0")/.."
sluice=$(realpath "${1:-target/release/sluice}")
seconds=${2:-10}
python=${PYTHON:-$HOME/.cache/sluice/venv-torch/bin/python}
images=../shared/data/imagenet-sample
[ -d "$images" ] || { echo "augment.sh needs $images (../shared)" >&2; exit 1; }
recipe="decode | random_resized_crop 224 | rand_augment n=2 m=9 | hflip 0.5 | normalize mean=0.485,0.456,0.406 std=0.229,0.224,0.225 | chw | random_erasing p=0.25"
ours=$("$sluice" bench cpu --images "$images" --threads 1 --seconds "$seconds" --per-op --pipeline "$recipe" 2>&1 | grep -E '^(cpu|plain|op)')
echo "$ours"
theirs=$("$python" bench/augment_reference.py "$images" --seconds "$seconds")
echo "$theirs"
rate() { awk -F'\t' -v k="$1" '$1 == k {split($3, a, " "); print a[1]}'; }
full=$(echo "$ours" | rate cpu)
plain=$(echo "$ours" | rate plain)
tv=$(echo "$theirs" | rate torchvision)
awk -v s="$full" -v p="$plain" -v t="$tv" 'BEGIN {
    printf "recipe per core: sluice %.0f images/s, torchvision %.0f: %.2fx\n", s, t, s / t
    printf "sluice with the recipe at %.2f of sluice without it (%.0f images/s)\n", s / p, p
}'
