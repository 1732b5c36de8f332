#!/usr/bin/env bash
# Restore benchmark: pgjet restore side by side with this machine's write limit and with
# pgBackRest restore, in one run, cold cache, medians. Not a test: it only measures.
#
#   bash bench/restore.sh                                   # full size (scale 100 + 500 MiB)
#   SCALE=20 RANDOM_MB=100 KEEP=1 bash bench/restore.sh     # small, keep cluster and backups
#   REUSE=1 KEEP=1 bash bench/restore.sh                    # again on the kept backups
#
# Per round (cold cache before each, `sync` inside each timing, as bench/run.sh does):
#   dd_direct    `dd if=<incompressible file in /dev/shm> of=OUT bs=8M oflag=direct; sync`,
#                as many bytes as the restored directory's apparent size: the disk's write
#                limit for the logical bytes of the restore, one request in flight
#   dd_direct_x4 the same bytes by 4 dd's at once (DD_STREAMS), a quarter each, each into
#                a file of its own: the write limit with several requests in flight
#   dd_read_write  dd_direct while every stored object of the pgjet backup is read with direct
#                I/O, four at once: a restore's reads and writes by plain tools (they share
#                the disk; dd_direct leaves the reads out; not a tight limit)
#   tar_x        `tar -xf <tar of a restored directory, in /dev/shm>; sync`: the same files,
#                holes included (tar -S), written by tar through the page cache
#   limit_pgjet_restore  the device's own time for the restore's bytes (the backup's stored
#                objects read, the restored directory's apparent size written) at the best
#                rate fio reaches for that mix (bench/common.sh device_limit; DEVICE_LIMIT=0
#                leaves it out; with REPOS_IN_MEMORY=1 writes only)
#   pgjet_restore        `pgjet restore --jobs $JOBS` of a zstd backup
#   pgbackrest_restore   `pgbackrest restore` of a zst backup (process-max $JOBS)
# The inputs of dd and tar live in /dev/shm (tmpfs), so dropping the cache does not make
# them read from disk: those two references measure writing only.
#
# Extra settings (with those of bench/run.sh: SCALE, RANDOM_MB, RUNS, JOBS, BENCH_DIR, KEEP,
# SKIP_PGBACKREST, CHECK_RESTORE):
#   REUSE=1     use the cluster and backups kept by an earlier KEEP=1 run of this script
#   RREPORT     markdown report (default $BENCH_DIR/results/restore.md)
#   SHM_DIR     where the in-memory inputs go (default /dev/shm/pgjet-bench)
#   PGJET_ENV   extra environment for the timed pgjet restore (e.g. "RUST_LOG=...")
#   DD_STREAMS  parallel dd's of the second write reference (default 4)
#   REPOS_IN_MEMORY=1  move both repositories to tmpfs (SHM_DIR-repos, symbolic links in
#               their place) for the timed rounds: the restores then read nothing from the disk
#               they write to, as with a repository on another device, and the write limit
#               (dd_direct) is the whole reference; moved back at exit
#   PGJET_BASE  another pgjet binary to time in the same rounds (pgjet_base), e.g. the
#               commit before a change
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/run.sh
source "$HERE/run.sh"

REUSE=${REUSE:-0}
RREPORT=${RREPORT:-$RES/restore.md}
SHM=${SHM_DIR:-/dev/shm/pgjet-bench}
PGJET_ENV=${PGJET_ENV:-}
DD_STREAMS=${DD_STREAMS:-4}
REPOS_IN_MEMORY=${REPOS_IN_MEMORY:-0}
SHM_REPOS=$SHM-repos
PGJET_BASE=${PGJET_BASE:-}          # a second pgjet binary (e.g. an older commit), timed as pgjet_base
STATE=$BENCH/restore-state.sh
LOADS=$RES/loads.tsv                # name, run, 1-minute load average before the run
PGJET_REPO=$BENCH/pgjet-repo-zstd

restore_cleanup() {
    local rc=$?
    # set +e first: under set -e, (exit $rc) of a failed run would end the trap here, and
    # cleanup (which stops the cluster) would never run
    set +e
    rm -rf "$SHM"
    repos_back
    (exit $rc)
    cleanup
}
trap restore_cleanup EXIT

