//! pgjet: PostgreSQL physical backup, restore, replica creation and WAL archiving.
//!
//! The library knows nothing of the terminal: commands report progress through
//! [`transfer::Progress`] and return typed [`error::Error`]s; the binary maps them to exit codes.
//! docs/architecture.md draws the rooms below and what each owns.
pub mod archive;
pub mod codec;
pub mod commands;
pub mod error;
pub mod io;
pub mod options;
pub mod pg;
pub mod pgdata;
pub mod primary;
pub mod remote;
pub mod repo;
pub mod storage;
pub mod transfer;
