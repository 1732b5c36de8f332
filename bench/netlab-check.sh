#!/usr/bin/env bash
# Is the network lab faithful? For each setting, builds a lab (scripts/netlab.sh), measures
#   - the ping RTT from B to A on the idle link (median of PINGS pings),
#   - iperf3 TCP throughput A -> B (the replica direction; client in B with -R), one stream
#     and 4 streams (-P 4), IPERF_S seconds each after IPERF_OMIT s of warm-up left out,
#   - the delay line's CPU use over the iperf3 runs (utime + stime from /proc/PID/stat),
# and says whether each is within TOL_PCT % of what was set. Throughput is compared with the
# TCP goodput the rate allows: tbf counts each frame with its 14-byte Ethernet header, so a
# 1514-byte frame carries 1448 bytes of payload (MSS 1460 less the 12-byte timestamp option):
# goodput ceiling = RATE x 1448 / 1514 (95.6 %). The ratio to the raw rate is printed too.
#
# Usage: bash bench/netlab-check.sh            (as root; about 3 minutes)
# Env:   PINGS (20), IPERF_S (10), IPERF_OMIT (2), TOL_PCT (5), LAB_ID (200..203 used),
#        SKIP_NO_OFFLOAD=1 to skip the OFFLOAD=0 comparison run,
#        SETTINGS ("1gbit/20 200mbit/50 -/0"): the RATE/RTT_MS settings checked, "-" for an
#          unshaped link (the smoke checks one),
#        IPERF_NICE (-10): iperf3 runs at this nice value, like the delay line, so that the
#          figures measure the lab rather than whoever else compiles on the machine,
#        QUIET_WAIT_S (300): before each setting, wait up to this long for a quiet machine
#          (less than QUIET_PCT (25) % of one core busy over 3 s); the load before and after
#          each setting is reported (a shared machine: others' builds take CPU from the lab)
# Output: a Markdown table on stdout (also written to REPORT, default
#         bench/results/netlab-<UTC time>.md).
set -euo pipefail
cd "$(dirname "$0")/.."

PINGS=${PINGS:-20}
IPERF_S=${IPERF_S:-10}
IPERF_OMIT=${IPERF_OMIT:-2}
TOL_PCT=${TOL_PCT:-5}
LAB_ID=${LAB_ID:-200}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}

[ "$(id -u)" -eq 0 ] || { echo "netlab-check.sh: run as root" >&2; exit 1; }
for t in iperf3 ping ip tc python3; do
    command -v "$t" >/dev/null || { echo "netlab-check.sh: $t missing (bash scripts/install-deps.sh)" >&2; exit 1; }
done
export PATH="${HOME:-/root}/.cargo/bin:$PATH"
cargo build -q --release --bin pgjet-delayline
export DELAYLINE=$CARGO_TARGET_DIR/release/pgjet-delayline

TCK=$(getconf CLK_TCK)
IPERF_NICE=${IPERF_NICE:--10}
QUIET_WAIT_S=${QUIET_WAIT_S:-300}
QUIET_PCT=${QUIET_PCT:-25}
RESULT=${REPORT:-bench/results/netlab-$(date -u +%Y%m%dT%H%MZ).md}
mkdir -p "$(dirname "$RESULT")"
PREFIX="nlchk$$"
IPERF_PID=""
cleanup() {
    if [ -n "$IPERF_PID" ]; then kill "$IPERF_PID" 2>/dev/null || true; wait "$IPERF_PID" 2>/dev/null || true; fi
    IPERF_PID=""
    bash scripts/netlab.sh down "$PREFIX" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# busy and total jiffies of the whole machine (first line of /proc/stat)
machine_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit }' /proc/stat; }

cpu_ticks() { # utime + stime of PID in clock ticks (fields 14, 15 of /proc/PID/stat)
    [ -n "$1" ] && [ -r "/proc/$1/stat" ] && awk '{ print $14 + $15 }' "/proc/$1/stat" || echo 0
}

# iperf3 JSON -> "received_bits_per_second retransmits"
iperf_parse() {
    python3 -c 'import json,sys
d = json.load(sys.stdin)
e = d["end"]
print(int(e["sum_received"]["bits_per_second"]), e["sum_sent"].get("retransmits", 0))'
}

# Bytes the tbf on the wire's egress toward B has sent, counted as on the wire: tc counts a
# GSO packet as the sum of its segments with their headers. Empty when the link is unshaped.
tbf_sent() { tc -n "$1" -s qdisc show dev wb 2>/dev/null | awk '/^qdisc tbf/ { f = 1 } f && /Sent/ { print $2; exit }'; }

