#!/usr/bin/env bash
# Tests pgjet's Debian package (scripts/build-deb.sh, docs/packaging.md) on Debian 12, as root:
#   bash scripts/test-package.sh            # builds pgjet with cargo first
#   PGJET_BIN=path/to/pgjet bash scripts/test-package.sh
# 1. builds the .deb and checks its control data and its file list, with modes and owners;
# 2. installs it with dpkg -i into a clean Debian 12 root (debootstrap --variant=minbase, with
#    systemd, cached as /var/cache/pgjet-test/bookworm.tar and unpacked afresh for every run):
#    the binary runs, manual pages, completions, the config's mode and group (without, then
#    with a postgres user: postinst's chgrp), and `systemd-analyze verify` of every unit;
# 3. on this host, runs the units' command lines as they are in the package (/usr/bin/pgjet
#    and /usr/lib/pgjet/* taken from the extracted package) against a throwaway PostgreSQL 15
#    cluster: stanza-create, then pgjet-backup@'s ExecStart lines (a full, then an incr through
#    BACKUP_TYPE), pgjet-metrics@'s and pgjet-verify@'s (with its ExecStopPost), and checks
#    the metrics files with `promtool check metrics`;
# 4. `promtool check rules` and `promtool test rules` on packaging/prometheus/;
# 5. purges the package in the clean root and checks that nothing of it is left.
# Everything it starts is stopped and everything it makes is removed, also on failure.
set -euo pipefail
if [ -n "${PGJET_BIN:-}" ]; then PGJET_BIN=$(realpath "$PGJET_BIN"); fi # before the cd
cd "$(dirname "$0")/.."
SECONDS=0
log() { echo "test-package: $*" >&2; }
fail() {
    log "FAILED: $*"
    exit 1
}

