#!/usr/bin/env bash
# replica-create --delta benchmark (issue 19): a stale copy re-synced with the changed blocks
# taken from the primary's WAL summaries, against the same delta by page LSN (what 15 and 16
# get: the server reads each page's LSN) and comparing by hash (both sides read and hash
# every byte), against a full copy by pgjet and by pg_basebackup; and over the BASE_BACKUP
# stream (what a role with REPLICATION only gets, issue 36): the server's incremental
# BASE_BACKUP, and the whole stream compared in place (15-16, summarize_wal off); on
# one PostgreSQL 17+ cluster with summarize_wal = on, in one run. pgjet reads the primary
# over libpq (loopback), as it would across hosts. Cold cache before every timed command,
# medians. Not a test: it only measures.
#
#   bash bench/delta.sh                                            # scale 100 + 500 MiB, PG 18
#   SCALE=2 RANDOM_MB=16 RUNS=1 DREPORT=/tmp/delta.md bash bench/delta.sh   # smoke size
#
# Each round: DELTA_PCT % of pgbench_accounts' heap pages get one row updated (random pages,
# by ctid), CHECKPOINT, then one delta onto the copy D; the two kinds of delta alternate
# which goes first. Measured per command: wall seconds, peak RSS, bytes read from the disk
# (/proc/diskstats, every process), and pgjet's own figures (bytes found unchanged, copied).
# At the end the copy is started as a standby and its rows compared with the primary's.
#
# Settings, besides those of bench/run.sh (SCALE, RANDOM_MB, RUNS, PG_VERSION (default
# 18 here), BENCH_DIR, KEEP, COLD, PGJET):
#   DREPORT     markdown report (default $BENCH_DIR/results/delta.md)
#   DELTA_PCT   % of pgbench_accounts' pages changed before each delta (default 1)
#   DJOBS       pgjet --jobs (default 4, replica-create's own default over libpq)
# Run as root (servers and tools run as the OS user postgres through runuser).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PG_VERSION=${PG_VERSION:-18}
export PG_LISTEN=127.0.0.1          # pgjet reaches the primary over TCP, as across hosts
# shellcheck source=bench/run.sh
source "$HERE/run.sh"

DREPORT=${DREPORT:-$RES/delta.md}
DELTA_PCT=${DELTA_PCT:-1}
DJOBS=${DJOBS:-4}
COPY=$BENCH/delta-copy              # the copy D the deltas re-sync
READS=$RES/delta-reads.tsv          # name, run, bytes read from the disk
FIG=$RES/delta-figures.tsv          # name, run, pages changed, delta_same, delta_copied
DISK=""


# dtimed NAME RUN CMD: timed, and the disk's bytes read meanwhile in $READS
dtimed() {
    local s0 s1 rc=0
    s0=$(sectors_read)
    timed "$1" "$2" "$3" || rc=$?
    s1=$(sectors_read)
    printf '%s\t%s\t%s\n' "$1" "$2" "$(((s1 - s0) * 512))" >>"$READS"
    return $rc
}

conninfo() { printf 'host=127.0.0.1 port=%s user=postgres dbname=postgres' "$PORT"; }

replica_cmd() {  # replica_cmd "VAR=V ..." [--delta]: pgjet replica-create onto $COPY over libpq (DTRANSPORT=basebackup: the stream)
    local env=$1
    shift
    # The stream uncompressed, as auto takes it on this host (the wheel's 18 has gzip only,
    # whose one server core would bound the whole stream).
    local t=(--transport "${DTRANSPORT:-libpq}")
    [ "${DTRANSPORT:-libpq}" = basebackup ] && t+=(--network-compress none)
    # shellcheck disable=SC2086  # one word per VAR=V
    pg_cmd env $env "$PGJET_BIN" --source "$(conninfo)" "${t[@]}" --jobs "$DJOBS" \
        --pg-path "$COPY" --output json replica-create --start-fast "$@"
}

# change_pages: one row updated on DELTA_PCT % of pgbench_accounts' heap pages, CHECKPOINT;
# prints the rows updated
change_pages() {
    change_pages_sql "$DELTA_PCT" | psql_as "$PGV" "$PG" "$PORT" -At
    psql_as "$PGV" "$PG" "$PORT" -c CHECKPOINT >/dev/null
}

