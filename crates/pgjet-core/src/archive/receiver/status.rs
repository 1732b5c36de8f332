//! What the running receiver ([`super`]) shows of itself: a small JSON file in the stanza's
//! spool directory (`<spool-path>/archive/<stanza>/stream.json`), rewritten about once a
//! second (write and rename), which `info --output prometheus` turns into the `pgjet_stream_*`
//! metrics. Best effort: a file that cannot be written costs a debug line, not the stream.
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The file's name in the stanza's spool directory.
pub const STATUS_FILE: &str = "stream.json";

/// The receiver's state. LSNs as byte positions (PostgreSQL's `XLogRecPtr` as a number).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamStatus {
    /// The receiver's process.
    pub pid: u32,
    /// When this was written (Unix seconds).
    pub updated: f64,
    /// Streaming from a server now.
    pub connected: bool,
    /// The server streamed from (`host=... port=...`), empty before the first connection.
    pub server: String,
    /// The timeline streamed.
    pub timeline: u32,
    /// The position after the last byte received.
    pub received_lsn: u64,
    /// The position after the last byte durable in every repository (reported to the
    /// server as flushed).
    pub stored_lsn: u64,
    /// The server's end of WAL, as its last message said.
    pub server_lsn: u64,
    /// Seconds since the repositories last held everything the server had sent (0 when
    /// they do now).
    pub lag_seconds: f64,
    /// Connections made again after the first (lost connections, failovers).
    pub reconnects: u64,
    /// Tail chunks written into every repository, and the seconds their writes took
    /// (the repositories' own latency for the small writes a synchronous commit waits on).
    #[serde(default)]
    pub tail_writes: u64,
    #[serde(default)]
    pub tail_write_seconds: f64,
    /// WAL received at the server's end of WAL and reported flushed once durable, and the
    /// seconds from its receipt to the report: what a commit waits on the receiver for in
    /// synchronous mode, the tail's write included.
    #[serde(default)]
    pub flush_reports: u64,
    #[serde(default)]
    pub flush_wait_seconds: f64,
}

/// The status file of the stanza whose spool directory is `spool_dir`.
pub fn status_path(spool_dir: &Path) -> PathBuf {
    spool_dir.join(STATUS_FILE)
}

/// Writes `st` to `path` (a temporary file renamed over it). Best effort.
pub fn write(path: &Path, st: &StreamStatus) {
    let written = serde_json::to_vec(st)
        .map_err(|e| e.to_string())
        .and_then(|json| {
            crate::io::fs::write_whole(path, &json, crate::io::fs::FILE_MODE)
                .map_err(|e| e.to_string())
        });
    if let Err(e) = written {
        tracing::debug!("the stream's status file {}: {e}", path.display());
    }
}

/// Reads the status file at `path`: None when there is none or it cannot be read.
pub fn read(path: &Path) -> Option<StreamStatus> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = status_path(dir.path());
        assert_eq!(read(&p), None);
        let st = StreamStatus {
            pid: std::process::id(),
            updated: 1.5,
            connected: true,
            server: "host=a".into(),
            timeline: 2,
            received_lsn: 100,
            stored_lsn: 90,
            server_lsn: 120,
            lag_seconds: 0.25,
            reconnects: 3,
            tail_writes: 4,
            tail_write_seconds: 0.1,
            flush_reports: 4,
            flush_wait_seconds: 0.11,
        };
        write(&p, &st);
        assert_eq!(read(&p), Some(st));
    }
}
