#!/usr/bin/env bash
# A registry on the loopback interface for a machine that has none: Debian's docker-registry (distribution 2.8),
# plain HTTP on 127.0.0.1 (Docker trusts 127.0.0.0/8 without TLS), storage under $BUILDER_REGISTRY_ROOT.
#
# Usage: scripts/local-registry.sh start [HOST:PORT]   start one there unless a registry already answers
#        scripts/local-registry.sh stop                stop the one this script started
# HOST must be 127.x.x.x or localhost (default 127.0.0.1:5000): this script never serves beyond this machine.
# Environment: BUILDER_REGISTRY_ROOT  where its data, config and log live (default .registry/ in the repository)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROOT=${BUILDER_REGISTRY_ROOT:-$REPO/.registry}
die() { echo "local-registry: error: $*" >&2; exit 1; }
answers() { # a registry's /v2/ answers 200 (open) or 401 (auth)
    local code
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$1/v2/" || true)
    [[ $code == 200 || $code == 401 ]]
}

cmd=${1:-start}
addr=${2:-127.0.0.1:5000}
case $cmd in
    start)
        host=${addr%:*}
        [[ $host == localhost || $host =~ ^127\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "$addr is not on the loopback interface"
        if answers "$addr"; then
            echo "local-registry: a registry already answers on $addr" >&2
            exit 0
        fi
        command -v docker-registry >/dev/null || die "docker-registry is not installed (scripts/setup-docker.sh installs it)"
        mkdir -p "$ROOT/data"
        printf '%s\n' "version: 0.1" "log:" "  level: warn" "storage:" "  filesystem:" \
            "    rootdirectory: $ROOT/data" "  delete:" "    enabled: true" "http:" "  addr: $addr" > "$ROOT/config.yml"
        setsid nohup docker-registry serve "$ROOT/config.yml" </dev/null >>"$ROOT/registry.log" 2>&1 &
        echo $! > "$ROOT/registry.pid"
        for _ in $(seq 1 60); do
            if answers "$addr"; then
                echo "local-registry: serving $addr (data: $ROOT/data, pid $(cat "$ROOT/registry.pid"))" >&2
                exit 0
            fi
            sleep 0.5
        done
        tail -n 20 "$ROOT/registry.log" >&2 || true
        die "docker-registry did not answer on $addr within 30 s"
        ;;
    stop)
        [[ -f $ROOT/registry.pid ]] || { echo "local-registry: none started here" >&2; exit 0; }
        pid=$(cat "$ROOT/registry.pid")
        if kill -0 "$pid" 2>/dev/null; then kill "$pid"; fi
        rm -f "$ROOT/registry.pid"
        echo "local-registry: stopped pid $pid" >&2
        ;;
    *) die "usage: $0 start [HOST:PORT] | stop" ;;
esac
