#!/usr/bin/env bash
# Sluice across hosts (issue 17's test bed): every scenario of tests/cluster.rs, each daemon on
# a network namespace of its own with real faults, exactly-once checked from outside. Prints
# each scenario's figures and a last line `cluster: N scenarios, N passed, N failed`; exits
# non-zero on any failure. Needs root (the namespaces); each scenario cleans up after itself.
#
#   bash bench/cluster.sh
#
# Scenarios so far: storage node loss (SIGKILL and restart; a cut link), corruption (20 bit
# flips on a storage host; a sample rotten on both owners), worker churn (12 kills, one
# mid-drain, memory sampled), floods (1,000 slowloris connections, 20,000 garbage QUIC
# datagrams), lossy links (5% loss, 50 ms delay, 1% reordering; a 5 s blackhole; needs
# iptables, skipped without it), epoch boundaries over 50 ms links (each epoch started when
# asked, or the next one started early), and scaling (storage nodes with capped links; workers pinned
# to cores), and a pool that changes mid-epoch (tests/pool_membership.rs, its epoch 8 times
# CI's: workers capped at 400 millicores join at 30% and one is SIGKILLed at 60%; the
# thirds' throughput). CI runs the short version inside `cargo test --workspace`: node loss,
# corruption, churn and the pool; the rest are `#[ignore]`d benchmarks that this script
# includes.
set -euo pipefail
cd "$(dirname "$0")/.."
log="$(mktemp)"
set +e
# Bounded: the whole run is stopped after 15 minutes (each bed removes its namespaces when
# its test ends, pass or fail).
timeout 900 cargo test --release --locked --test cluster -- --include-ignored --nocapture \
    --test-threads 1 2>&1 | tee "$log" |
    grep -E '^(cluster |test |skipped)'
SLUICE_POOL_COPIES=8 timeout 600 cargo test --release --locked --test pool_membership -- \
    --nocapture 2>&1 | tee -a "$log" | grep -E '^(pool-membership |test |skipped)'
set -e
# The scenarios' own output interleaves with libtest's lines; its summary line does not.
passed=$(grep -oE 'test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | awk '{s += $4} END {print s + 0}')
failed=$(grep -oE 'test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' "$log" | awk '{s += $6} END {print s + 0}')
if ! grep -q 'test result:' "$log"; then
    failed=1 # it did not build or run
fi
echo "cluster: $((passed + failed)) scenarios, $passed passed, $failed failed"
rm -f "$log"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
