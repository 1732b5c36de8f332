//! Changed blocks read from the WAL itself: the block references of every record between two
//! LSNs, summarized by the rules of PostgreSQL's own WAL summarizer, so a differential or
//! incremental backup (or a resume) of a cluster without WAL summaries (PostgreSQL 15 and
//! 16, or 17+ with `summarize_wal = off`) reads only the blocks WAL changed.
//!
//! Facts from PostgreSQL (src/include/access/xlogrecord.h, xlog_internal.h,
//! src/backend/access/transam/xlogreader.c `DecodeXLogRecord`, and
//! src/backend/postmaster/walsummarizer.c for what a record means to a summary), for the
//! WAL format of PostgreSQL 15 to 18:
//!
//! - WAL is a stream of 8 KiB pages (`XLOG_BLCKSZ`), each starting with a header of 24 bytes,
//!   40 on the first page of a segment (`XLP_LONG_HEADER`); a record may continue over pages.
//!   Records start on 8-byte boundaries with a 24-byte header (`xl_tot_len`, `xl_xid`,
//!   `xl_prev`, `xl_info`, `xl_rmid`, 2 pad bytes, `xl_crc`); the CRC-32C covers the record
//!   after the header, then the header up to `xl_crc`.
//! - After the header come block headers (id 0 to 32: fork and flags, data length, an
//!   optional image header, the relation unless `BKPBLOCK_SAME_REL`, the block number),
//!   then the ids 252 (top-level xid, 4 bytes), 253 (origin, 2 bytes), 254/255 (main data
//!   length, 4 or 1 bytes, last); then the block data and the main data.
//! - A block referenced by a record changed (any fork but the free space map, which is not
//!   fully WAL-logged). `XLOG_SMGR_CREATE` of a fork (not the FSM) sets its *limit block* to
//!   0, `XLOG_SMGR_TRUNCATE` with `SMGR_TRUNCATE_HEAP` the main fork's to the new length; a
//!   relation dropped at commit or abort gets 0; `XLOG_DBASE_CREATE_*` and `XLOG_DBASE_DROP`
//!   give every relation of that database in that tablespace 0. `XLOG_SWITCH` ends a
//!   segment's records. A `XLOG_PARAMETER_CHANGE` to `wal_level = minimal` means changes may
//!   have gone unlogged: the scan cannot tell then.
//!
//! Anything unexpected (a missing segment, a page that is not where it should be, a record
//! whose CRC fails before `to`, an unknown block id) makes the scan say why it cannot tell,
//! and the backup reads the pages and compares their LSNs instead. It is never an error.
use crate::error::Result;
use crate::pg::lsn::Lsn;
use crate::pg::walsummary::SummarizedChanges;

/// WAL page size PostgreSQL is built with by default (`XLOG_BLCKSZ`); others are refused.
const XLOG_BLCKSZ: u64 = 8192;
const SHORT_PAGE_HEADER: u64 = 24;
const LONG_PAGE_HEADER: u64 = 40;
const XLP_LONG_HEADER: u16 = 0x0002;
const XLP_FIRST_IS_OVERWRITE_CONTRECORD: u16 = 0x0008;
const RECORD_HEADER: usize = 24;
const XLR_MAX_BLOCK_ID: u8 = 32;
const XLR_BLOCK_ID_TOPLEVEL_XID: u8 = 252;
const XLR_BLOCK_ID_ORIGIN: u8 = 253;
const XLR_BLOCK_ID_DATA_LONG: u8 = 254;
const XLR_BLOCK_ID_DATA_SHORT: u8 = 255;
const BKPBLOCK_FORK_MASK: u8 = 0x0F;
const BKPBLOCK_HAS_IMAGE: u8 = 0x10;
const BKPBLOCK_SAME_REL: u8 = 0x80;
const BKPIMAGE_HAS_HOLE: u8 = 0x01;
/// `BKPIMAGE_COMPRESS_PGLZ | _LZ4 | _ZSTD` (PostgreSQL 15+).
const BKPIMAGE_COMPRESSED: u8 = 0x04 | 0x08 | 0x10;
const MAIN_FORKNUM: u8 = 0;
const RM_XLOG_ID: u8 = 0;
const RM_XACT_ID: u8 = 1;
const RM_SMGR_ID: u8 = 2;
const RM_DBASE_ID: u8 = 4;
const XLOG_SWITCH: u8 = 0x40;
const XLOG_PARAMETER_CHANGE: u8 = 0x60;
const XLOG_SMGR_CREATE: u8 = 0x10;
const XLOG_SMGR_TRUNCATE: u8 = 0x20;
const SMGR_TRUNCATE_HEAP: u32 = 0x0001;
const XLOG_DBASE_CREATE_FILE_COPY: u8 = 0x00;
const XLOG_DBASE_CREATE_WAL_LOG: u8 = 0x10;
const XLOG_DBASE_DROP: u8 = 0x20;
const XLOG_XACT_OPMASK: u8 = 0x70;
const XLOG_XACT_HAS_INFO: u8 = 0x80;
const XLOG_XACT_COMMIT: u8 = 0x00;
const XLOG_XACT_ABORT: u8 = 0x20;
const XLOG_XACT_COMMIT_PREPARED: u8 = 0x30;
const XLOG_XACT_ABORT_PREPARED: u8 = 0x40;
const XACT_XINFO_HAS_DBINFO: u32 = 1 << 0;
const XACT_XINFO_HAS_SUBXACTS: u32 = 1 << 1;
const XACT_XINFO_HAS_RELFILELOCATORS: u32 = 1 << 2;

