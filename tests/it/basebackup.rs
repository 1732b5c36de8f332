//! The `BASE_BACKUP` transport (crates/pgjet-core/src/remote/replication.rs, crates/pgjet-core/src/remote/basebackup.rs,
//! `replica-create --transport basebackup`) against PostgreSQL 15 over loopback TCP:
//! - the replication connection and the stream decoder on their own: IDENTIFY_SYSTEM, then
//!   BASE_BACKUP with gzip decoded and every file checked against the server's manifest;
//! - replica-create with lz4 and a second tablespace mapped elsewhere, a table with a
//!   non-ASCII name: pg_verifybackup passes on the new directory, the standby starts, holds
//!   the same rows and streams from its slot;
//! - refusals: a role without REPLICATION (the error names `ALTER ROLE ... REPLICATION`,
//!   nothing is left behind);
//! - Patroni's call with a role that has REPLICATION only: the stream, then a delta over it
//!   into the kept copy, a directory that proves nothing replaced.

use crate::common::*;
use pgjet_core::remote::basebackup::{check_manifest, run_stream, BaseBackupCommand, WireCodec};
use pgjet_core::remote::replication::ReplConn;
use std::fs;
use std::time::Duration;

/// A PostgreSQL 15 cluster that also listens on 127.0.0.1 (initdb -A trust allows
/// replication connections from there), with a second tablespace and a table whose name is
/// not ASCII.
fn loopback_cluster(tag: &str) -> Cluster {
    let cluster = Cluster::new(&Pg::v15(), tag);
    cluster.listen_on_loopback();
    mkdir_pg(&cluster.ts1, 0o700);
    cluster.psql(
        "postgres",
        &format!(
            "CREATE TABLESPACE ts1 LOCATION '{}';\n\
             CREATE TABLE ts_t (id int PRIMARY KEY, v text) TABLESPACE ts1;\n\
             INSERT INTO ts_t SELECT i, repeat(md5(i::text), 8) FROM generate_series(1, 30000) i;\n\
             CREATE TABLE \"größe_ü\" (id int PRIMARY KEY, v text);\n\
             INSERT INTO \"größe_ü\" SELECT i, 'zeile ' || i FROM generate_series(1, 5000) i;\n\
             CHECKPOINT;",
            cluster.ts1.display()
        ),
    );
    cluster
}

fn tcp_conninfo(cluster: &Cluster, user: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user={user} dbname=postgres sslmode=disable",
        cluster.port()
    )
}

/// The connection and the decoder alone, in this process: IDENTIFY_SYSTEM gives the
/// cluster's system identifier; BASE_BACKUP with gzip arrives as two archives (the
/// tablespace's, then base.tar) and every file matches the server's manifest.
#[test]
fn pg15_stream_decodes_against_manifest() {
    let cluster = loopback_cluster("bb-decode");
    let target =
        pgjet_core::pg::session::parse_conninfo(&tcp_conninfo(&cluster, "postgres")).unwrap();
    let mut conn = ReplConn::connect(&target).expect("replication connection");
    let (sysid, tli, _) = conn.identify_system().unwrap();
    assert_eq!(sysid.to_string(), cluster.system_identifier());
    assert_eq!(tli, 1);
    let cmd = BaseBackupCommand {
        label: "pgjet test".into(),
        fast: true,
        wal: false,
        max_rate: None,
        codec: WireCodec::Gzip,
        level: Some(1),
        workers: None,
        tablespace_map: true,
        incremental: false,
    };
    let mut sink = CountingSink::default();
    let out = run_stream(&mut conn, &cmd, &mut sink).expect("BASE_BACKUP stream");
    conn.close();
    let d = &out.decoded;
    check_manifest(&d.received, d.manifest.as_ref(), "test").expect("files match the manifest");
    assert_eq!(out.tablespaces.len(), 1, "{:?}", out.tablespaces);
    let oid: u32 = cluster.tablespace_oid("ts1").parse().unwrap();
    assert_eq!(
        sink.archives.iter().map(|a| a.1).collect::<Vec<_>>(),
        vec![Some(oid), None],
        "{:?}",
        sink.archives
    );
    assert!(d.backup_label.is_some() && d.control.is_some() && d.tablespace_map.is_some());
    assert!(out.end_lsn > out.start_lsn);
    assert!(
        d.wire_bytes * 2 < d.logical_bytes,
        "gzip should at least halve this data: {} on the wire for {}",
        d.wire_bytes,
        d.logical_bytes
    );
    step!(
        "{} files, {} bytes in {} bytes on the wire",
        sink.files,
        d.logical_bytes,
        d.wire_bytes
    );
}

/// replica-create over the stream (lz4), with ts1 mapped to a new directory: pg_verifybackup
/// passes, the standby starts, holds the same rows and streams from slot s1.
#[test]
fn pg15_replica_create_basebackup_lz4() {
    let cluster = loopback_cluster("bb-replica");
    let data = cluster.new_dir("standby");
    let ts_new = cluster.new_dir("ts1-standby");
    let port = free_port();
    let r = pgjet_ok(&args![
        "replica-create",
        "--transport",
        "basebackup",
        "--network-compress",
        "lz4",
        "--source",
        tcp_conninfo(&cluster, "postgres"),
        "--pg-path",
        data.display(),
        "--pg-port",
        port,
        "--slot",
        "s1",
        "--start-fast",
        "--tablespace-map",
        format!("ts1={}", ts_new.display()),
        "--output",
        "json"
    ]);
    let summary: serde_json::Value = serde_json::from_str(r.stdout.trim())
        .unwrap_or_else(|e| panic!("--output json is not JSON ({e}):\n{r}"));
    assert_eq!(summary["transport"], "basebackup", "{r}");
    assert_eq!(summary["network_compress"], "lz4", "{r}");
    let wire = summary["wire_bytes"].as_u64().unwrap();
    let size = summary["size"].as_u64().unwrap();
    assert!(wire < size, "lz4 sent {wire} bytes for {size}");
    let v = pg_verifybackup(cluster.pg(), &data);
    assert!(v.success(), "pg_verifybackup on the new standby:\n{v}");
    assert!(
        fs::read_dir(&ts_new).unwrap().next().is_some(),
        "ts1's files must be in the mapped directory"
    );
    let link = fs::read_link(data.join("pg_tblspc").join(cluster.tablespace_oid("ts1"))).unwrap();
    assert_eq!(link, ts_new);

    let standby = cluster.start_other(&data, port);
    cluster.psql(
        "postgres",
        "INSERT INTO \"größe_ü\" SELECT i, 'neu' FROM generate_series(5001, 5100) i",
    );
    let caught_up = wait_for(Duration::from_secs(60), || {
        (standby.psql("postgres", "SELECT count(*) FROM \"größe_ü\"") == "5100").then_some(())
    });
    assert!(
        caught_up.is_some(),
        "rows written on the primary never reached the standby"
    );
    assert_eq!(standby.psql("postgres", "SELECT pg_is_in_recovery()"), "t");
    let streaming = wait_for(Duration::from_secs(30), || {
        let s = cluster.psql(
            "postgres",
            "SELECT count(*) FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = 's1' AND r.state = 'streaming'",
        );
        (s == "1").then_some(())
    });
    assert!(streaming.is_some(), "the standby must stream from slot s1");
    assert_same_fingerprint(
        "standby made over the BASE_BACKUP stream",
        &fingerprint(&cluster.server),
        &fingerprint(&standby),
    );
    assert_eq!(
        cluster.psql(
            "postgres",
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'pgjet_%'"
        ),
        "0",
        "the temporary slot must be gone"
    );
}

