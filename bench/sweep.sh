#!/usr/bin/env bash
# A sweep against one job alone, in the pool's CPU per delivered sample: N `sluice loadgen`
# jobs with the same data, pipeline and seed (a sweep's learning rates) against one fresh
# `sluice cpu --threads 1`, N = 1, 2 and 4, with sharing (the default) and with --no-share.
# The worker's CPU is read from /proc (user + system, its whole process), so what each job
# costs it beyond the shared decode (its reads, its transport, its units) is counted too.
#
#   bash bench/sweep.sh [EPOCHS] [TRANSPORT]      # defaults: 4 epochs, quic (or same-host)
#
# Data: the 804 JPEGs of ../shared/data/imagenet-sample with their labels, or 400 generated
# ones (says so). Prints one line per run:
#   sweep <transport> <share|no-share> <jobs> <worker CPU s> <µs per delivered sample>
#   <x one job alone> <peak window MiB>
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib/await_worker.sh
epochs=${1:-4}
transport=${2:-quic}
[ -x target/release/sluice ] || cargo build --release --locked -p sluice >&2
bin=${SLUICE_BIN:-$PWD/target/release/sluice}
work=$(mktemp -d)
worker_pid=
cleanup() {
    [ -n "$worker_pid" ] && kill "$worker_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

shared=../shared/data/imagenet-sample
if [ -f "$shared/labels.tsv" ]; then
    "$bin" shard --input "$shared" --labels "$shared/labels.tsv" \
        --output "$work/shards/s-%06d.tar" --max-count 100 \
        --manifest "$work/shards/manifest.json" >/dev/null
else
    echo "note: no $shared; 400 generated JPEGs instead" >&2
    "$bin" synth --output "$work/images" --classes 4 --per-class 100 >/dev/null
    "$bin" shard --input "$work/images" --output "$work/shards/s-%06d.tar" --max-count 100 \
        --manifest "$work/shards/manifest.json" >/dev/null
fi
echo "sweep-bench-token-0123456789" > "$work/token"

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# One run: a fresh worker, `jobs` loadgens at once; sets cpu_s, samples and peak_window.
run() {
    local jobs=$1 share=$2 state
    state=$(mktemp -d -p "$work")
    local same=(--no-same-host) client=()
    if [ "$transport" = same-host ]; then
        same=(--same-host-dir "$state/sock")
        client=(--same-host-dir "$state/sock")
    fi
    "$bin" cpu --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --threads 1 \
        --state-dir "$state" --token-file "$work/token" "${same[@]}" 2> "$state/cpu.log" &
    worker_pid=$!
    local addr metrics
    await_worker "$state/cpu.log" metrics
    local flag=()
    [ "$share" = no-share ] && flag=(--no-share)
    local before pids=()
    before=$(ticks "$worker_pid")
    for j in $(seq "$jobs"); do
        "$bin" loadgen --dataset "$work/shards/manifest.json" --workers "$addr" \
            --trust-cert "$state/cert.pem" --token-file "$work/token" --ranks 1 \
            --batch-size 32 --epochs "$epochs" --job-name "lr-$j" "${client[@]}" "${flag[@]}" \
            --dump-ids "$state/ids.$j" > "$state/loadgen.$j" 2>&1 &
        pids+=($!)
    done
    peak_window=0
    while kill -0 "${pids[@]}" 2>/dev/null; do
        local w
        w=$(curl -s "http://$metrics/metrics" | awk '$1 == "sluice_cpu_share_window_bytes" { print $2 }')
        peak_window=$(awk -v a="$peak_window" -v b="${w:-0}" 'BEGIN { print (b > a) ? b : a }')
        sleep 0.1
    done
    for p in "${pids[@]}"; do
        wait "$p" || { cat "$state"/loadgen.* >&2; exit 1; }
    done
    cpu_s=$(awk -v t="$(( $(ticks "$worker_pid") - before ))" -v hz="$(getconf CLK_TCK)" 'BEGIN { print t / hz }')
    samples=$(( $(cat "$state"/ids.* | wc -l) ))
    for j in $(seq 2 "$jobs"); do
        cmp -s "$state/ids.1" "$state/ids.$j" || { echo "job $j's order differs from job 1's" >&2; exit 1; }
    done
    kill "$worker_pid" && wait "$worker_pid" 2>/dev/null || true
    worker_pid=
}

echo "sweep: worker CPU per delivered sample, sluice cpu --threads 1, $epochs epochs, $transport"
for share in share no-share; do
    alone=
    for jobs in 1 2 4; do
        run "$jobs" "$share"
        us=$(awk -v c="$cpu_s" -v n="$samples" 'BEGIN { printf "%.0f", c * 1e6 / n }')
        [ -z "$alone" ] && alone=$cpu_s
        awk -v t="$transport" -v s="$share" -v j="$jobs" -v c="$cpu_s" -v us="$us" -v a="$alone" \
            -v w="$peak_window" 'BEGIN { printf "sweep\t%s\t%s\t%d jobs\tworker CPU %.2f s\t%s µs/sample\t%.2fx one job alone\tpeak window %.0f MiB\n", t, s, j, c, us, c / a, w / 1048576 }'
    done
done
