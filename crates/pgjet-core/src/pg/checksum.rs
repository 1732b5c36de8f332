//! Data page layout and PostgreSQL's data page checksum.
//!
//! The checksum is the algorithm of `src/include/storage/checksum_impl.h`; the page
//! header layout is `PageHeaderData` of `src/include/storage/bufpage.h`; the rules for
//! which pages to verify during a backup follow `src/backend/backup/basebackup.c`
//! (`verify_page_checksum` / the loop in `sendFile`) and `PageIsVerified` in
//! `src/backend/storage/page/bufpage.c`.

/// Size of a data page in bytes (PostgreSQL's default `BLCKSZ`, `pg_config.h`). pgjet
/// supports only clusters built with the default block size.
pub const BLCKSZ: usize = 8192;

/// Blocks per relation segment file: a relation is split into files of
/// `RELSEG_SIZE * BLCKSZ` = 1 GiB (PostgreSQL default `RELSEG_SIZE`, `pg_config.h`).
/// The checksum block number of block `i` in segment file `n` is `n * RELSEG_SIZE + i`.
pub const RELSEG_SIZE: u32 = 131072;

/// Number of parallel FNV lanes of the checksum (`N_SUMS` in `checksum_impl.h`); part of
/// the algorithm, changing it changes every checksum.
const N_SUMS: usize = 32;

/// FNV-1a prime multiplier (`FNV_PRIME` in `checksum_impl.h`).
const FNV_PRIME: u32 = 16_777_619;

/// Initial value of each of the 32 lanes (`checksumBaseOffsets` in `checksum_impl.h`).
const BASE_OFFSETS: [u32; N_SUMS] = [
    0x5B1F36E9, 0xB8525960, 0x02AB50AA, 0x1DE66D2A, 0x79FF467A, 0x9BB9F8A3, 0x217E7CD2, 0x83E13D2C,
    0xF8D4474F, 0xE39EB970, 0x42C6AE16, 0x993216FA, 0x7B093B5D, 0x98DAFF3C, 0xF718902A, 0x0B1C9CDB,
    0xE58F764B, 0x187636BC, 0x5D7B3BB1, 0xE73DE7DE, 0x92BEC979, 0xCCA6C0B2, 0x304A0979, 0x85AA43D4,
    0x783125BB, 0x6CA8EAA2, 0xE407EAC6, 0x4B5CFC3E, 0x9FBF8C76, 0x15CA20BE, 0xF2CA9FD3, 0x959BD756,
];

/// Byte offset of `pd_checksum` (u16) in the page header: after `pd_lsn` (8 bytes).
const PD_CHECKSUM_OFFSET: usize = 8;
/// Byte offset of `pd_upper` (u16): `pd_lsn` 8, `pd_checksum` 2, `pd_flags` 2, `pd_lower` 2.
const PD_UPPER_OFFSET: usize = 14;

/// One mixing round: `tmp = sum ^ value; sum = tmp * FNV_PRIME ^ (tmp >> 17)`
/// (`CHECKSUM_COMP` in `checksum_impl.h`).
#[inline(always)]
fn comp(sum: u32, value: u32) -> u32 {
    let tmp = sum ^ value;
    tmp.wrapping_mul(FNV_PRIME) ^ (tmp >> 17)
}

#[inline(always)]
fn read_u16(page: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([page[off], page[off + 1]])
}

#[inline(always)]
fn read_u32(page: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([page[off], page[off + 1], page[off + 2], page[off + 3]])
}

