use super::*;
use crate::pg::pg_manifest::{parse_manifest, render_pg_manifest, PgManifestFile, PgWalRange};
use std::io::Write;

/// A ustar header as src/port/tar.c writes it (octal numbers, "ustar\0" "00").
fn header(name: &str, size: u64, kind: u8, mode: u32, link: &str) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let put = |h: &mut [u8; 512], at: usize, len: usize, v: u64| {
        let s = format!("{:0w$o}", v, w = len - 1);
        h[at..at + len - 1].copy_from_slice(s.as_bytes());
    };
    put(&mut h, 100, 8, mode as u64);
    put(&mut h, 108, 8, 26);
    put(&mut h, 116, 8, 26);
    put(&mut h, 124, 12, size);
    put(&mut h, 136, 12, 1_700_000_000);
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u64 = h.iter().map(|&b| b as u64).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    h
}

enum E<'a> {
    Dir(&'a str),
    File(&'a str, Vec<u8>),
    Link(&'a str, &'a str),
}

fn tar(entries: &[E]) -> Vec<u8> {
    let mut t = Vec::new();
    for e in entries {
        match e {
            E::Dir(n) => t.extend_from_slice(&header(&format!("{n}/"), 0, b'5', 0o700, "")),
            E::Link(n, l) => t.extend_from_slice(&header(n, 0, b'2', 0o777, l)),
            E::File(n, d) => {
                t.extend_from_slice(&header(n, d.len() as u64, b'0', 0o600, ""));
                t.extend_from_slice(d);
                t.resize(t.len().div_ceil(512) * 512, 0);
            }
        }
    }
    t.extend_from_slice(&[0u8; 1024]);
    t
}

fn compress(codec: WireCodec, data: &[u8]) -> Vec<u8> {
    match codec {
        WireCodec::None => data.to_vec(),
        WireCodec::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        }
        WireCodec::Lz4 => {
            let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        }
        WireCodec::Zstd => zstd::encode_all(data, 1).unwrap(),
    }
}

/// CopyData messages for archives (name, tablespace path, compressed bytes cut into
/// pieces of `piece` bytes) and a manifest.
fn messages(archives: &[(&str, &str, Vec<u8>)], manifest: &[u8], piece: usize) -> Vec<Vec<u8>> {
    let mut m = Vec::new();
    let mut done = 0u64;
    for (name, path, bytes) in archives {
        let mut n = vec![b'n'];
        n.extend_from_slice(name.as_bytes());
        n.push(0);
        n.extend_from_slice(path.as_bytes());
        n.push(0);
        m.push(n);
        for c in bytes.chunks(piece) {
            let mut d = vec![b'd'];
            d.extend_from_slice(c);
            m.push(d);
            done += c.len() as u64;
            let mut p = vec![b'p'];
            p.extend_from_slice(&done.to_be_bytes());
            m.push(p);
        }
    }
    m.push(vec![b'm']);
    for c in manifest.chunks(100) {
        let mut d = vec![b'd'];
        d.extend_from_slice(c);
        m.push(d);
    }
    m
}

#[derive(Default)]
struct Recorder {
    events: Vec<String>,
    files: std::collections::BTreeMap<String, Vec<u8>>,
    cur: Option<String>,
    archive: Option<u32>,
    progress: Vec<u64>,
}

impl StreamSink for Recorder {
    fn begin_archive(&mut self, name: &str, ts: Option<u32>) -> Result<()> {
        self.archive = ts;
        self.events.push(format!("archive {name} {ts:?}"));
        Ok(())
    }
    fn directory(&mut self, p: &str, mode: u32) -> Result<()> {
        self.events.push(format!("dir {p} {mode:o}"));
        Ok(())
    }
    fn symlink(&mut self, p: &str, t: &str) -> Result<()> {
        self.events.push(format!("link {p} -> {t}"));
        Ok(())
    }
    fn file_begin(&mut self, p: &str, size: u64, _: u32, _: i64) -> Result<()> {
        let key = match self.archive {
            Some(o) => format!("{o}:{p}"),
            None => p.to_string(),
        };
        self.events.push(format!("file {key} {size}"));
        self.files.insert(key.clone(), Vec::new());
        self.cur = Some(key);
        Ok(())
    }
    fn file_data(&mut self, d: &[u8]) -> Result<()> {
        let k = self.cur.clone().unwrap();
        self.files.get_mut(&k).unwrap().extend_from_slice(d);
        Ok(())
    }
    fn file_end(&mut self) -> Result<()> {
        self.cur = None;
        Ok(())
    }
    fn progress(&mut self, done: u64) {
        self.progress.push(done);
    }
}

