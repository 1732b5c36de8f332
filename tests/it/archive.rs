//! WAL archiving, point-in-time recovery and retention, against real PostgreSQL 15 to 18
//! with posix and S3 (versitygw) repositories. PostgreSQL itself runs `pgjet archive-push`
//! as its archive_command and `pgjet archive-get` as the restored clusters' restore_command.
//!
//! - PostgreSQL 15, posix, synchronous: pgbench while archiving, every segment from the
//!   backup on is archived and verifies; the repository unwritable for a while (permissions)
//!   then back, nothing lost; PITR to a restore point, an LSN, an xid (inclusive and
//!   exclusive), a time (pause and shutdown), and the end of the archive, each checked by the
//!   rows committed just before and after the target; a target before every backup refused;
//!   duplicate pushes (same content: a warning; different content: refused, the archived
//!   copy kept); a segment of another cluster refused; timelines: a restored cluster
//!   promoted and writing on timeline 2, then a restore to a point on timeline 2; a
//!   .partial segment archived and served back; a corrupt archived segment found by verify and
//!   refused by archive-get.
//! - PostgreSQL 18, posix, asynchronous: pgbench while the background pusher is killed with
//!   SIGKILL three times, nothing lost and everything restorable; archive-push-queue-max
//!   exceeded while the repository is unwritable: WAL dropped with a warning, the gap recorded
//!   and shown by info, a recovery across it refused; a backup after the gap restores; expire
//!   removes the old backup, its WAL and the gap record.
//! - PostgreSQL 15, S3, asynchronous: pgbench, the S3 server stopped then started again,
//!   nothing lost; a restore replays the archive with the asynchronous archive-get prefetch.
//! - PostgreSQL 16, 17 and 18, S3, asynchronous: a full backup taken under pgbench and
//!   restored (pgbench's invariant, pg_amcheck, pg_verifybackup where the major has one),
//!   PITR to a time and to the archive's end through the asynchronous archive-get.
//! - PostgreSQL 18, S3, synchronous: PITR to a time between two backups (the first is
//!   chosen by itself), to the end of the archive (from the second), and to an LSN.
//! - PostgreSQL 15, posix, retention: retention-archive=2 alone over four backups (run by
//!   `backup` itself): the older two keep only their own WAL and restore with --type
//!   immediate, the newer two keep a continuous archive (PITR between them); and
//!   retention-full-type=time over backups aged with pgjet's own manifest writer: the window
//!   and the newest backup before it stay, a recovery into the window's start works.

