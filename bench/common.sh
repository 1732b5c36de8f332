# Shell functions the benchmark scripts share (sourced; they need a `say` function and the
# variables DROP_CACHES (initially empty), LOGS and TIMES).

# cold_cache: write back dirty pages and drop the page cache, so every timed run reads from
# disk. If dropping is not permitted, says so once and the runs are warm (DROP_CACHES=no).
cold_cache() {
    sync
    if [ "$DROP_CACHES" != no ]; then
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
# children, not their sum). One row in $TIMES (name, run, seconds, KiB, ok or FAIL); on a
# failure the log's last lines and a non-zero return. Needs LOGS and TIMES.
timed() {
    local name=$1 run=$2 cmd=$3 base sec rss
    base=$LOGS/$name.run$run
    cold_cache
    if /usr/bin/time -f '%e %M' -o "$base.time" bash -c "$cmd && sync" >"$base.log" 2>&1; then
        read -r sec rss < <(tail -n 1 "$base.time")
        printf '%s\t%s\t%s\t%s\tok\n' "$name" "$run" "$sec" "$rss" >>"$TIMES"
        printf '  %-28s run %d: %8.2f s  %6d MiB RSS\n' "$name" "$run" "$sec" "$((rss / 1024))"
    else
        failed "$name" "$run" "log $base.log"
        tail -n 6 "$base.log" | sed 's/^/      /'
        return 1
    fi
}
