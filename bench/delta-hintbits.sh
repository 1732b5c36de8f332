#!/usr/bin/env bash
# The re-sync of a standby that ran, as issue 36 found it (PostgreSQL 15, no WAL summaries):
# a standby made by pgjet streams and serves reads (so it sets hint bits of its own), is
# stopped, one pgbench client runs TXNS transactions on the primary, then `replica-create
# --delta` re-syncs the standby, once comparing relation pages by their LSN (the default
# without summaries) and once by hash (PGJET_DELTA_PAGE_LSN=0), each from the same stopped
# standby (a copy of it is kept for the second). Prints the bytes each moved, against a full
# copy's, and checks both re-synced standbys hold the primary's rows. Not a test: it measures.
#
#   bash bench/delta-hintbits.sh                       # scale 10, 2000 transactions
#   SCALE=2 TXNS=200 bash bench/delta-hintbits.sh      # smoke size
#   INIT_STEPS=dtGp bash bench/delta-hintbits.sh       # rows loaded unfrozen, unhinted
#
# Run as root; PostgreSQL 15 from Debian; pgjet from target/release (PGJET to override).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCALE=${SCALE:-10}
TXNS=${TXNS:-2000}
PGJET=${PGJET:-$HERE/../target/release/pgjet}
BIN=/usr/lib/postgresql/15/bin
W=$(mktemp -d /tmp/pgjet-hintbits.XXXXXX)
chmod 755 "$W"
install -m 755 "$PGJET" "$W/pgjet"
chown postgres: "$W"
as_pg() { runuser -u postgres -- "$@"; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
P1=$(port); P2=$(port)
cleanup() {
    for d in "$W/primary" "$W/standby" "$W/hash"; do
        [ -f "$d/postmaster.pid" ] && as_pg "$BIN/pg_ctl" -D "$d" -m immediate stop >/dev/null 2>&1 || true
    done
    rm -rf "$W"
}
trap cleanup EXIT
sql() { as_pg "$BIN/psql" -h "$W" -p "$1" -U postgres -d postgres -Atc "$2"; }
start() { as_pg "$BIN/pg_ctl" -D "$1" -l "$1.log" -o "-p $2 -k $W -c listen_addresses=127.0.0.1" -w start >/dev/null; }
stop() { as_pg "$BIN/pg_ctl" -D "$1" -m fast -w stop >/dev/null; }
src="host=127.0.0.1 port=$P1 user=postgres dbname=postgres"

as_pg "$BIN/initdb" -D "$W/primary" -A trust >/dev/null
# The primary's WAL is kept aside (not in a repository pgjet reads) for pg_waldump's count.
as_pg mkdir "$W/wal"
printf "archive_mode = on\narchive_command = 'cp %%p $W/wal/%%f'\n" >>"$W/primary/postgresql.conf"
start "$W/primary" "$P1"
# INIT_STEPS=dtGp: rows made by INSERT ... SELECT on the server and no VACUUM, so that no
# tuple is frozen or hinted when the standby first reads it (pgbench's default client-side
# load uses COPY FREEZE: its rows need no hint bits, and the standby's reads set none).
INIT_STEPS=${INIT_STEPS:-dtgvp}
as_pg "$BIN/pgbench" -h "$W" -p "$P1" -U postgres -i -q -I "$INIT_STEPS" -s "$SCALE" postgres >/dev/null 2>&1
full=$(as_pg "$W/pgjet" --source "$src" --transport libpq --pg-path "$W/standby" --output json \
    replica-create --start-fast 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["size"])')
echo "primary_conninfo = '$src'" >>"$W/standby/postgresql.auto.conf"
start "$W/standby" "$P2"
# Reads on the standby set its own hint bits, as a standby serving queries does.
sql "$P2" "SELECT count(*) FROM pgbench_accounts" >/dev/null
stop "$W/standby"
as_pg "$BIN/pgbench" -h "$W" -p "$P1" -U postgres -c 1 -t "$TXNS" -n postgres >/dev/null 2>&1
sql "$P1" CHECKPOINT >/dev/null
last=$(sql "$P1" "SELECT pg_walfile_name(pg_switch_wal())")
until [ "$(sql "$P1" "SELECT last_archived_wal >= '$last' FROM pg_stat_archiver")" = t ]; do sleep 0.2; done
cp -a "$W/standby" "$W/hash"
# The pages WAL changed since the standby's redo point (distinct relation blocks that
# pg_waldump lists from there to the end of the primary's WAL), against what each delta moves.
redo=$(as_pg "$BIN/pg_controldata" "$W/standby" | sed -n "s/^Latest checkpoint's REDO location: *//p")
# pg_waldump stops with an error where the kept WAL ends: that is its end here.
dump=$(as_pg "$BIN/pg_waldump" -p "$W/wal" -s "$redo" 2>/dev/null || true)
end=$(tail -n 1 <<<"$dump" | sed -n 's/.* lsn: \([0-9A-F]*\/[0-9A-F]*\).*/\1/p')
changed=$(grep -o 'blkref #[0-9]*: rel [0-9/]* \(fork [a-z]* \)\?blk [0-9]*' <<<"$dump" \
    | sed 's/blkref #[0-9]*: //' | sort -u | wc -l)
wal_bytes=$(sql "$P1" "SELECT pg_wal_lsn_diff('$end', '$redo')")
delta() {  # delta DIR ENV: the bytes copied, from the summary
    as_pg env "$2" "$W/pgjet" --source "$src" --transport libpq --pg-path "$1" --output json \
        replica-create --delta --start-fast 2>"$1.delta.log" \
        | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["delta_copied"], s["delta_same"])'
    grep -h "delta:" "$1.delta.log" | sed "s|^|  $(basename "$1"): |" >&2
}
read -r lsn_copied lsn_same <<<"$(delta "$W/standby" PGJET_DELTA_PAGE_LSN=1)"
read -r hash_copied hash_same <<<"$(delta "$W/hash" PGJET_DELTA_PAGE_LSN=0)"
want=$(sql "$P1" "SELECT count(*), sum(abalance) FROM pgbench_accounts")
for d in standby hash; do
    echo "primary_conninfo = '$src'" >>"$W/$d/postgresql.auto.conf"
    start "$W/$d" "$P2"
    got=$(sql "$P2" "SELECT count(*), sum(abalance) FROM pgbench_accounts")
    stop "$W/$d"
    [ "$got" = "$want" ] || { echo "MISMATCH after the delta into $d: $got, primary $want"; exit 1; }
done
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", 100 * a / b}'; }
echo "PostgreSQL 15, pgbench scale $SCALE (init steps $INIT_STEPS), $TXNS transactions of one client after the standby stopped"
echo "full copy:           $(mib "$full") MiB"
echo "delta by page LSN:   $(mib "$lsn_copied") MiB copied ($(pct "$lsn_copied" "$full") % of a full copy), $(mib "$lsn_same") MiB unchanged"
echo "delta by hash:       $(mib "$hash_copied") MiB copied ($(pct "$hash_copied" "$full") % of a full copy), $(mib "$hash_same") MiB unchanged"
echo "changed by WAL:      $changed blocks ($(mib $((changed * 8192))) MiB) in $(mib "$wal_bytes") MiB of WAL since the standby's redo point $redo (the copy also carries the WAL its own run needs, whole 16 MiB segments)"
echo "both re-synced standbys hold the primary's pgbench_accounts ($want)"
