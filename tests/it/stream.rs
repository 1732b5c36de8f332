//! `archive-stream`, the WAL receiver of a backup host, against real PostgreSQL servers: the
//! WAL reaches the repository over the replication protocol, through a role that has
//! REPLICATION and nothing else.
//!
//! - PostgreSQL 15, posix, archive-push into the same stanza as well (archive_mode on): pgbench streamed; the receiver killed with SIGKILL mid-segment and
//!   restarted (it resumes from what the repository holds); the receiver made the
//!   synchronous standby and the primary killed with SIGKILL right after a commit returned;
//!   the receiver stopped with SIGTERM;
//!   verify passes, and a restore from the repository alone replays to the last commit
//!   (the tail of the last segment served by archive-get) with every row.
//! - PostgreSQL 18, posix: a multi-host string with target_session_attrs=read-write over a
//!   primary and its standby; the primary lost, the standby promoted: the receiver follows
//!   it onto timeline 2, and a restore replays across the switch to the last commit.
//! - Refusals: a logical slot of the receiver's name, a server of another cluster, and the
//!   old primary come back on timeline 1 after the archive followed timeline 2.
//! - PostgreSQL 18, S3: the S3 server stopped under pgbench, started again: the receiver
//!   catches up, and a restore from S3 alone holds every commit.

use crate::common::*;
use std::path::Path;
use std::time::Duration;

/// The application_name the receiver connects with, as pg_stat_replication shows it.
const APP: &str = "pgjet_stream";

/// Starts `archive-stream` for `cluster` into the posix repository `repo` as the role
/// `streamer`; its output appended to `<root>/<tag>.log`.
fn start_receiver(cluster: &Cluster, repo: &Path, tag: &str) -> Background {
    let source = format!(
        "host={} port={} user=streamer application_name={APP}",
        cluster.sock().display(),
        cluster.port()
    );
    start_receiver_from(cluster, &cluster.repo_args(repo), tag, &source)
}

/// [`start_receiver`] with the connection string `source`, the stanza and repository as
/// `repo_flags` say.
fn start_receiver_from(
    cluster: &Cluster,
    repo_flags: &[String],
    tag: &str,
    source: &str,
) -> Background {
    let log = cluster.root.join(&format!("{tag}.log"));
    RECEIVER_LOG.with(|l| *l.borrow_mut() = Some(log));
    let mut a = repo_flags.to_vec();
    let spool = spool_dir(cluster);
    a.extend(args![
        "--source",
        source,
        "--log-level",
        "debug",
        "--spool-path",
        spool.display()
    ]);
    let mut full = args!["archive-stream"];
    full.extend(a);
    Background::spawn_logged(
        &pgjet_bin(),
        &full,
        &cluster.root.join(&format!("{tag}.pid")),
        &cluster.root.join(&format!("{tag}.log")),
    )
}

/// The spool directory the tests' receivers write their status file in.
fn spool_dir(cluster: &Cluster) -> std::path::PathBuf {
    let d = cluster.root.join("spool");
    if !d.exists() {
        mkdir_pg(&d, 0o750);
    }
    d
}

/// `info --output prometheus` of the posix repository `repo`, with the receivers' spool.
fn metrics(cluster: &Cluster, repo: &Path) -> String {
    let mut a = args!["info", "--output", "prometheus"];
    a.extend(cluster.repo_args(repo));
    a.extend(args!["--spool-path", spool_dir(cluster).display()]);
    pgjet_ok(&a).stdout
}

/// The value of the sample `name{stanza="main"}` in `m`.
fn sample(m: &str, name: &str) -> f64 {
    let prefix = format!("{name}{{stanza=\"main\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{m}"))
}

thread_local! {
    /// The log of the receiver this test started last, shown when a wait fails.
    static RECEIVER_LOG: std::cell::RefCell<Option<std::path::PathBuf>> = const { std::cell::RefCell::new(None) };
}

