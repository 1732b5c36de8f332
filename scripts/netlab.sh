#!/usr/bin/env bash
# pgjet's network lab: two hosts joined by a wire with a real rate limit and a real round-trip
# time, built from network namespaces, veth pairs, tc tbf and a TUN delay line
# (pgjet-delayline; this kernel has no netem). See docs/netlab.md.
#
#   <p>a  (host A, the primary's)  lab0 198.18.<id>.2/30
#            |  veth
#   <p>w  (the wire)  wa 198.18.<id>.1/30   wb 198.18.<id>.5/30   dl0 (TUN: pgjet-delayline)
#            |  veth
#   <p>b  (host B, the destination)  lab0 198.18.<id>.6/30
#
# In the wire, `ip rule iif wa|wb lookup 100` sends every packet arriving from either host into
# dl0 (table 100 has only `default dev dl0`); the delay line holds it for RTT_MS/2 and writes it
# back into dl0, where the main table routes it out of the other veth. So each packet passes
# the delay line once per direction. tbf on the wire's egress toward each host (wa and wb)
# limits the rate in both directions, with a queue of about one bandwidth-delay product.
# 198.18.0.0/15 is the range reserved for network benchmarks (RFC 2544); the hosts only have a
# route to each other, none to anything else.
#
# Usage (as root; non-interactive):
#   RATE=1gbit RTT_MS=20 scripts/netlab.sh up PREFIX ID   # prints NETLAB_* lines (addresses)
#   scripts/netlab.sh down PREFIX                          # idempotent
#   scripts/netlab.sh show PREFIX                          # the NETLAB_* lines of a running lab
#
#   PREFIX  [a-z0-9_]{1,24}: namespaces are PREFIXa, PREFIXb, PREFIXw
#   ID      0..255: the third octet of the lab's addresses (keeps labs apart in listings)
# Env:
#   RATE        tc rate of the wire in each direction: 1gbit, 200mbit, 500kbit, ...; empty or
#               "unlimited" = unshaped (veth speed)
#   RTT_MS      round-trip time added by the wire, in ms (fractional allowed); 0 = no delay line
#   OFFLOAD     1 (default) = the delay line uses IFF_VNET_HDR + TUNSETOFFLOAD (TCP
#               super-packets up to 64 KiB: far less CPU at 1 Gbit/s); 0 = one packet per segment
#   QUEUE_MS    tbf queue length in ms at RATE (default: RTT_MS + 10, i.e. about one BDP)
#   BURST_MS    tbf bucket in ms at RATE (default 1; at least 66000 bytes in any case)
#   DL_NICE     nice value of the delay line (default -10: it is small and timing-critical; at
#               nice 0, three busy processes on this 2-core VM add up to 4 ms to a 20 ms RTT)
#   DELAYLINE   path of the pgjet-delayline binary (default: target/release/pgjet-delayline
#               next to this script, then $PATH)
#   NETLAB_RUN  state directory root (default /run/pgjet-netlab): <root>/PREFIX holds the
#               delay line's pid file, log, and the NETLAB_* lines
set -euo pipefail

NETLAB_RUN=${NETLAB_RUN:-/run/pgjet-netlab}
# TCP buffer limits set inside the two hosts (per-namespace sysctls): the autotuning maximum
# must exceed the bandwidth-delay product (1 Gbit/s x 50 ms = 6.25 MB) plus the queue.
TCP_BUF_MAX=33554432

die() { echo "netlab.sh: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }

check_prefix() {
    [[ "${1:-}" =~ ^[a-z0-9_]{1,24}$ ]] || die "PREFIX '${1:-}' must match [a-z0-9_]{1,24}"
}

# rate_bytes RATE -> bytes per second (integer), using tc's units (bit, kbit, mbit, gbit).
rate_bytes() {
    local r=${1,,}
    [[ "$r" =~ ^([0-9]+([.][0-9]+)?)(bit|kbit|mbit|gbit|tbit)$ ]] \
        || die "RATE '$1' must look like 200mbit, 1gbit, 1.5gbit or 500kbit"
    local n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[3]} mul
    case $unit in
        bit) mul=1 ;; kbit) mul=1000 ;; mbit) mul=1000000 ;; gbit) mul=1000000000 ;;
        tbit) mul=1000000000000 ;;
    esac
    awk -v n="$n" -v m="$mul" 'BEGIN { printf "%d\n", n * m / 8 }'
}

ns_exec() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

find_delayline() {
    if [ -n "${DELAYLINE:-}" ]; then
        [ -x "$DELAYLINE" ] || die "DELAYLINE=$DELAYLINE is not an executable file"
        echo "$DELAYLINE"; return
    fi
    local here; here=$(cd "$(dirname "$0")" && pwd)
    local c
    for c in "${CARGO_TARGET_DIR:-$here/../target}/release/pgjet-delayline" \
             "$here/../target/release/pgjet-delayline"; do
        [ -x "$c" ] && { echo "$c"; return; }
    done
    command -v pgjet-delayline >/dev/null 2>&1 && { command -v pgjet-delayline; return; }
    die "pgjet-delayline not found: cargo build --release --bin pgjet-delayline, or set DELAYLINE"
}

