//! Physical WAL streaming on a [`ReplConn`]: `START_REPLICATION`, the WAL data and keepalive
//! messages the server sends in COPY BOTH mode, the standby status updates the client sends
//! back, and the end of a timeline.
//!
//! Message formats from PostgreSQL's documentation, "Streaming Replication Protocol"
//! (protocol-replication.html) and src/backend/replication/walsender.c (`StartReplication`,
//! `XLogSendPhysical`, `WalSndKeepalive`, `ProcessStandbyReplyMessage`):
//!
//! | message | bytes |
//! |---|---|
//! | XLogData `w` | Int64 start of the data, Int64 server's end of WAL, Int64 send time, data |
//! | keepalive `k` | Int64 server's end of WAL, Int64 send time, Byte1 reply requested |
//! | status update `r` | Int64 written, Int64 flushed, Int64 applied (each the last byte + 1), Int64 client time, Byte1 reply requested |
//!
//! Times are microseconds since 2000-01-01 00:00 UTC (PostgreSQL's epoch).
use super::replication::ReplConn;
use crate::error::Result;
use crate::pg::lsn::Lsn;
use bytes::BytesMut;
use postgres_protocol::message::frontend;
use std::time::Duration;

/// Seconds from the Unix epoch to PostgreSQL's (2000-01-01 00:00:00 UTC,
/// `POSTGRES_EPOCH_JDATE` in src/include/datatype/timestamp.h).
const PG_EPOCH_UNIX_SECS: i64 = 946_684_800;

/// The timeline that follows the one streamed, as the server reports it when the streamed
/// timeline ends (`START_REPLICATION`'s result set: `next_tli`, `next_tli_startpos`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextTimeline {
    pub timeline: u32,
    /// Where the next timeline starts (the switch point).
    pub start: Lsn,
}

/// How `START_REPLICATION` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// COPY BOTH mode: WAL follows ([`ReplConn::next_wal`]).
    Streaming,
    /// The start point is exactly the end of the requested (historic) timeline: no WAL, the
    /// next timeline instead.
    TimelineEnded(NextTimeline),
}

/// One message of the stream.
#[derive(Debug)]
pub enum WalMessage {
    /// `len` WAL bytes from `start`, not read yet: [`ReplConn::read_wal`] reads them where
    /// they are kept (the next [`ReplConn::next_wal`] skips what is left unread).
    Data {
        start: Lsn,
        /// The server's end of WAL when it sent them.
        server_end: Lsn,
        len: usize,
    },
    /// The server is alive; `reply`: it wants a status update now.
    Keepalive { server_end: Lsn, reply: bool },
    /// The server ended the stream (CopyDone): the timeline ended, or the server is
    /// shutting down. [`ReplConn::end_stream`] reads what follows.
    End,
}

/// Offset of the WAL bytes in an XLogData message's body (`w`, three Int64).
const XLOG_DATA_HEADER: usize = 25;

fn be_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Parses the row of `START_REPLICATION`'s result set at a timeline's end.
fn next_timeline(conn: &ReplConn, rows: &[Vec<Option<String>>]) -> Result<Option<NextTimeline>> {
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let col = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
    let timeline = col(0).parse::<u32>().ok();
    let start = col(1).parse::<Lsn>().ok();
    match (timeline, start) {
        (Some(timeline), Some(start)) => Ok(Some(NextTimeline { timeline, start })),
        _ => Err(conn.protocol(format!(
            "the end of a timeline named next timeline '{}' at '{}'",
            col(0),
            col(1)
        ))),
    }
}

