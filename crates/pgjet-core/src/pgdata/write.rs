//! Writing a data directory's files: the pieces of a copy from the primary
//! ([`DirSink`], the transfer engine's sink) and of a backup read back from the repository
//! ([`DataDirWriter`], read-back's [`RestoreTarget`]) go into files created sparse at their
//! size, each written in place with its all-zero pages left as holes (or cleared, where the
//! file held other bytes), small new files in one open.
use crate::error::{Error, Result};
use crate::io::direct::{self, Writer, DIRECT_MIN_WRITE};
use crate::repo::restore_target::RestoreTarget;
use crate::repo::FileEntry;
use crate::transfer::{nonzero_runs, ReadPiece, UnitSink};
use std::path::{Path, PathBuf};

/// A data directory (or a delta restore's existing copy) as read-back's [`RestoreTarget`]:
/// paths are relative to `root`.
pub struct DataDirWriter<'a> {
    pub root: &'a Path,
    /// The files may hold other bytes (a delta restore): the all-zero pages of the written
    /// pieces are punched out rather than left as they are.
    pub overwrite: bool,
}

impl RestoreTarget for DataDirWriter<'_> {
    /// A missing parent directory is made; written through the page cache (small files).
    fn create(
        &self,
        path: &str,
        mode: u32,
        size: u64,
        mtime: i64,
        data: &[u8],
        zero_pages: &[[u32; 2]],
    ) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let path = self.root.join(path);
        let file = crate::io::fs::create_new_file(&path, mode)?;
        let mut end = 0u64;
        for (off, run) in nonzero_runs(data, zero_pages) {
            file.write_all_at(run, off as u64)
                .map_err(|e| Error::io("write", &path, e))?;
            end = off as u64 + run.len() as u64;
        }
        if end != size {
            file.set_len(size)
                .map_err(|e| Error::io("size", &path, e))?;
        }
        let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime.max(0) as u64);
        file.set_modified(when)
            .map_err(|e| Error::io("set mtime", &path, e))
    }

    fn write(&self, path: &str, offset: u64, data: &[u8], zero_pages: &[[u32; 2]]) -> Result<()> {
        write_piece(
            &self.root.join(path),
            offset,
            data,
            zero_pages,
            self.overwrite,
        )
    }

    fn holds(&self, path: &str, offset: u64, want: &[u8]) -> Result<bool> {
        same_bytes(&self.root.join(path), offset, want)
    }

    fn written(&self, path: &str, offset: u64, len: u64) {
        crate::io::fs::start_writeback(&self.root.join(path), offset, len);
    }

    fn finish(&self, path: &str, mtime: i64) -> Result<()> {
        crate::io::fs::set_mtime(&self.root.join(path), mtime)
    }
}

/// Writes pieces straight into files that already exist at their final size (sparse).
pub struct DirSink<'a> {
    /// Target path of each file of the list, by index.
    pub targets: &'a [PathBuf],
    /// The files held other bytes before (a delta): all-zero pages are punched out as holes
    /// instead of being skipped, so no old byte survives where the source has zeros.
    pub overwrite: bool,
}

impl UnitSink for DirSink<'_> {
    type State = ();
    type Piece = ();

    fn new_state(&self) -> Result<()> {
        Ok(())
    }

    fn write_unit(
        &self,
        _: &mut (),
        pieces: &[ReadPiece],
        _release: &mut dyn FnMut(),
    ) -> Result<Vec<()>> {
        for p in pieces {
            let path = &self.targets[p.spec.index()];
            write_piece(path, p.spec.offset, p.data, &p.zero_pages, self.overwrite)?;
        }
        Ok(vec![(); pieces.len()])
    }
}

/// Writes a piece in place in the existing file `path` ([`write_runs`]); over old bytes
/// (`overwrite`) its all-zero pages are cleared too ([`punch_zero_pages`]).
fn write_piece(
    path: &Path,
    offset: u64,
    data: &[u8],
    zero_pages: &[[u32; 2]],
    overwrite: bool,
) -> Result<()> {
    write_runs(path, offset, data, zero_pages)?;
    if overwrite && !zero_pages.is_empty() {
        punch_zero_pages(path, offset, zero_pages)?;
    }
    Ok(())
}

