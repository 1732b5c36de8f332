#!/usr/bin/env bash
# pgjet WAL archiving benchmark (issue 7, section 8), one run, side by side:
#   pgjet archive-push synchronous and asynchronous, pgBackRest 2.45 archive-push synchronous
#   and asynchronous (archive-async=y, the same process-max as pgjet's --jobs), into a posix
#   directory and into S3 (versitygw behind the network lab's delay line, RTT_MS round trip).
#
#   1. lag: unthrottled pgbench (CLIENTS clients, DURATION s) on a cluster archiving with the
#      tool; the number of pg_wal/archive_status/*.ready files is sampled every second, during
#      the run and until the queue is empty (max, mean, drain time);
#   2. throughput: floods of pre-made segments, one per kind of FLOOD_KINDS (random: rows of
#      random bytes, incompressible; update: whole-table UPDATEs of pgbench_accounts after a
#      checkpoint, full-page images and update records, compressible like OLTP WAL; pgbench:
#      unthrottled pgbench, slow to make on 2 cores), are made with archiving paused
#      (archive_command = ''), then the tool's archive_command is set and the time until no
#      .ready is left gives segments per second. The machine's limits for the same job: cp +
#      sync of the same files into a directory, and s5cmd uploading them;
#   3. replay: each asynchronous tool restores its own backup (taken before the pgbench run)
#      and PostgreSQL recovers to the end of the archive through its archive-get (pgjet:
#      prefetch, pgBackRest: archive-async=y); time from start to promoted. The limits: the
#      same segments replayed from a local directory with cp, and (S3) s5cmd downloading the
#      archive's objects.
#
#   bash bench/archive.sh
#   DURATION=20 FLOOD_SEGS=16 TARGETS=s3 bash bench/archive.sh     # smoke
#
# Run as root; clusters and tools run as postgres inside namespace B (see bench/s3.sh).
set -euo pipefail
export BENCH_DIR=${BENCH_DIR:-/var/tmp/pgjet-archbench}
export LAB_PREFIX=${LAB_PREFIX:-pjar}
export LAB_ID=${LAB_ID:-94}
HERE0=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
AREPORT=${REPORT:-$HERE0/results/archive-$(date -u +%Y%m%dT%H%MZ).md}
# shellcheck source=bench/s3.sh
source "$HERE0/s3.sh"     # the lab, versitygw, namespaces and helpers; runs nothing
REPORT=$AREPORT

DURATION=${DURATION:-60}            # seconds of pgbench per tool
CLIENTS=${CLIENTS:-8}               # pgbench clients (-j 2)
FLOOD_SEGS=${FLOOD_SEGS:-96}        # pre-made segments of random bytes (throughput test)
FLOOD_UPDATE_SEGS=${FLOOD_UPDATE_SEGS:-96}     # pre-made segments of whole-table UPDATEs
FLOOD_PGBENCH_SEGS=${FLOOD_PGBENCH_SEGS:-10}   # pre-made segments of pgbench's WAL
FLOOD_KINDS=${FLOOD_KINDS:-random update}      # which floods (random, update, pgbench)
ASCALE=${ASCALE:-10}                # pgbench -i -s of the cluster
TARGETS=${TARGETS:-posix s3}
PHASES=${PHASES:-lag flood replay}  # which of the three runs (a subset for profiling)
PERF=${PERF:-0}                     # 1 = perf record -a -g while each flood drains (RES/perf-*.data)
CPU_BY_PROCESS=${CPU_BY_PROCESS:-0} # 1 = each flood's CPU seconds by process name, on the console
TOOLS=${TOOLS:-pgjet-sync pgjet-async pgbr-sync pgbr-async}
BASE=$BENCH/pg-base                 # cached: initdb + pgbench -i + pgcrypto, archive_mode = on
CL=$RUN/cluster                     # the working copy of one tool's run
RP=$RUN/replay                      # a restored cluster replaying the archive
LAGS=$RES/lag.tsv                   # target, tool, second, ready files
ROWS=$RES/rows.tsv                  # target, tool, metric, value
SAMPLER=""
WARM_WAL=""                         # replay: a directory whose files are read into the page cache first

