# Shell functions the benchmark scripts share (sourced; they need a `say` function and the
# variables DROP_CACHES (initially empty), LOGS and TIMES).

# cold_cache: write back dirty pages and drop the page cache, so every timed run reads from
# disk. If dropping is not permitted, says so once and the runs are warm (DROP_CACHES=no).
# COLD=0 (the CI smoke run, whose times mean nothing) leaves the cache alone, as if dropping
# were not permitted: the machine's other work keeps its cache.
cold_cache() {
    sync
    if [ "${COLD:-1}" = 0 ]; then
        DROP_CACHES=no
    elif [ "$DROP_CACHES" != no ]; then
        if echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
            DROP_CACHES=yes
        else
            DROP_CACHES=no
            say "WARNING: cannot drop the page cache (echo 3 > /proc/sys/vm/drop_caches failed);"
            say "         runs are NOT cold-cache; carrying on"
        fi
    fi
}

# failed NAME RUN WHY: one FAIL row in $TIMES, and a line on the terminal.
failed() {
    printf '%s\t%s\t-\t-\tFAIL\n' "$1" "$2" >>"$TIMES"
    printf '  %-28s run %d: FAILED (%s)\n' "$1" "$2" "$3"
}

# timed NAME RUN CMD: cold cache, then `bash -c "CMD && sync"` under GNU time: wall seconds
# and peak RSS (KiB; GNU time reports the largest single process among the command and its
# children, not their sum). One row in $TIMES (name, run, seconds, KiB, ok or FAIL); with CPUS
# set, one row in $CPUS too (name, run, user s, system s: the command and all its children).
# On a failure the log's last lines and a non-zero return. Needs LOGS and TIMES.
timed() {
    local name=$1 run=$2 cmd=$3 base sec rss us ss
    base=$LOGS/$name.run$run
    cold_cache
    if /usr/bin/time -f '%e %M %U %S' -o "$base.time" bash -c "$cmd && sync" >"$base.log" 2>&1; then
        read -r sec rss us ss < <(tail -n 1 "$base.time")
        printf '%s\t%s\t%s\t%s\tok\n' "$name" "$run" "$sec" "$rss" >>"$TIMES"
        [ -z "${CPUS:-}" ] || printf '%s\t%s\t%s\t%s\n' "$name" "$run" "$us" "$ss" >>"$CPUS"
        printf '  %-28s run %d: %8.2f s  %6d MiB RSS  %6.2f CPU s\n' "$name" "$run" "$sec" "$((rss / 1024))" "$(awk -v u="$us" -v s="$ss" 'BEGIN {print u + s}')"
    else
        failed "$name" "$run" "log $base.log"
        tail -n 6 "$base.log" | sed 's/^/      /'
        return 1
    fi
}

# cpu_median NAME -> the median over runs of NAME's user + system seconds in $CPUS
cpu_median() { awk -F'\t' -v n="$1" '$1==n {print $3 + $4}' "$CPUS" 2>/dev/null | stdin_median; }

# archive_all CMD...: one archive_command (run by /bin/sh) that runs every CMD (each a shell
# command with %p) at the same time and succeeds only when all of them do. The benches give
# every tool its own WAL archive this way: a backup that waits for its WAL in its archive
# (pgBackRest's archive-check, pgjet's archive-check, both on by default) waits for its own
# tool's archive-push, not for the other's. pgBackRest accepts it: it checks only that
# archive_command names pgbackrest. No single quotes in CMD (it goes into ALTER SYSTEM '...').
archive_all() {
    local i=0 c s=""
    for c in "$@"; do
        i=$((i + 1))
        s+="{ $c; } & p$i=\$!; "
    done
    s+="s=0;"
    for ((c = 1; c <= i; c++)); do s+=" wait \$p$c || s=1;"; done
    printf '%s exit $s' "$s"
}

# archiver_idle PGDATA [SECONDS]: wait (default at most 120 s) until PostgreSQL's archiver has
# nothing left to archive: no pg_wal/archive_status/*.ready (a .ready file is renamed .done
# only after archive_command returned, so none left means no archive-push is running).
# A bench waits so before it empties a tool's repository: otherwise a push still running
# (the other tool's backup returned as soon as its own push was done) would write into the
# emptied directory. Non-zero, with a message, on timeout.
archiver_idle() {
    local d=$1 limit=${2:-120} t0=$SECONDS
    while compgen -G "$d/pg_wal/archive_status/*.ready" >/dev/null; do
        if [ $((SECONDS - t0)) -ge "$limit" ]; then
            printf '  archiver not idle after %d s: %s\n' "$limit" "$(cd "$d/pg_wal/archive_status" && echo *.ready)" >&2
            return 1
        fi
        sleep 0.2
    done
}

