#!/usr/bin/env bash
# pgjet WAL streaming benchmark (issue 38, section 5), one run, side by side:
#   pgjet archive-stream (a receiver on the replication protocol that stores into the
#   repository), pg_receivewal into a local directory (posix only: it writes files), pgjet
#   archive-push asynchronous and pgBackRest archive-push asynchronous (archive-async=y, the
#   same process-max as pgjet's --jobs); into a posix directory and into S3 (versitygw behind
#   the network lab's delay line, RTT_MS round trip).
#
#   1. lag under unthrottled pgbench (CLIENTS clients, DURATION s): every SAMPLE_EVERY s, the
#      server's flush LSN minus what the tool has made durable: a receiver's flush LSN as the
#      server sees it (pg_stat_replication: the receiver reports as flushed only what is
#      durable), archive-push's end of the last archived segment (pg_stat_archiver); max, mean
#      and 95th percentile in MiB, and the time to catch up after pgbench;
#   2. throughput: floods of WAL (FLOOD_KINDS of bench/archive.sh: random, incompressible;
#      update, compressible like OLTP WAL) made while the tool is stopped (a receiver's slot
#      keeps the WAL; archive_command paused), then the time until the tool has it all:
#      segments per second, and the machine's busy CPU seconds per GiB over that time (every
#      process: the tool, PostgreSQL's WAL sender or archiver, the store). The machine's
#      limits for the same files: cp + sync, s5cmd upload (from bench/archive.sh's floods);
#   3. synchronous mode (receivers only): pgbench with one client, SYNC_S seconds, with
#      synchronous_standby_names empty (local flush) and naming the receiver (pg_receivewal
#      --synchronous; archive-stream SYNC_ROUNDS times); the commit latency added, beside
#      the repository's own latency for the small durable write a tail chunk is (posix:
#      create, write, fsync, fsync of the directory, in Python; S3: a PUT with
#      `If-None-Match: *` under a tail's path over a kept connection, with curl, without
#      `Expect: 100-continue`, which would cost a round trip more), measured before and
#      after each synchronous run, after a sync; the commit statement's own latency too
#      (pgbench -r), and archive-stream's account of the wait from its status file.
#
#   bash bench/stream.sh
#   PERF=1 STOOLS=pgjet-stream TARGETS=s3 FLOOD_KINDS=update bash bench/stream.sh   # the receiver's
#       profile while it catches up each flood: $BENCH_DIR/results/perf-<target>-<tool>-<kind>.data
#   DURATION=3 FLOOD_SEGS=2 FLOOD_KINDS=random SYNC_S=2 SKIP_S5CMD=1 RTT_MS=1 ASCALE=1 bash bench/stream.sh   # smoke
#
# Run as root; clusters and tools run as postgres inside namespace B (see bench/s3.sh).
set -euo pipefail
export BENCH_DIR=${BENCH_DIR:-/var/tmp/pgjet-streambench}
export LAB_PREFIX=${LAB_PREFIX:-pjst}
export LAB_ID=${LAB_ID:-95}
HERE1=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SREPORT=${REPORT:-$HERE1/results/walstream-$(date -u +%Y%m%dT%H%MZ).md}
# shellcheck source=bench/archive.sh
source "$HERE1/archive.sh"    # the lab, versitygw, the cached cluster, floods; runs nothing
REPORT=$SREPORT

STOOLS=${STOOLS:-pgjet-stream pg_receivewal pgjet-async pgbr-async}
SYNC_S=${SYNC_S:-15}                # seconds of single-client pgbench per synchronous run
SYNC_ROUNDS=${SYNC_ROUNDS:-3}       # archive-stream's synchronous runs, each between two write measurements
SAMPLE_EVERY=${SAMPLE_EVERY:-0.5}   # seconds between lag samples
WRITES=${WRITES:-100}               # small durable writes timed for the repository's latency
FLOOD_RUNS=${FLOOD_RUNS:-3}         # runs of each flood per tool (medians reported)
APP=bench_receiver                  # the receivers' application_name (and the sync standby)
LAGB=$RES/stream-lag.tsv            # target, tool, seconds, lag bytes
RECV_PID=""
SEG=16777216

scleanup() {
    local rc=$?
    [ -z "$RECV_PID" ] || kill -TERM "$RECV_PID" 2>/dev/null || true
    (exit $rc)
    cleanup
}
trap scleanup EXIT

is_receiver() { case $1 in pgjet-stream | pg_receivewal) return 0 ;; esac; return 1; }

