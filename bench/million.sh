#!/usr/bin/env bash
# A million files: peak RSS and time of pgjet backup, verify and restore of a PostgreSQL 15
# cluster whose data directory holds FILES small files, on a posix repository.
#
# The files are made directly in the cluster's database directory (base/<oid>/) with names
# PostgreSQL does not use (pgjet_<n>, FILE_BYTES random bytes each): PostgreSQL ignores
# them, pgjet backs them up and restores them like any other file, and a cluster of a
# million files is made in a minute instead of the hours CREATE TABLE would take. Everything
# lives on an ext4 image mounted through a loop device, so that removing it afterwards is an
# unmount. One run, not a benchmark of record: the report goes to stdout and
# $BENCH_DIR/report.md.
#
#   FILES=1000000 JOBS=2 bash bench/million.sh
#   FILES=100000 NOJOURNAL=1 bash bench/million.sh   # the image without an ext4 journal
#
# The restore runs twice: cold (page cache dropped) into an empty directory, then, once the
# restored cluster was checked, warm: the restored directory removed and restored again at
# once, without dropping the cache (a busy host, a restore run again). On ext4 without a
# journal the second is far slower: the kernel does not reuse an inode freed in the last
# minute while its inode table block is cached (fs/ext4/ialloc.c, recently_deleted(), checked
# only when there is no journal), and skips past every one of them for each new file.
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-1000000}
FILE_BYTES=${FILE_BYTES:-100}
JOBS=${JOBS:-2}
ONLY_BACKUP=${ONLY_BACKUP:-0}   # 1: time the backup only
PGJET=${PGJET:-target/release/pgjet}
BENCH_DIR=${BENCH_DIR:-/var/tmp/pgjet-million}
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
PORT=${PORT:-55471}
IMG_GB=${IMG_GB:-24}
NOJOURNAL=${NOJOURNAL:-0}       # 1: make the image's ext4 without a journal