# REPOS_IN_MEMORY=1: each repository moved to tmpfs, a symbolic link left in its place
repos_to_memory() {
    local d
    mkdir -p "$SHM_REPOS"
    for d in "$PGJET_REPO" "$PGBR_REPO"; do
        [ -d "$d" ] && [ ! -L "$d" ] || continue
        mv "$d" "$SHM_REPOS/$(basename "$d")"
        ln -s "$SHM_REPOS/$(basename "$d")" "$d"
    done
    say "repositories in memory: $(du -sh "$SHM_REPOS" | cut -f1) under $SHM_REPOS"
}
repos_back() {
    local d
    for d in "$PGJET_REPO" "$PGBR_REPO"; do
        if [ -L "$d" ] && [ -d "$SHM_REPOS/$(basename "$d")" ]; then
            rm -f "$d"
            mv "$SHM_REPOS/$(basename "$d")" "$d"
        fi
    done
    rm -rf "$SHM_REPOS"
}

# rtimed NAME ROUND CMD: timed, with the load average noted first
rtimed() {
    printf '%s\t%s\t%s\n' "$1" "$2" "$(cut -d' ' -f1 /proc/loadavg)" >>"$LOADS"
    timed "$@"
}

prepare() {
    if [ "$REUSE" = 1 ] && [ -f "$STATE" ]; then
        # shellcheck disable=SC1090
        source "$STATE"
        say "reusing the cluster and backups of $STATE (SCALE=$SCALE RANDOM_MB=$RANDOM_MB)"
        return
    fi
    build_cluster
    [ "$SKIP_PGBACKREST" = 1 ] || setup_pgbackrest
    setup_archiving
    psql_as "$PGV" "$PG" "$PORT" -c "CHECKPOINT" >/dev/null
    record_size cluster "$PGDATA"
    header "Backups to restore from (untimed)"
    local args
    pgjet_fresh_repo "$PGJET_REPO"
    mapfile -t args < <(pgjet_conn "$PGJET_REPO")
    as_pg "$PGJET_BIN" backup "${args[@]}" --type full --start-fast --jobs "$JOBS" \
        --compress-type zstd >"$LOGS/restore-bench-pgjet-backup.log" 2>&1
    say "pgjet backup $(pgjet_latest "$PGJET_REPO")"
    if [ "$SKIP_PGBACKREST" != 1 ]; then
        as_pg pgbackrest --config="$PGBR_CONF" --stanza=zst --type=full backup
        say "pgBackRest backup $(pgbr_latest zst)"
    fi
    # Restores need no server; a stopped one adds no noise.
    pg_stop_cluster "$PG"
    printf 'SCALE=%q\nRANDOM_MB=%q\nSRC_ROWS=%q\nPORT=%q\n' "$SCALE" "$RANDOM_MB" "$SRC_ROWS" "$PORT" >"$STATE"
}

pgjet_restore_cmd() {
    local env=() bin=${2:-$PGJET_BIN}
    [ -n "$PGJET_ENV" ] && read -r -a env <<<"$PGJET_ENV"
    printf 'cd / && runuser -u postgres -- %s' \
        "$(q env "${env[@]}" "$bin" restore --stanza "$PGJET_STANZA" --repo-path "$PGJET_REPO" --pg-path "$1" --jobs "$JOBS")"
}

# The in-memory inputs of the two references, sized from one untimed pgjet restore.
make_references() {
    local o=$OUT/ref
    header "References: sizes from one untimed pgjet restore"
    fresh_dir "$o"
    bash -c "$(pgjet_restore_cmd "$o")" >"$LOGS/restore-ref.log" 2>&1
    LOGICAL=$(du -sb "$o" | cut -f1)
    ALLOCATED=$(du -s -B1 "$o" | cut -f1)
    NFILES=$(find "$o" -type f | wc -l)
    record_size restored_logical "$o"
    say "restored directory: $NFILES files, $(mib "$LOGICAL") MiB apparent, $(mib "$ALLOCATED") MiB allocated"
    BACKUP_BYTES=$(du -sb "$PGJET_REPO/$PGJET_STANZA/backup/$(pgjet_latest "$PGJET_REPO")" | cut -f1)
    rm -rf "$SHM"; mkdir -p "$SHM"
    tar -C "$o" -S -cf "$SHM/ref.tar" .
    rm -rf "$o"
    local blocks=$(( (LOGICAL + 4095) / 4096 ))
    head -c $((blocks * 4096)) /dev/urandom >"$SHM/rand"
    say "in /dev/shm: ref.tar $(mib "$(stat -c %s "$SHM/ref.tar")") MiB, rand $(mib "$(stat -c %s "$SHM/rand")") MiB"
}

