//! The sections of pgjet's manual pages that the command line cannot say by itself
//! (`pgjet man [COMMAND]`, rendered by clap_mangen from [`crate::cli::command`]): EXAMPLES,
//! FILES and EXIT STATUS, in roff (man(7)).

/// Examples per command (None: pgjet's own page): (what it does, the command line).
fn examples(command: Option<&str>) -> &'static [(&'static str, &'static str)] {
    match command {
        None => &[
            ("Create the stanza, once per cluster", "sudo -u postgres pgjet --stanza main stanza-create"),
            ("A full backup, then a daily incremental", "sudo -u postgres pgjet --stanza main backup --type full --start-fast\nsudo -u postgres pgjet --stanza main backup --type incr"),
            ("Restore the newest backup into a new directory", "sudo -u postgres pgjet --stanza main restore --pg-path /srv/pg/restored --archive-mode off"),
            ("Create a streaming replica from the standby's host", "sudo -u postgres pgjet replica-create --source \"host=db1 user=replicator\" --pg-path /var/lib/postgresql/15/main --slot standby1 --start"),
        ],
        Some("stanza-create") => &[("Record the cluster at pg-path in the repository", "sudo -u postgres pgjet --stanza main stanza-create")],
        Some("backup") => &[
            ("A full backup with an immediate checkpoint", "sudo -u postgres pgjet --stanza main backup --type full --start-fast"),
            ("An incremental: the blocks changed since the newest backup", "sudo -u postgres pgjet --stanza main backup --type incr"),
            ("A backup of a cluster on another host, over libpq", "pgjet --stanza main --source \"host=db1 user=backup\" backup --start-fast"),
        ],
        Some("restore") => &[
            ("The newest backup into a new directory, not archiving into production's repository", "sudo -u postgres pgjet --stanza main restore --pg-path /srv/pg/test --archive-mode off"),
            ("To a restore point, then promote", "sudo -u postgres pgjet --stanza main restore --pg-path /srv/pg/pitr --type name --target before-migration --target-action promote --archive-mode off"),
            ("Bring a stopped copy up to date, writing only what differs", "sudo -u postgres pgjet --stanza main restore --pg-path /srv/pg/test --delta"),
        ],
        Some("verify") => &[("Re-read every stored byte of every backup and of the WAL archive", "pgjet --stanza main verify")],
        Some("info") => &[
            ("Backups and the WAL archive", "pgjet --stanza main info"),
            ("What pgBackRest's monitoring reads (pgbackrest_exporter, check_pgbackrest)", "pgjet --stanza main info --output json --format pgbackrest"),
            ("Metrics for node_exporter's textfile collector", "pgjet info --output prometheus > /var/lib/node_exporter/pgjet.prom"),
        ],
        Some("check") => &[
            ("Cluster, rights, repository and WAL archiving; exits non-zero on any problem it prints", "sudo -u postgres pgjet --stanza main check"),
            ("The rights of a remote role, each missing one with its GRANT", "pgjet check --source \"host=db1 user=replicator\""),
        ],
        Some("replica-create") => &[
            ("A new standby streaming from slot standby1, started", "sudo -u postgres pgjet replica-create --source \"host=db1 user=replicator\" --pg-path /var/lib/postgresql/15/main --slot standby1 --start-fast --start"),
            ("Re-sync a stopped standby, keeping its slot and settings", "sudo -u postgres pgjet replica-create --delta --source \"host=db1 user=replicator\" --pg-path /var/lib/postgresql/15/main --start-fast"),
        ],
        Some("expire") => &[("What retention-full 2 would remove, and what it keeps", "sudo -u postgres pgjet --stanza main --retention-full 2 expire --dry-run")],
        Some("archive-push") => &[("postgresql.conf, with a config file that is not /etc/pgjet/pgjet.conf", "archive_command = 'pgjet --config /etc/pgjet/main.conf --stanza=main archive-push %p'")],
        Some("archive-stream") => &[
            ("the WAL of a primary and its standby, following the one that accepts writes", "pgjet --stanza=main archive-stream --source 'host=db1,db2 user=replicator target_session_attrs=read-write application_name=pgjet_stream'"),
            ("as a service (the Debian package), the source in /etc/pgjet/pgjet.conf", "systemctl enable --now pgjet-archive-stream@main.service"),
        ],
        Some("archive-get") => &[("postgresql.conf of a restored cluster (restore writes it)", "restore_command = 'pgjet --stanza=main archive-get %f \"%p\"'")],
        Some("cipher-pass-change") => &[("Rewrap the keys with repo1-cipher-pass-new from the config file", "pgjet --stanza main cipher-pass-change")],
        Some(_) => &[],
    }
}

