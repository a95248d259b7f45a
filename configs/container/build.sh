#!/usr/bin/env bash
# Builds localhost/sluice:<version> from scratch (no base image is pulled): the release binary
# (stripped) and the shared libraries it links, run as uid 10001. Podman or buildah.
#
#   configs/container/build.sh              # builds target/release/sluice first if missing
#   SLUICE_BIN=path/to/sluice SLUICE_TAG=localhost/sluice:dev configs/container/build.sh
#
# Run the daemons with the host's network (QUIC wants its UDP buffers and path MTU):
#   podman run -d --network host -v /srv/sluice:/srv/sluice localhost/sluice:0.1.0 \
#       storage --data /srv/sluice --listen 0.0.0.0:7000
# On machines whose containers cannot set cgroups or rlimits (a container inside a VM
# sandbox), export CONTAINERS_CONF=configs/container/containers.conf first (runc, cgroupfs,
# no default ulimits); this script does so when `podman info` fails without it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)"
tag="${SLUICE_TAG:-localhost/sluice:$version}"
bin="${SLUICE_BIN:-$repo/target/release/sluice}"
if [ ! -x "$bin" ]; then
    (cd "$repo" && cargo build --release -p sluice)
fi
if command -v podman >/dev/null; then
    engine=podman
elif command -v buildah >/dev/null; then
    engine=buildah
else
    echo "build.sh: neither podman nor buildah is installed" >&2
    exit 2
fi
if [ -z "${CONTAINERS_CONF:-}" ] && ! podman info >/dev/null 2>&1; then
    export CONTAINERS_CONF="$here/containers.conf"
fi
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
root="$context/root"
mkdir -p "$root/usr/local/bin" "$root/etc" "$root/tmp"
chmod 1777 "$root/tmp"
strip -o "$root/usr/local/bin/sluice" "$bin" 2>/dev/null || cp "$bin" "$root/usr/local/bin/sluice"
# The libraries the binary links (libc, libm, libgcc_s, the loader), at their paths.
for lib in $(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
# The CA certificates, for shard URLs over https (and the HTTP client, which loads them).
for bundle in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
    if [ -f "$bundle" ]; then
        mkdir -p "$root/etc/ssl/certs"
        cp -L "$bundle" "$root/etc/ssl/certs/ca-certificates.crt"
        break
    fi
done
echo 'sluice:x:10001:10001:sluice:/tmp:/nonexistent' > "$root/etc/passwd"
echo 'sluice:x:10001:' > "$root/etc/group"
cp "$here/Containerfile" "$context/Containerfile"
if [ "$engine" = podman ]; then
    podman build --quiet --tag "$tag" --file "$context/Containerfile" "$context" >/dev/null
else
    buildah bud --quiet --tag "$tag" --file "$context/Containerfile" "$context" >/dev/null
fi
echo "$tag"
