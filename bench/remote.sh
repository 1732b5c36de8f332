#!/usr/bin/env bash
# pgjet cross-host benchmark: replica creation and backup of a primary on host A, run from
# host B across the network lab (scripts/netlab.sh), side by side with pg_basebackup and
# pgBackRest (TLS server on the primary), plus raw references, in one run. Not a test.
#
#   bash bench/remote.sh                                   # full size (see bench/README.md)
#   SCALE=5 RANDOM_MB=50 SMALL_TABLES=500 RUNS=1 REPORT=/tmp/r.md bash bench/remote.sh  # smoke
#
# Run as root (namespaces, drop_caches; servers and clients run as postgres).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
# shellcheck source=scripts/pg-env.sh
source "$ROOT/scripts/pg-env.sh"
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"

# ------------------------------------------------------------------ settings (env overrides)
SCALE=${SCALE:-100}                 # pgbench scale of the main dataset
RANDOM_MB=${RANDOM_MB:-500}         # MiB of incompressible bytes in the main dataset
SMALL_TABLES=${SMALL_TABLES:-20000} # tables of the small-file dataset (0 = skip it)
RUNS=${RUNS:-3}                     # timed runs per command in the main table
LINKS=${LINKS:-"unshaped 1gbit/20 200mbit/50"}   # RATE/RTT_MS, or "unshaped"
SMALL_LINKS=${SMALL_LINKS:-$LINKS}  # links for the small-table dataset
SMALL_RUNS=${SMALL_RUNS:-1}
JOBS_LIST=${JOBS_LIST:-"2 4"}       # pgBackRest process-max and pgjet backup --jobs
REPLICA_JOBS=${REPLICA_JOBS:-4}     # pgjet replica-create --jobs in the main table (its default)
PGBR_COMPRESS=${PGBR_COMPRESS:-"none lz4"}
PGJET_COMPRESS=${PGJET_COMPRESS:-"none zstd"}
SMALL_PGBR_COMPRESS=${SMALL_PGBR_COMPRESS:-none}    # the same for the small-table dataset
SMALL_PGJET_COMPRESS=${SMALL_PGJET_COMPRESS:-none}
SWEEP_LINKS=${SWEEP_LINKS:-"1gbit/20 200mbit/50"}
SWEEP_JOBS=${SWEEP_JOBS:-"1 2 4 8"}
SWEEP_RUNS=${SWEEP_RUNS:-1}
DELTA_LINK=${DELTA_LINK:-1gbit/20}
DELTA_RANGES=${DELTA_RANGES:-"64 256 1024"}
export DELTA_PCT=${DELTA_PCT:-1}         # % of pgbench_accounts pages changed before each delta
PARTS=${PARTS:-"main small sweep delta incr stream"}
# The sources part (PARTS=sources, not in the default list): on SOURCES_LINK, replica creation
# from the primary, from a standby of it on host A, seeded from an S3 repository (versitygw on
# host A) with SOURCES_WAL_MB of WAL archived since the backup, and the re-sync (Patroni's
# reinit) of a replica that missed DELTA_PCT % of the pages: pgjet against pg_basebackup and
# `pgbackrest --delta restore`.
SOURCES_LINK=${SOURCES_LINK:-1gbit/20}
SOURCES_RUNS=${SOURCES_RUNS:-$RUNS}
SOURCES_WAL_MB=${SOURCES_WAL_MB:-1024}  # MiB of pgbench WAL archived between the S3 backup and the seeds
SOURCES_STANDBY_PORT=${SOURCES_STANDBY_PORT:-5433}   # the source standby's port on host A
SOURCES_S3_PORT=${SOURCES_S3_PORT:-9000}             # versitygw (plain HTTP) on host A
SOURCES_PGBR_COMPRESS=${SOURCES_PGBR_COMPRESS:-lz4}  # pgBackRest's backups restored by the reinit peer
SOURCES_PGBR_JOBS=${SOURCES_PGBR_JOBS:-2}            # their process-max, and the restore's
VERSITYGW=${VERSITYGW:-$(for c in /usr/local/bin/versitygw /root/go/bin/versitygw "$(command -v versitygw || true)"; do
    if [ -x "$c" ]; then echo "$c"; break; fi; done)}
# The stream part (issue 18): compression at the source. Datasets: pgb (pgbench only, like the
# published slow-VPN case) and main (the mixed one); the transports and peers below.
STREAM_SCALE=${STREAM_SCALE:-100}   # pgbench scale of the pgb dataset
STREAM_DATASETS=${STREAM_DATASETS:-"pgb main"}
STREAM_LINKS=${STREAM_LINKS:-"100mbit/50 1gbit/20 unshaped"}
STREAM_RUNS=${STREAM_RUNS:-$RUNS}
STREAM_REPLICA=${STREAM_REPLICA:-"libpq bb_zstd bb_lz4 auto"}   # pgjet replica-create variants; base:V runs V with PGJET_BASE
STREAM_PGBB=${STREAM_PGBB:-"none lz4 zstd_w2"}                 # pg_basebackup -Fp --compress=server-...
STREAM_BACKUP=${STREAM_BACKUP:-"bb bb_lz4 libpq auto"}         # pgjet backup transports (repository lz4)
STREAM_JOBS=${STREAM_JOBS:-"2 4"}   # pgBackRest process-max and pgjet backup --jobs in the stream part
STREAM_RAW=${STREAM_RAW-"plain zstd"}   # raw references: tar over TCP, and with zstd -1 (empty: none)
# Links at or under STREAM_SLOW_MBIT Mbit/s skip the uncompressed runs (the raw tar, pgjet's
# ranges, pg_basebackup without compression): each is the logical bytes over the line rate
# (measured so at scale 30, docs/benchmarks-stream.md) and would take minutes. 0 keeps them.
export STREAM_SLOW_MBIT=${STREAM_SLOW_MBIT:-0}
SKIP_PGBACKREST=${SKIP_PGBACKREST:-0}
QUIET_LOAD=${QUIET_LOAD:-0.7}       # wait for a 1-min load average below this ...
QUIET_WAIT=${QUIET_WAIT:-600}       # ... for at most this many seconds, before each link
IPERF_S=${IPERF_S:-10}              # seconds of iperf3 per link (the link's TCP goodput, once per link)
LAB_PREFIX=${LAB_PREFIX:-pjbr}
LAB_ID=${LAB_ID:-91}
PGV=15
BENCH=${BENCH_DIR:-/var/tmp/pgjet-bench-remote}
PGJET_SRC=${PGJET:-${CARGO_TARGET_DIR:-$ROOT/target}/release/pgjet}
# PGJET_BASE=PATH: a second pgjet build (say, before a change) timed in the main part of the
# same run, its replica-create and backups alternating with PGJET's (odd runs the base first);
# the report gets a section comparing the two.
PGJET_BASE_SRC=${PGJET_BASE:-}
PGJET_BASE_BIN=$BENCH/bin/pgjet-base
REPORT=$(realpath -m "${REPORT:-$ROOT/docs/benchmarks-remote.md}")
# REPORT_ONLY=1: write REPORT again from the results a run kept under BENCH_DIR (a report
# that could not be written, or a report's code changed), running nothing.
REPORT_ONLY=${REPORT_ONLY:-0}
KEEP=${KEEP:-0}                     # 1 = keep clusters, repository and outputs
REUSE=${REUSE:-0}                   # 1 = reuse the clusters a KEEP=1 run left; append to its results

PGBIN=$(pg_bindir "$PGV")
NA=${LAB_PREFIX}a
NB=${LAB_PREFIX}b
ADDR_A=""
PORT=5432                           # inside namespace a nobody else listens
LOGS=$BENCH/logs
RES=$BENCH/results
TSV=$RES/runs.tsv
PKI=$BENCH/pki
PASSFILE=$BENCH/pgpass
PGJET_BIN=$BENCH/bin/pgjet
PGBR_REPO=$BENCH/b/pgbr-repo
PGJET_REPO=$BENCH/b/pgjet-repo      # pgjet's repository (on B's side), also its WAL archive
PGBR_CONF_A=$BENCH/pgbr-a.conf
PGBR_CONF_B=$BENCH/pgbr-b.conf
OUT=$BENCH/b/out
ROLE=replicator
PASSWORD='bench-Pa55'
CUR_DS=""                           # dataset whose primary runs now (main|small)
CUR_LINK=""
PGBR_PID=""
SAMPLER_PID=""
DROP_CACHES=unknown
CG_A=/sys/fs/cgroup/cpuacct/${LAB_PREFIX}-bench-a   # cpuacct cgroup of everything on host A
CG_B=/sys/fs/cgroup/cpuacct/${LAB_PREFIX}-bench-b   # ... and of the timed command on host B
CG_P=$CG_A/primary                  # the sources part: the primary alone (a child of CG_A, which still counts it)
SRC_SB=$BENCH/a/pg-standby          # the sources part: the source standby on host A
S3DATA=$BENCH/a/s3data              # ... versitygw's posix directory (host A's side)
S3_CONF=$BENCH/pgjet-s3.conf        # ... pgjet's S3 repository options (0600, postgres)
PGBR_CONF_R=$BENCH/pgbr-b-restore.conf   # ... pgBackRest on B restoring into the kept replica
S3_BUCKET=pgjet
S3_KEY=pgjetbench
S3_SECRET=pgjet-bench-secret-0123456789
VGW_PID=""
ADDR_B=""
SRC_ARCHIVE_SET=0                   # 1 while the primary's archive_command is the sources part's (ALTER SYSTEM)
declare -A LOGICAL                  # dataset -> bytes a backup copies (PGDATA without pg_wal segments)
declare -A LOAD                     # link/phase -> "before / after" load averages

say() { printf '%s\n' "$*"; }
header() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
die() { printf 'remote bench: %s\n' "$*" >&2; exit 1; }
q() { printf '%q ' "$@"; }

