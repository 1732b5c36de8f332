//! Resuming an interrupted backup: the *resume journal* a backup writes as it runs, and what
//! the next backup makes of it.
//!
//! A backup's manifest is one stream, complete only at the end; killed halfway, it leaves
//! objects nobody can name. So every backup also saves, every `manifest-save-threshold`
//! bytes of files stored (pgBackRest's option of that name does the same for its manifest
//! copy), the file lines stored since the last save, once their objects are durable:
//!
//! ```text
//! <label>/resume/<attempt>.json                 AttemptHeader (written when the copy starts)
//! <label>/resume/<attempt>-<save>.jsonl.zst    file lines ([`FileEntry`]), zstd
//! ```
//!
//! The next backup of the same type, reference, compression and timeline resumes the newest
//! interrupted backup ([`find`]): it reads every attempt's lines (a later attempt's line for
//! a path replaces an earlier one), checks the stored frames those lines name against their
//! XXH3-128 and drops any file whose frames fail, removes every object no kept line names,
//! and then copies the cluster again into the same label with the kept files as its
//! reference ([`super::incremental::Reference::resumed`]): a block whose page LSN is older
//! than the oldest attempt's start LSN did not change since that attempt copied it, and is
//! kept; any other block, and any other file whose range hash differs, is copied again. So
//! a resumed backup holds exactly what an uninterrupted one would; its file lines name the
//! kept frames as its own. The journal is removed once the backup is complete.
//!
//! Why the page LSN rule holds for a kept copy: each attempt copied its files after its own
//! backup start (the redo point of its checkpoint), so the argument of
//! [`super::incremental`] applies with that start LSN, and with any older one.
use super::handle::Backup;
use super::manifest::{FileEntry, ManifestHeader};
use crate::error::{Error, Result};
use crate::pg::lsn::Lsn;
use crate::storage::Storage;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Directory of the journal inside a backup's directory.
pub const RESUME_DIR: &str = "resume";
/// Version of the journal's objects.
const JOURNAL_FORMAT: u32 = 1;
/// A save is also made when this long passed since the last one and a file line waits.
const SAVE_INTERVAL: Duration = Duration::from_secs(60);

/// What an attempt of a backup recorded when its copy started.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttemptHeader {
    /// [`JOURNAL_FORMAT`].
    pub format: u32,
    /// 1 for the first attempt, then one more per resume.
    pub attempt: u32,
    /// The cluster's timeline when the attempt started (pg_control_checkpoint()).
    pub timeline: u32,
    /// The server's clock when the attempt started, before it listed the files (Unix
    /// seconds); 0 when unknown.
    #[serde(default)]
    pub started: i64,
    /// The backup's manifest header, start LSN included.
    pub header: ManifestHeader,
}

/// One line of a save: a file stored whole (as in the manifest), or the stored prefix of a
/// file still in progress (its first `covered` bytes; `partial` has the file's size and
/// modification time as listed and the pieces of the prefix).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum JournalLine {
    Partial { partial: FileEntry, covered: u64 },
    File(FileEntry),
}

/// How the journal of a backup being written is started ([`Journal::start`]).
#[derive(Debug, Clone)]
pub struct JournalStart {
    /// This attempt's number.
    pub attempt: u32,
    /// The cluster's timeline now.
    pub timeline: u32,
    /// The server's clock now, Unix seconds ([`AttemptHeader::started`]).
    pub started: i64,
    /// Logical bytes of files stored between saves.
    pub threshold: u64,
    /// Objects numbered below this one were stored by an earlier attempt.
    pub first_new_object: usize,
}

/// The journal of a backup being written: file lines saved in batches, each batch once the
/// objects its lines name are durable. Saves run on a thread of their own (a sync of the
/// repository may take a while); the next one waits for it.
pub struct Journal {
    store: Arc<dyn Storage>,
    dir: String,
    start: JournalStart,
    saves: u32,
    pending: Vec<u8>,
    pending_bytes: u64,
    /// Files in progress: the latest stored prefix of each, by path.
    partials: HashMap<String, (FileEntry, u64)>,
    last_save: Instant,
    saving: Option<std::thread::JoinHandle<Result<()>>>,
    /// Logical bytes of the pieces whose frames an earlier attempt stored.
    reused: u64,
}

