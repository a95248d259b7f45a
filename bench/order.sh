#!/usr/bin/env bash
# What the deterministic (plan) order costs against arrival order, side by side in one run:
# the same dataset, workers and seed, `sluice loadgen` alternating between the two orders for
# ROUNDS rounds, so machine noise hits both alike. Prints each round's samples/s and the
# median ratio plan / arrival (1.0 = free; the goal is at least 0.95).
#
#   bash bench/order.sh [SLUICE] [ROUNDS]
#
# SLUICE defaults to target/release/sluice. The dataset is ../shared/data/imagenet-sample
# (804 real JPEGs) when present, else generated; WORKERS=local (default) decodes in process,
# or give host:port,... of running `sluice cpu` daemons (with TOKEN_FILE and TRUST_CERT).
# EPOCHS, BATCH, RANKS and PIPELINE change the load.
set -euo pipefail
cd "$(dirname "$0")/.."
sluice=${1:-target/release/sluice}
rounds=${2:-3}
epochs=${EPOCHS:-2}
batch=${BATCH:-64}
ranks=${RANKS:-1}
workers=${WORKERS:-local}
pipeline=${PIPELINE:-decode | random_resized_crop 224 | hflip 0.5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -d ../shared/data/imagenet-sample ]; then
    src=../shared/data/imagenet-sample
    "$sluice" shard --input "$src" --labels "$src/labels.tsv" --output "$work/s-%06d.tar" \
        --max-count 100 --manifest "$work/m.json" >/dev/null
    echo "dataset: the 804 ImageNet JPEGs in $src"
else
    "$sluice" synth --output "$work/images" --classes 20 --per-class 40 >/dev/null
    "$sluice" shard --input "$work/images" --output "$work/s-%06d.tar" --max-count 100 \
        --manifest "$work/m.json" >/dev/null
    echo "dataset: 800 generated JPEGs (../shared is absent)"
fi
extra=()
[ -n "${TOKEN_FILE:-}" ] && extra+=(--token-file "$TOKEN_FILE")
[ -n "${TRUST_CERT:-}" ] && extra+=(--trust-cert "$TRUST_CERT")

rate() {
    "$sluice" loadgen --dataset "$work/m.json" --workers "$workers" --ranks "$ranks" \
        --batch-size "$batch" --epochs "$epochs" --pipeline "$pipeline" --order "$1" \
        --json "$work/$1.json" "${extra[@]}" >/dev/null 2>&1
    python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['samples_per_s'])" \
        "$work/$1.json"
}

ratios=()
for r in $(seq 1 "$rounds"); do
    # Alternate which order goes first, so warm caches favour neither.
    if [ $((r % 2)) -eq 1 ]; then a=$(rate arrival); p=$(rate plan); else p=$(rate plan); a=$(rate arrival); fi
    ratio=$(python3 -c "print(f'{$p / $a:.3f}')")
    ratios+=("$ratio")
    printf 'round %d: plan %.0f samples/s, arrival %.0f samples/s, plan/arrival %s\n' "$r" "$p" "$a" "$ratio"
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
echo "order: plan / arrival median $median over $rounds rounds ($workers, $ranks rank(s), batch $batch)"
