//! Repositories on object stores, each a real server on 127.0.0.1 started by the test
//! (tests/common/stores.rs): S3 (versitygw, TLS verified against a test CA), GCS
//! (fake-gcs-server, TLS), Azure Blob (Azurite) and SFTP (OpenSSH), configured the pgBackRest
//! way (a config file with `repo1-type`, `repo1-s3-*`, `repo1-storage-*`, ...).
//!
//! - For each store, with PostgreSQL 15: stanza-create, a full backup, info, verify, check,
//!   restore (pg_verifybackup, start, same rows); the objects are where the repository
//!   format says and the backup lock is gone afterwards.
//! - Refusals (S3): a wrong secret, a missing bucket and an untrusted certificate fail at once
//!   with their own message and exit code; a backup while another holds the stanza's lock
//!   (a conditional create on S3) fails naming the holder, and succeeds once it lets go.
mod common;

use common::stores::*;
use common::*;
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

fn cmd(name: &str, base: &[String], extra: &[&str]) -> Vec<String> {
    let mut a = vec![name.to_string()];
    a.extend(base.iter().cloned());
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// The scenario every store runs (see the module's doc).
fn store_scenario(kind: StoreKind) {
    let tag = format!("{kind:?}").to_lowercase();
    let s3 = StoreServer::start(kind, &tag);
    let cluster = Cluster::new(&Pg::v15(), &tag);
    load_dataset(&cluster, DatasetSpec::SMALL);
    let conf = s3.config_file("pgjet.conf", "/repo", &[]);
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
        format!("main/backup/{label}/manifest.json"),
        format!("main/backup/{label}/data/000001"),
    ] {
        assert!(
            objects.contains(&want),
            "{want} is not in the bucket; objects: {objects:?}"
        );
    }
    assert!(
        !objects.iter().any(|o| o.contains("lock/")),
        "the backup lock must be gone after the backup: {objects:?}"
    );

    let r = pgjet_ok(&cmd("verify", &base, &[]));
    step!("{kind:?}: verify in {:.1}s", r.elapsed.as_secs_f64());
    pgjet_ok(&cmd("check", &base, &[]));

    let restored = cluster.new_dir("restored");
    let ts_dir = cluster.new_dir("restored-ts1");
    let a = args![
        "restore",
        "--config",
        conf.display(),
        "--stanza",
        "main",
        "--pg-path",
        restored.display(),
        "--set",
        label,
        "--type",
        "immediate",
        "--jobs",
        2,
        "--tablespace-map",
        format!("ts1={}", ts_dir.display())
    ];
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
}

#[test]
fn s3_backup_info_verify_restore() {
    store_scenario(StoreKind::S3);
}

#[test]
fn gcs_backup_info_verify_restore() {
    store_scenario(StoreKind::Gcs);
}

#[test]
fn azure_backup_info_verify_restore() {
    store_scenario(StoreKind::Azure);
}

#[test]
fn sftp_backup_info_verify_restore() {
    store_scenario(StoreKind::Sftp);
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
    let store = pgjet::storage::open(&cfg).expect("open the S3 repository from the library");
    let lock = pgjet::repo::StanzaLock::acquire(store.clone(), "main", "backup").unwrap();
    assert!(s3
        .objects("/r")
        .iter()
        .any(|o| o == "main/lock/backup.json"));
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
    assert!(!s3.objects("/r").iter().any(|o| o.contains("lock/")));
    pgjet_ok(&cmd(
        "backup",
        &base,
        &["--type", "full", "--start-fast", "--jobs", "2"],
    ));
}
