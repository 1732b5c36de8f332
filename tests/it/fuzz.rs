//! Hostile input, fuzzed on stable Rust with proptest (bounded: a few hundred to a few
//! thousand cases per target, seconds in all): every parser that reads bytes from a
//! repository or a server gets random bytes and mutations of valid input. None may panic or
//! allocate from a length field it has not checked; each rejection must say what was wrong
//! (a non-empty message).
//!
//! Targets: WAL archive objects (header line and frame), stored frames and slices of a
//! backup (`decode_piece`), encrypted objects (whole, in place, sizes), WAL file names,
//! backup labels, timeline history files, the server's backup_manifest, replication
//! protocol messages (ErrorResponse fields, DataRow), conninfo strings and URIs, the
//! config file (INI) through the whole option resolution, pgjet's own manifest lines,
//! summaries and gap records (read back from a repository), and the BASE_BACKUP stream's tar
//! archives.

use crate::common::CountingSink;
use pgjet_core::codec::{CompressType, Compression, Compressor};
use pgjet_core::repo::cipher::{self, DataKey, ObjectCipher};
use pgjet_core::repo::{FrameSlice, Piece};
use proptest::prelude::*;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Failures are reported with their input; nothing is written to the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// `bytes` with `edits` applied: (position, new byte) pairs, positions taken modulo the
/// length; then cut to `cut` bytes when shorter.
fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8)], cut: Option<usize>) -> Vec<u8> {
    if !bytes.is_empty() {
        let n = bytes.len();
        for &(i, b) in edits {
            bytes[i % n] = b;
        }
    }
    if let Some(c) = cut {
        bytes.truncate(c);
    }
    bytes
}

/// A valid archive object of a small WAL file, compressed with `kind`.
fn wal_object(kind: CompressType, data: &[u8]) -> Vec<u8> {
    let c = Compression {
        kind,
        level: if kind == CompressType::Gzip { 6 } else { 1 },
    };
    let mut comp = Compressor::new(c).unwrap();
    pgjet_core::repo::wal::encode("000000010000000000000001", data, c, &mut comp, 42).unwrap()
}

