//! Fault tests against PostgreSQL 15: each makes something go wrong and asserts what a user
//! would see (a non-zero exit with a fragment of the message, see docs/commands.md: what
//! failed, where, and a HINT; or, for a corrupt source page, a warning naming file and block),
//! and that nothing was lost or left looking complete.
//!
//! Tests a-f and i-k share one cluster with a small dataset and one full backup (built once, in
//! a static; its server is stopped and its directory removed when the test process exits).
//! Tests g (kill -9 during a backup) and h (a corrupt page in the source), and the second
//! cluster of test c, have their own clusters; so do n and o (the stanza's lock lost during
//! a backup: taken over by another pgjet, or not renewable until its lease ran out), whose
//! clusters archive WAL through a gate that holds the backup at its end; and t (a second
//! host's clock 5 minutes ahead does not take a live lock), which runs on such a cluster too.
//! q (the repository's disk full during a backup), r (the spool's disk full under
//! asynchronous archive-push) and s (a read-only repository) use the shared cluster with
//! their own repositories.

use crate::common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The shared fixture: a PostgreSQL 15 cluster with the SMALL dataset, its repository with the
/// stanza "main" and one complete full backup.
struct Fx {
    cluster: Cluster,
    label: String,
}

fn fx() -> &'static Fx {
    static FX: OnceLock<Fx> = OnceLock::new();
    FX.get_or_init(|| {
        let t = Instant::now();
        let cluster = Cluster::new(&Pg::v15(), "faults");
        load_dataset(&cluster, DatasetSpec::SMALL);
        let repo = cluster.repo.clone();
        cluster.pgjet_cmd("stanza-create", &repo, &[]).ok();
        cluster.full_backup(&repo);
        let backups = info_backups(&repo, "main");
        assert_eq!(
            backups.len(),
            1,
            "fault fixture: one backup expected: {backups:?}"
        );
        let label = backups[0]["label"].as_str().unwrap().to_string();
        step!("fault fixture ready in {} (backup {label})", secs(t));
        Fx { cluster, label }
    })
}

/// Stanza arguments with an overridden --pg-path and --pg-port.
fn stanza_args_with(c: &Cluster, repo: &Path, pg_path: &Path, port: u16) -> Vec<String> {
    args![
        "--stanza",
        "main",
        "--repo-path",
        repo.display(),
        "--pg-path",
        pg_path.display(),
        "--pg-port",
        port,
        "--pg-socket-path",
        c.sock().display()
    ]
}