fn big() -> Vec<u8> {
    (0..300_000u32)
        .flat_map(|i| (i % 251).to_le_bytes())
        .collect()
}

/// A base archive and one tablespace's, and the manifest that lists their files.
fn cluster() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let base = tar(&[
        E::File("backup_label", b"START WAL LOCATION: 0/2000028\n".to_vec()),
        E::File("tablespace_map", b"16385 /srv/ts\n".to_vec()),
        E::Dir("base"),
        E::Dir("base/5"),
        E::File("base/5/16384", big()),
        E::File("base/5/PG_VERSION", b"15\n".to_vec()),
        E::Dir("global"),
        E::Dir("pg_wal"),
        E::File("pg_wal/000000010000000000000002", vec![7u8; 4096]),
        E::Link("pg_wal_link", "/elsewhere"),
        E::File("global/pg_control", vec![1u8; 8192]),
    ]);
    let ts = tar(&[
        E::Dir("PG_15_202209061"),
        E::Dir("PG_15_202209061/5"),
        E::File("PG_15_202209061/5/16400", vec![3u8; 10_000]),
    ]);
    let f = |path: &str, d: &[u8]| PgManifestFile {
        path: path.into(),
        size: d.len() as u64,
        mtime: 1_700_000_000,
        crc32c: crc32c::crc32c(d),
    };
    let manifest = render_pg_manifest(
        150000,
        42,
        &[
            f("backup_label", b"START WAL LOCATION: 0/2000028\n"),
            f("tablespace_map", b"16385 /srv/ts\n"),
            f("base/5/16384", &big()),
            f("base/5/PG_VERSION", b"15\n"),
            f("global/pg_control", &[1u8; 8192]),
            f("pg_tblspc/16385/PG_15_202209061/5/16400", &[3u8; 10_000]),
        ],
        &[PgWalRange {
            timeline: 1,
            start: Lsn(0x2000028),
            end: Lsn(0x2000100),
        }],
    );
    (base, ts, manifest)
}

fn decode(codec: WireCodec, piece: usize) -> (Result<Decoded>, Recorder) {
    let (base, ts, manifest) = cluster();
    let msgs = messages(
        &[
            ("16385.tar", "/srv/ts", compress(codec, &ts)),
            ("base.tar", "", compress(codec, &base)),
        ],
        &manifest,
        piece,
    );
    let mut rec = Recorder::default();
    let r = decode_copy_stream(
        &mut msgs.into_iter(),
        codec,
        &[(16385, "/srv/ts".into())],
        &mut rec,
    );
    (r, rec)
}

#[test]
fn every_codec_decodes_and_matches_the_manifest() {
    for codec in [
        WireCodec::None,
        WireCodec::Gzip,
        WireCodec::Lz4,
        WireCodec::Zstd,
    ] {
        for piece in [1, 7, 1000, 1 << 20] {
            let (r, rec) = decode(codec, piece);
            let d = r.unwrap_or_else(|e| panic!("{codec:?} {piece}: {e}"));
            assert_eq!(
                d.archives,
                vec!["16385.tar", "base.tar"],
                "{codec:?} {piece}"
            );
            assert_eq!(rec.files["base/5/16384"], big(), "{codec:?}");
            assert_eq!(
                rec.files["16385:PG_15_202209061/5/16400"],
                vec![3u8; 10_000]
            );
            assert!(!rec.files.contains_key("backup_label"), "held back");
            assert!(!rec.files.contains_key("global/pg_control"), "held back");
            assert_eq!(d.control.as_ref().unwrap().bytes, vec![1u8; 8192]);
            assert_eq!(d.control.as_ref().unwrap().mode, 0o600);
            assert!(d.backup_label.unwrap().bytes.starts_with(b"START WAL"));
            assert_eq!(d.tablespace_map.unwrap().bytes, b"16385 /srv/ts\n");
            assert!(rec.events.contains(&"dir base/5 700".to_string()));
            assert!(rec
                .events
                .contains(&"link pg_wal_link -> /elsewhere".to_string()));
            assert!(rec.events[0].starts_with("archive 16385.tar Some(16385)"));
            assert!(!rec.progress.is_empty());
            check_manifest(&d.received, d.manifest.as_ref(), "test").unwrap();
            assert!(d.wire_bytes > 0);
            assert_eq!(
                d.logical_bytes,
                big().len() as u64 + 10_000 + 8192 + 4096 + 3 + 30 + 14
            );
        }
    }
}