/// Writes the non-zero pages of `data` into the existing file `path` at `offset`: direct
/// I/O for the aligned part (see [`crate::io::direct`]) when they are at least
/// [`DIRECT_MIN_WRITE`] bytes, the page cache otherwise. The caller syncs at the end.
pub fn write_runs(path: &Path, offset: u64, data: &[u8], zero_pages: &[[u32; 2]]) -> Result<()> {
    let runs = nonzero_runs(data, zero_pages);
    if runs.is_empty() {
        return Ok(());
    }
    let total: usize = runs.iter().map(|(_, b)| b.len()).sum();
    let w = if total < DIRECT_MIN_WRITE {
        Writer::open_buffered(path)
    } else {
        Writer::open(path)
    }
    .map_err(|e| Error::io("open", path, e))?;
    for (off, bytes) in runs {
        w.write_at(bytes, offset + off as u64)
            .map_err(|e| Error::io("write", path, e))?;
    }
    Ok(())
}

/// Makes the all-zero pages `zero_pages` of a piece at `offset` read as zeros in the
/// existing file `path`: punched out as holes (fallocate PUNCH_HOLE, keeping the size), or
/// written as zeros where the filesystem cannot punch.
pub fn punch_zero_pages(path: &Path, offset: u64, zero_pages: &[[u32; 2]]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io("open", path, e))?;
    let page = crate::pg::checksum::BLCKSZ as u64;
    for [first, count] in zero_pages {
        let at = offset + *first as u64 * page;
        let len = *count as u64 * page;
        // SAFETY: fallocate on an open descriptor with valid offsets; errors are returned.
        let rc = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                at as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc != 0 {
            let zeros = vec![0u8; len as usize];
            f.write_all_at(&zeros, at)
                .map_err(|e| Error::io("write", path, e))?;
        }
    }
    Ok(())
}

/// True when the `want.len()` bytes of file `path` at `offset` are `want` (a delta restore's
/// compare before a write; a short file differs).
///
/// Errors: the file cannot be opened or read.
fn same_bytes(path: &Path, offset: u64, want: &[u8]) -> Result<bool> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).map_err(|e| Error::io("open", path, e))?;
    let mut have = vec![0u8; want.len()];
    match f.read_exact_at(&mut have, offset) {
        Ok(()) => Ok(have == want),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(Error::io("read", path, e)),
    }
}

