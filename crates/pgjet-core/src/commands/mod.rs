//! The commands, one module each: thin entries that check what the command needs, open it
//! (repositories, the primary, the target) and call down into the rooms that do the work.
pub mod archive_get;
pub mod archive_push;
pub mod archive_stream;
pub mod backup;
pub mod check;
pub mod cipher_pass;
pub mod expire;
pub mod info;
pub mod info_pgbackrest;
pub mod info_pgbackrest_text;
pub mod metrics;
pub mod metrics_stream;
pub mod replica;
pub mod replica_seed;
pub mod replica_stream;
pub mod restore;
pub mod stanza_create;
pub mod verify;
