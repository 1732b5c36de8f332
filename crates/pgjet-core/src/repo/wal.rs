//! The WAL archive: where archived WAL files live in a stanza and how each one is stored.
//! Documented in docs/repository-format.md ("The WAL archive").
//!
//! ```text
//! <stanza>/archive/<TLI>/<TLI>.history            timeline history file
//! <stanza>/archive/<TLI>/<LOG>/<segment>          WAL segment (24 hex digits)
//! <stanza>/archive/<TLI>/<LOG>/<segment>.partial  partial segment (end of a timeline)
//! <stanza>/archive/<TLI>/<LOG>/<segment>.<off>.backup  backup history file
//! ```
//!
//! `<TLI>` and `<LOG>` are the first and second 8 hex digits of the segment name (timeline,
//! and the high 32 bits of the segment's LSN), so one `<LOG>` directory holds 256 segments of
//! 16 MiB and a listing per timeline is cheap.
//!
//! Each archived file is one object: a JSON header line ([`WalHeader`]) ending in `\n`, then
//! the file's bytes compressed as one frame. Objects are created only if absent
//! ([`crate::storage::Storage::create_new`]), so a readable archived file is never replaced
//! (a damaged one is: [`replace`]); the name is the
//! PostgreSQL file name whatever the compression, so a second push finds the first.
use super::Stanza;
use crate::codec::{self, Compression, Compressor};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Version of the WAL object header this build writes and reads.
pub const WAL_OBJECT_FORMAT: u32 = 1;

/// Largest header line a reader accepts, in bytes (a real one is about 300).
const MAX_HEADER: usize = 4096;

/// Largest WAL file pgjet archives, in bytes: PostgreSQL's largest segment size (1 GiB,
/// `WalSegMaxSize` in src/include/access/xlog_internal.h).
pub const MAX_WAL_FILE: u64 = 1 << 30;

/// What kind of file PostgreSQL hands to archive_command or asks restore_command for.
/// Names as `src/include/access/xlog_internal.h` forms them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalFileKind {
    /// `TTTTTTTTLLLLLLLLSSSSSSSS`: a WAL segment.
    Segment,
    /// `<segment>.partial`: the last, partly filled segment of a timeline, archived at
    /// promotion (`XLogArchiveNotify` of the renamed file in xlog.c).
    Partial,
    /// `<segment>.<8 hex>.backup`: a backup history file (`BackupHistoryFileName`).
    BackupHistory,
    /// `<TLI>.history`: a timeline history file (`TLHistoryFileName`).
    TimelineHistory,
}

/// A WAL archive file name, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalFile {
    /// The file name as PostgreSQL uses it (`%f`).
    pub name: String,
    pub kind: WalFileKind,
    /// Timeline (the first 8 hex digits).
    pub timeline: u32,
}

impl WalFile {
    /// Classifies a PostgreSQL WAL archive file name (no directory part).
    ///
    /// Errors: [`Error::Config`] for a name that is none of the four kinds (a path, a
    /// lower-case name, a temporary file), saying what the names look like.
    pub fn parse(name: &str) -> Result<WalFile> {
        let hex8 = |s: &str| {
            s.len() == 8
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
        };
        let seg = crate::pg::lsn::is_wal_segment_name;
        let kind = if seg(name) {
            Some(WalFileKind::Segment)
        } else if let Some(s) = name.strip_suffix(".partial") {
            seg(s).then_some(WalFileKind::Partial)
        } else if let Some(t) = name.strip_suffix(".history") {
            hex8(t).then_some(WalFileKind::TimelineHistory)
        } else if let Some(rest) = name.strip_suffix(".backup") {
            (rest.len() == 33
                && rest.is_ascii()
                && seg(&rest[..24])
                && &rest[24..25] == "."
                && hex8(&rest[25..]))
            .then_some(WalFileKind::BackupHistory)
        } else {
            None
        };
        let kind = kind.ok_or_else(|| {
            Error::Config(format!(
                "'{name}' is not a WAL file name: expected a segment (24 upper-case hex digits), <segment>.partial, <segment>.<offset>.backup or <timeline>.history"
            ))
        })?;
        let timeline = u32::from_str_radix(&name[..8], 16)
            .map_err(|_| Error::Config(format!("'{name}': bad timeline")))?;
        Ok(WalFile {
            name: name.to_string(),
            kind,
            timeline,
        })
    }