# ------------------------------------------------------------------ cleanup
cleanup() {
    local rc=$? d
    set +e
    stop_sampler
    stop_pgbr_server
    stop_anchor
    # the sources part's servers: standbys started in B, the source standby on A, versitygw
    for d in "$OUT"/src-* "$OUT"/reinit-*; do [ -d "$d" ] && pg_stop_cluster "$d"; done
    pg_stop_cluster "$SRC_SB"
    stop_versitygw
    for d in main small; do pg_stop_cluster "$BENCH/a/pg-$d"; done
    pg_stop_cluster "$BENCH/b/delta"
    # a kept cluster must not archive into the S3 server that is gone
    [ "$SRC_ARCHIVE_SET" = 1 ] && sed -i '/^archive_command/d' "$BENCH/a/pg-main/data/postgresql.auto.conf"
    bash "$ROOT/scripts/netlab.sh" down "$LAB_PREFIX" 2>/dev/null
    rm -rf "/etc/netns/$NB"
    rm -f "$S3_CONF" "$PGBR_CONF_R"
    rmdir "$CG_P" 2>/dev/null
    rmdir "$CG_A" "$CG_B" 2>/dev/null
    if [ "$KEEP" != 1 ]; then
        rm -rf "$BENCH/a" "$BENCH/b" "$BENCH/bin"
        say "removed clusters, repositories and outputs under $BENCH (results and logs kept)"
    fi
    [ $rc -eq 0 ] || say "remote bench exited with status $rc" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM


load1() { cut -d' ' -f1 /proc/loadavg; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
# wait_quiet: wait (at most QUIET_WAIT s) for a 1-minute load average below QUIET_LOAD
wait_quiet() {
    local t0=$SECONDS
    while awk -v l="$(load1)" -v q="$QUIET_LOAD" 'BEGIN {exit !(l >= q)}'; do
        if [ $((SECONDS - t0)) -ge "$QUIET_WAIT" ]; then
            say "  machine not quiet after ${QUIET_WAIT}s (load $(loadavg)); going on"
            return 0
        fi
        sleep 10
    done
    say "  machine quiet after $((SECONDS - t0)) s (load $(loadavg))"
}

# ------------------------------------------------------------------ the lab
# lab_up LINK: (re)build the lab with LINK = unshaped | RATE/RTT_MS; the primary of the
# current dataset and the pgBackRest server are restarted inside namespace a.
lab_params() {
    if [ "$1" = unshaped ]; then echo "unlimited 0"; else echo "${1%/*} ${1#*/}"; fi
}
link_title() {
    if [ "$1" = unshaped ]; then echo "unshaped veth"; else
        local r=${1%/*}; echo "${r/gbit/ Gbit/s}${r/*gbit*/}" | sed 's/mbit/ Mbit\/s/'; fi
}
link_mbit() { case "$1" in unshaped) echo 0 ;; *gbit/*) echo $(( ${1%%gbit/*} * 1000 )) ;; *mbit/*) echo "${1%%mbit/*}" ;; *) echo 0 ;; esac; }
link_label() { if [ "$1" = unshaped ]; then echo "unshaped"; else echo "${1%/*}, ${1#*/} ms RTT"; fi; }

lab_up() {
    local link=$1 ds=$2 rate rtt
    read -r rate rtt < <(lab_params "$link")
    stop_pgbr_server
    stop_anchor
    [ -n "$CUR_DS" ] && pg_stop_cluster "$BENCH/a/pg-$CUR_DS"
    bash "$ROOT/scripts/netlab.sh" down "$LAB_PREFIX" >/dev/null 2>&1 || true
    RATE=$rate RTT_MS=$rtt bash "$ROOT/scripts/netlab.sh" up "$LAB_PREFIX" "$LAB_ID" >"$RES/lab.env"
    # shellcheck disable=SC1091
    ADDR_A=$(sed -n 's/^NETLAB_ADDR_A=//p' "$RES/lab.env")
    CUR_LINK=$link
    start_anchor
    start_primary "$ds"
    start_pgbr_server
    say "lab: $(link_label "$link"); primary ($ds) in $NA at $ADDR_A:$PORT"
}

iface() { ip netns exec "$NB" cat "/sys/class/net/lab0/statistics/$1"; }
# An idle process inside B, so that /proc/$ANCHOR_B/net/dev shows B's counters cheaply (the
# sampler reads it every 0.2 s). Started with the lab, stopped with it.
ANCHOR_B=""
start_anchor() {
    ip netns exec "$NB" sleep 100000 </dev/null >/dev/null 2>&1 &
    ANCHOR_B=$!
}
stop_anchor() {
    [ -n "$ANCHOR_B" ] || return 0
    kill "$ANCHOR_B" 2>/dev/null || true
    wait "$ANCHOR_B" 2>/dev/null || true
    ANCHOR_B=""
}
rx_now() { sed -n 's/^ *lab0: *\([0-9]*\).*/\1/p' "/proc/$ANCHOR_B/net/dev" 2>/dev/null; }
# busy and total jiffies of the whole machine (all cores), from /proc/stat
cpu_now() { awk '$1 == "cpu" {t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t}' /proc/stat; }

start_primary() {
    local ds=$1 d=$BENCH/a/pg-$1
    touch "$d/log"; chown postgres: "$d/log"
    in_cg_a ip netns exec "$NA" runuser -u postgres -- "$PGBIN/pg_ctl" -D "$d/data" -l "$d/log" -w -t 120 start >/dev/null \
        || { tail -n 20 "$d/log"; die "primary $ds did not start in $NA"; }
    CUR_DS=$ds
}

# ------------------------------------------------------------------ process CPU / memory
# CPU: cpuacct cgroups (v1 on this machine). Everything of host A (postmaster and all its
# processes, the pgBackRest TLS server and the workers it forks and detaches, the raw
# sender) runs in $CG_A; the timed command on B in $CG_B. cpuacct.usage counts the CPU time
# of exited members too, so the delta over a run is the side's whole CPU cost.
make_cgroups() {
    mkdir -p "$CG_A" "$CG_B" || die "cannot create cpuacct cgroups under /sys/fs/cgroup/cpuacct"
}
# in_cg_a CMD...: run CMD (exec) inside A's cgroup
in_cg_a() { sh -c 'echo $$ > "$0/tasks" && exec "$@"' "$CG_A" "$@"; }
cg_ns() { cat "$1/cpuacct.usage"; }
# the processes of A's cgroup and of its child (the sources part's primary)
cg_a_procs() { cat "$CG_A/cgroup.procs" "$CG_A"/*/cgroup.procs 2>/dev/null || true; }
# CPU ns of the primary alone, while the sources part keeps it in CG_P (else nothing)
cg_p_ns() { if [ -r "$CG_P/cpuacct.usage" ]; then cat "$CG_P/cpuacct.usage"; fi; }
# The sampler: every 0.2 s, the largest VmHWM and RssAnon among the processes of A's cgroup
# that were not there when the run began (backends, walsenders, pgBackRest workers), written
# to $RES/sampler.
sampler_loop() {
    local hwm=0 anon=0 p v a t0
    declare -A base=()
    for p in $(cg_a_procs); do base[$p]=1; done
    t0=${EPOCHREALTIME/./}
    while :; do
        echo "$(( (${EPOCHREALTIME/./} - t0) / 1000 )) $(rx_now)" >>"$SAMPLER_TRACE"
        for p in $(cg_a_procs); do
            [ -n "${base[$p]:-}" ] && continue
            read -r v a < <(awk '/^VmHWM:/ {h=$2} /^RssAnon:/ {a=$2} END {print h+0, a+0}' "/proc/$p/status" 2>/dev/null || echo "0 0")
            [ "${v:-0}" -gt "$hwm" ] && hwm=$v
            [ "${a:-0}" -gt "$anon" ] && anon=$a
        done
        echo "$hwm $anon" >"$RES/sampler.tmp" && mv "$RES/sampler.tmp" "$RES/sampler"
        sleep 0.2
    done
}
start_sampler() { echo "0 0" >"$RES/sampler"; : >"$SAMPLER_TRACE"; sampler_loop & SAMPLER_PID=$!; }
stop_sampler() {
    [ -n "$SAMPLER_PID" ] || return 0
    kill "$SAMPLER_PID" 2>/dev/null; wait "$SAMPLER_PID" 2>/dev/null || true
    SAMPLER_PID=""
}

# ------------------------------------------------------------------ timing
# timed NAME RUN CMD: cold cache, then `bash -c "CMD && sync"` under GNU time; records wall,
# peak RSS (largest single process on B), user+sys on B, lab0 rx/tx in B, CPU ticks of the
# primary's side, its peak backend VmHWM/RssAnon, and (sources part) the primary's own CPU.
# Row in $TSV. Non-zero on failure.
timed() {
    local name=$1 run=$2 cmd=$3 base=$LOGS/$1.$CUR_LINK_TAG.run$2 rx0 tx0 rx1 tx1 a0 a1 b0 b1 ok=ok
    local sec rss us ss hwm anon acpu bcpu steady
    local c0 c1 mcpu p0 p1 pcpu=""
    cold_cache
    SAMPLER_TRACE=$base.rx
    rx0=$(iface rx_bytes); tx0=$(iface tx_bytes); a0=$(cg_ns "$CG_A"); b0=$(cg_ns "$CG_B"); c0=$(cpu_now); p0=$(cg_p_ns)
    start_sampler
    if ! /usr/bin/time -f '%e %M %U %S' -o "$base.time" bash -c "echo \$\$ > $CG_B/tasks && $cmd && sync" >"$base.log" 2>&1; then ok=FAIL; fi
    stop_sampler
    rx1=$(iface rx_bytes); tx1=$(iface tx_bytes); a1=$(cg_ns "$CG_A"); b1=$(cg_ns "$CG_B"); c1=$(cpu_now); p1=$(cg_p_ns)
    [ -n "$p0" ] && [ -n "$p1" ] && pcpu=$(awk -v t=$((p1 - p0)) 'BEGIN {printf "%.2f", t / 1e9}')
    # the whole machine's busy share during the run, in % of all cores
    mcpu=$(echo "$c0 $c1" | awk '{d = $4 - $2; printf "%.0f", (d > 0 ? 100 * ($3 - $1) / d : 0)}')
    # steady wire rate: rx bytes between 25 % and 75 % of the run, per second
    steady=$(awk 'NR == 1 {next} {t[n] = $1; b[n] = $2; n++} END {if (n < 4) {print ""; exit}
        i = int(n / 4); j = int(3 * n / 4); if (t[j] > t[i]) printf "%.0f", (b[j] - b[i]) * 1000 / (t[j] - t[i])}' "$base.rx")
    read -r sec rss us ss < <(tail -n 1 "$base.time")
    read -r hwm anon <"$RES/sampler"
    acpu=$(awk -v t=$((a1 - a0)) 'BEGIN {printf "%.2f", t / 1e9}')
    bcpu=$(awk -v t=$((b1 - b0)) 'BEGIN {printf "%.2f", t / 1e9}')
    if [ "$ok" = ok ] && ! [[ "$sec" =~ ^[0-9.]+$ ]]; then ok=FAIL; fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$CUR_DS" "$CUR_LINK" "$name" "$run" \
        "$sec" "$rss" "$bcpu" $((rx1 - rx0)) $((tx1 - tx0)) "$acpu" "$hwm" "$anon" "$ok" \
        "$(awk -v u="$us" -v s="$ss" 'BEGIN {print u + s}')" "$mcpu" "$steady" "$pcpu" >>"$TSV"
    if [ "$ok" = ok ]; then
        printf '  %-24s run %d: %7.2f s  rx %5.0f MiB  steady %5.1f MiB/s  B-cpu %5.1f s  A-cpu %5.1f s  machine %3s%%  RSS %4d MiB  A-HWM %4d MiB\n' "$name" "$run" "$sec" \
            "$(awk -v b=$((rx1 - rx0)) 'BEGIN {print b / 1048576}')" "$(awk -v b="${steady:-0}" 'BEGIN {print b / 1048576}')" \
            "$bcpu" "$acpu" "$mcpu" $((rss / 1024)) $((hwm / 1024))
        [ -z "$pcpu" ] || printf '  %-24s        primary alone: %5.2f s CPU\n' "" "$pcpu"
    else
        printf '  %-26s run %d: FAILED (log %s)\n' "$name" "$run" "$base.log"
        tail -n 6 "$base.log" | sed 's/^/      /'
        return 1
    fi
}

fresh_dir() { rm -rf "$1"; mkdir -p "$1"; chown postgres: "$1"; chmod 700 "$1"; }
# in_b ARGS...: command string running ARGS as postgres inside namespace b
# (inside, A's directories $BENCH/a are hidden under an empty tmpfs: ip netns exec runs in a
# mount namespace of its own, so nothing in B can take a local shortcut to the primary's files)
in_b() { printf 'cd / && ip netns exec %s sh -c %s -- runuser -u postgres -- env PGPASSFILE=%s %s' "$NB" \
    "$(q 'mount -t tmpfs -o size=1m,mode=755 pgjet-bench-hidden "$BENCH_A" && exec "$@"')" "$PASSFILE" "$(q "$@")"; }
# in_b_pg ARGS...: in_b for a command that starts a copy of the primary in B (pg_ctl, or
# replica-create --start): the copy's postgresql.conf names the primary's socket directory,
# which the empty tmpfs then holds (in that mount namespace only, where the server stays)
in_b_pg() { printf 'cd / && ip netns exec %s sh -c %s -- runuser -u postgres -- env PGPASSFILE=%s %s' "$NB" \
    "$(q 'mount -t tmpfs -o size=1m,mode=755 pgjet-bench-hidden "$BENCH_A" && mkdir -p "$BENCH_A/pg-main/sock" &&
chown postgres: "$BENCH_A/pg-main/sock" && chmod 700 "$BENCH_A/pg-main/sock" && exec "$@"')" "$PASSFILE" "$(q "$@")"; }
conninfo() {   # [PORT]: the primary's (default), or the source standby's on A
    echo "host=$ADDR_A port=${1:-$PORT} user=$ROLE dbname=postgres sslmode=verify-full sslrootcert=$PKI/ca.crt passfile=$PASSFILE"
}

# ------------------------------------------------------------------ set-up
make_pki() {
    rm -rf "$PKI"; mkdir -p "$PKI"
    (
        cd "$PKI"
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=pgjet-bench-ca 2>/dev/null
        printf 'subjectAltName=IP:198.18.%s.2,DNS:pgjet-bench-a\nbasicConstraints=CA:FALSE\n' "$LAB_ID" >san.ext
        openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=pgjet-bench-a 2>/dev/null
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile san.ext 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=pgbackrest-client 2>/dev/null
        openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 2 2>/dev/null
    )
    chown -R postgres: "$PKI"; chmod 600 "$PKI"/*.key; chmod 755 "$PKI"
    printf '*:*:*:%s:%s\n' "$ROLE" "$PASSWORD" >"$PASSFILE"
    chown postgres: "$PASSFILE"; chmod 600 "$PASSFILE"
    # pgBackRest checks the server name against DNS names only: b resolves pgjet-bench-a
    # through the namespace's own /etc/hosts (ip netns exec bind-mounts /etc/netns/NS/*).
    mkdir -p "/etc/netns/$NB"
    printf '127.0.0.1 localhost\n198.18.%s.2 pgjet-bench-a\n' "$LAB_ID" >"/etc/netns/$NB/hosts"
}

# archive_command_of DS: the primary's archive_command: each tool's archive-push into its own
# repository on B's side, at the same time (archive_all), through the shared filesystem
# (only WAL goes that way, a few segments per backup; the data files cross the link). Each
# tool's backup waits for its WAL in its own archive (archive-check, both tools' default).
archive_command_of() {
    local ds=$1 cmds=()
    cmds+=("$PGJET_BIN --stanza=$ds --repo-path=$PGJET_REPO archive-push %p")
    [ "$SKIP_PGBACKREST" = 1 ] || cmds+=("pgbackrest --config=$PGBR_CONF_A --stanza=$ds --compress-type=none archive-push %p")
    archive_all "${cmds[@]}"
}

# build_cluster DS: initdb, TLS, role, pg_hba, archiving into the tools' repositories, then
# the dataset. Built in the root namespace (socket only), stopped at the end.
build_cluster() {
    local ds=$1 d=$BENCH/a/pg-$1 port
    header "Build the $ds dataset"
    rm -rf "$d"; mkdir -p "$d"
    port=$(free_port)
    PG_SHARED_BUFFERS=256MB PG_EXTRA_CONF="max_wal_size = 2GB
checkpoint_timeout = 30min
autovacuum = off" pg_make_cluster "$PGV" "$d" "$port"
    local t0=$SECONDS
    if [ "$ds" = pgb ]; then
        as_pg "$PGBIN/pgbench" -h "$d/sock" -p "$port" -U postgres -i -q -s "$STREAM_SCALE" postgres 2>&1 | tail -n 1
    elif [ "$ds" = main ]; then
        as_pg "$PGBIN/pgbench" -h "$d/sock" -p "$port" -U postgres -i -q -s "$SCALE" postgres 2>&1 | tail -n 1
        install -m 755 "$(dirname "${BASH_SOURCE[0]}")/gen-random.sh" "$BENCH/bin/gen-random.sh"
        psql_as "$PGV" "$d" "$port" >/dev/null <<SQL
CREATE TABLE random_bytes (id serial PRIMARY KEY, payload bytea NOT NULL);
ALTER TABLE random_bytes ALTER COLUMN payload SET STORAGE EXTERNAL;
COPY random_bytes (payload) FROM PROGRAM '$BENCH/bin/gen-random.sh $RANDOM_MB';
SQL
    else
        # SMALL_TABLES tables of 5 rows each: one 8 KiB heap file each (no index, no TOAST
        # table, and no VACUUM, so no free space or visibility map forks)
        psql_as "$PGV" "$d" "$port" >/dev/null <<SQL
SET synchronous_commit = off;
SELECT format('CREATE TABLE small_%s (id int, v int); INSERT INTO small_%s SELECT g, g * 7 FROM generate_series(1, 5) g;', i, i)
FROM generate_series(1, $SMALL_TABLES) i \gexec
SQL
    fi
    [ "$ds" = small ] || psql_as "$PGV" "$d" "$port" -c "VACUUM (FREEZE, ANALYZE)" >/dev/null
    psql_as "$PGV" "$d" "$port" >/dev/null <<SQL
CHECKPOINT;
CREATE ROLE $ROLE LOGIN REPLICATION PASSWORD '$PASSWORD';
GRANT pg_read_all_settings TO $ROLE;
GRANT EXECUTE ON FUNCTION pg_backup_start(text, boolean) TO $ROLE;
GRANT EXECUTE ON FUNCTION pg_backup_stop(boolean) TO $ROLE;
GRANT EXECUTE ON FUNCTION pg_read_binary_file(text, bigint, bigint, boolean) TO $ROLE;
GRANT EXECUTE ON FUNCTION pg_ls_dir(text, boolean, boolean) TO $ROLE;
GRANT EXECUTE ON FUNCTION pg_stat_file(text, boolean) TO $ROLE;
SQL
    say "loaded in $((SECONDS - t0)) s"
    pg_stop_cluster "$d"
    cp "$PKI/server.crt" "$PKI/server.key" "$d/data/"
    chown postgres: "$d/data/server.crt" "$d/data/server.key"; chmod 600 "$d/data/server.key"
    cat >>"$d/data/postgresql.conf" <<EOF
# ---- bench/remote.sh: the primary in namespace $NA
port = $PORT
listen_addresses = '*'
password_encryption = 'scram-sha-256'
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
max_connections = 40
archive_mode = on
archive_command = '$(archive_command_of "$ds")'
EOF
    cat >"$d/data/pg_hba.conf" <<EOF
local   all         all                     trust
local   replication all                     trust
hostssl all         $ROLE   0.0.0.0/0   scram-sha-256
hostssl replication $ROLE   0.0.0.0/0   scram-sha-256
EOF
    # the role's password was set before password_encryption mattered: scram is the default in 15
    measure_dataset "$ds"
}

measure_dataset() {
    local ds=$1 d=$BENCH/a/pg-$1
    LOGICAL[$ds]=$(find "$d/data" -type f ! -path '*/pg_wal/0*' ! -name postmaster.pid -printf '%s\n' | awk '{s += $1} END {print s + 0}')
    echo "${LOGICAL[$ds]}" >"$RES/logical-$ds.txt"
    du -sb "$d/data" >"$RES/size-$ds.txt"
    find "$d/data" -type f ! -path '*/pg_wal/*' | wc -l >"$RES/files-$ds.txt"
    say "PGDATA $ds: $(( $(cut -f1 "$RES/size-$ds.txt") >> 20 )) MiB, copied by a backup: $(( LOGICAL[$ds] >> 20 )) MiB in $(cat "$RES/files-$ds.txt") files"
}

# ------------------------------------------------------------------ pgBackRest
write_pgbr_conf() {
    mkdir -p "$BENCH/a/pgbr-log" "$BENCH/a/pgbr-lock" "$BENCH/a/pgbr-spool" "$BENCH/b/pgbr-log" \
        "$BENCH/b/pgbr-lock" "$PGBR_REPO"
    chown postgres: "$BENCH/a/pgbr-log" "$BENCH/a/pgbr-lock" "$BENCH/a/pgbr-spool" "$BENCH/b/pgbr-log" \
        "$BENCH/b/pgbr-lock" "$PGBR_REPO"
    # Host A: the TLS server the repository host connects to, and archive-push. archive-push
    # writes into the repository directory directly (both "hosts" share this machine's disk):
    # only WAL goes that way, a few segments per backup; the data files cross the link.
    cat >"$PGBR_CONF_A" <<EOF
[global]
repo1-path=$PGBR_REPO
log-path=$BENCH/a/pgbr-log
lock-path=$BENCH/a/pgbr-lock
spool-path=$BENCH/a/pgbr-spool
log-level-console=warn
log-level-file=info
tls-server-address=198.18.$LAB_ID.2
tls-server-cert-file=$PKI/server.crt
tls-server-key-file=$PKI/server.key
tls-server-ca-file=$PKI/ca.crt
tls-server-auth=pgbackrest-client=*

[main]
pg1-path=$BENCH/a/pg-main/data
pg1-port=$PORT
pg1-socket-path=$BENCH/a/pg-main/sock

[small]
pg1-path=$BENCH/a/pg-small/data
pg1-port=$PORT
pg1-socket-path=$BENCH/a/pg-small/sock

[pgb]
pg1-path=$BENCH/a/pg-pgb/data
pg1-port=$PORT
pg1-socket-path=$BENCH/a/pg-pgb/sock
EOF
    # Host B: the repository host; the primary through pgBackRest's TLS protocol.
    cat >"$PGBR_CONF_B" <<EOF
[global]
repo1-path=$PGBR_REPO
repo1-retention-full=9999
log-path=$BENCH/b/pgbr-log
lock-path=$BENCH/b/pgbr-lock
log-level-console=warn
log-level-file=info
start-fast=y
archive-copy=n
archive-timeout=120
EOF
    local ds
    for ds in main small pgb; do
        cat >>"$PGBR_CONF_B" <<EOF

[$ds]
pg1-host=pgjet-bench-a
pg1-host-type=tls
pg1-host-cert-file=$PKI/client.crt
pg1-host-key-file=$PKI/client.key
pg1-host-ca-file=$PKI/ca.crt
pg1-path=$BENCH/a/pg-$ds/data
pg1-port=$PORT
pg1-socket-path=$BENCH/a/pg-$ds/sock
EOF
    done
    chmod 644 "$PGBR_CONF_A" "$PGBR_CONF_B"
}

start_pgbr_server() {
    [ "$SKIP_PGBACKREST" = 1 ] && return 0
    # sh execs ip, which execs setpriv, which execs pgbackrest: $! is the server's PID
    sh -c 'echo $$ > "$0/tasks" && exec "$@"' "$CG_A" ip netns exec "$NA" \
        setpriv --reuid=postgres --regid=postgres --init-groups \
        pgbackrest --config="$PGBR_CONF_A" server </dev/null >"$LOGS/pgbr-server.log" 2>&1 &
    PGBR_PID=$!
    local i
    for i in $(seq 1 50); do
        ip netns exec "$NA" ss -Hltn "sport = :8432" | grep -q . && return 0
        sleep 0.1
    done
    die "pgbackrest server did not listen (log $LOGS/pgbr-server.log)"
}
stop_pgbr_server() {
    [ -n "$PGBR_PID" ] || return 0
    kill "$PGBR_PID" 2>/dev/null || true
    wait "$PGBR_PID" 2>/dev/null || true
    PGBR_PID=""
}
pgbr_b() { in_b pgbackrest --config="$PGBR_CONF_B" "$@"; }

# ------------------------------------------------------------------ the timed commands
LOCAL_EXCL="--exclude=./pg_wal/0* --exclude=./postmaster.pid"

raw_sender() {   # python TCP server in A: on connect, tar the data dir into the socket
    cat >"$BENCH/bin/raw.py" <<'EOF'
import socket, subprocess, sys
mode = sys.argv[1]
if mode == "serve":
    addr, port, datadir = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    zstd = len(sys.argv) > 5 and sys.argv[5] == "zstd"
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(1)
    c, _ = s.accept()
    p = subprocess.Popen(["tar", "-C", datadir, "--exclude=./pg_wal/0*", "--exclude=./postmaster.pid",
                          "--warning=no-file-changed", "--warning=no-file-removed", "-cf", "-", "."],
                         stdout=subprocess.PIPE)
    if zstd:
        p = subprocess.Popen(["zstd", "-1", "-q", "-c"], stdin=p.stdout, stdout=subprocess.PIPE)
    while True:
        b = p.stdout.read(1 << 20)
        if not b: break
        c.sendall(b)
    c.close(); p.wait()
else:
    addr, port = sys.argv[2], int(sys.argv[3])
    c = socket.create_connection((addr, port))
    out = sys.stdout.buffer
    while True:
        b = c.recv(1 << 20)
        if not b: break
        out.write(b)
EOF
}

bench_raw() {  # RUN [zstd [NAME]]: tar [| zstd -1] | TCP (plain, no TLS) | [zstd -d |] tar -x: the same bytes over the same link
    local r=$1 z=${2:-} name=${3:-raw_tar_tcp} o=$OUT/raw p=7000 unz=""
    fresh_dir "$o"
    in_cg_a ip netns exec "$NA" python3 "$BENCH/bin/raw.py" serve "$ADDR_A" $p "$BENCH/a/pg-$CUR_DS/data" $z </dev/null >"$LOGS/raw-sender.log" 2>&1 &
    local spid=$!
    sleep 0.5
    [ "$z" = zstd ] && unz="zstd -d -q -c | "
    timed "$name" "$r" "ip netns exec $NB python3 $BENCH/bin/raw.py recv $ADDR_A $p | $unz ip netns exec $NB tar -C $(q "$o") -xf -" || true
    wait "$spid" 2>/dev/null || true
    rm -rf "$o"
}

bench_local_copy() {   # plain local copy reference, no network
    local r=$1 o=$OUT/local
    rm -rf "$o"; mkdir -p "$o"
    timed local_tar_copy "$r" "tar -C $(q "$BENCH/a/pg-$CUR_DS/data") --warning=no-file-changed --warning=no-file-removed $LOCAL_EXCL -cf - . | tar -C $(q "$o") -xf -" || true
    rm -rf "$o"
}

bench_pg_basebackup() {
    local r=$1 o=$OUT/pgbb
    fresh_dir "$o"
    timed pg_basebackup_R "$r" "$(in_b "$PGBIN/pg_basebackup" -d "$(conninfo)" -D "$o" -Fp -Xstream -R -c fast)" || true
    rm -rf "$o"
}

bench_pgjet_replica() {   # NAME RUN JOBS [DIR [BIN]]
    local name=$1 r=$2 j=$3 o=${4:-$OUT/pgjet-replica} bin=${5:-$PGJET_BIN}
    fresh_dir "$o"
    timed "$name" "$r" "$(in_b "$bin" --source "$(conninfo)" --transport libpq --jobs "$j" \
        --pg-path "$o" --output json replica-create --start-fast)" || true
}

bench_pgbackrest() {   # RUN [PREFIX]
    local r=$1 pre=${2:-} j ct
    for ct in $PGBR_COMPRESS; do
        for j in $JOBS_LIST; do
            timed "${pre}pgbackrest_${ct}_p$j" "$r" "$(pgbr_b --stanza="$CUR_DS" --type=full --process-max="$j" \
                --compress-type="$ct" backup)" || true
            # keep the repository small (untimed)
            as_pg pgbackrest --config="$PGBR_CONF_B" --stanza="$CUR_DS" --repo1-retention-full=1 expire >/dev/null 2>&1 || true
        done
    done
}

# pgjet_stanza: create the current dataset's stanza in pgjet's repository, from B (untimed;
# idempotent). The primary archives into it: it must exist whenever the primary runs.
pgjet_stanza() {
    eval "$(in_b "$PGJET_BIN" --stanza "$CUR_DS" --repo-path "$PGJET_REPO" --source "$(conninfo)" stanza-create)" \
        >"$LOGS/pgjet-stanza-create.log" 2>&1 || { cat "$LOGS/pgjet-stanza-create.log"; return 1; }
}

bench_pgjet_backup() {   # RUN [BIN PREFIX]
    local r=$1 bin=${2:-$PGJET_BIN} pre=${3:-} j ct repo=$PGJET_REPO
    for ct in $PGJET_COMPRESS; do
        for j in $JOBS_LIST; do
            # a fresh stanza for each backup, once no archive-push is running (the primary
            # archives into it)
            if ! archiver_idle "$BENCH/a/pg-$CUR_DS/data" || ! rm -rf "${repo:?}/$CUR_DS" || ! pgjet_stanza; then
                printf '  %-26s run %d: FAILED (fresh stanza)\n' "${pre}pgjet_backup_${ct}_j$j" "$r"
                printf '%s\t%s\t%s\t%s\t0\t0\t0\t0\t0\t0\t0\t0\tFAIL\t0\t\t\n' "$CUR_DS" "$CUR_LINK" "${pre}pgjet_backup_${ct}_j$j" "$r" >>"$TSV"
                continue
            fi
            timed "${pre}pgjet_backup_${ct}_j$j" "$r" "$(in_b "$bin" --stanza "$CUR_DS" --repo-path "$repo" \
                --source "$(conninfo)" --transport libpq --jobs "$j" --compress-type "$ct" --output json \
                backup --type full --start-fast)" || true
        done
    done
}

iperf_ref() {   # IPERF_S s of iperf3 A -> B (1 stream, after 2 s left out), once per link: the link's TCP goodput
    local out
    in_cg_a ip netns exec "$NA" iperf3 -s -1 -B "$ADDR_A" >/dev/null 2>&1 &
    local spid=$!
    sleep 0.5
    out=$(ip netns exec "$NB" iperf3 -c "$ADDR_A" -R -t "$IPERF_S" -O 2 -J 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])' 2>/dev/null || echo "")
    wait "$spid" 2>/dev/null || true
    printf '%s\t%s\t%s\n' "$CUR_DS" "$CUR_LINK" "$out" >>"$RES/iperf.tsv"
    say "  iperf3 (1 stream, A -> B): $(awk -v b="${out:-0}" 'BEGIN {printf "%.1f Mbit/s", b / 1e6}')"
}

