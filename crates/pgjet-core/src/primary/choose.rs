//! `--transport auto` for a primary on another host: the parallel ranges (libpq) or the
//! server's compressed `BASE_BACKUP` stream, chosen by what a probe measures in its first
//! second (docs/basebackup-transport.md, "How auto chooses").
//!
//! The probe, on the SQL session pgjet opens anyway:
//! 1. a sample of the relation files of the connected database, 8 pieces of 128 KiB spread
//!    over them in proportion to their sizes (systematic sampling), read in one round trip
//!    with `pg_read_binary_file`: the bytes and how fast they came;
//! 2. when that took under a quarter of a second, a second read of 8 MiB in one round trip,
//!    in pieces of 1 MiB timed as they arrive (on a fast link 1 MiB is over before TCP has
//!    opened its window): the link's rate from the first piece's arrival to the last's;
//! 3. the sample compressed here with each method the server can use (zstd at the server's
//!    default level 3, lz4 at its default, gzip at level 1, the level auto asks for):
//!    the ratio, and the rate of one core of this host as a proxy for one core of the
//!    server (`BASE_BACKUP` compresses on one core unless zstd gets workers).
//!
//! Then [`decide`]: the ranges are estimated at the measured rate (one connection; the
//! ranges use several, so this is a lower bound), the stream with a method at the smallest of
//! the rate times its ratio, the rate of one server core compressing and doing the rest of
//! `BASE_BACKUP`'s work ([`SERVER_WORK`]), and its decompression rate. zstd's threads on the
//! server are not counted: they take cores the live load may need and the probe cannot see.
//! When the CPU, not the link, bounds the best method, a method within [`TIE`] of it that is
//! lighter on the server is taken. The stream is chosen when that estimate is at least
//! [`STREAM_MARGIN`] times the ranges': the ranges cost the primary no compression CPU, and
//! their estimate is low.
use crate::error::{Error, Result};
use crate::options::{NetworkCompress, PrimaryConn, Transport};
use crate::pg::conninfo::ConnTarget;
use crate::pg::privileges::Copying;
use crate::pg::session::{ServerInfo, Session};
use crate::remote::basebackup::WireCodec;
use crate::remote::control::Control;
use crate::remote::replication::ReplConn;
use std::io::Write;
use std::time::Instant;

/// Bytes per second one server core handles in `BASE_BACKUP` besides compressing them:
/// reading, the page-checksum check, the tar headers, the manifest's CRC-32C, sending. From
/// the primary's CPU time of the lz4 stream in bench/remote.sh (1517 MiB of pgbench in 2.3 s
/// of CPU, lz4 itself about 3500 MiB/s: docs/scaling.md); it stands for a server core like
/// this machine's (a faster one errs toward the ranges).
pub const SERVER_WORK: f64 = 800.0 * 1048576.0;
/// zlib's level 1 against zstd's level 3, compressing on one core: 231 against 830 MiB/s on
/// pgbench pages with the same C libraries PostgreSQL links (bench/rates.sh, this machine).
pub const ZLIB_PER_ZSTD: f64 = 0.28;
/// How much faster the stream must be estimated before auto takes it.
pub const STREAM_MARGIN: f64 = 1.2;
/// Methods whose estimates are within this factor of the best are a tie, which goes to the
/// one lightest on the server's CPU (the estimates' own spread from run to run is about
/// that: docs/basebackup-transport.md).
pub const TIE: f64 = 1.25;
/// Pieces of the sample, and the bytes of each.
const SAMPLE_PIECES: u64 = 8;
const SAMPLE_PIECE: u64 = 128 << 10;
/// A sample read faster than this is followed by a longer read for the link's rate.
const SHORT_READ: f64 = 0.25;
/// Bytes of that longer read, and of each of its pieces.
const LINK_READ: u64 = 8 << 20;
const LINK_PIECE: u64 = 1 << 20;
/// PostgreSQL's relation segment size (RELSEG_SIZE * BLCKSZ, pg_config.h): offsets past it
/// are in the files `<relfilenode>.<n>`.
const SEGMENT: u64 = 1 << 30;

