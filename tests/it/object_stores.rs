//! Repositories on object stores, each a real server on 127.0.0.1 started by the test
//! (tests/it/common/stores.rs): S3 (versitygw, TLS verified against a test CA), GCS
//! (fake-gcs-server, TLS), Azure Blob (Azurite) and SFTP (OpenSSH), configured the pgBackRest
//! way (a config file with `repo1-type`, `repo1-s3-*`, `repo1-storage-*`, ...).
//!
//! - For each store, with PostgreSQL 15: stanza-create, a full backup, info, verify, check,
//!   restore (pg_verifybackup, start, same rows); the objects are where the repository
//!   format says and the backup lock is gone afterwards.
//! - S3: a chain full, incr, diff taken while the cluster changes, verified, the incr and the
//!   diff restored with their own rows.
//! - S3: a full killed (SIGKILL) after two saves of its resume journal, the resumed attempt cut
//!   off by the S3 server going down (it fails), then resumed to the end once the server is
//!   back: the same label, restored with the rows it had.
//! - Refusals (S3): a wrong secret, a missing bucket and an untrusted certificate fail at once
//!   with their own message and exit code; a backup while another holds the stanza's lock
//!   (a conditional create on S3) fails naming the holder, and succeeds once it lets go.
use crate::common;

use crate::common::stores::*;
use crate::common::*;
use std::fs;
use std::path::Path;
use std::time::Duration;

/// `--config C --stanza main --pg-path D --pg-port P --pg-socket-path S` for `cluster`.
fn store_args(conf: &Path, cluster: &Cluster) -> Vec<String> {
    args![
        "--config",
        conf.display(),
        "--stanza",
        "main",
        "--pg-path",
        cluster.data().display(),
        "--pg-port",
        cluster.port(),
        "--pg-socket-path",
        cluster.sock().display()
    ]
}

