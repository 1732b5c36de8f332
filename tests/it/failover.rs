//! Recovery settings inherited from the source (issue 17), as a user meets them, against real
//! PostgreSQL 15 (and 18 for the failover without a slot):
//! - Failover, then re-sync: primary A, standby B made by `replica-create --slot r1 --start`;
//!   A stopped (fast), B promoted and written to; A re-synced from B with
//!   `replica-create --delta --start`, without a slot and with a new slot r2. The copied
//!   postgresql.auto.conf carries B's own `primary_conninfo` (to A) and
//!   `primary_slot_name = 'r1'` from its standby days; pgjet must comment them out, so A
//!   streams from B (r1 does not exist on B) and its settings name B, and r2 where asked.
//! - Restore: a backup whose postgresql.auto.conf carries a `restore_command` and a stale
//!   `recovery_target_time` (set with ALTER SYSTEM before the backup). The default `--type`
//!   comments both out, writes pgjet's `restore_command`, and the restored cluster replays the
//!   archive to its end and is promoted; `--type preserve` keeps the file as the backup had it.

use crate::common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------------
// Reading postgresql.auto.conf as PostgreSQL would.

/// The settings of a configuration file PostgreSQL would read, in file order: (name
/// lower-cased, value with its quotes removed), as pgjet reads them.
fn active_settings(text: &str) -> Vec<(String, String)> {
    pgjet_core::pgdata::own_settings::settings_in(text)
}

/// Values of the active lines setting `name` in `text`, in file order.
fn active(text: &str, name: &str) -> Vec<String> {
    active_settings(text)
        .into_iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v)
        .collect()
}

/// The original lines setting `name` that pgjet commented out in `text`: each is written as
/// `#<original line>` right after a note
/// `# <name> inherited from the source, commented out by <note> on YYYY-MM-DD:`.
/// Panics when a commented line of `name` lacks its note.
fn commented_with_note(text: &str, name: &str, note: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let prefix = format!("# {name} inherited from the source, commented out by {note} on ");
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(head) = l.strip_prefix(&prefix) else {
            continue;
        };
        let date = head.strip_suffix(':').unwrap_or("");
        assert!(
            date.len() == 10
                && date.bytes().enumerate().all(|(j, b)| if j == 4 || j == 7 {
                    b == b'-'
                } else {
                    b.is_ascii_digit()
                }),
            "the note {l:?} does not end with a date YYYY-MM-DD and a colon:\n{text}"
        );
        let original = lines
            .get(i + 1)
            .and_then(|n| n.strip_prefix('#'))
            .unwrap_or_else(|| {
                panic!("the note {l:?} is not followed by a commented line:\n{text}")
            });
        let set = active_settings(original);
        assert!(
            set.len() == 1 && set[0].0 == name,
            "the line after the note {l:?} does not set {name}: {original:?}\n{text}"
        );
        out.push(original.to_string());
    }
    out
}

/// The `port` of a libpq connection string (`key=value` words; values may be quoted).
fn conninfo_port(conninfo: &str) -> Option<String> {
    conninfo
        .split_whitespace()
        .find_map(|w| w.strip_prefix("port="))
        .map(|p| p.trim_matches('\'').to_string())
}

fn auto_conf(data: &Path) -> String {
    let p = data.join("postgresql.auto.conf");
    fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Every recovery setting pgjet's finish comments out when inherited, to check that no
/// other one is left active.
use pgjet_core::pgdata::finish::RECOVERY_SETTINGS;

/// The active recovery settings of `text` (names, file order).
fn active_recovery_names(text: &str) -> Vec<String> {
    active_settings(text)
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| RECOVERY_SETTINGS.contains(&n.as_str()))
        .collect()
}

// ------------------------------------------------------------------------------------------
// Servers.

/// Waits (up to 60 s) until `sql` on `server` answers `want`; panics with `what`, the last
/// answer and the server's log otherwise.
fn wait_answer(server: &Server, sql: &str, want: &str, what: &str) {
    let mut last = String::new();
    let ok = wait_for(Duration::from_secs(60), || {
        let r = server.psql_run("postgres", sql);
        last = format!("{}{}", r.stdout.trim(), r.stderr.trim());
        (r.success() && r.stdout.trim() == want).then_some(())
    });
    assert!(
        ok.is_some(),
        "{what}: `{sql}` on {} answers {last:?}, not {want:?}, after 60 s\n--- server log (tail) ---\n{}",
        server.data.display(),
        server.log_tail()
    );
}

