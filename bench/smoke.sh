#!/usr/bin/env bash
# Smoke run of every benchmark in bench/ at a tiny size (seconds to a minute each), so that a
# benchmark cannot silently stop working: CI runs it after the tests (.ci/run). It asserts
# no time and no ratio. A benchmark fails the smoke when it exits non-zero, or when its
# output or report has a line marked FAIL (FAILED: a timed command or a restore that
# failed; MISMATCH: a restored cluster that does not hold the source's rows).
#
#   bash bench/smoke.sh                      # every benchmark, as root; a few minutes
#   SMOKE="run s3" bash bench/smoke.sh       # some of them
#
# Names: run restore incr resume delta cipher million s3 archive stream remote netlab rates (bench/run.sh,
# restore.sh, incr.sh, resume.sh, delta.sh, cipher.sh, million.sh, s3.sh, archive.sh, stream.sh, remote.sh, netlab-check.sh, rates.sh). Reports, logs and work dirs go under
# SMOKE_DIR (default /var/tmp/pgjet-smoke, emptied first): docs/ and bench/results/ are
# not written. Labs and work dirs are the smoke's own (LAB_PREFIX smk*, LAB_ID 181-190), so
# a full-size benchmark may run at the same time. Nothing is installed beyond what
# scripts/install-deps.sh installs (run first; idempotent); s5cmd, which s3.sh and
# archive.sh build for their raw-client rows, is left out (SKIP_S5CMD=1).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SMOKE=${SMOKE:-run restore incr resume delta cipher million s3 archive stream remote netlab rates}
SMOKE_DIR=${SMOKE_DIR:-/var/tmp/pgjet-smoke}

[ "$(id -u)" -eq 0 ] || { echo "smoke: run as root (namespaces, drop_caches, runuser)" >&2; exit 1; }
# One smoke run at a time on a machine (a second would find the first's labs, whose names are
# fixed, and could empty its directory): /var/tmp/pgjet-smoke.lock holds the running one's
# PID; a lock whose process is gone is taken over.
LOCK=/var/tmp/pgjet-smoke.lock
if ! (set -C; echo $$ >"$LOCK") 2>/dev/null; then
    other=$(cat "$LOCK" 2>/dev/null || true)
    if [ -n "$other" ] && kill -0 "$other" 2>/dev/null; then
        echo "smoke: another smoke run (pid $other) is going on this machine: wait for it" >&2
        exit 1
    fi
    echo $$ >"$LOCK"
fi
trap 'rm -f "$LOCK"' EXIT
# A smoke run killed before its end (a session that stopped under it) leaves its labs: their
# names are fixed, so the next run would refuse them. The lock is ours now: take them down.
for ns in /run/netns/smk*; do
    [ -e "$ns" ] || continue
    p=$(basename "$ns"); p=${p%[abw]}
    echo "smoke: taking down the lab '$p' a killed smoke run left"
    bash scripts/netlab.sh down "$p" >/dev/null 2>&1 || true
done
rm -rf "$SMOKE_DIR"
mkdir -p "$SMOKE_DIR"
chmod 755 "$SMOKE_DIR"

bash scripts/install-deps.sh >"$SMOKE_DIR/install-deps.log" 2>&1 \
    || { tail -n 20 "$SMOKE_DIR/install-deps.log"; echo "smoke: scripts/install-deps.sh failed" >&2; exit 1; }
export PATH="${HOME:-/root}/.cargo/bin:$PATH"
cargo build -q --release --bins
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
# shellcheck source=scripts/pg-env.sh
source scripts/pg-env.sh
# the times mean nothing here: no page-cache drops (bench/common.sh cold_cache), which would
# only slow the run and empty the cache of whatever else the machine does
export COLD=0

# marks FILE...: the lines that mark a failure (not the reports' "ok/FAIL" column legends)
marks() {
    grep -hE '\bFAIL(ED)?\b|MISMATCH' "$@" 2>/dev/null | grep -vE 'ok/FAIL|ok\|FAIL' || true
}

