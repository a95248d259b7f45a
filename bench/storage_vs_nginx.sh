#!/usr/bin/env bash
# Serves the same ~100 MB shard files from page cache with `sluice storage` and with nginx on
# loopback, fetches them with 1, 4 and 16 concurrent clients (curl), and prints GB/s for both,
# their ratio, and the ratio to `cat` of the same files (the page-cache ceiling).
#
#   bash bench/storage_vs_nginx.sh            # uses /tmp/wds-big (the anchors' shards) or makes 8 x 100 MB files
#
# Installs nginx and curl from Debian when missing (as root). Timed steps take `flock $LOCK`,
# like the anchors, so they never overlap other benchmarks.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
LOCK="${LOCK:-/tmp/cpu.lock}"
WORK="${WORK:-/tmp/sluice-storage-bench}"
ROUNDS="${ROUNDS:-3}"

command -v nginx >/dev/null && command -v curl >/dev/null || {
  apt-get update -qq && apt-get install -y -qq nginx-light curl >/dev/null
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
SPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$SLUICE" storage --data "$WORK/data" --listen "127.0.0.1:$SPORT" 2>"$WORK/sluice.log" &
SPID=$!
trap 'kill $SPID 2>/dev/null; nginx -c "$WORK/nginx.conf" -p "$WORK" -s stop 2>/dev/null || true' EXIT
sleep 1

# fetch PORT CONCURRENCY -> GB/s (median of ROUNDS), each client fetching every file once
fetch() {
  local port=$1 c=$2 best=()
  for r in $(seq "$ROUNDS"); do
    local list; list=$(for i in $(seq "$c"); do for f in "${FILES[@]}"; do echo "http://127.0.0.1:$port/v1/b/$f"; done; done)
    local t0 t1; t0=$(date +%s.%N)
    echo "$list" | flock "$LOCK" xargs -P "$c" -n 1 curl -s -o /dev/null --fail
    t1=$(date +%s.%N)
    best+=( $(python3 -c "print(f'{$BYTES*$c/($t1-$t0)/1e9:.2f}')") )
  done
  printf '%s\n' "${best[@]}" | sort -n | sed -n "$(( (ROUNDS+1)/2 ))p"
}
catrate() {
  local c=$1 t0 t1; t0=$(date +%s.%N)
  for i in $(seq "$c"); do cat "$WORK/data/b/"*.tar > /dev/null & done; wait
  t1=$(date +%s.%N)
  python3 -c "print(f'{$BYTES*$c/($t1-$t0)/1e9:.2f}')"
}

echo "# $(date -Is) $(nproc) cores; ${#FILES[@]} files, $((BYTES/1000000)) MB; GB/s = 1e9 B/s, median of $ROUNDS"
printf 'clients\tsluice_GBps\tnginx_GBps\tsluice/nginx\tcat_GBps\tsluice/cat\n'
for c in 1 4 16; do
  s=$(fetch "$SPORT" "$c"); n=$(fetch "$NPORT" "$c"); k=$(flock "$LOCK" bash -c "$(declare -f catrate); WORK=$WORK BYTES=$BYTES catrate $c")
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$s" "$n" "$(python3 -c "print(f'{$s/$n:.2f}')")" "$k" "$(python3 -c "print(f'{$s/$k:.2f}')")"
done
