//! The stanza handle: one stanza of one repository, through which every command reads and
//! writes the format below `<stanza>/` (docs/repository-format.md). Object names are built
//! here and in the modules of `repo/` only; a caller holds a [`Stanza`] and, for one backup,
//! a [`Backup`], and never a `(store, stanza, label)` triple.
pub use super::handle::{Backup, Stanza};
use super::manifest_io::{self, BackupSummary, ManifestReader, ManifestWriter, ScannedManifest};
use super::{BackupManifest, ManifestHeader, StanzaInfo, StanzaLock, REPO_FORMAT};
use crate::error::{Error, Result};
use crate::storage::Storage;
use std::sync::Arc;

/// What to do about stanza `name` missing from `store`: the stanzas it has (a mistyped
/// --stanza), or stanza-create when it has none.
pub fn missing_stanza_hint(name: &str, store: &Arc<dyn Storage>) -> String {
    match stanza_names(store) {
        Ok(names) if !names.is_empty() => format!(
            "this repository holds the stanza(s) {}: check --stanza (or stanza= in the config file); a new stanza '{name}' is made with `pgjet --stanza {name} stanza-create`",
            names.join(", ")
        ),
        _ => format!(
            "this repository holds no stanza yet: create it with `pgjet --stanza {name} stanza-create` (or check --repo-path: is it the repository you meant?)"
        ),
    }
}

impl Stanza {
    /// True when the stanza has been created in this repository.
    ///
    /// Errors: the store's.
    pub fn exists(&self) -> Result<bool> {
        self.store().exists(&self.info_name())
    }

    /// Reads the stanza info; a missing stanza is an error that points at stanza-create.
    ///
    /// Errors: [`Error::Repo`] for a missing stanza, an unreadable `stanza.json` or another
    /// format version; the store's.
    pub fn info(&self) -> Result<StanzaInfo> {
        let name = self.info_name();
        let bytes = match self.store().get(&name) {
            Ok(b) => b,
            Err(e) if e.is_not_found() => {
                return Err(Error::Repo(format!(
                    "stanza '{}' does not exist in repo{}",
                    self.name(),
                    self.repo()
                ))
                .with_hint(missing_stanza_hint(self.name(), &self.store_arc())))
            }
            Err(e) => return Err(e),
        };
        if bytes.starts_with(super::cipher::MAGIC) {
            let n = self.repo();
            return Err(Error::Repo(format!(
                "stanza '{}' of repo{n} is encrypted: set repo{n}-cipher-type=aes-256-gcm and repo{n}-cipher-pass (config file or PGJET_REPO{n}_CIPHER_PASS)",
                self.name()
            )));
        }
        let info: StanzaInfo = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Repo(format!("{name} is not valid: {e}")))?;
        if info.format != REPO_FORMAT {
            return Err(Error::Repo(format!(
                "{name} has format {}, this pgjet reads {REPO_FORMAT}",
                info.format
            )));
        }
        Ok(info)
    }

    /// Writes the stanza info (stanza-create), durably.
    ///
    /// Errors: `info` names another stanza; the store's.
    pub fn create(&self, info: &StanzaInfo) -> Result<()> {
        if info.stanza != self.name() {
            return Err(Error::Other(format!(
                "stanza info of '{}' written as stanza '{}'",
                info.stanza,
                self.name()
            )));
        }
        let json = serde_json::to_vec_pretty(info)
            .map_err(|e| Error::Other(format!("cannot encode the stanza info: {e}")))?;
        self.store().put_durable(&self.info_name(), &json)
    }

    /// Labels of every backup directory of the stanza, complete or not, oldest first.
    ///
    /// Errors: the store's.
    pub fn labels(&self) -> Result<Vec<String>> {
        crate::storage::list_sorted(self.store(), &self.backups_dir())
    }

    /// Labels of the complete backups (those with a summary), oldest first.
    ///
    /// Errors: the store's.
    pub fn complete(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for label in self.labels()? {
            if self.backup(&label).is_complete()? {
                out.push(label);
            }
        }
        Ok(out)
    }

    /// Labels of backup directories with no summary: interrupted backups.
    ///
    /// Errors: the store's.
    pub fn incomplete(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for label in self.labels()? {
            if !label.ends_with(".tmp") && !self.backup(&label).is_complete()? {
                out.push(label);
            }
        }
        Ok(out)
    }

    /// Resolves `--set` (a label or `latest`) to a complete backup.
    ///
    /// Errors: [`Error::Repo`] when no complete backup matches, naming those there are.
    pub fn resolve_set(&self, set: &str) -> Result<Backup<'_>> {
        let labels = self.complete()?;
        let label = if set == "latest" {
            labels.last().cloned().ok_or_else(|| {
                Error::Repo(format!("stanza '{}' has no complete backup", self.name()))
            })?
        } else if labels.iter().any(|l| l == set) {
            set.to_string()
        } else {
            return Err(Error::Repo(format!(
                "backup '{set}' not found in stanza '{}' (complete backups: {})",
                self.name(),
                labels.join(", ")
            )));
        };
        Ok(self.backup(&label))
    }

    /// Checks that a command can write to the stanza's part of the repository: a probe object
    /// `<stanza>/check.<pid>` is written durably and removed (documented in
    /// docs/repository-format.md).
    ///
    /// Errors: the store's.
    pub fn check_writable(&self) -> Result<()> {
        let probe = format!("{}/check.{}", self.name(), std::process::id());
        self.store().put_durable(&probe, b"pgjet check\n")?;
        self.store().delete(&probe)
    }

    /// Takes the stanza's backup lock for `command` (see [`super::lock`]).
    ///
    /// Errors: as [`StanzaLock::acquire`].
    pub fn lock(&self, command: &str) -> Result<StanzaLock> {
        StanzaLock::acquire(self.store_arc(), self.name(), command)
    }

    /// Removes every interrupted backup (no summary) but `keep` (the one a backup
    /// resumes), with a warning each: a backup under the stanza's lock calls this before it
    /// starts.
    ///
    /// Errors: the store's.
    pub fn remove_incomplete(&self, keep: Option<&str>) -> Result<()> {
        for stale in self.incomplete()? {
            if Some(stale.as_str()) == keep {
                continue;
            }
            tracing::warn!("removing interrupted backup {stale} (it has no summary)");
            self.backup(&stale).remove()?;
        }
        Ok(())
    }
}