impl Journal {
    /// Writes the attempt's header (durable) and starts the journal of `backup`.
    ///
    /// Errors: the store's.
    pub fn start(backup: &Backup, header: &ManifestHeader, start: JournalStart) -> Result<Journal> {
        let store = backup.stanza().store_arc();
        let dir = backup.file_name(RESUME_DIR);
        let h = AttemptHeader {
            format: JOURNAL_FORMAT,
            attempt: start.attempt,
            timeline: start.timeline,
            started: start.started,
            header: header.clone(),
        };
        let json = serde_json::to_vec(&h).map_err(|e| {
            Error::Other("cannot encode the resume journal's header".into()).because(e)
        })?;
        store.put_durable(&format!("{dir}/{:04}.json", start.attempt), &json)?;
        Ok(Journal {
            store,
            dir,
            start,
            saves: 0,
            pending: Vec::new(),
            pending_bytes: 0,
            partials: HashMap::new(),
            last_save: Instant::now(),
            saving: None,
            reused: 0,
        })
    }

    /// Adds the line of a file whose frames are all stored; saves when enough waits.
    ///
    /// Errors: the previous save's.
    pub fn add(&mut self, f: &FileEntry) -> Result<()> {
        let before = self.partials.remove(&f.path).map_or(0, |p| p.1);
        serde_json::to_writer(&mut self.pending, f)
            .map_err(|e| Error::Other("cannot encode a resume journal line".into()).because(e))?;
        self.pending.push(b'\n');
        self.pending_bytes += f.size.saturating_sub(before);
        let first_new = self.start.first_new_object;
        self.reused += f
            .pieces
            .iter()
            .filter(|p| {
                p.backup.is_none() && p.object.parse::<usize>().is_ok_and(|n| n < first_new)
            })
            .map(|p| p.logical_size)
            .sum::<u64>();
        self.maybe_save()
    }

    /// Notes the stored prefix (the first `covered` bytes) of a file still in progress;
    /// saves when enough waits.
    ///
    /// Errors: the previous save's.
    pub fn partial(&mut self, f: FileEntry, covered: u64) -> Result<()> {
        let before = self.partials.get(&f.path).map_or(0, |p| p.1);
        self.pending_bytes += covered.saturating_sub(before);
        self.partials.insert(f.path.clone(), (f, covered));
        self.maybe_save()
    }

    fn maybe_save(&mut self) -> Result<()> {
        if self.pending_bytes >= self.start.threshold
            || (self.pending_bytes > 0 && self.last_save.elapsed() > SAVE_INTERVAL)
        {
            self.save()?;
        }
        Ok(())
    }

    /// Raises the save threshold to 1% of `total`, the logical bytes the backup copies
    /// (pgBackRest's rule for `manifest-save-threshold`): a large backup saves about a
    /// hundred times, whatever its size.
    pub fn scale_to(&mut self, total: u64) {
        self.start.threshold = self.start.threshold.max(total / 100);
    }

    /// Logical bytes of the files added so far whose frames an earlier attempt stored.
    pub fn reused(&self) -> u64 {
        self.reused
    }

    /// Waits for the save in flight, if any.
    fn wait(&mut self) -> Result<()> {
        match self.saving.take() {
            None => Ok(()),
            Some(h) => h
                .join()
                .unwrap_or_else(|_| Err(Error::Other("a resume journal save panicked".into()))),
        }
    }

    /// Saves the lines added since the last save: the repository synced (their objects
    /// durable), then one object of them, durable.
    fn save(&mut self) -> Result<()> {
        self.wait()?;
        self.saves += 1;
        let name = format!(
            "{}/{:04}-{:06}.jsonl.zst",
            self.dir, self.start.attempt, self.saves
        );
        let mut lines = std::mem::take(&mut self.pending);
        for (f, covered) in self.partials.values() {
            let line = JournalLine::Partial {
                partial: f.clone(),
                covered: *covered,
            };
            serde_json::to_writer(&mut lines, &line).map_err(|e| {
                Error::Other("cannot encode a resume journal line".into()).because(e)
            })?;
            lines.push(b'\n');
        }
        self.pending_bytes = 0;
        self.last_save = Instant::now();
        let store = self.store.clone();
        self.saving = Some(std::thread::spawn(move || {
            let z = zstd::bulk::compress(&lines, 3)
                .map_err(|e| Error::Other(format!("cannot compress {name}")).because(e))?;
            store.sync()?;
            store.put_durable(&name, &z)
        }));
        Ok(())
    }

