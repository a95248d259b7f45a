#!/usr/bin/env bash
# Serves the same ~100 MB shard files from page cache with `sluice storage` and with nginx on
# loopback, fetches them with 1, 4 and 16 concurrent clients (curl), and prints GB/s for both,
# their ratio, the ratio to `cat` of the same files (the page-cache ceiling), and the CPU time
# charged to each server per GB served (user + system of its processes, from /proc). Read that
# last figure with care: on loopback the clients' TCP receive work runs in softirqs, charged to
# whichever task is on the CPU, so part of it lands on the server (inside its sendfile, or when a
# pacing timer fires while it runs). It shows how hard each server drives the kernel, not its
# user-space cost alone (sluice spent 0.2% of its profile samples in user space).
#
#   bash bench/storage_vs_nginx.sh            # uses /tmp/wds-big (the anchors' shards) or makes 8 x 100 MB files
#   ROUNDS=9 SLUICE_CONFIG=my.toml bash bench/storage_vs_nginx.sh   # more rounds; sluice with a config
#   CLIENTS="4" ROUNDS=15 bash bench/storage_vs_nginx.sh               # one concurrency only
#   SLUICE_B=/tmp/other/sluice CLIENTS=4 ROUNDS=15 bash bench/storage_vs_nginx.sh
#       # a second sluice build in the same rounds (an A/B of a change: effects of 1-2% are
#       # only visible side by side, rounds vary by more than that), reported against both
#
# Installs nginx and curl (and cmake and nasm, which the build of libjpeg-turbo needs) from
# Debian when missing (as root). Timed steps take `flock $LOCK`, like the anchors, so they
# never overlap other benchmarks.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
LOCK="${LOCK:-/tmp/cpu.lock}"
WORK="${WORK:-/tmp/sluice-storage-bench}"
ROUNDS="${ROUNDS:-5}"
CLIENTS="${CLIENTS:-1 4 16}"

command -v nginx >/dev/null && command -v curl >/dev/null && command -v cmake >/dev/null \
  && command -v nasm >/dev/null || {
  apt-get update -qq && apt-get install -y -qq nginx-light curl cmake nasm >/dev/null
}
cargo build --release --manifest-path "$ROOT/Cargo.toml" -q
SLUICE="$ROOT/target/release/sluice"