# Kills PID (SIGTERM, then SIGKILL after 3 s) if it is still the process we started (its
# command line names pgjet-delayline).
stop_delayline() {
    local pidfile=$1 pid
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile" 2>/dev/null || true)
    [[ "$pid" =~ ^[0-9]+$ ]] || { rm -f "$pidfile"; return 0; }
    if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q pgjet-delayline; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 30); do
            [ -d "/proc/$pid" ] || break
            sleep 0.1
        done
        if [ -d "/proc/$pid" ]; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$pidfile"
    # Its counters (packets delayed, dropped), printed when it stopped.
    [ -s "$(dirname "$pidfile")/delayline.log" ] && sed 's/^/netlab.sh: /' "$(dirname "$pidfile")/delayline.log" >&2
    return 0
}

cmd_down() {
    local p=$1
    check_prefix "$p"
    local dir="$NETLAB_RUN/$p"
    stop_delayline "$dir/delayline.pid"
    local ns pid
    for ns in "${p}a" "${p}b" "${p}w"; do
        [ -e "/run/netns/$ns" ] || continue
        # Safety net: whatever a test left running inside the lab's own namespaces is stopped
        # by PID, or the namespace would outlive its name.
        for pid in $(ip netns pids "$ns" 2>/dev/null || true); do
            kill -TERM "$pid" 2>/dev/null || true
        done
        for _ in $(seq 1 20); do
            [ -z "$(ip netns pids "$ns" 2>/dev/null || true)" ] && break
            sleep 0.1
        done
        for pid in $(ip netns pids "$ns" 2>/dev/null || true); do
            kill -KILL "$pid" 2>/dev/null || true
        done
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$dir"
}

cmd_show() {
    local p=$1
    check_prefix "$p"
    [ -f "$NETLAB_RUN/$p/env" ] || die "no lab '$p' (no $NETLAB_RUN/$p/env)"
    cat "$NETLAB_RUN/$p/env"
}

