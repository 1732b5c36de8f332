//! Tuning knobs for the benchmarks that measure them, read once from the environment.
//!
//! Every default lives with the code it tunes (and says where its figure comes from); a
//! variable here only overrides it, for a benchmark that compares values. They are not
//! options users set: the option table (`crate::options::table`, its tuning section) knows
//! them as environment-only variables, so they are not reported as unknown.
//!
//! The environment is read on the first call of [`get`] (or [`init`], which the binary calls
//! first so that a bad value is a configuration error before any work starts); later changes
//! of the environment are not seen.
use crate::error::{Error, Result};
use std::sync::OnceLock;

/// Overrides of built-in defaults; None (or `true` for a switch) leaves the default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    /// `PGJET_READ_AHEAD`: whole-object reads a restore keeps in flight.
    pub read_ahead: Option<usize>,
    /// `PGJET_READ_PARTS`: ranged requests one object-store read is split into.
    pub read_parts: Option<usize>,
    /// `PGJET_LOCAL_IO_DEPTH`: threads per job reading a local data directory.
    pub local_io_depth: Option<usize>,
    /// `PGJET_BUNDLE_KIB`, in bytes: most logical bytes in one bundle.
    pub bundle_bytes: Option<u64>,
    /// `PGJET_BUNDLE_FILES`: most files in one bundle.
    pub bundle_files: Option<usize>,
    /// `PGJET_LIBPQ_ROW_KIB`, in bytes: most bytes per result row of a libpq read.
    pub libpq_row: Option<u64>,
    /// `PGJET_LIBPQ_PREFETCH` (any value but `0` keeps it on).
    pub libpq_prefetch: bool,
    /// `PGJET_DELTA_RANGE_KIB`, in bytes: size of a range compared by hash.
    pub delta_range: Option<u64>,
    /// `PGJET_DELTA_SUMMARIES` (any value but `0` keeps it on): a delta takes changed
    /// blocks from the primary's WAL summaries where it can (the benchmark turns it off to
    /// time the comparison by hash on the same cluster).
    pub delta_summaries: bool,
    /// `PGJET_DELTA_PAGE_LSN` (any value but `0` keeps it on): without summaries, a delta
    /// compares relation pages by their LSN where it can (the benchmark turns it off to
    /// time the comparison by hash on the same cluster).
    pub delta_page_lsn: bool,
    /// `PGJET_DELTA_WAL_SHARE` (default 8; 0: never): without summaries, a delta on one
    /// timeline lists the changed blocks from the primary's WAL when that WAL is at most
    /// 1/N of the data's bytes (the tests set 1, so that their small clusters take it).
    pub delta_wal_share: u64,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            read_ahead: None,
            read_parts: None,
            local_io_depth: None,
            bundle_bytes: None,
            bundle_files: None,
            libpq_row: None,
            libpq_prefetch: true,
            delta_range: None,
            delta_summaries: true,
            delta_page_lsn: true,
            delta_wal_share: 8,
        }
    }
}

impl Tuning {
    /// Reads the variables through `var` (the environment's lookup, or a test's).
    ///
    /// Counts out of their range are ignored (the default stays), as the benchmarks have
    /// always relied on; sizes out of range and a bundle file count out of range are
    /// [`Error::Config`] errors naming the variable.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Tuning> {
        let count = |name: &str, max: usize| {
            var(name)
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|n| (1..=max).contains(n))
        };
        let kib = |name: &str| -> Result<Option<u64>> {
            match var(name) {
                None => Ok(None),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(k) if (8..=65536).contains(&k) && k % 8 == 0 => Ok(Some(k << 10)),
                    _ => Err(Error::Config(format!(
                        "{name} '{v}' must be a multiple of 8 between 8 and 65536"
                    ))),
                },
            }
        };
        let bundle_files = match var("PGJET_BUNDLE_FILES") {
            None => None,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if (1..=65536).contains(&n) => Some(n),
                _ => {
                    return Err(Error::Config(format!(
                        "PGJET_BUNDLE_FILES '{v}' must be a number from 1 to 65536"
                    )))
                }
            },
        };
        Ok(Tuning {
            read_ahead: count("PGJET_READ_AHEAD", 64),
            read_parts: count("PGJET_READ_PARTS", 16),
            local_io_depth: count("PGJET_LOCAL_IO_DEPTH", 16),
            bundle_bytes: kib("PGJET_BUNDLE_KIB")?,
            bundle_files,
            libpq_row: kib("PGJET_LIBPQ_ROW_KIB")?,
            libpq_prefetch: var("PGJET_LIBPQ_PREFETCH").is_none_or(|v| v.trim() != "0"),
            delta_range: kib("PGJET_DELTA_RANGE_KIB")?,
            delta_summaries: var("PGJET_DELTA_SUMMARIES").is_none_or(|v| v.trim() != "0"),
            delta_page_lsn: var("PGJET_DELTA_PAGE_LSN").is_none_or(|v| v.trim() != "0"),
            delta_wal_share: var("PGJET_DELTA_WAL_SHARE")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(8),
        })
    }
}

static TUNING: OnceLock<Tuning> = OnceLock::new();

/// Reads the tuning from the environment, once; the binary calls it before any work.
///
/// Errors: a variable with a malformed value ([`Tuning::from_lookup`]).
pub fn init() -> Result<&'static Tuning> {
    if let Some(t) = TUNING.get() {
        return Ok(t);
    }
    let t = Tuning::from_lookup(|k| std::env::var(k).ok())?;
    Ok(TUNING.get_or_init(|| t))
}

/// The tuning in effect. When [`init`] was not called (the library used on its own) the
/// environment is read now; a malformed value is then logged and the defaults are used.
pub fn get() -> &'static Tuning {
    TUNING.get_or_init(|| {
        Tuning::from_lookup(|k| std::env::var(k).ok()).unwrap_or_else(|e| {
            tracing::warn!("{e}; the built-in defaults are used");
            Tuning::default()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(kv: &[(&str, &str)]) -> Result<Tuning> {
        let m: HashMap<String, String> = kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Tuning::from_lookup(move |k| m.get(k).cloned())
    }

    #[test]
    fn values_are_checked_and_unset_ones_keep_the_defaults() {
        assert_eq!(with(&[]).unwrap(), Tuning::default());
        let t = with(&[
            ("PGJET_LIBPQ_ROW_KIB", "256"),
            ("PGJET_READ_AHEAD", "8"),
            ("PGJET_READ_PARTS", "99"),
            ("PGJET_LIBPQ_PREFETCH", "0"),
            ("PGJET_BUNDLE_FILES", "10"),
        ])
        .unwrap();
        assert_eq!(t.libpq_row, Some(256 << 10));
        assert_eq!(t.read_ahead, Some(8));
        assert_eq!(t.read_parts, None, "a count out of range keeps the default");
        assert!(!t.libpq_prefetch);
        assert_eq!(t.bundle_files, Some(10));
        for bad in ["12", "0", "65544", "x"] {
            let e = with(&[("PGJET_LIBPQ_ROW_KIB", bad)])
                .unwrap_err()
                .to_string();
            assert!(e.contains("PGJET_LIBPQ_ROW_KIB"), "{e}");
        }
        assert!(with(&[("PGJET_BUNDLE_FILES", "0")]).is_err());
        assert!(with(&[("PGJET_DELTA_RANGE_KIB", "7")]).is_err());
    }
}
