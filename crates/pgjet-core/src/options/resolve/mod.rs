//! Layering, driven by the table: each option from its flag, then its `PGJET_*` variable,
//! then the config file (`[<stanza>:<command>]`, `[<stanza>]`, `[global:<command>]`,
//! `[global]`), then its default; and the checks of what is given where:
//!
//! - a flag of an option that does not apply to the command: [`Error::Config`] "option X
//!   does not apply to COMMAND"; a secret or environment-only option given as a flag: an
//!   error saying where it is read instead;
//! - in the file or the environment, an option that does not apply to the command is
//!   ignored without a word (one config file serves every command); one that applies but
//!   is not read from there (a command-line-only option such as `--set`) is a warning; a
//!   command's own option that pgBackRest users keep in the file (`start-fast`, `delta`,
//!   `archive-mode`, ...) is read from it when the command line does not give it;
//! - an unknown key (any section) or `PGJET_*` variable: a warning naming it and where;
//! - a pgBackRest option pgjet does not implement, in a section that applies to this
//!   stanza (`[global]`, `[global:*]`, `[<stanza>]`, `[<stanza>:*]`) or the environment:
//!   an error; a cipher key that is not `repoN-cipher-type`/`-pass`/`-pass-new`: an error.
use super::command::*;
use super::kind::Value;
use super::table::{self, Cmd, Key, OptionDef, OPTIONS};
use super::*;
use crate::codec::CompressType;
use std::collections::HashMap;
use std::str::FromStr;

mod build;
mod checks;
mod env;

pub use build::build_command;
use checks::*;
pub use env::{Env, NoEnv, ProcessEnv};

/// Values given on the command line, by option name (repository options by their
/// unnumbered name, i.e. repository 1), every occurrence in order.
pub type CliValues = HashMap<String, Vec<String>>;

/// One option given as a flag or a `PGJET_*` variable (never a secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Given {
    /// The option's name (a repository option's unnumbered name).
    pub name: &'static str,
    /// A repository option's repository.
    pub repo: Option<u8>,
    pub value: String,
    /// True when it came from the environment, false from the command line.
    pub from_env: bool,
}

impl Given {
    /// `--name=value` (repository N > 1: `--repoN-name=value`).
    pub fn flag(&self) -> String {
        match self.repo {
            Some(n) if n > 1 => format!("--{}={}", self.indexed_key(n), self.value),
            _ => format!("--{}={}", self.name, self.value),
        }
    }

    fn indexed_key(&self, n: u8) -> String {
        format!(
            "repo{n}-{}",
            self.name.strip_prefix("repo-").unwrap_or(self.name)
        )
    }
}

/// One invocation, parsed and resolved: the command with its options, the settings, and
/// the warnings to log once logging is set up.
#[derive(Debug)]
pub struct Invocation {
    pub command: Command,
    pub settings: Settings,
    pub warnings: Vec<String>,
}

/// Where a value was found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    CommandLine,
    Environment(String),
    /// The config file's section.
    File(String),
}

/// A value and where it was found.
#[derive(Debug, Clone)]
struct Found {
    value: String,
    origin: Origin,
    /// The key or flag it was found under.
    key: String,
}

/// The config file that was read.
struct ConfigFile {
    path: PathBuf,
    ini: ini::Ini,
}

/// Everything a value can come from, for one command and stanza.
struct Sources<'a> {
    /// The command whose options apply (None: every option applies).
    cmd: Option<Cmd>,
    cli: &'a CliValues,
    env: &'a dyn Env,
    file: Option<ConfigFile>,
    stanza: Option<String>,
}

