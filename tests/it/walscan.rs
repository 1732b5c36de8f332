//! pgjet's WAL scan (crates/pgjet-core/src/pg/walscan.rs) against PostgreSQL's own reading of the same WAL:
//! after a workload (inserts, updates with full-page images, an index, a truncation, a drop,
//! a database created by each strategy and dropped, a table in a tablespace), every main-fork
//! block reference `pg_waldump` prints between the checkpoint's redo point and the end is one
//! the scan counts, and the limits (creation, truncation, a database) cover what they must.
//! PostgreSQL 15 and 18.

use crate::common::*;
use std::collections::{BTreeMap, BTreeSet};

/// Blocks by relation: (tablespace, database, relfilenumber) → block numbers.
type RelationBlocks = BTreeMap<(u32, u32, u32), BTreeSet<u32>>;

/// (tablespace, database, relfilenumber) → main-fork blocks pg_waldump lists, with the
/// number of main-fork block references in all.
fn waldump_blocks(c: &Cluster, from: &str, to: &str) -> (RelationBlocks, u64) {
    let r = run_as_postgres(
        &c.pg().tool("pg_waldump"),
        &args![
            "--path",
            c.data().join("pg_wal").display(),
            "--start",
            from,
            "--end",
            to
        ],
        None,
    );
    assert!(r.success(), "pg_waldump failed:\n{r}");
    let mut out: BTreeMap<(u32, u32, u32), BTreeSet<u32>> = BTreeMap::new();
    let mut refs = 0;
    for line in r.stdout.lines() {
        // "blkref #0: rel 1663/5/16384 fork fsm blk 2" (15) or "rel 1663/5/16384, fork fsm, blk 2"
        // (16+); the main fork is not named.
        for part in line.split("blkref #").skip(1) {
            let Some(rel) = part.split("rel ").nth(1) else {
                continue;
            };
            let ids: Vec<u32> = rel
                .split(|ch: char| !ch.is_ascii_digit() && ch != '/')
                .next()
                .unwrap_or("")
                .split('/')
                .filter_map(|x| x.parse().ok())
                .collect();
            let fork_named = rel.split(" blk ").next().unwrap_or("").contains("fork");
            let blk: Option<u32> = rel
                .split(" blk ")
                .nth(1)
                .and_then(|b| b.split(|ch: char| !ch.is_ascii_digit()).next())
                .and_then(|b| b.parse().ok());
            if let (3, false, Some(b)) = (ids.len(), fork_named, blk) {
                out.entry((ids[0], ids[1], ids[2])).or_default().insert(b);
                refs += 1;
            }
        }
    }
    (out, refs)
}