    /// Waits for the last save; called before the backup's manifest is completed.
    ///
    /// Errors: that save's.
    pub fn close(&mut self) -> Result<()> {
        self.wait()
    }

    /// Removes the journal of a complete backup (a leftover is harmless: a complete
    /// backup is never resumed).
    pub fn remove(mut self) {
        let _ = self.wait();
        if let Err(e) = self.store.remove_all(&self.dir) {
            tracing::warn!("cannot remove the resume journal {}: {e}", self.dir);
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        let _ = self.wait();
    }
}

/// A file an interrupted backup stored, whole or in part.
#[derive(Debug, Clone)]
pub struct Kept {
    /// The file as listed (size, modification time) with the pieces of its stored part.
    pub entry: FileEntry,
    /// Bytes stored from its start: `entry.size` for a whole file.
    pub covered: u64,
    /// Not written since well before its attempt started: its modification time is at
    /// least two seconds older than the attempt's start by the server's clock. Such a file
    /// whose size and modification time are still the same was not written since the
    /// attempt copied it (a write sets the time to the clock, which is past the attempt's
    /// start), so its stored part need not be read again.
    pub trusted: bool,
}

/// What an interrupted backup's journal holds ([`Interrupted::load`]).
pub struct Interrupted {
    /// The interrupted backup's label.
    pub label: String,
    /// Every attempt's header, oldest first.
    pub attempts: Vec<AttemptHeader>,
    /// The files stored, by path (a later line replacing an earlier one, except a part of a
    /// file shorter than what an earlier line had).
    pub files: HashMap<String, Kept>,
    /// The highest data object number any journal line names, kept or not: a line that
    /// [`Interrupted::verify`] drops stays in the journal, so its number is never handed
    /// out again ([`Interrupted::clean`]), or the next load would find that line naming
    /// another file's frame.
    pub highest_named: usize,
}

/// Attempt number and save number of a journal object's name, or None for another name.
fn parse_name(name: &str) -> Option<(u32, Option<u32>)> {
    if let Some(a) = name.strip_suffix(".json") {
        return Some((a.parse().ok()?, None));
    }
    let (a, s) = name.strip_suffix(".jsonl.zst")?.split_once('-')?;
    Some((a.parse().ok()?, Some(s.parse().ok()?)))
}

impl Interrupted {
    /// Reads the journal of the interrupted backup `backup`; None when it has none (an
    /// older pgjet, or killed before its copy started).
    ///
    /// Errors: the store's; [`Error::Repo`] for a journal object that cannot be decoded.
    pub fn load(backup: &Backup) -> Result<Option<Interrupted>> {
        let store = backup.store();
        let dir = backup.file_name(RESUME_DIR);
        let mut names: Vec<((u32, Option<u32>), String)> = Vec::new();
        for n in crate::storage::list_sorted(store, &dir)? {
            if let Some(k) = parse_name(&n) {
                names.push((k, n));
            }
        }
        // Header first within an attempt (None sorts before Some).
        names.sort();
        let bad = |n: &str, e: String| Error::Repo(format!("resume journal {dir}/{n}")).because(e);
        let mut attempts: Vec<AttemptHeader> = Vec::new();
        let mut files = HashMap::new();
        let mut highest_named = 0;
        for ((attempt, save), n) in names {
            let bytes = store.get(&format!("{dir}/{n}"))?;
            match save {
                None => {
                    let h: AttemptHeader =
                        serde_json::from_slice(&bytes).map_err(|e| bad(&n, e.to_string()))?;
                    if h.format != JOURNAL_FORMAT || h.attempt != attempt {
                        return Err(bad(
                            &n,
                            format!("format {} attempt {}", h.format, h.attempt),
                        ));
                    }
                    attempts.push(h);
                }
                Some(_) => {
                    if attempts.last().map(|h| h.attempt) != Some(attempt) {
                        return Err(bad(&n, "no header for its attempt".into()));
                    }
                    let started = attempts.last().map_or(0, |h| h.started);
                    let text =
                        zstd::stream::decode_all(&bytes[..]).map_err(|e| bad(&n, e.to_string()))?;
                    for line in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                        let line: JournalLine =
                            serde_json::from_slice(line).map_err(|e| bad(&n, e.to_string()))?;
                        let (entry, covered) = match line {
                            JournalLine::File(f) => {
                                let size = f.size;
                                (f, size)
                            }
                            JournalLine::Partial { partial, covered } => (partial, covered),
                        };
                        highest_named = entry
                            .pieces
                            .iter()
                            .filter(|p| p.backup.is_none())
                            .filter_map(|p| p.object.parse::<usize>().ok())
                            .fold(highest_named, usize::max);
                        let trusted = started > 0 && entry.mtime < started - 1;
                        // A whole file replaces what an earlier line had of it; a part only
                        // a shorter part (a later attempt that has not got as far yet).
                        let whole = covered >= entry.size;
                        if !whole
                            && files
                                .get(&entry.path)
                                .is_some_and(|k: &Kept| k.covered > covered)
                        {
                            continue;
                        }
                        files.insert(
                            entry.path.clone(),
                            Kept {
                                entry,
                                covered,
                                trusted,
                            },
                        );
                    }
                }
            }
        }
        if attempts.is_empty() {
            return Ok(None);
        }
        Ok(Some(Interrupted {
            label: backup.label().to_string(),
            attempts,
            files,
            highest_named,
        }))
    }

