//! The control file, global/pg_control (src/include/catalog/pg_control.h).
//!
//! PostgreSQL stores a CRC32C of ControlFileData up to its `crc` field in that field
//! (src/common/controldata_utils.c: `COMP_CRC32C(crc, ControlFile, offsetof(ControlFileData,
//! crc))`). The field's offset differs between major versions, so [`crc_is_valid`] looks
//! for the one 4-byte-aligned position where the stored value matches the CRC of the bytes
//! before it. A torn read (the server rewriting the file while it is read) matches nowhere.

use crate::error::{Error, Result};
use std::path::Path;

/// Size of the pg_control file on disk, bytes (PG_CONTROL_FILE_SIZE).
pub const PG_CONTROL_FILE_SIZE: usize = 8192;
/// Upper bound searched for the `crc` field; ControlFileData is about 300 bytes in 15..18.
const MAX_CRC_OFFSET: usize = 1024;
/// Reads tried before a control file whose CRC never matches is reported (see
/// `crate::transfer::source::read_control`).
pub const READ_ATTEMPTS: usize = 5;

/// True when `bytes` carries a ControlFileData whose CRC matches.
pub fn crc_is_valid(bytes: &[u8]) -> bool {
    (16..MAX_CRC_OFFSET.min(bytes.len().saturating_sub(4)))
        .step_by(4)
        .any(|n| crc32c::crc32c(&bytes[..n]).to_le_bytes() == bytes[n..n + 4])
}

/// A cluster's state as pg_control records it (`DBState`, src/include/catalog/pg_control.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbState {
    Startup,
    /// Shut down cleanly (a primary).
    ShutDown,
    /// Shut down cleanly while in recovery (a standby).
    ShutDownInRecovery,
    ShuttingDown,
    InCrashRecovery,
    InArchiveRecovery,
    /// Running, or crashed while running.
    InProduction,
    /// A value this version of pgjet does not know.
    Other(u32),
}

impl DbState {
    fn from_raw(v: u32) -> DbState {
        match v {
            0 => DbState::Startup,
            1 => DbState::ShutDown,
            2 => DbState::ShutDownInRecovery,
            3 => DbState::ShuttingDown,
            4 => DbState::InCrashRecovery,
            5 => DbState::InArchiveRecovery,
            6 => DbState::InProduction,
            o => DbState::Other(o),
        }
    }
}

/// What pgjet reads from a control file: the cluster and its latest checkpoint.
///
/// The offsets are those of `ControlFileData` in PostgreSQL 11 to 18 (pg_control.h; 11
/// removed `prevCheckPoint`): `system_identifier` u64 at 0, `catalog_version_no` u32 at 12,
/// `state` (an enum, 4 bytes) at 16, `checkPoint` at 32, and `checkPointCopy` at 40, whose `redo` is at 40 and
/// `ThisTimeLineID` at 48; after `checkPointCopy` (88 bytes: 17's `wal_level` took padding)
/// and `unloggedLSN` come `minRecoveryPoint` at 136 and `minRecoveryPointTLI` at 144. All
/// little-endian here (x86-64). The test suite compares them with pg_controldata's output on
/// every major it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlFacts {
    pub system_identifier: u64,
    /// `catalog_version_no`: the catalog version of the server that wrote it (the
    /// tablespace directories' `PG_<major>_<catalog version>`).
    pub catalog_version: u32,
    pub state: DbState,
    /// The latest checkpoint record's location.
    pub checkpoint: crate::pg::lsn::Lsn,
    /// The latest checkpoint's redo point: WAL replay of this directory would start here,
    /// and every page it holds was written by WAL before this point or is changed again
    /// after it.
    pub redo: crate::pg::lsn::Lsn,
    /// The latest checkpoint's timeline.
    pub timeline: u32,
    /// `minRecoveryPoint` and its timeline: while in recovery, no page on disk holds a
    /// change from WAL past it (xlog.c UpdateMinRecoveryPoint runs before a page is written
    /// in recovery). None when unset (0, as on a primary).
    pub min_recovery: Option<(crate::pg::lsn::Lsn, u32)>,
}

/// The [`ControlFacts`] of the bytes of a control file, when its CRC matches.
pub fn parse_control(bytes: &[u8]) -> Option<ControlFacts> {
    if !crc_is_valid(bytes) {
        return None;
    }
    let u64_at = |o: usize| Some(u64::from_le_bytes(bytes.get(o..o + 8)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(bytes.get(o..o + 4)?.try_into().ok()?));
    Some(ControlFacts {
        system_identifier: u64_at(0)?,
        catalog_version: u32_at(12)?,
        state: DbState::from_raw(u32_at(16)?),
        checkpoint: crate::pg::lsn::Lsn(u64_at(32)?),
        redo: crate::pg::lsn::Lsn(u64_at(40)?),
        timeline: u32_at(48)?,
        min_recovery: match (u64_at(136)?, u32_at(144)?) {
            (0, _) => None,
            (lsn, tli) => Some((crate::pg::lsn::Lsn(lsn), tli)),
        },
    })
}

/// The catalog version (`CATALOG_VERSION_NO`, src/include/catalog/catversion.h) of the
/// released PostgreSQL major of `version_num` (server_version_num): fixed for a major from
/// its first release on (it changes only during development). None for a major not listed;
/// a beta of a listed major may have another, which the backup's check of the copy's
/// pg_control then refuses. Compared with pg_controldata on every major the tests run
/// (`assert_control_reads_as_pg_controldata`).
pub fn released_catalog_version(version_num: u32) -> Option<u32> {
    match version_num / 10000 {
        15 => Some(202209061),
        16 => Some(202307071),
        17 => Some(202406281),
        18 => Some(202506291),
        _ => None,
    }
}

/// Reads `<pgdata>/global/pg_control` and checks its CRC; a read that races with the
/// server's rewrite is tried again, up to [`READ_ATTEMPTS`] times.
///
/// Errors: the file cannot be read ([`Error::Io`]), or its CRC never matches
/// ([`Error::Unsafe`]: a damaged control file proves nothing about the directory).
pub fn read_control(pgdata: &Path) -> Result<ControlFacts> {
    let p = pgdata.join("global/pg_control");
    for attempt in 0..READ_ATTEMPTS {
        let bytes = std::fs::read(&p).map_err(|e| Error::io("read", &p, e))?;
        if let Some(facts) = parse_control(&bytes) {
            return Ok(facts);
        }
        if attempt + 1 < READ_ATTEMPTS {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    Err(Error::Unsafe(format!(
        "{}: the control file's CRC does not match after {READ_ATTEMPTS} reads; the file is damaged",
        p.display()
    )))
}

/// Reads the system identifier from `<pgdata>/global/pg_control` (see [`read_control`]).
///
/// Errors: as [`read_control`].
pub fn read_system_identifier(pgdata: &Path) -> Result<u64> {
    read_control(pgdata).map(|c| c.system_identifier)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_crc_field() {
        let mut b = vec![0u8; PG_CONTROL_FILE_SIZE];
        for (i, x) in b.iter_mut().enumerate().take(296) {
            *x = (i * 7) as u8;
        }
        assert!(!crc_is_valid(&b));
        let crc = crc32c::crc32c(&b[..296]);
        b[296..300].copy_from_slice(&crc.to_le_bytes());
        assert!(crc_is_valid(&b));
        b[100] ^= 1;
        assert!(!crc_is_valid(&b));
        assert!(!crc_is_valid(&[1, 2, 3]));
    }
}
