#!/usr/bin/env bash
# The README's "Five-minute tour", run as written on this Debian 12 machine, as root: its
# Install block, its config file, and every line of its sh blocks, in order, against
# PostgreSQL 15 clusters made the Debian way (pg_createcluster, config in /etc/postgresql).
# A surprise (a command that fails, a restored cluster that does not start or lacks rows, a
# standby that does not stream from its slot after the re-sync) fails the tour.
#
#   bash scripts/tour.sh              # CI runs it after the cargo tests (scripts/test.sh)
#
# What the README names is used as named: `sudo -u postgres pgjet` (pgjet installed in
# /usr/local/bin as the Install block does, man pages and completion included), the config
# file /etc/pgjet/pgjet.conf, the repository /var/lib/pgjet, the CA file /etc/pgjet/ca.crt,
# the socket directory /var/run/postgresql, the role's password in ~postgres/.pgpass. So the tour refuses to run where any of these
# exists and was not made by an earlier tour, and removes what it made on exit. One host
# plays every part, so only these are replaced (sed, on the README's text):
#   - the clusters: `15 main` and /var/lib/postgresql/15/main become the tour's primary
#     (`15 tour`) in the local, S3 and archiving blocks, and its new standby (`15
#     tourstandby`) in the replica block; `restored` becomes `tourrestored`; port 5432 and
#     5433 become free ports;
#   - the primary's host (db1.example.com, db1) becomes localhost and its port, under TLS with a CA
#     made here; /srv/pg becomes a directory under the tour's temp dir;
#   - the S3 server becomes versitygw on 127.0.0.1, in the README's region (its endpoint, port,
#     keys, CA, uri-style, passphrase);
#   - the example time of the time target becomes a time between the tour's two commits.
# Servers it starts listen on loopback and the Unix socket only, and are stopped on exit.
#
# Env: PGJET=/path/to/pgjet (no build), KEEP=1 (keep the temp dir), TMPDIR (default /var/tmp).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
# shellcheck source=scripts/pg-env.sh
source "$HERE/pg-env.sh"
export PATH="$PATH:${HOME:-/root}/.cargo/bin"