    /// The segment name a segment, partial or backup history file belongs to (None for a
    /// timeline history file).
    pub fn segment(&self) -> Option<&str> {
        match self.kind {
            WalFileKind::TimelineHistory => None,
            _ => Some(&self.name[..24]),
        }
    }

    /// Its object name in the repository (see the module documentation).
    pub(super) fn object_name(&self, stanza: &str) -> String {
        let tli = &self.name[..8];
        match self.kind {
            WalFileKind::TimelineHistory => format!("{stanza}/archive/{tli}/{}", self.name),
            _ => format!("{stanza}/archive/{tli}/{}/{}", &self.name[8..16], self.name),
        }
    }
}

/// Directory of a stanza's WAL archive.
fn archive_dir(stanza: &str) -> String {
    format!("{stanza}/archive")
}

/// The header line of an archived WAL object: what the file is, and the checksums of its
/// logical and stored bytes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WalHeader {
    /// [`WAL_OBJECT_FORMAT`].
    pub pgjet_wal: u32,
    /// The PostgreSQL file name.
    pub file: String,
    /// Logical size in bytes.
    pub size: u64,
    /// XXH3-128 of the logical bytes (32 hex digits).
    pub xxh3: String,
    pub compression: Compression,
    /// Size in bytes of the frame after the header line.
    pub stored_size: u64,
    /// XXH3-128 of the frame.
    pub stored_xxh3: String,
    /// The cluster's system identifier (from the stanza).
    #[serde(with = "super::u64_string")]
    pub system_identifier: u64,
    /// RFC 3339 UTC time of the push.
    pub pushed: String,
}

/// Encodes `data` (the file `name`) as an archive object: header line, then one frame.
///
/// Errors: the compressor's (out of memory).
pub fn encode(
    name: &str,
    data: &[u8],
    compression: Compression,
    compressor: &mut Compressor,
    system_identifier: u64,
) -> Result<Vec<u8>> {
    let xxh3 = codec::xxh3_hex(data);
    let mut out = Vec::new();
    encode_hashed(
        name,
        data,
        &xxh3,
        compression,
        compressor,
        system_identifier,
        &mut out,
    )?;
    Ok(out)
}

/// [`encode`] into `out` (cleared first; a caller that encodes many segments passes the same
/// one, so its capacity is kept), for a caller that already has `data`'s XXH3-128 (`xxh3`,
/// 32 hex digits): the 16 MiB of a segment are hashed once.
///
/// Errors: as [`encode`].
pub fn encode_hashed(
    name: &str,
    data: &[u8],
    xxh3: &str,
    compression: Compression,
    compressor: &mut Compressor,
    system_identifier: u64,
    out: &mut Vec<u8>,
) -> Result<()> {
    let frame = compressor
        .compress_frame(data)
        .map_err(|e| Error::Other(format!("cannot compress {name}")).because(e))?;
    let header = WalHeader {
        pgjet_wal: WAL_OBJECT_FORMAT,
        file: name.to_string(),
        size: data.len() as u64,
        xxh3: xxh3.to_string(),
        compression,
        stored_size: frame.len() as u64,
        stored_xxh3: codec::xxh3_hex(frame),
        system_identifier,
        pushed: super::label::rfc3339(chrono::Utc::now()),
    };
    out.clear();
    serde_json::to_writer(&mut *out, &header)
        .map_err(|e| Error::Other(format!("cannot encode the header of {name}")).because(e))?;
    out.push(b'\n');
    out.extend_from_slice(frame);
    Ok(())
}

/// Reads the header line of an archive object (`object` names it in errors) and returns it
/// with the offset where the frame starts.
///
/// Errors: [`Error::CorruptWal`] when there is no valid header line.
pub fn parse_header(object: &str, bytes: &[u8]) -> Result<(WalHeader, usize)> {
    let corrupt = |reason: String| Error::CorruptWal {
        name: object.to_string(),
        reason,
    };
    let end = bytes
        .iter()
        .take(MAX_HEADER)
        .position(|&b| b == b'\n')
        .ok_or_else(|| corrupt("no header line".into()))?;
    let h: WalHeader = serde_json::from_slice(&bytes[..end])
        .map_err(|e| corrupt(format!("header is not valid: {e}")))?;
    if h.pgjet_wal != WAL_OBJECT_FORMAT {
        return Err(corrupt(format!(
            "header format {}, this pgjet reads {WAL_OBJECT_FORMAT}",
            h.pgjet_wal
        )));
    }
    Ok((h, end + 1))
}

