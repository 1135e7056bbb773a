#!/usr/bin/env bash
# Make a Debian bookworm base image with python3 + venv without pulling from a registry:
# debootstrap a root filesystem, then `docker import` it. Used where no image registry is
# reachable (see scripts/sam_local.sh); elsewhere the Dockerfile's default bases are used.
#
#   scripts/make_local_base.sh [IMAGE]      (default reflex-local-base:bookworm)
#
# The rootfs tarball is cached in ~/.cache/reflex-runtime/docker/, so a machine whose docker
# lost its images re-imports in seconds instead of bootstrapping again.
set -euo pipefail

IMAGE="${1:-reflex-local-base:bookworm}"
DOCKER="${DOCKER:-/usr/bin/docker}"
CACHE="${REFLEX_DOCKER_CACHE:-$HOME/.cache/reflex-runtime/docker}"
TARBALL="$CACHE/reflex-local-base-bookworm.tar"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

log() { echo "make_local_base: $*" >&2; }

if "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
    log "$IMAGE already present"
    exit 0
fi

# The recipe version is part of the cache key: change it when the rootfs contents change.
[ -f "$CA_BUNDLE" ] || { log "no CA bundle at $CA_BUNDLE: the image keeps Debian's"; CA_BUNDLE=/dev/null; }
RECIPE="bookworm-minbase-py3-v1 $(sha256sum "$CA_BUNDLE" | cut -c1-16)"
if [ -f "$TARBALL" ] && [ "$(cat "$TARBALL.recipe" 2>/dev/null)" = "$RECIPE" ]; then
    log "importing cached rootfs $TARBALL"
    "$DOCKER" import "$TARBALL" "$IMAGE" >/dev/null
    exit 0
fi

command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }

# The Debian mirror this machine already uses (deb822 or one-line sources).
MIRROR="$(grep -hoE '^URIs: *http[^ ]*debian/?$' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | sed 's/^URIs: *//')"
[ -n "$MIRROR" ] || MIRROR="$(grep -hoE '^deb +http[^ ]*debian/? +bookworm ' /etc/apt/sources.list 2>/dev/null | head -1 | awk '{print $2}')"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

mkdir -p "$CACHE"
ROOTFS="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
cleanup() {
    umount "$ROOTFS/proc" 2>/dev/null || true
    rm -rf "$ROOTFS"
}
trap cleanup EXIT

log "debootstrap bookworm from $MIRROR"
debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }

# The host's CA bundle goes in at the standard path so pip inside `docker build` trusts what
# this machine trusts (its route to PyPI may re-sign TLS).
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
mount -t proc proc "$ROOTFS/proc"
chroot "$ROOTFS" /bin/sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*' \
    >>"$CACHE/debootstrap.log" 2>&1 || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
umount "$ROOTFS/proc"
[ "$CA_BUNDLE" = /dev/null ] || cp "$CA_BUNDLE" "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
: >"$ROOTFS/etc/resolv.conf"

tar -C "$ROOTFS" -cf "$TARBALL.tmp" .
mv "$TARBALL.tmp" "$TARBALL"
echo "$RECIPE" >"$TARBALL.recipe"
"$DOCKER" import "$TARBALL" "$IMAGE" >/dev/null
log "made $IMAGE ($(du -h "$TARBALL" | cut -f1) rootfs)"
