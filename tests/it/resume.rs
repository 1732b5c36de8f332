//! Resuming interrupted backups: a backup killed (SIGKILL) after its resume journal saved
//! some files is resumed by the next backup into the same label, keeping what it stored
//! where the cluster did not change since; the result restores to exactly the cluster's
//! rows at its end (pg_verifybackup, the rows, pgbench's invariant, pg_amcheck).
//!
//! PostgreSQL 15, local files, posix repository:
//! - a full killed under pgbench, the cluster changed (rows updated, a table dropped, one
//!   truncated, one created), the resumed attempt killed again, changed again, then resumed
//!   to the end; restored and checked;
//! - an incr on it killed and resumed (its kept pieces name its own frames and the full's);
//! - `--no-resume` removes an interrupted backup and starts over; an interrupted backup of
//!   another type is removed, not resumed;
//! - a byte flipped in a saved object: its files copied again; a journal part that is not
//!   zstd: the backup is not resumed and a new one starts over.
//!
//! PostgreSQL 15 over libpq: a full whose link goes down (every connection cut) resumed once
//! it is up again.
//!
//! The S3 case is in tests/it/object_stores.rs.
use crate::common;

use crate::common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The save threshold of every attempt: a save of the resume journal every 4 MiB.
const SAVES: &[&str] = &["--manifest-save-threshold", "4MiB"];

fn resume_dir(c: &Cluster, label: &str) -> PathBuf {
    backup_dir(&c.repo, "main", label).join("resume")
}

/// Starts `backup --type kind` (slow: [`SLOW_BACKUP`], [`SAVES`], and `extra`) in the background and kills it
/// with SIGKILL once its resume journal holds save `save` of attempt `attempt`; returns the
/// backup's label.
fn kill_after_save(c: &Cluster, kind: &str, extra: &[&str], attempt: u32, save: u32) -> String {
    let mut a = vec!["backup".to_string(), "--type".into(), kind.into()];
    a.extend(c.stanza_args(&c.repo));
    a.extend(
        SLOW_BACKUP
            .iter()
            .chain(SAVES)
            .chain(extra)
            .map(|s| s.to_string()),
    );
    let tag = format!("{kind}-attempt{attempt}");
    let b = Background::spawn(&pgjet_bin(), &a, &c.root.join(&format!("{tag}.pid")));
    let t = Instant::now();
    let (b, label) = wait_for_journal_save(b, &c.repo.join("main").join("backup"), attempt, save);
    b.signal(libc::SIGKILL);
    let r = b.wait();
    assert!(
        !r.success(),
        "{tag}: the killed backup reported success?\n{r}"
    );
    assert!(
        !backup_dir(&c.repo, "main", &label)
            .join("summary.json")
            .exists(),
        "{tag}: {label} completed before the kill; make it slower"
    );
    step!(
        "{tag}: {label} killed after journal save {save} ({})",
        secs(t)
    );
    label
}

/// `backup --type kind` (slow, [`SAVES`]) and `extra` to the end: (label, resumed, bytes kept, run).
fn backup_to_end(c: &Cluster, kind: &str, extra: &[&str]) -> (String, bool, u64, Run) {
    let mut a = vec!["--type", kind, "--output", "json"];
    a.extend_from_slice(SLOW_BACKUP);
    a.extend_from_slice(SAVES);
    a.extend_from_slice(extra);
    let r = c.pgjet_cmd("backup", &c.repo, &a).ok();
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim())
        .unwrap_or_else(|e| panic!("backup --output json is not JSON ({e}):\n{r}"));
    let label = v["label"].as_str().expect("label").to_string();
    let resumed = v["resumed"].as_bool().expect("resumed");
    let reused = v["reused"].as_u64().expect("reused");
    step!(
        "backup --type {kind}: {label} in {:.1}s (resumed {resumed}, {} MiB kept)",
        r.elapsed.as_secs_f64(),
        reused >> 20
    );
    (label, resumed, reused, r)
}

