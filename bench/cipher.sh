#!/usr/bin/env bash
# Encryption benchmark (issue 20): pgjet with repo1-cipher-type=aes-256-gcm against pgjet
# without, in the same rounds, on one PostgreSQL 15 cluster. Not a test: it only measures.
#
#   bash bench/cipher.sh                                  # scale 100 + 500 MiB random
#   SCALE=10 RANDOM_MB=100 RUNS=1 WAL_SEGS=8 bash bench/cipher.sh   # smoke
#
# Per round (cold cache before each timing, `sync` inside it, the two kinds alternating
# which goes first):
#   backup_plain / backup_enc    `pgjet backup --type full --jobs $JOBS` (zstd) into a posix
#                repository, without and with encryption
#   restore_plain / restore_enc  `pgjet restore --jobs $JOBS` of that backup
#   push_sync_plain / _enc       WAL_SEGS real 16 MiB segments of this cluster pushed one
#                `archive-push` process at a time, as PostgreSQL's archive_command would
#                (the first process derives the key-encrypting key with Argon2id; the
#                others take it from the kernel keyring: docs/encryption.md, "The key cache")
#   push_async_plain / _enc      the same segments with --archive-async (the background
#                pusher, --jobs $JOBS): a fake pg_wal with archive_status/*.ready, each
#                segment's foreground archive-push called in order
# The reference for each pair is the unencrypted run of the same round: the target is
# within 10% (ratio <= 1.10).
#
# Settings (with those of bench/run.sh: SCALE, RANDOM_MB, RUNS, JOBS, BENCH_DIR, KEEP):
#   WAL_SEGS   segments for the archive-push runs (default 32)
#   CREPORT    markdown report (default bench/results/cipher-<UTC time>.md)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export BENCH_DIR=${BENCH_DIR:-/var/tmp/pgjet-cipherbench}
# shellcheck source=bench/run.sh
source "$HERE/run.sh"

WAL_SEGS=${WAL_SEGS:-32}
CREPORT=${CREPORT:-$HERE/results/cipher-$(date -u +%Y%m%dT%H%MZ).md}
PASS=bench-passphrase-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
PLAIN_REPO=$BENCH/repo-plain
ENC_REPO=$BENCH/repo-enc
ENC_CONF=$BENCH/cipher.conf
WALSRC=$BENCH/wal-src              # the segments pushed (on the same disk as the repository)

cipher_cleanup() {
    local rc=$?
    set +e
    [ "$KEEP" = 1 ] || rm -rf "$PLAIN_REPO" "$ENC_REPO" "$ENC_CONF" "$WALSRC" "$BENCH"/spool-*
    (exit $rc)
    cleanup
}
trap cipher_cleanup EXIT

# conf_args KIND -> the repository flags of KIND (plain: a path; enc: the config file)
conf_args() {
    case $1 in
        plain) printf '%s\n' --repo-path "$PLAIN_REPO" ;;
        enc) printf '%s\n' --config "$ENC_CONF" ;;
    esac
}

# pj KIND CMD ARGS...: a pgjet command line on the repository of KIND (for timed)
pj() {
    local kind=$1 cmd=$2 repo
    shift 2
    mapfile -t repo < <(conf_args "$kind")
    pg_cmd "$PGJET_BIN" "$cmd" --stanza "$PGJET_STANZA" "${repo[@]}" "$@"
}

cipher_prepare() {
    build_cluster
    printf '[global]\nrepo1-path=%s\nrepo1-cipher-type=aes-256-gcm\nrepo1-cipher-pass=%s\n' \
        "$ENC_REPO" "$PASS" >"$ENC_CONF"
    chmod 600 "$ENC_CONF"
    chown postgres: "$ENC_CONF"
    local kind
    for kind in plain enc; do
        fresh_dir "$BENCH/repo-$kind"
        bash -c "$(pj "$kind" stanza-create --pg-path "$PGDATA" --pg-port "$PORT" --pg-socket-path "$PG/sock")" \
            >"$LOGS/stanza-create-$kind.log" 2>&1 || { cat "$LOGS/stanza-create-$kind.log"; die "stanza-create $kind"; }
    done
    header "WAL segments for archive-push: $WAL_SEGS of this cluster (random rows)"
    local first last
    first=$(psql_as "$PGV" "$PG" "$PORT" -Atc "SELECT pg_walfile_name(pg_current_wal_insert_lsn())")
    psql_as "$PGV" "$PG" "$PORT" >/dev/null <<SQL
CREATE TABLE wal_maker AS SELECT i, decode(md5(i::text) || md5((i + 1)::text), 'hex') || gen_random_uuid()::text::bytea AS b
  FROM generate_series(1, $((WAL_SEGS * 16 * 1024 * 1024 / 120))) i;
SQL
    psql_as "$PGV" "$PG" "$PORT" -Atc "SELECT pg_switch_wal()" >/dev/null
    last=$(psql_as "$PGV" "$PG" "$PORT" -Atc "SELECT pg_walfile_name(pg_current_wal_insert_lsn())")
    rm -rf "$WALSRC"
    mkdir -p "$WALSRC/archive_status"
    local f n=0
    for f in $(cd "$PGDATA/pg_wal" && ls | grep -E '^[0-9A-F]{24}$' | sort); do
        [[ "$f" > "$first" && "$f" < "$last" ]] || continue
        [ "$n" -lt "$WAL_SEGS" ] || break
        cp "$PGDATA/pg_wal/$f" "$WALSRC/$f"
        n=$((n + 1))
    done
    chown -R postgres: "$WALSRC"
    WAL_COPIED=$n
    say "$n segments from $first to $last copied to $WALSRC"
    [ "$n" -gt 0 ] || die "no WAL segment to push"
}