/// Waits until the receiver reports flushed (durable in the repository) every WAL byte the
/// server has inserted now (the test clusters commit asynchronously: a commit that
/// returned may not be flushed on the server yet).
fn wait_flushed(server: &Server, what: &str) {
    let target = server.psql("postgres", "SELECT pg_current_wal_insert_lsn()");
    let ok = wait_for(Duration::from_secs(60), || {
        let r = server.psql(
            "postgres",
            &format!(
                "SELECT coalesce(bool_or(flush_lsn >= '{target}'), false) FROM pg_stat_replication WHERE application_name = '{APP}'"
            ),
        );
        (r == "t").then_some(())
    });
    let log = RECEIVER_LOG
        .with(|l| l.borrow().clone())
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    assert!(
        ok.is_some(),
        "{what}: the receiver did not report {target} flushed within 60 s: {}\n--- receiver log ---\n{log}",
        server.psql(
            "postgres",
            "SELECT application_name, state, sent_lsn, write_lsn, flush_lsn FROM pg_stat_replication"
        )
    );
}

fn marks(server: &Server) -> String {
    server.psql(
        "postgres",
        "SELECT string_agg(i::text, ',' ORDER BY i) FROM marks",
    )
}

#[test]
fn pg15_posix_stream_kill9_and_restore_to_the_last_commit() {
    let pg = Pg::v15();
    let cluster = Cluster::new(&pg, "stream15");
    let repo = cluster.repo.clone();
    cluster.psql("postgres", "CREATE ROLE streamer LOGIN REPLICATION");
    cluster.pgjet_cmd("stanza-create", &repo, &[]).ok();
    // archive-push into the same stanza at the same time: each segment is stored once, by
    // whichever comes first, and the other finds it archived with the same bytes.
    let push = format!(
        "{} --stanza=main --repo-path={} archive-push %p",
        pgjet_bin().display(),
        repo.display()
    );
    cluster.psql("postgres", "ALTER SYSTEM SET archive_mode = on");
    cluster.psql(
        "postgres",
        &format!("ALTER SYSTEM SET archive_command = '{push}'"),
    );
    cluster.restart();
    let receiver = start_receiver(&cluster, &repo, "receiver1");
    pgbench_init(&cluster.server, 5);
    cluster.psql("postgres", "CREATE TABLE marks (i int)");
    cluster.full_backup(&repo);
    let (bin, a) = pgbench_args(&cluster.server, &args!["-n", "-c", 4, "-T", 4]);
    run_as_postgres(&bin, &a, None).ok();
    for i in 1..=3 {
        cluster.psql("postgres", &format!("INSERT INTO marks VALUES ({i})"));
    }
    wait_flushed(&cluster.server, "after pgbench");
    step!("pgbench and marks 1-3 streamed");
    // The receiver's metrics: up, nothing left to store, once its status caught up.
    let m = wait_for(Duration::from_secs(10), || {
        let m = metrics(&cluster, &repo);
        (sample(&m, "pgjet_stream_lag_bytes") == 0.0).then_some(m)
    })
    .unwrap_or_else(|| {
        panic!(
            "the stream's lag never reached 0:\n{}",
            metrics(&cluster, &repo)
        )
    });
    assert_eq!(sample(&m, "pgjet_stream_up"), 1.0, "{m}");
    assert!(sample(&m, "pgjet_stream_stored_lsn_bytes") > 0.0, "{m}");
    assert_eq!(sample(&m, "pgjet_stream_reconnects_total"), 0.0, "{m}");

    // Killed mid-segment, restarted: it resumes from the repository.
    receiver.signal(libc::SIGKILL);
    let r = receiver.wait();
    assert!(!r.success());
    let m = metrics(&cluster, &repo);
    assert_eq!(
        sample(&m, "pgjet_stream_up"),
        0.0,
        "a killed receiver is down:\n{m}"
    );
    cluster.psql("postgres", "INSERT INTO marks VALUES (4)");
    let receiver = start_receiver(&cluster, &repo, "receiver2");
    let (bin, a) = pgbench_args(&cluster.server, &args!["-n", "-c", 2, "-T", 2]);
    run_as_postgres(&bin, &a, None).ok();
    wait_flushed(&cluster.server, "after the restart");
    step!("receiver restarted after SIGKILL; mark 4 streamed");

    // Synchronous: with the receiver in synchronous_standby_names, a commit returns once its
    // WAL is durable in the repository; the primary lost right after it, the row is there.
    cluster.psql(
        "postgres",
        &format!("ALTER SYSTEM SET synchronous_standby_names = '{APP}'"),
    );
    cluster.psql("postgres", "ALTER SYSTEM SET synchronous_commit = on");
    cluster.psql("postgres", "SELECT pg_reload_conf()");
    let sync = wait_for(Duration::from_secs(30), || {
        let r = cluster.psql(
            "postgres",
            &format!("SELECT sync_state FROM pg_stat_replication WHERE application_name = '{APP}'"),
        );
        (r == "sync").then_some(())
    });
    assert!(
        sync.is_some(),
        "the receiver never became the synchronous standby"
    );
    cluster.psql("postgres", "INSERT INTO marks VALUES (5)");
    let archiver = cluster.psql(
        "postgres",
        "SELECT archived_count > 0 AND failed_count = 0 FROM pg_stat_archiver",
    );
    assert_eq!(archiver, "t", "archive-push beside the receiver failed");
    let pid = read_pid(cluster.data()).expect("postmaster.pid");
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(wait_for(Duration::from_secs(20), || (!pid_alive(pid)).then_some(())).is_some());
    stop_server_by_pid(&cluster.pg().bin, cluster.data());
    receiver.signal(libc::SIGTERM);
    let r = receiver.wait();
    assert!(
        r.success(),
        "the receiver did not stop cleanly on SIGTERM:\n{r}"
    );
    let log = std::fs::read_to_string(cluster.root.join("receiver2.log")).unwrap_or_default();
    assert!(!log.contains("ERROR"), "{log}");

    let v = pgjet(&args![
        "verify",
        "--stanza",
        "main",
        "--repo-path",
        repo.display()
    ]);
    assert!(v.success(), "verify failed:\n{v}");

    let server = restore_promoted(&cluster, &cluster.repo_args(&repo), "restored");
    assert_eq!(marks(&server), "1,2,3,4,5");
    assert_pgbench_consistent(&server);
    step!("restored from the repository alone: every committed row is there");
}