/// PostgreSQL's data page checksum of `page` stored as block `blkno` of its relation
/// fork (block number counted across segment files: `segno * RELSEG_SIZE + index`).
///
/// The page is read as 64 rows of 32 little-endian u32 words; lane `j` folds column `j`
/// starting from its base offset, then two rounds of zeros; the lanes are xor-ed, xor-ed
/// with `blkno`, and reduced to `(x % 65535) + 1` so the result is never 0. The stored
/// `pd_checksum` field (bytes 8..10) is treated as zero; `page` itself is not modified.
/// Exactly `pg_checksum_page` of `src/include/storage/checksum_impl.h` on a
/// little-endian host.
///
/// `page` must be exactly [`BLCKSZ`] bytes (checked with `debug_assert!`); a shorter
/// slice panics on indexing, a longer one is checksummed over its first `BLCKSZ` bytes.
/// PostgreSQL only calls this for pages that are not new ([`page_is_new`]).
pub fn pg_checksum_page(page: &[u8], blkno: u32) -> u16 {
    debug_assert_eq!(
        page.len(),
        BLCKSZ,
        "pg_checksum_page needs a {BLCKSZ}-byte page"
    );
    let page = &page[..BLCKSZ];
    let mut sums = BASE_OFFSETS;
    for (row_index, row) in page.chunks_exact(N_SUMS * 4).enumerate() {
        for (j, sum) in sums.iter_mut().enumerate() {
            let mut value = read_u32(row, j * 4);
            // Word 2 of row 0 holds pd_checksum (low half on little-endian) and pd_flags.
            if row_index == 0 && j * 4 == PD_CHECKSUM_OFFSET {
                value &= 0xFFFF_0000;
            }
            *sum = comp(*sum, value);
        }
    }
    let mut result = 0u32;
    for sum in sums.iter_mut() {
        *sum = comp(comp(*sum, 0), 0);
        result ^= *sum;
    }
    ((result ^ blkno) % 65535 + 1) as u16
}

/// The page LSN (`pd_lsn`, bytes 0..8): `xlogid` (u32, high half) then `xrecoff` (u32,
/// low half), each little-endian; returns `(xlogid << 32) | xrecoff`. This is the end of
/// the WAL record that last changed the page. See `PageXLogRecPtr` in
/// `src/include/storage/bufpage.h`. Panics if `page` is shorter than 8 bytes.
pub fn page_lsn(page: &[u8]) -> u64 {
    (u64::from(read_u32(page, 0)) << 32) | u64::from(read_u32(page, 4))
}

/// The checksum stored in the page header (`pd_checksum`, u16 little-endian at byte 8).
/// See `PageHeaderData` in `src/include/storage/bufpage.h`. Panics if `page` is shorter
/// than 10 bytes.
pub fn page_checksum_field(page: &[u8]) -> u16 {
    read_u16(page, PD_CHECKSUM_OFFSET)
}

/// True when the page was never initialized: `pd_upper == 0` (PostgreSQL `PageIsNew`,
/// `src/include/storage/bufpage.h`). New pages carry no checksum. Panics if `page` is
/// shorter than 16 bytes.
pub fn page_is_new(page: &[u8]) -> bool {
    read_u16(page, PD_UPPER_OFFSET) == 0
}

/// True when every byte of `page` is zero (any length; word-at-a-time). An all-zero page
/// is what PostgreSQL leaves when it extends a relation (`pg_memory_is_all_zeros` in
/// `PageIsVerified`, `src/backend/storage/page/bufpage.c`); restore can write it as a
/// hole.
pub fn page_is_zero(page: &[u8]) -> bool {
    let mut chunks = page.chunks_exact(8);
    let words_zero = chunks
        .by_ref()
        .all(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) == 0);
    words_zero && chunks.remainder().iter().all(|&b| b == 0)
}

/// Outcome of checking one data page during a backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageVerdict {
    /// Not new, LSN before the backup start, stored checksum equals the computed one.
    Valid,
    /// New page (`pd_upper == 0`) that is entirely zero: no checksum to check.
    New,
    /// Page LSN is at or after the backup start LSN: it may be torn by a concurrent write
    /// and WAL replay will rewrite it, so it is not checked.
    AfterBackupStart,
    /// The stored checksum does not match. Also returned for a page with `pd_upper == 0`
    /// that is not all zeros (`computed` is then the checksum the page would need).
    Mismatch {
        /// `pd_checksum` as stored on the page.
        stored: u16,
        /// [`pg_checksum_page`] of the page.
        computed: u16,
    },
}

