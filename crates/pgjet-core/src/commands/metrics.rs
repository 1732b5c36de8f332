//! `info --output prometheus`: the repository's state as Prometheus metrics in the text
//! exposition format (version 0.0.4), for node_exporter's textfile collector: write it to
//! `<dir>/pgjet.prom.$$` and rename it to `pgjet.prom`. Checked with `promtool check metrics`.
//!
//! Every metric carries `stanza` (and `repo`, 1-4, for what a repository holds). Times are
//! Unix seconds, sizes bytes. Per stanza and repository, for each backup type (`full`,
//! `diff`, `incr`): how many complete backups, and the newest one's end time, duration,
//! logical size and stored bytes; the WAL archive's segment count, gaps and newest archived
//! LSN. On the database host (with `pg-path`): the archive-push queue (segments PostgreSQL
//! marked `.ready` and the age of the oldest) and the asynchronous pusher's errors in the
//! spool.
use super::info::{BackupInfo, StanzaView};
use crate::archive::spool::Spool;
use crate::options::Settings;
use std::fmt::Write;
use std::path::Path;

const TYPES: [&str; 3] = ["full", "diff", "incr"];

/// One metric family: its HELP and TYPE lines, then its samples.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: Vec<(String, f64)>,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }

    fn add(&mut self, labels: &[(&str, &str)], value: f64) {
        self.samples.push((label_text(labels), value));
    }

    fn render(&self, out: &mut String) {
        if self.samples.is_empty() {
            return;
        }
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        for (labels, v) in &self.samples {
            let _ = writeln!(out, "{}{labels} {}", self.name, number(*v));
        }
    }
}

/// `{a="x",b="y"}` with the exposition format's escapes (backslash, quote, newline).
fn label_text(labels: &[(&str, &str)]) -> String {
    let inner: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{k}=\"{v}\"")
        })
        .collect();
    format!("{{{}}}", inner.join(","))
}

fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Unix seconds of a backup's time as `info` shows it (RFC 3339, UTC).
fn unix(t: &str) -> Option<f64> {
    chrono::DateTime::parse_from_rfc3339(t)
        .ok()
        .map(|d| d.timestamp() as f64)
}

/// What the archive-push queue and the spool show on this host, for one stanza.
#[derive(Debug, Default, PartialEq)]
pub struct QueueView {
    /// Segments (and other WAL files) PostgreSQL marked ready and pgjet has not archived.
    pub ready: u64,
    /// Seconds since the oldest of them was marked (0 when none).
    pub oldest_age: f64,
    /// Error files in the spool (a segment's last attempt failed, or the pusher could not
    /// start).
    pub errors: u64,
    /// Unix seconds of the newest of them (None when none).
    pub last_error: Option<f64>,
}

/// The queue of `pg_wal/archive_status` under `pg_path` and the error files of the
/// asynchronous pusher in `spool_out` (`<spool-path>/archive/<stanza>/out`); a missing
/// directory counts as empty. Errors: none (unreadable entries are skipped).
pub fn queue_view(pg_path: &Path, spool_out: &Path, now: std::time::SystemTime) -> QueueView {
    let modified = |p: std::path::PathBuf| std::fs::metadata(p).ok()?.modified().ok();
    let wal = pg_path.join("pg_wal");
    let ready = crate::archive::queue::ready_files(&wal).unwrap_or_default();
    let status = wal.join("archive_status");
    let oldest = ready
        .iter()
        .filter_map(|n| modified(status.join(format!("{n}.ready"))))
        .min();
    let errors: Vec<std::time::SystemTime> = std::fs::read_dir(spool_out)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".error"))
        .filter_map(|e| modified(e.path()))
        .collect();
    QueueView {
        ready: ready.len() as u64,
        oldest_age: oldest
            .and_then(|t| now.duration_since(t).ok())
            .map_or(0.0, |d| d.as_secs_f64().round()),
        errors: errors.len() as u64,
        last_error: errors.iter().max().and_then(|t| {
            t.duration_since(std::time::UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs() as f64)
        }),
    }
}

/// The queue of this host for each stanza of `v` when `pg-path` is set (the database
/// host), else nothing.
pub fn queues(s: &Settings, v: &[StanzaView]) -> Vec<(String, QueueView)> {
    let Some(pg) = &s.pg_path else {
        return Vec::new();
    };
    v.iter()
        .map(|st| {
            let out = Spool::dir_of(&s.archive_config(), &st.stanza).join("out");
            (
                st.stanza.clone(),
                queue_view(pg, &out, std::time::SystemTime::now()),
            )
        })
        .collect()
}