/// Restores `label`, checks it with pg_verifybackup, starts it and compares its rows with
/// `fp` (pgbench's tables left out when `quiet`), pgbench's invariant and pg_amcheck.
fn restore_and_check(c: &Cluster, label: &str, fp: &std::collections::BTreeMap<String, String>) {
    pgjet_ok(&verify_args(&c.repo, label));
    let dir = c.new_dir(&format!("restore-{label}"));
    let r = pgjet_ok(&restore_args_no_ts(&c.repo, &dir, label));
    step!("{label}: restored in {:.1}s", r.elapsed.as_secs_f64());
    let v = pg_verifybackup(c.pg(), &dir);
    assert!(v.success(), "{label}: pg_verifybackup failed:\n{v}");
    let server = start_restored(c, label, &dir);
    assert_same_fingerprint(label, fp, &fingerprint(&server));
    assert_pgbench_invariant(label, &server);
    let a = server.amcheck();
    assert!(a.success(), "{label}: pg_amcheck failed:\n{a}");
    drop(server);
    let _ = fs::remove_dir_all(&dir);
}

/// A PostgreSQL 15 cluster for these tests: pgbench scale 5 and 48 MiB of random rows.
fn resume_cluster(tag: &str) -> Cluster {
    let c = Cluster::new(&Pg::v15(), tag);
    pgbench_init(&c.server, 5);
    load_random(&c.server, "postgres", "rand_t", 48 << 20);
    c
}