# disk_of PATH -> the /proc/diskstats name of the block device holding PATH (empty if none:
# an overlay or tmpfs has no device of its own)
disk_of() {
    local mm
    mm=$(stat -c '%Hd %Ld' "$1")
    awk -v a="${mm% *}" -v b="${mm#* }" '$1 == a && $2 == b {print $3}' /proc/diskstats
}
# sectors_read -> sectors read so far on the device $DISK (/proc/diskstats)
sectors_read() { awk -v d="$DISK" '$3 == d {print $6}' /proc/diskstats; }

# change_pages_sql PCT -> SQL that updates one row on PCT % of pgbench_accounts' heap pages
# (chosen at random, by ctid) and prints the number of rows updated
change_pages_sql() {
    cat <<SQL
WITH t AS (SELECT format('(%s,%s)', k, 1 + floor(random() * 61)::int)::tid AS t
           FROM generate_series(0, (pg_relation_size('pgbench_accounts') / 8192)::int - 1) k
           WHERE random() < $1 / 100.0),
     u AS (UPDATE pgbench_accounts SET abalance = abalance + 1
           WHERE ctid = ANY (ARRAY(SELECT t FROM t)) RETURNING 1)
SELECT count(*) FROM u;
SQL
}

# stdin_median: the median of the numbers on stdin, one a line (the mean of the middle two of
# an even count); empty when there are none.
stdin_median() {
    sort -g | awk '{a[NR]=$1} END {if (NR==0) print ""; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'
}

# run_of NAME RUN -> the seconds of that run in $TIMES (empty when it failed)
run_of() { awk -F'\t' -v n="$1" -v r="$2" '$1==n && $2==r && $5=="ok" {print $3}' "$TIMES"; }

