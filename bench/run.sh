#!/usr/bin/env bash
# pgjet benchmark: pgjet side by side with pg_basebackup, pgBackRest and plain tar/zstd
# references, on one PostgreSQL 15 cluster, in one run. Not a test: it only measures.
#
#   bash bench/run.sh                                        # full size (scale 100 + 500 MiB)
#   SCALE=5 RANDOM_MB=50 RUNS=1 SKIP_PGJET=1 REPORT=/tmp/b.md bash bench/run.sh   # smoke run
#
# See bench/README.md for what is measured and how to read the report.
# Run as root (servers and pg tools run as the OS user postgres through runuser).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
# shellcheck source=scripts/pg-env.sh
source "$ROOT/scripts/pg-env.sh"
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"

# ------------------------------------------------------------------ settings (env overrides)
SCALE=${SCALE:-100}                 # pgbench scale (100 = about 1.5 GiB)
RANDOM_MB=${RANDOM_MB:-500}         # MiB of incompressible bytes (bytea, STORAGE EXTERNAL)
RUNS=${RUNS:-3}                     # timed runs per command; medians are reported
JOBS=${JOBS:-2}                     # pgjet --jobs, pgBackRest process-max, zstd -T
PGV=${PG_VERSION:-15}
BENCH=${BENCH_DIR:-/var/tmp/pgjet-bench}
PGJET_SRC=${PGJET:-$ROOT/target/release/pgjet}
# PGJET_BASE=PATH: a second pgjet build (say, before a change) timed in the same run, its
# commands alternating with PGJET's (odd runs the base first, even runs the new build first),
# with the same repositories; the report gets a section comparing the two.
PGJET_BASE_SRC=${PGJET_BASE:-}
SKIP_PGJET=${SKIP_PGJET:-0}
SKIP_PGBACKREST=${SKIP_PGBACKREST:-0}
PGBR_ZST_LEVEL=${PGBR_ZST_LEVEL:-}  # empty = pgBackRest's default zst level (3)
CHECK_RESTORE=${CHECK_RESTORE:-1}   # start restored clusters once (untimed) and compare rows
REPORT=${REPORT:-$ROOT/docs/benchmarks.md}
KEEP=${KEEP:-0}                     # 1 = keep $BENCH (servers are stopped all the same)

PGBIN=$(pg_bindir "$PGV")
PG=$BENCH/pg                        # cluster dir: $PG/data, $PG/sock, $PG/log
PGDATA=$PG/data
OUT=$BENCH/out                      # outputs of the timed commands (removed between runs)
LOGS=$BENCH/logs
RES=$BENCH/results
TIMES=$RES/times.tsv                # name, run, seconds, max RSS KiB, ok|FAIL
SIZES=$RES/sizes.tsv                # name, bytes
CPUS=$RES/cpu.tsv                   # name, run, user s, system s (timed)
LIMITS=$RES/limits.tsv              # name, run, % reads, block size and queue depth, MiB/s (device_limit)
# DEVICE_LIMIT=1: after pgjet's jobs in each run, the device's own time for each job's bytes
# (fio, bench/common.sh device_limit; FIO_BS, FIO_DEPTHS, FIO_S, FIO_SIZE)
DEVICE_LIMIT=${DEVICE_LIMIT:-1}
PGBR_CONF=$BENCH/pgbackrest.conf
PGBR_REPO=$BENCH/pgbackrest-repo
PGJET_BIN=$BENCH/bin/pgjet
PGJET_STANZA=bench
PORT=""
DROP_CACHES=unknown
STARTED=()                          # cluster dirs / PGDATAs of the servers we started

say() { printf '%s\n' "$*"; }
header() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
die() { printf 'bench: %s\n' "$*" >&2; exit 1; }