/// `pg_ctl <args> -D data` as postgres with `pg`'s binaries; panics unless it succeeds.
fn pg_ctl(pg: &Pg, data: &Path, a: &[&str]) {
    let mut v: Vec<String> = a.iter().map(|s| s.to_string()).collect();
    v.extend(args!["-D", data.display()]);
    run_as_postgres(&pg.tool("pg_ctl"), &v, None).ok();
}

// ------------------------------------------------------------------------------------------
// Failover, then the former primary re-synced from the new one.

/// The failover recipe (see the module's documentation), A re-synced with `--slot` `slot`
/// when given.
fn failover_then_resync(pg: Pg, tag: &str, slot: Option<&str>) {
    let t0 = Instant::now();
    let cluster = Cluster::new(&pg, tag);
    let a_data = cluster.data().to_path_buf();
    let a_port = cluster.port();
    // 18 summarizes WAL (B inherits the setting): A, shut down cleanly before B's
    // promotion, holds nothing B lacks, so its changed blocks come from B's summaries along
    // timelines 1 and 2 (a diverged A is compared by hash: the test below).
    let summaries = pg.major == "18";
    if summaries {
        cluster.summarize_wal();
    }
    cluster.psql(
        "postgres",
        "CREATE TABLE events (id int PRIMARY KEY, origin text);\n\
         INSERT INTO events SELECT i, 'A' FROM generate_series(1, 1000) i;",
    );

    // 1. Standby B of A, streaming from slot r1.
    let b_data = cluster.new_dir("b");
    let b_port = free_port();
    let (r, b) = replica_create_started(
        &pg,
        &cluster.server,
        &b_data,
        b_port,
        &["--slot", "r1"],
        "B from A",
    );
    step!("B made from A in {:.1}s", r.elapsed.as_secs_f64());
    cluster.psql(
        "postgres",
        "INSERT INTO events SELECT i, 'A' FROM generate_series(1001, 1100) i",
    );
    wait_answer(
        &b,
        "SELECT count(*) FROM events",
        "1100",
        "rows written on A reach B",
    );
    assert_eq!(b.psql("postgres", "SELECT pg_is_in_recovery()"), "t");
    // What A will inherit: B's own standby settings.
    let b_auto = auto_conf(&b_data);
    assert_eq!(
        active(&b_auto, "primary_slot_name"),
        ["r1"],
        "B's postgresql.auto.conf must name slot r1 (the setting A will inherit):\n{b_auto}"
    );
    let b_conninfo = active(&b_auto, "primary_conninfo");
    assert!(
        b_conninfo.len() == 1 && conninfo_port(&b_conninfo[0]) == Some(a_port.to_string()),
        "B's postgresql.auto.conf must hold one primary_conninfo, to A (port {a_port}):\n{b_auto}"
    );

    // 2. Failover: A stopped, B promoted and written to.
    pg_ctl(&pg, &a_data, &["stop", "-m", "fast", "-w", "-t", "60"]);
    pg_ctl(&pg, &b_data, &["promote", "-w", "-t", "60"]);
    b.wait_promoted(Duration::from_secs(60));
    b.psql(
        "postgres",
        "INSERT INTO events SELECT i, 'B' FROM generate_series(1101, 1200) i",
    );

    // 3. A re-synced from B.
    let mut extra = vec!["--delta"];
    if let Some(s) = slot {
        extra.extend(["--slot", s]);
    }
    let (r, a) = replica_create_started(&pg, &b, &a_data, a_port, &extra, "A re-synced from B");
    let summary: serde_json::Value = serde_json::from_str(r.stdout.trim())
        .unwrap_or_else(|e| panic!("replica-create --output json is not JSON ({e}):\n{r}"));
    assert!(
        summary["delta_same"].as_u64().is_some() && summary["delta_copied"].as_u64().is_some(),
        "the re-sync must have run as a delta (A's files compared):\n{r}"
    );
    if summaries {
        assert!(
            r.stderr.contains("along timelines 1, 2 list"),
            "A's changed blocks must come from B's summaries along timelines 1 and 2:\n{r}"
        );
    }
    step!(
        "A re-synced from B in {:.1}s ({} bytes found unchanged, {} copied)",
        r.elapsed.as_secs_f64(),
        summary["delta_same"],
        summary["delta_copied"]
    );

    // A is a standby of B and streams from it.
    assert_eq!(a.psql("postgres", "SELECT pg_is_in_recovery()"), "t");
    wait_answer(
        &a,
        "SELECT status || ' ' || sender_port FROM pg_stat_wal_receiver",
        &format!("streaming {b_port}"),
        "A's WAL receiver streams from B",
    );
    wait_answer(
        &b,
        "SELECT string_agg(state, ',') FROM pg_stat_replication",
        "streaming",
        "B shows one standby streaming",
    );
    match slot {
        Some(s) => wait_answer(
            &b,
            "SELECT string_agg(slot_name || ':' || active, ',') FROM pg_replication_slots",
            &format!("{s}:true"),
            "B's only slot is the new one, used by A",
        ),
        None => assert_eq!(
            b.psql("postgres", "SELECT count(*) FROM pg_replication_slots"),
            "0",
            "B has no slot: A re-synced without --slot must stream without one"
        ),
    }
    assert_eq!(
        a.psql("postgres", "SELECT count(*) FROM events WHERE origin = 'B'"),
        "100",
        "rows written on B before the re-sync are on A"
    );
    b.psql(
        "postgres",
        "INSERT INTO events SELECT i, 'B' FROM generate_series(1201, 1300) i",
    );
    wait_answer(
        &a,
        "SELECT count(*) || ' ' || max(id) FROM events",
        "1300 1300",
        "rows written on B after the re-sync reach A",
    );

    // A's postgresql.auto.conf: pgjet's settings only, B's own commented out with the note.
    let a_auto = auto_conf(&a_data);
    let conninfo = active(&a_auto, "primary_conninfo");
    assert!(
        conninfo.len() == 1 && conninfo_port(&conninfo[0]) == Some(b_port.to_string()),
        "A must have exactly one active primary_conninfo, to B (port {b_port}):\n{a_auto}"
    );
    let want_slot: Vec<String> = slot.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        active(&a_auto, "primary_slot_name"),
        want_slot,
        "A's active primary_slot_name:\n{a_auto}"
    );
    let names = active_recovery_names(&a_auto);
    let want_names: Vec<&str> = match slot {
        Some(_) => vec!["primary_conninfo", "primary_slot_name"],
        None => vec!["primary_conninfo"],
    };
    assert_eq!(names, want_names, "A's active recovery settings:\n{a_auto}");
    let old_slot = commented_with_note(&a_auto, "primary_slot_name", "pgjet replica-create");
    assert_eq!(
        old_slot.len(),
        1,
        "B's primary_slot_name must be there once, commented out with pgjet's note:\n{a_auto}"
    );
    assert_eq!(active_settings(&old_slot[0])[0].1, "r1", "{a_auto}");
    assert!(
        a_auto.lines().filter(|l| l.contains("'r1'")).count() == 1,
        "'r1' must appear only in the commented line:\n{a_auto}"
    );
    let old_conninfo = commented_with_note(&a_auto, "primary_conninfo", "pgjet replica-create");
    assert!(
        old_conninfo.len() == 1
            && conninfo_port(&active_settings(&old_conninfo[0])[0].1) == Some(a_port.to_string()),
        "B's primary_conninfo (to A, port {a_port}) must be there once, commented out:\n{a_auto}"
    );
    drop(a);
    drop(b);
    step!("failover and re-sync ({slot:?}) passed in {}", secs(t0));
}