cleanup() {
    local rc=$?
    set +e
    [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
    if [ "$LOCKED" = 1 ]; then
        pg_stop_cluster "$CL"; pg_stop_cluster "$RP"; pg_stop_cluster "$BASE"
        stop_background
        stop_versitygw
        if [ "$LAB_OWNED" = 1 ]; then
            bash "$ROOT/scripts/netlab.sh" down "$LAB_PREFIX" 2>/dev/null
            rm -rf "/etc/netns/$NB"
        fi
        [ "$KEEP" = 1 ] || rm -rf "$RUN"
    fi
    [ $rc -eq 0 ] || say "archive bench exited with status $rc" >&2
}
trap cleanup EXIT

row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$ROWS"; }
now() { date +%s.%N; }
psql_cl() { as_b "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$1/sock" -p "$(cluster_port "$1")" -U postgres -d postgres "${@:2}"; }
ready_count() { find "$1/data/pg_wal/archive_status" -name '*.ready' 2>/dev/null | wc -l; }

# stop_background: background pushers and prefetchers of both tools (by the PIDs in their
# lock files and pgjet's hidden background commands in /proc/PID/cmdline, never by name)
# left from a run. pgjet's are those whose command line names this bench's run directory
# (they carry the foreground's command-line options, --config=$RUN/...): others' (a test
# suite on the same machine) are left alone.
stop_background() {
    local c pid
    for c in /proc/[0-9]*/cmdline; do
        pid=${c#/proc/}; pid=${pid%/cmdline}
        if { tr "\0" "\n" <"$c"; } 2>/dev/null | grep -qx 'archive-\(push\|get\)-async' \
            && { tr "\0" "\n" <"$c"; } 2>/dev/null | grep -qF -- "$RUN/"; then
            kill -TERM "$pid" 2>/dev/null
        fi
    done
    for pid in $(cat "$RUN"/pgbr-lock/*.lock 2>/dev/null | grep -o '^[0-9]*' || true); do
        kill -TERM "$pid" 2>/dev/null
    done
}

build_base() {
    if [ -f "$BASE/stamp" ] && [ "$(cat "$BASE/stamp")" = "scale=$ASCALE" ] && [ "$REBUILD" != 1 ]; then
        say "cached cluster $BASE (scale $ASCALE)"
        return
    fi
    header "Build the cluster (pgbench scale $ASCALE)"
    pg_stop_cluster "$BASE"; rm -rf "$BASE"; mkdir -p "$BASE"
    PG_EXTRA_CONF="archive_mode = on
archive_command = ''
max_wal_size = 4GB
checkpoint_timeout = 30min" pg_make_cluster "$PGV" "$BASE" "$(free_port)"
    as_pg "$PGBIN/pgbench" -i -q -s "$ASCALE" -h "$BASE/sock" -p "$(cluster_port "$BASE")" -U postgres postgres >"$LOGS/pgbench-init.log" 2>&1
    psql_as "$PGV" "$BASE" "$(cluster_port "$BASE")" -c "CREATE EXTENSION pgcrypto" -c "CREATE TABLE flood (b bytea)" -c CHECKPOINT
    pg_stop_cluster "$BASE"
    echo "scale=$ASCALE" >"$BASE/stamp"
}

# configure TARGET: pgjet.conf and pgbackrest.conf for one repository of TARGET, both with
# asynchronous settings in [async] sections chosen by --stanza... kept simple: one file per
# tool and mode.
configure() {
    local target=$1 async
    for async in n y; do
        {
            echo "[global]"
            if [ "$target" = posix ]; then
                echo "repo1-path=$RUN/pgjet-repo"
            else
                printf 'repo1-type=s3\nrepo1-path=/pgjet\nrepo1-s3-bucket=%s\nrepo1-s3-endpoint=%s\nrepo1-storage-port=%s\nrepo1-s3-region=%s\nrepo1-s3-key=%s\nrepo1-s3-key-secret=%s\nrepo1-s3-uri-style=path\nrepo1-storage-ca-file=%s\n' \
                    "$BUCKET" "$S3_HOST" "$S3_PORT" "$S3_REGION" "$S3_KEY" "$S3_SECRET" "$PKI/ca.crt"
            fi
            printf 'archive-async=%s\nspool-path=%s\njobs=%s\n' "$async" "$RUN/pgjet-spool" "$JOBS"
            printf '[bench]\npg-path=%s\npg-port=%s\npg-socket-path=%s\n' "$CL/data" "$(cluster_port "$BASE")" "$CL/sock"
        } >"$RUN/pgjet-$async.conf"
        {
            printf '[global]\nlock-path=%s\nspool-path=%s\nlog-path=%s\nlog-level-console=warn\nlog-level-file=info\n' \
                "$RUN/pgbr-lock" "$RUN/pgbr-spool" "$LOGS/pgbackrest"
            printf 'process-max=%s\ncompress-type=zst\nstart-fast=y\narchive-check=y\narchive-copy=n\narchive-async=%s\n' "$JOBS" "$async"
            if [ "$target" = posix ]; then
                echo "repo1-path=$RUN/pgbr-repo"
            else
                printf 'repo1-type=s3\nrepo1-path=/pgbackrest\nrepo1-s3-bucket=%s\nrepo1-s3-endpoint=%s\nrepo1-storage-port=%s\nrepo1-s3-region=%s\nrepo1-s3-key=%s\nrepo1-s3-key-secret=%s\nrepo1-s3-uri-style=path\nrepo1-storage-ca-file=%s\n' \
                    "$BUCKET" "$S3_HOST" "$S3_PORT" "$S3_REGION" "$S3_KEY" "$S3_SECRET" "$PKI/ca.crt"
            fi
            printf 'repo1-retention-full=9999999\n[bench]\npg1-path=%s\npg1-port=%s\npg1-socket-path=%s\n' "$CL/data" "$(cluster_port "$BASE")" "$CL/sock"
        } >"$RUN/pgbr-$async.conf"
        chown postgres: "$RUN/pgjet-$async.conf" "$RUN/pgbr-$async.conf"
        chmod 600 "$RUN/pgjet-$async.conf" "$RUN/pgbr-$async.conf"
    done
}

# archive_cmd TOOL: the archive_command of TOOL (pgjet-sync, pgjet-async, pgbr-sync, pgbr-async)
archive_cmd() {
    local async=n
    case $1 in *-async) async=y ;; esac
    case $1 in
        pgjet-*) echo "$PGJET_BIN --config=$RUN/pgjet-$async.conf --stanza=bench archive-push %p" ;;
        pgbr-*) echo "pgbackrest --config=$RUN/pgbr-$async.conf --stanza=bench archive-push %p" ;;
    esac
}
tool_cmd() {   # TOOL ARGS...: run the tool's own CLI (stanza bench) in B
    local t=$1 async=n; shift
    case $t in *-async) async=y ;; esac
    case $t in
        pgjet-*) as_b "$PGJET_BIN" --config="$RUN/pgjet-$async.conf" --stanza=bench "$@" ;;
        pgbr-*) as_b pgbackrest --config="$RUN/pgbr-$async.conf" --stanza=bench "$@" ;;
    esac
}
set_archive() { psql_cl "$CL" -c "ALTER SYSTEM SET archive_command = '$1'" -c "SELECT pg_reload_conf()" >/dev/null; }

# sample TARGET TOOL: one line per second with the .ready count, until killed
sample() {
    local t0 s
    t0=$(now)
    while :; do
        s=$(awk -v a="$(now)" -v b="$t0" 'BEGIN {printf "%.0f", a - b}')
        printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$s" "$(ready_count "$CL")" >>"$LAGS"
        sleep 1
    done
}

# wait_drained SECONDS: until no .ready is left (0 = timed out)
wait_drained() {
    local t0=$1 limit=$2
    while [ "$(ready_count "$CL")" -gt 0 ]; do
        if awk -v a="$(now)" -v b="$t0" -v l="$limit" 'BEGIN {exit !(a - b > l)}'; then return 1; fi
        sleep 0.2
    done
}

# fresh_cluster [DIR...]: a fresh copy of the cached cluster started in B, no background
# process of either tool, empty repositories, spools and DIRs
fresh_cluster() {
    local d
    stop_background
    pg_stop_cluster "$CL"; rm -rf "$CL"; cp -a "$BASE" "$CL"
    sed -i "s|$BASE/sock|$CL/sock|" "$CL/data/postgresql.conf"
    rm -f "$CL/data/postmaster.pid"
    start_in_b "$CL"
    # No autovacuum worker starting at a random moment of a timed flood (a flood's UPDATE of
    # the whole table, or its inserts, call for one): the same for every tool
    psql_cl "$CL" -c "ALTER SYSTEM SET autovacuum = off" -c "SELECT pg_reload_conf()" >/dev/null
    rm -rf "$S3DATA/$BUCKET/pgjet" "$S3DATA/$BUCKET/pgbackrest"
    for d in "$RUN/pgjet-repo" "$RUN/pgbr-repo" "$RUN/pgjet-spool" "$RUN/pgbr-spool" "$RUN/pgbr-lock" "$@"; do
        rm -rf "$d"; mkdir -p "$d"; chown postgres: "$d"
    done
    mkdir -p "$LOGS/pgbackrest"; chown postgres: "$LOGS/pgbackrest"
}

# one_tool TARGET TOOL: the lag and flood runs of one tool on a fresh copy of the cluster
one_tool() {
    local target=$1 tool=$2 t0 t1 lsn0 lsn1 segs
    header "$target / $tool"
    fresh_cluster
    # stanza-create first: pgBackRest's takes the archive lock its asynchronous push holds
    tool_cmd "$tool" stanza-create >"$LOGS/$target-$tool-stanza.log" 2>&1 || { cat "$LOGS/$target-$tool-stanza.log"; die "stanza-create failed"; }
    set_archive "$(archive_cmd "$tool")"
    case $tool in
        pgjet-*) tool_cmd "$tool" backup --start-fast >"$LOGS/$target-$tool-backup.log" 2>&1 ;;
        pgbr-*) tool_cmd "$tool" backup --type=full >"$LOGS/$target-$tool-backup.log" 2>&1 ;;
    esac || { tail "$LOGS/$target-$tool-backup.log"; die "backup failed"; }

    # 1. lag under pgbench
    if [[ " $PHASES " == *" lag "* ]]; then
    lsn0=$(psql_cl "$CL" -c "SELECT pg_current_wal_lsn()")
    sample "$target" "$tool" & SAMPLER=$!
    as_b "$PGBIN/pgbench" -n -c "$CLIENTS" -j 2 -T "$DURATION" -h "$CL/sock" -p "$(cluster_port "$CL")" -U postgres postgres >"$LOGS/$target-$tool-pgbench.log" 2>&1 || true
    t0=$(now)
    lsn1=$(psql_cl "$CL" -c "SELECT pg_current_wal_lsn()")
    wait_drained "$t0" 600 || say "  lag run: FAILED, queue not drained in 600 s after pgbench"
    t1=$(now)
    kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null || true; SAMPLER=""
    segs=$(psql_cl "$CL" -c "SELECT round(pg_wal_lsn_diff('$lsn1', '$lsn0') / 16777216.0, 1)")
    row "$target" "$tool" pgbench_tps "$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$LOGS/$target-$tool-pgbench.log" | head -n 1)"
    row "$target" "$tool" pgbench_segments "$segs"
    row "$target" "$tool" drain_s "$(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.1f", a - b}')"
    say "  pgbench: $segs segments of WAL; queue drained $(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.1f", a - b}') s after pgbench ended"
    fi

    # 2. floods of pre-made segments
    if [[ " $PHASES " == *" flood "* ]]; then
        local kind
        for kind in $FLOOD_KINDS; do
            case $kind in
                random) flood "$target" "$tool" random "$FLOOD_SEGS" ;;
                update) flood "$target" "$tool" update "$FLOOD_UPDATE_SEGS" ;;
                pgbench) flood "$target" "$tool" pgbench "$FLOOD_PGBENCH_SEGS" ;;
                *) die "unknown flood kind $kind" ;;
            esac
        done
    fi
    case $PHASES/$tool in *replay*/*-async) replay "$target" "$tool" ;; esac
    # what the archive holds: files and stored bytes (the segments are 16 MiB each)
    local adir
    case $target/$tool in
        posix/pgjet-*) adir=$RUN/pgjet-repo/bench/archive ;;
        posix/pgbr-*) adir=$RUN/pgbr-repo/archive ;;
        s3/pgjet-*) adir=$S3DATA/$BUCKET/pgjet/bench/archive ;;
        s3/pgbr-*) adir=$S3DATA/$BUCKET/pgbackrest/archive ;;
    esac
    row "$target" "$tool" archive_files "$(find "$adir" -type f -name '0000000*' ! -name '*.history' ! -name '*.backup' | wc -l)"
    row "$target" "$tool" archive_bytes "$(find "$adir" -type f -name '0000000*' ! -name '*.history' ! -name '*.backup' -printf '%s\n' | awk '{b += $1} END {print b + 0}')"
    pg_stop_cluster "$CL"
}