die() { echo "million.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (servers run as postgres through runuser)"
[ -x "$PGJET" ] || die "no pgjet binary at $PGJET (cargo build --release)"
[ -x /usr/bin/time ] || die "GNU time is missing (apt-get install time)"
mountpoint -q "$BENCH_DIR/mnt" 2>/dev/null && die "$BENCH_DIR/mnt is mounted (another run?)"

mkdir -p "$BENCH_DIR/mnt"
M=$BENCH_DIR/mnt
PG_PID=""
cleanup() {
    if [ -n "$PG_PID" ] && kill -0 "$PG_PID" 2>/dev/null; then
        runuser -u postgres -- "$PGBIN/pg_ctl" -D "$M/data" -m fast -w stop >/dev/null 2>&1 || kill "$PG_PID"
    fi
    for d in "$M/restore"; do
        [ -f "$d/postmaster.pid" ] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$d" -m fast -w stop >/dev/null 2>&1 || true
    done
    mountpoint -q "$M" && { umount "$M" || umount -l "$M"; }
    rm -f "$BENCH_DIR/fs.img"
}
trap cleanup EXIT

rm -f "$BENCH_DIR/fs.img"
truncate -s "${IMG_GB}G" "$BENCH_DIR/fs.img"
mkfs_opts=()
[ "$NOJOURNAL" = 1 ] && mkfs_opts=(-O ^has_journal)
mkfs.ext4 -q -F "${mkfs_opts[@]}" -N $((FILES * 2 + 200000)) "$BENCH_DIR/fs.img"
mount -o loop "$BENCH_DIR/fs.img" "$M"
mkdir -p "$M/sock" "$M/repo" "$M/bin"
cp "$PGJET" "$M/bin/pgjet"
chown -R postgres: "$M"
as_pg() { runuser -u postgres -- "$@"; }

echo "== cluster: initdb, $FILES files of $FILE_BYTES bytes"
as_pg "$PGBIN/initdb" -D "$M/data" -k -A trust >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$M/data" -l "$M/pg.log" -w \
    -o "-p $PORT -k $M/sock -c listen_addresses=''" start >/dev/null
PG_PID=$(head -1 "$M/data/postmaster.pid")
psql() { as_pg "$PGBIN/psql" -h "$M/sock" -p "$PORT" -d postgres -qAtX "$@"; }
psql -c "CREATE TABLE t AS SELECT g AS a FROM generate_series(1, 100000) g; CHECKPOINT"
DBOID=$(psql -c "SELECT oid FROM pg_database WHERE datname = 'postgres'")
t0=$(date +%s.%N)
as_pg python3 - "$M/data/base/$DBOID" "$FILES" "$FILE_BYTES" <<'EOF'
import os, sys
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    fd = os.open(f"{d}/pgjet_{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(size))
    os.close(fd)
EOF
echo "   made in $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN {printf "%.1f", a - b}') s; $(find "$M/data" -type f | wc -l) files in the data directory"

cat >"$M/pgjet.conf" <<EOF
[global]
repo1-path=$M/repo
# in the file, not on the command line: stanza-create takes no --jobs
process-max=$JOBS

[main]
pg1-path=$M/data
pg1-socket-path=$M/sock
pg1-port=$PORT
EOF
chown postgres: "$M/pgjet.conf"
PJ=(runuser -u postgres -- "$M/bin/pgjet" --config "$M/pgjet.conf" --stanza main)
pj() { "${PJ[@]}" "$@"; }
pj stanza-create >/dev/null

REPORT=$BENCH_DIR/report.md
{
    echo "# $FILES files of $FILE_BYTES bytes (plus a 100 000-row table), PostgreSQL 15, posix repository, --jobs $JOBS, ext4 $([ "$NOJOURNAL" = 1 ] && echo "without" || echo "with") a journal"
    echo
    echo "$(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r); pgjet $(git rev-parse --short HEAD)"
    echo
    echo "| command | seconds | peak RSS MiB |"
    echo "|---|---|---|"
} >"$REPORT"

timed() { # name, command...
    local name=$1; shift
    sync; [ "${COLD:-1}" = 0 ] || echo 3 >/proc/sys/vm/drop_caches   # COLD=0: warm (the CI smoke)
    local t0 t1
    t0=$(date +%s.%N)
    /usr/bin/time -f "%M" -o "$BENCH_DIR/$name.rss" "$@" >"$BENCH_DIR/$name.log" 2>&1 \
        || { echo "| $name | FAILED (see $BENCH_DIR/$name.log) | |" >>"$REPORT"; tail -5 "$BENCH_DIR/$name.log"; return 1; }
    sync
    t1=$(date +%s.%N)
    local rss
    rss=$(tail -1 "$BENCH_DIR/$name.rss")
    printf '| %s | %.1f | %.0f |\n' "$name" "$(awk -v a="$t1" -v b="$t0" 'BEGIN {print a - b}')" "$(awk -v k="$rss" 'BEGIN {print k / 1024}')" >>"$REPORT"
    tail -1 "$REPORT"
}

echo "== timed runs"
# BACKUP_ARGS: more options for the backup (e.g. --log-level debug, which logs memory by phase).
# shellcheck disable=SC2086
timed backup "${PJ[@]}" backup ${BACKUP_ARGS:-}
if [ "$ONLY_BACKUP" = 1 ]; then cat "$REPORT"; exit 0; fi
timed info "${PJ[@]}" info
timed verify "${PJ[@]}" verify
timed restore "${PJ[@]}" restore --pg-path "$M/restore"

# (PostgreSQL fsyncs every file of a data directory it recovers, unless told to syncfs:
# a million fsyncs take minutes, and are not what is measured here.)
echo "== the restored cluster starts and holds the rows and the files"
echo "port = $((PORT + 1))" >>"$M/restore/postgresql.auto.conf"
as_pg "$PGBIN/pg_ctl" -D "$M/restore" -l "$M/restore.log" -w -t 300 \
    -o "-k $M/sock -c listen_addresses='' -c recovery_init_sync_method=syncfs" start >/dev/null
rows=$(as_pg "$PGBIN/psql" -h "$M/sock" -p $((PORT + 1)) -d postgres -qAtX -c "SELECT count(*) FROM t")
as_pg "$PGBIN/pg_ctl" -D "$M/restore" -m fast -w stop >/dev/null
n=$(find "$M/restore/base/$DBOID" -name 'pgjet_*' | wc -l)
same=$(cmp "$M/data/base/$DBOID/pgjet_$((FILES / 2))" "$M/restore/base/$DBOID/pgjet_$((FILES / 2))" && echo yes || echo NO)
ok=yes
[ "$rows" = 100000 ] && [ "$n" = "$FILES" ] && [ "$same" = yes ] || ok=no
# Again, warm: the restored directory removed and the backup restored at once.
rm -rf "$M/restore"
COLD=0 timed restore_warm "${PJ[@]}" restore --pg-path "$M/restore" || ok=no
{
    echo
    echo "Restored cluster: started, $rows rows in t (100000 expected), $n of $FILES files, a sample file identical: $same.$( [ $ok = yes ] || echo " FAIL")"
    echo "restore: page cache dropped first; restore_warm: right after the restored directory was removed, cache not dropped."
} >>"$REPORT"
echo
cat "$REPORT"
[ $ok = yes ]