/// What auto chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// The parallel ranges over libpq connections.
    Ranges,
    /// The server's stream, compressed with this method; `level` to ask for (None: see
    /// [`super::stream_sequence::codec_level`]).
    Stream {
        codec: WireCodec,
        level: Option<i32>,
        /// zstd threads on the server (0: none).
        workers: u32,
    },
}

/// One compression method measured on the sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CodecRate {
    pub codec: WireCodec,
    /// Logical bytes per compressed byte.
    pub ratio: f64,
    /// Logical bytes per second, one core of this host.
    pub compress: f64,
    pub decompress: f64,
}

/// What the probe measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    /// Logical bytes per second of one connection reading in one round trip.
    pub link: f64,
    /// Bytes of the sample.
    pub sample: usize,
    /// The methods the server can use, measured.
    pub codecs: Vec<CodecRate>,
    /// zstd threads the server will compress with (0: the backend compresses).
    pub workers: u32,
}

/// The estimates behind a choice, logical bytes per second.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimates {
    pub ranges: f64,
    /// Per method: its estimate.
    pub stream: Vec<(WireCodec, f64)>,
}

/// The choice for `p` and the estimates behind it (see the module's documentation).
pub fn decide(p: &Probe) -> (Choice, Estimates) {
    let ranges = p.link;
    let stream: Vec<(WireCodec, f64)> = p
        .codecs
        .iter()
        .map(|c| {
            // One server core compresses and does the rest of BASE_BACKUP's work per byte.
            // zstd's threads are not counted on: they take cores the live load may need and
            // that the probe cannot see (see the module's documentation).
            let core = 1.0 / (1.0 / c.compress + 1.0 / SERVER_WORK);
            let rate = (p.link * c.ratio).min(core).min(c.decompress);
            (c.codec, rate)
        })
        .collect();
    // The fastest estimate. When the CPU bounds it rather than the link, a method within TIE
    // of it that costs the server less CPU per byte (a higher compression rate) is taken:
    // the CPU figures are the uncertain ones (a core here stands for a core there, and the
    // loads on both hosts move them), the link times the ratio is not.
    let top = p
        .codecs
        .iter()
        .zip(&stream)
        .max_by(|a, b| a.1 .1.total_cmp(&b.1 .1));
    let best = top.map(|(c, &(codec, rate))| {
        if p.link * c.ratio <= rate {
            return (codec, rate);
        }
        p.codecs
            .iter()
            .zip(&stream)
            .filter(|(_, x)| x.1 >= rate / TIE)
            .max_by(|a, b| a.0.compress.total_cmp(&b.0.compress))
            .map_or((codec, rate), |(_, x)| *x)
    });
    let choice = match best {
        Some((codec, rate)) if rate >= ranges * STREAM_MARGIN => Choice::Stream {
            codec,
            level: None,
            workers: if codec == WireCodec::Zstd {
                p.workers
            } else {
                0
            },
        },
        _ => Choice::Ranges,
    };
    (choice, Estimates { ranges, stream })
}

/// The sample's pieces: (path, offset, length) spread over `files` ((path of the first
/// segment, size in bytes)) in proportion to their sizes.
fn sample_pieces(files: &[(String, u64)], pieces: u64, piece: u64) -> Vec<(String, u64, u64)> {
    let total: u64 = files.iter().map(|f| f.1).sum();
    if total == 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..pieces {
        // The middle of the i-th of `pieces` equal strides through all the bytes.
        let mut at = (2 * i + 1) * total / (2 * pieces);
        for (path, size) in files {
            if at < *size {
                let off = at.saturating_sub(piece / 2) / 8192 * 8192;
                let len = piece.min(size - off);
                let (seg, in_seg) = (off / SEGMENT, off % SEGMENT);
                let len = len.min(SEGMENT - in_seg);
                let p = if seg == 0 {
                    path.clone()
                } else {
                    format!("{path}.{seg}")
                };
                out.push((p, in_seg, len));
                break;
            }
            at -= size;
        }
    }
    out
}

