//! What comes back from the workers: each unit's pieces collected ([`Collector`]), and the
//! pieces of each file put back in order ([`FileAssembler`]) for a sink that writes a file's
//! entry once all its pieces are stored.
use super::*;
use crate::error::Result;

/// What a copy found, indexed like the file list (the pieces themselves go to a
/// [`Collector`] as units complete).
#[derive(Debug, Default)]
pub struct CopyOutcome {
    /// Blocks with a failed page checksum, per file.
    pub page_errors: Vec<Vec<u32>>,
    /// Files that disappeared during the copy (dropped relations): leave them out.
    pub vanished: Vec<bool>,
    /// Blocks with a failed page checksum, all files together.
    pub page_error_count: usize,
}

/// What one unit produced, handed to a [`Collector`] when the unit is stored: each piece with
/// its file's index, the blocks whose page checksum failed twice, the files that vanished.
pub struct UnitDone<P> {
    pub pieces: Vec<(usize, P)>,
    pub page_errors: Vec<(usize, u32)>,
    pub vanished: Vec<usize>,
}

/// Receives each unit's outcome as the unit completes; the engine serializes the calls.
/// An error stops the copy.
pub trait Collector<P>: Send {
    fn unit_done(&mut self, done: UnitDone<P>) -> Result<()>;
}

/// Keeps what the copy found and drops the pieces (a sink whose pieces carry nothing to
/// keep, such as a data directory's).
impl<P> Collector<P> for CopyOutcome {
    fn unit_done(&mut self, done: UnitDone<P>) -> Result<()> {
        self.page_error_count += done.page_errors.len();
        for (file, blk) in done.page_errors {
            self.page_errors[file].push(blk);
        }
        for file in done.vanished {
            self.vanished[file] = true;
        }
        Ok(())
    }
}

/// Puts files together from units as they complete, and hands each whole file to `emit`
/// once (pieces in logical order, page errors sorted): a backup writes its manifest while it
/// copies, and keeps only the files still in progress. Files that vanished during the copy
/// are not emitted; their indexes are in [`FileAssembler::vanished`]. With
/// [`FileAssembler::prefixes`] set, a file in progress is also handed over each time the
/// pieces stored from its start grow (its contiguous prefix: a backup's resume journal saves
/// large files in part).
///
/// Memory: 4 bytes per file, plus the pieces of the files in progress (units are claimed in
/// order and a large file's chunks are consecutive units, so few are).
pub struct FileAssembler<'a, P: PieceOffset> {
    /// Pieces not yet stored, per file.
    remaining: Vec<u32>,
    /// Files in progress: pieces so far, page errors, vanished.
    open: std::collections::HashMap<usize, (Vec<P>, Vec<u32>, bool)>,
    emit: &'a mut FileEmit<'a, P>,
    /// Hand over the growing prefixes of files in progress too.
    pub prefixes: bool,
    /// The end of the prefix last handed over, per file in progress.
    reported: std::collections::HashMap<usize, u64>,
    /// Bytes of pieces added since the prefix was last looked at, per file in progress:
    /// the prefix is looked at again after [`PREFIX_STEP`] more, so that a file of many
    /// small pieces (an incremental's changed blocks among its references) costs linear
    /// time, not a copy of its pieces per piece.
    since: std::collections::HashMap<usize, u64>,
    /// Files that vanished during the copy.
    pub vanished: Vec<usize>,
    /// Blocks with a failed page checksum, all files together.
    pub page_error_count: usize,
}

/// Bytes of pieces stored for a file between two looks at its prefix
/// ([`FileAssembler::prefixes`]): 8 MiB, a few chunks; a resume journal saves every 64 MiB
/// or more, so it never waits for a prefix longer than this.
pub const PREFIX_STEP: u64 = 8 << 20;

/// What a [`FileAssembler`] hands its files to: (file index, pieces in logical order, page
/// errors sorted, whole). `whole` false: the pieces are the file's stored prefix so far
/// (from offset 0, contiguous), no page errors; the file comes again, whole, later.
pub type FileEmit<'a, P> = dyn FnMut(usize, Vec<P>, Vec<u32>, bool) -> Result<()> + Send + 'a;