    /// The oldest start LSN of the attempts: a page older than it is unchanged since every
    /// attempt's copy of it.
    pub fn start_lsn(&self) -> Lsn {
        self.attempts
            .iter()
            .map(|a| a.header.start_lsn)
            .min()
            .unwrap_or(Lsn(0))
    }

    /// Why a backup planned as `planned` (its header before the copy: type, reference,
    /// compression, cluster) on `timeline` cannot resume this one, or Ok.
    pub fn resumable(
        &self,
        planned: &ManifestHeader,
        timeline: u32,
    ) -> std::result::Result<(), String> {
        if self.files.is_empty() {
            return Err("no file of it was saved to its resume journal".into());
        }
        for a in &self.attempts {
            let h = &a.header;
            let why = if h.label != self.label || h.stanza != planned.stanza {
                format!("its journal names backup {}/{}", h.stanza, h.label)
            } else if h.backup_type != planned.backup_type {
                format!(
                    "it is of type {}, this backup of type {}",
                    h.backup_type, planned.backup_type
                )
            } else if h.reference != planned.reference {
                format!(
                    "its reference is {}, this one's {}",
                    h.reference.as_deref().unwrap_or("none"),
                    planned.reference.as_deref().unwrap_or("none")
                )
            } else if h.compression != planned.compression {
                format!(
                    "it is compressed with {} level {}, this one with {} level {}",
                    h.compression.kind,
                    h.compression.level,
                    planned.compression.kind,
                    planned.compression.level
                )
            } else if h.system_identifier != planned.system_identifier
                || h.pg_version != planned.pg_version
                || h.block_size != planned.block_size
            {
                "it is of another cluster or major version".to_string()
            } else if h.data_checksums != planned.data_checksums {
                "data checksums were turned on or off since".to_string()
            } else if h.databases.is_empty() {
                "it did not record the cluster's databases".to_string()
            } else if a.timeline != timeline {
                format!(
                    "it is of timeline {}, the cluster is on timeline {timeline} now",
                    a.timeline
                )
            } else {
                continue;
            };
            return Err(why);
        }
        Ok(())
    }

    /// The databases whose blocks may be kept: same (OID, xmin) now as in every attempt.
    pub fn same_databases(&self, now: &[(u32, u32)]) -> Vec<(u32, u32)> {
        now.iter()
            .filter(|d| self.attempts.iter().all(|a| a.header.databases.contains(d)))
            .copied()
            .collect()
    }

