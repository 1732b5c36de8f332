#!/usr/bin/env bash
# pgjet demo: the main job end to end on a fresh Debian 12 machine, as root.
#
#   bash scripts/demo.sh
#
# 1. installs the dependencies (scripts/install-deps.sh) and builds pgjet (cargo build --release)
# 2. creates a throwaway PostgreSQL 15 cluster in a temp dir with real data
#    (pgbench -i -s 10 plus a few transactions, a second tablespace holding a table)
# 3. with pgjet (run as the OS user postgres): stanza-create, backup --start-fast, info,
#    verify, restore into a new directory (--tablespace-map), starts the restored cluster on
#    another port and compares its rows with the source
# 4. replica-create --start from the primary, inserts a row on the primary and shows it
#    arriving on the replica
# Every server it started is stopped by PID and the temp dir removed on exit, unless KEEP=1.
#
# Env: KEEP=1 keep the temp dir and servers' data (servers are stopped all the same),
#      SCALE (pgbench scale, default 10), PGJET=/path/to/pgjet to skip the build,
#      TMPDIR (where the temp dir goes, default /var/tmp), PG_VERSION (default 15).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
# shellcheck source=scripts/pg-env.sh
source "$HERE/pg-env.sh"

SCALE=${SCALE:-10}
PGV=${PG_VERSION:-15}
STANZA=demo
export PATH="$PATH:${HOME:-/root}/.cargo/bin"

step_no=0
step() {
    step_no=$((step_no + 1))
    printf '\n\033[1m==== %d. %s\033[0m\n' "$step_no" "$*"
}
info() { printf '  %s\n' "$*"; }
die() { printf '\nDEMO FAILED: %s\n' "$*" >&2; exit 1; }

if [ "$(id -u)" -ne 0 ]; then die "run as root (servers run as postgres via runuser)"; fi