# ------------------------------------------------------------------ cleanup
cleanup() {
    local rc=$? d
    set +e
    fio_huge_pages_restore
    for d in "${STARTED[@]}"; do pg_stop_cluster "$d"; done
    if [ "$KEEP" = 1 ]; then
        say "KEEP=1: kept $BENCH"
    else
        rm -rf "$OUT" "$PG" "$PGBR_REPO" "${BENCH:?}"/pgjet-repo-* "${BENCH:?}/bin" "$BENCH/spool" "$BENCH/lock" "$BENCH/fio-limit.dat"
        say "removed the cluster, repositories and outputs under $BENCH (results and logs kept)"
    fi
    [ $rc -eq 0 ] || say "bench exited with status $rc" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ measuring

# q ARGS... -> the arguments quoted for bash -c
q() { printf '%q ' "$@"; }
# pg_cmd ARGS... -> a shell command string running ARGS as postgres
pg_cmd() { printf 'cd / && runuser -u postgres -- %s' "$(q "$@")"; }


# record_size NAME PATH...: bytes on disk (apparent size) of PATHs, last run wins
record_size() {
    local name=$1 bytes
    shift
    bytes=$(du -scb "$@" 2>/dev/null | tail -n 1 | cut -f1)
    sed -i "/^$name\t/d" "$SIZES" 2>/dev/null || true
    printf '%s\t%s\n' "$name" "$bytes" >>"$SIZES"
}

# fresh_dir DIR: an empty directory owned by postgres, mode 700 (for restore targets)
fresh_dir() {
    rm -rf "$1"
    mkdir -p "$1"
    chown postgres: "$1"
    chmod 700 "$1"
}

# ------------------------------------------------------------------ the cluster
build_cluster() {
    header "Build the cluster: PostgreSQL $PGV, data checksums, pgbench scale $SCALE + $RANDOM_MB MiB random"
    pg_stop_cluster "$PG" 2>/dev/null || true
    rm -rf "$PG"
    mkdir -p "$PG"
    PORT=$(free_port)
    STARTED+=("$PG")
    PG_SHARED_BUFFERS=256MB PG_EXTRA_CONF="max_wal_size = 2GB
checkpoint_timeout = 30min
archive_mode = off" pg_make_cluster "$PGV" "$PG" "$PORT"
    say "cluster: $PGDATA (port $PORT, socket $PG/sock, pid $(pg_cluster_pid "$PG"))"

    local t0=$SECONDS
    as_pg "$PGBIN/pgbench" -h "$PG/sock" -p "$PORT" -U postgres -i -q -s "$SCALE" postgres 2>&1 | tail -n 1
    # a few transactions, so that sum(abalance) says something when restores are checked
    as_pg "$PGBIN/pgbench" -h "$PG/sock" -p "$PORT" -U postgres -n -c 2 -t 500 postgres >/dev/null

    # incompressible bytes: 1 MiB of /dev/urandom per row, hex-encoded for COPY, stored
    # uncompressed out of line (STORAGE EXTERNAL: TOAST without compression)
    install -m 755 "$(dirname "${BASH_SOURCE[0]}")/gen-random.sh" "$BENCH/bin/gen-random.sh"
    psql_as "$PGV" "$PG" "$PORT" >/dev/null <<SQL
CREATE TABLE random_bytes (id serial PRIMARY KEY, payload bytea NOT NULL);
ALTER TABLE random_bytes ALTER COLUMN payload SET STORAGE EXTERNAL;
COPY random_bytes (payload) FROM PROGRAM '$BENCH/bin/gen-random.sh $RANDOM_MB';
VACUUM (FREEZE, ANALYZE);
CHECKPOINT;
SELECT pg_switch_wal();
CHECKPOINT;
SQL
    say "loaded in $((SECONDS - t0)) s"
    SRC_ROWS=$(psql_as "$PGV" "$PG" "$PORT" -Atc "SELECT count(*), sum(abalance) FROM pgbench_accounts")
    SRC_RANDOM=$(psql_as "$PGV" "$PG" "$PORT" -Atc "SELECT count(*), pg_size_pretty(pg_total_relation_size('random_bytes')) FROM random_bytes")
    say "pgbench_accounts count|sum(abalance): $SRC_ROWS; random_bytes rows|size: $SRC_RANDOM"
}

# ------------------------------------------------------------------ pgBackRest set-up
# pgBackRest 2.45 needs, for a full backup with its default archive-check=y:
#   - archive_mode=on and an archive_command that runs `pgbackrest archive-push` (without
#     them `backup` fails with "[087] archive_mode must be enabled"; with --no-archive-check
#     it would back up, but without the WAL needed to restore a consistent cluster); see
#     setup_archiving
#   - lock-path, spool-path and log-path writable by postgres (it runs as postgres)
# Two stanzas on the same cluster, one per compression type, in one repository; every WAL
# segment is pushed to both.
setup_pgbackrest() {
    header "pgBackRest $(pgbackrest version | awk '{print $2}'): stanzas 'none' and 'zst'"
    rm -rf "$PGBR_REPO" "$BENCH/spool" "$BENCH/lock"
    mkdir -p "$PGBR_REPO" "$BENCH/spool" "$BENCH/lock" "$LOGS/pgbackrest"
    chown postgres: "$PGBR_REPO" "$BENCH/spool" "$BENCH/lock" "$LOGS/pgbackrest"
    cat >"$PGBR_CONF" <<EOF
[global]
repo1-path=$PGBR_REPO
# keep everything; the bench expires old backups itself between runs (untimed)
repo1-retention-full=9999999
lock-path=$BENCH/lock
spool-path=$BENCH/spool
log-path=$LOGS/pgbackrest
log-level-console=warn
log-level-file=info
process-max=$JOBS
start-fast=y
archive-check=y
archive-copy=n

[none]
pg1-path=$PGDATA
pg1-port=$PORT
pg1-socket-path=$PG/sock
compress-type=none

[zst]
pg1-path=$PGDATA
pg1-port=$PORT
pg1-socket-path=$PG/sock
compress-type=zst
${PGBR_ZST_LEVEL:+compress-level=$PGBR_ZST_LEVEL}
EOF
    chmod 644 "$PGBR_CONF"
    local s
    for s in none zst; do
        as_pg pgbackrest --config="$PGBR_CONF" --stanza="$s" stanza-create
    done
}

# ------------------------------------------------------------------ WAL archiving
# setup_archiving: each tool archives into its own archive, and each tool's backup waits
# for its WAL there (archive-check, the default of both): archive_mode=on and an
# archive_command running, at the same time (archive_all), pgBackRest's archive-push into
# both stanzas and pgjet's into both of its repositories (created here; bench_pgjet empties
# and re-creates them between runs once the archiver is idle). Nothing to archive with
# both tools left out.
setup_archiving() {
    local cmds=() ct s
    if [ "$SKIP_PGJET" != 1 ]; then
        for ct in none zstd; do
            pgjet_fresh_repo "$BENCH/pgjet-repo-$ct" || die "pgjet stanza-create failed"
        done
        cmds+=("$PGJET_BIN --stanza=$PGJET_STANZA --repo-path=$BENCH/pgjet-repo-none archive-push %p && $PGJET_BIN --stanza=$PGJET_STANZA --repo-path=$BENCH/pgjet-repo-zstd archive-push %p")
    fi
    if [ "$SKIP_PGBACKREST" != 1 ]; then
        cmds+=("pgbackrest --config=$PGBR_CONF --stanza=none archive-push %p && pgbackrest --config=$PGBR_CONF --stanza=zst archive-push %p")
    fi
    [ ${#cmds[@]} -gt 0 ] || return 0
    psql_as "$PGV" "$PG" "$PORT" >/dev/null <<SQL
ALTER SYSTEM SET archive_mode = on;
ALTER SYSTEM SET archive_command = '$(archive_all "${cmds[@]}")';
SQL
    as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w restart -l "$PG/log" >/dev/null
    if [ "$SKIP_PGBACKREST" != 1 ]; then
        for s in none zst; do
            as_pg pgbackrest --config="$PGBR_CONF" --stanza="$s" check
        done
    fi
    say "archive_mode=on; archive_command pushes into $( [ "$SKIP_PGJET" = 1 ] || echo "pgjet's two repositories")$( [ "$SKIP_PGJET" = 1 ] || [ "$SKIP_PGBACKREST" = 1 ] || echo " and ")$( [ "$SKIP_PGBACKREST" = 1 ] || echo "both pgBackRest stanzas ('pgbackrest check' passed)")"
}

pgbr() { pg_cmd pgbackrest --config="$PGBR_CONF" "$@"; }

# latest backup label of a pgBackRest stanza
pgbr_latest() { (cd "$PGBR_REPO/backup/$1" && ls -d [0-9]*F 2>/dev/null | sort | tail -n 1); }

# ------------------------------------------------------------------ pgjet set-up
setup_pgjet() {
    header "pgjet: $PGJET_SRC"
    [ -x "$PGJET_SRC" ] || die "no pgjet binary at $PGJET_SRC (cargo build --release, or PGJET=..., or SKIP_PGJET=1)"
    install -m 755 "$PGJET_SRC" "$PGJET_BIN"
    PGJET_VERSION=$(as_pg "$PGJET_BIN" --version 2>&1 | head -n 1)
    say "$PGJET_VERSION"
    if [ -n "$PGJET_BASE_SRC" ]; then
        [ -x "$PGJET_BASE_SRC" ] || die "no pgjet binary at PGJET_BASE=$PGJET_BASE_SRC"
        install -m 755 "$PGJET_BASE_SRC" "$BENCH/bin/pgjet-base"
        say "base build: $PGJET_BASE_SRC (timed as base_pgjet_*, alternating with $PGJET_SRC)"
    fi
}

pgjet_conn() {
    printf '%s\n' --stanza "$PGJET_STANZA" --repo-path "$1" --pg-path "$PGDATA" --pg-port "$PORT" \
        --pg-socket-path "$PG/sock"
}

# pgjet_fresh_repo DIR: empty repository with the stanza created (untimed). The cluster
# archives into it: emptied only once the archiver is idle (no archive-push running).
pgjet_fresh_repo() {
    local args
    archiver_idle "$PGDATA" || return 1
    fresh_dir "$1"
    mapfile -t args < <(pgjet_conn "$1")
    as_pg "$PGJET_BIN" stanza-create "${args[@]}" >"$LOGS/pgjet-stanza-create.log" 2>&1 \
        || { cat "$LOGS/pgjet-stanza-create.log"; return 1; }
}

pgjet_latest() { (cd "$1/$PGJET_STANZA/backup" && ls -d */ 2>/dev/null | tr -d / | sort | tail -n 1); }

# dd_read_write_cmd BACKUP_DIR INPUT OUT -> a command line: every file under BACKUP_DIR read
# with direct I/O (four at once) while `dd oflag=direct` writes INPUT to OUT: a restore's reads and
# writes at once, by plain tools, on the one disk (a write-only reference leaves the reads
# out). Not a tight limit: the dd's overlap their reads and writes less well than pgjet.
dd_read_write_cmd() {
    printf '{ %s & dd if=%s of=%s bs=8M oflag=direct status=none; wait; }' \
        "$(dd_read_cmd "$1")" "$(q "$2")" "$(q "$3")"
}

# dd_read_cmd BACKUP_DIR -> a command line: every file under BACKUP_DIR read with direct I/O,
# four at once: a restore's reads alone, by plain tools
dd_read_cmd() {
    printf 'find %s -type f -print0 | xargs -0 -P4 -I{} dd if={} of=/dev/null bs=8M iflag=direct status=none' "$(q "$1")"
}

# The references copy what the backups copy: not the WAL segments already in pg_wal (with
# max_wal_size = 2GB they are about as large as the data), nor postmaster.pid.
TAR_EXCLUDE="--exclude='./pg_wal/0*' --exclude=./postmaster.pid"

# ------------------------------------------------------------------ one round of every command
bench_tar_copy() {          # plain copy reference
    local r=$1 o=$OUT/tar-copy
    rm -rf "$o"; mkdir -p "$o"
    timed tar_copy "$r" "tar -C $(q "$PGDATA") --warning=no-file-changed --warning=no-file-removed $TAR_EXCLUDE -cf - . | tar -C $(q "$o") -xf -" || true
    record_size tar_copy "$o"
    rm -rf "$o"
}

bench_tar_zstd() {          # compressed copy reference, then its restore reference
    local r=$1 f=$OUT/tar.zst o=$OUT/untar
    rm -f "$f"; mkdir -p "$OUT"
    timed tar_zstd "$r" "tar -C $(q "$PGDATA") --warning=no-file-changed --warning=no-file-removed $TAR_EXCLUDE -cf - . | zstd -1 -T$JOBS -q > $(q "$f")" || true
    record_size tar_zstd "$f"
    rm -rf "$o"; mkdir -p "$o"
    [ -s "$f" ] && { timed zstd_untar "$r" "zstd -d -T$JOBS -q < $(q "$f") | tar -C $(q "$o") -xf -" || true; }
    record_size zstd_untar "$o"
    rm -rf "$o" "$f"
}

bench_pg_basebackup() {
    local r=$1 o=$OUT/pgbb
    fresh_dir "$o"
    timed pg_basebackup "$r" "$(pg_cmd "$PGBIN/pg_basebackup" -h "$PG/sock" -p "$PORT" -U postgres -D "$o" -Fp -Xstream -c fast)" || true
    record_size pg_basebackup "$o"
    [ "$CHECK_RESTORE" = 1 ] && [ "$r" = "$RUNS" ] && check_restored pg_basebackup "$o"
    rm -rf "$o"
    fresh_dir "$o"
    timed pg_basebackup_R "$r" "$(pg_cmd "$PGBIN/pg_basebackup" -h "$PG/sock" -p "$PORT" -U postgres -D "$o" -Fp -Xstream -c fast -R)" || true
    record_size pg_basebackup_R "$o"
    rm -rf "$o"
}

bench_pgbackrest() {
    local r=$1 s label o=$OUT/pgbr-restore
    for s in none zst; do
        # keep only the newest backup of the stanza (untimed)
        as_pg pgbackrest --config="$PGBR_CONF" --stanza="$s" --repo1-retention-full=1 expire >/dev/null 2>&1 || true
        timed "pgbackrest_$s" "$r" "$(pgbr --stanza="$s" --type=full backup)" || true
        label=$(pgbr_latest "$s")
        [ -n "$label" ] && record_size "pgbackrest_$s" "$PGBR_REPO/backup/$s/$label"
    done
    fresh_dir "$o"
    timed pgbackrest_restore "$r" "$(pgbr --stanza=zst --pg1-path="$o" restore)" || true
    record_size pgbackrest_restore "$o"
    [ "$CHECK_RESTORE" = 1 ] && [ "$r" = "$RUNS" ] && check_restored pgbackrest_restore "$o"
    rm -rf "$o"
}

# bench_pgjet RUN [BIN PREFIX]: pgjet's commands with binary BIN (default the build under
# test), timed under names PREFIXpgjet_*.
bench_pgjet() {
    local r=$1 bin=${2:-$PGJET_BIN} pre=${3:-} ct repo args label o=$OUT/pgjet-restore
    for ct in none zstd; do
        repo=$BENCH/pgjet-repo-$ct
        pgjet_fresh_repo "$repo" || { failed "pgjet_$ct" "$r" "fresh repository (archiver busy, or stanza-create)"; continue; }
        mapfile -t args < <(pgjet_conn "$repo")
        timed "${pre}pgjet_$ct" "$r" "$(pg_cmd "$bin" backup "${args[@]}" --type full --start-fast \
            --jobs "$JOBS" --compress-type "$ct")" || true
        label=$(pgjet_latest "$repo")
        [ -n "$label" ] && record_size "${pre}pgjet_$ct" "$repo/$PGJET_STANZA/backup/$label"
    done
    fresh_dir "$o"
    timed "${pre}pgjet_restore" "$r" "$(pg_cmd "$bin" restore --stanza "$PGJET_STANZA" \
        --repo-path "$BENCH/pgjet-repo-zstd" --pg-path "$o" --jobs "$JOBS")" || true
    record_size "${pre}pgjet_restore" "$o"
    [ "$CHECK_RESTORE" = 1 ] && [ "$r" = "$RUNS" ] && check_restored "${pre}pgjet_restore" "$o"
    rm -rf "$o"
    fresh_dir "$o"
    timed "${pre}pgjet_replica" "$r" "$(pg_cmd "$bin" replica-create \
        --source "host=$PG/sock port=$PORT user=postgres dbname=postgres" --pg-path "$o" \
        --start-fast --jobs "$JOBS")" || true
    record_size "${pre}pgjet_replica" "$o"
    rm -rf "$o"
    [ -n "$pre" ] || [ "$DEVICE_LIMIT" != 1 ] || pgjet_limits "$r"
}

# pgjet_limits RUN: the device's time for the bytes each of pgjet's jobs of this run read and
# wrote (device_limit): a backup reads PGDATA but pg_wal and writes the backup; the restore
# reads the zstd backup and writes the restored directory; replica-create reads and writes the
# copy (pg_wal's segments it copies included).
pgjet_limits() {
    local r=$1 j rd wr
    for j in none zstd restore replica; do
        read -r rd wr < <(job_bytes "$j")
        device_limit "limit_pgjet_$j" "$r" "$rd" "$wr" "$BENCH"
    done
    rm -f "$BENCH/fio-limit.dat"
}

# job_bytes JOB (none, zstd, restore, replica) -> "READ WRITTEN": the bytes pgjet's job of
# that name read and wrote, from the recorded sizes (see pgjet_limits)
job_bytes() {
    case $1 in
        none | zstd) echo "$(( $(size_of cluster) - $(size_of cluster_pg_wal) )) $(size_of "pgjet_$1")" ;;
        restore) echo "$(size_of pgjet_zstd) $(size_of pgjet_restore)" ;;
        replica) echo "$(size_of pgjet_replica) $(size_of pgjet_replica)" ;;
    esac
}