    /// Reads every object of this backup the kept lines name and checks each frame they
    /// name against its XXH3-128, on `jobs` threads; drops the lines of files with a frame
    /// missing or wrong (with a warning). Returns the bytes read.
    ///
    /// Errors: the store's, other than a missing object.
    pub fn verify(&mut self, backup: &Backup, jobs: usize) -> Result<u64> {
        let mut frames: HashMap<&str, HashSet<(u64, u64, &str)>> = HashMap::new();
        for f in self.files.values() {
            for p in f.entry.pieces.iter().filter(|p| p.backup.is_none()) {
                frames.entry(&p.object).or_default().insert((
                    p.offset,
                    p.stored_size,
                    &p.stored_xxh3,
                ));
            }
        }
        // (object, its frames as (offset, stored size, XXH3-128)).
        type Frames<'f> = Vec<(&'f str, Vec<(u64, u64, &'f str)>)>;
        let objects: Frames = frames
            .into_iter()
            .map(|(o, f)| (o, f.into_iter().collect()))
            .collect();
        let bad = std::sync::Mutex::new(HashSet::<String>::new());
        let read = std::sync::atomic::AtomicU64::new(0);
        crate::io::parallel::for_each_with(
            objects.len(),
            jobs,
            || Ok(()),
            |_, i| {
                let (object, frames) = &objects[i];
                let why = match backup.store().get(&backup.object_name(object)) {
                    Err(e) if e.is_not_found() => Some("missing".to_string()),
                    Err(e) => return Err(e),
                    Ok(bytes) => {
                        read.fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
                        frames.iter().find_map(|(offset, size, xxh3)| {
                            let frame = usize::try_from(*offset)
                                .ok()
                                .zip(usize::try_from(offset + size).ok())
                                .and_then(|(a, b)| bytes.get(a..b));
                            match frame {
                                None => Some(format!("too short for the frame at {offset}")),
                                Some(fr) if crate::codec::xxh3_hex(fr) != *xxh3 => {
                                    Some(format!("the frame at {offset} does not match its XXH3"))
                                }
                                Some(_) => None,
                            }
                        })
                    }
                };
                if let Some(why) = why {
                    tracing::warn!(
                        "interrupted backup {}: object {object} {why}; the files it holds are copied again",
                        self.label
                    );
                    bad.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(object.to_string());
                }
                Ok(())
            },
        )?;
        let bad = bad.into_inner().unwrap_or_else(|p| p.into_inner());
        if !bad.is_empty() {
            self.files.retain(|_, f| {
                !f.entry
                    .pieces
                    .iter()
                    .any(|p| p.backup.is_none() && bad.contains(&p.object))
            });
        }
        Ok(read.into_inner())
    }

    /// Removes every data object of the backup that no kept line names (those of files
    /// stored after the last save, and any left half-written). Returns the number after
    /// the highest object number seen in the store or named by the journal: the next
    /// attempt's first object.
    ///
    /// Errors: the store's.
    pub fn clean(&self, backup: &Backup) -> Result<usize> {
        let kept: HashSet<&str> = self
            .files
            .values()
            .flat_map(|f| f.entry.pieces.iter())
            .filter(|p| p.backup.is_none())
            .map(|p| p.object.as_str())
            .collect();
        let dir = backup.file_name("data");
        let mut next = self.highest_named + 1;
        let mut removed = 0u64;
        for name in crate::storage::list_sorted(backup.store(), &dir)? {
            if let Ok(n) = name.parse::<usize>() {
                next = next.max(n + 1);
            }
            if !kept.contains(name.as_str()) {
                backup.store().delete(&format!("{dir}/{name}"))?;
                removed += 1;
            }
        }
        tracing::debug!(
            "interrupted backup {}: {removed} unsaved objects removed",
            self.label
        );
        Ok(next)
    }

    /// Logical bytes of the kept files' stored parts.
    pub fn bytes(&self) -> u64 {
        self.files.values().map(|f| f.covered).sum()
    }

    /// The next attempt's number.
    pub fn next_attempt(&self) -> u32 {
        self.attempts.last().map_or(1, |a| a.attempt + 1)
    }
}

/// The newest interrupted backup of `stanza` when a backup planned as `planned` on
/// `timeline` can resume it: loaded, its frames checked ([`Interrupted::verify`]) on `jobs`
/// threads and its unsaved objects removed ([`Interrupted::clean`]); with the first object
/// number of the new attempt. None (with the reason logged) when there is none or it cannot
/// be resumed: the caller removes it then.
///
/// Errors: the store's.
pub fn find(
    stanza: &super::Stanza,
    planned: &ManifestHeader,
    timeline: u32,
    jobs: usize,
) -> Result<Option<(Interrupted, usize)>> {
    let Some(label) = stanza.incomplete()?.pop() else {
        return Ok(None);
    };
    let backup = stanza.backup(&label);
    let mut it = match Interrupted::load(&backup) {
        Ok(Some(it)) => it,
        Ok(None) => {
            tracing::info!("interrupted backup {label} has no resume journal: it is not resumed");
            return Ok(None);
        }
        Err(e) => {
            tracing::warn!("interrupted backup {label} is not resumed: {e}");
            return Ok(None);
        }
    };
    if let Err(why) = it.resumable(planned, timeline) {
        tracing::warn!("interrupted backup {label} is not resumed: {why}");
        return Ok(None);
    }
    let clock = Instant::now();
    let read = it.verify(&backup, jobs)?;
    let next = it.clean(&backup)?;
    tracing::info!(
        "resuming interrupted backup {label} (attempt {}): {} files, {} MiB, kept from earlier attempts where the cluster did not change since (checked {} MiB of stored frames in {:.1} s)",
        it.next_attempt(),
        it.files.len(),
        it.bytes() >> 20,
        read >> 20,
        clock.elapsed().as_secs_f64()
    );
    Ok(Some((it, next)))
}

#[cfg(test)]
mod tests {
    use super::parse_name;

