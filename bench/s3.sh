#!/usr/bin/env bash
# pgjet object-store benchmark: backup and restore of a cluster with many small tables to a
# posix directory and to an S3 server (versitygw) behind the network lab's delay line,
# pgjet side by side with pgBackRest 2.45 (bundled and unbundled), plus large files against
# a raw S3 client (s5cmd), in one run. Not a test: it only measures. Issue 6, section 5.
#
#   bash bench/s3.sh                                                  # full size (see bench/README.md)
#   TABLES=2000 SCALE=2 RANDOM_MB=64 LARGE_MB=256 RUNS=1 REPORT=/tmp/s3.md bash bench/s3.sh   # smoke
#
# Run as root (network namespaces, drop_caches); servers and clients run as postgres.
#
#   root namespace  builds the clusters (cached under $BENCH_DIR between invocations)
#   <p>a  host A    versitygw (S3, TLS with a CA made here), listening on A's lab address
#   <p>w  the wire  pgjet-delayline: RTT_MS round trip (and RATE, if set)
#   <p>b  host B    both PostgreSQL clusters, pgjet, pgBackRest, s5cmd: every S3 byte crosses the wire
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
# shellcheck source=scripts/pg-env.sh
source "$ROOT/scripts/pg-env.sh"
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"

# ------------------------------------------------------------------ settings (env overrides)
TABLES=${TABLES:-100000}            # small tables of the main cluster (one row, one 8 KiB file each)
SCALE=${SCALE:-20}                  # pgbench -i -s of the main cluster
RANDOM_MB=${RANDOM_MB:-256}         # MiB of incompressible bytes in the main cluster
LARGE_MB=${LARGE_MB:-2048}          # MiB of incompressible bytes of the large-file cluster (0 = no large-file part)
RUNS=${RUNS:-3}                     # timed runs per command (medians, min–max)
JOBS=${JOBS:-4}                     # pgjet --jobs, pgBackRest process-max, s5cmd --concurrency
RTT_MS=${RTT_MS:-20}                # round trip added by the delay line
RATE=${RATE:-unlimited}             # tc rate of the wire (netlab RATE), unlimited = delay only
S5CMD_PART_MB=${S5CMD_PART_MB:-50}  # s5cmd --part-size (MiB; 50 is s5cmd's default)
S5CMD_MAX_CONC=${S5CMD_MAX_CONC:-16}   # s5cmd --concurrency of the link-limit rows
SKIP_PGBACKREST=${SKIP_PGBACKREST:-0}
SKIP_S5CMD=${SKIP_S5CMD:-0}         # 1 = leave s5cmd out (its rows of the large-file part; s5cmd is not built)
# LARGE_VARIANTS: more restores of the large-file backup in each run, each under its own
# environment, as "NAME:VAR=VALUE,VAR=VALUE ..." (say "parts1:PGJET_READ_PARTS=1"); each is
# timed as pgjet_large_restore_NAME, with pgjet's debug log (its restore stage timings).
LARGE_VARIANTS=${LARGE_VARIANTS:-}
PGBR_S3_PLAIN_RUNS=${PGBR_S3_PLAIN_RUNS:-$RUNS}   # runs of pgBackRest bundle=n on S3 (the slowest pair)
CHECK_RESTORE=${CHECK_RESTORE:-1}   # after the last run, start restored clusters once and compare rows
LINK_CHECK=${LINK_CHECK:-1}         # ping and iperf3 across the lab before the runs
KEEP=${KEEP:-0}                     # 1 = keep repositories, S3 data and PKI of this invocation
REBUILD=${REBUILD:-0}               # 1 = rebuild the cached clusters even if their parameters match
LAB_PREFIX=${LAB_PREFIX:-pjs3}
LAB_ID=${LAB_ID:-93}
PGV=15
BENCH=${BENCH_DIR:-/var/tmp/pgjet-s3bench}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
PGJET_SRC=${PGJET:-$TARGET_DIR/release/pgjet}
export DELAYLINE=${DELAYLINE:-$TARGET_DIR/release/pgjet-delayline}
S5CMD=${S5CMD:-/usr/local/bin/s5cmd}
VERSITYGW=${VERSITYGW:-$(for c in /usr/local/bin/versitygw /root/go/bin/versitygw "$(command -v versitygw || true)"; do
    if [ -x "$c" ]; then echo "$c"; break; fi; done)}
S5CMD_VERSION=v2.3.0
REPORT=${REPORT:-$ROOT/bench/results/s3-$(date -u +%Y%m%dT%H%MZ).md}

PGBIN=$(pg_bindir "$PGV")
NA=${LAB_PREFIX}a
NB=${LAB_PREFIX}b
ADDR_A=""
S3_HOST=pgjet-s3                    # name of the S3 server, in B's /etc/hosts and its certificate
S3_PORT=9443                        # inside namespace A nobody else listens
BUCKET=bench
S3_KEY=pgjetbench
S3_SECRET=pgjet-bench-secret-0123456789
S3_REGION=us-east-1
MAIN=$BENCH/pg-main                 # cached clusters: DIR/data, DIR/sock, DIR/log, DIR/stamp
LARGE=$BENCH/pg-large
RUN=$BENCH/run                      # this invocation's repositories, S3 data, PKI, configs
PKI=$RUN/pki
S3DATA=$RUN/s3data                  # versitygw's posix directory: $S3DATA/$BUCKET/<object key>
OUT=$RUN/out                        # restore targets (removed between runs)
LOGS=$BENCH/logs
RES=$BENCH/results
TIMES=$RES/times.tsv                # name, run, seconds, max RSS KiB, ok|FAIL
SIZES=$RES/sizes.tsv                # name, bytes, files
FACTS=$RES/facts.tsv                # key, value (machine, link, settings)
CHECKS=$RES/checks.tsv              # name, ok|FAIL, detail
PGJET_BIN=$BENCH/bin/pgjet
PGJET_CONF=$RUN/pgjet.conf
PGBR_CONF=$RUN/pgbackrest.conf
VGW_PID=""
LOCKED=0                            # 1 once this invocation holds $BENCH/lock (cleanup touches nothing before)
LAB_OWNED=0                         # 1 once this invocation brings the lab up
DROP_CACHES=unknown
CHECK_STARTED=()
declare -A LOGICAL LFILES           # cluster -> logical bytes (PGDATA without pg_wal) and files
declare -A SRC_CHECK                # cluster -> rows the restore check compares

say() { printf '%s\n' "$*"; }
header() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
die() { printf 's3 bench: %s\n' "$*" >&2; exit 1; }
q() { printf '%q ' "$@"; }
fact() { printf '%s\t%s\n' "$1" "$2" >>"$FACTS"; }

