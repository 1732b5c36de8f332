//! The keys of an encrypted repository (docs/encryption.md): `cipher.json` (the KDF, the
//! repository id, the wrapped stanza and archive keys) and each backup's `key` file, which
//! key seals an object (from its name), and the keys opened once per stanza per process:
//! derived, unwrapped, made for a new backup, and changed with the passphrase.
use super::cipher::{self, CipherError, DataKey, Kdf, Kek, ObjectCipher, REPO_ID_LEN, SALT_LEN};
use super::cipher_store::CipherStorage;
use super::kek_cache;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// `cipher.json`'s name below a stanza.
pub const CIPHER_FILE: &str = "cipher.json";
/// A backup's wrapped key, below its directory.
pub const KEY_FILE: &str = "key";
/// The one cipher pgjet writes (`repo-cipher-type`).
pub use crate::options::CIPHER_TYPE;

/// `cipher.json`.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct CipherFile {
    pub(super) format: u32,
    pub(super) cipher: String,
    pub(super) kdf: KdfFile,
    /// Hex of [`REPO_ID_LEN`] random bytes.
    pub(super) repository_id: String,
    /// `stanza` and `archive`: hex of the wrapped key (nonce, ciphertext, tag).
    pub(super) keys: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct KdfFile {
    pub(super) algorithm: String,
    pub(super) memory_kib: u32,
    pub(super) passes: u32,
    pub(super) lanes: u32,
    /// Hex of [`SALT_LEN`] bytes.
    pub(super) salt: String,
}

impl KdfFile {
    pub(super) fn of(kdf: &Kdf) -> KdfFile {
        KdfFile {
            algorithm: "argon2id".into(),
            memory_kib: kdf.memory_kib,
            passes: kdf.passes,
            lanes: kdf.lanes,
            salt: hex::encode(kdf.salt),
        }
    }
}

/// A backup's `key` file.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct KeyFile {
    pub(super) format: u32,
    /// Hex of the wrapped key.
    pub(super) key: String,
    /// Which key-encrypting key wrapped it: the hex of its KDF salt (absent: the current).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) kek: Option<String>,
    /// While the passphrase changes ([`CipherStorage::change_passphrase`]): the same key
    /// wrapped by the next key-encrypting key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) next: Option<NextKey>,
}

/// [`KeyFile::next`].
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct NextKey {
    pub(super) kek: String,
    pub(super) key: String,
}

impl KeyFile {
    /// The wrapped key for the key-encrypting key whose salt is `tag` (hex).
    pub(super) fn wrapped_for(&self, tag: &str) -> Option<&str> {
        if self.kek.as_deref().is_none_or(|k| k == tag) {
            return Some(&self.key);
        }
        self.next
            .as_ref()
            .filter(|n| n.kek == tag)
            .map(|n| n.key.as_str())
    }
}

/// The keys of one stanza, once its passphrase opened them.
pub(super) struct StanzaKeys {
    pub(super) repo_id: [u8; REPO_ID_LEN],
    pub(super) kek: Kek,
    /// Hex of the KDF salt: names the key-encrypting key in key files.
    pub(super) kek_tag: String,
    pub(super) stanza: Arc<DataKey>,
    pub(super) archive: Arc<DataKey>,
    pub(super) backups: Mutex<HashMap<String, Arc<DataKey>>>,
}

/// What an object's name says about its encryption.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Class<'a> {
    /// Stored as it is: `cipher.json`, a backup's `key`.
    Plain,
    Stanza(&'a str),
    Archive(&'a str),
    /// (stanza, label).
    Backup(&'a str, &'a str),
    /// Not below a stanza: pgjet writes nothing there.
    Outside,
}

pub(super) fn classify(name: &str) -> Class<'_> {
    let Some((stanza, rest)) = name.split_once('/') else {
        return Class::Outside;
    };
    if rest == CIPHER_FILE {
        return Class::Plain;
    }
    if let Some((label, object)) = rest.strip_prefix("backup/").and_then(|r| r.split_once('/')) {
        return if object == KEY_FILE {
            Class::Plain
        } else {
            Class::Backup(stanza, label)
        };
    }
    if rest.starts_with("archive/") {
        return Class::Archive(stanza);
    }
    Class::Stanza(stanza)
}

/// An object's data key and its stanza's repository id.
pub(super) struct Sealing {
    pub(super) keys: Arc<StanzaKeys>,
    pub(super) key: Arc<DataKey>,
}

impl Sealing {
    pub(super) fn cipher(&self) -> ObjectCipher<'_> {
        ObjectCipher {
            key: &self.key,
            repo_id: &self.keys.repo_id,
        }
    }
}

pub(super) fn to_json<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(v)
        .map_err(|e| Error::Other("cannot encode a cipher file".into()).because(e))
}

