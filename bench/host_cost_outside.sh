#!/usr/bin/env bash
# What the client costs a GPU host, measured from outside as issue 37 defines it: the CPU time
# (user + sys) of a 1-rank `sluice loadgen` process per delivered sample, decoding done by a
# separate `sluice cpu --threads 2`, over same-host shared memory and over QUIC. `sluice bench
# host-cost` measures the client against a worker that serves ready-made tensors as fast as it
# can; this measures it at the pace a real worker decodes, where each sample's arrival is a
# wake-up of its own. The figure includes loadgen's start (about 85 ms here): give it epochs.
#
#   bash bench/host_cost_outside.sh [EPOCHS] [ROUNDS]      # defaults: 80 epochs, 2 rounds
#   LOAD=quiet|busy|both (default both): busy keeps the other core spinning (`yes`, pinned to
#   the last CPU), as a training process's own threads would, while loadgen runs.
#
# These VMs differ about 2x in absolute speed, so each figure is also given as a ratio to the
# floors `sluice bench host-cost` measures in the same run, under the same load, just before
# it: the copy of a 224x224x3 tensor (same-host), and over QUIC the kernel's copy of its
# datagrams out of a UDP socket, AES-256-GCM over them and the copy.
#
# Data: the first 196 JPEGs of ../shared/data/imagenet-sample with their labels (4 shards of
# 50), or, without ../shared, 196 generated ones (says so). The binary is target/release/sluice
# (built if missing) or $SLUICE_BIN; $SLUICE_BIN_B, if set, is measured alternately beside it
# (an A/B of two builds on one machine). Prints one line per run:
#   outside <load> <transport> <binary> <µs per sample> <x the floor> <samples/s> <after the
#   first epoch: µs per sample, x the floor, user and system µs, page faults and context
#   switches per sample, as loadgen reads them itself: a long run's steady cost, without the
#   loader's start and the first pages of its buffers>
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib/await_worker.sh
epochs=${1:-80}
rounds=${2:-2}
if [ -z "${SLUICE_BIN:-}" ]; then
    [ -x target/release/sluice ] || cargo build --release --locked -p sluice >&2
    SLUICE_BIN=$PWD/target/release/sluice
fi
bins=("$SLUICE_BIN")
[ -n "${SLUICE_BIN_B:-}" ] && bins+=("$SLUICE_BIN_B")

load=${LOAD:-both}
case "$load" in quiet) loads=(quiet) ;; busy) loads=(busy) ;; both) loads=(quiet busy) ;;
    *) echo "LOAD=$load: quiet, busy or both" >&2; exit 2 ;; esac
