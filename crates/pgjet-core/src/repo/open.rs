//! Opening the configured repositories: the one a command uses, every one in scope, or the
//! first that holds a given backup.
use super::cipher_store::CipherStorage;
use super::Stanza;
use crate::error::{Error, Result};
use crate::options::RepoSet;
use crate::storage::config::RepoConfig;
use crate::storage::Storage;
use std::sync::Arc;

/// Opens the command's stanza (`--stanza`) in the repository it uses (`--repo N`, else the
/// first configured). Nothing of the stanza is read yet.
///
/// Errors: no stanza given, none configured, a posix path that is not a directory, an
/// object store that refuses the credentials or lacks the bucket.
pub fn open_stanza(s: &RepoSet) -> Result<Stanza> {
    let stanza = s.stanza()?;
    let (n, cfg) = s.repo()?;
    Ok(Stanza::new(n, open_store(s, n, cfg)?, stanza))
}

/// Opens repository `n` (`cfg`): encrypted with its passphrase when
/// `repoN-cipher-type=aes-256-gcm` ([`CipherStorage`]), else as it is.
///
/// Errors: as [`crate::storage::open`].
pub fn open_store(s: &RepoSet, n: u8, cfg: &RepoConfig) -> Result<Arc<dyn Storage>> {
    let store = crate::storage::open(cfg)?;
    Ok(match s.ciphers.iter().find(|(k, _)| *k == n) {
        Some((_, pass)) => Arc::new(CipherStorage::new(store, n, pass.expose())),
        None => store,
    })
}

/// The command's stanza in every configured repository but number `except`; a repository
/// that cannot be opened is left out with a warning (for checks that are best made
/// everywhere, such as a new backup label's uniqueness).
///
/// Errors: no stanza given.
pub fn open_other_stanzas(s: &RepoSet, except: u8) -> Result<Vec<Stanza>> {
    let stanza = s.stanza()?;
    Ok(s.repos
        .iter()
        .filter(|(n, _)| *n != except)
        .filter_map(|(n, cfg)| match open_store(s, *n, cfg) {
            Ok(st) => Some(Stanza::new(*n, st, stanza)),
            Err(e) => {
                tracing::warn!("repo{n}: cannot be opened: {e}");
                None
            }
        })
        .collect())
}

/// The repositories a command that reads or sets up every repository works on: `--repo N`
/// alone, else every configured one in order (repo1 first).
///
/// Errors: none configured, or `--repo N` not configured.
pub fn repos_in_scope(s: &RepoSet) -> Result<Vec<(u8, &RepoConfig)>> {
    if s.repo.is_some() {
        return Ok(vec![s.repo()?]);
    }
    s.repo()?;
    Ok(s.repos.iter().map(|(n, c)| (*n, c)).collect())
}

/// Opens every repository in scope ([`repos_in_scope`]), in order.
///
/// Errors: as [`crate::storage::open`], for the first repository that cannot be opened.
pub fn open_repos(s: &RepoSet) -> Result<Vec<(u8, Arc<dyn Storage>)>> {
    repos_in_scope(s)?
        .into_iter()
        .map(|(n, cfg)| Ok((n, open_store(s, n, cfg)?)))
        .collect()
}

/// The command's stanza (`--stanza`) in every repository in scope ([`repos_in_scope`]), in
/// order. Nothing of the stanza is read yet.
///
/// Errors: no stanza given; as [`crate::storage::open`], for the first repository that
/// cannot be opened.
pub fn open_stanzas(s: &RepoSet) -> Result<Vec<Stanza>> {
    let stanza = s.stanza()?;
    Ok(open_repos(s)?
        .into_iter()
        .map(|(n, store)| Stanza::new(n, store, stanza))
        .collect())
}

/// Finds the repository that holds backup `set` (a label or `latest`) of the command's
/// stanza: with `--repo N` that one; else the first configured repository that has it (for
/// `latest`, the first with a complete backup), as pgBackRest's restore searches. A
/// repository that cannot be opened is skipped with a warning.
///
/// Returns the stanza in that repository and the backup's label. Errors: no stanza given;
/// no repository has the set (the message names what each one said).
pub fn open_stanza_with_set(s: &RepoSet, set: &str) -> Result<(Stanza, String)> {
    let stanza = s.stanza()?;
    let scope = repos_in_scope(s)?;
    let single = scope.len() == 1;
    let mut why = Vec::new();
    for (n, cfg) in scope {
        let found = open_store(s, n, cfg).and_then(|store| {
            let st = Stanza::new(n, store, stanza);
            st.info()?;
            let label = st.resolve_set(set)?.label().to_string();
            Ok((st, label))
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