/// The WAL of one timeline as a byte stream, a segment at a time, page headers checked.
struct WalStream<F: FnMut(u64) -> Result<Option<Vec<u8>>>> {
    fetch: F,
    seg_size: u64,
    segno: Option<u64>,
    seg: Vec<u8>,
    /// Segments read.
    segments: u64,
}

type Why = String;

impl<F: FnMut(u64) -> Result<Option<Vec<u8>>>> WalStream<F> {
    fn new(fetch: F, seg_size: u64) -> Self {
        WalStream {
            fetch,
            seg_size,
            segno: None,
            seg: Vec::new(),
            segments: 0,
        }
    }

    /// The segment holding `pos`, fetched if needed.
    fn segment(&mut self, pos: u64) -> std::result::Result<&[u8], Why> {
        let segno = pos / self.seg_size;
        if self.segno != Some(segno) {
            let bytes = (self.fetch)(segno)
                .map_err(|e| format!("WAL segment {segno:X} cannot be read: {e}"))?
                .ok_or_else(|| {
                    format!("WAL segment number {segno:X} is neither in pg_wal nor in the archive")
                })?;
            if bytes.len() as u64 != self.seg_size {
                return Err(format!(
                    "WAL segment {segno:X} has {} bytes, not {}",
                    bytes.len(),
                    self.seg_size
                ));
            }
            self.seg = bytes;
            self.segno = Some(segno);
            self.segments += 1;
        }
        Ok(&self.seg)
    }

    /// Checks the header of the page at `page` (a page start) and returns its length.
    fn page_header(&mut self, page: u64) -> std::result::Result<u64, Why> {
        let seg_size = self.seg_size;
        let seg = self.segment(page)?;
        let at = (page % seg_size) as usize;
        let h = &seg[at..at + SHORT_PAGE_HEADER as usize];
        let info = u16::from_le_bytes([h[2], h[3]]);
        let addr = u64::from_le_bytes(h[8..16].try_into().unwrap_or_default());
        if addr != page {
            return Err(format!(
                "the WAL page at {} holds page {} {RECYCLED}",
                Lsn(page),
                Lsn(addr)
            ));
        }
        if info & XLP_FIRST_IS_OVERWRITE_CONTRECORD != 0 {
            return Err(format!(
                "the WAL page at {} follows an overwritten record",
                Lsn(page)
            ));
        }
        if info & XLP_LONG_HEADER != 0 {
            let blcksz = u32::from_le_bytes(seg[at + 36..at + 40].try_into().unwrap_or_default());
            if u64::from(blcksz) != XLOG_BLCKSZ {
                return Err(format!("the WAL block size is {blcksz}, not {XLOG_BLCKSZ}"));
            }
            Ok(LONG_PAGE_HEADER)
        } else {
            Ok(SHORT_PAGE_HEADER)
        }
    }

