//! `info`: stanzas and their complete backups.
use crate::error::{Error, Result};
use crate::io::mib;
use crate::options::Settings;
use crate::repo;
use crate::repo::open::open_repos;
use crate::repo::Stanza;
use serde::Serialize;

/// One backup as `info` shows it.
#[derive(Debug, Serialize)]
pub struct BackupInfo {
    pub label: String,
    /// The repository that holds it (1-4).
    pub repo: u8,
    #[serde(rename = "type")]
    pub backup_type: String,
    /// For a diff or incr: the backup it was taken against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// Every older backup whose stored bytes it needs (its chain), oldest first: none for a
    /// full.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    pub start_time: String,
    pub stop_time: String,
    pub start_lsn: String,
    pub stop_lsn: String,
    pub timeline: u32,
    /// Logical bytes.
    pub size: u64,
    /// Bytes this backup stored (an incr or diff: its changed blocks and files only).
    pub stored_size: u64,
    pub wal_start: String,
    pub wal_stop: String,
    /// The backup's WAL range in the archive (when it checked the archive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archive_start: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archive_stop: Option<String>,
    pub compression: String,
}

/// The WAL archive of one repository, as `info` shows it.
#[derive(Debug, Serialize)]
pub struct ArchiveView {
    pub repo: u8,
    /// Runs of consecutive archived segments, per timeline, ascending.
    pub ranges: Vec<crate::repo::wal::SegmentRun>,
    /// Recorded gaps: WAL dropped by archive-push-queue-max.
    pub gaps: Vec<crate::repo::wal::Gap>,
}

/// One stanza as `info` shows it.
#[derive(Debug, Serialize)]
pub struct StanzaView {
    pub stanza: String,
    pub system_identifier: String,
    pub pg_version: String,
    pub backups: Vec<BackupInfo>,
    /// The WAL archive of each repository that has one.
    pub archive: Vec<ArchiveView>,
}

/// Collects the stanzas (only --stanza when given) and their complete backups, from every
/// repository in scope (`--repo N`, else all configured); backups sorted by label.
pub fn collect(s: &Settings) -> Result<Vec<StanzaView>> {
    let mut out: Vec<StanzaView> = Vec::new();
    for (n, store) in open_repos(&s.repo_set)? {
        let names = match &s.repo_set.stanza {
            Some(name) => {
                if s.repo_set.repos.len() == 1 || Stanza::new(n, store.clone(), name).exists()? {
                    vec![name.clone()]
                } else {
                    vec![]
                }
            }
            None => repo::stanza_names(&store)?,
        };
        for name in names {
            let stanza = Stanza::new(n, store.clone(), &name);
            let st = stanza.info()?;
            let i = match out.iter().position(|v| v.stanza == name) {
                Some(i) => i,
                None => {
                    out.push(StanzaView {
                        stanza: name.clone(),
                        system_identifier: st.system_identifier.to_string(),
                        pg_version: st.pg_version.clone(),
                        backups: Vec::new(),
                        archive: Vec::new(),
                    });
                    out.len() - 1
                }
            };
            // The backups know the segment size for sure; a stanza made before the WAL
            // archive only assumes 16 MiB.
            let complete = stanza.complete()?;
            let seg_size = match complete.first() {
                Some(l) => stanza.backup(l).summary()?.header.wal_segment_size,
                None => st.wal_segment_size,
            };
            let ranges = crate::repo::wal::segment_runs(&stanza, seg_size)?;
            let gaps = crate::repo::wal::gaps(&stanza)?;
            if !ranges.is_empty() || !gaps.is_empty() {
                out[i].archive.push(ArchiveView {
                    repo: n,
                    ranges,
                    gaps,
                });
            }
            for label in complete {
                // The summary only: info never reads a manifest.
                let m = stanza.backup(&label).summary()?;
                let (h, e) = (m.header, m.end);
                out[i].backups.push(BackupInfo {
                    label,
                    repo: n,
                    backup_type: h.backup_type,
                    reference: h.reference,
                    depends_on: e.references,
                    start_time: h.start_time,
                    stop_time: e.stop.stop_time,
                    start_lsn: h.start_lsn.to_string(),
                    stop_lsn: e.stop.stop_lsn.to_string(),
                    timeline: e.stop.timeline,
                    size: e.size,
                    stored_size: e.stored_size,
                    wal_start: e.stop.wal_segments.first().cloned().unwrap_or_default(),
                    wal_stop: e.stop.wal_segments.last().cloned().unwrap_or_default(),
                    archive_start: e.stop.archive_start.clone(),
                    archive_stop: e.stop.archive_stop.clone(),
                    compression: format!("{}", h.compression.kind),
                });
            }
        }
    }
    if let Some(name) = &s.repo_set.stanza {
        if out.is_empty() {
            let hint = match crate::repo::open::open_repos(&s.repo_set)?.first() {
                Some((_, store)) => crate::repo::stanza::missing_stanza_hint(name, store),
                None => format!("create it with `pgjet --stanza {name} stanza-create`"),
            };
            return Err(Error::Repo(format!(
                "stanza '{name}' does not exist in any configured repository"
            ))
            .with_hint(hint));
        }
    }
    for v in &mut out {
        v.backups
            .sort_by(|a, b| (&a.label, a.repo).cmp(&(&b.label, b.repo)));
    }
    Ok(out)
}

/// Renders `info` as text.
pub fn render_text(v: &[StanzaView]) -> String {
    let mut t = String::new();
    if v.is_empty() {
        t.push_str("no stanzas\n");
    }
    for st in v {
        t.push_str(&format!(
            "stanza: {}\n    system identifier: {}, PostgreSQL {}\n",
            st.stanza, st.system_identifier, st.pg_version
        ));
        for a in &st.archive {
            t.push_str(&format!("\n    WAL archive (repo{}):\n", a.repo));
            for r in &a.ranges {
                t.push_str(&format!(
                    "        timeline {}: {} to {} ({} segment(s))\n",
                    r.timeline, r.first, r.last, r.segments
                ));
            }
            for g in &a.gaps {
                t.push_str(&format!(
                    "        GAP: {} to {} ({} segment(s)) dropped {}: {}\n",
                    g.first, g.last, g.segments, g.recorded, g.reason
                ));
            }
        }
        if st.backups.is_empty() {
            t.push_str("    no backups\n");
        }
        for b in &st.backups {
            t.push_str(&format!(
                "\n    {} backup: {} (repo{}){}\n        start: {} (LSN {}), stop: {} (LSN {}), timeline {}\n        size: {}, stored: {} ({})\n        WAL: {} / {}{}\n",
                b.backup_type, b.label, b.repo,
                match &b.reference {
                    Some(r) => format!("\n        reference: {r}, depends on: {}", b.depends_on.join(", ")),
                    None => String::new(),
                },
                b.start_time, b.start_lsn, b.stop_time, b.stop_lsn, b.timeline,
                mib(b.size), mib(b.stored_size), b.compression, b.wal_start, b.wal_stop,
                match (&b.archive_start, &b.archive_stop) {
                    (Some(a), Some(z)) => format!(" (in the archive: {a} to {z})"),
                    _ => String::new(),
                }
            ));
        }
    }
    t
}