impl Sources<'_> {
    /// The sections read, in order: `[<stanza>:<command>]`, `[<stanza>]`,
    /// `[global:<command>]`, `[global]`.
    fn sections(&self) -> Vec<String> {
        let cmd = self.cmd.map(|c| table::command_def(c).name);
        let mut out = Vec::new();
        for s in self.stanza.iter().map(String::as_str).chain(["global"]) {
            if let Some(c) = cmd {
                out.push(format!("{s}:{c}"));
            }
            out.push(s.to_string());
        }
        out
    }

    /// The value of `def` (for a repository option, of repository `repo`, default 1), from
    /// the first place that has it.
    fn lookup(&self, def: &'static OptionDef, repo: Option<u8>) -> Result<Option<Found>> {
        let n = repo.unwrap_or(1);
        let first_repo = !def.repo || n == 1;
        if def.places.cli && first_repo {
            if let Some(v) = self.cli.get(def.name).and_then(|v| v.last()) {
                return Ok(Some(Found {
                    value: v.clone(),
                    origin: Origin::CommandLine,
                    key: def.name.to_string(),
                }));
            }
        }
        let (keys, vars): (Vec<String>, Vec<String>) = if def.repo {
            let (key, var) = def.indexed(n);
            if n == 1 {
                (vec![key, def.name.to_string()], vec![var, def.env_var()])
            } else {
                (vec![key], vec![var])
            }
        } else {
            (
                def.spellings().map(str::to_string).collect(),
                vec![def.env_var()],
            )
        };
        if def.places.env {
            for var in &vars {
                if let Some(v) = self.env.var(var)? {
                    return Ok(Some(Found {
                        value: v,
                        origin: Origin::Environment(var.clone()),
                        key: if def.repo {
                            def.indexed(n).0
                        } else {
                            def.name.to_string()
                        },
                    }));
                }
            }
        }
        if def.places.file {
            if let Some(f) = &self.file {
                // The stanza itself is read from the global sections only.
                let sections = if def.name == "stanza" {
                    self.sections()
                        .into_iter()
                        .filter(|s| s == "global" || s.starts_with("global:"))
                        .collect()
                } else {
                    self.sections()
                };
                for section in sections {
                    let Some(props) = f.ini.section(Some(section.as_str())) else {
                        continue;
                    };
                    for key in &keys {
                        if let Some(v) = props.get(key) {
                            return Ok(Some(Found {
                                value: v.to_string(),
                                origin: Origin::File(section.clone()),
                                key: key.clone(),
                            }));
                        }
                    }
                }
            }
        }
        Ok(None)
    }

    /// The value of general option `name` (not a repository option).
    fn get(&self, name: &str) -> Result<Option<Found>> {
        match table::find(name, self.cmd) {
            Some(def) => self.lookup(def, None),
            None => Ok(None),
        }
    }

    /// The value of `name`, or its default from the table.
    fn get_or_default(&self, name: &str) -> Result<Option<String>> {
        Ok(match self.get(name)? {
            Some(f) => Some(f.value),
            None => table::find(name, self.cmd)
                .and_then(|d| d.default)
                .map(str::to_string),
        })
    }

    /// `f`, found for `def`, checked against `def`'s kind ([`table::Kind::check`]).
    /// Errors: what is wrong with it, after where it was.
    fn check(&self, def: &OptionDef, f: &Found) -> Result<Value> {
        def.kind
            .check(&f.key, &f.value)
            .map_err(|e| Error::Config(format!("{}: {e}", self.place(f))))
    }

    /// The value of general option `name` checked against its kind, else its default from
    /// the table (checked likewise); None when neither.
    fn value(&self, name: &str) -> Result<Option<Value>> {
        let Some(def) = table::find(name, self.cmd) else {
            return Ok(None);
        };
        match self.lookup(def, None)? {
            Some(f) => self.check(def, &f).map(Some),
            None => def
                .default
                .map(|d| def.kind.check(def.name, d).map_err(Error::Config))
                .transpose(),
        }
    }

    /// The value of `name`, a [`table::Kind::Bool`] with a default.
    fn bool(&self, name: &str) -> Result<bool> {
        self.typed(name, "y or n", Value::bool)
            .map(Option::unwrap_or_default)
    }

    /// The value of `name`, a [`table::Kind::Size`], in bytes.
    fn size(&self, name: &str) -> Result<Option<u64>> {
        self.typed(name, "a size", Value::size)
    }

    /// The value of `name`, a [`table::Kind::Seconds`].
    fn seconds(&self, name: &str) -> Result<Option<f64>> {
        self.typed(name, "seconds", Value::seconds)
    }

    /// The value of `name`, a [`table::Kind::Range`], as a `T` (the table's bounds fit it).
    fn int<T: TryFrom<i64>>(&self, name: &str) -> Result<Option<T>> {
        self.typed(name, "a whole number", Value::int::<T>)
    }

    /// The value of `name`, a [`table::Kind::Choice`] with a default, as the type whose words
    /// the table lists.
    fn choice<T: FromStr<Err = String>>(&self, name: &str) -> Result<T> {
        let word = self.typed(name, "a word", Value::word)?;
        word.unwrap_or_default().parse().map_err(Error::Config)
    }

    /// The value of `name` through `read`, which answers for the kind the table gives it.
    /// Errors: a bad value ([`Self::value`]); an option read as a kind it is not (a mistake
    /// here, which the tests of the table's defaults catch).
    fn typed<T>(
        &self,
        name: &str,
        what: &str,
        read: impl Fn(&Value) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.value(name)? {
            None => Ok(None),
            Some(v) => read(&v).map(Some).ok_or_else(|| {
                Error::Config(format!(
                    "option {name} is read as {what}, but its table entry is {v:?}"
                ))
            }),
        }
    }

    /// Where `f` was, for messages.
    fn place(&self, f: &Found) -> String {
        match &f.origin {
            Origin::CommandLine => "command line".into(),
            Origin::Environment(var) => format!("environment ({var})"),
            Origin::File(section) => format!(
                "config file {}, section [{section}]",
                self.file
                    .as_ref()
                    .map(|c| c.path.display().to_string())
                    .unwrap_or_default()
            ),
        }
    }
}