# bench_pgjet_ab RUN replica|backup: pgjet's replica-create or backups, and with PGJET_BASE
# the base build's too (named base_*), in an order that alternates from run to run.
bench_pgjet_ab() {
    local r=$1 what=$2 order=new
    [ -n "$PGJET_BASE_SRC" ] && order=$( [ $((r % 2)) = 1 ] && echo "base new" || echo "new base")
    local which
    for which in $order; do
        case "$what:$which" in
            replica:new) bench_pgjet_replica "pgjet_replica_j$REPLICA_JOBS" "$r" "$REPLICA_JOBS" ;;
            replica:base) bench_pgjet_replica "base_pgjet_replica_j$REPLICA_JOBS" "$r" "$REPLICA_JOBS" \
                "$OUT/pgjet-replica" "$PGJET_BASE_BIN" ;;
            backup:new) bench_pgjet_backup "$r" ;;
            backup:base) bench_pgjet_backup "$r" "$PGJET_BASE_BIN" base_ ;;
        esac
        [ "$what" = replica ] && rm -rf "$OUT/pgjet-replica"
    done
    return 0
}

# ------------------------------------------------------------------ the parts
phase_begin() { header "$1"; wait_quiet; LOAD[$1]="$(loadavg)"; }
phase_end() { LOAD[$1]="${LOAD[$1]} → $(loadavg)"; printf '%s\t%s\n' "$1" "${LOAD[$1]}" >>"$RES/load.tsv"; }