/// Bytes per second of a read sent at `sent` whose pieces arrived as `got`: from the first
/// piece's arrival to the last's when there are several, else from `sent`.
pub fn link_rate(sent: Instant, got: &[(Option<Vec<u8>>, Instant)]) -> f64 {
    let len = |v: &Option<Vec<u8>>| v.as_ref().map_or(0, Vec::len) as f64;
    match got {
        [(first, t0), .., (_, t1)] if *t1 > *t0 => {
            let after: f64 = got.iter().map(|(v, _)| len(v)).sum::<f64>() - len(first);
            after / t1.duration_since(*t0).as_secs_f64()
        }
        _ => {
            let all: f64 = got.iter().map(|(v, _)| len(v)).sum();
            all / sent.elapsed().as_secs_f64().max(1e-6)
        }
    }
}

/// Measures `codec` on `sample`. None when the method fails here (it cannot: the sample is
/// in memory; kept total).
///
/// lz4 is measured in its block format, the algorithm the server's frames wrap: setting up a
/// frame costs more than 1 MiB takes to compress. gzip's rate is not measured (this build's
/// deflate, miniz_oxide, runs about 5 times faster than the zlib PostgreSQL links): it is
/// zstd's measured rate times [`ZLIB_PER_ZSTD`]; its ratio is measured.
fn measure(codec: WireCodec, sample: &[u8]) -> Option<CodecRate> {
    let t = Instant::now();
    let packed: Vec<u8> = match codec {
        WireCodec::None => return None,
        WireCodec::Zstd => zstd::bulk::compress(sample, 3).ok()?,
        WireCodec::Lz4 => lz4_flex::block::compress(sample),
        WireCodec::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(1));
            e.write_all(sample).ok()?;
            e.finish().ok()?
        }
    };
    let c = t.elapsed().as_secs_f64().max(1e-6);
    let t = Instant::now();
    let back = match codec {
        WireCodec::Zstd => zstd::bulk::decompress(&packed, sample.len()).ok()?,
        WireCodec::Lz4 => lz4_flex::block::decompress(&packed, sample.len()).ok()?,
        _ => {
            let mut v = Vec::with_capacity(sample.len());
            std::io::copy(&mut flate2::read::GzDecoder::new(&packed[..]), &mut v).ok()?;
            v
        }
    };
    let d = t.elapsed().as_secs_f64().max(1e-6);
    let compress = match codec {
        WireCodec::Gzip => measure(WireCodec::Zstd, sample)?.compress * ZLIB_PER_ZSTD,
        _ => sample.len() as f64 / c,
    };
    (back.len() == sample.len()).then(|| CodecRate {
        codec,
        ratio: sample.len() as f64 / packed.len().max(1) as f64,
        compress,
        decompress: sample.len() as f64 / d,
    })
}

/// The connected database's 64 largest relation files, one row: `path size` pairs joined
/// by commas, largest first (relation paths hold neither; [`relation_files`] reads it).
const FILES_QUERY: &str = "SELECT string_agg(p || ' ' || n, ',' ORDER BY n DESC) FROM \
     (SELECT pg_relation_filepath(c.oid) p, pg_relation_size(c.oid) n FROM pg_class c \
      WHERE c.relkind IN ('r', 'i', 't', 'm') AND pg_relation_filepath(c.oid) IS NOT NULL \
      AND pg_relation_size(c.oid) >= 8192 ORDER BY 2 DESC LIMIT 64) f";

/// (path, bytes) from [`FILES_QUERY`]'s value; pairs that do not parse are left out.
fn relation_files(v: &str) -> Vec<(String, u64)> {
    v.split(',')
        .filter_map(|f| {
            let (p, n) = f.trim().rsplit_once(' ')?;
            Some((p.to_string(), n.parse().ok()?))
        })
        .collect()
}

