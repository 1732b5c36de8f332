//! The command line, built with clap's builder from the option table: each command shows
//! the options that apply to it; every other known option is accepted hidden so that it is
//! refused with a clear error ([`from_matches`]) rather than clap's "unexpected argument".
//! Options may come before the command (`pgjet --stanza=main archive-push %p`) or after it.
use crate::manual;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::parser::ValueSource;
use clap::{value_parser, Arg, ArgAction, ArgMatches};
use pgjet_core::error::{Error, Result};
use pgjet_core::options::resolve::{
    resolve_invocation, CliValues, Env, Invocation, Parsed, ProcessEnv,
};
use pgjet_core::options::table::{
    self, Cmd, CommandDef, Kind, OptionDef, Words, COMMANDS, OPTIONS,
};
use std::collections::HashSet;

/// The whole command line.
pub fn command() -> clap::Command {
    let mut root = clap::Command::new("pgjet")
        .version(env!("CARGO_PKG_VERSION"))
        .about(env!("CARGO_PKG_DESCRIPTION"))
        .subcommand_required(true)
        .arg_required_else_help(true);
    let mut seen = HashSet::new();
    for def in OPTIONS.iter().filter(|d| general(d) && d.places.cli) {
        if seen.insert(def.name) {
            root = root.arg(visible_arg(def));
        }
    }
    for def in OPTIONS {
        if seen.insert(def.name) {
            root = root.arg(hidden_arg(def));
        }
    }
    for c in COMMANDS {
        root = root.subcommand(subcommand(c));
    }
    root.subcommand(
        clap::Command::new(COMPLETION)
            .about(
                "Print a shell completion script on stdout (bash, zsh, fish, elvish, powershell)",
            )
            .arg(
                Arg::new("shell")
                    .value_name("SHELL")
                    .required(true)
                    .value_parser(value_parser!(clap_complete::Shell)),
            ),
    )
    .subcommand(
        clap::Command::new(MAN)
            .about("Print the manual page (roff) of pgjet, or of one command, on stdout")
            .arg(Arg::new("command").value_name("COMMAND")),
    )
}

/// The command that prints a completion script, and the one that prints a manual page:
/// documents generated from [`command`], not commands of the option table (they take no
/// options and need no configuration).
pub const COMPLETION: &str = "completion";
pub const MAN: &str = "man";

/// For `pgjet completion SHELL` and `pgjet man [COMMAND]` (`args` as the process got them,
/// the program's name first): the document to print. None for any other command line.
///
/// Errors: clap's, for a shell it does not know; an unknown or hidden command for `man`.
pub fn document<I, T>(args: I) -> Option<std::result::Result<Vec<u8>, clap::Error>>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let first = args.get(1)?.to_str()?;
    if first != COMPLETION && first != MAN {
        return None;
    }
    Some(render_document(&args))
}

fn render_document(args: &[std::ffi::OsString]) -> std::result::Result<Vec<u8>, clap::Error> {
    let m = command().try_get_matches_from(args)?;
    let mut out = Vec::new();
    match m.subcommand() {
        Some((COMPLETION, sm)) => {
            let shell = *sm
                .get_one::<clap_complete::Shell>("shell")
                .expect("SHELL is required");
            let mut root = command();
            clap_complete::generate(shell, &mut root, "pgjet", &mut out);
        }
        Some((MAN, sm)) => {
            let mut root = command();
            root.build();
            let name = sm.get_one::<String>("command").cloned();
            let page = match sm.get_one::<String>("command") {
                None => root,
                Some(name) => match root
                    .get_subcommands()
                    .find(|c| c.get_name() == name && !c.is_hide_set())
                {
                    Some(c) => c.clone().name(format!("pgjet-{name}")),
                    None => {
                        return Err(clap::Error::raw(
                            clap::error::ErrorKind::InvalidValue,
                            format!("pgjet has no command '{name}' (pgjet --help lists them)\n"),
                        ))
                    }
                },
            };
            clap_mangen::Man::new(page)
                .render(&mut out)
                .map_err(|e| clap::Error::raw(clap::error::ErrorKind::Io, e))?;
            out.extend_from_slice(manual::sections(name.as_deref()).as_bytes());
        }
        _ => {
            return Err(clap::Error::raw(
                clap::error::ErrorKind::InvalidSubcommand,
                "expected `completion SHELL` or `man [COMMAND]`\n",
            ))
        }
    }
    Ok(out)
}

