#!/usr/bin/env bash
# Resume benchmark: a full backup killed (SIGKILL, its whole process group) at KILL_AT% of
# the time a fresh full took, a little pgbench, then the next backup, which resumes it;
# against the fresh full of the same cluster. pgjet side by side with pgBackRest 2.45
# (which resumes too: it keeps the files of an aborted backup whose size and time did not
# change and whose repository checksum holds). One run, cold cache before every timed
# command, medians. Not a test: it only measures.
#
#   bash bench/resume.sh                                          # full size (scale 100 + 500 MiB)
#   SCALE=1 RANDOM_MB=8 RUNS=1 RREPORT=/tmp/resume.md bash bench/resume.sh   # smoke size
#
# Per run (details and how to read the report: bench/README.md, "Resume"):
#   read_pgdata       every byte of PGDATA read once (the limit for a resume that reads
#                     every page to compare page LSNs)
#   pgjet_fresh       pgjet backup --type full into an empty repository
#   pgjet_fresh_nosave  the same saving no resume journal (--manifest-save-threshold 1TB): the
#                     cost of the saves
#   pgjet_resumed     after a pgjet full killed at KILL_AT% of pgjet_fresh and 500 pgbench
#                     transactions: the next backup (it resumes)
#   pgbackrest_fresh, pgbackrest_resumed: the same with pgBackRest (stanza zst)
# Both tools: zstd, JOBS workers, --start-fast; the cluster archives WAL into both tools'
# archives (archive_all, as incr.sh), and each backup waits for its WAL there (archive-check,
# both tools' default). pgjet's resume reads the blocks changed since the killed attempt
# from that WAL (pg_wal, then its archive).
#
# Settings, besides those of bench/run.sh (SCALE, RANDOM_MB, RUNS, JOBS, PG_VERSION,
# BENCH_DIR, KEEP, SKIP_PGBACKREST, CHECK_RESTORE, COLD, PGJET):
#   RREPORT   markdown report (default $BENCH_DIR/results/resume.md)
#   KILL_AT   percent of the fresh backup's time at which the interrupted one is killed (50)
# Run as root (servers and tools run as the OS user postgres through runuser).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/run.sh
source "$HERE/run.sh"

RREPORT=${RREPORT:-$RES/resume.md}
KILL_AT=${KILL_AT:-50}
PJREPO=$BENCH/pgjet-repo-resume     # run.sh's cleanup removes pgjet-repo-*
KEPT=$RES/kept.tsv                  # run, pgjet's kept bytes, killed after seconds (pgjet, pgBackRest)
PGBR_OK=0

psql_src() { psql_as "$PGV" "$PG" "$PORT" "$@"; }

# killed_after NAME SECONDS CMD: CMD (a pg_cmd line) started in a session of its own, cold
# cache first, killed with SIGKILL (its whole process group: runuser, the tool and its
# workers) after SECONDS; untimed. Says whether it ended before the kill.
killed_after() {
    local name=$1 secs=$2 cmd=$3 pid
    cold_cache
    setsid bash -c "$cmd" >"$LOGS/$name.killed.log" 2>&1 &
    pid=$!
    sleep "$secs"
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL -- "-$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        # until every process of the group is gone (the next backup checks its lock's pid)
        local n=0
        while pgrep -g "$pid" >/dev/null && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
        say "  $name: killed after $secs s"
    else
        wait "$pid" 2>/dev/null || true
        say "  $name: ended before the kill at $secs s (log $LOGS/$name.killed.log)"
    fi
}

# pgbench_some: 500 transactions (2 clients) between the kill and the resume, untimed.
# The rows a restore is compared with (check_restored) follow.
pgbench_some() {
    as_pg "$PGBIN/pgbench" -h "$PG/sock" -p "$PORT" -U postgres -n -c 2 -t 250 postgres >/dev/null
    SRC_ROWS=$(psql_src -Atc "SELECT count(*), sum(abalance) FROM pgbench_accounts")
}

# last_seconds NAME RUN -> the seconds of NAME's row for RUN in $TIMES
last_seconds() { awk -F'\t' -v n="$1" -v r="$2" '$1==n && $2==r && $5=="ok" {s=$3} END {print s}' "$TIMES"; }

pgbr_fresh_repo() {
    archiver_idle "$PGDATA" || return 1
    rm -rf "$PGBR_REPO"
    mkdir -p "$PGBR_REPO"
    chown postgres: "$PGBR_REPO"
    as_pg pgbackrest --config="$PGBR_CONF" --stanza=zst stanza-create >/dev/null
}