/// Runs the probe on the primary behind `sess`, for the methods `codecs`, sampling `files`
/// ((path, bytes), largest first). The link's rate is `known_link` (bytes per second on
/// this session, measured before) when the sample reads too fast to tell it. None when
/// there are no relation files worth a sample (a tiny cluster: any transport will do).
/// Errors: the reads' (a role without EXECUTE on pg_read_binary_file).
pub fn probe(
    sess: &Session,
    files: &[(String, u64)],
    codecs: &[WireCodec],
    workers: u32,
    known_link: Option<f64>,
) -> Result<Option<Probe>> {
    let pieces = sample_pieces(files, SAMPLE_PIECES, SAMPLE_PIECE);
    if pieces.is_empty() {
        return Ok(None);
    }
    let t = Instant::now();
    let got = sess.read_file_ranges(&pieces)?;
    let secs = t.elapsed().as_secs_f64();
    let sample: Vec<u8> = got.into_iter().flatten().flatten().collect();
    if (sample.len() as u64) < SAMPLE_PIECES * SAMPLE_PIECE / 2 {
        return Ok(None);
    }
    let mut link = sample.len() as f64 / secs.max(1e-6);
    if let (true, Some(known)) = (secs < SHORT_READ, known_link) {
        link = known;
    } else if secs < SHORT_READ {
        // The link's rate from a longer read of the largest file (cut at its segment's end),
        // in pieces taken as they arrive: the rate from the first piece's arrival to the
        // last's leaves out the request's round trip and the start of TCP's slow start.
        let (path, size) = &files[0];
        let len = LINK_READ.min(*size).min(SEGMENT);
        let pieces: Vec<(String, u64, u64)> = (0..len.div_ceil(LINK_PIECE))
            .map(|i| {
                let at = i * LINK_PIECE;
                (path.clone(), at, LINK_PIECE.min(len - at))
            })
            .collect();
        let t = Instant::now();
        let got = sess.read_file_ranges_timed(&pieces)?;
        link = link_rate(t, &got);
    }
    let codecs = codecs.iter().filter_map(|c| measure(*c, &sample)).collect();
    Ok(Some(Probe {
        link,
        sample: sample.len(),
        codecs,
        workers,
    }))
}

/// One line for the log and the tests: the figures and the choice.
pub fn describe(p: &Probe, e: &Estimates, c: Choice) -> String {
    let mib = |b: f64| b / (1 << 20) as f64;
    let codecs: Vec<String> = p
        .codecs
        .iter()
        .zip(&e.stream)
        .map(|(c, (_, est))| {
            format!(
                "{} {:.1}x at {:.0} MiB/s per core (stream ~{:.0} MiB/s)",
                c.codec.name(),
                c.ratio,
                mib(c.compress),
                mib(*est)
            )
        })
        .collect();
    let chose = match c {
        Choice::Ranges => "ranges (libpq)".to_string(),
        Choice::Stream { codec, .. } => format!("basebackup ({})", codec.name()),
    };
    format!(
        "transport auto: link {:.1} MiB/s on one connection (ranges ~{:.0} MiB/s), sample {:.1} MiB compresses {}{}; chose {chose}",
        mib(p.link),
        mib(e.ranges),
        p.sample as f64 / (1 << 20) as f64,
        codecs.join(", "),
        if p.codecs.iter().any(|c| c.codec == WireCodec::Zstd) {
            format!(" (zstd with {} threads on the server)", p.workers)
        } else {
            String::new()
        }
    )
}