pub(super) fn hex_array<const N: usize>(what: &str, s: &str) -> Result<[u8; N]> {
    let v = hex::decode(s).map_err(|_| Error::Repo(format!("{what}: not hex")))?;
    v.try_into()
        .map_err(|_| Error::Repo(format!("{what}: not {N} bytes")))
}

impl CipherStorage {
    /// Opens `cipher.json`'s keys with the passphrase. Errors: a wrong passphrase; a file
    /// that is not one pgjet wrote.
    pub(super) fn open_keys(&self, name: &str, bytes: &[u8]) -> Result<StanzaKeys> {
        let f: CipherFile = serde_json::from_slice(bytes).map_err(|e| {
            Error::Repo(format!("{name}: not a cipher file pgjet can read")).because(e)
        })?;
        if f.format != 1 || f.cipher != CIPHER_TYPE || f.kdf.algorithm != "argon2id" {
            return Err(Error::Repo(format!(
                "{name}: format {} cipher {} kdf {} is not one this pgjet reads (1, {CIPHER_TYPE}, argon2id)",
                f.format, f.cipher, f.kdf.algorithm
            )));
        }
        let kdf = Kdf {
            memory_kib: f.kdf.memory_kib,
            passes: f.kdf.passes,
            lanes: f.kdf.lanes,
            salt: hex_array::<SALT_LEN>(name, &f.kdf.salt)?,
        };
        let repo_id = hex_array::<REPO_ID_LEN>(name, &f.repository_id)?;
        // A process PostgreSQL starts per segment finds the key derived by an earlier one.
        let cached = kek_cache::lookup(&kdf.salt, &repo_id, &self.pass);
        let kek = match &cached {
            Some(raw) => Kek::from_raw(raw),
            None => self.derive(&kdf, &repo_id, &self.pass)?,
        };
        match self.unwrap_keys(name, &f, &repo_id, kek) {
            Err(_) if cached.is_some() => {
                self.unwrap_keys(name, &f, &repo_id, self.derive(&kdf, &repo_id, &self.pass)?)
            }
            r => r,
        }
    }

    /// Derives the key-encrypting key of `pass` and caches it ([`kek_cache`]).
    pub(super) fn derive(
        &self,
        kdf: &Kdf,
        repo_id: &[u8; REPO_ID_LEN],
        pass: &[u8],
    ) -> Result<Kek> {
        let raw = kdf.derive_raw(pass)?;
        kek_cache::store(&kdf.salt, repo_id, pass, &raw);
        Ok(Kek::from_raw(&raw))
    }

    /// The stanza's keys, unwrapped from `cipher.json` (`f`, named `name`) with `kek`.
    pub(super) fn unwrap_keys(
        &self,
        name: &str,
        f: &CipherFile,
        repo_id: &[u8; REPO_ID_LEN],
        kek: Kek,
    ) -> Result<StanzaKeys> {
        let repo_id = *repo_id;
        let unwrap = |which: &str| -> Result<Arc<DataKey>> {
            let wrapped = f
                .keys
                .get(which)
                .and_then(|h| hex::decode(h).ok())
                .ok_or_else(|| Error::Repo(format!("{name}: no {which} key")))?;
            match kek.unwrap(&repo_id, which, &wrapped) {
                Ok(k) => Ok(Arc::new(k)),
                Err(CipherError::WrongPassphrase(_)) => Err(self.wrong_passphrase()),
                Err(e) => Err(e.into()),
            }
        };
        let (stanza, archive) = (unwrap("stanza")?, unwrap("archive")?);
        Ok(StanzaKeys {
            repo_id,
            kek,
            kek_tag: f.kdf.salt.clone(),
            stanza,
            archive,
            backups: Mutex::new(HashMap::new()),
        })
    }

    /// A new `cipher.json`: a fresh salt, repository id, stanza and archive keys.
    pub(super) fn new_cipher_file(&self) -> Result<Vec<u8>> {
        let kdf = Kdf::new()?;
        let repo_id = cipher::new_repository_id()?;
        let kek = self.derive(&kdf, &repo_id, &self.pass)?;
        let mut keys = BTreeMap::new();
        for which in ["stanza", "archive"] {
            let wrapped = kek.wrap(&repo_id, which, &DataKey::random()?)?;
            keys.insert(which.to_string(), hex::encode(wrapped));
        }
        let f = CipherFile {
            format: 1,
            cipher: CIPHER_TYPE.into(),
            kdf: KdfFile::of(&kdf),
            repository_id: hex::encode(repo_id),
            keys,
        };
        to_json(&f)
    }

