#!/usr/bin/env bash
# Fair shares from outside, with each job's demand beside its share: one `sluice cpu
# --threads 1` and loadgen jobs over QUIC at weights 3 and 1 (default credits, batches of 16),
# then a third job of weight 1; the worker's /metrics read over WINDOW seconds gives each
# job's share of the samples sent (sluice_cpu_job_samples_total) and what it asked for
# meanwhile (sluice_cpu_job_units_{running,waiting,starved}, averaged over 10 reads): a job
# below its weight's share with no unit waiting for a slot asks for less than its share.
#
#   bash bench/fair_share.sh [WINDOW] [PLACEMENT]    # defaults: 8 s, shared
#
# PLACEMENT: `shared` runs the worker and the clients on every core (the clients compete
# with the worker, as on a GPU host), `apart` pins the worker to core 0 and the clients to
# the others (taskset). Data: 400 generated JPEGs in shards of 40, read as files. The binary
# is target/release/sluice (built if missing) or $SLUICE_BIN. Prints a line per job:
#   <phase> <job> weight <w> share <s> (of <n> samples) running <r> waiting <q> starved <c>
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib/await_worker.sh
window=${1:-8}
placement=${2:-shared}
if [ -z "${SLUICE_BIN:-}" ]; then
    [ -x target/release/sluice ] || cargo build --release --locked -p sluice >&2
    SLUICE_BIN=$PWD/target/release/sluice
fi
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

worker_cpus=() client_cpus=()
if [ "$placement" = apart ]; then
    last=$(( $(nproc) - 1 ))
    [ "$last" -ge 1 ] || { echo "apart needs 2 cores" >&2; exit 1; }
    worker_cpus=(taskset -c 0) client_cpus=(taskset -c "1-$last")
fi

"$SLUICE_BIN" synth --output "$work/images" --classes 4 --per-class 100 >/dev/null
"$SLUICE_BIN" shard --input "$work/images" --output "$work/shards/s-%06d.tar" --max-count 40 \
    --manifest "$work/shards/manifest.json" >/dev/null
echo "fair-share-bench-token-0123456789" > "$work/token"
"${worker_cpus[@]}" "$SLUICE_BIN" cpu --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --threads 1 --no-same-host --state-dir "$work/state" --token-file "$work/token" \
    2> "$work/cpu.log" &
pids+=($!)
await_worker "$work/cpu.log" metrics

# --no-share: jobs with the same data, pipeline and seed are a sweep and share decodes
# (bench/sweep.sh); these stand for different trainings.
job() {
    "${client_cpus[@]}" "$SLUICE_BIN" loadgen --dataset "$work/shards/manifest.json" \
        --workers "$addr" --trust-cert "$work/state/cert.pem" --token-file "$work/token" \
        --same-host off --batch-size 16 --epochs 100000 --job-name "$1" --job-weight "$2" \
        --no-share > /dev/null 2>&1 &
    pids+=($!)
}

# The value of one series ($1, e.g. 'sluice_cpu_job_weight{job="a"}') now.
value() {
    curl -s "http://$metrics/metrics" | awk -v s="$1" '$1 == s { print $2; found = 1 } END { if (!found) print 0 }'
}

# Shares and demand of jobs "$@" over the window.
measure() {
    local phase=$1; shift
    declare -A before run wait starve
    for j in "$@"; do
        before[$j]=$(value "sluice_cpu_job_samples_total{job=\"$j\"}")
        run[$j]=0 wait[$j]=0 starve[$j]=0
    done
    for _ in $(seq 10); do
        sleep "$(awk -v w="$window" 'BEGIN { print w / 10 }')"
        for j in "$@"; do
            run[$j]=$(awk -v a="${run[$j]}" -v b="$(value "sluice_cpu_job_units_running{job=\"$j\"}")" 'BEGIN { print a + b }')
            wait[$j]=$(awk -v a="${wait[$j]}" -v b="$(value "sluice_cpu_job_units_waiting{job=\"$j\"}")" 'BEGIN { print a + b }')
            starve[$j]=$(awk -v a="${starve[$j]}" -v b="$(value "sluice_cpu_job_units_starved{job=\"$j\"}")" 'BEGIN { print a + b }')
        done
    done
    local total=0 got
    declare -A delta
    for j in "$@"; do
        got=$(value "sluice_cpu_job_samples_total{job=\"$j\"}")
        delta[$j]=$(awk -v a="$got" -v b="${before[$j]}" 'BEGIN { print a - b }')
        total=$(awk -v t="$total" -v d="${delta[$j]}" 'BEGIN { print t + d }')
    done
    for j in "$@"; do
        awk -v p="$phase" -v j="$j" -v w="$(value "sluice_cpu_job_weight{job=\"$j\"}")" \
            -v d="${delta[$j]}" -v t="$total" -v r="${run[$j]}" -v q="${wait[$j]}" -v c="${starve[$j]}" \
            'BEGIN { printf "%s\t%s\tweight %s\tshare %.2f (of %d samples)\trunning %.1f\twaiting %.1f\tstarved %.1f\n", p, j, w, d / (t > 0 ? t : 1), t, r / 10, q / 10, c / 10 }'
    done
}

wait_for() {
    for _ in $(seq 300); do
        [ "$(value "sluice_cpu_job_weight{job=\"$1\"}")" != 0 ] && return
        sleep 0.1
    done
    echo "job $1 never opened" >&2; exit 1
}

echo "fair shares: sluice cpu --threads 1, loadgens over QUIC (batch 16, default credits), placement $placement, ${window}s windows"
job heavy 3; job light 1
wait_for heavy; wait_for light
sleep 2
measure "3:1" heavy light
job late 1
wait_for late
sleep 2
measure "3:1:1" heavy light late
