//! Opening the configured repositories: the one a command uses, every one in scope, or the
//! first that holds a given backup.
use crate::error::{Error, Result};
use crate::options::{RepoConfig, Settings};
use crate::storage::Storage;
use std::sync::Arc;

/// Opens the repository the command uses (`--repo N`, else the first configured).
///
/// Errors: none configured, a posix path that is not a directory, an object store that
/// refuses the credentials or lacks the bucket.
pub fn open_repo(s: &Settings) -> Result<(u8, Arc<dyn Storage>)> {
    let (n, cfg) = s.repo()?;
    Ok((n, crate::storage::open(cfg)?))
}

/// Every configured repository but number `except`, opened; one that cannot be opened is
/// left out with a warning (for checks that are best made everywhere, such as a new
/// backup label's uniqueness).
pub fn open_other_repos(s: &Settings, except: u8) -> Vec<(u8, Arc<dyn Storage>)> {
    s.repos
        .iter()
        .filter(|(n, _)| *n != except)
        .filter_map(|(n, cfg)| match crate::storage::open(cfg) {
            Ok(st) => Some((*n, st)),
            Err(e) => {
                tracing::warn!("repo{n}: cannot be opened: {e}");
                None
            }
        })
        .collect()
}

/// The repositories a command that reads or sets up every repository works on: `--repo N`
/// alone, else every configured one in order (repo1 first).
///
/// Errors: none configured, or `--repo N` not configured.
pub fn repos_in_scope(s: &Settings) -> Result<Vec<(u8, &RepoConfig)>> {
    if s.repo.is_some() {
        return Ok(vec![s.repo()?]);
    }
    s.repo()?;
    Ok(s.repos.iter().map(|(n, c)| (*n, c)).collect())
}

/// Opens every repository in scope ([`repos_in_scope`]), in order.
///
/// Errors: as [`crate::storage::open`], for the first repository that cannot be opened.
pub fn open_repos(s: &Settings) -> Result<Vec<(u8, Arc<dyn Storage>)>> {
    repos_in_scope(s)?
        .into_iter()
        .map(|(n, cfg)| Ok((n, crate::storage::open(cfg)?)))
        .collect()
}

/// Finds the repository that holds backup `set` (a label or `latest`) of `stanza`: with
/// `--repo N` that one; else the first configured repository that has it (for `latest`, the
/// first with a complete backup), as pgBackRest's restore searches. A repository that
/// cannot be opened is skipped with a warning.
///
/// Returns the repository's number, its store and the backup's label. Errors: no repository
/// has the set (the message names what each one said).
pub fn open_repo_with_set(
    s: &Settings,
    stanza: &str,
    set: &str,
) -> Result<(u8, Arc<dyn Storage>, String)> {
    let scope = repos_in_scope(s)?;
    let single = scope.len() == 1;
    let mut why = Vec::new();
    for (n, cfg) in scope {
        let found = crate::storage::open(cfg).and_then(|store| {
            super::read_stanza(&*store, stanza)?;
            let label = super::resolve_set(&*store, stanza, set)?;
            Ok((n, store, label))
        });
        match found {
            Ok(f) => return Ok(f),
            Err(e) if single => return Err(e),
            Err(e) => {
                tracing::warn!("repo{n}: {e}");
                why.push(format!("repo{n}: {e}"));
            }
        }
    }
    Err(Error::Repo(format!(
        "no repository holds backup '{set}' of stanza '{stanza}' ({})",
        why.join("; ")
    )))
}