# start_receiver TARGET TOOL [--synchronous]: the receiver as postgres in B (exec'd all the way
# down, so $! is its PID), until the server lists it in pg_stat_replication
start_receiver() {
    local target=$1 tool=$2 sync=${3:-} port i
    port=$(cluster_port "$CL")
    case $tool in
        pgjet-stream)
            (cd / && exec ip netns exec "$NB" setpriv --reuid=postgres --regid=postgres --init-groups -- \
                env HOME=/var/lib/postgresql "$PGJET_BIN" --config="$RUN/pgjet-n.conf" --stanza=bench \
                --source="host=$CL/sock port=$port user=postgres application_name=$APP" archive-stream) \
                </dev/null >>"$LOGS/$target-$tool.log" 2>&1 9>&- &
            ;;
        pg_receivewal)
            (cd / && exec ip netns exec "$NB" setpriv --reuid=postgres --regid=postgres --init-groups -- \
                env HOME=/var/lib/postgresql "$PGBIN/pg_receivewal" -D "$RUN/receivewal" -S bench_pgrw \
                -d "host=$CL/sock port=$port user=postgres application_name=$APP" -n --status-interval=1 $sync) \
                </dev/null >>"$LOGS/$target-$tool.log" 2>&1 9>&- &
            ;;
    esac
    RECV_PID=$!
    wait_connected "$APP" "$LOGS/$target-$tool.log"
}

# wait_connected APP LOG: until the server lists the receiver RECV_PID as APP in
# pg_stat_replication (30 s at most; a receiver that exits or never connects ends the bench,
# with the end of its LOG)
wait_connected() {
    local i
    for i in $(seq 1 300); do
        [ "$(psql_cl "$CL" -c "SELECT count(*) FROM pg_stat_replication WHERE application_name = '$1'")" = 1 ] && return 0
        kill -0 "$RECV_PID" 2>/dev/null || break
        sleep 0.1
    done
    tail -n 20 "$2"
    die "the receiver of $2 did not connect"
}

stop_receiver() {
    [ -n "$RECV_PID" ] || return 0
    # pg_receivewal 15 ends cleanly on SIGINT only (SIGTERM kills it: a .partial segment
    # half zero-filled, which it then refuses to start with); archive-stream on either
    kill -INT "$RECV_PID" 2>/dev/null || true
    wait "$RECV_PID" 2>/dev/null || true
    RECV_PID=""
}

# lag_sql TOOL: the server's flush LSN minus what TOOL made durable, bytes (-1: not known yet)
lag_sql() {
    if is_receiver "$1"; then
        echo "SELECT coalesce((SELECT pg_wal_lsn_diff(pg_current_wal_flush_lsn(), flush_lsn) FROM pg_stat_replication WHERE application_name = '$APP'), -1)"
    else
        # the end of the last archived segment: <TLI><LOG><SEG> (16 MiB segments)
        echo "SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0') - (('x' || substr(last_archived_wal, 9, 8))::bit(32)::bigint * 4294967296 + (('x' || substr(last_archived_wal, 17, 8))::bit(32)::bigint + 1) * $SEG), -1) FROM pg_stat_archiver"
    fi
}

# stream_sampler TARGET TOOL: one lag sample every SAMPLE_EVERY s, until killed
stream_sampler() {
    local t0 sql v
    t0=$(now)
    sql=$(lag_sql "$2")
    while :; do
        v=$(psql_cl "$CL" -c "$sql" 2>/dev/null || echo -1)
        printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$(awk -v a="$(now)" -v b="$t0" 'BEGIN {printf "%.1f", a - b}')" "$v" >>"$LAGB"
        sleep "$SAMPLE_EVERY"
    done
}

# wait_caught_up TOOL LSN SECONDS: until TOOL has made LSN durable (1 = timed out)
wait_caught_up() {
    local tool=$1 lsn=$2 limit=$3 t0 sql
    t0=$(now)
    if [ "$tool" = pg_receivewal ]; then
        # it fsyncs a segment when it closes it (without --synchronous) and renames it from
        # .partial: durable through LSN (a segment boundary) once that file is there
        local seg
        seg=$(psql_cl "$CL" -c "SELECT pg_walfile_name('$lsn')")
        until [ -f "$RUN/receivewal/$seg" ]; do
            if awk -v a="$(now)" -v b="$t0" -v l="$limit" 'BEGIN {exit !(a - b > l)}'; then return 1; fi
            sleep 0.05
        done
        return 0
    elif is_receiver "$tool"; then
        sql="SELECT coalesce((SELECT flush_lsn >= '$lsn' FROM pg_stat_replication WHERE application_name = '$APP'), false)"
    else
        sql="SELECT coalesce(pg_wal_lsn_diff('$lsn', '0/0') <= ('x' || substr(last_archived_wal, 9, 8))::bit(32)::bigint * 4294967296 + (('x' || substr(last_archived_wal, 17, 8))::bit(32)::bigint + 1) * $SEG, false) FROM pg_stat_archiver"
    fi
    until [ "$(psql_cl "$CL" -c "$sql")" = t ]; do
        if awk -v a="$(now)" -v b="$t0" -v l="$limit" 'BEGIN {exit !(a - b > l)}'; then return 1; fi
        sleep 0.1
    done
}

# segments_stored TARGET FIRST LAST: how many of the segments named FIRST..LAST (one timeline)
# archive-stream has stored in the stanza's archive, counted in the repository's directory
# (S3: versitygw's own directory; an object is there once its PUT is done)
segments_stored() {
    local dir=$RUN/pgjet-repo/bench/archive
    [ "$1" = posix ] || dir=$S3DATA/$BUCKET/pgjet/bench/archive
    find "$dir" -type f -name '[0-9A-F]*' 2>/dev/null |
        awk -F/ -v a="$2" -v b="$3" '{n = $NF ""} length(n) == 24 && n >= a "" && n <= b "" {c++} END {print c + 0}'
}

