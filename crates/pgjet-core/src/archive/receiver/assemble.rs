//! The receiver's side of `archive-stream` ([`super`]): the segment in progress assembled
//! from the WAL messages, complete segments and tail chunks handed to the storer, status
//! updates to the server.
use super::super::push::Archiver;
use super::status::StreamStatus;
use super::store::{hand_over, Shared, Work};
use super::ReceiverOptions;
use crate::error::{Error, Result};
use crate::pg::lsn::{self, Lsn};
use crate::remote::replication::ReplConn;
use crate::repo::wal_tail;
use crossbeam_channel::Sender;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Tails awaiting their flush report that are remembered, at most (the oldest are
/// forgotten: the figures are an average, not an account).
const AWAITING_REPORT_MAX: usize = 1024;

/// The segment in progress on the receiver's side.
pub(super) struct Segment {
    pub(super) timeline: u32,
    pub(super) segno: u64,
    /// The segment's buffer, a whole segment long (recycled: [`Shared::buffer`]); the
    /// first `filled` bytes are received.
    pub(super) bytes: Vec<u8>,
    pub(super) filled: usize,
    /// Bytes already handed to the storer as chunks.
    pub(super) handed: usize,
    /// Where each chunk handed over for this segment begins its own bytes, in order (a
    /// merged chunk also covers some before: [`wal_tail::merged_start`]).
    pub(super) chunk_starts: Vec<usize>,
    /// When the first byte not yet handed over was received.
    pub(super) unhanded_since: Option<Instant>,
}

impl Segment {
    pub(super) fn name(&self, seg_size: u64) -> String {
        lsn::wal_segment_name(self.timeline, self.segno, seg_size)
    }

    /// The segment `segno` of `timeline`, its first bytes `prefix` (a stored tail), in a
    /// buffer from `shared`.
    pub(super) fn new(
        shared: &Shared,
        seg_size: u64,
        timeline: u32,
        segno: u64,
        prefix: &[u8],
    ) -> Segment {
        let mut bytes = shared.buffer(seg_size as usize);
        bytes[..prefix.len()].copy_from_slice(prefix);
        Segment {
            timeline,
            segno,
            bytes,
            filled: prefix.len(),
            handed: prefix.len(),
            chunk_starts: Vec::new(),
            unhanded_since: None,
        }
    }
}

/// The receiver's state across connections.
pub(super) struct Stream<'a> {
    pub(super) a: &'a Archiver,
    pub(super) o: &'a ReceiverOptions,
    pub(super) seg_size: u64,
    pub(super) shared: &'a Shared,
    pub(super) tx: &'a Sender<Work>,
    pub(super) wake: &'a UnixStream,
    /// The timeline streamed and the next byte expected.
    pub(super) timeline: u32,
    pub(super) next: Lsn,
    pub(super) segment: Option<Segment>,
    /// Work the storer could not take yet (its queue was full), oldest first.
    pub(super) waiting: std::collections::VecDeque<Work>,
    pub(super) last_status: Instant,
    pub(super) last_handed: Instant,
    pub(super) reported: Lsn,
    /// The server's end of WAL, as its last message said.
    pub(super) server_end: Lsn,
    /// The server streamed from, for the status file.
    pub(super) server: String,
    /// Connections made so far.
    pub(super) connections: u64,
    /// Since when the repositories have been behind what the server sent.
    pub(super) behind_since: Option<Instant>,
    pub(super) last_shown: Option<Instant>,
    /// Tails handed over at the server's end of WAL and not yet reported flushed: the
    /// position each makes durable and when its first byte was received.
    pub(super) awaiting_report: std::collections::VecDeque<(Lsn, Instant)>,
    /// Tails reported flushed, and the time from their receipt to the report in total
    /// ([`super::status::StreamStatus::flush_reports`]).
    pub(super) flush_reports: u64,
    pub(super) flush_wait: Duration,
}

