//! `verify`: re-reads every stored byte of one backup or of all, against the manifest.
use crate::error::{Error, Result};
use crate::io::mib;
use crate::options::Settings;
use crate::repo;
use crate::repo::open::{open_stanza_with_set, open_stanzas};
use crate::repo::read_back::{ReadBack, Want};
use crate::repo::Stanza;
use crate::transfer::Progress;

/// Runs `verify`. Returns one line per backup checked; errors with [`Error::Corrupt`] naming
/// every file with a missing or damaged frame.
pub fn run(s: &Settings, set: Option<&str>, progress: &dyn Progress) -> Result<Vec<String>> {
    let repo_set = &s.repo_set;
    // With --set: the repository that holds it. Without: every backup of every repository
    // in scope.
    let mut work: Vec<(Stanza, String)> = Vec::new();
    match set {
        Some(l) => work.push(open_stanza_with_set(repo_set, l)?),
        None => {
            for st in open_stanzas(repo_set)? {
                st.info()?;
                for label in st.complete()? {
                    work.push((st.clone(), label));
                }
            }
        }
    }
    let several = s.repo_set.repos.len() > 1;
    let mut lines = Vec::new();
    let mut corrupt: Vec<(String, Vec<String>)> = Vec::new();
    for (st, label) in work {
        let backup = st.backup(&label);
        let shown = if several {
            format!("repo{} {label}", st.repo())
        } else {
            label.clone()
        };
        // A first pass checks the whole manifest; the second streams its files.
        let scan = backup.scan()?;
        let (h, end) = (&scan.summary.header, &scan.summary.end);
        // The pieces stored in older backups are read and checked there.
        let chain = match repo::chain::open_chain(&backup, &scan.summary) {
            Ok(c) => c,
            Err(e) => {
                lines.push(format!("{shown}: {e}"));
                corrupt.push((shown, vec![e.to_string()]));
                continue;
            }
        };
        let rb = ReadBack {
            backup: &backup,
            kind: h.compression.kind,
            chain: &chain,
            contiguous: scan.contiguous,
            target: None,
            jobs: s.jobs(),
        };
        let stream = backup.manifest_reader()?.files();
        progress.begin(&format!("verify {shown}"), end.size);
        let bad = rb.run(stream, &mut |_| Ok(Want::All), progress)?.bad;
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
        for st in open_stanzas(repo_set)? {
            let shown = if several {
                format!("repo{} WAL archive", st.repo())
            } else {
                "WAL archive".to_string()
            };
            let (files, stored, bad) = repo::wal::verify_archive(&st, s.jobs())?;
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