# wait_flood_stored TARGET TOOL END SECONDS: until TOOL has made the flood ending at END durable.
# archive-stream's segments are counted in the repository (END is a segment boundary: the
# flood ends with a switch), every 0.05 s: no psql per look, whose CPU the flood's figure
# would count (the lag run asks the server, wait_caught_up)
wait_flood_stored() {
    local target=$1 tool=$2 end=$3 limit=$4 names first last want t0
    if [ "$tool" != pgjet-stream ] || [ "$FLOOD_FIRST" = "" ]; then
        wait_caught_up "$tool" "$end" "$limit"; return
    fi
    t0=$(now)
    until [ "$(segments_stored "$target" "$FLOOD_FIRST" "$FLOOD_LAST")" -ge "$FLOOD_WANT" ]; do
        if awk -v a="$(now)" -v b="$t0" -v l="$limit" 'BEGIN {exit !(a - b > l)}'; then return 1; fi
        sleep 0.05
    done
}

# stream_flood TARGET TOOL KIND SEGMENTS: the flood made with the receiver stopped (its slot
# keeps the WAL), then the time until the receiver has it durable
stream_flood() {
    local target=$1 tool=$2 kind=$3 want=$4 start end segs t0 t1 cpu0 cpu1 rcpu pid
    stop_receiver
    start=$(psql_cl "$CL" -c "SELECT pg_current_wal_flush_lsn()")
    make_flood "$kind" "$want"
    end=$(psql_cl "$CL" -c "SELECT pg_current_wal_flush_lsn()")
    # The WAL made, in segments: a flood overshoots what it asked for (an UPDATE of the
    # whole table writes many segments at once), as archive-push's count of .ready files does.
    segs=$(psql_cl "$CL" -c "SELECT round(pg_wal_lsn_diff('$end', '$start') / $SEG.0, 1)")
    # The segments the flood completes, for wait_flood_stored (none when END is not a boundary;
    # pg_walfile_name of a boundary names the segment before it, hence the +1 and -1)
    FLOOD_FIRST="" FLOOD_LAST="" FLOOD_WANT=0
    read -r FLOOD_FIRST FLOOD_LAST FLOOD_WANT < <(psql_cl "$CL" -F ' ' -c "SELECT pg_walfile_name('$start'::pg_lsn + 1), pg_walfile_name('$end'::pg_lsn - 1), floor((pg_wal_lsn_diff('$end', '0/0') - 1) / $SEG) - floor(pg_wal_lsn_diff('$start', '0/0') / $SEG) + 1 WHERE pg_wal_lsn_diff('$end', '0/0') % $SEG = 0") || true
    cpu_by_process save "$RES/cpu-procs.json"
    cpu0=$(cpu_ticks)
    t0=$(now)
    start_receiver "$target" "$tool"
    pid=$RECV_PID
    local perf_pid=""
    if [ "$PERF" = 1 ]; then   # the receiver's own profile while it catches up
        perf record -g -F 999 -p "$pid" -o "$RES/perf-$target-$tool-$kind.data" >/dev/null 2>&1 & perf_pid=$!
    fi
    wait_flood_stored "$target" "$tool" "$end" 1800 || say "  flood ($kind): FAILED, not received in 1800 s"
    t1=$(now)
    cpu1=$(cpu_ticks)
    cpu_by_process show "$RES/cpu-procs.json"
    if [ -n "$perf_pid" ]; then kill -INT "$perf_pid"; wait "$perf_pid" 2>/dev/null || true; fi
    rcpu=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
    row "$target" "$tool" "flood_${kind}_segments" "$segs"
    row "$target" "$tool" "flood_${kind}_s" "$(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.2f", a - b}')"
    row "$target" "$tool" "flood_${kind}_cpu_s" "$(awk -v a="$cpu1" -v b="$cpu0" -v h="$(getconf CLK_TCK)" 'BEGIN {printf "%.2f", (a - b) / h}')"
    row "$target" "$tool" "flood_${kind}_tool_cpu_s" "$(awk -v a="$rcpu" -v h="$(getconf CLK_TCK)" 'BEGIN {printf "%.2f", a / h}')"
    say "  flood ($kind): $segs segments received in $(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.1f", a - b}') s"
    psql_cl "$CL" -c "TRUNCATE flood" >/dev/null
}

# pgbench_latency SECONDS: single-client pgbench's average latency per transaction and of its
# commit (the END statement, pgbench -r), ms, and the transactions it ran: "TXN COMMIT COUNT"
pgbench_latency() {
    as_b "$PGBIN/pgbench" -n -r -c 1 -T "$1" -h "$CL/sock" -p "$(cluster_port "$CL")" -U postgres postgres 2>/dev/null |
        awk '/^latency average = / {t = $4} $NF == "END;" {c = $1} /^number of transactions actually processed: / {n = $NF} END {print t, c, n}'
}

