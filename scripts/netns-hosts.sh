#!/usr/bin/env bash
# Makes N "hosts" on this machine: network namespaces tch0..tch{N-1}, each with one veth link
# into a bridge, at 10.77.0.1 .. 10.77.0.N. Ranks in different namespaces talk TCP over the
# veths (the engine treats each namespace as its own host); ranks inside one share memory.
#
#   scripts/netns-hosts.sh up N      create (idempotent: tears down a previous set first)
#   scripts/netns-hosts.sh down      remove every namespace and the bridge
#   scripts/netns-hosts.sh exec I CMD...   run CMD in host I
# Needs root (CI runs as root) and iproute2.
set -euo pipefail

BR=tcbr0
down() {
    for ns in $(ip netns list 2>/dev/null | awk '/^tch[0-9]+/{print $1}'); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    ip link del "$BR" 2>/dev/null || true
}

up() {
    local n=$1
    down
    ip link add "$BR" type bridge
    ip link set "$BR" up
    for ((i = 0; i < n; i++)); do
        ip netns add "tch$i"
        ip link add "tcv$i" type veth peer name eth0 netns "tch$i"
        ip link set "tcv$i" master "$BR" up
        ip -n "tch$i" addr add "10.77.0.$((i + 1))/24" dev eth0
        ip -n "tch$i" link set eth0 up
        ip -n "tch$i" link set lo up
    done
    # The hosts must reach each other before anyone relies on it (bash's /dev/tcp needs no
    # extra tools: a refused connection proves the route works, a timeout does not).
    for ((i = 1; i < n; i++)); do
        local out
        out=$(ip netns exec tch0 timeout 3 bash -c "echo > /dev/tcp/10.77.0.$((i + 1))/9" 2>&1 || true)
        case "$out" in
            *"Connection refused"*) ;;
            *) echo "netns-hosts: host $i is not reachable from host 0: $out" >&2; exit 1 ;;
        esac
    done
}

case "${1:-}" in
    up) up "${2:?number of hosts}" ;;
    down) down ;;
    exec)
        i=${2:?host index}
        shift 2
        exec ip netns exec "tch$i" "$@"
        ;;
    *)
        echo "usage: $0 up N | down | exec I CMD..." >&2
        exit 2
        ;;
esac
