//! WAL archiving: archive-push and archive-get, synchronous ([`push`], [`get`]) and
//! asynchronous through the spool directory ([`spool`]) with one background pusher
//! ([`pusher`]) and one prefetcher ([`prefetcher`]) per stanza. The archive's format in the
//! repository is `crate::repo::wal`'s.
pub mod get;
pub mod prefetcher;
pub mod push;
pub mod pusher;
pub mod queue;
pub mod receiver;
pub mod spool;
