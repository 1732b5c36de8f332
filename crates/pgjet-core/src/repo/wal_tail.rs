//! The tail of the WAL stream: the part of the segment in progress that `archive-stream` has
//! received and made durable before the segment is complete. Stored as chunks, each one
//! object holding a range of the segment's bytes, so that keeping the tail durable costs one
//! small write per flush rather than rewriting the segment:
//!
//! ```text
//! <stanza>/archive/<TLI>/<LOG>/<segment>.stream/<start>-<end>   bytes [start, end) of <segment>
//! ```
//!
//! `<start>` and `<end>` are offsets in the segment, 8 hex digits (a segment is at most
//! 1 GiB). A chunk is encoded as an archived WAL file is ([`super::wal::encode`]: header line
//! and one compressed frame, checksummed), its header naming `<segment>.stream/<start>-<end>`.
//! Chunks are created only if absent, never replaced. Once the complete segment is archived,
//! its tail is removed. The tail is never listed as an archived file
//! ([`super::wal::list_timeline`] skips the `.stream` names): `archive-get` reads it only
//! when the complete segment is missing (the end of the WAL, after the primary was lost).
use super::wal::{self, WalFile, WalFileKind};
use super::Stanza;
use crate::codec::{Compression, Compressor};
use crate::error::{Error, Result};

/// Chunks merged at each level: every [`MERGE`]th chunk of a segment's tail covers the
/// ranges of the [`MERGE`] - 1 before it too, every [`MERGE`]²th the [`MERGE`]² - 1 before it,
/// and so on. A reader that takes the chunk reaching furthest at each offset
/// ([`read_tail`]) then reads at most `MERGE - 1` chunks per level
/// (about 60 for the 8,000 chunks a segment gets from commits made one at a time in
/// synchronous mode), where without merging it read one chunk per flush. Each byte is
/// written once more per level it is merged at.
pub const MERGE: usize = 16;

/// Where the `k`th chunk (1-based) of a tail starts when `starts[i]` is where the `(i+1)`th
/// chunk's own bytes start: its own start, or that of the first chunk it merges (the
/// largest power of [`MERGE`] dividing `k` says how many).
pub fn merged_start(starts: &[usize], k: usize) -> usize {
    let mut span = 1;
    while k.is_multiple_of(span * MERGE) {
        span *= MERGE;
    }
    starts[k - span]
}

/// The directory of the tail chunks of `segment` (a segment's [`WalFile`]).
fn tail_dir(st: &Stanza, segment: &WalFile) -> String {
    format!("{}.stream", segment.object_name(st.name()))
}

/// The name a chunk's header carries: `<segment>.stream/<start>-<end>`.
fn chunk_file(segment: &str, start: u64, end: u64) -> String {
    format!("{segment}.stream/{start:08X}-{end:08X}")
}

/// Parses a chunk's object name `<start>-<end>` into its offsets.
fn parse_chunk(name: &str) -> Option<(u64, u64)> {
    let (a, b) = name.split_once('-')?;
    if a.len() != 8 || b.len() != 8 {
        return None;
    }
    let (start, end) = (
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    );
    (start < end).then_some((start, end))
}

/// The segment's file, checked to be a segment name.
fn segment_file(segment: &str) -> Result<WalFile> {
    let f = WalFile::parse(segment)?;
    if f.kind != WalFileKind::Segment {
        return Err(Error::Other(format!("{segment} is not a WAL segment name")));
    }
    Ok(f)
}