/// What a command line says, once parsed (by the binary's clap parser, or built by a program
/// that embeds pgjet): the command, the option values given (by option name, in order), and
/// the command's positional arguments.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub cmd: Cmd,
    pub values: CliValues,
    pub args: Vec<String>,
}

/// Resolves what the command line said (`parsed`) with the environment `env` and the config
/// file into an [`Invocation`]: the settings, the command's plain options. Warnings found on
/// the way are appended to `warnings` (also when it fails).
///
/// Errors ([`Error::Config`]): an option that does not apply, a bad value, an unreadable
/// config file, an unsupported option (see [`resolve_settings`]).
pub fn resolve_invocation(
    mut parsed: Parsed,
    env: &dyn Env,
    warnings: &mut Vec<String>,
) -> Result<Invocation> {
    let cmd = table::command_def(parsed.cmd).options_of;
    let settings = resolve_settings(Some(cmd), &parsed.values, env, warnings)?;
    command_values_from_file(cmd, &mut parsed.values, env)?;
    let command = build_command(parsed.cmd, &parsed.values, &parsed.args)?;
    Ok(Invocation {
        command,
        settings,
        warnings: warnings.clone(),
    })
}

/// Reads the config file: `--config` / `PGJET_CONFIG` (an error when it cannot be read),
/// else the environment's default ([`Env::default_config`]) when it exists.
fn read_config_file(cli: &CliValues, env: &dyn Env) -> Result<Option<ConfigFile>> {
    let given = match cli.get("config").and_then(|v| v.last()) {
        Some(p) => Some(p.clone()),
        None => env.var(&table::env_name("config"))?,
    };
    let (path, explicit) = match (given, env.default_config()) {
        (Some(p), _) => (PathBuf::from(p), true),
        (None, Some(d)) => (d, false),
        (None, None) => return Ok(None),
    };
    if !explicit && !path.exists() {
        return Ok(None);
    }
    let ini = ini::Ini::load_from_file(&path).map_err(|e| {
        Error::Config(format!("cannot read config file {}", path.display())).because(e)
    })?;
    Ok(Some(ConfigFile { path, ini }))
}

