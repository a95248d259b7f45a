#!/usr/bin/env bash
# What carrying fields costs, side by side in one run: a dataset written by Python
# webdataset.ShardWriter (../shared's 804 ImageNet JPEGs, each with a ~130-byte caption and a
# ~370-byte JSON annotation), two `sluice cpu` workers (one decode thread each) over QUIC on
# loopback, and `sluice loadgen` alternating between no fields and `--fields txt,json` for
# ROUNDS rounds. Prints samples/s and the field bytes per sample of each run.
#
#   bash bench/fields.sh [SLUICE] [ROUNDS]
#
# SLUICE defaults to target/release/sluice; PYTHON (default .venv/bin/python, as .ci/run
# makes it) needs webdataset and Pillow. Everything is written under a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
sluice=$(realpath "${1:-target/release/sluice}")
rounds=${2:-3}
python=${PYTHON:-.venv/bin/python}
images=../shared/data/imagenet-sample
[ -d "$images" ] || { echo "fields.sh needs $images (../shared)" >&2; exit 1; }
dir=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$dir"' EXIT

"$python" - "$images" "$dir/data" <<'PY'
import io, pathlib, random, sys
import webdataset as wds
from PIL import Image
src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
out.mkdir(parents=True)
rng = random.Random(0)
words = "a photo of the small large red green dog cat bird on in with near tree water sky".split()
with wds.ShardWriter(str(out / "cap-%06d.tar"), maxcount=100, verbose=0) as sink:
    for i, p in enumerate(sorted(src.glob("*.JPEG"))):
        data = p.read_bytes()
        w, h = Image.open(io.BytesIO(data)).size
        boxes = [[rng.uniform(0, w / 2), rng.uniform(0, h / 2), rng.uniform(w / 2, w),
                  rng.uniform(h / 2, h)] for _ in range(4)]
        sink.write({"__key__": f"s{i:05d}", "jpg": data, "cls": i,
                    "txt": " ".join(rng.choice(words) for _ in range(30)),
                    "json": {"boxes": boxes, "classes": [rng.randrange(1000) for _ in range(4)],
                             "image_id": i}})
PY
"$sluice" index "$dir"/data/cap-*.tar --output "$dir/data/manifest.json" >/dev/null

echo "bench-token-0123456789" > "$dir/token"
: > "$dir/trust.pem"
addrs=()
for i in 0 1; do
  RUST_LOG=info "$sluice" cpu --listen 127.0.0.1:0 --threads 1 --no-same-host \
      --state-dir "$dir/w$i" --token-file "$dir/token" 2> "$dir/w$i.log" &
  pids+=($!)
  for _ in $(seq 200); do grep -q "listen=" "$dir/w$i.log" 2>/dev/null && break; sleep 0.1; done
  addrs+=("$(grep -o 'listen=[^ ]*' "$dir/w$i.log" | head -1 | cut -d= -f2)")
  cat "$dir/w$i/cert.pem" >> "$dir/trust.pem"
done
workers=$(IFS=,; echo "${addrs[*]}")
for round in $(seq "$rounds"); do
  for fields in none txt,json; do
    extra=()
    [ "$fields" != none ] && extra=(--fields "$fields")
    "$sluice" loadgen --dataset "$dir/data/manifest.json" --workers "$workers" \
        --token-file "$dir/token" --trust-cert "$dir/trust.pem" --batch-size 64 --epochs 2 \
        --pipeline "decode | random_resized_crop 224 | hflip 0.5" "${extra[@]}" \
        --json "$dir/r.json" > /dev/null 2>&1
    "$python" -c "
import json; r = json.load(open('$dir/r.json'))
print('round $round fields=$fields: %.0f samples/s, %.0f field bytes/sample'
      % (r['samples_per_s'], r['field_bytes_per_sample']))"
  done
done