#[test]
fn resume_after_kill_pg15_local() {
    let t0 = Instant::now();
    let c = resume_cluster("resume");
    let s = &c.server;
    c.psql(
        "postgres",
        "CREATE TABLE trunc_t AS SELECT i, md5(i::text) v FROM generate_series(1, 50000) i;\n\
         CREATE TABLE drop_t AS SELECT i FROM generate_series(1, 10000) i;\n\
         CHECKPOINT;",
    );
    c.pgjet_cmd("stanza-create", &c.repo, &[]).ok();

    // Attempt 1 of a full, under pgbench, killed after ten saves (about 40 MiB).
    let (bin, a) = pgbench_args(s, &args!["-n", "-c", 2, "-T", 600]);
    let bench = Background::spawn(&bin, &a, &c.root.join("bench.pid"));
    let label = kill_after_save(&c, "full", &[], 1, 10);
    bench.signal(libc::SIGINT);
    let _ = bench.wait();
    assert!(
        info_backups(&c.repo, "main").is_empty(),
        "an interrupted backup is not listed"
    );

    // The cluster changes; attempt 2 resumes into the same label and is killed too.
    c.psql(
        "postgres",
        "UPDATE rand_t SET b = decode(repeat('cd', 1000), 'hex') WHERE id % 40 = 0;\n\
         DROP TABLE drop_t;\n\
         TRUNCATE trunc_t;\n\
         INSERT INTO trunc_t SELECT i, 'after truncate ' || i FROM generate_series(1, 100) i;",
    );
    let again = kill_after_save(&c, "full", &[], 2, 4);
    assert_eq!(
        again, label,
        "the second attempt must resume the first one's label"
    );

    // More changes; attempt 3 runs to the end.
    c.psql(
        "postgres",
        "CREATE TABLE new_t AS SELECT i, md5(i::text) v FROM generate_series(1, 30000) i;",
    );
    let (bin_tx, a_tx) = pgbench_args(s, &args!["-n", "-c", 2, "-t", 200]);
    let r = run_as_postgres(&bin_tx, &a_tx, None);
    assert!(r.success(), "pgbench failed:\n{r}");
    let (done, resumed, reused, r) = backup_to_end(&c, "full", &[]);
    assert_eq!(done, label, "the backup must resume the interrupted label");
    assert!(
        resumed && reused > 0,
        "the third attempt kept nothing?\n{r}"
    );
    assert!(
        r.stderr.contains("resuming interrupted backup") && r.stderr.contains("attempt 3"),
        "the log must say the backup is resumed, and which attempt:\n{r}"
    );
    let fp_full = fingerprint(s);
    assert!(
        !resume_dir(&c, &label).exists(),
        "a complete backup keeps no resume journal"
    );
    let listed = info_backups(&c.repo, "main");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_sane_backup(&listed[0], "full");
    restore_and_check(&c, &label, &fp_full);

    // An incr under pgbench, killed, then resumed: it names the full and its own frames.
    let bench = Background::spawn(&bin, &a, &c.root.join("bench2.pid"));
    c.psql(
        "postgres",
        "UPDATE rand_t SET b = decode(repeat('ef', 1000), 'hex') WHERE id % 25 = 0;",
    );
    let incr = kill_after_save(&c, "incr", &[], 1, 2);
    bench.signal(libc::SIGINT);
    let _ = bench.wait();
    c.psql(
        "postgres",
        "UPDATE new_t SET v = 'after the kill' WHERE i % 7 = 0;",
    );
    let (done, resumed, _, r) = backup_to_end(&c, "incr", &[]);
    assert_eq!(done, incr, "the incr must resume its interrupted label");
    assert!(resumed, "{r}");
    assert!(done.starts_with(&label) && done.ends_with('I'), "{done}");
    let fp_incr = fingerprint(s);
    let info = info_backups(&c.repo, "main");
    assert_eq!(info.len(), 2, "{info:?}");
    assert_eq!(info[1]["reference"], label.as_str(), "{:?}", info[1]);
    restore_and_check(&c, &incr, &fp_incr);

    // --no-resume: the interrupted backup is removed and a new label taken.
    let stale = kill_after_save(&c, "incr", &[], 1, 1);
    std::thread::sleep(Duration::from_millis(1100));
    let (fresh, resumed, _, r) = backup_to_end(&c, "incr", &["--no-resume"]);
    assert!(
        !resumed && fresh != stale,
        "--no-resume resumed {stale}:\n{r}"
    );
    assert!(
        !backup_dir(&c.repo, "main", &stale).exists(),
        "--no-resume must remove the interrupted backup {stale}"
    );

    // An interrupted diff is not resumed by an incr: removed, with the reason.
    let stale = kill_after_save(&c, "diff", &[], 1, 1);
    std::thread::sleep(Duration::from_millis(1100));
    let (fresh, resumed, _, r) = backup_to_end(&c, "incr", &[]);
    assert!(!resumed && fresh != stale, "{r}");
    assert!(
        r.stderr
            .contains("is not resumed: it is of type diff, this backup of type incr"),
        "the log must say why the interrupted backup is not resumed:\n{r}"
    );
    assert!(!backup_dir(&c.repo, "main", &stale).exists());
    pgjet_ok(&verify_args(&c.repo, &fresh));
    step!("resume scenario done in {}", secs(t0));
}