    /// Appends `n` bytes of records from `pos` to `out`, skipping page headers; returns the
    /// position after them.
    fn read(
        &mut self,
        mut pos: u64,
        mut n: usize,
        out: &mut Vec<u8>,
    ) -> std::result::Result<u64, Why> {
        while n > 0 {
            if pos.is_multiple_of(XLOG_BLCKSZ) {
                pos += self.page_header(pos)?;
            }
            let page_end = (pos / XLOG_BLCKSZ + 1) * XLOG_BLCKSZ;
            let take = ((page_end - pos) as usize).min(n);
            let seg_size = self.seg_size;
            let seg = self.segment(pos)?;
            let at = (pos % seg_size) as usize;
            out.extend_from_slice(&seg[at..at + take]);
            pos += take as u64;
            n -= take;
        }
        Ok(pos)
    }
}

/// The blocks WAL changed from `from` (a record boundary: a backup's start LSN, the redo
/// point of its checkpoint) up to `to`, read from the WAL segments of `seg_size` bytes that
/// `fetch` gives whole by segment number (None: it cannot be had); `tablespace_dir` names
/// files in tablespaces (as [`crate::pg::session::ServerInfo::tablespace_dir`]).
/// `Ok(Err(reason))` when the WAL cannot tell (see the module's doc); also returns the
/// segments read.
///
/// Errors: none of its own; the closure's errors count as "cannot tell".
pub fn scan(
    fetch: impl FnMut(u64) -> Result<Option<Vec<u8>>>,
    seg_size: u64,
    from: Lsn,
    to: Lsn,
    tablespace_dir: &str,
) -> (std::result::Result<SummarizedChanges, Why>, u64) {
    let mut s = Scan::new(from);
    match s.run(fetch, seg_size, to, tablespace_dir) {
        Ok(()) => (Ok(s.changes), s.segments),
        Err(why) => (Err(why), s.segments),
    }
}

/// A scan that may read its WAL from more than one place: [`Scan::run`] stops at the first
/// record its segments do not hold (a segment missing there, or its bytes end: zeros, a
/// recycled file's old pages, a record that is not the one after the last) and keeps what
/// it listed up to that record's start ([`Scan::at`]); a later `run` with other segments
/// (the primary's, after the target's own) goes on from there.
///
/// Why the join is exact: every record read starts where the one before it ended and names
/// that one's start (`xl_prev`, checked) under a CRC that holds, on pages whose headers name
/// their own address, so the records listed are one unbroken run of this timeline's WAL,
/// whichever segments held them; one timeline's WAL is the same on every server that has it.
#[derive(Debug, Default)]
pub struct Scan {
    /// The blocks listed so far.
    pub changes: SummarizedChanges,
    /// The start of the next record to read.
    pos: u64,
    /// The start of the record before it (unknown at the scan's start).
    prev: Option<u64>,
    /// Segments read, by every run.
    pub segments: u64,
}

impl Scan {
    /// A scan from `from` (a record boundary).
    pub fn new(from: Lsn) -> Self {
        Scan {
            pos: from.0,
            ..Scan::default()
        }
    }

    /// Where the next record starts: `to` once a run has reached it.
    pub fn at(&self) -> Lsn {
        Lsn(self.pos)
    }

    /// Lists the blocks of the records from [`Scan::at`] up to `to`, in the segments of
    /// `seg_size` bytes `fetch` gives; `tablespace_dir` as [`scan`]'s. Err says where and
    /// why it stopped; what it listed before stays.
    pub fn run(
        &mut self,
        fetch: impl FnMut(u64) -> Result<Option<Vec<u8>>>,
        seg_size: u64,
        to: Lsn,
        tablespace_dir: &str,
    ) -> std::result::Result<(), Why> {
        let mut w = WalStream::new(fetch, seg_size);
        let r = self.stream(&mut w, to, tablespace_dir);
        self.segments += w.segments;
        r
    }