impl Backup<'_> {
    /// True when the backup's summary exists (the backup is complete).
    ///
    /// Errors: the store's.
    pub fn is_complete(&self) -> Result<bool> {
        self.store()
            .exists(&self.file_name(manifest_io::SUMMARY_OBJECT))
    }

    /// Reads the summary; see [`manifest_io::read_summary`].
    pub fn summary(&self) -> Result<BackupSummary> {
        manifest_io::read_summary(self)
    }

    /// Opens the manifest as a stream; see [`ManifestReader::open`].
    pub fn manifest_reader(&self) -> Result<ManifestReader> {
        ManifestReader::open(self)
    }

    /// Checks the whole manifest in one pass; see [`manifest_io::scan_manifest`].
    pub fn scan(&self) -> Result<ScannedManifest> {
        manifest_io::scan_manifest(self)
    }

    /// Reads the whole manifest into memory; see [`manifest_io::read_manifest`].
    pub fn manifest(&self) -> Result<BackupManifest> {
        manifest_io::read_manifest(self)
    }

    /// Starts the backup's manifest ([`ManifestWriter`]): the backup is being written.
    ///
    /// Errors: `header` names another backup; the store's.
    pub fn begin(&self, header: ManifestHeader) -> Result<ManifestWriter> {
        if header.label != self.label() || header.stanza != self.stanza().name() {
            return Err(Error::Other(format!(
                "manifest of {}/{} written as backup {}/{}",
                header.stanza,
                header.label,
                self.stanza().name(),
                self.label()
            )));
        }
        ManifestWriter::create(self, header)
    }

    /// Writes a whole manifest in memory and then its summary; see
    /// [`manifest_io::write_manifest`].
    pub fn write_manifest(&self, m: &BackupManifest) -> Result<BackupSummary> {
        let mut w = self.begin(m.header.clone())?;
        for d in &m.directories {
            w.dir(d)?;
        }
        for f in &m.files {
            w.file(f)?;
        }
        w.finish(m.stop.clone(), m.stored_size)
    }

    /// Removes the backup, summary first: an interrupted removal leaves an incomplete backup
    /// (which the next backup removes), never a complete-looking one with missing objects.
    ///
    /// Errors: the store's.
    pub fn remove(&self) -> Result<()> {
        self.store()
            .delete(&self.file_name(manifest_io::SUMMARY_OBJECT))?;
        self.store().remove_all(&self.dir())
    }
}

/// A label for a backup starting now that no backup of the stanza has in `stanza`'s
/// repository or in any of `others` (every configured repository a command could restore
/// from: a label names one backup wherever it is searched for). Labels have one-second
/// resolution, so this waits for the next second while the label is taken. Returns the start
/// time and the label. Another repository that cannot be listed is skipped with a warning.
/// `make` builds the label from the start time ([`super::new_label`] for a full backup,
/// [`super::label::new_chain_label`] for a diff or incr).
///
/// Errors: the backup's own repository cannot be listed.
pub fn new_unique_label(
    stanza: &Stanza,
    others: &[Stanza],
    make: &dyn Fn(chrono::DateTime<chrono::Utc>) -> String,
) -> Result<(chrono::DateTime<chrono::Utc>, String)> {
    loop {
        let started = chrono::Utc::now();
        let label = make(started);
        let mut taken = stanza.labels()?.contains(&label);
        for other in others {
            match other.labels() {
                Ok(labels) => taken |= labels.contains(&label),
                Err(e) => tracing::warn!("repo{}: cannot list the backups: {e}", other.repo()),
            }
        }
        if !taken {
            return Ok((started, label));
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Names of the stanzas created in `store` (those with a `stanza.json`), sorted.
///
/// Errors: the store's.
pub fn stanza_names(store: &Arc<dyn Storage>) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for name in store.list("")? {
        let name = name?;
        if Stanza::new(0, store.clone(), &name)
            .exists()
            .unwrap_or(false)
        {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}
