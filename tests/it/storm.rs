//! The kill -9 storm (issue 20): while a writer commits numbered rows into a PostgreSQL 15
//! cluster that archives with `pgjet archive-push` (PostgreSQL's archive_command), pgjet
//! commands are killed with SIGKILL at random moments, and after each kill the same command
//! is run again and must complete:
//!
//! - `backup` (full, incr and diff in turn): the next run resumes or starts over;
//! - `restore` into a new directory: the next run is `restore --delta` into the same one;
//! - `replica-create` from the live cluster: the next run is `--delta` into the same one;
//! - `expire` (retention-full 2): the next run finishes the removal;
//! - `archive-push`: the running ones killed in the middle of a push; PostgreSQL retries;
//! - `archive-get` of an archived segment: the next run writes the same bytes as an
//!   uninterrupted one. (Killing PostgreSQL's own restore_command ends its recovery with
//!   FATAL, by PostgreSQL's design; a restart goes on, so it is not stormed here.)
//!
//! At the end: `verify` passes on every backup `info` lists as complete (a failure counts as
//! broken), and the newest backup restored with recovery to the end of the archive holds
//! every row committed before the final WAL switch (a missing one counts as lost). The
//! report: kills per command, broken, lost; both must be 0.
//!
//! Three storms: a posix repository with synchronous archive-push; the same encrypted
//! (aes-256-gcm); and S3 (versitygw) behind the fault proxy (connection resets, `503 Slow
//! Down` answers and cut requests while the kills go on) with asynchronous archive-push
//! and archive-get, whose background pusher and prefetcher are killed too.
//!
//! CI runs a short storm: `STORM_KILLS` kills per command (default 3). The long one:
//! `STORM_KILLS=100 cargo test --release --test it -- storm:: --nocapture`.
use crate::common;

use crate::common::faultproxy::FaultProxy;
use crate::common::stores::*;
use crate::common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A small deterministic random generator (the seed is printed, so a run can be repeated).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What the storm counted.
#[derive(Default, Debug)]
struct Report {
    kills: std::collections::BTreeMap<&'static str, u32>,
    /// Kills that came after the command had ended by itself (nothing to kill).
    too_late: u32,
    broken: u32,
    lost: u64,
    committed: u64,
}

/// The repository flags (a config file) and the commands' cluster flags.
struct Env<'a> {
    cluster: &'a Cluster,
    conf: PathBuf,
}

impl Env<'_> {
    /// `cmd` on the cluster: its data directory, port and socket, then `extra`.
    fn args(&self, cmd: &str, extra: &[String]) -> Vec<String> {
        let c = self.cluster;
        let mut a = self.target_args(cmd, c.data(), &[]);
        a.extend(args![
            "--pg-port",
            c.port(),
            "--pg-socket-path",
            c.sock().display()
        ]);
        a.extend(extra.iter().cloned());
        a
    }

    /// `restore`-style arguments: the target directory instead of the cluster's.
    fn target_args(&self, cmd: &str, dir: &Path, extra: &[String]) -> Vec<String> {
        let mut a = args![
            cmd,
            "--config",
            self.conf.display(),
            "--stanza",
            "main",
            "--pg-path",
            dir.display()
        ];
        a.extend(extra.iter().cloned());
        a
    }
}