/// `restore --config C --stanza main` into fresh directories `restored` and `restored-ts1` of
/// `cluster` (tablespace ts1 mapped there), with `extra`; returns the arguments and the two
/// directories.
fn restore_cmd(
    conf: &Path,
    cluster: &Cluster,
    extra: &[&str],
) -> (Vec<String>, std::path::PathBuf, std::path::PathBuf) {
    let restored = cluster.new_dir("restored");
    let ts_dir = cluster.new_dir("restored-ts1");
    let mut a = args![
        "restore",
        "--config",
        conf.display(),
        "--stanza",
        "main",
        "--pg-path",
        restored.display(),
        "--tablespace-map",
        format!("ts1={}", ts_dir.display())
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    (a, restored, ts_dir)
}

fn cmd(name: &str, base: &[String], extra: &[&str]) -> Vec<String> {
    let mut a = vec![name.to_string()];
    a.extend(base.iter().cloned());
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// The scenario every store runs (see the module's doc); `encrypted`: with
/// `repo1-cipher-type=aes-256-gcm`, and every object but the key files checked to be sealed.
fn store_scenario(kind: StoreKind, encrypted: bool) {
    let tag = format!("{kind:?}{}", if encrypted { "-enc" } else { "" }).to_lowercase();
    let s3 = StoreServer::start(kind, &tag);
    let cluster = Cluster::new(&Pg::v15(), &tag);
    load_dataset(&cluster, DatasetSpec::SMALL);
    let cipher: &[(&str, &str)] = if encrypted {
        &[
            ("repo1-cipher-type", "aes-256-gcm"),
            ("repo1-cipher-pass", "store-test-passphrase"),
        ]
    } else {
        &[]
    };
    let conf = s3.config_file("pgjet.conf", "/repo", cipher);
    let base = store_args(&conf, &cluster);

    pgjet_ok(&cmd("stanza-create", &base, &[]));
    let r = pgjet_ok(&cmd(
        "backup",
        &base,
        &["--type", "full", "--start-fast", "--jobs", "2"],
    ));
    step!("{kind:?}: full backup in {:.1}s", r.elapsed.as_secs_f64());
    let source_fp = fingerprint(&cluster.server);

    let r = pgjet_ok(&cmd("info", &base, &["--output", "json"]));
    let v: serde_json::Value =
        serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| panic!("info json: {e}\n{r}"));
    let backups = v[0]["backups"]
        .as_array()
        .unwrap_or_else(|| panic!("no backups array:\n{r}"))
        .clone();
    assert_eq!(backups.len(), 1, "one backup expected:\n{r}");
    assert_sane_backup(&backups[0], "full");
    let label = backups[0]["label"].as_str().unwrap().to_string();

    // The objects are in the bucket, below the repository's prefix, as documented.
    let objects = s3.objects("/repo");
    for want in [
        "main/stanza.json".to_string(),
        format!("main/backup/{label}/manifest.jsonl.zst"),
        format!("main/backup/{label}/summary.json"),
        format!("main/backup/{label}/data/000001"),
    ] {
        assert!(
            objects.contains(&want),
            "{want} is not in the bucket; objects: {objects:?}"
        );
    }
    let locks: Vec<&String> = objects.iter().filter(|o| o.contains("lock/")).collect();
    assert_eq!(
        locks,
        vec!["main/lock/backup-0000000001.json"],
        "one lock record, the backup's: {objects:?}"
    );
    if !encrypted {
        let rec: pgjet_core::repo::lock::LockRecord =
            serde_json::from_slice(&s3.object_bytes("/repo", locks[0])).unwrap();
        assert!(rec.released, "the backup let its lock go: {rec:?}");
    }
    if encrypted {
        for want in [
            "main/cipher.json".to_string(),
            format!("main/backup/{label}/key"),
        ] {
            assert!(objects.contains(&want), "{want} is missing: {objects:?}");
        }
        // Read back raw through the library, without the passphrase: sealed.
        for o in &objects {
            if o.ends_with("/cipher.json") || o.ends_with("/key") {
                continue;
            }
            let bytes = s3.object_bytes("/repo", o);
            assert!(bytes.starts_with(b"PGJAE1\0\0"), "{o} is stored plain");
        }
        step!(
            "{kind:?}: {} objects, all sealed but the key files",
            objects.len()
        );
        // Without the passphrase the stanza says it is encrypted.
        let plain = s3.config_file("plain.conf", "/repo", &[]);
        pgjet(&cmd("info", &store_args(&plain, &cluster), &[])).fails_with("is encrypted");
    }

    let r = pgjet_ok(&cmd("verify", &base, &[]));
    step!("{kind:?}: verify in {:.1}s", r.elapsed.as_secs_f64());
    pgjet_ok(&cmd("check", &base, &[]));

    let (a, restored, ts_dir) = restore_cmd(
        &conf,
        &cluster,
        &[
            "--set",
            &label,
            "--type",
            "immediate",
            "--target-action",
            "promote",
            "--jobs",
            "2",
        ],
    );
    let r = pgjet_ok(&a);
    step!("{kind:?}: restore in {:.1}s", r.elapsed.as_secs_f64());
    start_and_compare(
        &cluster,
        &format!("restore from {kind:?}"),
        &restored,
        &ts_dir,
        &source_fp,
        false,
    );
    if kind == StoreKind::Sftp {
        // OpenDAL's ssh session starts a control master with ControlPersist=yes: pgjet must
        // close it before it exits (io::runtime::drain), or every command leaves one behind.
        // The master exits on its own once told to: allow it a few seconds (more on a
        // loaded machine).
        let key = s3.dir.join("client_key").display().to_string();
        let mut left = String::new();
        let gone = wait_for(Duration::from_secs(10), || {
            let out = std::process::Command::new("pgrep")
                .args(["-f", &key])
                .output()
                .unwrap();
            left = String::from_utf8_lossy(&out.stdout).into_owned();
            left.is_empty().then_some(())
        });
        assert!(gone.is_some(), "ssh processes outlived pgjet: {left}");
    }
}

#[test]
fn s3_backup_info_verify_restore() {
    store_scenario(StoreKind::S3, false);
}

#[test]
fn s3_encrypted_backup_verify_restore() {
    store_scenario(StoreKind::S3, true);
}

#[test]
fn gcs_backup_info_verify_restore() {
    store_scenario(StoreKind::Gcs, false);
}

#[test]
fn gcs_encrypted_backup_verify_restore() {
    store_scenario(StoreKind::Gcs, true);
}

#[test]
fn azure_backup_info_verify_restore() {
    store_scenario(StoreKind::Azure, false);
}

#[test]
fn azure_encrypted_backup_verify_restore() {
    store_scenario(StoreKind::Azure, true);
}

#[test]
fn sftp_backup_info_verify_restore() {
    store_scenario(StoreKind::Sftp, false);
}

#[test]
fn sftp_encrypted_backup_verify_restore() {
    store_scenario(StoreKind::Sftp, true);
}

#[test]
fn s3_refusals_name_their_cause() {
    let s3 = StoreServer::start(StoreKind::S3, "s3-refusals");
    let cluster = Cluster::new(&Pg::v15(), "s3-refusals");
    let good = s3.config_file("good.conf", "/r", &[]);
    let base = store_args(&good, &cluster);
    pgjet_ok(&cmd("stanza-create", &base, &[]));

    // A wrong secret: refused, exit 4, the hint names the credentials.
    let bad = s3.config_file("bad-secret.conf", "/r", &[("repo1-s3-key-secret", "wrong")]);
    let r = pgjet(&cmd("info", &store_args(&bad, &cluster), &[]));
    assert_eq!(r.status.code(), Some(4), "wrong secret:\n{r}");
    assert!(r.stderr.contains("repo-s3-key"), "wrong secret, hint:\n{r}");
    step!("wrong secret: {}", r.stderr.trim());

    // A missing bucket: exit 4, the hint names the bucket.
    let nob = s3.config_file(
        "no-bucket.conf",
        "/r",
        &[("repo1-s3-bucket", "nosuchbucket")],
    );
    let r = pgjet(&cmd("info", &store_args(&nob, &cluster), &[]));
    assert_eq!(r.status.code(), Some(4), "missing bucket:\n{r}");
    assert!(r.text_lower().contains("bucket"), "missing bucket:\n{r}");
    step!("missing bucket: {}", r.stderr.trim());

    // TLS verified against the system's CAs only: the test CA is unknown, so it fails (and
    // with verification off, it works).
    let sys = s3.config_file("system-ca.conf", "/r", &[("repo1-storage-ca-file", "")]);
    let r = pgjet(&cmd("info", &store_args(&sys, &cluster), &[]));
    assert_eq!(r.status.code(), Some(4), "an untrusted certificate:\n{r}");
    assert!(
        r.stderr.contains("certificate") && r.elapsed < Duration::from_secs(10),
        "an untrusted certificate fails at once, by name:\n{r}"
    );
    step!("untrusted certificate: {}", r.stderr.trim());
    let nover = s3.config_file(
        "no-verify.conf",
        "/r",
        &[
            ("repo1-storage-ca-file", ""),
            ("repo1-storage-verify-tls", "n"),
        ],
    );
    pgjet_ok(&cmd("info", &store_args(&nover, &cluster), &[]));

    // Another pgjet holds the stanza's lock (this test process, through the library): the
    // backup fails naming it (exit 6) and leaves no backup behind; once the holder lets go,
    // the next backup succeeds.
    let cfg = s3.repo_config("/r");
    let store = pgjet_core::storage::open(&cfg).expect("open the S3 repository from the library");
    let lock = pgjet_core::repo::StanzaLock::acquire(store.clone(), "main", "backup").unwrap();
    assert!(s3
        .objects("/r")
        .iter()
        .any(|o| o == "main/lock/backup-0000000001.json"));
    let r = pgjet(&cmd("backup", &base, &["--type", "full", "--start-fast"]));
    assert_eq!(r.status.code(), Some(6), "backup under a held lock:\n{r}");
    assert!(
        r.stderr.contains("another pgjet backup")
            && r.stderr.contains(&format!("pid {}", std::process::id())),
        "the error must name the holder:\n{r}"
    );
    assert!(
        !s3.objects("/r")
            .iter()
            .any(|o| o.starts_with("main/backup/")),
        "a refused backup must leave nothing: {:?}",
        s3.objects("/r")
    );
    drop(lock);
    let (_, released) = pgjet_core::repo::lock::current(&*store, "main")
        .unwrap()
        .unwrap();
    assert!(released.unwrap().released, "the lock was let go");
    pgjet_ok(&cmd(
        "backup",
        &base,
        &["--type", "full", "--start-fast", "--jobs", "2"],
    ));
}

/// The labels `info --output json` lists for stanza main with config `conf`.
fn labels(conf: &Path, cluster: &Cluster) -> Vec<String> {
    let r = pgjet_ok(&cmd(
        "info",
        &store_args(conf, cluster),
        &["--output", "json"],
    ));
    let v: serde_json::Value =
        serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| panic!("info json: {e}\n{r}"));
    v[0]["backups"]
        .as_array()
        .unwrap_or_else(|| panic!("no backups array:\n{r}"))
        .iter()
        .map(|b| b["label"].as_str().unwrap().to_string())
        .collect()
}