/// Checks one [`BLCKSZ`]-byte page read from a relation file during a backup.
/// `blkno` is the block number within the relation fork (`segno * RELSEG_SIZE + index`),
/// `backup_start_lsn` the backup's start LSN (`START WAL LOCATION`).
///
/// Order of the rules:
/// 1. `pd_upper == 0` ("new"): all zeros -> [`PageVerdict::New`]. basebackup.c skips
///    every new page, but `PageIsVerified` (what the server applies when it reads the
///    page) rejects a new page that is not all zeros, so pgjet reports it as
///    [`PageVerdict::Mismatch`].
/// 2. page LSN `>= backup_start_lsn` -> [`PageVerdict::AfterBackupStart`]
///    (basebackup.c: such a page may be half-written, WAL replay restores it).
/// 3. compare `pd_checksum` with [`pg_checksum_page`].
///
/// Like basebackup.c, a caller that gets `Mismatch` should re-read the block once and
/// check again before reporting it: the first read may have raced a concurrent write
/// (a torn 4 KiB half), which the re-read shows with a new LSN or a valid checksum.
/// Only meaningful when the cluster has data checksums enabled.
pub fn verify_page(page: &[u8], blkno: u32, backup_start_lsn: u64) -> PageVerdict {
    if page_is_new(page) {
        if page_is_zero(page) {
            return PageVerdict::New;
        }
        return PageVerdict::Mismatch {
            stored: page_checksum_field(page),
            computed: pg_checksum_page(page, blkno),
        };
    }
    if page_lsn(page) >= backup_start_lsn {
        return PageVerdict::AfterBackupStart;
    }
    let stored = page_checksum_field(page);
    let computed = pg_checksum_page(page, blkno);
    if stored == computed {
        PageVerdict::Valid
    } else {
        PageVerdict::Mismatch { stored, computed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expands a sparse page: zeros except the given (offset, hex) runs.
    fn sparse_page(runs: &[(usize, &str)]) -> Vec<u8> {
        let mut page = vec![0u8; BLCKSZ];
        for (offset, hex_run) in runs {
            let bytes = hex::decode(hex_run).unwrap();
            page[*offset..*offset + bytes.len()].copy_from_slice(&bytes);
        }
        page
    }

    /// Real pages from PostgreSQL 15.20 and 18.6 clusters (`initdb -k`), stored sparsely as
    /// (byte offset, hex of a non-zero run); all other bytes are zero. Each entry:
    /// (description, block number within the fork, runs).
    type SparsePage = (&'static str, u32, &'static [(usize, &'static str)]);
    const REAL_PAGES: &[SparsePage] = &[
        ("pg15 global/1262 block 0", 0, &[
            (4, "90277501958201003000f01d00200420000000000500010006000100f09d200100000000409f7a01809e7a01"),
            (7232, "d002"),
            (7248, "06001080032920ff9f000000000000000400000074656d706c61746530"),
            (7332, concat!(
                "0a0000000600000063010000ffffffffcc020000010000007f06000011432e5554462d3811432e5554462d385b010000",
                "0000000000090400000200000001000000000000000a000000000800000a0000000a000000000e0000000000cf02",
            )),
            (7440, "05001080032920ff9f000000000000000100000074656d706c61746531"),
            (7524, concat!(
                "0a0000000600000063010100ffffffffcc020000010000007f06000011432e5554462d3811432e5554462d385b010000",
                "0000000000090400000200000001000000000000000a000000000800000a0000000a000000000e0000000000ce020000",
                "cf02",
            )),
            (7632, "050010c0032520ff1f000000000000000100000074656d706c61746531000000d202"),
            (7680, "03001000030920ff1f0000000000000005000000706f737467726573"),
            (7764, "0a0000000600000063000100ffffffffcc020000010000007f06000011432e5554462d3811432e5554462d38d002"),
            (7824, "06001080032920ff9f000000000000000400000074656d706c61746530"),
            (7908, concat!(
                "0a0000000600000063010000ffffffffcc020000010000007f06000011432e5554462d3811432e5554462d385b010000",
                "0000000000090400000200000001000000000000000a000000000800000a0000000a000000000e0000000000cf02",
            )),
            (8016, "05001080032920ff9f000000000000000100000074656d706c61746531"),
            (8100, concat!(
                "0a0000000600000063010100ffffffffcc020000010000007f06000011432e5554462d3811432e5554462d385b010000",
                "0000000000090400000200000001000000000000000a000000000800000a0000000a000000000e",
            )),
        ]),
        ("pg15 global/1213 block 0", 0, &[
            (4, "30006c01c25a04002000401f0020042000000000a09fc000409fc0"),
            (8000, "01"),
            (8016, "02000500010918078006000070675f676c6f62616c"),
            (8092, "0a00000001"),
            (8112, "01000500010918077f06000070675f64656661756c74"),
            (8188, "0a"),
        ]),
        ("pg15 base/5/16384_fsm block 2", 2, &[
            (4, "68367f014dab00001800002000200420"),
            (28, "55550055000000550000000000000055"),
            (59, "55"),
            (91, "55"),
            (155, "55"),
            (284, "55"),
            (541, "55"),
            (1055, "55"),
            (2083, "55"),
            (4139, "55"),
        ]),
        ("pg15 base/5/16384_vm block 0", 0, &[
            (4, "18167f01ec5100001800002000200420000000005555555501"),
        ]),
        ("pg18 global/1262 block 0", 0, &[
            (4, "38f26e01440e01003000e01d00200420000000000500010006000100e09d200100000000389f8a01709e8a01"),
            (7216, "ec02"),
            (7232, "06001280032920ff3f020000000000000400000074656d706c61746530"),
            (7316, concat!(
                "0a0000000600000063010000ffffffffe8020000010000007f06000011432e5554462d3811432e5554462d386b010000",
                "0000000000090400000200000001000000000000000a00000000080000000000000a0000000a000000000e",
            )),
            (7416, "eb02"),
            (7432, "05001280032920ff3f020000000000000100000074656d706c61746531"),
            (7516, concat!(
                "0a0000000600000063010100ffffffffe8020000010000007f06000011432e5554462d3811432e5554462d386b010000",
                "0000000000090400000200000001000000000000000a00000000080000000000000a0000000a000000000e",
            )),
            (7616, "ea020000eb02"),
            (7632, "050012c0032520ff3f00000000000000ee02"),
            (7664, "03001200030920ff3f0000000000000005000000706f737467726573"),
            (7748, "0a0000000600000063000100ffffffffe8020000010000007f06000011432e5554462d3811432e5554462d38ec02"),
            (7808, "06001280032920ff3f020000000000000400000074656d706c61746530"),
            (7892, concat!(
                "0a0000000600000063010000ffffffffe8020000010000007f06000011432e5554462d3811432e5554462d386b010000",
                "0000000000090400000200000001000000000000000a00000000080000000000000a0000000a000000000e",
            )),
            (7992, "eb02"),
            (8008, "05001280032920ff3f020000000000000100000074656d706c61746531"),
            (8092, concat!(
                "0a0000000600000063010100ffffffffe8020000010000007f06000011432e5554462d3811432e5554462d386b010000",
                "0000000000090400000200000001000000000000000a00000000080000000000000a0000000a000000000e",
            )),
        ]),
        ("pg18 global/1213 block 0", 0, &[
            (4, "d8d46601e62604002000401f0020042000000000a09fc000409fc0"),
            (8000, "01"),
            (8016, "02000500010918078006000070675f676c6f62616c"),
            (8092, "0a00000001"),
            (8112, "01000500010918077f06000070675f64656661756c74"),
            (8188, "0a"),
        ]),
        ("pg18 base/5/16384_fsm block 2", 2, &[
            (4, "e0ee79013c7f00001800002000200420"),
            (28, "55550055000000550000000000000055"),
            (59, "55"),
            (91, "55"),
            (155, "55"),
            (284, "55"),
            (541, "55"),
            (1055, "55"),
            (2083, "55"),
            (4139, "55"),
        ]),
        ("pg18 base/5/16384_vm block 0", 0, &[
            (4, "90ce790116050000180000200020042000000000ffffffff03"),
        ]),
    ];
    /// Full 8 KiB heap, index and catalog pages in `tests/data/pg/` (made by the commands in
    /// `tests/data/pg/README`), named `pgNN-<relfilenode>-<blkno>.page`. All are required.
    const PAGE_FIXTURES: &[&str] = &[
        "pg15-1262-0.page",
        "pg15-16384-0.page",
        "pg15-16384-3.page",
        "pg15-16389-1.page",
        "pg18-1262-0.page",
        "pg18-16384-0.page",
        "pg18-16384-3.page",
        "pg18-16390-1.page",
    ];

    /// Real pages: the embedded ones above, plus the [`PAGE_FIXTURES`]; panics naming a
    /// fixture that is missing.
    fn real_pages() -> Vec<(String, u32, Vec<u8>)> {
        let mut out: Vec<(String, u32, Vec<u8>)> = REAL_PAGES
            .iter()
            .map(|(name, blkno, runs)| (name.to_string(), *blkno, sparse_page(runs)))
            .collect();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/pg");
        for name in PAGE_FIXTURES {
            let path = dir.join(name);
            let page = std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "fixture {} is required (see tests/data/pg/README): {e}",
                    path.display()
                )
            });
            let stem = name.strip_suffix(".page").unwrap();
            let blkno: u32 = stem.rsplit('-').next().unwrap().parse().unwrap();
            out.push((name.to_string(), blkno, page));
        }
        out.sort();
        out
    }

    #[test]
    fn checksum_matches_postgresql_on_real_pages() {
        for (name, blkno, page) in real_pages() {
            assert_eq!(page.len(), BLCKSZ);
            assert!(!page_is_new(&page), "{name}");
            let stored = page_checksum_field(&page);
            assert_ne!(stored, 0, "{name}");
            assert_eq!(pg_checksum_page(&page, blkno), stored, "{name}");
            assert_eq!(
                verify_page(&page, blkno, u64::MAX),
                PageVerdict::Valid,
                "{name}"
            );
            // The block number is mixed in: the same page elsewhere does not verify.
            assert_ne!(pg_checksum_page(&page, blkno + 1), stored, "{name}");
        }
    }

    #[test]
    fn flipped_byte_is_a_mismatch() {
        for (name, blkno, page) in real_pages() {
            for offset in [20usize, 100, 4096, 8191] {
                let mut bad = page.clone();
                bad[offset] ^= 0x01;
                match verify_page(&bad, blkno, u64::MAX) {
                    PageVerdict::Mismatch { stored, computed } => {
                        assert_eq!(stored, page_checksum_field(&page));
                        assert_ne!(stored, computed);
                    }
                    other => panic!("{name} offset {offset}: {other:?}"),
                }
            }
            // Flipping the stored checksum itself is also caught.
            let mut bad = page.clone();
            bad[PD_CHECKSUM_OFFSET] ^= 0x40;
            assert!(matches!(
                verify_page(&bad, blkno, u64::MAX),
                PageVerdict::Mismatch { .. }
            ));
        }
    }

    #[test]
    fn pages_after_backup_start_are_skipped() {
        for (_name, blkno, page) in real_pages() {
            // FSM pages are not WAL-logged and may have LSN 0; 0 >= 0 still skips them.
            let lsn = page_lsn(&page);
            let mut bad = page.clone();
            bad[5000] ^= 0xFF;
            assert_eq!(verify_page(&bad, blkno, lsn), PageVerdict::AfterBackupStart);
            assert!(matches!(
                verify_page(&bad, blkno, lsn + 1),
                PageVerdict::Mismatch { .. }
            ));
        }
    }

    #[test]
    fn checksum_field_does_not_affect_checksum() {
        let (_, blkno, page) = real_pages().remove(0);
        let mut other = page.clone();
        other[8] = 0x12;
        other[9] = 0x34;
        assert_eq!(
            pg_checksum_page(&page, blkno),
            pg_checksum_page(&other, blkno)
        );
    }

    #[test]
    fn new_and_zero_pages() {
        let zero = vec![0u8; BLCKSZ];
        assert!(page_is_new(&zero));
        assert!(page_is_zero(&zero));
        assert_eq!(verify_page(&zero, 7, 0), PageVerdict::New);
        let mut junk = zero.clone();
        junk[4000] = 1;
        assert!(page_is_new(&junk));
        assert!(!page_is_zero(&junk));
        assert!(matches!(
            verify_page(&junk, 7, u64::MAX),
            PageVerdict::Mismatch { stored: 0, .. }
        ));
        // Odd lengths for the zero test.
        assert!(page_is_zero(&[0u8; 13]));
        assert!(!page_is_zero(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]));
        assert!(page_is_zero(&[]));
    }

    #[test]
    fn header_fields() {
        let mut p = vec![0u8; BLCKSZ];
        p[0..4].copy_from_slice(&0x16u32.to_le_bytes());
        p[4..8].copy_from_slice(&0xB374D848u32.to_le_bytes());
        p[8..10].copy_from_slice(&0xBEEFu16.to_le_bytes());
        p[14..16].copy_from_slice(&8000u16.to_le_bytes());
        assert_eq!(page_lsn(&p), 0x16_B374_D848);
        assert_eq!(page_checksum_field(&p), 0xBEEF);
        assert!(!page_is_new(&p));
        let c = pg_checksum_page(&p, 0);
        assert!(c >= 1);
    }

    #[test]
    fn checksum_never_zero() {
        let mut p = vec![0u8; BLCKSZ];
        p[14] = 1;
        for blkno in 0..2000u32 {
            assert_ne!(pg_checksum_page(&p, blkno), 0);
        }
    }
}
