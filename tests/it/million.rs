//! A backup of a million files, synthetic but stored, checked and restored with the real
//! code: the manifest written as a stream ([`ManifestWriter`]), checked in one pass
//! ([`Backup::scan`]), verified and restored from a second pass ([`ReadBack`] over a
//! [`ManifestReader`]), each phase's peak resident memory measured in a child process.
//!
//! The one test plays two roles. Run normally, it is the parent: it re-runs this test binary
//! with only itself selected and [`CHILD_DIR_ENV`] set to a scratch filesystem; that child
//! runs [`child_workload`], which prints one `VmHWM <phase> <KiB>` line per phase (resetting
//! the peak between phases through /proc/self/clear_refs) and fails on a phase over the
//! limit, and the parent asserts the child succeeded and reported every phase under 200 MiB.
//! There is no separate child test that could pass without doing anything.
use pgjet_core::codec::{self, CompressType, Compression};
use pgjet_core::pg::lsn::Lsn;
use pgjet_core::pgdata::write::DataDirWriter;
use pgjet_core::repo::manifest_io::ManifestWriter;
use pgjet_core::repo::read_back::{ReadBack, Want};
use pgjet_core::repo::restore_target::RestoreTarget;
use pgjet_core::repo::{
    Backup, DirEntry, FileEntry, ManifestHeader, Piece, Stanza, StopInfo, REPO_FORMAT,
};
use pgjet_core::storage::posix::PosixStorage;
use pgjet_core::transfer::NoProgress;
use std::path::Path;
use std::time::Instant;

const FILES: usize = 1_000_000;
const PER_DIR: usize = 1000;
/// Files per bundle object (the backup's own limit, `BUNDLE_MAX_FILES`).
const PER_OBJECT: usize = pgjet_core::transfer::BUNDLE_MAX_FILES;
const STANZA: &str = "million";
const LABEL: &str = "20261122-120000F";
/// The limit the issue sets for a million files.
const LIMIT_KIB: u64 = 200 << 10;
/// Set by the parent for its child: the directory the child works in.
const CHILD_DIR_ENV: &str = "PGJET_MILLION_DIR";
/// The phases the child reports, in order.
const PHASES: [&str; 4] = ["backup-manifest-write", "scan", "verify", "restore"];

/// Content of file `i`: 40 to 167 bytes that differ from file to file.
fn content(i: usize) -> Vec<u8> {
    let len = 40 + i % 128;
    format!("{i:0>len$}").into_bytes()
}

fn path_of(i: usize) -> String {
    format!("base/{}/{}", i / PER_DIR, i)
}

/// Peak resident set of this process, KiB, then reset (Linux: `5` to clear_refs).
fn take_peak() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    kib
}

/// Prints the phase's peak for the parent and fails when it is over the limit.
fn report(phase: &str, started: Instant) {
    let kib = take_peak();
    println!(
        "VmHWM {phase} {kib} ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    assert!(
        kib < LIMIT_KIB,
        "{phase}: peak {kib} KiB, limit {LIMIT_KIB} KiB"
    );
}

