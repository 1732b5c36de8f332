//! Reading a backup back: every stored frame is checked (XXH3-128 of the stored bytes),
//! expanded, checked again (XXH3-128 of the logical bytes) and only then written. `verify`
//! runs the same checks without writing.
use super::sink::write_runs;
use super::Progress;
use crate::codec::{self, CompressType};
use crate::error::{Error, Result};
use crate::repo::{self, BackupManifest, Piece};
use crate::storage::direct::{aligned_buf, AlignedBuf};
use crate::storage::Storage;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Checks one frame against its piece and expands it into `logical` (resized to the piece's
/// logical size, zero pages filled with zeros). Errors say what did not match.
pub fn decode_piece(
    kind: CompressType,
    frame: &[u8],
    piece: &Piece,
    payload: &mut Vec<u8>,
    logical: &mut AlignedBuf,
) -> std::result::Result<(), String> {
    if frame.len() as u64 != piece.stored_size || codec::xxh3_hex(frame) != piece.stored_xxh3 {
        return Err("stored bytes do not match their checksum".into());
    }
    let ranges =
        crate::repo::manifest::nonzero_ranges(piece.logical_size as usize, &piece.zero_pages)
            .ok_or("the manifest's zero-page runs do not fit the piece")?;
    let payload_len: usize = ranges.iter().map(|r| r.1).sum();
    logical.clear();
    if piece.zero_pages.is_empty() {
        // No holes: the frame expands straight into the logical bytes.
        logical.resize(payload_len, 0);
        codec::decompress(kind, frame, logical).map_err(|e| format!("cannot decompress: {e}"))?;
    } else {
        payload.clear();
        payload.resize(payload_len, 0);
        codec::decompress(kind, frame, payload).map_err(|e| format!("cannot decompress: {e}"))?;
        logical.resize(piece.logical_size as usize, 0);
        let mut src = 0usize;
        for (off, n) in ranges {
            logical[off..off + n].copy_from_slice(&payload[src..src + n]);
            src += n;
        }
    }
    if codec::xxh3_hex(logical) != piece.xxh3 {
        return Err("logical bytes do not match their checksum".into());
    }
    Ok(())
}

/// The frames of one object: (file index, piece index) pairs, and the object's expected size.
struct ObjectWork {
    name: String,
    pieces: Vec<(usize, usize)>,
    size: u64,
}

fn group_by_object(m: &BackupManifest, skip: Option<usize>) -> Vec<ObjectWork> {
    let mut map: BTreeMap<&str, ObjectWork> = BTreeMap::new();
    for (fi, f) in m.files.iter().enumerate() {
        for (pi, p) in f.pieces.iter().enumerate() {
            let w = map.entry(&p.object).or_insert_with(|| ObjectWork {
                name: p.object.clone(),
                pieces: vec![],
                size: 0,
            });
            w.size += p.stored_size;
            if Some(fi) != skip {
                w.pieces.push((fi, pi));
            }
        }
    }
    let mut v: Vec<ObjectWork> = map.into_values().filter(|w| !w.pieces.is_empty()).collect();
    v.sort_by_key(|w| std::cmp::Reverse(w.size));
    v
}

/// Checks every frame of backup `m` and, when `targets` is given, writes each file's bytes
/// into `targets[file]` (files must already exist at their final size). Files at index
/// `skip` are left out (restore writes pg_control last, on its own).
///
/// Returns the paths of the files with missing or damaged frames (verify: all of them;
/// restore stops at the first and returns [`Error::Corrupt`]).
pub fn read_back(
    store: &dyn Storage,
    m: &BackupManifest,
    targets: Option<&[PathBuf]>,
    skip: Option<usize>,
    jobs: usize,
    progress: &dyn Progress,
) -> Result<Vec<String>> {
    let work = group_by_object(m, skip);
    let next = AtomicUsize::new(0);
    let abort = AtomicBool::new(false);
    let bad: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                let (mut payload, mut logical) =
                    (Vec::new(), aligned_buf(super::CHUNK_SIZE as usize));
                while !abort.load(Ordering::SeqCst) {
                    let Some(w) = work.get(next.fetch_add(1, Ordering::SeqCst)) else {
                        break;
                    };
                    let res = one_object(
                        store,
                        m,
                        w,
                        targets,
                        &mut payload,
                        &mut logical,
                        &bad,
                        progress,
                    );
                    let restoring = targets.is_some();
                    match res {
                        Ok(())
                            if restoring
                                && !bad.lock().unwrap_or_else(|p| p.into_inner()).is_empty() =>
                        {
                            abort.store(true, Ordering::SeqCst)
                        }
                        Ok(()) => {}
                        Err(e) => {
                            abort.store(true, Ordering::SeqCst);
                            first_error
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert(e);
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let mut bad = bad.into_inner().unwrap_or_else(|p| p.into_inner());
    bad.sort();
    bad.dedup();
    if targets.is_some() && !bad.is_empty() {
        return Err(Error::Corrupt {
            label: m.label.clone(),
            files: bad,
        });
    }
    Ok(bad)
}

#[allow(clippy::too_many_arguments)]
fn one_object(
    store: &dyn Storage,
    m: &BackupManifest,
    w: &ObjectWork,
    targets: Option<&[PathBuf]>,
    payload: &mut Vec<u8>,
    logical: &mut AlignedBuf,
    bad: &Mutex<Vec<String>>,
    progress: &dyn Progress,
) -> Result<()> {
    let name = repo::object_name(&m.stanza, &m.label, &w.name);
    let mark = |fi: usize, why: &str| {
        let path = &m.files[fi].path;
        tracing::error!("{path}: {why} (object data/{})", w.name);
        bad.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(path.clone());
    };
    let object = match store.size(&name)? {
        Some(n) if n == w.size => store.get_aligned(&name)?,
        found => {
            let why = match found {
                None => "stored object is missing".to_string(),
                Some(n) => format!("stored object has {n} bytes, expected {}", w.size),
            };
            for &(fi, _) in &w.pieces {
                mark(fi, &why);
            }
            return Ok(());
        }
    };
    for &(fi, pi) in &w.pieces {
        let p = &m.files[fi].pieces[pi];
        let Some(frame) = usize::try_from(p.offset)
            .ok()
            .zip(usize::try_from(p.offset.saturating_add(p.stored_size)).ok())
            .and_then(|(a, b)| object.get(a..b))
        else {
            mark(fi, "the manifest points past the end of the stored object");
            continue;
        };
        if let Err(why) = decode_piece(m.compression.kind, frame, p, payload, logical) {
            mark(fi, &why);
            continue;
        }
        if let Some(t) = targets {
            write_runs(&t[fi], p.logical_offset, logical, &p.zero_pages)?;
        }
        progress.advance(p.logical_size);
    }
    Ok(())
}

/// Reads, checks and writes one file on its own (restore uses it for pg_control, last).
pub fn restore_one(
    store: &dyn Storage,
    m: &BackupManifest,
    file: usize,
    target: &PathBuf,
) -> Result<()> {
    let f = &m.files[file];
    let (mut payload, mut logical) = (Vec::new(), aligned_buf(super::CHUNK_SIZE as usize));
    for p in &f.pieces {
        let frame = store.get_range(
            &repo::object_name(&m.stanza, &m.label, &p.object),
            p.offset,
            p.stored_size,
        )?;
        decode_piece(m.compression.kind, &frame, p, &mut payload, &mut logical).map_err(|why| {
            tracing::error!("{}: {why}", f.path);
            Error::Corrupt {
                label: m.label.clone(),
                files: vec![f.path.clone()],
            }
        })?;
        write_runs(target, p.logical_offset, &logical, &p.zero_pages)?;
    }
    Ok(())
}