# flood TARGET TOOL KIND SEGMENTS: make SEGMENTS segments of KIND WAL (random: rows of
# random bytes; update: whole-table UPDATEs after checkpoints; pgbench: unthrottled pgbench)
# with archiving paused, then time the tool archiving all of them
flood() {
    local target=$1 tool=$2 kind=$3 want=$4 t0 t1 n
    psql_cl "$CL" -c "SELECT pg_switch_wal()" >/dev/null
    wait_drained "$(now)" 120 || true
    set_archive ""
    # No background pusher may run while the flood is made: it would push it ahead of the
    # timer (pgjet's scans archive_status by itself).
    stop_background
    sleep 1
    make_flood "$kind" "$want"
    sleep 1
    n=$(ready_count "$CL")
    if [ -z "${LIMIT_DONE[$target/$kind]:-}" ]; then flood_limits "$target" "$kind"; fi
    local perf_pid=""
    if [ "$PERF" = 1 ]; then   # profile the whole machine while the flood drains
        perf record -a -g -F 499 -o "$RES/perf-$target-$tool-$kind.data" >/dev/null 2>&1 & perf_pid=$!
        sleep 1
    fi
    local cpu0 cpu1
    cpu_by_process save "$RES/cpu-procs.json"
    cpu0=$(cpu_ticks)
    t0=$(now)
    set_archive "$(archive_cmd "$tool")"
    wait_drained "$t0" 1800 || say "  flood ($kind): FAILED, not archived in 1800 s"
    t1=$(now)
    cpu1=$(cpu_ticks)
    cpu_by_process show "$RES/cpu-procs.json"
    row "$target" "$tool" "flood_${kind}_cpu_s" "$(awk -v a="$cpu1" -v b="$cpu0" -v h="$(getconf CLK_TCK)" 'BEGIN {printf "%.2f", (a - b) / h}')"
    if [ -n "$perf_pid" ]; then kill -INT "$perf_pid"; wait "$perf_pid" 2>/dev/null || true; fi
    row "$target" "$tool" "flood_${kind}_segments" "$n"
    row "$target" "$tool" "flood_${kind}_s" "$(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.2f", a - b}')"
    say "  flood ($kind): $n segments archived in $(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.1f", a - b}') s"
    psql_cl "$CL" -c "TRUNCATE flood" >/dev/null
}