# bench_pgjet_ab RUN: the build under test and, with PGJET_BASE, the base build, in an order
# that alternates from run to run.
bench_pgjet_ab() {
    local r=$1
    if [ -z "$PGJET_BASE_SRC" ]; then
        bench_pgjet "$r"
    elif [ $((r % 2)) = 1 ]; then
        bench_pgjet "$r" "$BENCH/bin/pgjet-base" base_
        bench_pgjet "$r"
    else
        bench_pgjet "$r"
        bench_pgjet "$r" "$BENCH/bin/pgjet-base" base_
    fi
}

# check_restored NAME PGDATA: start a restored cluster (untimed) on a free port with archiving
# off, wait for the end of recovery, compare pgbench_accounts with the source, stop it.
check_restored() {
    local name=$1 d=$2 p sock=$BENCH/check-sock got=""
    [ -f "$d/PG_VERSION" ] || { say "  check $name: no restored cluster"; return 0; }
    p=$(free_port)
    fresh_dir "$sock"
    : >"$LOGS/check-$name.log"
    chown postgres: "$LOGS/check-$name.log"
    STARTED+=("$d")
    if ! as_pg "$PGBIN/pg_ctl" -D "$d" -l "$LOGS/check-$name.log" -w -t 300 \
            -o "-p $p -k $sock -c archive_mode=off -c listen_addresses=''" start >/dev/null; then
        say "  check $name: FAILED to start (log $LOGS/check-$name.log)"
        echo "check_$name FAIL" >>"$RES/checks.txt"
        return 0
    fi
    for _ in $(seq 1 600); do
        [ "$(as_pg "$PGBIN/psql" -X -h "$sock" -p "$p" -U postgres -d postgres -Atc 'SELECT pg_is_in_recovery()' 2>/dev/null)" = f ] && break
        sleep 0.5
    done
    got=$(as_pg "$PGBIN/psql" -X -h "$sock" -p "$p" -U postgres -d postgres -Atc \
        "SELECT count(*), sum(abalance) FROM pgbench_accounts" 2>/dev/null || true)
    pg_stop_cluster "$d"
    if [ "$got" = "$SRC_ROWS" ]; then
        say "  check $name: restored cluster started, pgbench_accounts matches ($got)"
        echo "check_$name ok" >>"$RES/checks.txt"
    else
        say "  check $name: MISMATCH: got '$got', source '$SRC_ROWS' (log $LOGS/check-$name.log)"
        echo "check_$name FAIL" >>"$RES/checks.txt"
    fi
}

