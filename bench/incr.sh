#!/usr/bin/env bash
# Differential/incremental backup benchmark: `pgjet backup --type incr` side by side with
# pgBackRest's incremental backups (2.45 from Debian: file level; optionally a pgBackRest
# built from source: block incremental) and, on PostgreSQL 17+, `pg_basebackup
# --incremental` + `pg_combinebackup`, after about 1% of the pages changed; then the restore
# of a chain (full + CHAIN incr) against the restore of a full of the same data. One run,
# cold cache before every timed command, medians. Not a test: it only measures.
#
#   bash bench/incr.sh                                           # full size (scale 100 + 500 MiB)
#   SCALE=2 RANDOM_MB=16 RUNS=1 IREPORT=/tmp/incr.md bash bench/incr.sh   # smoke size
#   PG_VERSION=18 bash bench/incr.sh                             # with pg_basebackup --incremental
#   BUILD_PGBR=1 bash bench/incr.sh                              # with a pgBackRest built from source
#
# What it does (details and how to read the report: bench/README.md, "Incremental backups"):
#   1. untimed: the cluster of bench/run.sh (build_cluster), a full backup with each tool
#   2. one change: in pgbench_accounts one row on every CHANGE_EVERY-th heap page (the row
#      moves: its old and its new page change, and the index), and the bytes of every
#      CHANGE_EVERY-th row of random_bytes (1 MiB of TOAST each, rewritten); CHECKPOINT.
#      Counted: the heap pages the updated rows came from and went to (ctid), and every
#      main-fork page whose LSN is newer than the change's start (pageinspect)
#   3. timed, RUNS times, each from the same starting point (the new incr is removed after
#      each run): read_pgdata (reading PGDATA once: this machine's limit for a backup that
#      reads every page), pgjet_incr, pgbackrest_incr, pgbackrest_new_incr,
#      pg_basebackup_incr and pg_combinebackup; seconds, peak RSS, stored bytes, bytes read
#      from the disk (/proc/diskstats)
#   4. a pgjet chain: full + CHAIN incr, another change before each; a full right after (and
#      pgBackRest's own chain and full beside it, each member taken right after pgjet's); timed
#      restore of the last incr against restore of that full, each tool's, and this machine's write limit
#      for the same bytes (dd_direct: `dd oflag=direct` of as many incompressible bytes as
#      the backup's files hold, from /dev/shm, then sync), the restore's reads alone (dd_read)
#      and its I/O at once (dd_read_write: the same while the full's stored objects are read);
#      pgjet's two restores again from a copy of the repository in /dev/shm (*_mem)
#   5. the report (IREPORT), with the issue's targets MET / NOT MET
#
# Settings, besides those of bench/run.sh (SCALE, RANDOM_MB, RUNS, JOBS, PG_VERSION,
# BENCH_DIR, KEEP, SKIP_PGBACKREST, CHECK_RESTORE, COLD, PGJET):
#   IREPORT       markdown report (default $BENCH_DIR/results/incr.md)
#   CHAIN         incrementals in the restored chain (default 6)
#   RESTORE_RUNS  rounds of the chain's restore section (default 5 when RUNS is 3 or 4, else
#                 RUNS): the disk's speed drifts by a fifth between rounds here, and the
#                 write-limit target compares two of its timings
#   CHANGE_EVERY  one heap page and one random_bytes row in CHANGE_EVERY changes (default 100)
#   BUILD_PGBR=1  build pgBackRest from the source of its newest release (PGBR_RELEASE: a tag
#                 such as release/2.59.1, default latest) from GitHub, or from PGBR_SRC (a
#                 source tarball or directory), into $BENCH_DIR/pgbr-new (kept, reused)
#   PGBR_NEW      a pgBackRest binary to use as the block-incremental peer (no build)
# Run as root (servers and tools run as the OS user postgres through runuser).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/run.sh
source "$HERE/run.sh"

IREPORT=${IREPORT:-$RES/incr.md}
CHAIN=${CHAIN:-6}
CHANGE_EVERY=${CHANGE_EVERY:-100}
RESTORE_RUNS=${RESTORE_RUNS:-$(( RUNS >= 3 && RUNS < 5 ? 5 : RUNS ))}
BUILD_PGBR=${BUILD_PGBR:-0}
PGBR_NEW=${PGBR_NEW:-}
SHM_IN=${SHM_DIR:-/dev/shm/pgjet-incr-bench}   # dd_direct's input (removed at exit)
PGBR_RELEASE=${PGBR_RELEASE:-latest}
PGBR_SRC=${PGBR_SRC:-}

PJREPO=$BENCH/pgjet-repo-incr       # pgjet's repository (run.sh's cleanup removes pgjet-repo-*)
PGBB_FULL=$BENCH/pgbb-full          # pg_basebackup's full (PostgreSQL 17+)
PGBRN_DIR=$BENCH/pgbr-new           # pgBackRest built from source: bin/pgbackrest (kept)
PGBRN_CONF=$BENCH/pgbackrest-new.conf
PGBRN_REPO=$BENCH/pgbr-new-repo
READS=$RES/reads.tsv                # name, run, bytes read by the command + server, by the whole disk
CHANGES=$RES/changes.tsv            # change, heap pages of pgbench_accounts, of random_bytes, sum(abalance)
PAGES=$RES/changed-pages.tsv        # kind, pages with a newer LSN than the first change's start
CHAINF=$RES/chain.tsv               # member, label, type, stored bytes, seconds (pgjet's own)
PGBR_OLD=0                          # 1 = pgBackRest 2.45 (Debian) in the runs
PGBRN_BIN=""                        # the pgBackRest built from source, when there is one
PGBRN_VERSION=""
PGBB_INCR=0                         # 1 = pg_basebackup --incremental (PostgreSQL 17+)
NOTES=()                            # lines for the report's notes
DISK=""                             # /proc/diskstats name of the device holding $BENCH

note() { NOTES+=("$*"); say "note: $*"; }

incr_cleanup() {
    local rc=$?
    set +e
    [ "$KEEP" = 1 ] || rm -rf "$PGBB_FULL" "$PGBRN_REPO" "$BENCH/lock-new" "$BENCH/spool-new" "$BENCH/pgbr-build"
    rm -rf "$SHM_IN"
    (exit $rc)
    cleanup
}
trap incr_cleanup EXIT

# ------------------------------------------------------------------ measuring

# server_read_bytes -> read_bytes (/proc/PID/io: bytes the process had read from storage,
# page-cache hits not counted) summed over the source cluster's postmaster and its children
# but the archiver; the postmaster's figure includes the children it has reaped (a walsender
# that sent a base backup, a backend that ran pg_backup_start). The archiver is left out: its
# archive_command runs every tool's archive-push whichever tool's backup switched the segment.
# 0 when the cluster is stopped.
server_read_bytes() {
    local pm p v s=0
    pm=$(pg_cluster_pid "$PG" 2>/dev/null) || true
    if [ -z "$pm" ] || [ ! -d "/proc/$pm" ]; then echo 0; return 0; fi
    for p in $pm $(ps -o pid=,args= --ppid "$pm" 2>/dev/null | awk '$2 != "postgres:" || $3 != "archiver" {print $1}'); do
        v=$(awk '$1 == "read_bytes:" {print $2}' "/proc/$p/io" 2>/dev/null) || v=0
        s=$((s + ${v:-0}))
    done
    echo "$s"
}

