//! `info --format pgbackrest`: the repositories as pgBackRest 2.45's `info` reports them, so
//! that monitoring written for pgBackRest (pgbackrest_exporter, check_pgbackrest, dashboards)
//! reads pgjet's unchanged. The schema, the status codes and what each tool reads are in
//! tests/data/pgbackrest-info/SCHEMA.md, taken from pgBackRest 2.45's own output
//! (src/command/info/info.c); the tests compare every key and JSON type with it.
//!
//! What maps how: one pgBackRest "db" per stanza and repository (pgjet's stanza is one
//! cluster, id 1); `info.size` the logical size, `info.delta` the logical bytes the backup
//! stored itself; `info.repository.delta` its stored bytes, `info.repository.size` those of
//! it and every backup it references (an upper bound: pgBackRest counts only the referenced
//! files); `error` a page checksum failure; timestamps as Unix seconds. Keys come out in
//! alphabetical order, as pgBackRest writes them (serde_json's map is sorted).
use crate::error::Result;
use crate::options::Settings;
use crate::repo::open::open_repos;
use crate::repo::Stanza;
use serde_json::{json, Value};

pub use super::info_pgbackrest_text::render_text;

/// pgBackRest's stanza and repository status codes and messages (src/command/info/info.c).
const OK: (i64, &str) = (0, "ok");
const MISSING_STANZA_PATH: (i64, &str) = (1, "missing stanza path");
const NO_BACKUP: (i64, &str) = (2, "no valid backups");
const MIXED: (i64, &str) = (4, "different across repos");
const PG_MISMATCH: (i64, &str) = (5, "database mismatch across repos");
pub(super) const OTHER: i64 = 99;

/// pgBackRest's backup.info format number its backups report (`backrest.format`).
const BACKREST_FORMAT: i64 = 5;

/// The stanzas of every repository in scope (`--stanza` only, when given, reported even
/// where it does not exist, as pgBackRest does), each a pgBackRest info object.
///
/// Errors: a repository that cannot be opened or listed; a stanza's error is its status.
pub fn collect(s: &Settings) -> Result<Vec<Value>> {
    let repos = open_repos(&s.repo_set)?;
    let mut names: Vec<String> = match &s.repo_set.stanza {
        Some(n) => vec![n.clone()],
        None => {
            let mut v = Vec::new();
            for (_, store) in &repos {
                v.extend(crate::repo::stanza_names(store)?);
            }
            v
        }
    };
    names.sort();
    names.dedup();
    let mut out = Vec::new();
    for name in names {
        let per_repo: Vec<RepoStanza> = repos
            .iter()
            .map(|(n, store)| {
                let cipher = if s.repo_set.ciphers.iter().any(|(k, _)| k == n) {
                    "aes-256-gcm"
                } else {
                    "none"
                };
                read_repo(&Stanza::new(*n, store.clone(), &name), cipher)
            })
            .collect();
        out.push(stanza_object(&name, per_repo));
    }
    Ok(out)
}

/// What one repository holds of a stanza.
struct RepoStanza {
    key: u8,
    cipher: &'static str,
    code: i64,
    message: String,
    /// (system identifier, PostgreSQL major) when the stanza exists there.
    db: Option<(u64, String)>,
    archive: Option<Value>,
    backups: Vec<(i64, Value)>,
    lock_held: bool,
}

fn read_repo(st: &Stanza, cipher: &'static str) -> RepoStanza {
    let mut r = RepoStanza {
        key: st.repo(),
        cipher,
        code: OK.0,
        message: OK.1.into(),
        db: None,
        archive: None,
        backups: Vec::new(),
        lock_held: false,
    };
    if let Err(e) = fill_repo(st, &mut r) {
        r.code = OTHER;
        r.message = format!("[{}] {}", error_type(&e), e.with_causes());
    }
    r
}

/// pgBackRest's error type names for the kinds of pgjet's errors (in the `[Type] message`
/// of a repository's status 99).
fn error_type(e: &crate::error::Error) -> &'static str {
    use crate::error::Error as E;
    match e.kind() {
        E::Storage { .. } | E::Io { .. } => "FileReadError",
        E::Corrupt { .. } | E::CorruptWal { .. } => "ChecksumError",
        E::Repo(_) => "FormatError",
        E::Config(_) => "OptionInvalidError",
        _ => "UnknownError",
    }
}

