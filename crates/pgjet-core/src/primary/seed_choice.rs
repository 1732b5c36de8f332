//! How `replica-create --seed auto` chooses where a new standby's bytes come from: the
//! source (the cluster copied) or the stanza's newest backup in the repository
//! (docs/replica-sources.md). Only for a new standby (an empty or absent target, no
//! `--slot`) whose source runs on another host, when a stanza is configured and its newest
//! backup is of the source's cluster. Then both ways are timed, on what each reads:
//! - the repository: the largest of some of the backup's objects, one per job, read at
//!   once, give its rate in stored bytes per second; the estimate is the backup's stored bytes
//!   (its chain's) and the archived WAL's, at that rate, plus the WAL's replay at
//!   [`REPLAY_RATE`];
//! - the source: rows the server makes (`repeat`, which any role may run, so a role with
//!   REPLICATION only is timed too) give the link's rate; the estimate is the cluster's size
//!   at that rate times the backup's compression ratio (the stream compresses the same
//!   pages), bounded by what one server core compresses ([`SERVER_CORE`]).
//!
//! The repository is taken when its estimate is [`SEED_MARGIN`] times smaller; the log
//! gives the figures. The source is timed first: when the replay alone would take longer
//! than the copy, the repository is not read (timing it over a slow store cost 2.7 s of a
//! 14 s copy in bench/remote.sh's sources part). The repository's listings run while the
//! source connects, and a copy from the source keeps that session and the link's rate for
//! its transport's choice ([`SeedChoice`]): one connection and one reading of the link.
use crate::error::{Error, Result};
use crate::options::{PrimaryConn, ReplicaOptions, RepoSet, Seed};
use crate::pg::lsn::parse_wal_segment_name;
use crate::primary::choose::Reached;
use crate::repo::wal::{self, WalFile};
use crate::repo::Stanza;
use std::time::Instant;

/// Logical bytes of WAL per second a standby replays from the archive: PostgreSQL 15 on this
/// machine replayed 1056 MiB of pgbench WAL (93 % full-page images), archived with `cp`, at a
/// median of 99.5 MiB/s with the page cache dropped and 117.6 MiB/s cached
/// (docs/replica-sources.md). WAL of small records replays fewer MiB per second: the
/// estimate then errs toward the source.
pub const REPLAY_RATE: f64 = 100.0 * 1048576.0;
/// Logical bytes per second one server core streams compressed: zstd's level 3 on pgbench
/// pages (830 MiB/s, bench/rates.sh) and the rest of `BASE_BACKUP`'s work
/// ([`crate::primary::choose::SERVER_WORK`]), one after the other.
pub const SERVER_CORE: f64 =
    1.0 / (1.0 / (830.0 * 1048576.0) + 1.0 / crate::primary::choose::SERVER_WORK);
/// How much faster the repository must be estimated before auto takes it: the replay's
/// rate is the least certain figure, and the source's copy needs no archive.
pub const SEED_MARGIN: f64 = 1.2;
/// The link's sample: at most this many rows of [`LINK_ROW`] bytes, fewer for a small
/// cluster (one row per 64 MiB of it, at least two).
const LINK_ROWS: u64 = 8;
const LINK_ROW: u64 = 1 << 20;

/// Archived segments whose stored sizes are read, and backup objects listed per job, for
/// the repository's sample.
const SAMPLE_SEGMENTS: usize = 8;
const SAMPLE_LISTED: usize = 8;
/// The most bytes read of each sampled object.
const SAMPLE_BYTES: u64 = 8 << 20;

/// `f` of every item of `items`, on up to `threads` threads; the results in `items`' order.
///
/// Errors: the first of `f`'s.
fn in_parallel<T: Sync, R: Send + Default + Clone>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    let out = std::sync::Mutex::new(vec![R::default(); items.len()]);
    crate::io::parallel::for_each_with(
        items.len(),
        threads,
        || Ok(()),
        |_, i| {
            let r = f(&items[i])?;
            out.lock().unwrap_or_else(|e| e.into_inner())[i] = r;
            Ok(())
        },
    )?;
    Ok(out.into_inner().unwrap_or_else(|e| e.into_inner()))
}

/// What the choice between the repository and the source is made on.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedFigures {
    /// Logical bytes a copy from the source moves: the cluster's size.
    pub cluster: u64,
    /// Stored bytes a restore of the newest backup reads (its own and its chain's).
    pub backup_stored: u64,
    /// The WAL archived since the backup started: logical bytes (replayed) and stored
    /// bytes (read).
    pub wal_logical: u64,
    pub wal_stored: u64,
    /// Stored bytes per second the repository gave to `jobs` readers at once.
    pub repo_rate: f64,
    /// Logical bytes per second of the link to the source, one connection.
    pub link: f64,
    /// The backup's logical bytes per stored byte: the stream's ratio, estimated.
    pub ratio: f64,
}

