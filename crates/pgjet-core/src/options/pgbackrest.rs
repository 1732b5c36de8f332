//! pgBackRest's option names, so that a pgBackRest config carried over to pgjet is read
//! honestly: an option pgjet implements is read (pgjet's own names and its aliases come
//! first, see [`super::table::classify`]); any other pgBackRest option is an error naming
//! it, never silently ignored.
//!
//! Source: pgBackRest's option definitions, src/build/config/config.yaml (the `option:`
//! section, and the `deprecate:` names it still accepts). `pg-*` options are indexed
//! `pgN-*` (N 1 to 256), `repo-*` options `repoN-*`; a `?` in a deprecated name stands for
//! that index.

/// pgBackRest's options (unindexed names).
const OPTIONS: &[&str] = &[
    // Command-line only.
    "config",
    "config-include-path",
    "config-path",
    "dry-run",
    "force",
    "online",
    "output",
    "reference",
    "set",
    "report",
    "stanza",
    "target",
    "target-action",
    "target-exclusive",
    "target-timeline",
    "type",
    "verbose",
    "exec-id",
    "process",
    "remote-type",
    "cipher-pass",
    "filter",
    "ignore-missing",
    "raw",
    "recurse",
    "sort",
    // General.
    "archive-timeout",
    "beta",
    "buffer-size",
    "cmd",
    "cmd-ssh",
    "compress",
    "compress-level",
    "compress-level-network",
    "compress-type",
    "db-timeout",
    "delta",
    "io-timeout",
    "job-retry",
    "job-retry-interval",
    "lock-path",
    "neutral-umask",
    "process-max",
    "protocol-timeout",
    "sck-block",
    "sck-keep-alive",
    "spool-path",
    "tcp-keep-alive-count",
    "tcp-keep-alive-idle",
    "tcp-keep-alive-interval",
    "tls-server-ca-file",
    "tls-server-cert-file",
    "tls-server-key-file",
    "tls-server-auth",
    "tls-server-address",
    "tls-server-port",
    // Logging.
    "log-level-console",
    "log-level-file",
    "log-level-stderr",
    "log-path",
    "log-subprocess",
    "log-timestamp",
    // Archive.
    "archive-async",
    "archive-get-queue-max",
    "archive-header-check",
    "archive-missing-retry",
    "archive-push-queue-max",
    // Backup.
    "annotation",
    "archive-check",
    "archive-copy",
    "archive-mode-check",
    "backup-standby",
    "checksum-page",
    "page-header-check",
    "exclude",
    "expire-auto",
    "manifest-save-threshold",
    "resume",
    "start-fast",
    "stop-auto",
    // Restore.
    "archive-mode",
    "db-exclude",
    "db-include",
    "link-all",
    "link-map",
    "tablespace-map",
    "tablespace-map-all",
    "recovery-option",
    // Stanza (pg-* are indexed pgN-*).
    "pg",
    "pg-database",
    "pg-local",
    "pg-host",
    "pg-host-cert-file",
    "pg-host-key-file",
    "pg-host-ca-file",
    "pg-host-ca-path",
    "pg-host-cmd",
    "pg-host-config",
    "pg-host-config-include-path",
    "pg-host-config-path",
    "pg-host-port",
    "pg-host-user",
    "pg-host-type",
    "pg-path",
    "pg-port",
    "pg-socket-path",
    "pg-user",
    "pg-version-force",
    // Repository (repo-* are indexed repoN-*).
    "repo",
    "repo-local",
    "repo-type",
    "repo-azure-account",
    "repo-azure-container",
    "repo-azure-endpoint",
    "repo-azure-key",
    "repo-azure-key-type",
    "repo-azure-uri-style",
    "repo-bundle",
    "repo-bundle-size",
    "repo-bundle-limit",
    "repo-block",
    "repo-block-size-map",
    "repo-block-age-map",
    "repo-block-checksum-size-map",
    "repo-block-size-super",
    "repo-block-size-super-full",
    "repo-cipher-pass",
    "repo-cipher-type",
    "repo-gcs-bucket",
    "repo-gcs-endpoint",
    "repo-gcs-key",
    "repo-gcs-key-type",
    "repo-hardlink",
    "repo-host-type",
    "repo-host",
    "repo-host-cert-file",
    "repo-host-key-file",
    "repo-host-ca-file",
    "repo-host-ca-path",
    "repo-host-cmd",
    "repo-host-config",
    "repo-host-config-include-path",
    "repo-host-config-path",
    "repo-host-port",
    "repo-host-user",
    "repo-path",
    "repo-retention-archive",
    "repo-retention-archive-type",
    "repo-retention-diff",
    "repo-retention-full-type",
    "repo-retention-full",
    "repo-retention-history",
    "repo-s3-bucket",
    "repo-s3-endpoint",
    "repo-s3-key",
    "repo-s3-key-secret",
    "repo-s3-key-type",
    "repo-s3-kms-key-id",
    "repo-s3-sse-customer-key",
    "repo-s3-region",
    "repo-s3-role",
    "repo-s3-token",
    "repo-s3-uri-style",
    "repo-sftp-host",
    "repo-sftp-host-fingerprint",
    "repo-sftp-host-key-check-type",
    "repo-sftp-host-key-hash-type",
    "repo-sftp-host-port",
    "repo-sftp-host-user",
    "repo-sftp-known-host",
    "repo-sftp-private-key-file",
    "repo-sftp-private-key-passphrase",
    "repo-sftp-public-key-file",
    "repo-storage-verify-tls",
    "repo-storage-ca-file",
    "repo-storage-ca-path",
    "repo-storage-host",
    "repo-storage-port",
    "repo-storage-tag",
    "repo-storage-upload-chunk-size",
    // Deprecated names pgBackRest still reads (`?` normalized away: db?-path -> db-path).
    "archive-queue-max",
    "db-host",
    "db-cmd",
    "db-config",
    "db-ssh-port",
    "db-user",
    "db-path",
    "db-port",
    "db-socket-path",
    "backup-host",
    "backup-cmd",
    "backup-config",
    "backup-ssh-port",
    "backup-user",
    "hardlink",
    "retention-archive",
    "retention-archive-type",
    "retention-diff",
    "retention-full",
    "repo-s3-verify-ssl",
    "repo-azure-verify-tls",
    "repo-s3-verify-tls",
    "repo-s3-ca-file",
    "repo-azure-ca-file",
    "repo-s3-ca-path",
    "repo-azure-ca-path",
    "repo-s3-host",
    "repo-azure-host",
    "repo-azure-port",
    "repo-s3-port",
];