/// A former primary that kept writing after its standby was promoted (split brain), then
/// re-synced from the new primary with `--delta` on PostgreSQL 18 with WAL summaries: its
/// WAL goes past the switch point, so the new primary's summaries do not list what it
/// wrote alone; pgjet must compare by hash (and say why), and A must end up holding B's rows
/// and none of its own diverged ones.
#[test]
fn pg18_diverged_former_primary_is_compared_by_hash() {
    former_primary_compared_by_hash(false);
}

/// A crashed primary (stopped `-m immediate`, its last writes perhaps never streamed) and its
/// standby promoted: `replica-create --delta` of the former primary cannot trust the WAL
/// summaries (the crashed primary's WAL may go past the switch point) and compares by hash,
/// saying why; A then holds exactly B's rows.
#[test]
fn pg18_crashed_former_primary_is_compared_by_hash() {
    former_primary_compared_by_hash(true);
}

/// A, a PostgreSQL 18 primary summarizing WAL with table `events` (5000 rows, origin 'A'),
/// and B, its standby made by `replica-create` and started, holding those rows: (the
/// installation, A, B's data directory, B's port, B). `tag` names A's directories.
fn primary_and_standby_18(tag: &str) -> (Pg, Cluster, PathBuf, u16, Server) {
    let pg = Pg::v18();
    let cluster = Cluster::new(&pg, tag);
    cluster.summarize_wal();
    cluster.psql(
        "postgres",
        "CREATE TABLE events (id int PRIMARY KEY, origin text);\n\
         INSERT INTO events SELECT i, 'A' FROM generate_series(1, 5000) i;",
    );
    let b_data = cluster.new_dir("b");
    let b_port = free_port();
    let (_, b) = replica_create_started(&pg, &cluster.server, &b_data, b_port, &[], "B from A");
    wait_answer(
        &b,
        "SELECT count(*) FROM events",
        "5000",
        "A's rows reach B",
    );
    (pg, cluster, b_data, b_port, b)
}

