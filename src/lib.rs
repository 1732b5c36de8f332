//! pgjet: PostgreSQL physical backup, restore, replica creation and WAL archiving.
//!
//! The library knows nothing of the terminal: commands report progress through
//! [`transfer::Progress`] and return typed [`error::Error`]s; the binary maps them to exit codes.
pub mod codec;
pub mod commands;
pub mod error;
pub mod options;
pub mod pg;
pub mod remote;
pub mod repo;
pub mod storage;
pub mod transfer;