# stream_counters: archive-stream's flush reports and tail writes so far, from its status
# file: "FLUSH_REPORTS FLUSH_WAIT_S TAIL_WRITES TAIL_WRITE_S" (zeros when there is none)
stream_counters() {
    /usr/bin/python3 -c 'import json, sys
try: s = json.load(open(sys.argv[1]))
except Exception: s = {}
print(*(s.get(k, 0) for k in ("flush_reports", "flush_wait_seconds", "tail_writes", "tail_write_seconds")))' \
        "$RUN/pgjet-spool/archive/bench/stream.json"
}

set_sync_names() {
    psql_cl "$CL" -c "ALTER SYSTEM SET synchronous_standby_names = '$1'" -c "SELECT pg_reload_conf()" >/dev/null
    sleep 0.5
}

# sync_phase TARGET TOOL: commit latency with a local flush only, then with the receiver as
# the synchronous standby: per transaction and of the commit statement alone (the other
# statements of a transaction run slower between commits that wait, on this VM: idle CPUs
# wake late). archive-stream: SYNC_ROUNDS runs, each between two measurements of the
# repository's own write (a store's latency drifts by a few ms within minutes), and its own
# account of each run's wait (status file counters: receipt of the WAL to its flush report,
# and the tail writes within)
sync_phase() {
    local target=$1 tool=$2 local_ms sync_ms c0 c1 local_commit_ms sync_commit_ms wait_ms write_ms sync_n reports writes
    local rounds=1 round
    set_sync_names ""
    read -r local_ms local_commit_ms _ < <(pgbench_latency "$SYNC_S")
    row "$target" "$tool" sync_local_ms "${local_ms:-0}"
    row "$target" "$tool" sync_local_commit_ms "${local_commit_ms:-0}"
    say "  local flush: ${local_ms:-?} ms per transaction (${local_commit_ms:-?} ms its commit)"
    if [ "$tool" = pg_receivewal ]; then
        stop_receiver
        start_receiver "$target" "$tool" --synchronous
    fi
    set_sync_names "\"$APP\""
    # The receiver must be the synchronous standby, or the figure means nothing.
    local state
    state=$(psql_cl "$CL" -c "SELECT sync_state FROM pg_stat_replication WHERE application_name = '$APP'")
    [ "$state" = sync ] || say "  synchronous: FAILED, $tool is '$state', not the synchronous standby"
    if [ "$tool" = pgjet-stream ]; then
        rounds=$SYNC_ROUNDS
        sync
        write_latency "$target" "$tool"
    fi
    for round in $(seq 1 "$rounds"); do
        [ "$tool" != pgjet-stream ] || { sleep 1.2; c0=$(stream_counters); }
        read -r sync_ms sync_commit_ms sync_n < <(pgbench_latency "$SYNC_S")
        row "$target" "$tool" sync_ms "${sync_ms:-0}"
        row "$target" "$tool" sync_commit_ms "${sync_commit_ms:-0}"
        say "  synchronous: ${sync_ms:-?} ms per transaction (${sync_commit_ms:-?} ms its commit), $sync_n transactions, with $tool as the synchronous standby"
        if [ "$tool" = pgjet-stream ]; then
            sleep 1.2   # the status file is rewritten every second
            c1=$(stream_counters)
            read -r wait_ms write_ms reports writes < <(awk -v a="$c0" -v b="$c1" 'BEGIN {split(a, x, " "); split(b, y, " ");
                n = y[1] - x[1]; w = y[3] - x[3];
                printf "%.3f %.3f %d %d\n", (n > 0 ? (y[2] - x[2]) * 1000 / n : 0), (w > 0 ? (y[4] - x[4]) * 1000 / w : 0), n, w}')
            row "$target" "$tool" sync_flush_wait_ms "$wait_ms"
            row "$target" "$tool" sync_tail_write_ms "$write_ms"
            say "  archive-stream's own account: $wait_ms ms from receipt to flush report, of which $write_ms ms writing the tail ($reports flush reports, $writes tail writes)"
            write_latency "$target" "$tool"
        fi
    done
    set_sync_names ""
    [ "$tool:$target" != pgjet-stream:s3 ] || link_peer "$target"
}