# ------------------------------------------------------------------ cleanup
cleanup() {
    local rc=$? d
    set +e
    if [ "$LOCKED" != 1 ]; then
        [ $rc -eq 0 ] || say "s3 bench exited with status $rc" >&2
        return
    fi
    for d in "${CHECK_STARTED[@]}"; do pg_stop_cluster "$d"; done
    pg_stop_cluster "$MAIN"
    pg_stop_cluster "$LARGE"
    stop_versitygw
    if [ "$LAB_OWNED" = 1 ]; then
        bash "$ROOT/scripts/netlab.sh" down "$LAB_PREFIX" 2>/dev/null
        rm -rf "/etc/netns/$NB"
    fi
    if [ "$KEEP" = 1 ]; then
        say "KEEP=1: kept $RUN (repositories, S3 data, PKI, configs)"
    else
        rm -rf "$RUN"
    fi
    [ $rc -eq 0 ] || say "s3 bench exited with status $rc" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ measuring

# record_size NAME DIR: bytes (apparent) and regular files under DIR, last run wins
record_size() {
    local name=$1 dir=$2 bytes files
    [ -d "$dir" ] || return 0
    read -r bytes files < <(find "$dir" -type f -printf '%s\n' | awk '{b += $1; n++} END {printf "%d %d\n", b, n}')
    sed -i "/^$name\t/d" "$SIZES" 2>/dev/null || true
    printf '%s\t%s\t%s\n' "$name" "$bytes" "$files" >>"$SIZES"
}

fresh_dir() { rm -rf "$1"; mkdir -p "$1"; chown postgres: "$1"; chmod 700 "$1"; }

# in_b ARGS...: a command string running ARGS as postgres inside namespace B
in_b() { printf 'cd / && ip netns exec %s runuser -u postgres -- %s' "$NB" "$(q "$@")"; }
# as_b ARGS...: run ARGS as postgres inside namespace B, now
as_b() { (cd / && ip netns exec "$NB" runuser -u postgres -- "$@"); }

# ------------------------------------------------------------------ the clusters (cached)
# logical_size NAME PGDATA: what a backup copies (PGDATA without pg_wal), bytes and files
logical_size() {
    local b n
    read -r b n < <(find "$2" -path "$2/pg_wal" -prune -o -type f ! -name postmaster.pid -printf '%s\n' |
        awk '{b += $1; n++} END {printf "%d %d\n", b, n}')
    LOGICAL[$1]=$b; LFILES[$1]=$n
}

build_main() {
    local stamp port t0=$SECONDS i n
    stamp="s3bench-main v2 pg$PGV tables=$TABLES scale=$SCALE random_mb=$RANDOM_MB"
    if [ "$REBUILD" != 1 ] && [ -f "$MAIN/data/PG_VERSION" ] && [ "$(cat "$MAIN/stamp" 2>/dev/null)" = "$stamp" ]; then
        say "main cluster: reusing $MAIN ($stamp)"
        return 0
    fi
    header "Build the main cluster: $TABLES tables, pgbench scale $SCALE, $RANDOM_MB MiB random (cached for later runs)"
    pg_stop_cluster "$MAIN"
    rm -rf "$MAIN"; mkdir -p "$MAIN"
    port=$(free_port)
    # autovacuum off: nothing changes the cluster between runs but the backups themselves.
    # max_locks_per_transaction: one DO block creates 10 000 tables in one transaction.
    PG_SHARED_BUFFERS=256MB PG_EXTRA_CONF="max_wal_size = 4GB
checkpoint_timeout = 30min
max_locks_per_transaction = 1024
autovacuum = off
archive_mode = on
archive_command = '/bin/true'" pg_make_cluster "$PGV" "$MAIN" "$port"
    # the build itself without fsync (a crash would just mean a rebuild); on again at the end
    psql_as "$PGV" "$MAIN" "$port" -c "ALTER SYSTEM SET fsync = off" -c "SELECT pg_reload_conf()" >/dev/null
    i=0
    while [ "$i" -lt "$TABLES" ]; do
        n=$((TABLES - i)); [ "$n" -gt 10000 ] && n=10000
        psql_as "$PGV" "$MAIN" "$port" -c "DO \$\$ BEGIN FOR j IN $i..$((i + n - 1)) LOOP EXECUTE format('CREATE TABLE t%s (a int); INSERT INTO t%s VALUES (1)', j, j); END LOOP; END \$\$;" >/dev/null
        i=$((i + n))
        say "  $i / $TABLES tables ($((SECONDS - t0)) s)"
    done
    as_pg "$PGBIN/pgbench" -h "$MAIN/sock" -p "$port" -U postgres -i -q -s "$SCALE" postgres 2>&1 | tail -n 1
    as_pg "$PGBIN/pgbench" -h "$MAIN/sock" -p "$port" -U postgres -n -c 2 -t 500 postgres >/dev/null
    psql_as "$PGV" "$MAIN" "$port" >/dev/null <<SQL
CREATE TABLE random_bytes (id serial PRIMARY KEY, payload bytea NOT NULL);
ALTER TABLE random_bytes ALTER COLUMN payload SET STORAGE EXTERNAL;
COPY random_bytes (payload) FROM PROGRAM '$BENCH/bin/gen-random.sh $RANDOM_MB';
VACUUM (FREEZE, ANALYZE) pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history, random_bytes,
    pg_class, pg_attribute, pg_type, pg_depend;
ALTER SYSTEM RESET fsync;
SELECT pg_reload_conf();
CHECKPOINT;
SQL
    pg_stop_cluster "$MAIN"
    sync
    echo "$stamp" >"$MAIN/stamp"
    say "main cluster built in $((SECONDS - t0)) s"
}

build_large() {
    local stamp port t0=$SECONDS
    stamp="s3bench-large v1 pg$PGV random_mb=$LARGE_MB"
    if [ "$REBUILD" != 1 ] && [ -f "$LARGE/data/PG_VERSION" ] && [ "$(cat "$LARGE/stamp" 2>/dev/null)" = "$stamp" ]; then
        say "large-file cluster: reusing $LARGE ($stamp)"
        return 0
    fi
    header "Build the large-file cluster: $LARGE_MB MiB random (cached for later runs)"
    pg_stop_cluster "$LARGE"
    rm -rf "$LARGE"; mkdir -p "$LARGE"
    port=$(free_port)
    PG_EXTRA_CONF="max_wal_size = 4GB
checkpoint_timeout = 30min
autovacuum = off" pg_make_cluster "$PGV" "$LARGE" "$port"
    psql_as "$PGV" "$LARGE" "$port" -c "ALTER SYSTEM SET fsync = off" -c "SELECT pg_reload_conf()" >/dev/null
    psql_as "$PGV" "$LARGE" "$port" >/dev/null <<SQL
CREATE TABLE random_bytes (id serial PRIMARY KEY, payload bytea NOT NULL);
ALTER TABLE random_bytes ALTER COLUMN payload SET STORAGE EXTERNAL;
COPY random_bytes (payload) FROM PROGRAM '$BENCH/bin/gen-random.sh $LARGE_MB';
VACUUM (FREEZE, ANALYZE);
ALTER SYSTEM RESET fsync;
SELECT pg_reload_conf();
CHECKPOINT;
SQL
    pg_stop_cluster "$LARGE"
    sync
    echo "$stamp" >"$LARGE/stamp"
    say "large-file cluster built in $((SECONDS - t0)) s"
}

cluster_port() { sed -n 's/^port = \([0-9]*\)$/\1/p' "$1/data/postgresql.conf" | tail -n 1; }

# start_in_b DIR: start a cached cluster inside namespace B (its archive_command reaches S3 there)
start_in_b() {
    local d=$1
    touch "$d/log"; chown postgres: "$d/log"
    as_b "$PGBIN/pg_ctl" -D "$d/data" -l "$d/log" -w -t 300 start >/dev/null 9>&- \
        || { tail -n 20 "$d/log"; die "cluster $d did not start in $NB"; }
}

# the restore check's query: what a restored cluster must hold
check_query() {
    if [ "$1" = main ]; then
        printf '%s' "SELECT (SELECT count(*) || '/' || sum(abalance) FROM pgbench_accounts) || ' ' ||
            (SELECT count(*) FROM pg_class WHERE relkind = 'r' AND relname ~ '^t[0-9]+\$') || ' ' ||
            (SELECT count(*) || '/' || sum(length(payload)) FROM random_bytes)"
        if [ "$TABLES" -gt 0 ]; then
            printf '%s' " || ' ' || (SELECT count(*) FROM t0) + (SELECT count(*) FROM t$((TABLES - 1)))"
        fi
    else
        printf '%s' "SELECT count(*) || '/' || sum(length(payload)) FROM random_bytes"
    fi
}

# ------------------------------------------------------------------ the lab and the S3 server
make_pki() {
    rm -rf "$PKI"; mkdir -p "$PKI"
    (
        cd "$PKI"
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=pgjet-s3bench-ca 2>/dev/null
        printf 'subjectAltName=DNS:%s,IP:%s\nbasicConstraints=CA:FALSE\n' "$S3_HOST" "$ADDR_A" >san.ext
        openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=$S3_HOST" 2>/dev/null
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile san.ext 2>/dev/null
    )
    chmod 755 "$PKI"; chmod 644 "$PKI/ca.crt"; chmod 600 "$PKI"/*.key
}

lab_up() {
    header "Network lab: RTT $RTT_MS ms, rate $RATE"
    if [ -e "/run/netns/$NA" ] || [ -e "/run/netns/$NB" ] || [ -e "/run/netns/${LAB_PREFIX}w" ]; then
        die "namespaces of lab '$LAB_PREFIX' exist (another s3.sh running, or a killed one): 'bash scripts/netlab.sh down $LAB_PREFIX', or LAB_PREFIX=..."
    fi
    LAB_OWNED=1         # from here on, cleanup takes it down (a failing `up` removes its own part)
    RATE=$RATE RTT_MS=$RTT_MS bash "$ROOT/scripts/netlab.sh" up "$LAB_PREFIX" "$LAB_ID" >"$RES/lab.env" 9>&-
    ADDR_A=$(sed -n 's/^NETLAB_ADDR_A=//p' "$RES/lab.env")
    # B resolves the server's name through its own /etc/hosts (ip netns exec bind-mounts
    # /etc/netns/<ns>/hosts): pgBackRest checks a certificate's DNS names only.
    mkdir -p "/etc/netns/$NB"
    printf '127.0.0.1 localhost\n%s %s\n' "$ADDR_A" "$S3_HOST" >"/etc/netns/$NB/hosts"
    say "lab up: namespaces $NA (S3 server, $ADDR_A) and $NB (clients, clusters); delay line pid $(sed -n 's/^NETLAB_DELAYLINE_PID=//p' "$RES/lab.env")"
}

start_versitygw() {
    local i
    rm -rf "$S3DATA"; mkdir -p "$S3DATA/$BUCKET"
    make_pki
    # --quiet: no line per request on stdout. Credentials through the environment (not argv).
    # --keep-alive: versitygw 1.8 otherwise answers every request with "Connection: close",
    # so each request pays a TCP and TLS handshake and a fresh slow start; S3, GCS and Azure
    # keep connections open, and every client here reuses them when it may.
    ROOT_ACCESS_KEY_ID=$S3_KEY ROOT_SECRET_ACCESS_KEY=$S3_SECRET \
        ip netns exec "$NA" "$VERSITYGW" --quiet --keep-alive --port "$ADDR_A:$S3_PORT" \
        --cert "$PKI/server.crt" --key "$PKI/server.key" posix "$S3DATA" \
        </dev/null >"$LOGS/versitygw.log" 2>&1 9>&- &
    VGW_PID=$!          # ip netns exec execs: this is versitygw itself
    for i in $(seq 1 100); do
        if ip netns exec "$NB" curl -s -o /dev/null --cacert "$PKI/ca.crt" "https://$S3_HOST:$S3_PORT/"; then
            say "versitygw (pid $VGW_PID) serves https://$S3_HOST:$S3_PORT (bucket $BUCKET, path style) from $S3DATA"
            return 0
        fi
        kill -0 "$VGW_PID" 2>/dev/null || break
        sleep 0.1
    done
    cat "$LOGS/versitygw.log" >&2
    die "versitygw did not start"
}


# link_check: ping and iperf3 B <-> A, once, before the runs
link_check() {
    header "The link's plain limits"
    local p up down spid
    p=$(ip netns exec "$NB" ping -n -q -c 20 -i 0.2 "$ADDR_A" | sed -n 's/^rtt [^=]*= *\([^ ]*\) ms.*/\1/p')
    fact ping_min_avg_max_mdev_ms "$p"
    say "  ping B -> A, 20 packets: min/avg/max/mdev $p ms"
    if command -v iperf3 >/dev/null; then
        ip netns exec "$NA" iperf3 -s -1 -B "$ADDR_A" >/dev/null 2>&1 9>&- &
        spid=$!; sleep 0.5
        up=$(ip netns exec "$NB" iperf3 -c "$ADDR_A" -P "$JOBS" -t 5 -O 1 -J 2>/dev/null |
            /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])' 2>/dev/null || echo "")
        wait "$spid" 2>/dev/null || true
        ip netns exec "$NA" iperf3 -s -1 -B "$ADDR_A" >/dev/null 2>&1 9>&- &
        spid=$!; sleep 0.5
        down=$(ip netns exec "$NB" iperf3 -c "$ADDR_A" -R -P "$JOBS" -t 5 -O 1 -J 2>/dev/null |
            /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])' 2>/dev/null || echo "")
        wait "$spid" 2>/dev/null || true
        fact iperf3_up_bps "$up"; fact iperf3_down_bps "$down"
        say "  iperf3 $JOBS streams, 5 s, plain TCP: B -> A $(awk -v b="${up:-0}" 'BEGIN {printf "%.0f", b / 8 / 1048576}') MiB/s, A -> B $(awk -v b="${down:-0}" 'BEGIN {printf "%.0f", b / 8 / 1048576}') MiB/s"
    fi
}

