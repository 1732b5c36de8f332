//! Sources on other hosts, with nothing installed on the primary. [`libpq`] reads a cluster
//! through ordinary connections to its server (parallel ranges); [`basebackup`] decodes the
//! replication protocol's `BASE_BACKUP` stream (server-side compression) read over a
//! [`replication`] connection. A pgjet agent will join them behind the same
//! [`crate::transfer::Source`] seam. [`control`] is the connection that asks the server its
//! facts and holds the copy's slots: the SQL session, or a replication connection in its
//! place for a role pg_hba.conf lets in for replication only.
pub mod basebackup;
pub mod control;
pub mod libpq;
pub mod replication;
pub mod wal_stream;