# cpu_by_process save|show FILE: with CPU_BY_PROCESS=1, the CPU time of every process saved
# into FILE; then, by process name, what each used since (processes gone since: one line)
cpu_by_process() {
    [ "$CPU_BY_PROCESS" = 1 ] || return 0
    /usr/bin/python3 - "$@" <<'PYEOF'
import os, sys, json, collections
def snap():
    d = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try: s = open(f"/proc/{p}/stat").read()
        except OSError: continue
        f = s[s.rindex(")") + 2:].split()
        d[p] = (s[s.index("(") + 1:s.rindex(")")], int(f[11]) + int(f[12]))
    c = open("/proc/stat").readline().split()
    return d, sum(int(c[i]) for i in (1, 2, 3, 6, 7))
if sys.argv[1] == "save":
    json.dump(snap(), open(sys.argv[2], "w"))
    sys.exit()
(a, ba), (b, bb) = json.load(open(sys.argv[2])), snap()
by = collections.Counter()
for p, (comm, t) in b.items():
    by[comm] += t - (a[p][1] if p in a else 0)
hz = os.sysconf("SC_CLK_TCK")
print("    CPU s by process: " + ", ".join(f"{c} {t / hz:.2f}" for c, t in by.most_common(8) if t > 0)
      + f"; gone since {(bb - ba - sum(by.values())) / hz:.2f}; machine {(bb - ba) / hz:.2f}")
PYEOF
}