    /// The keys of `stanza`, opened once. Without a `cipher.json`: made when `write`
    /// (unless the stanza holds plain objects: refused), else None.
    pub(super) fn stanza_keys(&self, stanza: &str, write: bool) -> Result<Option<Arc<StanzaKeys>>> {
        let mut cache = self.stanzas.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = cache.get(stanza) {
            return Ok(Some(k.clone()));
        }
        let name = format!("{stanza}/{CIPHER_FILE}");
        for _ in 0..2 {
            match self.inner.get(&name) {
                Ok(bytes) => {
                    let keys = Arc::new(self.open_keys(&name, &bytes)?);
                    cache.insert(stanza.to_string(), keys.clone());
                    return Ok(Some(keys));
                }
                Err(e) if !e.is_not_found() => return Err(e),
                Err(_) if !write => return Ok(None),
                Err(_) => {
                    if self.inner.exists(&format!("{stanza}/stanza.json"))? {
                        return Err(self.plain_stanza(stanza));
                    }
                    // Lost a race with another process: read the one it made.
                    self.inner.create_new(&name, &self.new_cipher_file()?)?;
                }
            }
        }
        Err(Error::Repo(format!("{name}: could not be created or read")))
    }

    /// The key of backup `label`: from its `key` file, or (when `write`) a new one whose
    /// file is written first. None when it has none and `!write`.
    pub(super) fn backup_key(
        &self,
        keys: &StanzaKeys,
        stanza: &str,
        label: &str,
        write: bool,
    ) -> Result<Option<Arc<DataKey>>> {
        let mut cache = keys.backups.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = cache.get(label) {
            return Ok(Some(k.clone()));
        }
        let name = format!("{stanza}/backup/{label}/{KEY_FILE}");
        let which = format!("backup/{label}");
        for _ in 0..2 {
            match self.inner.get(&name) {
                Ok(bytes) => {
                    let f: KeyFile = serde_json::from_slice(&bytes)
                        .map_err(|e| Error::Repo(format!("{name}: not a key file")).because(e))?;
                    let wrapped = f
                        .wrapped_for(&keys.kek_tag)
                        .and_then(|h| hex::decode(h).ok())
                        .ok_or_else(|| {
                            Error::Repo(format!(
                                "{name}: holds no key wrapped by this stanza's current passphrase (damaged, or copied from another repository)"
                            ))
                        })?;
                    let key = match keys.kek.unwrap(&keys.repo_id, &which, &wrapped) {
                        Ok(k) => Arc::new(k),
                        Err(CipherError::WrongPassphrase(_)) => {
                            return Err(Error::Repo(format!(
                                "{name}: does not open with this repository's passphrase (damaged, or another backup's key)"
                            )))
                        }
                        Err(e) => return Err(e.into()),
                    };
                    cache.insert(label.to_string(), key.clone());
                    return Ok(Some(key));
                }
                Err(e) if !e.is_not_found() => return Err(e),
                Err(_) if !write => return Ok(None),
                Err(_) => {
                    let wrapped = keys.kek.wrap(&keys.repo_id, &which, &DataKey::random()?)?;
                    let f = KeyFile {
                        format: 1,
                        key: hex::encode(wrapped),
                        kek: Some(keys.kek_tag.clone()),
                        next: None,
                    };
                    self.inner.create_new(&name, &to_json(&f)?)?;
                }
            }
        }
        Err(Error::Repo(format!("{name}: could not be created or read")))
    }

    /// How object `name` is sealed: None for a plain one. On a read (`!write`) of an object
    /// whose key does not exist: the store's not-found error when the object does not
    /// exist either, else a clear refusal.
    pub(super) fn sealing(&self, name: &str, write: bool) -> Result<Option<Sealing>> {
        let stanza = match classify(name) {
            Class::Plain => return Ok(None),
            Class::Outside => {
                return Err(Error::Repo(format!(
                    "{name}: an object outside any stanza in an encrypted repository"
                )))
            }
            Class::Stanza(s) | Class::Archive(s) | Class::Backup(s, _) => s,
        };
        let Some(keys) = self.stanza_keys(stanza, write)? else {
            // No cipher.json: the object is missing (the stanza is not created), or plain.
            self.inner.get(name)?;
            return Err(self.plain_stanza(stanza));
        };
        let key = match classify(name) {
            Class::Archive(_) => keys.archive.clone(),
            Class::Backup(_, label) => match self.backup_key(&keys, stanza, label, write)? {
                Some(k) => k,
                None => {
                    self.inner.get(name)?;
                    return Err(Error::Repo(format!(
                        "backup {label}: its key ({stanza}/backup/{label}/{KEY_FILE}) is missing, so its objects cannot be opened"
                    )));
                }
            },
            _ => keys.stanza.clone(),
        };
        Ok(Some(Sealing { keys, key }))
    }

