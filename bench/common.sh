# Shell functions the benchmark scripts share (sourced; needs a `say` function and the
# variable DROP_CACHES, initially empty).

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
