//! Tests of `info --output prometheus` (commands/metrics.rs).
use super::*;

/// Label values are escaped; families without samples are left out; the newest backup of
/// each type gives the last_* samples.
#[test]
fn renders_families_and_escapes_labels() {
    let backup = |label: &str, t: &str, stop: &str, stored: u64| BackupInfo {
        label: label.into(),
        repo: 1,
        backup_type: t.into(),
        reference: None,
        depends_on: Vec::new(),
        start_time: "2026-11-26T10:00:00Z".into(),
        stop_time: stop.into(),
        start_lsn: "0/1000028".into(),
        stop_lsn: "0/1000100".into(),
        timeline: 1,
        size: 100,
        stored_size: stored,
        wal_start: String::new(),
        wal_stop: String::new(),
        archive_start: None,
        archive_stop: None,
        compression: "zstd".into(),
    };
    let v = vec![StanzaView {
        stanza: "a\"b\\c".into(),
        system_identifier: "1".into(),
        pg_version: "15".into(),
        backups: vec![
            backup("20261126-100000F", "full", "2026-11-26T10:00:30Z", 10),
            backup(
                "20261126-100000F_20261126-110000I",
                "incr",
                "2026-11-26T10:00:02Z",
                3,
            ),
            backup(
                "20261126-100000F_20261126-120000I",
                "incr",
                "2026-11-26T10:00:05Z",
                4,
            ),
        ],
        archive: Vec::new(),
    }];
    let q = vec![(
        "a\"b\\c".to_string(),
        QueueView {
            ready: 2,
            oldest_age: 7.0,
            errors: 0,
            last_error: None,
        },
    )];
    let m = render_prometheus(&v, &q);
    let l = r#"{stanza="a\"b\\c",repo="1",type="incr"}"#;
    assert!(m.contains(&format!("pgjet_backups{l} 2\n")), "{m}");
    assert!(
        m.contains(&format!("pgjet_backup_last_stored_bytes{l} 4\n")),
        "{m}"
    );
    assert!(
        m.contains(&format!("pgjet_backup_last_duration_seconds{l} 5\n")),
        "{m}"
    );
    assert!(m.contains(r#"pgjet_backups{stanza="a\"b\\c",repo="1",type="diff"} 0"#));
    assert!(!m
        .contains("pgjet_backup_last_size_bytes{stanza=\"a\\\"b\\\\c\",repo=\"1\",type=\"diff\"}"));
    assert!(m.contains(r#"pgjet_archive_push_queue_segments{stanza="a\"b\\c"} 2"#));
    assert!(
        !m.contains("pgjet_archive_oldest_segment_info"),
        "no archive, no family"
    );
    assert_eq!(m.matches("# TYPE pgjet_backups gauge").count(), 1);
}

/// The queue: `.ready` files counted and the oldest's age; error files in the spool.
#[test]
fn queue_from_archive_status_and_spool() {
    let d = tempfile::tempdir().unwrap();
    let status = d.path().join("pg_wal/archive_status");
    std::fs::create_dir_all(&status).unwrap();
    std::fs::write(status.join("000000010000000000000001.ready"), "").unwrap();
    std::fs::write(status.join("000000010000000000000002.ready"), "").unwrap();
    std::fs::write(status.join("000000010000000000000000.done"), "").unwrap();
    let out = d.path().join("spool/out");
    let now = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
    let q = queue_view(d.path(), &out, now);
    assert_eq!((q.ready, q.errors, q.last_error), (2, 0, None));
    assert!((59.0..=62.0).contains(&q.oldest_age), "{q:?}");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("global.error"), "could not start").unwrap();
    let q = queue_view(d.path(), &out, now);
    assert_eq!(q.errors, 1);
    assert!(q.last_error.is_some());
}
