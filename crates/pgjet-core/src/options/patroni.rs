//! Patroni's call of a replica creation method (`postgresql.create_replica_methods`) or of a
//! custom bootstrap method (`bootstrap.method`), taken as it comes, with no wrapper.
//!
//! Patroni runs the method's `command` followed by `--scope=NAME`, `--role=replica`,
//! `--datadir=DIR` and `--connstring=DSN` (a bootstrap method: `--scope` and `--datadir`
//! only), then one `--KEY=VALUE` for each other key of the method's section, Python's
//! booleans written `True` and `False` (Patroni's patroni/postgresql/bootstrap.py). The
//! password is not in the DSN but in the file `PGPASSFILE` names, which libpq's rules (and
//! pgjet's) read anyway.
//!
//! [`translate`] recognises that call by `--scope=` and `--datadir=` after `replica-create`
//! or `restore` and turns it into pgjet's own command line: `--datadir` is `--pg-path`,
//! `--connstring` is `--source` (none when empty: Patroni passes an empty one to a `no_leader`
//! method when there is no leader to clone), a key that names one of the command's options (`--jobs=8`,
//! `--start_fast=True`, dashes or underscores) is that option, and Patroni's own keys
//! (`scope`, `role`, `keep_data`, `no_leader`, ...) are kept aside in a [`PatroniCall`].
//! Any other key is ignored and logged: the method's section may hold keys for another tool.
//! Outside such a call an unknown flag stays an error.
use super::table::{self, Cmd, Kind};
use std::ffi::OsString;

/// What Patroni said of the call beyond pgjet's own options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PatroniCall {
    /// `--scope`: the Patroni cluster's name.
    pub scope: String,
    /// `--role` (`replica` for a replica creation method; none for bootstrap).
    pub role: Option<String>,
    /// `keep_data`: Patroni left the data directory as it was (a reinit over kept data, a
    /// failed start): a copy of the same cluster is re-synced in place.
    pub keep_data: bool,
    /// `no_leader` (or its old name `no_master`): the method may run with no leader.
    pub no_leader: bool,
    /// The `--KEY=VALUE` arguments pgjet does not take for this command, as given.
    pub ignored: Vec<String>,
}

/// The arguments `args` (the program first) translated when they are Patroni's call of
/// `replica-create` or `restore` (see the module's documentation), with what Patroni said;
/// None for any other command line, which is parsed as it is.
pub fn translate(args: &[OsString]) -> Option<(Vec<OsString>, PatroniCall)> {
    let texts: Vec<Option<&str>> = args.iter().map(|a| a.to_str()).collect();
    let at = texts
        .iter()
        .position(|t| matches!(t, Some("replica-create") | Some("restore")))?;
    let cmd = match texts[at] {
        Some("replica-create") => Cmd::ReplicaCreate,
        _ => Cmd::Restore,
    };
    let has = |key: &str| {
        texts
            .iter()
            .any(|t| t.is_some_and(|t| t.starts_with(&format!("--{key}="))))
    };
    if !(has("scope") && has("datadir")) {
        return None;
    }
    let mut call = PatroniCall::default();
    let mut out = Vec::with_capacity(args.len());
    for (i, arg) in args.iter().enumerate() {
        let split = texts[i]
            .filter(|_| i > 0)
            .and_then(|t| t.strip_prefix("--"))
            .and_then(|t| t.split_once('='));
        let Some((key, value)) = split else {
            out.push(arg.clone());
            continue;
        };
        match key {
            "scope" => call.scope = value.to_string(),
            "role" => call.role = Some(value.to_string()),
            "datadir" => out.push(format!("--pg-path={value}").into()),
            // Empty when no member may be cloned (no leader, a `no_leader` method): no
            // source, so replica-create seeds from the repository.
            "connstring" if value.is_empty() => {}
            "connstring" => out.push(format!("--source={value}").into()),
            "keep_data" => call.keep_data = truthy(value),
            "no_leader" | "no_master" => call.no_leader = call.no_leader || truthy(value),
            "no_params" => {}
            k => match option_of(k, cmd) {
                Some((name, Kind::Switch)) => {
                    if truthy(value) {
                        out.push(format!("--{name}").into());
                    }
                }
                Some((name, _)) => out.push(format!("--{name}={value}").into()),
                None => call.ignored.push(format!("--{key}={value}")),
            },
        }
    }
    Some((out, call))
}

/// The name and kind of the option of `cmd` spelled `key`, with `_` for `-` as YAML keys are
/// written.
fn option_of(key: &str, cmd: Cmd) -> Option<(&'static str, Kind)> {
    let spelling = key.replace('_', "-");
    let def = table::find(&spelling, Some(cmd))?;
    (def.commands.contains(cmd) && def.places.cli).then_some((def.name, def.kind))
}

/// A YAML boolean as Patroni writes it (`True`), or as a user would (`y`, `on`, `1`).
fn truthy(v: &str) -> bool {
    super::parse_bool("", v).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn patronis_replica_method_call_becomes_pgjets_command_line() {
        // As Patroni 4.1 calls `command: pgjet replica-create` with keep_data, jobs and a
        // key meant for another tool.
        let (args, call) = translate(&os(&[
            "pgjet",
            "replica-create",
            "--keep_data=True",
            "--jobs=8",
            "--start_fast=True",
            "--delta=False",
            "--wal_method=stream",
            "--scope=acc",
            "--role=replica",
            "--datadir=/var/lib/pg/acc",
            "--connstring=dbname=postgres user=replicator host=127.0.0.1 port=5432",
        ]))
        .expect("a Patroni call");
        assert_eq!(
            args,
            os(&[
                "pgjet",
                "replica-create",
                "--jobs=8",
                "--start-fast",
                "--pg-path=/var/lib/pg/acc",
                "--source=dbname=postgres user=replicator host=127.0.0.1 port=5432",
            ])
        );
        assert_eq!(
            call,
            PatroniCall {
                scope: "acc".into(),
                role: Some("replica".into()),
                keep_data: true,
                no_leader: false,
                ignored: vec!["--wal_method=stream".into()],
            }
        );
    }

    #[test]
    fn a_bootstrap_call_of_restore_and_other_command_lines() {
        let (args, call) = translate(&os(&[
            "pgjet",
            "--stanza=main",
            "restore",
            "--type=time",
            "--scope=acc",
            "--datadir=/d",
            "--no_params=False",
        ]))
        .expect("a Patroni bootstrap call");
        assert_eq!(
            args,
            os(&[
                "pgjet",
                "--stanza=main",
                "restore",
                "--type=time",
                "--pg-path=/d"
            ])
        );
        assert_eq!((call.scope.as_str(), call.role), ("acc", None));
        // Not Patroni's: no --scope, or a command it never calls.
        assert!(translate(&os(&["pgjet", "replica-create", "--datadir=/d"])).is_none());
        assert!(translate(&os(&["pgjet", "backup", "--scope=a", "--datadir=/d"])).is_none());
        assert!(translate(&os(&["pgjet", "info"])).is_none());
    }

    #[test]
    fn no_leader_call_has_no_source() {
        // Patroni 4.1 with no leader: `--connstring=` empty, only `no_leader` methods.
        let (args, call) = translate(&os(&[
            "pgjet",
            "replica-create",
            "--no_leader=True",
            "--seed=repo",
            "--scope=acc",
            "--role=replica",
            "--datadir=/d",
            "--connstring=",
        ]))
        .expect("a Patroni call");
        assert_eq!(
            args,
            os(&["pgjet", "replica-create", "--seed=repo", "--pg-path=/d"])
        );
        assert!(call.no_leader);
    }
}
