//! `expire`: removes the backups past the retention policy and the archived WAL no kept
//! backup needs, in every repository in scope (the rules: [`crate::repo::retention`]).
use crate::error::Result;
use crate::options::Settings;
use crate::repo::{self, retention, StanzaLock};

/// Runs `expire` on every repository in scope, each under the stanza's lock. Returns the
/// lines to print.
///
/// Errors: the lock is held by a running backup; the stores'.
pub fn run(s: &Settings, dry_run: bool) -> Result<Vec<String>> {
    let stanza = s.stanza()?;
    let mut lines = Vec::new();
    for (n, store) in repo::open::open_repos(s)? {
        repo::read_stanza(&*store, stanza)?;
        let lock = StanzaLock::acquire(store.clone(), stanza, "expire")?;
        for l in retention::expire_repo(&s.retention, &store, stanza, dry_run)? {
            lines.push(format!("repo{n}: {l}"));
        }
        drop(lock);
    }
    Ok(lines)
}