/// True for an option every command could share (not one command's own, not a tuning
/// variable).
fn general(d: &OptionDef) -> bool {
    !d.command_specific() && d.places != table::ENV_ONLY
}

/// One command; its arguments and options are added when it is the one parsed (or its help
/// shown), so that a run builds one command's options, not every command's.
fn subcommand(c: &CommandDef) -> clap::Command {
    clap::Command::new(c.name)
        .about(c.about)
        .hide(c.hidden)
        .defer(command_options)
}

/// Adds to command `sc` its arguments, the options that apply to it, and every other option
/// hidden.
fn command_options(sc: clap::Command) -> clap::Command {
    let Some(c) = table::command(sc.get_name()) else {
        return sc;
    };
    let mut sc = sc;
    for (i, (name, help)) in c.args.iter().enumerate() {
        sc = sc.arg(
            Arg::new(*name)
                .value_name(*name)
                .help(*help)
                .required(true)
                .index(i + 1),
        );
    }
    let mut seen = HashSet::new();
    for def in OPTIONS.iter().filter(|d| {
        d.places.cli && d.places != table::ENV_ONLY && d.commands.contains(c.options_of)
    }) {
        if seen.insert(def.name) {
            sc = sc.arg(visible_arg(def));
        }
    }
    for def in OPTIONS {
        if seen.insert(def.name) {
            sc = sc.arg(hidden_arg(def));
        }
    }
    sc
}

/// The help of `def`: its text, and its environment variable when it has one.
fn help(def: &OptionDef) -> String {
    if def.places.env {
        format!("{} [env: {}]", def.help, def.env_var())
    } else {
        def.help.to_string()
    }
}

/// The flag of `def` as help shows it, with its parser, from its kind. The values of the
/// general options (which may come from the flag, the environment or the config file) are
/// checked by the core, the same way for the three ([`Kind::check`]): here they are text, a
/// choice's words listed for completion. A command's own choice (`--type`,
/// `--target-action`, ...) is checked here by clap, which suggests the nearest word.
fn visible_arg(def: &'static OptionDef) -> Arg {
    let mut a = Arg::new(def.name).long(def.name).help(help(def));
    if !def.heading.is_empty() {
        a = a.help_heading(def.help_heading());
    }
    for al in def.visible_aliases {
        a = a.visible_alias(*al);
    }
    for al in def.aliases {
        a = a.alias(*al);
    }
    if def.kind != Kind::Switch {
        a = a.value_name(def.value_name);
    }
    match def.kind {
        Kind::Switch => a.action(ArgAction::SetTrue),
        Kind::List => a.action(ArgAction::Append),
        Kind::Choice(words) if def.command_specific() => {
            let a = a.value_parser(PossibleValuesParser::new(words.iter().map(possible_value)));
            match def.default {
                Some(d) => a.default_value(d),
                None => a,
            }
        }
        // Help lists the words in the option's own text already.
        Kind::Choice(words) => a.value_parser(Listed(words)).hide_possible_values(true),
        Kind::Text => match (def.command_specific(), def.default) {
            (true, Some(d)) => a.default_value(d),
            _ => a,
        },
        Kind::Path => a.value_parser(value_parser!(std::path::PathBuf)),
        Kind::Bool | Kind::Size | Kind::Seconds { .. } | Kind::Range { .. } => a,
    }
}

/// A word of a choice as clap lists it: its meaning as help, its other spellings as hidden
/// aliases.
fn possible_value(
    &(word, help, other): &(&'static str, &'static str, &'static [&'static str]),
) -> PossibleValue {
    let v = PossibleValue::new(word).aliases(other.iter().copied());
    if help.is_empty() {
        v
    } else {
        v.help(help)
    }
}

/// A general option's words, for completion; any value passes, to be checked by the core as
/// the same value from the environment or the config file is.
#[derive(Clone)]
struct Listed(Words);

impl TypedValueParser for Listed {
    type Value = std::ffi::OsString;

    fn parse_ref(
        &self,
        _cmd: &clap::Command,
        _arg: Option<&Arg>,
        value: &std::ffi::OsStr,
    ) -> std::result::Result<Self::Value, clap::Error> {
        Ok(value.to_owned())
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(self.0.iter().map(possible_value)))
    }
}

