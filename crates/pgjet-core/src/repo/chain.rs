//! The chain of a differential or incremental backup: the older backups whose frames its
//! pieces name ([`super::manifest::ManifestEnd::references`]), each checked before a byte is
//! read from it.
use super::{Backup, BackupSummary};
use crate::codec::CompressType;
use crate::error::{Error, Result};

/// The older backups a backup's pieces name, with the compression of their frames, in the
/// order of `end.references` (oldest first: labels sort by time).
///
/// Each reference must be complete (its summary present and valid, of this stanza), older
/// than the backup (its label sorts before), and of the same cluster (system identifier,
/// major version, block size). A full backup has none and gets an empty chain.
///
/// Errors: [`Error::Repo`] naming the first reference that is missing, incomplete, newer or
/// of another cluster, with what to do.
pub fn open_chain(backup: &Backup, summary: &BackupSummary) -> Result<Vec<(String, CompressType)>> {
    let (label, h) = (backup.label(), &summary.header);
    let mut chain = Vec::with_capacity(summary.end.references.len());
    for r in &summary.end.references {
        if r.as_str() >= label {
            return Err(Error::Repo(format!(
                "backup {label} names backup {r} as a reference, but a reference must be older"
            )));
        }
        let other = backup.stanza().backup(r);
        let s = other.summary().map_err(|e| {
            Error::Repo(format!(
                "backup {label} depends on backup {r}, which cannot be read"
            ))
            .because(e)
            .with_hint("restore or verify another backup, or take a new full backup")
        })?;
        let o = &s.header;
        if o.system_identifier != h.system_identifier
            || o.pg_version != h.pg_version
            || o.block_size != h.block_size
        {
            return Err(Error::Repo(format!(
                "backup {label} depends on backup {r}, which is of another cluster \
                 (system identifier {} PostgreSQL {}, against {} PostgreSQL {})",
                o.system_identifier, o.pg_version, h.system_identifier, h.pg_version
            )));
        }
        chain.push((r.clone(), o.compression.kind));
    }
    Ok(chain)
}

/// What the cluster is now, for choosing a reference ([`choose_reference`]).
pub struct ClusterNow {
    pub system_identifier: u64,
    pub pg_version: String,
    /// Bytes.
    pub block_size: u32,
    pub data_checksums: bool,
    /// The timeline of the latest checkpoint (pg_control_checkpoint()).
    pub timeline: u32,
}

/// The reference of a differential (`diff_only`: the newest full backup) or incremental
/// backup (the newest complete backup of any type) among `complete` (labels, oldest first),
/// or why there can be none and the backup must be full.
///
/// A backup can serve as reference only when its blocks are exactly what the page LSN rule
/// assumes: same cluster and major version, 8 KiB blocks ([`crate::pg::checksum::BLCKSZ`]),
/// data checksums not turned on since (pages written before then carry no checksum, and
/// hint-bit changes were not WAL-logged), and the same timeline (after a promotion, pages
/// of the old timeline past the branch point may sit in the reference with LSNs the new
/// timeline reuses).
///
/// Errors: a summary that cannot be read.
pub fn choose_reference(
    stanza: &super::Stanza,
    complete: &[String],
    diff_only: bool,
    now: &ClusterNow,
) -> Result<std::result::Result<BackupSummary, String>> {
    let label = if diff_only {
        complete.iter().rev().find(|l| l.ends_with('F'))
    } else {
        complete.last()
    };
    let Some(label) = label else {
        return Ok(Err(format!(
            "the stanza holds no {} backup",
            if diff_only { "full" } else { "complete" }
        )));
    };
    let s = stanza.backup(label).summary()?;
    let h = &s.header;
    let why = if h.system_identifier != now.system_identifier || h.pg_version != now.pg_version {
        Some(format!(
            "backup {label} is of another cluster or major version (system identifier {}, PostgreSQL {})",
            h.system_identifier, h.pg_version
        ))
    } else if h.block_size != crate::pg::checksum::BLCKSZ as u32
        || now.block_size != crate::pg::checksum::BLCKSZ as u32
    {
        Some(format!(
            "the block size is {} bytes (backup {label}: {} bytes); changed blocks are found in 8 KiB blocks only",
            now.block_size, h.block_size
        ))
    } else if now.data_checksums && !h.data_checksums {
        Some(format!(
            "data checksums were turned on after backup {label}"
        ))
    } else if h.databases.is_empty() {
        Some(format!(
            "backup {label} was taken by an older pgjet that did not record its databases"
        ))
    } else if s.end.stop.timeline != now.timeline {
        Some(format!(
            "backup {label} is of timeline {}, the cluster is on timeline {} now",
            s.end.stop.timeline, now.timeline
        ))
    } else {
        None
    };
    Ok(match why {
        Some(w) => Err(w),
        None => Ok(s),
    })
}