/// Checks an archive object whole and returns its header and the file's bytes: the frame's
/// size and XXH3-128, then the decompressed bytes' size and XXH3-128. `expected` is the file
/// name it must hold.
///
/// Errors: [`Error::CorruptWal`] naming `object` and the first check that failed.
pub fn decode(object: &str, expected: &str, bytes: &[u8]) -> Result<(WalHeader, Vec<u8>)> {
    let corrupt = |reason: String| Error::CorruptWal {
        name: object.to_string(),
        reason,
    };
    let (h, start) = parse_header(object, bytes)?;
    if h.file != expected {
        return Err(corrupt(format!("it holds {}, not {expected}", h.file)));
    }
    let frame = &bytes[start..];
    if frame.len() as u64 != h.stored_size {
        return Err(corrupt(format!(
            "{} stored bytes, the header says {}",
            frame.len(),
            h.stored_size
        )));
    }
    if codec::xxh3_hex(frame) != h.stored_xxh3 {
        return Err(corrupt("stored bytes do not match their checksum".into()));
    }
    if h.size > MAX_WAL_FILE {
        return Err(corrupt(format!("size {} is too large", h.size)));
    }
    let mut out = vec![0u8; h.size as usize];
    codec::decompress(h.compression.kind, frame, &mut out)
        .map_err(|e| corrupt(format!("cannot decompress: {e}")))?;
    if codec::xxh3_hex(&out) != h.xxh3 {
        return Err(corrupt(
            "decompressed bytes do not match their checksum".into(),
        ));
    }
    Ok((h, out))
}

/// How a push ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushOutcome {
    /// The object was created and is durable.
    Stored,
    /// The file was archived before with the same bytes; nothing was written.
    AlreadyArchived,
    /// An object of the file's name is there but damaged: it cannot be read as an archive
    /// object, or its header names these bytes but the bytes do not hold up (cut short: an
    /// upload a store kept although it was cut off). Nothing was written; the caller
    /// replaces it ([`replace`]) with the encoded object again. The reason is given.
    Damaged(String),
}

/// Stores the encoded object `encoded` of `file` (bytes `data`) unless the archive has it:
/// a conditional create, durable when it returns. When the name is taken, the archived copy
/// is read and compared by size and XXH3-128 of the logical bytes.
///
/// `encoded` is handed to the store when `last` (no other repository needs it after this
/// one: an encrypting store seals it in place, without a second buffer) and holds
/// unspecified bytes afterwards, its allocation kept for the next segment; it is left as it
/// was otherwise.
///
/// Errors: [`Error::Repo`] when the archived copy differs (it is never replaced); the
/// store's errors. A damaged archived copy is [`PushOutcome::Damaged`], not an error.
pub fn store(
    st: &Stanza,
    file: &WalFile,
    data: &[u8],
    encoded: &mut Vec<u8>,
    last: bool,
) -> Result<PushOutcome> {
    let name = file.object_name(st.name());
    let created = if last {
        let (created, buf) = st
            .store()
            .create_new_owned(&name, std::mem::take(encoded))?;
        *encoded = buf;
        created
    } else {
        st.store().create_new(&name, encoded)?
    };
    if created {
        return Ok(PushOutcome::Stored);
    }
    let existing = st.store().get(&name)?;
    let h = match parse_header(&name, &existing) {
        Ok((h, _)) => h,
        Err(Error::CorruptWal { reason, .. }) => return Ok(PushOutcome::Damaged(reason)),
        Err(e) => return Err(e),
    };
    if h.size == data.len() as u64 && h.xxh3 == codec::xxh3_hex(data) {
        // The header matches; check the stored copy whole before trusting it.
        return match decode(&name, &file.name, &existing) {
            Ok(_) => Ok(PushOutcome::AlreadyArchived),
            Err(Error::CorruptWal { reason, .. }) => Ok(PushOutcome::Damaged(reason)),
            Err(e) => Err(e),
        };
    }
    Err(Error::Repo(format!(
        "WAL file {} is already archived in {} with different content ({} bytes, XXH3 {}; this one: {} bytes, XXH3 {}); the archived copy is kept. Two clusters may be archiving into one stanza",
        file.name,
        st.store().describe(),
        h.size,
        h.xxh3,
        data.len(),
        codec::xxh3_hex(data)
    )))
}