one_round() {
    local r=$1 o
    o=$OUT/dd.out
    rm -f "$o"
    rtimed dd_direct "$r" "dd if=$(q "$SHM/rand") of=$(q "$o") bs=8M oflag=direct status=none" || true
    rm -f "$o"
    # The same bytes as DD_STREAMS dd's at once, each writing its share to a file of its own:
    # the device takes more than one request in flight (pgjet writes with several threads).
    local i part cmd="" blocks=$(( $(stat -c %s "$SHM/rand") / 4096 ))
    part=$(( (blocks + DD_STREAMS - 1) / DD_STREAMS * 4096 ))
    for i in $(seq 0 $((DD_STREAMS - 1))); do
        cmd+="dd if=$(q "$SHM/rand") of=$(q "$OUT/dd.$i") bs=8M iflag=skip_bytes,count_bytes skip=$((i * part)) count=$part oflag=direct status=none & "
    done
    rtimed dd_direct_x$DD_STREAMS "$r" "${cmd}wait" || true
    rm -f "$OUT"/dd.[0-9]*
    o=$OUT/dd.out
    # with the repositories in memory the restores read nothing from the disk
    [ "$REPOS_IN_MEMORY" = 1 ] || rtimed dd_read_write "$r" "$(dd_read_write_cmd "$PGJET_REPO/$PGJET_STANZA/backup/$(pgjet_latest "$PGJET_REPO")" "$SHM/rand" "$o")" || true
    rm -f "$o"
    o=$OUT/tarx
    rm -rf "$o"; mkdir -p "$o"
    rtimed tar_x "$r" "tar -C $(q "$o") -xf $(q "$SHM/ref.tar")" || true
    rm -rf "$o"
    o=$OUT/pgjet-restore
    fresh_dir "$o"
    rtimed pgjet_restore "$r" "$(pgjet_restore_cmd "$o")" || true
    record_size pgjet_restore "$o"
    if [ "$DEVICE_LIMIT" = 1 ]; then
        # with the repositories in memory the restore reads nothing from the disk
        device_limit limit_pgjet_restore "$r" "$( [ "$REPOS_IN_MEMORY" = 1 ] && echo 0 || echo "$BACKUP_BYTES")" "$LOGICAL" "$BENCH"
        rm -f "$BENCH/fio-limit.dat"
    fi
    [ "$CHECK_RESTORE" = 1 ] && [ "$r" = "$RUNS" ] && check_restored pgjet_restore "$o"
    rm -rf "$o"
    if [ -n "$PGJET_BASE" ]; then
        o=$OUT/pgjet-base-restore
        fresh_dir "$o"
        rtimed pgjet_base "$r" "$(pgjet_restore_cmd "$o" "$BENCH/bin/pgjet-base")" || true
        rm -rf "$o"
    fi
    if [ "$SKIP_PGBACKREST" != 1 ]; then
        o=$OUT/pgbr-restore
        fresh_dir "$o"
        rtimed pgbackrest_restore "$r" "$(pgbr --stanza=zst --pg1-path="$o" restore)" || true
        record_size pgbackrest_restore "$o"
        [ "$CHECK_RESTORE" = 1 ] && [ "$r" = "$RUNS" ] && check_restored pgbackrest_restore "$o"
        rm -rf "$o"
    fi
}

loads_of() { awk -F'\t' -v n="$1" '$1==n {printf "%s%s", s, $3; s=" "}' "$LOADS"; }

