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
use crate::archive::queue::{queue_view, QueueView};
use crate::archive::spool::Spool;
use crate::options::Settings;
use std::fmt::Write;

const TYPES: [&str; 3] = ["full", "diff", "incr"];

/// One metric family: its HELP and TYPE lines, then its samples.
pub(super) struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: Vec<(String, f64)>,
}

impl Family {
    pub(super) fn new(name: &'static str, kind: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }

    pub(super) fn add(&mut self, labels: &[(&str, &str)], value: f64) {
        self.samples.push((label_text(labels), value));
    }

    pub(super) fn render(&self, out: &mut String) {
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

/// The queue of this host for each stanza of `v` when `pg-path` is set (the database
/// host), else nothing.
pub fn queues(s: &Settings, v: &[StanzaView]) -> Vec<(String, QueueView)> {
    let Some(pg) = &s.primary.pg_path else {
        return Vec::new();
    };
    let archive = s.archive_config();
    v.iter()
        .map(|st| {
            let out = Spool::dir_of(&archive, &st.stanza).join("out");
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
#[path = "metrics_tests.rs"]
mod tests;
