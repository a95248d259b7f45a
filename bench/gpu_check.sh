#!/usr/bin/env bash
# The GPU checks of the CUDA upload path and the Python binding's device batches, on a machine
# with an NVIDIA GPU (none is needed to build them). Build on any x86_64 Linux machine:
#
#   cargo build --release --features cuda -p sluice
#   cargo test --release --features cuda -p sluice-client --no-run   # prints the test binary
#   MATURIN_PEP517_ARGS="--features cuda --strip" pip wheel --no-deps -w FOLDER ./python
#
# and put into one folder: `sluice`, the test binary as `cuda_tests`, and the wheel
# (`sluice-*.whl`; it is installed into FOLDER/py with pip, no index needed). Then, on the GPU
# machine, from the repo root:
#
#   bash bench/gpu_check.sh FOLDER [OUTPUT]
#
# It runs: the CUDA unit tests (they skip without a GPU; here they must run), `sluice bench
# upload` (pinned ring vs a plain pinned copy), `sluice loadgen` with the host and the CUDA sink
# on a generated dataset, `sluice bench host-cost` (the client's CPU per sample on a GPU node's
# cores), and the Python tests with torch (and Lightning, Accelerate where installed) on the
# GPU. Everything it prints also goes to OUTPUT/gpu_check.log (default $OUT, else
# /tmp/gpu-check).
set -uo pipefail
dir=$(realpath "${1:?usage: gpu_check.sh FOLDER [OUTPUT]}")
out=${2:-${OUT:-/tmp/gpu-check}}
mkdir -p "$out"
exec > >(tee "$out/gpu_check.log") 2>&1
failures=()
step() { echo; echo "== $*"; }
check() { "$@" || failures+=("$*"); }

step "machine"
rm -rf "$dir/py" && python3 -m pip install -q --no-index --no-deps --no-compile --target "$dir/py" "$dir"/sluice-*.whl \
    || failures+=("installing the wheel")
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv
nproc
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" || true

# The conversion kernel needs NVRTC: sluice finds libnvrtc.so.13/.12 by itself, in the loader's
# path or the toolkit's directories (SLUICE_NVRTC=path overrides). Say which one is there.
step "NVRTC"
ldconfig -p | grep -m3 'libnvrtc\.so' || ls /usr/local/cuda/lib64/libnvrtc.so* 2>/dev/null || echo "no libnvrtc: the conversion tests will skip"

step "CUDA unit tests (sluice-client, feature cuda)"
check "$dir/cuda_tests" --nocapture --test-threads=1

step "sluice bench upload"
check "$dir/sluice" bench upload --json "$out/upload.json"
check "$dir/sluice" bench upload --dtype float16 --batches 32 --repeat 32 --json "$out/upload_f16.json"

step "sluice loadgen: host sink vs CUDA sink"
data=$(mktemp -d)
"$dir/sluice" synth --output "$data/images" --classes 8 --per-class 1000 --quality 85 >/dev/null
"$dir/sluice" shard --input "$data/images" --output "$data/shards/s-%06d.tar" --max-count 250 \
    --manifest "$data/shards/manifest.json" >/dev/null
for step_ms in 0 40; do
    for device in cpu cuda:0; do
        echo "-- step ${step_ms} ms, device $device"
        check "$dir/sluice" loadgen --dataset "$data/shards/manifest.json" --workers local \
            --batch-size 256 --epochs 3 --step-ms "$step_ms" --device "$device" \
            --json "$out/loadgen_${step_ms}ms_${device/:/}.json"
    done
done

echo "-- step 40 ms, device cuda:0, float16 NCHW normalized on the GPU"
check "$dir/sluice" loadgen --dataset "$data/shards/manifest.json" --workers local \
    --batch-size 256 --epochs 3 --step-ms 40 --device cuda:0 --dtype float16 \
    --json "$out/loadgen_40ms_cuda0_f16.json"

step "sluice bench transport (QUIC, same-host, TCP, memcpy)"
check "$dir/sluice" bench transport

step "sluice bench host-cost (client CPU per sample beside its floor)"
check "$dir/sluice" bench host-cost --repeat 2
check "$dir/sluice" bench host-cost --repeat 2 --io-threads 1

step "Python iterator beside the Rust loader, one same-host worker, host and device batches"
token=$(mktemp); echo "gpu-check-token-123456" > "$token"
"$dir/sluice" cpu --listen 127.0.0.1:0 --threads "$(( $(nproc) - 2 ))" --state-dir "$data/state" \
    --token-file "$token" 2> "$data/cpu.log" &
cpu_pid=$!
for _ in $(seq 100); do addr=$(grep -om1 'listen=[0-9.:]*' "$data/cpu.log" | cut -d= -f2); [ -n "$addr" ] && break; sleep 0.1; done
for device in cpu cuda:0; do
    check env PYTHONPATH="$dir/py" python3 python/bench/iterator_overhead.py \
        --dataset "$data/shards/manifest.json" --workers "$addr" --trust-cert "$data/state/cert.pem" \
        --token-file "$token" --sluice "$dir/sluice" --device "$device" --rounds 5
done
kill "$cpu_pid"

step "Python tests with torch on the GPU"
export PYTHONPATH="$dir/py${PYTHONPATH:+:$PYTHONPATH}" SLUICE_BIN="$dir/sluice"
check python3 -m pytest -v -rs -p no:cacheprovider python/tests

step "summary"
if [ ${#failures[@]} -eq 0 ]; then
    echo "all GPU checks passed"
else
    printf 'FAILED: %s\n' "${failures[@]}"
    exit 1
fi