impl Stream<'_> {
    /// Hands over what waits, in order, as far as the storer takes it. True when nothing
    /// waits any more.
    pub(super) fn drain_waiting(&mut self) -> bool {
        while let Some(w) = self.waiting.pop_front() {
            if let Err(w) = hand_over(self.tx, self.shared, w) {
                self.waiting.push_front(w);
                return false;
            }
        }
        true
    }

    pub(super) fn queue(&mut self, work: Work) {
        self.waiting.push_back(work);
        self.drain_waiting();
    }

    /// Hands the bytes of the segment in progress received since the last hand-over to the
    /// storer as a tail chunk, merged with earlier chunks at the levels of [`wal_tail::merged_start`]. A chunk of
    /// this segment still waiting for the storer (a slow repository) is replaced by one
    /// that covers its bytes too.
    pub(super) fn hand_tail(&mut self) {
        let Some(seg) = &mut self.segment else {
            return;
        };
        if seg.handed >= seg.filled {
            return;
        }
        let name = seg.name(self.seg_size);
        let mut replaced = None;
        if matches!(self.waiting.back(), Some(Work::Chunk { segment, .. }) if *segment == name) {
            // It keeps its place in the levels, now reaching to here.
            if let Some(Work::Chunk { end, .. }) = self.waiting.pop_back() {
                replaced = Some(end);
            }
        } else {
            seg.chunk_starts.push(seg.handed);
        }
        let start = wal_tail::merged_start(&seg.chunk_starts, seg.chunk_starts.len());
        let end = Lsn(seg.segno * self.seg_size + seg.filled as u64);
        let work = Work::Chunk {
            segment: name,
            start: start as u64,
            bytes: seg.bytes[start..seg.filled].to_vec(),
            end,
        };
        if let Some(since) = seg.unhanded_since.take() {
            // At the server's end of WAL a commit may wait for this tail (synchronous mode).
            // A replaced chunk's wait goes on in the chunk that replaces it.
            match self.awaiting_report.back_mut() {
                Some(last) if Some(last.0) == replaced => last.0 = end,
                _ if end >= self.server_end => {
                    if self.awaiting_report.len() >= AWAITING_REPORT_MAX {
                        self.awaiting_report.pop_front();
                    }
                    self.awaiting_report.push_back((end, since));
                }
                _ => {}
            }
        }
        seg.handed = seg.filled;
        self.last_handed = Instant::now();
        self.queue(work);
    }

    /// Reads the `len` WAL bytes of the message that starts at `start` from `conn` into the
    /// segment in progress, with no message body in between (the stream is at `start` or
    /// past it: bytes received already are skipped), and hands each complete segment to the
    /// storer.
    ///
    /// Errors: `start` is past the stream's position (a hole); the connection lost.
    pub(super) fn receive(&mut self, conn: &mut ReplConn, start: Lsn, len: usize) -> Result<()> {
        if start > self.next {
            return Err(Error::Protocol {
                target: "the WAL stream".into(),
                detail: format!(
                    "the server sent WAL from {start}, but the stream is at {}",
                    self.next
                ),
            });
        }
        let skip = (self.next.0 - start.0).min(len as u64) as usize;
        conn.skip_wal(skip)?;
        let mut left = len - skip;
        while left > 0 {
            let segno = self.next.0 / self.seg_size;
            let seg = self.segment.get_or_insert_with(|| {
                Segment::new(self.shared, self.seg_size, self.timeline, segno, &[])
            });
            let n = (seg.bytes.len() - seg.filled).min(left);
            seg.unhanded_since.get_or_insert_with(Instant::now);
            conn.read_wal(&mut seg.bytes[seg.filled..seg.filled + n])?;
            seg.filled += n;
            left -= n;
            self.next = Lsn(self.next.0 + n as u64);
            if seg.filled == seg.bytes.len() {
                let seg = self.segment.take().expect("a segment in progress");
                self.queue(Work::Segment {
                    segment: seg.name(self.seg_size),
                    had_tail: seg.handed > 0,
                    bytes: seg.bytes,
                    end: self.next,
                });
                self.last_handed = Instant::now();
            }
        }
        Ok(())
    }

    /// The streamed timeline ended where the next one starts: the stream follows it.
    pub(super) fn follow(&mut self, n: crate::remote::wal_stream::NextTimeline) {
        tracing::info!(
            "timeline {} ended at {}; following timeline {}",
            self.timeline,
            n.start,
            n.timeline
        );
        self.switch_to(n.timeline, n.start);
    }

    /// Moves the stream to timeline `tli` at the start of the segment of `at`.
    pub(super) fn switch_to(&mut self, tli: u32, at: Lsn) {
        self.hand_tail();
        self.segment = None;
        self.timeline = tli;
        self.next = Lsn(at.0 - at.0 % self.seg_size);
    }

    /// Sends a status update when the durable position moved, the interval passed or the
    /// server asked.
    /// Writes the status file ([`super::status`]) when a second has passed since the last
    /// time, or at once with `now`.
    pub(super) fn show(&mut self, connected: bool, now: bool) {
        let Some(path) = &self.o.status_file else {
            return;
        };
        if !now
            && self
                .last_shown
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        let stored = self.shared.durable.load(Ordering::Acquire);
        if stored < self.server_end.0.max(self.next.0) {
            self.behind_since.get_or_insert_with(Instant::now);
        } else {
            self.behind_since = None;
        }
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let st = StreamStatus {
            pid: std::process::id(),
            updated: clock.as_secs_f64(),
            connected,
            server: self.server.clone(),
            timeline: self.timeline,
            received_lsn: self.next.0,
            stored_lsn: stored,
            server_lsn: self.server_end.0,
            lag_seconds: self.behind_since.map_or(0.0, |t| t.elapsed().as_secs_f64()),
            reconnects: self.connections.saturating_sub(1),
            tail_writes: self.shared.tail_writes.load(Ordering::Relaxed),
            tail_write_seconds: self.shared.tail_write_micros.load(Ordering::Relaxed) as f64 / 1e6,
            flush_reports: self.flush_reports,
            flush_wait_seconds: self.flush_wait.as_secs_f64(),
        };
        super::status::write(path, &st);
        self.last_shown = Some(Instant::now());
    }

    pub(super) fn report(&mut self, conn: &mut ReplConn, asked: bool) -> Result<()> {
        let durable = Lsn(self.shared.durable.load(Ordering::Acquire));
        if asked || durable != self.reported || self.last_status.elapsed() >= self.o.status_interval
        {
            conn.send_status(self.next, durable, false)?;
            self.reported = durable;
            self.last_status = Instant::now();
            while let Some(&(end, since)) = self.awaiting_report.front() {
                if end > durable {
                    break;
                }
                self.awaiting_report.pop_front();
                self.flush_reports += 1;
                self.flush_wait += since.elapsed();
            }
        }
        Ok(())
    }
}