/// The choice for a primary on another host (`--transport auto`): ranges unless the probe
/// finds the stream faster by [`STREAM_MARGIN`] and the stream can run (PostgreSQL 15+, a
/// role with REPLICATION or superuser). `wanted`: `--network-compress` (a method other than
/// auto is the only one considered; none means ranges); `workers`: zstd threads on the
/// server (None: its max_parallel_maintenance_workers). `link`: the link's rate on `sess`,
/// when measured before ([`probe`]). Logs the figures and the choice.
///
/// Errors: the probe's queries.
pub fn choose_remote(
    sess: &Session,
    info: &ServerInfo,
    target: &ConnTarget,
    (wanted, workers): (NetworkCompress, Option<u32>),
    link: Option<f64>,
) -> Result<(Choice, Option<ReplConn>)> {
    // One round trip for the facts and the files to sample: each would cost a full round
    // trip on the slow links auto is for.
    let row = sess.query_row(
        "read the role's replication right and the server's compression methods",
        &format!(
            "SELECT (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), ({}), {}, ({FILES_QUERY})",
            super::stream_sequence::CODECS_QUERY,
            super::stream_sequence::WORKERS_QUERY
        ),
    )?;
    let col = |i: usize| row.get(i).cloned().flatten();
    let files = relation_files(&col(3).unwrap_or_default());
    // A server whose methods cannot be read is weighed with gzip, which every build has.
    let (mut codecs, workers) =
        super::stream_sequence::methods_from(wanted, workers, col(1), col(2), &[WireCodec::Gzip]);
    let can = col(0).is_some_and(|v| v == "t");
    if info.version_num < 150000 || !can || wanted == NetworkCompress::None {
        tracing::info!(
            "transport auto: ranges (libpq){}",
            if info.version_num < 150000 {
                " (the stream needs PostgreSQL 15)"
            } else if !can {
                " (the role lacks REPLICATION, which the stream needs)"
            } else {
                ""
            }
        );
        return Ok((Choice::Ranges, None));
    }
    // gzip only on a server without lz4 and zstd: PostgreSQL's zstd compresses better and
    // faster than its gzip at level 1, lz4 much faster (bench/rates.sh, with the same C
    // libraries the server links), while the sample's gzip here (miniz_oxide) runs several
    // times faster than zlib's and would be taken for the faster.
    if codecs.len() > 1 {
        codecs.retain(|c| *c != WireCodec::Gzip);
    }
    // The stream's replication connection opens while the probe runs (its round trips,
    // and TLS's, overlap the sample's): it is kept when the stream is chosen, dropped when
    // not. The role may replicate, so the server logs no refusal for a role.
    let early = {
        let (target, info) = (target.clone(), info.clone());
        std::thread::Builder::new()
            .name("pgjet-replication-connect".into())
            .spawn(move || super::stream_sequence::connect_checked(&target, &info))
            .ok()
    };
    let Some(p) = probe(sess, &files, &codecs, workers, link)? else {
        tracing::info!("transport auto: too little data to measure; ranges (libpq)");
        return Ok((Choice::Ranges, None));
    };
    let (c, e) = decide(&p);
    tracing::info!("{}", describe(&p, &e, c));
    if c == Choice::Ranges {
        return Ok((c, None));
    }
    match early.map(|h| h.join()) {
        Some(Ok(Ok(conn))) => Ok((c, Some(conn))),
        // Another cluster behind the replication connection: never a fallback.
        Some(Ok(Err(e @ Error::Unsafe(_)))) => Err(e),
        // A refused replication connection (pg_hba.conf, max_wal_senders): the ranges
        // still work.
        Some(Ok(Err(e))) => {
            tracing::warn!(
                "transport auto: the stream would be faster, but its replication connection failed: {}; {}; ranges (libpq)",
                e.with_causes(),
                e.hint().trim_start_matches("HINT: ")
            );
            Ok((Choice::Ranges, None))
        }
        // No thread (or it panicked): the stream connects when it starts.
        _ => Ok((c, None)),
    }
}

/// The primary reached for the stream `--transport auto` chose.
pub struct Reached {
    /// How to reach it.
    pub target: ConnTarget,
    /// The session the probe ran on (kept, so the stream does not connect again), or for a
    /// role pg_hba.conf lets in for replication only, a replication connection in its place
    /// ([`crate::remote::control`]).
    pub ctl: Box<dyn Control>,
    pub info: ServerInfo,
    /// The replication connection opened while the probe ran (IDENTIFY_SYSTEM checked).
    pub early: Option<ReplConn>,
    /// Logical bytes per second of the link on this session, when already measured
    /// (`--seed auto` timed it): the probe then does not read for it again.
    pub link: Option<f64>,
}

impl Reached {
    /// Connects to the primary for the stream (no replication connection yet): the SQL
    /// session, or with `replication_only` allowed a replication connection in its place
    /// ([`crate::remote::control::connect_control`], whose errors it returns).
    pub fn connect(s: &PrimaryConn, replication_only: bool) -> Result<Reached> {
        let target = super::primary_target(s)?;
        let (ctl, info) = crate::remote::control::connect_control(&target, replication_only)?;
        Ok(Reached {
            target,
            ctl,
            info,
            early: None,
            link: None,
        })
    }
}