impl ReplConn {
    /// `START_REPLICATION [SLOT slot] PHYSICAL start TIMELINE timeline`: streams WAL from
    /// `start` (any byte position) on `timeline`, holding the physical slot `slot` if given
    /// (its restart LSN then follows the flush position of the status updates).
    ///
    /// Errors: the server's refusal ([`crate::error::Error::Replication`]: the slot does not
    /// exist or is active, the WAL at `start` was removed, the start point is not in the
    /// server's history); an unexpected reply ([`crate::error::Error::Protocol`]).
    pub fn start_replication(
        &mut self,
        slot: Option<&str>,
        start: Lsn,
        timeline: u32,
    ) -> Result<Started> {
        let slot = slot
            .map(|s| format!("SLOT {} ", super::control::ident(s)))
            .unwrap_or_default();
        self.send_query(&format!(
            "START_REPLICATION {slot}PHYSICAL {start} TIMELINE {timeline}"
        ))?;
        let m = self.read_message()?;
        match m.tag {
            b'W' => Ok(Started::Streaming),
            // No COPY mode: the result set of the next timeline follows (or an error).
            b'T' | b'D' | b'C' | b'E' => {
                let mut rows = Vec::new();
                let mut failed = None;
                let mut m = m;
                loop {
                    match m.tag {
                        b'D' => rows.push(super::replication::parse_data_row(&m.body)?),
                        b'E' => failed = Some(self.server_error(&m.body)),
                        b'Z' => break,
                        _ => {}
                    }
                    m = self.read_message()?;
                }
                if let Some(e) = failed {
                    return Err(e);
                }
                match next_timeline(self, &rows)? {
                    Some(n) => Ok(Started::TimelineEnded(n)),
                    None => Err(self.protocol("START_REPLICATION ended without streaming")),
                }
            }
            other => Err(self.protocol(format!(
                "unexpected message '{}' after START_REPLICATION",
                other.escape_ascii()
            ))),
        }
    }

    /// The next message of the stream, waiting up to `timeout` for it, or for `wake` (a
    /// descriptor another thread makes readable) to be readable: None then. The WAL bytes of
    /// the message before that the caller did not read ([`Self::read_wal`]) are skipped.
    ///
    /// Errors: the server's ErrorResponse; the connection lost; a malformed message.
    pub fn next_wal(
        &mut self,
        wake: Option<std::os::fd::RawFd>,
        timeout: Duration,
    ) -> Result<Option<WalMessage>> {
        self.skip_wal(self.wal_pending)?;
        let (readable, _) = self.wait_readable(wake, timeout)?;
        if !readable {
            return Ok(None);
        }
        let (tag, len) = self.read_head()?;
        match tag {
            b'd' if len > 0 => {
                let mut kind = [0u8; 1];
                self.read_into(&mut kind)?;
                match kind[0] {
                    b'w' if len >= XLOG_DATA_HEADER => {
                        // The header here; the WAL bytes where the caller keeps them.
                        let mut h = [0u8; XLOG_DATA_HEADER - 1];
                        self.read_into(&mut h)?;
                        let int64 = |at: usize| {
                            let mut b = [0u8; 8];
                            b.copy_from_slice(&h[at..at + 8]);
                            u64::from_be_bytes(b)
                        };
                        let (start, end) = (int64(0), int64(8));
                        self.wal_pending = len - XLOG_DATA_HEADER;
                        Ok(Some(WalMessage::Data {
                            start: Lsn(start),
                            server_end: Lsn(end),
                            len: len - XLOG_DATA_HEADER,
                        }))
                    }
                    b'w' => {
                        self.read_body(len - 1)?;
                        Err(self.protocol("a WAL data message shorter than its header"))
                    }
                    b'k' => {
                        let rest = self.read_body(len - 1)?;
                        let (Some(end), Some(&reply)) = (be_u64(&rest, 0), rest.get(16)) else {
                            return Err(self.protocol("a keepalive message shorter than 18 bytes"));
                        };
                        Ok(Some(WalMessage::Keepalive {
                            server_end: Lsn(end),
                            reply: reply != 0,
                        }))
                    }
                    other => {
                        self.read_body(len - 1)?;
                        Err(self.protocol(format!(
                            "unexpected COPY data '{}' in the WAL stream",
                            other.escape_ascii()
                        )))
                    }
                }
            }
            b'd' => Err(self.protocol("empty COPY data in the WAL stream")),
            b'c' => {
                self.read_body(len)?;
                Ok(Some(WalMessage::End))
            }
            b'E' => {
                let body = self.read_body(len)?;
                Err(self.server_error(&body))
            }
            other => {
                self.read_body(len)?;
                Err(self.protocol(format!(
                    "unexpected message '{}' in the WAL stream",
                    other.escape_ascii()
                )))
            }
        }
    }