use crate::common::stores::*;
use crate::common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How pgjet reaches the repository under test: the flags every command (and
/// archive_command) gets, and the S3 server behind it.
struct Repo {
    args: Vec<String>,
    server: Option<StoreServer>,
}

fn posix_repo(cluster: &Cluster) -> Repo {
    Repo {
        args: args!["--repo-path", cluster.repo.display()],
        server: None,
    }
}

fn s3_repo(tag: &str) -> Repo {
    let server = StoreServer::start(StoreKind::S3, tag);
    let conf = server.config_file("pgjet.conf", "/repo", &[]);
    Repo {
        args: args!["--config", conf.display()],
        server: Some(server),
    }
}

/// `pgjet <cmd> --stanza main <repo> --pg-path ... <extra>` for `cluster`.
fn pj(cluster: &Cluster, repo: &Repo, cmd: &str, extra: &[&str]) -> Run {
    pgjet(&pj_args(cluster, repo, cmd, extra))
}

/// The arguments [`pj`] runs.
fn pj_args(cluster: &Cluster, repo: &Repo, cmd: &str, extra: &[&str]) -> Vec<String> {
    let mut a = args![cmd, "--stanza", "main"];
    a.extend(repo.args.iter().cloned());
    a.extend(args![
        "--pg-path",
        cluster.data().display(),
        "--pg-port",
        cluster.port(),
        "--pg-socket-path",
        cluster.sock().display()
    ]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// The archive_command running this pgjet on `repo` with `extra` flags.
fn archive_command(repo: &Repo, extra: &[&str]) -> String {
    let mut a = vec![
        pgjet_bin().display().to_string(),
        "--stanza=main".to_string(),
    ];
    a.extend(repo.args.iter().cloned());
    a.extend(extra.iter().map(|s| s.to_string()));
    a.push("archive-push %p".into());
    a.join(" ")
}

/// `archive-get WAL DEST` on `repo`.
fn get_args(repo: &Repo, wal: impl std::fmt::Display, dest: &dyn std::fmt::Display) -> Vec<String> {
    let mut a = args!["archive-get", "--stanza", "main"];
    a.extend(repo.args.iter().cloned());
    a.extend(args![wal, dest]);
    a
}

/// Sets archive_command (a reload is enough).
fn set_archive_command(server: &Server, repo: &Repo, extra: &[&str]) {
    let cmd = archive_command(repo, extra).replace('\'', "''");
    server.psql(
        "postgres",
        &format!("ALTER SYSTEM SET archive_command = '{cmd}'; SELECT pg_reload_conf();"),
    );
    std::thread::sleep(Duration::from_millis(300));
}

/// Turns archiving on (archive_mode needs a restart) with pgjet as archive_command.
fn enable_archiving(cluster: &Cluster, repo: &Repo, extra: &[&str]) {
    cluster.psql("postgres", "ALTER SYSTEM SET archive_mode = 'on'");
    set_archive_command(&cluster.server, repo, extra);
    let s = &cluster.server;
    let r = run_as_postgres(
        &s.pg.tool("pg_ctl"),
        &args![
            "restart",
            "-w",
            "-t",
            "60",
            "-m",
            "fast",
            "-D",
            s.data.display(),
            "-l",
            s.log.display(),
            "-o",
            format!("-p {} -k {}", s.port, s.sock.display())
        ],
        None,
    );
    assert!(r.success(), "restart with archiving failed:\n{r}");
}

/// The rows of table marks, in order, as "1,2,3".
fn marks(server: &Server) -> String {
    server.psql(
        "postgres",
        "SELECT coalesce(string_agg(i::text, ',' ORDER BY i), '') FROM marks",
    )
}

/// `info --output json` of stanza main: the stanza's object.
fn info_json(cluster: &Cluster, repo: &Repo) -> serde_json::Value {
    let r = pj(cluster, repo, "info", &["--output", "json"]).ok();
    let v: serde_json::Value =
        serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| panic!("info json: {e}\n{r}"));
    v[0].clone()
}

/// The archive's runs of segments (timeline, first, last) from info.
fn archive_runs(cluster: &Cluster, repo: &Repo) -> Vec<(u64, String, String)> {
    let v = info_json(cluster, repo);
    v["archive"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|a| a["ranges"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            (
                r["timeline"].as_u64().unwrap_or(0),
                r["first"].as_str().unwrap_or("").to_string(),
                r["last"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Names of the files PostgreSQL still has to archive (`archive_status/*.ready`).
/// The last segment of the archive's single run must be at least `segment`, and the run must
/// start at or before `from`: every segment in between is archived.
fn assert_continuous(cluster: &Cluster, repo: &Repo, tli: u64, from: &str, to: &str) {
    let runs: Vec<_> = archive_runs(cluster, repo)
        .into_iter()
        .filter(|r| r.0 == tli)
        .collect();
    let covering = runs
        .iter()
        .any(|(_, first, last)| first.as_str() <= from && last.as_str() >= to);
    assert!(
        covering,
        "the archive of timeline {tli} has no continuous run from {from} to {to}: {runs:?}"
    );
}

/// The archive start of the newest backup, from info.
fn newest_backup(cluster: &Cluster, repo: &Repo) -> serde_json::Value {
    let v = info_json(cluster, repo);
    v["backups"]
        .as_array()
        .and_then(|b| b.last().cloned())
        .unwrap_or_else(|| panic!("no backup in info: {v}"))
}

/// Restores into a fresh directory `name` of `cluster` with `extra` flags (archive_mode off
/// unless `extra` says otherwise); returns the directory.
fn restore(cluster: &Cluster, repo: &Repo, name: &str, extra: &[&str]) -> PathBuf {
    restore_run(cluster, repo, name, extra).0
}

/// [`restore`], with the restore's run.
fn restore_run(cluster: &Cluster, repo: &Repo, name: &str, extra: &[&str]) -> (PathBuf, Run) {
    let dir = cluster.new_dir(name);
    let mut a = args!["restore", "--stanza", "main"];
    a.extend(repo.args.iter().cloned());
    a.extend(args!["--pg-path", dir.display()]);
    if !extra.iter().any(|e| e.starts_with("--jobs")) {
        a.extend(args!["--jobs", "2"]);
    }
    if !extra.contains(&"--archive-mode") {
        a.extend(args!["--archive-mode", "off"]);
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    let r = pgjet_ok(&a);
    step!("{name}: restored in {:.1}s", r.elapsed.as_secs_f64());
    (dir, r)
}

/// Restores with `extra`, starts the cluster, waits until it is promoted, and returns it.
fn restore_promoted(cluster: &Cluster, repo: &Repo, name: &str, extra: &[&str]) -> Server {
    let dir = restore(cluster, repo, name, extra);
    let server = cluster.start_other(&dir, free_port());
    server.wait_promoted(Duration::from_secs(120));
    server
}

/// Starts the restored cluster in `dir` without waiting for it (it is expected to stop by
/// itself), its log in `<name>.log`; returns the log's text once it holds `text` and the
/// server is gone, or None after 60 s (the server is then stopped by its PID).
fn start_until_it_stops(cluster: &Cluster, dir: &Path, name: &str, text: &str) -> Option<String> {
    let log = cluster.root.join(&format!("{name}.log"));
    let sock = cluster.root.join(&format!("{name}-sock"));
    mkdir_pg(&sock, 0o755);
    run_as_postgres(
        &cluster.pg().tool("pg_ctl"),
        &args![
            "start",
            "-W",
            "-D",
            dir.display(),
            "-l",
            log.display(),
            "-o",
            format!("-p {} -k {}", free_port(), sock.display())
        ],
        None,
    )
    .ok();
    let found = wait_for(Duration::from_secs(60), || {
        let t = fs::read_to_string(&log).unwrap_or_default();
        (t.contains(text) && !dir.join("postmaster.pid").exists()).then_some(t)
    });
    if found.is_none() {
        stop_server_by_pid(&cluster.pg().bin, dir);
    }
    found
}

/// Runs `check` with `extra` (a WAL switch, waited for in the archive), waits until PostgreSQL
/// has nothing left to archive, and checks the archive of timeline 1 is continuous from `from`
/// to the switched segment, which it returns.
fn archive_all(cluster: &Cluster, repo: &Repo, extra: &[&str], from: &str, what: &str) -> String {
    // After an outage PostgreSQL's archiver waits up to a minute before it tries again,
    // and check fails at once on an archiver that is failing (it says so): the backlog first.
    wait_queue_empty(cluster, what);
    let r = pj(cluster, repo, "check", &check_flags(extra)).ok();
    let last = r
        .stdout
        .split_whitespace()
        .find(|w| w.len() == 24 && w.starts_with("00000001"))
        .unwrap_or_else(|| panic!("no segment in check's output:\n{r}"))
        .to_string();
    wait_queue_empty(cluster, what);
    assert_continuous(cluster, repo, 1, from, &last);
    last
}

/// The flags of `extra` that `check` takes: archive_command's asynchronous-archiving
/// settings are not its own (pgjet refuses options that do not apply to a command).
fn check_flags<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    extra
        .iter()
        .copied()
        .filter(|f| {
            ![
                "--archive-async",
                "--spool-path",
                "--archive-push-queue-max",
            ]
            .iter()
            .any(|o| f.starts_with(o))
        })
        .collect()
}

/// PostgreSQL's count of failed archive_command runs (pg_stat_archiver).
fn failed_archives(cluster: &Cluster) -> u64 {
    cluster
        .psql("postgres", "SELECT failed_count FROM pg_stat_archiver")
        .parse()
        .unwrap_or(0)
}

/// Waits (up to 60 s) until PostgreSQL has counted a failed archive_command more than
/// `before`; panics with `what` otherwise.
fn wait_archiving_failed(cluster: &Cluster, before: u64, what: &str) {
    let failed = wait_for(Duration::from_secs(60), || {
        let n = failed_archives(cluster);
        (n > before).then_some(n)
    });
    assert!(failed.is_some(), "{what}");
}

/// Restores with `extra` and `--target-action promote`, starts the cluster, and checks that
/// marks holds `want` (`what` names the target in the message).
fn pitr(cluster: &Cluster, repo: &Repo, name: &str, extra: &[&str], want: &str, what: &str) {
    let mut a = extra.to_vec();
    a.extend(["--target-action", "promote"]);
    let s = restore_promoted(cluster, repo, name, &a);
    assert_eq!(marks(&s), want, "{what}");
}

/// Commits row `i` into marks.
fn mark(cluster: &Cluster, i: u32) {
    cluster.psql("postgres", &format!("INSERT INTO marks VALUES ({i})"));
}

/// The recovery targets of one run of marks: rows 1..=6 with a restore point after 1, an LSN
/// after 2, the xid of 4, a time after 5.
struct Targets {
    restore_point: String,
    lsn: String,
    xid: String,
    time: String,
}

fn write_marks(cluster: &Cluster) -> Targets {
    let q = |sql: &str| cluster.psql("postgres", sql);
    mark(cluster, 1);
    q("SELECT pg_create_restore_point('rp1')");
    mark(cluster, 2);
    let lsn = q("SELECT pg_current_wal_insert_lsn()");
    mark(cluster, 3);
    let xid = q(
        "WITH x AS (INSERT INTO marks VALUES (4) RETURNING txid_current() AS x) SELECT x FROM x",
    );
    mark(cluster, 5);
    std::thread::sleep(Duration::from_millis(300));
    let time = q("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || '+00'");
    std::thread::sleep(Duration::from_millis(300));
    mark(cluster, 6);
    step!("marks written: restore point rp1, LSN {lsn}, xid {xid}, time {time}");
    Targets {
        restore_point: "rp1".into(),
        lsn,
        xid,
        time,
    }
}

/// pgbench for `seconds` with 4 clients; returns its run.
fn pgbench_for(cluster: &Cluster, seconds: u32) -> Run {
    let (bin, a) = pgbench_args(&cluster.server, &args!["-n", "-c", 4, "-T", seconds]);
    run_as_postgres(&bin, &a, None).ok()
}

/// Flips one byte in the middle of `path`.
fn flip_byte(path: &Path) {
    let mut b = fs::read(path).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0x5a;
    fs::write(path, b).unwrap();
}

/// PIDs of running background pushers (processes running pgjet's hidden
/// `archive-push-async` command).
fn pusher_pids() -> Vec<i32> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(cmdline) = fs::read(e.path().join("cmdline")) {
            if cmdline
                .split(|b| *b == 0)
                .any(|arg| arg == b"archive-push-async")
            {
                out.push(pid);
            }
        }
    }
    out
}

#[test]
fn pg15_posix_sync_archiving_pitr_timelines_and_faults() {
    let cluster = Cluster::new(&Pg::v15(), "arch15");
    let repo = posix_repo(&cluster);
    pgbench_init(&cluster.server, 1);
    cluster.psql("postgres", "CREATE TABLE marks (i int)");
    pj(&cluster, &repo, "stanza-create", &[]).ok();
    // archive_mode on and no archive_command: PostgreSQL archives nothing and keeps every
    // segment in pg_wal. backup refuses it (archive-check, as pgBackRest's) and check fails,
    // each naming the fix; archive-check=n backs up with a warning.
    // (A spread checkpoint of 3 s: the backup below runs without --start-fast.)
    cluster.psql(
        "postgres",
        "ALTER SYSTEM SET archive_mode = 'on'; ALTER SYSTEM SET checkpoint_completion_target = 0.01",
    );
    cluster.restart();
    let r = pj(&cluster, &repo, "backup", &["--start-fast"]).fails_with("archive_command is empty");
    assert_eq!(r.status.code(), Some(6), "{r}");
    assert!(r.stderr.contains("HINT: set archive_command"), "{r}");
    let r = pj(&cluster, &repo, "check", &[]).fails_with("archive_command is empty");
    assert!(r.stdout.contains("PROBLEM: archive_mode is on"), "{r}");
    let r = pj(&cluster, &repo, "backup", &["--archive-check", "n"]).ok();
    assert!(
        r.stderr.contains("WARN") && r.stderr.contains("archive_command is empty"),
        "{r}"
    );
    // Without --start-fast the backup says at once that it waits for a checkpoint.
    log_line(
        &r,
        "waiting for the next checkpoint",
        "backup did not say it waits for the checkpoint",
    );
    assert!(r.stderr.contains("--start-fast"), "{r}");
    // An archive_command that fails: check stops once the archiver has failed on the
    // segment, quoting pg_stat_archiver, instead of waiting out archive-timeout.
    cluster.psql(
        "postgres",
        "ALTER SYSTEM SET archive_command = 'false'; SELECT pg_reload_conf()",
    );
    let r = pj(&cluster, &repo, "check", &["--archive-timeout", "600"])
        .fails_with("archiver is failing");
    assert!(
        r.stderr.contains("archive_command failed for 0000000"),
        "check must quote the archiver's last failure:\n{r}"
    );
    enable_archiving(&cluster, &repo, &[]);
    wait_queue_empty(
        &cluster,
        "the segments that failed, once archive_command works",
    );
    let r = pj(&cluster, &repo, "check", &[]).ok();
    assert!(r.stdout.contains("reached the archive"), "{r}");
    pj(&cluster, &repo, "backup", &["--start-fast", "--jobs", "2"]).ok();
    let b = newest_backup(&cluster, &repo);
    let archive_start = b["archive_start"]
        .as_str()
        .unwrap_or_else(|| panic!("no archive_start: {b}"))
        .to_string();
    assert_eq!(
        b["archive_stop"]
            .as_str()
            .map(|s| s >= archive_start.as_str()),
        Some(true),
        "{b}"
    );

    // pgbench under synchronous archiving.
    let r = pgbench_for(&cluster, 4);
    step!(
        "pgbench: {}",
        r.stdout.lines().find(|l| l.contains("tps")).unwrap_or("")
    );

    // The repository unwritable for a while: PostgreSQL keeps the WAL and retries.
    let archive_dir = cluster.repo.join("main/archive");
    let before = failed_archives(&cluster);
    fs::set_permissions(&archive_dir, fs::Permissions::from_mode(0o000)).unwrap();
    for _ in 0..3 {
        cluster.psql(
            "postgres",
            "INSERT INTO marks SELECT 0 FROM generate_series(1, 1000); SELECT pg_switch_wal()",
        );
    }
    wait_archiving_failed(
        &cluster,
        before,
        "archiving did not fail while the repository was unwritable",
    );
    assert!(!ready_files(cluster.data()).is_empty());
    fs::set_permissions(&archive_dir, fs::Permissions::from_mode(0o750)).unwrap();
    cluster.psql("postgres", "DELETE FROM marks");
    let targets = write_marks(&cluster);
    let last = archive_all(
        &cluster,
        &repo,
        &["--archive-timeout", "90"],
        &archive_start,
        "after the outage",
    );
    let r = pj(&cluster, &repo, "verify", &[]).ok();
    assert!(r.stdout.contains("WAL archive: ok"), "{r}");

    // Point-in-time recovery, each target checked by the rows around it.
    pitr(
        &cluster,
        &repo,
        "pitr-name",
        &["--type", "name", "--target", &targets.restore_point],
        "1",
        "restore point",
    );
    pitr(
        &cluster,
        &repo,
        "pitr-lsn",
        &["--type", "lsn", "--target", &targets.lsn],
        "1,2",
        "LSN",
    );
    pitr(
        &cluster,
        &repo,
        "pitr-xid",
        &["--type", "xid", "--target", &targets.xid],
        "1,2,3,4",
        "xid, inclusive",
    );
    pitr(
        &cluster,
        &repo,
        "pitr-xid-excl",
        &[
            "--type",
            "xid",
            "--target",
            &targets.xid,
            "--target-exclusive",
        ],
        "1,2,3",
        "xid, exclusive",
    );
    // pause (the default action): the server stays in recovery, paused at the target.
    let dir = restore(
        &cluster,
        &repo,
        "pitr-time",
        &["--type", "time", "--target", &targets.time],
    );
    let s = cluster.start_other(&dir, free_port());
    let paused = wait_for(Duration::from_secs(60), || {
        let r = s.psql_run(
            "postgres",
            "SELECT pg_is_in_recovery(), pg_get_wal_replay_pause_state()",
        );
        (r.success() && r.stdout.trim() == "t|paused").then_some(())
    });
    assert!(
        paused.is_some(),
        "recovery did not pause at the time target:\n{}",
        s.log_tail()
    );
    assert_eq!(marks(&s), "1,2,3,4,5", "time");
    drop(s);
    // shutdown: the server stops by itself at the target.
    let dir = restore(
        &cluster,
        &repo,
        "pitr-shutdown",
        &[
            "--type",
            "time",
            "--target",
            &targets.time,
            "--target-action",
            "shutdown",
        ],
    );
    let log = start_until_it_stops(
        &cluster,
        &dir,
        "pitr-shutdown",
        "database system is shut down",
    );
    assert!(
        log.is_some(),
        "the server did not shut down at the target:\n{}",
        fs::read_to_string(cluster.root.join("pitr-shutdown.log")).unwrap_or_default()
    );
    // default: to the end of the archive.
    let s = restore_promoted(&cluster, &repo, "pitr-end", &[]);
    assert_eq!(marks(&s), "1,2,3,4,5,6", "end of the archive");
    drop(s);
    // A target before every backup is refused before anything is written.
    let empty = cluster.new_dir("pitr-early");
    let mut a = args!["restore", "--stanza", "main"];
    a.extend(repo.args.iter().cloned());
    a.extend(args![
        "--pg-path",
        empty.display(),
        "--type",
        "time",
        "--target",
        "2001-01-01 00:00:00+00"
    ]);
    pgjet(&a).fails_with("no backup of stanza 'main' ends before the target");
    assert_eq!(fs::read_dir(&empty).unwrap().count(), 0);

    // Duplicate pushes: the same bytes are accepted with a warning; other bytes are refused
    // and the archived copy stays.
    let dup = cluster.new_dir("dup");
    let seg = dup.join(&archive_start);
    let a = get_args(&repo, &archive_start, &seg.display());
    pgjet_ok(&a);
    let original = fs::read(&seg).unwrap();
    let r = pj(
        &cluster,
        &repo,
        "archive-push",
        &[&seg.display().to_string()],
    )
    .ok();
    assert!(
        r.text_lower()
            .contains("already in repo1 with the same content"),
        "{r}"
    );
    flip_byte(&seg);
    pj(
        &cluster,
        &repo,
        "archive-push",
        &[&seg.display().to_string()],
    )
    .fails_with("already archived");
    fs::remove_file(&seg).unwrap();
    pgjet_ok(&a);
    assert!(
        fs::read(&seg).unwrap() == original,
        "the archived copy changed"
    );
    // A segment of another cluster (its header's system identifier differs) is refused.
    let mut other = original.clone();
    other[24..32].copy_from_slice(&12345u64.to_le_bytes());
    let foreign = dup.join("000000010000000000000042");
    fs::write(&foreign, &other).unwrap();
    chown_pg_recursive(&foreign);
    pj(
        &cluster,
        &repo,
        "archive-push",
        &[&foreign.display().to_string()],
    )
    .fails_with("does not belong to stanza 'main'");

    // Timelines: a cluster restored to rp1 and promoted archives timeline 2 into the stanza;
    // a restore to a restore point on timeline 2 follows the history there.
    let s = restore_promoted(
        &cluster,
        &repo,
        "tl2",
        &[
            "--type",
            "name",
            "--target",
            "rp1",
            "--target-action",
            "promote",
            "--archive-mode",
            "preserve",
        ],
    );
    assert_eq!(marks(&s), "1");
    s.psql("postgres", "INSERT INTO marks VALUES (10)");
    s.psql("postgres", "SELECT pg_create_restore_point('rp_tl2')");
    s.psql("postgres", "INSERT INTO marks VALUES (11)");
    let seg2 = s.psql("postgres", "SELECT pg_walfile_name(pg_switch_wal())");
    assert!(seg2.starts_with("00000002"), "{seg2}");
    let obj = cluster
        .repo
        .join(format!("main/archive/00000002/{}/{seg2}", &seg2[8..16]));
    let history = cluster.repo.join("main/archive/00000002/00000002.history");
    let archived = wait_for(Duration::from_secs(60), || {
        (obj.exists() && history.exists()).then_some(())
    });
    assert!(
        archived.is_some(),
        "timeline 2 was not archived ({} / {}):\n{}",
        obj.display(),
        history.display(),
        s.log_tail()
    );
    drop(s);
    pitr(
        &cluster,
        &repo,
        "pitr-tl2",
        &["--type", "name", "--target", "rp_tl2"],
        "1,10",
        "restore point on timeline 2",
    );
    // A target on timeline 1 past the branch: following timeline 2 (latest, the default)
    // would never reach it. Refused before the copy, naming the timeline that reaches it.
    let dir = cluster.new_dir("pitr-unreachable");
    let mut a = args![
        "restore",
        "--stanza",
        "main",
        "--pg-path",
        dir.display(),
        "--type",
        "lsn",
        "--target",
        &targets.lsn
    ];
    a.extend(repo.args.iter().cloned());
    let r = pgjet(&a).fails_with("branched off");
    assert!(
        r.stderr.contains("--target-timeline 1 (current)"),
        "the refusal should name the timeline that reaches the target:\n{r}"
    );
    assert_eq!(
        fs::read_dir(&dir).unwrap().count(),
        0,
        "a refused restore must not touch the target"
    );
    let runs = archive_runs(&cluster, &repo);
    assert!(
        runs.iter().any(|r| r.0 == 2),
        "info shows no timeline 2: {runs:?}"
    );
    // The timeline trap: a backup of production (timeline 1) taken after that test copy
    // branched off. Restored to the end of the archive along the newest timeline (2),
    // PostgreSQL would stop with "requested timeline 2 is not a child of this server's
    // history"; restore says so and follows timeline 1, which has production's rows.
    pj(&cluster, &repo, "backup", &["--start-fast"]).ok();
    let (trap, r) = restore_run(&cluster, &repo, "trap", &[]);
    assert!(
        r.stderr.contains("is not a child of this server's history")
            && r.stderr.contains("recovery_target_timeline = 'current'"),
        "restore must see the timeline trap:\n{r}"
    );
    let s = cluster.start_other(&trap, free_port());
    s.wait_promoted(Duration::from_secs(120));
    assert_eq!(
        marks(&s),
        "1,2,3,4,5,6",
        "the trap restore holds production's rows"
    );
    // Without an archive to read, the restored cluster's log has none of archive-get's
    // "not in the archive" lines (the normal end of recovery).
    assert!(
        !s.log_tail().contains("is not in the archive"),
        "{}",
        s.log_tail()
    );
    drop(s);
    // A partial segment (what a promoted standby archives for its old timeline's last
    // segment) is archived next to its segment and served back.
    let partial = dup.join(format!("{archive_start}.partial"));
    fs::write(&partial, &original).unwrap();
    chown_pg_recursive(&partial);
    pj(
        &cluster,
        &repo,
        "archive-push",
        &[&partial.display().to_string()],
    )
    .ok();
    assert!(cluster
        .repo
        .join(format!(
            "main/archive/00000001/{}/{archive_start}.partial",
            &archive_start[8..16]
        ))
        .exists());
    let back = dup.join("partial-back");
    let a = get_args(&repo, format!("{archive_start}.partial"), &back.display());
    pgjet_ok(&a);
    assert!(
        fs::read(&back).unwrap() == original,
        "the partial segment came back changed"
    );

    // A corrupt archived segment: verify names it, archive-get refuses it loudly (not the
    // quiet "not in the archive").
    let victim = cluster
        .repo
        .join(format!("main/archive/00000001/{}/{last}", &last[8..16]));
    flip_byte(&victim);
    pj(&cluster, &repo, "verify", &[]).fails_with(&last);
    let a = get_args(&repo, &last, &dup.join("x").display());
    let r = pgjet(&a).fails_with("corrupt");
    assert_ne!(
        r.status.code(),
        Some(1),
        "a corrupt segment must not look missing:\n{r}"
    );
    let a = get_args(&repo, "0000000100000000000000FF", &dup.join("y").display());
    assert_eq!(
        pgjet(&a).status.code(),
        Some(1),
        "a missing segment exits 1"
    );
    // A recovery that needs the corrupt segment (on timeline 1: timeline 2 branched off in
    // the same segment) stops with FATAL instead of ending early and promoting a cluster that
    // lacks the later transactions.
    let dir = restore(
        &cluster,
        &repo,
        "pitr-corrupt",
        &[
            "--type",
            "time",
            "--target",
            &targets.time,
            "--target-action",
            "promote",
            "--target-timeline",
            "current",
        ],
    );
    let stopped = start_until_it_stops(&cluster, &dir, "pitr-corrupt", "recovery stops here")
        .unwrap_or_else(|| {
            panic!(
                "recovery did not stop at the corrupt segment:\n{}",
                fs::read_to_string(cluster.root.join("pitr-corrupt.log")).unwrap_or_default()
            )
        });
    assert!(
        !stopped.contains("archive recovery complete"),
        "recovery ended and promoted:\n{stopped}"
    );
}

#[test]
fn pg18_posix_async_archiving_kill9_queue_max_and_expire() {
    let cluster = Cluster::new(&Pg::v18(), "arch18");
    let repo = posix_repo(&cluster);
    let spool = cluster.new_dir("spool");
    let spool_flag = format!("--spool-path={}", spool.display());
    let async_flags = ["--archive-async=y", spool_flag.as_str(), "--jobs=2"];
    pgbench_init(&cluster.server, 2);
    pj(&cluster, &repo, "stanza-create", &[]).ok();
    enable_archiving(&cluster, &repo, &async_flags);
    pj(&cluster, &repo, "backup", &["--start-fast", "--jobs", "2"]).ok();
    let first = newest_backup(&cluster, &repo);
    let first_label = first["label"].as_str().unwrap().to_string();
    let archive_start = first["archive_start"].as_str().unwrap().to_string();

    // pgbench while the background pusher is killed with SIGKILL three times.
    let (bin, a) = pgbench_args(&cluster.server, &args!["-n", "-c", 4, "-T", 9]);
    let bench = Background::spawn(&bin, &a, &cluster.root.join("pgbench.pid"));
    let mut kills = 0;
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(2000));
        cluster.psql("postgres", "SELECT pg_switch_wal()");
        if let Some(pids) = wait_for(Duration::from_secs(5), || {
            let p = pusher_pids();
            (!p.is_empty()).then_some(p)
        }) {
            for pid in pids {
                unsafe { libc::kill(pid, libc::SIGKILL) };
                kills += 1;
            }
        }
    }
    let r = bench.wait();
    assert!(r.success(), "pgbench failed:\n{r}");
    assert!(kills >= 3, "only {kills} background pusher(s) were killed");
    archive_all(
        &cluster,
        &repo,
        &async_flags,
        &archive_start,
        "after the kills",
    );
    pj(&cluster, &repo, "verify", &[]).ok();
    let want = cluster.psql(
        "postgres",
        "SELECT count(*), sum(delta) FROM pgbench_history",
    );
    let s = restore_promoted(&cluster, &repo, "end", &async_flags);
    assert_eq!(
        s.psql(
            "postgres",
            "SELECT count(*), sum(delta) FROM pgbench_history"
        ),
        want,
        "every committed transaction is restored"
    );
    drop(s);

    // An outage: the repository unwritable until PostgreSQL's archiver has failed three
    // times in a row, after which it waits up to 60 s before it tries again. Once the
    // repository takes WAL again, the pusher wakes it: caught up within 30 s.
    let archive_dir = cluster.repo.join("main/archive");
    let before = failed_archives(&cluster);
    fs::set_permissions(&archive_dir, fs::Permissions::from_mode(0o000)).unwrap();
    for _ in 0..2 {
        cluster.psql("postgres", "INSERT INTO pgbench_history SELECT 1, 1, 1, 0, now() FROM generate_series(1, 1000); SELECT pg_switch_wal()");
    }
    wait_archiving_failed(
        &cluster,
        before + 2,
        "archiving did not fail three times while the repository was unwritable",
    );
    // The archiver rests once its count stays still for 4 s (within a round its attempts
    // come 1 to 2 s apart).
    let mut n = failed_archives(&cluster);
    let resting = wait_for(Duration::from_secs(40), || {
        std::thread::sleep(Duration::from_secs(4));
        let now = failed_archives(&cluster);
        std::mem::replace(&mut n, now).eq(&now).then_some(())
    });
    assert!(resting.is_some(), "PostgreSQL's archiver kept retrying");
    fs::set_permissions(&archive_dir, fs::Permissions::from_mode(0o750)).unwrap();
    let back = std::time::Instant::now();
    wait_queue_empty(&cluster, "after the outage");
    let took = back.elapsed();
    assert!(
        took < Duration::from_secs(30),
        "asynchronous archiving caught up {} s after the repository came back (the bound is 30 s)",
        took.as_secs()
    );
    step!(
        "caught up {} ms after the repository came back",
        took.as_millis()
    );

    // The queue limit: with the repository unwritable, WAL beyond 48 MiB is dropped with a
    // warning, and the gap is recorded once the repository is back.
    let mut limited = async_flags.to_vec();
    limited.push("--archive-push-queue-max=48MB");
    set_archive_command(&cluster.server, &repo, &limited);
    fs::set_permissions(&archive_dir, fs::Permissions::from_mode(0o000)).unwrap();
    cluster.psql("postgres", "CREATE TABLE filler (b text)");
    for _ in 0..6 {
        cluster.psql("postgres", "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000); SELECT pg_switch_wal()");
    }
    // The queue shrinks to the limit (three segments) while the repository stays unwritable.
    let dropped = wait_for(Duration::from_secs(120), || {
        let log = fs::read_to_string(&cluster.server.log).unwrap_or_default();
        (log.contains("WAL DROPPED") && ready_files(cluster.data()).len() <= 3).then_some(())
    });
    assert!(
        dropped.is_some(),
        "no WAL dropped: waiting {:?}\n{}",
        ready_files(cluster.data()),
        cluster.server.log_tail()
    );
    fs::set_permissions(&archive_dir, fs::Permissions::from_mode(0o750)).unwrap();
    wait_queue_empty(&cluster, "after the repository came back");
    // The pusher writes the gap record into the repository once it can.
    cluster.psql(
        "postgres",
        "INSERT INTO filler VALUES ('after'); SELECT pg_switch_wal()",
    );
    let gaps = wait_for(Duration::from_secs(60), || {
        let v = info_json(&cluster, &repo);
        let g = v["archive"][0]["gaps"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (!g.is_empty()).then_some(g)
    })
    .unwrap_or_else(|| panic!("no gap in info:\n{}", pj(&cluster, &repo, "info", &[])));
    step!("gaps recorded: {gaps:?}");
    let text = pj(&cluster, &repo, "info", &[]).ok();
    assert!(text.stdout.contains("GAP:"), "{text}");
    // A recovery from the first backup would cross the gap: refused.
    let dir = cluster.new_dir("across-gap");
    let mut a = args!["restore", "--stanza", "main"];
    a.extend(repo.args.iter().cloned());
    a.extend(args!["--pg-path", dir.display(), "--set", first_label]);
    pgjet(&a).fails_with("gap");
    // A backup after the gap restores, and expire drops the first backup, its WAL and the gap.
    pj(
        &cluster,
        &repo,
        "backup",
        &["--start-fast", "--jobs", "2", "--no-expire"],
    )
    .ok();
    let second = newest_backup(&cluster, &repo);
    let second_start = second["archive_start"].as_str().unwrap().to_string();
    let r = pj(
        &cluster,
        &repo,
        "expire",
        &["--retention-full", "1", "--dry-run"],
    )
    .ok();
    assert!(
        r.stdout
            .contains(&format!("would expire backup {first_label}")),
        "{r}"
    );
    assert_eq!(
        info_json(&cluster, &repo)["backups"]
            .as_array()
            .map(|b| b.len()),
        Some(2)
    );
    let r = pj(&cluster, &repo, "expire", &["--retention-full", "1"]).ok();
    assert!(
        r.stdout.contains(&format!("expired backup {first_label}")),
        "{r}"
    );
    let v = info_json(&cluster, &repo);
    assert_eq!(v["backups"].as_array().map(|b| b.len()), Some(1), "{v}");
    assert!(
        v["archive"][0]["gaps"]
            .as_array()
            .map(|g| g.is_empty())
            .unwrap_or(true),
        "{v}"
    );
    let runs = archive_runs(&cluster, &repo);
    assert!(
        runs.iter().all(|r| r.1 >= second_start),
        "WAL before {second_start} is left: {runs:?}"
    );
    let want = cluster.psql("postgres", "SELECT count(*) FROM filler");
    pj(&cluster, &repo, "check", &check_flags(&limited)).ok();
    let s = restore_promoted(&cluster, &repo, "after-gap", &async_flags);
    assert_eq!(s.psql("postgres", "SELECT count(*) FROM filler"), want);
}

#[test]
fn pg15_s3_async_archiving_outage_and_prefetch() {
    let cluster = Cluster::new(&Pg::v15(), "arch15s3");
    let mut repo = s3_repo("arch15s3");
    let spool = cluster.new_dir("spool");
    let spool_flag = format!("--spool-path={}", spool.display());
    let async_flags = ["--archive-async=y", spool_flag.as_str(), "--jobs=4"];
    pgbench_init(&cluster.server, 2);
    pj(&cluster, &repo, "stanza-create", &[]).ok();
    enable_archiving(&cluster, &repo, &async_flags);
    pj(&cluster, &repo, "backup", &["--start-fast", "--jobs", "2"]).ok();
    let archive_start = newest_backup(&cluster, &repo)["archive_start"]
        .as_str()
        .unwrap()
        .to_string();
    pgbench_for(&cluster, 4);

    // The S3 server stops: pushes fail, PostgreSQL keeps the WAL; it comes back and the
    // queue drains.
    let before = failed_archives(&cluster);
    repo.server.as_mut().unwrap().stop();
    let mut last = String::new();
    for _ in 0..3 {
        let out = cluster.psql("postgres", "INSERT INTO pgbench_history SELECT 1, 1, 1, 0, now() FROM generate_series(1, 1000); SELECT pg_walfile_name(pg_switch_wal())");
        last = out.lines().last().unwrap_or_default().to_string();
    }
    // A failure seen by PostgreSQL (the pusher's store retries take about 30 s to give up on a
    // file); the bound after S3's return holds whatever the archiver does meanwhile.
    let state = || {
        let log = fs::read_to_string(spool.join("archive/main/push.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        format!(
            "pg_stat_archiver: {}\npush.log (last lines first):\n{}",
            cluster.psql("postgres", "SELECT archived_count, last_archived_wal, failed_count, last_failed_wal, last_failed_time, now() FROM pg_stat_archiver"),
            tail.join("\n")
        )
    };
    let failed = wait_for(Duration::from_secs(60), || {
        (failed_archives(&cluster) > before).then_some(())
    });
    assert!(
        failed.is_some(),
        "archiving did not fail while the S3 server was down\n{}",
        state()
    );
    repo.server.as_mut().unwrap().resume();
    let back = std::time::Instant::now();
    let caught_up = wait_for(Duration::from_secs(90), || {
        let done = cluster.psql(
            "postgres",
            &format!("SELECT coalesce(last_archived_wal >= '{last}', false) FROM pg_stat_archiver"),
        );
        (done == "t").then_some(back.elapsed())
    });
    let took = caught_up.unwrap_or_else(|| {
        panic!(
            "{last} was not archived within 90 s of S3's return\n{}",
            state()
        )
    });
    assert!(
        took < Duration::from_secs(30),
        "asynchronous archiving caught up {} s after S3's return (the bound is 30 s)",
        took.as_secs()
    );
    step!("caught up {} ms after S3's return", took.as_millis());
    archive_all(
        &cluster,
        &repo,
        &["--archive-timeout", "120"],
        &archive_start,
        "after the S3 outage",
    );
    let r = pj(&cluster, &repo, "verify", &[]).ok();
    assert!(r.stdout.contains("WAL archive: ok"), "{r}");

    // Replay through the asynchronous archive-get: the prefetcher fills the spool.
    let want = cluster.psql(
        "postgres",
        "SELECT count(*), sum(delta) FROM pgbench_history",
    );
    let s = restore_promoted(&cluster, &repo, "end", &async_flags);
    assert_eq!(
        s.psql(
            "postgres",
            "SELECT count(*), sum(delta) FROM pgbench_history"
        ),
        want
    );
    let get_log = fs::read_to_string(spool.join("archive/main/get.log")).unwrap_or_default();
    assert!(
        get_log.contains("prefetcher started"),
        "the prefetcher did not run: {get_log}"
    );
}

/// The scenario each major runs against S3 with asynchronous archiving: a full backup
/// taken while pgbench writes (its writes overlap the backup), restored to its end and
/// checked (pgbench's invariant, every account, pg_amcheck); marks written after it, then
/// a point-in-time recovery to a time between them and a recovery to the archive's end,
/// both replaying through the asynchronous archive-get from S3.
fn s3_async_archiving_backup_under_load_pitr(pg: Pg, tag: &str) {
    let t0 = std::time::Instant::now();
    let cluster = Cluster::new(&pg, tag);
    let repo = s3_repo(tag);
    let spool = cluster.new_dir("spool");
    let spool_flag = format!("--spool-path={}", spool.display());
    let async_flags = ["--archive-async=y", spool_flag.as_str(), "--jobs=4"];
    pgbench_init(&cluster.server, 4);
    cluster.psql("postgres", "CREATE TABLE marks (i int)");
    pj(&cluster, &repo, "stanza-create", &[]).ok();
    enable_archiving(&cluster, &repo, &async_flags);

    // A backup under load: pgbench commits before, during and after it.
    let history = |s: &Server| -> u64 {
        s.psql("postgres", "SELECT count(*) FROM pgbench_history")
            .parse()
            .unwrap()
    };
    let (bin, a) = pgbench_args(&cluster.server, &args!["-n", "-c", 4, "-T", 600]);
    let mut bench = Background::spawn(&bin, &a, &cluster.root.join("pgbench.pid"));
    let writing = wait_for(Duration::from_secs(60), || {
        (history(&cluster.server) > 0).then_some(())
    });
    assert!(writing.is_some(), "pgbench wrote nothing within 60 s");
    let before = history(&cluster.server);
    let r = pj(&cluster, &repo, "backup", &["--start-fast", "--jobs", "2"]).ok();
    let after = history(&cluster.server);
    assert!(
        bench.try_wait().is_none(),
        "pgbench ended before the backup did:\n{}",
        bench.wait()
    );
    bench.signal(libc::SIGTERM);
    bench.wait();
    assert!(after > before, "no transaction committed during the backup");
    step!(
        "{tag}: backup under pgbench in {:.1}s, history {before} -> {after} rows meanwhile",
        r.elapsed.as_secs_f64()
    );
    let backup = newest_backup(&cluster, &repo);
    let archive_start = backup["archive_start"].as_str().unwrap().to_string();

    let targets = write_marks(&cluster);
    let last = archive_all(&cluster, &repo, &[], &archive_start, "after the marks");
    let v = pj(&cluster, &repo, "verify", &[]).ok();
    assert!(v.stdout.contains("WAL archive: ok"), "{v}");
    step!("{tag}: archived through {last}, verify ok");

    // The backup's own end, checked as pg_verifybackup, pgbench and amcheck see it.
    let dir = restore(
        &cluster,
        &repo,
        "end-of-backup",
        &[
            "--type",
            "immediate",
            "--target-action",
            "promote",
            "--archive-mode",
            "off",
        ],
    );
    let s = start_restored(&cluster, &format!("{tag}: restore of the backup"), &dir);
    assert_pgbench_invariant(tag, &s);
    assert!(
        history(&s) >= before,
        "rows committed before the backup are missing"
    );
    assert_eq!(
        s.psql("postgres", "SELECT count(*) FROM pgbench_accounts"),
        "400000"
    );
    let check = s.amcheck();
    assert!(
        check.success(),
        "pg_amcheck on the restored cluster:\n{check}"
    );
    drop(s);

    // Point in time, and the archive's end, through the asynchronous archive-get.
    let mut time = vec!["--type", "time", "--target", targets.time.as_str()];
    time.extend(async_flags);
    pitr(&cluster, &repo, "pitr-time", &time, "1,2,3,4,5", "time");
    let want = cluster.psql(
        "postgres",
        "SELECT count(*), sum(delta) FROM pgbench_history",
    );
    let s = restore_promoted(&cluster, &repo, "end", &async_flags);
    assert_eq!(marks(&s), "1,2,3,4,5,6", "end of the archive");
    assert_eq!(
        s.psql(
            "postgres",
            "SELECT count(*), sum(delta) FROM pgbench_history"
        ),
        want
    );
    assert_pgbench_invariant(tag, &s);
    step!("{tag}: S3 async archiving scenario done in {}", secs(t0));
}

#[test]
fn pg16_s3_async_archiving_backup_under_load_pitr() {
    s3_async_archiving_backup_under_load_pitr(Pg::v16(), "arch16s3");
}

#[test]
fn pg17_s3_async_archiving_backup_under_load_pitr() {
    s3_async_archiving_backup_under_load_pitr(Pg::v17(), "arch17s3");
}

#[test]
fn pg18_s3_async_archiving_backup_under_load_pitr() {
    s3_async_archiving_backup_under_load_pitr(Pg::v18(), "arch18s3async");
}

#[test]
fn pg18_s3_sync_archiving_pitr() {
    let cluster = Cluster::new(&Pg::v18(), "arch18s3");
    let repo = s3_repo("arch18s3");
    cluster.psql("postgres", "CREATE TABLE marks (i int)");
    pj(&cluster, &repo, "stanza-create", &[]).ok();
    enable_archiving(&cluster, &repo, &[]);
    pj(&cluster, &repo, "backup", &["--start-fast", "--jobs", "2"]).ok();
    let first = newest_backup(&cluster, &repo)["label"]
        .as_str()
        .unwrap()
        .to_string();
    let targets = write_marks(&cluster);
    // A second backup after the marks (in a later second: labels have one-second resolution).
    std::thread::sleep(Duration::from_millis(1100));
    pj(&cluster, &repo, "backup", &["--start-fast", "--jobs", "2"]).ok();
    mark(&cluster, 7);
    pj(&cluster, &repo, "check", &[]).ok();
    // The time target lies between the backups: the first one is chosen by itself.
    let dir = restore(
        &cluster,
        &repo,
        "pitr-time",
        &[
            "--type",
            "time",
            "--target",
            &targets.time,
            "--target-action",
            "promote",
        ],
    );
    let conf = fs::read_to_string(dir.join("postgresql.auto.conf")).unwrap();
    assert!(
        conf.contains(&format!("backup {first}")),
        "the backup before the target was not chosen:\n{conf}"
    );
    let s = cluster.start_other(&dir, free_port());
    s.wait_promoted(Duration::from_secs(120));
    assert_eq!(marks(&s), "1,2,3,4,5", "time");
    drop(s);
    let s = restore_promoted(&cluster, &repo, "end", &[]);
    assert_eq!(
        marks(&s),
        "1,2,3,4,5,6,7",
        "end of the archive, from the second backup"
    );
    drop(s);
    pitr(
        &cluster,
        &repo,
        "pitr-lsn",
        &["--type", "lsn", "--target", &targets.lsn],
        "1,2",
        "LSN",
    );
}

// ------------------------------------------------------------------------------------------
// Retention: retention-archive and retention-full-type=time.

/// Commits a row into filler and switches to a new WAL segment, twice: the archive gets
/// segments that belong to no backup.
fn segments_between(cluster: &Cluster) {
    for _ in 0..2 {
        cluster.psql(
            "postgres",
            "INSERT INTO filler VALUES ('x'); SELECT pg_switch_wal()",
        );
    }
}

/// Runs `backup` with `extra` flags; returns the new backup's entry from info and the run.
fn backup_entry(cluster: &Cluster, repo: &Repo, extra: &[&str]) -> (serde_json::Value, Run) {
    let mut a = vec!["--start-fast", "--jobs", "2"];
    a.extend_from_slice(extra);
    let r = pj(cluster, repo, "backup", &a).ok();
    let b = newest_backup(cluster, repo);
    step!(
        "backup {}: archive {} to {}",
        b["label"],
        b["archive_start"],
        b["archive_stop"]
    );
    (b, r)
}

/// A string field of an info entry.
fn field(v: &serde_json::Value, key: &str) -> String {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in {v}"))
        .to_string()
}

/// The segment number of WAL segment `name` (16 MiB segments, the tests' clusters).
fn segno(name: &str) -> u64 {
    pgjet_core::pg::lsn::parse_wal_segment_name(name, 16 << 20)
        .unwrap_or_else(|| panic!("not a WAL segment name: {name}"))
        .1
}

/// Labels of the backups info lists, oldest first.
fn labels(cluster: &Cluster, repo: &Repo) -> Vec<String> {
    info_json(cluster, repo)["backups"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| field(b, "label"))
        .collect()
}

/// Restores backup `label` with --type immediate, starts the cluster, and checks that marks
/// holds `want`: the backup is consistent with the WAL the archive kept for it.
fn restore_immediate(cluster: &Cluster, repo: &Repo, name: &str, label: &str, want: &str) {
    let s = restore_promoted(
        cluster,
        repo,
        name,
        &[
            "--set",
            label,
            "--type",
            "immediate",
            "--target-action",
            "promote",
        ],
    );
    assert_eq!(
        marks(&s),
        want,
        "backup {label} restored with --type immediate"
    );
}

/// Restores to LSN `target` (the backup chosen by pgjet), starts the cluster, and checks that
/// the backup chosen is `label` and that marks holds `want`.
fn restore_lsn(cluster: &Cluster, repo: &Repo, name: &str, target: &str, label: &str, want: &str) {
    let dir = restore(
        cluster,
        repo,
        name,
        &[
            "--type",
            "lsn",
            "--target",
            target,
            "--target-action",
            "promote",
        ],
    );
    let conf = fs::read_to_string(dir.join("postgresql.auto.conf")).unwrap();
    assert!(
        conf.contains(&format!("backup {label}")),
        "{name}: backup {label} was not the one chosen for LSN {target}:\n{conf}"
    );
    let s = cluster.start_other(&dir, free_port());
    s.wait_promoted(Duration::from_secs(120));
    assert_eq!(marks(&s), want, "{name}: recovery to LSN {target}");
}

/// retention-archive=2 with four backups, and no retention-full (README: retention-archive
/// alone expires WAL too, and `backup` runs expire for it): the two newest backups keep a
/// continuous archive (a point-in-time recovery between them works), the two older ones
/// keep exactly their own WAL (each still restores with --type immediate), the segments in
/// between are gone, and every backup stays.
#[test]
fn pg15_posix_retention_archive() {
    let cluster = Cluster::new(&Pg::v15(), "retarch");
    let repo = posix_repo(&cluster);
    cluster.psql(
        "postgres",
        "CREATE TABLE marks (i int); CREATE TABLE filler (t text)",
    );
    pj(&cluster, &repo, "stanza-create", &[]).ok();
    enable_archiving(&cluster, &repo, &[]);
    let mut b = Vec::new();
    for i in 1..=3 {
        mark(&cluster, i);
        b.push(backup_entry(&cluster, &repo, &["--no-expire"]).0);
        segments_between(&cluster);
    }
    mark(&cluster, 4);
    let target = cluster.psql("postgres", "SELECT pg_current_wal_insert_lsn()");
    mark(&cluster, 5);
    let range = |b: &serde_json::Value| (field(b, "archive_start"), field(b, "archive_stop"));
    let (s1, e1) = range(&b[0]);
    let (s2, e2) = range(&b[1]);
    let (s3, e3) = range(&b[2]);
    // Before: one continuous run from the first backup on, with segments that belong to no
    // backup between the backups.
    assert_continuous(&cluster, &repo, 1, &s1, &e3);
    assert!(segno(&s2) > segno(&e1) + 1 && segno(&s3) > segno(&e2) + 1);

    // The fourth backup expires with retention-archive alone.
    let (b4, r) = backup_entry(&cluster, &repo, &["--retention-archive", "2"]);
    assert!(
        r.stderr.contains("expire: removed")
            && r.stderr
                .contains(&format!("(backup {})", field(&b[2], "label"))),
        "the backup did not expire WAL with retention-archive alone:\n{r}"
    );
    b.push(b4);
    let all: Vec<String> = b.iter().map(|x| field(x, "label")).collect();
    assert_eq!(labels(&cluster, &repo), all, "no backup is expired");
    let runs = archive_runs(&cluster, &repo);
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert_eq!(
        runs[0],
        (1, s1.clone(), e1.clone()),
        "backup 1 keeps its own WAL only"
    );
    assert_eq!(
        runs[1],
        (1, s2.clone(), e2.clone()),
        "backup 2 keeps its own WAL only"
    );
    assert_eq!(
        runs[2].1, s3,
        "the archive is continuous from backup 3 on: {runs:?}"
    );
    assert!(
        runs[2].2 >= field(&b[3], "archive_stop"),
        "the archive is continuous to backup 4's end: {runs:?}"
    );
    // Expiring again removes nothing more.
    let r = pj(&cluster, &repo, "expire", &["--retention-archive", "2"]).ok();
    assert!(r.stdout.contains("no archived WAL to remove"), "{r}");
    assert_eq!(archive_runs(&cluster, &repo), runs);

    // A point-in-time recovery between the two newest backups; the older ones restore to
    // their consistent point.
    restore_lsn(&cluster, &repo, "pitr-window", &target, &all[2], "1,2,3,4");
    restore_immediate(&cluster, &repo, "older-1", &all[0], "1");
    restore_immediate(&cluster, &repo, "older-2", &all[1], "1,2");
}

/// Moves backup `label`'s start and stop times `days` days into the past: its manifest and
/// summary are read and written again with pgjet's own reader and writer (the objects stay).
fn age_backup(repo_dir: &Path, label: &str, days: i64) {
    use pgjet_core::storage::posix::PosixStorage;
    let store = PosixStorage::open(repo_dir).unwrap();
    let stanza = pgjet_core::repo::Stanza::new(1, std::sync::Arc::new(store), "main");
    let backup = stanza.backup(label);
    let mut m = backup.manifest().unwrap();
    let back = |t: &str| {
        let t = chrono::DateTime::parse_from_rfc3339(t)
            .unwrap_or_else(|e| panic!("{label}: time {t}: {e}"))
            .with_timezone(&chrono::Utc);
        pgjet_core::repo::rfc3339(t - chrono::Duration::days(days))
    };
    m.header.start_time = back(&m.header.start_time);
    m.stop.stop_time = back(&m.stop.stop_time);
    backup.write_manifest(&m).unwrap();
    chown_pg_recursive(repo_dir);
}

/// retention-full-type=time: four backups that stopped 10, 6 and 2 days ago and now, with
/// retention-full=5 (days): the two of the window stay and so does the newest one before it
/// (6 days), from which a recovery into the window's first moments starts; the oldest goes
/// with the WAL before the kept backups, and the archive stays continuous from the oldest
/// kept backup on.
#[test]
fn pg15_posix_retention_full_time() {
    let cluster = Cluster::new(&Pg::v15(), "rettime");
    let repo = posix_repo(&cluster);
    cluster.psql(
        "postgres",
        "CREATE TABLE marks (i int); CREATE TABLE filler (t text)",
    );
    pj(&cluster, &repo, "stanza-create", &[]).ok();
    enable_archiving(&cluster, &repo, &[]);
    let mut b = Vec::new();
    mark(&cluster, 1);
    b.push(backup_entry(&cluster, &repo, &["--no-expire"]).0);
    segments_between(&cluster);
    mark(&cluster, 2);
    b.push(backup_entry(&cluster, &repo, &["--no-expire"]).0);
    segments_between(&cluster);
    mark(&cluster, 3);
    let target = cluster.psql("postgres", "SELECT pg_current_wal_insert_lsn()");
    mark(&cluster, 4);
    b.push(backup_entry(&cluster, &repo, &["--no-expire"]).0);
    segments_between(&cluster);
    mark(&cluster, 5);
    b.push(backup_entry(&cluster, &repo, &["--no-expire"]).0);
    let all: Vec<String> = b.iter().map(|x| field(x, "label")).collect();
    let start2 = field(&b[1], "archive_start");
    assert_continuous(
        &cluster,
        &repo,
        1,
        &field(&b[0], "archive_start"),
        &field(&b[3], "archive_stop"),
    );
    assert!(segno(&start2) > segno(&field(&b[0], "archive_stop")) + 1);

    for (label, days) in [(&all[0], 10), (&all[1], 6), (&all[2], 2)] {
        age_backup(&cluster.repo, label, days);
    }
    let v = info_json(&cluster, &repo);
    let stop0 = field(&v["backups"][0], "stop_time");
    let ago = chrono::Utc::now()
        - chrono::DateTime::parse_from_rfc3339(&stop0)
            .unwrap()
            .with_timezone(&chrono::Utc);
    assert!(ago.num_days() == 10, "backup 1 stopped {stop0}");

    let time = ["--retention-full", "5", "--retention-full-type", "time"];
    let mut dry = time.to_vec();
    dry.push("--dry-run");
    let r = pj(&cluster, &repo, "expire", &dry).ok();
    assert_eq!(r.stdout.matches("would expire backup").count(), 1, "{r}");
    assert!(
        r.stdout
            .contains(&format!("would expire backup {}", all[0])),
        "{r}"
    );
    assert_eq!(labels(&cluster, &repo), all, "--dry-run removes nothing");

    let r = pj(&cluster, &repo, "expire", &time).ok();
    assert_eq!(r.stdout.matches("expired backup").count(), 1, "{r}");
    assert!(
        r.stdout.contains(&format!("expired backup {}", all[0])),
        "{r}"
    );
    assert_eq!(labels(&cluster, &repo), all[1..].to_vec());
    assert!(!backup_dir(&cluster.repo, "main", &all[0]).exists());
    let runs = archive_runs(&cluster, &repo);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        runs[0].1, start2,
        "the archive starts at the oldest kept backup: {runs:?}"
    );
    assert!(runs[0].2 >= field(&b[3], "archive_stop"), "{runs:?}");

    // The window's first moments: recovered to from the backup before the window.
    restore_lsn(&cluster, &repo, "window-start", &target, &all[1], "1,2,3");
}

/// Every file below `dir`, recursively.
fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_below(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// An encrypted posix repository (`repo1-cipher-type=aes-256-gcm`, the passphrase in the
/// config file, mode 0600): stanza-create, archiving by PostgreSQL's archive_command, a
/// backup, verify, and a point-in-time recovery whose restore_command decrypts the WAL; no
/// stored object but the key files holds a plain byte, and the passphrase appears in no
/// output and no file pgjet writes. The passphrase changed (no data rewritten, the old one
/// refused, the new one verifies everything); an incremental backup restored with its rows;
/// a backup killed after its first journal save, resumed by the next. Refused, each with its own message: a wrong passphrase,
/// the repository read without one (commands and archive-get), a flipped byte in a backup's
/// object (verify, restore) and in an archived segment (archive-get), and an object of another
/// backup in its place.
#[test]
fn pg15_posix_encrypted_backup_archive_pitr_and_refusals() {
    const PASS: &str = "Correct-Horse-Battery-Staple-4a7f";
    let cluster = Cluster::new(&Pg::v15(), "enc15");
    let conf = cluster.root.join("pgjet.conf");
    let write_conf = |path: &Path, extra: &str| {
        fs::write(
            path,
            format!("[global]\nrepo1-path={}\n{extra}", cluster.repo.display()),
        )
        .unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
        chown_pg_recursive(path);
    };
    write_conf(
        &conf,
        &format!("repo1-cipher-type=aes-256-gcm\nrepo1-cipher-pass={PASS}\n"),
    );
    let repo = Repo {
        args: args!["--config", conf.display()],
        server: None,
    };
    pgbench_init(&cluster.server, 1);
    cluster.psql("postgres", "CREATE TABLE marks (i int)");
    let mut outputs = Vec::new();
    outputs.push(pj(&cluster, &repo, "stanza-create", &[]).ok());
    enable_archiving(&cluster, &repo, &[]);
    outputs.push(pj(&cluster, &repo, "backup", &["--start-fast", "--jobs", "2"]).ok());
    let b = newest_backup(&cluster, &repo);
    let label = b["label"].as_str().unwrap().to_string();
    let archive_start = b["archive_start"].as_str().unwrap().to_string();
    let targets = write_marks(&cluster);
    let last = archive_all(&cluster, &repo, &[], &archive_start, "encrypted archive");
    let r = pj(&cluster, &repo, "verify", &[]).ok();
    assert!(r.stdout.contains("WAL archive: ok"), "{r}");
    outputs.push(r);

    // Nothing stored in the clear but the key files; the passphrase nowhere.
    let files = files_below(&cluster.repo);
    let mut sealed = 0;
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let bytes = fs::read(f).unwrap();
        assert!(
            !bytes.windows(PASS.len()).any(|w| w == PASS.as_bytes()),
            "{} holds the passphrase",
            f.display()
        );
        if name == "cipher.json" || name == "key" {
            continue;
        }
        assert!(
            bytes.starts_with(b"PGJAE1\0\0"),
            "{} is not encrypted",
            f.display()
        );
        sealed += 1;
    }
    step!("{sealed} stored objects, every one encrypted; the key files are the only plain ones");
    assert!(files
        .iter()
        .any(|f| f.ends_with(format!("backup/{label}/key"))));

    // Point-in-time recovery: restore_command runs archive-get with the config file.
    pitr(
        &cluster,
        &repo,
        "pitr-enc",
        &["--type", "time", "--target", &targets.time],
        "1,2,3,4,5",
        "time target, encrypted repository",
    );
    let auto = fs::read_to_string(cluster.root.join("pitr-enc/postgresql.auto.conf")).unwrap();
    assert!(
        auto.contains("archive-get") && !auto.contains(PASS),
        "{auto}"
    );
    for r in &outputs {
        assert!(
            !format!("{r}").contains(PASS),
            "the passphrase in an output:\n{r}"
        );
    }

    // A new passphrase: only the keys' wrapping changes; the old one no longer opens the
    // stanza, the new one opens every backup and the archive.
    // Refused before anything changes: no new passphrase, the same one, a plain repository.
    let cipher_json = fs::read(cluster.repo.join("main/cipher.json")).unwrap();
    pj(&cluster, &repo, "cipher-pass-change", &[]).fails_with("repo1-cipher-pass-new");
    let same = cluster.root.join("same.conf");
    write_conf(
        &same,
        &format!(
            "repo1-cipher-type=aes-256-gcm\nrepo1-cipher-pass={PASS}\nrepo1-cipher-pass-new={PASS}\n"
        ),
    );
    let s = Repo {
        args: args!["--config", same.display()],
        server: None,
    };
    pj(&cluster, &s, "cipher-pass-change", &[]).fails_with("is the current passphrase");
    pj(&cluster, &posix_repo(&cluster), "cipher-pass-change", &[])
        .fails_with("not configured as encrypted");
    assert_eq!(
        fs::read(cluster.repo.join("main/cipher.json")).unwrap(),
        cipher_json,
        "a refused passphrase change changed cipher.json"
    );
    const NEW: &str = "Another-Long-Passphrase-9c2e";
    let change = cluster.root.join("change.conf");
    write_conf(
        &change,
        &format!(
            "repo1-cipher-type=aes-256-gcm\nrepo1-cipher-pass={PASS}\nrepo1-cipher-pass-new={NEW}\n"
        ),
    );
    let c = Repo {
        args: args!["--config", change.display()],
        server: None,
    };
    let data_before = fs::read(
        cluster
            .repo
            .join(format!("main/backup/{label}/data/000001")),
    )
    .unwrap();
    let r = pj(&cluster, &c, "cipher-pass-change", &[]).ok();
    assert!(
        r.stdout.contains("rewrapped") && !format!("{r}").contains(NEW),
        "{r}"
    );
    step!("{}", r.stdout.trim());
    assert_eq!(
        fs::read(
            cluster
                .repo
                .join(format!("main/backup/{label}/data/000001"))
        )
        .unwrap(),
        data_before,
        "a passphrase change rewrites no data"
    );
    pj(&cluster, &repo, "info", &[]).fails_with("does not open its keys");
    write_conf(
        &conf,
        &format!("repo1-cipher-type=aes-256-gcm\nrepo1-cipher-pass={NEW}\n"),
    );
    let r = pj(&cluster, &repo, "verify", &[]).ok();
    assert!(r.stdout.contains("WAL archive: ok"), "{r}");
    // The lock's record is sealed like everything else: read through the cipher store.
    let sealed =
        std::sync::Arc::new(pgjet_core::storage::posix::PosixStorage::open(&cluster.repo).unwrap());
    let opened = pgjet_core::repo::cipher_store::CipherStorage::new(sealed, 1, NEW);
    let (_, lock) = pgjet_core::repo::lock::current(&opened, "main")
        .unwrap()
        .unwrap();
    assert!(
        lock.is_some_and(|l| l.released),
        "cipher-pass-change did not let its lock go"
    );

    // An incremental backup (its key, its reference's objects under the full's key),
    // restored with its rows; then a backup killed after its first journal save, resumed by
    // the next one (its key file made by the first attempt).
    load_random(&cluster.server, "postgres", "rand_t", 48 << 20);
    mark(&cluster, 7);
    pj(
        &cluster,
        &repo,
        "backup",
        &["--type", "incr", "--start-fast", "--jobs", "2"],
    )
    .ok();
    let incr = newest_backup(&cluster, &repo);
    assert_eq!(incr["type"], "incr", "{incr}");
    let incr = incr["label"].as_str().unwrap().to_string();
    pitr(
        &cluster,
        &repo,
        "incr-enc",
        &["--set", &incr, "--type", "immediate"],
        "1,2,3,4,5,6,7",
        "the encrypted incr",
    );
    let mut a = pj_args(&cluster, &repo, "backup", &["--type", "full"]);
    a.extend(SLOW_BACKUP.iter().map(|s| s.to_string()));
    a.extend(args!["--manifest-save-threshold", "4MiB"]);
    let b = Background::spawn(&pgjet_bin(), &a, &cluster.root.join("killed.pid"));
    let (b, killed) = wait_for_journal_save(b, &cluster.repo.join("main/backup"), 1, 1);
    b.signal(libc::SIGKILL);
    assert!(!b.wait().success());
    // The same settings (a resumed backup keeps its compression).
    let mut again = vec!["--type", "full", "--output", "json"];
    again.extend_from_slice(SLOW_BACKUP);
    let r = pj(&cluster, &repo, "backup", &again).ok();
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(
        v["label"],
        killed.as_str(),
        "the killed backup is resumed:\n{r}"
    );
    assert_eq!(v["resumed"], true, "{r}");
    step!(
        "{killed}: killed after its first journal save, resumed ({} bytes kept)",
        v["reused"]
    );
    pj(&cluster, &repo, "verify", &["--set", &killed]).ok();

    // A wrong passphrase: refused, not named.
    let wrong = cluster.root.join("wrong.conf");
    write_conf(
        &wrong,
        "repo1-cipher-type=aes-256-gcm\nrepo1-cipher-pass=Tr0ub4dor&3\n",
    );
    let w = Repo {
        args: args!["--config", wrong.display()],
        server: None,
    };
    let r = pj(&cluster, &w, "info", &[]).fails_with("does not open its keys");
    assert!(!format!("{r}").contains("Tr0ub4dor"), "{r}");
    // Without the passphrase: the stanza says it is encrypted, archive-get too.
    let plain = posix_repo(&cluster);
    pj(&cluster, &plain, "info", &[]).fails_with("is encrypted: set repo1-cipher-type");
    let dest = cluster.new_dir("get");
    let a = get_args(&plain, &last, &dest.join("x").display());
    let r = pgjet(&a).fails_with("is encrypted");
    assert_ne!(
        r.status.code(),
        Some(1),
        "an encrypted segment is not missing:\n{r}"
    );

    // A flipped byte in an archived segment: archive-get refuses it.
    let victim = cluster
        .repo
        .join(format!("main/archive/00000001/{}/{last}", &last[8..16]));
    flip_byte(&victim);
    let a = get_args(&repo, &last, &dest.join("y").display());
    let r = pgjet(&a).fails_with("does not authenticate");
    assert_ne!(r.status.code(), Some(1), "{r}");

    // A second backup; then its first object put in the place of the first backup's:
    // verify names it, and restore of the first refuses.
    pj(&cluster, &repo, "backup", &["--start-fast", "--jobs", "2"]).ok();
    let second = newest_backup(&cluster, &repo)["label"]
        .as_str()
        .unwrap()
        .to_string();
    let obj = |l: &str| cluster.repo.join(format!("main/backup/{l}/data/000001"));
    fs::copy(obj(&second), obj(&label)).unwrap();
    let r = pj(&cluster, &repo, "verify", &["--set", &label]);
    assert!(!r.success(), "verify must find the swapped object:\n{r}");
    assert!(format!("{r}").contains("000001"), "{r}");
    let dir = cluster.new_dir("swapped");
    let mut a = args!["restore", "--stanza", "main", "--set", &label];
    a.extend(repo.args.iter().cloned());
    a.extend(args!["--pg-path", dir.display()]);
    pgjet(&a).fails_with("000001");
    // A flipped byte in the second backup's manifest: its restore refuses.
    flip_byte(
        &cluster
            .repo
            .join(format!("main/backup/{second}/manifest.jsonl.zst")),
    );
    let dir = cluster.new_dir("flipped");
    let mut a = args!["restore", "--stanza", "main", "--set", &second];
    a.extend(repo.args.iter().cloned());
    a.extend(args!["--pg-path", dir.display()]);
    pgjet(&a).fails_with("does not authenticate");
}