/// Resolves the settings of command `cmd` (None: every option applies) from the command
/// line values `cli`, the environment `env` and the config file; appends warnings to
/// `warnings`.
///
/// Errors: an explicit `--config` that cannot be read, a malformed file, a value out of
/// range (`--jobs 0`, unknown compress type, bad level, log level or output), a cipher or
/// unsupported pgBackRest option.
pub fn resolve_settings(
    cmd: Option<Cmd>,
    cli: &CliValues,
    env: &dyn Env,
    warnings: &mut Vec<String>,
) -> Result<Settings> {
    let file = read_config_file(cli, env)?;
    let mut src = Sources {
        cmd,
        cli,
        env,
        file,
        stanza: None,
    };
    src.stanza = src.get("stanza")?.map(|f| f.value);
    let mut refused = Refused::default();
    check_environment(&src, warnings, &mut refused)?;
    check_file(&src, warnings, &mut refused);
    refused.into_result()?;
    check_given(&src)?;
    let compression = compression(&src)?;
    let config_file = src.file.as_ref().map(|f| f.path.clone());
    // Read before --repo: of two bad values, the one read first is reported.
    let given = given(&src)?;
    let repos = repos(&src)?;
    let cipher_pass = ciphers(&src, "cipher-pass")?;
    let ciphers_new = ciphers(&src, "cipher-pass-new")?;
    Ok(Settings {
        given,
        repo_set: RepoSet {
            stanza: src.stanza.clone(),
            repos,
            ciphers: cipher_pass,
            repo: src.int("repo")?,
            config_file: config_file.clone(),
        },
        ciphers_new,
        primary: PrimaryConn {
            pg_path: src.get("pg-path")?.map(|f| PathBuf::from(f.value)),
            pg_port: src.int("pg-port")?.unwrap_or(DEFAULT_PG_PORT),
            pg_socket_path: PathBuf::from(
                src.get_or_default("pg-socket-path")?.unwrap_or_default(),
            ),
            pg_user: src.get_or_default("pg-user")?.unwrap_or_default(),
            jobs_given: src.get("jobs")?.is_some(),
            jobs: jobs(&src)?,
            source: source(&src)?,
            transport: src.choice("transport")?,
            network_compress: src.choice("network-compress")?,
            network_level: src.int("compress-level-network")?,
            network_workers: src.int("network-compress-workers")?,
            max_rate: src.size("max-rate")?,
            config_file,
        },
        compression,
        log_level: log_level(&src)?,
        output: src.choice("output")?,
        archive: archive(&src)?,
        retention: retention(&src)?,
        resume: src.bool("resume")?,
        manifest_save_threshold: src
            .size("manifest-save-threshold")?
            .unwrap_or_default()
            .max(1 << 20),
    })
}