/// Restores the newest backup of the repository `repo_flags` name into a new directory `name` of `cluster`, to the end
/// of the archive, starts it and waits until it is promoted.
fn restore_promoted(cluster: &Cluster, repo_flags: &[String], name: &str) -> Server {
    let dir = cluster.new_dir(name);
    let mut a = repo_flags.to_vec();
    a.extend(args![
        "--pg-path",
        dir.display(),
        "--archive-mode",
        "off",
        "--target-action",
        "promote"
    ]);
    let mut full = args!["restore"];
    full.extend(a);
    pgjet_ok(&full);
    let server = cluster.start_other(&dir, free_port());
    server.wait_promoted(Duration::from_secs(120));
    server
}

/// pgbench's invariant: the accounts' balances add up to the history's deltas.
fn assert_pgbench_consistent(server: &Server) {
    let check = server.psql(
        "postgres",
        "SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT sum(delta) FROM pgbench_history)",
    );
    assert_eq!(check, "t", "pgbench's balances do not add up");
}

/// Kills the server of `data` with SIGKILL (the host lost) and waits until it is gone.
fn kill_server(pg: &Pg, data: &Path) {
    let pid = read_pid(data).expect("postmaster.pid");
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(wait_for(Duration::from_secs(20), || (!pid_alive(pid)).then_some(())).is_some());
    stop_server_by_pid(&pg.bin, data);
}