part_main() {   # DS LINKS RUNS
    local ds=$1 links=$2 runs=$3 link r
    if [ "$ds" = small ]; then PGBR_COMPRESS=$SMALL_PGBR_COMPRESS; PGJET_COMPRESS=$SMALL_PGJET_COMPRESS; fi
    for link in $links; do
        CUR_LINK_TAG=${link//\//_}
        lab_up "$link" "$ds"
        phase_begin "$ds @ $(link_label "$link")"
        iperf_ref
        for r in $(seq 1 "$runs"); do
            say "-- run $r of $runs"
            [ "$link" = unshaped ] && bench_local_copy "$r"
            bench_raw "$r"
            bench_pgjet_ab "$r" replica
            bench_pg_basebackup "$r"
            [ "$SKIP_PGBACKREST" = 1 ] || bench_pgbackrest "$r"
            bench_pgjet_ab "$r" backup
        done
        phase_end "$ds @ $(link_label "$link")"
    done
}

part_sweep() {
    local link j r
    for link in $SWEEP_LINKS; do
        CUR_LINK_TAG=${link//\//_}
        lab_up "$link" main
        phase_begin "sweep @ $(link_label "$link")"
        for r in $(seq 1 "$SWEEP_RUNS"); do
            for j in $SWEEP_JOBS; do
                bench_pgjet_replica "sweep_replica_j$j" "$r" "$j"; rm -rf "$OUT/pgjet-replica"
            done
        done
        phase_end "sweep @ $(link_label "$link")"
    done
}

# change_pages: one row updated on DELTA_PCT % of pgbench_accounts' heap pages (random
# pages, by ctid), then CHECKPOINT; prints the rows updated
change_pages() {
    change_pages_sql "$DELTA_PCT" | psql_as "$PGV" "$BENCH/a/pg-main" "$PORT" -At
    psql_as "$PGV" "$BENCH/a/pg-main" "$PORT" -c CHECKPOINT >/dev/null
}

# part_incr: on DELTA_LINK, a full backup over libpq into a fresh stanza, then SWEEP_RUNS
# times: DELTA_PCT % of the pages changed and an incremental backup over libpq (each against
# the one before): the bytes on the wire of an incr against a full's.
part_incr() {
    local link=$DELTA_LINK pages n r
    CUR_LINK_TAG=${link//\//_}
    lab_up "$link" main
    phase_begin "incr @ $(link_label "$link")"
    pages=$(psql_as "$PGV" "$BENCH/a/pg-main" "$PORT" -Atc "SELECT pg_relation_size('pgbench_accounts') / 8192")
    archiver_idle "$BENCH/a/pg-$CUR_DS/data" && rm -rf "${PGJET_REPO:?}/$CUR_DS" && pgjet_stanza \
        || { say "  incr: no fresh stanza"; phase_end "incr @ $(link_label "$link")"; return 0; }
    local args=(--stanza "$CUR_DS" --repo-path "$PGJET_REPO" --source "$(conninfo)" --transport libpq
        --jobs "$REPLICA_JOBS" --compress-type zstd --output json)
    timed incr_base_full 1 "$(in_b "$PGJET_BIN" "${args[@]}" backup --type full --start-fast)" || true
    : >"$RES/incr-changes.tsv"
    for r in $(seq 1 "$SWEEP_RUNS"); do
        n=$(change_pages "$pages")
        printf '%s\t%s\t%s\n' "$r" "$n" "$pages" >>"$RES/incr-changes.tsv"
        say "  changed $n of $pages pgbench_accounts pages (one row each), checkpoint"
        timed incr_libpq "$r" "$(in_b "$PGJET_BIN" "${args[@]}" backup --type incr --start-fast)" || true
        cp "$LOGS/incr_libpq.$CUR_LINK_TAG.run$r.log" "$RES/incr_libpq.run$r.json" 2>/dev/null || true
    done
    phase_end "incr @ $(link_label "$link")"
}

part_delta() {
    local link=$DELTA_LINK d=$BENCH/b/delta kib n r
    CUR_LINK_TAG=${link//\//_}
    lab_up "$link" main
    phase_begin "delta @ $(link_label "$link")"
    local pages
    pages=$(psql_as "$PGV" "$BENCH/a/pg-main" "$PORT" -Atc "SELECT pg_relation_size('pgbench_accounts') / 8192")
    bench_pgjet_replica delta_base_full 1 "$REPLICA_JOBS" "$d"
    for r in $(seq 1 "$SWEEP_RUNS"); do
        for kib in $DELTA_RANGES; do
            n=$(change_pages "$pages")
            printf '%s\t%s\t%s\t%s\n' "$kib" "$r" "$n" "$pages" >>"$RES/delta-changes.tsv"
            say "  changed $n of $pages pgbench_accounts pages (one row each), checkpoint"
            timed "delta_r${kib}k" "$r" "$(in_b env PGJET_DELTA_RANGE_KIB="$kib" "$PGJET_BIN" --source "$(conninfo)" \
                --transport libpq --jobs "$REPLICA_JOBS" --pg-path "$d" --output json replica-create --delta --start-fast)" || true
            cp "$LOGS/delta_r${kib}k.$CUR_LINK_TAG.run$r.log" "$RES/delta_r${kib}k.run$r.json" 2>/dev/null || true
        done
    done
    # a full copy again for the comparison at the same time of the run
    bench_pgjet_replica delta_full_again 1 "$REPLICA_JOBS"; rm -rf "$OUT/pgjet-replica"
    phase_end "delta @ $(link_label "$link")"
    rm -rf "$d"
}

# ------------------------------------------------------------------ the stream part
# Rows are named s_*: the same dataset and link may also appear in the main part.
bench_s_pgjet_replica() {   # RUN VARIANT: [base:]libpq | bb_zstd | bb_lz4 | auto (base: PGJET_BASE's build)
    local r=$1 v=$2 o=$OUT/pgjet-replica t=() bin=$PGJET_BIN name=s_pgjet_replica_$2
    case "$v" in base:*) v=${v#base:}; bin=$PGJET_BASE_BIN; name=s_base_replica_$v ;; esac
    case "$v" in
        libpq) t=(--transport libpq --jobs "$REPLICA_JOBS") ;;
        bb_*) t=(--transport basebackup --network-compress "${v#bb_}") ;;
        auto) t=(--transport auto) ;;
    esac
    fresh_dir "$o"
    timed "$name" "$r" "$(in_b "$bin" --source "$(conninfo)" "${t[@]}" \
        --pg-path "$o" --output json --log-level info replica-create --start-fast)" || true
    rm -rf "$o"
}

bench_s_pg_basebackup() {   # RUN VARIANT: none | lz4 | zstd_w2 (server-side compression, plain format)
    local r=$1 v=$2 o=$OUT/pgbb c=()
    case "$v" in
        lz4) c=(--compress=server-lz4) ;;
        zstd_w2) c=(--compress=server-zstd:workers=2) ;;
    esac
    fresh_dir "$o"
    timed "s_pgbb_$v" "$r" "$(in_b "$PGBIN/pg_basebackup" -d "$(conninfo)" -D "$o" -Fp -Xstream -R -c fast "${c[@]}")" || true
    rm -rf "$o"
}

bench_s_pgjet_backup() {   # RUN TRANSPORT JOBS: bb | bb_lz4 | libpq | auto; the repository compresses with lz4
    local r=$1 v=$2 j=$3 repo=$PGJET_REPO name=s_pgjet_backup_${2}_j$3 t=()
    case "$v" in
        bb) t=(--transport basebackup --network-compress zstd) ;;
        bb_lz4) t=(--transport basebackup --network-compress lz4) ;;
        libpq) t=(--transport libpq) ;;
        auto) t=(--transport auto) ;;
    esac
    if ! archiver_idle "$BENCH/a/pg-$CUR_DS/data" || ! rm -rf "${repo:?}/$CUR_DS" || ! pgjet_stanza; then
        printf '  %-26s run %d: FAILED (fresh stanza)\n' "$name" "$r"
        printf '%s\t%s\t%s\t%s\t0\t0\t0\t0\t0\t0\t0\t0\tFAIL\t0\t\t\n' "$CUR_DS" "$CUR_LINK" "$name" "$r" >>"$TSV"
        return 0
    fi
    timed "$name" "$r" "$(in_b "$PGJET_BIN" --stanza "$CUR_DS" --repo-path "$repo" --source "$(conninfo)" \
        "${t[@]}" --jobs "$j" --compress-type lz4 --output json --log-level info backup --type full --start-fast)" || true
}

part_stream() {
    local ds link r v j
    for ds in $STREAM_DATASETS; do
        [ -f "$BENCH/a/pg-$ds/data/PG_VERSION" ] || { say "no $ds dataset: skipped"; continue; }
        for link in $STREAM_LINKS; do
            CUR_LINK_TAG=${link//\//_}
            lab_up "$link" "$ds"
            phase_begin "stream: $ds @ $(link_label "$link")"
            iperf_ref
            local slow=0 mbit
            mbit=$(link_mbit "$link")
            [ "$STREAM_SLOW_MBIT" -gt 0 ] && [ "$mbit" -gt 0 ] && [ "$mbit" -le "$STREAM_SLOW_MBIT" ] && slow=1
            for r in $(seq 1 "$STREAM_RUNS"); do
                say "-- run $r of $STREAM_RUNS"
                # The commands of a run, in the order listed for run 1 and shuffled (seeded by
                # the run's number) for the others: on this VM a command that moved gigabytes
                # leaves the next one slower (its walsender spent 3.6 s of CPU instead of 1.3,
                # most of it copying from the page cache, after a backup over the ranges), so no
                # command may always follow the same one.
                local cmds=()
                case " $STREAM_RAW " in *" plain "*) [ $slow = 1 ] || cmds+=("bench_raw $r '' s_raw_tar_tcp") ;; esac
                case " $STREAM_RAW " in *" zstd "*) cmds+=("bench_raw $r zstd s_raw_tar_zstd1_tcp") ;; esac
                for v in $STREAM_REPLICA; do
                    [ $slow = 1 ] && [ "$v" = libpq ] && continue
                    cmds+=("bench_s_pgjet_replica $r $v")
                done
                for v in $STREAM_PGBB; do
                    [ $slow = 1 ] && [ "$v" = none ] && continue
                    cmds+=("bench_s_pg_basebackup $r $v")
                done
                if [ "$SKIP_PGBACKREST" != 1 ]; then
                    cmds+=("PGBR_COMPRESS=lz4 JOBS_LIST='$STREAM_JOBS' bench_pgbackrest $r s_")
                fi
                for v in $STREAM_BACKUP; do
                    [ $slow = 1 ] && [ "$v" = libpq ] && continue
                    for j in $STREAM_JOBS; do cmds+=("bench_s_pgjet_backup $r $v $j"); done
                done
                if [ "$r" -gt 1 ]; then
                    mapfile -t cmds < <(printf '%s\n' "${cmds[@]}" | shuf --random-source=<(yes "$r"))
                fi
                local c
                for c in "${cmds[@]}"; do eval "$c"; done
            done
            phase_end "stream: $ds @ $(link_label "$link")"
        done
    done
}

# ------------------------------------------------------------------ the sources part
# Rows src_* and reinit_* (dataset main, link SOURCES_LINK): where a new standby's files come
# from (the primary, a standby of it on host A, an S3 repository), and the re-sync of a
# replica that missed DELTA_PCT % of the pages (Patroni's reinit) against its peers.

# versitygw (plain HTTP, path-style bucket $S3_BUCKET) in host A's namespace and cgroup,
# reached from B through the lab's wire, from A's own processes locally
start_versitygw() {
    local i
    [ -x "${VERSITYGW:-}" ] || die "versitygw not found: run scripts/install-deps.sh or set VERSITYGW"
    rm -rf "$S3DATA"; mkdir -p "$S3DATA/$S3_BUCKET"
    # --keep-alive: versitygw otherwise closes every connection, which real object stores do not.
    # Not through in_cg_a (a function: `&` would fork a subshell, and $! would be that): sh
    # execs ip, which execs versitygw, so $! is versitygw itself. Credentials in its environment.
    ROOT_ACCESS_KEY_ID=$S3_KEY ROOT_SECRET_ACCESS_KEY=$S3_SECRET \
        sh -c 'echo $$ > "$0/tasks" && exec "$@"' "$CG_A" ip netns exec "$NA" "$VERSITYGW" --quiet --keep-alive \
        --port "$ADDR_A:$SOURCES_S3_PORT" posix "$S3DATA" </dev/null >"$LOGS/versitygw.log" 2>&1 &
    VGW_PID=$!
    for i in $(seq 1 100); do
        if ip netns exec "$NB" curl -s -o /dev/null "http://$ADDR_A:$SOURCES_S3_PORT/"; then
            say "  versitygw (pid $VGW_PID) serves http://$ADDR_A:$SOURCES_S3_PORT (bucket $S3_BUCKET) from $S3DATA"
            return 0
        fi
        kill -0 "$VGW_PID" 2>/dev/null || break
        sleep 0.1
    done
    cat "$LOGS/versitygw.log" >&2
    die "versitygw did not start"
}

# The primary alone in CG_P (a child of CG_A: A's figures still count it): its postmaster, so
# every process it forks from now on, and the processes it has.
primary_cg_in() {
    local pm c
    mkdir -p "$CG_P"
    pm=$(pg_cluster_pid "$BENCH/a/pg-main")
    [ -n "$pm" ] || die "no primary running"
    echo "$pm" >"$CG_P/cgroup.procs"
    for c in $(ps -o pid= --ppid "$pm"); do echo "$c" >"$CG_P/cgroup.procs" 2>/dev/null || true; done
}
primary_cg_out() {
    [ -d "$CG_P" ] || return 0
    local p
    for p in $(cat "$CG_P/cgroup.procs" 2>/dev/null); do echo "$p" >"$CG_A/cgroup.procs" 2>/dev/null || true; done
    rmdir "$CG_P" 2>/dev/null || true
}

pq() { psql_as "$PGV" "$BENCH/a/pg-main" "$PORT" -Atc "$1"; }   # one query on the primary, as postgres
src_fact() { printf '%s\t%s\n' "$1" "$2" >>"$RES/sources-facts.tsv"; }
logical_now() {
    find "$BENCH/a/pg-main/data" -type f ! -path '*/pg_wal/0*' ! -name postmaster.pid -printf '%s\n' | awk '{s += $1} END {print s + 0}'
}

# wait_streaming_where COND [SECONDS]: until the primary has a streaming walsender with COND
wait_streaming_where() {
    local i
    for i in $(seq 1 $((${2:-120} * 5))); do
        [ "$(pq "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND $1")" -ge 1 ] && return 0
        sleep 0.2
    done
    say "  no streaming walsender with $1 after ${2:-120} s"
    return 1
}