# push_cmd KIND MODE -> a command pushing every segment of WALSRC, one archive-push at a time
push_cmd() {
    local kind=$1 mode=$2 repo extra="" f s=""
    mapfile -t repo < <(conf_args "$kind")
    if [ "$mode" = async ]; then
        extra="--archive-async=y --spool-path=$BENCH/spool-$kind --jobs=$JOBS"
        s+="touch $(for f in "$WALSRC"/0*; do printf '%q ' "$WALSRC/archive_status/$(basename "$f").ready"; done); "
    fi
    for f in "$WALSRC"/0*; do
        s+="runuser -u postgres -- $(q "$PGJET_BIN" --stanza "$PGJET_STANZA" "${repo[@]}") $extra archive-push $(q "$f") && "
    done
    printf '%s true' "$s"
}

# reset_archive KIND: the repository's archive emptied (every round pushes the same segments)
reset_archive() {
    local repo=$BENCH/repo-$1
    rm -rf "$repo/$PGJET_STANZA/archive" "$BENCH/spool-$1" "$WALSRC"/archive_status/*
    mkdir -p "$BENCH/spool-$1"
    chown postgres: "$BENCH/spool-$1"
}

cipher_round() {
    local r=$1 kind order o
    order="plain enc"
    [ $((r % 2)) = 0 ] && order="enc plain"
    for kind in $order; do
        rm -rf "$BENCH/repo-$kind/$PGJET_STANZA/backup"
        timed "backup_$kind" "$r" "$(pj "$kind" backup --pg-path "$PGDATA" --pg-port "$PORT" \
            --pg-socket-path "$PG/sock" --type full --start-fast --jobs "$JOBS" --compress-type zstd)" || true
    done
    for kind in $order; do
        o=$OUT/restore-$kind
        fresh_dir "$o"
        timed "restore_$kind" "$r" "$(pj "$kind" restore --pg-path "$o" --jobs "$JOBS")" || true
        [ "$CHECK_RESTORE" = 1 ] && [ "$r" = "$RUNS" ] && check_restored "restore_$kind" "$o"
        rm -rf "$o"
    done
    for kind in $order; do
        reset_archive "$kind"
        timed "push_sync_$kind" "$r" "$(push_cmd "$kind" sync)" || true
    done
    for kind in $order; do
        reset_archive "$kind"
        timed "push_async_$kind" "$r" "$(push_cmd "$kind" async)" || true
    done
}

cipher_report() {
    local seg_mib=$((WAL_COPIED * 16))
    {
        echo "# Encryption: pgjet with and without aes-256-gcm, $(date -u +%Y-%m-%dT%H:%MZ)"
        echo
        echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo); $PGJET_VERSION."
        echo "PostgreSQL $PGV, pgbench scale $SCALE + $RANDOM_MB MiB random; cold cache before each timing: $DROP_CACHES; $RUNS rounds, medians; the kinds alternate which goes first."
        echo "archive-push: $WAL_COPIED real segments ($seg_mib MiB) pushed one process at a time, as archive_command runs it."
        echo
        echo "| job | plain (s) | encrypted (s) | encrypted / plain | target ≤ 1.10 |"
        echo "|---|---:|---:|---:|---|"
        local job a b q
        for job in backup restore push_sync push_async; do
            a=$(median "${job}_plain"); b=$(median "${job}_enc")
            q=$(awk -v a="$a" -v b="$b" 'BEGIN {if (a > 0 && b > 0) printf "%.2f", b / a; else print "n/a"}')
            echo "| $job | $a | $b | $q | $(awk -v q="$q" 'BEGIN {print (q != "n/a" && q <= 1.10) ? "met" : "NOT MET"}') |"
        done
        echo
        echo "Every timing (seconds):"
        echo
        echo '```'
        sort -k1,1 -k2,2n "$TIMES"
        echo '```'
        if [ -s "$RES/checks.txt" ]; then
            echo
            echo "Restored clusters started and compared (untimed):"
            sed 's/^check_/- /' "$RES/checks.txt"
        fi
    } >"$CREPORT"
}

cipher_main() {
    [ "$(id -u)" -eq 0 ] || die "run as root (drop_caches, runuser)"
    mkdir -p "$BENCH" "$BENCH/bin" "$LOGS" "$RES" "$OUT"
    chmod 755 "$BENCH" "$BENCH/bin"
    chown postgres: "$OUT"
    : >"$TIMES"; : >"$SIZES"; : >"$RES/checks.txt"
    say "bench dir $BENCH; SCALE=$SCALE RANDOM_MB=$RANDOM_MB RUNS=$RUNS JOBS=$JOBS WAL_SEGS=$WAL_SEGS"
    setup_pgjet
    cipher_prepare
    local r
    for r in $(seq 1 "$RUNS"); do
        header "Run $r of $RUNS (load $(cut -d' ' -f1-3 /proc/loadavg))"
        cipher_round "$r"
    done
    header "Report"
    cipher_report
    cat "$CREPORT"
}

cipher_main "$@"