/// Rows and pages only `s` has, marked `origin`: every 7th row of `events` changed, 500 rows
/// added (ids 9001-9500); then a CHECKPOINT when `checkpoint`.
fn write_alone(s: &Server, origin: &str, checkpoint: bool) {
    s.psql(
        "postgres",
        &format!(
            "UPDATE events SET origin = '{origin}' WHERE id % 7 = 0;\n\
             INSERT INTO events SELECT i, '{origin}' FROM generate_series(9001, 9500) i;{}",
            if checkpoint { "\nCHECKPOINT;" } else { "" }
        ),
    );
}

/// A copy promoted away from its primary, then re-synced from it (a standby promoted for a
/// test, or by mistake, and put back): the copy is on timeline 2, which is not in the
/// history of the primary's timeline 1, so the primary's WAL summaries say nothing about
/// what the copy wrote on its own. `replica-create --delta` must compare by hash, saying
/// why, and the copy must end with exactly the primary's rows (PostgreSQL 18, summaries on).
#[test]
fn pg18_promoted_copy_resynced_from_its_primary_is_compared_by_hash() {
    let (pg, cluster, b_data, b_port, b) = primary_and_standby_18("promotedcopy18");
    pg_ctl(&pg, &b_data, &["promote", "-w", "-t", "60"]);
    b.wait_promoted(Duration::from_secs(60));
    // B writes on its own timeline, then shuts down cleanly; A writes too.
    write_alone(&b, "B alone", true);
    pg_ctl(&pg, &b_data, &["stop", "-m", "fast", "-w", "-t", "60"]);
    drop(b);
    cluster.psql(
        "postgres",
        "INSERT INTO events SELECT i, 'A' FROM generate_series(5001, 5100) i",
    );
    let (r, b) = replica_create_started(
        &pg,
        &cluster.server,
        &b_data,
        b_port,
        &["--delta"],
        "B re-synced from A",
    );
    assert!(
        r.stderr.contains("WAL summaries not used") && r.stderr.contains("not in the history"),
        "B must be compared by hash, saying its timeline is not in A's history:\n{r}"
    );
    let rows = "SELECT count(*) || ' ' || sum(id) || ' ' || count(*) FILTER (WHERE origin = 'B alone') FROM events";
    let want = cluster.psql("postgres", rows);
    assert!(want.starts_with("5100 ") && want.ends_with(" 0"), "{want}");
    wait_answer(&b, rows, &want, "B holds exactly A's rows");
    step!("a promoted copy was compared by hash and holds its primary's rows again");
}