/// Renders `v` (and this host's `queues`) as Prometheus metrics.
pub fn render_prometheus(v: &[StanzaView], queues: &[(String, QueueView)]) -> String {
    let mut info = Family::new(
        "pgjet_stanza_info",
        "gauge",
        "A stanza in the repositories: its system identifier and PostgreSQL version.",
    );
    let mut count = Family::new("pgjet_backups", "gauge", "Complete backups, by type.");
    let mut end = Family::new(
        "pgjet_backup_last_end_timestamp_seconds",
        "gauge",
        "When the newest complete backup of the type ended (Unix seconds).",
    );
    let mut duration = Family::new(
        "pgjet_backup_last_duration_seconds",
        "gauge",
        "How long the newest complete backup of the type took, from start to stop.",
    );
    let mut size = Family::new(
        "pgjet_backup_last_size_bytes",
        "gauge",
        "Logical bytes of the newest complete backup of the type.",
    );
    let mut stored = Family::new(
        "pgjet_backup_last_stored_bytes",
        "gauge",
        "Bytes the newest complete backup of the type stored in the repository.",
    );
    let mut segments = Family::new(
        "pgjet_archive_segments",
        "gauge",
        "WAL segments in the repository's archive.",
    );
    let mut gaps = Family::new(
        "pgjet_archive_gaps",
        "gauge",
        "Recorded gaps in the WAL archive (WAL dropped by archive-push-queue-max).",
    );
    let mut newest = Family::new(
        "pgjet_archive_newest_segment_info",
        "gauge",
        "The newest archived WAL segment (its name in the segment label).",
    );
    let mut oldest = Family::new(
        "pgjet_archive_oldest_segment_info",
        "gauge",
        "The oldest archived WAL segment (its name in the segment label).",
    );
    let mut ready = Family::new(
        "pgjet_archive_push_queue_segments",
        "gauge",
        "WAL files PostgreSQL marked ready for archiving and not yet archived (pg_wal/archive_status).",
    );
    let mut age = Family::new(
        "pgjet_archive_push_queue_oldest_age_seconds",
        "gauge",
        "Seconds since the oldest WAL file waiting for archiving was marked ready (0 when none).",
    );
    let mut errors = Family::new(
        "pgjet_archive_push_errors",
        "gauge",
        "Error files of the asynchronous archive-push in the spool.",
    );
    let mut last_error = Family::new(
        "pgjet_archive_push_last_error_timestamp_seconds",
        "gauge",
        "When the newest archive-push error in the spool was written (Unix seconds; 0 when none).",
    );
    for st in v {
        let s = st.stanza.as_str();
        info.add(
            &[
                ("stanza", s),
                ("system_identifier", &st.system_identifier),
                ("pg_version", &st.pg_version),
            ],
            1.0,
        );
        let mut repos: Vec<u8> = st.backups.iter().map(|b| b.repo).collect();
        repos.extend(st.archive.iter().map(|a| a.repo));
        repos.sort_unstable();
        repos.dedup();
        for r in repos {
            let repo = r.to_string();
            for t in TYPES {
                let of_type: Vec<&BackupInfo> = st
                    .backups
                    .iter()
                    .filter(|b| b.repo == r && b.backup_type == t)
                    .collect();
                let l = [("stanza", s), ("repo", repo.as_str()), ("type", t)];
                count.add(&l, of_type.len() as f64);
                // sorted by label: the last is the newest
                if let Some(b) = of_type.last() {
                    let (start, stop) = (unix(&b.start_time), unix(&b.stop_time));
                    if let Some(stop) = stop {
                        end.add(&l, stop);
                    }
                    if let (Some(a), Some(z)) = (start, stop) {
                        duration.add(&l, (z - a).max(0.0));
                    }
                    size.add(&l, b.size as f64);
                    stored.add(&l, b.stored_size as f64);
                }
            }
            let l = [("stanza", s), ("repo", repo.as_str())];
            let archive = st.archive.iter().find(|a| a.repo == r);
            let runs = archive.map(|a| a.ranges.as_slice()).unwrap_or_default();
            segments.add(&l, runs.iter().map(|x| x.segments).sum::<u64>() as f64);
            gaps.add(&l, archive.map_or(0, |a| a.gaps.len()) as f64);
            // runs are ascending by timeline and segment
            if let (Some(first), Some(last)) = (runs.first(), runs.last()) {
                oldest.add(
                    &[
                        ("stanza", s),
                        ("repo", repo.as_str()),
                        ("segment", &first.first),
                    ],
                    1.0,
                );
                newest.add(
                    &[
                        ("stanza", s),
                        ("repo", repo.as_str()),
                        ("segment", &last.last),
                    ],
                    1.0,
                );
            }
        }
    }
    for (s, q) in queues {
        let l = [("stanza", s.as_str())];
        ready.add(&l, q.ready as f64);
        age.add(&l, q.oldest_age);
        errors.add(&l, q.errors as f64);
        last_error.add(&l, q.last_error.unwrap_or(0.0));
    }
    let mut out = String::new();
    for f in [
        &info,
        &count,
        &end,
        &duration,
        &size,
        &stored,
        &segments,
        &gaps,
        &oldest,
        &newest,
        &ready,
        &age,
        &errors,
        &last_error,
    ] {
        f.render(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Label values are escaped; families without samples are left out; the newest backup of
    /// each type gives the last_* samples.
    #[test]
    fn renders_families_and_escapes_labels() {
        let backup = |label: &str, t: &str, stop: &str, stored: u64| BackupInfo {
            label: label.into(),
            repo: 1,
            backup_type: t.into(),
            reference: None,
            depends_on: Vec::new(),
            start_time: "2026-11-26T10:00:00Z".into(),
            stop_time: stop.into(),
            start_lsn: "0/1000028".into(),
            stop_lsn: "0/1000100".into(),
            timeline: 1,
            size: 100,
            stored_size: stored,
            wal_start: String::new(),
            wal_stop: String::new(),
            archive_start: None,
            archive_stop: None,
            compression: "zstd".into(),
        };
        let v = vec![StanzaView {
            stanza: "a\"b\\c".into(),
            system_identifier: "1".into(),
            pg_version: "15".into(),
            backups: vec![
                backup("20261126-100000F", "full", "2026-11-26T10:00:30Z", 10),
                backup(
                    "20261126-100000F_20261126-110000I",
                    "incr",
                    "2026-11-26T10:00:02Z",
                    3,
                ),
                backup(
                    "20261126-100000F_20261126-120000I",
                    "incr",
                    "2026-11-26T10:00:05Z",
                    4,
                ),
            ],
            archive: Vec::new(),
        }];
        let q = vec![(
            "a\"b\\c".to_string(),
            QueueView {
                ready: 2,
                oldest_age: 7.0,
                errors: 0,
                last_error: None,
            },
        )];
        let m = render_prometheus(&v, &q);
        let l = r#"{stanza="a\"b\\c",repo="1",type="incr"}"#;
        assert!(m.contains(&format!("pgjet_backups{l} 2\n")), "{m}");
        assert!(
            m.contains(&format!("pgjet_backup_last_stored_bytes{l} 4\n")),
            "{m}"
        );
        assert!(
            m.contains(&format!("pgjet_backup_last_duration_seconds{l} 5\n")),
            "{m}"
        );
        assert!(m.contains(r#"pgjet_backups{stanza="a\"b\\c",repo="1",type="diff"} 0"#));
        assert!(!m.contains(
            "pgjet_backup_last_size_bytes{stanza=\"a\\\"b\\\\c\",repo=\"1\",type=\"diff\"}"
        ));
        assert!(m.contains(r#"pgjet_archive_push_queue_segments{stanza="a\"b\\c"} 2"#));
        assert!(
            !m.contains("pgjet_archive_oldest_segment_info"),
            "no archive, no family"
        );
        assert_eq!(m.matches("# TYPE pgjet_backups gauge").count(), 1);
    }

    /// The queue: `.ready` files counted and the oldest's age; error files in the spool.
    #[test]
    fn queue_from_archive_status_and_spool() {
        let d = tempfile::tempdir().unwrap();
        let status = d.path().join("pg_wal/archive_status");
        std::fs::create_dir_all(&status).unwrap();
        std::fs::write(status.join("000000010000000000000001.ready"), "").unwrap();
        std::fs::write(status.join("000000010000000000000002.ready"), "").unwrap();
        std::fs::write(status.join("000000010000000000000000.done"), "").unwrap();
        let out = d.path().join("spool/out");
        let now = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
        let q = queue_view(d.path(), &out, now);
        assert_eq!((q.ready, q.errors, q.last_error), (2, 0, None));
        assert!((59.0..=62.0).contains(&q.oldest_age), "{q:?}");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("global.error"), "could not start").unwrap();
        let q = queue_view(d.path(), &out, now);
        assert_eq!(q.errors, 1);
        assert!(q.last_error.is_some());
    }
}
