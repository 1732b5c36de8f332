//! Differential and incremental backups: chains taken while the cluster changes, every
//! member restored and checked (pg_verifybackup, the rows, pgbench's invariant), verify on
//! a chain, and a chain whose reference is gone refused before the target is touched.
//!
//! - PostgreSQL 15, local files: full, incr, incr (under pgbench), diff, incr; between them
//!   relations updated, truncated, dropped, created and extended, a database created and
//!   dropped, a tablespace added; the changed blocks read from the WAL in pg_wal.
//! - PostgreSQL 15 over libpq (pg_read_binary_file): the same chain, the changed blocks
//!   found on the server.
//! - PostgreSQL 15 over the BASE_BACKUP stream: the same chain (everything crosses, only
//!   the changes are stored).
//! - PostgreSQL 18, local files, `summarize_wal = on`: the same chain, the changed blocks
//!   found in the WAL summaries; and with `summarize_wal = off`: found in the WAL in pg_wal.
//! - PostgreSQL 17, local files, `summarize_wal = on` (17 is the first with WAL
//!   summaries); PostgreSQL 16 over libpq.
//! - PostgreSQL 15, a standby with its primary stopped: a full and an incr of the standby,
//!   a full over its BASE_BACKUP stream and an incr over libpq, each restored (the first
//!   full ends on a segment boundary: the last record a switch).

use crate::common::*;
use std::collections::BTreeMap;
use std::fs;
use std::time::Instant;

/// One member of a chain: its label, type, and the rows it must restore.
struct Member {
    label: String,
    kind: &'static str,
    /// The fingerprint when the backup ended; pgbench's tables left out when it ran under
    /// pgbench (the restored invariant is checked instead).
    fp: BTreeMap<String, String>,
    under_load: bool,
    /// The tablespace ts2 existed when it was taken: (OID, location).
    ts2: Option<String>,
}

/// `backup --type <kind>` with `extra`; returns its label (the summary's).
fn backup(c: &Cluster, kind: &str, extra: &[&str]) -> (String, Run) {
    let mut a = vec![
        "--type",
        kind,
        "--start-fast",
        "--jobs",
        "2",
        "--output",
        "json",
    ];
    a.extend_from_slice(extra);
    let r = c.pgjet_cmd("backup", &c.repo, &a).ok();
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim())
        .unwrap_or_else(|e| panic!("backup --output json is not JSON ({e}):\n{r}"));
    let label = v["label"].as_str().expect("label").to_string();
    step!(
        "backup --type {kind}: {label} in {:.1}s, {} stored",
        r.elapsed.as_secs_f64(),
        v["stored_size"]
    );
    (label, r)
}