/// Adds to `cli` the command options of `cmd` read from the command line, else the config
/// file ([`table::CLI_FILE`]: `start-fast=y`, `delta=y`, ...) that the command line does
/// not give, from the first section that has them (a list option takes every line of that
/// section). A switch is added only when the file's value is true.
///
/// Errors: a value its option does not take (a switch that is not y/n, true/false, on/off
/// or 1/0; a word that is not one of a choice's), naming the file and section.
fn command_values_from_file(cmd: Cmd, cli: &mut CliValues, env: &dyn Env) -> Result<()> {
    let Some(file) = read_config_file(cli, env)? else {
        return Ok(());
    };
    let mut src = Sources {
        cmd: Some(cmd),
        cli,
        env,
        file: Some(file),
        stanza: None,
    };
    src.stanza = src.get("stanza")?.map(|f| f.value);
    let mut add: Vec<(&'static str, Vec<String>)> = Vec::new();
    for def in OPTIONS.iter().filter(|d| {
        d.command_specific()
            && d.places.file
            && d.commands.contains(cmd)
            && !src.cli.contains_key(d.name)
    }) {
        let Some(f) = &src.file else { break };
        for section in src.sections() {
            let Some(props) = f.ini.section(Some(section.as_str())) else {
                continue;
            };
            let values: Vec<String> = def
                .spellings()
                .flat_map(|k| props.get_all(k))
                .map(str::to_string)
                .collect();
            let Some(last) = values.last() else {
                continue;
            };
            let value = def.kind.check(def.name, last).map_err(|e| {
                Error::Config(format!(
                    "config file {}, section [{section}]: {e}",
                    f.path.display()
                ))
            })?;
            match def.kind {
                table::Kind::Switch => {
                    if value.bool() == Some(true) {
                        add.push((def.name, vec![String::new()]));
                    }
                }
                table::Kind::List => add.push((def.name, values)),
                _ => add.push((def.name, vec![last.clone()])),
            }
            break;
        }
    }
    drop(src);
    for (name, v) in add {
        cli.insert(name.to_string(), v);
    }
    Ok(())
}

/// Checks every value given for an option that applies to the command (a flag, a `PGJET_*`
/// variable, a key of a section read), each against its kind, whether or not this run reads
/// it: a bad value is refused where it is, before anything else is read. (A command's own
/// options are checked by the command line, and in the file by [`command_values_from_file`].)
///
/// Errors: the first bad value, in table order, with where it was.
fn check_given(src: &Sources) -> Result<()> {
    // repo-cipher-type is checked by `ciphers`: in any case, and pgBackRest's aes-256-cbc
    // refused with the reason.
    for def in OPTIONS.iter().filter(|d| {
        !d.command_specific()
            && d.places != table::ENV_ONLY
            && d.name != "repo-cipher-type"
            && src.cmd.is_none_or(|c| d.commands.contains(c))
    }) {
        for repo in repo_numbers(def) {
            if let Some(f) = src.lookup(def, repo)? {
                src.check(def, &f)?;
            }
        }
    }
    Ok(())
}

/// The repositories an option exists for: 1 to [`MAX_REPOS`] for a repository option, else
/// one unnumbered (None).
fn repo_numbers(def: &OptionDef) -> Vec<Option<u8>> {
    if def.repo {
        (1..=MAX_REPOS).map(Some).collect()
    } else {
        vec![None]
    }
}

/// The options given as flags or environment variables, secrets left out, in table order.
fn given(src: &Sources) -> Result<Vec<Given>> {
    let mut out = Vec::new();
    for def in OPTIONS
        .iter()
        .filter(|d| !d.secret && !d.command_specific())
    {
        if def.places == table::ENV_ONLY {
            continue;
        }
        for repo in repo_numbers(def) {
            if let Some(f) = src.lookup(def, repo)? {
                let from_env = match f.origin {
                    Origin::CommandLine => false,
                    Origin::Environment(_) => true,
                    Origin::File(_) => continue,
                };
                out.push(Given {
                    name: def.name,
                    repo: if def.repo { repo } else { None },
                    value: f.value,
                    from_env,
                });
            }
        }
    }
    Ok(out)
}

/// The repositories configured, 1..=[`MAX_REPOS`].
fn repos(src: &Sources) -> Result<Vec<(u8, RepoConfig)>> {
    let mut out = Vec::new();
    for n in 1..=MAX_REPOS {
        // `get` answers `repoN-<x>` and `repo-<x>` alike: both are repository n's option.
        let failed = std::cell::RefCell::new(None);
        let get = |key: &str| -> Option<String> {
            let Key::Option {
                def, repo: Some(k), ..
            } = table::classify(key)
            else {
                return None;
            };
            match src.lookup(def, Some(k)) {
                Ok(f) => f.map(|f| f.value),
                Err(e) => {
                    failed.borrow_mut().get_or_insert(e);
                    None
                }
            }
        };
        let cfg = RepoConfig::resolve(n, &get);
        if let Some(e) = failed.into_inner() {
            return Err(e);
        }
        if let Some(c) = cfg? {
            out.push((n, c));
        }
    }
    Ok(out)
}

/// The passphrases of the repositories whose `repoN-cipher-type` is `aes-256-gcm`.
///
/// Errors: another cipher type (pgBackRest's aes-256-cbc has no authentication); a cipher
/// type without a passphrase, or a passphrase without the type.
///
/// `which`: `cipher-pass`, or `cipher-pass-new` (the passphrases cipher-pass-change sets).
fn ciphers(src: &Sources, which: &str) -> Result<Vec<(u8, super::CipherPass)>> {
    let mut out = Vec::new();
    for n in 1..=MAX_REPOS {
        let get = |name: &str| -> Result<Option<(&'static OptionDef, Found)>> {
            let key = format!("repo{n}-{name}");
            match table::classify(&key) {
                Key::Option {
                    def, repo: Some(k), ..
                } => Ok(src.lookup(def, Some(k))?.map(|f| (def, f))),
                _ => Ok(None),
            }
        };
        // In any case, as pgjet always read it; pgBackRest's CBC is refused with the reason.
        let kind = match get("cipher-type")? {
            None => CipherType::None,
            Some((def, f)) => {
                let value = f.value.trim().to_ascii_lowercase();
                if value == "aes-256-cbc" {
                    return Err(Error::Config(format!(
                        "repo{n}-cipher-type=aes-256-cbc (pgBackRest's) is not offered: CBC does not authenticate, and pgjet refuses data it cannot authenticate; use aes-256-gcm (in a new repository)"
                    )));
                }
                let word = src.check(def, &Found { value, ..f })?;
                word.word()
                    .unwrap_or_default()
                    .parse()
                    .map_err(Error::Config)?
            }
        };
        let pass = get(which)?.map(|(_, f)| f.value);
        match (kind, pass) {
            (CipherType::None, None) => {}
            (CipherType::Aes256Gcm, Some(p)) if !p.is_empty() => {
                out.push((n, super::CipherPass::new(p)))
            }
            (CipherType::Aes256Gcm, None) if which != "cipher-pass" => {}
            (CipherType::Aes256Gcm, _) => {
                return Err(Error::Config(format!(
                    "repo{n}-cipher-type={CIPHER_TYPE} needs repo{n}-cipher-pass (config file or PGJET_REPO{n}_CIPHER_PASS)"
                )))
            }
            (CipherType::None, Some(_)) => {
                return Err(Error::Config(format!(
                    "repo{n}-{which} is set but repo{n}-cipher-type is not {CIPHER_TYPE}: set both to encrypt repo{n}, or neither"
                )))
            }
        }
    }
    Ok(out)
}

/// `--source`: a bare host name becomes `host=NAME`; empty is unset.
fn source(src: &Sources) -> Result<Option<String>> {
    Ok(src
        .get("source")?
        .map(|f| f.value)
        .filter(|v| !v.trim().is_empty())
        .map(|v| {
            if v.contains('=') || v.contains("://") {
                v
            } else {
                format!("host={}", v.trim())
            }
        }))
}

/// `--jobs` (1 to [`MAX_JOBS`]), default the number of cores, at most [`MAX_JOBS`].
fn jobs(src: &Sources) -> Result<usize> {
    Ok(match src.int("jobs")? {
        Some(j) => j,
        None => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .min(MAX_JOBS),
    })
}

/// `compress-type` and `compress-level`, whose range depends on the type (checked by
/// [`Compression::new`]).
fn compression(src: &Sources) -> Result<Compression> {
    let kind: CompressType = src.choice("compress-type")?;
    let level = src.int("compress-level")?;
    Compression::new(kind, level).map_err(Error::Config)
}

fn log_level(src: &Sources) -> Result<String> {
    let level = src.get_or_default("log-level")?.unwrap_or_default();
    // pgBackRest's levels (log-level-console): off prints nothing, but pgjet always prints
    // its errors; detail lies between info and debug.
    let level = match level.as_str() {
        "off" => "error".to_string(),
        "detail" => "info".to_string(),
        _ => level,
    };
    if !["error", "warn", "info", "debug", "trace"].contains(&level.as_str()) {
        return Err(Error::Config(format!(
            "log-level must be error, warn, info, debug or trace (or pgBackRest's off and detail), not '{level}'"
        )));
    }
    Ok(level)
}

fn archive(src: &Sources) -> Result<ArchiveSettings> {
    Ok(ArchiveSettings {
        timeout: src
            .seconds("archive-timeout")?
            .unwrap_or(DEFAULT_ARCHIVE_TIMEOUT),
        asynchronous: src.bool("archive-async")?,
        spool_path: PathBuf::from(src.get_or_default("spool-path")?.unwrap_or_default()),
        push_queue_max: src.size("archive-push-queue-max")?,
        get_queue_max: src
            .size("archive-get-queue-max")?
            .unwrap_or(DEFAULT_ARCHIVE_GET_QUEUE_MAX),
        check: src.bool("archive-check")?,
        stream_slot: src.get_or_default("archive-stream-slot")?,
    })
}

fn retention(src: &Sources) -> Result<Retention> {
    Ok(Retention {
        full: src.int("retention-full")?,
        full_type: src.choice("retention-full-type")?,
        diff: src.int("retention-diff")?,
        archive: src.int("retention-archive")?,
    })
}
