//! Where `archive-stream` ([`super`]) takes the stream up after a restart: what the
//! repositories hold, never what a process only had in memory.
use super::super::push::Archiver;
use crate::error::Result;
use crate::pg::lsn::{self, Lsn};
use crate::repo::wal::{self, WalFile, WalFileKind};
use crate::repo::{wal_tail, Stanza};

/// Where the stream resumes: a timeline, the next byte, and the bytes of its segment before
/// that byte (the stored tail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    pub timeline: u32,
    pub lsn: Lsn,
    pub prefix: Vec<u8>,
}

/// Where one repository's archive ends for the stream: the highest timeline that has
/// segments or a tail, after its last archived segment (and that segment's tail when the
/// tail is of the next segment). None for an archive with neither.
///
/// Errors: the store's; a damaged tail chunk.
pub fn resume_point(st: &Stanza, seg_size: u64) -> Result<Option<Resume>> {
    let mut tlis = wal::timelines(st)?;
    tlis.reverse();
    for tli in tlis {
        // The newest log directory with a segment or a tail decides: everything in the
        // older ones comes before it. One listing each, newest first (a restart costs a few
        // requests, not a walk over the whole archive).
        let mut logs = wal::log_dirs(st, tli)?;
        logs.reverse();
        for log in logs {
            let (mut last_seg, mut last_tail) = (None, None);
            for n in wal::list_log_dir(st, tli, &log)? {
                if let Some(seg) = wal_tail::tail_segment(&n) {
                    let segno = lsn::parse_wal_segment_name(seg, seg_size).map(|(_, s)| s);
                    last_tail = last_tail.max(segno);
                } else if WalFile::parse(&n).is_ok_and(|f| f.kind == WalFileKind::Segment) {
                    let segno = lsn::parse_wal_segment_name(&n, seg_size).map(|(_, s)| s);
                    last_seg = last_seg.max(segno);
                }
            }
            let next = last_seg.map(|s| s + 1);
            // A tail of the segment after the last archived one (or beyond a gap) ends it
            // there; otherwise the archive ends with its last segment.
            if let Some(t) = last_tail.filter(|t| next.is_none_or(|n| *t >= n)) {
                let name = lsn::wal_segment_name(tli, t, seg_size);
                let prefix = wal_tail::read_tail(st, &name)?.unwrap_or_default();
                return Ok(Some(Resume {
                    timeline: tli,
                    lsn: Lsn(t * seg_size + prefix.len() as u64),
                    prefix,
                }));
            }
            if let Some(n) = next {
                return Ok(Some(Resume {
                    timeline: tli,
                    lsn: Lsn(n * seg_size),
                    prefix: Vec::new(),
                }));
            }
        }
    }
    Ok(None)
}

/// The lowest [`resume_point`] over the repositories that have one (each must get every
/// byte it lacks; a repository with nothing yet gets the stream from there on). None when
/// none has any: the stream then starts where the server's slot, or position, says.
pub(super) fn resume_all(a: &Archiver, seg_size: u64) -> Result<Option<Resume>> {
    let mut lowest: Option<Resume> = None;
    for st in a.repos() {
        if let Some(r) = resume_point(st, seg_size)? {
            if lowest
                .as_ref()
                .is_none_or(|l| (r.timeline, r.lsn) < (l.timeline, l.lsn))
            {
                lowest = Some(r);
            }
        }
    }
    Ok(lowest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{CompressType, Compression, Compressor};
    use crate::repo::sink::tests::memory;

    const SEG: u64 = 16 << 20;

    /// An archived segment as a listing shows it (the receiver never reads its bytes).
    fn archived(st: &Stanza, name: &str) {
        let object = format!("s/archive/{}/{}/{name}", &name[..8], &name[8..16]);
        st.store().put(&object, b"x").unwrap();
    }

    fn tail(st: &Stanza, name: &str, bytes: &[u8]) {
        let c = Compression::new(CompressType::Lz4, None).unwrap();
        let mut z = Compressor::new(c).unwrap();
        wal_tail::store_chunk(st, name, 0, bytes, c, &mut z, 7).unwrap();
    }

    /// The archive ends after its newest segment, or at the end of a tail past it, on the
    /// newest timeline, whichever log directory they are in; a tail left behind by a
    /// segment archived since does not count.
    #[test]
    fn the_stream_resumes_where_the_newest_log_directory_ends() {
        let st = Stanza::new(1, memory(), "s");
        assert_eq!(resume_point(&st, SEG).unwrap(), None);

        archived(&st, "0000000100000000000000FE");
        archived(&st, "0000000100000000000000FF");
        archived(&st, "000000010000000100000000");
        let at = |segno: u64, prefix: &[u8]| Resume {
            timeline: 1,
            lsn: Lsn(segno * SEG + prefix.len() as u64),
            prefix: prefix.to_vec(),
        };
        assert_eq!(resume_point(&st, SEG).unwrap(), Some(at(0x101, &[])));

        // The tail of a segment archived since is passed over.
        tail(&st, "000000010000000100000000", &[1u8; 512]);
        assert_eq!(resume_point(&st, SEG).unwrap(), Some(at(0x101, &[])));

        // A tail in a newer log directory, with no segment there: the stream goes on from it.
        tail(&st, "000000010000000200000000", &[2u8; 1000]);
        assert_eq!(
            resume_point(&st, SEG).unwrap(),
            Some(at(0x200, &[2u8; 1000]))
        );

        // A newer timeline decides, even with less WAL.
        archived(&st, "000000020000000000000003");
        let r = resume_point(&st, SEG).unwrap().unwrap();
        assert_eq!((r.timeline, r.lsn), (2, Lsn(4 * SEG)));
    }
}