/// Stores FILES small files (plus pg_control) in bundles and writes their manifest.
fn write_backup(backup: &Backup) {
    let header = ManifestHeader {
        format: REPO_FORMAT,
        label: LABEL.into(),
        backup_type: "full".into(),
        stanza: STANZA.into(),
        system_identifier: 7,
        pg_version: "15".into(),
        pg_version_num: 150000,
        catalog_version: 202209061,
        start_time: "2026-11-22T12:00:00Z".into(),
        start_lsn: "0/2000028".parse::<Lsn>().unwrap(),
        wal_segment_size: 16 << 20,
        block_size: 8192,
        data_checksums: true,
        compression: Compression::new(CompressType::None, None).unwrap(),
        tablespaces: vec![],
        reference: None,
        databases: vec![],
    };
    let mut w = backup.begin(header).unwrap();
    w.dir(&DirEntry {
        path: "base".into(),
        mode: 0o700,
    })
    .unwrap();
    w.dir(&DirEntry {
        path: "global".into(),
        mode: 0o700,
    })
    .unwrap();
    for d in 0..FILES.div_ceil(PER_DIR) {
        w.dir(&DirEntry {
            path: format!("base/{d}"),
            mode: 0o700,
        })
        .unwrap();
    }
    let mut stored = 0u64;
    let (mut object, mut n) = (Vec::new(), 0usize);
    let mut pending: Vec<FileEntry> = Vec::new();
    let mut flush = |object: &mut Vec<u8>,
                     n: &mut usize,
                     pending: &mut Vec<FileEntry>,
                     w: &mut ManifestWriter| {
        let name = pgjet_core::repo::sink::object_id(*n);
        backup.put_object(&name, object).unwrap();
        stored += object.len() as u64;
        for f in pending.drain(..) {
            w.file(&f).unwrap();
        }
        object.clear();
        *n += 1;
    };
    for i in 0..=FILES {
        let (path, data) = if i == FILES {
            ("global/pg_control".to_string(), vec![3u8; 8192])
        } else {
            (path_of(i), content(i))
        };
        let piece = Piece {
            backup: None,
            frame: None,
            object: pgjet_core::repo::sink::object_id(n),
            offset: object.len() as u64,
            stored_size: data.len() as u64,
            stored_xxh3: codec::xxh3_hex(&data),
            logical_offset: 0,
            logical_size: data.len() as u64,
            zero_pages: vec![],
            xxh3: Some(codec::xxh3_hex(&data)),
            crc32c: Some(codec::crc32c(&data)),
        };
        object.extend_from_slice(&data);
        pending.push(FileEntry {
            path,
            size: data.len() as u64,
            mtime: 1_700_000_000 + i as i64,
            mode: 0o600,
            crc32c: Some(codec::crc32c(&data)),
            pieces: vec![piece],
            page_errors: vec![],
        });
        if pending.len() == PER_OBJECT {
            flush(&mut object, &mut n, &mut pending, &mut w);
        }
    }
    if !pending.is_empty() {
        flush(&mut object, &mut n, &mut pending, &mut w);
    }
    let stop = StopInfo {
        stop_time: "2026-11-22T12:01:00Z".into(),
        stop_lsn: "0/2000100".parse::<Lsn>().unwrap(),
        timeline: 1,
        backup_label: String::new(),
        tablespace_map: None,
        wal_segments: vec![],
        archive_start: None,
        archive_stop: None,
    };
    w.finish(stop, stored).unwrap();
}

fn read_back<'a>(
    backup: &'a Backup<'a>,
    contiguous: bool,
    target: Option<&'a dyn RestoreTarget>,
) -> ReadBack<'a> {
    ReadBack {
        backup,
        kind: CompressType::None,
        chain: &[],
        contiguous,
        target,
        jobs: 2,
    }
}