    /// Changes the passphrase of `stanza` to `new`: a new salt and key-encrypting key wrap
    /// the same stanza, archive and backup keys; no object but the key files is rewritten.
    /// Returns the number of backup keys rewrapped.
    ///
    /// Safe to interrupt at any point: each backup's key file first gets the key wrapped
    /// both ways, then `cipher.json` is replaced (durably, in one write: the switch), then
    /// the key files drop the old wrapping. Before the switch the old passphrase opens
    /// everything, after it the new one. The caller holds the stanza's lock, so no backup
    /// makes a key meanwhile.
    ///
    /// Errors: the stanza has no `cipher.json`; the current passphrase does not open it; a
    /// key file that does not open; the store's.
    pub fn change_passphrase(&self, stanza: &str, new: &str) -> Result<usize> {
        let keys = self.stanza_keys(stanza, false)?.ok_or_else(|| {
            Error::Repo(format!(
                "stanza '{stanza}' has no {CIPHER_FILE}: it is not encrypted"
            ))
        })?;
        let name = format!("{stanza}/{CIPHER_FILE}");
        let old: CipherFile = serde_json::from_slice(&self.inner.get(&name)?)
            .map_err(|e| Error::Repo(name.to_string()).because(e))?;
        let kdf = Kdf::new()?;
        let kek = self.derive(&kdf, &keys.repo_id, new.as_bytes())?;
        let tag = hex::encode(kdf.salt);
        // 1. Every backup's key wrapped both ways.
        let mut files = Vec::new();
        for label in crate::storage::list_sorted(self.inner.as_ref(), &format!("{stanza}/backup"))?
        {
            let key_name = format!("{stanza}/backup/{label}/{KEY_FILE}");
            let mut f: KeyFile = match self.inner.get(&key_name) {
                Ok(b) => serde_json::from_slice(&b)
                    .map_err(|e| Error::Repo(format!("{key_name}: not a key file")).because(e))?,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            };
            let key = self
                .backup_key(&keys, stanza, &label, false)?
                .ok_or_else(|| Error::Repo(format!("{key_name}: vanished")))?;
            let wrapped = hex::encode(kek.wrap(&keys.repo_id, &format!("backup/{label}"), &key)?);
            f.next = Some(NextKey {
                kek: tag.clone(),
                key: wrapped.clone(),
            });
            f.kek.get_or_insert_with(|| keys.kek_tag.clone());
            self.inner.put_durable(&key_name, &to_json(&f)?)?;
            files.push((key_name, wrapped));
        }
        // 2. The switch.
        let mut wrapped = BTreeMap::new();
        for (which, key) in [("stanza", &keys.stanza), ("archive", &keys.archive)] {
            wrapped.insert(
                which.to_string(),
                hex::encode(kek.wrap(&keys.repo_id, which, key)?),
            );
        }
        let f = CipherFile {
            kdf: KdfFile::of(&kdf),
            keys: wrapped,
            ..old
        };
        self.inner.put_durable(&name, &to_json(&f)?)?;
        // 3. The old wrapping goes.
        for (key_name, key) in &files {
            let f = KeyFile {
                format: 1,
                key: key.clone(),
                kek: Some(tag.clone()),
                next: None,
            };
            self.inner.put_durable(key_name, &to_json(&f)?)?;
        }
        // This process goes on with the same keys under the new passphrase (its lock, say).
        let backups = std::mem::take(&mut *keys.backups.lock().unwrap_or_else(|p| p.into_inner()));
        let next = StanzaKeys {
            repo_id: keys.repo_id,
            kek,
            kek_tag: tag,
            stanza: keys.stanza.clone(),
            archive: keys.archive.clone(),
            backups: Mutex::new(backups),
        };
        self.stanzas
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(stanza.to_string(), Arc::new(next));
        Ok(files.len())
    }

    /// Forgets the cached backup keys whose key file removing `path` (an object or a
    /// directory) takes away: a backup's `key`, its directory, the stanza's `backup/`, the
    /// stanza, the root. Other removals (WAL, data objects) touch no key.
    pub(super) fn forget(&self, path: &str) {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let (stanza, label) = match parts.as_slice() {
            [] => (None, None),
            [s] | [s, "backup"] => (Some(*s), None),
            [s, "backup", l] | [s, "backup", l, KEY_FILE] => (Some(*s), Some(*l)),
            _ => return,
        };
        let stanzas = self.stanzas.lock().unwrap_or_else(|p| p.into_inner());
        for (name, keys) in stanzas.iter() {
            if stanza.is_some_and(|s| s != name) {
                continue;
            }
            let mut backups = keys.backups.lock().unwrap_or_else(|p| p.into_inner());
            match label {
                Some(l) => {
                    backups.remove(l);
                }
                None => backups.clear(),
            }
        }
    }
}