impl SeedFigures {
    /// Seconds until a standby seeded from the repository has replayed the archive.
    pub fn repo_seconds(&self) -> f64 {
        (self.backup_stored + self.wal_stored) as f64 / self.repo_rate.max(1.0)
            + self.wal_logical as f64 / REPLAY_RATE
    }

    /// Logical bytes per second of a copy from the source: the link uncompressed, or
    /// compressed at the backup's ratio up to one server core.
    pub fn source_rate(&self) -> f64 {
        self.link.max((self.link * self.ratio).min(SERVER_CORE))
    }

    /// Seconds of a copy from the source.
    pub fn source_seconds(&self) -> f64 {
        self.cluster as f64 / self.source_rate().max(1.0)
    }

    /// Whether the repository is taken ([`SEED_MARGIN`]).
    pub fn repo_wins(&self) -> bool {
        self.repo_seconds() * SEED_MARGIN < self.source_seconds()
    }

    /// One line for the log: the figures and the estimates.
    pub fn describe(&self) -> String {
        let mib = |b: f64| b / 1048576.0;
        let repo = if self.repo_rate.is_infinite() {
            format!(
                "not read, the replay of its WAL alone ({:.0} MiB at {:.0} MiB/s) takes ~{:.1} s",
                mib(self.wal_logical as f64),
                mib(REPLAY_RATE),
                self.repo_seconds()
            )
        } else {
            format!(
                "backup {:.0} MiB and WAL {:.0} MiB stored at {:.0} MiB/s, WAL {:.0} MiB replayed at {:.0} MiB/s: ~{:.1} s",
                mib(self.backup_stored as f64),
                mib(self.wal_stored as f64),
                mib(self.repo_rate),
                mib(self.wal_logical as f64),
                mib(REPLAY_RATE),
                self.repo_seconds()
            )
        };
        format!(
            "repository: {repo}; source: {:.0} MiB at {:.0} MiB/s (link {:.1} MiB/s, ratio {:.1}): ~{:.1} s",
            mib(self.cluster as f64),
            mib(self.source_rate()),
            mib(self.link),
            self.ratio,
            self.source_seconds()
        )
    }
}

/// What [`wanted`] decided: whether replica-create seeds from the repository, and the
/// source's session when it connected to time it (kept for the copy's transport, which then
/// does not connect again).
pub struct SeedChoice {
    pub repo: bool,
    pub reached: Option<Reached>,
}

impl SeedChoice {
    fn source(reached: Option<Reached>) -> Result<SeedChoice> {
        Ok(SeedChoice {
            repo: false,
            reached,
        })
    }
}

