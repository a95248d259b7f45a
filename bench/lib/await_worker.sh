# Sourced by the bench scripts that start a `sluice cpu` of their own: where it listens, read
# from the line it logs once it serves.
#
#   await_worker LOG [metrics]
#
# Sets `addr` (its QUIC address) and `metrics` (its /metrics address, when it was started
# with --metrics-listen), waiting up to 30 s; with `metrics`, waits for both. Exits naming the
# log when the worker never says it serves.
await_worker() {
    local log=$1 want_metrics=${2:-}
    addr= metrics=
    for _ in $(seq 300); do
        addr=$(grep -om1 ' listen=[0-9.:]*' "$log" | cut -d= -f2 || true)
        metrics=$(grep -om1 'metrics=Some([0-9.:]*' "$log" | cut -d'(' -f2 || true)
        [ -n "$addr" ] && { [ -z "$want_metrics" ] || [ -n "$metrics" ]; } && return 0
        sleep 0.1
    done
    echo "sluice cpu did not start: $(cat "$log")" >&2
    exit 1
}