/// Primary A and its standby B; the receiver given both hosts with
/// `target_session_attrs=read-write`; A lost (SIGKILL) and B promoted: the receiver follows
/// B onto timeline 2 (creating its slot there), and a restore from the repository alone
/// replays across the switch to the last commit on B.
#[test]
fn pg18_posix_stream_follows_a_failover_with_a_multi_host_string() {
    let pg = Pg::v18();
    let cluster = Cluster::new(&pg, "stream18");
    let repo = cluster.repo.clone();
    cluster.psql("postgres", "CREATE ROLE streamer LOGIN REPLICATION");
    cluster.pgjet_cmd("stanza-create", &repo, &[]).ok();
    pgbench_init(&cluster.server, 2);
    cluster.psql("postgres", "CREATE TABLE marks (i int)");
    let b_data = cluster.new_dir("b");
    let (_, b) =
        replica_create_started(&pg, &cluster.server, &b_data, free_port(), &[], "B from A");
    let source = format!(
        "host={},{} port={},{} user=streamer application_name={APP} target_session_attrs=read-write",
        cluster.sock().display(),
        b.sock.display(),
        cluster.port(),
        b.port
    );
    let receiver = start_receiver_from(&cluster, &cluster.repo_args(&repo), "receiver", &source);
    cluster.full_backup(&repo);
    let (bin, a) = pgbench_args(&cluster.server, &args!["-n", "-c", 2, "-T", 3]);
    run_as_postgres(&bin, &a, None).ok();
    cluster.psql("postgres", "INSERT INTO marks VALUES (1), (2)");
    wait_flushed(&cluster.server, "on A");
    let on_b = wait_for(Duration::from_secs(30), || {
        (b.psql("postgres", "SELECT count(*) FROM marks") == "2").then_some(())
    });
    assert!(on_b.is_some(), "A's rows did not reach B");
    step!("A streamed into the repository and to B");

    kill_server(&pg, cluster.data());
    let r = run_as_postgres(
        &pg.tool("pg_ctl"),
        &args!["promote", "-w", "-t", "60", "-D", b_data.display()],
        None,
    );
    assert!(
        r.success(),
        "promote B:
{r}"
    );
    b.wait_promoted(Duration::from_secs(60));
    b.psql("postgres", "INSERT INTO marks VALUES (3), (4)");
    wait_flushed(&b, "on B after the failover");
    step!("the receiver followed B onto timeline 2");

    receiver.signal(libc::SIGTERM);
    let r = receiver.wait();
    assert!(
        r.success(),
        "the receiver did not stop cleanly on SIGTERM:\n{r}"
    );
    let log = std::fs::read_to_string(cluster.root.join("receiver.log")).unwrap_or_default();
    assert!(log.contains("following timeline 2"), "{log}");
    let server = restore_promoted(&cluster, &cluster.repo_args(&repo), "restored");
    assert_eq!(marks(&server), "1,2,3,4");
    assert_pgbench_consistent(&server);
    step!("restored across the failover from the repository alone");
    drop(server);

    // The old primary comes back on timeline 1 (split brain): the archive already holds
    // timeline 2, so the receiver refuses it rather than archive its diverging WAL.
    let old = cluster.start_other(cluster.data(), free_port());
    let mut a = args!["archive-stream"];
    a.extend(cluster.repo_args(&repo));
    a.push(format!(
        "--source=host={} port={} user=streamer",
        old.sock.display(),
        old.port
    ));
    pgjet(&a).fails_with("it is not the cluster's newest primary");
    step!("the old primary on timeline 1 is refused");
}

/// PostgreSQL 18 into S3 (versitygw): the S3 server stopped for a minute while pgbench writes (the
/// receiver retries, the slot keeps the WAL on the server), started again: the receiver
/// catches up, and a restore from S3 alone holds every commit.
#[test]
fn pg18_s3_stream_rides_out_a_store_outage() {
    use crate::common::stores::{StoreKind, StoreServer};
    let pg = Pg::v18();
    let cluster = Cluster::new(&pg, "stream18s3");
    let mut store = StoreServer::start(StoreKind::S3, "stream18s3");
    let conf = store.config_file("pgjet.conf", "/repo", &[]);
    let flags = args!["--stanza", "main", "--config", conf.display()];
    let pj = |cmd: &str, extra: &[&str]| {
        let mut a = args![cmd];
        a.extend(flags.iter().cloned());
        a.extend(cluster.pg_args());
        a.extend(extra.iter().map(|s| s.to_string()));
        pgjet_ok(&a)
    };
    cluster.psql("postgres", "CREATE ROLE streamer LOGIN REPLICATION");
    pj("stanza-create", &[]);
    pgbench_init(&cluster.server, 2);
    cluster.psql("postgres", "CREATE TABLE marks (i int)");
    let source = format!(
        "host={} port={} user=streamer application_name={APP}",
        cluster.sock().display(),
        cluster.port()
    );
    let receiver = start_receiver_from(&cluster, &flags, "receiver", &source);
    pj("backup", &["--start-fast", "--jobs", "2"]);
    cluster.psql("postgres", "INSERT INTO marks VALUES (1)");
    wait_flushed(&cluster.server, "before the outage");

    // A minute without S3 under a steady load.
    store.stop();
    let (bin, a) = pgbench_args(&cluster.server, &args!["-n", "-c", 2, "-R", 100, "-T", 60]);
    run_as_postgres(&bin, &a, None).ok();
    cluster.psql("postgres", "INSERT INTO marks VALUES (2)");
    let behind = cluster.psql(
        "postgres",
        &format!(
            "SELECT pg_current_wal_insert_lsn() - flush_lsn > 0 FROM pg_stat_replication WHERE application_name = '{APP}'"
        ),
    );
    assert_eq!(behind, "t", "nothing waited while S3 was down");
    store.resume();
    wait_flushed(&cluster.server, "after the outage");
    step!("the receiver caught up after the S3 outage");

    kill_server(&pg, cluster.data());
    receiver.signal(libc::SIGTERM);
    let r = receiver.wait();
    assert!(
        r.success(),
        "the receiver did not stop cleanly on SIGTERM:\n{r}"
    );
    let server = restore_promoted(&cluster, &flags, "restored");
    assert_eq!(marks(&server), "1,2");
    assert_pgbench_consistent(&server);
    step!("restored from S3 alone: every committed row is there");
}