/// Replaces the damaged archived copy of `file` ([`PushOutcome::Damaged`]: no archive-get
/// could use it) with the encoded object `encoded`, durable when it returns. Never used for
/// a readable copy of other content: that stays, and [`store`] refuses.
///
/// Errors: the store's.
pub fn replace(st: &Stanza, file: &WalFile, encoded: &[u8]) -> Result<()> {
    st.store()
        .put_durable(&file.object_name(st.name()), encoded)
}

/// Reads archived `file` and checks it whole: its header (whose `xxh3` the bytes were
/// checked against) and bytes, None when the archive does not have it.
///
/// Errors: [`Error::CorruptWal`]; the store's errors other than not-found.
pub fn fetch(st: &Stanza, file: &WalFile) -> Result<Option<(WalHeader, Vec<u8>)>> {
    let name = file.object_name(st.name());
    let bytes = match st.store().get(&name) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    if bytes.starts_with(crate::repo::cipher::MAGIC) {
        // Read without the passphrase: the stanza says so (encrypted too).
        st.info()?;
    }
    decode(&name, &file.name, &bytes).map(Some)
}

/// Bytes archived `file` takes in the repository (compressed, encrypted), None when the
/// archive does not have it.
///
/// Errors: the store's.
pub fn stored_size(st: &Stanza, file: &WalFile) -> Result<Option<u64>> {
    st.store().size(&file.object_name(st.name()))
}

/// Removes archived `file` (retention); absent is fine.
///
/// Errors: the store's.
pub fn remove(st: &Stanza, file: &WalFile) -> Result<()> {
    st.store().delete(&file.object_name(st.name()))
}

/// True when the archive has `file` (one existence check, no read).
pub fn contains(st: &Stanza, file: &WalFile) -> Result<bool> {
    st.store().exists(&file.object_name(st.name()))
}

/// Timelines that have an archive directory, ascending.
pub fn timelines(st: &Stanza) -> Result<Vec<u32>> {
    let mut t = Vec::new();
    for n in st.store().list(&archive_dir(st.name()))? {
        let n = n?;
        if let (8, Ok(tli)) = (n.len(), u32::from_str_radix(&n, 16)) {
            t.push(tli);
        }
    }
    t.sort_unstable();
    t.dedup();
    Ok(t)
}