# one_delta NAME RUN ENV: a change, then the delta with ENV ("PGJET_DELTA_SUMMARIES=0|1
# [PGJET_DELTA_PAGE_LSN=0]")
one_delta() {
    local name=$1 r=$2 env=$3 n log
    n=$(change_pages)
    say "  changed $n rows (one per page), checkpoint"
    dtimed "$name" "$r" "$(replica_cmd "$env" --delta)" || return 0
    log=$LOGS/$name.run$r.log
    grep -q "WAL summaries" "$log" && say "    $(grep -o 'WAL summaries.*' "$log" | head -n 1 | cut -c1-150)"
    python3 - "$log" "$name" "$r" "$n" >>"$FIG" <<'PY'
import json, sys
log, name, run, n = sys.argv[1:]
text = open(log, errors="replace").read()
start = text.find("\n{")
s = {}
if start >= 0:
    try:
        s, _ = json.JSONDecoder().raw_decode(text[start + 1:])
    except ValueError:
        s = {}
print(f"{name}\t{run}\t{n}\t{s.get('delta_same', '')}\t{s.get('delta_copied', '')}")
PY
}

check_copy() {
    local port want got i
    port=$(free_port)
    chown -R postgres: "$COPY"
    as_pg "$PGBIN/pg_ctl" -D "$COPY" -l "$OUT/delta-copy.log" -o "-p $port -c unix_socket_directories=$PG/sock" -w -t 300 start >/dev/null
    STARTED+=("$COPY")
    want=$(psql_as "$PGV" "$PG" "$PORT" -Atc "SELECT count(*), sum(abalance) FROM pgbench_accounts")
    got=""
    for i in $(seq 1 120); do
        got=$(as_pg "$PGBIN/psql" -h "$PG/sock" -p "$port" -U postgres -d postgres -Atc \
            "SELECT count(*), sum(abalance) FROM pgbench_accounts" 2>/dev/null) || got=""
        [ "$got" = "$want" ] && break
        sleep 1
    done
    pg_stop_cluster "$COPY" || true
    if [ "$got" = "$want" ]; then
        say "copy started as a standby: pgbench_accounts count|sum $got, as on the primary"
        CHECK="the copy, started as a standby after the last delta, holds the primary's pgbench_accounts (count and sum of abalance: $got)"
    else
        say "MISMATCH: the copy holds $got, the primary $want"
        CHECK="**MISMATCH: the copy after the last delta differs from the primary**: $got against $want"
    fi
}

mid() { sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}'; }  # median of stdin (lower one of an even count)
med_read() { awk -F'\t' -v n="$1" '$1==n {print $3}' "$READS" | mid; }
med_fig() { awk -F'\t' -v n="$1" -v c="$2" '$1==n && $c != "" {print $c}' "$FIG" | mid; }
div() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b}'; }

write_delta_report() {
    local full pgbb sum hash n
    full=$(median replica_full); pgbb=$(median pg_basebackup_full)
    sum=$(median delta_summaries); hash=$(median delta_hash)
    n=$(awk -F'\t' '{print $3}' "$FIG" | mid)
    {
        echo "# replica-create --delta: WAL summaries against hashes"
        echo
        echo "Run $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname) ($(nproc) cores), by bench/delta.sh."
        echo "PostgreSQL $PGV, summarize_wal = on, pgbench scale $SCALE + $RANDOM_MB MiB random"
        echo "($(mib "$(size_of cluster)") MiB data directory). pgjet over libpq on loopback, --jobs $DJOBS."
        echo "$RUNS round(s); cache dropped before each command: $DROP_CACHES. Before each delta,"
        echo "$DELTA_PCT % of pgbench_accounts' pages got one row updated (median $n rows), then CHECKPOINT."
        echo "The disk's bytes read count every process (the server's and pgjet's)."
        echo
        echo "| command | median s | read from disk MiB | copied MiB | unchanged MiB | peak RSS MiB |"
        echo "|---|---:|---:|---:|---:|---:|"
        local c
        for c in pg_basebackup_full replica_full delta_hash delta_page_lsn delta_summaries stream_whole stream_incremental; do
            printf '| %s | %s | %s | %s | %s | %s |\n' "$c" "$(median "$c")" "$(mib "$(med_read "$c")")" \
                "$(mib "$(med_fig "$c" 5)")" "$(mib "$(med_fig "$c" 4)")" \
                "$(awk -v k="$(median "$c" 4)" 'BEGIN {if (k != "") printf "%.0f", k / 1024}')"
        done
        echo
        echo "- delta with summaries against delta by hash: $(div "$hash" "$sum")x faster, disk reads $(div "$(med_read delta_hash)" "$(med_read delta_summaries)")x fewer."
        echo "- delta by page LSN (no summaries: PostgreSQL 15 and 16) against delta by hash: $(div "$hash" "$(median delta_page_lsn)")x faster, disk reads $(div "$(med_read delta_hash)" "$(med_read delta_page_lsn)")x fewer."
        echo "- delta with summaries against pgjet's full copy: $(div "$full" "$sum")x; against pg_basebackup: $(div "$pgbb" "$sum")x."
        echo "- over the BASE_BACKUP stream (a role with REPLICATION only, as Patroni's replicator): the incremental BASE_BACKUP (17+) against pg_basebackup $(div "$pgbb" "$(median stream_incremental)")x, against the whole stream compared in place (15-16, or summarize_wal off) $(div "$(median stream_whole)" "$(median stream_incremental)")x."
        echo "- ${CHECK:-the copy was not checked}."
    } >"$DREPORT"
}