#[test]
fn a_short_stream_is_refused() {
    for codec in [
        WireCodec::None,
        WireCodec::Gzip,
        WireCodec::Lz4,
        WireCodec::Zstd,
    ] {
        let (base, _, manifest) = cluster();
        let c = compress(codec, &base);
        for cut in [c.len() / 2, c.len() - 1100.min(c.len() / 3)] {
            let msgs = messages(&[("base.tar", "", c[..cut].to_vec())], &manifest, 4096);
            let e = decode_copy_stream(&mut msgs.into_iter(), codec, &[], &mut Recorder::default())
                .map(|d| d.archives)
                .unwrap_err();
            assert!(matches!(e, Error::Corrupt { .. }), "{codec:?} {cut}: {e}");
            assert!(e.to_string().contains("base.tar"), "{e}");
        }
        // The stream ends (CopyDone) in the middle of the archive, without a manifest.
        let mut msgs = messages(&[("base.tar", "", c.clone())], &manifest, c.len() / 4);
        msgs.truncate(2);
        let e = decode_copy_stream(&mut msgs.into_iter(), codec, &[], &mut Recorder::default())
            .map(|d| d.archives)
            .unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{codec:?}: {e}");
        // The stream ends after the archive, without the manifest: decoded, but the check
        // refuses it.
        let mut msgs = messages(&[("base.tar", "", c.clone())], &manifest, 4096);
        let m = msgs.iter().position(|m| m == b"m").unwrap();
        msgs.truncate(m);
        let d = decode_copy_stream(&mut msgs.into_iter(), codec, &[], &mut Recorder::default())
            .unwrap();
        assert!(check_manifest(&d.received, d.manifest.as_ref(), "t").is_err());
    }
}

#[test]
fn a_corrupt_archive_is_refused() {
    let (base, _, manifest) = cluster();
    // A damaged tar header.
    let mut t = base.clone();
    t[512 * 2 + 10] ^= 0x01; // the name in the second header
    let msgs = messages(&[("base.tar", "", t)], &manifest, 4096);
    let e = decode_copy_stream(
        &mut msgs.into_iter(),
        WireCodec::None,
        &[],
        &mut Recorder::default(),
    );
    assert!(matches!(e, Err(Error::Corrupt { .. })), "{e:?}");
    // Damaged compressed bytes: zstd and gzip carry checksums; lz4 frames from the encoder
    // carry a content checksum too.
    for codec in [WireCodec::Gzip, WireCodec::Lz4, WireCodec::Zstd] {
        let mut c = compress(codec, &base);
        let at = c.len() / 2;
        c[at] ^= 0xff;
        c[at + 1] ^= 0x0f;
        let msgs = messages(&[("base.tar", "", c)], &manifest, 4096);
        let r = decode_copy_stream(&mut msgs.into_iter(), codec, &[], &mut Recorder::default());
        match r {
            Err(e) => assert!(matches!(e, Error::Corrupt { .. }), "{codec:?}: {e}"),
            // A flip that decodes to other bytes is caught by the manifest.
            Ok(d) => assert!(
                check_manifest(&d.received, d.manifest.as_ref(), "t").is_err(),
                "{codec:?}: damage not seen"
            ),
        }
    }
    // Unsafe paths and unknown entry types.
    for bad in [
        tar(&[E::File("../escape", b"x".to_vec())]),
        tar(&[E::File("/abs", b"x".to_vec())]),
        tar(&[E::File("a/../../b", b"x".to_vec())]),
    ] {
        let msgs = messages(&[("base.tar", "", bad)], &manifest, 4096);
        let e = decode_copy_stream(
            &mut msgs.into_iter(),
            WireCodec::None,
            &[],
            &mut Recorder::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("unsafe"), "{e}");
    }
    let mut odd = tar(&[E::File("x", b"x".to_vec())]);
    odd[156] = b'3';
    odd[148..156].copy_from_slice(b"        ");
    let sum: u64 = odd[..512].iter().map(|&b| b as u64).sum();
    odd[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let msgs = messages(&[("base.tar", "", odd)], &manifest, 4096);
    assert!(decode_copy_stream(
        &mut msgs.into_iter(),
        WireCodec::None,
        &[],
        &mut Recorder::default()
    )
    .is_err());
    // Garbage CopyData types and a stream without an archive start: the server broke the
    // protocol (its own kind: exit code 3 and the hint about what --source reaches).
    let protocol = |e: Error| {
        assert!(matches!(e.kind(), Error::Protocol { .. }), "{e:?}");
        assert_eq!(e.exit_code(), 3);
        assert!(e.hint().contains("replication protocol"), "{}", e.hint());
    };
    let e = decode_copy_stream(
        &mut vec![b"zz".to_vec()].into_iter(),
        WireCodec::None,
        &[],
        &mut Recorder::default(),
    );
    protocol(e.unwrap_err());
    let mut msgs = messages(&[("base.tar", "", base)], &manifest, 4096);
    msgs.insert(3, vec![b'q', 1, 2]);
    protocol(
        decode_copy_stream(
            &mut msgs.into_iter(),
            WireCodec::None,
            &[],
            &mut Recorder::default(),
        )
        .unwrap_err(),
    );
}

/// The received entry of `path`, to change it.
fn entry<'a>(r: &'a mut Received, path: &str) -> &'a mut (u64, u64, u32, bool) {
    let h = xxhash_rust::xxh3::xxh3_64(path.as_bytes());
    r.entries.iter_mut().find(|e| e.0 == h).unwrap()
}

