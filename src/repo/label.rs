//! Backup labels and the times the repository records.
use chrono::{DateTime, Utc};

/// A backup label like pgBackRest's: `YYYYMMDD-HHMMSSF` (UTC), for a full backup started at
/// `now`. Labels sort by time.
pub fn new_label(now: DateTime<Utc>) -> String {
    now.format("%Y%m%d-%H%M%SF").to_string()
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
    }
}