/// Stores bytes [`start`, `start + data.len()`) of segment `segment` as one tail chunk,
/// durable when it returns. A chunk of the same range stored before (a restart that
/// received the same bytes again) is compared and kept.
///
/// Errors: [`Error::Repo`] when a chunk of that range holds other bytes; the store's.
pub fn store_chunk(
    st: &Stanza,
    segment: &str,
    start: u64,
    data: &[u8],
    compression: Compression,
    compressor: &mut Compressor,
    system_identifier: u64,
) -> Result<()> {
    let file = segment_file(segment)?;
    let end = start + data.len() as u64;
    let name = chunk_file(segment, start, end);
    let object = format!("{}/{start:08X}-{end:08X}", tail_dir(st, &file));
    let encoded = wal::encode(&name, data, compression, compressor, system_identifier)?;
    if st.store().create_new(&object, &encoded)? {
        return Ok(());
    }
    let (_, have) = wal::decode(&object, &name, &st.store().get(&object)?)?;
    if have == data {
        return Ok(());
    }
    Err(Error::Repo(format!(
        "the stream's tail chunk {name} is already in {} with other bytes; it is kept. Two receivers may be streaming into one stanza",
        st.store().describe()
    )))
}

/// The durable tail of segment `segment`: its bytes from offset 0 as far as the chunks
/// cover them without a gap (at each offset, the chunk that reaches furthest), each chunk
/// checked whole. None when there is no chunk at offset 0.
///
/// Errors: [`Error::CorruptWal`] for a chunk that does not read back as stored; the store's.
pub fn read_tail(st: &Stanza, segment: &str) -> Result<Option<Vec<u8>>> {
    let file = segment_file(segment)?;
    let dir = tail_dir(st, &file);
    let mut chunks: Vec<(u64, u64)> = Vec::new();
    for n in st.store().list(&dir)? {
        if let Some(c) = parse_chunk(&n?) {
            chunks.push(c);
        }
    }
    chunks.sort_unstable();
    let mut out: Vec<u8> = Vec::new();
    // One pass over the chunks sorted by start: at each offset, the chunk that reaches
    // furthest among those starting at or before it. A chunk passed over ends at or before
    // the one taken, so it never reaches further later.
    let mut next = chunks.iter().peekable();
    loop {
        let at = out.len() as u64;
        let mut best: Option<(u64, u64)> = None;
        while let Some(&&(start, end)) = next.peek().filter(|c| c.0 <= at) {
            if end > at && best.is_none_or(|(_, e)| end > e) {
                best = Some((start, end));
            }
            next.next();
        }
        let Some((start, end)) = best else {
            break;
        };
        let object = format!("{dir}/{start:08X}-{end:08X}");
        let (_, bytes) = wal::decode(
            &object,
            &chunk_file(segment, start, end),
            &st.store().get(&object)?,
        )?;
        if bytes.len() as u64 != end - start {
            return Err(Error::CorruptWal {
                name: object,
                reason: format!(
                    "it holds {} bytes for a range of {}",
                    bytes.len(),
                    end - start
                ),
            });
        }
        out.extend_from_slice(&bytes[(at - start) as usize..]);
    }
    Ok((!out.is_empty()).then_some(out))
}