#[test]
fn manifest_mismatches_name_the_file() {
    let (r, _) = decode(WireCodec::Lz4, 4096);
    let d = r.unwrap();
    let manifest = d.manifest.as_ref().unwrap().bytes().unwrap();
    let check = |r: &Received, m: &[u8]| check_manifest_from(r, &mut &m[..], "t");
    check(&d.received, &manifest).unwrap();
    // A different file.
    let mut files = d.received.clone();
    entry(&mut files, "base/5/16384").2 ^= 1;
    let e = check(&files, &manifest).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }));
    assert!(e.to_string().contains("base/5/16384 (CRC-32C"), "{e}");
    // A missing one, an unexpected one (WAL is never listed, so never unexpected).
    let mut files = d.received.clone();
    entry(&mut files, "pg_tblspc/16385/PG_15_202209061/5/16400").0 ^= 1;
    files.add("pg_wal/000000010000000000000009", 16, 0);
    let e = check(&files, &manifest).unwrap_err().to_string();
    assert!(
        e.contains("pg_tblspc/16385/PG_15_202209061/5/16400 (missing"),
        "{e}"
    );
    assert!(
        e.contains("1 file(s) in the stream that the manifest does not list"),
        "{e}"
    );
    assert!(!e.contains("pg_wal"), "{e}");
    // A size difference.
    let mut files = d.received.clone();
    entry(&mut files, "base/5/PG_VERSION").1 += 1;
    assert!(check(&files, &manifest)
        .unwrap_err()
        .to_string()
        .contains("base/5/PG_VERSION (size"));
    // A manifest whose own checksum is wrong, truncated, or not a manifest.
    let mut m = manifest.clone();
    let at = m.windows(5).position(|w| w == b"16384").unwrap();
    m[at] = b'7';
    assert!(check(&d.received, &m)
        .unwrap_err()
        .to_string()
        .contains("checksum"));
    assert!(check(&d.received, &manifest[..manifest.len() - 90]).is_err());
    assert!(check(&d.received, b"{").is_err());
    assert!(check_manifest(&d.received, None, "t").is_err());
    let (entries, wal) = parse_manifest(&manifest).unwrap();
    assert_eq!(entries.len(), 6);
    assert_eq!(wal, vec![(1, Lsn(0x2000028), Lsn(0x2000100))]);
}

#[test]
fn command_text() {
    let c = BaseBackupCommand {
        label: "it's".into(),
        fast: true,
        wal: false,
        max_rate: Some(10 << 20),
        codec: WireCodec::Zstd,
        level: Some(3),
        workers: Some(2),
        incremental: false,
        tablespace_map: true,
    };
    assert_eq!(
        c.sql(),
        "BASE_BACKUP ( LABEL 'it''s', PROGRESS, CHECKPOINT 'fast', WAL false, WAIT false, \
         MANIFEST 'yes', MANIFEST_CHECKSUMS 'CRC32C', TABLESPACE_MAP, MAX_RATE 10240, \
         COMPRESSION 'zstd', COMPRESSION_DETAIL 'level=3,workers=2' )"
    );
    let c = BaseBackupCommand {
        codec: WireCodec::None,
        max_rate: None,
        ..c
    };
    assert!(!c.sql().contains("COMPRESSION"));
    assert!(!c.sql().contains("INCREMENTAL"));
    let c = BaseBackupCommand {
        incremental: true,
        ..c
    };
    assert!(c.sql().contains(", TABLESPACE_MAP, INCREMENTAL )"));
}

#[test]
fn tar_numbers() {
    assert_eq!(tar_number(b"0000644\0"), Some(0o644));
    assert_eq!(tar_number(b"  644 \0"), Some(0o644));
    assert_eq!(
        tar_number(&[0x80, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0]),
        Some(2 << 32)
    );
    assert_eq!(tar_number(b"9\0"), None);
    assert_eq!(safe_path(b"./base/1"), Some("base/1".into()));
    assert_eq!(safe_path(b"a//b"), None);
}
