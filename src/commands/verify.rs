//! `verify`: re-reads every stored byte of one backup or of all, against the manifest.
use crate::error::{Error, Result};
use crate::io::mib;
use crate::options::Settings;
use crate::repo;
use crate::repo::open::{open_repo_with_set, open_repos};
use crate::repo::read_back::{ReadBack, Want};
use crate::transfer::Progress;

/// Runs `verify`. Returns one line per backup checked; errors with [`Error::Corrupt`] naming
/// every file with a missing or damaged frame.
pub fn run(s: &Settings, set: Option<&str>, progress: &dyn Progress) -> Result<Vec<String>> {
    let stanza = s.stanza()?;
    // With --set: the repository that holds it. Without: every backup of every repository
    // in scope.
    let mut work: Vec<(u8, std::sync::Arc<dyn crate::storage::Storage>, String)> = Vec::new();
    match set {
        Some(l) => work.push(open_repo_with_set(s, stanza, l)?),
        None => {
            for (n, store) in open_repos(s)? {
                repo::read_stanza(&*store, stanza)?;
                for label in repo::list_complete(&*store, stanza)? {
                    work.push((n, store.clone(), label));
                }
            }
        }
    }
    let several = s.repos.len() > 1;
    let mut lines = Vec::new();
    let mut corrupt: Vec<(String, Vec<String>)> = Vec::new();
    for (n, store, label) in work {
        let shown = if several {
            format!("repo{n} {label}")
        } else {
            label.clone()
        };
        // A first pass checks the whole manifest; the second streams its files.
        let scan = repo::scan_manifest(&*store, stanza, &label)?;
        let (h, end) = (&scan.summary.header, &scan.summary.end);
        let rb = ReadBack {
            store: &*store,
            stanza,
            label: &label,
            kind: h.compression.kind,
            contiguous: scan.contiguous,
            target: None,
            overwrite: false,
            jobs: s.jobs,
        };
        let stream = repo::ManifestReader::open(&*store, stanza, &label)?.files();
        progress.begin(&format!("verify {shown}"), end.size);
        let bad = rb.run(stream, &mut |_| Ok(Want::All), progress)?;
        progress.finish();
        if bad.is_empty() {
            lines.push(format!(
                "{shown}: ok ({} files, {} stored)",
                end.files,
                mib(end.stored_size)
            ));
        } else {
            for f in &bad {
                lines.push(format!("{shown}: corrupt file {f}"));
            }
            corrupt.push((shown, bad));
        }
    }
    // Without --set, the WAL archive of every repository in scope too.
    if set.is_none() {
        for (n, store) in open_repos(s)? {
            let shown = if several {
                format!("repo{n} WAL archive")
            } else {
                "WAL archive".to_string()
            };
            let (files, stored, bad) = repo::wal::verify_archive(&*store, stanza, s.jobs)?;
            if files == 0 {
                continue;
            }
            if bad.is_empty() {
                lines.push(format!(
                    "{shown}: ok ({files} files, {} stored)",
                    mib(stored)
                ));
            } else {
                for f in &bad {
                    lines.push(format!("{shown}: corrupt file {f}"));
                }
                corrupt.push((shown, bad));
            }
        }
    }
    if !corrupt.is_empty() {
        let label = corrupt
            .iter()
            .map(|(l, _)| l.clone())
            .collect::<Vec<_>>()
            .join(", ");
        let label = if label.contains("WAL archive") {
            label
        } else {
            format!("backup {label}")
        };
        let files = corrupt.into_iter().flat_map(|(_, f)| f).collect();
        for l in &lines {
            tracing::info!("{l}");
        }
        return Err(Error::Corrupt { label, files });
    }
    Ok(lines)
}
