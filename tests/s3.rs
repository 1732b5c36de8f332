//! Repositories on S3: a real S3 server (versitygw, tests/common/s3.rs) on 127.0.0.1 over
//! TLS verified against a test CA, configured the pgBackRest way (a config file with
//! `repo1-type=s3`, `repo1-s3-*`, `repo1-storage-*`).
//!
//! - PostgreSQL 15: stanza-create, a full backup, info, verify, restore (pg_verifybackup,
//!   start, same rows), all through S3; the objects are where the repository format says.
//! - Refusals: a wrong secret, a missing bucket and an untrusted certificate fail at once
//!   with their own message and exit code; a backup while another holds the stanza's lock
//!   (a conditional create on S3) fails naming the holder, and succeeds once it lets go.
mod common;

use common::s3::*;
use common::*;
use std::path::Path;
use std::time::Duration;

/// `--config C --stanza main --pg-path D --pg-port P --pg-socket-path S` for `cluster`.
fn s3_args(conf: &Path, cluster: &Cluster) -> Vec<String> {
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

#[test]
fn pg15_s3_backup_info_verify_restore() {
    let s3 = S3Server::start("pg15-s3");
    let cluster = Cluster::new(&Pg::v15(), "pg15-s3");
    load_dataset(&cluster, DatasetSpec::SMALL);
    let conf = s3.config_file("pgjet.conf", "/repo", &[]);
    let base = s3_args(&conf, &cluster);

    pgjet_ok(&cmd("stanza-create", &base, &[]));
    let r = pgjet_ok(&cmd(
        "backup",
        &base,
        &["--type", "full", "--start-fast", "--jobs", "2"],
    ));
    step!("full backup to S3 in {:.1}s", r.elapsed.as_secs_f64());
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
    step!("verify from S3 in {:.1}s", r.elapsed.as_secs_f64());
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
    step!("restore from S3 in {:.1}s", r.elapsed.as_secs_f64());
    start_and_compare(
        &cluster,
        "restore from S3",
        &restored,
        &ts_dir,
        &source_fp,
        false,
    );
}

#[test]
fn s3_refusals_name_their_cause() {
    let s3 = S3Server::start("s3-refusals");
    let cluster = Cluster::new(&Pg::v15(), "s3-refusals");
    let good = s3.config_file("good.conf", "/r", &[]);
    let base = s3_args(&good, &cluster);
    pgjet_ok(&cmd("stanza-create", &base, &[]));

    // A wrong secret: refused, exit 4, the hint names the credentials.
    let bad = s3.config_file("bad-secret.conf", "/r", &[("repo1-s3-key-secret", "wrong")]);
    let r = pgjet(&cmd("info", &s3_args(&bad, &cluster), &[]));
    assert_eq!(r.status.code(), Some(4), "wrong secret:\n{r}");
    assert!(r.stderr.contains("repo-s3-key"), "wrong secret, hint:\n{r}");
    step!("wrong secret: {}", r.stderr.trim());

    // A missing bucket: exit 4, the hint names the bucket.
    let nob = s3.config_file(
        "no-bucket.conf",
        "/r",
        &[("repo1-s3-bucket", "nosuchbucket")],
    );
    let r = pgjet(&cmd("info", &s3_args(&nob, &cluster), &[]));
    assert_eq!(r.status.code(), Some(4), "missing bucket:\n{r}");
    assert!(r.text_lower().contains("bucket"), "missing bucket:\n{r}");
    step!("missing bucket: {}", r.stderr.trim());

    // TLS verified against the system's CAs only: the test CA is unknown, so it fails (and
    // with verification off, it works).
    let sys = s3.config_file("system-ca.conf", "/r", &[("repo1-storage-ca-file", "")]);
    let r = pgjet(&cmd("info", &s3_args(&sys, &cluster), &[]));
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
    pgjet_ok(&cmd("info", &s3_args(&nover, &cluster), &[]));

    // Another pgjet holds the stanza's lock (this test process, through the library): the
    // backup fails naming it (exit 6) and leaves no backup behind; once the holder lets go,
    // the next backup succeeds.
    let cfg = pgjet::config::RepoConfig::S3 {
        bucket: S3_BUCKET.into(),
        endpoint: format!("https://127.0.0.1:{}", s3.port),
        region: "us-east-1".into(),
        key: S3_KEY.into(),
        key_secret: S3_SECRET.into(),
        token: None,
        uri_style: pgjet::config::UriStyle::Path,
        path: "/r".into(),
        tls: pgjet::config::StorageTls {
            verify: true,
            ca_file: Some(s3.ca.clone()),
        },
    };
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