SUMMARY=()
FAILED=0
# one NAME REPORT VAR=VALUE... -- CMD...: run one benchmark with its settings, judge it
one() {
    local name=$1 report=$2 t0=$SECONDS rc=0 log=$SMOKE_DIR/$1.log m verdict=ok
    shift 2
    local vars=()
    while [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    printf '== %-8s ' "$name"
    env "${vars[@]}" "$@" >"$log" 2>&1 </dev/null || rc=$?
    m=$(marks "$log" "$report")
    if [ "$rc" != 0 ] || [ -n "$m" ]; then
        verdict=FAIL
        FAILED=1
    fi
    SUMMARY+=("$(printf '%-8s %-4s exit %-3s %4d s  %s' "$name" "$verdict" "$rc" $((SECONDS - t0)) "$log")")
    printf '%-4s (exit %s, %d s)\n' "$verdict" "$rc" $((SECONDS - t0))
    if [ "$verdict" = FAIL ]; then
        [ -z "$m" ] || printf '%s\n' "$m" | head -n 20 | sed 's/^/   marked: /'
        tail -n 25 "$log" | sed 's/^/   | /'
    fi
}

T0=$SECONDS
for b in $SMOKE; do
    d=$SMOKE_DIR/$b
    case $b in
        run)
            one run "$d.md" BENCH_DIR="$d" REPORT="$d.md" SCALE=1 RANDOM_MB=8 RUNS=1 FIO_S=1 FIO_SIZE=64m FIO_DEPTHS="1 16" -- bash bench/run.sh ;;
        restore)
            one restore "$d.md" BENCH_DIR="$d" REPORT="$d-run.md" RREPORT="$d.md" SCALE=1 RANDOM_MB=8 RUNS=1 FIO_S=1 FIO_SIZE=64m FIO_DEPTHS="1 16" \
                DD_STREAMS=2 -- bash bench/restore.sh ;;
        incr)
            one incr "$d.md" BENCH_DIR="$d" IREPORT="$d.md" SCALE=1 RANDOM_MB=8 RUNS=1 -- bash bench/incr.sh ;;
        resume)
            one resume "$d.md" BENCH_DIR="$d" RREPORT="$d.md" SCALE=1 RANDOM_MB=8 RUNS=1 -- bash bench/resume.sh ;;
        delta)
            one delta "$d.md" BENCH_DIR="$d" DREPORT="$d.md" SCALE=1 RANDOM_MB=8 RUNS=1 -- bash bench/delta.sh ;;
        cipher)
            one cipher "$d.md" BENCH_DIR="$d" CREPORT="$d.md" SCALE=1 RANDOM_MB=8 RUNS=1 WAL_SEGS=2 -- bash bench/cipher.sh ;;
        million)
            one million "$d/report.md" BENCH_DIR="$d" FILES=2000 IMG_GB=1 PORT="$(free_port)" -- bash bench/million.sh ;;
        s3)
            one s3 "$d.md" BENCH_DIR="$d" REPORT="$d.md" LAB_PREFIX=smks3 LAB_ID=181 TABLES=200 SCALE=1 \
                RANDOM_MB=8 LARGE_MB=16 SKIP_S5CMD=1 RUNS=1 RTT_MS=1 LINK_CHECK=0 -- bash bench/s3.sh ;;
        archive)
            # the S3 target only (the posix one differs by its repository settings): all four tools
            one archive "$d.md" BENCH_DIR="$d" REPORT="$d.md" LAB_PREFIX=smkar LAB_ID=182 TARGETS=s3 ASCALE=1 \
                DURATION=2 FLOOD_SEGS=1 FLOOD_KINDS=random SKIP_S5CMD=1 RTT_MS=1 -- bash bench/archive.sh ;;
        stream)
            # both targets, every tool (pg_receivewal on posix), each phase once and small
            one stream "$d.md" BENCH_DIR="$d" REPORT="$d.md" LAB_PREFIX=smkst LAB_ID=185 ASCALE=1 DURATION=3 \
                FLOOD_SEGS=2 FLOOD_RUNS=2 FLOOD_KINDS=random SYNC_S=2 SYNC_ROUNDS=2 WRITES=20 SKIP_S5CMD=1 RTT_MS=1 -- bash bench/stream.sh ;;
        remote)
            one remote "$d.md" BENCH_DIR="$d" REPORT="$d.md" LAB_PREFIX=smkrm LAB_ID=183 SCALE=1 RANDOM_MB=8 \
                SMALL_TABLES=100 RUNS=1 LINKS=1gbit/1 SMALL_LINKS=unshaped SWEEP_LINKS=200mbit/1 SWEEP_JOBS=2 \
                JOBS_LIST=2 DELTA_LINK=1gbit/1 DELTA_RANGES=64 QUIET_WAIT=0 IPERF_S=2 \
                STREAM_SCALE=2 STREAM_LINKS=unshaped STREAM_DATASETS=main STREAM_JOBS=2 \
                STREAM_SLOW_MBIT=100 \
                -- bash bench/remote.sh ;;
        rates)
            one rates "$d.md" RATES_DIR="$d" REPORT="$d.md" MB=16 -- bash bench/rates.sh ;;
        netlab)
            one netlab "$d.md" REPORT="$d.md" LAB_ID=184 PINGS=3 IPERF_S=3 IPERF_OMIT=1 SKIP_NO_OFFLOAD=1 \
                QUIET_WAIT_S=0 SETTINGS=1gbit/20 -- bash bench/netlab-check.sh ;;
        *) echo "smoke: unknown benchmark '$b' (run restore incr resume delta cipher million s3 archive stream remote netlab rates)" >&2; exit 2 ;;
    esac
done

echo
echo "smoke: $((SECONDS - T0)) s"
printf '  %s\n' "${SUMMARY[@]}"
if [ "$FAILED" != 0 ]; then
    echo "smoke: a benchmark FAILED (its log above; reports and logs in $SMOKE_DIR)" >&2
    exit 1
fi