# ------------------------------------------------------------------ cleanup
T=""
STARTED=()          # cluster dirs / PGDATAs of servers this script started
cleanup() {
    local rc=$? d
    set +e
    for d in "${STARTED[@]}"; do
        pg_stop_cluster "$d"
    done
    if [ -n "$T" ] && [ -d "$T" ]; then
        if [ "${KEEP:-0}" = 1 ]; then
            echo "KEEP=1: kept $T"
        else
            rm -rf "$T"
        fi
    fi
    [ $rc -eq 0 ] || echo "demo exited with status $rc" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# pgjet as postgres, showing the command
pgjet() {
    printf '  $ pgjet'; printf ' %q' "$@"; printf '\n'
    as_pg "$BIN" "$@"
}

# ------------------------------------------------------------------ 1. dependencies, build
step "Install dependencies"
PROFILE=demo PG_VERSION=$PGV bash "$HERE/install-deps.sh"

step "Build pgjet"
if [ -n "${PGJET:-}" ]; then
    info "using PGJET=$PGJET (no build)"
    SRC_BIN=$PGJET
else
    (cd "$ROOT" && cargo build --release)
    SRC_BIN=$ROOT/target/release/pgjet
fi
[ -x "$SRC_BIN" ] || die "no pgjet binary at $SRC_BIN"

T=$(mktemp -d "${TMPDIR:-/var/tmp}/pgjet-demo.XXXXXX")
chmod 755 "$T"
mkdir -p "$T/bin"
install -m 755 "$SRC_BIN" "$T/bin/pgjet"
BIN=$T/bin/pgjet
info "work dir: $T"
info "pgjet: $(as_pg "$BIN" --version 2>&1 || true)"

# ------------------------------------------------------------------ 2. source cluster
step "Create a PostgreSQL $PGV cluster with data (pgbench scale $SCALE, a second tablespace)"
P1=$(free_port)
PRIMARY=$T/primary
STARTED+=("$PRIMARY")
pg_make_cluster "$PGV" "$PRIMARY" "$P1"
info "primary: PGDATA $PRIMARY/data, socket $PRIMARY/sock, port $P1, pid $(pg_cluster_pid "$PRIMARY")"

mkdir -p "$T/ts1" && chown postgres: "$T/ts1" && chmod 700 "$T/ts1"
psql_as "$PGV" "$PRIMARY" "$P1" <<SQL
CREATE TABLESPACE ts1 LOCATION '$T/ts1';
CREATE TABLE demo_ts (id bigint PRIMARY KEY, note text) TABLESPACE ts1;
INSERT INTO demo_ts SELECT g, md5(g::text) FROM generate_series(1, 100000) g;
SQL
as_pg "$(pg_bindir "$PGV")/pgbench" -h "$PRIMARY/sock" -p "$P1" -U postgres -i -q -s "$SCALE" postgres 2>&1 | tail -n 2
# some transactions so that abalance is not all zero
as_pg "$(pg_bindir "$PGV")/pgbench" -h "$PRIMARY/sock" -p "$P1" -U postgres -n -c 2 -t 1000 postgres \
    | grep -E 'transactions actually processed|tps' || true
psql_as "$PGV" "$PRIMARY" "$P1" -c "CHECKPOINT"
info "database size: $(psql_as "$PGV" "$PRIMARY" "$P1" -Atc "SELECT pg_size_pretty(sum(pg_database_size(oid))) FROM pg_database")"

CHECK_SQL="SELECT count(*), sum(abalance) FROM pgbench_accounts"
TS_SQL="SELECT count(*), sum(id) FROM demo_ts"
SRC_ACC=$(psql_as "$PGV" "$PRIMARY" "$P1" -Atc "$CHECK_SQL")
SRC_TS=$(psql_as "$PGV" "$PRIMARY" "$P1" -Atc "$TS_SQL")
info "source: pgbench_accounts count|sum(abalance) = $SRC_ACC ; demo_ts (in ts1) count|sum(id) = $SRC_TS"

# ------------------------------------------------------------------ 3. backup and restore
REPO=$T/repo
mkdir -p "$REPO" && chown postgres: "$REPO" && chmod 700 "$REPO"
CONN=(--stanza "$STANZA" --repo-path "$REPO" --pg-path "$PRIMARY/data" --pg-port "$P1"
      --pg-socket-path "$PRIMARY/sock")

step "pgjet stanza-create"
pgjet stanza-create "${CONN[@]}"

step "pgjet backup --start-fast"
time pgjet backup "${CONN[@]}" --type full --start-fast

step "pgjet info"
pgjet info --stanza "$STANZA" --repo-path "$REPO"
pgjet info --stanza "$STANZA" --repo-path "$REPO" --output json
echo

step "pgjet verify"
pgjet verify --stanza "$STANZA" --repo-path "$REPO"

step "pgjet restore into a new directory (tablespace ts1 mapped elsewhere)"
RESTORED=$T/restored
mkdir -p "$RESTORED/data" "$RESTORED/sock" "$T/ts1-restored"
chown postgres: "$RESTORED" "$RESTORED/data" "$RESTORED/sock" "$T/ts1-restored"
chmod 700 "$RESTORED/data" "$T/ts1-restored"
time pgjet restore --stanza "$STANZA" --repo-path "$REPO" --pg-path "$RESTORED/data" \
    --set latest --tablespace-map "ts1=$T/ts1-restored"
for l in "$RESTORED"/data/pg_tblspc/*; do
    [ -L "$l" ] && info "restored tablespace link: pg_tblspc/$(basename "$l") -> $(readlink "$l")"
done

step "Start the restored cluster on another port and compare with the source"
P2=$(free_port)
while [ "$P2" = "$P1" ]; do P2=$(free_port); done
# the restored postgresql.conf is the source's: override port and socket directory
cat >>"$RESTORED/data/postgresql.auto.conf" <<EOF
port = $P2
unix_socket_directories = '$RESTORED/sock'
EOF
STARTED+=("$RESTORED")
pg_start_cluster "$PGV" "$RESTORED"
pg_wait_ready "$PGV" "$RESTORED" "$P2" 120
# --type default recovers to the end of the archive (here the WAL the backup holds: the
# cluster does not archive) and promotes: wait for it
for _ in $(seq 1 300); do
    [ "$(psql_as "$PGV" "$RESTORED" "$P2" -Atc 'SELECT pg_is_in_recovery()')" = f ] && break
    sleep 0.2
done
info "restored: PGDATA $RESTORED/data, port $P2, pid $(pg_cluster_pid "$RESTORED"), in recovery: $(psql_as "$PGV" "$RESTORED" "$P2" -Atc 'SELECT pg_is_in_recovery()')"
DST_ACC=$(psql_as "$PGV" "$RESTORED" "$P2" -Atc "$CHECK_SQL")
DST_TS=$(psql_as "$PGV" "$RESTORED" "$P2" -Atc "$TS_SQL")
info "source   pgbench_accounts: $SRC_ACC   demo_ts: $SRC_TS"
info "restored pgbench_accounts: $DST_ACC   demo_ts: $DST_TS"
if [ "$SRC_ACC" != "$DST_ACC" ] || [ "$SRC_TS" != "$DST_TS" ]; then
    die "restored rows differ from the source"
fi
info "OK: the restored cluster holds the same rows"
pg_stop_cluster "$RESTORED"

# ------------------------------------------------------------------ 4. replica
step "pgjet replica-create --start from the primary"
REPLICA=$T/replica
P3=$(free_port)
while [ "$P3" = "$P1" ] || [ "$P3" = "$P2" ]; do P3=$(free_port); done
mkdir -p "$REPLICA/data" "$T/ts1-replica"
chown postgres: "$REPLICA" "$REPLICA/data" "$T/ts1-replica"
chmod 700 "$REPLICA/data" "$T/ts1-replica"
STARTED+=("$REPLICA")
time pgjet replica-create --source "host=$PRIMARY/sock port=$P1 user=postgres dbname=postgres" \
    --pg-path "$REPLICA/data" --pg-port "$P3" --tablespace-map "ts1=$T/ts1-replica" \
    --slot demo_replica --start-fast --start
# where does the standby listen? postmaster.pid line 4 = port, line 5 = socket directory
[ -f "$REPLICA/data/postmaster.pid" ] || die "replica-create --start: no postmaster.pid in $REPLICA/data"
R_PORT=$(sed -n 4p "$REPLICA/data/postmaster.pid")
R_SOCK=$(sed -n 5p "$REPLICA/data/postmaster.pid")
info "replica: PGDATA $REPLICA/data, port $R_PORT, socket $R_SOCK, pid $(pg_cluster_pid "$REPLICA")"
rpsql() {
    as_pg "$(pg_bindir "$PGV")/psql" -X -q -v ON_ERROR_STOP=1 -h "$R_SOCK" -p "$R_PORT" -U postgres -d postgres "$@"
}
for _ in $(seq 1 600); do
    as_pg "$(pg_bindir "$PGV")/pg_isready" -q -h "$R_SOCK" -p "$R_PORT" && break
    sleep 0.1
done
info "replica in recovery: $(rpsql -Atc 'SELECT pg_is_in_recovery()')"
info "primary pg_stat_replication: $(psql_as "$PGV" "$PRIMARY" "$P1" -Atc "SELECT application_name||' '||state||' slot='||coalesce((SELECT string_agg(slot_name, ',') FROM pg_replication_slots WHERE active), '-') FROM pg_stat_replication")"

step "Insert a row on the primary and watch it arrive on the replica"
MARK="hello from the primary at $(date +%T.%N)"
psql_as "$PGV" "$PRIMARY" "$P1" -c "INSERT INTO demo_ts VALUES (1000001, '$MARK')"
info "inserted on the primary: (1000001, '$MARK')"
t0=$(date +%s.%N)
got=""
for _ in $(seq 1 300); do
    got=$(rpsql -Atc "SELECT note FROM demo_ts WHERE id = 1000001" 2>/dev/null || true)
    [ -n "$got" ] && break
    sleep 0.1
done
[ "$got" = "$MARK" ] || die "the row did not arrive on the replica within 30 s"
info "on the replica after $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}') s: (1000001, '$got')"
info "replica pgbench_accounts: $(rpsql -Atc "$CHECK_SQL") (source $SRC_ACC)"

step "Done"
info "stanza-create, backup, info, verify, restore and replica-create all worked."
