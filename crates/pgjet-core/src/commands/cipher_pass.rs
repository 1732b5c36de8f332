//! `cipher-pass-change`: a new passphrase for an encrypted repository's stanza. The stanza,
//! archive and backup keys stay; only their wrapping (cipher.json, each backup's key file)
//! is rewritten, with the stanza's lock held ([`CipherStorage::change_passphrase`]).
use crate::error::{Error, Result};
use crate::options::Settings;
use crate::repo::cipher_store::CipherStorage;
use crate::repo::Stanza;
use std::sync::Arc;

/// Runs `cipher-pass-change` on the command's stanza in the repository it uses (`--repo N`,
/// else the first): the current passphrase from `repoN-cipher-pass`, the new one from
/// `repoN-cipher-pass-new` (config file or environment only). Returns what was done.
///
/// Errors: the repository is not configured as encrypted, no new passphrase or the same
/// one; the current passphrase does not open the stanza; another command holds the
/// stanza's lock; the store's.
pub fn run(s: &Settings) -> Result<String> {
    let stanza = s.stanza()?;
    let (n, cfg) = s.repo()?;
    let pass = |list: &[(u8, crate::options::CipherPass)]| {
        list.iter().find(|(k, _)| *k == n).map(|(_, p)| p.clone())
    };
    let old = pass(&s.repo_set.ciphers).ok_or_else(|| {
        Error::Config(format!(
            "repo{n} is not configured as encrypted: set repo{n}-cipher-type=aes-256-gcm and its current passphrase in repo{n}-cipher-pass"
        ))
    })?;
    let new = pass(&s.ciphers_new).ok_or_else(|| {
        Error::Config(format!(
            "set the new passphrase in repo{n}-cipher-pass-new (config file or PGJET_REPO{n}_CIPHER_PASS_NEW)"
        ))
    })?;
    if new.expose() == old.expose() {
        return Err(Error::Config(format!(
            "repo{n}-cipher-pass-new is the current passphrase"
        )));
    }
    let store = Arc::new(CipherStorage::new(
        crate::storage::open(cfg)?,
        n,
        old.expose(),
    ));
    let st = Stanza::new(n, store.clone(), stanza);
    st.info()?;
    let lock = st.lock("cipher-pass-change")?;
    let keys = store.change_passphrase(stanza, new.expose())?;
    drop(lock);
    Ok(format!(
        "repo{n}: stanza '{stanza}' now opens with repo{n}-cipher-pass-new ({keys} backup keys and the stanza's rewrapped, no data rewritten); make it repo{n}-cipher-pass wherever the old one is set"
    ))
}