    fn stream<F: FnMut(u64) -> Result<Option<Vec<u8>>>>(
        &mut self,
        w: &mut WalStream<F>,
        to: Lsn,
        tablespace_dir: &str,
    ) -> std::result::Result<(), Why> {
        let mut rec = Vec::with_capacity(64 << 10);
        while self.pos < to.0 {
            let mut pos = self.pos;
            if pos.is_multiple_of(XLOG_BLCKSZ) {
                pos += w.page_header(pos)?;
                if pos >= to.0 {
                    // `to` is the first record of this page.
                    self.pos = pos;
                    break;
                }
            }
            let start = pos;
            rec.clear();
            let after_header = w.read(pos, RECORD_HEADER, &mut rec)?;
            let tot_len = u32::from_le_bytes(rec[0..4].try_into().unwrap_or_default()) as usize;
            // A record that starts before `to` ends before it (`to` is a record's start); a
            // length far past it is not a record.
            if tot_len < RECORD_HEADER || tot_len as u64 > to.0.saturating_sub(start) + (64 << 20) {
                return Err(format!(
                    "no valid WAL record at {} (the WAL ends before {to})",
                    Lsn(start)
                ));
            }
            let end = w.read(after_header, tot_len - RECORD_HEADER, &mut rec)?;
            if !crc_holds(&rec) {
                return Err(format!(
                    "the WAL record at {} fails its CRC (the WAL ends before {to})",
                    Lsn(start)
                ));
            }
            let xl_prev = u64::from_le_bytes(rec[8..16].try_into().unwrap_or_default());
            if self.prev.is_some_and(|p| p != xl_prev) {
                return Err(format!(
                    "the WAL record at {} follows {}, not the record before it (the WAL ends before {to})",
                    Lsn(start),
                    Lsn(xl_prev)
                ));
            }
            let (info, rmid) = (rec[16], rec[17]);
            decode(&rec, rmid, info, tablespace_dir, &mut self.changes)
                .map_err(|why| format!("the WAL record at {}: {why}", Lsn(start)))?;
            self.prev = Some(start);
            self.pos = if rmid == RM_XLOG_ID && info & 0xF0 == XLOG_SWITCH {
                // The rest of the segment is unused.
                (end / w.seg_size + 1) * w.seg_size
            } else {
                end.div_ceil(8) * 8
            };
        }
        Ok(())
    }
}

/// The bytes of segment `segno` (of `seg_size` bytes) that a scan from `from` to `to` reads:
/// from the page holding `from` (in its segment) to the end of the page holding `to` (in
/// its segment), the whole segment in between. A record that starts before `to` ends
/// before it, so nothing past that page is read; a source can send just these bytes and
/// [`padded`] make the segment whole.
pub fn segment_part(segno: u64, seg_size: u64, from: Lsn, to: Lsn) -> std::ops::Range<u64> {
    let lo = if from.0 / seg_size == segno {
        from.0 % seg_size / XLOG_BLCKSZ * XLOG_BLCKSZ
    } else {
        0
    };
    let hi = if to.0 / seg_size == segno {
        ((to.0 % seg_size / XLOG_BLCKSZ + 1) * XLOG_BLCKSZ).min(seg_size)
    } else {
        seg_size
    };
    lo..hi.max(lo)
}

/// A segment of `seg_size` bytes holding `bytes` (its [`segment_part`] `part`) in place,
/// zeros elsewhere (bytes the scan does not read). Bytes past `part` are dropped.
pub fn padded(bytes: &[u8], part: std::ops::Range<u64>, seg_size: u64) -> Vec<u8> {
    let mut seg = vec![0u8; seg_size as usize];
    let n = bytes.len().min((part.end - part.start) as usize);
    let at = part.start as usize;
    seg[at..at + n].copy_from_slice(&bytes[..n]);
    seg
}

/// What a data directory's own WAL holds at an LSN ([`record_at`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalAt {
    /// A record whose CRC holds starts there: the WAL goes on.
    Record,
    /// The segment is there, its page is where it should be, and no record starts there:
    /// the WAL ends before.
    End,
    /// It cannot be told (the segment missing, unreadable, of another size, a page that is
    /// not where it should be, an overwritten record): the reason.
    Unknown(String),
}