/// The workload, run only in the child the parent starts, in `dir` (an empty directory).
fn child_workload(dir: &Path) {
    std::fs::create_dir(dir.join("repo")).unwrap();
    let store = PosixStorage::open(&dir.join("repo")).unwrap();
    let stanza = Stanza::new(1, std::sync::Arc::new(store), STANZA);
    let backup = stanza.backup(LABEL);
    take_peak();
    let t = Instant::now();
    write_backup(&backup);
    report("backup-manifest-write", t);

    let t = Instant::now();
    let scan = backup.scan().unwrap();
    assert_eq!(scan.summary.end.files, FILES as u64 + 1);
    assert_eq!(scan.directories.len(), FILES.div_ceil(PER_DIR) + 2);
    assert!(scan.contiguous);
    report("scan", t);

    let t = Instant::now();
    let files = backup.manifest_reader().unwrap().files();
    let bad = read_back(&backup, scan.contiguous, None)
        .run(files, &mut |_| Ok(Want::All), &NoProgress)
        .unwrap();
    assert!(bad.bad.is_empty(), "{bad:?}");
    report("verify", t);

    let t = Instant::now();
    let target = dir.join("restore");
    std::fs::create_dir(&target).unwrap();
    for d in &scan.directories {
        std::fs::create_dir_all(target.join(&d.path)).unwrap();
    }
    let files = backup.manifest_reader().unwrap().files();
    let mut created = 0usize;
    let writer = DataDirWriter {
        root: &target,
        overwrite: false,
    };
    let bad = read_back(&backup, scan.contiguous, Some(&writer))
        .run(
            files,
            &mut |f| {
                if f.path == "global/pg_control" {
                    return Ok(Want::Nothing);
                }
                created += 1;
                // As restore does: a small file of one piece is created by its writer, any
                // other here, before its pieces are written.
                if f.pieces.len() == 1 && f.size < 1 << 20 {
                    return Ok(Want::Create(f.mode));
                }
                pgjet_core::pgdata::create_file(&target, &f.path, f.size, f.mode)?;
                Ok(Want::All)
            },
            &NoProgress,
        )
        .unwrap();
    assert!(bad.bad.is_empty(), "{bad:?}");
    assert_eq!(created, FILES);
    report("restore", t);
    // Spot checks: contents and modification times.
    for i in [0, 1, 4095, 4096, 500_000, FILES - 1] {
        let p = target.join(path_of(i));
        assert_eq!(std::fs::read(&p).unwrap(), content(i), "{}", p.display());
        let mtime = std::fs::metadata(&p)
            .unwrap()
            .modified()
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert_eq!(mtime, 1_700_000_000 + i as u64, "{}", p.display());
    }
    assert!(!target.join("global/pg_control").exists());
}

/// A scratch filesystem for a million files: ext4 in a sparse image file, loop-mounted, so
/// that removing the files afterwards is an unmount (removing a million files one by one
/// takes about two minutes here). Falls back to a plain directory when it cannot mount.
struct Scratch {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("pgjet-million-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let image = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let run = |cmd: &str, args: &[&str]| {
            std::process::Command::new(cmd)
                .args(args)
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        let img = image.to_str().unwrap();
        let mounted = std::fs::File::create(&image)
            .and_then(|f| f.set_len(8 << 30))
            .is_ok()
            && run("mkfs.ext4", &["-q", "-F", "-N", "1200000", img])
            && run("mount", &["-o", "loop", img, mnt.to_str().unwrap()]);
        if !mounted {
            eprintln!(
                "no loop-mounted ext4 here: the files go to {} and their removal is slow",
                mnt.display()
            );
            let _ = std::fs::remove_file(&image);
        }
        Scratch { dir, mounted }
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.mounted {
            let mnt = self.path();
            let ok = std::process::Command::new("umount")
                .arg(&mnt)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&mnt)
                    .status();
            }
        }
    }
}

#[test]
fn a_million_files_stay_under_200_mib() {
    if let Some(dir) = std::env::var_os(CHILD_DIR_ENV) {
        // The child's role: the parent below started this process.
        child_workload(Path::new(&dir));
        return;
    }
    let scratch = Scratch::new();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "million::a_million_files_stay_under_200_mib",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_ENV, scratch.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child failed");
    let t = Instant::now();
    drop(scratch);
    eprintln!(
        "removed the million files in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let peaks: Vec<(String, u64)> = stdout
        .lines()
        .filter_map(|l| l.find("VmHWM ").map(|i| &l[i + 6..]))
        .map(|l| {
            let mut w = l.split_whitespace();
            (
                w.next().unwrap().to_string(),
                w.next().unwrap().parse().unwrap(),
            )
        })
        .collect();
    let names: Vec<&str> = peaks.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        names, PHASES,
        "the child must report every phase:\n{stdout}"
    );
    for (phase, kib) in &peaks {
        eprintln!("{phase}: peak {:.1} MiB", *kib as f64 / 1024.0);
        assert!(
            *kib < LIMIT_KIB,
            "{phase}: peak {kib} KiB, limit {LIMIT_KIB} KiB"
        );
    }
}