work=$(mktemp -d)
worker_pid=
busy_pid=
cleanup() {
    [ -n "$worker_pid" ] && kill "$worker_pid" 2>/dev/null || true
    [ -n "$busy_pid" ] && kill "$busy_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

shared=../shared/data/imagenet-sample
mkdir -p "$work/images"
if [ -f "$shared/labels.tsv" ]; then
    head -197 "$shared/labels.tsv" > "$work/labels.tsv"
    tail -n +2 "$work/labels.tsv" | cut -f1 | while read -r f; do
        ln -s "$(realpath "$shared/$f")" "$work/images/$f"
    done
    labels=(--labels "$work/labels.tsv")
else
    echo "note: no $shared; 196 generated JPEGs instead" >&2
    "$SLUICE_BIN" synth --output "$work/gen" --classes 4 --per-class 49 >/dev/null
    rmdir "$work/images" && mv "$work/gen" "$work/images"
    labels=()
fi
"$SLUICE_BIN" shard --input "$work/images" "${labels[@]}" --output "$work/shards/s-%06d.tar" \
    --max-count 50 --manifest "$work/shards/manifest.json" >/dev/null
echo "gpu-host-cost-token-0123456789" > "$work/token"
samples=$(( 196 * epochs ))

# The floors now, µs per sample: sets floor_quic and floor_copy, from `bench host-cost`'s
# QUIC row ("floor T µs (kernel receive K + <impl> AES-256-GCM in N-byte packets D + copy C)":
# T is the sum: the kernel's copy out of the socket, decryption and the copy into a batch).
floors() {
    local row
    row=$("$SLUICE_BIN" bench host-cost --only quic --samples 1024 --repeat 1 --epochs 1 \
        | grep -m1 $'^host-cost\tquic') || { echo "bench host-cost printed no QUIC row" >&2; exit 1; }
    floor_quic=$(sed -E 's/.*floor ([0-9.]+) µs.*/\1/' <<< "$row")
    floor_copy=$(sed -E 's/.*\+ copy ([0-9.]+)\).*/\1/' <<< "$row")
}

# One run: a fresh worker, then loadgen timed by bash's `time` (its CPU alone).
run() {
    local bin=$1 transport=$2 mode=$3 state
    state=$(mktemp -d -p "$work")
    local same=(--no-same-host) client=()
    if [ "$transport" = same-host ]; then
        same=(--same-host-dir "$state/sock")
        client=(--same-host-dir "$state/sock")
    fi
    "$bin" cpu --listen 127.0.0.1:0 --threads 2 --state-dir "$state" --token-file "$work/token" \
        "${same[@]}" 2> "$state/cpu.log" &
    worker_pid=$!
    local addr metrics
    await_worker "$state/cpu.log"
    local TIMEFORMAT='%U %S %R' times
    times=$( { time "$bin" loadgen --dataset "$work/shards/manifest.json" --workers "$addr" \
        --trust-cert "$state/cert.pem" --token-file "$work/token" --ranks 1 --batch-size 32 \
        --epochs "$epochs" "${client[@]}" > "$state/loadgen.log" 2>&1 ; } 2>&1 )
    kill "$worker_pid" && wait "$worker_pid" 2>/dev/null || true
    worker_pid=
    grep -q "all ranks" "$state/loadgen.log" || { cat "$state/loadgen.log" >&2; exit 1; }
    read -r user sys wall <<< "$times"
    local floor=$floor_copy
    [ "$transport" = quic ] && floor=$floor_quic
    # loadgen's own reading after the first epoch (its start and first pages left out):
    # "after the first epoch: 17.2 µs CPU per sample (user 4.0, system 13.2), 0.01 page
    # faults and 0.45 context switches a sample".
    local later
    later=$(grep -o 'after the first epoch: .*' "$state/loadgen.log" \
        | sed -E 's/after the first epoch: ([0-9.]+) µs CPU per sample \(user ([0-9.]+), system ([0-9.]+)\), ([0-9.]+) page faults and ([0-9.]+) context switches.*/\1 \2 \3 \4 \5/' || true)
    [ -n "$later" ] || later="-"
    awk -v u="$user" -v s="$sys" -v w="$wall" -v n="$samples" -v t="$transport" -v m="$mode" \
        -v b="$(basename "$bin")" -v f="$floor" -v later="$later" \
        'BEGIN { us = (u + s) * 1e6 / n;
                 printf "outside\t%s\t%s\t%s\t%.1f µs/sample\t%.2fx the floor (%.1f µs)\t%.0f samples/s\t",
                        m, t, b, us, us / f, f, n / w;
                 if (split(later, l, " ") < 5) { print "after the first epoch: not reported (an older loadgen)"; exit }
                 printf "after the first epoch %.1f µs (%.2fx; user %.1f, system %.1f; %.2f page faults, %.2f context switches a sample)\n",
                        l[1], l[1] / f, l[2], l[3], l[4], l[5] }'
}

# The other core busy: a spinner on the last CPU for as long as the mode lasts.
busy_on() {
    local last
    last=$(( $(nproc) - 1 ))
    taskset -c "$last" yes > /dev/null &
    busy_pid=$!
}
busy_off() {
    [ -n "$busy_pid" ] && kill "$busy_pid" 2>/dev/null && wait "$busy_pid" 2>/dev/null || true
    busy_pid=
}

echo "host cost from outside: loadgen's CPU per sample, 1 rank, batch 32, $epochs epochs of 196 JPEGs, beside sluice cpu --threads 2"
for _ in $(seq "$rounds"); do
    for mode in "${loads[@]}"; do
        [ "$mode" = busy ] && busy_on
        floors
        echo "floors ($mode): copy $floor_copy µs, QUIC $floor_quic µs per sample"
        for transport in same-host quic; do
            for bin in "${bins[@]}"; do
                run "$bin" "$transport" "$mode"
            done
        done
        busy_off
    done
done
