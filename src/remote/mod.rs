//! Sources on other hosts, with nothing installed on the primary. [`libpq`] reads a cluster
//! through ordinary connections to its server (parallel ranges); [`basebackup`] decodes the
//! replication protocol's `BASE_BACKUP` stream (server-side compression) read over a
//! [`replication`] connection. A pgjet agent will join them behind the same
//! [`crate::transfer::Source`] seam.
pub mod basebackup;
pub mod libpq;
pub mod replication;