/// The backup directories (labels) that hold objects below `prefix`.
fn backup_dirs(store: &StoreServer, prefix: &str) -> Vec<String> {
    let mut d: Vec<String> = store
        .objects(prefix)
        .iter()
        .filter_map(|o| o.strip_prefix("main/backup/"))
        .filter_map(|o| o.split('/').next())
        .map(str::to_string)
        .collect();
    d.dedup();
    d
}

/// The S3 server is stopped while a backup uploads: the backup fails with the storage exit
/// code (9) after its retries, `info` does not list it, and once the server is back the next
/// backup succeeds, removes the interrupted one's objects and verifies.
#[test]
fn s3_server_stopped_mid_backup() {
    let mut s3 = StoreServer::start(StoreKind::S3, "s3-stop");
    let proxy = common::faultproxy::FaultProxy::start(s3.port);
    let cluster = Cluster::new(&Pg::v15(), "s3-stop");
    load_dataset(&cluster, DatasetSpec::SMALL);
    let port = proxy.port.to_string();
    let conf = s3.config_file("via-proxy.conf", "/r", &[("repo1-storage-port", &port)]);
    let base = store_args(&conf, &cluster);
    pgjet_ok(&cmd("stanza-create", &base, &[]));
    // Slow the upload down so that the server can be stopped in the middle of it.
    proxy.set_throttle_ms(20);
    let before = proxy.up_bytes();
    let backup = Background::spawn(
        &pgjet_bin(),
        &cmd(
            "backup",
            &base,
            &["--type", "full", "--start-fast", "--jobs", "2"],
        ),
        &s3.dir.join("backup.pid"),
    );
    let uploading = wait_for(Duration::from_secs(60), || {
        (proxy.up_bytes() > before + (2 << 20)).then_some(())
    });
    assert!(uploading.is_some(), "the backup never uploaded 2 MiB");
    s3.stop();
    let r = backup.wait();
    step!(
        "backup with the server stopped: {:?} after {:.1}s",
        r.status.code(),
        r.elapsed.as_secs_f64()
    );
    assert_eq!(
        r.status.code(),
        Some(9),
        "a backup whose store went away:\n{r}"
    );
    assert!(
        r.stderr.contains("storage"),
        "the error names the storage:\n{r}"
    );
    s3.resume();
    proxy.set_throttle_ms(0);
    assert!(
        labels(&conf, &cluster).is_empty(),
        "an interrupted backup must not be listed"
    );
    let stale = backup_dirs(&s3, "/r");
    assert_eq!(
        stale.len(),
        1,
        "the interrupted backup left its objects: {stale:?}"
    );
    let r = pgjet_ok(&cmd(
        "backup",
        &base,
        &["--type", "full", "--start-fast", "--jobs", "2"],
    ));
    assert!(r.stderr.contains("removing interrupted backup"), "{r}");
    let listed = labels(&conf, &cluster);
    assert_eq!(listed.len(), 1);
    assert_eq!(
        backup_dirs(&s3, "/r"),
        listed,
        "only the complete backup's objects remain"
    );
    pgjet_ok(&cmd("verify", &base, &[]));
}