# fsync_latency: the posix directory's latency for one small durable write (create, write,
# fsync, fsync of the directory, in Python), WRITES of them: "MEAN MEDIAN" in ms
fsync_latency() {
    fresh_dir "$RUN/latency"
    as_b /usr/bin/python3 - "$RUN/latency" "$WRITES" <<'PYEOF'
import os, sys, time, statistics
d, n = sys.argv[1], int(sys.argv[2])
dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
data = os.urandom(512)
t = []
for i in range(n):
    a = time.perf_counter()
    fd = os.open(os.path.join(d, f"w{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)
    os.write(fd, data); os.fsync(fd); os.close(fd); os.fsync(dfd)
    t.append((time.perf_counter() - a) * 1000)
print(f"{statistics.mean(t):.3f} {statistics.median(t):.3f}")
PYEOF
    rm -rf "$RUN/latency"
}

# link_peer TARGET: what a synchronous commit costs beyond the durable write itself when the
# receiver is across the same link as the repository, for PostgreSQL's own receiver and for
# archive-stream alike: each in namespace A (the S3 server's side of the delay line),
# streaming from the cluster in B over TCP into a directory there (pg_receivewal
# --synchronous; archive-stream into a posix repository), as the synchronous standby; the
# commit latency added, beside the link's round trip as PostgreSQL's protocol sees it
# (pgbench's SELECT 1 from A) and the directory's own durable write
link_peer() {
    local target=$1 port rtt_ms commit_ms n fmean state addr_b peer
    port=$(cluster_port "$CL")
    addr_b=$(sed -n 's/^NETLAB_ADDR_B=//p' "$RES/lab.env")
    stop_receiver
    # TCP on B's address of the lab, for A only
    printf 'host all postgres %s/32 trust\nhost replication postgres %s/32 trust\n' "$ADDR_A" "$ADDR_A" >>"$CL/data/pg_hba.conf"
    psql_cl "$CL" -c "ALTER SYSTEM SET listen_addresses = '$addr_b'" >/dev/null
    pg_stop_cluster "$CL"
    start_in_b "$CL"
    echo 'SELECT 1;' >"$RUN/select1.sql"; chmod 644 "$RUN/select1.sql"
    rtt_ms=$(cd / && ip netns exec "$NA" runuser -u postgres -- "$PGBIN/pgbench" -n -c 1 -T 3 -f "$RUN/select1.sql" \
        -h "$addr_b" -p "$port" -U postgres postgres 2>/dev/null | awk '/^latency average = / {print $4}')
    row "$target" link link_rtt_ms "${rtt_ms:-0}"
    fresh_dir "$RUN/linkwal"; fresh_dir "$RUN/link-repo"; fresh_dir "$RUN/link-spool"
    printf '[global]\nrepo1-path=%s\nspool-path=%s\n[bench]\npg-path=%s\npg-port=%s\npg-socket-path=%s\n' \
        "$RUN/link-repo" "$RUN/link-spool" "$CL/data" "$port" "$CL/sock" >"$RUN/pgjet-link.conf"
    chown postgres: "$RUN/pgjet-link.conf"
    as_b "$PGJET_BIN" --config="$RUN/pgjet-link.conf" --stanza=bench stanza-create >"$LOGS/$target-link-stanza.log" 2>&1 ||
        { cat "$LOGS/$target-link-stanza.log"; die "stanza-create (link) failed"; }
    for peer in pg_receivewal pgjet-stream; do
        if [ "$peer" = pg_receivewal ]; then
            psql_cl "$CL" -c "SELECT pg_create_physical_replication_slot('bench_link', true)" >/dev/null
            (cd / && exec ip netns exec "$NA" setpriv --reuid=postgres --regid=postgres --init-groups -- \
                "$PGBIN/pg_receivewal" -D "$RUN/linkwal" -S bench_link -n --status-interval=1 --synchronous \
                -d "host=$addr_b port=$port user=postgres application_name=bench_link") \
                </dev/null >>"$LOGS/$target-link-$peer.log" 2>&1 9>&- &
        else
            (cd / && exec ip netns exec "$NA" setpriv --reuid=postgres --regid=postgres --init-groups -- \
                env HOME=/var/lib/postgresql "$PGJET_BIN" --config="$RUN/pgjet-link.conf" --stanza=bench \
                --archive-stream-slot=bench_link_pgjet \
                --source="host=$addr_b port=$port user=postgres application_name=bench_link" archive-stream) \
                </dev/null >>"$LOGS/$target-link-$peer.log" 2>&1 9>&- &
        fi
        RECV_PID=$!     # stopped by stop_receiver, or by the exit trap
        wait_connected bench_link "$LOGS/$target-link-$peer.log"
        set_sync_names '"bench_link"'
        state=$(psql_cl "$CL" -c "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'bench_link'")
        [ "$state" = sync ] || say "  link peer: FAILED, $peer is '$state', not the synchronous standby"
        read -r _ commit_ms n < <(pgbench_latency "$SYNC_S")
        set_sync_names ""
        stop_receiver
        row "$target" "link-$peer" link_commit_ms "${commit_ms:-0}"
        say "  $peer --synchronous across the link: ${commit_ms:-?} ms per commit ($n transactions); the link's round trip ${rtt_ms:-?} ms"
    done
    sync
    read -r fmean _ < <(fsync_latency)
    row "$target" link link_fsync_ms "${fmean:-0}"
    say "  the directory's durable write: ${fmean:-?} ms"
}

# write_latency TARGET TOOL: the repository's own latency for the small durable write a tail
# chunk is (posix: create, write, fsync, fsync of the directory, in Python; S3: a PUT with
# `If-None-Match: *` under a tail's path, over a kept connection, with curl), WRITES of them;
# recorded beside TOOL's synchronous run as write_ms (their mean, as pgbench's latencies are)
# and write_median_ms
write_latency() {
    local target=$1 tool=$2 ms
    if [ "$target" = posix ]; then
        ms=$(fsync_latency)
    else
        local args=() i dir=latency/archive/bench/15-1/0000000100000000/tail/000000010000000000000001
        head -c 512 /dev/urandom >"$RUN/latency.bin"; chmod 644 "$RUN/latency.bin"
        for i in $(seq 1 "$WRITES"); do args+=(-T "$RUN/latency.bin" "https://$S3_HOST:$S3_PORT/$BUCKET/$dir/$(printf '%08X-%08X' "$i" $((i + 1)))"); done
        ms=$(ip netns exec "$NB" curl -s -o /dev/null --cacert "$PKI/ca.crt" --aws-sigv4 "aws:amz:$S3_REGION:s3" \
            --user "$S3_KEY:$S3_SECRET" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -H "Expect:" -H "If-None-Match: *" \
            -w '%{http_code} %{time_total}\n' "${args[@]}" |
            awk '$1 == 200 && NR > 1 {print $2 * 1000}' | sort -n |
            awk '{v[NR] = $1; s += $1} END {if (NR) printf "%.3f %.3f", s / NR, v[int((NR + 1) / 2)]}')
        rm -rf "$S3DATA/$BUCKET/latency" "$RUN/latency.bin"
    fi
    local mean median
    read -r mean median <<<"${ms:-0 0}"
    row "$target" "$tool" write_ms "$mean"
    row "$target" "$tool" write_median_ms "$median"
    say "  the repository's own small durable write: $mean ms mean, $median ms median (of $WRITES)"
}

# one_stream_tool TARGET TOOL: lag, floods and (receivers) synchronous mode on a fresh copy
one_stream_tool() {
    local target=$1 tool=$2 lsn0 lsn1 t0 t1 segs kind
    header "$target / $tool"
    fresh_cluster "$RUN/receivewal"
    case $tool in
        pgjet-stream)
            set_archive /bin/true
            tool_cmd pgjet-sync stanza-create >"$LOGS/$target-$tool-stanza.log" 2>&1 || { cat "$LOGS/$target-$tool-stanza.log"; die "stanza-create failed"; }
            start_receiver "$target" "$tool" ;;
        pg_receivewal)
            set_archive /bin/true
            psql_cl "$CL" -c "SELECT pg_create_physical_replication_slot('bench_pgrw', true)" >/dev/null
            start_receiver "$target" "$tool" ;;
        *)
            tool_cmd "$tool" stanza-create >"$LOGS/$target-$tool-stanza.log" 2>&1 || { cat "$LOGS/$target-$tool-stanza.log"; die "stanza-create failed"; }
            set_archive "$(archive_cmd "$tool")"
            psql_cl "$CL" -c "SELECT pg_switch_wal()" >/dev/null ;;
    esac

    # 1. lag under pgbench
    lsn0=$(psql_cl "$CL" -c "SELECT pg_current_wal_lsn()")
    stream_sampler "$target" "$tool" & SAMPLER=$!
    as_b "$PGBIN/pgbench" -n -c "$CLIENTS" -j 2 -T "$DURATION" -h "$CL/sock" -p "$(cluster_port "$CL")" -U postgres postgres >"$LOGS/$target-$tool-pgbench.log" 2>&1 || true
    t0=$(now)
    # Only archive-stream keeps the segment in progress durable: the others are waited for
    # to the end of it.
    [ "$tool" = pgjet-stream ] || psql_cl "$CL" -c "SELECT pg_switch_wal()" >/dev/null
    lsn1=$(psql_cl "$CL" -c "SELECT pg_current_wal_flush_lsn()")
    wait_caught_up "$tool" "$lsn1" 600 || say "  lag run: FAILED, not caught up in 600 s after pgbench"
    t1=$(now)
    kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null || true; SAMPLER=""
    segs=$(psql_cl "$CL" -c "SELECT round(pg_wal_lsn_diff('$lsn1', '$lsn0') / $SEG.0, 1)")
    row "$target" "$tool" pgbench_tps "$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$LOGS/$target-$tool-pgbench.log" | head -n 1)"
    row "$target" "$tool" pgbench_segments "$segs"
    row "$target" "$tool" drain_s "$(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.1f", a - b}')"
    say "  pgbench: $segs segments of WAL; caught up $(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.1f", a - b}') s after pgbench ended"

    # 2. floods, FLOOD_RUNS times each (the report gives the medians)
    local run
    for kind in $FLOOD_KINDS; do
        local n=$FLOOD_SEGS
        [ "$kind" = update ] && n=$FLOOD_UPDATE_SEGS
        [ "$kind" = pgbench ] && n=$FLOOD_PGBENCH_SEGS
        for run in $(seq 1 "$FLOOD_RUNS"); do
            if is_receiver "$tool"; then stream_flood "$target" "$tool" "$kind" "$n"; else flood "$target" "$tool" "$kind" "$n"; fi
        done
    done

    # 3. synchronous mode, beside the repository's own write latency measured in the same
    # state: the floods' writes flushed first (left to the kernel's writeback, they slowed
    # an S3 server's writes during the synchronous run, not during the latency measured at
    # the start)
    if is_receiver "$tool"; then
        sync
        sync_phase "$target" "$tool"
    fi
    stop_receiver
    stop_background
    pg_stop_cluster "$CL"
}