/// A role without REPLICATION gets an error naming `ALTER ROLE ... REPLICATION`, and nothing
/// is left (no slot, no pg_control).
#[test]
fn pg15_basebackup_refusals() {
    let cluster = Cluster::new(&Pg::v15(), "bb-refuse");
    cluster.listen_on_loopback();
    cluster.psql(
        "postgres",
        "CREATE ROLE plain LOGIN; GRANT pg_read_all_settings TO plain; GRANT EXECUTE ON FUNCTION pg_control_system() TO plain;",
    );
    let data = cluster.root.join("standby");
    let (source, dir) = (tcp_conninfo(&cluster, "plain"), data.display().to_string());
    let r = pgjet(&[
        "replica-create",
        "--transport",
        "basebackup",
        "--source",
        &source,
        "--pg-path",
        &dir,
        "--slot",
        "s2",
    ]);
    assert!(
        !r.success(),
        "a role without REPLICATION must be refused:\n{r}"
    );
    let text = r.text_lower();
    assert!(
        text.contains("alter role plain replication"),
        "the error must name the fix:\n{r}"
    );
    assert!(!data.join("global/pg_control").exists());
    assert_no_slot_left(&cluster, "after the failure");
}

/// Patroni's call with Patroni's role (`CREATE ROLE replicator WITH REPLICATION LOGIN`, no
/// grant): `check` says the stream is what it may run; replica-create (auto) takes the
/// stream, then re-syncs the kept copy in place (`keep_data`) writing only what differs,
/// with no standby settings of its own; the standby starts and holds the primary's rows; a
/// copy of that standby cascades from it. A kept directory that proves nothing is replaced
/// under Patroni. SIGTERM mid-copy ends pgjet within seconds, leaving nothing. No slot is
/// left.
#[test]
fn pg15_replication_only_role_as_patroni_calls() {
    // No tablespace: on one host the standby's would be the primary's own directory.
    let cluster = Cluster::new(&Pg::v15(), "bb-reponly");
    cluster.listen_on_loopback();
    cluster.psql(
        "postgres",
        "CREATE ROLE replicator WITH REPLICATION LOGIN; \
         CREATE TABLE ts_t (id int PRIMARY KEY, v text); \
         INSERT INTO ts_t SELECT i, repeat(md5(i::text), 8) FROM generate_series(1, 30000) i;",
    );
    let source = tcp_conninfo(&cluster, "replicator");
    let r = pgjet_ok(&args!["check", "--source", source]);
    assert!(
        r.stdout
            .contains("--transport basebackup: the role has what it needs")
            && r.stdout
                .contains("note: --transport libpq: EXECUTE on pg_read_binary_file")
            && !r.stdout.contains("MISSING"),
        "{r}"
    );
    pgjet(&args!["check", "--source", source, "--transport", "libpq"])
        .fails_with("GRANT EXECUTE ON FUNCTION pg_ls_dir(text, boolean, boolean) TO replicator;");
    let data = cluster.new_dir("patroni-standby");
    let connstring = format!(
        "dbname=postgres user=replicator host=127.0.0.1 port={}",
        cluster.port()
    );
    let patroni = |dir: &std::path::Path| {
        pgjet_ok(&args![
            "replica-create",
            "--keep_data=True",
            "--start_fast=True",
            "--scope=acc",
            "--role=replica",
            format!("--datadir={}", dir.display()),
            format!("--connstring={connstring}")
        ])
    };
    // A pg_hba.conf with the replication line only (what pg_basebackup needs): pgjet asks
    // the server's facts and holds its slots on a replication connection. The standbys made
    // below copy this pg_hba.conf, so the clone from a standby runs this way too.
    let hba = cluster.data().join("pg_hba.conf");
    let full_hba = fs::read_to_string(&hba).unwrap();
    let set_hba = |text: &str| {
        fs::write(&hba, text).unwrap();
        cluster.psql("postgres", "SELECT pg_reload_conf()");
    };
    let replication_only_hba =
        "local all all trust\nhost replication replicator 127.0.0.1/32 trust\n";
    set_hba(replication_only_hba);
    let r = pgjet_ok(&args!["check", "--source", source]);
    assert!(
        r.stdout.contains("for replication only")
            && r.stdout.contains("replica-create needs nothing more")
            && r.stdout.contains(
                "note: --transport libpq and local, and check of a stanza: an ordinary session"
            )
            && r.stdout
                .contains("postgres replicator <this host's address>/32"),
        "{r}"
    );
    pgjet(&args!["check", "--source", source, "--transport", "libpq"])
        .fails_with("lets the role in for replication only");
    let r = patroni(&data);
    assert!(
        r.stderr
            .contains("in for replication only: the server's facts and the copy's slots")
            && r.stderr
                .contains("the role may connect for replication only"),
        "auto must take the stream over replication connections alone:\n{r}"
    );
    assert_no_slot_left(&cluster, "after a copy over replication connections alone");
    // Changes while the copy sits, then Patroni's reinit over the kept data, which a crash
    // left with a postmaster.pid naming a server that is gone (here a process that ended):
    // removed, and the copy re-synced in place.
    cluster.psql(
        "postgres",
        "UPDATE ts_t SET v = 'changed' WHERE id % 100 = 0; CREATE TABLE after_copy AS SELECT 1 AS x; CHECKPOINT;",
    );
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    fs::write(
        data.join("postmaster.pid"),
        format!("{gone_pid}\n{}\n", data.display()),
    )
    .unwrap();
    let r = patroni(&data);
    assert!(
        r.stderr
            .contains(&format!("(PID {gone_pid}) is gone: removed")),
        "the stale postmaster.pid must be removed, and the log say so:\n{r}"
    );
    assert!(
        r.stderr.contains("re-synced in place")
            && r.stderr.contains("delta over the BASE_BACKUP stream"),
        "{r}"
    );
    assert!(r.stdout.contains("delta:"), "{r}");
    let auto_conf = fs::read_to_string(data.join("postgresql.auto.conf")).unwrap();
    assert!(
        !auto_conf.contains("pgjet"),
        "no block of ours under Patroni:\n{auto_conf}"
    );
    fs::write(
        data.join("postgresql.auto.conf"),
        format!("{auto_conf}primary_conninfo = '{connstring}'\n"),
    )
    .unwrap();
    let mut standby = cluster.start_other(&data, free_port());
    let caught_up = wait_for(Duration::from_secs(30), || {
        (standby.psql("postgres", "SELECT count(*) FROM after_copy") == "1").then_some(())
    });
    assert!(caught_up.is_some(), "the re-synced standby must replay");
    assert_same_fingerprint(
        "standby re-synced over the stream",
        &fingerprint(&cluster.server),
        &fingerprint(&standby),
    );
    // A standby as the source (Patroni's clonefrom), by the same role: the stream, which a
    // standby serves; the copy cascades from it and holds the same rows. The primary's
    // checkpoint gives the standby a restartpoint to start the backup from.
    cluster.psql("postgres", "CHECKPOINT");
    let cascade = cluster.new_dir("cascade");
    let from_standby = format!(
        "host=127.0.0.1 port={} user=replicator dbname=postgres sslmode=disable",
        standby.port
    );
    let r = pgjet_ok(&args![
        "replica-create",
        "--start-fast",
        "--source",
        from_standby,
        "--pg-path",
        cascade.display()
    ]);
    assert!(r.stderr.contains("the source is a standby"), "{r}");
    let mut cascaded = cluster.start_other(&cascade, free_port());
    let streaming = wait_for(Duration::from_secs(30), || {
        (standby.psql(
            "postgres",
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
        ) == "1")
            .then_some(())
    });
    assert!(streaming.is_some(), "the copy must stream from the standby");
    assert_same_fingerprint(
        "copy of a standby",
        &fingerprint(&cluster.server),
        &fingerprint(&cascaded),
    );
    cascaded.stop();
    standby.stop();
    // --slot and --start with replication connections alone: the slot is made before the
    // copy (it cannot be copied from the temporary one without SQL) and kept; the standby's
    // own WAL receiver tells that it streams (pg_stat_replication needs a session).
    let slotted = cluster.new_dir("slotted");
    let slotted_port = free_port();
    let r = pgjet(&args![
        "replica-create",
        "--source",
        source,
        "--pg-path",
        slotted.display(),
        "--pg-port",
        slotted_port,
        "--slot",
        "ro_slot",
        "--start-fast",
        "--start"
    ]);
    let slotted_server = Server::adopt(cluster.pg(), &slotted, &slotted.join("pgjet-start.log"));
    assert!(r.success(), "{r}");
    assert!(
        r.stderr
            .contains("replication slot ro_slot made on the primary")
            && r.stderr.contains("is streaming (its WAL receiver says so"),
        "{r}"
    );
    assert_eq!(
        cluster.psql(
            "postgres",
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'ro_slot' AND active"
        ),
        "1",
        "the standby must stream from its slot"
    );
    if let Some(mut s) = slotted_server {
        s.stop();
    }
    cluster.psql("postgres", "SELECT pg_drop_replication_slot('ro_slot')");
    set_hba(&full_hba);
    step!("replication connections alone: copy, re-sync, clone of a standby, --slot, --start");
    // A kept directory that proves nothing (no pg_control, no marker): replaced.
    let junk = cluster.new_dir("patroni-junk");
    fs::write(junk.join("stray"), b"x").unwrap();
    chown_pg_recursive(&junk);
    let r = patroni(&junk);
    assert!(r.stderr.contains("is replaced by a full copy"), "{r}");
    assert!(
        r.stderr.contains("the role may not copy files") && r.stderr.contains("BASE_BACKUP"),
        "auto must take the stream for a REPLICATION-only role:\n{r}"
    );
    assert!(junk.join("global/pg_control").exists() && !junk.join("stray").exists());
    assert_no_slot_left(&cluster, "after the Patroni calls");
    step!("Patroni's calls done");

    // Cancelled as Patroni cancels (SIGTERM) mid-copy, the temporary slot held by a
    // replication connection (pg_hba.conf's replication line alone): the exit status is
    // SIGTERM's within a few seconds, the directory stays unfinished, nothing is left on the
    // server.
    set_hba(replication_only_hba);
    let cancelled = cluster.new_dir("patroni-cancelled");
    let bg = Background::spawn(
        &pgjet_bin(),
        &args![
            "replica-create",
            "--start_fast=True",
            "--max_rate=1M",
            "--scope=acc",
            "--role=replica",
            format!("--datadir={}", cancelled.display()),
            format!("--connstring={connstring}")
        ],
        &cluster.root.join("cancel.pid"),
    );
    let started = wait_for(Duration::from_secs(20), || {
        fs::read_dir(cancelled.join("base")).ok().map(|_| ())
    });
    assert!(started.is_some(), "the copy never started");
    step!("the copy started; SIGTERM");
    let r = end_on_sigterm(bg, "Patroni's replica-create");
    assert!(r.stderr.contains("cancelled by SIGTERM"), "{r}");
    assert!(
        cancelled.join("pgjet.incomplete").exists()
            && !cancelled.join("global/pg_control").exists(),
        "the directory must stay unfinished"
    );
    assert_no_slot_left(&cluster, "after SIGTERM");
    step!("no slot left");
    assert_no_session_left(&cluster, "usename = 'replicator'");
}

