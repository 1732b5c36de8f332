//! Compression and hashing stages applied to each piece of a file.
//!
//! A piece is compressed on its own (one frame per piece), so pieces can be written, read
//! and checked independently and in parallel. Hashes: XXH3-128 of the logical bytes and of
//! the stored bytes (fast, for corruption detection) and CRC32C of the logical bytes (what
//! PostgreSQL's `backup_manifest` uses; CRC32C values of consecutive pieces combine into the
//! file's CRC32C).
use crate::io::direct::AlignedBuf;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};

/// Compression algorithm of stored bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompressType {
    /// Stored as is.
    None,
    /// LZ4 block format (lz4_flex), no level.
    Lz4,
    /// Zstandard frame.
    Zstd,
    /// gzip (deflate) stream.
    Gzip,
}

// The words of `compress-type`; `zst` and `gz` are pgBackRest's.
words!(CompressType, "compress type", {
    "none" => None: "",
    "lz4" => Lz4: "",
    "zstd" | "zst" => Zstd: "",
    "gzip" | "gz" => Gzip: "",
});

impl std::fmt::Display for CompressType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A compression choice: algorithm and level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compression {
    /// Algorithm.
    #[serde(rename = "type")]
    pub kind: CompressType,
    /// Level (zstd 1..=19, gzip 0..=9; ignored for lz4 and none).
    pub level: i32,
}

impl Compression {
    /// The default level of each algorithm: zstd 1 and gzip 6 (measured in docs/benchmarks.md:
    /// zstd 1 keeps the two cores ahead of the disk on pgbench data).
    pub fn default_level(kind: CompressType) -> i32 {
        match kind {
            CompressType::Zstd => 1,
            CompressType::Gzip => 6,
            _ => 0,
        }
    }

    /// Checks the level against the algorithm's range.
    pub fn new(kind: CompressType, level: Option<i32>) -> Result<Self, String> {
        let level = level.unwrap_or_else(|| Self::default_level(kind));
        let ok = match kind {
            CompressType::Zstd => (1..=19).contains(&level),
            CompressType::Gzip => (0..=9).contains(&level),
            _ => true,
        };
        if !ok {
            return Err(format!("compress-level {level} is out of range for {kind}"));
        }
        Ok(Compression { kind, level })
    }
}

/// A per-worker compressor that keeps its context between pieces (zstd context reuse).
pub struct Compressor {
    c: Compression,
    zstd: Option<zstd::bulk::Compressor<'static>>,
    scratch: Vec<u8>,
    /// [`Compressor::compress_frame`]'s output, kept at its largest length (zeroed once).
    frame: Vec<u8>,
}

impl Compressor {
    /// Creates the compressor; fails only if zstd cannot allocate its context.
    pub fn new(c: Compression) -> io::Result<Self> {
        let zstd = match c.kind {
            CompressType::Zstd => Some(zstd::bulk::Compressor::new(c.level)?),
            _ => None,
        };
        Ok(Compressor {
            c,
            zstd,
            scratch: Vec::new(),
            frame: Vec::new(),
        })
    }

    /// Compresses `input` into a buffer the compressor keeps and returns the frame (the same
    /// bytes [`Compressor::compress`] appends). For a caller that compresses many pieces of
    /// the same size, one after another: the buffer is allocated and zeroed once, not once
    /// a piece (a fresh 16 MiB output buffer costs a page fault and a page clear per 4 KiB).
    pub fn compress_frame<'a>(&'a mut self, input: &'a [u8]) -> io::Result<&'a [u8]> {
        let n = match self.c.kind {
            CompressType::None => return Ok(input),
            CompressType::Gzip => {
                self.scratch.clear();
                let mut enc = flate2::write::GzEncoder::new(
                    &mut self.scratch,
                    flate2::Compression::new(self.c.level as u32),
                );
                enc.write_all(input)?;
                enc.finish()?;
                return Ok(&self.scratch);
            }
            CompressType::Lz4 | CompressType::Zstd => {
                let bound = frame_bound(self.c.kind, input.len());
                if self.frame.len() < bound {
                    self.frame.resize(bound, 0);
                }
                compress_block(self.c.kind, &mut self.zstd, input, &mut self.frame[..bound])?
            }
        };
        Ok(&self.frame[..n])
    }