/// The segments of timeline `tli` that have a stored tail, sorted.
///
/// Errors: the store's.
pub fn tails(st: &Stanza, tli: u32) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for log in wal::log_dirs(st, tli)? {
        out.extend(
            wal::list_log_dir(st, tli, &log)?
                .iter()
                .filter_map(|n| tail_segment(n))
                .map(str::to_string),
        );
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The segment whose tail directory an entry of a log directory is (`<segment>.stream`).
pub fn tail_segment(entry: &str) -> Option<&str> {
    entry
        .strip_suffix(".stream")
        .filter(|seg| crate::pg::lsn::is_wal_segment_name(seg))
}

/// Removes the tail of `segment` (its complete segment is archived, or retention).
///
/// Errors: the store's.
pub fn remove_tail(st: &Stanza, segment: &str) -> Result<()> {
    let file = segment_file(segment)?;
    st.store().remove_all(&tail_dir(st, &file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::CompressType;
    use crate::repo::sink::tests::memory;

    const SEG: &str = "000000010000000000000003";

    fn chunk(st: &Stanza, start: u64, data: &[u8]) -> Result<()> {
        let c = Compression::new(CompressType::Zstd, None).unwrap();
        let mut z = Compressor::new(c).unwrap();
        store_chunk(st, SEG, start, data, c, &mut z, 7)
    }

    /// Chunks read back as the bytes they cover from offset 0, the longest at each offset
    /// winning, up to the first gap; the same chunk stored twice is kept, other bytes for
    /// its range are refused; removed, nothing is left.
    #[test]
    fn the_tail_reads_back_as_far_as_its_chunks_reach() {
        let st = Stanza::new(1, memory(), "s");
        let bytes: Vec<u8> = (0..30_000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(read_tail(&st, SEG).unwrap(), None);
        chunk(&st, 0, &bytes[..1000]).unwrap();
        chunk(&st, 1000, &bytes[1000..5000]).unwrap();
        // A restart received [1000, 8000) again, and more.
        chunk(&st, 1000, &bytes[1000..8000]).unwrap();
        chunk(&st, 8000, &bytes[8000..9000]).unwrap();
        // Past a gap: not part of the tail.
        chunk(&st, 20_000, &bytes[20_000..30_000]).unwrap();
        assert_eq!(read_tail(&st, SEG).unwrap().unwrap(), &bytes[..9000]);
        assert_eq!(tails(&st, 1).unwrap(), vec![SEG.to_string()]);
        assert!(tails(&st, 2).unwrap().is_empty());

        chunk(&st, 8000, &bytes[8000..9000]).unwrap();
        let e = chunk(&st, 8000, &bytes[9000..10_000]).unwrap_err();
        assert!(e.to_string().contains("other bytes"), "{e}");

        // The tail is not an archived file.
        assert!(wal::list_timeline(&st, 1).unwrap().is_empty());

        remove_tail(&st, SEG).unwrap();
        assert_eq!(read_tail(&st, SEG).unwrap(), None);
        assert!(tails(&st, 1).unwrap().is_empty());
    }

    /// A chunk whose bytes do not fill the range its name gives is refused as corrupt,
    /// not read past its end.
    #[test]
    fn a_chunk_shorter_than_its_range_is_corrupt() {
        let st = Stanza::new(1, memory(), "s");
        let c = Compression::new(CompressType::Zstd, None).unwrap();
        let mut z = Compressor::new(c).unwrap();
        let name = chunk_file(SEG, 0, 16);
        let encoded = wal::encode(&name, &[7u8; 8], c, &mut z, 7).unwrap();
        let object = format!(
            "{}/00000000-00000010",
            tail_dir(&st, &segment_file(SEG).unwrap())
        );
        assert!(st.store().create_new(&object, &encoded).unwrap());
        let e = read_tail(&st, SEG).unwrap_err();
        assert!(e.to_string().contains("8 bytes for a range of 16"), "{e}");
    }

    /// A tail of many small chunks merged at levels (as the receiver writes them) reads back
    /// whole, taking one chunk per merged range.
    #[test]
    fn merged_chunks_read_back_in_few_gets() {
        let st = Stanza::new(1, memory(), "s");
        let bytes: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 253) as u8).collect();
        let mut starts = Vec::new();
        for k in 1..=300usize {
            starts.push((k - 1) * 100);
            let from = merged_start(&starts, k);
            chunk(&st, from as u64, &bytes[from..k * 100]).unwrap();
        }
        let mut chunks: Vec<(u64, u64)> = st
            .store()
            .list(&tail_dir(&st, &WalFile::parse(SEG).unwrap()))
            .unwrap()
            .map(|n| parse_chunk(&n.unwrap()).unwrap())
            .collect();
        chunks.sort_unstable();
        // The 256th chunk covers [0, 25600), the 272nd [25600, 27200), the 288th [27200, 28800).
        assert!(chunks.contains(&(0, 25_600)));
        assert!(chunks.contains(&(25_600, 27_200)));
        assert!(chunks.contains(&(27_200, 28_800)));
        assert_eq!(read_tail(&st, SEG).unwrap().unwrap(), &bytes[..30_000]);
    }
}