/// A, a PostgreSQL 18 primary summarizing WAL, and B, its standby, promoted. A either wrote
/// on alone after the promotion and was shut down cleanly (`crashed` false: its shutdown
/// checkpoint lies past the switch point), or wrote what B never received and crashed before
/// it (`crashed` true: its own WAL goes past the switch point). Either way the delta onto A
/// compares by hash, the log naming the reason, and A ends with B's rows.
fn former_primary_compared_by_hash(crashed: bool) {
    let (pg, cluster, b_data, _, b) =
        primary_and_standby_18(if crashed { "crashed18" } else { "diverged18" });
    let a_data = cluster.data().to_path_buf();
    let a_port = cluster.port();
    if crashed {
        // A's last writes never reach B: B stops first; then A crashes, and B comes back
        // (A is gone) to be promoted.
        pg_ctl(&pg, &b_data, &["stop", "-m", "fast", "-w", "-t", "60"]);
        write_alone(&cluster.server, "A alone", false);
        // Flushed (the fixture commits with synchronous_commit off): A's WAL goes past what
        // B has, on A's disk.
        cluster.psql(
            "postgres",
            "SET synchronous_commit = on; CREATE TABLE flushed_alone (i int)",
        );
        pg_ctl(&pg, &a_data, &["stop", "-m", "immediate", "-w", "-t", "60"]);
        let log = b.log.display().to_string();
        pg_ctl(&pg, &b_data, &["start", "-w", "-t", "60", "-l", &log]);
    }
    pg_ctl(&pg, &b_data, &["promote", "-w", "-t", "60"]);
    b.wait_promoted(Duration::from_secs(60));
    b.psql(
        "postgres",
        "INSERT INTO events SELECT i, 'B' FROM generate_series(5001, 5100) i",
    );
    if !crashed {
        // A goes on alone: rows and pages B never had, past the switch point.
        write_alone(&cluster.server, "A alone", true);
        pg_ctl(&pg, &a_data, &["stop", "-m", "fast", "-w", "-t", "60"]);
    }
    let (r, a) =
        replica_create_started(&pg, &b, &a_data, a_port, &["--delta"], "A re-synced from B");
    let reason = if crashed {
        "own WAL on timeline 1 goes on past the switch point"
    } else {
        "is at or past the switch point"
    };
    assert!(
        r.stderr.contains("WAL summaries not used") && r.stderr.contains(reason),
        "A must be compared by hash, saying why ({reason}):\n{r}"
    );
    let rows = "SELECT count(*) || ' ' || sum(id) || ' ' || count(*) FILTER (WHERE origin = 'A alone') FROM events";
    let want = b.psql("postgres", rows);
    if !crashed {
        assert!(want.starts_with("5100 ") && want.ends_with(" 0"), "{want}");
    }
    wait_answer(&a, rows, &want, "A holds exactly B's rows");
    step!(
        "a former primary ({}) was compared by hash and holds B's rows",
        if crashed { "crashed" } else { "diverged" }
    );
}

/// The failover recipe, A re-synced without `--slot`: the inherited `primary_slot_name = 'r1'`
/// (no such slot on B) must not be in effect.
#[test]
fn pg15_failover_resync_without_slot() {
    failover_then_resync(Pg::v15(), "failover15", None);
}

/// The failover recipe, A re-synced with `--slot r2`: A streams from the new slot r2, and
/// r1 is left only as a comment.
#[test]
fn pg15_failover_resync_with_new_slot() {
    failover_then_resync(Pg::v15(), "failover15-slot", Some("r2"));
}

/// The failover recipe without `--slot` against PostgreSQL 18.
#[test]
fn pg18_failover_resync_without_slot() {
    failover_then_resync(Pg::v18(), "failover18", None);
}

// ------------------------------------------------------------------------------------------
// Restore of a backup carrying recovery settings.

/// The inherited `restore_command`, set before the backup: it reads an archive that is gone.
const OLD_RESTORE_COMMAND: &str = "cp /srv/old-archive/%f \"%p\"";
/// The inherited `recovery_target_time`, set before the backup: long before this cluster
/// existed, so recovery honouring it stops at the first commit it replays.
const STALE_TARGET_TIME: &str = "2020-01-01 00:00:00+00";