fn scenario(pg: Pg, tag: &str) {
    let c = Cluster::new(&pg, tag);
    // CREATE DATABASE ... FILE_COPY checkpoints: keep the WAL the scan reads.
    c.psql("postgres", "ALTER SYSTEM SET wal_keep_size = '1GB'");
    c.psql("postgres", "SELECT pg_reload_conf()");
    let ts = c.root.join("ts_scan");
    mkdir_pg(&ts, 0o700);
    c.psql(
        "postgres",
        &format!(
            "CREATE TABLE keep_t AS SELECT i, md5(i::text) v FROM generate_series(1, 20000) i;\n\
             CREATE TABLE trunc_t AS SELECT i FROM generate_series(1, 50000) i;\n\
             CREATE TABLE drop_t AS SELECT i FROM generate_series(1, 1000) i;\n\
             CREATE TABLESPACE ts_scan LOCATION '{}';\n\
             CHECKPOINT;",
            ts.display()
        ),
    );
    let from = c.psql("postgres", "SELECT redo_lsn FROM pg_control_checkpoint()");
    let spc = c.tablespace_oid("ts_scan");
    let node = |t: &str| -> (u32, u32, u32) {
        let v = c.psql(
            "postgres",
            &format!(
                "SELECT coalesce(nullif(reltablespace, 0), 1663) || ' ' || \
                 (SELECT oid FROM pg_database WHERE datname = current_database()) || ' ' || \
                 relfilenode FROM pg_class WHERE relname = '{t}'"
            ),
        );
        let n: Vec<u32> = v.split(' ').map(|x| x.parse().unwrap()).collect();
        (n[0], n[1], n[2])
    };
    let trunc_before = node("trunc_t");
    c.psql(
        "postgres",
        "UPDATE keep_t SET v = 'changed' WHERE i % 50 = 0;\n\
             CREATE INDEX ON keep_t (i);\n\
             DELETE FROM trunc_t WHERE i > 100;\n\
             VACUUM trunc_t;\n\
             DROP TABLE drop_t;\n\
             CREATE TABLE new_t TABLESPACE ts_scan AS SELECT i FROM generate_series(1, 5000) i;\n\
             CREATE DATABASE db_copy STRATEGY FILE_COPY;\n\
             CREATE DATABASE db_wal STRATEGY WAL_LOG;\n\
             DROP DATABASE db_copy;",
    );
    let to = c.psql("postgres", "SELECT pg_current_wal_insert_lsn()");
    let (dumped, refs) = waldump_blocks(&c, &from, &to);
    let parse = |l: &str| {
        let (a, b) = l.split_once('/').unwrap();
        (u64::from_str_radix(a, 16).unwrap() << 32) | u64::from_str_radix(b, 16).unwrap()
    };
    let seg_size: u64 = c
        .psql(
            "postgres",
            "SELECT setting::bigint * 1 FROM pg_settings WHERE name = 'wal_segment_size'",
        )
        .parse()
        .unwrap();
    let tsdir = format!(
        "PG_{}_{}",
        c.psql("postgres", "SHOW server_version_num")
            .parse::<u32>()
            .unwrap()
            / 10000,
        c.psql(
            "postgres",
            "SELECT catalog_version_no FROM pg_control_system()"
        )
    );
    let pg_wal = c.data().join("pg_wal");
    let fetch = |segno: u64| -> pgjet_core::error::Result<Option<Vec<u8>>> {
        let name = pgjet_core::pg::lsn::wal_segment_name(1, segno, seg_size);
        Ok(std::fs::read(pg_wal.join(name)).ok())
    };
    let (scanned, segments) = pgjet_core::pg::walscan::scan(
        fetch,
        seg_size,
        pgjet_core::pg::lsn::Lsn(parse(&from)),
        pgjet_core::pg::lsn::Lsn(parse(&to)),
        &tsdir,
    );
    let changes = scanned.unwrap_or_else(|why| panic!("the scan could not tell: {why}"));
    step!(
        "{tag}: {from} to {to}: {segments} segments, {} block references (pg_waldump: {refs} in {} relations)",
        changes.blocks,
        dumped.len()
    );
    assert_eq!(
        changes.blocks, refs,
        "the scan and pg_waldump count different main-fork block references"
    );
    // The same WAL read as a delta reads it: the target's own pg_wal first, which ends in
    // the middle of a page (a standby stopped there; past it the bytes of a recycled file,
    // whole records of older WAL among them), then the rest from the primary, only the
    // pages the scan needs. The join lists the same blocks.
    let (from_lsn, to_lsn) = (parse(&from), parse(&to));
    let cut = from_lsn + (to_lsn - from_lsn) / 2;
    let cut_seg = cut / seg_size;
    let older = fetch(cut_seg - 1)
        .unwrap()
        .or_else(|| fetch(cut_seg + 1).unwrap());
    let own = |segno: u64| -> pgjet_core::error::Result<Option<Vec<u8>>> {
        if segno > cut_seg {
            return Ok(None);
        }
        let mut b = fetch(segno)?.unwrap();
        if segno == cut_seg {
            let at = (cut % seg_size) as usize;
            match &older {
                Some(old) => b[at..].copy_from_slice(&old[at..]),
                None => b[at..].fill(0),
            }
        }
        Ok(Some(b))
    };
    let mut joined = pgjet_core::pg::walscan::Scan::new(pgjet_core::pg::lsn::Lsn(from_lsn));
    let why = joined
        .run(own, seg_size, pgjet_core::pg::lsn::Lsn(to_lsn), &tsdir)
        .expect_err("the own WAL ends before `to`");
    let at = joined.at();
    assert!(
        at.0 <= cut && at.0 > from_lsn,
        "stopped at {at}, cut at {cut:X}: {why}"
    );
    let rest = |segno: u64| -> pgjet_core::error::Result<Option<Vec<u8>>> {
        let part = pgjet_core::pg::walscan::segment_part(
            segno,
            seg_size,
            at,
            pgjet_core::pg::lsn::Lsn(to_lsn),
        );
        Ok(fetch(segno)?.map(|b| {
            let n = (part.end as usize).min(b.len());
            pgjet_core::pg::walscan::padded(&b[part.start as usize..n], part, seg_size)
        }))
    };
    joined
        .run(rest, seg_size, pgjet_core::pg::lsn::Lsn(to_lsn), &tsdir)
        .unwrap_or_else(|why| panic!("the rest could not be read: {why}"));
    step!("{tag}: own WAL cut at {cut:X} ({why}); joined at {at}");
    assert_eq!(
        joined.changes.blocks, refs,
        "the joined scan lists other blocks"
    );
    let path = |r: &(u32, u32, u32)| match r.0 {
        1664 => format!("global/{}", r.2),
        1663 => format!("base/{}/{}", r.1, r.2),
        s => format!("pg_tblspc/{s}/{tsdir}/{}/{}", r.1, r.2),
    };
    for (r, blocks) in &dumped {
        let max = *blocks.iter().max().unwrap();
        if max >= 131072 {
            continue;
        }
        let got: BTreeSet<u32> = changes
            .blocks_of(&path(r), u64::from(max) + 1)
            .into_iter()
            .collect();
        let missing: Vec<&u32> = blocks.difference(&got).collect();
        assert!(
            missing.is_empty(),
            "{}: blocks {missing:?} not found by the scan",
            path(r)
        );
    }
    // The truncated relation: everything from its new length on counts as changed.
    let tail = changes.blocks_of(&path(&trunc_before), 300);
    assert!(
        tail.contains(&299) && tail.contains(&250),
        "the truncation's limit is missing: {tail:?}"
    );
    // The new table in the tablespace was created in the range: all of it.
    let new_t = node("new_t");
    assert_eq!(new_t.0.to_string(), spc);
    assert_eq!(changes.blocks_of(&path(&new_t), 40).len(), 40);
    // A database created in the range: every block of every relation in it.
    let db_wal: u32 = c
        .psql(
            "postgres",
            "SELECT oid FROM pg_database WHERE datname = 'db_wal'",
        )
        .parse()
        .unwrap();
    assert_eq!(
        changes.blocks_of(&format!("base/{db_wal}/999999"), 7).len(),
        7
    );
    // A relation WAL never named is not listed.
    assert!(changes.blocks_of("base/5/999999", 10).is_empty());
}

#[test]
fn walscan_matches_pg_waldump_pg15() {
    scenario(Pg::v15(), "walscan-15");
}

#[test]
fn walscan_matches_pg_waldump_pg18() {
    scenario(Pg::v18(), "walscan-18");
}