    #[test]
    fn journal_names() {
        assert_eq!(parse_name("0001.json"), Some((1, None)));
        assert_eq!(parse_name("0002-000013.jsonl.zst"), Some((2, Some(13))));
        assert_eq!(parse_name("0002-000013.jsonl.zst.tmp"), None);
        assert_eq!(parse_name("x.json"), None);
    }
}

#[cfg(test)]
mod line_tests {
    use super::*;

    /// A part and a whole file, as a save writes them, read back as such.
    #[test]
    fn journal_lines_round_trip() {
        let f: FileEntry = serde_json::from_value(serde_json::json!({
            "path": "base/5/16384", "size": 16384, "mtime": 1, "mode": 384, "pieces": []
        }))
        .unwrap();
        let part = serde_json::to_string(&JournalLine::Partial {
            partial: f.clone(),
            covered: 8192,
        })
        .unwrap();
        let whole = serde_json::to_string(&f).unwrap();
        match serde_json::from_str::<JournalLine>(&part).unwrap() {
            JournalLine::Partial { covered, .. } => assert_eq!(covered, 8192),
            l => panic!("{part} read as {l:?}"),
        }
        match serde_json::from_str::<JournalLine>(&whole).unwrap() {
            JournalLine::File(g) => assert_eq!(g, f),
            l => panic!("{whole} read as {l:?}"),
        }
    }
}

#[cfg(test)]
mod fault_tests {
    use super::*;
    use crate::codec::CompressType;
    use crate::error::StorageFault;
    use crate::pg::checksum::BLCKSZ;
    use crate::repo::handle::Stanza;
    use crate::repo::sink::tests::{file_bytes, memory, store_unit, TestFile, LABEL, MTIME};
    use crate::repo::sink::{object_id, RepoSink};
    use crate::storage::fault::{Fault, FaultyStorage, Op};

    /// The header of the test backup (stanza `s`, zstd level 1, one database).
    fn header() -> ManifestHeader {
        let mut h = crate::repo::manifest::tests::sample().header;
        h.label = LABEL.into();
        h.stanza = "s".into();
        h.databases = vec![(5, 1)];
        h
    }

    /// Four files of 2, 3, 1 and 2 pages, one unit (object) each.
    fn four_files() -> Vec<TestFile> {
        vec![
            ("base/5/100", file_bytes(1, 2, 0, &[])),
            ("base/5/101", file_bytes(2, 3, 0, &[1])),
            ("base/5/102", file_bytes(3, 1, 0, &[])),
            ("base/5/103", file_bytes(4, 2, 0, &[])),
        ]
    }

    /// Names of the backup's stored data objects.
    fn data_objects(stanza: &Stanza) -> Vec<String> {
        crate::storage::list_sorted(stanza.store(), &format!("s/backup/{LABEL}/data")).unwrap()
    }

    /// A first attempt of the backup as the copy runs it: each file stored as one unit
    /// through a sink with a resume journal (saved every `threshold` bytes of files), its
    /// line added once stored; the upload of the fourth object fails (transient) and the
    /// attempt ends there, its manifest never finished. Returns that failure.
    fn failed_attempt(
        faulty: &FaultyStorage,
        stanza: &Stanza,
        files: &[TestFile],
        threshold: u64,
    ) -> Error {
        let backup = stanza.backup(LABEL);
        let mut sink = RepoSink::new(&backup, header().compression);
        sink.journal = Some(JournalStart {
            attempt: 1,
            timeline: 1,
            started: MTIME + 100,
            threshold,
            first_new_object: 1,
        });
        let mut manifest = sink.begin_manifest(header()).unwrap();
        faulty.inject(
            Op::Put,
            "/data/",
            4,
            1,
            Fault::Fail(StorageFault::Transient),
        );
        let mut st = crate::transfer::UnitSink::new_state(&sink).unwrap();
        for (i, f) in files.iter().enumerate() {
            let unit = vec![(i, 0, f.1.len() as u64)];
            match store_unit(&sink, &mut st, files, &unit) {
                Ok(stored) => {
                    let pieces = stored.into_iter().map(|s| s.1).collect();
                    manifest
                        .file(&crate::repo::sink::tests::entry(f, pieces))
                        .unwrap();
                    assert_eq!(manifest.reused(), 0, "a first attempt reuses nothing");
                }
                Err(e) => {
                    faulty.heal();
                    return e;
                }
            }
        }
        panic!("the fourth upload did not fail");
    }