# cpu_ticks: the machine's busy CPU time so far (user, nice, system, irq, softirq of every CPU),
# in clock ticks: the difference over a job is the CPU it cost, whichever processes did it
cpu_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }

# make_flood KIND SEGMENTS: write SEGMENTS segments of KIND WAL into $CL (random: rows of
# random bytes; update: whole-table UPDATEs after checkpoints; pgbench: unthrottled pgbench),
# then switch to a new segment
make_flood() {
    local kind=$1 want=$2 lsn0 bp
    lsn0=$(psql_cl "$CL" -c "SELECT pg_current_wal_lsn()")
    if [ "$kind" = pgbench ]; then
        as_b "$PGBIN/pgbench" -n -c "$CLIENTS" -j 2 -T 900 -h "$CL/sock" -p "$(cluster_port "$CL")" -U postgres postgres >/dev/null 2>&1 &
        bp=$!
    fi
    while [ "$(psql_cl "$CL" -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$lsn0') < $want * 16777216.0")" = t ]; do
        case $kind in
            random) psql_cl "$CL" -c "INSERT INTO flood SELECT gen_random_bytes(1000) FROM generate_series(1, 20000)" >/dev/null ;;
            update) psql_cl "$CL" -c CHECKPOINT -c "UPDATE pgbench_accounts SET abalance = abalance + 1" >/dev/null ;;
            *) sleep 0.2 ;;
        esac
    done
    if [ "$kind" = pgbench ]; then
        # pgbench runs as postgres under runuser in the namespace: end it through its server
        # sessions (it exits when they are gone), then reap it
        psql_cl "$CL" -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'pgbench'" >/dev/null
        wait "$bp" 2>/dev/null || true
    fi
    # A checkpoint now, not one forced by the flood's WAL while a tool is timed (autovacuum is
    # off in the copies: fresh_cluster)
    psql_cl "$CL" -c CHECKPOINT -c "SELECT pg_switch_wal()" >/dev/null
}