/// Allocates, in the open target file `file` at `path`, the ranges `f`'s pieces will
/// write: everything but the zero pages, which stay holes ([`direct::allocate`]), so the
/// writers' direct writes overwrite allocated blocks and several run in one file at once.
/// Small files are left alone (they are written through the page cache). Returns false
/// when the filesystem cannot allocate ahead (the caller may stop trying). Errors (ENOSPC
/// first of all) name the file.
pub fn allocate_pieces(file: &std::fs::File, path: &Path, f: &FileEntry) -> Result<bool> {
    // Non-zero ranges of the file, adjacent ones merged (across pieces too).
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for p in &f.pieces {
        let runs =
            crate::repo::manifest::nonzero_ranges(p.logical_size as usize, &p.range_zero_pages())
                .unwrap_or_default();
        for (off, n) in runs {
            let (start, len) = (p.logical_offset + off as u64, n as u64);
            match ranges.last_mut() {
                Some(r) if r.0 + r.1 == start => r.1 += len,
                _ => ranges.push((start, len)),
            }
        }
    }
    let bytes: u64 = ranges.iter().map(|r| r.1).sum();
    if ranges.is_empty() || bytes < DIRECT_MIN_WRITE as u64 {
        return Ok(true);
    }
    for (start, len) in ranges {
        if !direct::allocate(file, start, len).map_err(|e| Error::io("allocate", path, e))? {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{CompressType, Compression};
    use crate::pg::checksum::BLCKSZ;
    use crate::repo::handle::Stanza;
    use crate::repo::read_back::{restore_one, ReadBack, Want};
    use crate::repo::sink::tests::{memory, sample_files, store_all, LABEL, MTIME};
    use crate::repo::sink::RepoSink;
    use crate::transfer::NoProgress;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn mtime(path: &Path) -> i64 {
        std::fs::metadata(path).unwrap().mtime()
    }

    /// Blocks allocated to `path`, in 512-byte units.
    fn blocks(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().blocks()
    }

    /// A backup read back through [`DataDirWriter`] lands in files byte for byte, with
    /// their modification time and permission bits: the small file of one piece created by
    /// its writer, the relation (several pieces) created at its size first; its all-zero
    /// pages are holes. pg_control's way, `restore_one`, writes the same bytes.
    #[test]
    fn a_backup_read_back_lands_in_files_byte_for_byte() {
        let stanza = Stanza::new(1, memory(), "s");
        let (files, units) = sample_files();
        let backup = stanza.backup(LABEL);
        let sink = RepoSink::new(&backup, Compression::new(CompressType::Zstd, None).unwrap());
        let entries = store_all(&sink, &files, &units).unwrap();
        let dir = tempfile::tempdir().unwrap();
        for d in ["base/1", "global"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let writer = DataDirWriter {
            root: dir.path(),
            overwrite: false,
        };
        let rb = ReadBack {
            backup: &backup,
            kind: CompressType::Zstd,
            chain: &[],
            contiguous: true,
            target: Some(&writer),
            jobs: 2,
        };
        let mut prepare = |f: &FileEntry| -> Result<Want> {
            if f.pieces.len() == 1 {
                return Ok(Want::Create(0o640));
            }
            super::super::create_file(dir.path(), &f.path, f.size, 0o600)?;
            Ok(Want::All)
        };
        let out = rb
            .run(entries.iter().cloned().map(Ok), &mut prepare, &NoProgress)
            .unwrap();
        assert!(out.bad.is_empty(), "{:?}", out.bad);
        for (path, data) in &files {
            let p = dir.path().join(path);
            assert_eq!(std::fs::read(&p).unwrap(), *data, "{path}");
            assert_eq!(mtime(&p), MTIME, "{path}");
        }
        let mode = |p: &str| {
            std::fs::metadata(dir.path().join(p))
                .unwrap()
                .permissions()
                .mode()
        };
        assert_eq!(mode("PG_VERSION") & 0o777, 0o640);
        assert_eq!(mode("base/1/16384") & 0o777, 0o600);
        // Six pages, three of them zero: no more than three pages' blocks allocated.
        let rel = dir.path().join("base/1/16384");
        assert!(blocks(&rel) * 512 <= 3 * BLCKSZ as u64, "{}", blocks(&rel));

        let (rel_entry, rel_data) = (&entries[1], &files[1].1);
        std::fs::remove_file(&rel).unwrap();
        super::super::create_file(dir.path(), &rel_entry.path, rel_entry.size, 0o600).unwrap();
        restore_one(&backup, CompressType::Zstd, rel_entry, &writer).unwrap();
        assert_eq!(std::fs::read(&rel).unwrap(), *rel_data);

        // Created twice is refused: a writer never replaces a file it did not expect.
        let e = writer
            .create("PG_VERSION", 0, 3, MTIME, b"16\n", &[])
            .unwrap_err();
        assert!(e.to_string().contains("PG_VERSION"), "{e}");
        assert_eq!(
            std::fs::read(dir.path().join("PG_VERSION")).unwrap(),
            b"15\n"
        );
    }

    /// A piece written over other bytes: a new file's writer leaves the zero pages as they
    /// are (holes), a delta's (`overwrite`) makes them read as zeros; `holds` compares the
    /// bytes in place and calls a short file different.
    #[test]
    fn zero_pages_are_cleared_only_over_old_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let page = BLCKSZ;
        let old = vec![7u8; 4 * page];
        let mut new = vec![9u8; 4 * page];
        new[page..3 * page].fill(0);
        let zero = [[1u32, 2u32]];
        for overwrite in [false, true] {
            std::fs::write(dir.path().join("f"), &old).unwrap();
            let w = DataDirWriter {
                root: dir.path(),
                overwrite,
            };
            assert!(w.holds("f", 0, &old).unwrap());
            assert!(!w.holds("f", 0, &new).unwrap());
            assert!(!w.holds("f", page as u64, &old).unwrap(), "short");
            w.write("f", 0, &new, &zero).unwrap();
            let on_disk = std::fs::read(dir.path().join("f")).unwrap();
            assert_eq!(on_disk[..page], new[..page]);
            assert_eq!(on_disk[3 * page..], new[3 * page..]);
            let middle = if overwrite { &new } else { &old };
            assert_eq!(
                on_disk[page..3 * page],
                middle[page..3 * page],
                "{overwrite}"
            );
            assert_eq!(w.holds("f", 0, &new).unwrap(), overwrite);
            w.finish("f", MTIME).unwrap();
            assert_eq!(mtime(&dir.path().join("f")), MTIME);
        }
        let w = DataDirWriter {
            root: dir.path(),
            overwrite: true,
        };
        assert!(w.write("missing", 0, &new, &zero).is_err());
        assert!(w.holds("missing", 0, &new).is_err());
    }
}
