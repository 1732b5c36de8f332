//! PostgreSQL knowledge: LSN and WAL segment math, page checksums, the basebackup.c file
//! rules, the data directory walk, libpq connection strings, the SQL session and the PostgreSQL `backup_manifest`
//! writer. Nothing here knows about repositories.
pub mod archiver;
pub mod checksum;
pub mod conninfo;
pub mod control;
pub mod datadir;
pub mod exclude;
pub mod lsn;
pub mod pg_manifest;
pub mod privileges;
pub mod processes;
pub mod session;
pub mod walscan;
pub mod walsummary;