/// What the WAL segments of `seg_size` bytes that `fetch` gives by segment number hold at
/// `at` (a record boundary, such as a timeline's switch point): see [`WalAt`]. Bytes that
/// are no record (zeros, or the tail of a recycled file) are the end; a record that an old
/// recycled file happens to hold there reads as [`WalAt::Record`] (the caller errs toward
/// "the WAL goes on").
pub fn record_at(
    fetch: impl FnMut(u64) -> Result<Option<Vec<u8>>>,
    seg_size: u64,
    at: Lsn,
) -> WalAt {
    let mut w = WalStream::new(fetch, seg_size);
    let mut pos = at.0;
    // The page holding `at` must be this WAL's page, whether `at` starts it or not.
    let page = pos / XLOG_BLCKSZ * XLOG_BLCKSZ;
    match w.page_header(page) {
        Ok(n) if pos == page => pos += n,
        Ok(n) if pos < page + n => {
            return WalAt::Unknown(format!("{} lies inside a page header", Lsn(pos)))
        }
        Ok(_) => {}
        Err(why) => return ended(why),
    }
    let mut rec = Vec::with_capacity(RECORD_HEADER);
    let after_header = match w.read(pos, RECORD_HEADER, &mut rec) {
        Ok(p) => p,
        Err(why) => return ended(why),
    };
    let tot_len = u32::from_le_bytes(rec[0..4].try_into().unwrap_or_default()) as usize;
    // XLogRecordMaxSize (xlogrecord.h): 1020 MiB.
    if !(RECORD_HEADER..=1020 << 20).contains(&tot_len) {
        return WalAt::End;
    }
    if let Err(why) = w.read(after_header, tot_len - RECORD_HEADER, &mut rec) {
        return ended(why);
    }
    if crc_holds(&rec) {
        WalAt::Record
    } else {
        WalAt::End
    }
}

/// A would-be record that runs into a page which is not this WAL's (a recycled file's old
/// page: [`WalStream::page_header`]'s "holds page") is no record; any other failure (a
/// missing or unreadable segment) cannot tell.
fn ended(why: Why) -> WalAt {
    if why.contains(RECYCLED) {
        WalAt::End
    } else {
        WalAt::Unknown(why)
    }
}

/// The words of [`WalStream::page_header`]'s refusal of a page at another address.
const RECYCLED: &str = "(a recycled or missing segment)";

/// Whether a whole record's CRC-32C (`xl_crc`, at 20) matches: it covers the record after
/// its header, then the header up to `xl_crc`.
fn crc_holds(rec: &[u8]) -> bool {
    let crc = u32::from_le_bytes(rec[20..24].try_into().unwrap_or_default());
    let c = crc32c::crc32c_append(crc32c::crc32c(&rec[RECORD_HEADER..]), &rec[..20]);
    c == crc
}

/// Little-endian readers over a record.
fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// A relation: (tablespace, database, relfilenumber).
type Locator = (u32, u32, u32);

fn locator_at(b: &[u8], at: usize) -> Option<Locator> {
    Some((u32_at(b, at)?, u32_at(b, at + 4)?, u32_at(b, at + 8)?))
}