# ------------------------------------------------------------------ report
median() {  # median of the ok seconds (or RSS with col=4) of NAME
    local name=$1 col=${2:-3}
    awk -F'\t' -v n="$name" -v c="$col" '$1==n && $5=="ok" {print $c}' "$TIMES" | stdin_median
}
minmax() {
    awk -F'\t' -v n="$1" '$1==n && $5=="ok" {print $3}' "$TIMES" | sort -g |
        awk 'NR==1{mi=$1} {ma=$1} END {if (NR) printf "%.2f–%.2f", mi, ma}'
}
nfail() { awk -F'\t' -v n="$1" '$1==n && $5=="FAIL"' "$TIMES" | wc -l; }
size_of() { awk -F'\t' -v n="$1" '$1==n {print $2}' "$SIZES" 2>/dev/null | tail -n 1; }
mib() { [ -n "$1" ] && awk -v b="$1" 'BEGIN {printf "%.0f", b / 1048576}'; }
# ratio PEER PGJET -> "x.xx×" = median(PEER) / median(PGJET): above 1 means pgjet is faster
ratio() {
    local a b
    a=$(median "$1"); b=$(median "$2")
    if [ -n "$a" ] && [ -n "$b" ]; then awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f×", a / b}'; else echo "n/a"; fi
}