write_stream_report() {
    /usr/bin/python3 - "$ROWS" "$LAGB" "$FACTS" "$REPORT" "$SYNC_S" <<'PYEOF'
import sys, statistics as st, collections
SYNC_S = sys.argv[5]
rows_f, lags_f, facts_f, report = sys.argv[1:5]
rows = collections.defaultdict(dict)
# A key written several times (the floods, FLOOD_RUNS times each): every value is kept, in
# order, and the plain figure is their median.
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for l in open(rows_f):
    t, tool, k, v = l.rstrip("\n").split("\t")
    try: runs[(t, tool)][k].append(float(v))
    except ValueError: rows[(t, tool)][k] = v
for key, ks in runs.items():
    for k, vs in ks.items(): rows[key][k] = st.median(vs)
lag = collections.defaultdict(list)
for l in open(lags_f):
    t, tool, s, b = l.rstrip("\n").split("\t")
    if b and float(b) >= 0: lag[(t, tool)].append(float(b) / 1048576)
facts = dict(l.rstrip("\n").split("\t", 1) for l in open(facts_f) if "\t" in l)
out = []
P = out.append
P("# WAL streaming: lag, throughput and synchronous commits (bench/stream.sh)")
P("")
for k in ("machine", "memory", "disk", "postgres", "pgjet", "pgbackrest", "versitygw", "settings"):
    if k in facts: P(f"- {k}: {facts[k]}")
P("")
tools = ["pgjet-stream", "pg_receivewal", "pgjet-async", "pgbr-async"]
names = {"pgjet-stream": "pgjet archive-stream", "pg_receivewal": "pg_receivewal (local directory)", "pgjet-async": "pgjet archive-push async", "pgbr-async": "pgBackRest archive-push async"}
def p95(v):
    v = sorted(v)
    return v[min(len(v) - 1, int(0.95 * len(v)))] if v else 0
for t in ("posix", "s3"):
    if not any((t, x) in rows for x in tools): continue
    P(f"## {'posix directory' if t == 'posix' else 'S3 (versitygw, ' + facts.get('rtt_ms', '?') + ' ms round trip)'}")
    P("")
    kinds = [k for k in ("random", "update", "pgbench") if any(f"flood_{k}_s" in r for (tt, _), r in rows.items() if tt == t)]
    P("| tool | pgbench tps | WAL (segments) | lag MiB: max | mean | p95 | caught up after pgbench s | " + "".join(f"flood {k}: segments/s | runs | CPU s/GiB | " for k in kinds))
    P("|---|---:|---:|---:|---:|---:|---:|" + "---:|---:|---:|" * len(kinds))
    def per_run(x, kind, k):
        # each run's figure k per segment (the limits: one run, over the flood's segments)
        r = runs.get((t, x), {})
        n = r.get(f"flood_{kind}_segments") or runs.get((t, "limit"), {}).get(f"flood_{kind}_segments", [])
        v = r.get(f"flood_{kind}_{k}", [])
        if len(n) == 1: n = n * len(v)
        return [(a, b) for a, b in zip(n, v) if a and b]
    def rate(x, kind):   # median of the runs' segments per second
        v = [a / b for a, b in per_run(x, kind, "s")]
        return st.median(v) if v else None
    def cpu(x, kind):    # median of the runs' machine CPU seconds per GiB
        v = [b / (a * 16 / 1024) for a, b in per_run(x, kind, "cpu_s")]
        return st.median(v) if v else None
    def spread(x, kind):  # the runs' segments per second, lowest to highest
        v = sorted(a / b for a, b in per_run(x, kind, "s"))
        return f"{v[0]:.1f}–{v[-1]:.1f}" if len(v) > 1 else ""
    f1 = lambda v: f"{v:.1f}" if v else ""
    for x in tools:
        r = rows.get((t, x))
        if not r: continue
        lg = lag.get((t, x), [0])
        P(f"| {names[x]} | {r.get('pgbench_tps', 0):.0f} | {r.get('pgbench_segments', 0):.1f} | {max(lg):.1f} | {st.mean(lg):.1f} | {p95(lg):.1f} | {r.get('drain_s', 0):.1f} | " + "".join(f"{f1(rate(x, k))} | {spread(x, k)} | {f1(cpu(x, k))} | " for k in kinds))
    for lim in ("limit: cp + sync", "limit: s5cmd upload"):
        if (t, lim) in rows:
            P(f"| {lim} (the same segments, raw) | | | | | | | " + "".join(f"{f1(rate(lim, k))} | | | " for k in kinds))
    P("")
    P(f"Floods: segments per second and CPU are medians of {facts.get('flood_runs', '1')} run(s) per tool; runs: the lowest and highest. The limits: one run.")
    P("")
    for kind in kinds:
        s_, rw, ba, aa = rate("pgjet-stream", kind), rate("pg_receivewal", kind), rate("pgbr-async", kind), rate("pgjet-async", kind)
        if s_ and rw: P(f"- flood ({kind}): archive-stream / pg_receivewal = {s_ / rw:.2f}×")
        if s_ and ba: P(f"- flood ({kind}): archive-stream / pgBackRest async = {s_ / ba:.2f}×")
        if s_ and aa: P(f"- flood ({kind}): archive-stream / pgjet archive-push async = {s_ / aa:.2f}×")
    if lag.get((t, "pgjet-stream")): P(f"- archive-stream max lag: {max(lag[(t, 'pgjet-stream')]):.1f} MiB ({max(lag[(t, 'pgjet-stream')]) / 16:.2f} segment), {len(lag[(t, 'pgjet-stream')])} samples")
    for x in ("pgjet-async", "pgbr-async"):
        if lag.get((t, x)): P(f"- {names[x]} max lag: {max(lag[(t, x)]) / 16:.1f} segments")
    P("")
sync = [(t, x) for t in ("posix", "s3") for x in tools if "sync_ms" in rows.get((t, x), {})]
if sync:
    P("## Synchronous mode: commit latency (pgbench, 1 client)")
    P("")
    P("Per transaction (pgbench's average) and of its commit alone (the END statement, pgbench -r); with a receiver as the synchronous standby, the median over its runs. The repository's own write: the small durable write a tail chunk is (S3: a PUT with If-None-Match under a tail's path), its mean, measured between archive-stream's synchronous runs with the floods' writes flushed; each run is compared with the mean of the measurements just before and just after it, and the median over the runs is given. archive-stream's own account: from receiving the commit's WAL to reporting it flushed, and the tail writes within (its status file's counters over each run).")
    P("")
    P("| repository | standby | transaction ms: local flush | synchronous | added | commit ms: local flush | synchronous | added | repository's own write ms (each measurement) | commit added − write ms (each run) | archive-stream: receipt to flush report ms | of which its tail writes ms |")
    P("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t, x in sync:
        r, rr = rows[(t, x)], runs[(t, x)]
        add = r["sync_ms"] - r["sync_local_ms"]
        cadd = r.get("sync_commit_ms", 0) - r.get("sync_local_commit_ms", 0)
        ws, commits = rr.get("write_ms", []), rr.get("sync_commit_ms", [])
        own = x == "pgjet-stream" and len(ws) == len(commits) + 1
        wr = extra = ""
        if own:
            extras = [c - r["sync_local_commit_ms"] - (ws[i] + ws[i + 1]) / 2 for i, c in enumerate(commits)]
            wr = f"{st.mean(ws):.2f} ({' / '.join(f'{v:.2f}' for v in ws)})"
            extra = f"{st.median(extras):+.2f} ({' / '.join(f'{v:+.2f}' for v in extras)})"
        fw, tw = r.get("sync_flush_wait_ms"), r.get("sync_tail_write_ms")
        P(f"| {t} | {names[x]} | {r['sync_local_ms']:.2f} | {r['sync_ms']:.2f} | {add:+.2f} | {r.get('sync_local_commit_ms', 0):.2f} | {r.get('sync_commit_ms', 0):.2f} | {cadd:+.2f} | {wr} | {extra} | {f'{fw:.2f}' if fw else ''} | {f'{tw:.2f}' if tw else ''} |")
    P("")
    for t in ("posix", "s3"):
        l, r = rows.get((t, "link"), {}), rows.get((t, "pgjet-stream"), {})
        peers = [(x, rows.get((t, f"link-{x}"), {}).get("link_commit_ms")) for x in ("pg_receivewal", "pgjet-stream")]
        if not (l.get("link_rtt_ms") and r.get("sync_local_commit_ms") and any(c for _, c in peers)):
            continue
        P(f"### The same link without the object store ({t}'s link)")
        P("")
        P(f"What any synchronous standby behind this link pays beyond its durable write, on this machine: each receiver on the S3 server's side of the delay line, streaming from the cluster over TCP into a directory there, as the synchronous standby ({SYNC_S} s of pgbench, 1 client). The link's round trip as PostgreSQL's protocol sees it (pgbench SELECT 1 from that side): {l['link_rtt_ms']:.2f} ms; the directory's small durable write: {l.get('link_fsync_ms', 0):.2f} ms.")
        P("")
        P("| receiver | commit ms | added | added − round trip − durable write |")
        P("|---|---:|---:|---:|")
        for x, c in peers:
            if c:
                ladd = c - r["sync_local_commit_ms"]
                P(f"| {names[x]} | {c:.2f} | {ladd:+.2f} | {ladd - l['link_rtt_ms'] - l.get('link_fsync_ms', 0):+.2f} |")
        P("")
open(report, "w").write("\n".join(out) + "\n")
PYEOF
}

smain() {
    bench_up
    : >"$LAGB"
    fact flood_runs "$FLOOD_RUNS"
    fact settings "FLOOD_RUNS=$FLOOD_RUNS DURATION=$DURATION CLIENTS=$CLIENTS FLOOD_SEGS=$FLOOD_SEGS FLOOD_UPDATE_SEGS=$FLOOD_UPDATE_SEGS FLOOD_KINDS='$FLOOD_KINDS' ASCALE=$ASCALE JOBS=$JOBS RTT_MS=$RTT_MS SYNC_S=$SYNC_S SYNC_ROUNDS=$SYNC_ROUNDS TARGETS='$TARGETS' STOOLS='$STOOLS'"
    local target tool
    for target in $TARGETS; do
        configure "$target"
        for tool in $STOOLS; do
            # pg_receivewal writes files into a local directory: the posix target only
            [ "$tool" = pg_receivewal ] && [ "$target" != posix ] && continue
            one_stream_tool "$target" "$tool"
        done
    done
    header "Report"
    write_stream_report
    cat "$REPORT"
    say "report written to $REPORT"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    smain "$@"
fi
