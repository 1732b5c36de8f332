//! `archive-stream`, the WAL receiver of a backup host, against real PostgreSQL servers: the
//! WAL reaches the repository over the replication protocol only (archive_mode stays off),
//! through a role that has REPLICATION and nothing else.
//!
//! - PostgreSQL 15, posix: pgbench streamed; the receiver killed with SIGKILL mid-segment and
//!   restarted (it resumes from what the repository holds); the receiver made the
//!   synchronous standby and the primary killed with SIGKILL right after a commit returned;
//!   the receiver stopped with SIGTERM;
//!   verify passes, and a restore from the repository alone replays to the last commit
//!   (the tail of the last segment served by archive-get) with every row.

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
    let mut a = cluster.repo_args(repo);
    a.extend(args!["--source", source, "--log-level", "debug"]);
    let mut full = args!["archive-stream"];
    full.extend(a);
    Background::spawn_logged(
        &pgjet_bin(),
        &full,
        &cluster.root.join(&format!("{tag}.pid")),
        &cluster.root.join(&format!("{tag}.log")),
    )
}

/// Waits until the receiver reports flushed (durable in the repository) every WAL byte the
/// server has inserted now (the test clusters commit asynchronously: a commit that
/// returned may not be flushed on the server yet).
fn wait_flushed(cluster: &Cluster, what: &str) {
    let target = cluster.psql("postgres", "SELECT pg_current_wal_insert_lsn()");
    let ok = wait_for(Duration::from_secs(60), || {
        let r = cluster.psql(
            "postgres",
            &format!(
                "SELECT coalesce(bool_or(flush_lsn >= '{target}'), false) FROM pg_stat_replication WHERE application_name = '{APP}'"
            ),
        );
        (r == "t").then_some(())
    });
    assert!(
        ok.is_some(),
        "{what}: the receiver did not report {target} flushed within 60 s: {}",
        cluster.psql(
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
    let receiver = start_receiver(&cluster, &repo, "receiver1");
    pgbench_init(&cluster.server, 5);
    cluster.psql("postgres", "CREATE TABLE marks (i int)");
    cluster.full_backup(&repo);
    let (bin, a) = pgbench_args(&cluster.server, &args!["-n", "-c", 4, "-T", 4]);
    run_as_postgres(&bin, &a, None).ok();
    for i in 1..=3 {
        cluster.psql("postgres", &format!("INSERT INTO marks VALUES ({i})"));
    }
    wait_flushed(&cluster, "after pgbench");
    step!("pgbench and marks 1-3 streamed");

    // Killed mid-segment, restarted: it resumes from the repository.
    receiver.signal(libc::SIGKILL);
    let r = receiver.wait();
    assert!(!r.success());
    cluster.psql("postgres", "INSERT INTO marks VALUES (4)");
    let receiver = start_receiver(&cluster, &repo, "receiver2");
    let (bin, a) = pgbench_args(&cluster.server, &args!["-n", "-c", 2, "-T", 2]);
    run_as_postgres(&bin, &a, None).ok();
    wait_flushed(&cluster, "after the restart");
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
    assert!(sync.is_some(), "the receiver never became the synchronous standby");
    cluster.psql("postgres", "INSERT INTO marks VALUES (5)");
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

    let dir = cluster.new_dir("restored");
    let mut a = cluster.repo_args(&repo);
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
    assert_eq!(marks(&server), "1,2,3,4,5");
    let check = server.psql(
        "postgres",
        "SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT sum(delta) FROM pgbench_history)",
    );
    assert_eq!(check, "t", "pgbench's balances do not add up");
    step!("restored from the repository alone: every committed row is there");
}