# shellcheck disable=SC2016  # markdown with backticks
declare -A DESCR
DESCR[tar_copy]='`tar -C PGDATA --exclude=./pg_wal/0* -cf - . | tar -C OUT -xf -; sync` (plain copy reference, WAL segments left out as the backups do)'
DESCR[tar_zstd]='`tar -C PGDATA --exclude=./pg_wal/0* -cf - . | zstd -1 -T'$JOBS' > OUT.tar.zst; sync`'
DESCR[zstd_untar]='`zstd -d -T'$JOBS' < OUT.tar.zst | tar -C OUT -xf -; sync` (restore reference)'
DESCR[pg_basebackup]='`pg_basebackup -D OUT -Fp -Xstream -c fast; sync`'
DESCR[pg_basebackup_R]='`pg_basebackup -D OUT -Fp -Xstream -c fast -R; sync` (replica reference)'
DESCR[pgbackrest_none]='`pgbackrest backup --type=full` compress-type=none, process-max='$JOBS
DESCR[pgbackrest_zst]='`pgbackrest backup --type=full` compress-type=zst level '"${PGBR_ZST_LEVEL:-3 (its default)}"', process-max='$JOBS
DESCR[pgbackrest_restore]='`pgbackrest restore` of the zst backup into an empty dir, process-max='$JOBS
DESCR[pgjet_none]='`pgjet backup --type full --start-fast --jobs '$JOBS' --compress-type none`'
DESCR[pgjet_zstd]='`pgjet backup --type full --start-fast --jobs '$JOBS' --compress-type zstd`'
DESCR[pgjet_restore]='`pgjet restore` of the zstd backup into an empty dir'
DESCR[pgjet_replica]='`pgjet replica-create --start-fast` into an empty dir (no --start)'
NAMES=(tar_copy tar_zstd zstd_untar pg_basebackup pg_basebackup_R pgbackrest_none pgbackrest_zst
       pgbackrest_restore pgjet_none pgjet_zstd pgjet_restore pgjet_replica)