/// `pgjet restore --stanza main --repo-path <repo> --pg-path <dir> --set <label> <extra>`.
fn restore_cmd(repo: &Path, dir: &Path, label: &str, extra: &[&str]) -> Vec<String> {
    let mut a = args![
        "restore",
        "--stanza",
        "main",
        "--repo-path",
        repo.display(),
        "--pg-path",
        dir.display(),
        "--set",
        label
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// A backup whose postgresql.auto.conf carries [`OLD_RESTORE_COMMAND`] and
/// [`STALE_TARGET_TIME`], rows 2 and 3 written after it and archived. Default `--type`: the
/// restored cluster replays the archive to its end (rows 1,2,3) and is promoted; its
/// postgresql.auto.conf has one active restore_command (pgjet's archive-get), no other active
/// recovery setting, and both inherited lines commented out under pgjet's note. `--type
/// preserve`: postgresql.auto.conf is byte for byte the source's.
#[test]
fn pg15_restore_replaces_inherited_recovery_settings() {
    let t0 = Instant::now();
    let pg = Pg::v15();
    let cluster = Cluster::new(&pg, "inherited15");
    let repo = cluster.repo.clone();
    // Archiving into the repository with pgjet (archive_mode needs a restart).
    let archive_command = format!(
        "{} --stanza=main --repo-path={} archive-push %p",
        pgjet_bin().display(),
        repo.display()
    );
    cluster.psql(
        "postgres",
        &format!(
            "ALTER SYSTEM SET archive_mode = 'on';\n\
             ALTER SYSTEM SET archive_command = '{}';",
            archive_command.replace('\'', "''")
        ),
    );
    let s = &cluster.server;
    pg_ctl(
        &pg,
        &s.data,
        &[
            "restart",
            "-w",
            "-t",
            "60",
            "-m",
            "fast",
            "-l",
            &s.log.display().to_string(),
            "-o",
            &format!("-p {} -k {}", s.port, s.sock.display()),
        ],
    );
    cluster.pgjet_cmd("stanza-create", &repo, &[]).ok();
    cluster.psql(
        "postgres",
        "CREATE TABLE marks (i int); INSERT INTO marks VALUES (1);",
    );
    // The inherited settings: ignored by a running primary, read by whatever recovers from a
    // copy of its data directory.
    cluster.psql(
        "postgres",
        &format!(
            "ALTER SYSTEM SET restore_command = '{}';\n\
             ALTER SYSTEM SET recovery_target_time = '{STALE_TARGET_TIME}';",
            OLD_RESTORE_COMMAND.replace('\'', "''")
        ),
    );
    let source_auto = auto_conf(cluster.data());
    assert_eq!(
        active(&source_auto, "restore_command"),
        [OLD_RESTORE_COMMAND],
        "{source_auto}"
    );
    assert_eq!(
        active(&source_auto, "recovery_target_time"),
        [STALE_TARGET_TIME],
        "{source_auto}"
    );
    cluster.full_backup(&repo);
    let backups = info_backups(&repo, "main");
    assert_eq!(backups.len(), 1, "one backup expected: {backups:?}");
    let label = backups[0]["label"].as_str().unwrap().to_string();
    // Rows only the archive holds; check switches the WAL and waits for it in the archive.
    cluster.psql("postgres", "INSERT INTO marks VALUES (2)");
    cluster.psql("postgres", "INSERT INTO marks VALUES (3)");
    cluster.pgjet_cmd("check", &repo, &[]).ok();

    // Default --type: to the end of the archive, with pgjet's restore_command only.
    let dir = cluster.new_dir("restore-default");
    pgjet_ok(&restore_cmd(
        &repo,
        &dir,
        &label,
        &["--archive-mode", "off"],
    ));
    let auto = auto_conf(&dir);
    let server = cluster.start_other(&dir, free_port());
    server.wait_promoted(Duration::from_secs(120));
    assert_eq!(
        server.psql(
            "postgres",
            "SELECT string_agg(i::text, ',' ORDER BY i) FROM marks"
        ),
        "1,2,3",
        "the restored cluster must replay the archive to its end (rows 2 and 3 were written after the backup)"
    );
    drop(server);
    let note = format!("pgjet restore of backup {label}");
    let rc = active(&auto, "restore_command");
    assert!(
        rc.len() == 1 && rc[0].contains("archive-get") && rc[0].contains(&*pgjet_bin().to_string_lossy()),
        "the restored postgresql.auto.conf must have exactly one active restore_command, pgjet's:\n{auto}"
    );
    assert_eq!(
        active_recovery_names(&auto),
        ["restore_command"],
        "no inherited recovery setting may stay active:\n{auto}"
    );
    let old_rc = commented_with_note(&auto, "restore_command", &note);
    assert!(
        old_rc.len() == 1 && active_settings(&old_rc[0])[0].1 == OLD_RESTORE_COMMAND,
        "the inherited restore_command must be there once, commented out with pgjet's note:\n{auto}"
    );
    let old_target = commented_with_note(&auto, "recovery_target_time", &note);
    assert!(
        old_target.len() == 1 && active_settings(&old_target[0])[0].1 == STALE_TARGET_TIME,
        "the inherited recovery_target_time must be there once, commented out with pgjet's note:\n{auto}"
    );

    // --type preserve: the file stays as the backup had it.
    let dir = cluster.new_dir("restore-preserve");
    pgjet_ok(&restore_cmd(&repo, &dir, &label, &["--type", "preserve"]));
    let auto = auto_conf(&dir);
    assert_eq!(
        auto, source_auto,
        "restore --type preserve must keep postgresql.auto.conf as the backup had it"
    );
    step!(
        "restore with inherited recovery settings passed in {}",
        secs(t0)
    );
}
