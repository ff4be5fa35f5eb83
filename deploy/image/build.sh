#!/usr/bin/env bash
# `make image`: the base image (made once, deploy/image/base.sh), then queryserve's image from
# deploy/image/Containerfile, with podman, no daemon and no registry. Run from the repository
# root after `make prepare`.
#
# This machine's quirks stay here, out of the image (empty either variable to drop its quirk):
#   QUERYSERVE_CONTAINERS_CONF  podman settings for hosts like CI's (runc, the host's ulimits):
#                               default deploy/image/containers.conf
#   QUERYSERVE_BUILD_CA         a CA bundle mounted over the build's own while pip runs, for a
#                               registry reached through a proxy with its own CA: default the
#                               host's bundle ($PIP_CERT, else /etc/ssl/certs/ca-certificates.crt)
set -euo pipefail
cd "$(dirname "$0")/../.."

IMAGE=${IMAGE:-localhost/queryserve:latest}
BASE_IMAGE=${BASE_IMAGE:-localhost/debian-bookworm-minbase:latest}
conf=${QUERYSERVE_CONTAINERS_CONF-deploy/image/containers.conf}
ca=${QUERYSERVE_BUILD_CA-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}

if [[ -n $conf ]]; then
    CONTAINERS_CONF=$(realpath "$conf")
    export CONTAINERS_CONF
fi
if [[ ! -f model_repository/embed/model.onnx ]]; then
    echo "model_repository/ is not prepared: run \`make prepare\` first" >&2
    exit 1
fi

started=$(date +%s)
BASE_IMAGE=$BASE_IMAGE deploy/image/base.sh

build=(podman build --pull=never --network host --file deploy/image/Containerfile
       --build-arg "BASE=$BASE_IMAGE" --tag "$IMAGE" --layers)
if [[ -n $ca && -f $ca ]]; then
    build+=(--volume "$(realpath "$ca"):/etc/ssl/certs/ca-certificates.crt:ro")
fi
"${build[@]}" .

size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "$IMAGE: $((size / 1000000)) MB, built in $(( $(date +%s) - started )) s"