/// A stored piece that knows where it lies in its file, so an assembler can order a file's
/// pieces.
pub trait PieceOffset: Send {
    /// Offset of the piece in its file, bytes.
    fn logical_offset(&self) -> u64;
    /// Offset just past the piece's end in its file, bytes.
    fn logical_end(&self) -> u64;
}

impl<'a, P: PieceOffset + Clone> FileAssembler<'a, P> {
    /// An assembler for `files` copied as `units`; files no unit covers (empty ones) are
    /// emitted at once.
    pub fn new(
        files: &[SourceFile],
        units: &[Unit],
        emit: &'a mut FileEmit<'a, P>,
    ) -> Result<FileAssembler<'a, P>> {
        Self::with_seeds(files, units, Vec::new(), emit)
    }

    /// [`FileAssembler::new`] with pieces known before the copy (`seeds`: file index and
    /// piece; a differential backup's ranges that are not read): each file is emitted with
    /// its seeds and its copied pieces, in logical order.
    pub fn with_seeds(
        files: &[SourceFile],
        units: &[Unit],
        seeds: Vec<(usize, P)>,
        emit: &'a mut FileEmit<'a, P>,
    ) -> Result<FileAssembler<'a, P>> {
        let mut remaining = vec![0u32; files.len()];
        for u in units {
            for p in &u.pieces {
                remaining[p.index()] += 1;
            }
        }
        let mut open: std::collections::HashMap<usize, (Vec<P>, Vec<u32>, bool)> =
            Default::default();
        for (i, p) in seeds {
            open.entry(i).or_default().0.push(p);
        }
        for (i, n) in remaining.iter().enumerate() {
            if *n == 0 {
                let mut pieces = open.remove(&i).map(|o| o.0).unwrap_or_default();
                pieces.sort_by_key(|p| p.logical_offset());
                emit(i, pieces, Vec::new(), true)?;
            }
        }
        Ok(FileAssembler {
            remaining,
            open,
            emit,
            prefixes: false,
            reported: Default::default(),
            since: Default::default(),
            vanished: Vec::new(),
            page_error_count: 0,
        })
    }

    fn piece_done(&mut self, file: usize) -> Result<()> {
        self.remaining[file] -= 1;
        if self.remaining[file] == 0 {
            self.reported.remove(&file);
            self.since.remove(&file);
            if let Some((mut pieces, mut errs, gone)) = self.open.remove(&file) {
                if gone {
                    self.vanished.push(file);
                } else {
                    pieces.sort_by_key(|p| p.logical_offset());
                    errs.sort_unstable();
                    (self.emit)(file, pieces, errs, true)?;
                }
            }
        } else if self.prefixes && self.since.get(&file).is_some_and(|b| *b >= PREFIX_STEP) {
            self.since.insert(file, 0);
            self.prefix(file)?;
        }
        Ok(())
    }

    /// Hands over the stored prefix of `file`, in progress, when it grew.
    fn prefix(&mut self, file: usize) -> Result<()> {
        let Some((pieces, _, false)) = self.open.get_mut(&file) else {
            return Ok(());
        };
        pieces.sort_by_key(|p| p.logical_offset());
        let mut end = 0;
        let mut n = 0;
        for p in pieces.iter() {
            if p.logical_offset() != end {
                break;
            }
            end = p.logical_end();
            n += 1;
        }
        let before = self.reported.get(&file).copied().unwrap_or(0);
        if end > before {
            self.reported.insert(file, end);
            let prefix = pieces[..n].to_vec();
            (self.emit)(file, prefix, Vec::new(), false)?;
        }
        Ok(())
    }
}

impl<P: PieceOffset + Clone> Collector<P> for FileAssembler<'_, P> {
    fn unit_done(&mut self, done: UnitDone<P>) -> Result<()> {
        self.page_error_count += done.page_errors.len();
        for (file, blk) in done.page_errors {
            self.open.entry(file).or_default().1.push(blk);
        }
        for file in done.vanished {
            self.open.entry(file).or_default().2 = true;
            self.piece_done(file)?;
        }
        for (file, piece) in done.pieces {
            if self.prefixes {
                *self.since.entry(file).or_default() +=
                    piece.logical_end() - piece.logical_offset();
            }
            self.open.entry(file).or_default().0.push(piece);
            self.piece_done(file)?;
        }
        Ok(())
    }
}