mkdir -p "$WORK/data/b"
if ls /tmp/wds-big/*.tar >/dev/null 2>&1; then
  for f in /tmp/wds-big/*.tar; do [ -f "$WORK/data/b/$(basename "$f")" ] || cp "$f" "$WORK/data/b/"; done
else
  for i in 0 1 2 3 4 5 6 7; do
    [ -f "$WORK/data/b/s$i.tar" ] || head -c 100000000 /dev/urandom > "$WORK/data/b/s$i.tar"
  done
fi
FILES=( $(cd "$WORK/data/b" && ls *.tar) )
BYTES=$(cat "$WORK/data/b/"*.tar | wc -c)
cat "$WORK/data/b/"*.tar > /dev/null   # warm the page cache

# nginx on a free port
NPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$WORK/nginx.conf" <<CONF
worker_processes auto;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on; tcp_nopush on;
  server { listen 127.0.0.1:$NPORT; location /v1/ { alias $WORK/data/; } }
}
CONF
nginx -c "$WORK/nginx.conf" -p "$WORK"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# start_sluice BINARY PORT LOG: sluice storage on the bench's data, with SLUICE_CONFIG if set
start_sluice() {
  if [ -n "${SLUICE_CONFIG:-}" ]; then   # a config of your own; its mountpath must be $WORK/data
    "$1" storage --config "$SLUICE_CONFIG" --listen "127.0.0.1:$2" 2>"$3" &
  else
    "$1" storage --data "$WORK/data" --listen "127.0.0.1:$2" 2>"$3" &
  fi
}
SPORT=$(free_port)
start_sluice "$SLUICE" "$SPORT" "$WORK/sluice.log"
SPID=$!
BPID=""
if [ -n "${SLUICE_B:-}" ]; then
  BPORT=$(free_port)
  start_sluice "$SLUICE_B" "$BPORT" "$WORK/sluice-b.log"
  BPID=$!
fi
trap 'kill $SPID $BPID 2>/dev/null; nginx -c "$WORK/nginx.conf" -p "$WORK" -s stop 2>/dev/null || true' EXIT
sleep 1
NPIDS=( $(pgrep -P "$(cat "$WORK/nginx.pid")") )   # nginx's workers, forked by now

# CPU clock ticks (user + system) used so far by the processes PIDS (all their threads).
ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
HZ=$(getconf CLK_TCK)
# one PORT CONCURRENCY PIDS... -> "GB/s server-CPU-ms-per-GB" of one round, each client
# fetching every file once
one() {
  local port=$1 c=$2 list t0 t1 k0 k1; shift 2
  list=$(for i in $(seq "$c"); do for f in "${FILES[@]}"; do echo "http://127.0.0.1:$port/v1/b/$f"; done; done)
  k0=$(ticks "$@"); t0=$(date +%s.%N)
  echo "$list" | flock "$LOCK" xargs -P "$c" -n 1 curl -s -o /dev/null --fail
  t1=$(date +%s.%N); k1=$(ticks "$@")
  python3 -c "print(f'{$BYTES*$c/($t1-$t0)/1e9:.3f} {($k1-$k0)*1000/$HZ/($BYTES*$c/1e9):.1f}')"
}
# median VALUES... (the lower middle one of an even count); ratio A B -> A/B to three places
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
ratio() { python3 -c "print(f'{$1/$2:.3f}')"; }
catrate() {
  local c=$1 t0 t1; t0=$(date +%s.%N)
  for i in $(seq "$c"); do cat "$WORK/data/b/"*.tar > /dev/null & done; wait
  t1=$(date +%s.%N)
  python3 -c "print(f'{$BYTES*$c/($t1-$t0)/1e9:.2f}')"
}

echo "# $(date -Is) $(nproc) cores; ${#FILES[@]} files, $((BYTES/1000000)) MB; GB/s = 1e9 B/s, median of $ROUNDS rounds"
printf 'clients\tsluice_GBps\tnginx_GBps\tsluice/nginx\tcat_GBps\tsluice/cat\tsluice_cpu_ms/GB\tnginx_cpu_ms/GB\n'
# Every round runs each server once, so drift in the machine's load hits all alike, and which
# goes first rotates too (this VM evicts page cache on its own, so the first server of a round
# may re-read pages the next then finds cached); a ratio is the median of the per-round ratios.
SERVERS=(s n); [ -n "$BPID" ] && SERVERS+=(b)
for c in $CLIENTS; do
  ss=(); ns=(); rs=(); sc=(); nc=(); bs=(); bc=(); brs=(); bss=()
  for r in $(seq "$ROUNDS"); do
    for j in $(seq 0 $(( ${#SERVERS[@]} - 1 ))); do
      case ${SERVERS[$(( (j + r) % ${#SERVERS[@]} ))]} in
        s) so=$(one "$SPORT" "$c" "$SPID") ;;
        n) no=$(one "$NPORT" "$c" "${NPIDS[@]}") ;;
        b) bo=$(one "$BPORT" "$c" "$BPID") ;;
      esac
    done
    s=${so% *}; n=${no% *}
    ss+=("$s"); ns+=("$n"); sc+=("${so#* }"); nc+=("${no#* }")
    rs+=("$(ratio "$s" "$n")")
    if [ -n "$BPID" ]; then
      b=${bo% *}; bs+=("$b"); bc+=("${bo#* }")
      brs+=("$(ratio "$b" "$n")"); bss+=("$(ratio "$b" "$s")")
    fi
  done
  s=$(median "${ss[@]}"); n=$(median "${ns[@]}")
  scpu=$(median "${sc[@]}"); ncpu=$(median "${nc[@]}")
  sn=$(median "${rs[@]}")
  k=$(flock "$LOCK" bash -c "$(declare -f catrate); WORK=$WORK BYTES=$BYTES catrate $c")
  printf '%s\t%.2f\t%.2f\t%.2f\t%s\t%.2f\t%s\t%s\n' "$c" "$s" "$n" "$sn" "$k" "$(python3 -c "print($s/$k)")" "$scpu" "$ncpu"
  echo "# $c clients, sluice/nginx per round: ${rs[*]}"
  if [ -n "$BPID" ]; then
    echo "# $c clients, SLUICE_B: $(median "${bs[@]}") GB/s, b/nginx $(median "${brs[@]}")," \
      "b/sluice $(median "${bss[@]}"), $(median "${bc[@]}") cpu ms/GB; b/sluice per round: ${bss[*]}"
  fi
done
