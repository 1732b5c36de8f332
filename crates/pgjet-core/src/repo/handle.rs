//! The handles of the repository format: a [`Stanza`] (one stanza of one configured
//! repository) and a [`Backup`] of it, with the names of their objects. What they read and
//! write is in [`super::stanza`] and the modules it calls; this file holds only what every
//! one of them needs (so the format's modules import it, and nothing runs in a circle).
use crate::error::Result;
use crate::storage::Storage;
use std::sync::Arc;

/// One stanza of one configured repository. Cheap to clone (the store is shared).
#[derive(Clone)]
pub struct Stanza {
    repo: u8,
    store: Arc<dyn Storage>,
    name: String,
}

impl std::fmt::Debug for Stanza {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "repo{} stanza '{}'", self.repo, self.name)
    }
}

impl Stanza {
    /// The stanza `name` of repository number `repo` (`repoN`), kept in `store`. Nothing is
    /// read: [`Stanza::info`] checks that the stanza exists.
    pub fn new(repo: u8, store: Arc<dyn Storage>, name: &str) -> Stanza {
        Stanza {
            repo,
            store,
            name: name.to_string(),
        }
    }

    /// The repository's number (`repoN`).
    pub fn repo(&self) -> u8 {
        self.repo
    }

    /// The stanza's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The repository's store.
    pub fn store(&self) -> &dyn Storage {
        &*self.store
    }

    /// The repository's store, shared (a manifest writer keeps it).
    pub(super) fn store_arc(&self) -> Arc<dyn Storage> {
        self.store.clone()
    }

    /// The object naming the stanza's cluster.
    pub(super) fn info_name(&self) -> String {
        format!("{}/stanza.json", self.name)
    }

    /// The directory that holds every backup of the stanza.
    pub(super) fn backups_dir(&self) -> String {
        format!("{}/backup", self.name)
    }

    /// Backup `label` of this stanza (nothing is read).
    pub fn backup(&self, label: &str) -> Backup<'_> {
        Backup {
            stanza: self,
            label: label.to_string(),
        }
    }
}

/// One backup of a [`Stanza`]: its summary, manifest and stored objects.
pub struct Backup<'s> {
    stanza: &'s Stanza,
    label: String,
}

impl<'s> Backup<'s> {
    /// The backup's label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The stanza the backup belongs to.
    pub fn stanza(&self) -> &'s Stanza {
        self.stanza
    }

    /// The repository's store.
    pub fn store(&self) -> &'s dyn Storage {
        self.stanza.store()
    }

    /// The backup's directory.
    pub(super) fn dir(&self) -> String {
        format!("{}/{}", self.stanza.backups_dir(), self.label)
    }

    /// Name of the object `name` of the backup's directory (`summary.json`, the manifest).
    pub(super) fn file_name(&self, name: &str) -> String {
        format!("{}/{name}", self.dir())
    }

    /// Name of a stored data object of the backup (`data/<object>`).
    pub(super) fn object_name(&self, object: &str) -> String {
        format!("{}/data/{object}", self.dir())
    }

    /// Full names of up to `n` stored data objects of the backup, as the store lists them
    /// (for a timed read of the repository: replica-create's `--seed auto`).
    ///
    /// Errors: the store's listing.
    pub fn some_data_objects(&self, n: usize) -> Result<Vec<String>> {
        let dir = format!("{}/data", self.dir());
        let mut out = Vec::new();
        for name in self.store().list(&dir)?.take(n) {
            out.push(format!("{dir}/{}", name?));
        }
        Ok(out)
    }

    /// Writes the stored data object `object` of the backup (`data/<object>`, one unit of
    /// frames). Not durable until the store's sync. A backup stores its units through
    /// [`super::sink::RepoSink`]; this is for tools and tests that lay out a backup by hand.
    ///
    /// Errors: the store's.
    pub fn put_object(&self, object: &str, data: &[u8]) -> Result<()> {
        self.store().put(&self.object_name(object), data)
    }
}