fn cmd(name: &str, rest: Vec<String>, extra: &[&str]) -> Vec<String> {
    let mut a = vec![name.to_string()];
    a.extend(rest);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// A copy (`cp -a`) of the shared repository, for tests that damage it.
fn copy_repo(c: &Cluster, name: &str) -> PathBuf {
    let repo = c.root.join(name);
    let st = Command::new("cp")
        .arg("-a")
        .arg(&c.repo)
        .arg(&repo)
        .status()
        .unwrap();
    assert!(st.success(), "cp -a repository");
    repo
}

/// Label directories under <repo>/main/backup (docs/repository-format.md), sorted.
fn backup_dirs(repo: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(repo.join("main").join("backup"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Label directories under <repo>/main/backup that contain a summary.json (= look complete).
fn complete_backups(repo: &Path) -> Vec<String> {
    let backups = repo.join("main").join("backup");
    backup_dirs(repo)
        .into_iter()
        .filter(|l| backups.join(l).join("summary.json").exists())
        .collect()
}

fn assert_no_backups(repo: &Path, what: &str) {
    let listed = info_backups(repo, "main");
    assert!(
        listed.is_empty(),
        "{what}: info must list no backup, got {listed:?}"
    );
    let complete = complete_backups(repo);
    assert!(
        complete.is_empty(),
        "{what}: label dirs with summary.json left behind: {complete:?}"
    );
}

// ------------------------------------------------------------------------------------------

/// a. cluster not reachable (wrong --pg-port) for backup and check -> "could not connect".
#[test]
fn a_cluster_not_reachable() {
    let c = &fx().cluster;
    let repo = c.new_dir("repo-a");
    c.pgjet_cmd("stanza-create", &repo, &[]).ok();
    let bad_port = free_port();
    let base = stanza_args_with(c, &repo, c.data(), bad_port);
    pgjet(&cmd(
        "backup",
        base.clone(),
        &["--type", "full", "--start-fast"],
    ))
    .fails_with("could not connect");
    pgjet(&cmd("check", base, &[])).fails_with("could not connect");
    assert_no_backups(&repo, "backup with a wrong --pg-port");
    // The stanza is still usable.
    c.pgjet_cmd("check", &repo, &[]).ok();
}

/// b. --pg-path is a real directory but not the server's data_directory -> "data_directory".
#[test]
fn b_pg_path_not_data_directory() {
    let c = &fx().cluster;
    let repo = c.new_dir("repo-b");
    c.pgjet_cmd("stanza-create", &repo, &[]).ok();
    // A real directory that looks a bit like a data directory.
    let other = c.new_dir("other-data");
    fs::copy(c.data().join("PG_VERSION"), other.join("PG_VERSION")).unwrap();
    chown_pg_recursive(&other);
    let before = snapshot_tree(&other);
    let base = stanza_args_with(c, &repo, &other, c.port());
    pgjet(&cmd(
        "backup",
        base.clone(),
        &["--type", "full", "--start-fast"],
    ))
    .fails_with("data_directory");
    pgjet(&cmd("check", base, &[])).fails_with("data_directory");
    assert_no_backups(&repo, "backup with a wrong --pg-path");
    assert_eq!(
        snapshot_tree(&other),
        before,
        "the wrong --pg-path directory was modified"
    );
}

/// c. no stanza -> "stanza-create"; another cluster's stanza -> "system identifier"; the
/// stanza files stay unchanged.
#[test]
fn c_stanza_checks() {
    let a = &fx().cluster;
    let repo = a.new_dir("repo-c");
    a.pgjet_cmd("backup", &repo, &["--type", "full", "--start-fast"])
        .fails_with("stanza-create");
    pgjet(&args![
        "info",
        "--stanza",
        "main",
        "--repo-path",
        repo.display()
    ])
    .fails_with("stanza-create");
    assert!(
        complete_backups(&repo).is_empty(),
        "a backup without stanza left a complete-looking backup"
    );

    a.pgjet_cmd("stanza-create", &repo, &[]).ok();
    let stanza_dir = repo.join("main");
    assert!(
        stanza_dir.join("stanza.json").exists(),
        "stanza-create wrote no {}/stanza.json",
        stanza_dir.display()
    );
    let before = snapshot_tree(&stanza_dir);

    let b = Cluster::new(&Pg::v15(), "faults-b");
    assert_ne!(
        a.system_identifier(),
        b.system_identifier(),
        "two initdb runs gave the same system identifier"
    );
    b.pgjet_cmd("stanza-create", &repo, &[])
        .fails_with("system identifier");
    b.pgjet_cmd("backup", &repo, &["--type", "full", "--start-fast"])
        .fails_with("system identifier");
    b.pgjet_cmd("check", &repo, &[])
        .fails_with("system identifier");
    let after = snapshot_tree(&stanza_dir);
    if after != before {
        let changed: Vec<&String> = before
            .keys()
            .chain(after.keys())
            .filter(|k| before.get(*k) != after.get(*k))
            .collect();
        panic!("stanza files changed by the commands of another cluster: {changed:?}");
    }
    assert_no_backups(&repo, "backup of another cluster");
    // A's stanza still works for A.
    a.pgjet_cmd("check", &repo, &[]).ok();
}

/// The HINT line of a command that fails.
fn r_hint(args: &[String]) -> String {
    let r = pgjet(args);
    assert!(!r.success(), "expected a failure:\n{r}");
    r.stderr
        .lines()
        .find(|l| l.contains("HINT:"))
        .unwrap_or_else(|| panic!("no HINT line:\n{r}"))
        .to_string()
}

/// d. restore into a non-empty dir -> "not empty", file untouched; restore into the running
/// cluster's own data directory -> error, the cluster keeps running.
#[test]
fn d_restore_targets() {
    let fx = fx();
    let c = &fx.cluster;
    let target = c.new_dir("restore-d-nonempty");
    let ts = c.new_dir("restore-d-ts");
    fs::write(target.join("keep.txt"), b"precious").unwrap();
    chown_pg_recursive(&target);
    pgjet(&restore_args(
        &c.repo,
        &target,
        &fx.label,
        &format!("ts1={}", ts.display()),
    ))
    .fails_with("not empty");
    // The hint is this error's own: a copy of the same cluster is brought up to date with
    // --delta (not "pgjet refuses to risk data").
    assert!(
        r_hint(&restore_args(
            &c.repo,
            &target,
            &fx.label,
            &format!("ts1={}", ts.display())
        ))
        .contains("add --delta"),
        "the hint of a non-empty target must name --delta"
    );
    assert_eq!(
        fs::read(target.join("keep.txt")).unwrap(),
        b"precious",
        "existing file changed"
    );
    // Output to a reader that went away (`pgjet info | head`): a quiet exit with a
    // shell's SIGPIPE status, not println!'s panic.
    let mut fds = [0i32; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    unsafe { libc::close(fds[0]) };
    let closed = unsafe { <Stdio as std::os::unix::io::FromRawFd>::from_raw_fd(fds[1]) };
    let out = Command::new(pgjet_bin())
        .args(["info", "--output", "json", "--repo-path"])
        .arg(&c.repo)
        .stdout(closed)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // A mistyped stanza: the hint lists the stanzas the repository holds.
    let r = pgjet(&args![
        "info",
        "--stanza",
        "mian",
        "--repo-path",
        c.repo.display()
    ])
    .fails_with("stanza 'mian' does not exist");
    assert!(
        r.stderr
            .contains(&format!("holds the stanza(s) {}", c.stanza)),
        "the hint must list the stanzas that exist:\n{r}"
    );
    let names: Vec<String> = fs::read_dir(&target)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        vec!["keep.txt".to_string()],
        "restore into a non-empty dir added files"
    );
    assert!(
        !ts.join("PG_VERSION").exists() && fs::read_dir(&ts).unwrap().next().is_none(),
        "failed restore wrote into the tablespace dir"
    );

    // The running cluster's own data directory (it holds postmaster.pid).
    let rows_before = c.psql("postgres", "SELECT count(*) FROM pgbench_accounts");
    let version_before = fs::read(c.data().join("PG_VERSION")).unwrap();
    let control_exists = c.data().join("global/pg_control").exists();
    let ts2 = c.new_dir("restore-d-ts2");
    let r = pgjet(&restore_args(
        &c.repo,
        c.data(),
        &fx.label,
        &format!("ts1={}", ts2.display()),
    ));
    assert!(
        !r.success(),
        "restore into a running cluster's data directory must fail:\n{r}"
    );
    let text = r.text_lower();
    assert!(
        text.contains("postmaster.pid") || text.contains("not empty"),
        "restore into a running cluster: expected \"postmaster.pid\" (or \"not empty\") in the message:\n{r}"
    );
    if !text.contains("postmaster.pid") {
        step!("note: restore into a running data dir reported \"not empty\" rather than \"postmaster.pid\"");
    }
    assert!(
        c.server.answers(),
        "the cluster stopped answering after the failed restore into its data dir"
    );
    assert_eq!(
        c.psql("postgres", "SELECT count(*) FROM pgbench_accounts"),
        rows_before,
        "rows changed"
    );
    assert_eq!(
        fs::read(c.data().join("PG_VERSION")).unwrap(),
        version_before
    );
    assert_eq!(c.data().join("global/pg_control").exists(), control_exists);
    assert!(
        c.data().join("postmaster.pid").exists(),
        "postmaster.pid of the running cluster disappeared"
    );
    c.psql("postgres", "CHECKPOINT");
}

/// e. a flipped byte inside a stored piece: verify and restore fail and name the file; the
/// failed restore does not leave global/pg_control behind.
#[test]
fn e_flipped_byte() {
    let fx = fx();
    let c = &fx.cluster;
    let repo = copy_repo(c, "repo-e");
    let bdir = backup_dir(&repo, "main", &fx.label);
    let manifest = read_manifest(&bdir);
    let files = manifest["files"]
        .as_array()
        .unwrap_or_else(|| panic!("the manifest has no files array"));
    // The biggest file with pieces, preferring relation files (base/ or pg_tblspc/).
    let pick = files
        .iter()
        .filter(|f| f["pieces"].as_array().is_some_and(|p| !p.is_empty()))
        .max_by_key(|f| {
            let p = f["path"].as_str().unwrap_or("");
            let rel = p.starts_with("base/") || p.starts_with("pg_tblspc/");
            (rel, f["size"].as_u64().unwrap_or(0))
        })
        .unwrap_or_else(|| panic!("no file with pieces in the manifest"));
    let path = pick["path"].as_str().unwrap().to_string();
    let pieces = pick["pieces"].as_array().unwrap();
    let piece = &pieces[pieces.len() / 2];
    let object = piece["object"]
        .as_str()
        .unwrap_or_else(|| panic!("piece without object: {piece}"));
    let offset = piece["offset"]
        .as_u64()
        .unwrap_or_else(|| panic!("piece without offset: {piece}"));
    let stored = piece["stored_size"]
        .as_u64()
        .unwrap_or_else(|| panic!("piece without stored_size: {piece}"));
    assert!(stored > 0, "piece with stored_size 0: {piece}");
    let obj_path = bdir.join("data").join(object);
    let mut bytes =
        fs::read(&obj_path).unwrap_or_else(|e| panic!("read {}: {e}", obj_path.display()));
    let at = (offset + stored / 2) as usize;
    assert!(
        at < bytes.len(),
        "piece {piece} lies outside {} ({} bytes)",
        obj_path.display(),
        bytes.len()
    );
    bytes[at] ^= 0x5a;
    fs::write(&obj_path, &bytes).unwrap();
    step!(
        "flipped byte {at} of {} (piece of {path}, {} pieces)",
        obj_path.display(),
        pieces.len()
    );

    let r = pgjet(&verify_args(&repo, &fx.label));
    assert!(
        !r.success(),
        "verify must fail after a flipped byte in a piece of {path}:\n{r}"
    );
    assert!(
        r.text_lower().contains(&path.to_lowercase()),
        "verify failed but does not name {path}:\n{r}"
    );
    let r = pgjet(&args![
        "verify",
        "--stanza",
        "main",
        "--repo-path",
        repo.display()
    ]);
    assert!(
        !r.success(),
        "verify (all backups) must fail after a flipped byte in a piece of {path}:\n{r}"
    );

    let target = c.new_dir("restore-e");
    let ts = c.new_dir("restore-e-ts");
    let r = pgjet(&restore_args(
        &repo,
        &target,
        &fx.label,
        &format!("ts1={}", ts.display()),
    ));
    assert!(
        !r.success(),
        "restore must fail after a flipped byte in a piece of {path}:\n{r}"
    );
    assert!(
        r.text_lower().contains(&path.to_lowercase()),
        "restore failed but does not name {path}:\n{r}"
    );
    assert!(
        !target.join("global/pg_control").exists(),
        "a failed restore left {}/global/pg_control: it looks like a usable cluster",
        target.display()
    );
    // The original repository is intact.
    pgjet_ok(&args![
        "verify",
        "--stanza",
        "main",
        "--repo-path",
        c.repo.display(),
        "--set",
        fx.label
    ]);
}

/// Unmounts a tmpfs when dropped (also on panic).
struct Mount {
    dir: PathBuf,
}

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Mount {
        fs::create_dir_all(dir).unwrap();
        let r = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0777"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            r.status.success(),
            "mount tmpfs on {}: {}",
            dir.display(),
            String::from_utf8_lossy(&r.stderr)
        );
        Mount {
            dir: dir.to_path_buf(),
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// f. restore onto a 16 MiB tmpfs -> "no space left", no global/pg_control left behind.
#[test]
fn f_disk_full_on_restore() {
    let fx = fx();
    let c = &fx.cluster;
    let size: u64 = info_backups(&c.repo, "main")[0]["size"].as_u64().unwrap();
    assert!(
        size > 16 << 20,
        "the fixture backup ({size} bytes) must be bigger than the 16 MiB tmpfs"
    );
    let mnt_dir = c.root.join("tmpfs-f");
    let _mount = Mount::tmpfs(&mnt_dir, "16m");
    let target = mnt_dir.join("restore");
    let ts = mnt_dir.join("ts1");
    mkdir_pg(&target, 0o700);
    mkdir_pg(&ts, 0o700);
    let r = pgjet(&restore_args(
        &c.repo,
        &target,
        &fx.label,
        &format!("ts1={}", ts.display()),
    ));
    let r = r.fails_with("no space left");
    assert!(
        !target.join("global/pg_control").exists(),
        "a restore that ran out of space left global/pg_control: it looks like a usable cluster\n{r}"
    );
}

/// g. kill -9 during a backup: the partial backup is not listed, the server is left clean (no
/// slots, no backup in progress, no leftover sessions), and the next backup works, removes the
/// interrupted backup's directory and is the only backup listed.
#[test]
fn g_kill9_during_backup() {
    let pg = Pg::v15();
    let c = Cluster::new(&pg, "faults-g");
    let t = Instant::now();
    load_random(&c.server, "postgres", "big_rand", 200 << 20);
    c.psql("postgres", "CHECKPOINT");
    step!("g: 200 MiB of random rows loaded in {}", secs(t));
    let repo = c.repo.clone();
    c.pgjet_cmd("stanza-create", &repo, &[]).ok();

    let pidfile = c.root.join("pgjet.pid");
    let mut a = vec!["backup".to_string()];
    a.extend(c.stanza_args(&repo));
    a.extend(args!["--type", "full"]);
    a.extend(SLOW_BACKUP.iter().map(|s| s.to_string()));
    let mut backup = Background::spawn(&pgjet_bin(), &a, &pidfile);
    let backup_root = repo.join("main").join("backup");
    let started = Instant::now();
    let label_dir = loop {
        if backup.try_wait().is_some() {
            panic!(
                "g: the backup ended before it could be killed; make it slower\n{}",
                backup.wait()
            );
        }
        let found = fs::read_dir(&backup_root).ok().and_then(|rd| {
            rd.flatten().map(|e| e.path()).find(|p| {
                fs::read_dir(p.join("data"))
                    .map(|d| {
                        d.flatten()
                            .any(|f| f.metadata().map(|m| m.len() > 0).unwrap_or(false))
                    })
                    .unwrap_or(false)
            })
        });
        if let Some(d) = found {
            break d;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "g: no data appeared under {} within 120 s",
            backup_root.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let pid = backup.pid();
    backup.signal(libc::SIGKILL);
    let r = backup.wait();
    assert!(!r.success(), "g: killed backup reported success?\n{r}");
    step!(
        "g: killed pgjet backup (pid {pid}) after {} while writing {}",
        secs(started),
        label_dir.display()
    );
    assert!(
        !label_dir.join("summary.json").exists(),
        "g: the backup finished (summary.json exists) before the kill; make it slower"
    );
    let killed_label = label_dir
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(
        backup_dirs(&repo),
        vec![killed_label.clone()],
        "g: the interrupted backup's directory must be the only one under {}",
        backup_root.display()
    );

    // The partial backup is not listed.
    let listed = info_backups(&repo, "main");
    assert!(
        listed.is_empty(),
        "g: info lists the killed backup: {listed:?}"
    );

    // The server is left clean.
    let clean = wait_for(Duration::from_secs(30), || {
        let slots = c.psql("postgres", "SELECT count(*) FROM pg_replication_slots");
        let sessions = c.psql(
            "postgres",
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type IN ('client backend', 'walsender') AND pid <> pg_backend_pid()",
        );
        let progress = c.psql(
            "postgres",
            "SELECT count(*) FROM pg_stat_progress_basebackup",
        );
        (slots == "0" && sessions == "0" && progress == "0").then_some(())
    });
    assert!(
        clean.is_some(),
        "g: 30 s after the kill the server still has slots / pgjet sessions / a base backup in progress:\nslots: {}\nsessions: {}\nprogress: {}",
        c.psql("postgres", "SELECT slot_name, slot_type, active, temporary FROM pg_replication_slots"),
        c.psql("postgres", "SELECT pid, backend_type, application_name, state, query FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND backend_type IN ('client backend', 'walsender')"),
        c.psql("postgres", "SELECT * FROM pg_stat_progress_basebackup"),
    );
    c.psql("postgres", "SELECT pg_backup_start('pgjet-test-probe', true) IS NOT NULL;\nSELECT lsn IS NOT NULL FROM pg_backup_stop(false);");

    // A fresh backup works, removes the interrupted backup's directory, and only it is listed.
    // Labels have a resolution of one second: wait until the fresh backup's label cannot be the
    // killed one's, so that the directory seen afterwards is not the killed one reused.
    let killed_at = chrono::NaiveDateTime::parse_from_str(&killed_label, "%Y%m%d-%H%M%SF")
        .unwrap_or_else(|e| panic!("g: label {killed_label:?} is not YYYYMMDD-HHMMSSF: {e}"))
        .and_utc();
    let next_second = wait_for(Duration::from_secs(5), || {
        (chrono::Utc::now() - killed_at >= chrono::TimeDelta::seconds(1)).then_some(())
    });
    assert!(
        next_second.is_some(),
        "g: the clock is behind label {killed_label}"
    );
    c.full_backup(&repo);
    assert!(
        !label_dir.exists(),
        "g: the next backup did not remove the interrupted backup's directory {}",
        label_dir.display()
    );
    let listed = info_backups(&repo, "main");
    assert_eq!(
        listed.len(),
        1,
        "g: exactly one backup expected after the fresh backup: {listed:?}"
    );
    assert_sane_backup(&listed[0], "full");
    let fresh_label = listed[0]["label"].as_str().unwrap().to_string();
    assert_ne!(
        fresh_label, killed_label,
        "g: the fresh backup reused the killed one's label"
    );
    assert_eq!(
        backup_dirs(&repo),
        vec![fresh_label.clone()],
        "g: after the fresh backup only its directory may be left under {}",
        backup_root.display()
    );
    assert_eq!(
        complete_backups(&repo),
        vec![fresh_label],
        "g: the listed backup must be complete (have its summary.json)"
    );
    pgjet_ok(&args![
        "verify",
        "--stanza",
        "main",
        "--repo-path",
        repo.display()
    ]);
}

/// h. a page of the source cluster is really corrupt (a byte flipped on disk while the server
/// was down): the backup still completes, warns with the file and block, and records the
/// block in the manifest's `page_errors`; the other pages pass.
#[test]
fn h_corrupt_page_in_source_is_reported() {
    let mut c = Cluster::new(&Pg::v15(), "pagecheck");
    c.psql(
        "postgres",
        "CREATE TABLE victim AS SELECT g AS id, repeat('x', 200) AS pad FROM generate_series(1, 2000) g",
    );
    let rel = c.psql("postgres", "SELECT pg_relation_filepath('victim')");
    c.psql("postgres", "CHECKPOINT");
    // Flip a byte inside the tuple data of block 1, with the server stopped, then start it.
    c.server.stop();
    let file = c.data().join(&rel);
    let mut bytes = fs::read(&file).unwrap();
    assert!(bytes.len() >= 2 * 8192, "{} is too small", file.display());
    bytes[8192 + 5000] ^= 0x5a;
    fs::write(&file, &bytes).unwrap();
    let (port, sock, log) = (c.port(), c.sock().to_path_buf(), c.server.log.clone());
    let data = c.data().to_path_buf();
    // The stopped server's handle must not run its Drop (it would stop the new one).
    let stopped = std::mem::replace(
        &mut c.server,
        Server::start(&Pg::v15(), &data, port, &sock, &log),
    );
    std::mem::forget(stopped);

    let repo = c.repo.clone();
    c.pgjet_cmd("stanza-create", &repo, &[]).ok();
    let run = c
        .pgjet_cmd("backup", &repo, &["--type", "full", "--start-fast"])
        .ok();
    let text = run.text_lower();
    assert!(
        text.contains("page checksum mismatch") && text.contains(&rel) && text.contains("block 1"),
        "backup must name the corrupt file {rel} and block 1:\n{run}"
    );
    assert!(
        text.contains("1 page checksum error"),
        "summary must count it:\n{run}"
    );
    let label = info_backups(&repo, "main")[0]["label"]
        .as_str()
        .unwrap()
        .to_string();
    let m = read_manifest(&backup_dir(&repo, "main", &label));
    let files = m["files"].as_array().unwrap();
    let entry = files
        .iter()
        .find(|f| f["path"] == rel.as_str())
        .unwrap_or_else(|| panic!("{rel} missing from the manifest"));
    assert_eq!(entry["page_errors"], serde_json::json!([1]), "{entry}");
    let others = files
        .iter()
        .filter(|f| f["path"] != rel.as_str() && f.get("page_errors").is_some())
        .count();
    assert_eq!(others, 0, "only {rel} has a bad page");
}

/// i. replica-create refuses a non-empty target and a tablespace directory that is in use (the
/// primary's own), before it touches the primary: no slot is left behind.
#[test]
fn i_replica_create_refuses_used_targets() {
    let c = &fx().cluster;
    let conninfo = format!(
        "host={} port={} user=postgres dbname=postgres",
        c.sock().display(),
        c.port()
    );
    let fresh_ts = c.new_dir("replica-i-ts");
    let target = c.new_dir("replica-i-nonempty");
    fs::write(target.join("keep.txt"), b"precious").unwrap();
    chown_pg_recursive(&target);
    let port = free_port();
    let run = |pg_path: &Path, ts: &Path| {
        pgjet(&args![
            "replica-create",
            "--source",
            conninfo,
            "--pg-path",
            pg_path.display(),
            "--pg-port",
            port,
            "--tablespace-map",
            format!("ts1={}", ts.display()),
            "--slot",
            "pgjet_refused"
        ])
    };
    run(&target, &fresh_ts).fails_with("not empty");
    assert_eq!(fs::read(target.join("keep.txt")).unwrap(), b"precious");
    // The primary's own tablespace directory is in use.
    let empty_target = c.root.join("replica-i-new");
    run(&empty_target, &c.ts1).fails_with("not empty");
    assert!(
        !empty_target.exists(),
        "a refused replica-create created its target"
    );
    assert_eq!(
        c.psql("postgres", "SELECT count(*) FROM pg_replication_slots"),
        "0",
        "a refused replica-create left a replication slot"
    );
}

/// j. pgjet refuses to run as root for commands that write cluster or repository files.
#[test]
fn j_refuses_root() {
    let c = &fx().cluster;
    let out = Command::new(pgjet_bin())
        .args(c.stanza_args(&c.repo))
        .arg("check")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        !out.status.success() && err.contains("root"),
        "running as root must be refused: {err}"
    );
    // Read-only commands are fine as root.
    let out = Command::new(pgjet_bin())
        .args(["info", "--repo-path"])
        .arg(&c.repo)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "info as root: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// k. a tampered manifest is refused by restore and verify before anything is written: one
/// whose stored bytes changed (caught by the summary's checksum), and one rewritten with valid
/// checksums but a path that climbs out of the target.
#[test]
fn k_tampered_manifest_is_refused() {
    let fx = fx();
    let c = &fx.cluster;
    let repo = copy_repo(c, "repo-k");
    let bdir = backup_dir(&repo, "main", &fx.label);
    let original = read_manifest(&bdir);
    let mpath = bdir.join("manifest.jsonl.zst");
    let mut stored = fs::read(&mpath).unwrap();
    let i = stored.len() / 2;
    stored[i] ^= 0x10;
    fs::write(&mpath, &stored).unwrap();
    let v = pgjet(&verify_args(&repo, &fx.label));
    assert!(
        v.status.code() == Some(5) && v.stderr.contains("manifest.jsonl.zst"),
        "verify of a manifest whose bytes changed must name it:\n{v}"
    );
    let mut m = original;
    m["files"][0]["path"] = serde_json::json!("../../escaped");
    write_manifest(&bdir, &m);
    let target = c.root.join("restore-k");
    let ts = c.root.join("restore-k-ts");
    let r = pgjet(&restore_args(
        &repo,
        &target,
        &fx.label,
        &format!("ts1={}", ts.display()),
    ));
    let text = r.text_lower();
    assert!(
        !r.success() && text.contains("manifest.jsonl.zst") && text.contains("safe relative path"),
        "restore of a tampered manifest must be refused:\n{r}"
    );
    assert!(
        !target.exists() && !ts.exists(),
        "a refused restore created its target"
    );
    assert!(!c.root.path.join("escaped").exists());
    let v = pgjet(&verify_args(&repo, &fx.label));
    assert!(
        !v.success() && v.text_lower().contains("manifest.jsonl.zst"),
        "verify of a tampered manifest must fail:\n{v}"
    );
}

/// `restore --delta` repairs a restored copy that was changed, truncated, added to and
/// deleted from: only what differs is written back, files the backup lacks are removed,
/// pg_verifybackup accepts the result and the cluster starts; a running server's directory
/// and another cluster's are refused.
#[test]
fn l_restore_delta_repairs_a_copy() {
    let fx = fx();
    let c = &fx.cluster;
    let target = c.new_dir("restore-l");
    let ts = c.new_dir("restore-l-ts");
    let ts_map = format!("ts1={}", ts.display());
    pgjet(&restore_args(&c.repo, &target, &fx.label, &ts_map)).ok();
    // Damage: a flipped byte in the largest relation file, a truncated file, a deleted
    // file, a file and a directory the backup does not have, a stale postmaster.opts.
    let mut rels: Vec<(u64, PathBuf)> = Vec::new();
    for db in fs::read_dir(target.join("base")).unwrap().flatten() {
        for f in fs::read_dir(db.path()).unwrap().flatten() {
            let len = f.metadata().unwrap().len();
            if f.file_name()
                .to_string_lossy()
                .chars()
                .all(|ch| ch.is_ascii_digit())
            {
                rels.push((len, f.path()));
            }
        }
    }
    rels.sort();
    let (len, big) = rels.last().cloned().unwrap();
    let mut bytes = fs::read(&big).unwrap();
    bytes[(len / 2) as usize] ^= 0x5a;
    fs::write(&big, &bytes).unwrap();
    let (_, mid) = rels[rels.len() / 2].clone();
    let truncated_len = fs::metadata(&mid).unwrap().len() / 2;
    fs::OpenOptions::new()
        .write(true)
        .open(&mid)
        .unwrap()
        .set_len(truncated_len)
        .unwrap();
    let (_, gone) = rels[rels.len() / 3].clone();
    fs::remove_file(&gone).unwrap();
    fs::write(target.join("base/1/999999999"), b"not in the backup").unwrap();
    fs::create_dir_all(target.join("extra_dir/sub")).unwrap();
    fs::write(target.join("postmaster.opts"), b"stale").unwrap();
    chown_pg_recursive(&target);

    // A server pid file: refused, nothing touched.
    fs::write(target.join("postmaster.pid"), b"1\n").unwrap();
    let mut a = restore_args(&c.repo, &target, &fx.label, &ts_map);
    a.push("--delta".into());
    pgjet(&a).fails_with("postmaster.pid");
    assert!(
        target.join("global/pg_control").exists(),
        "a refused delta changed the target"
    );
    fs::remove_file(target.join("postmaster.pid")).unwrap();

    let r = pgjet(
        &args!["--log-level", "info"]
            .into_iter()
            .chain(a.clone())
            .collect::<Vec<_>>(),
    )
    .ok();
    let line = r
        .stderr
        .lines()
        .find(|l| l.contains("pieces already in place"))
        .unwrap_or_else(|| panic!("no delta summary:\n{r}"));
    step!("restore --delta: {line}");
    let nums: Vec<usize> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        nums.len() >= 2 && nums[0] > 0 && nums[0] < nums[1],
        "{line}"
    );
    for extra in [
        "base/1/999999999",
        "extra_dir",
        "postmaster.opts",
        "pgjet.incomplete",
    ] {
        assert!(!target.join(extra).exists(), "{extra} survived the delta");
    }
    assert!(gone.exists() && fs::metadata(&mid).unwrap().len() > truncated_len);
    let server = start_restored(c, "restore --delta", &target);
    assert!(server.answers());
    drop(server);

    // Another cluster's directory is refused.
    let other = c.new_dir("restore-l-other");
    fs::create_dir_all(other.join("global")).unwrap();
    let mut control = vec![0u8; 8192];
    control[..8].copy_from_slice(&1u64.to_le_bytes());
    // pg_control is believed only when its CRC matches: a damaged one proves nothing.
    fs::write(other.join("global/pg_control"), &control).unwrap();
    chown_pg_recursive(&other);
    let mut a = restore_args(&c.repo, &other, &fx.label, &ts_map);
    a.push("--delta".into());
    pgjet(&a).fails_with("CRC does not match");
    // ControlFileData's CRC field (after 296 bytes in PostgreSQL 15 to 18).
    let crc = crc32c::crc32c(&control[..296]);
    control[296..300].copy_from_slice(&crc.to_le_bytes());
    fs::write(other.join("global/pg_control"), &control).unwrap();
    pgjet(&a).fails_with("another cluster");
}

/// Bad --source / --transport settings end with a clear configuration error (exit 2) and
/// leave no target directory behind.
#[test]
fn m_source_and_transport_settings() {
    let c = &fx().cluster;
    let target = c.root.join("m-never");
    let local_source = format!(
        "host={} port={} user=postgres",
        c.sock().display(),
        c.port()
    );
    let r =
        pgjet(&args!["--pg-path", target.display(), "replica-create"]).fails_with("needs --source");
    assert_eq!(r.status.code(), Some(2), "{r}");
    let r = pgjet(&args![
        "--source",
        local_source,
        "--transport",
        "bogus",
        "--pg-path",
        target.display(),
        "replica-create"
    ])
    .fails_with("transport 'bogus'");
    assert_eq!(r.status.code(), Some(2), "{r}");
    let r = pgjet(&args![
        "--source",
        "host=/tmp port='unterminated",
        "--pg-path",
        target.display(),
        "replica-create"
    ])
    .fails_with("unterminated");
    assert_eq!(r.status.code(), Some(2), "{r}");
    assert!(
        !target.exists(),
        "a refused replica-create left {}",
        target.display()
    );
}

// ------------------------------------------------------------------------------------------
// A lock lost during a backup (tests n and o).

/// A PostgreSQL 15 cluster with the stanza "main" that archives WAL through a gate: its
/// archive_command runs `pgjet archive-push` only while the gate file exists (until then it
/// waits, up to 10 minutes). With the gate closed, a backup stops at its end, waiting for its
/// last WAL segment to reach the archive (archive-check), before it checks its lock and writes
/// its summary: the tests act on the lock there, without depending on how long the copy takes.
/// The gate is opened when dropped, so the archiver never waits at shutdown.
struct GatedCluster {
    c: Cluster,
    gate: PathBuf,
}

impl GatedCluster {
    fn new(tag: &str) -> GatedCluster {
        let c = Cluster::new(&Pg::v15(), tag);
        let repo = c.repo.clone();
        c.pgjet_cmd("stanza-create", &repo, &[]).ok();
        let gate = c.root.join("archive-gate");
        fs::write(&gate, "").unwrap();
        let script = c.root.join("archive.sh");
        fs::write(
            &script,
            format!(
                "#!/bin/sh\n# pgjet test: archives only while {gate} exists\nn=0\n\
                 while [ ! -e {gate} ]; do\n  n=$((n+1)); [ $n -gt 6000 ] && exit 1\n  sleep 0.1\ndone\n\
                 exec {bin} --stanza=main --repo-path={repo} archive-push \"$1\"\n",
                gate = gate.display(),
                bin = pgjet_bin().display(),
                repo = repo.display()
            ),
        )
        .unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        c.psql(
            "postgres",
            &format!(
                "ALTER SYSTEM SET archive_mode = 'on';\nALTER SYSTEM SET archive_command = '{} %p';",
                script.display()
            ),
        );
        // archive_mode needs a restart.
        let s = &c.server;
        let opts = format!("-p {} -k {}", s.port, s.sock.display());
        let (data, log) = (s.data.display().to_string(), s.log.display().to_string());
        let restart = [
            "restart", "-w", "-t", "60", "-m", "fast", "-D", &data, "-l", &log, "-o", &opts,
        ];
        run_as_postgres(&s.pg.tool("pg_ctl"), &restart, None).ok();
        GatedCluster { c, gate }
    }

    fn close(&self) {
        fs::remove_file(&self.gate).unwrap();
    }

    fn open(&self) {
        fs::write(&self.gate, "").unwrap();
    }

    /// The stanza's current lock record (of the highest epoch) with its epoch, when there
    /// is a readable one.
    fn current_lock(&self) -> Option<(u64, pgjet_core::repo::lock::LockRecord)> {
        let store = pgjet_core::storage::posix::PosixStorage::open(&self.c.repo).ok()?;
        match pgjet_core::repo::lock::current(&store, "main").ok()?? {
            (epoch, Some(rec)) => Some((epoch, rec)),
            _ => None,
        }
    }

    /// The stanza's current lock record, when there is a readable one.
    fn lock(&self) -> Option<pgjet_core::repo::lock::LockRecord> {
        self.current_lock().map(|(_, r)| r)
    }

    /// Starts `pgjet backup` in the background, its stderr (the log) into `log`; returns it
    /// once it holds the stanza's lock, with the lock's record.
    fn spawn_backup(&self, log: &Path) -> (Background, pgjet_core::repo::lock::LockRecord) {
        let c = &self.c;
        let mut a = args![
            "-c",
            format!("exec \"$0\" \"$@\" 2>{}", log.display()),
            pgjet_bin().display(),
            "backup"
        ];
        a.extend(c.stanza_args(&c.repo));
        a.extend(args![
            "--start-fast",
            "--jobs",
            "2",
            "--archive-timeout",
            "600"
        ]);
        let pidfile = c.root.join(&format!(
            "{}.pid",
            log.file_name().unwrap().to_string_lossy()
        ));
        let backup = Background::spawn(Path::new("/bin/sh"), &a, &pidfile);
        let pid = backup.pid() as u32;
        let rec = wait_for(Duration::from_secs(60), || {
            self.lock().filter(|r| r.pid == pid)
        })
        .unwrap_or_else(|| {
            panic!(
                "the backup (pid {pid}) did not take the lock within 60 s:\n{}",
                fs::read_to_string(log).unwrap_or_default()
            )
        });
        (backup, rec)
    }
}

impl Drop for GatedCluster {
    fn drop(&mut self) {
        let _ = fs::write(&self.gate, "");
    }
}

/// Waits (up to `timeout`) until `log` holds `text` while `backup` still runs, calling `each`
/// between looks; panics with the log when the backup ends first or the text never comes.
fn wait_log(
    backup: &mut Background,
    log: &Path,
    text: &str,
    timeout: Duration,
    mut each: impl FnMut(),
) {
    let t = Instant::now();
    loop {
        let seen = fs::read_to_string(log).unwrap_or_default();
        if seen.contains(text) {
            return;
        }
        if let Some(st) = backup.try_wait() {
            panic!("the backup ended ({st}) before its log said {text:?}:\n{seen}");
        }
        assert!(
            t.elapsed() < timeout,
            "the backup's log did not say {text:?} within {timeout:?}:\n{seen}"
        );
        each();
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits for `backup` to end: it must fail with exit code 6 and a log naming the lost lock.
fn assert_lost_lock(what: &str, backup: Background, log: &Path) {
    let r = backup.wait();
    let text = fs::read_to_string(log).unwrap_or_default();
    assert!(
        !r.success(),
        "{what}: the backup completed without its lock:\n{r}\n--- log ---\n{text}"
    );
    assert_eq!(r.status.code(), Some(6), "{what}: {r}\n--- log ---\n{text}");
    assert!(
        text.contains("lost the lock main/lock/backup-") && text.contains("not complete"),
        "{what}: the error does not name the lost lock:\n{text}"
    );
    step!(
        "{what}: {}",
        text.lines()
            .find(|l| l.contains("lost the lock"))
            .unwrap_or("")
    );
}

/// After a backup that lost its lock: nothing looks complete, and the next backup succeeds,
/// removes the interrupted backup's directory, and verifies.
fn assert_next_backup_succeeds(what: &str, c: &Cluster) {
    assert_no_backups(&c.repo, what);
    let interrupted = backup_dirs(&c.repo);
    assert_eq!(
        interrupted.len(),
        1,
        "{what}: the interrupted backup's directory: {interrupted:?}"
    );
    c.full_backup(&c.repo);
    let listed = info_backups(&c.repo, "main");
    assert_eq!(listed.len(), 1, "{what}: {listed:?}");
    let label = listed[0]["label"].as_str().unwrap().to_string();
    assert_ne!(label, interrupted[0], "{what}");
    assert_eq!(backup_dirs(&c.repo), vec![label.clone()], "{what}");
    pgjet_ok(&verify_args(&c.repo, &label));
}

/// n. Another pgjet (on another host) takes the stanza's lock over while a backup runs: the
/// backup's lease renewal finds the other record, and the backup then fails naming the lost
/// lock instead of writing its summary; the other holder's record is left alone; once that
/// one is released, the next backup succeeds. (About 20 s: the renewal runs every 15 s.)
#[test]
fn n_lock_taken_over_during_backup() {
    let g = GatedCluster::new("faults-n");
    let c = &g.c;
    g.close();
    let log = c.root.join("n-backup.log");
    let (mut backup, ours) = g.spawn_backup(&log);
    let now = chrono::Utc::now();
    let theirs = pgjet_core::repo::lock::LockRecord {
        host: "elsewhere".into(),
        pid: 4242,
        command: "backup".into(),
        token: "taken-over-by-the-test".into(),
        acquired: pgjet_core::repo::rfc3339(now),
        lease_until: now.timestamp() + 3600,
        released: false,
    };
    assert_ne!(ours.token, theirs.token);
    let store = pgjet_core::storage::posix::PosixStorage::open(&c.repo).unwrap();
    // Taken as another pgjet takes a lock it judged stale: it creates the next epoch's
    // record; owned by the cluster's OS user (the repository's files are 0640, so one left
    // to root could not be read by the backup).
    let (epoch, _) = g.current_lock().unwrap();
    let theirs_name = pgjet_core::repo::lock::record_name("main", epoch + 1);
    let theirs_json = serde_json::to_vec(&theirs).unwrap();
    {
        use pgjet_core::storage::Storage;
        assert!(store.create_new(&theirs_name, &theirs_json).unwrap());
    }
    chown_pg_recursive(&c.repo.join(&theirs_name));
    // Never written over, and the backup's own record is not renewed again.
    let ours_path = c
        .repo
        .join(pgjet_core::repo::lock::record_name("main", epoch));
    wait_log(
        &mut backup,
        &log,
        "was taken by another process",
        Duration::from_secs(60),
        || {
            assert_eq!(
                g.lock().map(|r| r.token),
                Some(theirs.token.clone()),
                "n: the other holder's record is no longer the lock"
            );
        },
    );
    let ours_after = fs::read(&ours_path).unwrap();
    g.open();
    assert_lost_lock("n", backup, &log);
    assert_eq!(
        fs::read(c.repo.join(&theirs_name)).unwrap(),
        theirs_json,
        "n: the other holder's lock must be left alone"
    );
    assert_eq!(
        fs::read(&ours_path).unwrap(),
        ours_after,
        "n: the lost holder wrote its record again (renewed or released it)"
    );
    // The other holder ends and releases its lock.
    let released = pgjet_core::repo::lock::LockRecord {
        released: true,
        ..theirs
    };
    fs::write(
        c.repo.join(&theirs_name),
        serde_json::to_vec(&released).unwrap(),
    )
    .unwrap();
    assert_next_backup_succeeds("n", c);
}

/// o. The lock cannot be renewed during a backup (its directory in the repository turned
/// read-only): once the lease runs out the lock is lost, and even with the repository
/// writable again the backup fails naming the lost lock instead of writing its summary; it
/// marks its lock record released; the next backup succeeds. About 80 s: the lease (60 s) must
/// run out, and nothing shorter is honest without a test-only way to shorten it.
#[test]
fn o_lock_not_renewable_during_backup() {
    let g = GatedCluster::new("faults-o");
    let c = &g.c;
    g.close();
    let log = c.root.join("o-backup.log");
    let (mut backup, _) = g.spawn_backup(&log);
    let lock_dir = c.repo.join("main/lock");
    let mode = fs::metadata(&lock_dir).unwrap().permissions().mode();
    // pgjet runs as postgres: with the directory read-only it can read the record but not
    // write the renewed one (a new file renamed over it).
    fs::set_permissions(&lock_dir, fs::Permissions::from_mode(0o555)).unwrap();
    let t = Instant::now();
    wait_log(
        &mut backup,
        &log,
        "before its lease ran out",
        Duration::from_secs(180),
        || {},
    );
    step!(
        "o: the lock was lost {} after its directory turned read-only",
        secs(t)
    );
    fs::set_permissions(&lock_dir, fs::Permissions::from_mode(mode)).unwrap();
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("could not renew the lock"), "{text}");
    g.open();
    assert_lost_lock("o", backup, &log);
    assert!(
        g.lock().is_some_and(|r| r.released),
        "o: the backup did not let its lock go"
    );
    assert_next_backup_succeeds("o", c);
}

/// p. A pgBackRest config carried over as a new user would: pgBackRest's spellings of the
/// options pgjet has are read, but pgBackRest's `repo1-cipher-type=aes-256-cbc` stops
/// stanza-create and backup before anything is written (CBC does not authenticate; pgjet
/// encrypts with aes-256-gcm), and an unknown key is a warning naming it and the file;
/// `resume` and `manifest-save-threshold` are read.
#[test]
fn p_a_pgbackrest_config_carried_over() {
    let c = &fx().cluster;
    let repo = c.new_dir("repo-n");
    let conf_dir = c.new_dir("conf-n");
    let passphrase = "n-test-passphrase-b7c1";
    let cluster_lines = format!(
        "[main]\npg1-path={}\npg1-port={}\npg1-socket-path={}\n",
        c.data().display(),
        c.port(),
        c.sock().display()
    );
    let write_conf = |name: &str, global: &str| -> PathBuf {
        let f = conf_dir.join(name);
        fs::write(
            &f,
            format!(
                "[global]\nrepo1-path={}\nprocess-max=2\nbogus-option=1\n{global}\n{cluster_lines}",
                repo.display()
            ),
        )
        .unwrap();
        chown_pg_recursive(&f);
        f
    };
    let ciphered = write_conf(
        "ciphered.conf",
        &format!("repo1-cipher-type=aes-256-cbc\nrepo1-cipher-pass={passphrase}"),
    );
    for command in [
        &["stanza-create"][..],
        &["backup", "--type", "full", "--start-fast"],
    ] {
        let mut a = args!["--config", ciphered.display(), "--stanza", "main"];
        a.extend(command.iter().map(|s| s.to_string()));
        let r = pgjet(&a).fails_with("CBC does not authenticate");
        assert_eq!(r.status.code(), Some(2), "{r}");
        assert!(
            r.stderr.contains("repo1-cipher-type=aes-256-cbc") && r.stderr.contains("aes-256-gcm"),
            "{command:?} does not name the cipher and the one to use:\n{r}"
        );
        assert!(
            !r.stderr.contains(passphrase) && !r.stdout.contains(passphrase),
            "{command:?} printed the passphrase:\n{r}"
        );
        assert!(
            r.stderr.contains("unknown option bogus-option")
                && r.stderr.contains(&ciphered.display().to_string()),
            "{command:?}: no warning naming bogus-option and the file:\n{r}"
        );
        let written: Vec<_> = fs::read_dir(&repo).unwrap().flatten().collect();
        assert!(
            written.is_empty(),
            "{command:?} refused, yet wrote into the repository: {written:?}"
        );
    }

    // Without the cipher options the same file works, and still names the unknown key; the
    // resume options pgBackRest users set (resume, manifest-save-threshold in bytes) are
    // read, not warned about; so are the logging lines of pgBackRest's user guide
    // (log-level-console is pgjet's log-level; the log file's level is ignored, with a
    // warning); and retention as pgBackRest spells it, per repository
    // (repo1-retention-full), applied after every backup.
    let plain = write_conf(
        "plain.conf",
        "resume=n\nmanifest-save-threshold=1073741824\nlog-level-console=info\nlog-level-file=detail\n\
         repo1-retention-full=1\nrepo1-retention-full-type=count",
    );
    let base = args!["--config", plain.display(), "--stanza", "main"];
    let r = pgjet_ok(&cmd("stanza-create", base.clone(), &[]));
    assert!(
        r.stderr.contains(&format!(
            "config file {}, section [global]: unknown option bogus-option",
            plain.display()
        )),
        "no warning naming bogus-option, the file and its section:\n{r}"
    );
    for key in [
        "resume",
        "manifest-save-threshold",
        "log-level-console",
        "repo1-retention-full",
    ] {
        assert!(
            !r.stderr.contains(&format!("unknown option {key}"))
                && !r.stderr.contains(&format!("{key} is ignored")),
            "{key} is pgBackRest's and pgjet's, yet warned about:\n{r}"
        );
    }
    assert!(
        r.stderr
            .contains("log-level-file is ignored: pgjet logs to stderr only"),
        "no warning for log-level-file:\n{r}"
    );
    pgjet_ok(&cmd(
        "backup",
        base.clone(),
        &["--type", "full", "--start-fast"],
    ));
    assert_eq!(complete_backups(&repo).len(), 1);
    let first = complete_backups(&repo);
    std::thread::sleep(Duration::from_millis(1100));
    pgjet_ok(&cmd("backup", base, &["--type", "full", "--start-fast"]));
    let kept = complete_backups(&repo);
    assert!(
        kept.len() == 1 && kept != first,
        "repo1-retention-full=1: the second backup must expire the first: {first:?} -> {kept:?}"
    );

    // An option of another command is refused on the command line, before anything runs.
    let a = args![
        "--config",
        plain.display(),
        "--stanza",
        "main",
        "archive-get",
        "--retention-archive",
        "2",
        "000000010000000000000001",
        conf_dir.join("RECOVERYXLOG").display()
    ];
    let r = pgjet(&a).fails_with("option retention-archive does not apply to archive-get");
    assert_eq!(r.status.code(), Some(2), "{r}");
}

impl Mount {
    /// `dir` bound onto itself read-only (a repository on a read-only snapshot or mount).
    fn read_only(dir: &Path) -> Mount {
        for a in [
            vec![
                "--bind".to_string(),
                dir.display().to_string(),
                dir.display().to_string(),
            ],
            vec![
                "-o".into(),
                "remount,bind,ro".into(),
                dir.display().to_string(),
            ],
        ] {
            let r = Command::new("mount").args(&a).output().unwrap();
            assert!(
                r.status.success(),
                "mount {a:?}: {}",
                String::from_utf8_lossy(&r.stderr)
            );
        }
        Mount {
            dir: dir.to_path_buf(),
        }
    }

    /// Grows or shrinks this tmpfs to `size`.
    fn resize(&self, size: &str) {
        let r = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(
            r.status.success(),
            "remount: {}",
            String::from_utf8_lossy(&r.stderr)
        );
    }
}

/// Fills the filesystem of `dir` to the last byte with the file `<dir>/filler` (as root,
/// which a tmpfs does not reserve blocks for); returns the file.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let p = dir.join("filler");
    let mut f = fs::File::create(&p).unwrap();
    let block = vec![0x5au8; 64 << 10];
    while f.write_all(&block).is_ok() {}
    let small = [0u8; 512];
    while f.write_all(&small).is_ok() {}
    while f.write_all(&small[..1]).is_ok() {}
    p
}

/// A complete WAL segment of the fixture cluster: the one current before a switch.
fn complete_segment(c: &Cluster) -> PathBuf {
    let name = c.psql("postgres", "SELECT pg_walfile_name(pg_current_wal_lsn())");
    c.psql("postgres", "SELECT pg_switch_wal()");
    c.data().join("pg_wal").join(name)
}

/// q. The repository's disk fills during a backup (a tmpfs of half the backup's stored
/// size): the backup fails naming "no space left", nothing looks complete (info lists no
/// backup); once there is room the next backup completes and verifies.
#[test]
fn q_disk_full_on_the_repository() {
    let c = &fx().cluster;
    let stored: u64 = info_backups(&c.repo, "main")[0]["stored_size"]
        .as_u64()
        .unwrap();
    let mnt = c.root.join("tmpfs-q");
    let m = Mount::tmpfs(&mnt, &format!("{}k", stored / 2 / 1024));
    let repo = mnt.join("repo");
    mkdir_pg(&repo, 0o750);
    c.pgjet_cmd("stanza-create", &repo, &[]).ok();
    let r = c
        .pgjet_cmd("backup", &repo, &["--start-fast", "--jobs", "2"])
        .fails_with("no space left");
    step!(
        "q: {}",
        r.stderr.lines().find(|l| l.contains("ERROR")).unwrap_or("")
    );
    assert_no_backups(&repo, "q");
    m.resize(&format!("{}k", stored * 3 / 1024));
    let r = c
        .pgjet_cmd("backup", &repo, &["--start-fast", "--jobs", "2"])
        .ok();
    let listed = info_backups(&repo, "main");
    assert_eq!(listed.len(), 1, "q: {listed:?}\n{r}");
    pgjet_ok(&verify_args(&repo, listed[0]["label"].as_str().unwrap()));
}

/// r. The spool's disk is full under asynchronous archive-push: the push fails naming "no
/// space left" (PostgreSQL keeps the segment and retries); with room again the same push
/// succeeds and archive-get serves the segment back byte for byte.
#[test]
fn r_disk_full_on_the_spool() {
    let c = &fx().cluster;
    let repo = copy_repo(c, "repo-r");
    let mnt = c.root.join("tmpfs-r");
    let _m = Mount::tmpfs(&mnt, "2m");
    let spool = mnt.join("spool");
    mkdir_pg(&spool, 0o750);
    let filler = fill(&mnt);
    // The segment in a pg_wal of its own, marked ready as PostgreSQL marks it before it runs
    // archive_command (the background pusher takes what archive_status lists).
    let wal = c.new_dir("r-wal").join("pg_wal");
    mkdir_pg(&wal.join("archive_status"), 0o700);
    let from = complete_segment(c);
    let name = from.file_name().unwrap().to_string_lossy().to_string();
    let seg = wal.join(&name);
    fs::copy(&from, &seg).unwrap();
    fs::write(wal.join("archive_status").join(format!("{name}.ready")), "").unwrap();
    chown_pg_recursive(&wal);
    let push = |timeout: &str| {
        let mut a = args!["archive-push"];
        a.extend(c.stanza_args(&repo));
        a.extend(args![
            "--archive-async=y",
            "--spool-path",
            spool.display(),
            "--archive-timeout",
            timeout,
            seg.display()
        ]);
        pgjet(&a)
    };
    let r = push("20").fails_with("no space left");
    step!(
        "r: {}",
        r.stderr.lines().find(|l| l.contains("ERROR")).unwrap_or("")
    );
    fs::remove_file(&filler).unwrap();
    push("60").ok();
    let back = c.new_dir("r-get").join("segment");
    let mut a = args!["archive-get"];
    a.extend(c.stanza_args(&repo));
    a.extend(args![
        seg.file_name().unwrap().to_string_lossy(),
        back.display()
    ]);
    pgjet_ok(&a);
    assert!(
        fs::read(&back).unwrap() == fs::read(&seg).unwrap(),
        "r: archive-get returned other bytes"
    );
}

/// s. A read-only repository (a snapshot mounted read-only): info, verify and restore work
/// (nothing is written into the repository to read it); backup, expire and archive-push
/// each fail naming the read-only file system, and nothing in it changes.
#[test]
fn s_read_only_repository() {
    let fx = fx();
    let c = &fx.cluster;
    let repo = copy_repo(c, "repo-s");
    let before = snapshot_tree(&repo);
    let _m = Mount::read_only(&repo);
    assert_eq!(info_backups(&repo, "main").len(), 1);
    pgjet_ok(&verify_args(&repo, &fx.label));
    let target = c.new_dir("s-restore");
    let ts = c.new_dir("s-ts1");
    pgjet_ok(&restore_args(
        &repo,
        &target,
        &fx.label,
        &format!("ts1={}", ts.display()),
    ));
    assert!(target.join("global/pg_control").exists());
    let r = c
        .pgjet_cmd("backup", &repo, &["--start-fast"])
        .fails_with("read-only file system");
    step!(
        "s: backup: {}",
        r.stderr.lines().find(|l| l.contains("ERROR")).unwrap_or("")
    );
    c.pgjet_cmd("expire", &repo, &["--retention-full", "1"])
        .fails_with("read-only file system");
    let mut a = args!["archive-push"];
    a.extend(c.stanza_args(&repo));
    a.push(complete_segment(c).display().to_string());
    pgjet(&a).fails_with("read-only file system");
    drop(_m);
    assert!(
        snapshot_tree(&repo) == before,
        "s: the read-only repository changed"
    );
}

/// t. A second host whose clock runs 5 minutes ahead (libfaketime) starts a backup while
/// the first one runs: the first's lease looks expired by its clock, but it watches the
/// record for a renewal period, sees it renewed, and refuses naming the clocks instead of
/// taking the lock over; the first backup keeps its lock and completes.
#[test]
fn t_clock_skew_does_not_take_a_live_lock() {
    let g = GatedCluster::new("faults-t");
    let c = &g.c;
    g.close();
    let log = c.root.join("t-backup.log");
    let (backup, ours) = g.spawn_backup(&log);
    let mut a = args!["-f", "+300s", pgjet_bin().display(), "backup"];
    a.extend(c.stanza_args(&c.repo));
    a.extend(args!["--start-fast"]);
    let t = Instant::now();
    let r = run_as_postgres(Path::new("/usr/bin/faketime"), &a, None).fails_with("clocks disagree");
    step!(
        "t: refused after {}: {}",
        secs(t),
        r.stderr.lines().find(|l| l.contains("ERROR")).unwrap_or("")
    );
    assert!(r.stderr.contains("ahead"), "t: {r}");
    assert_eq!(
        g.lock().map(|l| l.token),
        Some(ours.token),
        "t: the lock changed hands"
    );
    g.open();
    let done = backup.wait();
    assert!(
        done.success(),
        "t: the first backup failed:\n{done}\n{}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(info_backups(&c.repo, "main").len(), 1);
}