# iperf_run NS_B ADDR_A NS_WIRE STREAMS -> "received_bps retransmits wire_bps": iperf3 A -> B;
# wire_bps is the tbf's send rate sampled over the steady part (IPERF_OMIT + 1 s after the
# start, for IPERF_S - 2 s), "-" when unshaped.
iperf_run() {
    local nb=$1 a=$2 nw=$3 p=$4 out w0 w1 t0 t1 ipid wire=-
    out=$(mktemp)
    ip netns exec "$nb" nice -n "$IPERF_NICE" iperf3 -c "$a" -R -P "$p" -t "$IPERF_S" -O "$IPERF_OMIT" -J >"$out" &
    ipid=$!
    sleep $((IPERF_OMIT + 1))
    w0=$(tbf_sent "$nw"); t0=$(date +%s.%N)
    sleep $((IPERF_S - 2))
    w1=$(tbf_sent "$nw"); t1=$(date +%s.%N)
    wait "$ipid"
    if [ -n "$w0" ] && [ -n "$w1" ]; then
        wire=$(awk -v a="$w0" -v b="$w1" -v s="$t0" -v e="$t1" 'BEGIN { printf "%d\n", (b - a) * 8 / (e - s) }')
    fi
    echo "$(iperf_parse <"$out") $wire"
    rm -f "$out"
}

pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "n/a"; else printf "%.1f\n", 100 * a / b }'; }
within() { awk -v a="$1" -v b="$2" -v t="$TOL_PCT" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; print (d <= t / 100) ? "yes" : "NO" }'; }

# busy % of one core over 3 s, all processes
busy_3s() {
    local a b
    a=$(machine_ticks); sleep 3; b=$(machine_ticks)
    awk -v a="$a" -v b="$b" -v n="$(nproc)" 'BEGIN { split(a, x, " "); split(b, y, " ");
        printf "%.0f\n", n * 100 * (y[1] - x[1]) / (y[2] - x[2]) }'
}
# wait_quiet: waits (at most QUIET_WAIT_S) until the machine is quiet; prints the last busy %.
wait_quiet() {
    local t_wait bg
    t_wait=$(date +%s)
    bg=$(busy_3s)
    while [ "$bg" -ge "$QUIET_PCT" ] && [ $(( $(date +%s) - t_wait )) -lt "$QUIET_WAIT_S" ]; do
        echo "netlab-check: machine busy ($bg % of a core), waiting for quiet" >&2
        sleep 7
        bg=$(busy_3s)
    done
    echo "$bg"
}

OUT_ROWS=()
DATE=$(date -u +%Y-%m-%dT%H:%MZ)