/// The exit statuses ([`crate::error::Error::exit_code`]).
const EXIT_STATUS: &[(&str, &str)] = &[
    ("0", "success"),
    ("1", "another error; archive-get: the WAL file is not in the archive (the normal end of recovery)"),
    ("2", "configuration: a flag, variable or config file key (check: a right the role lacks)"),
    ("3", "PostgreSQL could not be reached, refused a query or the replication connection, or broke the replication protocol"),
    ("4", "repository: missing stanza, another cluster's, malformed; a store that refused the credentials or the bucket"),
    ("5", "corruption: stored bytes that do not match their hashes"),
    ("6", "unsafe: pgjet refuses to risk data (a non-empty target, a running server, WAL that cannot reach the archive)"),
    ("7", "a file operation failed"),
    ("8", "no space left on a device"),
    ("9", "the repository's store failed after every retry (a later try may work)"),
    ("130, 143", "cancelled by SIGINT or SIGTERM (128 + the signal): what was being written stays unfinished"),
];

/// Quotes `s` for roff text: a backslash doubled, a line starting with `.` or `'` escaped.
fn roff(s: &str) -> String {
    s.replace('\\', "\\e")
        .lines()
        .map(|l| match l.chars().next() {
            Some('.') | Some('\'') => format!("\\&{l}"),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The EXAMPLES, FILES and EXIT STATUS sections of `command`'s page (None: pgjet's own),
/// in roff.
pub fn sections(command: Option<&str>) -> String {
    let mut t = String::new();
    let ex = examples(command);
    if !ex.is_empty() {
        t.push_str(".SH EXAMPLES\n");
        for (what, line) in ex {
            t.push_str(&format!(".TP\n{}\n.nf\n{}\n.fi\n", roff(what), roff(line)));
        }
    }
    t.push_str(".SH FILES\n.TP\n/etc/pgjet/pgjet.conf\nThe config file read when it exists (--config FILE or PGJET_CONFIG name another): INI, keys are the flag names (pgBackRest's spellings too) in [global], [global:COMMAND], [STANZA] and [STANZA:COMMAND] sections. It holds secrets: mode 0600. A command PostgreSQL runs (archive_command, restore_command) reads it too, so name it there when it is not the default.\n");
    t.push_str(".SH EXIT STATUS\n");
    for (code, what) in EXIT_STATUS {
        t.push_str(&format!(".TP\n{code}\n{}\n", roff(what)));
    }
    t.push_str(".SH SEE ALSO\nThe documentation: docs/commands.md and docs/configuration.md of pgjet's source.\n");
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_has_examples_and_every_exit_code_is_listed() {
        for c in pgjet_core::options::table::COMMANDS
            .iter()
            .filter(|c| !c.hidden)
        {
            assert!(!examples(Some(c.name)).is_empty(), "{}", c.name);
        }
        assert_eq!(roff(".x\n'y\na\\b"), "\\&.x\n\\&'y\na\\eb");
        let s = sections(Some("backup"));
        assert!(
            s.contains(".SH EXAMPLES") && s.contains(".SH EXIT STATUS") && s.contains(".SH FILES")
        );
    }
}
