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

/// Reads the system identifier from `<pgdata>/global/pg_control` (the first 8 bytes of
/// ControlFileData, src/include/catalog/pg_control.h), after checking the file's CRC; a read
/// that races with the server's rewrite is tried again, up to [`READ_ATTEMPTS`] times.
///
/// Errors: the file cannot be read ([`Error::Io`]), or its CRC never matches
/// ([`Error::Unsafe`]: a damaged control file proves nothing about the directory).
pub fn read_system_identifier(pgdata: &Path) -> Result<u64> {
    let p = pgdata.join("global/pg_control");
    for attempt in 0..READ_ATTEMPTS {
        let bytes = std::fs::read(&p).map_err(|e| Error::io("read", &p, e))?;
        if crc_is_valid(&bytes) {
            if let Some(first) = bytes.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
                return Ok(u64::from_le_bytes(first));
            }
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