/// Whether replica-create seeds from the repository (see the module's documentation): with
/// `--seed repo` always, `--seed source` never, `auto` with no source or when the
/// repository is estimated faster. Logs why.
///
/// Errors: `--seed repo` or no source without a stanza; the source's connection and the
/// repository's reads while measuring.
pub fn wanted(repos: &RepoSet, conn: &PrimaryConn, args: &ReplicaOptions) -> Result<SeedChoice> {
    let no_source = conn.source.as_deref().is_none_or(|v| v.trim().is_empty());
    let repo = |repo| {
        Ok(SeedChoice {
            repo,
            reached: None,
        })
    };
    match args.seed {
        Seed::Source => return repo(false),
        Seed::Repo => {
            repos.stanza()?;
            return repo(true);
        }
        Seed::Auto if no_source => {
            if repos.stanza.is_some() {
                tracing::info!(
                    "seed auto: no source given{}: the standby is restored from the repository",
                    if args.patroni.is_some() {
                        " (Patroni found no member to clone)"
                    } else {
                        ""
                    }
                );
                return repo(true);
            }
            return repo(false);
        }
        Seed::Auto => {}
    }
    if repos.stanza.is_none() {
        return repo(false);
    }
    let target = conn.pg_path()?;
    let kept = std::fs::read_dir(target)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if kept || args.delta {
        tracing::info!(
            "seed auto: the source (a kept copy is re-synced from the source, which sends only what differs)"
        );
        return repo(false);
    }
    if args.slot.is_some() {
        tracing::info!(
            "seed auto: the source (--slot: a slot made now holds no WAL from a backup's start)"
        );
        return repo(false);
    }
    // The repository's listings and the source's connection run at once: each is several
    // round trips on the slow links auto is for.
    let (side, connected) = std::thread::scope(|scope| {
        let side = std::thread::Builder::new()
            .name("pgjet-seed-repo".into())
            .spawn_scoped(scope, || RepoSide::read(repos));
        let connected = Reached::connect(conn, true);
        let side = match side {
            Ok(h) => h
                .join()
                .unwrap_or_else(|_| Err(Error::Other("the repository's reader panicked".into()))),
            Err(_) => RepoSide::read(repos),
        };
        (side, connected)
    });
    let mut reached = connected?;
    let side = match side {
        Ok(Some(side)) => side,
        Ok(None) => return SeedChoice::source(Some(reached)),
        Err(e) => {
            reached.ctl.close();
            return Err(e);
        }
    };
    let info = &reached.info;
    if side.summary.header.system_identifier != info.system_identifier {
        tracing::info!(
            "seed auto: the source (backup {} is of cluster {}, the source is {})",
            side.label,
            side.summary.header.system_identifier,
            info.system_identifier
        );
        return SeedChoice::source(Some(reached));
    }
    if crate::primary::local_data_directory(info).is_some() {
        tracing::info!("seed auto: the source (it runs on this host)");
        return SeedChoice::source(Some(reached));
    }
    let Some(sess) = reached.ctl.session() else {
        tracing::info!(
            "seed auto: the source (the role may connect for replication only: the link cannot be timed without an ordinary session, and the source needs no WAL from the archive)"
        );
        return SeedChoice::source(Some(reached));
    };
    let f = match measure(conn, &side, sess) {
        Ok(f) => {
            reached.link = Some(f.link);
            f
        }
        Err(e) => {
            reached.ctl.close();
            return Err(e);
        }
    };
    let repo_wins = f.repo_wins();
    tracing::info!(
        "seed auto: {}; chose the {}",
        f.describe(),
        if repo_wins { "repository" } else { "source" }
    );
    if repo_wins {
        reached.ctl.close();
        return repo(true);
    }
    SeedChoice::source(Some(reached))
}

/// The repository's side of `--seed auto`, read before the source is timed: the stanza's
/// newest backup, the stored bytes of its chain, and the segments archived since it.
struct RepoSide {
    st: Stanza,
    label: String,
    summary: crate::repo::manifest_io::BackupSummary,
    backup_stored: u64,
    since: Vec<String>,
}

impl RepoSide {
    /// None (with the reason in the log) when there is no backup to seed from.
    ///
    /// Errors: the repository's reads.
    fn read(s: &RepoSet) -> Result<Option<RepoSide>> {
        let (st, label) = match crate::repo::open::open_stanza_with_set(s, "latest") {
            Ok(f) => f,
            Err(e) => {
                tracing::info!("seed auto: the source (no backup to seed from: {e})");
                return Ok(None);
            }
        };
        let summary = st.backup(&label).summary()?;
        let mut backup_stored = summary.end.stored_size;
        for r in &summary.end.references {
            backup_stored += st.backup(r).summary()?.end.stored_size;
        }
        let since = archived_since(&st, &summary, summary.header.wal_segment_size)?;
        Ok(Some(RepoSide {
            st,
            label,
            summary,
            backup_stored,
            since,
        }))
    }
}

/// The figures for the repository's `side` against the source behind `sess`.
fn measure(
    s: &PrimaryConn,
    side: &RepoSide,
    sess: &crate::pg::session::Session,
) -> Result<SeedFigures> {
    let RepoSide {
        st,
        label,
        summary,
        backup_stored,
        since,
    } = side;
    let seg_size = summary.header.wal_segment_size;
    let jobs = s.jobs.max(1);
    // The source first: when the archive's replay alone takes longer than the copy, the
    // repository is not read at all (a seed could not win, whatever its rate).
    let cluster = summary.end.size.max(database_sizes(sess));
    let rows = (cluster / (64 << 20)).clamp(2, LINK_ROWS) as u32;
    let t = Instant::now();
    let got = sess.filler_rows_timed(rows, LINK_ROW as u32)?;
    let link = crate::primary::choose::link_rate(t, &got);
    let ratio = if summary.header.compression.kind == crate::codec::CompressType::None {
        1.0
    } else {
        summary.end.size as f64 / summary.end.stored_size.max(1) as f64
    };
    let mut f = SeedFigures {
        cluster,
        backup_stored: *backup_stored,
        wal_logical: since.len() as u64 * seg_size,
        wal_stored: 0,
        repo_rate: f64::INFINITY,
        link,
        ratio: ratio.max(1.0),
    };
    if !f.repo_wins() {
        return Ok(f);
    }
    // The stored bytes of an archived segment: the largest of the newest few (the newest
    // may be a switched one, mostly zeros, that compresses to almost nothing).
    let newest: Vec<String> = since.iter().rev().take(SAMPLE_SEGMENTS).cloned().collect();
    let sizes = in_parallel(&newest, jobs, |name| {
        Ok(wal::stored_size(st, &WalFile::parse(name)?)?.unwrap_or(0))
    })?;
    f.wal_stored = since.len() as u64 * sizes.into_iter().max().unwrap_or(seg_size);
    // The largest of some of the backup's own objects, one per job, read at once as a
    // restore reads them (small ones would time the requests' latency, not the bytes), at
    // most SAMPLE_BYTES of each.
    let listed = st.backup(label).some_data_objects(jobs * SAMPLE_LISTED)?;
    let sizes = in_parallel(&listed, jobs, |name| {
        Ok(st.store().size(name)?.unwrap_or(0))
    })?;
    let mut by_size: Vec<(u64, &String)> = sizes.into_iter().zip(&listed).collect();
    by_size.sort_by_key(|b| std::cmp::Reverse(b.0));
    let sample: Vec<(u64, String)> = by_size
        .iter()
        .take(jobs)
        .map(|(size, n)| ((*size).min(SAMPLE_BYTES), (*n).clone()))
        .collect();
    let t = Instant::now();
    let read: u64 = in_parallel(&sample, jobs, |(len, name)| {
        st.store().get_range(name, 0, *len).map(|b| b.len() as u64)
    })?
    .iter()
    .sum();
    f.repo_rate = read as f64 / t.elapsed().as_secs_f64().max(1e-6);
    Ok(f)
}