/// pgBackRest options about its log file, which pgjet does not have (it logs to stderr,
/// `log-level`, which reads pgBackRest's `log-level-console` too): a carried-over config
/// that sets them is read with a warning naming each, since nothing but the log depends on
/// them.
const IGNORED: &[&str] = &[
    "log-level-file",
    "log-path",
    "log-subprocess",
    "log-timestamp",
];

/// pgBackRest options that only tune its own processes (buffers, timeouts of its protocol
/// and of its remote hosts, lock files): nothing pgjet stores depends on them, so a
/// carried-over config that sets them is read with a warning naming each.
const TUNING: &[&str] = &[
    "buffer-size",
    "db-timeout",
    "io-timeout",
    "protocol-timeout",
    "lock-path",
    "neutral-umask",
    "job-retry",
    "job-retry-interval",
    "tcp-keep-alive-count",
    "tcp-keep-alive-idle",
    "tcp-keep-alive-interval",
    "sck-keep-alive",
    "sck-block",
];

/// pgBackRest options pgjet always behaves as with the value given here, so that value is
/// read without a word (pgBackRest users keep them in their files); another value is an
/// error naming what pgjet does (the hint of [`lookup`]).
const ALWAYS: &[(&str, &str)] = &[
    // Small files are always bundled, incrementals always store changed blocks.
    ("repo-bundle", "y"),
    ("repo-block", "y"),
    // A backup always holds the WAL from its start to its stop.
    ("archive-copy", "y"),
    // Pages are validated whenever the cluster has data checksums.
    ("checksum-page", "y"),
    ("page-header-check", "y"),
    // pgjet's backups are non-exclusive: a failed one ends with its session.
    ("stop-auto", "y"),
    // Compression is compress-type's; `compress=y` is pgBackRest's old spelling of gz.
    ("compress", "y"),
    // Every backup runs expire unless --no-expire is given.
    ("expire-auto", "y"),
];

