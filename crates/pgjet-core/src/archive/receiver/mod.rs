//! `archive-stream`: WAL received over the replication protocol and stored in the stanza's
//! archive as archive-push stores it, with nothing installed on the database host.
//!
//! Two threads. The receiver holds the replication connection: it assembles the segment in
//! progress in memory, hands each complete segment to the storer, and, whenever the stream
//! pauses at the server's end of WAL (or at least every `tail_interval` otherwise), the bytes
//! received since the last hand-over as a tail chunk ([`crate::repo::wal_tail`]). The storer writes them into
//! every repository in order, retrying while a repository is down, and only then moves the
//! durable position on; the receiver reports that position to the server as flushed. So
//! the slot keeps on the server every byte not yet durable in the repositories, and with the
//! receiver named in `synchronous_standby_names` a commit returns only once its WAL is in
//! the repositories.
//!
//! Restarted, the receiver starts from what the repositories hold (the lowest position over
//! them): the segment after the last archived one, and the durable tail of that segment.
//! A segment or chunk stored again is compared, never replaced ([`crate::repo::wal::store`]).
//!
//! Timelines as PostgreSQL's own receiver follows them (walreceiver.c, pg_receivewal): the
//! history files of newer timelines are stored; the stream of a timeline ends at its switch
//! point with the next timeline, which is then streamed from the start of the segment holding
//! the switch point (a promoted server's first segment of the new timeline begins with the
//! old timeline's bytes).
mod assemble;
mod resume;
mod slot;
pub mod status;
mod store;

use resume::resume_all;
pub use resume::{resume_point, Resume};

use super::push::Archiver;
use crate::error::{Error, Result};
use crate::pg::conninfo::ConnTarget;
use crate::pg::lsn::{self, Lsn};
use crate::remote::replication::ReplConn;
use crate::remote::wal_stream::{Started, WalMessage};
use assemble::{Segment, Stream};
use crossbeam_channel::Sender;
use slot::{ensure_slot, removed, skip_removed};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use store::{store_loop, Shared, Work, MAX_BACKOFF, QUEUE};

/// What `archive-stream` needs besides the repositories.
#[derive(Debug, Clone)]
pub struct ReceiverOptions {
    /// The hosts to stream from, in the order tried (one per host of a multi-host
    /// connection string).
    pub targets: Vec<ConnTarget>,
    /// Only a server that accepts writes (not in recovery) is streamed from
    /// (`target_session_attrs=read-write` or `primary`).
    pub read_write: bool,
    /// The physical replication slot held on the server (created when missing).
    pub slot: String,
    /// Longest time between two status updates to the server (pg_receivewal's
    /// `--status-interval`, 10 s by default).
    pub status_interval: Duration,
    /// Longest time received bytes wait before they are stored as a tail chunk while the
    /// stream never pauses.
    pub tail_interval: Duration,
    /// Where the receiver shows its state ([`status`]); None: nowhere.
    pub status_file: Option<std::path::PathBuf>,
    /// Complete segments stored at once, at most (each compressed and written by a thread
    /// of its own while the stream catches up), at least 1.
    pub jobs: usize,
}

/// Runs the receiver until cancelled (SIGTERM, SIGINT): then the bytes received are stored
/// and reported before it returns.
///
/// Errors: a server of another cluster; the stanza's timeline ahead of every server's; a
/// repository whose stanza cannot be read at start. Lost connections and failing
/// repositories are retried, not returned.
pub fn run(a: &Archiver, o: &ReceiverOptions) -> Result<()> {
    let seg_size = a.segment_size();
    let shared = Arc::new(Shared::new());
    let (wake_rx, wake_tx) =
        UnixStream::pair().map_err(|e| Error::Other("cannot make a pipe".into()).because(e))?;
    wake_rx
        .set_nonblocking(true)
        .map_err(|e| Error::Other("cannot make a pipe".into()).because(e))?;
    let (tx, rx) = crossbeam_channel::bounded::<Work>(QUEUE);
    std::thread::scope(|scope| {
        let storer_shared = shared.clone();
        let storer = scope.spawn(move || store_loop(a, rx, &storer_shared, wake_tx, o.jobs));
        let result = receive_loop(a, o, seg_size, &shared, &tx, &wake_rx);
        drop(tx);
        let stored = storer
            .join()
            .unwrap_or_else(|_| Err(Error::Other("the storer thread panicked".into())));
        result.and(stored)
    })
}