    /// Compresses `input` and appends the frame to `out`. lz4 and zstd write straight into
    /// `out`, not through [`Compressor::compress_frame`]'s kept buffer: a backup has one
    /// compressor per worker, and a kept buffer of a whole chunk's bound in each (zeroed,
    /// so resident) beside the worker's object buffer raised the backup's peak RSS from
    /// 161 to 225 MiB at 100 000 tables (bench/s3.sh, posix, --jobs 4).
    pub fn compress(&mut self, input: &[u8], out: &mut AlignedBuf) -> io::Result<()> {
        match self.c.kind {
            CompressType::None | CompressType::Gzip => {
                let frame = self.compress_frame(input)?;
                out.extend_from_slice(frame);
            }
            CompressType::Lz4 | CompressType::Zstd => {
                let start = out.len();
                out.resize(start + frame_bound(self.c.kind, input.len()), 0);
                match compress_block(self.c.kind, &mut self.zstd, input, &mut out[start..]) {
                    Ok(n) => out.truncate(start + n),
                    Err(e) => {
                        out.truncate(start);
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }
}

/// The most bytes an lz4 or zstd frame of `len` input bytes can take (0 for the other kinds).
fn frame_bound(kind: CompressType, len: usize) -> usize {
    match kind {
        CompressType::Zstd => zstd::zstd_safe::compress_bound(len),
        CompressType::Lz4 => lz4_flex::block::get_maximum_output_size(len),
        CompressType::None | CompressType::Gzip => 0,
    }
}

/// Compresses `input` as one lz4 or zstd frame into `dst` (at least [`frame_bound`] long)
/// and returns the frame's length. `zstd` is the compressor's context (made by
/// [`Compressor::new`] for zstd). Errors: the codec's, or `kind` is neither lz4 nor zstd.
fn compress_block(
    kind: CompressType,
    zstd: &mut Option<zstd::bulk::Compressor<'static>>,
    input: &[u8],
    dst: &mut [u8],
) -> io::Result<usize> {
    match kind {
        CompressType::Lz4 => {
            lz4_flex::block::compress_into(input, dst).map_err(|e| io::Error::other(e.to_string()))
        }
        CompressType::Zstd => zstd
            .as_mut()
            .ok_or_else(|| io::Error::other("zstd compressor without its context"))?
            .compress_to_buffer(input, dst),
        CompressType::None | CompressType::Gzip => {
            Err(io::Error::other(format!("{kind} is not a block codec")))
        }
    }
}

/// Decompresses one frame of `kind` into `out`, which it must fill exactly.
/// Errors (InvalidData) when the frame is damaged or expands to another length.
pub fn decompress(kind: CompressType, frame: &[u8], out: &mut [u8]) -> io::Result<()> {
    let bad = |e: String| io::Error::new(io::ErrorKind::InvalidData, e);
    let n = match kind {
        CompressType::None => {
            if frame.len() == out.len() {
                out.copy_from_slice(frame);
            }
            frame.len()
        }
        CompressType::Lz4 => {
            lz4_flex::block::decompress_into(frame, out).map_err(|e| bad(e.to_string()))?
        }
        CompressType::Zstd => {
            // One decompression context per thread: making one per frame took 4% of a chain
            // restore's CPU (perf; many small frames).
            thread_local! {
                static DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
                    const { std::cell::RefCell::new(None) };
            }
            DCTX.with(|d| -> io::Result<usize> {
                let mut d = d.borrow_mut();
                if d.is_none() {
                    *d = Some(zstd::bulk::Decompressor::new()?);
                }
                match d.as_mut() {
                    Some(d) => d.decompress_to_buffer(frame, out),
                    None => Err(bad("no zstd context".into())),
                }
            })
            .map_err(|e| bad(e.to_string()))?
        }
        CompressType::Gzip => {
            let mut d = flate2::read::GzDecoder::new(frame);
            d.read_exact(out).map_err(|e| bad(e.to_string()))?;
            let mut extra = [0u8; 1];
            match d.read(&mut extra).map_err(|e| bad(e.to_string()))? {
                0 => out.len(),
                _ => out.len() + 1,
            }
        }
    };
    if n != out.len() {
        return Err(bad(format!(
            "frame expands to {n} bytes or more, expected {}",
            out.len()
        )));
    }
    Ok(())
}

/// XXH3-128 of `data` as 32 lowercase hex digits.
pub fn xxh3_hex(data: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(data))
}

/// CRC32C (Castagnoli) of `data`, as PostgreSQL computes it for backup manifests.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_type() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for kind in [
            CompressType::None,
            CompressType::Lz4,
            CompressType::Zstd,
            CompressType::Gzip,
        ] {
            let mut c = Compressor::new(Compression::new(kind, None).unwrap()).unwrap();
            let mut frame = crate::io::direct::aligned_buf(0);
            frame.extend_from_slice(&[1, 2, 3]);
            c.compress(&data, &mut frame).unwrap();
            // compress() writes into the caller's buffer and keeps none of its own (a backup
            // has one compressor per worker: see its doc).
            assert_eq!(c.frame.capacity(), 0, "{kind}");
            // The kept buffer gives the same frame, also after a larger piece.
            c.compress_frame(&[7u8; 300_000]).unwrap();
            assert_eq!(c.compress_frame(&data).unwrap(), &frame[3..], "{kind}");
            let mut out = vec![9u8; data.len()];
            decompress(kind, &frame[3..], &mut out).unwrap();
            assert_eq!(out, data, "{kind}");
            let mut longer = vec![0u8; data.len() + 1];
            assert!(
                decompress(kind, &frame[3..], &mut longer).is_err(),
                "{kind}"
            );
            let mut shorter = vec![0u8; data.len() - 1];
            assert!(
                decompress(kind, &frame[3..], &mut shorter).is_err(),
                "{kind}"
            );
        }
    }

    #[test]
    fn levels_checked() {
        assert!(Compression::new(CompressType::Zstd, Some(40)).is_err());
        assert!(Compression::new(CompressType::Gzip, Some(9)).is_ok());
        assert_eq!("zst".parse::<CompressType>().unwrap(), CompressType::Zstd);
        assert!("brotli".parse::<CompressType>().is_err());
    }
}
