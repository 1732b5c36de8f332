//! pgjet's integration tests, in one test binary (as ripgrep's tests/ are): the shared code in
//! `common/` and pgjet's library are compiled and linked once, and the tests of every module
//! share one pool of test threads. Run one module with its path as the filter:
//! `cargo test --release --test it -- remote::` (scripts/test.sh runs the whole suite).
//! Shared servers and clusters (a module's `OnceLock` fixtures) live as long as the process.

#[macro_use]
mod common;

mod archive;
mod basebackup;
mod failover;
mod faults;
mod fuzz;
mod incremental;
mod layers;
mod million;
mod modes;
mod netlab;
mod object_stores;
mod patroni;
mod remote;
mod resume;
mod storm;
mod stream;
mod tls;
mod versions;
mod walscan;