/// A storm of resets, `503 Slow Down` answers and cut connections between pgjet and S3
/// (plain HTTP, so the proxy can answer): backup, verify and restore all succeed through
/// their retries, which are logged, and the restored cluster holds the source's rows.
#[test]
fn s3_fault_storm_is_retried() {
    let s3 = StoreServer::start_with(StoreKind::S3, "s3-storm", false);
    let proxy = common::faultproxy::FaultProxy::start(s3.port);
    let cluster = Cluster::new(&Pg::v15(), "s3-storm");
    load_dataset(&cluster, DatasetSpec::SMALL);
    let port = proxy.port.to_string();
    let conf = s3.config_file("storm.conf", "/r", &[("repo1-storage-port", &port)]);
    let base = store_args(&conf, &cluster);
    pgjet_ok(&cmd("stanza-create", &base, &[]));
    proxy.set_storm(Some(common::faultproxy::Storm {
        reset_pct: 10,
        http503_pct: 10,
        cut_pct: 5,
    }));
    let r = pgjet_ok(&cmd(
        "backup",
        &base,
        &["--type", "full", "--start-fast", "--jobs", "2"],
    ));
    let source_fp = fingerprint(&cluster.server);
    pgjet_ok(&cmd("verify", &base, &[]));
    let (a, restored, ts_dir) = restore_cmd(&conf, &cluster, &["--jobs", "2"]);
    let rr = pgjet_ok(&a);
    let (resets, answers, cuts) = proxy.faults();
    step!("storm: {resets} resets, {answers} 503 answers, {cuts} cuts injected");
    assert!(
        resets + answers + cuts >= 3,
        "too few faults were injected to prove anything: {:?}",
        proxy.faults()
    );
    assert!(
        format!("{}{}", r.stderr, rr.stderr).contains("retrying"),
        "retries must be logged:\n{r}\n{rr}"
    );
    proxy.set_storm(None);
    start_and_compare(
        &cluster,
        "restore through the storm",
        &restored,
        &ts_dir,
        &source_fp,
        false,
    );
}

