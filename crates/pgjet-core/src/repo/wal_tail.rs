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
    loop {
        let at = out.len() as u64;
        let Some(&(start, end)) = chunks
            .iter()
            .filter(|(s, e)| *s <= at && *e > at)
            .max_by_key(|(_, e)| *e)
        else {
            break;
        };
        let object = format!("{dir}/{start:08X}-{end:08X}");
        let (_, bytes) = wal::decode(
            &object,
            &chunk_file(segment, start, end),
            &st.store().get(&object)?,
        )?;
        out.extend_from_slice(&bytes[(at - start) as usize..]);
    }
    Ok((!out.is_empty()).then_some(out))
}

/// The segments of timeline `tli` that have a stored tail, sorted.
///
/// Errors: the store's.
pub fn tails(st: &Stanza, tli: u32) -> Result<Vec<String>> {
    let dir = format!("{}/archive/{tli:08X}", st.name());
    let mut out = Vec::new();
    for log in st.store().list(&dir)? {
        let log = log?;
        if log.len() != 8 || log.contains('.') {
            continue;
        }
        for n in st.store().list(&format!("{dir}/{log}"))? {
            let n = n?;
            let n = n.trim_end_matches('/');
            if let Some(seg) = n.strip_suffix(".stream") {
                if crate::pg::lsn::is_wal_segment_name(seg) {
                    out.push(seg.to_string());
                }
            }
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
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
}