/// A full backup over libpq, through a TCP proxy on 127.0.0.1, whose link goes down after
/// five journal saves (every connection cut, new ones refused): the backup fails, and says
/// so, within two minutes, leaving nothing listed; with the link up again the next backup
/// resumes it into the same label, keeping what was saved, and restores to the cluster's
/// rows.
#[test]
fn resume_after_link_cut_pg15_libpq() {
    let t0 = Instant::now();
    let c = resume_cluster("resume-libpq");
    c.listen_on_loopback();
    c.pgjet_cmd("stanza-create", &c.repo, &[]).ok();
    let proxy = common::faultproxy::FaultProxy::start(c.port());
    let source = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres",
        proxy.port
    );
    let mut a = args![
        "backup",
        "--type",
        "full",
        "--transport",
        "libpq",
        "--source",
        source,
        "--output",
        "json"
    ];
    a.extend(c.repo_args(&c.repo));
    a.extend(SLOW_BACKUP.iter().chain(SAVES).map(|s| s.to_string()));

    let b = Background::spawn(&pgjet_bin(), &a, &c.root.join("cut.pid"));
    let (mut b, label) = wait_for_journal_save(b, &c.repo.join("main").join("backup"), 1, 5);
    proxy.link_down();
    let ended = wait_for(Duration::from_secs(120), || b.try_wait());
    assert!(
        ended.is_some(),
        "the backup did not end within 120 s of the link going down"
    );
    let r = b.wait();
    assert!(!r.success(), "a backup whose link was cut succeeded?\n{r}");
    assert!(
        !backup_dir(&c.repo, "main", &label)
            .join("summary.json")
            .exists(),
        "{label} has a summary after the cut"
    );
    assert!(
        info_backups(&c.repo, "main").is_empty(),
        "an interrupted backup is not listed"
    );
    let err = r
        .stderr
        .lines()
        .find(|l| l.contains("ERROR"))
        .unwrap_or("(no ERROR line)");
    step!("{label}: link down after save 5: failed: {err}");

    proxy.link_up();
    // Cancelled as Patroni or systemd cancels (SIGTERM) while it resumes: SIGTERM's status
    // within seconds, no session of pgjet left on the server (the backup it ran there
    // ended with it), nothing listed, and the repository lock released (the next run
    // below resumes at once).
    let b = Background::spawn(&pgjet_bin(), &a, &c.root.join("term.pid"));
    let (b, again) = wait_for_journal_save(b, &c.repo.join("main").join("backup"), 2, 2);
    assert_eq!(again, label, "the second attempt resumes the first");
    let r = end_on_sigterm(b, "backup");
    assert!(
        info_backups(&c.repo, "main").is_empty(),
        "a cancelled backup is not listed:\n{r}"
    );
    assert_no_session_left(&c, "application_name LIKE 'pgjet%'");
    let r = pgjet(&a).ok();
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim())
        .unwrap_or_else(|e| panic!("backup --output json is not JSON ({e}):\n{r}"));
    assert_eq!(
        v["label"].as_str(),
        Some(label.as_str()),
        "resumed into its label"
    );
    assert_eq!(v["resumed"].as_bool(), Some(true), "resumed:\n{r}");
    let reused = v["reused"].as_u64().unwrap_or(0);
    assert!(reused > 0, "kept nothing of the first attempt:\n{r}");
    step!(
        "{label}: resumed over the link in {:.1}s, {} MiB kept",
        r.elapsed.as_secs_f64(),
        reused >> 20
    );
    let fp = fingerprint(&c.server);
    restore_and_check(&c, &label, &fp);
    cancel_on_a_stuck_repository(&c, &label);
    step!("link cut and resume done in {}", secs(t0));
}

/// A restore and an archive-get waiting on a repository that stops answering (an object
/// whose open never returns, as on a hung NFS mount: here a named pipe no one writes) end
/// on SIGTERM within seconds, with SIGTERM's status: the restore leaves no pg_control
/// (the directory cannot be started), archive-get no file where PostgreSQL would read it.
fn cancel_on_a_stuck_repository(c: &Cluster, label: &str) {
    let stick = |p: &Path| {
        fs::remove_file(p).unwrap();
        let r = std::process::Command::new("mkfifo")
            .arg(p)
            .status()
            .unwrap();
        assert!(r.success(), "mkfifo {}", p.display());
    };
    // The backup's largest object.
    let mut objects: Vec<(u64, PathBuf)> = files_under(&backup_dir(&c.repo, "main", label))
        .into_iter()
        .filter_map(|p| Some((fs::metadata(&p).ok()?.len(), p)))
        .collect();
    objects.sort();
    let (_, largest) = objects.pop().expect("the backup has objects");
    stick(&largest);
    let dir = c.new_dir("restore-stuck");
    let b = Background::spawn(
        &pgjet_bin(),
        &restore_args_no_ts(&c.repo, &dir, label),
        &c.root.join("restore-stuck.pid"),
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(!dir.join("global/pg_control").exists());
    end_on_sigterm(b, "restore stuck on the repository");
    assert!(
        !dir.join("global/pg_control").exists(),
        "a cancelled restore must not look complete"
    );

    // A WAL segment archived, then its object stuck.
    let wal = c.data().join("pg_wal");
    let mut segs: Vec<String> = fs::read_dir(&wal)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.len() == 24 && n.chars().all(|ch| ch.is_ascii_hexdigit()))
        .collect();
    segs.sort();
    let seg = segs.first().expect("a WAL segment").clone();
    c.pgjet_cmd(
        "archive-push",
        &c.repo,
        &[&wal.join(&seg).to_string_lossy()],
    )
    .ok();
    let stored = files_under(&c.repo.join("main").join("archive"))
        .into_iter()
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&seg))
        })
        .expect("the pushed segment's object");
    stick(&stored);
    let dest = c.root.join("RECOVERYXLOG");
    let mut a = vec!["archive-get".to_string()];
    a.extend(c.stanza_args(&c.repo));
    a.extend([seg.clone(), dest.to_string_lossy().into_owned()]);
    let b = Background::spawn(&pgjet_bin(), &a, &c.root.join("get-stuck.pid"));
    std::thread::sleep(Duration::from_secs(1));
    end_on_sigterm(b, "archive-get stuck on the repository");
    assert!(!dest.exists(), "archive-get must leave no file");
}