/// Damaged repository objects on S3: a flipped byte and a missing object are reported by
/// `verify` (exit 5) naming the files they hold, and `restore` refuses (exit 5) naming one.
#[test]
fn s3_corrupt_and_missing_objects_are_named() {
    let s3 = StoreServer::start(StoreKind::S3, "s3-damage");
    let cluster = Cluster::new(&Pg::v15(), "s3-damage");
    load_dataset(&cluster, DatasetSpec::SMALL);
    let conf = s3.config_file("pgjet.conf", "/r", &[]);
    let base = store_args(&conf, &cluster);
    pgjet_ok(&cmd("stanza-create", &base, &[]));
    pgjet_ok(&cmd(
        "backup",
        &base,
        &["--type", "full", "--start-fast", "--jobs", "2"],
    ));
    let label = labels(&conf, &cluster).pop().unwrap();
    let dir = format!("main/backup/{label}");
    let manifest = manifest_from_stored(
        &fs::read(s3.object_file("/r", &format!("{dir}/manifest.jsonl.zst"))).unwrap(),
    );
    // Pieces by object: (object, offset in the object, stored size, file).
    let mut pieces: Vec<(String, u64, u64, String)> = Vec::new();
    for f in manifest["files"].as_array().unwrap() {
        for p in f["pieces"].as_array().unwrap() {
            pieces.push((
                p["object"].as_str().unwrap().to_string(),
                p["offset"].as_u64().unwrap(),
                p["stored_size"].as_u64().unwrap(),
                f["path"].as_str().unwrap().to_string(),
            ));
        }
    }
    let mut objects: Vec<String> = pieces.iter().map(|p| p.0.clone()).collect();
    objects.sort();
    objects.dedup();
    assert!(
        objects.len() >= 3,
        "the backup has too few objects: {objects:?}"
    );
    // Flip a byte in the middle of the first object: the file whose frame holds it is named.
    let flipped = objects[0].clone();
    let f = s3.object_file("/r", &format!("{dir}/data/{flipped}"));
    let mut bytes = fs::read(&f).unwrap();
    let mid = bytes.len() as u64 / 2;
    bytes[mid as usize] ^= 0x40;
    fs::write(&f, bytes).unwrap();
    let flipped_file = pieces
        .iter()
        .find(|p| p.0 == flipped && p.1 <= mid && mid < p.1 + p.2)
        .map(|p| p.3.clone())
        .expect("a piece holds the middle byte");
    // Remove the second object: every file stored in it is named.
    let missing = objects[1].clone();
    let missing_file = pieces.iter().find(|p| p.0 == missing).unwrap().3.clone();
    fs::remove_file(s3.object_file("/r", &format!("{dir}/data/{missing}"))).unwrap();

    let r = pgjet(&cmd("verify", &base, &[]));
    assert_eq!(r.status.code(), Some(5), "verify of a damaged backup:\n{r}");
    for name in [&flipped_file, &missing_file] {
        assert!(
            r.stderr.contains(name.as_str()),
            "verify must name {name}:\n{r}"
        );
    }
    let (a, _, _) = restore_cmd(&conf, &cluster, &[]);
    let r = pgjet(&a);
    assert_eq!(
        r.status.code(),
        Some(5),
        "restore of a damaged backup:\n{r}"
    );
    assert!(
        r.stderr.contains(flipped_file.as_str()) || r.stderr.contains(missing_file.as_str()),
        "restore must name a damaged file:\n{r}"
    );
}

/// Two backups of one stanza at once, both real pgjet processes: the second fails at once
/// naming the first (its PID), the first completes.
#[test]
fn s3_concurrent_backups_one_fails_naming_the_other() {
    let s3 = StoreServer::start(StoreKind::S3, "s3-twice");
    let proxy = common::faultproxy::FaultProxy::start(s3.port);
    let cluster = Cluster::new(&Pg::v15(), "s3-twice");
    load_dataset(&cluster, DatasetSpec::SMALL);
    let port = proxy.port.to_string();
    let slow = s3.config_file("slow.conf", "/r", &[("repo1-storage-port", &port)]);
    let direct = s3.config_file("direct.conf", "/r", &[]);
    pgjet_ok(&cmd("stanza-create", &store_args(&direct, &cluster), &[]));
    proxy.set_throttle_ms(20);
    let first = Background::spawn(
        &pgjet_bin(),
        &cmd(
            "backup",
            &store_args(&slow, &cluster),
            &["--type", "full", "--start-fast"],
        ),
        &s3.dir.join("first.pid"),
    );
    let held = wait_for(Duration::from_secs(60), || {
        s3.objects("/r")
            .iter()
            .any(|o| o.starts_with("main/lock/backup-"))
            .then_some(())
    });
    assert!(held.is_some(), "the first backup never took the lock");
    let r = pgjet(&cmd(
        "backup",
        &store_args(&direct, &cluster),
        &["--type", "full", "--start-fast"],
    ));
    assert_eq!(r.status.code(), Some(6), "the second backup:\n{r}");
    assert!(
        r.stderr.contains(&format!("pid {}", first.pid())),
        "the second backup must name the first one's PID {}:\n{r}",
        first.pid()
    );
    proxy.set_throttle_ms(0);
    let r = first.wait();
    assert!(r.success(), "the first backup must complete:\n{r}");
    assert_eq!(labels(&direct, &cluster).len(), 1);
}