delta_cleanup() {
    local rc=$?
    [ "$KEEP" = 1 ] || rm -rf "$COPY"
    (exit $rc)
    cleanup  # reads the exit status as $?
}

delta_main() {
    trap delta_cleanup EXIT
    [ "$(id -u)" -eq 0 ] || die "run as root (drop_caches, runuser)"
    [ "${PGV%%.*}" -ge 17 ] || die "WAL summaries need PostgreSQL 17+ (PG_VERSION=$PGV)"
    mkdir -p "$BENCH" "$BENCH/bin" "$LOGS" "$RES" "$OUT"
    chmod 755 "$BENCH" "$BENCH/bin"
    chown postgres: "$OUT"
    : >"$TIMES"; : >"$SIZES"; : >"$READS"; : >"$FIG"
    DISK=$(disk_of "$BENCH")
    [ -n "$DISK" ] || die "no block device under $BENCH for /proc/diskstats"
    setup_pgjet
    build_cluster
    psql_as "$PGV" "$PG" "$PORT" -c "ALTER SYSTEM SET summarize_wal = on" -c "SELECT pg_reload_conf()" \
        -c CHECKPOINT >/dev/null
    record_size cluster "$PGDATA"

    header "A full copy into $COPY (pgjet), and pg_basebackup for reference"
    fresh_dir "$COPY"
    dtimed replica_full 1 "$(replica_cmd PGJET_DELTA_SUMMARIES=1)"
    local r
    for r in $(seq 1 "$RUNS"); do
        header "Round $r of $RUNS"
        rm -rf "$OUT/pgbb"
        dtimed pg_basebackup_full "$r" "$(pg_cmd "$PGBIN/pg_basebackup" -h "$PG/sock" -p "$PORT" -U postgres -D "$OUT/pgbb" -c fast -X stream)" || true
        rm -rf "$OUT/pgbb"
        # The kinds take turns going first.
        local kinds=(summaries page_lsn hash stream_incremental stream_whole) k i
        for i in 0 1 2 3 4; do
            k=${kinds[$(((r + i) % 5))]}
            case $k in
                summaries) one_delta delta_summaries "$r" PGJET_DELTA_SUMMARIES=1 ;;
                page_lsn) one_delta delta_page_lsn "$r" PGJET_DELTA_SUMMARIES=0 ;;
                hash) one_delta delta_hash "$r" "PGJET_DELTA_SUMMARIES=0 PGJET_DELTA_PAGE_LSN=0" ;;
                stream_incremental) DTRANSPORT=basebackup one_delta stream_incremental "$r" PGJET_DELTA_SUMMARIES=1 ;;
                stream_whole) DTRANSPORT=basebackup one_delta stream_whole "$r" PGJET_DELTA_SUMMARIES=0 ;;
            esac
        done
    done
    header "Check the copy"
    check_copy
    header "Report"
    write_delta_report
    cat "$DREPORT"
    say "report written to $DREPORT"
}

delta_main "$@"
