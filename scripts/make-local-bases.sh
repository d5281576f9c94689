#!/usr/bin/env bash
# Build the local base images that stand in for nvidia/cuda images where nothing can be pulled:
#   builder-local/debian:bookworm     debootstrap minbase, imported
#   builder-local/cuda:13.0-devel     + python3, build tools, nvcc 13.0 from PyPI wheels
#   builder-local/cuda:13.0-base      + python3, libcudart.so.13 only
# With --trixie also the same devel base on Debian 13 (GCC 14.2, Python 3.13), for builds that need GCC >= 13
# (vLLM >= 0.33: its CMake stops on bookworm's 12.2):
#   builder-local/debian:trixie, builder-local/cuda:13.0-devel-trixie
# An image that already exists is skipped unless --force is given.
#
# Usage: scripts/make-local-bases.sh [--force] [--trixie]
# Environment:
#   BUILDER_CA_BUNDLE   CA bundle for HTTPS to the package index, passed to builds as the BuildKit
#                       secret "ca" (default /etc/ssl/certs/ca-certificates.crt when present)
#   DEBIAN_MIRROR       default http://deb.debian.org/debian
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DOCKERFILES=$REPO/dockerfiles/local-bases
DEBIAN_IMAGE=builder-local/debian:bookworm
DEVEL_IMAGE=builder-local/cuda:13.0-devel
BASE_IMAGE=builder-local/cuda:13.0-base
TRIXIE_IMAGE=builder-local/debian:trixie
TRIXIE_DEVEL_IMAGE=builder-local/cuda:13.0-devel-trixie
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA=${BUILDER_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

force=0
trixie=0
for arg in "$@"; do
    case $arg in
        --force) force=1 ;;
        --trixie) trixie=1 ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "make-local-bases: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

die() { echo "make-local-bases: error: $*" >&2; exit 1; }
note() { echo "make-local-bases: $*" >&2; }

timeout 20 docker info >/dev/null 2>&1 || die "the Docker daemon does not answer; run scripts/setup-docker.sh"
docker buildx version >/dev/null 2>&1 || die "docker buildx is missing; run scripts/setup-docker.sh"

# One run at a time: parallel test sessions share the images.
{ exec 9>/run/lock/builder-local-bases.lock; } 2>/dev/null || exec 9>/tmp/builder-local-bases.lock
flock -w 1800 9 || die "another make-local-bases.sh held the lock for 30 minutes"

exists() { docker image inspect "$1" >/dev/null 2>&1; }
want() { ((force)) || ! exists "$1"; }

secret=()
if [[ -s $CA ]]; then
    secret=(--secret "id=ca,src=$CA")
fi

build() {  # build IMAGE DOCKERFILE [ARGS...]
    local image=$1 dockerfile=$2 start=$SECONDS out
    shift 2
    note "building $image"
    out=$(mktemp)
    if ! docker buildx build --progress=plain --load "${secret[@]}" \
            -t "$image" -f "$DOCKERFILES/$dockerfile" "$@" "$DOCKERFILES" >"$out" 2>&1; then
        tail -n 60 "$out" >&2
        rm -f "$out"
        die "building $image failed"
    fi
    rm -f "$out"
    note "built $image in $((SECONDS - start))s"
}

debian_base() {  # debian_base SUITE IMAGE: debootstrap minbase, imported
    local suite=$1 image=$2 start=$SECONDS rootfs log
    command -v debootstrap >/dev/null || die "debootstrap is missing; run scripts/setup-docker.sh"
    note "debootstrap $suite (minbase) from $MIRROR"
    rootfs=$(mktemp -d /var/tmp/builder-debian-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    log=$rootfs.log
    if ! debootstrap --variant=minbase "$suite" "$rootfs" "$MIRROR" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        rm -f "$log"
        die "debootstrap failed"
    fi
    rm -f "$log"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar --numeric-owner -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' \
        - "$image" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
    note "imported $image in $((SECONDS - start))s"
}

if want "$DEBIAN_IMAGE"; then
    debian_base bookworm "$DEBIAN_IMAGE"
fi

if want "$DEVEL_IMAGE"; then
    build "$DEVEL_IMAGE" cuda-devel.Dockerfile --build-arg "BASE=$DEBIAN_IMAGE"
fi

if want "$BASE_IMAGE"; then
    build "$BASE_IMAGE" cuda-base.Dockerfile --build-arg "BASE=$DEBIAN_IMAGE" --build-arg "DEVEL=$DEVEL_IMAGE"
fi

images=("$DEBIAN_IMAGE" "$DEVEL_IMAGE" "$BASE_IMAGE")
if ((trixie)); then
    if want "$TRIXIE_IMAGE"; then
        debian_base trixie "$TRIXIE_IMAGE"
    fi
    if want "$TRIXIE_DEVEL_IMAGE"; then
        build "$TRIXIE_DEVEL_IMAGE" cuda-devel.Dockerfile --build-arg "BASE=$TRIXIE_IMAGE"
    fi
    images+=("$TRIXIE_IMAGE" "$TRIXIE_DEVEL_IMAGE")
fi

for image in "${images[@]}"; do
    exists "$image" || die "$image is missing after the build"
    echo "$image"
done
