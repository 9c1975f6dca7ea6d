#!/usr/bin/env bash
# Builds the lease image from Debian's own packages, with no registry: mmdebstrap makes a minimal root filesystem
# of the machine's own Debian release, `docker import` turns it into a base image, and the Dockerfile adds the
# lease's SSH configuration and first process. Does nothing when the image already carries the hash of this
# folder's files; the image's name is the first argument (default gpu-broker-lease:1).
set -euo pipefail
cd "$(dirname "$0")"
image=${1:-gpu-broker-lease:1}
inputs=$(cat build.sh Dockerfile sshd_config lease-init | sha256sum | cut -c1-16)
label='{{index .Config.Labels "gpu-broker.inputs"}}'
if [ "$(docker image inspect -f "$label" "$image" 2>/dev/null)" = "$inputs" ]; then
  exit 0
fi
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
base="gpu-broker-lease-base:$inputs"
if ! docker image inspect "$base" >/dev/null 2>&1; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mmdebstrap --quiet --variant=minbase --include=openssh-server,python3,curl,ca-certificates \
    "$suite" "$work/rootfs.tar"
  docker import "$work/rootfs.tar" "$base" >/dev/null
fi
DOCKER_BUILDKIT=0 docker build --quiet --label "gpu-broker.inputs=$inputs" --build-arg "BASE=$base" -t "$image" . \
  >/dev/null 2>"${TMPDIR:-/tmp}/gpu-broker-lease-build.log" \
  || { cat "${TMPDIR:-/tmp}/gpu-broker-lease-build.log" >&2; exit 1; }
echo "built $image"