/// What a resume does with damage: a byte flipped in an object the journal names (its
/// files are copied again, with a warning naming the object, and the result restores to the
/// cluster's rows), and a journal part that is not zstd (the interrupted backup is not
/// resumed, with the reason, and a new backup starts over).
#[test]
fn resume_copies_damaged_frames_again_and_refuses_a_bad_journal() {
    let t0 = Instant::now();
    let c = resume_cluster("resume-damage");
    c.pgjet_cmd("stanza-create", &c.repo, &[]).ok();

    // A byte flipped in the middle of the first object the killed attempt stored.
    let label = kill_after_save(&c, "full", &[], 1, 3);
    let first = backup_dir(&c.repo, "main", &label)
        .join("data")
        .join("000001");
    let mut bytes = fs::read(&first).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    fs::write(&first, &bytes).unwrap();
    let (resumed, was_resumed, reused, r) = backup_to_end(&c, "full", &[]);
    assert_eq!(resumed, label, "resumed into its label");
    assert!(was_resumed, "resumed:\n{r}");
    step!("{label}: resumed, {} KiB kept", reused >> 10);
    let why = format!("{label}: no warning about the damaged object");
    step!(
        "{label}: {}",
        log_line(
            &r,
            "does not match its XXH3; the files it holds are copied again",
            &why
        )
    );
    let fp = fingerprint(&c.server);
    restore_and_check(&c, &label, &fp);

    // A journal part replaced by bytes that are not zstd: not resumed, started over.
    let label2 = kill_after_save(&c, "full", &[], 1, 2);
    let part = fs::read_dir(resume_dir(&c, &label2))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".jsonl.zst"))
        .max()
        .expect("a saved journal part");
    fs::write(&part, b"this is not a zstd frame").unwrap();
    let (fresh, was_resumed, _, r) = backup_to_end(&c, "full", &[]);
    assert!(
        !was_resumed,
        "a backup with a bad journal was resumed:\n{r}"
    );
    let why = format!("{label2}: no reason given for not resuming");
    step!("{label2}: {}", log_line(&r, "is not resumed", &why));
    // The interrupted backup is removed; the new one may take its label again (labels
    // have one-second resolution and the name is free once it is gone), but holds no
    // journal of the old attempts.
    assert!(
        fresh == label2 || !backup_dir(&c.repo, "main", &label2).exists(),
        "the interrupted backup {label2} was not removed"
    );
    assert!(
        !resume_dir(&c, &fresh).exists(),
        "{fresh} completed with a resume journal left"
    );
    restore_and_check(&c, &fresh, &fp);
    step!("damage cases done in {}", secs(t0));
}

/// The regular files below `dir`, at any depth.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push(e.path()),
                Ok(t) if t.is_file() => out.push(e.path()),
                _ => {}
            }
        }
    }
    out
}