/// The chain as pgBackRest 2.45's `info --output json` reports it (`--format pgbackrest`):
/// every key and JSON type of pgBackRest's own output, the values of this chain; a stanza
/// that does not exist is pgBackRest's status 1, exit status 0.
fn pgbackrest_info(c: &Cluster, chain: &[Member]) {
    let info = |stanza: &str| {
        let r = pgjet_ok(&args![
            "info",
            "--stanza",
            stanza,
            "--repo-path",
            c.repo.display(),
            "--output",
            "json",
            "--format",
            "pgbackrest",
            "--log-level-console",
            "error"
        ]);
        assert!(
            r.stderr.trim().is_empty(),
            "check_pgbackrest reads stderr too:\n{r}"
        );
        serde_json::from_str::<serde_json::Value>(r.stdout.trim())
            .unwrap_or_else(|e| panic!("not JSON ({e}):\n{r}"))
    };
    let v = info(&c.stanza);
    assert_pgbackrest_shape(
        &v,
        &pgbackrest_info_fixture("pgbackrest-2.45-info-stanza.json"),
    );
    let st = &v[0];
    assert_eq!(st["status"]["code"], 0, "{v:#}");
    assert_eq!(st["status"]["message"], "ok", "{v:#}");
    assert_eq!(
        st["db"][0]["system-id"].to_string(),
        c.system_identifier(),
        "{v:#}"
    );
    let ours = info_backups(&c.repo, &c.stanza);
    let backups = st["backup"].as_array().unwrap();
    assert_eq!(backups.len(), chain.len(), "{v:#}");
    for (b, (t, o)) in backups.iter().zip(chain.iter().zip(&ours)) {
        assert_eq!(b["label"], t.label.as_str(), "oldest first: {v:#}");
        assert_eq!(b["type"], o["type"], "{v:#}");
        assert_eq!(b["info"]["size"], o["size"], "{v:#}");
        assert_eq!(b["info"]["repository"]["delta"], o["stored_size"], "{v:#}");
        assert_eq!(b["lsn"]["start"], o["start_lsn"], "{v:#}");
        assert_eq!(b["error"], false, "{v:#}");
        if o["type"] == "full" {
            assert_eq!(b["info"]["delta"], b["info"]["size"], "{v:#}");
            assert!(b["reference"].is_null() && b["prior"].is_null(), "{v:#}");
        } else {
            assert!(
                b["info"]["delta"].as_u64() < b["info"]["size"].as_u64(),
                "{v:#}"
            );
            assert_eq!(b["prior"], o["reference"], "{v:#}");
            assert!(
                b["reference"].as_array().is_some_and(|r| !r.is_empty()),
                "{v:#}"
            );
        }
        let (start, stop) = (&b["timestamp"]["start"], &b["timestamp"]["stop"]);
        assert!(start.is_i64() && start.as_i64() <= stop.as_i64(), "{v:#}");
    }
    let missing = info("nosuch");
    assert_pgbackrest_shape(
        &missing,
        &pgbackrest_info_fixture("pgbackrest-2.45-info-missing-stanza.json"),
    );
    assert_eq!(missing[0]["status"]["code"], 1, "{missing:#}");
    assert_eq!(missing[0]["status"]["message"], "missing stanza path");
    step!(
        "info --format pgbackrest: pgBackRest 2.45's keys and types, {} backups",
        backups.len()
    );
}

/// pgbench for `tx` transactions per client, 2 clients; panics unless it succeeds.
fn pgbench_tx(s: &Server, tx: u32) {
    let (bin, a) = pgbench_args(s, &args!["-n", "-c", 2, "-t", tx]);
    let r = run_as_postgres(&bin, &a, None);
    assert!(r.success(), "pgbench failed:\n{r}");
}

/// pgbench for `tx` transactions per client, 2 clients, in the background.
fn pgbench_background(c: &Cluster, tx: u32, name: &str) -> Background {
    let (bin, a) = pgbench_args(&c.server, &args!["-n", "-c", 2, "-t", tx]);
    Background::spawn(&bin, &a, &c.root.join(&format!("{name}.pid")))
}

/// The info entry of `label`.
fn info_of(c: &Cluster, label: &str) -> serde_json::Value {
    info_backups(&c.repo, &c.stanza)
        .into_iter()
        .find(|b| b["label"] == label)
        .unwrap_or_else(|| panic!("info does not list {label}"))
}

/// Bytes a backup stored itself (frames counted once), by its files' first directory (the
/// second under base/): where an incr's bytes went.
fn stored_by_dir(c: &Cluster, label: &str) -> BTreeMap<String, u64> {
    let m = read_manifest(&backup_dir(&c.repo, "main", label));
    let mut seen = std::collections::HashSet::new();
    let mut out = BTreeMap::new();
    for f in m["files"].as_array().unwrap() {
        let path = f["path"].as_str().unwrap();
        let mut parts = path.split('/');
        let mut key = parts.next().unwrap_or("").to_string();
        if key == "base" {
            key = path.rsplit_once('/').map_or(path, |x| x.0).to_string();
        }
        for p in f["pieces"].as_array().unwrap() {
            if p.get("backup").is_some_and(|b| !b.is_null()) {
                continue;
            }
            if seen.insert((p["object"].to_string(), p["offset"].as_u64())) {
                *out.entry(key.clone()).or_insert(0) += p["stored_size"].as_u64().unwrap();
            }
        }
    }
    out
}

