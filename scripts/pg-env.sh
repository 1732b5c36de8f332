# shellcheck shell=bash
# Helpers for throwaway PostgreSQL clusters, to be sourced by bash scripts run as root:
#
#   source scripts/pg-env.sh
#   port=$(free_port)
#   pg_make_cluster 15 /var/tmp/x "$port"      # initdb -k + start; data in /var/tmp/x/data
#   psql_as 15 /var/tmp/x "$port" -c 'select 1'
#   pg_stop_cluster /var/tmp/x
#
# Layout of a cluster DIR: DIR/data (PGDATA), DIR/sock (unix socket dir), DIR/log (server log).
# Servers run as the OS user `postgres` (PostgreSQL refuses root); every directory the server
# writes to is owned by postgres. Servers listen on the unix socket only (listen_addresses='')
# unless PG_LISTEN is set (e.g. PG_LISTEN=127.0.0.1).
#
# Env knobs: PG_USER (default postgres), PG18_DIR (default /opt/pgjet/pg18),
#            PG_SHARED_BUFFERS (default 128MB), PG_LISTEN (default ''),
#            PG_EXTRA_CONF (extra lines appended to postgresql.conf).

PG_USER=${PG_USER:-postgres}
PG18_DIR=${PG18_DIR:-/opt/pgjet/pg18}

# pg_bindir VERSION -> prints the bin directory of that PostgreSQL major version.
pg_bindir() {
    case "$1" in
        18) echo "$PG18_DIR/bin" ;;
        16|17) echo "/opt/pgjet/pg$1/bin" ;;
        *)  echo "/usr/lib/postgresql/$1/bin" ;;
    esac
}

# as_pg CMD... -> runs CMD as the postgres OS user, from a directory it can read.
as_pg() {
    (cd / && runuser -u "$PG_USER" -- "$@")
}

# free_port -> prints a TCP port nobody listens on, and with no listening unix socket
# .s.PGSQL.<port> anywhere. Ports are picked at random in 20000-59999 to keep parallel scripts apart.
free_port() {
    local p
    for _ in $(seq 1 200); do
        p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
        if ! ss -Hltn "sport = :$p" 2>/dev/null | grep -q . \
            && ! ss -Hlx 2>/dev/null | grep -q "\.s\.PGSQL\.$p\b"; then
            echo "$p"
            return 0
        fi
    done
    echo "free_port: no free port found" >&2
    return 1
}

# pg_make_cluster VERSION DIR PORT -> initdb (data checksums on) into DIR/data and start it.
pg_make_cluster() {
    local ver=$1 dir=$2 port=$3 bin
    bin=$(pg_bindir "$ver")
    [ -x "$bin/initdb" ] || { echo "pg_make_cluster: no PostgreSQL $ver at $bin" >&2; return 1; }
    mkdir -p "$dir/sock"
    chown "$PG_USER:" "$dir" "$dir/sock"
    chmod 700 "$dir/sock"
    as_pg "$bin/initdb" -k -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
        >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
    chown "$PG_USER:" "$dir/initdb.log"
    cat >>"$dir/data/postgresql.conf" <<EOF

# ---- pg-env.sh: throwaway cluster
port = $port
listen_addresses = '${PG_LISTEN:-}'
unix_socket_directories = '$dir/sock'
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
shared_buffers = ${PG_SHARED_BUFFERS:-128MB}
fsync = on
logging_collector = off
${PG_EXTRA_CONF:-}
EOF
    # trust on the socket and on localhost, including replication connections
    cat >"$dir/data/pg_hba.conf" <<EOF
local   all             all                     trust
local   replication     all                     trust
host    all             all     127.0.0.1/32    trust
host    replication     all     127.0.0.1/32    trust
EOF
    pg_start_cluster "$ver" "$dir"
}

# pg_start_cluster VERSION DIR -> starts the cluster in DIR/data (log DIR/log) and waits.
pg_start_cluster() {
    local ver=$1 dir=$2 bin
    bin=$(pg_bindir "$ver")
    touch "$dir/log" && chown "$PG_USER:" "$dir/log"
    as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 120 start >/dev/null \
        || { echo "pg_start_cluster: start failed; tail of $dir/log:" >&2; tail -n 30 "$dir/log" >&2; return 1; }
}

# pg_datadir DIR -> DIR/data if DIR is a cluster dir made by pg_make_cluster, else DIR itself
# (so the stop helpers also take a bare PGDATA, e.g. a restored or replica data directory).
pg_datadir() {
    if [ -d "$1/data" ] && [ ! -f "$1/PG_VERSION" ]; then echo "$1/data"; else echo "$1"; fi
}

# pg_cluster_pid DIR -> prints the postmaster PID from DIR/data/postmaster.pid (or nothing).
pg_cluster_pid() {
    local f
    f=$(pg_datadir "$1")/postmaster.pid
    [ -f "$f" ] && head -n1 "$f"
}

# pg_stop_cluster DIR -> stops the server whose PID is in DIR/data/postmaster.pid (DIR may
# also be a PGDATA): pg_ctl stop -m fast, then SIGQUIT/SIGKILL to that PID if it is still
# there. Never by process name.
pg_stop_cluster() {
    local dir pid bin
    dir=$(pg_datadir "$1")
    pid=$(pg_cluster_pid "$1") || return 0
    [ -n "$pid" ] || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    # the binaries that run this server: /proc/PID/exe
    bin=$(dirname "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" 2>/dev/null)
    if [ -x "$bin/pg_ctl" ]; then
        as_pg "$bin/pg_ctl" -D "$dir" -m fast -w -t 60 stop >/dev/null 2>&1 || true
    else
        kill -INT "$pid" 2>/dev/null || true
    fi
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -QUIT "$pid" 2>/dev/null || true
    sleep 1
    kill -KILL "$pid" 2>/dev/null || true
    return 0
}

# psql_as VERSION DIR PORT [psql args...] -> psql as postgres on the cluster's socket,
# quiet, stop on error (-X -q -v ON_ERROR_STOP=1), database postgres unless -d is given.
psql_as() {
    local ver=$1 dir=$2 port=$3
    shift 3
    as_pg "$(pg_bindir "$ver")/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir/sock" -p "$port" \
        -U postgres -d postgres "$@"
}

# pg_wait_ready VERSION DIR PORT [SECONDS] -> waits until the server accepts connections.
pg_wait_ready() {
    local ver=$1 dir=$2 port=$3 t=${4:-60}
    for _ in $(seq 1 $((t * 10))); do
        as_pg "$(pg_bindir "$ver")/pg_isready" -q -h "$dir/sock" -p "$port" && return 0
        sleep 0.1
    done
    echo "pg_wait_ready: $dir (port $port) not ready after ${t}s" >&2
    return 1
}