# resume_pair NAME RUN FRESH CMD: twice, CMD killed at KILL_AT% of FRESH seconds and then
# resumed (timed): NAME_resumed after 500 pgbench transactions (the files they touch are
# written by the resume's checkpoint), NAME_resumed_idle with no write in between. FRESH_REPO
# is a function that empties the tool's repository first.
resume_pair() {
    local name=$1 r=$2 fresh=$3 cmd=$4 empty=$5 t variant
    t=$(awk -v s="$fresh" -v p="$KILL_AT" 'BEGIN {printf "%.2f", s * p / 100}')
    for variant in resumed resumed_idle; do
        $empty
        killed_after "$name" "$t" "$cmd"
        [ "$variant" = resumed ] && pgbench_some
        timed "${name}_$variant" "$r" "$cmd" || true
        if [ "$name" = pgjet ]; then
            printf '%s\t%s\t%s\t%s\n' "$variant" "$r" "$(grep -o '"reused": *[0-9]*' "$LOGS/pgjet_$variant.run$r.log" | grep -o '[0-9]*$' || true)" "$t" >>"$KEPT"
            grep -q 'resuming interrupted backup' "$LOGS/pgjet_$variant.run$r.log" ||
                say "  WARNING: pgjet_$variant run $r did not resume (log $LOGS/pgjet_$variant.run$r.log)"
        fi
    done
}

pj_empty() { pgjet_fresh_repo "$PJREPO" || die "pgjet stanza-create failed"; }

resume_round() {
    local r=$1 args cmd o=$OUT/pgjet-restore
    itimed_read "$r"
    mapfile -t args < <(pgjet_conn "$PJREPO")
    cmd=$(pg_cmd "$PGJET_BIN" backup "${args[@]}" --type full --start-fast --jobs "$JOBS" \
        --compress-type zstd --output json)
    pj_empty
    timed pgjet_fresh "$r" "$cmd" || true
    record_size pgjet_fresh "$PJREPO/$PGJET_STANZA/backup"
    # the cost of the journal's saves: the same backup saving none (the threshold past its size)
    pj_empty
    timed pgjet_fresh_nosave "$r" "$cmd --manifest-save-threshold 1TB" || true
    resume_pair pgjet "$r" "$(last_seconds pgjet_fresh "$r")" "$cmd" pj_empty
    if [ "$CHECK_RESTORE" = 1 ] && [ "$r" = "$RUNS" ]; then
        fresh_dir "$o"
        as_pg "$PGJET_BIN" restore --stanza "$PGJET_STANZA" --repo-path "$PJREPO" --pg-path "$o" \
            --jobs "$JOBS" >"$LOGS/pgjet-resumed-restore.log" 2>&1 || say "  restore of the resumed backup FAILED"
        check_restored pgjet_resumed_idle "$o"
        rm -rf "$o"
    fi
    if [ "$PGBR_OK" = 1 ]; then
        cmd=$(pgbr --stanza=zst --type=full backup)
        pgbr_fresh_repo
        timed pgbackrest_fresh "$r" "$cmd" || true
        record_size pgbackrest_fresh "$PGBR_REPO/backup"
        resume_pair pgbackrest "$r" "$(last_seconds pgbackrest_fresh "$r")" "$cmd" pgbr_fresh_repo
    fi
}

itimed_read() {
    timed read_pgdata "$1" "tar -C $(q "$PGDATA") --warning=no-file-changed --warning=no-file-removed $TAR_EXCLUDE -cf - . | cat >/dev/null" || true
}

div() { awk -v a="$1" -v b="$2" 'BEGIN {if (a != "" && b != "" && b > 0) printf "%.2f", a / b}'; }