/// Two repositories at once, posix (repo1) and S3 (repo2): stanza-create sets up both;
/// `backup --repo 2` goes to S3 and a plain backup to repo1; `info` lists both backups with
/// their repository; `restore --set` of the S3 backup without `--repo` finds it in repo2, and
/// the restored cluster holds the rows.
#[test]
fn posix_and_s3_repositories_together() {
    let s3 = StoreServer::start(StoreKind::S3, "two-repos");
    let cluster = Cluster::new(&Pg::v15(), "two-repos");
    load_dataset(&cluster, DatasetSpec::SMALL);
    let mut text = format!("[global]\nrepo1-path={}\n", cluster.repo.display());
    for (k, v) in s3.options("/two") {
        text.push_str(&format!("{}={v}\n", k.replacen("repo1-", "repo2-", 1)));
    }
    let conf = s3.dir.join("two.conf");
    fs::write(&conf, text).unwrap();
    chown_pg_recursive(&conf);
    let base = store_args(&conf, &cluster);
    let r = pgjet_ok(&cmd("stanza-create", &base, &[]));
    assert!(
        r.stdout.contains("repo1") && r.stdout.contains("repo2"),
        "{r}"
    );
    pgjet_ok(&cmd(
        "backup",
        &base,
        &[
            "--repo",
            "2",
            "--type",
            "full",
            "--start-fast",
            "--jobs",
            "2",
        ],
    ));
    let source_fp = fingerprint(&cluster.server);
    // Labels have one-second resolution and are unique per repository only: start the
    // second backup in a later second, so that the two labels order as the backups did.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    std::thread::sleep(std::time::Duration::from_nanos(
        1_000_000_000 - u64::from(now.subsec_nanos()) + 50_000_000,
    ));
    pgjet_ok(&cmd(
        "backup",
        &base,
        &["--type", "full", "--start-fast", "--jobs", "2"],
    ));
    let r = pgjet_ok(&cmd("info", &base, &["--output", "json"]));
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    let backups = v[0]["backups"].as_array().unwrap().clone();
    let repos: Vec<u64> = backups
        .iter()
        .map(|b| b["repo"].as_u64().unwrap())
        .collect();
    assert_eq!(
        repos,
        vec![2, 1],
        "the S3 backup first (older), then the posix one:\n{r}"
    );
    assert!(
        s3.objects("/two")
            .iter()
            .any(|o| o.ends_with("/summary.json")),
        "the S3 backup is in the bucket"
    );
    let s3_label = backups[0]["label"].as_str().unwrap().to_string();
    pgjet_ok(&cmd("verify", &base, &[]));

    let (a, restored, ts_dir) = restore_cmd(&conf, &cluster, &["--set", &s3_label, "--jobs", "2"]);
    let r = pgjet_ok(&a);
    assert!(
        r.stderr.contains("from repo2"),
        "the restore says where it reads:\n{r}"
    );
    start_and_compare(
        &cluster,
        "restore from repo2 (S3)",
        &restored,
        &ts_dir,
        &source_fp,
        false,
    );
}