[ "$(id -u)" = 0 ] || fail "run as root (dpkg, chroot, the postgres user)"
[ -x /usr/lib/postgresql/15/bin/initdb ] || fail "PostgreSQL 15 is missing: bash scripts/install-deps.sh"
command -v promtool >/dev/null || fail "promtool is missing: bash scripts/install-deps.sh"
getent passwd postgres >/dev/null || fail "no postgres user (PostgreSQL 15's package makes it)"
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v systemd-analyze >/dev/null || need+=(systemd)
if [ ${#need[@]} -gt 0 ]; then
    log "apt: installing ${need[*]}"
    apt-get install -y -q --no-install-recommends "${need[@]}" </dev/null >&2 \
        || { apt-get update -q </dev/null >&2 && apt-get install -y -q --no-install-recommends "${need[@]}" </dev/null >&2; }
fi

tmp=$(mktemp -d /tmp/pgjet-package-test.XXXXXX)
chmod 0755 "$tmp" # the postgres user runs the extracted binary and the cluster below it
chroot_dir=$tmp/root
stanza=pkgtest$$
pgbin=/usr/lib/postgresql/15/bin
data=$tmp/pg/data
runtime_dir= # the metrics unit's RuntimeDirectory, made in /run as systemd would

cleanup() {
    local rc=$?
    set +e
    if [ -f "$data/postmaster.pid" ]; then
        runuser -u postgres -- "$pgbin/pg_ctl" -D "$data" -m immediate -w stop >/dev/null 2>&1
    fi
    [ -n "$runtime_dir" ] && rm -rf "$runtime_dir"
    # nothing is mounted into the clean root; should something be, it is left, not deleted through
    if [ -d "$chroot_dir" ] && findmnt -rn -o TARGET | grep -q "^$chroot_dir"; then
        log "something is mounted below $chroot_dir: $tmp left in place"
    else
        rm -rf "$tmp"
    fi
    if [ "$rc" -eq 0 ]; then log "passed in ${SECONDS}s"; else log "failed (status $rc) after ${SECONDS}s"; fi
}
trap cleanup EXIT

# ---------------------------------------------------------------- 1. build and inspect
if [ -n "${PGJET_BIN:-}" ]; then
    deb=$(bash scripts/build-deb.sh "$PGJET_BIN" | tail -n1)
else
    deb=$(bash scripts/build-deb.sh | tail -n1)
fi
[ -f "$deb" ] || fail "build-deb.sh made no package"
log "package: $deb"
dpkg-deb --info "$deb" >&2
[ "$(dpkg-deb --field "$deb" Package)" = pgjet ] || fail "Package is not pgjet"
[[ "$(dpkg-deb --field "$deb" Depends)" == *"libc6 (>= "* ]] || fail "Depends does not name libc6"

pkg=$tmp/pkg # the package's files, for the command lines run on this host
dpkg-deb -x "$deb" "$pkg"
pkgbin=$pkg/usr/bin/pgjet
"$pkgbin" --version >&2

# Every file with its mode, nothing more (directories aside): the manual pages of every command
# `pgjet --help` lists, the config 0640, scripts 0755, the rest 0644.
commands=$("$pkgbin" --help | awk '/^Commands:/ { on = 1; next } /^[^ ]/ { on = 0 } on && NF { print $1 }' | grep -vx help)
{
    echo "-rwxr-xr-x ./usr/bin/pgjet"
    echo "-rw-r----- ./etc/pgjet/pgjet.conf"
    for u in backup verify metrics; do
        echo "-rw-r--r-- ./lib/systemd/system/pgjet-$u@.service"
        echo "-rw-r--r-- ./lib/systemd/system/pgjet-$u@.timer"
    done
    echo "-rw-r--r-- ./lib/systemd/system/pgjet-archive-stream@.service"
    echo "-rwxr-xr-x ./usr/lib/pgjet/write-textfile"
    echo "-rwxr-xr-x ./usr/lib/pgjet/write-verify-metric"
    echo "-rw-r--r-- ./usr/share/man/man1/pgjet.1.gz"
    for c in $commands; do echo "-rw-r--r-- ./usr/share/man/man1/pgjet-$c.1.gz"; done
    echo "-rw-r--r-- ./usr/share/bash-completion/completions/pgjet"
    echo "-rw-r--r-- ./usr/share/zsh/vendor-completions/_pgjet"
    echo "-rw-r--r-- ./usr/share/fish/vendor_completions.d/pgjet.fish"
    echo "-rw-r--r-- ./usr/share/pgjet/prometheus/pgjet-alerts.yml"
    echo "-rw-r--r-- ./usr/share/doc/pgjet/copyright"
    echo "-rw-r--r-- ./usr/share/doc/pgjet/changelog.Debian.gz"
} | LC_ALL=C sort >"$tmp/expected-files"
dpkg-deb --contents "$deb" | awk '$1 !~ /^d/ { print $1, $6 }' | LC_ALL=C sort >"$tmp/files"
diff -u "$tmp/expected-files" "$tmp/files" >&2 || fail "the package's files differ from the expected list (- expected, + in the package)"
if dpkg-deb --contents "$deb" | awk '$2 != "root/root"' | grep .; then
    fail "files not owned by root/root"
fi
[ "$(dpkg-deb --info "$deb" conffiles)" = /etc/pgjet/pgjet.conf ] || fail "pgjet.conf is not the conffile"
cmp "$pkg/usr/share/pgjet/prometheus/pgjet-alerts.yml" packaging/prometheus/pgjet-alerts.yml \
    || fail "the packaged alert rules differ from packaging/prometheus/pgjet-alerts.yml"
log "contents: $(wc -l <"$tmp/files") files as expected"

# ---------------------------------------------------------------- 2. a clean Debian 12 root
# debootstrap's minbase (essential packages and apt) plus systemd, which every Debian 12
# machine runs and systemd-analyze needs (--root: the units it depends on). Built once from
# this machine's mirror, then unpacked afresh for every run.
cache=/var/cache/pgjet-test/bookworm.tar
bootstrap_args="--variant=minbase --include=systemd bookworm"
mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
    # the mirror apt uses here: deb822 .sources (URIs: of a bookworm stanza) or sources.list
    mirror=$(awk 'BEGIN { RS = ""; FS = "\n" }
        { uris = ""; suites = ""
          for (i = 1; i <= NF; i++) {
              if ($i ~ /^URIs:/) { uris = $i; sub(/^URIs:[ \t]*/, "", uris); split(uris, u, " "); uris = u[1] }
              if ($i ~ /^Suites:/) suites = " " $i " "
          }
          if (uris != "" && suites ~ / bookworm /) { print uris; exit } }' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { if ($(i + 1) == "bookworm") { print $i; exit } break } }' /etc/apt/sources.list)
fi
mirror=${mirror:-http://deb.debian.org/debian}
if [ ! -f "$cache" ] || [ "$(cat "$cache.args" 2>/dev/null)" != "$bootstrap_args" ]; then
    log "debootstrap $bootstrap_args from $mirror into the cache $cache (once)"
    mkdir -p "$(dirname "$cache")"
    boot=$tmp/bootstrap
    # shellcheck disable=SC2086 # the arguments are words
    debootstrap $bootstrap_args "$boot" "$mirror" >"$tmp/debootstrap.log" 2>&1 \
        || { tail -n 30 "$tmp/debootstrap.log" >&2; fail "debootstrap"; }
    rm -rf "$boot"/var/cache/apt/archives/*.deb "$boot"/var/lib/apt/lists/*
    tar -C "$boot" --numeric-owner -cf "$cache.tmp.$$" .
    mv "$cache.tmp.$$" "$cache"
    echo "$bootstrap_args" >"$cache.args"
    rm -rf "$boot"
fi
mkdir "$chroot_dir"
tar -C "$chroot_dir" --numeric-owner -xf "$cache"
# in_root CMD...: CMD in the clean root (also stat: owners by the root's own users)
in_root() { chroot "$chroot_dir" "$@"; }
# What the root holds before the package, to compare with after the purge: all but dpkg's and
# apt's state, logs, and the user accounts this test adds.
snapshot() {
    (cd "$chroot_dir" && find . -xdev | sed 's|^\.||' | grep -vE '^/(var/lib/dpkg|var/log|var/cache/debconf|var/cache/ldconfig)(/|$)|^/etc/(passwd|group|shadow|gshadow|subuid|subgid)-?$|^/etc/\.pwd\.lock$' | LC_ALL=C sort)
}
snapshot >"$tmp/before"
[ "$(wc -l <"$tmp/before")" -gt 1000 ] || fail "the clean root's file list is too short: $(wc -l <"$tmp/before") entries"
cp "$deb" "$chroot_dir/tmp/pgjet.deb"

# Installed where there is no postgres user: the config stays root's, no spool.
in_root dpkg -i /tmp/pgjet.deb >&2
version=$(dpkg-deb --field "$deb" Version)
[ "$(in_root /usr/bin/pgjet --version)" = "pgjet ${version%-*}" ] || fail "pgjet --version in the clean root"
[ "$(in_root stat -c '%a %U %G' /etc/pgjet/pgjet.conf)" = "640 root root" ] \
    || fail "pgjet.conf without a postgres group: $(in_root stat -c '%a %U %G' /etc/pgjet/pgjet.conf)"
[ ! -e "$chroot_dir/var/spool/pgjet" ] || fail "a spool was made without a postgres user"
# Then a postgres user appears and the package is installed again (postinst's configure
# again, as on an upgrade): the config's group is postgres, the spool is postgres's.
in_root groupadd --system postgres
in_root useradd --system --gid postgres --home-dir /var/lib/postgresql --no-create-home postgres
in_root dpkg -i /tmp/pgjet.deb >&2
[ "$(in_root stat -c '%a %U %G' /etc/pgjet/pgjet.conf)" = "640 root postgres" ] \
    || fail "pgjet.conf with a postgres group: $(in_root stat -c '%a %U %G' /etc/pgjet/pgjet.conf)"
[ "$(in_root stat -c '%a %U %G' /var/spool/pgjet)" = "750 postgres postgres" ] \
    || fail "the spool: $(in_root stat -c '%a %U %G' /var/spool/pgjet)"
in_root dpkg --verify pgjet || fail "dpkg --verify pgjet"
# manual pages: gzip'd roff, one per command (man itself is not in minbase)
for page in pgjet $(for c in $commands; do echo "pgjet-$c"; done); do
    f=$chroot_dir/usr/share/man/man1/$page.1.gz
    [ -f "$f" ] || fail "no manual page $page"
    grep -q "^\.TH $page 1" <<<"$(zcat "$f")" || fail "$page.1.gz is not a roff page titled $page"
done
grep -q 'start\\-fast' <<<"$(zcat "$chroot_dir/usr/share/man/man1/pgjet-backup.1.gz")" \
    || fail "pgjet-backup(1) does not document --start-fast"
# completions: present, and bash's parses
for f in usr/share/bash-completion/completions/pgjet usr/share/zsh/vendor-completions/_pgjet \
    usr/share/fish/vendor_completions.d/pgjet.fish; do
    [ -s "$chroot_dir/$f" ] || fail "no completion /$f"
done
in_root bash -n /usr/share/bash-completion/completions/pgjet || fail "the bash completion does not parse"
grep -q 'complete -c pgjet' "$chroot_dir/usr/share/fish/vendor_completions.d/pgjet.fish" || fail "fish completion"
[ "$(head -n1 "$chroot_dir/usr/share/zsh/vendor-completions/_pgjet")" = '#compdef pgjet' ] || fail "zsh completion"
log "installed in a clean Debian 12 root: binary, manual pages, completions, config 0640 root:postgres"

# systemd-analyze verify of every unit, with the clean root's systemd units and binaries
# (--root): an instance of each template. Any message is a failure, not only its exit status.
units=()
for u in backup verify metrics; do units+=("pgjet-$u@main.service" "pgjet-$u@main.timer"); done
units+=(pgjet-archive-stream@main.service)
for u in "${units[@]}"; do
    out=$(systemd-analyze verify --root="$chroot_dir" --man=no --generators=no "$u" 2>&1) \
        || fail "systemd-analyze verify $u: $out"
    [ -z "$out" ] || fail "systemd-analyze verify $u: $out"
done
# systemd-analyze checks only the first command of each Exec*= kind: every command's
# program must be an absolute path to an executable of the clean root.
for f in "$chroot_dir"/lib/systemd/system/pgjet-*; do
    while IFS= read -r exe; do
        exe=${exe#"${exe%%/*}"} # without the prefixes + - ! @ :
        exe=${exe%% *}
        [ -x "$chroot_dir$exe" ] || fail "$(basename "$f"): $exe is not an executable of the package or the system"
    done < <(sed -n 's/^Exec[A-Za-z]*=//p' "$f")
done
log "systemd-analyze verify: ${units[*]}"
# The timers enabled as the admin would (systemctl enable): their links are the postrm's to
# remove on purge.
timers=(pgjet-backup@main.timer pgjet-verify@main.timer pgjet-metrics@main.timer)
systemctl --root="$chroot_dir" enable "${timers[@]}" >&2
for t in "${timers[@]}"; do
    [ -L "$chroot_dir/etc/systemd/system/timers.target.wants/$t" ] || fail "systemctl enable $t made no link"
done

# ---------------------------------------------------------------- 3. the units' command lines
# A throwaway PostgreSQL 15 cluster, archiving through the package's pgjet: no TCP listener,
# the socket in a directory of its own, so no other server can be in the way.
port=55432
sock=$tmp/pg/sock
conf=$tmp/pgjet.conf
textfile=$tmp/textfile
install -d -o postgres -g postgres -m 0700 "$tmp/pg" "$sock"
install -d -o postgres -g postgres -m 0750 "$tmp/repo" "$tmp/spool"
install -d -m 0755 "$textfile"
cat >"$conf" <<EOF
[global]
repo1-path=$tmp/repo
spool-path=$tmp/spool
[$stanza]
pg1-path=$data
pg1-port=$port
pg1-socket-path=$sock
EOF
chgrp postgres "$conf" # as the package's /etc/pgjet/pgjet.conf
chmod 0640 "$conf"
runuser -u postgres -- "$pgbin/initdb" -D "$data" --auth=trust -U postgres --no-sync >"$tmp/initdb.log" 2>&1 \
    || { cat "$tmp/initdb.log" >&2; fail initdb; }
cat >>"$data/postgresql.conf" <<EOF
listen_addresses = ''
port = $port
unix_socket_directories = '$sock'
archive_mode = on
archive_command = '$pkgbin --config=$conf --stanza=$stanza archive-push %p'
EOF
runuser -u postgres -- "$pgbin/pg_ctl" -D "$data" -l "$tmp/pg/server.log" -w start >/dev/null \
    || { cat "$tmp/pg/server.log" >&2; fail "PostgreSQL did not start"; }
as_postgres() { (cd / && runuser -u postgres -- env PGJET_CONFIG="$conf" "$@"); }
as_postgres "$pkgbin" --stanza="$stanza" stanza-create >&2

# unit_lines UNIT KEY: the values of KEY= in the package's unit file, as written
unit_lines() { sed -n "s/^$2=//p" "$pkg/lib/systemd/system/$1"; }
# run_unit_line UNIT LINE [NAME=VALUE...]: runs one Exec line of UNIT as systemd would for the
# instance $stanza: %i is the stanza; ${NAME} is one word and $NAME is split at blanks, from
# the unit's Environment= lines and then NAME=VALUE (what an EnvironmentFile would set); the
# process gets them, PGJET_CONFIG (the test's config, where the units read /etc/pgjet's) and
# what systemd sets for ExecStopPost when given; it runs as the unit's User=, or root for a
# '+' line. The one substitution: /usr/bin/pgjet and /usr/lib/pgjet/* are the extracted
# package's. Anything else systemd would interpret (quotes, other specifiers) is refused here.
run_unit_line() {
    local unit=$1 line=$2 user prefix w name val kv
    shift 2
    local - # no globbing of the words below
    set -f
    local -A uenv=()
    while IFS= read -r kv; do uenv[${kv%%=*}]=${kv#*=}; done < <(unit_lines "$unit" Environment)
    for kv in "$@"; do uenv[${kv%%=*}]=${kv#*=}; done
    user=$(unit_lines "$unit" User)
    prefix=${line%%/*}
    line=${line#"$prefix"}
    case "$prefix" in '') ;; +) user=root ;; *) fail "$unit: prefix $prefix not handled by this test" ;; esac
    line=${line//%i/$stanza}
    case "$line" in *%* | *\"* | *\'* | *\\*) fail "$unit: $line: quotes or specifiers this test does not expand" ;; esac
    local argv=()
    [ -z "${UNIT_WRAP:-}" ] || line="$UNIT_WRAP $line"
    for w in $line; do
        if [[ $w =~ ^\$([A-Za-z_][A-Za-z0-9_]*)$ ]]; then # $NAME: split, maybe no word at all
            # shellcheck disable=SC2206
            argv+=(${uenv[${BASH_REMATCH[1]}]:-})
            continue
        fi
        while [[ $w =~ \$\{([A-Za-z_][A-Za-z0-9_]*)\} ]]; do # ${NAME}: within the word
            name=${BASH_REMATCH[1]}
            val=${uenv[$name]:-}
            w=${w//\$\{$name\}/$val}
        done
        case "$w" in /usr/bin/pgjet | /usr/lib/pgjet/*) w=$pkg$w ;; esac
        argv+=("$w")
    done
    local envv=(PGJET_CONFIG="$conf")
    for name in "${!uenv[@]}"; do envv+=("$name=${uenv[$name]}"); done
    log "$unit ($user): ${argv[*]}"
    (cd / && runuser -u "$user" -- env "${envv[@]}" "${argv[@]}" </dev/null)
}
# run_unit UNIT KEY [NAME=VALUE...]: every KEY= line of UNIT, in order, stopping at a failure
run_unit() {
    local unit=$1 key=$2 line
    shift 2
    while IFS= read -r line; do
        run_unit_line "$unit" "$line" "$@" || return
    done < <(unit_lines "$unit" "$key")
}

# pgjet-backup@: a full (the default BACKUP_TYPE), then an incr as /etc/pgjet/backup-STANZA.env
# would ask, each followed by expire.
[ "$(unit_lines pgjet-backup@.service ExecStart | wc -l)" = 2 ] || fail "pgjet-backup@.service: two ExecStart lines expected"
run_unit pgjet-backup@.service ExecStart >&2 || fail "pgjet-backup@$stanza's ExecStart lines"
as_postgres "$pkgbin" --stanza="$stanza" info >&2
as_postgres "$pkgbin" --stanza="$stanza" info --output prometheus >"$tmp/info.prom"
grep -qx "pgjet_backups{stanza=\"$stanza\",repo=\"1\",type=\"full\"} 1" "$tmp/info.prom" || fail "info shows no full backup"
grep -qx "pgjet_backups{stanza=\"$stanza\",repo=\"1\",type=\"incr\"} 0" "$tmp/info.prom" || fail "info shows an incr backup"
run_unit pgjet-backup@.service ExecStart BACKUP_TYPE=incr >&2 || fail "pgjet-backup@$stanza's ExecStart lines with BACKUP_TYPE=incr"
as_postgres "$pkgbin" --stanza="$stanza" info --output prometheus >"$tmp/info.prom"
grep -qx "pgjet_backups{stanza=\"$stanza\",repo=\"1\",type=\"full\"} 1" "$tmp/info.prom" || fail "info: not one full backup after the incr"
grep -qx "pgjet_backups{stanza=\"$stanza\",repo=\"1\",type=\"incr\"} 1" "$tmp/info.prom" || fail "info shows no incr backup (BACKUP_TYPE)"
log "pgjet-backup@$stanza: one full and one incr backup, as its command lines took them"

# pgjet-metrics@: its RuntimeDirectory (systemd makes it, owned by User=), ExecStart as
# postgres into it, ExecStartPost as root into the textfile directory.
runtime_dir=/run/$(unit_lines pgjet-metrics@.service RuntimeDirectory)
runtime_dir=${runtime_dir//%i/$stanza}
install -d -o postgres -g postgres -m 0755 "$runtime_dir"
run_unit pgjet-metrics@.service ExecStart TEXTFILE_DIR="$textfile" >&2 || fail "pgjet-metrics@$stanza's ExecStart"
run_unit pgjet-metrics@.service ExecStartPost TEXTFILE_DIR="$textfile" >&2 || fail "pgjet-metrics@$stanza's ExecStartPost"
rm -rf "$runtime_dir"
runtime_dir=
m=$textfile/pgjet-$stanza.prom
[ "$(stat -c '%a %U' "$m")" = "644 root" ] || fail "$m: $(stat -c '%a %U' "$m")"
grep -qx "pgjet_backups{stanza=\"$stanza\",repo=\"1\",type=\"incr\"} 1" "$m" || fail "$m has no incr backup"
grep -q "^pgjet_archive_push_queue_segments{stanza=\"$stanza\"} " "$m" || fail "$m has no archive-push queue (pg1-path)"
promtool check metrics <"$m" || fail "promtool check metrics $m"

# pgjet-verify@: ExecStopPost as systemd runs it after a failure (status 5), then the real
# verify and its ExecStopPost.
vm=$textfile/pgjet-verify-$stanza.prom
run_unit pgjet-verify@.service ExecStopPost TEXTFILE_DIR="$textfile" \
    SERVICE_RESULT=exit-code EXIT_CODE=exited EXIT_STATUS=5 >&2 || fail "pgjet-verify@'s ExecStopPost"
grep -qx "pgjet_verify_last_success{stanza=\"$stanza\"} 0" "$vm" || fail "$vm: a failed verify is not 0"
grep -qx "pgjet_verify_last_exit_status{stanza=\"$stanza\"} 5" "$vm" || fail "$vm: no exit status 5"
rc=0
run_unit pgjet-verify@.service ExecStart TEXTFILE_DIR="$textfile" >&2 || rc=$?
result=success
[ "$rc" = 0 ] || result=exit-code
run_unit pgjet-verify@.service ExecStopPost TEXTFILE_DIR="$textfile" \
    SERVICE_RESULT=$result EXIT_CODE=exited EXIT_STATUS=$rc >&2 || fail "pgjet-verify@'s ExecStopPost"
[ "$rc" = 0 ] || fail "pgjet-verify@$stanza's ExecStart: status $rc"
grep -qx "pgjet_verify_last_success{stanza=\"$stanza\"} 1" "$vm" || fail "$vm: the verify's success is not 1"
promtool check metrics <"$vm" || fail "promtool check metrics $vm"
[ -z "$(find "$textfile" -name '*.tmp.*')" ] || fail "temporary files left in the textfile directory"
log "pgjet-metrics@ and pgjet-verify@: $(basename "$m") and $(basename "$vm") pass promtool check metrics"

# pgjet-archive-stream@: the receiver's command line for a few seconds beside the cluster's
# archive-push (one stanza), a WAL switch meanwhile, then SIGTERM as systemd stops it: it
# must end with status 0, having made its slot and stored the switched segment.
as_postgres "$pgbin/psql" -h "$sock" -p "$port" -U postgres -qAt -c "SELECT pg_switch_wal()" postgres >/dev/null
(sleep 2 && as_postgres "$pgbin/psql" -h "$sock" -p "$port" -U postgres -qAt \
    -c "CREATE TABLE t(); DROP TABLE t; SELECT pg_switch_wal()" postgres >/dev/null) &
UNIT_WRAP="timeout -s TERM --preserve-status 6" \
    run_unit pgjet-archive-stream@.service ExecStart PGJET_SOURCE="host=$sock port=$port user=postgres" >&2 \
    || fail "pgjet-archive-stream@$stanza's ExecStart did not stop cleanly on SIGTERM"
wait
slot=$(as_postgres "$pgbin/psql" -h "$sock" -p "$port" -U postgres -qAt \
    -c "SELECT restart_lsn IS NOT NULL FROM pg_replication_slots WHERE slot_name = 'pgjet_stream_$stanza'" postgres)
[ "$slot" = t ] || fail "pgjet-archive-stream@$stanza made no slot holding WAL"
log "pgjet-archive-stream@$stanza: streamed beside archive-push, stopped cleanly by SIGTERM"

runuser -u postgres -- "$pgbin/pg_ctl" -D "$data" -m fast -w stop >/dev/null

# ---------------------------------------------------------------- 4. the alert rules
promtool check rules packaging/prometheus/pgjet-alerts.yml >&2 || fail "promtool check rules"
(cd packaging/prometheus && promtool test rules pgjet-alerts.test.yml) >&2 || fail "promtool test rules"

# ---------------------------------------------------------------- 5. purge
in_root dpkg --purge pgjet >&2
for gone in /usr/bin/pgjet /etc/pgjet /usr/lib/pgjet /usr/share/pgjet /usr/share/doc/pgjet /var/spool/pgjet \
    /lib/systemd/system/pgjet-backup@.service /lib/systemd/system/pgjet-archive-stream@.service; do
    [ ! -e "$chroot_dir$gone" ] || fail "$gone is left after the purge"
done
# shellcheck disable=SC2016 # dpkg-query's format, not the shell's
[ "$(in_root dpkg-query -W -f='${db:Status-Status}' pgjet 2>/dev/null || true)" != installed ] || fail "pgjet still installed"
rm -f "$chroot_dir/tmp/pgjet.deb"
snapshot >"$tmp/after"
diff -u "$tmp/before" "$tmp/after" >&2 || fail "the purge left files behind (+) or removed others (-)"
log "purged: nothing of the package is left in the clean root"