# flood_limits TARGET: the machine's limits for the flood's job, on the same .ready files:
# cp + sync into a directory, or s5cmd uploading them to the bucket (JOBS at once)
declare -A LIMIT_DONE
flood_limits() {
    local target=$1 kind=$2 t0 t1 list
    LIMIT_DONE[$target/$kind]=1
    list=$RUN/flood-files
    fresh_dir "$list"
    for f in "$CL"/data/pg_wal/archive_status/*.ready; do
        f=$(basename "$f" .ready)
        ln "$CL/data/pg_wal/$f" "$list/$f" 2>/dev/null || true
    done
    # Warm, like the tools' runs: the segments were just written.
    if [ "$target" = posix ]; then
        fresh_dir "$RUN/limit-copy"
        t0=$(now); as_b cp "$list"/* "$RUN/limit-copy/"; sync; t1=$(now)
        row "$target" "limit: cp + sync" "flood_${kind}_s" "$(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.2f", a - b}')"
        rm -rf "$RUN/limit-copy"
    elif [ "$SKIP_S5CMD" != 1 ]; then
        t0=$(now)
        bash -c "$(s5 --numworkers "$JOBS" cp "$list/*" "s3://$BUCKET/limit/")" >"$LOGS/s5cmd-flood.log" 2>&1 || tail -n 3 "$LOGS/s5cmd-flood.log"
        t1=$(now)
        row "$target" "limit: s5cmd upload" "flood_${kind}_s" "$(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.2f", a - b}')"
        rm -rf "$S3DATA/$BUCKET/limit"
    fi
    row "$target" "limit" "flood_${kind}_segments" "$(find "$list" -type f | wc -l)"
    rm -rf "$list"
}

# replay TARGET TOOL [RESTORE_COMMAND NAME]: restore the tool's backup and time recovery to
# the end of its archive (with RESTORE_COMMAND instead of the tool's, as NAME: the limit)
replay() {
    local target=$1 tool=$2 rc=${3:-} name=${4:-$2} t0 t1 port
    local opt=()
    [ -z "$rc" ] || opt=(--recovery-option="restore_command=$rc")
    pg_stop_cluster "$RP"; rm -rf "$RP"; mkdir -p "$RP/data" "$RP/sock"; chown -R postgres: "$RP"; chmod 700 "$RP/data"
    case $tool in
        pgjet-*) tool_cmd "$tool" --pg-path="$RP/data" restore --archive-mode=off "${opt[@]}" >"$LOGS/$target-$name-restore.log" 2>&1 ;;
        pgbr-*) tool_cmd "$tool" --pg1-path="$RP/data" restore --archive-mode=off "${opt[@]}" >"$LOGS/$target-$name-restore.log" 2>&1 ;;
    esac || { tail "$LOGS/$target-$name-restore.log"; say "  replay ($name): restore FAILED"; return 0; }
    port=$(free_port)
    cat >>"$RP/data/postgresql.auto.conf" <<EOF
port = $port
unix_socket_directories = '$RP/sock'
hot_standby = off
EOF
    touch "$RP/log"; chown postgres: "$RP/log" "$RP/data/postgresql.auto.conf"
    cold_cache
    # The at-hand floor: its segments are in the page cache, as a prefetcher's are.
    [ -z "$WARM_WAL" ] || cat "$WARM_WAL"/* >/dev/null
    t0=$(now)
    as_b "$PGBIN/pg_ctl" -D "$RP/data" -l "$RP/log" -W start >/dev/null 9>&-
    while ! as_b "$PGBIN/psql" -X -At -h "$RP/sock" -p "$port" -U postgres -d postgres -c "SELECT pg_is_in_recovery()" 2>/dev/null | grep -q f; do
        if awk -v a="$(now)" -v b="$t0" 'BEGIN {exit !(a - b > 1800)}'; then say "  replay ($name): FAILED, recovery did not end in 1800 s"; break; fi
        sleep 0.1
    done
    t1=$(now)
    row "$target" "$name" replay_segments "$(grep -c 'restored log file' "$RP/log")"
    row "$target" "$name" replay_s "$(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.2f", a - b}')"
    say "  replay ($name): $(grep -c 'restored log file' "$RP/log") segments from the archive, promoted after $(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.1f", a - b}') s"
    pg_stop_cluster "$RP"
    cp "$RP/log" "$LOGS/$target-$name-replay.log"
    rm -rf "$RP"
    # The machine's limits for this replay, with the same segments already decompressed in a
    # local directory (fetched untimed): restore_command a plain cp of cold files; and every
    # segment at hand, a hard link (ln) to files in the page cache, as a prefetcher's are, which
    # leaves only PostgreSQL's own redo (the floor no restore_command can beat).
    if [ -z "$rc" ] && [ "$tool" = pgjet-async ]; then
        local w=$RUN/walcopy f
        fresh_dir "$w"
        for f in $(sed -n 's/.*restored log file "\([0-9A-F]*\)" from archive.*/\1/p' "$LOGS/$target-$name-replay.log" | sort -u); do
            tool_cmd pgjet-sync archive-get "$f" "$w/$f" >/dev/null 2>&1 || true
        done
        replay "$target" "$tool" "cp $w/%f \"%p\"" "limit: local cp"
        WARM_WAL=$w replay "$target" "$tool" "ln $w/%f \"%p\"" "limit: at hand (ln)"
        rm -rf "$w"
        if [ "$target" = s3 ] && [ "$SKIP_S5CMD" != 1 ]; then
            # The link's limit: the archive's objects downloaded by s5cmd, JOBS at once.
            fresh_dir "$w"
            t0=$(now)
            bash -c "$(s5 --numworkers "$JOBS" cp "s3://$BUCKET/pgjet/bench/archive/*" "$w/")" >"$LOGS/s5cmd-replay.log" 2>&1 || tail -n 3 "$LOGS/s5cmd-replay.log"
            t1=$(now)
            row "$target" "limit: s5cmd download" replay_s "$(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.2f", a - b}')"
            say "  s5cmd download of the archive: $(find "$w" -type f | wc -l) objects, $(du -sm "$w" | cut -f1) MiB in $(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.1f", a - b}') s"
            rm -rf "$w"
        fi
    fi
}

