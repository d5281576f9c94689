#!/usr/bin/env bash
# Install and start a Docker engine with a modern BuildKit on Debian 12 (bookworm).
#
# Bookworm's docker.io (20.10) has no buildx and a BuildKit without SOURCE_DATE_EPOCH /
# rewrite-timestamp, so this script:
#   * installs bookworm's docker.io (for runc, iptables and the other dependencies) plus
#     skopeo, docker-registry, debootstrap, apache2-utils and bubblewrap (scripts/farm's build servers);
#   * downloads trixie's docker.io, docker-buildx and containerd (and docker-cli, used only when
#     no Docker CLI 23+ is on PATH) (trixie is added for those
#     commands only, from its own sources folder) and unpacks them under $BUILDER_DOCKER_PREFIX;
#   * starts trixie's dockerd in the background with the containerd image store
#     (containerd-snapshotter), which OCI exports with rewrite-timestamp need;
#   * installs buildx as a Docker CLI plugin.
#
# Idempotent: when a daemon already answers and buildx works, it only prints the versions.
# Environment:
#   BUILDER_DOCKER_PREFIX   where trixie's engine is unpacked   (default /opt/builder-docker)
#   BUILDER_DOCKERD_LOG     dockerd's log file                  (default /var/log/builder-dockerd.log)
#   BUILDER_DOCKER_TIMEOUT  seconds to wait for the daemon      (default 90)
set -euo pipefail

PREFIX=${BUILDER_DOCKER_PREFIX:-/opt/builder-docker}
LOG=${BUILDER_DOCKERD_LOG:-/var/log/builder-dockerd.log}
TIMEOUT=${BUILDER_DOCKER_TIMEOUT:-90}
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins
APT_PACKAGES=(docker.io skopeo docker-registry debootstrap apache2-utils bubblewrap)
TRIXIE_PACKAGES=(docker.io docker-cli docker-buildx containerd)
DAEMON_BINARIES=(dockerd docker-proxy containerd containerd-shim-runc-v2 ctr)

die() { echo "setup-docker: error: $*" >&2; exit 1; }
note() { echo "setup-docker: $*" >&2; }
# Run a command with its output kept aside; show the output only when it fails.
quietly() {
    local out rc=0
    out=$(mktemp)
    "$@" >"$out" 2>&1 || rc=$?
    if ((rc)); then
        cat "$out" >&2
        rm -f "$out"
        die "failed ($rc): $*"
    fi
    rm -f "$out"
}

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "must run as root (or with sudo available)"
    SUDO=(sudo)
fi