scenario() { # RATE RTT_MS OFFLOAD
    local rate=$1 rtt=$2 offload=$3 id=$LAB_ID
    LAB_ID=$((LAB_ID + 1))
    local bg bg_after; bg=$(wait_quiet)
    echo "== RATE=${rate:-unlimited} RTT_MS=$rtt OFFLOAD=$offload (background load $bg % of a core)" >&2
    RATE=$rate RTT_MS=$rtt OFFLOAD=$offload bash scripts/netlab.sh up "$PREFIX" "$id" >/dev/null
    local A=198.18.$id.2 NA="${PREFIX}a" NB="${PREFIX}b" dl_pid=""
    dl_pid=$(bash scripts/netlab.sh show "$PREFIX" | sed -n 's/^NETLAB_DELAYLINE_PID=//p')

    # Ping on the idle link (one warm-up ping for ARP first).
    ip netns exec "$NB" ping -n -c 1 -W 5 "$A" >/dev/null
    local med
    med=$(ip netns exec "$NB" ping -n -c "$PINGS" -i 0.2 -W 5 "$A" \
          | sed -n 's/.*time=\([0-9.]*\) ms.*/\1/p' | sort -n \
          | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }')

    # iperf3 server in A, bound to A's address; stopped by PID.
    ip netns exec "$NA" nice -n "$IPERF_NICE" iperf3 -s -B "$A" >/dev/null 2>&1 &
    IPERF_PID=$!
    sleep 0.5
    local c0 t0 c1 t1 r1 r4 one four
    local m0 m1
    c0=$(cpu_ticks "$dl_pid"); t0=$(date +%s.%N); m0=$(machine_ticks)
    one=$(iperf_run "$NB" "$A" "${PREFIX}w" 1)
    four=$(iperf_run "$NB" "$A" "${PREFIX}w" 4)
    c1=$(cpu_ticks "$dl_pid"); t1=$(date +%s.%N); m1=$(machine_ticks)
    kill "$IPERF_PID" 2>/dev/null || true; wait "$IPERF_PID" 2>/dev/null || true; IPERF_PID=""
    # down prints the delay line's counters (packets, drops) on stderr.
    bash scripts/netlab.sh down "$PREFIX" >/dev/null
    bg_after=$(busy_3s)

    local retr1 retr4 w1 w4
    read -r r1 retr1 w1 <<<"$one"
    read -r r4 retr4 w4 <<<"$four"
    local cpu
    if [ -n "$dl_pid" ]; then
        cpu=$(awk -v c="$((c1 - c0))" -v k="$TCK" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f\n", 100 * c / k / (b - a) }')
    else
        cpu="-"
    fi
    local mbusy
    mbusy=$(awk -v a="$m0" -v b="$m1" -v n="$(nproc)" 'BEGIN { split(a, x, " "); split(b, y, " ");
        printf "%.0f\n", n * 100 * (y[1] - x[1]) / (y[2] - x[2]) }')
    local rtt_ok="-" ceiling="" t_ok1="-" t_ok4="-" pr1="-" pr4="-" pc1="-" pc4="-" wire="-" w_ok="-"
    if awk -v r="$rtt" 'BEGIN { exit !(r > 0) }'; then rtt_ok=$(within "$med" "$rtt"); fi
    if [ -n "$rate" ]; then
        local rb; rb=$(awk -v r="${rate,,}" 'BEGIN {
            n = r + 0; u = r; sub(/^[0-9.]+/, "", u);
            m = (u == "gbit") ? 1e9 : (u == "mbit") ? 1e6 : (u == "kbit") ? 1e3 : 1; printf "%d\n", n * m }')
        ceiling=$(awk -v b="$rb" 'BEGIN { printf "%d\n", b * 1448 / 1514 }')
        pr1=$(pct "$r1" "$rb"); pr4=$(pct "$r4" "$rb")
        pc1=$(pct "$r1" "$ceiling"); pc4=$(pct "$r4" "$ceiling")
        t_ok1=$(within "$r1" "$ceiling"); t_ok4=$(within "$r4" "$ceiling")
        if [ "$w1" != - ] && [ "$w4" != - ]; then
            wire="$(awk -v r="$w1" 'BEGIN { printf "%.1f\n", r / 1e6 }') / $(awk -v r="$w4" 'BEGIN { printf "%.1f\n", r / 1e6 }') ($(pct "$w4" "$rb") %)"
            w_ok=$(within "$w4" "$rb")
        fi
    fi
    local mb1 mb4
    mb1=$(awk -v r="$r1" 'BEGIN { printf "%.1f\n", r / 1e6 }')
    mb4=$(awk -v r="$r4" 'BEGIN { printf "%.1f\n", r / 1e6 }')
    OUT_ROWS+=("| ${rate:-unlimited} | $rtt | $offload | $med | $rtt_ok | $wire | $w_ok | $mb1 ($pr1 % / $pc1 %) | $t_ok1 | $retr1 | $mb4 ($pr4 % / $pc4 %) | $t_ok4 | $retr4 | $cpu | $mbusy | $bg / $bg_after |")
    echo "   ping median $med ms; wire $wire Mbit/s; 1 stream $mb1 Mbit/s ($retr1 retr); 4 streams $mb4 Mbit/s ($retr4 retr); delay line CPU $cpu %, machine $mbusy % of 1 core" >&2
}

for setting in ${SETTINGS:-1gbit/20 200mbit/50 -/0}; do
    rate=${setting%/*}
    [ "$rate" != - ] || rate=""
    scenario "$rate" "${setting#*/}" 1
done
if [ "${SKIP_NO_OFFLOAD:-0}" != 1 ]; then
    scenario 1gbit 20 0
fi

{
    echo "Network lab check, $DATE, $(nproc) cores, kernel $(uname -r), TCP $(sysctl -n net.ipv4.tcp_congestion_control)"
    echo "ping: median of $PINGS (idle link); iperf3: A -> B, ${IPERF_S} s after ${IPERF_OMIT} s warm-up; tolerance ${TOL_PCT} %"
    echo "wire: what the tbf toward B sent (frames with headers, GSO counted per segment) in the steady part of the 1- and 4-stream runs; the 4-stream figure (the link kept full) is compared with RATE"
    echo "throughput: Mbit/s received (% of RATE / % of the TCP goodput ceiling RATE x 1448/1514); CPU: delay line, % of one core; machine busy: all processes (ours, iperf3, the kernel, and anyone else's), in % of one core (200 = both cores), during the iperf3 runs; others before / after: the machine's busy % (others' work: our lab is not running then) in the 3 s before the setting's lab was built and after it was removed"
    echo "iperf3 at nice $IPERF_NICE, delay line at nice ${DL_NICE:--10}"
    echo
    echo "| RATE | RTT ms | offload | ping median ms | RTT within ${TOL_PCT} % | wire Mbit/s 1 / 4 streams (% of RATE) | within | 1 stream Mbit/s | within | retr | 4 streams Mbit/s | within | retr | delay line CPU % | machine busy % | others before / after % |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${OUT_ROWS[@]}"
} | tee "$RESULT"
echo "written: $RESULT" >&2