# itimed NAME RUN CMD: timed (cold cache, GNU time, one row in $TIMES), and two counts of the
# bytes read from storage meanwhile, one row in $READS:
#   - read_bytes of the command's own processes (the bash -c that runs it reads its own
#     /proc/$$/io at the end: the children it reaped, and theirs, are included) plus the
#     growth of the source cluster's (server_read_bytes): what the command and the server on
#     its behalf (pg_basebackup's walsender) read
#   - the sectors read on $BENCH's disk (/proc/diskstats): the whole device, other processes'
#     reads included (a busy machine, or one whose cache was just dropped, reads for others too)
itimed() {
    local name=$1 run=$2 cmd=$3 d0 d1 s0 s1 own rc=0 iof=$LOGS/$1.run$2.io
    rm -f "$iof"
    d0=$(sectors_read); s0=$(server_read_bytes)
    timed "$name" "$run" "{ $cmd
}; __rc=\$?; awk '\$1 == \"read_bytes:\" {print \$2}' /proc/\$\$/io > $(q "$iof"); (exit \$__rc)" || rc=$?
    d1=$(sectors_read); s1=$(server_read_bytes)
    if [ "$rc" = 0 ]; then
        own=$(cat "$iof" 2>/dev/null || true)
        printf '%s\t%s\t%s\t%s\n' "$name" "$run" "$( [ -n "$own" ] && echo $((own + s1 - s0)))" \
            "$( [ -n "$DISK" ] && [ -n "$d0" ] && echo $(((d1 - d0) * 512)))" >>"$READS"
    fi
    return $rc
}

# record_bytes NAME BYTES: a size given by a tool (last run wins), in $SIZES as record_size's
record_bytes() {
    sed -i "/^$1\t/d" "$SIZES" 2>/dev/null || true
    [ -n "$2" ] && printf '%s\t%s\n' "$1" "$2" >>"$SIZES"
    return 0
}

psql_src() { psql_as "$PGV" "$PG" "$PORT" "$@"; }

# ------------------------------------------------------------------ pgjet helpers
pj_args() { pgjet_conn "$PJREPO"; }

# pj_info LABEL FIELD -> FIELD of backup LABEL in `pgjet info --output json` (lists joined by ",")
pj_info() {
    as_pg "$PGJET_BIN" info --stanza "$PGJET_STANZA" --repo-path "$PJREPO" --output json 2>/dev/null |
        python3 -c '
import json, sys
label, field = sys.argv[1:3]
for st in json.load(sys.stdin):
    for b in st.get("backups", []):
        if b["label"] == label:
            v = b.get(field, "")
            print(",".join(v) if isinstance(v, list) else v)
' "$1" "$2"
}

# json_field FILE FIELD -> FIELD of the JSON object in FILE (pgjet backup --output json)
json_field() {
    python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' "$1" "$2" 2>/dev/null || true
}

# pj_backup TYPE LOG: an untimed pgjet backup (zstd, --start-fast), its log in LOG and its
# JSON summary in LOG.json; prints the new label
pj_backup() {
    local args
    mapfile -t args < <(pj_args)
    as_pg "$PGJET_BIN" backup "${args[@]}" --type "$1" --start-fast --jobs "$JOBS" \
        --compress-type zstd --output json >"$2.json" 2>"$2" || { tail -n 5 "$2" | sed 's/^/      /' >&2; return 1; }
    json_field "$2.json" label
}

# ------------------------------------------------------------------ pgBackRest helpers
# pgbr_newest REPO -> the newest backup label (any type) of stanza zst in REPO
pgbr_newest() { (cd "$1/backup/zst" 2>/dev/null && ls -d [0-9]*[FDI] 2>/dev/null | sort | tail -n 1); }

# pgbr_stored BIN CONF LABEL -> bytes backup LABEL stored in the repository (info: repository delta)
pgbr_stored() {
    as_pg "$1" --config="$2" --stanza=zst --output=json info 2>/dev/null | python3 -c '
import json, sys
for st in json.load(sys.stdin):
    for b in st.get("backup", []):
        if b["label"] == sys.argv[1]:
            print(b["info"]["repository"]["delta"])
' "$3" || true
}