/// Every archived file name of timeline `tli` (segments, partial and backup history files,
/// and the history file), sorted by name.
pub fn list_timeline(st: &Stanza, tli: u32) -> Result<Vec<String>> {
    let dir = timeline_dir(st, tli);
    let mut out = Vec::new();
    for entry in st.store().list(&dir)? {
        let entry = entry?;
        if is_log_dir(&entry) {
            out.extend(
                list_log_dir(st, tli, &entry)?
                    .into_iter()
                    .filter(|n| WalFile::parse(n).is_ok()),
            );
        } else if WalFile::parse(&entry).is_ok() {
            out.push(entry);
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The directory of timeline `tli`'s archive.
fn timeline_dir(st: &Stanza, tli: u32) -> String {
    format!("{}/{:08X}", archive_dir(st.name()), tli)
}

/// A log directory's name: the 8 hex digits a segment name has in its middle (one directory
/// per 4 GiB of WAL).
fn is_log_dir(name: &str) -> bool {
    name.len() == 8 && !name.contains('.')
}

/// The log directories of timeline `tli`, ascending (the newest WAL is in the last).
///
/// Errors: the store's.
pub fn log_dirs(st: &Stanza, tli: u32) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in st.store().list(&timeline_dir(st, tli))? {
        let entry = entry?;
        if is_log_dir(&entry) {
            out.push(entry);
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// What log directory `log` of timeline `tli` holds, one listing: archived files and the
/// `<segment>.stream` directories of stream tails ([`super::wal_tail`]), unsorted, without
/// a trailing '/'.
///
/// Errors: the store's.
pub fn list_log_dir(st: &Stanza, tli: u32, log: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for n in st
        .store()
        .list(&format!("{}/{log}", timeline_dir(st, tli)))?
    {
        out.push(n?.trim_end_matches('/').to_string());
    }
    Ok(out)
}

/// A run of consecutive archived segments of one timeline.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SegmentRun {
    pub timeline: u32,
    /// First and last segment, inclusive.
    pub first: String,
    pub last: String,
    pub segments: u64,
}

/// The archived segments of a stanza as runs of consecutive segments per timeline (a run ends
/// where a segment is missing), ascending. `seg_size` in bytes places the names.
///
/// Errors: the store's.
pub fn segment_runs(st: &Stanza, seg_size: u64) -> Result<Vec<SegmentRun>> {
    let mut out: Vec<SegmentRun> = Vec::new();
    for tli in timelines(st)? {
        let mut prev: Option<u64> = None;
        for name in list_timeline(st, tli)? {
            let Some((_, segno)) = crate::pg::lsn::parse_wal_segment_name(&name, seg_size) else {
                continue;
            };
            match (out.last_mut(), prev) {
                (Some(r), Some(p)) if r.timeline == tli && p + 1 == segno => {
                    r.last = name.clone();
                    r.segments += 1;
                }
                _ => out.push(SegmentRun {
                    timeline: tli,
                    first: name.clone(),
                    last: name.clone(),
                    segments: 1,
                }),
            }
            prev = Some(segno);
        }
    }
    Ok(out)
}

/// A run of WAL segments that was never archived: dropped by archive-push because the
/// queue passed `archive-push-queue-max`. Recovery cannot replay across it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Gap {
    /// First and last missing segment (same timeline), inclusive.
    pub first: String,
    pub last: String,
    /// Number of segments dropped.
    pub segments: u64,
    /// RFC 3339 UTC time the WAL was dropped.
    pub recorded: String,
    /// Why, for people: e.g. "archive-push-queue-max 1 GiB exceeded (70 segments waiting)".
    pub reason: String,
}

impl Gap {
    /// Timeline of the gap.
    pub fn timeline(&self) -> u32 {
        u32::from_str_radix(self.first.get(..8).unwrap_or(""), 16).unwrap_or(0)
    }
}

/// Directory of a stanza's gap records: `<stanza>/archive/gap/<first>-<last>.json`.
fn gap_dir(stanza: &str) -> String {
    format!("{}/gap", archive_dir(stanza))
}

/// Object name of the record of `gap`.
fn gap_name(stanza: &str, gap: &Gap) -> String {
    format!("{}/{}-{}.json", gap_dir(stanza), gap.first, gap.last)
}

/// Removes the record of `gap` (retention, once the WAL before it is gone).
///
/// Errors: the store's.
pub fn remove_gap(st: &Stanza, gap: &Gap) -> Result<()> {
    st.store().delete(&gap_name(st.name(), gap))
}

/// Records `gap` durably (it must be in the repository before the WAL it names is
/// acknowledged to PostgreSQL as done).
///
/// Errors: the store's.
pub fn record_gap(st: &Stanza, gap: &Gap) -> Result<()> {
    let json = serde_json::to_vec_pretty(gap)
        .map_err(|e| Error::Other("cannot encode a gap record".into()).because(e))?;
    st.store().put_durable(&gap_name(st.name(), gap), &json)
}

/// The gap records of a stanza, sorted by first segment.
///
/// Errors: a record that cannot be read or parsed ([`Error::Repo`] naming it); the store's.
pub fn gaps(st: &Stanza) -> Result<Vec<Gap>> {
    let dir = gap_dir(st.name());
    let mut out = Vec::new();
    for n in st.store().list(&dir)? {
        let n = n?;
        if !n.ends_with(".json") {
            continue;
        }
        let name = format!("{dir}/{n}");
        let g: Gap = serde_json::from_slice(&st.store().get(&name)?)
            .map_err(|e| Error::Repo(format!("gap record {name} is not valid")).because(e))?;
        out.push(g);
    }
    out.sort_by(|a, b| a.first.cmp(&b.first));
    Ok(out)
}

/// Waits until WAL file `name` (a segment, or a history file) is in the archive of `store`,
/// checking after 5 ms, then at doubling intervals up to every 100 ms, for up to `timeout`
/// seconds (the archiver usually has it within milliseconds of the switch). Returns the
/// seconds waited.
///
/// `give_up` is asked about once a second while the file is missing; its error ends the
/// wait at once (the archiver is seen failing).
///
/// Errors: [`Error::Unsafe`] naming the file, the repository and what to check when it does
/// not arrive in time; `give_up`'s; the store's errors.
pub fn wait_archived(
    st: &Stanza,
    name: &str,
    timeout: f64,
    give_up: &mut dyn FnMut() -> Result<()>,
) -> Result<f64> {
    let file = WalFile::parse(name)?;
    let t = std::time::Instant::now();
    let mut pause = crate::io::pace::Backoff::new(std::time::Duration::from_millis(100));
    let mut asked = t;
    loop {
        if contains(st, &file)? {
            return Ok(t.elapsed().as_secs_f64());
        }
        if asked.elapsed() >= std::time::Duration::from_secs(1) {
            give_up()?;
            asked = std::time::Instant::now();
        }
        if t.elapsed().as_secs_f64() >= timeout {
            return Err(Error::Unsafe(format!(
                "WAL file {name} did not reach the archive of stanza '{}' in {} within {timeout} s (archive-timeout): check archive_command (it should run `pgjet --stanza={} archive-push %p`) and the server log for its errors",
                st.name(),
                st.store().describe(),
                st.name()
            )));
        }
        pause.sleep();
    }
}

/// Reads and checks every file of a stanza's WAL archive (both checksums, the size, the
/// name in the header) with `jobs` threads. Returns (files, stored bytes, damaged object
/// names with the reason).
///
/// Errors: the store's, other than a damaged file.
pub fn verify_archive(st: &Stanza, jobs: usize) -> Result<(u64, u64, Vec<String>)> {
    let mut names = Vec::new();
    for tli in timelines(st)? {
        names.extend(list_timeline(st, tli)?);
    }
    let stored = AtomicU64::new(0);
    let bad = Mutex::new(Vec::new());
    crate::io::parallel::for_each_with(
        names.len(),
        jobs,
        || Ok(()),
        |_, i| {
            let f = WalFile::parse(&names[i])?;
            let object = f.object_name(st.name());
            let bytes = st.store().get(&object)?;
            stored.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            match decode(&object, &f.name, &bytes) {
                Ok(_) => Ok(()),
                Err(Error::CorruptWal { name, reason }) => {
                    tracing::error!("{name}: {reason}");
                    bad.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(format!("{name} ({reason})"));
                    Ok(())
                }
                Err(e) => Err(e),
            }
        },
    )?;
    let mut bad = bad.into_inner().unwrap_or_else(|p| p.into_inner());
    bad.sort();
    Ok((names.len() as u64, stored.into_inner(), bad))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::CompressType;

    #[test]
    fn names_are_classified_and_placed_per_timeline() {
        let f = WalFile::parse("000000020000000A000000FF").unwrap();
        assert_eq!((f.kind, f.timeline), (WalFileKind::Segment, 2));
        assert_eq!(
            f.object_name("main"),
            "main/archive/00000002/0000000A/000000020000000A000000FF"
        );
        let h = WalFile::parse("0000000A.history").unwrap();
        assert_eq!((h.kind, h.timeline), (WalFileKind::TimelineHistory, 10));
        assert_eq!(h.object_name("m"), "m/archive/0000000A/0000000A.history");
        assert_eq!(h.segment(), None);
        let p = WalFile::parse("000000010000000000000005.partial").unwrap();
        assert_eq!(p.kind, WalFileKind::Partial);
        assert_eq!(p.segment(), Some("000000010000000000000005"));
        let b = WalFile::parse("000000010000000000000003.00000028.backup").unwrap();
        assert_eq!(b.kind, WalFileKind::BackupHistory);
        assert_eq!(
            b.object_name("m"),
            "m/archive/00000001/00000000/000000010000000000000003.00000028.backup"
        );
        for bad in [
            "",
            "00000001000000000000000",
            "00000001000000000000000a",
            "pg_wal/000000010000000000000001",
            "0000000a.history",
            "000000010000000000000003.0000028.backup",
            "000000010000000000000003.tmp",
            "RECOVERYXLOG",
            "000000010000000000000003\u{e9}0000028.backup",
        ] {
            assert!(WalFile::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn objects_round_trip_and_damage_is_named() {
        let data: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        for kind in [
            CompressType::None,
            CompressType::Lz4,
            CompressType::Zstd,
            CompressType::Gzip,
        ] {
            let c = Compression::new(kind, None).unwrap();
            let mut comp = Compressor::new(c).unwrap();
            let name = "000000010000000000000001";
            let obj = encode(name, &data, c, &mut comp, 42).unwrap();
            let (h, back) = decode("o", name, &obj).unwrap();
            assert_eq!(back, data);
            assert_eq!(h.system_identifier, 42);
            assert!(decode("o", "000000010000000000000002", &obj).is_err());
            let mut bad = obj.clone();
            let last = bad.len() - 1;
            bad[last] ^= 1;
            let e = decode("o", name, &bad).unwrap_err().to_string();
            assert!(e.contains("corrupt WAL archive file o"), "{e}");
            assert!(decode("o", name, &obj[..obj.len() - 1]).is_err());
            assert!(decode("o", name, b"garbage").is_err());
        }
    }

    /// A posix stanza in a temporary directory, zstd and its compressor, and segment 7.
    fn stanza_and_codec() -> (tempfile::TempDir, Stanza, Compression, Compressor, WalFile) {
        let dir = tempfile::tempdir().unwrap();
        let st = crate::storage::posix::PosixStorage::open(dir.path()).unwrap();
        let st = Stanza::new(1, std::sync::Arc::new(st), "s");
        let c = Compression::new(CompressType::Zstd, None).unwrap();
        let comp = Compressor::new(c).unwrap();
        let f = WalFile::parse("000000010000000000000007").unwrap();
        (dir, st, c, comp, f)
    }

    #[test]
    fn a_second_push_is_compared_never_replaced() {
        let (_dir, st, c, mut comp, f) = stanza_and_codec();
        let a = vec![7u8; 1 << 20];
        let mut ea = encode(&f.name, &a, c, &mut comp, 1).unwrap();
        // Not the last repository: the encoded bytes are left as they were, for the next.
        assert_eq!(
            store(&st, &f, &a, &mut ea, false).unwrap(),
            PushOutcome::Stored
        );
        assert_eq!(
            store(&st, &f, &a, &mut ea, true).unwrap(),
            PushOutcome::AlreadyArchived
        );
        let mut b = a.clone();
        b[5] = 0;
        let mut eb = encode(&f.name, &b, c, &mut comp, 1).unwrap();
        let e = store(&st, &f, &b, &mut eb, true).unwrap_err().to_string();
        assert!(e.contains("different content"), "{e}");
        assert_eq!(fetch(&st, &f).unwrap().unwrap().1, a);
        let missing = WalFile::parse("000000010000000000000008").unwrap();
        assert_eq!(fetch(&st, &missing).unwrap(), None);
        assert_eq!(list_timeline(&st, 1).unwrap(), vec![f.name.clone()]);
        assert_eq!(timelines(&st).unwrap(), vec![1]);
    }

    #[test]
    fn a_damaged_copy_is_reported_and_replaced_but_never_a_readable_one() {
        let (dir, st, c, mut comp, f) = stanza_and_codec();
        let data: Vec<u8> = (0..1u32 << 18).flat_map(|i| i.to_le_bytes()).collect();
        let enc = encode(&f.name, &data, c, &mut comp, 1).unwrap();
        let path = dir.path().join(f.object_name(st.name()));
        // An upload cut off that the store kept: its header, part of its frame; then
        // bytes that are no archive object at all.
        for damaged in [&enc[..enc.len() - 1000], &b"\0\0garbage"[..]] {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, damaged).unwrap();
            let mut e = enc.clone();
            match store(&st, &f, &data, &mut e, true).unwrap() {
                PushOutcome::Damaged(reason) => assert!(!reason.is_empty()),
                other => panic!("{other:?}"),
            }
            replace(&st, &f, &enc).unwrap();
            assert_eq!(fetch(&st, &f).unwrap().unwrap().1, data);
            let mut e = enc.clone();
            assert_eq!(
                store(&st, &f, &data, &mut e, true).unwrap(),
                PushOutcome::AlreadyArchived
            );
        }
        // A readable copy of other bytes is refused, not reported damaged.
        let mut other = data.clone();
        other[9] ^= 1;
        let mut e = encode(&f.name, &other, c, &mut comp, 1).unwrap();
        let err = store(&st, &f, &other, &mut e, true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("different content"), "{err}");
    }
}