/// The receiver stopped, its slot dropped and the WAL after it removed on the server (a
/// checkpoint recycles it): started again, it records the missing segments as a gap (info
/// shows it), makes its slot again and streams on.
#[test]
fn pg15_wal_removed_on_the_server_is_recorded_as_a_gap() {
    let pg = Pg::v15();
    let cluster = Cluster::new(&pg, "stream15gap");
    let repo = cluster.repo.clone();
    cluster.psql("postgres", "CREATE ROLE streamer LOGIN REPLICATION");
    cluster.psql("postgres", "CREATE TABLE marks (i int)");
    cluster.pgjet_cmd("stanza-create", &repo, &[]).ok();
    // Without --source there is nothing to stream from: refused at once, naming the fix.
    let mut a = args!["archive-stream"];
    a.extend(cluster.repo_args(&repo));
    pgjet(&a).fails_with("archive-stream needs the cluster to stream from: --source");
    let receiver = start_receiver(&cluster, &repo, "receiver1");
    cluster.psql("postgres", "INSERT INTO marks VALUES (1)");
    wait_flushed(&cluster.server, "before the stop");
    receiver.signal(libc::SIGTERM);
    assert!(receiver.wait().success());

    cluster.psql(
        "postgres",
        "SELECT pg_drop_replication_slot('pgjet_stream_main')",
    );
    for i in 2..=6 {
        cluster.psql(
            "postgres",
            &format!("INSERT INTO marks VALUES ({i}); SELECT pg_switch_wal()"),
        );
    }
    cluster.psql("postgres", "CHECKPOINT");
    cluster.psql("postgres", "CHECKPOINT");

    let receiver = start_receiver(&cluster, &repo, "receiver2");
    cluster.psql("postgres", "INSERT INTO marks VALUES (7)");
    wait_flushed(&cluster.server, "after the gap");
    receiver.signal(libc::SIGTERM);
    assert!(receiver.wait().success());
    let log = std::fs::read_to_string(cluster.root.join("receiver2.log")).unwrap_or_default();
    assert!(log.contains("recorded as a gap"), "{log}");
    let r = pgjet_ok(&args![
        "info",
        "--stanza",
        "main",
        "--repo-path",
        repo.display(),
        "--output",
        "json"
    ]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let gaps = v[0]["archive"][0]["gaps"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(gaps.len(), 1, "{v}");
    assert!(
        gaps[0]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("archive-stream"),
        "{v}"
    );
    step!("the removed WAL is recorded as a gap: {}", gaps[0]);

    // Refusals, each before anything is stored: a slot of the receiver's name that is
    // logical, and a server of another cluster.
    cluster.psql("postgres", "ALTER SYSTEM SET wal_level = logical");
    cluster.restart();
    cluster.psql(
        "postgres",
        "SELECT pg_create_logical_replication_slot('decoder', 'pgoutput')",
    );
    let refused = |source: String, extra: &[&str]| {
        let mut a = args!["archive-stream"];
        a.extend(cluster.repo_args(&repo));
        a.push(format!("--source={source}"));
        a.extend(extra.iter().map(|s| s.to_string()));
        pgjet(&a)
    };
    let here = format!(
        "host={} port={} user=streamer",
        cluster.sock().display(),
        cluster.port()
    );
    refused(here, &["--archive-stream-slot=decoder"])
        .fails_with("replication slot 'decoder' is a logical slot");
    let other = Cluster::new(&pg, "stream15other");
    other.psql("postgres", "CREATE ROLE streamer LOGIN REPLICATION");
    let there = format!(
        "host={} port={} user=streamer",
        other.sock().display(),
        other.port()
    );
    refused(there, &[]).fails_with("belongs to the cluster with system identifier");
    step!("a logical slot and another cluster's server are refused");
}
