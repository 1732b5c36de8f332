//! `info --output prometheus`, the WAL receiver's part: for each stanza whose spool directory
//! holds `archive-stream`'s status file ([`crate::archive::receiver::status`]), the
//! `pgjet_stream_*` metrics. LSNs as byte positions.
use super::info::StanzaView;
use super::metrics::Family;
use crate::archive::receiver::status::{self, StreamStatus};
use crate::archive::spool::Spool;
use crate::options::Settings;

/// A status older than this many seconds means the receiver is not running (it rewrites
/// the file about once a second).
const STALE_AFTER: f64 = 30.0;

/// The receiver's status of each stanza of `v` that has one on this host.
pub fn streams(s: &Settings, v: &[StanzaView]) -> Vec<(String, StreamStatus)> {
    let archive = s.archive_config();
    v.iter()
        .filter_map(|st| {
            let path = status::status_path(&Spool::dir_of(&archive, &st.stanza));
            status::read(&path).map(|x| (st.stanza.clone(), x))
        })
        .collect()
}

/// Renders `streams` as Prometheus metrics, `now` in Unix seconds.
pub fn render(streams: &[(String, StreamStatus)], now: f64) -> String {
    let mut up = Family::new(
        "pgjet_stream_up",
        "gauge",
        "1 when archive-stream runs and streams from a server (its status is fresh and its process alive), else 0.",
    );
    let mut received = Family::new(
        "pgjet_stream_received_lsn_bytes",
        "gauge",
        "The position after the last WAL byte archive-stream received (an LSN as bytes).",
    );
    let mut stored = Family::new(
        "pgjet_stream_stored_lsn_bytes",
        "gauge",
        "The position after the last WAL byte durable in every repository, reported to the server as flushed.",
    );
    let mut lag_bytes = Family::new(
        "pgjet_stream_lag_bytes",
        "gauge",
        "WAL bytes the server had that the repositories do not hold yet.",
    );
    let mut lag_seconds = Family::new(
        "pgjet_stream_lag_seconds",
        "gauge",
        "Seconds since the repositories last held everything the server had sent (0: they do).",
    );
    let mut reconnects = Family::new(
        "pgjet_stream_reconnects_total",
        "counter",
        "Connections archive-stream made again since it started (lost connections, failovers).",
    );
    let mut tail_writes = Family::new(
        "pgjet_stream_tail_writes_total",
        "counter",
        "Tail chunks (the segment in progress, stored at the server's end of WAL) written into every repository.",
    );
    let mut tail_write_seconds = Family::new(
        "pgjet_stream_tail_write_seconds_total",
        "counter",
        "Seconds the tail chunks' writes took: the repositories' own latency for the writes synchronous commits wait on.",
    );
    let mut flush_reports = Family::new(
        "pgjet_stream_flush_reports_total",
        "counter",
        "WAL received at the server's end of WAL and reported to the server as flushed once durable.",
    );
    let mut flush_wait_seconds = Family::new(
        "pgjet_stream_flush_wait_seconds_total",
        "counter",
        "Seconds from receiving that WAL to reporting it flushed: what a synchronous commit waits on archive-stream for, tail writes included.",
    );
    let mut age = Family::new(
        "pgjet_stream_status_age_seconds",
        "gauge",
        "Seconds since archive-stream last wrote its status.",
    );
    for (stanza, st) in streams {
        let l = [("stanza", stanza.as_str())];
        let fresh = now - st.updated <= STALE_AFTER && crate::io::pid_alive(st.pid);
        up.add(&l, (fresh && st.connected) as u8 as f64);
        received.add(&l, st.received_lsn as f64);
        stored.add(&l, st.stored_lsn as f64);
        let server = st.server_lsn.max(st.received_lsn);
        lag_bytes.add(&l, server.saturating_sub(st.stored_lsn) as f64);
        let since = if fresh { 0.0 } else { now - st.updated };
        lag_seconds.add(&l, st.lag_seconds + since.max(0.0));
        reconnects.add(&l, st.reconnects as f64);
        tail_writes.add(&l, st.tail_writes as f64);
        tail_write_seconds.add(&l, st.tail_write_seconds);
        flush_reports.add(&l, st.flush_reports as f64);
        flush_wait_seconds.add(&l, st.flush_wait_seconds);
        age.add(&l, (now - st.updated).max(0.0));
    }
    let mut out = String::new();
    for f in [
        &up,
        &received,
        &stored,
        &lag_bytes,
        &lag_seconds,
        &reconnects,
        &tail_writes,
        &tail_write_seconds,
        &flush_reports,
        &flush_wait_seconds,
        &age,
    ] {
        f.render(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh status of a live process is up, its lag the server's bytes not stored; a
    /// stale one (or a dead process) is down and its lag grows with the time since.
    #[test]
    fn the_receivers_status_becomes_metrics() {
        let st = StreamStatus {
            pid: std::process::id(),
            updated: 1000.0,
            connected: true,
            server: "host=a".into(),
            timeline: 1,
            received_lsn: 5000,
            stored_lsn: 4000,
            server_lsn: 6000,
            lag_seconds: 2.0,
            reconnects: 1,
            tail_writes: 10,
            tail_write_seconds: 0.25,
            flush_reports: 8,
            flush_wait_seconds: 0.5,
        };
        let m = render(&[("main".into(), st.clone())], 1001.0);
        assert!(m.contains("pgjet_stream_up{stanza=\"main\"} 1\n"), "{m}");
        assert!(
            m.contains("pgjet_stream_flush_wait_seconds_total{stanza=\"main\"} 0.5\n"),
            "{m}"
        );
        assert!(
            m.contains("pgjet_stream_tail_writes_total{stanza=\"main\"} 10\n"),
            "{m}"
        );
        assert!(
            m.contains("pgjet_stream_lag_bytes{stanza=\"main\"} 2000\n"),
            "{m}"
        );
        assert!(
            m.contains("pgjet_stream_lag_seconds{stanza=\"main\"} 2\n"),
            "{m}"
        );
        assert!(
            m.contains("pgjet_stream_reconnects_total{stanza=\"main\"} 1\n"),
            "{m}"
        );
        assert!(
            m.contains("# TYPE pgjet_stream_reconnects_total counter\n"),
            "{m}"
        );
        let m = render(&[("main".into(), st)], 1100.0);
        assert!(m.contains("pgjet_stream_up{stanza=\"main\"} 0\n"), "{m}");
        assert!(
            m.contains("pgjet_stream_lag_seconds{stanza=\"main\"} 102\n"),
            "{m}"
        );
    }
}