/// A flag accepted but not shown, with any value: refused after parsing when it does not
/// apply, or checked as the command's own.
fn hidden_arg(def: &'static OptionDef) -> Arg {
    let mut a = Arg::new(def.name).long(def.name).hide(true);
    for al in def.visible_aliases.iter().chain(def.aliases) {
        a = a.alias(*al);
    }
    match def.kind {
        Kind::Switch => a.action(ArgAction::SetTrue),
        _ => a.action(ArgAction::Append),
    }
}

/// Reads clap's matches: options given before and after the command (after wins), each
/// checked against the command.
///
/// Errors ([`Error::Config`]): an option that does not apply to the command ("option
/// retention-archive does not apply to archive-get"); a secret or an environment-only
/// variable given as a flag; a value that is not UTF-8.
pub fn from_matches(m: &ArgMatches) -> Result<Parsed> {
    let (name, sub) = m
        .subcommand()
        .ok_or_else(|| Error::Config("a command is required (pgjet --help lists them)".into()))?;
    let c = table::command(name).ok_or_else(|| Error::Config(format!("unknown command {name}")))?;
    let mut values = CliValues::new();
    for matches in [m, sub] {
        for id in matches.ids() {
            let id = id.as_str();
            if matches.value_source(id) != Some(ValueSource::CommandLine)
                || c.args.iter().any(|(a, _)| *a == id)
            {
                continue;
            }
            let Some(def) = table::find(id, Some(c.options_of)) else {
                continue;
            };
            check_flag(def, c)?;
            let vals = if def.kind == Kind::Switch {
                vec!["true".to_string()]
            } else {
                raw_strings(matches, id)?
            };
            values.insert(def.name.to_string(), vals);
        }
    }
    let mut args = Vec::new();
    for (a, _) in c.args {
        args.extend(raw_strings(sub, a)?);
    }
    Ok(Parsed {
        cmd: c.cmd,
        values,
        args,
    })
}

/// Refuses flag `def` on command `c` when it does not apply there or is not read from the
/// command line.
fn check_flag(def: &OptionDef, c: &CommandDef) -> Result<()> {
    if !def.commands.contains(c.options_of) {
        return Err(Error::Config(format!(
            "option {} does not apply to {} (pgjet {} --help lists the options it takes)",
            def.name,
            c.name,
            table::command_def(c.options_of).name
        )));
    }
    if def.secret {
        return Err(Error::Config(format!(
            "option {} is a secret and is not taken on the command line (it would show in the process list and in restore_command): set {} or put {} in the config file",
            def.name,
            def.env_var(),
            def.name
        )));
    }
    if !def.places.cli {
        return Err(Error::Config(format!(
            "{} is read from the environment only: set {}",
            def.name,
            def.env_var()
        )));
    }
    Ok(())
}

/// Every value of `id` as given, as text.
fn raw_strings(m: &ArgMatches, id: &str) -> Result<Vec<String>> {
    let Some(raw) = m.get_raw(id) else {
        return Ok(Vec::new());
    };
    raw.map(|v| {
        v.to_str()
            .map(str::to_string)
            .ok_or_else(|| Error::Config(format!("--{id}: the value is not valid UTF-8")))
    })
    .collect()
}

/// Parses the command line `args` (the first is the program) and resolves the settings
/// with the process's environment and the config file.
///
/// Errors: [`ParseError::Clap`] for what clap reports (help and version included: the
/// caller prints it and exits); [`ParseError::Config`] for the rest (an option that does
/// not apply, a bad value, an unreadable config file, an unsupported option), with the
/// warnings found before it.
pub fn parse<I, T>(args: I) -> std::result::Result<Invocation, ParseError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    parse_with_env(args, &ProcessEnv)
}

/// [`parse`] with the environment `env`.
pub fn parse_with_env<I, T>(args: I, env: &dyn Env) -> std::result::Result<Invocation, ParseError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let m = command()
        .try_get_matches_from(args)
        .map_err(ParseError::Clap)?;
    let cmd = m.subcommand_name().and_then(table::command).map(|c| c.cmd);
    let mut warnings = Vec::new();
    from_matches(&m)
        .and_then(|parsed| resolve_invocation(parsed, env, &mut warnings))
        .map_err(|error| ParseError::Config {
            error,
            warnings,
            cmd,
        })
}

/// Why the command line could not be turned into an [`Invocation`].
#[derive(Debug)]
pub enum ParseError {
    /// clap's own report (usage errors, `--help`, `--version`).
    Clap(clap::Error),
    /// A configuration error, the warnings found before it, and the command named on the
    /// command line.
    Config {
        error: Error,
        warnings: Vec<String>,
        cmd: Option<Cmd>,
    },
}