fn fill_repo(st: &Stanza, r: &mut RepoStanza) -> Result<()> {
    if !st.exists()? {
        (r.code, r.message) = (MISSING_STANZA_PATH.0, MISSING_STANZA_PATH.1.into());
        return Ok(());
    }
    let info = st.info()?;
    r.db = Some((info.system_identifier, info.pg_version.clone()));
    r.lock_held = match crate::repo::lock::current(st.store(), st.name())? {
        Some((_, Some(l))) => !l.released && l.lease_until > chrono::Utc::now().timestamp(),
        _ => false,
    };
    let complete = st.complete()?;
    let mut summaries = Vec::new();
    for label in &complete {
        summaries.push(st.backup(label).summary()?);
    }
    let seg_size = summaries
        .first()
        .map(|b| b.header.wal_segment_size)
        .unwrap_or(info.wal_segment_size);
    let runs = crate::repo::wal::segment_runs(st, seg_size)?;
    let first_last = |f: fn(&crate::repo::wal::SegmentRun) -> &String| -> Vec<String> {
        runs.iter().map(|x| f(x).clone()).collect()
    };
    let (firsts, lasts) = (first_last(|x| &x.first), first_last(|x| &x.last));
    r.archive = Some(json!({
        "database": {"id": 1, "repo-key": r.key},
        "id": format!("{}-1", info.pg_version),
        "min": firsts.iter().min(),
        "max": lasts.iter().max(),
    }));
    let stored: std::collections::HashMap<&str, u64> = summaries
        .iter()
        .map(|b| (b.header.label.as_str(), b.end.stored_size))
        .collect();
    for b in &summaries {
        let (h, e) = (&b.header, &b.end);
        let epoch = |t: &str| {
            chrono::DateTime::parse_from_rfc3339(t)
                .map(|d| d.timestamp())
                .unwrap_or(0)
        };
        let set_size = e.stored_size
            + e.references
                .iter()
                .map(|l| stored.get(l.as_str()).copied().unwrap_or(0))
                .sum::<u64>();
        let stop = epoch(&e.stop.stop_time);
        r.backups.push((
            stop,
            json!({
                "archive": {"start": e.stop.archive_start, "stop": e.stop.archive_stop},
                "backrest": {"format": BACKREST_FORMAT, "version": format!("pgjet {}", env!("CARGO_PKG_VERSION"))},
                "database": {"id": 1, "repo-key": r.key},
                "error": e.page_errors.unwrap_or(0) > 0,
                "info": {
                    "delta": e.delta_size.unwrap_or(e.size),
                    "repository": {"delta": e.stored_size, "size": set_size},
                    "size": e.size,
                },
                "label": h.label,
                "lsn": {"start": h.start_lsn.to_string(), "stop": e.stop.stop_lsn.to_string()},
                "prior": h.reference,
                "reference": if e.references.is_empty() { Value::Null } else { json!(e.references) },
                "timestamp": {"start": epoch(&h.start_time), "stop": stop},
                "type": h.backup_type,
            }),
        ));
    }
    if summaries.is_empty() {
        (r.code, r.message) = (NO_BACKUP.0, NO_BACKUP.1.into());
    }
    Ok(())
}

/// One stanza's object from what each repository holds of it.
fn stanza_object(name: &str, repos: Vec<RepoStanza>) -> Value {
    let dbs: Vec<&(u64, String)> = repos.iter().filter_map(|r| r.db.as_ref()).collect();
    let (code, message) = if dbs.windows(2).any(|w| w[0] != w[1]) {
        (PG_MISMATCH.0, PG_MISMATCH.1.to_string())
    } else if repos.windows(2).any(|w| w[0].code != w[1].code) {
        (MIXED.0, MIXED.1.to_string())
    } else {
        match repos.first() {
            Some(r) if r.code == OTHER => (OTHER, "other".to_string()),
            Some(r) => (r.code, r.message.clone()),
            None => (MISSING_STANZA_PATH.0, MISSING_STANZA_PATH.1.to_string()),
        }
    };
    let ciphers: Vec<&str> = repos.iter().map(|r| r.cipher).collect();
    let cipher = match ciphers.first() {
        Some(c) if ciphers.iter().all(|x| x == c) => *c,
        Some(_) => "mixed",
        None => "none",
    };
    let mut backups: Vec<(i64, Value)> = Vec::new();
    for r in &repos {
        backups.extend(r.backups.iter().cloned());
    }
    backups.sort_by(|a, b| (a.0, a.1["label"].as_str()).cmp(&(b.0, b.1["label"].as_str())));
    json!({
        "archive": repos.iter().filter_map(|r| r.archive.clone()).collect::<Vec<_>>(),
        "backup": backups.into_iter().map(|(_, b)| b).collect::<Vec<_>>(),
        "cipher": cipher,
        "db": repos.iter().filter_map(|r| r.db.as_ref().map(|(id, v)| json!({
            "id": 1, "repo-key": r.key, "system-id": id, "version": v,
        }))).collect::<Vec<_>>(),
        "name": name,
        "repo": repos.iter().map(|r| json!({
            "cipher": r.cipher, "key": r.key,
            "status": {"code": r.code, "message": r.message},
        })).collect::<Vec<_>>(),
        "status": {
            "code": code,
            "lock": {"backup": {"held": repos.iter().any(|r| r.lock_held)}},
            "message": message,
        },
    })
}
