//! `verify`: re-reads every stored byte of one backup or of all, against the manifest.
use super::*;
use crate::repo;
use crate::transfer::restore::read_back;
use crate::transfer::Progress;

/// Runs `verify`. Returns one line per backup checked; errors with [`Error::Corrupt`] naming
/// every file with a missing or damaged frame.
pub fn run(s: &Settings, set: Option<&str>, progress: &dyn Progress) -> Result<Vec<String>> {
    let stanza = s.stanza()?;
    let store = open_repo(s)?;
    repo::read_stanza(&*store, stanza)?;
    let labels = match set {
        Some(l) => vec![repo::resolve_set(&*store, stanza, l)?],
        None => repo::list_complete(&*store, stanza)?,
    };
    let mut lines = Vec::new();
    let mut corrupt: Vec<(String, Vec<String>)> = Vec::new();
    for label in labels {
        let m = repo::read_manifest(&*store, stanza, &label)?;
        progress.begin(&format!("verify {label}"), m.size);
        let bad = read_back(&*store, &m, None, None, s.jobs, progress)?;
        progress.finish();
        if bad.is_empty() {
            lines.push(format!(
                "{label}: ok ({} files, {} stored)",
                m.files.len(),
                mib(m.stored_size)
            ));
        } else {
            for f in &bad {
                lines.push(format!("{label}: corrupt file {f}"));
            }
            corrupt.push((label, bad));
        }
    }
    if !corrupt.is_empty() {
        let label = corrupt
            .iter()
            .map(|(l, _)| l.clone())
            .collect::<Vec<_>>()
            .join(", ");
        let files = corrupt.into_iter().flat_map(|(_, f)| f).collect();
        for l in &lines {
            tracing::info!("{l}");
        }
        return Err(Error::Corrupt { label, files });
    }
    Ok(lines)
}