write_resume_report() {
    local pf pr bf br rd ratio
    pf=$(median pgjet_fresh); pr=$(median pgjet_resumed); rd=$(median read_pgdata)
    bf=$(median pgbackrest_fresh); br=$(median pgbackrest_resumed)
    ratio=$(div "$pr" "$pf")
    {
        echo "# Resume after a kill: pgjet $(as_pg "$PGJET_BIN" --version 2>&1 | head -n 1)"
        echo
        echo "$(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores; PostgreSQL $PGV, pgbench scale $SCALE + $RANDOM_MB MiB random ($(mib "$(size_of cluster)") MiB PGDATA); $RUNS runs, medians; cache dropped before every timed command: $DROP_CACHES; JOBS=$JOBS, zstd, killed at $KILL_AT% of the fresh backup's time, then 500 pgbench transactions."
        echo
        echo "| command | median s | min-max s | vs fresh | peak RSS MiB |"
        echo "|---|---:|---:|---:|---:|"
        local n
        for n in read_pgdata pgjet_fresh pgjet_fresh_nosave pgjet_resumed pgjet_resumed_idle pgbackrest_fresh pgbackrest_resumed pgbackrest_resumed_idle; do
            [ -n "$(median "$n")" ] || continue
            local base=""
            case $n in pgjet_resumed* | pgjet_fresh_nosave) base=$pf ;; pgbackrest_resumed*) base=$bf ;; esac
            echo "| $n | $(median "$n") | $(minmax "$n") | $( [ -n "$base" ] && div "$(median "$n")" "$base") | $(( $(median "$n" 4) / 1024 )) |"
        done
        echo
        echo "pgjet's resumed backups kept (bytes stored by the killed attempt; killed after s): $(awk -F'\t' '{printf "%s%s run %s: %s MiB after %s s", (NR>1?"; ":""), $1, $2, int($3/1048576), $4}' "$KEPT")."
        echo
        echo "_resumed: 500 pgbench transactions between the kill and the resume (the pages they change are written by the resume's checkpoint, so their files' times change); _resumed_idle: none."
        echo
        echo "Target (issue 19): a resume after a kill at 50% finishes in at most 0.6x the time of a fresh backup: pgjet ${ratio}x after writes, $(div "$(median pgjet_resumed_idle)" "$pf")x idle: $(awk -v x="$ratio" 'BEGIN {print (x != "" && x <= 0.6) ? "MET" : "NOT MET"}')$( [ -n "$br" ] && echo "; pgBackRest $(div "$br" "$bf")x after writes, $(div "$(median pgbackrest_resumed_idle)" "$bf")x idle")."
        echo "Reading PGDATA once (tar) took ${rd} s; pgjet reads with direct I/O, faster than tar here. A resume that must read a file again (its time changed: written since) reads all of it when there are no WAL summaries (local files, PostgreSQL before 17)."
        [ -s "$RES/checks.txt" ] && { echo; echo "Checks: $(tr '\n' ' ' <"$RES/checks.txt")"; }
    } >"$RREPORT"
}

resume_main() {
    [ "$(id -u)" -eq 0 ] || die "run as root (drop_caches, runuser, setsid)"
    for c in /usr/bin/time runuser setsid tar; do
        command -v "$c" >/dev/null || die "missing $c: run scripts/install-deps.sh"
    done
    mkdir -p "$BENCH" "$BENCH/bin" "$LOGS" "$RES" "$OUT"
    chmod 755 "$BENCH" "$BENCH/bin"
    chown postgres: "$OUT"
    : >"$TIMES"; : >"$SIZES"; : >"$RES/checks.txt"; : >"$KEPT"
    say "bench dir $BENCH; SCALE=$SCALE RANDOM_MB=$RANDOM_MB RUNS=$RUNS JOBS=$JOBS KILL_AT=$KILL_AT PG_VERSION=$PGV"
    if [ "$SKIP_PGBACKREST" != 1 ] && [ "$PGV" -le 15 ] && command -v pgbackrest >/dev/null; then
        PGBR_OK=1
    fi
    setup_pgjet
    build_cluster
    [ "$PGBR_OK" = 1 ] && setup_pgbackrest
    pj_empty
    local cmds=("$PGJET_BIN --stanza=$PGJET_STANZA --repo-path=$PJREPO archive-push %p")
    [ "$PGBR_OK" = 1 ] && cmds+=("pgbackrest --config=$PGBR_CONF --stanza=zst archive-push %p")
    psql_src >/dev/null <<SQL
ALTER SYSTEM SET archive_mode = on;
ALTER SYSTEM SET archive_command = '$(archive_all "${cmds[@]}")';
SQL
    as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w restart -l "$PG/log" >/dev/null
    psql_src -c "CHECKPOINT" >/dev/null
    record_size cluster "$PGDATA"
    local r
    for r in $(seq 1 "$RUNS"); do
        header "Run $r of $RUNS"
        resume_round "$r"
    done
    header "Report"
    mkdir -p "$(dirname "$RREPORT")"
    write_resume_report
    cat "$RREPORT"
    say
    say "report written to $RREPORT"
}

resume_main "$@"