# ------------------------------------------------------------------ tools' set-up
setup_pgjet() {
    [ -x "$PGJET_SRC" ] || die "no pgjet binary at $PGJET_SRC (cargo build --release, or PGJET=...)"
    install -m 755 "$PGJET_SRC" "$PGJET_BIN"
    PGJET_VERSION=$("$PGJET_BIN" --version 2>&1 | head -n 1) || PGJET_VERSION="pgjet (--version failed)"
    cat >"$PGJET_CONF" <<EOF
# written by bench/s3.sh
[global]
# repo1: posix
repo1-path=$RUN/pgjet-posix
# repo2: S3, the main cluster; repo3: S3, the large-file cluster
repo2-type=s3
repo2-path=/pgjet-main
repo2-s3-bucket=$BUCKET
repo2-s3-endpoint=$S3_HOST
repo2-storage-port=$S3_PORT
repo2-s3-region=$S3_REGION
repo2-s3-key=$S3_KEY
repo2-s3-key-secret=$S3_SECRET
repo2-s3-uri-style=path
repo2-storage-ca-file=$PKI/ca.crt
repo3-type=s3
repo3-path=/pgjet-large
repo3-s3-bucket=$BUCKET
repo3-s3-endpoint=$S3_HOST
repo3-storage-port=$S3_PORT
repo3-s3-region=$S3_REGION
repo3-s3-key=$S3_KEY
repo3-s3-key-secret=$S3_SECRET
repo3-s3-uri-style=path
repo3-storage-ca-file=$PKI/ca.crt

[main]
pg-path=$MAIN/data
pg-port=$(cluster_port "$MAIN")
pg-socket-path=$MAIN/sock
EOF
    # the large-file cluster exists only with LARGE_MB > 0 (its postgresql.conf gives the port)
    if [ "$LARGE_MB" -gt 0 ]; then
        printf '\n[large]\npg-path=%s\npg-port=%s\npg-socket-path=%s\n' \
            "$LARGE/data" "$(cluster_port "$LARGE")" "$LARGE/sock" >>"$PGJET_CONF"
    fi
    chown postgres: "$PGJET_CONF"; chmod 600 "$PGJET_CONF"
}

pgjet_b() { in_b "$PGJET_BIN" --config "$PGJET_CONF" "$@"; }

# pgjet_fresh STANZA REPO: an empty repository REPO (1 posix, 2 and 3 S3) with the stanza
# created (untimed). Object-store prefixes are emptied through versitygw's own directory.
# The main cluster archives into repositories 1 and 2: emptied only once its archiver is
# idle (no archive-push of either tool running), and the stanza is back before the next
# WAL segment is finished.
pgjet_fresh() {
    local stanza=$1 repo=$2
    if [ "$stanza" = main ]; then archiver_idle "$MAIN/data" || return 1; fi
    case $repo in
        1) fresh_dir "$RUN/pgjet-posix" ;;
        2) rm -rf "$S3DATA/$BUCKET/pgjet-main" ;;
        3) rm -rf "$S3DATA/$BUCKET/pgjet-large" ;;
    esac
    bash -c "$(pgjet_b --stanza "$stanza" --repo "$repo" stanza-create)" >"$LOGS/pgjet-stanza-create-$stanza-$repo.log" 2>&1 \
        || { sed 's/^/    /' "$LOGS/pgjet-stanza-create-$stanza-$repo.log"; return 1; }
}