/// A restore reads a large object of known size whole (one GET, the default) or as several
/// ranged requests at once (`PGJET_READ_PARTS`): either way the bytes come back whole, an
/// object shorter or longer than the manifest says comes back with a length that differs
/// from it (so restore and verify name the files), and a missing one is not found.
#[test]
fn s3_sized_reads_return_whole_objects_and_notice_wrong_sizes() {
    let s3 = StoreServer::start(StoreKind::S3, "s3-split");
    let cfg = s3.repo_config("/split");
    let store = pgjet_core::storage::open(&cfg).unwrap();
    let split = pgjet_core::storage::object::ObjectStorage::open(&cfg).unwrap();
    let len = (5usize << 20) + 12345;
    let data: Vec<u8> = (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    store.put("big", &data).unwrap();
    let mut buf = pgjet_core::io::direct::aligned_buf(8 << 20);
    type Read<'a> = Box<
        dyn Fn(&str, u64, &mut pgjet_core::io::direct::AlignedBuf) -> pgjet_core::error::Result<()>
            + 'a,
    >;
    let readers: [(&str, Read); 2] = [
        (
            "default",
            Box::new(|n, size, b| store.get_into(n, Some(size), b)),
        ),
        (
            "4 ranged GETs",
            Box::new(|n, size, b| split.get_split_into(n, size, 4, b)),
        ),
    ];
    for (how, read) in &readers {
        read("big", len as u64, &mut buf).unwrap();
        assert!(
            buf[..] == data[..],
            "{how}: a sized read must return the object"
        );

        // The manifest says 3 MiB more: the object reads short.
        read("big", (len + (3 << 20)) as u64, &mut buf).unwrap();
        assert_eq!(buf.len(), len, "{how}: a shorter object reads short");
        assert!(buf[..] == data[..]);

        // The manifest says 2 MiB less: the object reads long (the split read's open-ended
        // last range stops one byte past the size).
        let less = len - (2 << 20);
        read("big", less as u64, &mut buf).unwrap();
        assert!(
            buf.len() > less,
            "{how}: a longer object reads long ({})",
            buf.len()
        );
        assert!(buf[..less] == data[..less]);

        let e = read("gone", len as u64, &mut buf).unwrap_err();
        assert!(
            e.is_not_found(),
            "{how}: a missing object is not found: {e}"
        );
    }
}

/// The stanza's lock on each object store and SFTP, through the library as two processes
/// would use it: a second taker is refused naming the holder; the holder's renewals keep it
/// past its first lease; a takeover (the next epoch's record, created only if absent: a
/// second create of it is refused) is seen by the holder, which then never writes over it;
/// of eight takers of an expired lock exactly one wins, after watching it for a renewal
/// period; a released lock is taken at once.
#[test]
fn the_lock_on_every_store() {
    use pgjet_core::repo::lock::{self, LockRecord, StanzaLock};
    for kind in [
        StoreKind::S3,
        StoreKind::Azure,
        StoreKind::Gcs,
        StoreKind::Sftp,
    ] {
        let server = StoreServer::start(kind, &format!("lock-{kind:?}").to_lowercase());
        let store = pgjet_core::storage::open(&server.repo_config("/lk")).unwrap();
        let (lease, every) = (Duration::from_secs(3), Duration::from_millis(500));
        let take = || StanzaLock::acquire_timed(store.clone(), "main", "backup", lease, every);
        let a = take().unwrap();
        let e = take().err().unwrap().to_string();
        assert!(e.contains("another pgjet backup"), "{kind:?}: {e}");
        // Renewed: still held past its first lease.
        std::thread::sleep(lease + Duration::from_secs(1));
        a.check().unwrap();
        let (top, ours) = lock::current(&*store, "main").unwrap().unwrap();
        let ours = ours.unwrap();
        assert!(
            ours.lease_until > chrono::Utc::now().timestamp(),
            "{kind:?}"
        );
        // Another process takes it over.
        let theirs = LockRecord {
            host: "elsewhere".into(),
            pid: 4242,
            command: "backup".into(),
            token: "theirs".into(),
            acquired: "2026-01-01T00:00:00Z".into(),
            lease_until: chrono::Utc::now().timestamp() + 3600,
            released: false,
        };
        let json = serde_json::to_vec(&theirs).unwrap();
        let next = lock::record_name("main", top + 1);
        assert!(store.create_new(&next, &json).unwrap(), "{kind:?}");
        assert!(
            !store.create_new(&next, b"{}").unwrap(),
            "{kind:?}: created twice"
        );
        let e = a.check().unwrap_err().to_string();
        assert!(e.contains("lost the lock"), "{kind:?}: {e}");
        std::thread::sleep(every * 2);
        drop(a);
        assert_eq!(store.get(&next).unwrap(), json, "{kind:?}: written over");
        // Its lease runs out (its holder died elsewhere): eight takers, one winner.
        let expired = LockRecord {
            lease_until: chrono::Utc::now().timestamp() - 10,
            ..theirs
        };
        store
            .put_durable(&next, &serde_json::to_vec(&expired).unwrap())
            .unwrap();
        let go = std::sync::Arc::new(std::sync::Barrier::new(8));
        let results: Vec<_> = (0..8)
            .map(|_| {
                let (store, go) = (store.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    StanzaLock::acquire_timed(store, "main", "backup", lease, every)
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let won: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(won.len(), 1, "{kind:?}: {} takers won", won.len());
        for r in &results {
            if let Err(e) = r {
                assert!(
                    e.to_string().contains("another pgjet backup"),
                    "{kind:?}: {e}"
                );
            }
        }
        won[0].check().unwrap();
        drop(results);
        // Released: taken at once, and the earlier records are removed.
        let t = std::time::Instant::now();
        let b = take().unwrap();
        assert!(t.elapsed() < every, "{kind:?}: {:?}", t.elapsed());
        let records: Vec<String> = server
            .objects("/lk")
            .into_iter()
            .filter(|o| o.starts_with("main/lock/"))
            .collect();
        assert_eq!(
            records,
            vec![lock::record_name("main", top + 3)],
            "{kind:?}"
        );
        drop(b);
        drop(store);
        if kind == StoreKind::Sftp {
            // The test process's own ssh masters (pgjet ends its own when it exits).
            let key = server.dir.join("client_key").display().to_string();
            let _ = std::process::Command::new("pkill")
                .args(["-f", &key])
                .status();
        }
        step!("{kind:?}: the lock holds");
    }
}

/// A chain on S3: a full, an incr and a diff taken while the cluster changes, verify of all,
/// and the incr and the diff restored (their pieces read from the older backups' objects in
/// the bucket) with the rows each had.
#[test]
fn s3_incremental_chain() {
    let s3 = StoreServer::start(StoreKind::S3, "s3-chain");
    let cluster = Cluster::new(&Pg::v15(), "s3-chain");
    load_dataset(&cluster, DatasetSpec::SMALL);
    let conf = s3.config_file("pgjet.conf", "/repo", &[]);
    let base = store_args(&conf, &cluster);
    pgjet_ok(&cmd("stanza-create", &base, &[]));
    let take = |kind: &str| -> (String, std::collections::BTreeMap<String, String>) {
        let r = pgjet_ok(&cmd(
            "backup",
            &base,
            &[
                "--type",
                kind,
                "--start-fast",
                "--jobs",
                "2",
                "--output",
                "json",
            ],
        ));
        let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
        let label = v["label"].as_str().unwrap().to_string();
        step!(
            "S3 {kind}: {label} in {:.1}s, {} bytes stored",
            r.elapsed.as_secs_f64(),
            v["stored_size"]
        );
        (label, fingerprint(&cluster.server))
    };
    let (full, _) = take("full");
    cluster.psql(
        "postgres",
        "UPDATE pgbench_accounts SET abalance = abalance + 7 WHERE aid % 97 = 0;\n\
         CREATE TABLE after_full AS SELECT i FROM generate_series(1, 5000) i;\n\
         UPDATE ts_t SET v = 'changed' WHERE id % 50 = 0;",
    );
    let (incr, fp_incr) = take("incr");
    assert!(incr.starts_with(&full) && incr.ends_with('I'), "{incr}");
    cluster.psql(
        "postgres",
        "DELETE FROM after_full WHERE i % 2 = 0;\n\
         DROP TABLE small_1;\n\
         UPDATE pgbench_branches SET bbalance = bbalance + 1;",
    );
    let (diff, fp_diff) = take("diff");
    assert!(diff.ends_with('D'), "{diff}");
    let r = pgjet_ok(&cmd("verify", &base, &[]));
    assert!(r.stdout.contains(&incr) && r.stdout.contains(&diff), "{r}");
    for (label, fp) in [(&incr, &fp_incr), (&diff, &fp_diff)] {
        let (a, restored, ts_dir) = restore_cmd(
            &conf,
            &cluster,
            &[
                "--set",
                label,
                "--type",
                "immediate",
                "--target-action",
                "promote",
                "--jobs",
                "2",
            ],
        );
        let r = pgjet_ok(&a);
        step!("S3: restore of {label} in {:.1}s", r.elapsed.as_secs_f64());
        start_and_compare(
            &cluster,
            &format!("restore of {label} from S3"),
            &restored,
            &ts_dir,
            fp,
            false,
        );
    }
}

/// A full on S3 interrupted twice (kill -9, then the repository down) and resumed: the
/// third attempt keeps what the others stored, and the backup restores to its rows.
#[test]
fn s3_resume_after_kill_and_repository_down() {
    let mut s3 = StoreServer::start(StoreKind::S3, "s3-resume");
    let cluster = Cluster::new(&Pg::v15(), "s3-resume");
    load_dataset(&cluster, DatasetSpec::SMALL);
    load_random(&cluster.server, "postgres", "more_rand", 24 << 20);
    let conf = s3.config_file("pgjet.conf", "/repo", &[]);
    let base = store_args(&conf, &cluster);
    pgjet_ok(&cmd("stanza-create", &base, &[]));
    let mut slow = vec!["--type", "full", "--manifest-save-threshold", "2MiB"];
    slow.extend_from_slice(SLOW_BACKUP);
    slow.extend_from_slice(&["--output", "json"]);
    let backups = s3.object_file("/repo", "main/backup");
    let spawn = |n: u32| {
        Background::spawn(
            &pgjet_bin(),
            &cmd("backup", &base, &slow),
            &cluster.root.join(&format!("s3-attempt{n}.pid")),
        )
    };
    // Attempt 1: killed after two saves.
    let (b, label) = wait_for_journal_save(spawn(1), &backups, 1, 2);
    b.signal(libc::SIGKILL);
    let r = b.wait();
    assert!(!r.success(), "{r}");
    step!("S3: {label} killed after two journal saves");
    cluster.psql(
        "postgres",
        "UPDATE more_rand SET b = decode(repeat('ab', 1000), 'hex') WHERE id % 10 = 0;\n\
         CREATE TABLE after_kill AS SELECT i FROM generate_series(1, 5000) i;",
    );
    // Attempt 2: the repository goes down under it; it fails, with the store's error.
    let (b, again) = wait_for_journal_save(spawn(2), &backups, 2, 1);
    assert_eq!(
        again, label,
        "attempt 2 must resume the killed backup's label"
    );
    s3.stop();
    let t = std::time::Instant::now();
    let r = b.wait();
    assert!(
        !r.success(),
        "a backup whose repository went down succeeded?\n{r}"
    );
    step!(
        "S3: attempt 2 failed {} after the server went down",
        secs(t)
    );
    s3.resume();
    cluster.psql("postgres", "DELETE FROM after_kill WHERE i % 2 = 0;");
    // Attempt 3 to the end.
    let r = pgjet_ok(&cmd("backup", &base, &slow));
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["label"], label.as_str(), "{r}");
    assert!(
        v["resumed"] == true && v["reused"].as_u64().unwrap() > 0,
        "attempt 3 kept nothing:\n{r}"
    );
    step!(
        "S3: {label} resumed in {:.1}s, {} bytes kept",
        r.elapsed.as_secs_f64(),
        v["reused"]
    );
    let fp = fingerprint(&cluster.server);
    assert!(
        !s3.objects("/repo")
            .iter()
            .any(|o| o.contains(&format!("{label}/resume/"))),
        "the resume journal must be gone once the backup is complete"
    );
    pgjet_ok(&cmd("verify", &base, &[]));
    let (a, restored, ts_dir) = restore_cmd(&conf, &cluster, &["--jobs", "2"]);
    pgjet_ok(&a);
    let v = pg_verifybackup(cluster.pg(), &restored);
    assert!(
        v.success(),
        "pg_verifybackup of the resumed backup failed:\n{v}"
    );
    start_and_compare(
        &cluster,
        "restore of a resumed backup from S3",
        &restored,
        &ts_dir,
        &fp,
        false,
    );
}