    fn kept_paths(it: &Interrupted) -> Vec<&str> {
        let mut v: Vec<&str> = it.files.keys().map(String::as_str).collect();
        v.sort();
        v
    }

    /// A backup interrupted by a failed upload: its journal keeps the files whose lines
    /// were saved (their objects stored before the fault), not the one stored after the
    /// last save nor the one whose upload failed; the next backup of the same kind resumes
    /// it ([`find`]): the unsaved object is removed, the next attempt numbers its objects
    /// after the highest, and the kept lines read back byte for byte. A backup of another
    /// timeline or compression may not resume it.
    #[test]
    fn an_upload_failure_leaves_a_journal_of_what_was_stored_before_it() {
        let faulty = Arc::new(FaultyStorage::new(memory()));
        let stanza = Stanza::new(1, faulty.clone(), "s");
        let files = four_files();
        let page = BLCKSZ as u64;
        // Saved once the first two files are stored (5 pages); the third waits.
        let e = failed_attempt(&faulty, &stanza, &files, 5 * page);
        crate::storage::fault::assert_transient(&e, None);
        assert_eq!(
            data_objects(&stanza),
            vec![object_id(1), object_id(2), object_id(3)]
        );
        let backup = stanza.backup(LABEL);
        assert!(!backup.is_complete().unwrap());

        let it = Interrupted::load(&backup).unwrap().expect("a journal");
        assert_eq!(it.label, LABEL);
        assert_eq!(it.attempts.len(), 1);
        assert_eq!(it.next_attempt(), 2);
        assert_eq!(it.start_lsn(), header().start_lsn);
        assert_eq!(kept_paths(&it), vec!["base/5/100", "base/5/101"]);
        assert_eq!(it.bytes(), 5 * page);
        assert!(it
            .files
            .values()
            .all(|k| k.trusted && k.covered == k.entry.size));

        assert_eq!(it.resumable(&header(), 1), Ok(()));
        let why = it.resumable(&header(), 2).unwrap_err();
        assert!(why.contains("timeline"), "{why}");
        let mut other = header();
        other.compression = crate::codec::Compression::new(CompressType::Lz4, None).unwrap();
        let why = it.resumable(&other, 1).unwrap_err();
        assert!(why.contains("compressed"), "{why}");

        let (it, next) = find(&stanza, &header(), 1, 2).unwrap().expect("resumed");
        assert_eq!(kept_paths(&it), vec!["base/5/100", "base/5/101"]);
        assert_eq!(next, 4, "after the highest object seen");
        assert_eq!(data_objects(&stanza), vec![object_id(1), object_id(2)]);
        let dir = crate::repo::restore_target::MemoryTarget::default();
        for (path, data) in &files[..2] {
            let k = &it.files[*path];
            dir.make(path, k.entry.size);
            crate::repo::read_back::restore_one(&backup, CompressType::Zstd, &k.entry, &dir)
                .unwrap();
            assert_eq!(dir.file(path).unwrap().0, *data, "{path}");
        }
        assert!(
            find(&stanza, &header(), 2, 2).unwrap().is_none(),
            "another timeline"
        );
    }