# pgBackRest: one stanza over four repositories, so that one archive_command feeds them all
# (archive-push pushes every segment to every repository) and compress-type (a stanza
# option in 2.45) is the same for all: repo1 posix bundled, repo2 posix unbundled, repo3 S3
# bundled, repo4 S3 unbundled.
declare -A PGBR_REPO=([posix_bundle]=1 [posix_plain]=2 [s3_bundle]=3 [s3_plain]=4)
PGBR_SETS="posix_bundle posix_plain s3_bundle s3_plain"

setup_pgbackrest() {
    local r
    mkdir -p "$RUN/pgbr-posix-bundle" "$RUN/pgbr-posix-plain" "$RUN/pgbr-lock" "$RUN/pgbr-spool" "$LOGS/pgbackrest"
    chown postgres: "$RUN/pgbr-posix-bundle" "$RUN/pgbr-posix-plain" "$RUN/pgbr-lock" "$RUN/pgbr-spool" "$LOGS/pgbackrest"
    {
        cat <<EOF
# written by bench/s3.sh
[global]
lock-path=$RUN/pgbr-lock
spool-path=$RUN/pgbr-spool
log-path=$LOGS/pgbackrest
log-level-console=warn
log-level-file=info
process-max=$JOBS
compress-type=zst
start-fast=y
archive-check=y
archive-copy=n
repo1-path=$RUN/pgbr-posix-bundle
repo1-bundle=y
repo1-retention-full=9999999
repo2-path=$RUN/pgbr-posix-plain
repo2-bundle=n
repo2-retention-full=9999999
EOF
        for r in 3 4; do
            cat <<EOF
repo$r-type=s3
repo$r-path=/pgbackrest-$([ $r = 3 ] && echo bundle || echo plain)
repo$r-bundle=$([ $r = 3 ] && echo y || echo n)
repo$r-retention-full=9999999
repo$r-s3-bucket=$BUCKET
repo$r-s3-endpoint=$S3_HOST
repo$r-storage-port=$S3_PORT
repo$r-s3-region=$S3_REGION
repo$r-s3-key=$S3_KEY
repo$r-s3-key-secret=$S3_SECRET
repo$r-s3-uri-style=path
repo$r-storage-ca-file=$PKI/ca.crt
EOF
        done
        cat <<EOF

[bench]
pg1-path=$MAIN/data
pg1-port=$(cluster_port "$MAIN")
pg1-socket-path=$MAIN/sock
EOF
    } >"$PGBR_CONF"
    chown postgres: "$PGBR_CONF"; chmod 600 "$PGBR_CONF"
}

pgbr_b() { in_b pgbackrest --config="$PGBR_CONF" --stanza=bench "$@"; }

# set_archive_command: the main cluster archives into each tool's own repositories, both
# tools at the same time (archive_all): pgBackRest's archive-push into its four (its
# archive-check needs it, and it checks that archive_command runs pgbackrest), pgjet's into
# its repositories 1 and 2 (pgjet's archive-check, on by default, waits for the backup's
# last segment in the backup's repository). Repository 3 holds another stanza (the
# large-file cluster, which does not archive). archive_mode=on is set when the cluster is
# built; the command is set at every start (a reload is enough), once the stanzas exist.
set_archive_command() {
    local cmd pgbr="" pgj
    pgj="$PGJET_BIN --config=$PGJET_CONF --stanza=main --repo=1 archive-push %p && $PGJET_BIN --config=$PGJET_CONF --stanza=main --repo=2 archive-push %p"
    [ "$SKIP_PGBACKREST" = 1 ] || pgbr="pgbackrest --config=$PGBR_CONF --stanza=bench archive-push %p"
    cmd=$(archive_all "$pgj" ${pgbr:+"$pgbr"})
    psql_as "$PGV" "$MAIN" "$(cluster_port "$MAIN")" -c "ALTER SYSTEM SET archive_command = '$cmd'" \
        -c "SELECT pg_reload_conf()" >/dev/null
}

pgbr_latest() {   # SET: label of the newest backup in that repository
    local d
    case $1 in
        posix_bundle) d=$RUN/pgbr-posix-bundle ;;
        posix_plain) d=$RUN/pgbr-posix-plain ;;
        s3_bundle) d=$S3DATA/$BUCKET/pgbackrest-bundle ;;
        s3_plain) d=$S3DATA/$BUCKET/pgbackrest-plain ;;
    esac
    (cd "$d/backup/bench" 2>/dev/null && ls -d [0-9]*F 2>/dev/null | sort | tail -n 1) || true
}
pgbr_dir() {
    case $1 in
        posix_bundle) echo "$RUN/pgbr-posix-bundle" ;;
        posix_plain) echo "$RUN/pgbr-posix-plain" ;;
        s3_bundle) echo "$S3DATA/$BUCKET/pgbackrest-bundle" ;;
        s3_plain) echo "$S3DATA/$BUCKET/pgbackrest-plain" ;;
    esac
}

install_s5cmd() {
    [ -x "$S5CMD" ] && return 0
    header "Install s5cmd $S5CMD_VERSION into $S5CMD"
    local go=${GO:-$(command -v go || echo /usr/local/go/bin/go)} tmp
    [ -x "$go" ] || die "s5cmd missing and no go to build it (S5CMD=... or install Go)"
    tmp=$(mktemp -d)
    # `go install` fails here with a proxy 403; a module with the dependency pinned builds
    (cd "$tmp" && "$go" mod init x >/dev/null 2>&1 && "$go" get "github.com/peak/s5cmd/v2@$S5CMD_VERSION" \
        && "$go" build -o "$S5CMD" github.com/peak/s5cmd/v2) || { rm -rf "$tmp"; die "building s5cmd failed"; }
    rm -rf "$tmp"
}

# s5 ARGS...: a command string running s5cmd as postgres in B against the server, TLS
# verified against the bench CA (AWS_CA_BUNDLE), path-style (s5cmd's choice for a custom endpoint)
s5() {
    in_b env AWS_ACCESS_KEY_ID="$S3_KEY" AWS_SECRET_ACCESS_KEY="$S3_SECRET" AWS_REGION="$S3_REGION" \
        AWS_CA_BUNDLE="$PKI/ca.crt" "$S5CMD" --endpoint-url "https://$S3_HOST:$S3_PORT" "$@"
}

# ------------------------------------------------------------------ one round of every command
round_main() {
    local r=$1 kind repo label o=$OUT/restore

    # pgjet: a fresh repository per run (untimed stanza-create), backup, restore of that backup
    for repo in 1 2; do
        kind=$([ $repo = 1 ] && echo posix || echo s3)
        if pgjet_fresh main "$repo"; then
            timed "pgjet_backup_$kind" "$r" "$(pgjet_b --stanza main --repo "$repo" backup --type full --start-fast --jobs "$JOBS")" || true
        else
            failed "pgjet_backup_$kind" "$r" "fresh repository failed (archiver busy, or stanza-create)"
        fi
        # the backup only (like pgBackRest's rows): the repository also holds the WAL archive
        if [ $repo = 1 ]; then record_size "pgjet_backup_$kind" "$RUN/pgjet-posix/main/backup"
        else record_size "pgjet_backup_$kind" "$S3DATA/$BUCKET/pgjet-main/main/backup"; fi
        fresh_dir "$o"
        timed "pgjet_restore_$kind" "$r" "$(pgjet_b --stanza main --repo "$repo" restore --pg-path "$o" --jobs "$JOBS")" || true
        [ "$CHECK_RESTORE" = 1 ] && [ "$r" = "$RUNS" ] && [ $repo = 2 ] && check_restored "pgjet_restore_s3" main "$o"
        rm -rf "$o"
    done

    [ "$SKIP_PGBACKREST" = 1 ] && return 0
    # pgBackRest: keep only the newest backup of each repository (untimed), then back up and restore
    as_b pgbackrest --config="$PGBR_CONF" --stanza=bench --repo1-retention-full=1 --repo2-retention-full=1 \
        --repo3-retention-full=1 --repo4-retention-full=1 expire >"$LOGS/pgbr-expire.run$r.log" 2>&1 || true
    for kind in $PGBR_SETS; do
        repo=${PGBR_REPO[$kind]}
        if [ "$kind" = s3_plain ] && [ "$r" -gt "$PGBR_S3_PLAIN_RUNS" ]; then continue; fi
        timed "pgbr_backup_$kind" "$r" "$(pgbr_b --repo="$repo" --type=full backup)" || true
        label=$(pgbr_latest "$kind")
        [ -n "$label" ] && record_size "pgbr_backup_$kind" "$(pgbr_dir "$kind")/backup/bench/$label"
        fresh_dir "$o"
        timed "pgbr_restore_$kind" "$r" "$(pgbr_b --repo="$repo" --pg1-path="$o" restore)" || true
        [ "$CHECK_RESTORE" = 1 ] && [ "$r" = "$RUNS" ] && [ "$kind" = s3_bundle ] && check_restored "pgbr_restore_s3_bundle" main "$o"
        rm -rf "$o"
    done
}