# per_round_ratio A B ROUNDS -> the median over rounds 1..ROUNDS of A's time / B's time in the
# same round, two decimals ("n/a" when no round has both): pairs timed side by side cancel
# the disk's drift between rounds
per_round_ratio() {
    local r a b m
    m=$(for r in $(seq 1 "$3"); do
        a=$(run_of "$1" "$r"); b=$(run_of "$2" "$r")
        [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN {if (b > 0) print a / b}'
    done | stdin_median)
    if [ -n "$m" ]; then printf '%.2f' "$m"; else echo n/a; fi
}

# device_limit NAME RUN READ_BYTES WRITE_BYTES DIR: the device's own time for a job that reads
# READ_BYTES and writes WRITE_BYTES on DIR's filesystem, as a row NAME RUN SECONDS in $TIMES
# (so median, ratio and per_round_ratio work on it). fio (Debian's) with direct I/O (libaio),
# reads and writes in the job's proportion (rw=rw, rwmixread) on one file of FIO_SIZE, FIO_S
# seconds at each block size of FIO_BS and queue depth of FIO_DEPTHS, its buffers on
# transparent huge pages (fio_huge_pages); the best rate (read + write bytes per second) gives
# the time. The block size, depth and rate go to $LIMITS (NAME RUN MIX "bs B depth D" MiB/s).
# A mix measured before in the same run is not measured again. The file stays in DIR
# (fio-limit.dat) for the next call; the caller removes it.
FIO_BS=${FIO_BS:-1m 4m}
FIO_DEPTHS=${FIO_DEPTHS:-1 4 16}
FIO_S=${FIO_S:-4}
FIO_SIZE=${FIO_SIZE:-2g}
declare -A FIO_SEEN=()
device_limit() {
    local name=$1 run=$2 rb=$3 wb=$4 dir=$5 mix d bs bw best=0 bestd="" key sec
    [ -n "$rb" ] && [ -n "$wb" ] && [ $((rb + wb)) -gt 0 ] || { failed "$name" "$run" "bytes of the job unknown"; return 0; }
    mix=$(awk -v r="$rb" -v w="$wb" 'BEGIN {printf "%d", 100 * r / (r + w) + 0.5}')
    key="$run:$mix"
    if [ -n "${FIO_SEEN[$key]:-}" ]; then
        best=${FIO_SEEN[$key]%%:*}; bestd=${FIO_SEEN[$key]#*:}
    else
        fio_huge_pages on
        for bs in $FIO_BS; do
            for d in $FIO_DEPTHS; do
                bw=$(fio --name=limit --filename="$dir/fio-limit.dat" --size="$FIO_SIZE" --rw=rw --rwmixread="$mix" \
                    --bs="$bs" --direct=1 --ioengine=libaio --iodepth="$d" --mem=mmap --runtime="$FIO_S" --time_based \
                    --output-format=json 2>>"$LOGS/fio.log" |
                    python3 -c 'import json, sys; j = json.load(sys.stdin)["jobs"][0]; print(j["read"]["bw_bytes"] + j["write"]["bw_bytes"])' 2>>"$LOGS/fio.log") || bw=0
                if awk -v a="${bw:-0}" -v b="$best" 'BEGIN {exit !(a > b)}'; then best=$bw; bestd="bs $bs depth $d"; fi
            done
        done
        fio_huge_pages off
        FIO_SEEN[$key]="$best:$bestd"
    fi
    if [ -z "$bestd" ]; then failed "$name" "$run" "fio gave no rate (log $LOGS/fio.log)"; return 0; fi
    sec=$(awk -v r="$rb" -v w="$wb" -v bw="$best" 'BEGIN {printf "%.3f", (r + w) / bw}')
    printf '%s\t%s\t%s\t0\tok\n' "$name" "$run" "$sec" >>"$TIMES"
    printf '%s\t%s\t%s\t%s\t%.0f\n' "$name" "$run" "$mix" "$bestd" "$(awk -v b="$best" 'BEGIN {print b / 1048576}')" >>"$LIMITS"
    printf '  %-28s run %d: %8.2f s  (fio: %s %% reads, %s, %.0f MiB/s)\n' "$name" "$run" "$sec" "$mix" "$bestd" "$(awk -v b="$best" 'BEGIN {print b / 1048576}')"
}

# fio_huge_pages on|off: fio has no way to ask for huge pages on its buffers other than
# hugetlbfs, and on 4 KiB pages a direct request is cut at the disk's scatter-gather limit
# (254 segments on this project's VM, about 1 MiB): fio's rate was 22% below what the device
# serves (docs/benchmark-notes.md). "on" sets transparent huge pages to "always" for fio's
# runs, remembering the setting in THP_WAS; "off" (and fio_huge_pages_restore, for the exit
# traps) puts it back. pgjet itself advises its large buffers (MADV_HUGEPAGE), which works
# under Debian's default "madvise". Without THP in the kernel, both do nothing.
THP_FILE=/sys/kernel/mm/transparent_hugepage/enabled
THP_WAS=""
fio_huge_pages() {
    [ -w "$THP_FILE" ] || return 0
    if [ "$1" = on ]; then
        [ -n "$THP_WAS" ] || THP_WAS=$(sed -E 's/.*\[([a-z]+)\].*/\1/' "$THP_FILE")
        echo always >"$THP_FILE"
    else
        fio_huge_pages_restore
    fi
}
fio_huge_pages_restore() {
    [ -n "$THP_WAS" ] || return 0
    echo "$THP_WAS" >"$THP_FILE" 2>/dev/null || true
    THP_WAS=""
}

# limit_of NAME -> "MIX% reads, depth D, R MiB/s" of NAME's last row in $LIMITS
limit_of() { awk -F'\t' -v n="$1" '$1==n {l = $3 "% reads, " $4 ", " $5 " MiB/s"} END {print l}' "$LIMITS" 2>/dev/null; }

# stop_versitygw: stops the versitygw whose PID is VGW_PID, if that PID still is versitygw
# (bench/s3.sh, bench/remote.sh); safe under set -e.
stop_versitygw() {   # by PID, if it still is versitygw (safe under set -e)
    [ -n "$VGW_PID" ] || return 0
    if grep -qs versitygw "/proc/$VGW_PID/cmdline"; then
        kill -TERM "$VGW_PID" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$VGW_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$VGW_PID" 2>/dev/null || true
    fi
    wait "$VGW_PID" 2>/dev/null || true
    VGW_PID=""
}
