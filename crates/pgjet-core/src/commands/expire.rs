//! `expire`: removes the backups past the retention policy and the archived WAL no kept
//! backup needs, in every repository in scope (the rules: [`crate::repo::retention`]).
use crate::error::Result;
use crate::options::Settings;
use crate::repo::{self, retention};

/// Runs `expire` on every repository in scope, each under the stanza's lock. Returns the
/// lines to print.
///
/// Errors: the lock is held by a running backup; the stores'.
pub fn run(s: &Settings, dry_run: bool) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for st in repo::open::open_stanzas(&s.repo_set)? {
        st.info()?;
        let lock = st.lock("expire")?;
        for l in retention::expire_repo(&s.retention, &st, dry_run)? {
            lines.push(format!("repo{}: {l}", st.repo()));
        }
        drop(lock);
    }
    Ok(lines)
}