round_large() {
    local r=$1 o=$OUT/large
    # raw client: the big relation files of the large cluster, up and down, JOBS parts in flight
    if [ "$SKIP_S5CMD" != 1 ]; then
        rm -rf "$S3DATA/$BUCKET/raw"
        timed s5cmd_upload "$r" "$(s5 --numworkers 1 cp -c "$JOBS" -p "$S5CMD_PART_MB" "$RUN/large-files/*" "s3://$BUCKET/raw/")" || true
        fresh_dir "$o"
        timed s5cmd_download "$r" "$(s5 --numworkers 1 cp -c "$JOBS" -p "$S5CMD_PART_MB" "s3://$BUCKET/raw/*" "$o/")" || true
        rm -rf "$o"
    fi
    # pgjet on the same server: backup of the large cluster, restore of it
    if pgjet_fresh large 3; then
        timed pgjet_large_backup "$r" "$(pgjet_b --stanza large --repo 3 backup --type full --start-fast --jobs "$JOBS")" || true
    else
        failed pgjet_large_backup "$r" "stanza-create failed"
    fi
    record_size pgjet_large_backup "$S3DATA/$BUCKET/pgjet-large"
    fresh_dir "$o"
    timed pgjet_large_restore "$r" "$(pgjet_b --stanza large --repo 3 restore --pg-path "$o" --jobs "$JOBS")" || true
    [ "$CHECK_RESTORE" = 1 ] && [ "$r" = "$RUNS" ] && check_restored pgjet_large_restore large "$o"
    rm -rf "$o"
    local v vars
    for v in $LARGE_VARIANTS; do
        IFS=, read -r -a vars <<<"${v#*:}"
        fresh_dir "$o"
        timed "pgjet_large_restore_${v%%:*}" "$r" "$(in_b env "${vars[@]}" PGJET_LOG_LEVEL=debug "$PGJET_BIN" \
            --config "$PGJET_CONF" --stanza large --repo 3 restore --pg-path "$o" --jobs "$JOBS")" || true
        rm -rf "$o"
    done
    [ "$SKIP_S5CMD" = 1 ] && return 0
    # the link's limit for this client: s5cmd with more parts in flight
    rm -rf "$S3DATA/$BUCKET/raw"
    timed s5cmd_upload_max "$r" "$(s5 cp -c "$S5CMD_MAX_CONC" -p "$S5CMD_PART_MB" "$RUN/large-files/*" "s3://$BUCKET/raw/")" || true
    fresh_dir "$o"
    timed s5cmd_download_max "$r" "$(s5 cp -c "$S5CMD_MAX_CONC" -p "$S5CMD_PART_MB" "s3://$BUCKET/raw/*" "$o/")" || true
    rm -rf "$o" "$S3DATA/$BUCKET/raw"
}

# check_restored NAME CLUSTER PGDATA: start a restored cluster (untimed) inside B on its own
# socket with archiving off, wait for the end of recovery, compare with the source, stop it.
check_restored() {
    local name=$1 cl=$2 d=$3 sock=$RUN/check-sock got="" p
    if [ ! -f "$d/PG_VERSION" ]; then
        printf '%s\tFAIL\tno restored cluster\n' "$name" >>"$CHECKS"; say "  check $name: no restored cluster"; return 0
    fi
    fresh_dir "$sock"
    p=$(free_port)
    : >"$LOGS/check-$name.log"; chown postgres: "$LOGS/check-$name.log"
    CHECK_STARTED+=("$d")
    if ! as_b "$PGBIN/pg_ctl" -D "$d" -l "$LOGS/check-$name.log" -w -t 600 \
            -o "-p $p -k $sock -c archive_mode=off -c listen_addresses=''" start >/dev/null 9>&-; then
        printf '%s\tFAIL\tdid not start (log %s)\n' "$name" "$LOGS/check-$name.log" >>"$CHECKS"
        say "  check $name: FAILED to start (log $LOGS/check-$name.log)"
        pg_stop_cluster "$d"
        return 0
    fi
    for _ in $(seq 1 1200); do
        [ "$(as_pg "$PGBIN/psql" -X -h "$sock" -p "$p" -U postgres -d postgres -Atc 'SELECT pg_is_in_recovery()' 2>/dev/null)" = f ] && break
        sleep 0.5
    done
    got=$(as_pg "$PGBIN/psql" -X -h "$sock" -p "$p" -U postgres -d postgres -Atc "$(check_query "$cl")" 2>/dev/null || true)
    pg_stop_cluster "$d"
    if [ -n "$got" ] && [ "$got" = "${SRC_CHECK[$cl]}" ]; then
        printf '%s\tok\t%s\n' "$name" "$got" >>"$CHECKS"
        say "  check $name: restored cluster started, rows match ($got)"
    else
        printf '%s\tFAIL\tgot "%s", source "%s" (log %s)\n' "$name" "$got" "${SRC_CHECK[$cl]}" "$LOGS/check-$name.log" >>"$CHECKS"
        say "  check $name: MISMATCH: got '$got', source '${SRC_CHECK[$cl]}'"
    fi
}

# ------------------------------------------------------------------ report
write_report() {
    mkdir -p "$(dirname "$REPORT")"
    /usr/bin/python3 - "$RES" "$REPORT" <<'PYEOF'
import sys, csv, os, statistics, datetime
res, report = sys.argv[1:3]
MiB = 1048576.0
facts = {}
for r in csv.reader(open(os.path.join(res, "facts.tsv")), delimiter="\t"):
    if len(r) >= 2: facts[r[0]] = r[1]
rows = [r for r in csv.reader(open(os.path.join(res, "times.tsv")), delimiter="\t") if len(r) >= 5]
sizes = {}
if os.path.exists(os.path.join(res, "sizes.tsv")):
    for r in csv.reader(open(os.path.join(res, "sizes.tsv")), delimiter="\t"):
        if len(r) >= 3: sizes[r[0]] = (int(r[1]), int(r[2]))
checks = [r for r in csv.reader(open(os.path.join(res, "checks.tsv")), delimiter="\t")] if os.path.exists(os.path.join(res, "checks.tsv")) else []

def stat(name):
    ok = sorted(float(r[2]) for r in rows if r[0] == name and r[4] == "ok")
    rss = [int(r[3]) for r in rows if r[0] == name and r[4] == "ok"]
    fail = sum(1 for r in rows if r[0] == name and r[4] != "ok")
    if not ok: return dict(n=0, fail=fail)
    return dict(n=len(ok), fail=fail, med=statistics.median(ok), lo=ok[0], hi=ok[-1], rss=max(rss) / 1024.0)
def present(name): return any(r[0] == name for r in rows)
F = lambda k, d="": facts.get(k, d)
logical = {c: int(F(f"logical_{c}", "0") or 0) for c in ("main", "large", "large_files")}
files = {c: F(f"files_{c}", "?") for c in ("main", "large", "large_files")}

out = []; P = out.append
P("# pgjet on an object store: S3 behind a 20 ms round trip" if F("rtt_ms") == "20" else f"# pgjet on an object store: S3 behind a {F('rtt_ms')} ms round trip")
P("")
P(f"Written by `bench/s3.sh` on {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. Medians of {F('runs')} run(s) per command, "
  "runs interleaved (run 1 of every command, then run 2, ...); "
  + ("page cache dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`) before every timed run; "
     if F("drop_caches") == "yes" else "**page cache NOT dropped** (COLD=0, or not permitted); ")
  + "every command ends with `sync` inside its timing. Ratios are *peer median time / pgjet median time* "
  "(above 1 = pgjet faster); for the large files, *pgjet MiB/s / s5cmd MiB/s*.")
P("")
P("## Machine, link and software")
P("")
for k, label in (("machine", "machine"), ("memory", "memory"), ("kernel", "kernel / OS"), ("disk", "bench dir"),
                 ("load", "load average (1/5/15 min) at start → end"), ("postgres", "PostgreSQL"), ("pgjet", "pgjet"),
                 ("pgbackrest", "pgBackRest"), ("versitygw", "S3 server"), ("s5cmd", "s5cmd")):
    if F(k): P(f"- {label}: {F(k)}")
P(f"- link: network lab (`scripts/netlab.sh`), RTT_MS={F('rtt_ms')} through `pgjet-delayline`, RATE={F('rate')}; "
  f"the S3 server in namespace `{F('ns_a')}` ({F('addr_a')}), every client and both clusters in `{F('ns_b')}`; "
  "HTTPS (pgBackRest 2.45 speaks S3 over TLS only), each client verifying the server against the bench's CA")
if F("ping_min_avg_max_mdev_ms"): P(f"- ping B → A (20 packets) min/avg/max/mdev: {F('ping_min_avg_max_mdev_ms')} ms")
if F("iperf3_up_bps"):
    P(f"- iperf3, plain TCP, {F('jobs')} streams, 5 s: B → A (upload) {float(F('iperf3_up_bps') or 0)/8/MiB:.0f} MiB/s, "
      f"A → B (download) {float(F('iperf3_down_bps') or 0)/8/MiB:.0f} MiB/s")
for n, what in (("s5cmd_upload_max", "upload"), ("s5cmd_download_max", "download")):
    s = stat(n)
    if s["n"] and logical["large_files"]:
        P(f"- s5cmd {what} of the large files with {F('s5cmd_max_conc')} parts in flight (the S3 path's limit for a plain client): "
          f"{logical['large_files']/MiB/s['med']:.0f} MiB/s (median {s['med']:.2f} s)")
P("- both \"hosts\" are network namespaces of one VM: they share its cores, disk and page cache; the S3 server's disk writes and reads count in every S3 time.")
P("")
P("## Data")
P("")
P(f"- main cluster: PostgreSQL {F('pgv')}, data checksums, {F('tables')} tables of one row (one 8 KiB file each), `pgbench -i -s {F('scale')}`, "
  f"{F('random_mb')} MiB of /dev/urandom bytes (bytea, STORAGE EXTERNAL); autovacuum off. "
  f"Logical size (PGDATA without pg_wal): {logical['main']/MiB:.0f} MiB in {files['main']} files. Source rows checked: `{F('src_main')}`")
if logical["large"]:
    P(f"- large-file cluster: {F('large_mb')} MiB of /dev/urandom bytes in one table: {logical['large']/MiB:.0f} MiB in {files['large']} files; "
      f"its big relation files (what s5cmd copies): {logical['large_files']/MiB:.0f} MiB in {files['large_files']} files")
P("")
P("## Settings of every tool")
P("")
P(f"- **pgjet** ({F('pgjet')}): `backup --type full --start-fast --jobs {F('jobs')}` with its defaults (compress-type zstd level 1, "
  "small files bundled, 8 MiB chunks, one object each); `restore --jobs " + F('jobs') + "` (`--type immediate --target-action promote`). "
  "S3 repository: repo-type=s3, repo-s3-uri-style=path, repo-s3-endpoint=" + F('s3_host') + ", repo-storage-port=" + F('s3_port')
  + ", repo-storage-ca-file=the bench CA (TLS verified), region us-east-1. A fresh repository (stanza-create, untimed) before every backup. "
  "`archive-check=y` (its default): the backup waits for its last WAL segment in its repository's archive, which the cluster's "
  "archive_command fills (`pgjet archive-push` into repositories 1 and 2, at the same time as pgBackRest's archive-push).")
if F("skip_pgbackrest") != "1":
    P(f"- **pgBackRest** ({F('pgbackrest')}): one stanza over four repositories — repo1 posix `repo1-bundle=y`, repo2 posix `repo2-bundle=n`, "
      f"repo3 S3 `bundle=y`, repo4 S3 `bundle=n` (bundle size and limit at their defaults, 20 MiB and 2 MiB); `process-max={F('jobs')}`, "
      "`compress-type=zst` (level 3, its default), `start-fast=y`, `archive-check=y`, `archive-copy=n`; S3: `repo-s3-uri-style=path`, "
      f"`repo-storage-port={F('s3_port')}`, `repo-storage-ca-file`=the bench CA. `backup --repo=N --type=full`; `restore --repo=N` "
      "into an empty dir (default type: recovery to the end of the archive). The cluster's archive_command runs `pgbackrest archive-push`, "
      "which pushes every WAL segment to the four repositories (needed by `archive-check`), and pgjet's at the same time "
      "(each tool's backup waits for its own archive); old backups are expired "
      "(`expire --repoN-retention-full=1`, untimed) before each run's backups.")
P(f"- **s5cmd** ({F('s5cmd')}): `s5cmd --numworkers 1 cp -c {F('jobs')} -p {F('s5cmd_part_mb')}` (one file at a time, {F('jobs')} parts of "
  f"{F('s5cmd_part_mb')} MiB in flight: as many requests at once as pgjet's {F('jobs')} jobs); the link-limit rows: `s5cmd cp -c {F('s5cmd_max_conc')} "
  f"-p {F('s5cmd_part_mb')}` with its default 256 workers. Credentials and CA from the environment (`AWS_CA_BUNDLE`); path-style (its choice for a custom endpoint).")
P(f"- **versitygw** {F('versitygw')}: `versitygw --quiet --keep-alive --port {F('addr_a')}:{F('s3_port')} --cert ... --key ... posix DIR` (objects as files on the bench disk; `--keep-alive`, or it closes every connection, which real object stores do not).")
P("")

def fmt_row(label, name, base, ref=None, size=True, ratio_mode="time"):
    s = stat(name)
    if s["n"] == 0:
        if s["fail"]: P(f"| {label} | 0 | FAILED ({s['fail']}) | | | | | |")
        return
    fl = f" ({s['fail']} failed)" if s["fail"] else ""
    sz = sizes.get(name)
    szs = f"{sz[0]/MiB:.0f} MiB / {sz[1]}" if (sz and size) else ""
    rt = ""
    if ref:
        a, b = stat(ref), s
        if a.get("med") and b.get("med"):
            rt = f"{b['med']/a['med']:.2f}×"
    P(f"| {label} | {s['n']} | {s['med']:.2f}{fl} | {s['lo']:.2f}–{s['hi']:.2f} | {base/MiB/s['med']:.1f} | {s['rss']:.0f} | {szs} | {rt} |")

def table(title, note, items, base):
    if not any(present(n) for _, n, _ in items): return
    P(f"### {title}")
    P("")
    if note: P(note); P("")
    P("| command | runs | median s | min–max s | MiB/s | peak RSS MiB | stored MiB / objects | pgjet is faster by (peer s / pgjet s) |")
    P("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, n, ref in items: fmt_row(label, n, base, ref)
    P("")

P("## Main cluster: many small files")
P("")
P(f"MiB/s = logical size ({logical['main']/MiB:.0f} MiB) / median time. Peak RSS: the largest single process (GNU time; the highest of the runs), not the sum over "
  "pgBackRest's processes. Stored: the backup as written (pgBackRest: the backup set only; its WAL is in the archive since archive-copy=n; "
  "pgjet: the backup set, which holds its own WAL too; the archive is not counted), with its number of files/objects.")
P("")
for where, w in (("posix", "posix"), ("s3", "S3")):
    table(f"Backup to {w}", "", [
        (f"pgjet backup → {w}", f"pgjet_backup_{where}", None),
        (f"pgBackRest backup → {w}, bundle=y", f"pgbr_backup_{where}_bundle", f"pgjet_backup_{where}"),
        (f"pgBackRest backup → {w}, bundle=n", f"pgbr_backup_{where}_plain", f"pgjet_backup_{where}")], logical["main"])
    table(f"Restore from {w}", "", [
        (f"pgjet restore ← {w}", f"pgjet_restore_{where}", None),
        (f"pgBackRest restore ← {w}, bundle=y", f"pgbr_restore_{where}_bundle", f"pgjet_restore_{where}"),
        (f"pgBackRest restore ← {w}, bundle=n", f"pgbr_restore_{where}_plain", f"pgjet_restore_{where}")], logical["main"])

def mbps(n, base):
    s = stat(n)
    return base / MiB / s["med"] if s.get("med") else None
if logical["large"]:
    P("## Large files on S3: pgjet against a raw S3 client")
    P("")
    P(f"pgjet backs up and restores the large-file cluster ({logical['large']/MiB:.0f} MiB logical); s5cmd uploads and downloads its big "
      f"relation files ({logical['large_files']/MiB:.0f} MiB, {files['large_files']} files) to and from the same server. MiB/s of each "
      "command's own bytes; last column: pgjet's MiB/s / that row's MiB/s (above 1 = pgjet faster). Peak RSS: the highest of the runs.")
    P("")
    P("| command | runs | median s | min–max s | MiB/s | peak RSS MiB | pgjet faster by (pgjet MiB/s / its MiB/s) |")
    P("|---|---:|---:|---:|---:|---:|---:|")
    for label, n, base, ref, refbase in (
        (f"pgjet backup → S3 (--jobs {F('jobs')})", "pgjet_large_backup", logical["large"], None, None),
        (f"s5cmd upload (-c {F('jobs')}, one file at a time)", "s5cmd_upload", logical["large_files"], "pgjet_large_backup", logical["large"]),
        (f"s5cmd upload (-c {F('s5cmd_max_conc')}, 256 workers)", "s5cmd_upload_max", logical["large_files"], "pgjet_large_backup", logical["large"]),
        (f"pgjet restore ← S3 (--jobs {F('jobs')})", "pgjet_large_restore", logical["large"], None, None),
        (f"s5cmd download (-c {F('jobs')}, one file at a time)", "s5cmd_download", logical["large_files"], "pgjet_large_restore", logical["large"]),
        (f"s5cmd download (-c {F('s5cmd_max_conc')}, 256 workers)", "s5cmd_download_max", logical["large_files"], "pgjet_large_restore", logical["large"])):
        s = stat(n)
        if s["n"] == 0:
            if s["fail"]: P(f"| {label} | 0 | FAILED ({s['fail']}) | | | | |")
            continue
        fl = f" ({s['fail']} failed)" if s["fail"] else ""
        rt = ""
        if ref:
            a, b = mbps(ref, refbase), mbps(n, base)
            if a and b: rt = f"{a/b:.2f}×"
        P(f"| {label} | {s['n']} | {s['med']:.2f}{fl} | {s['lo']:.2f}–{s['hi']:.2f} | {base/MiB/s['med']:.1f} | {s['rss']:.0f} | {rt} |")
    P("")
    variants = sorted({r[0] for r in rows if r[0].startswith("pgjet_large_restore_")})
    if variants:
        P("Restore variants (LARGE_VARIANTS), each in the same runs; last column: its MiB/s / s5cmd download's (-c " + F("jobs") + "):")
        P("")
        P("| variant | runs | median s | min–max s | MiB/s | peak RSS MiB | / s5cmd download |")
        P("|---|---:|---:|---:|---:|---:|---:|")
        for n in variants:
            s = stat(n)
            if s["n"] == 0: P(f"| {n} | 0 | FAILED | | | | |"); continue
            b = mbps(n, logical["large"]); s5d = mbps("s5cmd_download", logical["large_files"])
            P(f"| {n[len('pgjet_large_restore_'):]} | {s['n']} | {s['med']:.2f} | {s['lo']:.2f}–{s['hi']:.2f} | {b:.1f} | {s['rss']:.0f} | {b/s5d:.2f}× |" if s5d else f"| {n} | {s['n']} | {s['med']:.2f} | | {b:.1f} | {s['rss']:.0f} | |")
        P("")

P("## Targets (issue 6)")
P("")
P("| target | measured | met? |")
P("|---|---:|:---:|")
def ratio(peer, pj):
    a, b = stat(peer), stat(pj)
    return a["med"] / b["med"] if a.get("med") and b.get("med") else None
def tgt(text, val, thr, fmt="{:.2f}×", ge=True):
    if val is None: P(f"| {text} | n/a | – |"); return
    ok = val >= thr if ge else val < thr
    P(f"| {text} | {fmt.format(val)} | {'yes' if ok else '**no**'} |")
if F("skip_pgbackrest") != "1":
    tgt("S3 backup ≥ 3× pgBackRest bundle=y", ratio("pgbr_backup_s3_bundle", "pgjet_backup_s3"), 3)
    tgt("S3 restore ≥ 2× pgBackRest bundle=y", ratio("pgbr_restore_s3_bundle", "pgjet_restore_s3"), 2)
if logical["large"]:
    up = mbps("pgjet_large_backup", logical["large"]); s5u = mbps("s5cmd_upload", logical["large_files"])
    dn = mbps("pgjet_large_restore", logical["large"]); s5d = mbps("s5cmd_download", logical["large_files"])
    tgt(f"large files: backup MiB/s ≥ 0.8× s5cmd upload (-c {F('jobs')})", up / s5u if up and s5u else None, 0.8)
    tgt(f"large files: restore MiB/s ≥ 0.8× s5cmd download (-c {F('jobs')})", dn / s5d if dn and s5d else None, 0.8)
pj = [stat(n).get("rss") for n in ("pgjet_backup_posix", "pgjet_backup_s3", "pgjet_restore_posix", "pgjet_restore_s3")]
pj = [x for x in pj if x is not None]
tgt(f"pgjet peak RSS at {F('tables')} tables < 200 MiB (backup and restore, max)", max(pj) if pj else None, 200, "{:.0f} MiB", ge=False)
P("")
if checks:
    P("## Restore checks (untimed, last run)")
    P("")
    P("The restored clusters were started once inside B (archive_mode=off) and, after recovery, queried: "
      f"`{F('check_query_main')}`.")
    P("")
    for c in checks:
        P(f"- {c[0]}: {c[1]}{' — ' + c[2] if len(c) > 2 else ''}")
    P("")
P("## Raw times")
P("")
P(f"`{os.path.join(res, 'times.tsv')}`: name, run, seconds, peak RSS KiB, ok/FAIL. Logs: `{F('logs')}/NAME.runN.log`.")
P("")
P("```tsv")
P("name\trun\tseconds\tpeak_rss_kib\tstatus")
for r in rows: P("\t".join(r[:5]))
P("```")
P("")
P(f"Settings: {F('settings')}")
open(report, "w").write("\n".join(out) + "\n")
PYEOF
}

# ------------------------------------------------------------------ main
main() {
    [ "$(id -u)" -eq 0 ] || die "run as root (namespaces, drop_caches, runuser)"
    local c r
    for c in /usr/bin/time pgbackrest runuser openssl curl basenc /usr/bin/python3 ip "$PGBIN/pgbench"; do
        command -v "$c" >/dev/null || die "missing $c: run scripts/install-deps.sh"
    done
    [ -x "${VERSITYGW:-}" ] || die "versitygw not found: run scripts/install-deps.sh or set VERSITYGW"
    [ -x "$DELAYLINE" ] || die "no pgjet-delayline at $DELAYLINE (cargo build --release, or DELAYLINE=...)"
    # s5cmd is used by the large-file part only
    if [ "$LARGE_MB" -gt 0 ] && [ "$SKIP_S5CMD" != 1 ]; then install_s5cmd; fi

    mkdir -p "$BENCH"
    # one invocation per bench dir: the lock is held until this shell exits
    exec 9>"$BENCH/lock"
    flock -n 9 || die "another bench/s3.sh is running on $BENCH (it holds $BENCH/lock)"
    LOCKED=1
    mkdir -p "$BENCH/bin" "$LOGS" "$RES"
    chmod 755 "$BENCH" "$BENCH/bin"
    rm -rf "$RUN"; mkdir -p "$RUN" "$OUT"; chmod 755 "$RUN"; chown postgres: "$OUT"
    rm -rf "$LOGS"; mkdir -p "$LOGS"
    : >"$TIMES"; : >"$SIZES"; : >"$FACTS"; : >"$CHECKS"
    install -m 755 "$HERE/gen-random.sh" "$BENCH/bin/gen-random.sh"
    say "bench dir $BENCH; TABLES=$TABLES SCALE=$SCALE RANDOM_MB=$RANDOM_MB LARGE_MB=$LARGE_MB RUNS=$RUNS JOBS=$JOBS RTT_MS=$RTT_MS RATE=$RATE"
    say "free space: $(df -h --output=avail "$BENCH" | tail -n 1 | tr -d ' ')"
    fact load_start "$(cut -d' ' -f1-3 /proc/loadavg)"

    build_main
    if [ "$LARGE_MB" -gt 0 ]; then build_large; fi

    lab_up
    start_versitygw
    setup_pgjet
    if [ "$SKIP_PGBACKREST" != 1 ]; then setup_pgbackrest; fi

    header "Start the clusters in $NB"
    start_in_b "$MAIN"
    # each tool's stanza first (this invocation's repositories are new), then the
    # archive_command that pushes into them
    local n
    fresh_dir "$RUN/pgjet-posix"
    for n in 1 2; do
        bash -c "$(pgjet_b --stanza main --repo "$n" stanza-create)" >"$LOGS/pgjet-stanza-create-main-$n.log" 2>&1 \
            || { cat "$LOGS/pgjet-stanza-create-main-$n.log"; die "pgjet stanza-create of repo$n failed"; }
    done
    if [ "$SKIP_PGBACKREST" != 1 ]; then
        as_b pgbackrest --config="$PGBR_CONF" --stanza=bench stanza-create >"$LOGS/pgbr-stanza-create.log" 2>&1 \
            || { cat "$LOGS/pgbr-stanza-create.log"; say "pgBackRest stanza-create FAILED: its commands will fail"; }
    fi
    set_archive_command
    logical_size main "$MAIN/data"
    SRC_CHECK[main]=$(psql_as "$PGV" "$MAIN" "$(cluster_port "$MAIN")" -Atc "$(check_query main)")
    say "main: $((LOGICAL[main] / 1048576)) MiB in ${LFILES[main]} files; check rows: ${SRC_CHECK[main]}"
    if [ "$LARGE_MB" -gt 0 ]; then
        start_in_b "$LARGE"
        logical_size large "$LARGE/data"
        SRC_CHECK[large]=$(psql_as "$PGV" "$LARGE" "$(cluster_port "$LARGE")" -Atc "$(check_query large)")
        # the big relation files (segments of random_bytes' TOAST relation), hard-linked into
        # one directory that s5cmd copies
        local rel lf
        rel=$(psql_as "$PGV" "$LARGE" "$(cluster_port "$LARGE")" -Atc \
            "SELECT pg_relation_filepath(reltoastrelid) FROM pg_class WHERE relname = 'random_bytes'")
        lf=$RUN/large-files
        fresh_dir "$lf"
        for c in "$LARGE/data/$rel" "$LARGE/data/$rel".[0-9]*; do
            [ -f "$c" ] && ln "$c" "$lf/"
        done
        read -r LOGICAL[large_files] LFILES[large_files] < <(find "$lf" -type f -printf '%s\n' | awk '{b += $1; n++} END {printf "%d %d\n", b, n}')
        say "large: $((LOGICAL[large] / 1048576)) MiB in ${LFILES[large]} files; big files $((LOGICAL[large_files] / 1048576)) MiB in ${LFILES[large_files]}"
    fi

    if [ "$SKIP_PGBACKREST" != 1 ]; then
        header "pgBackRest: stanza 'bench' on four repositories"
        if as_b pgbackrest --config="$PGBR_CONF" --stanza=bench check >"$LOGS/pgbr-check.log" 2>&1; then
            say "stanza created; 'pgbackrest check' passed on the four repositories"
        else
            cat "$LOGS/pgbr-check.log"; say "pgbackrest check FAILED (carrying on)"
        fi
    fi
    if [ "$LINK_CHECK" = 1 ]; then link_check; fi

    # facts for the report
    fact machine "$(nproc) CPUs, $(awk '/model name/ {sub(/.*: /, ""); print; exit}' /proc/cpuinfo)"
    fact memory "$(free -g | awk '/^Mem:/ {print $2 " GiB total, " $7 " GiB available"}')"
    fact kernel "$(uname -r); $(. /etc/os-release && echo "$PRETTY_NAME"); TCP congestion control $(cat /proc/sys/net/ipv4/tcp_congestion_control)"
    fact disk "$BENCH on $(df -T "$BENCH" | awk 'NR==2 {print $2 " (" $1 ")"}')"
    fact postgres "$("$PGBIN/postgres" --version)"
    fact pgjet "$PGJET_VERSION ($PGJET_SRC, built $(date -u -r "$PGJET_SRC" "+%Y-%m-%d %H:%M UTC" 2>/dev/null); bench/s3.sh from commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "?"))"
    fact pgbackrest "$(pgbackrest version)"
    fact versitygw "$(go version -m "$VERSITYGW" 2>/dev/null | awk '$1 == "mod" {print $3; exit}') ($VERSITYGW)"
    fact s5cmd "$(go version -m "$S5CMD" 2>/dev/null | awk '$1 == "mod" {print $3; exit}') ($S5CMD)"
    for c in rtt_ms:$RTT_MS rate:$RATE runs:$RUNS jobs:$JOBS tables:$TABLES scale:$SCALE random_mb:$RANDOM_MB \
             large_mb:$LARGE_MB s5cmd_part_mb:$S5CMD_PART_MB s5cmd_max_conc:$S5CMD_MAX_CONC pgv:$PGV \
             s3_host:$S3_HOST s3_port:$S3_PORT addr_a:$ADDR_A ns_a:$NA ns_b:$NB logs:$LOGS \
             skip_pgbackrest:$SKIP_PGBACKREST pgbr_s3_plain_runs:$PGBR_S3_PLAIN_RUNS; do
        fact "${c%%:*}" "${c#*:}"
    done
    fact logical_main "${LOGICAL[main]}"; fact files_main "${LFILES[main]}"
    fact logical_large "${LOGICAL[large]:-0}"; fact files_large "${LFILES[large]:-0}"
    fact logical_large_files "${LOGICAL[large_files]:-0}"; fact files_large_files "${LFILES[large_files]:-0}"
    fact src_main "${SRC_CHECK[main]}"
    fact check_query_main "$(check_query main | tr -s ' \n' ' ')"
    fact settings "TABLES=$TABLES SCALE=$SCALE RANDOM_MB=$RANDOM_MB LARGE_MB=$LARGE_MB RUNS=$RUNS JOBS=$JOBS RTT_MS=$RTT_MS RATE=$RATE S5CMD_PART_MB=$S5CMD_PART_MB S5CMD_MAX_CONC=$S5CMD_MAX_CONC SKIP_PGBACKREST=$SKIP_PGBACKREST PGBR_S3_PLAIN_RUNS=$PGBR_S3_PLAIN_RUNS"

    for r in $(seq 1 "$RUNS"); do
        header "Run $r of $RUNS"
        round_main "$r"
        if [ "$LARGE_MB" -gt 0 ]; then round_large "$r"; fi
    done

    header "Report"
    fact drop_caches "$DROP_CACHES"
    fact load "$(grep '^load_start' "$FACTS" | cut -f2) → $(cut -d' ' -f1-3 /proc/loadavg)"
    write_report
    cat "$REPORT"
    say
    say "report written to $REPORT"
}

# Sourced (for a one-off experiment with the helpers above): define only, run nothing.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