# start_b_standby DIR: start the copy in DIR inside B (port $PORT there), until it streams
start_b_standby() {
    local d=$1
    if ! (eval "$(in_b_pg "$PGBIN/pg_ctl" -D "$d" -l "$d.log" -w -t 300 -o "-p $PORT" start)") >/dev/null; then
        tail -n 20 "$d.log"; return 1
    fi
    wait_streaming_where "client_addr = '$ADDR_B'" 300
}

# The source standby: a pg_basebackup of the primary on host A, its own port and socket,
# streaming from the primary through its socket; in A's cgroup, not in the primary's.
make_source_standby() {
    pg_stop_cluster "$SRC_SB"; rm -rf "$SRC_SB"
    mkdir -p "$SRC_SB/sock"; chown postgres: "$SRC_SB" "$SRC_SB/sock"; chmod 700 "$SRC_SB/sock"
    as_pg "$PGBIN/pg_basebackup" -h "$BENCH/a/pg-main/sock" -p "$PORT" -U postgres -D "$SRC_SB/data" \
        -Fp -Xstream -R -c fast >"$LOGS/src-standby-basebackup.log" 2>&1 \
        || { cat "$LOGS/src-standby-basebackup.log"; die "pg_basebackup of the source standby failed"; }
    cat >>"$SRC_SB/data/postgresql.conf" <<EOC
# ---- bench/remote.sh, sources part: a standby of the primary on host A
port = $SOURCES_STANDBY_PORT
unix_socket_directories = '$SRC_SB/sock'
EOC
    touch "$SRC_SB/log"; chown postgres: "$SRC_SB/log"
    in_cg_a ip netns exec "$NA" runuser -u postgres -- "$PGBIN/pg_ctl" -D "$SRC_SB/data" -l "$SRC_SB/log" -w -t 120 start >/dev/null \
        || { tail -n 20 "$SRC_SB/log"; die "the source standby did not start"; }
    wait_streaming_where "client_addr IS NULL" 120 || die "the source standby does not stream"
    say "  source standby on A, port $SOURCES_STANDBY_PORT, streaming from the primary"
}

src_copy() {   # NAME RUN PORT: pgjet replica-create (--transport auto) into an empty dir from the server on A at PORT
    local o=$OUT/src-copy
    fresh_dir "$o"
    timed "$1" "$2" "$(in_b "$PGJET_BIN" --source "$(conninfo "$3")" --pg-path "$o" --output json \
        replica-create --start-fast)" || true
    rm -rf "$o"
}
src_pgbb() {   # NAME RUN PORT: pg_basebackup -R, the same
    local o=$OUT/src-pgbb
    fresh_dir "$o"
    timed "$1" "$2" "$(in_b "$PGBIN/pg_basebackup" -d "$(conninfo "$3")" -D "$o" -Fp -Xstream -R -c fast)" || true
    rm -rf "$o"
}
# src_start NAME RUN SEED: replica-create --seed SEED --start from the primary into an empty dir
# in B (timed until the new standby streams); the standby stopped and removed after
src_start() {
    local o=$OUT/src-start cfg=()
    [ "$3" = source ] || cfg=(--config "$S3_CONF" --stanza main)
    fresh_dir "$o"
    timed "$1" "$2" "$(in_b_pg "$PGJET_BIN" "${cfg[@]}" --source "$(conninfo)" --pg-path "$o" --output json \
        replica-create --seed "$3" --start --start-fast)" || true
    pg_stop_cluster "$o"
    rm -rf "$o" "$o.log"
}

# src_make_wal MIB: pgbench on the primary until MIB MiB of WAL were written; prints the bytes
src_make_wal() {
    local start now=0 target=$(($1 * 1048576))
    start=$(pq "SELECT pg_current_wal_lsn()")
    while :; do
        now=$(pq "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$start')::bigint")
        [ "$now" -ge "$target" ] && break
        as_pg env PGOPTIONS='-c synchronous_commit=off' "$PGBIN/pgbench" -h "$BENCH/a/pg-main/sock" -p "$PORT" \
            -U postgres -n -c 2 -j 2 -T 5 postgres >>"$LOGS/src-pgbench.log" 2>&1 \
            || { tail -n 5 "$LOGS/src-pgbench.log" >&2; return 1; }
    done
    echo "$now"
}
# src_wait_archived: switch to a new segment and wait until the archiver archived the one closed
src_wait_archived() {
    local seg t0=$SECONDS
    seg=$(pq "SELECT pg_walfile_name(pg_switch_wal())")
    until [ "$(pq "SELECT coalesce(last_archived_wal, '') >= '$seg' FROM pg_stat_archiver")" = t ]; do
        if [ $((SECONDS - t0)) -ge 1800 ]; then
            say "  $seg not archived after 1800 s: $(pq "SELECT last_archived_wal, failed_count, last_failed_wal FROM pg_stat_archiver")"
            return 1
        fi
        sleep 1
    done
    say "  archived through $seg ($((SECONDS - t0)) s after the switch)"
}

part_sources() {
    local link=$SOURCES_LINK r n pages logical wal kept=$OUT/reinit-pgjet kept_br=$OUT/reinit-pgbr
    local on_a=(--pg-path "$BENCH/a/pg-main/data" --pg-socket-path "$BENCH/a/pg-main/sock" --pg-port "$PORT")
    CUR_LINK_TAG=${link//\//_}
    lab_up "$link" main
    ADDR_B=$(sed -n 's/^NETLAB_ADDR_B=//p' "$RES/lab.env")
    phase_begin "sources @ $(link_label "$link")"
    : >"$RES/sources-facts.tsv"; : >"$RES/sources-changes.tsv"; : >"$RES/sources-seed-auto.txt"
    iperf_ref
    primary_cg_in
    src_fact logical_start "$(logical_now)"

    # 1, 2: a new replica copied from the primary and from a standby of it on A (the primary's
    # own CPU recorded for each)
    say "-- replica creation from the primary and from a standby on host A"
    make_source_standby
    for r in $(seq 1 "$SOURCES_RUNS"); do
        say "-- run $r of $SOURCES_RUNS"
        src_copy src_primary "$r" "$PORT"
        src_copy src_standby "$r" "$SOURCES_STANDBY_PORT"
        src_pgbb src_pgbb_primary "$r" "$PORT"
        src_pgbb src_pgbb_standby "$r" "$SOURCES_STANDBY_PORT"
    done
    pg_stop_cluster "$SRC_SB"; rm -rf "$SRC_SB"

    # 3: seeded from an S3 repository: a stanza and a full backup on it (untimed, on A), then
    # SOURCES_WAL_MB of pgbench WAL archived into it by the primary's archive_command
    say "-- seeded from an S3 repository (versitygw on host A) with $SOURCES_WAL_MB MiB of WAL since the backup"
    start_versitygw
    cat >"$S3_CONF" <<EOC
[global]
repo1-type=s3
repo1-path=/bench
repo1-s3-bucket=$S3_BUCKET
repo1-s3-endpoint=http://$ADDR_A
repo1-storage-port=$SOURCES_S3_PORT
repo1-s3-region=us-east-1
repo1-s3-key=$S3_KEY
repo1-s3-key-secret=$S3_SECRET
repo1-s3-uri-style=path
EOC
    chown postgres: "$S3_CONF"; chmod 600 "$S3_CONF"
    (cd / && in_cg_a ip netns exec "$NA" runuser -u postgres -- "$PGJET_BIN" --config "$S3_CONF" --stanza main \
        "${on_a[@]}" stanza-create) >"$LOGS/src-s3-stanza-create.log" 2>&1 \
        || { cat "$LOGS/src-s3-stanza-create.log"; die "pgjet stanza-create on S3 failed"; }
    # the primary archives into the S3 repository (and pgBackRest's, for the reinit peer's backups)
    local cmds=("$PGJET_BIN --config=$S3_CONF --stanza=main archive-push %p")
    [ "$SKIP_PGBACKREST" = 1 ] || cmds+=("pgbackrest --config=$PGBR_CONF_A --stanza=main --compress-type=none archive-push %p")
    SRC_ARCHIVE_SET=1
    pq "ALTER SYSTEM SET archive_command = '$(archive_all "${cmds[@]}")'" >/dev/null
    pq "SELECT pg_reload_conf()" >/dev/null
    local t0=$SECONDS
    (cd / && in_cg_a ip netns exec "$NA" runuser -u postgres -- "$PGJET_BIN" --config "$S3_CONF" --stanza main \
        "${on_a[@]}" --output json backup --type full --start-fast) >"$LOGS/src-s3-backup.log" 2>&1 \
        || { tail -n 20 "$LOGS/src-s3-backup.log"; die "pgjet backup into S3 failed"; }
    say "  full backup into S3 in $((SECONDS - t0)) s (untimed)"
    t0=$SECONDS
    wal=$(src_make_wal "$SOURCES_WAL_MB") || die "pgbench failed (log $LOGS/src-pgbench.log)"
    say "  $((wal >> 20)) MiB of WAL by pgbench in $((SECONDS - t0)) s"
    src_wait_archived || die "the WAL did not reach the S3 repository"
    src_fact wal_bytes "$wal"
    src_fact s3_stored_bytes "$(du -sb "$S3DATA" | cut -f1)"
    src_fact logical_after_wal "$(logical_now)"
    for r in $(seq 1 "$SOURCES_RUNS"); do
        say "-- run $r of $SOURCES_RUNS"
        src_start src_primary_start "$r" source
        src_start src_s3_seed "$r" repo
        src_start src_auto "$r" auto
        grep -h 'seed auto:' "$LOGS/src_auto.$CUR_LINK_TAG.run$r.log" 2>/dev/null | sed "s/^/run $r: /" >>"$RES/sources-seed-auto.txt" || true
    done
    sed 's/^/  /' "$RES/sources-seed-auto.txt"

    # 4: the re-sync of a replica that missed DELTA_PCT % of the pages. A pgjet replica kept in
    # B; each run: started until it streams, stopped, the pages changed, CHECKPOINT, then pgjet
    # --delta over it, pg_basebackup into an empty dir (Patroni's default), and pgBackRest's
    # --delta restore of its newest backup (an incr taken after the change) into a second kept
    # copy (the directory of the run before's restore: it missed the same pages).
    say "-- reinit of a replica that missed $DELTA_PCT % of the pages"
    pages=$(pq "SELECT pg_relation_size('pgbench_accounts') / 8192")
    fresh_dir "$kept"
    # With a slot of its own on the primary, as Patroni keeps one per member (use_slots):
    # the primary then holds the WAL from the replica's restart point, which the re-sync
    # without summaries reads to list the changed blocks.
    (eval "$(in_b "$PGJET_BIN" --source "$(conninfo)" --pg-path "$kept" --output json replica-create --start-fast --slot reinit_kept)") \
        >"$LOGS/src-reinit-first.log" 2>&1 || { tail -n 20 "$LOGS/src-reinit-first.log"; die "the kept replica's first copy failed"; }
    if [ "$SKIP_PGBACKREST" != 1 ]; then
        cat >"$PGBR_CONF_R" <<EOC
[global]
repo1-path=$PGBR_REPO
log-path=$BENCH/b/pgbr-log
lock-path=$BENCH/b/pgbr-lock
log-level-console=warn
log-level-file=info
process-max=$SOURCES_PGBR_JOBS

[main]
pg1-path=$kept_br
EOC
        chmod 644 "$PGBR_CONF_R"
    fi
    for r in $(seq 1 "$SOURCES_RUNS"); do
        say "-- run $r of $SOURCES_RUNS"
        start_b_standby "$kept" || die "the kept replica did not stream"
        pg_stop_cluster "$kept"
        if [ "$r" = 1 ] && [ "$SKIP_PGBACKREST" != 1 ]; then
            rm -rf "$kept_br"; cp -a "$kept" "$kept_br"
            (eval "$(pgbr_b --stanza=main --type=full --compress-type="$SOURCES_PGBR_COMPRESS" \
                --process-max="$SOURCES_PGBR_JOBS" backup)") >"$LOGS/src-pgbr-full.log" 2>&1 \
                || { tail -n 20 "$LOGS/src-pgbr-full.log"; die "pgBackRest full backup failed"; }
        fi
        n=$(change_pages)
        printf '%s\t%s\t%s\n' "$r" "$n" "$pages" >>"$RES/sources-changes.tsv"
        say "  changed $n of $pages pgbench_accounts pages (one row each), checkpoint"
        if [ "$SKIP_PGBACKREST" != 1 ]; then
            (eval "$(pgbr_b --stanza=main --type=incr --compress-type="$SOURCES_PGBR_COMPRESS" \
                --process-max="$SOURCES_PGBR_JOBS" backup)") >"$LOGS/src-pgbr-incr.run$r.log" 2>&1 \
                || { tail -n 20 "$LOGS/src-pgbr-incr.run$r.log"; die "pgBackRest incr backup failed"; }
        fi
        timed reinit_pgjet "$r" "$(in_b "$PGJET_BIN" --source "$(conninfo)" --pg-path "$kept" --output json \
            replica-create --delta --start-fast)" || true
        cp "$LOGS/reinit_pgjet.$CUR_LINK_TAG.run$r.log" "$RES/reinit_pgjet.run$r.json" 2>/dev/null || true
        fresh_dir "$OUT/reinit-pgbb"
        timed reinit_pg_basebackup "$r" "$(in_b "$PGBIN/pg_basebackup" -d "$(conninfo)" -D "$OUT/reinit-pgbb" \
            -Fp -Xstream -R -c fast)" || true
        rm -rf "$OUT/reinit-pgbb"
        if [ "$SKIP_PGBACKREST" != 1 ]; then
            timed reinit_pgbackrest_delta "$r" "$(in_b pgbackrest --config="$PGBR_CONF_R" --stanza=main --delta restore)" || true
        fi
    done

    # back to the primary's own archive_command, once the S3 pushes are done
    pq "ALTER SYSTEM RESET archive_command" >/dev/null
    pq "SELECT pg_reload_conf()" >/dev/null
    SRC_ARCHIVE_SET=0
    archiver_idle "$BENCH/a/pg-main/data" 300 || true
    stop_versitygw
    primary_cg_out
    rm -rf "$kept" "$kept_br" "$kept.log" "$OUT/src-copy" "$OUT/src-pgbb" "$OUT/src-start"
    phase_end "sources @ $(link_label "$link")"
}

# ------------------------------------------------------------------ main
main() {
    [ "$(id -u)" -eq 0 ] || die "run as root"
    if [ "$REPORT_ONLY" = 1 ]; then
        local ds
        [ -s "$TSV" ] || die "REPORT_ONLY=1: no results in $RES"
        for ds in main small pgb; do
            [ -f "$RES/logical-$ds.txt" ] && LOGICAL[$ds]=$(cat "$RES/logical-$ds.txt")
        done
        PGJET_VERSION=$("$PGJET_SRC" --version | head -n 1)
        write_report
        say "report written to $REPORT"
        return
    fi
    for c in /usr/bin/time pgbackrest runuser setpriv iperf3 python3 openssl "$PGBIN/pg_basebackup" basenc; do
        command -v "$c" >/dev/null || die "missing $c: run scripts/install-deps.sh"
    done
    case " $PARTS " in *" sources "*)
        [ -x "${VERSITYGW:-}" ] || die "versitygw not found: run scripts/install-deps.sh or set VERSITYGW"
        command -v curl >/dev/null || die "missing curl: run scripts/install-deps.sh" ;;
    esac
    [ -x "$PGJET_SRC" ] || die "no pgjet at $PGJET_SRC (cargo build --release)"
    [ -e "/run/netns/$NA" ] && die "namespace $NA exists (another run?): bash scripts/netlab.sh down $LAB_PREFIX"
    mkdir -p "$BENCH/bin" "$BENCH/a" "$BENCH/b" "$LOGS" "$RES" "$OUT"
    chmod 755 "$BENCH" "$BENCH/bin" "$BENCH/a" "$BENCH/b"
    chown postgres: "$OUT"
    if [ "$REUSE" != 1 ]; then
        : >"$TSV"; : >"$RES/iperf.tsv"; : >"$RES/load.tsv"; : >"$RES/delta-changes.tsv"
        loadavg >"$RES/load-start.txt"
    fi
    install -m 755 "$PGJET_SRC" "$PGJET_BIN"
    PGJET_VERSION=$("$PGJET_BIN" --version | head -n 1)
    if [ -n "$PGJET_BASE_SRC" ]; then
        [ -x "$PGJET_BASE_SRC" ] || die "no pgjet binary at PGJET_BASE=$PGJET_BASE_SRC"
        install -m 755 "$PGJET_BASE_SRC" "$PGJET_BASE_BIN"
    fi
    say "bench dir $BENCH; SCALE=$SCALE RANDOM_MB=$RANDOM_MB SMALL_TABLES=$SMALL_TABLES RUNS=$RUNS LINKS='$LINKS' PARTS='$PARTS'"
    say "load average at start: $(loadavg)"
    export BENCH_A=$BENCH/a
    make_cgroups
    raw_sender
    if [ "$REUSE" = 1 ]; then
        ls "$BENCH"/a/pg-*/data/PG_VERSION >/dev/null 2>&1 || die "REUSE=1 but no cluster under $BENCH/a (run once with KEEP=1)"
        mkdir -p "/etc/netns/$NB"
        printf '127.0.0.1 localhost\n198.18.%s.2 pgjet-bench-a\n' "$LAB_ID" >"/etc/netns/$NB/hosts"
        [ -f "$BENCH/a/pg-main/data/PG_VERSION" ] && measure_dataset main
        [ -f "$BENCH/a/pg-small/data/PG_VERSION" ] && measure_dataset small
        [ -f "$BENCH/a/pg-pgb/data/PG_VERSION" ] && measure_dataset pgb
    else
        make_pki
        write_pgbr_conf
        case " $PARTS " in *" main "*|*" sweep "*|*" delta "*|*" incr "*|*" sources "*) build_cluster main ;;
            *) case " $STREAM_DATASETS " in *" main "*) build_cluster main ;; esac ;; esac
        case " $PARTS " in *" small "*) [ "$SMALL_TABLES" -gt 0 ] && build_cluster small ;; esac
        case " $PARTS " in *" stream "*) case " $STREAM_DATASETS " in *" pgb "*) build_cluster pgb ;; esac ;; esac
    fi

    # both tools' stanzas, from B (pgBackRest's over TLS; needs a lab: the first link of
    # the run), before anything makes WAL the primary archives into them
    local first ds
    first=$(echo "$LINKS" | awk '{print $1}')
    [ " $PARTS " = " stream " ] && first=$(echo "$STREAM_LINKS" | awk '{print $1}')
    [ " $PARTS " = " sources " ] && first=$SOURCES_LINK
    CUR_LINK_TAG=setup
    mkdir -p "$PGJET_REPO"; chown postgres: "$PGJET_REPO"
    for ds in main small pgb; do
        [ -f "$BENCH/a/pg-$ds/data/PG_VERSION" ] || continue
        lab_up "$first" "$ds"
        pgjet_stanza || die "pgjet stanza-create of $ds failed"
        if [ "$SKIP_PGBACKREST" != 1 ] && [ "$REUSE" != 1 ]; then
            eval "$(pgbr_b --stanza="$ds" stanza-create)" && eval "$(pgbr_b --stanza="$ds" check)" \
                || die "pgBackRest stanza-create/check of $ds failed (logs in $BENCH/b/pgbr-log, $BENCH/a/pgbr-log)"
            say "pgBackRest stanza $ds created and checked over TLS"
        fi
        say "pgjet stanza $ds in $PGJET_REPO"
    done

    case " $PARTS " in *" main "*) part_main main "$LINKS" "$RUNS" ;; esac
    case " $PARTS " in *" delta "*) part_delta ;; esac
    case " $PARTS " in *" incr "*) part_incr ;; esac
    case " $PARTS " in *" sweep "*) part_sweep ;; esac
    case " $PARTS " in *" stream "*) part_stream ;; esac
    case " $PARTS " in *" sources "*) part_sources ;; esac
    if [ -f "$BENCH/a/pg-small/data/PG_VERSION" ]; then
        case " $PARTS " in *" small "*) part_main small "$SMALL_LINKS" "$SMALL_RUNS" ;; esac
    fi
    loadavg >"$RES/load-end.txt"

    header "Report"
    stop_pgbr_server
    pg_stop_cluster "$BENCH/a/pg-$CUR_DS"
    write_report
    say "report written to $REPORT"
}