/// The reference of a diff (`diff`) or incr backup of the cluster on `timeline`, loaded;
/// None, with the reason logged, when the backup must be a full
/// ([`choose_reference`]).
///
/// Errors: the repository's.
pub fn reference_for(
    stanza: &super::Stanza,
    info: &crate::pg::session::ServerInfo,
    timeline: u32,
    databases: &[(u32, u32)],
    diff: bool,
) -> Result<Option<super::incremental::Reference>> {
    let now = ClusterNow {
        system_identifier: info.system_identifier,
        pg_version: info.major(),
        block_size: info.block_size,
        data_checksums: info.data_checksums,
        timeline,
    };
    let kind = if diff { "diff" } else { "incr" };
    match choose_reference(stanza, &stanza.complete()?, diff, &now)? {
        Err(why) => {
            tracing::warn!("backup --type {kind}: {why}; taking a full backup instead");
            Ok(None)
        }
        Ok(summary) => {
            let r = super::incremental::Reference::load(
                &stanza.backup(&summary.header.label),
                databases,
            )?;
            tracing::info!(
                "backup --type {kind}: against backup {} ({} files, start LSN {})",
                r.label,
                r.len(),
                r.start_lsn
            );
            Ok(Some(r))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Compression;
    use crate::error::StorageFault;
    use crate::repo::stanza::tests::{
        complete_backup, faulty, manifest, memory, D1, F1, F2, F3, I1, I2,
    };
    use crate::repo::Stanza;
    use crate::storage::fault::{Fault, Op};

    /// The cluster the test manifests describe, as it is now (timeline 1).
    fn now() -> ClusterNow {
        ClusterNow {
            system_identifier: 1,
            pg_version: "15".into(),
            block_size: 8192,
            data_checksums: true,
            timeline: 1,
        }
    }

    /// The reference `choose_reference` picks among the stanza's complete backups, or why
    /// there is none.
    fn reference(
        st: &Stanza,
        diff_only: bool,
        now: &ClusterNow,
    ) -> std::result::Result<String, String> {
        choose_reference(st, &st.complete().unwrap(), diff_only, now)
            .unwrap()
            .map(|s| s.header.label)
    }

    #[test]
    fn a_full_backup_has_no_chain_and_an_incr_names_its_references_oldest_first() {
        let st = Stanza::new(1, memory(), "s");
        let mut full = manifest(F1, &[]);
        full.header.compression = Compression::new(CompressType::Lz4, None).unwrap();
        st.backup(F1).write_manifest(&full).unwrap();
        complete_backup(&st, D1, &[F1]);
        // The incr's pieces name the diff before the full: the chain is still oldest first.
        complete_backup(&st, I1, &[D1, F1]);

        let b = st.backup(F1);
        assert!(open_chain(&b, &b.summary().unwrap()).unwrap().is_empty());
        let b = st.backup(D1);
        assert_eq!(
            open_chain(&b, &b.summary().unwrap()).unwrap(),
            vec![(F1.to_string(), CompressType::Lz4)]
        );
        let b = st.backup(I1);
        let s = b.summary().unwrap();
        assert_eq!(s.header.reference.as_deref(), Some(F1));
        assert_eq!(
            open_chain(&b, &s).unwrap(),
            vec![
                (F1.to_string(), CompressType::Lz4),
                (D1.to_string(), CompressType::Zstd)
            ]
        );
    }

    #[test]
    fn a_chain_with_a_missing_newer_or_foreign_reference_is_refused_by_name() {
        let st = Stanza::new(1, memory(), "s");
        complete_backup(&st, F1, &[]);
        complete_backup(&st, D1, &[F1]);
        let d = st.backup(D1);
        let s = d.summary().unwrap();

        // The reference is of another cluster.
        let mut foreign = manifest(F1, &[]);
        foreign.header.system_identifier = 2;
        st.backup(F1).write_manifest(&foreign).unwrap();
        let e = open_chain(&d, &s).unwrap_err();
        assert!(matches!(e, Error::Repo(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains(&format!(
                "depends on backup {F1}, which is of another cluster"
            )),
            "{e}"
        );

        // The reference lost its summary (an interrupted expire): incomplete.
        st.store()
            .delete("s/backup/20260101-000000F/summary.json")
            .unwrap();
        let e = open_chain(&d, &s).unwrap_err().to_string();
        assert!(
            e.contains(&format!("depends on backup {F1}, which cannot be read"))
                && e.contains("does not exist or is incomplete"),
            "{e}"
        );

        // A summary naming a newer backup, or the backup itself, as its reference.
        complete_backup(&st, F2, &[]);
        complete_backup(&st, F3, &[]);
        let f2 = st.backup(F2);
        let mut s = f2.summary().unwrap();
        for r in [F3, F2] {
            s.end.references = vec![r.to_string()];
            let e = open_chain(&f2, &s).unwrap_err().to_string();
            assert!(
                e.contains(&format!(
                    "backup {F2} names backup {r} as a reference, but a reference must be older"
                )),
                "{e}"
            );
        }
    }

    #[test]
    fn a_reference_summary_that_reads_back_damaged_is_refused_by_name() {
        let (f, st) = faulty();
        complete_backup(&st, F1, &[]);
        complete_backup(&st, D1, &[F1]);
        let d = st.backup(D1);
        let s = d.summary().unwrap();
        f.inject(
            Op::Get,
            "20260101-000000F/summary.json",
            1,
            1,
            Fault::Corrupt(0),
        );
        let e = open_chain(&d, &s).unwrap_err().to_string();
        assert!(
            e.contains(&format!("depends on backup {F1}, which cannot be read"))
                && e.contains("s/backup/20260101-000000F/summary.json is not valid"),
            "{e}"
        );
        f.inject(
            Op::Get,
            "20260101-000000F/summary.json",
            1,
            1,
            Fault::Fail(StorageFault::Transient),
        );
        let e = open_chain(&d, &s).unwrap_err().to_string();
        assert!(e.contains(F1) && e.contains("injected Transient"), "{e}");
        // Read cleanly, the same chain opens.
        assert_eq!(open_chain(&d, &s).unwrap().len(), 1);
    }

    #[test]
    fn a_diff_takes_the_newest_full_and_an_incr_the_newest_complete_backup() {
        let st = Stanza::new(1, memory(), "s");
        complete_backup(&st, F1, &[]);
        complete_backup(&st, D1, &[F1]);
        assert_eq!(reference(&st, true, &now()), Ok(F1.to_string()));
        assert_eq!(reference(&st, false, &now()), Ok(D1.to_string()));

        complete_backup(&st, F2, &[]);
        complete_backup(&st, I2, &[F2]);
        assert_eq!(reference(&st, true, &now()), Ok(F2.to_string()));
        assert_eq!(reference(&st, false, &now()), Ok(I2.to_string()));

        // A newer interrupted backup (no summary) is never a reference.
        st.backup(F3).put_object("000001", b"frames").unwrap();
        assert_eq!(reference(&st, true, &now()), Ok(F2.to_string()));
        assert_eq!(reference(&st, false, &now()), Ok(I2.to_string()));
    }

    #[test]
    fn without_a_full_or_a_readable_summary_there_is_no_reference() {
        let st = Stanza::new(1, memory(), "s");
        assert_eq!(
            reference(&st, true, &now()),
            Err("the stanza holds no full backup".to_string())
        );
        assert_eq!(
            reference(&st, false, &now()),
            Err("the stanza holds no complete backup".to_string())
        );
        // A label said complete whose summary is gone: an error, not a silent full.
        let e = choose_reference(&st, &[F1.to_string()], false, &now())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&format!("backup '{F1}' of stanza 's' does not exist")),
            "{e}"
        );
    }

    #[test]
    fn a_reference_of_another_cluster_block_size_checksum_state_or_timeline_is_refused() {
        type Change = Box<dyn Fn(&mut crate::repo::BackupManifest, &mut ClusterNow)>;
        let cases: Vec<(Change, String)> = vec![
            (
                Box::new(|_, n| n.system_identifier = 2),
                format!("backup {F1} is of another cluster or major version"),
            ),
            (
                Box::new(|_, n| n.pg_version = "16".into()),
                format!("backup {F1} is of another cluster or major version"),
            ),
            (
                Box::new(|_, n| n.block_size = 16384),
                "the block size is 16384 bytes".into(),
            ),
            (
                Box::new(|m, _| m.header.block_size = 16384),
                format!("backup {F1}: 16384 bytes); changed blocks are found in 8 KiB blocks only"),
            ),
            (
                Box::new(|m, _| m.header.data_checksums = false),
                format!("data checksums were turned on after backup {F1}"),
            ),
            (
                Box::new(|m, _| m.header.databases.clear()),
                format!("backup {F1} was taken by an older pgjet"),
            ),
            (
                Box::new(|_, n| n.timeline = 2),
                format!("backup {F1} is of timeline 1, the cluster is on timeline 2 now"),
            ),
        ];
        for (change, why) in cases {
            let st = Stanza::new(1, memory(), "s");
            let (mut m, mut n) = (manifest(F1, &[]), now());
            change(&mut m, &mut n);
            st.backup(F1).write_manifest(&m).unwrap();
            for diff_only in [true, false] {
                let got = reference(&st, diff_only, &n).unwrap_err();
                assert!(got.contains(&why), "expected '{why}' in: {got}");
            }
        }
        // Checksums turned off since the backup do not change its blocks: still a reference.
        let st = Stanza::new(1, memory(), "s");
        complete_backup(&st, F1, &[]);
        let mut n = now();
        n.data_checksums = false;
        assert_eq!(reference(&st, true, &n), Ok(F1.to_string()));
    }
}