/// The archived segments from the backup's first on, on its timeline and later ones, by name.
fn archived_since(
    st: &Stanza,
    summary: &crate::repo::manifest_io::BackupSummary,
    seg_size: u64,
) -> Result<Vec<String>> {
    let first = summary
        .end
        .stop
        .wal_segments
        .first()
        .and_then(|n| parse_wal_segment_name(n, seg_size))
        .map_or(0, |(_, segno)| segno);
    let mut out = Vec::new();
    for tli in wal::timelines(st)? {
        if tli < summary.end.stop.timeline {
            continue;
        }
        for name in wal::list_timeline(st, tli)? {
            if parse_wal_segment_name(&name, seg_size).is_some_and(|(_, n)| n >= first) {
                out.push(name);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The databases' sizes on the source (0 when the role may not connect to them all).
fn database_sizes(sess: &crate::pg::session::Session) -> u64 {
    sess.query_row(
        "read the databases' sizes",
        "SELECT sum(pg_database_size(oid))::bigint FROM pg_database WHERE datallowconn",
    )
    .ok()
    .and_then(|r| r.first().cloned().flatten())
    .and_then(|v| v.parse().ok())
    .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn figures(link_mib: f64, repo_mib: f64, wal_mib: u64) -> SeedFigures {
        SeedFigures {
            cluster: 2048 * MIB,
            backup_stored: 700 * MIB,
            wal_logical: wal_mib * MIB,
            wal_stored: wal_mib * MIB / 3,
            repo_rate: repo_mib * MIB as f64,
            link: link_mib * MIB as f64,
            ratio: 3.0,
        }
    }

    #[test]
    fn the_repository_wins_on_a_slow_link_and_loses_to_much_wal() {
        // 100 Mbit/s to the source, a repository read at 400 MiB/s, 1 GiB of WAL since.
        assert!(figures(11.0, 400.0, 1024).repo_wins());
        // 2 Gbit/s to the source: its compressed stream is bound by one server core.
        let fast = figures(220.0, 400.0, 1024);
        assert!((fast.source_rate() - SERVER_CORE).abs() < 1.0);
        assert!(!fast.repo_wins());
        // A slow link, but 40 GiB of WAL to replay since the backup.
        assert!(!figures(11.0, 400.0, 40 << 10).repo_wins());
    }

    #[test]
    fn a_repository_whose_replay_alone_loses_is_not_read() {
        // As measured at 1 Gbit/s: 1 GiB of WAL to replay against a 2 GiB copy at ~300 MiB/s.
        let f = SeedFigures {
            repo_rate: f64::INFINITY,
            wal_stored: 0,
            ..figures(90.0, 0.0, 1088)
        };
        assert!(!f.repo_wins());
        assert!(
            f.describe().starts_with("repository: not read"),
            "{}",
            f.describe()
        );
    }

    #[test]
    fn an_uncompressed_backup_estimates_an_uncompressed_stream() {
        let f = SeedFigures {
            ratio: 1.0,
            ..figures(50.0, 400.0, 0)
        };
        assert_eq!(f.source_rate(), f.link);
        assert!(f.describe().contains("ratio 1.0"));
    }
}
