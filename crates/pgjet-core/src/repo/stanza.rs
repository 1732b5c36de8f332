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
        Ok(_) => format!(
            "this repository holds no stanza yet: create it with `pgjet --stanza {name} stanza-create` (or check --repo-path: is it the repository you meant?)"
        ),
        // A store that fails now says nothing of which stanzas it holds.
        Err(e) => format!("the repository's stanzas could not be listed to check --stanza: {e}"),
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
            .map_err(|e| Error::Repo(format!("{name} is not valid")).because(e))?;
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
            .map_err(|e| Error::Other("cannot encode the stanza info".into()).because(e))?;
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
        if Stanza::new(0, store.clone(), &name).exists()? {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::error::StorageFault;
    use crate::repo::manifest::FileEntry;
    use crate::storage::fault::{Fault, FaultyStorage, Op};
    use crate::storage::object::ObjectStorage;

    // Backup labels (pgBackRest's form): fulls F1 < F2 < F3, a diff and an incr of F1's
    // chain, an incr of F2's.
    pub(crate) const F1: &str = "20260101-000000F";
    pub(crate) const D1: &str = "20260101-000000F_20260102-000000D";
    pub(crate) const I1: &str = "20260101-000000F_20260103-000000I";
    pub(crate) const F2: &str = "20260108-000000F";
    pub(crate) const I2: &str = "20260108-000000F_20260109-000000I";
    pub(crate) const F3: &str = "20260115-000000F";

    /// An empty in-memory repository.
    pub(crate) fn memory() -> Arc<dyn Storage> {
        Arc::new(ObjectStorage::in_memory("stanza-test").unwrap())
    }

    /// An empty in-memory repository behind a fault wrapper, the wrapper, and stanza `s`
    /// of it (repo1).
    pub(crate) fn faulty() -> (Arc<FaultyStorage>, Stanza) {
        let f = Arc::new(FaultyStorage::new(memory()));
        let st = Stanza::new(1, f.clone(), "s");
        (f, st)
    }

    /// The stanza info of stanza `name` of the cluster the test manifests describe.
    pub(crate) fn info(name: &str) -> StanzaInfo {
        StanzaInfo {
            format: REPO_FORMAT,
            stanza: name.into(),
            system_identifier: 1,
            pg_version: "15".into(),
            pg_version_num: 150000,
            catalog_version: 1,
            created: "2026-01-01T00:00:00Z".into(),
            wal_segment_size: 16 << 20,
        }
    }

    /// A small valid manifest of backup `label` of stanza `s` (type from the label's last
    /// letter), whose pieces name the older backups `refs` (one file each).
    pub(crate) fn manifest(label: &str, refs: &[&str]) -> BackupManifest {
        let mut m = crate::repo::manifest::tests::sample();
        m.header.label = label.into();
        m.header.stanza = "s".into();
        m.header.backup_type = match label.chars().last() {
            Some('D') => "diff",
            Some('I') => "incr",
            _ => "full",
        }
        .into();
        m.header.databases = vec![(5, 1)];
        if !refs.is_empty() {
            m.header.format = crate::repo::CHAIN_FORMAT;
            m.header.reference = refs.last().map(|r| r.to_string());
        }
        for (i, r) in refs.iter().enumerate() {
            let mut piece = m.files[0].pieces[0].clone();
            piece.backup = Some(r.to_string());
            m.files.push(FileEntry {
                path: format!("base/1/{}", 100 + i),
                pieces: vec![piece],
                ..m.files[0].clone()
            });
        }
        m
    }

    /// Writes backup `label` whole (one data object, manifest, summary): a complete backup.
    pub(crate) fn complete_backup(st: &Stanza, label: &str, refs: &[&str]) {
        let b = st.backup(label);
        b.put_object("000001", b"frames").unwrap();
        let mut m = manifest(label, refs);
        m.header.stanza = st.name().into();
        b.write_manifest(&m).unwrap();
    }

    /// Leaves backup `label` as an interrupted backup does: data objects stored and a
    /// manifest begun, never finished (no summary).
    fn interrupted_backup(st: &Stanza, label: &str) {
        let b = st.backup(label);
        b.put_object("000001", b"frames").unwrap();
        let mut w = b.begin(manifest(label, &[]).header).unwrap();
        w.dir(&manifest(label, &[]).directories[0]).unwrap();
        drop(w);
    }

    #[test]
    fn stanza_create_writes_the_info_that_info_reads_back_and_refuses_others() {
        let st = Stanza::new(1, memory(), "s");
        assert!(!st.exists().unwrap());
        let e = st.info().unwrap_err();
        assert!(
            matches!(e.kind(), Error::Repo(m) if m.contains("stanza 's' does not exist")),
            "{e:?}"
        );
        assert!(e.hint().contains("stanza-create"), "{}", e.hint());

        let e = st.create(&info("other")).unwrap_err().to_string();
        assert!(e.contains("'other'") && e.contains("'s'"), "{e}");
        assert!(!st.exists().unwrap(), "a refused create writes nothing");

        st.create(&info("s")).unwrap();
        assert!(st.exists().unwrap());
        assert_eq!(st.info().unwrap(), info("s"));

        // Another format version, and an encrypted stanza.json, are refused by name.
        let mut newer = info("s");
        newer.format = REPO_FORMAT + 1;
        st.create(&newer).unwrap();
        let e = st.info().unwrap_err().to_string();
        assert!(e.contains("s/stanza.json has format"), "{e}");
        let mut sealed = super::super::cipher::MAGIC.to_vec();
        sealed.extend_from_slice(b"opaque");
        st.store().put_durable("s/stanza.json", &sealed).unwrap();
        let e = st.info().unwrap_err().to_string();
        assert!(
            e.contains("is encrypted") && e.contains("repo1-cipher-pass"),
            "{e}"
        );
    }

    #[test]
    fn a_backup_without_its_summary_is_listed_incomplete_never_complete() {
        let st = Stanza::new(1, memory(), "s");
        assert!(st.labels().unwrap().is_empty());
        complete_backup(&st, F1, &[]);
        interrupted_backup(&st, F2);
        // A whole manifest whose summary is gone (a removal cut short).
        complete_backup(&st, F3, &[]);
        st.store()
            .delete("s/backup/20260115-000000F/summary.json")
            .unwrap();
        // A temporary directory is neither.
        st.store()
            .put("s/backup/20260120-000000F.tmp/x", b"x")
            .unwrap();

        assert_eq!(
            st.labels().unwrap(),
            vec![F1, F2, F3, "20260120-000000F.tmp"]
        );
        assert_eq!(st.complete().unwrap(), vec![F1]);
        assert_eq!(st.incomplete().unwrap(), vec![F2, F3]);
        assert!(st.backup(F1).is_complete().unwrap());
        assert!(!st.backup(F2).is_complete().unwrap());
        // Nothing of an incomplete backup reads as a backup.
        for l in [F2, F3] {
            let e = st.backup(l).summary().unwrap_err().to_string();
            assert!(e.contains("does not exist or is incomplete"), "{e}");
            assert!(st.backup(l).manifest_reader().is_err());
        }
        assert_eq!(st.backup(F1).manifest().unwrap().header.label, F1);
    }

    #[test]
    fn resolve_set_finds_the_newest_complete_backup_or_names_those_there_are() {
        let st = Stanza::new(1, memory(), "s");
        let e = st.resolve_set("latest").err().unwrap().to_string();
        assert!(e.contains("stanza 's' has no complete backup"), "{e}");

        complete_backup(&st, F1, &[]);
        complete_backup(&st, D1, &[F1]);
        interrupted_backup(&st, F2);
        // The interrupted backup is newer, but `latest` is the newest complete one.
        assert_eq!(st.resolve_set("latest").unwrap().label(), D1);
        assert_eq!(st.resolve_set(F1).unwrap().label(), F1);
        for missing in [F2, F3] {
            let e = st.resolve_set(missing).err().unwrap().to_string();
            assert!(
                e.contains(&format!("backup '{missing}' not found"))
                    && e.contains(&format!("complete backups: {F1}, {D1}")),
                "{e}"
            );
        }
    }

    #[test]
    fn remove_incomplete_spares_the_resumed_backup_and_every_complete_one() {
        let st = Stanza::new(1, memory(), "s");
        complete_backup(&st, F1, &[]);
        interrupted_backup(&st, F2);
        interrupted_backup(&st, F3);
        st.remove_incomplete(Some(F3)).unwrap();
        assert_eq!(st.labels().unwrap(), vec![F1, F3]);
        assert_eq!(st.incomplete().unwrap(), vec![F3]);
        st.remove_incomplete(None).unwrap();
        assert_eq!(st.labels().unwrap(), vec![F1]);
        // The complete backup is whole: its manifest and objects are still there.
        let b = st.backup(F1);
        assert_eq!(b.manifest().unwrap().files.len(), 3);
        assert_eq!(b.some_data_objects(10).unwrap().len(), 1);
    }

    #[test]
    fn a_failed_manifest_or_summary_write_names_the_object_and_leaves_the_backup_incomplete() {
        let (f, st) = faulty();
        let m = manifest(F1, &[]);

        // The summary is refused: the manifest is there, the backup is not complete.
        f.inject(
            Op::Put,
            "summary.json",
            1,
            1,
            Fault::Fail(StorageFault::Transient),
        );
        let e = st.backup(F1).write_manifest(&m).unwrap_err();
        crate::storage::fault::assert_transient(&e, None);
        assert!(
            e.to_string()
                .contains("s/backup/20260101-000000F/summary.json"),
            "{e}"
        );
        assert!(st
            .store()
            .exists("s/backup/20260101-000000F/manifest.jsonl.zst")
            .unwrap());
        assert!(!st.backup(F1).is_complete().unwrap());
        assert_eq!(st.incomplete().unwrap(), vec![F1]);
        assert!(st.complete().unwrap().is_empty());
        assert!(st.resolve_set("latest").is_err());

        // The sync before the summary fails: the summary is never even attempted.
        let puts = f.calls(Op::Put, "summary.json");
        f.inject(Op::Sync, "", 1, 1, Fault::Fail(StorageFault::Transient));
        assert!(st.backup(F1).write_manifest(&m).is_err());
        assert_eq!(f.calls(Op::Put, "summary.json"), puts);
        assert!(!st.backup(F1).is_complete().unwrap());

        // The manifest cannot be started: the error names it and nothing is written.
        f.inject(
            Op::Writer,
            "manifest.jsonl.zst",
            1,
            1,
            Fault::Fail(StorageFault::Denied),
        );
        let m2 = manifest(F2, &[]);
        let e = st.backup(F2).write_manifest(&m2).unwrap_err().to_string();
        assert!(
            e.contains("s/backup/20260108-000000F/manifest.jsonl.zst"),
            "{e}"
        );
        assert_eq!(st.labels().unwrap(), vec![F1]);

        // Healed, the same backup completes and reads back whole.
        f.heal();
        st.backup(F1).write_manifest(&m).unwrap();
        assert_eq!(st.complete().unwrap(), vec![F1]);
        assert_eq!(st.backup(F1).manifest().unwrap().files, m.files);
    }

    #[test]
    fn an_interrupted_backup_removal_never_leaves_a_complete_looking_backup() {
        let (f, st) = faulty();
        complete_backup(&st, F1, &[]);
        complete_backup(&st, F2, &[]);

        // The summary cannot be removed: nothing else is touched, the backup stays whole.
        f.inject(
            Op::Delete,
            "20260101-000000F/summary.json",
            1,
            1,
            Fault::Fail(StorageFault::Transient),
        );
        let e = st.backup(F1).remove().unwrap_err().to_string();
        assert!(e.contains("s/backup/20260101-000000F/summary.json"), "{e}");
        assert_eq!(st.complete().unwrap(), vec![F1, F2]);
        assert_eq!(st.backup(F1).manifest().unwrap().header.label, F1);

        // The summary goes, then the directory cannot be removed: an incomplete backup is
        // left, which the next remove_incomplete takes away.
        f.inject(
            Op::Delete,
            "s/backup/20260108-000000F",
            2,
            1,
            Fault::Fail(StorageFault::Transient),
        );
        let e = st.backup(F2).remove().unwrap_err().to_string();
        assert!(
            e.contains("delete memory stanza-test s/backup/20260108-000000F:"),
            "{e}"
        );
        assert!(!st.backup(F2).is_complete().unwrap());
        assert_eq!(st.complete().unwrap(), vec![F1]);
        assert_eq!(st.incomplete().unwrap(), vec![F2]);
        assert_eq!(st.backup(F2).some_data_objects(10).unwrap().len(), 1);
        st.remove_incomplete(None).unwrap();
        assert_eq!(st.labels().unwrap(), vec![F1]);
    }

    #[test]
    fn a_store_failure_is_an_error_never_a_missing_stanza_or_no_backup() {
        let (f, st) = faulty();
        st.create(&info("s")).unwrap();
        complete_backup(&st, F1, &[]);

        f.inject(
            Op::Get,
            "s/stanza.json",
            1,
            1,
            Fault::Fail(StorageFault::Transient),
        );
        let e = st.info().unwrap_err();
        crate::storage::fault::assert_transient(&e, None);
        assert!(e.to_string().contains("s/stanza.json"), "{e}");

        // A flipped byte: the stanza info is refused as not valid, by name.
        f.inject(Op::Get, "s/stanza.json", 1, 1, Fault::Corrupt(0));
        let e = st.info().unwrap_err().to_string();
        assert!(e.contains("s/stanza.json is not valid"), "{e}");

        // A failed check for the summary fails the listing instead of hiding the backup.
        f.inject(
            Op::Exists,
            "summary.json",
            1,
            1,
            Fault::Fail(StorageFault::Transient),
        );
        let e = st.complete().unwrap_err().to_string();
        assert!(e.contains("s/backup/20260101-000000F/summary.json"), "{e}");
        f.inject(
            Op::List,
            "s/backup",
            1,
            1,
            Fault::Fail(StorageFault::Transient),
        );
        assert!(st.incomplete().is_err());
        assert_eq!(st.complete().unwrap(), vec![F1]);
        assert_eq!(st.info().unwrap(), info("s"));
    }

    #[test]
    fn new_unique_label_skips_a_label_any_repository_holds() {
        let (own_faults, st) = faulty();
        let (other_faults, other) = faulty();
        let unreadable = {
            let (f, s) = faulty();
            f.inject(Op::List, "", 1, u32::MAX, Fault::Fail(StorageFault::Denied));
            s
        };
        complete_backup(&st, F1, &[]);
        interrupted_backup(&other, F2);
        // The labels `make` proposes, in turn: F1 is taken here, F2 in the other
        // repository (even incomplete), F3 is free. A repository that cannot be listed
        // is skipped.
        let proposals = [F1, F2, F3];
        let asked = std::sync::atomic::AtomicUsize::new(0);
        let make = |_: chrono::DateTime<chrono::Utc>| {
            let i = asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            proposals[i.min(2)].to_string()
        };
        let (_, label) =
            new_unique_label(&st, &[other.clone(), unreadable.clone()], &make).unwrap();
        assert_eq!(label, F3);
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert!(other_faults.calls(Op::List, "s/backup") >= 3);

        // The backup's own repository cannot be listed: an error, no label.
        own_faults.inject(
            Op::List,
            "s/backup",
            1,
            1,
            Fault::Fail(StorageFault::Transient),
        );
        let e = new_unique_label(&st, &[], &|_| F3.to_string())
            .unwrap_err()
            .to_string();
        assert!(e.contains("s/backup"), "{e}");
    }

    #[test]
    fn stanza_names_lists_created_stanzas_and_the_hint_names_them() {
        let store = memory();
        let hint = missing_stanza_hint("main", &store);
        assert!(hint.contains("holds no stanza yet"), "{hint}");
        for name in ["b", "a"] {
            Stanza::new(1, store.clone(), name)
                .create(&info(name))
                .unwrap();
        }
        // A directory with backups but no stanza.json is not a stanza.
        let c = Stanza::new(1, store.clone(), "c");
        complete_backup(&c, F1, &[]);
        assert_eq!(stanza_names(&store).unwrap(), vec!["a", "b"]);
        let hint = missing_stanza_hint("main", &store);
        assert!(
            hint.contains("stanza(s) a, b") && hint.contains("--stanza main stanza-create"),
            "{hint}"
        );
        // check_writable leaves no probe behind.
        let a = Stanza::new(1, store.clone(), "a");
        a.check_writable().unwrap();
        assert_eq!(
            crate::storage::list_sorted(&*store, "a").unwrap(),
            vec!["stanza.json"]
        );
    }

    /// A store that fails while the stanzas are looked up: an error (not "no stanza here"),
    /// and the hint says the listing failed instead of sending the user to stanza-create.
    #[test]
    fn a_store_failure_while_listing_stanzas_is_not_an_empty_repository() {
        let faulty = Arc::new(FaultyStorage::new(memory()));
        let store: Arc<dyn Storage> = faulty.clone();
        Stanza::new(1, store.clone(), "a")
            .create(&info("a"))
            .unwrap();
        faulty.inject(Op::Exists, "a/", 1, 1, Fault::Fail(StorageFault::Transient));
        crate::storage::fault::assert_transient(&stanza_names(&store).unwrap_err(), None);
        faulty.inject(Op::List, "", 1, 1, Fault::Fail(StorageFault::Transient));
        let hint = missing_stanza_hint("main", &store);
        assert!(
            hint.contains("could not be listed") && !hint.contains("stanza-create"),
            "{hint}"
        );
        assert_eq!(stanza_names(&store).unwrap(), vec!["a"]);
    }
}