write_report() {
    local pgjet_commit
    pgjet_commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    LOGICAL_PGB=${LOGICAL[pgb]:-0} REPLICA_JOBS=$REPLICA_JOBS DELTA_PCT=$DELTA_PCT SKIP_PGBACKREST=$SKIP_PGBACKREST \
        SOURCES_PGBR_COMPRESS=$SOURCES_PGBR_COMPRESS SOURCES_PGBR_JOBS=$SOURCES_PGBR_JOBS python3 - "$RES" "$REPORT" \
        "SCALE=$SCALE RANDOM_MB=$RANDOM_MB SMALL_TABLES=$SMALL_TABLES RUNS=$RUNS SMALL_RUNS=$SMALL_RUNS SWEEP_RUNS=$SWEEP_RUNS LINKS='$LINKS' JOBS_LIST='$JOBS_LIST' REPLICA_JOBS=$REPLICA_JOBS DELTA_PCT=$DELTA_PCT PARTS='$PARTS' STREAM_SCALE=$STREAM_SCALE STREAM_LINKS='$STREAM_LINKS' STREAM_RUNS=$STREAM_RUNS$(case " $PARTS " in *" sources "*) echo " SOURCES_LINK=$SOURCES_LINK SOURCES_RUNS=$SOURCES_RUNS SOURCES_WAL_MB=$SOURCES_WAL_MB SOURCES_PGBR_COMPRESS=$SOURCES_PGBR_COMPRESS SOURCES_PGBR_JOBS=$SOURCES_PGBR_JOBS" ;; esac)" \
        "$PGJET_VERSION (commit $pgjet_commit)" "$DROP_CACHES" "${LOGICAL[main]:-0}" "${LOGICAL[small]:-0}" \
        "$(cat "$RES/files-main.txt" 2>/dev/null) $(cat "$RES/files-small.txt" 2>/dev/null)" \
        "$(nproc); $(awk '/model name/ {sub(/.*: /, ""); print; exit}' /proc/cpuinfo); $(uname -r); $("$PGBIN/postgres" --version); $(pgbackrest version); congestion control $(cat /proc/sys/net/ipv4/tcp_congestion_control)" \
        "$(cat "$RES/load-start.txt") → $(cat "$RES/load-end.txt")" <<'PYEOF'
import sys, csv, statistics, json, os, glob, datetime
res, report, settings, pgjet, drop, log_main, log_small, nfiles, machine, load_all = sys.argv[1:11]
LOGICAL = {"main": int(log_main), "small": int(log_small), "pgb": int(os.environ.get("LOGICAL_PGB", "0") or 0)}
NFILES = dict(zip(("main", "small"), (nfiles.split() + ["?", "?"])[:2]))
NFILES["pgb"] = open(os.path.join(res, "files-pgb.txt")).read().strip() if os.path.exists(os.path.join(res, "files-pgb.txt")) else "?"
rows = []
for r in csv.reader(open(os.path.join(res, "runs.tsv")), delimiter="\t"):
    if len(r) < 13: continue
    ds, link, name, run, sec, rss, bcpu, rx, tx, acpu, hwm, anon, ok = r[:13]
    mcpu = float(r[14]) if len(r) > 14 and r[14] else None
    steady = float(r[15]) if len(r) > 15 and r[15] else None
    pcpu = float(r[16]) if len(r) > 16 and r[16] else None
    rows.append(dict(ds=ds, link=link, name=name, run=int(run), ok=ok == "ok", mcpu=mcpu, steady=steady, pcpu=pcpu,
                     sec=float(sec) if ok == "ok" else None, rss=int(rss or 0) if ok == "ok" else 0,
                     bcpu=float(bcpu or 0), rx=int(rx), tx=int(tx), acpu=float(acpu),
                     hwm=int(hwm), anon=int(anon)))
load = dict(csv.reader(open(os.path.join(res, "load.tsv")), delimiter="\t")) if os.path.exists(os.path.join(res, "load.tsv")) else {}
iperf = {}
for r in csv.reader(open(os.path.join(res, "iperf.tsv")), delimiter="\t"):
    if len(r) == 3 and r[2] not in ("", "null"): iperf[(r[0], r[1])] = float(r[2])
MiB = 1048576.0
def rate_bytes(link):
    if link == "unshaped": return None
    r = link.split("/")[0].lower()
    for u, m in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if r.endswith(u): return float(r[:-len(u)]) * m / 8
    return None
def label(link):
    if link == "unshaped": return "unshaped veth (no shaping, no delay)"
    r, t = link.split("/")
    return f"{r.replace('gbit',' Gbit/s').replace('mbit',' Mbit/s')}, {t} ms RTT"
def sel(ds, link, name):
    return [x for x in rows if x["ds"] == ds and x["link"] == link and x["name"] == name]
def med(xs): return statistics.median(xs) if xs else None
def stat(ds, link, name):
    xs = [x for x in sel(ds, link, name) if x["ok"]]
    n_fail = len(sel(ds, link, name)) - len(xs)
    if not xs: return dict(n=0, fail=n_fail)
    s = sorted(x["sec"] for x in xs)
    return dict(n=len(xs), fail=n_fail, sec=med(s), lo=s[0], hi=s[-1],
                rx=med([x["rx"] for x in xs]), tx=med([x["tx"] for x in xs]),
                wire=med([x["rx"] / x["sec"] for x in xs]),
                bcpu=med([x["bcpu"] for x in xs]), acpu=med([x["acpu"] for x in xs]),
                mcpu=med([x["mcpu"] for x in xs if x["mcpu"] is not None]),
                steady=med([x["steady"] for x in xs if x["steady"] is not None]),
                pcpu=med([x["pcpu"] for x in xs if x["pcpu"] is not None]),
                rss=max(x["rss"] for x in xs), hwm=max(x["hwm"] for x in xs), anon=max(x["anon"] for x in xs))
DESCR = {
    "local_tar_copy": "local `tar -c \\| tar -x` + sync, no network (plain-copy reference)",
    "raw_tar_tcp": "`tar -c` in A → plain TCP (python, no TLS) → `tar -x` in B (raw reference)",
    "pg_basebackup_R": "`pg_basebackup -Fp -Xstream -R -c fast`, TLS verify-full",
    "pgjet_replica_j4": "`pgjet replica-create --transport libpq --jobs 4`",
}
def descr(n):
    if n.startswith("base_"): return "base build: " + descr(n[5:])
    if n.startswith("s_"):
        m = n[2:]
        if m == "raw_tar_tcp": return DESCR["raw_tar_tcp"]
        if m == "raw_tar_zstd1_tcp": return "`tar -c \\| zstd -1` in A → plain TCP → `zstd -d \\| tar -x` in B (raw compressed reference)"
        if m.startswith("pgjet_replica_"):
            v = m[len("pgjet_replica_"):]
            return {"libpq": f"`pgjet replica-create --transport libpq --jobs {os.environ.get('REPLICA_JOBS', '4')}`",
                    "auto": "`pgjet replica-create --transport auto`"}.get(v, f"`pgjet replica-create --transport basebackup --network-compress {v[3:]}`")
        if m.startswith("pgbb_"):
            v = m[5:]
            return "`pg_basebackup -Fp -Xstream -R -c fast`" + {"none": "", "lz4": " `--compress=server-lz4`", "zstd_w2": " `--compress=server-zstd:workers=2`"}.get(v, v)
        if m.startswith("pgbackrest_"): return descr(m)
        if m.startswith("pgjet_backup_"):
            v, j = m[len("pgjet_backup_"):].rsplit("_j", 1)
            t = {"bb": "basebackup --network-compress zstd", "bb_lz4": "basebackup --network-compress lz4", "libpq": "libpq", "auto": "auto"}.get(v, v)
            return f"`pgjet backup --transport {t} --jobs {j} --compress-type lz4`"
    if n in DESCR: return DESCR[n]
    if n.startswith("pgjet_replica_j"): return f"`pgjet replica-create --transport libpq --jobs {n.split('_j')[1]}`"
    if n.startswith("pgbackrest_"):
        _, ct, p = n.split("_"); return f"`pgbackrest backup` TLS server on A, compress-type={ct}, process-max={p[1:]}"
    if n.startswith("pgjet_backup_"):
        _, _, ct, j = n.split("_"); return f"`pgjet backup` from B, --compress-type {ct}, --jobs {j[1:]}"
    if n.startswith("sweep_replica_j"): return f"`pgjet replica-create --jobs {n.split('_j')[1]}`"
    return n
def f(x, d=1):
    return "–" if x is None else f"{x:.{d}f}"
out = []
P = out.append
P("# pgjet across hosts: replica creation and backup over the network lab")
P("")
P(f"Written by `bench/remote.sh` on {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC. "
  f"Page cache {'dropped before every timed run' if drop == 'yes' else 'NOT dropped (COLD=0, or drop_caches not permitted)'}; "
  "every command ends with `sync` inside the timing.")
P("")
P(f"- machine: {machine}")
P(f"- pgjet: {pgjet}")
P(f"- settings: {settings}")
P(f"- load average (1/5/15 min) at start → end of the whole run: {load_all}")
P("- both \"hosts\" are network namespaces of one VM: they share its 2 cores, its disk and its page cache.")
P("")
def main_table(ds, title, stream=False):
    keep = (lambda n: n.startswith("s_")) if stream else (lambda n: not n.startswith(("sweep_", "delta", "s_", "incr_", "src_", "reinit_")))
    links = []
    for x in rows:
        if x["ds"] == ds and keep(x["name"]) and x["link"] not in links: links.append(x["link"])
    if not links: return
    P(f"## {title}")
    P("")
    P(f"Logical bytes (what a backup copies: PGDATA without pg_wal segments): {LOGICAL[ds]/MiB:.0f} MiB in {NFILES[ds]} files. "
      "Medians (min–max) of the runs. *wire*: bytes received on B's `lab0` (frames, headers included) / wall time; "
      "*steady wire*: the same between 25 % and 75 % of the run's duration (sampled every 0.2 s; runs before this column existed show –); "
      "*machine CPU*: busy share of both cores during the run, everything on the VM included; "
      "*B CPU*: CPU time of the command on B (cpuacct cgroup); *A CPU*: CPU time of everything on A — postmaster and all "
      "its processes, the pgBackRest TLS server and its workers, the raw sender (cpuacct cgroup); *RSS B*: the largest process on B (GNU time); "
      "*A peak*: the largest VmHWM / RssAnon among the processes that appeared on A during the run (backends, walsenders, "
      "pgBackRest workers; sampled every 0.2 s; "
      "VmHWM includes the shared-buffer pages a backend touched).")
    P("")
    for link in links:
        names = []
        for x in rows:
            if x["ds"] == ds and x["link"] == link and x["name"] not in names and keep(x["name"]): names.append(x["name"])
        lr = rate_bytes(link)
        ip = iperf.get((ds, link))
        P(f"### {label(link)}")
        P("")
        extra = []
        if lr: extra.append(f"line rate {lr/MiB:.1f} MiB/s")
        if ip: extra.append(f"iperf3 1 stream A→B {ip/8/MiB:.1f} MiB/s goodput")
        lk = [v for k, v in load.items() if k.startswith(ds + " @") and label_short(link) in k]
        if lk: extra.append(f"load average before → after: {lk[0]}")
        if extra: P("; ".join(extra) + ".")
        P("")
        P("| command | runs | median s | min–max s | logical MiB/s | wire MiB/s | steady wire MiB/s | rx MiB | B CPU s | A CPU s | machine CPU % | RSS B MiB | A peak HWM/anon MiB |")
        P("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n in names:
            s = stat(ds, link, n)
            if s["n"] == 0:
                P(f"| {descr(n)} | 0 ({s['fail']} failed) | FAILED | | | | | | | | | | |"); continue
            fl = f" ({s['fail']} failed)" if s["fail"] else ""
            P(f"| {descr(n)} | {s['n']}{fl} | {s['sec']:.2f} | {s['lo']:.2f}–{s['hi']:.2f} | {LOGICAL[ds]/MiB/s['sec']:.1f} | "
              f"{s['wire']/MiB:.1f} | {f(s['steady'] / MiB if s['steady'] else None)} | {s['rx']/MiB:.0f} | {s['bcpu']:.1f} | {s['acpu']:.1f} | {f(s['mcpu'], 0)} | {s['rss']/1024:.0f} | "
              f"{s['hwm']/1024:.0f} / {s['anon']/1024:.0f} |")
        P("")
def label_short(link):
    if "/" not in link: return link
    return f"{link.split('/')[0]}, {link.split('/')[1]} ms RTT"
main_table("main", "Main dataset: pgbench + incompressible bytes")
# the base build, when one was timed alongside (PGJET_BASE)
ab = sorted({(x["ds"], x["link"], x["name"][5:]) for x in rows if x["name"].startswith("base_")})
if ab:
    P("## Against the base build (same run, alternating; ratio above 1 = this build faster)")
    P("")
    P("| dataset | link | command | base median s (min–max) | this build median s (min–max) | ratio base/this |")
    P("|---|---|---|---:|---:|---:|")
    for ds, link, n in ab:
        a, b = stat(ds, link, "base_" + n), stat(ds, link, n)
        if not a.get("sec") or not b.get("sec"): continue
        P(f"| {ds} | {label_short(link)} | {descr(n)} | {a['sec']:.2f} ({a['lo']:.2f}–{a['hi']:.2f}) | "
          f"{b['sec']:.2f} ({b['lo']:.2f}–{b['hi']:.2f}) | {a['sec'] / b['sec']:.2f}× |")
    P("")
# targets
P("## Targets")
P("")
P("Ratios are peer median time / pgjet median time (above 1 = pgjet faster); *wire* is B's lab0 rx over the whole run.")
P("")
P("| link | target | measured | met? |")
P("|---|---|---:|:---:|")
def ratio(ds, link, a, b):
    sa, sb = stat(ds, link, a), stat(ds, link, b)
    if sa.get("sec") and sb.get("sec"): return sa["sec"] / sb["sec"]
    return None
def tgt(link, text, val, thr, fmt="{:.2f}×", ge=True, ds="main"):
    if val is None: P(f"| {label_short(link)} | {text} | n/a | – |"); return
    ok = val >= thr if ge else val <= thr
    P(f"| {label_short(link)} | {text} | {fmt.format(val)} | {'yes' if ok else '**no**'} |")
links_main = []
for x in rows:
    if x["ds"] == "main" and not x["name"].startswith(("sweep_", "delta", "s_", "incr_", "src_", "reinit_")) and x["link"] not in links_main: links_main.append(x["link"])
rep = [n for n in dict.fromkeys(x["name"] for x in rows if x["name"].startswith("pgjet_replica_j"))]
repn = rep[0] if rep else "pgjet_replica_j4"
jobs = sorted({n.split("_p")[-1] for n in (x["name"] for x in rows) if n.startswith("pgbackrest_")}, key=int)
for link in links_main:
    tgt(link, "replica-create ≥ 1.0× pg_basebackup -R", ratio("main", link, "pg_basebackup_R", repn), 1.0)
    if link == "unshaped":
        tgt(link, "replica-create ≥ 0.9× local plain copy", ratio("main", link, "local_tar_copy", repn), 0.9)
    else:
        s = stat("main", link, repn); lr = rate_bytes(link)
        if s.get("wire") and lr: tgt(link, "replica-create on-wire ≥ 90 % of line rate", 100 * s["wire"] / lr, 90, "{:.1f} %")
        for j in jobs:
            tgt(link, f"backup none ≥ 1.5× pgBackRest none, {j} workers", ratio("main", link, f"pgbackrest_none_p{j}", f"pgjet_backup_none_j{j}"), 1.5)
            tgt(link, f"backup zstd vs pgBackRest lz4, {j} workers (≥ 1.5×)", ratio("main", link, f"pgbackrest_lz4_p{j}", f"pgjet_backup_zstd_j{j}"), 1.5)
for link in dict.fromkeys(x["link"] for x in rows if x["ds"] == "small"):
    for j in jobs:
        tgt(link, f"20k small tables: backup none ≥ 3× pgBackRest none, {j} workers", ratio("small", link, f"pgbackrest_none_p{j}", f"pgjet_backup_none_j{j}"), 3.0)
    tgt(link, "20k small tables: replica-create vs pg_basebackup -R", ratio("small", link, "pg_basebackup_R", repn), 1.0)
pg_rss = [x["rss"] for x in rows if x["ok"] and x["name"].startswith(("pgjet_", "sweep_", "delta", "incr_"))]
a_hwm = [x["hwm"] for x in rows if x["ok"] and x["name"].startswith(("pgjet_", "sweep_", "delta", "incr_"))]
if pg_rss: tgt("all", "pgjet peak RSS on B < 200 MiB", max(pg_rss) / 1024, 200, "{:.0f} MiB", ge=False)
if a_hwm: tgt("all", "peak VmHWM of a backend on A serving pgjet < 200 MiB", max(a_hwm) / 1024, 200, "{:.0f} MiB", ge=False)
P("")
# delta
dl = [x for x in rows if x["name"].startswith("delta")]
if dl:
    link = dl[0]["link"]
    P(f"## Delta (`replica-create --delta`) on {label(link)}")
    P("")
    ch = list(csv.reader(open(os.path.join(res, "delta-changes.tsv")), delimiter="\t"))
    full = [x for x in dl if x["name"] in ("delta_base_full", "delta_full_again") and x["ok"]]
    fs = med([x["sec"] for x in full]); frx = med([x["rx"] for x in full])
    P(f"Before each delta run, one row was updated on about {ch[0][3] if ch else '?'} × {sel and ''}"
      f"{os.environ.get('DELTA_PCT','1')} % of `pgbench_accounts`' heap pages (random pages, by ctid), then CHECKPOINT "
      "(autovacuum off). Full replica-create on the same link for comparison: "
      + ', '.join('%.2f s / %.0f MiB rx' % (x['sec'], x['rx'] / MiB) for x in full) + ".")
    P("")
    P("| range KiB | rows (pages) updated | wall s | rx MiB | rx / full | full time / delta time | copied / unchanged MiB (pgjet summary) | B CPU s | A CPU s | RSS B MiB |")
    P("|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for x in dl:
        if not x["name"].startswith("delta_r"): continue
        kib = x["name"][7:-1]
        n = next((c[2] for c in ch if c[0] == kib and c[1] == str(x["run"])), "?")
        summ = ""
        try:
            t = open(os.path.join(res, f"{x['name']}.run{x['run']}.json")).read()
            j = json.loads(t[t.index("\n{") + 1:])
            keys = {k: v for k, v in j.items() if isinstance(v, (int, float))}
            cp = next((keys[k] for k in keys if "copied" in k), None); un = next((keys[k] for k in keys if "same" in k), None)
            if cp is not None: summ = f"{cp/MiB:.0f} / {(un or 0)/MiB:.0f}"
        except Exception:
            pass
        if not x["ok"]:
            P(f"| {kib} | {n} | FAILED | | | | | | | |"); continue
        P(f"| {kib} | {n} | {x['sec']:.2f} | {x['rx']/MiB:.1f} | {100*x['rx']/frx:.1f} % | {fs/x['sec']:.2f}× | {summ} | {x['bcpu']:.1f} | {x['acpu']:.1f} | {x['rss']/1024:.0f} |")
    P("")
# incremental backups over libpq
il = [x for x in rows if x["name"].startswith("incr_")]
if il:
    link = il[0]["link"]
    P(f"## Incremental backup over libpq on {label(link)}")
    P("")
    full = [x for x in il if x["name"] == "incr_base_full" and x["ok"]]
    frx = med([x["rx"] for x in full]) if full else 0
    try:
        ch = list(csv.reader(open(os.path.join(res, "incr-changes.tsv")), delimiter="\t"))
    except OSError:
        ch = []
    P("A full backup over libpq (`--transport libpq --compress-type zstd`) into a fresh stanza, then, "
      f"before each incremental, one row updated on {os.environ.get('DELTA_PCT', '1')} % of `pgbench_accounts`' "
      "heap pages (random pages), CHECKPOINT; each `backup --type incr` against the backup before it. "
      "rx: bytes received on B (the pgjet host) during the command.")
    P("")
    P("| backup | rows (pages) updated | wall s | rx MiB | rx / full | B CPU s | A CPU s | RSS B MiB |")
    P("|---|---:|---:|---:|---:|---:|---:|---:|")
    worst = None
    for x in il:
        n = "" if x["name"] == "incr_base_full" else next((c[1] for c in ch if c[0] == str(x["run"])), "?")
        if not x["ok"]:
            P(f"| {x['name']} run {x['run']} | {n} | FAILED | | | | | |"); continue
        share = f"{100 * x['rx'] / frx:.1f} %" if frx else ""
        if x["name"] == "incr_libpq" and frx:
            worst = max(worst or 0, x["rx"] / frx)
        P(f"| {x['name']} run {x['run']} | {n} | {x['sec']:.2f} | {x['rx']/MiB:.1f} | {share} | {x['bcpu']:.1f} | {x['acpu']:.1f} | {x['rss']/1024:.0f} |")
    P("")
    if worst is not None:
        P(f"Target (issue 19): an incr over libpq at 1 Gbit/s, 20 ms moves at most 5 % of the full's bytes: "
          f"{100 * worst:.1f} % at most: {'MET' if worst <= 0.05 else 'NOT MET'}.")
    else:
        P("Target (issue 19): an incr over libpq moves at most 5 % of the full's bytes: FAILED (no incr measured).")
    P("")
# sweep
sw = [x for x in rows if x["name"].startswith("sweep_")]
if sw:
    P("## Connections sweep (`replica-create --jobs N`, main dataset)")
    P("")
    P("| link | jobs | wall s (median) | logical MiB/s | wire MiB/s | % of line rate | steady wire MiB/s | B CPU s | A CPU s | machine CPU % | RSS B MiB |")
    P("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for link in dict.fromkeys(x["link"] for x in sw):
        for n in dict.fromkeys(x["name"] for x in sw if x["link"] == link):
            s = stat("main", link, n); lr = rate_bytes(link)
            if not s.get("sec"): P(f"| {label_short(link)} | {n.split('_j')[1]} | FAILED | | | | | | | | |"); continue
            P(f"| {label_short(link)} | {n.split('_j')[1]} | {s['sec']:.2f} | {LOGICAL['main']/MiB/s['sec']:.1f} | {s['wire']/MiB:.1f} | "
              f"{100*s['wire']/lr:.1f} % | {f(s['steady'] / MiB if s['steady'] else None)} | {s['bcpu']:.1f} | {s['acpu']:.1f} | {f(s['mcpu'], 0)} | {s['rss']/1024:.0f} |" if lr else "")
    P("")
main_table("small", "Small-file dataset")
# the stream part: compression at the source (issue 18)
sdl = [d for d in ("pgb", "main") if any(x["ds"] == d and x["name"].startswith("s_") for x in rows)]
if sdl:
    P("## Compression at the source: the BASE_BACKUP stream against the ranges and the peers")
    P("")
    P("pgjet's transports (`libpq` ranges, `basebackup` stream, `auto`), pg_basebackup with server-side compression "
      "(plain format, decompressed on B) and pgBackRest (TLS server on A, lz4), with the raw references: the same tar "
      "over plain TCP, and with `zstd -1` on A (the machine's limit for a compressed copy of the same bytes). "
      "pgjet's backups store lz4 in the repository, as pgBackRest does.")
    sm = int(os.environ.get("STREAM_SLOW_MBIT", "0") or 0)
    if sm:
        P("")
        P(f"Links of {sm} Mbit/s or less skip the uncompressed runs (the raw tar, `--transport libpq`, pg_basebackup "
          "without compression): each takes the logical bytes over the line rate.")
    P("")
    for d in sdl:
        main_table(d, {"pgb": "Stream part, pgbench only (compressible)", "main": "Stream part, mixed dataset (pgbench + incompressible bytes)"}[d], stream=True)
    P("### Targets of the stream part")
    P("")
    P("| dataset | link | target | measured | met? |")
    P("|---|---|---|---:|:---:|")
    def t2(ds, link, text, val, thr, fmt="{:.2f}×", ge=True):
        if val is None: P(f"| {ds} | {label_short(link)} | {text} | n/a | – |"); return
        ok = val >= thr if ge else val <= thr
        P(f"| {ds} | {label_short(link)} | {text} | {fmt.format(val)} | {'yes' if ok else '**no**'} |")
    def best(ds, link, names):
        got = [(stat(ds, link, n)["sec"], n) for n in names if stat(ds, link, n).get("sec")]
        return min(got) if got else (None, None)
    sj = sorted({x["name"].rsplit("_p", 1)[1] for x in rows if x["name"].startswith("s_pgbackrest_")}, key=int)
    for d in sdl:
        for link in dict.fromkeys(x["link"] for x in rows if x["ds"] == d and x["name"].startswith("s_")):
            auto = stat(d, link, "s_pgjet_replica_auto")
            forced = [n for n in ("s_pgjet_replica_libpq", "s_pgjet_replica_bb_zstd", "s_pgjet_replica_bb_lz4")]
            bf, bfn = best(d, link, forced)
            bp, bpn = best(d, link, ["s_pgbb_none", "s_pgbb_lz4", "s_pgbb_zstd_w2"])
            rep_t = auto.get("sec") or bf
            if d == "pgb" and link.startswith("100mbit"):
                lz = stat(d, link, "s_pgbb_lz4").get("sec")
                t2(d, link, "replica-create ≥ 1.3× pg_basebackup server-lz4", lz / rep_t if lz and rep_t else None, 1.3)
                for j in sj:
                    pb = stat(d, link, f"s_pgbackrest_lz4_p{j}").get("sec")
                    bk = stat(d, link, f"s_pgjet_backup_auto_j{j}").get("sec") or best(d, link, [f"s_pgjet_backup_bb_j{j}", f"s_pgjet_backup_libpq_j{j}"])[0]
                    t2(d, link, f"backup ≥ 1.5× pgBackRest lz4, {j} processes", pb / bk if pb and bk else None, 1.5)
                    t2(d, link, f"backup ≥ 1.3× pg_basebackup server-lz4, --jobs {j}", lz / bk if lz and bk else None, 1.3)
                    t2(d, link, f"replica-create ≥ 1.5× pgBackRest lz4, {j} processes", pb / rep_t if pb and rep_t else None, 1.5)
            if auto.get("sec") and bf:
                t2(d, link, f"replica-create auto within 10 % of the best forced ({descr(bfn).strip('`')})", auto["sec"] / bf, 1.10, "{:.2f}", ge=False)
            if rep_t and bp:
                t2(d, link, f"replica-create never behind pg_basebackup's best ({bpn[2:]})", bp / rep_t, 1.0)
            for j in sorted({x["name"].rsplit("_j", 1)[1] for x in rows if x["name"].startswith("s_pgjet_backup_")}):
                a = stat(d, link, f"s_pgjet_backup_auto_j{j}").get("sec")
                b, bn = best(d, link, [f"s_pgjet_backup_bb_j{j}", f"s_pgjet_backup_bb_lz4_j{j}", f"s_pgjet_backup_libpq_j{j}"])
                if a and b: t2(d, link, f"backup auto within 10 % of the best forced, --jobs {j}", a / b, 1.10, "{:.2f}", ge=False)
    srss = [x["rss"] for x in rows if x["ok"] and x["name"].startswith("s_pgjet_")]
    if srss: t2("all", "all", "pgjet peak RSS on B < 200 MiB (stream part)", max(srss) / 1024, 200, "{:.0f} MiB", ge=False)
    P("")
# the sources part: where a new standby comes from, and the re-sync of a replica
srs = [x for x in rows if x["name"].startswith(("src_", "reinit_"))]
if srs:
    sds, slink = srs[0]["ds"], srs[0]["link"]
    def rd(name):
        try: return list(csv.reader(open(os.path.join(res, name)), delimiter="\t"))
        except OSError: return []
    sf = {r[0]: r[1] for r in rd("sources-facts.tsv") if len(r) == 2}
    def fmib(k): return f"{int(sf[k]) / MiB:.0f}" if sf.get(k, "").isdigit() else "?"
    pct = os.environ.get("DELTA_PCT", "1")
    brc, brj = os.environ.get("SOURCES_PGBR_COMPRESS", "lz4"), os.environ.get("SOURCES_PGBR_JOBS", "2")
    SD = {
        "src_primary": "`pgjet replica-create` from the primary (`--transport auto`)",
        "src_pgbb_primary": "`pg_basebackup -Fp -Xstream -R -c fast` from the primary",
        "src_standby": "`pgjet replica-create --source <standby>` (`--transport auto`: the standby's `BASE_BACKUP` stream)",
        "src_pgbb_standby": "`pg_basebackup -Fp -Xstream -R -c fast` from the standby",
        "src_primary_start": "`pgjet replica-create --seed source --start` from the primary",
        "src_s3_seed": "`pgjet replica-create --seed repo --source <primary> --start`: S3 backup + archived WAL, then streaming",
        "src_auto": "`pgjet replica-create --seed auto --source <primary> --start`",
        "reinit_pgjet": "`pgjet replica-create --delta` over the kept replica (`--transport auto`)",
        "reinit_pg_basebackup": "`pg_basebackup -Fp -Xstream -R -c fast` into an empty dir (Patroni's default)",
        "reinit_pgbackrest_delta": f"`pgbackrest --delta restore` of the newest backup into the kept replica (process-max {brj})",
    }
    JOBS = [
        ("new replica from the primary", ["src_primary", "src_pgbb_primary"], {"src_primary": ["src_pgbb_primary"]}),
        ("new replica from a standby on host A", ["src_standby", "src_pgbb_standby"], {"src_standby": ["src_pgbb_standby"]}),
        ("new standby, started until it streams", ["src_primary_start", "src_s3_seed", "src_auto"], {}),
        (f"re-sync of a replica that missed {pct} % of the pages", ["reinit_pgjet", "reinit_pg_basebackup", "reinit_pgbackrest_delta"],
         {"reinit_pgjet": ["reinit_pg_basebackup", "reinit_pgbackrest_delta"]}),
    ]
    def best_of(names):
        got = [(stat(sds, slink, n)["sec"], n) for n in names if stat(sds, slink, n).get("sec")]
        return min(got) if got else (None, None)
    P(f"## Where a new standby comes from, and re-syncing one (`PARTS=sources`), {label(slink)}")
    P("")
    ip = iperf.get((sds, slink))
    P(f"The main dataset ({fmib('logical_start')} MiB without pg_wal at the part's start"
      + (f"; iperf3 1 stream A→B {ip/8/MiB:.1f} MiB/s" if ip else "") + "). "
      "A standby of the primary runs on host A (a second PostgreSQL, `pg_basebackup -R` of the primary, streaming "
      "through its socket, its own port). For the S3 seed, versitygw (plain HTTP, `--keep-alive`) runs in host A's "
      "namespace and B reaches it through the lab's wire: a pgjet stanza and a full backup on it (untimed, run on A), "
      f"then {fmib('wal_bytes')} MiB of pgbench WAL archived into it by the primary's `archive_command` "
      f"(`pgjet archive-push`, synchronous), {fmib('s3_stored_bytes')} MiB stored on the server in all; the dataset was "
      f"{fmib('logical_after_wal')} MiB after it. The `--start` rows are timed until the new standby streams from the "
      "primary, i.e. for the seed after it replayed the archived WAL (`restore_command` = `pgjet archive-get`, one "
      "segment per call). *primary CPU*: the primary's postmaster and all its processes alone (a cpuacct cgroup of "
      "their own); *A CPU*: everything on host A (the primary, the standby, versitygw, pgBackRest's TLS server). "
      "*best peer / this*: the best peer's median over this row's (above 1: pgjet faster).")
    P("")
    P("| job | command | runs | median s | min–max s | rx MiB | wire MiB/s | B CPU s | A CPU s | primary CPU s | best peer / this |")
    P("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for job, names, peers in JOBS:
        for n in names:
            if not sel(sds, slink, n): continue
            s = stat(sds, slink, n)
            if s["n"] == 0:
                P(f"| {job} | {SD[n]} | 0 ({s['fail']} failed) | FAILED | | | | | | | |"); continue
            fl = f" ({s['fail']} failed)" if s["fail"] else ""
            rt = "–"
            if n in peers:
                bp, bn = best_of(peers[n])
                if bp: rt = f"{bp / s['sec']:.2f}× ({bn})"
            P(f"| {job} | {SD[n]} | {s['n']}{fl} | {s['sec']:.2f} | {s['lo']:.2f}–{s['hi']:.2f} | {s['rx']/MiB:.0f} | "
              f"{s['wire']/MiB:.1f} | {s['bcpu']:.1f} | {s['acpu']:.1f} | {f(s['pcpu'], 2)} | {rt} |")
    P("")
    P("| target | measured | met? |")
    P("|---|---:|:---:|")
    def t3(text, val, thr, fmt="{:.2f}×", ge=True, shown=None):
        if val is None: P(f"| {text} | n/a | – |"); return
        ok = val >= thr if ge else val <= thr
        P(f"| {text} | {shown or fmt.format(val)} | {'yes' if ok else '**no**'} |")
    def sec(n): return stat(sds, slink, n).get("sec")
    def rt2(a, b): return a / b if a and b else None
    t3("re-sync ≥ 5× pg_basebackup (Patroni's default)", rt2(sec("reinit_pg_basebackup"), sec("reinit_pgjet")), 5.0)
    bp, bn = best_of(["reinit_pg_basebackup", "reinit_pgbackrest_delta"])
    t3(f"re-sync ≥ 1.0× the best peer ({bn})", rt2(bp, sec("reinit_pgjet")), 1.0)
    t3("replica from the primary ≥ 1.0× pg_basebackup", rt2(sec("src_pgbb_primary"), sec("src_primary")), 1.0)
    t3("replica from a standby ≥ 1.0× pg_basebackup from the standby", rt2(sec("src_pgbb_standby"), sec("src_standby")), 1.0)
    ps, pp = stat(sds, slink, "src_standby").get("pcpu"), stat(sds, slink, "src_primary").get("pcpu")
    if ps is not None and pp is not None:
        t3("primary CPU during the copy from the standby ~0 (≤ 5 % of the copy from the primary's)", ps, max(0.05 * pp, 0.01),
           ge=False, shown=f"{ps:.2f} s (from the primary: {pp:.2f} s)")
    else:
        t3("primary CPU during the copy from the standby ~0", None, 0)
    bs, bsn = best_of(["src_primary_start", "src_s3_seed"])
    t3(f"seed auto within 10 % of the best of the two ({bsn})", rt2(sec("src_auto"), bs), 1.10, "{:.2f}", ge=False)
    P("")
    P("No peer was timed for the seed from S3 (pgBackRest's S3 client needs HTTPS): the S3 seed and the copy from the "
      "primary, both with `--start`, are the two ways to the same standby, and `--seed auto` is judged against the faster.")
    P("")
    auto = [l.rstrip("\n") for l in open(os.path.join(res, "sources-seed-auto.txt"))] if os.path.exists(os.path.join(res, "sources-seed-auto.txt")) else []
    if auto:
        P("`--seed auto`'s figures and choice, from its log:")
        P("")
        P("```")
        for l in auto: P(l)
        P("```")
        P("")
    ch = rd("sources-changes.tsv")
    P(f"The re-sync: a pgjet replica kept on B; before each run it was started until it streamed and stopped, then one "
      f"row was updated on {pct} % of `pgbench_accounts`' heap pages (random pages, by ctid; rows per run: "
      + ", ".join(f"{c[1]} of {c[2]} pages" for c in ch if len(c) == 3) + "), CHECKPOINT. "
      "pgjet re-syncs it with `--delta` (only ranges whose hashes differ cross the wire); pg_basebackup copies "
      "everything into an empty directory (Patroni's `reinit` without a `create_replica_methods` entry). "
      + ("" if os.environ.get("SKIP_PGBACKREST") == "1" else
         "pgBackRest, as Patroni's documentation sets it up (`create_replica_methods: [pgbackrest]`, `keep_data`, "
         "`command: pgbackrest --stanza=... --delta restore`), restores its newest backup — an incremental taken "
         f"(untimed) after the pages changed, on a full taken before the first run, `compress-type={brc}`, "
         f"process-max {brj} — over a second kept copy (the directory of the run before's restore, which missed "
         "the same pages): it checksums every file and copies the files that differ, whole, from its repository, "
         "which is on B's disk (no network: bytes on the wire ~0). It then leaves a restored **backup**: the standby "
         "must still replay the WAL from that backup's start (through `archive-get`) before it streams, which is "
         "not timed here, while pgjet's and pg_basebackup's copies need only the WAL of their own copy.")
      )
    P("")
P("## Machine load per phase (1/5/15-minute load average, before → after)")
P("")
for k, v in load.items(): P(f"- {k}: {v}")
P("")
P(f"Raw rows: `{os.path.join(res, 'runs.tsv')}` (dataset, link, command, run, s, RSS KiB, B CPU s, rx, tx, A CPU s, A HWM KiB, A anon KiB, ok).")
open(report, "w").write("\n".join(out) + "\n")
print("\n".join(out))
PYEOF
}

main "$@"