/// Connects to the first host that answers (and accepts writes when asked to), checks it
/// belongs to the stanza's cluster. Returns the connection and the server's timeline and
/// flush position.
fn connect(a: &Archiver, o: &ReceiverOptions) -> Result<(ReplConn, u32, Lsn)> {
    let mut last = None;
    for t in &o.targets {
        let mut conn = match ReplConn::connect(t) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!("{}: {e}", t.describe);
                last = Some(e);
                continue;
            }
        };
        if o.read_write {
            let ro = conn.show("transaction_read_only")?;
            if ro.as_deref() == Some("on") {
                tracing::debug!("{}: read-only (a standby), skipped", t.describe);
                last = Some(Error::Other(format!("{} is read-only", t.describe)));
                conn.close();
                continue;
            }
        }
        let (sysid, tli, pos) = conn.identify_system()?;
        if sysid != a.system_identifier() {
            return Err(Error::Repo(format!(
                "{} belongs to the cluster with system identifier {sysid}, but stanza '{}' to {}",
                t.describe,
                a.stanza(),
                a.system_identifier()
            )));
        }
        let pos: Lsn = pos
            .parse()
            .map_err(|_| conn.protocol(format!("IDENTIFY_SYSTEM returned the position '{pos}'")))?;
        return Ok((conn, tli, pos));
    }
    Err(last.unwrap_or_else(|| Error::Config("archive-stream: no host to connect to".into())))
}