/// Adds what one record changed to `out`.
fn decode(
    rec: &[u8],
    rmid: u8,
    info: u8,
    tsdir: &str,
    out: &mut SummarizedChanges,
) -> std::result::Result<(), Why> {
    let short = || "record shorter than its headers say".to_string();
    let mut at = RECORD_HEADER;
    let mut datatotal: usize = 0;
    let mut main_len: usize = 0;
    let mut rel: Option<Locator> = None;
    while rec.len() > at + datatotal {
        let id = *rec.get(at).ok_or_else(short)?;
        at += 1;
        match id {
            XLR_BLOCK_ID_DATA_SHORT => {
                main_len = *rec.get(at).ok_or_else(short)? as usize;
                at += 1;
                datatotal += main_len;
                break;
            }
            XLR_BLOCK_ID_DATA_LONG => {
                main_len = u32_at(rec, at).ok_or_else(short)? as usize;
                at += 4;
                datatotal += main_len;
                break;
            }
            XLR_BLOCK_ID_ORIGIN => at += 2,
            XLR_BLOCK_ID_TOPLEVEL_XID => at += 4,
            id if id <= XLR_MAX_BLOCK_ID => {
                let fork_flags = *rec.get(at).ok_or_else(short)?;
                let data_len = u16_at(rec, at + 1).ok_or_else(short)? as usize;
                at += 3;
                datatotal += data_len;
                if fork_flags & BKPBLOCK_HAS_IMAGE != 0 {
                    let bimg_len = u16_at(rec, at).ok_or_else(short)? as usize;
                    let bimg_info = *rec.get(at + 4).ok_or_else(short)?;
                    at += 5;
                    if bimg_info & BKPIMAGE_COMPRESSED != 0 && bimg_info & BKPIMAGE_HAS_HOLE != 0 {
                        at += 2;
                    }
                    datatotal += bimg_len;
                }
                if fork_flags & BKPBLOCK_SAME_REL == 0 {
                    rel = Some(locator_at(rec, at).ok_or_else(short)?);
                    at += 12;
                }
                let r = rel.ok_or("a block refers to the previous relation, but there is none")?;
                let block = u32_at(rec, at).ok_or_else(short)?;
                at += 4;
                let fork = fork_flags & BKPBLOCK_FORK_MASK;
                if fork == MAIN_FORKNUM {
                    out.add_block(r, block, tsdir);
                }
            }
            other => return Err(format!("unknown block id {other}")),
        }
    }
    if at + datatotal != rec.len() {
        return Err(format!(
            "headers and data make {} bytes, the record {}",
            at + datatotal,
            rec.len()
        ));
    }
    let main = &rec[rec.len() - main_len..];
    let op = info & 0xF0;
    // xl_parameter_change: five ints, then wal_level (0: minimal).
    if rmid == RM_XLOG_ID && op == XLOG_PARAMETER_CHANGE && u32_at(main, 20).ok_or_else(short)? == 0
    {
        return Err("wal_level was set to minimal".into());
    }
    match rmid {
        RM_SMGR_ID if op == XLOG_SMGR_CREATE => {
            // xl_smgr_create: the relation, then the fork.
            let r = locator_at(main, 0).ok_or_else(short)?;
            let fork = u32_at(main, 12).ok_or_else(short)?;
            if fork == u32::from(MAIN_FORKNUM) {
                out.add_limit(r, 0, tsdir);
            }
        }
        RM_SMGR_ID if op == XLOG_SMGR_TRUNCATE => {
            // xl_smgr_truncate: block number, relation, flags.
            let blkno = u32_at(main, 0).ok_or_else(short)?;
            let r = locator_at(main, 4).ok_or_else(short)?;
            let flags = u32_at(main, 16).ok_or_else(short)?;
            if flags & SMGR_TRUNCATE_HEAP != 0 {
                out.add_limit(r, blkno, tsdir);
            }
        }
        RM_DBASE_ID if op == XLOG_DBASE_CREATE_FILE_COPY || op == XLOG_DBASE_CREATE_WAL_LOG => {
            // db_id, tablespace_id first in both.
            let db = u32_at(main, 0).ok_or_else(short)?;
            let spc = u32_at(main, 4).ok_or_else(short)?;
            out.add_database(spc, db);
        }
        RM_DBASE_ID if op == XLOG_DBASE_DROP => {
            // db_id, ntablespaces, tablespace_ids[].
            let db = u32_at(main, 0).ok_or_else(short)?;
            let n = u32_at(main, 4).ok_or_else(short)? as usize;
            for i in 0..n {
                out.add_database(u32_at(main, 8 + 4 * i).ok_or_else(short)?, db);
            }
        }
        RM_XACT_ID => {
            let x = info & XLOG_XACT_OPMASK;
            if matches!(
                x,
                XLOG_XACT_COMMIT
                    | XLOG_XACT_ABORT
                    | XLOG_XACT_COMMIT_PREPARED
                    | XLOG_XACT_ABORT_PREPARED
            ) {
                for r in dropped_relations(main, info).ok_or_else(short)? {
                    out.add_limit(r, 0, tsdir);
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// The relations a commit or abort record drops (PostgreSQL `ParseCommitRecord`,
/// `ParseAbortRecord`: xact_time, then with `XLOG_XACT_HAS_INFO` the xinfo word and, in
/// this order, database info, subtransactions and relations).
fn dropped_relations(main: &[u8], info: u8) -> Option<Vec<Locator>> {
    let mut at = 8;
    if info & XLOG_XACT_HAS_INFO == 0 {
        return Some(Vec::new());
    }
    let xinfo = u32_at(main, at)?;
    at += 4;
    if xinfo & XACT_XINFO_HAS_DBINFO != 0 {
        at += 8;
    }
    if xinfo & XACT_XINFO_HAS_SUBXACTS != 0 {
        let n = u32_at(main, at)? as usize;
        at += 4 + 4 * n;
    }
    let mut out = Vec::new();
    if xinfo & XACT_XINFO_HAS_RELFILELOCATORS != 0 {
        let n = u32_at(main, at)? as usize;
        at += 4;
        for i in 0..n {
            out.push(locator_at(main, at + 12 * i)?);
        }
    }
    Some(out)
}