write_archive_report() {
    /usr/bin/python3 - "$ROWS" "$LAGS" "$FACTS" "$REPORT" <<'PYEOF'
import sys, statistics as st, collections
rows_f, lags_f, facts_f, report = sys.argv[1:5]
rows = collections.defaultdict(dict)
for l in open(rows_f):
    t, tool, k, v = l.rstrip("\n").split("\t")
    try: rows[(t, tool)][k] = float(v)
    except ValueError: rows[(t, tool)][k] = v
lag = collections.defaultdict(list)
for l in open(lags_f):
    t, tool, s, n = l.rstrip("\n").split("\t")
    lag[(t, tool)].append(int(n))
facts = dict(l.rstrip("\n").split("\t", 1) for l in open(facts_f) if "\t" in l)
out = []
P = out.append
P("# WAL archiving: lag, throughput and replay (bench/archive.sh)")
P("")
for k in ("machine", "memory", "disk", "postgres", "pgjet", "pgbackrest", "versitygw", "settings"):
    if k in facts: P(f"- {k}: {facts[k]}")
P("")
tools = ["pgjet-sync", "pgjet-async", "pgbr-sync", "pgbr-async"]
names = {"pgjet-sync": "pgjet sync", "pgjet-async": "pgjet async", "pgbr-sync": "pgBackRest sync", "pgbr-async": "pgBackRest async"}
for t in ("posix", "s3"):
    if not any((t, x) in rows for x in tools): continue
    P(f"## {'posix directory' if t == 'posix' else 'S3 (versitygw, ' + facts.get('rtt_ms', '?') + ' ms round trip)'}")
    P("")
    kinds = [k for k in ("random", "update", "pgbench") if any(f"flood_{k}_s" in r for (tt, _), r in rows.items() if tt == t)]
    P("| archive_command | pgbench tps | WAL made (segments) | max lag (.ready) | mean lag | drain after pgbench s | " + "".join(f"flood {k}: segments/s | " for k in kinds) + "replay s (segments) | archive: segments, stored/logical |")
    P("|---|---:|---:|---:|---:|---:|" + "---:|" * len(kinds) + "---:|---:|")
    def rate(x, kind):
        r = rows.get((t, x), {})
        n = rows.get((t, "limit" if x.startswith("limit") else x), {}).get(f"flood_{kind}_segments", 0)
        return n / r[f"flood_{kind}_s"] if r.get(f"flood_{kind}_s") else None
    f1 = lambda v: f"{v:.1f}" if v else ""
    for x in tools:
        r = rows.get((t, x))
        if not r: continue
        lg = lag.get((t, x), [0])
        rp = f"{r['replay_s']:.1f} ({r.get('replay_segments', 0):.0f})" if "replay_s" in r else "-"
        af = r.get("archive_files", 0)
        ratio = f"{af:.0f}, {r.get('archive_bytes', 0) / (af * 16777216):.2f}" if af else "-"
        P(f"| {names[x]} | {r.get('pgbench_tps', 0):.0f} | {r.get('pgbench_segments', 0):.1f} | {max(lg)} | {st.mean(lg):.1f} | {r.get('drain_s', 0):.1f} | " + "".join(f"{f1(rate(x, k))} | " for k in kinds) + f"{rp} | {ratio} |")
    for lim in ("limit: cp + sync", "limit: s5cmd upload"):
        if (t, lim) in rows:
            P(f"| {lim} (same files, raw) | | | | | | " + "".join(f"{f1(rate(lim, k))} | " for k in kinds) + " | |")
    for lim, what in (("limit: local cp", "replay from a local directory (cp)"), ("limit: at hand (ln)", "replay with every segment at hand (a hard link of a file in the page cache): PostgreSQL's redo alone"), ("limit: s5cmd download", "s5cmd downloading the archive's objects")):
        r = rows.get((t, lim))
        if r and r.get("replay_s"):
            seg = f" ({r['replay_segments']:.0f})" if r.get("replay_segments") else ""
            P(f"| limit: {what} | | | | | | " + "| " * len(kinds) + f"{r['replay_s']:.1f}{seg} | |")
    P("")
    g = lambda x, k: rows.get((t, x), {}).get(k)
    for kind in kinds:
        a, sy, ba = rate("pgjet-async", kind), rate("pgjet-sync", kind), rate("pgbr-async", kind)
        if a and sy: P(f"- flood ({kind}): pgjet async / pgjet sync = {a / sy:.1f}×")
        if a and ba: P(f"- flood ({kind}): pgjet async / pgBackRest async = {a / ba:.1f}×")
    ra, rb = g("pgjet-async", "replay_s"), g("pgbr-async", "replay_s")
    if ra and rb: P(f"- replay: pgBackRest async s / pgjet async s = {rb / ra:.2f}×")
    if lag.get((t, "pgjet-async")): P(f"- pgjet async max lag: {max(lag[(t, 'pgjet-async')])} segment(s)")
    P("")
open(report, "w").write("\n".join(out) + "\n")
PYEOF
}

