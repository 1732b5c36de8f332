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
        let last_seg = wal::list_timeline(st, tli)?
            .iter()
            .filter(|n| WalFile::parse(n).is_ok_and(|f| f.kind == WalFileKind::Segment))
            .filter_map(|n| lsn::parse_wal_segment_name(n, seg_size).map(|(_, s)| s))
            .max();
        let last_tail = wal_tail::tails(st, tli)?
            .iter()
            .filter_map(|n| lsn::parse_wal_segment_name(n, seg_size).map(|(_, s)| s))
            .max();
        let next = last_seg.map(|s| s + 1);
        // A tail of the segment after the last archived one (or beyond a gap) ends it there;
        // otherwise the archive ends with its last segment.
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