fn kinds() -> impl Strategy<Value = CompressType> {
    prop_oneof![
        Just(CompressType::None),
        Just(CompressType::Lz4),
        Just(CompressType::Zstd),
        Just(CompressType::Gzip)
    ]
}

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn wal_objects(
        kind in kinds(),
        data in prop::collection::vec(any::<u8>(), 0..4096),
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in prop::option::of(0usize..5000),
        noise in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let obj = wal_object(kind, &data);
        let name = "main/archive/00000001/0000000000000000/000000010000000000000001";
        // The object as written decodes to the data.
        let (_, back) = pgjet_core::repo::wal::decode(name, "000000010000000000000001", &obj).unwrap();
        prop_assert_eq!(&back, &data);
        for bytes in [mutate(obj, &edits, cut), noise] {
            match pgjet_core::repo::wal::decode(name, "000000010000000000000001", &bytes) {
                Ok((h, out)) => prop_assert_eq!(out.len() as u64, h.size),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
            let _ = pgjet_core::repo::wal::parse_header(name, &bytes);
        }
    }

    #[test]
    fn stored_frames_and_slices(
        kind in kinds(),
        frame in prop::collection::vec(any::<u8>(), 0..2048),
        logical_size in 0u64..(64 << 10),
        zero_pages in prop::collection::vec((0u32..16, 0u32..16), 0..4),
        slice in prop::option::of((0u64..(80 << 10), 0u64..(80 << 10))),
    ) {
        let zero_pages: Vec<[u32; 2]> = zero_pages.into_iter().map(|(a, b)| [a, b]).collect();
        let hash = pgjet_core::codec::xxh3_hex(&frame);
        let piece = Piece {
            backup: None,
            object: "000001".into(),
            offset: 0,
            stored_size: frame.len() as u64,
            stored_xxh3: hash.clone(),
            logical_offset: 0,
            logical_size,
            zero_pages: zero_pages.clone(),
            xxh3: Some("0".repeat(32)),
            crc32c: None,
            frame: slice.map(|(size, skip)| FrameSlice {
                size,
                skip,
                zero_pages,
                xxh3: "0".repeat(32),
            }),
        };
        let mut out = pgjet_core::io::direct::aligned_buf(0);
        let mut cache = pgjet_core::repo::frame::FrameCache::new();
        match pgjet_core::repo::frame::decode_piece(kind, &frame, &piece, &mut out, &mut cache) {
            // Random bytes cannot match the logical hash.
            Ok(()) => prop_assert!(false, "random frame accepted"),
            Err(why) => prop_assert!(!why.is_empty()),
        }
    }

    #[test]
    fn encrypted_objects(
        plain in prop::collection::vec(any::<u8>(), 0..200_000),
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in prop::option::of(0usize..210_000),
        noise in prop::collection::vec(any::<u8>(), 0..300),
        size in any::<u64>(),
    ) {
        let key = DataKey::random().unwrap();
        let repo = [3u8; cipher::REPO_ID_LEN];
        let c = ObjectCipher { key: &key, repo_id: &repo };
        let name = "main/backup/L/data/000001";
        let sealed = c.seal(name, &plain).unwrap();
        prop_assert_eq!(&c.open(name, &sealed).unwrap(), &plain);
        let bad = mutate(sealed.clone(), &edits, cut);
        for bytes in [bad, noise] {
            if bytes == sealed {
                continue;
            }
            let whole = c.open(name, &bytes);
            prop_assert!(whole.is_err(), "a changed object opened");
            prop_assert!(!whole.unwrap_err().to_string().is_empty());
            let mut b = bytes.clone();
            prop_assert!(c.open_in_place(name, &mut b).is_err());
        }
        let _ = cipher::plain_size(name, size);
    }

    #[test]
    fn names_labels_history_and_server_messages(
        text in "\\PC{0,200}",
        bytes in prop::collection::vec(any::<u8>(), 0..400),
        label_edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
    ) {
        if let Err(e) = pgjet_core::repo::wal::WalFile::parse(&text) {
            prop_assert!(!e.to_string().is_empty());
        }
        let _ = pgjet_core::pg::lsn::parse_wal_segment_name(&text, 16 << 20);
        let label = "START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\n\
                     CHECKPOINT LOCATION: 0/2000060\nBACKUP METHOD: streamed\n\
                     BACKUP FROM: primary\nSTART TIME: 2026-11-26 10:00:00 UTC\n\
                     LABEL: pgjet\nSTART TIMELINE: 1\n";
        let mutated = mutate(label.as_bytes().to_vec(), &label_edits, None);
        for t in [text.clone(), String::from_utf8_lossy(&mutated).into_owned()] {
            if let Err(e) = pgjet_core::pg::lsn::parse_backup_label(&t) {
                let said = format!("{e:?}");
                prop_assert!(!said.is_empty());
            }
            let _ = pgjet_core::pg::lsn::parse_history(&t);
        }
        if let Err(e) = pgjet_core::pg::pg_manifest::parse_manifest(&bytes) {
            prop_assert!(!e.to_string().is_empty());
        }
        if let Err(e) = pgjet_core::pg::pg_manifest::parse_manifest(text.as_bytes()) {
            prop_assert!(!e.to_string().is_empty());
        }
        let _ = pgjet_core::remote::replication::parse_error_fields(&bytes);
        if let Err(e) = pgjet_core::remote::replication::parse_data_row(&bytes) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn conninfo_strings_and_uris(
        text in "\\PC{0,160}",
        uri_tail in "[a-z0-9%@:/?&=.\\[\\]-]{0,80}",
        kv in prop::collection::vec(("[a-z_]{1,12}", "[^'\\\\ ]{0,12}"), 0..6),
    ) {
        let kv: String = kv.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        for s in [text, format!("postgresql://{uri_tail}"), kv] {
            if let Err(e) = pgjet_core::pg::conninfo::ConnInfo::parse(&s) {
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}

proptest! {
    #![proptest_config(config(300))]

    /// The config file goes through the whole option resolution: read, classified,
    /// checked, resolved for a command. Errors and warnings only.
    #[test]
    fn config_files(
        lines in prop::collection::vec(
            prop_oneof![
                "\\PC{0,60}",
                "(repo[1-5]?-|pg1-|)[a-z-]{1,24}=\\PC{0,30}",
                "\\[[a-z:-]{0,20}\\]",
            ],
            0..12,
        ),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pgjet.conf");
        std::fs::write(&f, lines.join("\n")).unwrap();
        let env: std::collections::HashMap<String, String> = Default::default();
        // What `pgjet --config F --stanza main info` parses to (the core has no clap).
        let values = [("config", f.to_str().unwrap()), ("stanza", "main")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
            .collect();
        let parsed = pgjet_core::options::resolve::Parsed {
            cmd: pgjet_core::options::table::Cmd::Info,
            values,
            args: Vec::new(),
        };
        let mut warnings = Vec::new();
        if let Err(error) =
            pgjet_core::options::resolve::resolve_invocation(parsed, &env, &mut warnings)
        {
            prop_assert!(!error.to_string().is_empty());
        }
    }
}

/// A posix repository in a temporary directory with stanza "s" and backup "L" (the
/// manifest of a small backup and its summary, written by pgjet's own writer).
fn repository_with_a_backup() -> (tempfile::TempDir, pgjet_core::repo::Stanza) {
    let dir = tempfile::tempdir().unwrap();
    let store = pgjet_core::storage::posix::PosixStorage::open(dir.path()).unwrap();
    let st = pgjet_core::repo::Stanza::new(1, std::sync::Arc::new(store), "s");
    let piece = |off: u64, size: u64| {
        serde_json::json!({"object": "000001", "offset": 0, "stored_size": 10, "stored_xxh3": "x",
            "logical_offset": off, "logical_size": size, "xxh3": "y", "crc32c": 0})
    };
    let m: pgjet_core::repo::manifest::BackupManifest = serde_json::from_value(serde_json::json!({
        "format": pgjet_core::repo::REPO_FORMAT, "label": "L", "type": "full", "stanza": "s",
        "system_identifier": "1", "pg_version": "15", "pg_version_num": 150000,
        "catalog_version": 1, "start_time": "", "stop_time": "", "start_lsn": "0/1",
        "stop_lsn": "0/2", "timeline": 1, "wal_segment_size": 16777216, "block_size": 8192,
        "data_checksums": true, "compression": {"type": "zstd", "level": 1},
        "backup_label": "", "tablespace_map": null, "tablespaces": [],
        "wal_segments": ["000000010000000000000001"], "size": 0, "stored_size": 0,
        "directories": [{"path": "base", "mode": 448}],
        "files": [
            {"path": "global/pg_control", "size": 8192, "mtime": 0, "mode": 384, "crc32c": 0, "pieces": [piece(0, 8192)]},
            {"path": "base/1/2", "size": 9437184, "mtime": 0, "mode": 384, "crc32c": 0,
             "pieces": [piece(0, 8388608), piece(8388608, 1048576)]},
        ]
    }))
    .unwrap();
    st.backup("L").write_manifest(&m).unwrap();
    (dir, st)
}

/// The path of object `name` of backup L in `dir`.
fn backup_object(dir: &tempfile::TempDir, name: &str) -> std::path::PathBuf {
    dir.path().join("s/backup/L").join(name)
}

/// A ustar entry: a 512-byte header (name, mode, size, type `kind`, checksum) and `data`
/// padded to whole blocks.
fn tar_entry(name: &str, kind: u8, data: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..108].copy_from_slice(b"0000600\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
    h[136..148].copy_from_slice(b"00000000000\0");
    h[148..156].copy_from_slice(b"        ");
    h[156] = kind;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut out = h.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

proptest! {
    #![proptest_config(config(300))]

    /// pgjet's own manifest (zstd JSON lines, its text mutated and compressed again) and
    /// summary.json, read through the backup's reader; gap records through the archive's.
    #[test]
    fn manifest_lines_summaries_and_gap_records(
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in prop::option::of(0usize..3000),
        noise in prop::collection::vec(any::<u8>(), 0..400),
    ) {
        let (dir, st) = repository_with_a_backup();
        let b = st.backup("L");
        let manifest = backup_object(&dir, "manifest.jsonl.zst");
        let text = zstd::decode_all(&std::fs::read(&manifest).unwrap()[..]).unwrap();
        std::fs::write(&manifest, zstd::encode_all(&mutate(text, &edits, cut)[..], 1).unwrap()).unwrap();
        if let Err(e) = b.manifest() {
            prop_assert!(!e.to_string().is_empty());
        }
        std::fs::write(&manifest, &noise).unwrap();
        if let Err(e) = b.manifest() {
            prop_assert!(!e.to_string().is_empty());
        }
        let summary = backup_object(&dir, "summary.json");
        let good = std::fs::read(&summary).unwrap();
        for bytes in [mutate(good, &edits, cut), noise.clone()] {
            std::fs::write(&summary, &bytes).unwrap();
            if let Err(e) = b.summary() {
                prop_assert!(!e.to_string().is_empty());
            }
        }
        let gap = pgjet_core::repo::wal::Gap {
            first: "000000010000000000000002".into(),
            last: "000000010000000000000004".into(),
            segments: 3,
            recorded: "2026-11-26T00:00:00Z".into(),
            reason: "archive-push-queue-max exceeded".into(),
        };
        pgjet_core::repo::wal::record_gap(&st, &gap).unwrap();
        let gaps = dir.path().join("s/archive/gap");
        let record = std::fs::read_dir(&gaps).unwrap().next().unwrap().unwrap().path();
        let good = std::fs::read(&record).unwrap();
        for bytes in [mutate(good, &edits, cut), noise] {
            std::fs::write(&record, &bytes).unwrap();
            if let Err(e) = pgjet_core::repo::wal::gaps(&st) {
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }

    /// The BASE_BACKUP stream: a tar archive (a directory, a file, the end blocks) cut into
    /// CopyData messages, mutated, or random; the decoder must not panic, nor hand the sink
    /// more file bytes than the stream carried.
    #[test]
    fn tar_streams(
        data in prop::collection::vec(any::<u8>(), 0..3000),
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in prop::option::of(0usize..5000),
        split in 1usize..2000,
        noise in prop::collection::vec(any::<u8>(), 0..1500),
    ) {
        use pgjet_core::remote::basebackup::{decode_copy_stream, WireCodec};
        let mut tar = tar_entry("base", b'5', &[]);
        tar.extend(tar_entry("base/PG_VERSION", b'0', &data));
        tar.extend([0u8; 1024]);
        for (i, body) in [tar.clone(), mutate(tar, &edits, cut), noise].into_iter().enumerate() {
            let mut msgs = vec![b"nbase.tar\0\0".to_vec()];
            for part in body.chunks(split) {
                let mut m = vec![b'd'];
                m.extend_from_slice(part);
                msgs.push(m);
            }
            let wire: usize = msgs.iter().map(|m| m.len()).sum();
            let mut sink = CountingSink::default();
            let r = decode_copy_stream(&mut msgs.into_iter(), WireCodec::None, &[], &mut sink);
            if i == 0 {
                // The archive as built decodes to its one file.
                prop_assert!(r.is_ok(), "{:?}", r.err());
                prop_assert_eq!((sink.files, sink.bytes), (1, data.len() as u64));
            }
            match r {
                Ok(_) => prop_assert!(sink.bytes <= wire as u64),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }
    }
}