write_restore_report() {
    local n med rss
    {
        echo "# pgjet restore benchmark"
        echo
        echo "Written by \`bench/restore.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'). Medians of $RUNS cold-cache run(s)"
        echo "(page cache dropped: $DROP_CACHES), every command followed by \`sync\` inside the timing."
        echo "$( [ -n "${PGJET_VERSION:-}" ] && echo "$PGJET_VERSION, ")commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$( [ -n "$(git -C "$ROOT" status --porcelain -- src 2>/dev/null)" ] && echo ' (modified)')."
        [ "$REPOS_IN_MEMORY" = 1 ] && echo "Repositories in memory (tmpfs): the restores read nothing from the disk they write to."
        echo "Cluster: SCALE=$SCALE RANDOM_MB=$RANDOM_MB; restored directory $NFILES files,"
        echo "$(mib "$LOGICAL") MiB apparent ($(mib "$ALLOCATED") MiB allocated; zero pages are holes). JOBS=$JOBS. $(nproc) CPUs."
        echo
        echo "| command | median s | min–max s | MiB/s (apparent) | peak RSS MiB | load avg before each run |"
        echo "|---|---:|---:|---:|---:|---|"
        for n in dd_direct "dd_direct_x$DD_STREAMS" dd_read_write tar_x limit_pgjet_restore pgjet_restore pgjet_base pgbackrest_restore; do
            med=$(median "$n"); rss=$(median "$n" 4)
            [ -z "$med" ] && [ "$(nfail "$n")" = 0 ] && continue
            printf '| %s | %s | %s | %s | %s | %s |\n' "$n" "$( [ -n "$med" ] && printf '%.2f' "$med" || echo FAILED)" \
                "$(minmax "$n")" "$( [ -n "$med" ] && awk -v b="$LOGICAL" -v s="$med" 'BEGIN {printf "%.0f", b / 1048576 / s}')" \
                "$( [ -n "$rss" ] && mib "$((${rss%.*} * 1024))")" "$(loads_of "$n")"
        done
        echo
        echo "| ratio | of medians | median of same-round ratios |"
        echo "|---|---:|---:|"
        [ "$DEVICE_LIMIT" != 1 ] || echo "| device's limit for the restore's bytes / pgjet restore (goal ≥ 0.9; fio: $(limit_of limit_pgjet_restore)) | $(ratio limit_pgjet_restore pgjet_restore | tr -d '×') | $(per_round_ratio limit_pgjet_restore pgjet_restore "$RUNS") |"
        echo "| pgjet restore / dd_direct (goal ≤ 1.11) | $(ratio pgjet_restore dd_direct | tr -d '×') | $(per_round_ratio pgjet_restore dd_direct "$RUNS") |"
        echo "| pgjet restore / dd_direct_x$DD_STREAMS | $(ratio pgjet_restore "dd_direct_x$DD_STREAMS" | tr -d '×') | $(per_round_ratio pgjet_restore "dd_direct_x$DD_STREAMS" "$RUNS") |"
        [ "$REPOS_IN_MEMORY" = 1 ] || echo "| pgjet restore / dd_read_write | $(ratio pgjet_restore dd_read_write | tr -d '×') | $(per_round_ratio pgjet_restore dd_read_write "$RUNS") |"
        echo "| pgjet restore / tar_x | $(ratio pgjet_restore tar_x | tr -d '×') | $(per_round_ratio pgjet_restore tar_x "$RUNS") |"
        [ -z "$PGJET_BASE" ] || echo "| pgjet_base / pgjet restore (above 1 = this pgjet faster) | $(ratio pgjet_base pgjet_restore | tr -d '×') | $(per_round_ratio pgjet_base pgjet_restore "$RUNS") |"
        echo "| pgBackRest restore / pgjet restore (above 1 = pgjet faster) | $(ratio pgbackrest_restore pgjet_restore | tr -d '×') | $(per_round_ratio pgbackrest_restore pgjet_restore "$RUNS") |"
        echo
        if [ -s "$RES/checks.txt" ]; then
            echo "Restored clusters started once (untimed, last run), pgbench_accounts compared with the source:"
            sed 's/^check_/- /' "$RES/checks.txt"
            echo
        fi
        echo "Raw: \`$TIMES\`, \`$LOADS\`."
    } >"$RREPORT"
}

restore_main() {
    [ "$(id -u)" -eq 0 ] || die "run as root (drop_caches, runuser)"
    for c in /usr/bin/time pgbackrest runuser dd tar fio; do
        command -v "$c" >/dev/null || die "missing $c: run scripts/install-deps.sh"
    done
    mkdir -p "$BENCH" "$BENCH/bin" "$LOGS" "$RES" "$OUT"
    chmod 755 "$BENCH" "$BENCH/bin"
    chown postgres: "$OUT"
    : >"$TIMES"; : >"$SIZES"; : >"$RES/checks.txt"; : >"$LOADS"; : >"$LIMITS"; : >"$CPUS"
    say "bench dir $BENCH; SCALE=$SCALE RANDOM_MB=$RANDOM_MB RUNS=$RUNS JOBS=$JOBS REUSE=$REUSE"
    setup_pgjet
    [ -z "$PGJET_BASE" ] || install -m 755 "$PGJET_BASE" "$BENCH/bin/pgjet-base"
    prepare
    make_references
    [ "$REPOS_IN_MEMORY" = 1 ] && repos_to_memory
    local r
    for r in $(seq 1 "$RUNS"); do
        header "Run $r of $RUNS (load $(cut -d' ' -f1-3 /proc/loadavg))"
        one_round "$r"
    done
    header "Report"
    write_restore_report
    cat "$RREPORT"
}

restore_main "$@"