write_report() {
    local n med rss mbps size fails descr pgsize walsize
    pgsize=$(size_of cluster)
    walsize=$(size_of cluster_pg_wal)
    {
        echo "# pgjet benchmarks"
        echo
        echo "Written by \`bench/run.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'). Medians of $RUNS run(s) per command;"
        if [ "$DROP_CACHES" = yes ]; then
            echo "page cache dropped (\`sync; echo 3 > /proc/sys/vm/drop_caches\`) before every timed run."
        else
            echo "**page cache NOT dropped** before the timed runs (COLD=0, or drop_caches not permitted here)."
        fi
        echo
        echo "What bounds each number, and how earlier designs measured: [benchmark-notes.md](benchmark-notes.md)."
        echo "Across hosts: [benchmarks-remote.md](benchmarks-remote.md); compressed at the source on slow and fast links (the BASE_BACKUP stream and `--transport auto` against pg_basebackup's server compression): [benchmarks-stream.md](benchmarks-stream.md). On an object store (S3 at 20 ms, 100 000 tables): [benchmarks-s3.md](benchmarks-s3.md). WAL archiving (lag, floods, replay against pgBackRest): [benchmarks-archive.md](benchmarks-archive.md). A stale copy re-synced with WAL summaries: [benchmarks-delta.md](benchmarks-delta.md). Where a new standby comes from (the primary, a standby, an S3 seed) and a re-sync against Patroni's and pgBackRest's methods: [benchmarks-sources.md](benchmarks-sources.md)."
        echo
        echo "## Machine and versions"
        echo
        echo "- CPUs (\`nproc\`): $(nproc); $(awk '/model name/ {sub(/.*: /, ""); print; exit}' /proc/cpuinfo)"
        echo "- memory (\`free -g\`): $(free -g | awk '/^Mem:/ {print $2 " GiB total, " $7 " GiB available"}')"
        echo "- kernel: $(uname -r); $(. /etc/os-release && echo "$PRETTY_NAME")"
        echo "- bench dir: \`$BENCH\` on $(df -T "$BENCH" | awk 'NR==2 {print $2 " (" $1 ")"}')"
        echo "- PostgreSQL: $("$PGBIN/postgres" --version)"
        echo "- pg_basebackup: $("$PGBIN/pg_basebackup" --version)"
        echo "- pgBackRest: $(pgbackrest version)"
        echo "- zstd: $(zstd --version | grep -o 'v[0-9][0-9.]*' | head -n 1); tar: $(tar --version | head -n 1)"
        echo "- pgjet: ${PGJET_VERSION:-skipped (SKIP_PGJET=1)}$( [ "$SKIP_PGJET" = 1 ] || { c=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) && echo ", commit $c"; } )"
        echo
        echo "## Cluster"
        echo
        echo "- PostgreSQL $PGV, data checksums on, \`pgbench -i -s $SCALE\` plus $RANDOM_MB MiB of /dev/urandom"
        echo "  bytes in a bytea column with STORAGE EXTERNAL (stored uncompressed)"
        echo "- PGDATA on disk: $(mib "$pgsize") MiB (of which pg_wal $(mib "$walsize") MiB); pgbench_accounts count|sum(abalance) = $SRC_ROWS"
        echo "- archive_mode=on; archive_command runs pgBackRest's archive-push (both stanzas) and pgjet's (both repositories)"
        echo "  at the same time: each tool's backup waits for its WAL in its own archive (archive-check, both tools' default)"
        echo "- parallelism: $JOBS (pgjet --jobs, pgBackRest process-max, zstd -T)"
        echo
        echo "## Results"
        echo
        echo "| command | what | median s | min–max s | MiB/s of PGDATA | peak RSS MiB | output size MiB |"
        echo "|---|---|---:|---:|---:|---:|---:|"
        for n in "${NAMES[@]}"; do
            descr=${DESCR[$n]}
            med=$(median "$n"); rss=$(median "$n" 4); size=$(size_of "$n"); fails=$(nfail "$n")
            [ -n "$med" ] && med=$(printf '%.2f' "$med")
            if [ -z "$med" ] && [ "$fails" = 0 ]; then continue; fi
            mbps=""
            [ -n "$med" ] && [ -n "$pgsize" ] && mbps=$(awk -v b="$pgsize" -v s="$med" 'BEGIN {if (s > 0) printf "%.0f", b / 1048576 / s}')
            printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$n" "${descr//|/\\|}" \
                "${med:-FAILED}$( [ "$fails" -gt 0 ] && [ -n "$med" ] && echo " ($fails failed)")" \
                "$(minmax "$n")" "${mbps:-}" "$( [ -n "$rss" ] && mib "$((${rss%.*} * 1024))")" "$(mib "$size")"
        done
        echo
        echo "Output size: the backup as stored (pgBackRest: the backup set only, its WAL is in the"
        echo "archive since archive-copy=n; pgjet and pg_basebackup: including the backup's WAL)"
        echo "or the restored/copied directory. Peak RSS: the largest single process of the command"
        echo "(GNU time), not the sum over processes."
        echo
        if [ "$SKIP_PGJET" != 1 ]; then
            echo "## Ratios (peer median time / pgjet median time; above 1 = pgjet faster)"
            echo
            echo "| pgjet command | vs | ratio |"
            echo "|---|---|---:|"
            echo "| backup, compress none | pg_basebackup | $(ratio pg_basebackup pgjet_none) |"
            echo "| backup, compress none | pgBackRest none | $(ratio pgbackrest_none pgjet_none) |"
            echo "| backup, compress none | plain copy (tar \| tar) | $(ratio tar_copy pgjet_none) |"
            echo "| backup, zstd | pgBackRest zst | $(ratio pgbackrest_zst pgjet_zstd) |"
            echo "| backup, zstd | tar \| zstd -1 | $(ratio tar_zstd pgjet_zstd) |"
            echo "| restore (zstd) | pgBackRest restore (zst) | $(ratio pgbackrest_restore pgjet_restore) |"
            echo "| restore (zstd) | zstd -d \| tar -x | $(ratio zstd_untar pgjet_restore) |"
            echo "| replica-create | pg_basebackup -R | $(ratio pg_basebackup_R pgjet_replica) |"
            echo "| replica-create | plain copy (tar \| tar) | $(ratio tar_copy pgjet_replica) |"
            echo
        fi
        if [ "$DEVICE_LIMIT" = 1 ] && [ "$SKIP_PGJET" != 1 ] && [ -s "$LIMITS" ]; then
            echo "## Against the device's limit (fio, in the same runs)"
            echo
            echo "Each pgjet job's bytes (read, written) at the best rate fio reaches on the same filesystem"
            echo "for that mix of reads and writes: direct I/O on huge-page buffers, one file, block sizes"
            echo "$FIO_BS at queue depths $FIO_DEPTHS, $FIO_S s each, measured right after pgjet's jobs in every run. Device / pgjet:"
            echo "the median over runs of the same run's ratio (1.0 = the device's speed for those bytes;"
            echo "a copy of a cluster is many files, a manifest, fsyncs and pg_control last)."
            echo
            echo "| pgjet job | reads MiB | writes MiB | fio, last run | device median s | pgjet median s | pgjet CPU s (of $(nproc) cores) | device / pgjet |"
            echo "|---|---:|---:|---|---:|---:|---:|---:|"
            local j rd wr
            for j in none zstd restore replica; do
                read -r rd wr < <(job_bytes "$j")
                printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "pgjet_$j" "$(mib "$rd")" "$(mib "$wr")" \
                    "$(limit_of "limit_pgjet_$j")" "$(median "limit_pgjet_$j")" "$(median "pgjet_$j")" "$(cpu_median "pgjet_$j")" \
                    "$(per_round_ratio "limit_pgjet_$j" "pgjet_$j" "$RUNS")"
            done
            echo
        fi
        if [ -n "$PGJET_BASE_SRC" ] && [ "$SKIP_PGJET" != 1 ]; then
            echo "## Against the base build (same run, alternating; above 1 = this build faster)"
            echo
            echo "Base: \`$PGJET_BASE_SRC\` ($("$BENCH/bin/pgjet-base" --version 2>&1 | head -n 1))."
            echo
            echo "| command | base median s | this build median s | base min–max | this min–max | ratio base/this |"
            echo "|---|---:|---:|---:|---:|---:|"
            for n in pgjet_none pgjet_zstd pgjet_restore pgjet_replica; do
                printf '| %s | %s | %s | %s | %s | %s |\n' "$n" "$(median "base_$n")" "$(median "$n")" \
                    "$(minmax "base_$n")" "$(minmax "$n")" "$(ratio "base_$n" "$n")"
            done
            echo
        fi
        if [ -s "$RES/checks.txt" ]; then
            echo "## Restore checks (untimed, last run)"
            echo
            echo "Restored clusters were started once and \`SELECT count(*), sum(abalance) FROM pgbench_accounts\` compared with the source:"
            echo
            sed 's/^check_/- /' "$RES/checks.txt"
            echo
        fi
        echo "Settings: SCALE=$SCALE RANDOM_MB=$RANDOM_MB RUNS=$RUNS JOBS=$JOBS DEVICE_LIMIT=$DEVICE_LIMIT FIO_BS='$FIO_BS' FIO_DEPTHS='$FIO_DEPTHS' FIO_S=$FIO_S FIO_SIZE=$FIO_SIZE. Raw timings: \`$TIMES\`."
    } >"$REPORT"
}

# ------------------------------------------------------------------ main
main() {
    [ "$(id -u)" -eq 0 ] || die "run as root (drop_caches, runuser)"
    for c in /usr/bin/time zstd pgbackrest runuser "$PGBIN/pg_basebackup" basenc fio; do
        command -v "$c" >/dev/null || die "missing $c: run scripts/install-deps.sh"
    done
    mkdir -p "$BENCH" "$BENCH/bin" "$LOGS" "$RES" "$OUT"
    chmod 755 "$BENCH" "$BENCH/bin"
    chown postgres: "$OUT"
    : >"$TIMES"; : >"$SIZES"; : >"$RES/checks.txt"; : >"$LIMITS"; : >"$CPUS"
    say "bench dir $BENCH; SCALE=$SCALE RANDOM_MB=$RANDOM_MB RUNS=$RUNS JOBS=$JOBS SKIP_PGJET=$SKIP_PGJET"
    say "free space: $(df -h --output=avail "$BENCH" | tail -n 1 | tr -d ' ')"

    [ "$SKIP_PGJET" = 1 ] || setup_pgjet
    build_cluster
    [ "$SKIP_PGBACKREST" = 1 ] || setup_pgbackrest
    setup_archiving
    psql_as "$PGV" "$PG" "$PORT" -c "CHECKPOINT" >/dev/null
    record_size cluster "$PGDATA"
    record_size cluster_pg_wal "$PGDATA/pg_wal"
    say "PGDATA: $(mib "$(size_of cluster)") MiB (pg_wal $(mib "$(size_of cluster_pg_wal)") MiB)"

    local r
    for r in $(seq 1 "$RUNS"); do
        header "Run $r of $RUNS"
        bench_tar_copy "$r"
        bench_tar_zstd "$r"
        bench_pg_basebackup "$r"
        [ "$SKIP_PGBACKREST" = 1 ] || bench_pgbackrest "$r"
        [ "$SKIP_PGJET" = 1 ] || bench_pgjet_ab "$r"
    done

    header "Report"
    mkdir -p "$(dirname "$REPORT")"
    write_report
    cat "$REPORT"
    say
    say "report written to $REPORT"
}

# Sourced (bench/restore.sh shares the helpers above): define only, run nothing.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