/// Takes a backup of `kind` and records it in `chain` with the rows it must restore.
fn take(
    c: &Cluster,
    chain: &mut Vec<Member>,
    transport: &str,
    summarize: bool,
    kind: &'static str,
    under_load: bool,
    ts2: Option<String>,
) {
    let (label, r) = backup(c, kind, &["--transport", transport]);
    step!(
        "{label}: stored by directory: {:?}",
        stored_by_dir(c, &label)
    );
    // The cluster does not archive: each backup says what that costs.
    log_line(
        &r,
        "point-in-time recovery past it is impossible",
        "a backup without archiving must warn that there is no PITR past it",
    );
    if summarize && kind != "full" {
        // With WAL summaries only the blocks they list are read.
        let why = format!("{label}: WAL summaries not used");
        step!("{label}: {}", log_line(&r, "WAL summaries from", &why));
    } else if transport == "local" && kind != "full" {
        // Without summaries, locally the WAL kept in pg_wal lists the changed blocks (the
        // diff spans more WAL than this small cluster's data: it reads the pages instead).
        let why = format!("{label}: the WAL did not list the changed blocks");
        let line = if kind == "diff" && r.stderr.contains("is larger than the data") {
            log_line(&r, "is larger than the data", &why)
        } else {
            log_line(&r, "only the blocks changed are read", &why)
        };
        step!("{label}: {line}");
    } else if transport == "libpq" && kind != "full" {
        // Over libpq the server finds the changed blocks: only they cross the wire.
        let why = format!("{label}: no changed-block lookup on the server");
        step!(
            "{label}: {}",
            log_line(&r, "changed since the reference", &why)
        );
    }
    let fp = fingerprint(&c.server);
    let fp = if under_load { quiet_tables(&fp) } else { fp };
    chain.push(Member {
        label,
        kind,
        fp,
        under_load,
        ts2,
    });
}

/// A chain full, incr, incr (under pgbench), diff, incr with `transport`, each member
/// restored and checked; then the chain's middle removed and its tail refused.
/// How much of [`chain_scenario`] a test runs: the whole, or its backups with each member
/// verified and restored. What follows those (delta restores, refused chains, metrics,
/// pgBackRest's info, retention) reads the repository the same way whatever the version
/// and transport that wrote it, so two tests run it, not all seven.
#[derive(PartialEq)]
enum Checks {
    All,
    Backups,
}