/// For a command run with `--transport auto`: the settings of the stream, and the session the
/// probe ran on, when the primary is on another host and [`choose_remote`] picks the stream
/// (transport basebackup, the method and level chosen unless given), or when the role may
/// not copy files (it lacks the backup API or the file functions: [`crate::pg::privileges`])
/// but has REPLICATION, or the source is a standby (then without a probe: the server's best
/// method, none on this host);
/// else None (this host's files, or the ranges: the session is closed). `files_first`: no
/// probe, the files whenever the role may copy them (a delta, which reads only what
/// differs that way). `standby_streams`: a standby source takes the stream (replica-create,
/// whose file transports copy a primary only); else a standby's files are copied.
/// `connected`: the primary already reached (`--seed auto` timed it), else it connects.
///
/// Errors: connection, the rights' and the probe's queries.
pub fn auto_stream_settings(
    s: &PrimaryConn,
    files_first: bool,
    standby_streams: bool,
    connected: Option<Reached>,
) -> Result<Option<(PrimaryConn, Reached)>> {
    if s.transport != Transport::Auto {
        if let Some(r) = connected {
            r.ctl.close();
        }
        return Ok(None);
    }
    let Reached {
        target,
        ctl,
        info,
        link,
        ..
    } = match connected {
        Some(r) => r,
        None => Reached::connect(s, true)?,
    };
    if ctl.session().is_none() {
        // pg_hba.conf lets the role in for replication only: the stream is all it may run,
        // and without a session neither the rights nor the link can be read.
        tracing::info!(
            "transport auto: the role may connect for replication only: the server's BASE_BACKUP stream ({}); the link is not probed (the probe reads over an ordinary session)",
            match s.network_compress {
                NetworkCompress::Auto =>
                    "the best method the server has: zstd, lz4, then gzip".to_string(),
                c => c.as_str().to_string(),
            }
        );
        let stream = PrimaryConn {
            transport: Transport::Basebackup,
            ..s.clone()
        };
        return Ok(Some((
            stream,
            Reached {
                target,
                ctl,
                info,
                early: None,
                link,
            },
        )));
    }
    let Some(sess) = ctl.into_session() else {
        return Ok(None);
    };
    let close = |sess: Session| {
        sess.close();
        Ok(None)
    };
    let rights = match crate::pg::privileges::rights(&sess) {
        Ok(r) => r,
        Err(e) => {
            sess.close();
            return Err(e);
        }
    };
    let local = super::local_data_directory(&info).is_some();
    let files = if local {
        Copying::LocalFiles
    } else {
        Copying::Ranges
    };
    let lacks = rights.missing_for(files);
    if info.in_recovery && !(standby_streams && rights.replication) {
        // A backup copies a standby's files as a primary's (pg_backup_start on a standby).
        return close(sess);
    }
    if (info.in_recovery || !lacks.is_empty()) && rights.replication {
        // A standby serves BASE_BACKUP as a primary does (its backup ends at its replay
        // point, its own WAL included), where the file transports would need the primary.
        // A role with REPLICATION only (Patroni's replicator, CloudNativePG's
        // streaming_replica): the stream is what it may run, as pg_basebackup does.
        let (mut codecs, workers) = super::stream_sequence::stream_methods(
            &sess,
            if local && s.network_compress == NetworkCompress::Auto {
                NetworkCompress::None
            } else {
                s.network_compress
            },
            s.network_workers,
        );
        if codecs.len() > 1 {
            codecs.retain(|c| *c != WireCodec::Gzip);
        }
        let codec = codecs.first().copied().unwrap_or(WireCodec::Gzip);
        let how = match codec {
            WireCodec::None => "uncompressed".to_string(),
            c => format!("{} on the server", c.name()),
        };
        if info.in_recovery {
            tracing::info!(
                "transport auto: the source is a standby: the server's BASE_BACKUP stream ({how})"
            );
        } else {
            tracing::info!(
                "transport auto: the role may not copy files ({}; `pgjet check` gives the GRANTs); the server's BASE_BACKUP stream ({how}), which needs only REPLICATION",
                lacks.iter().map(|m| m.what.as_str()).collect::<Vec<_>>().join(", ")
            );
        }
        return Ok(Some((
            stream_settings(s, codec, None, workers),
            Reached {
                target,
                ctl: Box::new(sess),
                info,
                early: None,
                link,
            },
        )));
    }
    if local || files_first {
        return close(sess);
    }
    let (choice, early) = match choose_remote(
        &sess,
        &info,
        &target,
        (s.network_compress, s.network_workers),
        link,
    ) {
        Ok(c) => c,
        Err(e) => {
            sess.close();
            return Err(e);
        }
    };
    let Choice::Stream {
        codec,
        level,
        workers,
    } = choice
    else {
        return close(sess);
    };
    Ok(Some((
        stream_settings(s, codec, level, workers),
        Reached {
            target,
            ctl: Box::new(sess),
            info,
            early,
            link,
        },
    )))
}

