//! Backup labels and the times the repository records.
use chrono::{DateTime, Utc};

/// A backup label like pgBackRest's: `YYYYMMDD-HHMMSSF` (UTC), for a full backup started at
/// `now`. Labels sort by time.
pub fn new_label(now: DateTime<Utc>) -> String {
    now.format("%Y%m%d-%H%M%SF").to_string()
}

/// The label of a differential (`diff`: `D`) or incremental (`incr`: `I`) backup started at
/// `now` against the chain of the full backup `full`: `<full>_YYYYMMDD-HHMMSS<D|I>`, as
/// pgBackRest names them. Such labels sort after their full and by time within the chain.
pub fn new_chain_label(full: &str, now: DateTime<Utc>, kind: char) -> String {
    format!("{full}_{}{kind}", now.format("%Y%m%d-%H%M%S"))
}

/// The label of a new backup started at `now`: a full's ([`new_label`]) without a
/// `reference` (a label), else a differential's (`diff`) or incremental's under the
/// reference's full backup ([`new_chain_label`]).
pub fn backup_label(reference: Option<&str>, diff: bool, now: DateTime<Utc>) -> String {
    match reference {
        None => new_label(now),
        Some(r) => new_chain_label(full_of(r), now, if diff { 'D' } else { 'I' }),
    }
}

/// The full backup a label belongs to: the label itself for a full, the part before `_`
/// for a diff or incr.
pub fn full_of(label: &str) -> &str {
    label.split('_').next().unwrap_or(label)
}

/// True for a label this format writes: `YYYYMMDD-HHMMSSF`, optionally followed by
/// `_YYYYMMDD-HHMMSSD` or `_YYYYMMDD-HHMMSSI`. A manifest's references are checked with it
/// before any object name is built from them.
pub fn is_label(s: &str) -> bool {
    fn stamp(p: &str, kinds: &[u8]) -> bool {
        let b = p.as_bytes();
        b.len() == 16
            && b[..8].iter().all(u8::is_ascii_digit)
            && b[8] == b'-'
            && b[9..15].iter().all(u8::is_ascii_digit)
            && kinds.contains(&b[15])
    }
    match s.split_once('_') {
        None => stamp(s, b"F"),
        Some((full, rest)) => stamp(full, b"F") && stamp(rest, b"DI"),
    }
}

/// A time as the repository records it: RFC 3339, UTC, whole seconds
/// (`2026-11-21T08:05:09Z`).
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_sort_by_time() {
        use chrono::TimeZone;
        let a = Utc.with_ymd_and_hms(2026, 11, 21, 8, 5, 9).unwrap();
        let b = Utc.with_ymd_and_hms(2026, 11, 21, 10, 0, 0).unwrap();
        assert_eq!(new_label(a), "20261121-080509F");
        assert!(new_label(a) < new_label(b));
        assert_eq!(rfc3339(a), "2026-11-21T08:05:09Z");
        let d = new_chain_label(&new_label(a), b, 'D');
        assert_eq!(d, "20261121-080509F_20261121-100000D");
        assert!(is_label(&d) && is_label(&new_label(a)));
        assert_eq!(full_of(&d), "20261121-080509F");
        assert!(new_label(a) < d && d < new_label(b));
        for bad in [
            "",
            "../x",
            "20261121-080509D",
            "20261121-080509F_",
            "20261121-080509F_20261121-100000F",
            "2026112a-080509F",
        ] {
            assert!(!is_label(bad), "{bad}");
        }
    }
}