fn chain_scenario(pg: Pg, tag: &str, transport: &str, summarize_wal: bool, checks: Checks) {
    let t0 = Instant::now();
    let c = Cluster::new(&pg, tag);
    let s = &c.server;
    if summarize_wal {
        c.summarize_wal();
    } else if transport == "local" {
        // The WAL since each reference stays in pg_wal, for the backup to read the changed
        // blocks from (a stanza that archives WAL has it in the archive).
        c.psql("postgres", "ALTER SYSTEM SET wal_keep_size = '2GB'");
        c.psql("postgres", "SELECT pg_reload_conf()");
    }
    pgbench_init(s, 5);
    load_random(s, "postgres", "rand_t", 12 << 20);
    c.psql(
        "postgres",
        "CREATE TABLE trunc_t AS SELECT i, md5(i::text) v FROM generate_series(1, 50000) i;\n\
         CREATE TABLE drop_t AS SELECT i FROM generate_series(1, 10000) i;\n\
         CREATE TABLE grow_t (id int, v text);\n\
         INSERT INTO grow_t SELECT i, md5(i::text) FROM generate_series(1, 1000) i;\n\
         CHECKPOINT;",
    );
    c.pgjet_cmd("stanza-create", &c.repo, &[]).ok();
    let mut chain: Vec<Member> = Vec::new();
    // An incr with no full in the stanza is a full, and says so.
    let (label, r) = backup(&c, "incr", &["--transport", transport]);
    assert!(
        label.ends_with('F') && r.stderr.contains("taking a full backup instead"),
        "an incr without a full should become a full and say so:\n{r}"
    );
    chain.push(Member {
        label,
        kind: "full",
        fp: fingerprint(&c.server),
        under_load: false,
        ts2: None,
    });
    let full_stored = info_of(&c, &chain[0].label)["stored_size"]
        .as_u64()
        .unwrap();

    // incr 1: scattered updates (pgbench), one random row rewritten, a table extended.
    pgbench_tx(s, 300);
    c.psql(
        "postgres",
        "UPDATE rand_t SET b = decode(repeat('ab', 1000), 'hex') WHERE id = 3;\n\
         INSERT INTO grow_t SELECT i, md5(i::text) FROM generate_series(1001, 200000) i;",
    );
    take(
        &c,
        &mut chain,
        transport,
        summarize_wal,
        "incr",
        false,
        None,
    );

    // incr 2, under pgbench: a table truncated, one dropped, one created, a database created.
    c.psql(
        "postgres",
        "TRUNCATE trunc_t;\n\
         INSERT INTO trunc_t SELECT i, 'after truncate ' || i FROM generate_series(1, 100) i;\n\
         DROP TABLE drop_t;\n\
         CREATE TABLE new_t AS SELECT i, md5(i::text) v FROM generate_series(1, 30000) i;\n\
         CREATE DATABASE db2;",
    );
    c.psql(
        "db2",
        "CREATE TABLE in_db2 AS SELECT i FROM generate_series(1, 5000) i;",
    );
    let bench = pgbench_background(&c, 1500, "bench-incr2");
    take(&c, &mut chain, transport, summarize_wal, "incr", true, None);
    let r = bench.wait();
    assert!(r.success(), "pgbench under the backup failed:\n{r}");

    // diff (against the full): rows deleted and vacuumed, the database dropped, a
    // tablespace added with a table in it.
    let ts2 = c.root.join("ts2");
    mkdir_pg(&ts2, 0o700);
    c.psql(
        "postgres",
        &format!(
            "DELETE FROM new_t WHERE i % 3 = 0;\n\
             VACUUM new_t;\n\
             DROP DATABASE db2;\n\
             CREATE TABLESPACE ts2 LOCATION '{}';\n\
             CREATE TABLE in_ts2 TABLESPACE ts2 AS SELECT i, md5(i::text) v FROM generate_series(1, 20000) i;",
            ts2.display()
        ),
    );
    let ts2_oid = c.tablespace_oid("ts2");
    take(
        &c,
        &mut chain,
        transport,
        summarize_wal,
        "diff",
        false,
        Some(ts2_oid.clone()),
    );

    // incr on the diff: a relation truncated to fewer segments' worth, then extended.
    c.psql(
        "postgres",
        "DELETE FROM grow_t WHERE id > 500;\n\
         VACUUM grow_t;\n\
         INSERT INTO grow_t SELECT i, 'again ' || i FROM generate_series(501, 800) i;\n\
         UPDATE in_ts2 SET v = 'changed' WHERE i % 100 = 0;",
    );
    take(
        &c,
        &mut chain,
        transport,
        summarize_wal,
        "incr",
        false,
        Some(ts2_oid.clone()),
    );

    // The manifests: each member names its reference, and stores little.
    let refs: Vec<(usize, usize)> = vec![(1, 0), (2, 1), (3, 0), (4, 3)];
    for (m, r) in refs {
        let info = info_of(&c, &chain[m].label);
        assert_eq!(info["type"], chain[m].kind, "{}", info);
        assert_eq!(info["reference"], chain[r].label.as_str(), "{}", info);
        // The WAL a backup holds is what the server wrote while it ran (autovacuum cleaning
        // up after the previous step writes full-page images after the checkpoint: 9.7 MB
        // of it seen in the last member once), not the changed blocks: left out here.
        let wal = stored_by_dir(&c, &chain[m].label)
            .get("pg_wal")
            .copied()
            .unwrap_or(0);
        let stored = info["stored_size"].as_u64().unwrap() - wal;
        // The members add new rows too; the last one changes grow_t's pages after a DELETE
        // and VACUUM: 185 to 1952 blocks seen, depending on whether VACUUM could truncate its
        // emptied tail, so up to 13 MB of the full's 20 (seen twice in a row here, as blocks
        // or as the WAL that wrote them): the bound is the same as the others'.
        let most = full_stored * 9 / 10;
        assert!(
            stored < most,
            "{} stored {stored} bytes besides its WAL ({wal}), the full {full_stored}: changed blocks only expected",
            chain[m].label
        );
    }
    // The incr after the diff takes blocks from both the diff and the full.
    let last = read_manifest(&backup_dir(&c.repo, "main", &chain[4].label));
    let named: std::collections::BTreeSet<String> = last["files"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f["pieces"].as_array().unwrap().iter())
        .filter_map(|p| p["backup"].as_str().map(str::to_string))
        .collect();
    assert!(
        named.contains(&chain[0].label) && named.contains(&chain[3].label),
        "the last incr should name the full and the diff: {named:?}"
    );

    // Every member verifies and restores to its own rows.
    for m in &chain {
        pgjet_ok(&verify_args(&c.repo, &m.label));
        let dir = c.new_dir(&format!("restore-{}", m.label));
        let mut a = restore_args_no_ts(&c.repo, &dir, &m.label);
        let ts_dir = c.root.join(&format!("ts2-{}", m.label));
        if let Some(oid) = &m.ts2 {
            mkdir_pg(&ts_dir, 0o700);
            a.extend(args![
                "--tablespace-map",
                format!("{oid}={}", ts_dir.display())
            ]);
        }
        let r = pgjet_ok(&a);
        let what = format!("{} {}", m.kind, m.label);
        step!("{what}: restored in {:.1}s", r.elapsed.as_secs_f64());
        let server = start_restored(&c, &what, &dir);
        let fp = fingerprint(&server);
        let fp = if m.under_load { quiet_tables(&fp) } else { fp };
        assert_same_fingerprint(&what, &m.fp, &fp);
        assert_pgbench_invariant(&what, &server);
        if std::ptr::eq(m, chain.last().unwrap()) {
            let r = server.amcheck();
            assert!(r.success(), "{what}: pg_amcheck failed:\n{r}");
        }
        drop(server);
        let _ = fs::remove_dir_all(&dir);
        let _ = fs::remove_dir_all(&ts_dir);
    }

    if checks == Checks::Backups {
        step!("{tag}: chain scenario (backups) done in {}", secs(t0));
        return;
    }

    // restore --delta of the last incr onto a restore of the full that ran for a while.
    let dir = c.new_dir("restore-delta");
    pgjet_ok(&restore_args_no_ts(&c.repo, &dir, &chain[0].label));
    let mut old = start_restored(&c, "full before the delta", &dir);
    old.psql(
        "postgres",
        "UPDATE grow_t SET v = 'diverged' WHERE id < 100; CHECKPOINT;",
    );
    old.stop();
    let last = chain.last().unwrap();
    let ts_dir = c.root.join("ts2-delta");
    mkdir_pg(&ts_dir, 0o700);
    let mut a = restore_args_no_ts(&c.repo, &dir, &last.label);
    a.extend(args![
        "--delta",
        "--tablespace-map",
        format!("{}={}", last.ts2.as_ref().unwrap(), ts_dir.display())
    ]);
    let r = pgjet_ok(&a);
    step!(
        "delta restore of {} in {:.1}s",
        last.label,
        r.elapsed.as_secs_f64()
    );
    let server = start_restored(&c, "delta restore of the last incr", &dir);
    assert_same_fingerprint(
        "delta restore of the last incr",
        &last.fp,
        &fingerprint(&server),
    );
    drop(server);
    // The same incr again, twice: a delta restore writes only what differs, slices of
    // older backups' frames included (compared once read back). The second time nothing
    // changed since: only pg_control and the files the finish rewrites are written.
    for round in ["after the cluster ran", "onto itself"] {
        let r = pgjet_ok(&a);
        let plan = log_line(&r, "pieces already in place", "no delta plan in the log");
        let num = |s: &str, after: &str| -> usize {
            s.split(after)
                .next()
                .unwrap_or("")
                .split_whitespace()
                .last()
                .unwrap_or("0")
                .parse()
                .unwrap_or(0)
        };
        let (kept, all) = (num(plan, " of "), num(plan, " pieces already"));
        let equal = r
            .stderr
            .lines()
            .find(|l| l.contains("found equal to the target's bytes"))
            .map(|l| num(l, " more piece(s)"))
            .unwrap_or(0);
        let written = all - kept - equal;
        step!("delta restore of {} {round}: {all} pieces, {kept} kept by hash, {equal} equal once compared, {written} written", last.label);
        if round == "onto itself" {
            assert!(
                written <= 3,
                "a delta restore onto an unchanged copy wrote {written} of {all} pieces:\n{r}"
            );
        }
    }
    let server = start_restored(&c, "delta restore of the last incr, again", &dir);
    assert_same_fingerprint(
        "delta restore of the last incr, again",
        &last.fp,
        &fingerprint(&server),
    );
    drop(server);
    let _ = fs::remove_dir_all(&dir);
    let _ = fs::remove_dir_all(&ts_dir);

    // The diff's summary gone (as if expired by hand): its incr is refused by restore and
    // verify, naming it, and the target stays untouched.
    let diff_dir = backup_dir(&c.repo, "main", &chain[3].label);
    fs::rename(
        diff_dir.join("summary.json"),
        c.root.join("diff-summary.json"),
    )
    .unwrap();
    let dir = c.new_dir("restore-orphan");
    fs::write(dir.join("keep-me"), b"x").unwrap();
    chown_pg_recursive(&dir);
    let r = pgjet(&restore_args_no_ts(&c.repo, &dir, &chain[4].label)).fails_with(&chain[3].label);
    assert!(
        r.text_lower().contains("depends on"),
        "restore of an incr without its reference should say what it depends on:\n{r}"
    );
    assert_eq!(
        fs::read_dir(&dir).unwrap().count(),
        1,
        "a refused restore must not touch the target"
    );
    pgjet(&verify_args(&c.repo, &chain[4].label)).fails_with(&chain[3].label);
    fs::rename(
        c.root.join("diff-summary.json"),
        diff_dir.join("summary.json"),
    )
    .unwrap();

    // A hostile chain: the last incr's summary naming itself (a cycle), then the diff
    // claiming another stanza. Both refused by restore and verify; the target untouched.
    let last_dir = backup_dir(&c.repo, "main", &chain[4].label);
    let edit = |dir: &std::path::Path, f: &dyn Fn(&mut serde_json::Value)| -> Vec<u8> {
        let p = dir.join("summary.json");
        let before = fs::read(&p).unwrap();
        let mut v: serde_json::Value = serde_json::from_slice(&before).unwrap();
        f(&mut v);
        fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
        before
    };
    let me = chain[4].label.clone();
    let saved = edit(&last_dir, &|v| {
        v["references"]
            .as_array_mut()
            .unwrap()
            .push(me.clone().into());
    });
    pgjet(&restore_args_no_ts(&c.repo, &dir, &chain[4].label)).fails_with(&chain[4].label);
    pgjet(&verify_args(&c.repo, &chain[4].label)).fails_with(&chain[4].label);
    fs::write(last_dir.join("summary.json"), saved).unwrap();
    let saved = edit(&diff_dir, &|v| v["stanza"] = "other".into());
    pgjet(&restore_args_no_ts(&c.repo, &dir, &chain[4].label)).fails_with(&chain[3].label);
    fs::write(diff_dir.join("summary.json"), saved).unwrap();
    assert_eq!(
        fs::read_dir(&dir).unwrap().count(),
        1,
        "a refused restore must not touch the target"
    );
    pgjet_ok(&verify_args(&c.repo, &chain[4].label));

    // The chain as metrics: one full, one diff, three incr; promtool accepts them.
    let m = checked_metrics(&c.repo, &c.stanza, c.server.data.as_path());
    for (t, n) in [("full", 1.0), ("diff", 1.0), ("incr", 3.0)] {
        let sample = format!(
            "pgjet_backups{{stanza=\"{}\",repo=\"1\",type=\"{t}\"}}",
            c.stanza
        );
        assert_eq!(metric(&m, &sample), Some(n), "{sample} in\n{m}");
    }
    let stored = format!(
        "pgjet_backup_last_stored_bytes{{stanza=\"{}\",repo=\"1\",type=\"incr\"}}",
        c.stanza
    );
    assert_eq!(
        metric(&m, &stored),
        Some(
            info_of(&c, &chain[4].label)["stored_size"]
                .as_f64()
                .unwrap()
        ),
        "{m}"
    );
    assert!(m.contains("pgjet_archive_push_queue_segments{"), "{m}");
    pgbackrest_info(&c, &chain);
    pgjet(
        &verify_args(&c.repo, &chain[4].label)
            .into_iter()
            .chain(args!["--output", "prometheus"])
            .collect::<Vec<_>>(),
    )
    .fails_with("--output prometheus applies to info only");

    // A second full, then retention-full 1: the first full goes with its whole chain.
    let (f2, _) = backup(&c, "full", &["--transport", transport, "--no-expire"]);
    c.pgjet_cmd("expire", &c.repo, &["--retention-full", "1"])
        .ok();
    let left: Vec<String> = info_backups(&c.repo, &c.stanza)
        .iter()
        .map(|b| b["label"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        left,
        vec![f2],
        "retention-full 1 keeps the newest full alone"
    );
    step!("{tag}: chain scenario done in {}", secs(t0));
}

#[test]
fn chain_pg15_local() {
    chain_scenario(Pg::v15(), "incr15-local", "local", false, Checks::All);
}

#[test]
fn chain_pg15_libpq() {
    chain_scenario(Pg::v15(), "incr15-libpq", "libpq", false, Checks::Backups);
}

#[test]
fn chain_pg18_local() {
    chain_scenario(Pg::v18(), "incr18-local", "local", true, Checks::All);
}

#[test]
fn chain_pg17_local() {
    chain_scenario(Pg::v17(), "incr17-local", "local", true, Checks::Backups);
}

#[test]
fn chain_pg16_libpq() {
    chain_scenario(Pg::v16(), "incr16-libpq", "libpq", false, Checks::Backups);
}

#[test]
fn chain_pg18_local_without_summaries() {
    chain_scenario(Pg::v18(), "incr18-nosum", "local", false, Checks::Backups);
}

/// Backups of a standby with its primary stopped (never contacted): a full, then, after
/// changes made on the primary and replayed, an incr, a full over the standby's BASE_BACKUP
/// stream, and after more changes an incr over libpq; each restored holds the standby's rows.
#[test]
fn standby_backups_without_the_primary() {
    let t0 = Instant::now();
    let pg = Pg::v15();
    let mut c = Cluster::new(&pg, "incr15-standby");
    pgbench_init(&c.server, 2);
    c.psql(
        "postgres",
        "CREATE TABLE t AS SELECT i, md5(i::text) v FROM generate_series(1, 20000) i",
    );
    let b_data = c.new_dir("standby");
    let (_, b) = replica_create_started(&pg, &c.server, &b_data, free_port(), &[], "standby");
    let repo = c.repo.clone();
    let on_b = |cmd: &str, extra: &[&str]| -> Run {
        let mut a = args![
            cmd,
            "--stanza",
            "main",
            "--repo-path",
            repo.display(),
            "--pg-path",
            b_data.display(),
            "--pg-port",
            b.port,
            "--pg-socket-path",
            b.sock.display()
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        pgjet(&a)
    };
    let (a_data, a_port, a_sock) = (c.data().to_path_buf(), c.port(), c.sock().to_path_buf());
    let a_log = c.root.join("a-again.log");
    // Waits until B has replayed everything A wrote, then stops A.
    let caught_up_then_stop_a = |c: &mut Cluster| {
        let lsn = c.psql("postgres", "SELECT pg_current_wal_lsn()");
        let ok = wait_for(std::time::Duration::from_secs(60), || {
            (b.psql(
                "postgres",
                &format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'"),
            ) == "t")
                .then_some(())
        });
        assert!(ok.is_some(), "the standby did not catch up");
        c.server.stop();
    };

    // `backup --type kind [--transport t]` of B: its label and run.
    let backup_b = |kind: &str, transport: Option<&str>| -> (String, Run) {
        let mut a = vec!["--type", kind, "--start-fast", "--output", "json"];
        if let Some(t) = transport {
            a.extend(["--transport", t]);
        }
        let r = on_b("backup", &a).ok();
        let v: serde_json::Value = serde_json::from_str(r.stdout.trim())
            .unwrap_or_else(|e| panic!("backup --output json is not JSON ({e}):\n{r}"));
        (v["label"].as_str().unwrap().to_string(), r)
    };
    // Starts A again. The stopped server's handle would stop the new one when dropped (by
    // the data directory's PID): it is forgotten instead.
    let start_a = |c: &mut Cluster| {
        let again = Server::start(&pg, &a_data, a_port, &a_sock, &a_log);
        std::mem::forget(std::mem::replace(&mut c.server, again));
    };

    caught_up_then_stop_a(&mut c);
    on_b("stanza-create", &[]).ok();
    let (_, full) = backup_b("full", None);
    let fp_full = fingerprint(&b);
    step!("full of the standby in {:.1}s", full.elapsed.as_secs_f64());

    // Changes on A, replayed on B; A stopped again before the incr.
    start_a(&mut c);
    c.psql(
        "postgres",
        "UPDATE t SET v = 'changed' WHERE i % 50 = 0;\n\
         CREATE TABLE t2 AS SELECT i FROM generate_series(1, 5000) i;",
    );
    pgbench_tx(&c.server, 200);
    caught_up_then_stop_a(&mut c);
    let (label, _) = backup_b("incr", None);
    assert!(label.ends_with('I'), "an incr of the standby: {label}");
    let fp_incr = fingerprint(&b);
    assert_ne!(
        fp_full, fp_incr,
        "the changes must have reached the standby"
    );

    // A full of the standby over its BASE_BACKUP stream too.
    let (stream_label, _) = backup_b("full", Some("basebackup"));

    // More changes on A, replayed; A stopped; an incr of the standby over libpq (the standby
    // serves the files and finds the changed blocks), against the stream full.
    start_a(&mut c);
    c.psql(
        "postgres",
        "UPDATE t SET v = 'again' WHERE i % 70 = 0;\n\
         DROP TABLE t2;",
    );
    pgbench_tx(&c.server, 100);
    caught_up_then_stop_a(&mut c);
    let (libpq_label, libpq) = backup_b("incr", Some("libpq"));
    assert!(
        libpq_label.ends_with('I'),
        "an incr of the standby over libpq: {libpq_label}"
    );
    let why = format!("{libpq_label}: no changed-block lookup on the standby");
    step!(
        "{libpq_label}: {}",
        log_line(&libpq, "changed since the reference", &why)
    );
    let fp_libpq = fingerprint(&b);

    let full_label = label.split('_').next().unwrap().to_string();
    for (set, fp) in [
        (full_label, &fp_full),
        (label, &fp_incr),
        (stream_label, &fp_incr),
        (libpq_label, &fp_libpq),
    ] {
        let dir = c.new_dir(&format!("restore-{set}"));
        pgjet_ok(&restore_args_no_ts(&c.repo, &dir, &set));
        let server = start_restored(&c, &format!("standby backup {set}"), &dir);
        assert_same_fingerprint(&set, fp, &fingerprint(&server));
        assert_pgbench_invariant(&set, &server);
    }
    step!("standby backups done in {}", secs(t0));
}

#[test]
fn chain_pg15_stream() {
    chain_scenario(
        Pg::v15(),
        "incr15-stream",
        "basebackup",
        false,
        Checks::Backups,
    );
}