    /// Of the files a journal saved, one whose object reads back damaged and one whose
    /// object is gone are dropped by verify (to be copied again) and their objects removed;
    /// the second attempt's journal counts the kept frames as reused, adds its own lines
    /// after the first attempt's, and is removed when the backup completes.
    #[test]
    fn kept_files_with_damaged_or_missing_frames_are_copied_again() {
        let faulty = Arc::new(FaultyStorage::new(memory()));
        let stanza = Stanza::new(1, faulty.clone(), "s");
        let files = four_files();
        // Saved after every file: the first three are in the journal.
        let e = failed_attempt(&faulty, &stanza, &files, 1);
        crate::storage::fault::assert_transient(&e, None);
        let backup = stanza.backup(LABEL);
        let mut it = Interrupted::load(&backup).unwrap().expect("a journal");
        assert_eq!(
            kept_paths(&it),
            vec!["base/5/100", "base/5/101", "base/5/102"]
        );

        let sizes: Vec<u64> = (1..=3)
            .map(|n| {
                stanza
                    .store()
                    .size(&backup.object_name(&object_id(n)))
                    .unwrap()
                    .unwrap()
            })
            .collect();
        faulty.inject(
            Op::Get,
            &format!("/data/{}", object_id(2)),
            1,
            u32::MAX,
            Fault::Corrupt(7),
        );
        stanza
            .store()
            .delete(&backup.object_name(&object_id(3)))
            .unwrap();
        let read = it.verify(&backup, 2).unwrap();
        assert_eq!(
            read,
            sizes[0] + sizes[1],
            "the objects there are read whole"
        );
        assert_eq!(kept_paths(&it), vec!["base/5/100"]);
        faulty.heal();
        // Object 3 is gone, but the journal still names it (102's dropped line): the next
        // attempt's objects start after it, never reusing a number a line names.
        assert_eq!(it.highest_named, 3);
        assert_eq!(it.clean(&backup).unwrap(), 4);
        assert_eq!(data_objects(&stanza), vec![object_id(1)]);

        // The second attempt: the kept file's line names its old frame; the others are
        // stored again, after it.
        let mut sink = RepoSink::new(&backup, header().compression);
        sink.next_object
            .store(4, std::sync::atomic::Ordering::Relaxed);
        sink.journal = Some(JournalStart {
            attempt: it.next_attempt(),
            timeline: 1,
            started: MTIME + 200,
            threshold: 1,
            first_new_object: 4,
        });
        let mut manifest = sink.begin_manifest(header()).unwrap();
        manifest.file(&it.files["base/5/100"].entry).unwrap();
        assert_eq!(manifest.reused(), files[0].1.len() as u64);
        let mut st = crate::transfer::UnitSink::new_state(&sink).unwrap();
        let stored = store_unit(
            &sink,
            &mut st,
            &files,
            &vec![(1, 0, files[1].1.len() as u64)],
        )
        .unwrap();
        let entry =
            crate::repo::sink::tests::entry(&files[1], stored.into_iter().map(|s| s.1).collect());
        assert_eq!(entry.pieces[0].object, object_id(4));
        manifest.file(&entry).unwrap();
        assert_eq!(manifest.reused(), files[0].1.len() as u64);
        drop(manifest); // interrupted again

        let mut again = Interrupted::load(&backup).unwrap().expect("a journal");
        assert_eq!(
            again.attempts.iter().map(|a| a.attempt).collect::<Vec<_>>(),
            vec![1, 2]
        );
        // The first attempt's lines of 101 and 102 are back (a journal keeps every line;
        // verify drops the damaged ones), 101 replaced by the second attempt's.
        assert_eq!(
            kept_paths(&again),
            vec!["base/5/100", "base/5/101", "base/5/102"]
        );
        assert_eq!(
            again.files["base/5/101"].entry.pieces[0].object,
            object_id(4)
        );
        // Not written since well before either attempt started: its stored part is trusted.
        assert!(again.files["base/5/101"].trusted);
        // 102's old line names the removed object 3: dropped again, and only it (had 3 been
        // handed out again, 101's good frame there would have been dropped with it).
        again.verify(&backup, 2).unwrap();
        assert_eq!(kept_paths(&again), vec!["base/5/100", "base/5/101"]);
        assert_eq!(again.clean(&backup).unwrap(), 5);

        // A third attempt completes the backup: its journal is removed with it.
        sink.journal = Some(JournalStart {
            attempt: again.next_attempt(),
            timeline: 1,
            started: MTIME + 300,
            threshold: 1,
            first_new_object: 5,
        });
        let mut manifest = sink.begin_manifest(header()).unwrap();
        manifest.file(&again.files["base/5/100"].entry).unwrap();
        manifest.file(&again.files["base/5/101"].entry).unwrap();
        let sample = crate::repo::manifest::tests::sample();
        manifest.finish(sample.stop, 0).unwrap();
        assert!(backup.is_complete().unwrap());
        assert!(Interrupted::load(&backup).unwrap().is_none());
    }
}