# bench_up: the checks, the run's lock and directories, the cached cluster, the lab, the S3
# server, this pgjet, and the facts of the machine (archive.sh and stream.sh)
bench_up() {
    [ "$(id -u)" -eq 0 ] || die "run as root"
    [ -x "$DELAYLINE" ] || die "no pgjet-delayline at $DELAYLINE"
    [ -x "${VERSITYGW:-}" ] || die "versitygw not found"
    # s5cmd: the S3 limits (SKIP_S5CMD=1 leaves them out)
    if [[ " $TARGETS " == *" s3 "* ]] && [ "$SKIP_S5CMD" != 1 ]; then install_s5cmd; fi
    mkdir -p "$BENCH"
    exec 9>"$BENCH/lock"
    flock -n 9 || die "another run holds $BENCH/lock"
    LOCKED=1
    mkdir -p "$BENCH/bin" "$LOGS" "$RES"; chmod 755 "$BENCH" "$BENCH/bin"
    rm -rf "$RUN"; mkdir -p "$RUN"; chmod 755 "$RUN"
    rm -rf "$LOGS"; mkdir -p "$LOGS"
    : >"$ROWS"; : >"$LAGS"; : >"$FACTS"; : >"$TIMES"
    build_base
    lab_up
    start_versitygw
    setup_pgjet >/dev/null 2>&1
    fact machine "$(nproc) CPUs, $(awk '/model name/ {sub(/.*: /, ""); print; exit}' /proc/cpuinfo)"
    fact memory "$(free -g | awk '/^Mem:/ {print $2 " GiB total"}')"
    fact disk "$BENCH on $(df -T "$BENCH" | awk 'NR==2 {print $2}')"
    fact postgres "$("$PGBIN/postgres" --version)"
    fact pgjet "$PGJET_VERSION (commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'))"
    fact pgbackrest "$(pgbackrest version)"
    fact versitygw "$VERSITYGW --keep-alive"
    fact rtt_ms "$RTT_MS"
}

amain() {
    bench_up
    fact settings "DURATION=$DURATION CLIENTS=$CLIENTS FLOOD_SEGS=$FLOOD_SEGS FLOOD_UPDATE_SEGS=$FLOOD_UPDATE_SEGS FLOOD_PGBENCH_SEGS=$FLOOD_PGBENCH_SEGS FLOOD_KINDS='$FLOOD_KINDS' ASCALE=$ASCALE JOBS=$JOBS RTT_MS=$RTT_MS TARGETS='$TARGETS' TOOLS='$TOOLS' PHASES='$PHASES'"
    local target tool
    for target in $TARGETS; do
        configure "$target"
        for tool in $TOOLS; do one_tool "$target" "$tool"; done
    done
    header "Report"
    write_archive_report
    cat "$REPORT"
    say "report written to $REPORT"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    amain "$@"
fi