# build_pgbr_new: pgBackRest from source (BUILD_PGBR=1) into $PGBRN_DIR/bin/pgbackrest: the
# newest release's tarball from GitHub (or PGBR_SRC), its build dependencies from Debian,
# meson + ninja. A build of the same version already there is reused. Non-zero, with a note
# saying why, when it cannot be built here.
build_pgbr_new() {
    local tag url src=$BENCH/pgbr-build t0=$SECONDS log=$LOGS/pgbr-build.log loc deps=() p top
    : >"$log"
    if [ -n "$PGBR_SRC" ]; then
        tag="local:$(basename "$PGBR_SRC")"
    else
        tag=$PGBR_RELEASE
        if [ "$tag" = latest ]; then
            # the releases/latest page redirects to .../releases/tag/release/X.Y.Z
            loc=$(curl -fsSI --max-time 20 https://github.com/pgbackrest/pgbackrest/releases/latest 2>>"$log" |
                awk 'tolower($1) == "location:" {print $2}' | tr -d '\r') || true
            if [ -z "$loc" ] && [ -x "$PGBRN_DIR/bin/pgbackrest" ]; then
                PGBRN_BUILD_NOTE="github.com not reachable: the build of an earlier run ($(cat "$PGBRN_DIR/SOURCE" 2>/dev/null)) reused"
                say "pgBackRest from source: $PGBRN_BUILD_NOTE"
                return 0
            elif [ -z "$loc" ]; then
                note "pgBackRest from source: not built: github.com is not reachable from this machine ($(tail -n 1 "$log"))"
                return 1
            fi
            tag=${loc#*/releases/tag/}
        fi
    fi
    if [ -x "$PGBRN_DIR/bin/pgbackrest" ] && [ "$(cat "$PGBRN_DIR/SOURCE" 2>/dev/null)" = "$tag" ]; then
        say "pgBackRest from source: reusing $PGBRN_DIR ($tag)"
        PGBRN_BUILD_NOTE="reused the build of an earlier run ($tag)"
        return 0
    fi
    header "Build pgBackRest from source ($tag)"
    for p in meson ninja-build gcc pkg-config libssl-dev libxml2-dev liblz4-dev libzstd-dev libbz2-dev \
        libyaml-dev libpq-dev libssh2-1-dev zlib1g-dev python3; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || deps+=("$p")
    done
    if [ ${#deps[@]} -gt 0 ]; then
        say "apt-get install ${deps[*]}"
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${deps[@]}" </dev/null >>"$log" 2>&1; then
            apt-get update -q </dev/null >>"$log" 2>&1 || true
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${deps[@]}" </dev/null >>"$log" 2>&1 || {
                note "pgBackRest from source: not built: apt-get could not install its build dependencies (${deps[*]}; log $log)"
                return 1
            }
        fi
    fi
    rm -rf "$src"
    mkdir -p "$src/src"
    if [ -d "$PGBR_SRC" ]; then
        cp -a "$PGBR_SRC/." "$src/src/"
    else
        if [ -n "$PGBR_SRC" ]; then
            cp "$PGBR_SRC" "$src/src.tar.gz"
        else
            url="https://github.com/pgbackrest/pgbackrest/archive/refs/tags/$tag.tar.gz"
            say "download $url"
            curl -fsSL --max-time 300 -o "$src/src.tar.gz" "$url" >>"$log" 2>&1 || {
                note "pgBackRest from source: not built: the download of $url did not succeed ($(tail -n 1 "$log"))"
                return 1
            }
        fi
        tar -C "$src/src" -xzf "$src/src.tar.gz" >>"$log" 2>&1 || { note "pgBackRest from source: not built: the tarball does not extract (log $log)"; return 1; }
        # a GitHub tarball has one top directory
        top=$(find "$src/src" -mindepth 1 -maxdepth 1 -type d)
        [ "$(printf '%s\n' "$top" | wc -l)" = 1 ] && [ -f "$top/meson.build" ] && { mv "$top" "$src/tree"; rm -rf "$src/src"; mv "$src/tree" "$src/src"; }
    fi
    [ -f "$src/src/meson.build" ] || { note "pgBackRest from source: not built: no meson.build in the source"; return 1; }
    if ! { meson setup "$src/build" "$src/src" >>"$log" 2>&1 && ninja -C "$src/build" src/pgbackrest >>"$log" 2>&1; }; then
        note "pgBackRest from source: not built: meson/ninja did not succeed (log $log)"
        return 1
    fi
    rm -rf "$PGBRN_DIR"
    mkdir -p "$PGBRN_DIR/bin"
    install -m 755 "$src/build/src/pgbackrest" "$PGBRN_DIR/bin/pgbackrest"
    printf '%s\n' "$tag" >"$PGBRN_DIR/SOURCE"
    chmod 755 "$PGBRN_DIR"
    rm -rf "$src"
    PGBRN_BUILD_NOTE="built from source ($tag) in $((SECONDS - t0)) s (dependencies, meson, ninja; log $log)"
    say "pgBackRest $PGBRN_BUILD_NOTE"
}

# prepare_pgbr_new: sets PGBRN_BIN when a pgBackRest for the block-incremental row is at hand
prepare_pgbr_new() {
    PGBRN_BUILD_NOTE=""
    if [ -n "$PGBR_NEW" ]; then
        if [ -x "$PGBR_NEW" ]; then
            install -m 755 "$PGBR_NEW" "$BENCH/bin/pgbackrest-new"
            PGBRN_BIN=$BENCH/bin/pgbackrest-new
            PGBRN_BUILD_NOTE="binary given: $PGBR_NEW"
        else
            note "pgBackRest block incremental: left out: PGBR_NEW=$PGBR_NEW is not an executable"
            return 0
        fi
    elif [ "$BUILD_PGBR" = 1 ]; then
        build_pgbr_new || return 0
        PGBRN_BIN=$PGBRN_DIR/bin/pgbackrest
    else
        NOTES+=("pgBackRest block incremental (a build from source): not run (BUILD_PGBR=1, or PGBR_NEW=PATH, includes it)")
        return 0
    fi
    if ! PGBRN_VERSION=$(as_pg "$PGBRN_BIN" version 2>&1); then
        note "pgBackRest block incremental: left out: '$PGBRN_BIN version' does not run ($PGBRN_VERSION)"
        PGBRN_BIN=""
        return 0
    fi
    say "block-incremental peer: $PGBRN_VERSION ($PGBRN_BUILD_NOTE)"
}

# setup_pgbr_new: its own repository (bundles and block incremental), lock, spool and log
# paths, stanza zst with compress-type=zst, process-max=JOBS, as the 2.45 stanza
setup_pgbr_new() {
    header "$PGBRN_VERSION: stanza 'zst', repo1-bundle=y, repo1-block=y"
    rm -rf "$PGBRN_REPO" "$BENCH/lock-new" "$BENCH/spool-new"
    mkdir -p "$PGBRN_REPO" "$BENCH/lock-new" "$BENCH/spool-new" "$LOGS/pgbackrest-new"
    chown postgres: "$PGBRN_REPO" "$BENCH/lock-new" "$BENCH/spool-new" "$LOGS/pgbackrest-new"
    cat >"$PGBRN_CONF" <<EOF
[global]
repo1-path=$PGBRN_REPO
repo1-retention-full=9999999
repo1-bundle=y
repo1-block=y
lock-path=$BENCH/lock-new
spool-path=$BENCH/spool-new
log-path=$LOGS/pgbackrest-new
log-level-console=warn
log-level-file=info
process-max=$JOBS
start-fast=y
archive-check=y
archive-copy=n

[zst]
pg1-path=$PGDATA
pg1-port=$PORT
pg1-socket-path=$PG/sock
compress-type=zst
EOF
    chmod 644 "$PGBRN_CONF"
    if ! as_pg "$PGBRN_BIN" --config="$PGBRN_CONF" --stanza=zst stanza-create >"$LOGS/pgbr-new-stanza.log" 2>&1; then
        note "pgBackRest block incremental: left out: stanza-create did not succeed (log $LOGS/pgbr-new-stanza.log)"
        PGBRN_BIN=""
    fi
}
pgbrn() { pg_cmd "$PGBRN_BIN" --config="$PGBRN_CONF" "$@"; }

# ------------------------------------------------------------------ set-up
# incr_setup: autovacuum off (every run starts from the same pages), pageinspect (the exact
# count of changed pages), summarize_wal on PostgreSQL 17+ (pg_basebackup --incremental), and
# each tool archiving into its own archive (archive_all), as bench/run.sh does
incr_setup() {
    local cmds=()
    pgjet_fresh_repo "$PJREPO" || die "pgjet stanza-create failed"
    cmds+=("$PGJET_BIN --stanza=$PGJET_STANZA --repo-path=$PJREPO archive-push %p")
    [ "$PGBR_OLD" = 1 ] && cmds+=("pgbackrest --config=$PGBR_CONF --stanza=zst archive-push %p")
    [ -n "$PGBRN_BIN" ] && cmds+=("$PGBRN_BIN --config=$PGBRN_CONF --stanza=zst archive-push %p")
    psql_src >/dev/null <<SQL
CREATE EXTENSION IF NOT EXISTS pageinspect;
ALTER SYSTEM SET autovacuum = off;
ALTER SYSTEM SET archive_mode = on;
ALTER SYSTEM SET archive_command = '$(archive_all "${cmds[@]}")';
$( [ "$PGBB_INCR" = 1 ] && echo "ALTER SYSTEM SET summarize_wal = on;" )
SQL
    as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w restart -l "$PG/log" >/dev/null
    if [ "$PGBR_OLD" = 1 ]; then
        as_pg pgbackrest --config="$PGBR_CONF" --stanza=zst check
    fi
    if [ -n "$PGBRN_BIN" ] && ! as_pg "$PGBRN_BIN" --config="$PGBRN_CONF" --stanza=zst check >"$LOGS/pgbr-new-check.log" 2>&1; then
        note "pgBackRest block incremental: left out: 'check' did not succeed (log $LOGS/pgbr-new-check.log)"
        PGBRN_BIN=""
    fi
    say "autovacuum=off; archive_mode=on, archive_command pushes into pgjet's repository$( [ "$PGBR_OLD" = 1 ] && echo ", pgBackRest 2.45's stanza")$( [ -n "$PGBRN_BIN" ] && echo ", the built pgBackRest's stanza")$( [ "$PGBB_INCR" = 1 ] && echo "; summarize_wal=on")"
}

# ------------------------------------------------------------------ 1. full backups (untimed)
PJ_FULL=""
full_backups() {
    local label log
    header "Full backups (untimed)"
    log=$LOGS/full-pgjet.log
    label=$(pj_backup full "$log") || die "pgjet full backup did not succeed (log $log)"
    PJ_FULL=$label
    record_size pgjet_full "$PJREPO/$PGJET_STANZA/backup/$label"
    record_bytes pgjet_full_stored "$(pj_info "$label" stored_size)"
    say "pgjet full $label: $(mib "$(size_of pgjet_full_stored)") MiB stored"
    if [ "$PGBR_OLD" = 1 ]; then
        log=$LOGS/full-pgbackrest.log
        if as_pg pgbackrest --config="$PGBR_CONF" --stanza=zst --type=full backup >"$log" 2>&1; then
            label=$(pgbr_newest "$PGBR_REPO")
            record_size pgbackrest_full "$PGBR_REPO/backup/zst/$label"
            record_bytes pgbackrest_full_stored "$(pgbr_stored pgbackrest "$PGBR_CONF" "$label")"
            say "pgBackRest 2.45 full $label: $(mib "$(size_of pgbackrest_full_stored)") MiB stored"
        else
            failed pgbackrest_full 0 "log $log"
            PGBR_OLD=0
        fi
    fi
    if [ -n "$PGBRN_BIN" ]; then
        log=$LOGS/full-pgbackrest-new.log
        if as_pg "$PGBRN_BIN" --config="$PGBRN_CONF" --stanza=zst --type=full backup >"$log" 2>&1; then
            label=$(pgbr_newest "$PGBRN_REPO")
            record_size pgbackrest_new_full "$PGBRN_REPO/backup/zst/$label"
            record_bytes pgbackrest_new_full_stored "$(pgbr_stored "$PGBRN_BIN" "$PGBRN_CONF" "$label")"
            say "pgBackRest (block incremental) full $label: $(mib "$(size_of pgbackrest_new_full_stored)") MiB stored"
        else
            failed pgbackrest_new_full 0 "log $log"
            PGBRN_BIN=""
        fi
    fi
    if [ "$PGBB_INCR" = 1 ]; then
        log=$LOGS/full-pg_basebackup.log
        fresh_dir "$PGBB_FULL"
        if as_pg "$PGBIN/pg_basebackup" -h "$PG/sock" -p "$PORT" -U postgres -D "$PGBB_FULL" -Fp -Xstream -c fast >"$log" 2>&1; then
            record_size pg_basebackup_full "$PGBB_FULL"
            record_bytes pg_basebackup_full_stored "$(size_of pg_basebackup_full)"
            say "pg_basebackup full: $(mib "$(size_of pg_basebackup_full)") MiB"
        else
            failed pg_basebackup_full 0 "log $log"
            PGBB_INCR=0
        fi
    fi
}

# ------------------------------------------------------------------ 2. the change
# apply_change K: the K-th change (K = 1, 2, ...), in one transaction per table, then a
# CHECKPOINT. pgbench_accounts: the row at line pointer 1 of every CHANGE_EVERY-th heap page
# (pages K-1, K-1+CHANGE_EVERY, ...; another set each change), abalance + 1: mostly not HOT
# (pgbench fills its pages), so its old page, its new page and an index page change. random_bytes:
# the rows with id % CHANGE_EVERY = K % CHANGE_EVERY get new bytes (one byte changed, the whole
# 1 MiB TOAST value written again: new TOAST pages, and the old value's pages marked deleted).
# Counts, exactly, the distinct heap pages the updated rows came from and went to (old ctid,
# new ctid from RETURNING); TOAST and index pages are not in that count. One row in $CHANGES.
apply_change() {
    local k=$1 off out acc rnd
    off=$(( (k - 1) % CHANGE_EVERY ))
    out=$(psql_src -At <<SQL
WITH old AS (
    SELECT ctid AS c FROM pgbench_accounts
    WHERE ctid = ANY (ARRAY(SELECT format('(%s,1)', b)::tid
                            FROM generate_series($off, pg_relation_size('pgbench_accounts') / 8192 - 1, $CHANGE_EVERY) b))),
upd AS (
    UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE ctid = ANY (ARRAY(SELECT c FROM old))
    RETURNING ctid AS c)
SELECT count(DISTINCT (c::text::point)[0]) FROM (SELECT c FROM old UNION ALL SELECT c FROM upd) x;
WITH old AS (SELECT id, ctid AS c FROM random_bytes WHERE id % $CHANGE_EVERY = $((k % CHANGE_EVERY))),
upd AS (
    UPDATE random_bytes r SET payload = overlay(r.payload PLACING decode(lpad(to_hex($k % 256), 2, '0'), 'hex') FROM 1 + $k)
    FROM old WHERE r.id = old.id
    RETURNING r.ctid AS c)
SELECT count(DISTINCT (c::text::point)[0]) FROM (SELECT c FROM old UNION ALL SELECT c FROM upd) x;
CHECKPOINT;
SQL
)
    acc=$(sed -n 1p <<<"$out"); rnd=$(sed -n 2p <<<"$out")
    SRC_ROWS=$(psql_src -Atc "SELECT count(*), sum(abalance) FROM pgbench_accounts")
    printf '%s\t%s\t%s\t%s\n' "$k" "$acc" "$rnd" "$SRC_ROWS" >>"$CHANGES"
    say "change $k: heap pages changed: pgbench_accounts $acc, random_bytes $rnd; pgbench_accounts count|sum(abalance) now $SRC_ROWS"
}

# count_changed LSN: every main-fork page (permanent relations of database postgres, catalogs
# included) whose page LSN is at or after LSN, read with pageinspect, by kind, into $PAGES
count_changed() {
    psql_src -At -F $'\t' >"$PAGES" <<SQL
SELECT CASE WHEN c.oid < 16384 THEN 'catalog'
            WHEN c.relkind = 'i' THEN 'index'
            WHEN c.relkind = 't' THEN 'toast'
            ELSE 'heap' END AS kind,
       count(*) FILTER (WHERE (page_header(get_raw_page(c.oid::regclass::text, 'main', b))).lsn >= '$1') AS changed,
       count(*) AS pages
FROM pg_class c
CROSS JOIN LATERAL generate_series(0, pg_relation_size(c.oid) / 8192 - 1) b
WHERE c.relkind IN ('r', 'i', 't', 'm', 'S') AND c.relpersistence = 'p'
GROUP BY 1 ORDER BY 1;
SQL
    say "main-fork pages with an LSN at or after $1 (kind, changed, of pages): $(awk -F'\t' '{printf "%s%s %s/%s", s, $1, $2, $3; s="; "}' "$PAGES")"
}

# ------------------------------------------------------------------ 3. one round of incrementals
incr_round() {
    local r=$1 label args o c
    itimed read_pgdata "$r" "tar -C $(q "$PGDATA") --warning=no-file-changed --warning=no-file-removed $TAR_EXCLUDE -cf - . | cat >/dev/null" || true

    mapfile -t args < <(pj_args)
    if itimed pgjet_incr "$r" "$(pg_cmd "$PGJET_BIN" backup "${args[@]}" --type incr --start-fast --jobs "$JOBS" --compress-type zstd)"; then
        label=$(pgjet_latest "$PJREPO")
        if [ "$label" != "$PJ_FULL" ]; then
            [ "$(pj_info "$label" type)" = incr ] || say "  WARNING: pgjet's backup $label is not an incr (type $(pj_info "$label" type)): see $LOGS/pgjet_incr.run$r.log"
            record_size pgjet_incr "$PJREPO/$PGJET_STANZA/backup/$label"
            record_bytes pgjet_incr_stored "$(pj_info "$label" stored_size)"
            # the next run starts from the same point: its reference is the full again
            rm -rf "${PJREPO:?}/$PGJET_STANZA/backup/$label"
        fi
    fi

    if [ "$PGBR_OLD" = 1 ]; then
        if itimed pgbackrest_incr "$r" "$(pgbr --stanza=zst --type=incr backup)"; then
            label=$(pgbr_newest "$PGBR_REPO")
            record_size pgbackrest_incr "$PGBR_REPO/backup/zst/$label"
            record_bytes pgbackrest_incr_stored "$(pgbr_stored pgbackrest "$PGBR_CONF" "$label")"
            as_pg pgbackrest --config="$PGBR_CONF" --stanza=zst --set="$label" expire >>"$LOGS/pgbackrest-expire.log" 2>&1 ||
                say "  could not expire pgBackRest's $label (log $LOGS/pgbackrest-expire.log): the next run builds on it"
        fi
    fi

    if [ -n "$PGBRN_BIN" ]; then
        if itimed pgbackrest_new_incr "$r" "$(pgbrn --stanza=zst --type=incr backup)"; then
            label=$(pgbr_newest "$PGBRN_REPO")
            record_size pgbackrest_new_incr "$PGBRN_REPO/backup/zst/$label"
            record_bytes pgbackrest_new_incr_stored "$(pgbr_stored "$PGBRN_BIN" "$PGBRN_CONF" "$label")"
            as_pg "$PGBRN_BIN" --config="$PGBRN_CONF" --stanza=zst --set="$label" expire >>"$LOGS/pgbackrest-new-expire.log" 2>&1 ||
                say "  could not expire the built pgBackRest's $label (log $LOGS/pgbackrest-new-expire.log): the next run builds on it"
        fi
    fi

    if [ "$PGBB_INCR" = 1 ]; then
        o=$OUT/pgbb-incr
        c=$OUT/pgbb-combined
        fresh_dir "$o"
        rm -rf "$c"
        if itimed pg_basebackup_incr "$r" "$(pg_cmd "$PGBIN/pg_basebackup" -h "$PG/sock" -p "$PORT" -U postgres \
                -D "$o" -Fp -Xstream -c fast --incremental="$PGBB_FULL/backup_manifest")"; then
            record_size pg_basebackup_incr "$o"
            record_bytes pg_basebackup_incr_stored "$(size_of pg_basebackup_incr)"
            if itimed pg_combinebackup "$r" "$(pg_cmd "$PGBIN/pg_combinebackup" "$PGBB_FULL" "$o" -o "$c")"; then
                record_size pg_combinebackup "$c"
                [ "$CHECK_RESTORE" = 1 ] && [ "$r" = "$RUNS" ] && check_restored pg_combinebackup "$c"
            fi
        fi
        rm -rf "$o" "$c"
    fi
}

# ------------------------------------------------------------------ 4. a chain, restored
CHAIN_LAST=""
PJ_FULL2=""
# The pgBackRest chains built beside pgjet's, the same members at the same moments (its full
# of step 1, an incr after each change, a full of the same data at the end): tool -> label.
# A tool is `pgbackrest` (2.45, Debian) or `pgbackrest_new` (the build from source).
declare -A PEER_CHAIN_LAST PEER_FULL2

# peer_tools -> the pgBackRest tools in this run, one per line
peer_tools() {
    [ "$PGBR_OLD" = 1 ] && echo pgbackrest
    [ -n "$PGBRN_BIN" ] && echo pgbackrest_new
    return 0
}
# peer_chain_tools -> the tools whose chain is complete (built without a failure)
peer_chain_tools() {
    local t
    for t in $(peer_tools); do [ -n "${PEER_FULL2[$t]:-}" ] && echo "$t"; done
    return 0
}
# peer_cmd TOOL ARGS... -> the command line (as postgres) of TOOL with its config
peer_cmd() {
    local t=$1
    shift
    if [ "$t" = pgbackrest ]; then pgbr "$@"; else pgbrn "$@"; fi
}
peer_repo() { if [ "$1" = pgbackrest ]; then echo "$PGBR_REPO"; else echo "$PGBRN_REPO"; fi; }
# peer_backup TOOL TYPE LOG -> the new label (untimed; the log in LOG)
peer_backup() {
    bash -c "$(peer_cmd "$1" --stanza=zst --type="$2" backup)" >"$3" 2>&1 || { tail -n 5 "$3" | sed 's/^/      /' >&2; return 1; }
    pgbr_newest "$(peer_repo "$1")"
}

# peer_chain_step TOOL TYPE I: one member of TOOL's chain (I: the incr's number, or "full");
# a failure leaves TOOL's chain out of the restores, with a note
PEER_DROPPED=()
peer_chain_step() {
    local t=$1 typ=$2 i=$3 label log=$LOGS/chain-$1-$3.log
    [[ " ${PEER_DROPPED[*]} " == *" $t "* ]] && return 0
    if label=$(peer_backup "$t" "$typ" "$log") && [ -n "$label" ]; then
        if [ "$typ" = full ]; then PEER_FULL2[$t]=$label; else PEER_CHAIN_LAST[$t]=$label; fi
        say "  $t $typ $i: $label"
    else
        note "$t's chain left out of the restores: its $typ $i did not succeed (log $log)"
        PEER_DROPPED+=("$t")
    fi
}

build_chain() {
    local i label log t
    header "A pgjet chain: the full, then $CHAIN incr with a change before each (untimed)$( [ -n "$(peer_tools)" ] && echo "; pgBackRest's beside it")"
    : >"$CHAINF"
    printf '0\t%s\tfull\t%s\t%s\n' "$PJ_FULL" "$(size_of pgjet_full_stored)" "$(json_field "$LOGS/full-pgjet.log.json" seconds)" >>"$CHAINF"
    for i in $(seq 1 "$CHAIN"); do
        # change 1 was made before the timed runs; their incrs are gone again
        [ "$i" = 1 ] || apply_change "$i"
        log=$LOGS/chain-incr-$i.log
        label=$(pj_backup incr "$log") || die "pgjet incr $i of the chain did not succeed (log $log)"
        printf '%s\t%s\t%s\t%s\t%s\n' "$i" "$label" "$(pj_info "$label" type)" "$(pj_info "$label" stored_size)" \
            "$(json_field "$log.json" seconds)" >>"$CHAINF"
        say "incr $i: $label, $(pj_info "$label" type), $(mib "$(pj_info "$label" stored_size)") MiB stored, depends on $(pj_info "$label" depends_on)"
        CHAIN_LAST=$label
        for t in $(peer_tools); do peer_chain_step "$t" incr "$i"; done
    done
    log=$LOGS/chain-full.log
    PJ_FULL2=$(pj_backup full "$log") || die "pgjet full after the chain did not succeed (log $log)"
    record_bytes pgjet_full2_stored "$(pj_info "$PJ_FULL2" stored_size)"
    say "full of the same data: $PJ_FULL2, $(mib "$(size_of pgjet_full2_stored)") MiB stored"
    for t in $(peer_tools); do peer_chain_step "$t" full full; done
    # Restores need no server; a stopped one adds no noise. Its last segments reach the
    # archives first.
    archiver_idle "$PGDATA" || true
    pg_stop_cluster "$PG"
    # the write limit's input: as many incompressible bytes as the backup's files hold
    local size
    size=$(pj_info "$PJ_FULL2" size)
    rm -rf "$SHM_IN"; mkdir -p "$SHM_IN"
    head -c "$(( (size + 4095) / 4096 * 4096 ))" /dev/urandom >"$SHM_IN/rand"
    record_bytes dd_direct_bytes "$size"
    # the same repository in memory: restores whose reads cost the disk nothing
    cp -a "$PJREPO" "$SHM_IN/repo"
}

# round_order R -> the order of a round's two restores: odd rounds the chain first, even
# rounds the full first
round_order() { if [ $(($1 % 2)) = 1 ]; then echo "chain full"; else echo "full chain"; fi; }

restore_round() {
    local r=$1 which set o t repo n
    # the write limit first in each round, as bench/restore.sh times it
    o=$OUT/dd.out
    rm -f "$o"
    itimed dd_direct "$r" "dd if=$(q "$SHM_IN/rand") of=$(q "$o") bs=8M oflag=direct status=none" || true
    rm -f "$o"
    itimed dd_read_write "$r" "$(dd_read_write_cmd "$PJREPO/$PGJET_STANZA/backup/$PJ_FULL2" "$SHM_IN/rand" "$o")" || true
    rm -f "$o"
    itimed dd_read "$r" "$(dd_read_cmd "$PJREPO/$PGJET_STANZA/backup/$PJ_FULL2")" || true
    # pgjet's two restores (round_order), then the same from the repository in memory (its
    # name ends in _mem)
    for repo in "$PJREPO" "$SHM_IN/repo"; do
        for which in $(round_order "$r"); do
            if [ "$which" = chain ]; then set=$CHAIN_LAST; else set=$PJ_FULL2; fi
            n=pgjet_restore_$which$( [ "$repo" = "$PJREPO" ] || echo _mem)
            o=$OUT/restore-$which
            fresh_dir "$o"
            itimed "$n" "$r" "$(pg_cmd "$PGJET_BIN" restore --stanza "$PGJET_STANZA" --repo-path "$repo" \
                --set "$set" --pg-path "$o" --jobs "$JOBS")" || true
            record_size "$n" "$o"
            [ "$CHECK_RESTORE" = 1 ] && [ "$r" = "$RESTORE_RUNS" ] && [ "$repo" = "$PJREPO" ] && check_restored "$n" "$o"
            rm -rf "$o"
        done
    done
    # pgBackRest's chain and full of the same data, in the same order (recovery settings as
    # its restore writes them by default: to the end of the archived WAL, then promote)
    for t in $(peer_chain_tools); do
        for which in $(round_order "$r"); do
            if [ "$which" = chain ]; then set=${PEER_CHAIN_LAST[$t]}; else set=${PEER_FULL2[$t]}; fi
            o=$OUT/restore-$t-$which
            fresh_dir "$o"
            itimed "${t}_restore_$which" "$r" "$(peer_cmd "$t" --stanza=zst --set="$set" --pg1-path="$o" restore)" || true
            record_size "${t}_restore_$which" "$o"
            [ "$CHECK_RESTORE" = 1 ] && [ "$r" = "$RESTORE_RUNS" ] && check_restored "${t}_restore_$which" "$o"
            rm -rf "$o"
        done
    done
}

# ------------------------------------------------------------------ 5. report
reads_med() {  # reads_med NAME COL: median of column COL (3: command + server, 4: disk) of $READS
    awk -F'\t' -v n="$1" -v c="$2" '$1 == n && $c != "" {print $c}' "$READS" | stdin_median
}
fmt_s() { [ -n "$1" ] && printf '%.2f' "$1"; }
fmt_mib() { [ -n "$1" ] && awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN {if (a != "" && b != "" && b > 0) printf "%.2f", a / b}'; }
# verdict VALUE OP LIMIT -> MET / NOT MET (n/a when VALUE is empty)
verdict() {
    [ -n "$1" ] || { echo "n/a"; return; }
    if awk -v v="$1" -v l="$3" -v op="$2" 'BEGIN {exit !((op == "le" && v <= l) || (op == "ge" && v >= l))}'; then
        echo MET
    else
        echo "NOT MET"
    fi
}

declare -A IDESCR
# shellcheck disable=SC2016
incr_descr() {
IDESCR[read_pgdata]='`tar -C PGDATA --exclude=./pg_wal/0* -cf - . | cat > /dev/null`: every byte of the data directory read once (the limit for a backup that reads every page)'
IDESCR[pgjet_incr]='`pgjet backup --type incr --start-fast --jobs '$JOBS' --compress-type zstd`'
IDESCR[pgbackrest_incr]='`pgbackrest backup --type=incr`, 2.45 (Debian): file level, compress-type=zst, process-max='$JOBS
IDESCR[pgbackrest_new_incr]='`pgbackrest backup --type=incr`, '"${PGBRN_VERSION#pgBackRest }"': repo1-block=y, repo1-bundle=y, compress-type=zst, process-max='$JOBS
IDESCR[pg_basebackup_incr]='`pg_basebackup -D OUT -Fp -Xstream -c fast --incremental=FULL/backup_manifest` (summarize_wal=on)'
IDESCR[pg_combinebackup]='`pg_combinebackup FULL INCR -o OUT`: what a restore of that incremental needs first'
IDESCR[pgjet_restore_chain]="\`pgjet restore --set <incr $CHAIN of the chain> --jobs $JOBS\` (full + $CHAIN incr)"
IDESCR[pgjet_restore_full]="\`pgjet restore --set <full of the same data> --jobs $JOBS\`"
IDESCR[pgbackrest_restore_chain]="\`pgbackrest restore --set <incr $CHAIN of its chain>\`, 2.45 (Debian): its full + $CHAIN file-level incr, process-max=$JOBS"
IDESCR[pgbackrest_restore_full]="\`pgbackrest restore --set <its full of the same data>\`, 2.45 (Debian), process-max=$JOBS"
IDESCR[pgbackrest_new_restore_chain]="\`pgbackrest restore --set <incr $CHAIN of its chain>\`, ${PGBRN_VERSION#pgBackRest }: its full + $CHAIN block incr, process-max=$JOBS"
IDESCR[pgbackrest_new_restore_full]="\`pgbackrest restore --set <its full of the same data>\`, ${PGBRN_VERSION#pgBackRest }, process-max=$JOBS"
IDESCR[pgjet_restore_chain_mem]="pgjet_restore_chain from a copy of the repository in /dev/shm: its reads cost the disk nothing"
IDESCR[pgjet_restore_full_mem]="pgjet_restore_full from a copy of the repository in /dev/shm: its reads cost the disk nothing"
IDESCR[dd_read]="the full's stored objects read alone (\`dd iflag=direct\`, 4 at once): a restore's reads, by plain tools"
IDESCR[dd_read_write]="dd_direct while the full's stored objects are read (\`dd iflag=direct\`, 4 at once): a restore's reads and writes at once, by plain tools (not a tight limit: they overlap less than pgjet)"
IDESCR[dd_direct]="\`dd if=<incompressible bytes in /dev/shm> of=OUT bs=8M oflag=direct\`, as many bytes as the full's files hold: this machine's write limit"
}

# irow NAME: one line of a results table (ratio against pgjet's NAME in $2)
irow() {
    local n=$1 base=$2 med rss fails stored dir rd rdisk ratio
    med=$(median "$n"); rss=$(median "$n" 4); fails=$(nfail "$n")
    [ -z "$med" ] && [ "$fails" = 0 ] && return 0
    stored=$(size_of "${n}_stored"); dir=$(size_of "$n"); rd=$(reads_med "$n" 3); rdisk=$(reads_med "$n" 4)
    ratio=$(div "$med" "$(median "$base")")
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$n" "${IDESCR[$n]//|/\\|}" \
        "$( [ -n "$med" ] && fmt_s "$med" || echo FAILED)$( [ "$fails" -gt 0 ] && [ -n "$med" ] && echo " ($fails failed)")" \
        "$(minmax "$n")" "${ratio:+$ratio×}" "$( [ -n "$rss" ] && mib "$((${rss%.*} * 1024))")" \
        "${stored:+$(fmt_mib "$stored")}" "${dir:+$(fmt_mib "$dir")}" "${rd:+$(fmt_mib "$rd")}" "${rdisk:+$(fmt_mib "$rdisk")}"
}

write_incr_report() {
    local acc rnd heap heap_b all all_b stored pj pgbr pgbb chain full n
    acc=$(awk -F'\t' '$1 == 1 {print $2}' "$CHANGES"); rnd=$(awk -F'\t' '$1 == 1 {print $3}' "$CHANGES")
    heap=$(( ${acc:-0} + ${rnd:-0} )); heap_b=$((heap * 8192))
    all=$(awk -F'\t' '{s += $2} END {print s + 0}' "$PAGES"); all_b=$((all * 8192))
    stored=$(size_of pgjet_incr_stored)
    pj=$(median pgjet_incr); pgbr=$(median pgbackrest_incr); pgbb=$(median pg_basebackup_incr)
    chain=$(median pgjet_restore_chain); full=$(median pgjet_restore_full)
    incr_descr
    {
        echo "# pgjet incremental backup benchmark"
        echo
        echo "Written by \`bench/incr.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'). Medians of $RUNS run(s) per command;"
        if [ "$DROP_CACHES" = yes ]; then
            echo "page cache dropped (\`sync; echo 3 > /proc/sys/vm/drop_caches\`) before every timed run, \`sync\` inside every timing."
        else
            echo "**page cache NOT dropped** before the timed runs (COLD=0, or drop_caches not permitted here): the times and bytes read mean little."
        fi
        echo
        echo "- $(nproc) CPUs, $(free -g | awk '/^Mem:/ {print $2 " GiB"}'); bench dir \`$BENCH\` on $(df -T "$BENCH" | awk 'NR==2 {print $2 " (" $1 ")"}')"
        echo "- PostgreSQL: $("$PGBIN/postgres" --version); pgjet: ${PGJET_VERSION:-?}, commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$( [ -n "$(git -C "$ROOT" status --porcelain -- src 2>/dev/null)" ] && echo ' (src/ modified)')"
        echo "- pgBackRest: $( [ "$PGBR_OLD" = 1 ] && pgbackrest version || echo 'Debian 2.45 not run')$( [ -n "$PGBRN_BIN" ] && echo "; $PGBRN_VERSION ($PGBRN_BUILD_NOTE)")"
        echo "- cluster: \`pgbench -i -s $SCALE\` + $RANDOM_MB MiB of random bytes (bench/run.sh's build_cluster), data checksums on,"
        echo "  autovacuum off, PGDATA $(mib "$(size_of cluster)") MiB; JOBS=$JOBS"
        echo
        echo "## The change"
        echo
        echo "One row on every ${CHANGE_EVERY}th heap page of pgbench_accounts (\`UPDATE ... SET abalance = abalance + 1\`, not HOT:"
        echo "the row moves to another page, and the primary key gets an entry), and the bytes of every ${CHANGE_EVERY}th row of"
        echo "random_bytes (1 MiB each, stored uncompressed in TOAST: the value is written again), then \`CHECKPOINT\`."
        echo
        echo "| changed 8 KiB pages | pages | MiB |"
        echo "|---|---:|---:|"
        echo "| heap pages the updated rows came from and went to (ctid): pgbench_accounts $acc, random_bytes $rnd (the first target's reference; index and TOAST pages not counted) | $heap | $(fmt_mib "$heap_b") |"
        if [ -s "$PAGES" ]; then
            while IFS=$'\t' read -r kind ch tot; do
                echo "| main-fork pages of kind *$kind* with a page LSN newer than the change's start (pageinspect; of $tot) | $ch | $(fmt_mib $((ch * 8192))) |"
            done <"$PAGES"
            echo "| every main-fork page with a newer page LSN (pageinspect, database postgres, catalogs included) | $all | $(fmt_mib "$all_b") |"
        fi
        echo
        echo "## Incremental backup after the change"
        echo
        echo "Each run starts from the same point: the new incremental is removed after each run (pgjet: its"
        echo "directory; pgBackRest: \`expire --set\`), so every incremental is taken against the full."
        echo
        echo "| name | command | median s | min–max s | time / pgjet's | peak RSS MiB | stored MiB | backup dir MiB | MiB read: command + server | MiB read: whole disk |"
        echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        for n in read_pgdata pgjet_incr pgbackrest_incr pgbackrest_new_incr pg_basebackup_incr pg_combinebackup; do
            irow "$n" pgjet_incr
        done
        echo
        echo "Stored: pgjet \`info\`'s stored_size (data objects, the backup's WAL included); pgBackRest \`info\`'s"
        echo "repository delta (\`archive-copy=n\`: its WAL is in the archive); pg_basebackup the directory. Backup dir:"
        echo "\`du -b\` of the backup's directory (pgBackRest bundles and pgjet objects). MiB read, command + server:"
        echo "\`read_bytes\` of /proc/PID/io (bytes fetched from storage, page-cache hits not counted) of the command's"
        echo "processes and of the source cluster's but its archiver (pg_basebackup's files are read by its walsender). Whole disk: sectors"
        echo "read on \`/dev/${DISK:-?}\` (/proc/diskstats) during the command, every process's reads included (after a"
        echo "cache drop the machine's other processes read again too)."
        echo "Peak RSS: the largest single process (GNU time)."
        echo
        echo "Full backups before the change (untimed), stored MiB: pgjet $(fmt_mib "$(size_of pgjet_full_stored)")$( [ -n "$(size_of pgbackrest_full_stored)" ] && echo ", pgBackRest 2.45 $(fmt_mib "$(size_of pgbackrest_full_stored)")")$( [ -n "$(size_of pgbackrest_new_full_stored)" ] && echo ", pgBackRest block incremental $(fmt_mib "$(size_of pgbackrest_new_full_stored)")")$( [ -n "$(size_of pg_basebackup_full)" ] && echo ", pg_basebackup $(fmt_mib "$(size_of pg_basebackup_full)")")."
        echo
        echo "## Restore: a chain against a full"
        echo
        echo "pgjet, one repository: the full, then $CHAIN incrementals with a change (as above, on other pages) before"
        echo "each; then a full of the same data. Timed: the restore of the last incremental and of that full, into"
        echo "empty directories, alternating which goes first; $RESTORE_RUNS rounds, each timing the write limit (dd_direct)"
        echo "first.$( [ -n "$(peer_chain_tools)" ] && echo " pgBackRest kept a chain of its own beside it, a member taken right after each of pgjet's (its full of step 1, an incr after each change, a full of the same data at the end), timed the same way after pgjet's two restores in each round; its restores recover to the end of the archived WAL, which after its last full holds no change.")"
        for t in $(peer_chain_tools); do
            echo
            echo "$t's chain: full ${PEER_CHAIN_LAST[$t]%%_*}, last incr ${PEER_CHAIN_LAST[$t]}, full of the same data ${PEER_FULL2[$t]}."
        done
        echo
        echo "| member | label | type | stored MiB | seconds (pgjet's own, warm) |"
        echo "|---|---|---|---:|---:|"
        while IFS=$'\t' read -r i label typ st sec; do
            printf '| %s | %s | %s | %s | %s |\n' "$( [ "$i" = 0 ] && echo full || echo "incr $i")" "$label" "$typ" "$(fmt_mib "$st")" "$(fmt_s "$sec")"
        done <"$CHAINF"
        echo
        echo "| name | command | median s | min–max s | time / full's | peak RSS MiB | stored MiB | restored MiB | MiB read: command | MiB read: whole disk |"
        echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        for n in dd_direct dd_read dd_read_write pgjet_restore_full pgjet_restore_chain pgjet_restore_full_mem \
            pgjet_restore_chain_mem pgbackrest_restore_full \
            pgbackrest_restore_chain pgbackrest_new_restore_full pgbackrest_new_restore_chain; do
            irow "$n" pgjet_restore_full
        done
        echo
        echo "## Targets"
        echo
        echo "| target | measured | |"
        echo "|---|---|---|"
        local v
        v=$(div "$stored" "$heap_b")
        echo "| pgjet incr stores ≤ 1.2× the changed heap pages' bytes (index and TOAST pages not counted) | $(fmt_mib "$stored") MiB / $(fmt_mib "$heap_b") MiB = ${v:-n/a}× | $(verdict "$v" le 1.2) |"
        if [ "$all" -gt 0 ]; then
            v=$(div "$stored" "$all_b")
            echo "| the same against every changed main-fork page (pageinspect: heap, TOAST, index, catalog) | $(fmt_mib "$stored") MiB / $(fmt_mib "$all_b") MiB = ${v:-n/a}× | $(verdict "$v" le 1.2) |"
        fi
        if [ "$PGBR_OLD" = 1 ] || [ -n "$pgbr" ]; then
            v=$(div "$pgbr" "$pj")
            echo "| pgjet incr ≥ 5× faster than pgBackRest 2.45's file-level incr | ${v:-n/a}× | $(verdict "$v" ge 5) |"
        else
            echo "| pgjet incr ≥ 5× faster than pgBackRest 2.45's file-level incr | not measured | n/a |"
        fi
        if [ "$PGBB_INCR" = 1 ] || [ -n "$pgbb" ]; then
            v=$(div "$pgbb" "$pj")
            echo "| pgjet incr ≥ 1.5× faster than pg_basebackup --incremental | ${v:-n/a}× | $(verdict "$v" ge 1.5) |"
        else
            echo "| pgjet incr ≥ 1.5× faster than pg_basebackup --incremental | not measured (PostgreSQL $PGV; needs 17+: PG_VERSION=18) | n/a |"
        fi
        v=$(div "$chain" "$full")
        echo "| restore of full + $CHAIN incr ≤ 1.2× the restore of a full | ${v:-n/a}× | $(verdict "$v" le 1.2) |"
        # at least 0.9x the write limit: time at most 1/0.9 of dd_direct's
        v=$(div "$(median dd_direct)" "$full")
        echo "| restore of a full ≥ 0.9× the write limit (dd_direct time / restore time) | ${v:-n/a}× | $(verdict "$v" ge 0.9) |"
        v=$(div "$(median dd_direct)" "$chain")
        echo "| restore of full + $CHAIN incr ≥ 0.9× the write limit (dd_direct time / restore time) | ${v:-n/a}× | $(verdict "$v" ge 0.9) |"
        echo "| (for reference) the same two, as the median of each round's ratio (dd_direct and the restore of one round) | full $(per_round_ratio dd_direct pgjet_restore_full "$RESTORE_RUNS")×, chain $(per_round_ratio dd_direct pgjet_restore_chain "$RESTORE_RUNS")× | |"
        for t in pgbackrest pgbackrest_new; do
            [ -n "$(median "${t}_restore_full")$(median "${t}_restore_chain")" ] || continue
            if [ "$t" = pgbackrest ]; then n="pgBackRest 2.45 (file level)"; else n="${PGBRN_VERSION:-pgBackRest} (block incremental)"; fi
            v=$(div "$(median "${t}_restore_full")" "$full")
            echo "| restore of a full ≥ 1.0× $n (its time / pgjet's) | ${v:-n/a}× (per round $(per_round_ratio "${t}_restore_full" pgjet_restore_full "$RESTORE_RUNS")×) | $(verdict "$v" ge 1.0) |"
            v=$(div "$(median "${t}_restore_chain")" "$chain")
            echo "| restore of full + $CHAIN incr ≥ 1.0× $n's of its own chain (its time / pgjet's) | ${v:-n/a}× (per round $(per_round_ratio "${t}_restore_chain" pgjet_restore_chain "$RESTORE_RUNS")×) | $(verdict "$v" ge 1.0) |"
        done
        echo "| (for reference) the same two from the repository in memory (dd_direct time / restore time; the restore's reads cost the disk nothing) | full $(div "$(median dd_direct)" "$(median pgjet_restore_full_mem)")×, chain $(div "$(median dd_direct)" "$(median pgjet_restore_chain_mem)")× (per round $(per_round_ratio dd_direct pgjet_restore_full_mem "$RESTORE_RUNS")×, $(per_round_ratio dd_direct pgjet_restore_chain_mem "$RESTORE_RUNS")×) | |"
        v=$(awk -v a="$(median dd_read)" -v b="$(median dd_direct)" 'BEGIN {if (a != "" && b != "") print a + b}')
        echo "| (for reference) restore against the disk's read time plus its write time (dd_read + dd_direct medians, $(fmt_s "$v") s, / restore time) | full $(div "$v" "$full")×, chain $(div "$v" "$chain")× | |"
        v=$(div "$(median dd_read_write)" "$full")
        echo "| (for reference) restore of a full against its reads and writes done by dd at once (dd_read_write time / restore time) | ${v:-n/a}× | |"
        v=$(div "$(median dd_read_write)" "$chain")
        echo "| (for reference) restore of full + $CHAIN incr against the same | ${v:-n/a}× | |"
        v=$(div "$pj" "$(median read_pgdata)")
        echo
        if [ "$PGV" -ge 17 ]; then
            echo "pgjet incr / reading PGDATA once: ${v:-n/a}× (with WAL summaries pgjet reads only the blocks they list)."
        else
            echo "pgjet incr / reading PGDATA once: ${v:-n/a}× (pgjet reads the blocks its WAL summaries, or the WAL itself, name; every page only when neither can tell)."
        fi
        echo
        if [ -s "$RES/checks.txt" ]; then
            echo "Restored clusters started once (untimed, last run), \`count(*), sum(abalance)\` of pgbench_accounts compared with the source's at that backup:"
            sed 's/^check_/- /' "$RES/checks.txt"
            echo
        fi
        if [ ${#NOTES[@]} -gt 0 ]; then
            echo "Notes:"
            printf -- '- %s\n' "${NOTES[@]}"
            echo
        fi
        echo "Settings: SCALE=$SCALE RANDOM_MB=$RANDOM_MB RUNS=$RUNS RESTORE_RUNS=$RESTORE_RUNS JOBS=$JOBS CHAIN=$CHAIN CHANGE_EVERY=$CHANGE_EVERY PG_VERSION=$PGV."
        echo "Raw: \`$TIMES\`, \`$READS\`, \`$SIZES\`, \`$CHANGES\`, \`$PAGES\`, \`$CHAINF\`."
    } >"$IREPORT"
}

# ------------------------------------------------------------------ main
incr_main() {
    [ "$(id -u)" -eq 0 ] || die "run as root (drop_caches, runuser)"
    for c in /usr/bin/time runuser python3 tar "$PGBIN/pg_basebackup"; do
        command -v "$c" >/dev/null || die "missing $c: run scripts/install-deps.sh"
    done
    mkdir -p "$BENCH" "$BENCH/bin" "$LOGS" "$RES" "$OUT"
    chmod 755 "$BENCH" "$BENCH/bin"
    chown postgres: "$OUT"
    : >"$TIMES"; : >"$SIZES"; : >"$RES/checks.txt"; : >"$READS"; : >"$CHANGES"; : >"$PAGES"; : >"$CHAINF"
    say "bench dir $BENCH; SCALE=$SCALE RANDOM_MB=$RANDOM_MB RUNS=$RUNS JOBS=$JOBS CHAIN=$CHAIN PG_VERSION=$PGV"
    DISK=$(disk_of "$BENCH")
    [ -n "$DISK" ] || note "no block device of its own under $BENCH (overlay or tmpfs?): bytes read not measured"

    if [ "$SKIP_PGBACKREST" = 1 ]; then
        NOTES+=("pgBackRest 2.45: left out (SKIP_PGBACKREST=1)")
    elif [ "$PGV" -gt 15 ]; then
        note "pgBackRest 2.45 (Debian): left out: it supports PostgreSQL up to 15, this cluster is $PGV"
    elif ! command -v pgbackrest >/dev/null; then
        note "pgBackRest 2.45: left out: not installed (scripts/install-deps.sh)"
    else
        PGBR_OLD=1
    fi
    if [ "$PGV" -ge 17 ]; then
        if [ -x "$PGBIN/pg_combinebackup" ]; then PGBB_INCR=1; else note "no pg_combinebackup in $PGBIN: pg_basebackup --incremental left out"; fi
    else
        NOTES+=("pg_basebackup --incremental: not measured: it needs PostgreSQL 17+ (summarize_wal); run with PG_VERSION=18")
    fi

    setup_pgjet
    prepare_pgbr_new
    build_cluster
    [ "$PGBR_OLD" = 1 ] && setup_pgbackrest
    [ -n "$PGBRN_BIN" ] && setup_pgbr_new
    incr_setup
    psql_src -c "CHECKPOINT" >/dev/null
    record_size cluster "$PGDATA"

    full_backups

    header "The change (about 1 page in $CHANGE_EVERY)"
    local lsn r
    lsn=$(psql_src -Atc "SELECT pg_current_wal_insert_lsn()")
    apply_change 1
    count_changed "$lsn"

    for r in $(seq 1 "$RUNS"); do
        header "Incremental backups, run $r of $RUNS"
        incr_round "$r"
    done

    build_chain
    for r in $(seq 1 "$RESTORE_RUNS"); do
        header "Restores, run $r of $RESTORE_RUNS"
        restore_round "$r"
    done

    header "Report"
    mkdir -p "$(dirname "$IREPORT")"
    write_incr_report
    cat "$IREPORT"
    say
    say "report written to $IREPORT"
}

incr_main "$@"
