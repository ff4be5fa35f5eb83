#!/usr/bin/env bash
# The base image, made without a registry: a Debian 12 minbase root file system with Python,
# from this machine's own apt source (debootstrap), imported as BASE_IMAGE. Reused when it
# exists; `podman rmi BASE_IMAGE` to rebuild it. A machine that can pull images does not need
# this: build with `--build-arg BASE=docker.io/library/debian:bookworm-slim` instead.
set -euo pipefail

BASE_IMAGE=${BASE_IMAGE:-localhost/debian-bookworm-minbase:latest}
PODMAN=${PODMAN:-podman}

if $PODMAN image exists "$BASE_IMAGE"; then
    echo "base image $BASE_IMAGE: exists, reused"
    exit 0
fi

# The mirror this machine's apt uses (the first URIs: line of its Debian source), unless given.
if [[ -z ${DEBIAN_MIRROR:-} ]]; then
    for source in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list.d/*.sources; do
        [[ -f $source ]] || continue
        DEBIAN_MIRROR=$(awk '/^URIs:/ {print $2; exit}' "$source")
        [[ -n $DEBIAN_MIRROR ]] && break
    done
fi
if [[ -z ${DEBIAN_MIRROR:-} ]]; then
    DEBIAN_MIRROR=$(awk '$1 == "deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list \
                    2>/dev/null || true)
fi
: "${DEBIAN_MIRROR:?no Debian mirror found in /etc/apt: set DEBIAN_MIRROR=URI}"

work=$(mktemp -d "${TMPDIR:-/tmp}/queryserve-base.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
echo "base image $BASE_IMAGE: debootstrap bookworm from $DEBIAN_MIRROR"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "$DEBIAN_MIRROR" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log"; exit 1; }
# What an image does not need: apt's package lists and caches.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | $PODMAN import \
    --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$BASE_IMAGE" >/dev/null
echo "base image $BASE_IMAGE: imported"
