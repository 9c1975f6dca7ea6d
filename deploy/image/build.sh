#!/usr/bin/env bash
# Builds the broker's image where no registry answers (this project's CI machine): the base from Debian's own
# packages (mmdebstrap, as deploy/lease-image/build.sh does; bookworm's python3 is 3.11, the project's Python), the
# runtime wheels fetched into deploy/image/wheelhouse (pip inside a build cannot reach the index there: its
# network does not trust the certificates the host's does), then deploy/image/Dockerfile. Where registries
# answer, build with docker directly (docs/DEPLOY.md).
#
#   deploy/image/build.sh [IMAGE]        (default gpu-broker:local)
#
# Quick the second time: the base is named by the hash of what makes it, the wheels are kept under
# ~/.cache/gpu-broker by the hash of the dependency list, and Docker's layer cache reuses the installed packages
# while that list is unchanged; only the broker's own code is copied again.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
image=${1:-gpu-broker:local}
# One build at a time on this machine (CI starts one beside the tests, and the image test asks again): the
# second waits for the first and then finds every step already done.
lock_dir="${XDG_CACHE_HOME:-$HOME/.cache}/gpu-broker"
mkdir -p "$lock_dir"
exec 9>"$lock_dir/image-build.lock"
flock 9
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log="$work/build.log"

suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
packages=python3,python3-venv,ca-certificates
base="gpu-broker-python-base:$(printf '%s %s\n' "$suite" "$packages" | sha256sum | cut -c1-16)"
if ! docker image inspect "$base" >/dev/null 2>&1; then
  mmdebstrap --quiet --variant=minbase --include="$packages" "$suite" "$work/rootfs.tar"
  docker import "$work/rootfs.tar" "$base" >/dev/null
fi

# The runtime wheels, chosen by the Python that will run them (a marker such as python_full_version < "3.11.3"
# asks for more on Debian's 3.11 than on another): pip runs in a throwaway container of the base, on the host's
# network and with the host's certificate store, which is how the host itself reaches the index.
requirements=$(docker run --rm --network none -v "$root/pyproject.toml:/pyproject.toml:ro" "$base" python3 -c \
  "import platform, tomllib; print(platform.python_version()); print('\n'.join(tomllib.load(open('/pyproject.toml', 'rb'))['project']['dependencies']))")
cache="${XDG_CACHE_HOME:-$HOME/.cache}/gpu-broker/wheelhouse/$(printf '%s\n' "$requirements" | sha256sum | cut -c1-16)"
if [ ! -f "$cache/complete" ]; then
  rm -rf "$cache.partial" && mkdir -p "$cache.partial"
  printf '%s\n' "$requirements" | tail -n +2 >"$cache.partial/requirements.txt"
  docker run --rm --network host -v /etc/ssl/certs:/etc/ssl/certs:ro -v "$cache.partial:/wheels" "$base" sh -c \
    'python3 -m venv /opt/download && /opt/download/bin/pip download --quiet --disable-pip-version-check --only-binary=:all: --dest /wheels -r /wheels/requirements.txt' \
    >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
  touch "$cache.partial/complete"
  rm -rf "$cache" && mv "$cache.partial" "$cache"
fi
wheelhouse=deploy/image/wheelhouse
find "$wheelhouse" -name '*.whl' -delete
cp --link "$cache"/*.whl "$wheelhouse"/ 2>/dev/null || cp "$cache"/*.whl "$wheelhouse"/

previous=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
DOCKER_BUILDKIT=0 docker build --quiet --build-arg "BASE=$base" -f deploy/image/Dockerfile -t "$image" . \
  >/dev/null 2>"$log" || { cat "$log" >&2; exit 1; }
# The image this name had before goes (unless a container still uses it), so CI's rebuild after every change
# does not fill the disk; the stages' images stay, being the cache of the next build.
if [ -n "$previous" ] && [ "$previous" != "$(docker image inspect -f '{{.Id}}' "$image")" ]; then
  docker rmi "$previous" >/dev/null 2>&1 || true
fi
echo "built $image"