say() { printf '\n\033[1m[tour] %s\033[0m\n' "$*"; }
die() { printf '\nTOUR FAILED: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run as root"

MARK=.made-by-pgjet-tour
T=""
MADE=()            # files and directories the tour made outside $T, removed on exit
CLUSTERS=()        # Debian clusters (version/name) the tour made
VGW_PID=""
cleanup() {
    local rc=$? c p
    set +e
    for c in "${CLUSTERS[@]}"; do
        pg_dropcluster --stop "${c%/*}" "${c#*/}" >/dev/null 2>&1
        rm -rf "/etc/postgresql/$c"       # what pg_dropcluster leaves: the tour's marker
    done
    [ -n "$VGW_PID" ] && kill "$VGW_PID" 2>/dev/null
    for p in "${MADE[@]}"; do rm -rf "$p"; done
    if [ -n "$T" ] && [ -d "$T" ]; then
        if [ "${KEEP:-0}" = 1 ]; then echo "KEEP=1: kept $T"; else rm -rf "$T"; fi
    fi
    [ $rc -eq 0 ] || echo "tour exited with status $rc" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- what the README names
# claim PATH: refuse one that exists unless an earlier tour made it (its marker, a sibling
# .made-by-pgjet-tour.NAME, left by a tour that was killed), and remove both on exit
claim() {
    local p=$1 m
    m=$(dirname "$p")/$MARK.$(basename "$p")
    if [ -e "$p" ] && [ ! -e "$m" ]; then
        die "$p exists and was not made by the tour: the tour uses the README's paths as they are, so it runs only on a machine without them"
    fi
    rm -rf "$p"
    mkdir -p "$(dirname "$p")" && touch "$m"
    MADE+=("$p" "$m")
}
PGPASS=$(getent passwd postgres | cut -d: -f6)/.pgpass
for p in /usr/local/bin/pgjet /etc/pgjet /var/lib/pgjet /etc/bash_completion.d/pgjet "$PGPASS"; do claim "$p"; done
for c in tour tourstandby tourrestored tourpitr; do
    if [ -d "/etc/postgresql/15/$c" ]; then
        [ -e "/etc/postgresql/15/$c/$MARK" ] || die "a Debian cluster 15/$c exists that the tour did not make"
        pg_dropcluster --stop 15 "$c"
    fi
    rm -rf "/var/lib/postgresql/15/$c" "/etc/postgresql/15/$c"
done

say "dependencies (scripts/install-deps.sh) and the build"
bash "$HERE/install-deps.sh" >/dev/null
command -v sudo >/dev/null || die "no sudo: scripts/install-deps.sh installs it"
if [ -n "${PGJET:-}" ]; then SRC_BIN=$PGJET; else (cd "$ROOT" && cargo build --release -q); SRC_BIN=$ROOT/target/release/pgjet; fi
T=$(mktemp -d "${TMPDIR:-/var/tmp}/pgjet-tour.XXXXXX")
chmod 755 "$T"
mkdir -p "$T/blocks" "$T/srv" "$T/pki"

# ---------------------------------------------------------------- the README's text
README=$ROOT/README.md
# section TITLE: the README's lines from "## TITLE" to the next "## " heading
section() { awk -v t="## $1" '$0 == t {on = 1; next} on && /^## / {exit} on' "$README"; }
# blocks LANG: the fenced blocks of that language in stdin, one file each: $T/blocks/LANG.N
blocks() {
    awk -v lang="$1" -v dir="$T/blocks" '
        $0 == "```" lang {n++; on = 1; f = dir "/" lang "." n; printf "" > f; next}
        on && $0 == "```" {on = 0; close(f); next}
        on {print >> f}' 
}
section "Install" | sed 's/^```sh$/```install-sh/' | blocks install-sh
section "Configuration" | blocks ini
mv "$T/blocks/ini.1" "$T/blocks/config.ini"
section "Five-minute tour" | blocks sh
section "Five-minute tour" | blocks ini
ls "$T/blocks"
[ -f "$T/blocks/sh.4" ] && [ -f "$T/blocks/ini.2" ] || die "the README's tour no longer has the blocks this script runs: update it"

P1=$(free_port); P2=$(free_port); while [ "$P2" = "$P1" ]; do P2=$(free_port); done
P3=$(free_port); while [ "$P3" = "$P1" ] || [ "$P3" = "$P2" ]; do P3=$(free_port); done
# sub ROLE FILE: the substitutions of the header, ROLE being the cluster /var/lib/.../main is
sub() {
    local role=$1 f=$2
    sed -i -e "s#/var/lib/postgresql/15/main#/var/lib/postgresql/15/$role#g" \
        -e "s#/etc/postgresql/15/main#/etc/postgresql/15/$role#g" \
        -e "s#\b15 main\b#15 $role#g" -e "s#\b15 restored\b#15 tourrestored#g" \
        -e "s#pg-port=5432#pg-port=$P1#; s#-p 5433#-p $P3#g; s#-p 5432#-p $P2#g" \
        -e "s#host=db1\.example\.com #host=localhost port=$P1 #g; s#host=db1 #host=localhost port=$P1 #g" \
        -e "s#/srv/pg#$T/srv#g" "$f"
}
run_block() {   # FILE [DIR: where it runs, / by default]
    local f=$1
    say "README block $(basename "$f"):"
    sed 's/^/    /' "$f"
    (cd "${2:-/}" && bash -euo pipefail -x "$f") || die "a command of the README's block $(basename "$f") failed"
}

# ---------------------------------------------------------------- Install
say "the README's Install block"
sub tour "$T/blocks/install-sh.1"
# run in the source tree (its `cargo build` as written, unless PGJET names the binary)
[ -n "${PGJET:-}" ] && sed -i -e '/^cargo build/d' -e "s#target/release/pgjet#$SRC_BIN#" "$T/blocks/install-sh.1"
run_block "$T/blocks/install-sh.1" "$ROOT"
MADE+=(/usr/local/share/man/man1/pgjet.1 /usr/local/share/man/man1/pgjet-*.1)
man -l /usr/local/share/man/man1/pgjet-backup.1 2>/dev/null | grep -q 'EXIT STATUS' \
    || groff -man -Tutf8 /usr/local/share/man/man1/pgjet-backup.1 2>/dev/null | grep -q 'EXIT STATUS' \
    || die "man pgjet-backup has no EXIT STATUS section"

# ---------------------------------------------------------------- the primary, Debian's way
say "the primary: a Debian cluster 15/tour (pg_createcluster), pgbench data, TLS with a CA made here"
(cd "$T/pki" && sh -c '
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=tour-ca
    printf "subjectAltName=DNS:localhost,IP:127.0.0.1\n" >san.ext
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile san.ext
' >/dev/null 2>&1) || die "openssl failed"
chown postgres: "$T/pki"/server.* && chmod 600 "$T/pki/server.key"
make_cluster() {   # NAME PORT -> a Debian cluster, not started, listening on loopback only
    pg_createcluster -q 15 "$1" -p "$2" -o listen_addresses=localhost -- -k >/dev/null
    CLUSTERS+=("15/$1")
    touch "/etc/postgresql/15/$1/$MARK"
    cat >"/etc/postgresql/15/$1/conf.d/tour.conf" <<EOF
ssl_cert_file = '$T/pki/server.crt'
ssl_key_file = '$T/pki/server.key'
EOF
}
make_cluster tour "$P1"
# the role's lines of docs/commands.md, for loopback, first (Debian's file ends with "host
# all all 127.0.0.1/32 scram-sha-256", which would match before them)
{ printf 'hostssl %s replicator 127.0.0.1/32 scram-sha-256\n' postgres replication
  cat /etc/postgresql/15/tour/pg_hba.conf; } >"$T/hba" && cat "$T/hba" >/etc/postgresql/15/tour/pg_hba.conf
pg_ctlcluster 15 tour start
PSQL=(sudo -u postgres psql -X -q -v ON_ERROR_STOP=1 -h /var/run/postgresql -p "$P1" -d postgres)
PGBENCH=(sudo -u postgres /usr/lib/postgresql/15/bin/pgbench -h /var/run/postgresql -p "$P1")
"${PGBENCH[@]}" -i -q -s 5 postgres >/dev/null 2>&1
"${PGBENCH[@]}" -n -c 2 -t 300 postgres >/dev/null
ROWS="SELECT count(*), sum(abalance) FROM pgbench_accounts"
SRC=$("${PSQL[@]}" -Atc "$ROWS")
# a README-reader's replication role: the grants of docs/commands.md, "A role for pgjet"
awk '/^### A role for pgjet/ {on = 1} on && /^```sql$/ {s = 1; next} s && /^```$/ {exit} s' \
    "$ROOT/docs/commands.md" | sed "s/PASSWORD '...'/PASSWORD 'tour-secret'/" >"$T/role.sql"
"${PSQL[@]}" -f "$T/role.sql"
# its password where libpq and pgjet look for it, as postgres: ~postgres/.pgpass
install -m 600 -o postgres /dev/null "$PGPASS"
echo "localhost:$P1:*:replicator:tour-secret" >"$PGPASS"
echo "primary: /var/lib/postgresql/15/tour, port $P1; pgbench_accounts count|sum = $SRC"

# ---------------------------------------------------------------- config file
say "the README's config file, as /etc/pgjet/pgjet.conf"
sub tour "$T/blocks/config.ini"
install -d -m 755 /etc/pgjet
install -m 600 -o postgres "$T/blocks/config.ini" /etc/pgjet/pgjet.conf
cat /etc/pgjet/pgjet.conf

# ---------------------------------------------------------------- a local backup and restore
sub tour "$T/blocks/sh.1"
run_block "$T/blocks/sh.1"
sudo -u postgres pg_ctlcluster 15 tourrestored status >/dev/null 2>&1 \
    || die "the README's restore block left no running cluster 15/tourrestored"
GOT=$(sudo -u postgres psql -X -h /var/run/postgresql -p "$P3" -d postgres -Atc "$ROWS")
[ "$GOT" = "$SRC" ] || die "the restored copy holds $GOT, the primary $SRC"
echo "restored copy (15/tourrestored, port $P3): $GOT, as the primary"
pg_dropcluster --stop 15 tourrestored
# Beside the README: the same restore into a plain directory says the copy lacks the config
# Debian keeps in /etc, and how to start it.
install -d -o postgres -m 700 "$T/srv/plain"
OUT=$(sudo -u postgres pgjet --stanza main restore --pg-path "$T/srv/plain" --archive-mode off 2>&1)
grep -q 'has no postgresql.conf, pg_hba.conf, pg_ident.conf' <<<"$OUT" \
    || die "a restore of a Debian cluster into a plain directory did not say it lacks its config files:
$OUT"
rm -rf "$T/srv/plain"

# ---------------------------------------------------------------- a replica on another host
say "the standby's host: Debian's package made and started a cluster there; here 15/tourstandby"
make_cluster tourstandby "$P2"
pg_ctlcluster 15 tourstandby start
install -m 644 "$T/pki/ca.crt" /etc/pgjet/ca.crt
sub tourstandby "$T/blocks/sh.2"
run_block "$T/blocks/sh.2"
SPSQL=(sudo -u postgres psql -X -q -h /var/run/postgresql -p "$P2" -d postgres)
for _ in $(seq 1 300); do
    [ "$("${PSQL[@]}" -Atc "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")" = 1 ] && break
    sleep 0.2
done
SLOTS=$("${PSQL[@]}" -Atc "SELECT string_agg(slot_name || ':' || active, ',') FROM pg_replication_slots")
[ "$SLOTS" = "standby1:true" ] || die "after the re-sync the primary's slots are '$SLOTS', not standby1 in use"
[ "$("${SPSQL[@]}" -Atc 'SELECT pg_is_in_recovery()')" = t ] || die "the re-synced standby is not in recovery"
"${PSQL[@]}" -c "CREATE TABLE tour_mark AS SELECT 'streamed' AS note"
for _ in $(seq 1 300); do
    [ "$("${SPSQL[@]}" -Atc "SELECT note FROM tour_mark" 2>/dev/null)" = streamed ] && break
    sleep 0.2
done
[ "$("${SPSQL[@]}" -Atc "SELECT note FROM tour_mark")" = streamed ] \
    || die "a row committed on the primary did not reach the re-synced standby"
echo "standby 15/tourstandby streams from slot standby1 after its re-sync; a new row arrived"
pg_dropcluster --stop 15 tourstandby
"${PSQL[@]}" -c "SELECT pg_drop_replication_slot('standby1')" >/dev/null

# ---------------------------------------------------------------- an S3 repository
say "an S3 server: versitygw on 127.0.0.1, TLS with the tour's CA"
VGW=$(for c in /usr/local/bin/versitygw /root/go/bin/versitygw "$(command -v versitygw || true)"; do
    [ -x "$c" ] && { echo "$c"; break; }; done)
[ -n "$VGW" ] || die "no versitygw: scripts/install-deps.sh builds it"
PS3=$(free_port)
mkdir -p "$T/s3/backups"
ROOT_ACCESS_KEY_ID=tourkey ROOT_SECRET_ACCESS_KEY=toursecret "$VGW" --quiet --keep-alive --region eu-west-1 \
    --port "127.0.0.1:$PS3" --cert "$T/pki/server.crt" --key "$T/pki/server.key" posix "$T/s3" \
    </dev/null >"$T/versitygw.log" 2>&1 &
VGW_PID=$!
for _ in $(seq 1 100); do
    curl -s -o /dev/null --cacert "$T/pki/ca.crt" "https://localhost:$PS3/" && break
    sleep 0.1
done
sub tour "$T/blocks/ini.1"
sed -i -e "s#^repo1-s3-endpoint=.*#repo1-s3-endpoint=localhost\nrepo1-storage-port=$PS3\nrepo1-storage-ca-file=$T/pki/ca.crt#" \
    -e "s#^repo1-s3-key=.*#repo1-s3-key=tourkey#; s#^repo1-s3-key-secret=.*#repo1-s3-key-secret=toursecret#" \
    -e "s#^repo1-s3-uri-style=host#repo1-s3-uri-style=path#; s#^repo1-cipher-pass=.*#repo1-cipher-pass=tour-passphrase#" \
    -e "s#^pg-path=/var/lib/postgresql/15/tour\$#&\npg-port=$P1\npg-socket-path=/var/run/postgresql#" "$T/blocks/ini.1"
install -m 600 -o postgres "$T/blocks/ini.1" /etc/pgjet/pgjet.conf
sed 's/^/    /' /etc/pgjet/pgjet.conf
sub tour "$T/blocks/sh.3"
run_block "$T/blocks/sh.3"
[ -n "$(find "$T/s3/backups/pgjet" -type f | head -1)" ] || die "nothing was stored under the bucket's prefix pgjet"

# ---------------------------------------------------------------- archiving and PITR
say "WAL archiving: the README's postgresql.conf lines (Debian: in /etc/postgresql/15/tour/conf.d), a restart"
grep -v '^#' "$T/blocks/ini.2" >/etc/postgresql/15/tour/conf.d/archiving.conf
cat /etc/postgresql/15/tour/conf.d/archiving.conf
pg_ctlcluster 15 tour restart
# The block runs in two parts: up to its backup; then the tour's commits (rows 1, 2 and 3,
# the restore point after 1, the time target after 2); then its restores, each copy read
# before the next command stops it.
sub tour "$T/blocks/sh.4"
sed -i -e 's/\b15 pitr\b/15 tourpitr/g' -e "s#-p 5434#-p $P3#" "$T/blocks/sh.4"
n=$(grep -n '^[^#]*pgjet .* restore ' "$T/blocks/sh.4" | head -1 | cut -d: -f1)
while [ "$n" -gt 1 ] && sed -n "$((n - 1))p" "$T/blocks/sh.4" | grep -q '^#'; do n=$((n - 1)); done
head -n $((n - 1)) "$T/blocks/sh.4" >"$T/blocks/sh.4a"
tail -n +"$n" "$T/blocks/sh.4" >"$T/blocks/sh.4b"
run_block "$T/blocks/sh.4a"
"${PSQL[@]}" -c "CREATE TABLE tour_pitr (n int); INSERT INTO tour_pitr VALUES (1)"
"${PSQL[@]}" -c "SELECT pg_create_restore_point('before-migration')" >/dev/null
"${PSQL[@]}" -c "INSERT INTO tour_pitr VALUES (2)"
sleep 1.2
AT=$("${PSQL[@]}" -Atc "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || '+00'")
sleep 1.2
"${PSQL[@]}" -c "INSERT INTO tour_pitr VALUES (3)"
SEG=$("${PSQL[@]}" -Atc "SELECT pg_walfile_name(pg_switch_wal())")
for _ in $(seq 1 300); do
    last=$("${PSQL[@]}" -Atc "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver")
    [[ ! "$last" < "$SEG" ]] && break
    sleep 0.2
done
sed -i "s#2026-11-22 14:15:02+00#$AT#" "$T/blocks/sh.4b"
cat >"$T/blocks/rows.sh" <<ROWS
# rows.sh EXPECTED: the point-in-time copy on port $P3, once promoted, holds rows EXPECTED
for _ in \$(seq 1 300); do
    [ "\$(sudo -u postgres psql -X -h /var/run/postgresql -p $P3 -d postgres -Atc 'SELECT pg_is_in_recovery()' 2>/dev/null)" = f ] && break
    sleep 0.2
done
got=\$(sudo -u postgres psql -X -h /var/run/postgresql -p $P3 -d postgres -Atc "SELECT string_agg(n::text, ',' ORDER BY n) FROM tour_pitr")
echo "the point-in-time copy holds rows \$got"
[ "\$got" = "\$1" ] || { echo "TOUR FAILED: the point-in-time copy holds rows '\$got', not '\$1'" >&2; exit 1; }
ROWS
awk -v rows="bash $T/blocks/rows.sh" '/pg_ctlcluster 15 tourpitr stop/ {print rows " 1"} {print} END {print rows " 1,2"}' \
    "$T/blocks/sh.4b" >"$T/blocks/sh.4c"
CLUSTERS+=("15/tourpitr")
run_block "$T/blocks/sh.4c"

say "the tour ran as written: no surprise"