/// Over TLS verify-full with SCRAM-SHA-256 and channel binding required (the replication
/// connection's own handshake, crates/pgjet-core/src/remote/replication.rs), zstd: the new directory passes
/// pg_verifybackup and starts.
#[test]
fn pg15_replica_create_basebackup_tls_scram_zstd() {
    let cluster = Cluster::new(&Pg::v15(), "bb-tls");
    let certs = cluster.new_dir("certs");
    make_test_certificates(
        &certs,
        "pgjet-test-server",
        "subjectAltName=DNS:pgjet-test-server\n",
    );
    let data = cluster.data();
    fs::copy(certs.join("server.crt"), data.join("server.crt")).unwrap();
    fs::copy(certs.join("server.key"), data.join("server.key")).unwrap();
    chown_pg_recursive(&certs);
    chown_pg_recursive(&data.join("server.crt"));
    chown_pg_recursive(&data.join("server.key"));
    fs::set_permissions(
        data.join("server.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    cluster.psql(
        "postgres",
        "SET password_encryption = 'scram-sha-256'; \
         CREATE ROLE rep LOGIN REPLICATION PASSWORD 'sekret pw'; \
         GRANT pg_read_all_settings TO rep; GRANT EXECUTE ON FUNCTION pg_control_system() TO rep; \
         ALTER SYSTEM SET ssl = on; ALTER SYSTEM SET ssl_cert_file = 'server.crt'; \
         ALTER SYSTEM SET ssl_key_file = 'server.key';",
    );
    fs::write(
        data.join("pg_hba.conf"),
        "local all all trust\nhostssl replication rep 127.0.0.1/32 scram-sha-256\nhostssl all rep 127.0.0.1/32 scram-sha-256\n",
    )
    .unwrap();
    cluster.listen_on_loopback();
    cluster.psql(
        "postgres",
        "CREATE TABLE t AS SELECT i, md5(i::text) AS v FROM generate_series(1, 50000) i",
    );
    let target = cluster.new_dir("standby");
    let port = free_port();
    let source = format!(
        "host=pgjet-test-server hostaddr=127.0.0.1 port={} user=rep password='sekret pw' dbname=postgres sslmode=verify-full sslrootcert={} channel_binding=require",
        cluster.port(),
        certs.join("ca.crt").display()
    );
    // No password anywhere: the hint says where one is looked for (not "is the cluster
    // running?").
    let r = pgjet(&args![
        "check",
        "--source",
        source.replace(" password='sekret pw'", "")
    ])
    .fails_with("password");
    assert!(
        r.stderr
            .contains("HINT: the server asks for a password and none was found")
            && r.stderr.contains("PGPASSFILE"),
        "{r}"
    );
    let r = pgjet_ok(&args![
        "replica-create",
        "--transport",
        "basebackup",
        "--network-compress",
        "zstd",
        "--compress-level-network",
        "3",
        "--network-compress-workers",
        "1",
        "--max-rate",
        "512M",
        "--source",
        source,
        "--pg-path",
        target.display(),
        "--pg-port",
        port,
        "--start-fast",
        "--output",
        "json"
    ]);
    let summary: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(summary["network_compress"], "zstd", "{r}");
    assert!(
        r.stderr
            .contains("BASE_BACKUP (zstd, 1 thread on the server)"),
        "--network-compress-workers 1 must reach the server:\n{r}"
    );
    let v = pg_verifybackup(cluster.pg(), &target);
    assert!(v.success(), "pg_verifybackup:\n{v}");
    let standby = cluster.start_other(&target, port);
    let rows = wait_for(Duration::from_secs(60), || {
        let n = standby.psql_run("postgres", "SELECT count(*) FROM t");
        (n.success() && n.stdout.trim() == "50000").then_some(())
    });
    assert!(rows.is_some(), "the standby must hold the table's rows");
}

/// PostgreSQL 18 built without lz4 and zstd: `--network-compress auto` falls back to gzip;
/// the new directory passes pg_verifybackup. Then the refusals as PostgreSQL 18 words them:
/// a role without REPLICATION, no replication line in pg_hba.conf.
#[test]
fn pg18_replica_create_basebackup_auto_is_gzip() {
    let pg = Pg::v18();
    let cluster = Cluster::new(&pg, "bb-pg18");
    cluster.listen_on_loopback();
    cluster.summarize_wal();
    cluster.psql(
        "postgres",
        "CREATE TABLE t AS SELECT i, md5(i::text) AS v FROM generate_series(1, 50000) i; CHECKPOINT;",
    );
    let target = cluster.new_dir("standby");
    let (source, dir) = (
        tcp_conninfo(&cluster, "postgres"),
        target.display().to_string(),
    );
    let r = pgjet_ok(&[
        "replica-create",
        "--transport",
        "basebackup",
        "--source",
        &source,
        "--pg-path",
        &dir,
        "--start-fast",
        "--output",
        "json",
    ]);
    let summary: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(summary["network_compress"], "gzip", "{r}");
    let v = pg_verifybackup(&pg, &target);
    assert!(v.success(), "pg_verifybackup:\n{v}");
    incremental_resync_cancelled(&cluster, &source, &target);

    // A backup over the stream (gzip: this build has no lz4/zstd), verified and restored.
    let repo = cluster.new_dir("stream-repo");
    let repo_s = repo.display().to_string();
    let base = ["--stanza", "main", "--repo-path", repo_s.as_str()];
    let run = |extra: &[&str]| pgjet_ok(&[&base[..], extra].concat());
    run(&[
        "--source",
        &source,
        "--transport",
        "basebackup",
        "stanza-create",
    ]);
    let r = run(&[
        "--source",
        &source,
        "--transport",
        "basebackup",
        "--output",
        "json",
        "backup",
        "--start-fast",
    ]);
    assert!(r.stderr.contains("BASE_BACKUP stream (gzip)"), "{r}");
    let label = serde_json::from_str::<serde_json::Value>(r.stdout.trim()).unwrap()["label"]
        .as_str()
        .unwrap()
        .to_string();
    run(&["verify", "--set", &label]);
    let restored = cluster.new_dir("restored");
    let restored_s = restored.display().to_string();
    run(&["--pg-path", &restored_s, "restore", "--set", &label]);
    let v = pg_verifybackup(&pg, &restored);
    assert!(v.success(), "pg_verifybackup on the restore:\n{v}");
    let server = cluster.start_other(&restored, free_port());
    server.wait_promoted(Duration::from_secs(120));
    assert_eq!(server.psql("postgres", "SELECT count(*) FROM t"), "50000");
    drop(server);

    // PostgreSQL 16+ words the missing REPLICATION attribute differently; the hint is the
    // same. Then no replication line in pg_hba.conf: the hint names the line.
    cluster.psql(
        "postgres",
        "CREATE ROLE plain LOGIN; GRANT pg_read_all_settings TO plain; \
         GRANT EXECUTE ON FUNCTION pg_control_system() TO plain;",
    );
    let refused = |user: &str, fix: &str| {
        let dir = cluster.root.join(&format!("refused-{user}"));
        let (source, path) = (tcp_conninfo(&cluster, user), dir.display().to_string());
        let r = pgjet(&[
            "replica-create",
            "--transport",
            "basebackup",
            "--source",
            &source,
            "--pg-path",
            &path,
        ]);
        assert!(!r.success(), "{user} must be refused:\n{r}");
        assert!(
            r.text_lower().contains(fix),
            "the error must name {fix:?}:\n{r}"
        );
        assert!(!dir.join("global/pg_control").exists());
    };
    refused("plain", "alter role plain replication");
    fs::write(
        cluster.data().join("pg_hba.conf"),
        "local all all trust\nhost all all 127.0.0.1/32 trust\n",
    )
    .unwrap();
    cluster.psql("postgres", "SELECT pg_reload_conf()");
    std::thread::sleep(Duration::from_millis(500));
    refused("postgres", "hostssl replication postgres");
    assert_no_slot_left(&cluster, "after the failure");

    // pg_hba.conf's replication line alone, for a role with REPLICATION only: the re-sync is
    // still PostgreSQL's incremental stream, everything asked on replication connections.
    fs::write(
        cluster.data().join("pg_hba.conf"),
        "local all all trust\nhost replication replicator 127.0.0.1/32 trust\n",
    )
    .unwrap();
    cluster.psql(
        "postgres",
        "CREATE ROLE replicator WITH REPLICATION LOGIN; SELECT pg_reload_conf(); \
         UPDATE t SET v = 'again' WHERE i % 100 = 1; CHECKPOINT;",
    );
    let replicator = tcp_conninfo(&cluster, "replicator");
    let dir = target.display().to_string();
    let r = pgjet_ok(&[
        "replica-create",
        "--source",
        &replicator,
        "--pg-path",
        &dir,
        "--delta",
        "--start-fast",
    ]);
    assert!(
        r.stderr.contains("in for replication only")
            && r.stderr
                .contains("delta over the BASE_BACKUP stream: incremental"),
        "{r}"
    );
    assert_no_slot_left(&cluster, "after the re-sync over replication connections");
    // A tablespace made since: its place comes from the stream's header (names are not
    // known without a session: mapped by OID); the next re-sync keeps it where its link
    // points and is incremental again, the tablespace's directory named with the catalog
    // version read from the kept copy's pg_control.
    let ts_primary = cluster.new_dir("ts-primary");
    let ts_standby = cluster.new_dir("ts-standby");
    cluster.psql(
        "postgres",
        &format!(
            "CREATE TABLESPACE ts1 LOCATION '{}'; \
             CREATE TABLE tt TABLESPACE ts1 AS SELECT i, md5(i::text) AS v FROM generate_series(1, 20000) i; \
             CHECKPOINT;",
            ts_primary.display()
        ),
    );
    let ts_oid = cluster.psql(
        "postgres",
        "SELECT oid FROM pg_tablespace WHERE spcname = 'ts1'",
    );
    let resync = |extra: &[&str]| {
        pgjet_ok(
            &[
                &[
                    "replica-create",
                    "--source",
                    replicator.as_str(),
                    "--pg-path",
                    dir.as_str(),
                    "--delta",
                    "--start-fast",
                ][..],
                extra,
            ]
            .concat(),
        )
    };
    let map = format!("{ts_oid}={}", ts_standby.display());
    let r = resync(&["--tablespace-map", &map]);
    assert!(
        r.stderr.contains(&format!(
            "tablespace OID {ts_oid} goes to {}",
            ts_standby.display()
        )),
        "{r}"
    );
    cluster.psql(
        "postgres",
        "UPDATE tt SET v = 'moved' WHERE i % 10 = 0; CHECKPOINT;",
    );
    let r = resync(&[]);
    assert!(
        r.stderr
            .contains("delta over the BASE_BACKUP stream: incremental"),
        "{r}"
    );
    assert!(fs::read_dir(&ts_standby).unwrap().count() > 0);
    let standby = cluster.start_other(&target, free_port());
    let rows = wait_for(Duration::from_secs(60), || {
        let n = standby.psql_run(
            "postgres",
            "SELECT count(*) FROM t WHERE v = 'again' UNION ALL SELECT count(*) FROM tt WHERE v = 'moved'",
        );
        (n.success() && n.stdout.split_whitespace().collect::<Vec<_>>() == ["500", "2000"])
            .then_some(())
    });
    assert!(
        rows.is_some(),
        "the re-synced standby must hold the new rows"
    );
    drop(standby);

    // A stanza and a backup by the same role over replication connections alone: the
    // stanza's catalog version is the release's (the backup checks it against the copy's
    // pg_control), an incr asked for is a full (no session lists the databases to compare),
    // the tablespace is named by its OID; verified, restored with the tablespace mapped by
    // OID, and it holds the rows.
    let repl_repo = cluster.new_dir("replication-only-repo");
    let repl_repo = repl_repo.display().to_string();
    let run = |extra: &[&str]| {
        pgjet_ok(
            &[
                &["--stanza", "main", "--repo-path", repl_repo.as_str()][..],
                extra,
            ]
            .concat(),
        )
    };
    run(&["--source", &replicator, "stanza-create"]);
    let r = run(&[
        "--source",
        &replicator,
        "--output",
        "json",
        "backup",
        "--start-fast",
        "--type",
        "incr",
    ]);
    assert!(
        r.stderr.contains("in for replication only")
            && r.stderr.contains("taking a full backup instead"),
        "{r}"
    );
    let label = serde_json::from_str::<serde_json::Value>(r.stdout.trim()).unwrap()["label"]
        .as_str()
        .unwrap()
        .to_string();
    assert_no_slot_left(&cluster, "after the backup over replication connections");
    run(&["verify", "--set", &label]);
    let restored = cluster.new_dir("restored-replication-only");
    let ts_restored = cluster.new_dir("ts-restored");
    run(&[
        "--pg-path",
        &restored.display().to_string(),
        "restore",
        "--set",
        &label,
        "--tablespace-map",
        &format!("{ts_oid}={}", ts_restored.display()),
    ]);
    let server = cluster.start_other(&restored, free_port());
    server.wait_promoted(Duration::from_secs(120));
    assert_eq!(
        server.psql(
            "postgres",
            "SELECT (SELECT count(*) FROM t WHERE v = 'again') || ' ' || (SELECT count(*) FROM tt WHERE v = 'moved')"
        ),
        "500 2000"
    );
}

/// The copy `target` of `cluster` (PostgreSQL 17+, `summarize_wal = on`) re-synced with
/// `--delta` over the stream, which is PostgreSQL's incremental `BASE_BACKUP`, cancelled by
/// SIGTERM mid-copy (held at MAX_RATE 32 kB/s): SIGTERM's status within seconds, the copy
/// marked unfinished and without pg_control, no slot left; the next `--delta` finishes
/// it, and the standby holds the primary's rows.
fn incremental_resync_cancelled(cluster: &Cluster, source: &str, target: &std::path::Path) {
    cluster.psql(
        "postgres",
        "UPDATE t SET v = 'changed' WHERE i % 50 = 0; CHECKPOINT;",
    );
    let dir = target.display().to_string();
    let a = args![
        "replica-create",
        "--transport",
        "basebackup",
        "--source",
        source,
        "--pg-path",
        dir,
        "--delta",
        "--start-fast"
    ];
    let mut slow = a.clone();
    slow.extend(args!["--max-rate", "32k"]);
    let bg = Background::spawn(&pgjet_bin(), &slow, &cluster.root.join("incr-cancel.pid"));
    let marked = wait_for(Duration::from_secs(30), || {
        target.join("pgjet.incomplete").exists().then_some(())
    });
    assert!(marked.is_some(), "the re-sync never began:\n{}", bg.wait());
    let r = end_on_sigterm(bg, "incremental re-sync");
    assert!(
        r.stderr
            .contains("delta over the BASE_BACKUP stream: incremental"),
        "the re-sync must be PostgreSQL's incremental stream:\n{r}"
    );
    assert!(
        target.join("pgjet.incomplete").exists() && !target.join("global/pg_control").exists(),
        "the cancelled copy must stay unfinished"
    );
    assert_no_slot_left(cluster, "after the cancelled incremental re-sync");
    let r = pgjet_ok(&a);
    assert!(
        r.stderr.contains("delta over the BASE_BACKUP stream"),
        "{r}"
    );
    assert!(!target.join("pgjet.incomplete").exists());
    let standby = cluster.start_other(target, free_port());
    assert_eq!(
        standby.psql("postgres", "SELECT count(*) FROM t WHERE v = 'changed'"),
        "1000"
    );
    drop(standby);
}

/// `backup --transport basebackup` (zstd) into a repository: verify passes, the backup is
/// stored in pgjet's own format (smaller than the data with the repository's lz4), restore
/// with ts1 mapped elsewhere gives a directory pg_verifybackup accepts, which starts and
/// holds the primary's rows; the temporary slot is gone.
#[test]
fn pg15_backup_basebackup_zstd_restore() {
    let cluster = loopback_cluster("bb-backup");
    let repo = cluster.new_dir("stream-repo");
    let base = args![
        "--source",
        tcp_conninfo(&cluster, "postgres"),
        "--stanza",
        "main",
        "--repo-path",
        repo.display()
    ];
    let with = |extra: Vec<String>| {
        let mut a = base.clone();
        a.extend(extra);
        a
    };
    pgjet_ok(&with(args!["--transport", "basebackup", "stanza-create"]));
    let r = pgjet_ok(&with(args![
        "--transport",
        "basebackup",
        "--network-compress",
        "zstd",
        "--compress-type",
        "lz4",
        "--output",
        "json",
        "backup",
        "--start-fast"
    ]));
    let summary: serde_json::Value = serde_json::from_str(r.stdout.trim())
        .unwrap_or_else(|e| panic!("--output json is not JSON ({e}):\n{r}"));
    let label = summary["label"].as_str().unwrap().to_string();
    let (size, stored) = (
        summary["size"].as_u64().unwrap(),
        summary["stored_size"].as_u64().unwrap(),
    );
    assert!(
        stored < size,
        "lz4 in the repository: {stored} stored for {size}"
    );
    assert!(
        r.stderr.contains("BASE_BACKUP stream (zstd)"),
        "the log must name the stream and its codec:\n{r}"
    );
    // zstd's threads default to the primary's max_parallel_maintenance_workers (2).
    assert!(
        r.stderr
            .contains("BASE_BACKUP (zstd, 2 threads on the server)"),
        "{r}"
    );
    assert_eq!(summary["page_errors"], 0, "{r}");
    let source_fp = fingerprint(&cluster.server);
    pgjet_ok(&with(args!["verify", "--set", label]));
    let restored = cluster.new_dir("restored");
    let ts = cluster.new_dir("restored-ts1");
    pgjet_ok(&with(args![
        "--pg-path",
        restored.display(),
        "restore",
        "--set",
        label,
        "--tablespace-map",
        format!("ts1={}", ts.display())
    ]));
    let v = pg_verifybackup(cluster.pg(), &restored);
    assert!(
        v.success(),
        "pg_verifybackup on the restored directory:\n{v}"
    );
    assert!(fs::read_dir(&ts).unwrap().next().is_some(), "ts1 restored");
    let server = cluster.start_other(&restored, free_port());
    server.wait_promoted(Duration::from_secs(120));
    assert_same_fingerprint(
        "restored from a backup over the BASE_BACKUP stream",
        &source_fp,
        &fingerprint(&server),
    );
    assert_eq!(
        server.psql("postgres", "SELECT count(*) FROM \"größe_ü\""),
        "5000"
    );
    assert_eq!(
        cluster.psql(
            "postgres",
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'pgjet_%'"
        ),
        "0",
        "the temporary slot must be gone"
    );
}

/// The first ERROR line of a command's output.
fn first_error(r: &Run) -> String {
    r.stderr
        .lines()
        .find(|l| l.contains("ERROR"))
        .unwrap_or_default()
        .to_string()
}

/// Starts `args` in a thread, waits until the server's walsender has sent for a moment, then
/// runs `cut` (which breaks the stream) and returns the command's result.
fn cut_mid_stream(cluster: &Cluster, args: Vec<String>, cut: impl FnOnce()) -> Run {
    let h = std::thread::spawn(move || pgjet(&args));
    let sending = wait_for(Duration::from_secs(60), || {
        let n = cluster.psql(
            "postgres",
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'",
        );
        (n == "1" || h.is_finished()).then_some(())
    });
    if h.is_finished() {
        panic!(
            "the command ended before the stream could be cut:\n{}",
            h.join().unwrap()
        );
    }
    assert!(sending.is_some(), "the stream never started");
    std::thread::sleep(Duration::from_secs(2));
    assert!(!h.is_finished(), "the stream ended before it could be cut");
    cut();
    h.join().unwrap()
}

/// Faults in the middle of the stream (slowed by --max-rate so there is a middle): the
/// walsender terminated (the link cut from the server's side) under a backup and under
/// replica-create, and the primary restarted under a backup. Each fails with an error
/// naming the stream; no backup is left that looks complete, no slot is left; the
/// half-written standby is finished by `replica-create --delta` over libpq, starts and
/// streams; a backup afterwards succeeds and verifies.
#[test]
fn pg15_stream_faults() {
    let cluster = loopback_cluster("bb-faults");
    cluster.psql(
        "postgres",
        "CREATE TABLE bulk AS SELECT i, repeat(md5(i::text), 4) AS v FROM generate_series(1, 200000) i; CHECKPOINT;",
    );
    let repo = cluster.new_dir("fault-repo");
    let source = tcp_conninfo(&cluster, "postgres");
    let base = args![
        "--source",
        source,
        "--stanza",
        "main",
        "--repo-path",
        repo.display(),
        "--transport",
        "basebackup"
    ];
    let with = |extra: Vec<String>| {
        let mut a = base.clone();
        a.extend(extra);
        a
    };
    pgjet_ok(&with(args!["stanza-create"]));
    let terminate = || {
        cluster.psql(
            "postgres",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'walsender'",
        );
    };
    let no_complete_backup = |what: &str| {
        let r = pgjet_ok(&args![
            "--stanza",
            "main",
            "--repo-path",
            repo.display(),
            "--output",
            "json",
            "info"
        ]);
        let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
        let n = v[0]["backup"].as_array().map(|b| b.len()).unwrap_or(0);
        assert_eq!(n, 0, "{what}: no backup may look complete:\n{r}");
        assert_no_slot_left(&cluster, what);
    };
    let slow = args![
        "--max-rate",
        "1M",
        "--output",
        "json",
        "backup",
        "--start-fast"
    ];

    // 1. The link cut under a backup.
    let r = cut_mid_stream(&cluster, with(slow.clone()), terminate);
    assert!(!r.success(), "a cut stream must fail the backup:\n{r}");
    assert!(
        r.text_lower().contains("replication") || r.text_lower().contains("stream"),
        "the error must name the stream:\n{r}"
    );
    step!("link cut under backup: {}", first_error(&r));
    no_complete_backup("link cut under backup");

    // 2. The primary restarted under a backup.
    let r = cut_mid_stream(&cluster, with(slow), || cluster.restart());
    assert!(
        !r.success(),
        "a restart under the stream must fail the backup:\n{r}"
    );
    step!("primary restarted under backup: {}", first_error(&r));
    no_complete_backup("primary restarted under backup");

    // 3. The link cut under replica-create; --delta over libpq finishes the directory.
    let data = cluster.new_dir("fault-standby");
    let ts_map = format!("ts1={}", cluster.new_dir("fault-standby-ts1").display());
    let port = free_port();
    let create = args![
        "replica-create",
        "--transport",
        "basebackup",
        "--max-rate",
        "1M",
        "--source",
        source,
        "--pg-path",
        data.display(),
        "--pg-port",
        port,
        "--tablespace-map",
        ts_map,
        "--start-fast"
    ];
    let r = cut_mid_stream(&cluster, create, terminate);
    assert!(!r.success(), "a cut stream must fail replica-create:\n{r}");
    step!("link cut under replica-create: {}", first_error(&r));
    assert!(
        !data.join("global/pg_control").exists(),
        "no pg_control after a failure"
    );
    assert_no_slot_left(&cluster, "after the failure");
    pgjet_ok(&args![
        "replica-create",
        "--delta",
        "--transport",
        "libpq",
        "--source",
        source,
        "--pg-path",
        data.display(),
        "--pg-port",
        port,
        "--tablespace-map",
        ts_map,
        "--start-fast"
    ]);
    let standby = cluster.start_other(&data, port);
    cluster.psql("postgres", "INSERT INTO bulk VALUES (0, 'after')");
    let caught_up = wait_for(Duration::from_secs(60), || {
        (standby.psql("postgres", "SELECT count(*) FROM bulk WHERE i = 0") == "1").then_some(())
    });
    assert!(
        caught_up.is_some(),
        "the finished standby must replay the primary's rows"
    );
    drop(standby);

    // 4. A backup afterwards succeeds and verifies.
    let r = pgjet_ok(&with(args!["--output", "json", "backup", "--start-fast"]));
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    let label = v["label"].as_str().unwrap().to_string();
    pgjet_ok(&args![
        "--stanza",
        "main",
        "--repo-path",
        repo.display(),
        "verify",
        "--set",
        label
    ]);
}

/// `check --source` reports what `--transport basebackup` needs: everything present for a
/// superuser; the server's compression methods for a role that is not one; with no
/// replication line in pg_hba.conf, the line to add: a note (check passes) unless
/// `--transport basebackup` is asked for (check fails, naming the fix).
#[test]
fn pg15_check_reports_stream_needs() {
    let cluster = loopback_cluster("bb-check");
    let check = |user: &str, extra: &[&str]| {
        let source = tcp_conninfo(&cluster, user);
        let mut a = vec!["--source", source.as_str()];
        a.extend_from_slice(extra);
        a.push("check");
        pgjet(&a)
    };
    let r = check("postgres", &[]);
    assert!(r.success(), "{r}");
    for want in [
        "--transport basebackup: a replication connection is accepted from this host",
        "--transport basebackup: compression on the server: zstd yes, lz4 yes, gzip yes; --network-compress auto uses zstd",
        "--transport basebackup: wal_level = replica",
        "free (the stream takes one, a standby one more)",
    ] {
        assert!(r.stdout.contains(want), "{want:?} missing:\n{r}");
    }
    cluster.psql(
        "postgres",
        "CREATE ROLE rep2 LOGIN REPLICATION; GRANT pg_read_all_settings TO rep2;\n\
         GRANT EXECUTE ON FUNCTION pg_backup_start(text, boolean) TO rep2;\n\
         GRANT EXECUTE ON FUNCTION pg_backup_stop(boolean) TO rep2;\n\
         GRANT EXECUTE ON FUNCTION pg_read_binary_file(text, bigint, bigint, boolean) TO rep2;\n\
         GRANT EXECUTE ON FUNCTION pg_ls_dir(text, boolean, boolean) TO rep2;\n\
         GRANT EXECUTE ON FUNCTION pg_stat_file(text, boolean) TO rep2;",
    );
    let r = check("rep2", &["--transport", "basebackup"]);
    assert!(r.success(), "{r}");
    assert!(
        r.stdout.contains(
            "compression on the server: zstd yes, lz4 yes, gzip yes; --network-compress auto uses zstd"
        ),
        "a role without superuser reads the server's methods too:\n{r}"
    );
    fs::write(
        cluster.data().join("pg_hba.conf"),
        "local all all trust\nhost all all 127.0.0.1/32 trust\n",
    )
    .unwrap();
    cluster.psql("postgres", "SELECT pg_reload_conf()");
    std::thread::sleep(Duration::from_millis(500));
    let line = "add `host replication postgres 127.0.0.1/32 scram-sha-256` to pg_hba.conf";
    let r = check("postgres", &[]);
    assert!(r.success(), "a missing stream need is a note only:\n{r}");
    assert!(
        r.stdout
            .contains(&"note: --transport basebackup: pg_hba.conf has no line".to_string()),
        "{r}"
    );
    assert!(r.stdout.contains(line), "{r}");
    let r = check("postgres", &["--transport", "basebackup"]);
    assert!(!r.success(), "with --transport basebackup it fails:\n{r}");
    assert!(
        r.stdout
            .contains("MISSING: --transport basebackup: pg_hba.conf"),
        "{r}"
    );
    assert!(r.stdout.contains(line), "{r}");
}

/// `--max-rate` holds on both transports: replica-create of a cluster of about 90 MiB at
/// 8 MiB/s over the libpq ranges (all connections together) and over the stream without
/// compression (the server's MAX_RATE) never goes more than 10 % over the limit. The rate is
/// the summary's logical bytes over its seconds, which include the checkpoint and the finish
/// (under half a second here); the lower bound only catches a limiter grossly off.
#[test]
fn pg15_max_rate_holds_on_both_transports() {
    let cluster = loopback_cluster("bb-rate");
    cluster.psql(
        "postgres",
        "CREATE TABLE pad AS SELECT i, repeat(md5(i::text), 4) AS v FROM generate_series(1, 400000) i; CHECKPOINT;",
    );
    let limit = 8.0 * 1048576.0;
    for (name, transport, extra) in [
        ("rate-libpq", "libpq", vec![]),
        (
            "rate-stream",
            "basebackup",
            vec!["--network-compress", "none"],
        ),
    ] {
        let dir = cluster.new_dir(name);
        let ts = cluster.new_dir(&format!("{name}-ts1"));
        let source = tcp_conninfo(&cluster, "postgres");
        let (d, m) = (dir.display().to_string(), format!("ts1={}", ts.display()));
        let mut a = vec![
            "replica-create",
            "--transport",
            transport,
            "--max-rate",
            "8M",
            "--source",
            &source,
            "--pg-path",
            &d,
            "--tablespace-map",
            &m,
            "--start-fast",
            "--output",
            "json",
        ];
        a.extend_from_slice(&extra);
        let r = pgjet_ok(&a);
        let s: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
        let (size, secs) = (s["size"].as_f64().unwrap(), s["seconds"].as_f64().unwrap());
        let rate = size / secs;
        step!(
            "{transport}: {:.1} MiB in {secs:.2} s = {:.2} MiB/s at --max-rate 8M",
            size / 1048576.0,
            rate / 1048576.0
        );
        assert!(
            size > 60.0 * 1048576.0,
            "the cluster must be large enough: {r}"
        );
        // The limit is the promise: never more than 10% over it. Below it only a gross
        // error is refused (half the limit): on a loaded 2-core machine the copy itself
        // fell to 7.06 MiB/s (0.88x) once, which says nothing about the limiter.
        assert!(
            rate <= 1.10 * limit && rate >= 0.50 * limit,
            "{transport}: {:.2} MiB/s is above 8 MiB/s by more than 10 % or below half of it:\n{r}",
            rate / 1048576.0
        );
    }
}