/// The receiving side of [`run`]: connects, streams and reconnects until cancelled.
fn receive_loop(
    a: &Archiver,
    o: &ReceiverOptions,
    seg_size: u64,
    shared: &Shared,
    tx: &Sender<Work>,
    wake: &UnixStream,
) -> Result<()> {
    let resume = resume_all(a, seg_size)?;
    let mut s = Stream {
        a,
        o,
        seg_size,
        shared,
        tx,
        wake,
        timeline: 0,
        next: Lsn(0),
        segment: None,
        waiting: Default::default(),
        last_status: Instant::now(),
        last_handed: Instant::now(),
        reported: Lsn(0),
        server_end: Lsn(0),
        server: String::new(),
        connections: 0,
        behind_since: None,
        last_shown: None,
        awaiting_report: Default::default(),
        flush_reports: 0,
        flush_wait: Duration::ZERO,
    };
    if let Some(r) = &resume {
        s.timeline = r.timeline;
        s.next = r.lsn;
        shared.durable.store(r.lsn.0, Ordering::Release);
        if !r.prefix.is_empty() {
            s.segment = Some(Segment::new(
                shared,
                seg_size,
                r.timeline,
                r.lsn.0 / seg_size,
                &r.prefix,
            ));
        }
        tracing::info!(
            "the archive ends at {} on timeline {}: streaming from there",
            r.lsn,
            r.timeline
        );
    }
    let mut wait = Duration::from_secs(1);
    while crate::io::cancel::cancelled().is_none() {
        match stream_once(&mut s) {
            Ok(()) => wait = Duration::from_secs(1),
            Err(e) if crate::io::cancel::cancelled().is_some() => {
                tracing::debug!("stream ended on cancel: {e}");
                break;
            }
            Err(e @ (Error::Repo(_) | Error::Config(_))) => return Err(e),
            Err(e) => {
                s.show(false, true);
                tracing::warn!("the WAL stream stopped: {e}; connecting again in {wait:?}");
                sleep_unless_cancelled(wait);
                wait = (wait * 2).min(MAX_BACKOFF);
            }
        }
    }
    // Cancelled: what was received is stored before the process ends.
    s.hand_tail();
    while !s.drain_waiting() {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn sleep_unless_cancelled(d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until && crate::io::cancel::cancelled().is_none() {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One connection's life: connect, take up the stream where it is (or where the server's
/// slot or position says, for an empty archive), follow timelines, stream until the
/// connection ends or the process is cancelled.
fn stream_once(s: &mut Stream) -> Result<()> {
    let (mut conn, server_tli, server_pos) = connect(s.a, s.o)?;
    s.connections += 1;
    s.server = conn.describe().to_string();
    s.server_end = s.server_end.max(server_pos);
    tracing::info!(
        "streaming from {} (timeline {server_tli}, at {server_pos})",
        conn.describe()
    );
    let slot_at = ensure_slot(&mut conn, &s.o.slot)?;
    if s.timeline == 0 {
        let at = slot_at.unwrap_or(server_pos);
        s.timeline = server_tli;
        s.next = Lsn(at.0 - at.0 % s.seg_size);
        s.shared.durable.store(s.next.0, Ordering::Release);
    }
    if s.timeline > server_tli {
        return Err(Error::Repo(format!(
            "the archive of stanza '{}' already holds timeline {}, but {} is on timeline {server_tli}: it is not the cluster's newest primary",
            s.a.stanza(),
            s.timeline,
            conn.describe()
        )));
    }
    // The history files of the timelines since the archive's.
    for tli in (s.timeline + 1).max(2)..=server_tli {
        let text = conn.timeline_history(tli)?;
        s.queue(Work::History {
            name: lsn::history_file_name(tli),
            text: text.into_bytes(),
        });
    }
    loop {
        let started = match conn.start_replication(Some(&s.o.slot), s.next, s.timeline) {
            Ok(st) => st,
            Err(Error::Replication { error, .. })
                if error.message.contains("is not in this server's history")
                    && s.timeline < server_tli =>
            {
                // The archive holds WAL of the old timeline past the point where the server's
                // history left it (WAL the old primary had not sent to the new one): that WAL
                // stays archived on its timeline, the stream goes on from the switch point.
                let history = lsn::parse_history(&conn.timeline_history(server_tli)?);
                let Some(i) = history.iter().position(|(t, _)| *t == s.timeline) else {
                    return Err(Error::Repo(format!(
                        "timeline {} of the archive is not in the history of {}'s timeline {server_tli}",
                        s.timeline,
                        conn.describe()
                    )));
                };
                let next_tli = history.get(i + 1).map(|h| h.0).unwrap_or(server_tli);
                tracing::warn!(
                    "the archive holds timeline {} past {}, where timeline {next_tli} left it; going on with timeline {next_tli}",
                    s.timeline,
                    history[i].1
                );
                s.switch_to(next_tli, history[i].1);
                continue;
            }
            Err(e) if removed(&e) => {
                skip_removed(s, &mut conn)?;
                continue;
            }
            Err(e) => return Err(e),
        };
        if let Started::TimelineEnded(n) = started {
            s.follow(n);
            continue;
        }
        let ended = match stream_copy(s, &mut conn) {
            // The server finds the WAL gone only once it reads it, in COPY mode: the
            // connection is done; a new one records the gap and goes on.
            Err(e) if removed(&e) => {
                tracing::debug!("{e}");
                conn.close();
                conn = connect(s.a, s.o)?.0;
                skip_removed(s, &mut conn)?;
                continue;
            }
            other => other?,
        };
        match ended {
            Some(n) => s.follow(n),
            None => {
                conn.close();
                return Ok(());
            }
        }
    }
}

/// COPY BOTH mode until the server ends the timeline (its next timeline returned), the
/// server ends the stream, or the process is cancelled (None).
fn stream_copy(
    s: &mut Stream,
    conn: &mut ReplConn,
) -> Result<Option<crate::remote::wal_stream::NextTimeline>> {
    s.last_status = Instant::now() - s.o.status_interval;
    loop {
        if crate::io::cancel::cancelled().is_some() {
            s.hand_tail();
            return Ok(None);
        }
        // Wake-ups from the storer are consumed; the durable position is read below.
        let mut sink = [0u8; 64];
        while matches!((&*s.wake).read(&mut sink), Ok(n) if n > 0) {}
        s.drain_waiting();
        let pending = s
            .segment
            .as_ref()
            .is_some_and(|seg| seg.handed < seg.filled);
        let storer_idle = s.shared.in_flight.load(Ordering::Acquire) == 0;
        if pending && storer_idle && s.last_handed.elapsed() >= s.o.tail_interval {
            s.hand_tail();
        }
        s.report(conn, false)?;
        s.show(true, false);
        if !s.waiting.is_empty() {
            // The storer is behind: the socket is not read (the server waits).
            let mut fds = [libc::pollfd {
                fd: s.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            // SAFETY: poll on one pollfd of this stack frame.
            unsafe { libc::poll(fds.as_mut_ptr(), 1, 1000) };
            continue;
        }
        // When the stream pauses, a tail is due at once at the server's end of WAL (a commit
        // may be waiting for it); behind it (catching up), at most every tail_interval: the
        // segment completes soon anyway, and the server still holds what is not yet durable
        // here. The wait for the next message is as long as the tail can wait (no poll in
        // a loop while it cannot be handed yet).
        let at_end = s.next >= s.server_end;
        let timeout = if !(pending && storer_idle) {
            Duration::from_millis(1000)
        } else if at_end {
            Duration::ZERO
        } else {
            s.o.tail_interval.saturating_sub(s.last_handed.elapsed())
        };
        match conn.next_wal(Some(s.wake.as_raw_fd()), timeout)? {
            None => {
                if pending
                    && storer_idle
                    && (at_end || s.last_handed.elapsed() >= s.o.tail_interval)
                {
                    s.hand_tail();
                }
            }
            Some(WalMessage::Data {
                start,
                server_end,
                len,
            }) => {
                s.server_end = s.server_end.max(server_end);
                s.receive(conn, start, len)?
            }
            Some(WalMessage::Keepalive { reply, server_end }) => {
                s.server_end = s.server_end.max(server_end);
                if reply {
                    s.report(conn, true)?;
                }
            }
            Some(WalMessage::End) => {
                s.hand_tail();
                return conn.end_stream().inspect(|n| {
                    if n.is_none() {
                        tracing::info!("the server ended the stream");
                    }
                });
            }
        }
    }
}