    /// Reads the next `dst.len()` WAL bytes of the last [`WalMessage::Data`] into `dst`
    /// (what the connection's read buffer holds, the rest from the socket).
    ///
    /// Errors: more bytes than the message has left ([`crate::error::Error::Protocol`]); the
    /// connection lost.
    pub fn read_wal(&mut self, dst: &mut [u8]) -> Result<()> {
        if dst.len() > self.wal_pending {
            return Err(self.protocol(format!(
                "{} WAL bytes asked for, {} left in the message",
                dst.len(),
                self.wal_pending
            )));
        }
        self.read_into(dst)?;
        self.wal_pending -= dst.len();
        Ok(())
    }

    /// Reads and drops up to `n` WAL bytes of the last [`WalMessage::Data`] (bytes the
    /// caller already has). Errors: the connection lost.
    pub fn skip_wal(&mut self, n: usize) -> Result<()> {
        let mut scratch = [0u8; 8192];
        let mut left = n.min(self.wal_pending);
        while left > 0 {
            let k = left.min(scratch.len());
            self.read_wal(&mut scratch[..k])?;
            left -= k;
        }
        Ok(())
    }

    /// Sends a standby status update: WAL received up to `written` and durable up to
    /// `flushed` (each the position after the last byte), nothing applied; `reply` asks
    /// the server to answer with a keepalive.
    ///
    /// Errors: the connection lost.
    pub fn send_status(&mut self, written: Lsn, flushed: Lsn, reply: bool) -> Result<()> {
        let now = chrono::Utc::now();
        let micros = (now.timestamp() - PG_EPOCH_UNIX_SECS) * 1_000_000
            + now.timestamp_subsec_micros() as i64;
        let mut msg = Vec::with_capacity(34);
        msg.push(b'r');
        msg.extend_from_slice(&written.0.to_be_bytes());
        msg.extend_from_slice(&flushed.0.to_be_bytes());
        msg.extend_from_slice(&0u64.to_be_bytes());
        msg.extend_from_slice(&micros.to_be_bytes());
        msg.push(reply as u8);
        let mut buf = BytesMut::new();
        frontend::CopyData::new(&msg[..])
            .map_err(|e| crate::error::Error::Other("status update".into()).because(e))?
            .write(&mut buf);
        self.send(&buf)
    }

    /// Ends COPY mode from this side (CopyDone) after the server's [`WalMessage::End`], or
    /// to stop streaming; reads what follows up to ReadyForQuery, WAL still in flight
    /// discarded. Returns the next timeline when the streamed one ended.
    ///
    /// Errors: the server's ErrorResponse; the connection lost.
    pub fn end_stream(&mut self) -> Result<Option<NextTimeline>> {
        let mut buf = BytesMut::new();
        frontend::copy_done(&mut buf);
        self.send(&buf)?;
        let mut rows = Vec::new();
        let mut failed = None;
        loop {
            let m = self.read_message()?;
            match m.tag {
                b'D' => rows.push(super::replication::parse_data_row(&m.body)?),
                b'E' => failed = Some(self.server_error(&m.body)),
                b'Z' => break,
                _ => {}
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        next_timeline(self, &rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_postgres_epoch_is_2000_01_01() {
        let t = chrono::DateTime::from_timestamp(PG_EPOCH_UNIX_SECS, 0).unwrap();
        assert_eq!(t.to_rfc3339(), "2000-01-01T00:00:00+00:00");
    }
}
