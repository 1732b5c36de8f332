#!/usr/bin/env bash
# Per-core rates of this machine, the inputs of docs/scaling.md: each compression method the
# BASE_BACKUP stream can use (zstd 3 = the server's default, zstd 1, lz4, gzip 1 = the level
# auto asks for), on pgbench relation pages and on random bytes, one thread each way; TLS
# (AES-256-GCM, what both transports' connections cipher); the disk's direct write and read.
# No time is asserted: a measurement (bench/README.md).
#
#   bash bench/rates.sh                       # builds a pgbench scale-10 cluster to sample
#   PGB_FILE=/path/to/relation/file bash bench/rates.sh
#   MB=64 REPORT=/tmp/rates.md bash bench/rates.sh     # smaller samples (CI's smoke size)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MB=${MB:-512}                       # MiB of each sample
DIR=${RATES_DIR:-/var/tmp/pgjet-rates}
REPORT=${REPORT:-$DIR/rates.md}
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}

for c in zstd lz4 gzip openssl dd; do
    command -v "$c" >/dev/null || { echo "rates: missing $c (scripts/install-deps.sh)" >&2; exit 1; }
done
rm -rf "$DIR"; mkdir -p "$DIR"; chown postgres: "$DIR"
cleanup() {
    if [ -f "$DIR/pg/postmaster.pid" ]; then
        runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DIR/pg" -m immediate stop >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT

src=${PGB_FILE:-}
if [ -z "$src" ]; then
    # a throwaway cluster: pgbench scale 10 (about 130 MiB of pgbench_accounts), repeated to MB
    port=$(( 20000 + RANDOM % 20000 ))
    runuser -u postgres -- "$PGBIN/initdb" -D "$DIR/pg" -U postgres >/dev/null
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DIR/pg" -w -o "-k $DIR -p $port -c listen_addresses=''" start >/dev/null
    runuser -u postgres -- "$PGBIN/pgbench" -h "$DIR" -p "$port" -U postgres -i -q -s 10 postgres >/dev/null 2>&1
    rel=$(runuser -u postgres -- "$PGBIN/psql" -h "$DIR" -p "$port" -U postgres -Atc "SELECT pg_relation_filepath('pgbench_accounts')")
    runuser -u postgres -- "$PGBIN/psql" -h "$DIR" -p "$port" -U postgres -qc CHECKPOINT
    src=$DIR/pg/$rel
fi
while [ "$(stat -c %s "$DIR/pgb" 2>/dev/null || echo 0)" -lt $(( MB << 20 )) ]; do cat "$src" >>"$DIR/pgb"; done
truncate -s "${MB}M" "$DIR/pgb"
head -c "${MB}M" /dev/urandom >"$DIR/rnd"

out=()
P() { out+=("$*"); echo "$*"; }
mbs() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f", b / s / 1048576 }'; }
secs() { local t0 t1; t0=$(date +%s.%N); "$@"; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }'; }

P "# Per-core rates on this machine"
P ""
P "$(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); ${MB} MiB samples in memory (page cache), one thread; MiB/s of uncompressed bytes."
P ""
P "| sample | method | ratio | compress MiB/s | decompress MiB/s |"
P "|---|---|---:|---:|---:|"
for x in pgb rnd; do
    f=$DIR/$x; n=$(stat -c %s "$f")
    cat "$f" >/dev/null
    for m in "zstd -3" "zstd -1" "lz4 -1" "gzip -1"; do
        tool=${m% *}; lvl=${m#* }; z=$DIR/$x.z
        case $tool in
            zstd) c=(zstd -q -T1 "$lvl" -c); d=(zstd -q -d -c) ;;
            lz4) c=(lz4 -q "$lvl" -c); d=(lz4 -q -d -c) ;;
            gzip) c=(gzip "$lvl" -c); d=(gzip -d -c) ;;
        esac
        tc=$(secs bash -c "$(printf '%q ' "${c[@]}") <'$f' >'$z'")
        td=$(secs bash -c "$(printf '%q ' "${d[@]}") <'$z' >/dev/null")
        zs=$(stat -c %s "$z")
        P "| $([ $x = pgb ] && echo pgbench pages || echo random bytes) | $m | $(awk -v a="$n" -v b="$zs" 'BEGIN { printf "%.1f", a / b }') | $(mbs "$n" "$tc") | $(mbs "$n" "$td") |"
        rm -f "$z"
    done
done
P ""
aes=$(openssl speed -elapsed -seconds 2 -evp aes-256-gcm 2>/dev/null | awk 'tolower($1) ~ /^aes-256-gcm/ {print $NF}')
P "- TLS cipher (AES-256-GCM, 16 KiB blocks, openssl speed, one thread): $(awk -v k="${aes%k}" 'BEGIN { printf "%.0f", k * 1000 / 1048576 }') MiB/s"
sync
w=$(dd if=/dev/zero of="$DIR/w" bs=8M count=$(( MB / 8 )) oflag=direct 2>&1 | tail -n 1)
P "- disk, direct write of ${MB} MiB in 8 MiB blocks: ${w##*, }"
r=$(dd if="$DIR/w" of=/dev/null bs=8M iflag=direct 2>&1 | tail -n 1)
P "- disk, direct read of the same: ${r##*, }"
rm -f "$DIR/w" "$DIR/pgb" "$DIR/rnd"
printf '%s\n' "${out[@]}" >"$REPORT"
echo "report written to $REPORT"