/// Runs `args` in the background, kills it with SIGKILL after `delay`, and returns whether
/// it was still running (a kill that hit something).
fn kill_after(args: &[String], delay: Duration, pidfile: &Path) -> bool {
    let mut b = Background::spawn(&pgjet_bin(), args, pidfile);
    let t = Instant::now();
    while t.elapsed() < delay {
        if b.try_wait().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if b.try_wait().is_some() {
        return false;
    }
    // It may end between the check and the kill (ESRCH): then the kill hit nothing.
    // SAFETY: kill(2) on the PID the program's shell wrote before exec.
    let hit = unsafe { libc::kill(b.pid(), libc::SIGKILL) } == 0;
    let r = b.wait();
    hit && !r.success()
}

/// The storm's state: its random generator, how long each command's last uninterrupted run
/// took, the counts.
struct Storm {
    rng: Rng,
    took: std::collections::BTreeMap<&'static str, Duration>,
    report: Report,
    pid: PathBuf,
}

impl Storm {
    /// Runs `args` and kills it at a random moment of its run (within the time the last
    /// uninterrupted run of `name` took; the first guess: half a second), then runs `again`
    /// to the end, which must succeed.
    fn hit(&mut self, name: &'static str, args: &[String], again: &[String]) {
        let d = self
            .took
            .get(name)
            .copied()
            .unwrap_or(Duration::from_millis(500));
        let at = Duration::from_micros(self.rng.below(d.as_micros() as u64));
        if kill_after(args, at, &self.pid) {
            *self.report.kills.entry(name).or_default() += 1;
        } else {
            self.report.too_late += 1;
        }
        self.took.insert(name, pgjet_ok(again).elapsed);
    }
}

/// The PIDs of the running `pgjet ... <conf> ... <word> ...` processes (this storm's:
/// the other storm of the test binary runs beside it).
fn running(conf: &Path, word: &str) -> Vec<i32> {
    let out = std::process::Command::new("pgrep")
        .args(["-f", &format!("pgjet .*{}.* {word}( |$)", conf.display())])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Kills every running `pgjet ... <word>` of this storm (PostgreSQL's children, or the
/// background pusher).
fn kill_children(conf: &Path, word: &str) -> u32 {
    let mut n = 0;
    for p in running(conf, word) {
        {
            // SAFETY: kill(2) on a PID pgrep just listed; a process gone since is ESRCH.
            if unsafe { libc::kill(p, libc::SIGKILL) } == 0 {
                n += 1;
            }
        }
    }
    n
}

/// Where a storm keeps its repository.
#[derive(Clone, Copy, PartialEq)]
enum Store {
    /// A directory; archive-push synchronous.
    Posix,
    /// versitygw behind the fault proxy, which resets 5% of new connections, answers 5%
    /// with `503 Slow Down` and cuts 2% mid-request while commands are killed (off for the
    /// final checks); archive-push and archive-get asynchronous through a spool, whose
    /// background pusher and prefetcher are killed too.
    S3Faults,
}

fn storm(tag: &str, encrypted: bool, store: Store) {
    let kills: u32 = std::env::var("STORM_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    step!("storm {tag}: {kills} kills per command, seed {seed}");
    let cluster = Cluster::new(&Pg::v15(), tag);
    pgbench_init(&cluster.server, 2);
    cluster.psql("postgres", "CREATE TABLE counter (i bigint PRIMARY KEY)");
    let conf = cluster.root.join("pgjet.conf");
    let cipher = if encrypted {
        "repo1-cipher-type=aes-256-gcm\nrepo1-cipher-pass=storm-passphrase-8d1e\n"
    } else {
        ""
    };
    // S3: plain HTTP, so that the proxy can answer requests itself.
    let s3 = (store == Store::S3Faults).then(|| StoreServer::start_with(StoreKind::S3, tag, false));
    let proxy = s3.as_ref().map(|s| FaultProxy::start(s.port));
    let (repo_conf, archive_root) = match (&s3, &proxy) {
        (Some(s3), Some(proxy)) => {
            let text: String = s3
                .options("/repo")
                .into_iter()
                .map(|(k, v)| match k.as_str() {
                    "repo1-storage-port" => format!("{k}={}\n", proxy.port),
                    _ => format!("{k}={v}\n"),
                })
                .collect();
            (text, s3.object_file("/repo", "main/archive/00000001"))
        }
        _ => (
            format!("repo1-path={}\n", cluster.repo.display()),
            cluster.repo.join("main/archive/00000001"),
        ),
    };
    fs::write(
        &conf,
        format!("[global]\n{repo_conf}retention-full=2\n{cipher}"),
    )
    .unwrap();
    fs::set_permissions(&conf, fs::Permissions::from_mode(0o600)).unwrap();
    chown_pg_recursive(&conf);
    let env = Env {
        cluster: &cluster,
        conf: conf.clone(),
    };
    pgjet_ok(&env.args("stanza-create", &[]));
    // archive_command: pgjet archive-push (S3: asynchronous); archive_mode needs a restart.
    let spool = cluster.new_dir("spool");
    let async_flags = match store {
        Store::Posix => String::new(),
        Store::S3Faults => format!(
            " --archive-async=y --spool-path={} --jobs=2",
            spool.display()
        ),
    };
    let push = format!(
        "{} --config={} --stanza=main{async_flags} archive-push %p",
        pgjet_bin().display(),
        conf.display()
    );
    cluster.psql("postgres", "ALTER SYSTEM SET archive_mode = 'on'");
    cluster.psql(
        "postgres",
        &format!("ALTER SYSTEM SET archive_command = '{push}'"),
    );
    cluster.restart();
    pgjet_ok(&env.args("backup", &args!["--type", "full", "--start-fast"]));
    if let Some(p) = &proxy {
        p.set_storm(Some(common::faultproxy::Storm {
            reset_pct: 5,
            http503_pct: 5,
            cut_pct: 2,
        }));
    }

    // The writer: numbered rows, each its own transaction; `committed` is the highest
    // number whose INSERT returned (rows are written in order).
    let committed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (committed, stop) = (committed.clone(), stop.clone());
        let sock = cluster.sock().to_path_buf();
        let port = cluster.port();
        let psql = cluster.pg().tool("psql");
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let mut sql = format!("INSERT INTO counter VALUES ({i});");
                if i.is_multiple_of(25) {
                    // A segment every 25 rows: archive-push always has work.
                    sql.push_str(" SELECT pg_switch_wal();");
                }
                let r = run_as_postgres(
                    &psql,
                    &args![
                        "-X",
                        "-q",
                        "-h",
                        sock.display(),
                        "-p",
                        port,
                        "-d",
                        "postgres",
                        "-c",
                        sql
                    ],
                    None,
                );
                assert!(r.success(), "the writer's INSERT {i} failed:\n{r}");
                committed.store(i, Ordering::Relaxed);
            }
        })
    };

    let mut st = Storm {
        rng: Rng(seed),
        took: Default::default(),
        report: Report::default(),
        pid: cluster.root.join("storm.pid"),
    };
    let types = ["full", "incr", "diff"];
    for k in 0..kills {
        // backup
        let kind = types[k as usize % 3];
        let a = env.args(
            "backup",
            &args!["--type", kind, "--start-fast", "--jobs", "2"],
        );
        st.hit("backup", &a, &a);
        let a = env.args("expire", &[]);
        st.hit("expire", &a, &a);
        // restore, then restore --delta into the same directory
        let dir = cluster.new_dir(&format!("restore-{k}"));
        let a = env.target_args("restore", &dir, &args!["--jobs", "2"]);
        st.hit("restore", &a, &[&a[..], &args!["--delta"]].concat());
        let v = pg_verifybackup(cluster.pg(), &dir);
        assert!(
            v.success(),
            "restore {k} after a kill: pg_verifybackup:\n{v}"
        );
        let _ = fs::remove_dir_all(&dir);
        // replica-create, then --delta into the same directory
        let dir = cluster.new_dir(&format!("replica-{k}"));
        let source = format!(
            "host={} port={} user=postgres dbname=postgres",
            cluster.sock().display(),
            cluster.port()
        );
        let a = args![
            "replica-create",
            "--source",
            source,
            "--pg-path",
            dir.display(),
            "--jobs",
            "2",
            "--start-fast"
        ];
        st.hit("replica-create", &a, &[&a[..], &args!["--delta"]].concat());
        let _ = fs::remove_dir_all(&dir);
        // archive-push: the next one PostgreSQL runs, a few milliseconds into its push
        let t = Instant::now();
        while running(&conf, "archive-push").is_empty() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_micros(st.rng.below(8_000)));
        let n = kill_children(&conf, "archive-push");
        *st.report.kills.entry("archive-push").or_default() += n;
        if store == Store::S3Faults && st.rng.below(2) == 0 {
            // The background pusher, mid-batch: the next archive-push starts another.
            let n = kill_children(&conf, "archive-push-async");
            *st.report.kills.entry("archive-push-async").or_default() += n;
        }
        // archive-get of an archived segment, killed, then run again: the same bytes as an
        // uninterrupted get.
        let segs = archived_segments(&archive_root);
        if let Some(seg) = segs.get(st.rng.below(segs.len() as u64) as usize) {
            let dest = cluster.new_dir(&format!("get-{k}"));
            // S3: the asynchronous archive-get (a background prefetcher fills the spool).
            let get_async: Vec<String> = match store {
                Store::Posix => Vec::new(),
                Store::S3Faults => args![
                    "--archive-async=y",
                    format!("--spool-path={}", spool.display()),
                    "--jobs=2"
                ],
            };
            let get = |to: &str| {
                let mut a = args![
                    "archive-get",
                    "--config",
                    conf.display(),
                    "--stanza",
                    "main"
                ];
                a.extend(get_async.iter().cloned());
                a.extend(args![seg, dest.join(to).display()]);
                a
            };
            st.hit("archive-get", &get("x"), &get("x"));
            if store == Store::S3Faults && st.rng.below(2) == 0 {
                let n = kill_children(&conf, "archive-get-async");
                *st.report.kills.entry("archive-get-async").or_default() += n;
            }
            pgjet_ok(&get("y"));
            let (x, y) = (
                fs::read(dest.join("x")).unwrap(),
                fs::read(dest.join("y")).unwrap(),
            );
            assert!(
                x == y && x.len() == 16 << 20,
                "archive-get of {seg} after a kill"
            );
            let _ = fs::remove_dir_all(&dest);
        }
    }

    // The end: the writer stops; every committed row must come back.
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    if let Some(p) = &proxy {
        let (resets, answers, cuts) = p.faults();
        step!(
            "storm {tag}: the proxy injected {resets} resets, {answers} 503 answers, {cuts} cuts"
        );
        assert!(resets + answers + cuts > 0, "no fault was injected");
        p.set_storm(None);
    }
    let m = committed.load(Ordering::Relaxed);
    st.report.committed = m;
    // PostgreSQL's archiver may wait a minute after failures (killed pushes): check
    // fails at once on an archiver that is failing, so the backlog is archived first.
    wait_queue_empty(&cluster, "the archive backlog after the storm");
    let r = pgjet_ok(&env.args("check", &args!["--archive-timeout", "120"]));
    step!(
        "check after the storm: {}",
        r.stdout.lines().last().unwrap_or("")
    );
    for b in info_labels(&env) {
        let v = pgjet(&env.args("verify", &args!["--set", b]));
        if !v.success() {
            st.report.broken += 1;
            eprintln!("BROKEN: verify of {b} after the storm:\n{v}");
        }
    }
    // The newest backup, recovered to the end of the archive.
    let dir = cluster.new_dir("final");
    pgjet_ok(&env.target_args(
        "restore",
        &dir,
        &args!["--jobs", "2", "--target-action", "promote"],
    ));
    let server = cluster.start_other(&dir, free_port());
    server.wait_promoted(Duration::from_secs(300));
    let have: u64 = server
        .psql(
            "postgres",
            &format!("SELECT count(*) FROM counter WHERE i <= {m}"),
        )
        .parse()
        .unwrap();
    st.report.lost = m - have.min(m);
    let report = st.report;
    step!(
        "storm {tag}: kills {:?} ({} came after the command had ended), {} rows committed, broken {}, lost {}",
        report.kills,
        report.too_late,
        report.committed,
        report.broken,
        report.lost
    );
    assert_eq!(
        report.broken, 0,
        "broken backups after the storm: {report:?}"
    );
    assert_eq!(
        report.lost, 0,
        "committed rows lost after the storm: {report:?}"
    );
    assert!(
        report.kills.values().sum::<u32>() >= kills,
        "too few kills hit a running command to prove anything: {report:?}"
    );
}

/// The names of the WAL segments in `tl`, the archive of timeline 1 as files (posix: the
/// repository; S3: versitygw's directory of the bucket).
fn archived_segments(tl: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for d in fs::read_dir(tl).into_iter().flatten().flatten() {
        for f in fs::read_dir(d.path()).into_iter().flatten().flatten() {
            let n = f.file_name().to_string_lossy().to_string();
            if n.len() == 24 && n.bytes().all(|b| b.is_ascii_hexdigit()) {
                out.push(n);
            }
        }
    }
    out.sort();
    out
}

/// The labels of the complete backups `info` lists.
fn info_labels(env: &Env) -> Vec<String> {
    let r = pgjet_ok(&env.args("info", &args!["--output", "json"]));
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    v[0]["backups"]
        .as_array()
        .map(|b| {
            b.iter()
                .filter_map(|x| x["label"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn storm_posix() {
    storm("storm-posix", false, Store::Posix);
}

#[test]
fn storm_posix_encrypted() {
    storm("storm-enc", true, Store::Posix);
}

#[test]
fn storm_s3_faults_async() {
    storm("storm-s3", false, Store::S3Faults);
}