cmd_up() {
    local p=$1 id=$2
    check_prefix "$p"
    [[ "$id" =~ ^[0-9]{1,3}$ ]] && [ "$id" -le 255 ] || die "ID '$id' must be 0..255"
    [ "$(id -u)" -eq 0 ] || die "run as root (network namespaces, veth, tc, TUN)"
    local rate=${RATE:-} rtt=${RTT_MS:-0} offload=${OFFLOAD:-1}
    [ "${rate,,}" = unlimited ] && rate=
    [[ "$rtt" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "RTT_MS '$rtt' must be a number of ms >= 0"
    [[ "$offload" =~ ^[01]$ ]] || die "OFFLOAD must be 0 or 1"
    local rbytes=0
    [ -n "$rate" ] && rbytes=$(rate_bytes "$rate")
    local delay_on; delay_on=$(awk -v r="$rtt" 'BEGIN { print (r > 0) ? 1 : 0 }')
    local dl=""
    [ "$delay_on" = 1 ] && dl=$(find_delayline)

    local A="${p}a" B="${p}b" W="${p}w" dir="$NETLAB_RUN/$p"
    local ns
    for ns in "$A" "$B" "$W"; do
        [ -e "/run/netns/$ns" ] && die "namespace $ns exists: run 'netlab.sh down $p' first"
    done
    mkdir -p "$dir"
    # From here on, a failure removes whatever was made.
    trap 'rc=$?; echo "netlab.sh: up failed (exit $rc), removing lab $p" >&2; cmd_down "$p"; exit $rc' ERR

    local net="198.18.$id"
    local W_A="$net.1" A_ADDR="$net.2" W_B="$net.5" B_ADDR="$net.6"

    for ns in "$A" "$B" "$W"; do
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        # IPv6 off: no router solicitations or MLD reports wandering through the delay line.
        ns_exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    done
    ip link add lab0 netns "$A" type veth peer name wa netns "$W"
    ip link add lab0 netns "$B" type veth peer name wb netns "$W"

    ip -n "$A" addr add "$A_ADDR/30" dev lab0
    ip -n "$B" addr add "$B_ADDR/30" dev lab0
    ip -n "$W" addr add "$W_A/30" dev wa
    ip -n "$W" addr add "$W_B/30" dev wb
    for ns in "$A" "$B"; do ip -n "$ns" link set lab0 up; done
    ip -n "$W" link set wa up
    ip -n "$W" link set wb up
    # Each host reaches the other host's /30 through the wire, and nothing else.
    ip -n "$A" route add "$net.4/30" via "$W_A" dev lab0
    ip -n "$B" route add "$net.0/30" via "$W_B" dev lab0

    # The wire forwards; rp_filter off (a packet re-injected from dl0 carries a source that is
    # routed via wa or wb, which strict or loose reverse-path filtering would drop).
    ns_exec "$W" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 \
        net.ipv4.conf.default.rp_filter=0 net.ipv4.conf.all.send_redirects=0 \
        net.ipv4.conf.default.send_redirects=0 net.ipv4.conf.wa.rp_filter=0 net.ipv4.conf.wb.rp_filter=0
    # The hosts: TCP autotuning may grow past the bandwidth-delay product.
    for ns in "$A" "$B"; do
        ns_exec "$ns" sysctl -qw "net.ipv4.tcp_rmem=4096 131072 $TCP_BUF_MAX" \
            "net.ipv4.tcp_wmem=4096 16384 $TCP_BUF_MAX" net.ipv4.tcp_no_metrics_save=1
    done

    local one_way="0" dl_pid=""
    if [ "$delay_on" = 1 ]; then
        one_way=$(awk -v r="$rtt" 'BEGIN { printf "%.6g\n", r / 2 }')
        # Queue bound of the delay line: what it holds in both directions at 10 Gbit/s (veth
        # speed, when unshaped) for the one-way delay, at least 16 MiB, at most 1 GiB.
        local dl_limit
        dl_limit=$(awk -v d="$one_way" 'BEGIN { b = 1.25e9 * d / 1000 * 2; if (b < 16777216) b = 16777216;
                                              if (b > 1073741824) b = 1073741824; printf "%d\n", b }')
        local args=(--dev dl0 --delay-ms "$one_way" --limit-bytes "$dl_limit" --pid-file "$dir/delayline.pid")
        [ "$offload" = 1 ] && args+=(--offload)
        rm -f "$dir/delayline.pid"
        # setsid: its own session, so no terminal signal of the caller reaches it; stopped by
        # PID on down. ip netns exec, nice and setsid exec, so $! is the delay line's PID (it
        # also writes its own PID to the pid file).
        local nice_v=${DL_NICE:--10}
        [[ "$nice_v" =~ ^-?[0-9]+$ ]] || die "DL_NICE '$nice_v' must be an integer"
        ip netns exec "$W" nice -n "$nice_v" setsid "$dl" "${args[@]}" </dev/null >"$dir/delayline.log" 2>&1 &
        dl_pid=$!
        # The pid file is written once the device exists and is up.
        local ok=0
        for _ in $(seq 1 100); do
            if [ -s "$dir/delayline.pid" ]; then ok=1; break; fi
            kill -0 "$dl_pid" 2>/dev/null || break
            sleep 0.05
        done
        if [ "$ok" != 1 ]; then
            echo "$dl_pid" >"$dir/delayline.pid"
            cat "$dir/delayline.log" >&2 || true
            false # -> ERR trap
        fi
        dl_pid=$(cat "$dir/delayline.pid")
        # Room for bursts between two reads of the delay line (the tun driver drops when full).
        ip -n "$W" link set dl0 txqueuelen 10000
        ns_exec "$W" sysctl -qw net.ipv4.conf.dl0.rp_filter=0
        ip -n "$W" route add default dev dl0 table 100
        ip -n "$W" rule add iif wa lookup 100 pref 100
        ip -n "$W" rule add iif wb lookup 100 pref 101
    fi

    if [ -n "$rate" ]; then
        local queue_ms=${QUEUE_MS:-}
        [ -z "$queue_ms" ] && queue_ms=$(awk -v r="$rtt" 'BEGIN { print r + 10 }')
        # burst: BURST_MS at the rate, at least 64 KiB + a header (so a 64 KiB GSO packet passes
        # whole); limit: QUEUE_MS of the rate (about one BDP), at least 256 KiB.
        local burst limit burst_ms=${BURST_MS:-1}
        [[ "$burst_ms" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "BURST_MS '$burst_ms' must be a number of ms"
        burst=$(awk -v b="$rbytes" -v m="$burst_ms" 'BEGIN { x = b * m / 1000; if (x < 66000) x = 66000; printf "%d\n", x }')
        limit=$(awk -v b="$rbytes" -v q="$queue_ms" 'BEGIN { x = b * q / 1000; if (x < 262144) x = 262144; printf "%d\n", x }')
        for dev in wa wb; do
            tc -n "$W" qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" limit "$limit"
        done
    fi

    local lines
    lines=$(cat <<EOF
NETLAB_PREFIX=$p
NETLAB_ID=$id
NETLAB_NS_A=$A
NETLAB_NS_B=$B
NETLAB_NS_WIRE=$W
NETLAB_IF=lab0
NETLAB_ADDR_A=$A_ADDR
NETLAB_ADDR_B=$B_ADDR
NETLAB_WIRE_ADDR_A=$W_A
NETLAB_WIRE_ADDR_B=$W_B
NETLAB_RATE=${rate:-unlimited}
NETLAB_RTT_MS=$rtt
NETLAB_ONE_WAY_MS=$one_way
NETLAB_OFFLOAD=$offload
NETLAB_DELAYLINE_PID=$dl_pid
EOF
)
    echo "$lines" >"$dir/env"
    echo "$lines"
    trap - ERR
}

[ $# -ge 1 ] || usage
case $1 in
    up)   [ $# -eq 3 ] || usage; cmd_up "$2" "$3" ;;
    down) [ $# -eq 2 ] || usage; cmd_down "$2" ;;
    show) [ $# -eq 2 ] || usage; cmd_show "$2" ;;
    -h|--help|help) usage ;;
    *) usage ;;
esac