dockerd_running() {
    local pid
    pid=$(cat /var/run/docker.pid 2>/dev/null) && [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}
daemon_ok() { timeout 20 docker info >/dev/null 2>&1; }
buildx_ok() { timeout 20 docker buildx version >/dev/null 2>&1; }

print_versions() {
    local client server buildx buildkit
    client=$(docker version --format '{{.Client.Version}}' 2>/dev/null || echo '?')
    server=$(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?')
    buildx=$(docker buildx version 2>/dev/null | awk '{print $2}')
    buildkit=$(timeout 60 docker buildx inspect --bootstrap 2>/dev/null \
        | awk -F': *' '/^BuildKit version/ {print $2; exit}')
    # Distribution builds of dockerd (Debian's included) report BuildKit as v0.0.0+unknown: the
    # BuildKit they vendor is the one of their engine release (26.x: BuildKit 0.13).
    [[ $buildkit == *unknown* ]] && buildkit="$buildkit (vendored by dockerd $server)"
    echo "docker client ${client}, server ${server}; buildx ${buildx:-?}; BuildKit ${buildkit:-?}"
}

apt_missing() {
    local p
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
    done
}

# Fast path: nothing to do (a package added to APT_PACKAGES since the last run is installed below).
if command -v docker >/dev/null && daemon_ok && buildx_ok && [[ -z $(apt_missing) ]]; then
    print_versions
    exit 0
fi

# One setup at a time (several test runs may start at once).
{ exec 9>/run/lock/builder-setup-docker.lock; } 2>/dev/null || exec 9>/tmp/builder-setup-docker.lock
flock -w 900 9 || die "another setup-docker.sh holds the lock for 15 minutes"
if command -v docker >/dev/null && daemon_ok && buildx_ok && [[ -z $(apt_missing) ]]; then
    print_versions
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
APT_QUIET=(-qq -o Dpkg::Use-Pty=0 -o APT::Color=0)

# --- 1. bookworm packages -------------------------------------------------------------------
mapfile -t missing < <(apt_missing)
if ((${#missing[@]})); then
    note "installing ${missing[*]} (bookworm)"
    # Keep the packages' init scripts from starting bookworm's dockerd or a registry on :5000.
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$policy" >/dev/null
        "${SUDO[@]}" chmod 755 "$policy"
        own_policy=1
    fi
    trap '[[ $own_policy == 1 ]] && "${SUDO[@]}" rm -f "$policy"' EXIT
    quietly "${SUDO[@]}" apt-get "${APT_QUIET[@]}" update
    quietly "${SUDO[@]}" apt-get "${APT_QUIET[@]}" install -y --no-install-recommends \
        "${missing[@]}" ca-certificates xz-utils
    if [[ $own_policy == 1 ]]; then "${SUDO[@]}" rm -f "$policy"; fi
    trap - EXIT
fi

# --- 2. trixie engine, unpacked under $PREFIX -----------------------------------------------
root=$PREFIX/root
if [[ ! -x $root/usr/sbin/dockerd || ! -x $root/usr/libexec/docker/cli-plugins/docker-buildx \
      || ! -x $root/usr/bin/containerd || ! -x $root/usr/bin/docker ]]; then
    note "downloading ${TRIXIE_PACKAGES[*]} (trixie) into $PREFIX"
    apt_dir=$PREFIX/apt
    "${SUDO[@]}" mkdir -p "$apt_dir/sources.list.d" "$apt_dir/lists/partial" "$apt_dir/debs"
    "${SUDO[@]}" tee "$apt_dir/sources.list.d/trixie.sources" >/dev/null <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    trixie_apt=(-oDir::Etc::SourceList=/dev/null -oDir::Etc::SourceParts="$apt_dir/sources.list.d"
                -oDir::State::Lists="$apt_dir/lists" -oDir::Cache::pkgcache=
                -oDir::Cache::srcpkgcache= -oAPT::Sandbox::User=root "${APT_QUIET[@]}")
    quietly "${SUDO[@]}" apt-get "${trixie_apt[@]}" update
    "${SUDO[@]}" rm -f "$apt_dir"/debs/*.deb
    (cd "$apt_dir/debs" && quietly "${SUDO[@]}" apt-get "${trixie_apt[@]}" download "${TRIXIE_PACKAGES[@]}")
    "${SUDO[@]}" rm -rf "$root.new"
    "${SUDO[@]}" mkdir -p "$root.new"
    for deb in "$apt_dir"/debs/*.deb; do
        "${SUDO[@]}" dpkg -x "$deb" "$root.new"
    done
    "${SUDO[@]}" rm -rf "$root"
    "${SUDO[@]}" mv "$root.new" "$root"
fi

# The daemon's PATH: trixie's engine first, then the system (bookworm's runc, iptables, tini).
"${SUDO[@]}" mkdir -p "$PREFIX/bin"
for b in "${DAEMON_BINARIES[@]}"; do
    src=""
    for d in usr/sbin usr/bin; do
        [[ -x $root/$d/$b ]] && { src=$root/$d/$b; break; }
    done
    [[ -n $src ]] || die "trixie packages have no $b"
    "${SUDO[@]}" ln -sfn "$src" "$PREFIX/bin/$b"
done

# buildx as a CLI plugin.
"${SUDO[@]}" mkdir -p "$PLUGIN_DIR"
if ! cmp -s "$root/usr/libexec/docker/cli-plugins/docker-buildx" "$PLUGIN_DIR/docker-buildx"; then
    "${SUDO[@]}" install -m 755 "$root/usr/libexec/docker/cli-plugins/docker-buildx" "$PLUGIN_DIR/docker-buildx"
fi

# The docker client: keep an existing modern one (e.g. /usr/local/bin/docker 28.x, which negotiates
# the API down to the daemon); otherwise use trixie's (bookworm's 20.10 client is too old).
client_major=$(docker version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1 || true)
if [[ ! $client_major =~ ^[0-9]+$ ]] || ((client_major < 23)); then
    note "using trixie's docker client as /usr/local/bin/docker"
    "${SUDO[@]}" ln -sfn "$root/usr/bin/docker" /usr/local/bin/docker
    hash -r
fi

# --- 3. daemon --------------------------------------------------------------------------------
config=$PREFIX/daemon.json
want='{"features": {"containerd-snapshotter": true}}'
if [[ ! -f $config || $(cat "$config") != "$want" ]]; then
    echo "$want" | "${SUDO[@]}" tee "$config" >/dev/null
fi

if ! daemon_ok; then
    if dockerd_running; then
        note "a dockerd is running but does not answer yet; waiting for it"
    else
        note "starting dockerd (log: $LOG)"
        "${SUDO[@]}" mkdir -p "$(dirname "$LOG")"
        "${SUDO[@]}" env PATH="$PREFIX/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
            setsid nohup dockerd --config-file "$config" </dev/null >>"$LOG" 2>&1 &
        disown || true
    fi
    deadline=$((SECONDS + TIMEOUT))
    until daemon_ok; do
        if ((SECONDS >= deadline)); then
            echo "setup-docker: error: dockerd did not answer 'docker info' within ${TIMEOUT}s." >&2
            echo "setup-docker: last lines of $LOG:" >&2
            tail -n 30 "$LOG" >&2 || true
            exit 1
        fi
        sleep 1
    done
fi

buildx_ok || die "'docker buildx version' fails; is $PLUGIN_DIR/docker-buildx installed and executable?"
server_major=$(docker version --format '{{.Server.Version}}' 2>/dev/null | cut -d. -f1 || true)
if [[ $server_major =~ ^[0-9]+$ ]] && ((server_major < 26)); then
    note "warning: the running dockerd is $server_major.x, older than 26 (no BuildKit 0.13: reproducible"
    note "OCI exports fail); stop it (e.g. systemctl stop docker docker.socket) and run this script again"
fi
print_versions