/// Some(why) when the pgBackRest option `key` is read with a warning and otherwise ignored
/// ([`IGNORED`], [`TUNING`]): the warning's reason.
pub fn ignored(key: &str) -> Option<&'static str> {
    let base = unindexed(key);
    if IGNORED.contains(&base.as_str()) {
        Some("pgjet logs to stderr only (log-level)")
    } else if TUNING.contains(&base.as_str()) {
        Some("it tunes pgBackRest's own processes; nothing pgjet stores depends on it")
    } else {
        None
    }
}

/// True when the pgBackRest option `key` set to `value` is what pgjet always does
/// ([`ALWAYS`]): read without a word.
pub fn always(key: &str, value: &str) -> bool {
    let base = unindexed(key);
    ALWAYS.iter().any(|(k, v)| {
        *k == base && super::parse_bool(k, value).ok() == super::parse_bool(k, v).ok()
    })
}

/// What pgjet has near a pgBackRest option it does not implement, for the error's hint.
const HINTS: &[(&str, &str)] = &[
    (
        "repo-retention-full",
        "pgjet reads repo1-retention-full (or retention-full) and applies it to every repository",
    ),
    (
        "repo-retention-full-type",
        "pgjet reads repo1-retention-full-type (or retention-full-type) and applies it to every repository",
    ),
    (
        "repo-retention-diff",
        "pgjet reads repo1-retention-diff (or retention-diff) and applies it to every repository",
    ),
    (
        "repo-retention-archive",
        "pgjet reads repo1-retention-archive (or retention-archive) and applies it to every repository",
    ),
    (
        "expire-auto",
        "pgjet expires after every backup unless `backup --no-expire` is given",
    ),
    ("repo-bundle", "pgjet always bundles small files"),
    ("repo-bundle-size", "pgjet always bundles small files"),
    ("repo-bundle-limit", "pgjet always bundles small files"),
    ("compress", "pgjet's option is compress-type"),
    (
        "pg-host-user",
        "pgjet connects over libpq: source (pg1-host) takes a connection string with host=, port=, user=, dbname=",
    ),
    (
        "pg-host-port",
        "pgjet connects over libpq: source (pg1-host) takes a connection string with host=, port=, user=, dbname=",
    ),
    (
        "pg-database",
        "pgjet connects over libpq: source (pg1-host) takes a connection string with host=, port=, user=, dbname=",
    ),
    (
        "repo-host",
        "pgjet has no repository host: use an object store, SFTP or a mounted directory",
    ),
];

/// The unindexed form of `key`: `pg1-path` -> `pg-path`, `repo12-s3-key` ->
/// `repo-s3-key`, `db2-host` -> `db-host`.
fn unindexed(key: &str) -> String {
    for group in ["pg", "repo", "db"] {
        if let Some(rest) = key.strip_prefix(group) {
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if digits > 0 && rest[digits..].starts_with('-') {
                return format!("{group}{}", &rest[digits..]);
            }
        }
    }
    key.to_string()
}

/// Some(hint) when `key` (lower case, indexed or not) is a pgBackRest option; the hint
/// says what pgjet has near it, when it has something.
pub fn lookup(key: &str) -> Option<Option<&'static str>> {
    let base = unindexed(key);
    if !OPTIONS.contains(&base.as_str()) {
        return None;
    }
    Some(HINTS.iter().find(|(k, _)| *k == base).map(|(_, h)| *h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexed_and_deprecated_names_are_known() {
        assert_eq!(unindexed("pg2-host-user"), "pg-host-user");
        assert_eq!(unindexed("repo17-bundle"), "repo-bundle");
        assert_eq!(unindexed("db1-path"), "db-path");
        assert_eq!(unindexed("process-max"), "process-max");
        assert!(lookup("pg2-database").is_some());
        assert!(lookup("repo1-cipher-type").is_some());
        assert_eq!(
            lookup("repo2-retention-full"),
            Some(Some(
                "pgjet reads repo1-retention-full (or retention-full) and applies it to every repository"
            ))
        );
        // repo1's is an alias of pgjet's own option, found before this list.
        assert!(matches!(
            super::super::table::classify("repo1-retention-full"),
            super::super::table::Key::Option { alias: true, .. }
        ));
        assert_eq!(lookup("bogus-option"), None);
        assert_eq!(lookup("pgx-path"), None);
    }
}