/// `s` for the stream with `codec` (its level given, else `level`; gzip chosen here gets
/// level 1, as auto's gzip does: [`super::stream_sequence::codec_level`]) and `workers` zstd threads.
fn stream_settings(
    s: &PrimaryConn,
    codec: WireCodec,
    level: Option<i32>,
    workers: u32,
) -> PrimaryConn {
    PrimaryConn {
        transport: Transport::Basebackup,
        network_compress: match codec {
            WireCodec::None => NetworkCompress::None,
            WireCodec::Gzip => NetworkCompress::Gzip,
            WireCodec::Lz4 => NetworkCompress::Lz4,
            WireCodec::Zstd => NetworkCompress::Zstd,
        },
        network_level: s
            .network_level
            .or(level)
            .or((codec == WireCodec::Gzip).then_some(1)),
        network_workers: Some(workers),
        ..s.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1048576.0;

    fn rate(codec: WireCodec, ratio: f64, compress: f64) -> CodecRate {
        CodecRate {
            codec,
            ratio,
            compress: compress * MIB,
            decompress: 4.0 * compress * MIB,
        }
    }

    fn probe(link: f64, codecs: Vec<CodecRate>) -> Probe {
        Probe {
            link: link * MIB,
            sample: 4 << 20,
            codecs,
            workers: 0,
        }
    }

    #[test]
    fn the_rule_in_a_table() {
        use WireCodec::{Gzip, Lz4, Zstd};
        let all = |r: f64| {
            vec![
                rate(Zstd, r, 250.0),
                rate(Lz4, r * 0.6, 600.0),
                rate(Gzip, r * 0.8, 60.0),
            ]
        };
        let gzip_only = |r: f64| vec![rate(Gzip, r, 60.0)];
        let s = |codec, level| Choice::Stream {
            codec,
            level,
            workers: 0,
        };
        // (what, link MiB/s, methods, expected)
        let cases: Vec<(&str, f64, Vec<CodecRate>, Choice)> = vec![
            ("slow link, pgbench", 11.0, all(9.0), s(Zstd, None)),
            ("slow link, random", 11.0, all(1.0), Choice::Ranges),
            ("slow link, half random", 11.0, all(1.8), s(Zstd, None)),
            ("fast link, random", 110.0, all(1.0), Choice::Ranges),
            (
                "fast link, pgbench: lz4 is faster than zstd there",
                110.0,
                all(9.0),
                s(Lz4, None),
            ),
            ("loopback, pgbench", 900.0, all(9.0), Choice::Ranges),
            ("loopback, random", 900.0, all(1.0), Choice::Ranges),
            (
                "no lz4/zstd, slow link, pgbench",
                11.0,
                gzip_only(7.0),
                s(Gzip, None),
            ),
            (
                "no lz4/zstd, fast link, pgbench",
                110.0,
                gzip_only(7.0),
                Choice::Ranges,
            ),
            (
                "no lz4/zstd, slow, random",
                11.0,
                gzip_only(1.0),
                Choice::Ranges,
            ),
            ("nothing to compress with", 11.0, vec![], Choice::Ranges),
        ];
        for (what, link, codecs, want) in cases {
            let p = probe(link, codecs);
            let (got, e) = decide(&p);
            assert_eq!(got, want, "{what}: {}", describe(&p, &e, got));
        }
        // On the fast link zstd's and lz4's estimates are close: the tie goes to lz4, lighter
        // on the server, with or without zstd threads (which the rule does not count on).
        let p = Probe {
            workers: 2,
            ..probe(110.0, vec![rate(Zstd, 24.0, 600.0), rate(Lz4, 9.6, 1000.0)])
        };
        let (got, e) = decide(&p);
        assert_eq!(got, s(Lz4, None), "{}", describe(&p, &e, got));
        // A mixed cluster on the slow link: both bounded by the link, the tighter ratio wins
        // though the estimates are within TIE.
        let p = probe(11.0, vec![rate(Zstd, 3.5, 600.0), rate(Lz4, 3.05, 1000.0)]);
        let (got, e) = decide(&p);
        assert_eq!(got, s(Zstd, None), "{}", describe(&p, &e, got));
        // Threads change nothing where the link bounds the stream.
        let p = Probe {
            workers: 2,
            ..probe(900.0, all(1.0))
        };
        assert_eq!(decide(&p).0, Choice::Ranges);
    }

    #[test]
    fn link_rate_from_the_rows_after_the_first() {
        use std::time::Duration;
        let t = Instant::now();
        let mib = || Some(vec![0u8; 1 << 20]);
        let at = |ms: u64| t + Duration::from_millis(ms);
        // The first row after a 100 ms round trip, the next two 10 ms apart: 2 MiB in 20 ms.
        let rows = vec![(mib(), at(100)), (mib(), at(110)), (mib(), at(120))];
        assert!((link_rate(t, &rows) / MIB - 100.0).abs() < 1e-6);
        // One row (or rows that came together): the whole read's bytes over its time.
        let one = vec![(mib(), t)];
        let r = link_rate(t - Duration::from_millis(500), &one) / MIB;
        assert!(r > 1.0 && r <= 2.0, "{r}");
        // Files gone (NULL rows) count no bytes.
        assert_eq!(link_rate(t, &[(None, at(1)), (None, at(2))]), 0.0);
    }

    #[test]
    fn relation_files_from_one_row() {
        assert_eq!(
            relation_files("base/5/16390 1073741824,pg_tblspc/16385/PG_15_202209061/5/16400 8192"),
            vec![
                ("base/5/16390".to_string(), 1 << 30),
                ("pg_tblspc/16385/PG_15_202209061/5/16400".to_string(), 8192)
            ]
        );
        assert!(relation_files("").is_empty());
        assert_eq!(relation_files("base/5/1 x,base/5/2 9").len(), 1);
    }

    #[test]
    fn samples_spread_by_size_and_follow_segments() {
        let files = vec![
            ("base/5/1".to_string(), 3 * SEGMENT),
            ("base/5/2".to_string(), SEGMENT),
        ];
        let p = sample_pieces(&files, 16, 256 << 10);
        assert_eq!(p.len(), 16);
        assert_eq!(p.iter().filter(|x| x.0.starts_with("base/5/1")).count(), 12);
        assert!(p.iter().any(|x| x.0 == "base/5/1.2"));
        assert!(p.iter().all(|x| x.1 % 8192 == 0 && x.1 + x.2 <= SEGMENT));
        assert!(sample_pieces(&[], 16, 1).is_empty());
        let tiny = sample_pieces(&[("base/5/3".into(), 8192)], 4, 256 << 10);
        assert!(tiny.iter().all(|x| x.1 == 0 && x.2 == 8192));
    }

    #[test]
    fn measures_compressible_and_random_samples() {
        let text: Vec<u8> = (0..(1 << 20))
            .map(|i: u32| b"pgbench_accounts row "[(i % 21) as usize])
            .collect();
        let mut x = 0x9e3779b97f4a7c15u64;
        let random: Vec<u8> = (0..(1 << 20))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for c in [WireCodec::Zstd, WireCodec::Lz4, WireCodec::Gzip] {
            let t = measure(c, &text).unwrap();
            let r = measure(c, &random).unwrap();
            assert!(t.ratio > 5.0, "{c:?} {t:?}");
            assert!(r.ratio < 1.05, "{c:?} {r:?}");
            assert!(t.compress > 0.0 && t.decompress > 0.0);
        }
        assert!(measure(WireCodec::None, &text).is_none());
    }
}
