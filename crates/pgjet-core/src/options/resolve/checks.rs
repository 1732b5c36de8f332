//! The checks of what is given where (the module documentation of `resolve` lists them):
//! unknown keys and variables warned about, pgBackRest options pgjet does not implement and
//! cipher keys refused, secrets in a file others may read.
use super::*;

/// The options refused for what they ask (cipher options, pgBackRest options pgjet lacks),
/// each with where it was; turned into one error naming them all.
#[derive(Default)]
pub(super) struct Refused {
    /// (key, place).
    cipher: Vec<(String, String)>,
    /// (key, place, hint).
    unsupported: Vec<(String, String, Option<&'static str>)>,
}

impl Refused {
    /// Ok when nothing was refused, else one [`Error::Config`]: the cipher options first
    /// (grouped by where they were), then the unsupported ones.
    pub(super) fn into_result(self) -> Result<()> {
        let mut parts = Vec::new();
        if !self.cipher.is_empty() {
            let mut places: Vec<(String, Vec<String>)> = Vec::new();
            for (key, place) in &self.cipher {
                match places.iter_mut().find(|(p, _)| p == place) {
                    Some((_, keys)) => keys.push(key.clone()),
                    None => places.push((place.clone(), vec![key.clone()])),
                }
            }
            let named: Vec<String> = places
                .iter()
                .map(|(place, keys)| format!("{} ({place})", keys.join(", ")))
                .collect();
            parts.push(format!(
                "{} {} not {} of pgjet's: encryption is set per repository with repoN-cipher-type=aes-256-gcm and repoN-cipher-pass; without them the repository would be stored unencrypted",
                named.join(", "),
                if self.cipher.len() == 1 { "is" } else { "are" },
                if self.cipher.len() == 1 { "an option" } else { "options" }
            ));
        }
        match self.unsupported.as_slice() {
            [] => {}
            [(key, place, hint)] => parts.push(format!(
                "{key} ({place}) is a pgBackRest option pgjet does not implement yet; remove it{}",
                hint.map(|h| format!(" ({h})")).unwrap_or_default()
            )),
            many => parts.push(format!(
                "pgBackRest options pgjet does not implement yet; remove them: {}",
                many.iter()
                    .map(|(key, place, hint)| format!(
                        "{key} ({place}{})",
                        hint.map(|h| format!("; {h}")).unwrap_or_default()
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
        if parts.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(parts.join("; ")))
        }
    }
}

/// True when a cipher option's value asks for nothing: `cipher-type=none`.
pub(super) fn cipher_none(key: &str, value: &str) -> bool {
    key.ends_with("cipher-type") && value.trim().eq_ignore_ascii_case("none")
}

/// Checks the `PGJET_*` variables: unknown ones and aliases warn; cipher and unsupported
/// pgBackRest options go to `refused`. Errors: a value that is not UTF-8.
pub(super) fn check_environment(
    src: &Sources,
    warnings: &mut Vec<String>,
    refused: &mut Refused,
) -> Result<()> {
    let mut names = src.env.pgjet_names();
    names.sort();
    for var in names {
        let Some((key, class)) = table::classify_env(&var) else {
            continue;
        };
        match class {
            Key::Option {
                def, alias: true, ..
            } => warnings.push(format!(
                "environment: {var} is not read; the variable of {key} is {}",
                def.env_var()
            )),
            Key::Option { def, .. } => {
                let def = table::find(def.name, src.cmd).unwrap_or(def);
                let applies = src.cmd.is_none_or(|c| def.commands.contains(c));
                if !def.places.env && applies {
                    warnings.push(format!(
                        "environment: {var} is not read: option {} is given on the command line only; ignored",
                        def.name
                    ));
                }
            }
            Key::Cipher => {
                let value = src.env.var(&var)?.unwrap_or_default();
                if !cipher_none(&key, &value) {
                    refused.cipher.push((var.clone(), "environment".into()));
                }
            }
            Key::PgBackRest(_)
                if super::pgbackrest::always(&key, &src.env.var(&var)?.unwrap_or_default()) => {}
            Key::PgBackRest(hint) => match super::pgbackrest::ignored(&key) {
                Some(why) => warnings.push(format!("environment: {var} is ignored: {why}")),
                None => refused
                    .unsupported
                    .push((var.clone(), "environment".into(), hint)),
            },
            Key::Unknown => warnings.push(format!("environment: unknown variable {var}, ignored")),
        }
    }
    Ok(())
}

/// True when config section `section` applies to stanza `stanza`: `[global]`,
/// `[global:*]`, and the stanza's own.
pub(super) fn section_applies(section: &str, stanza: Option<&str>) -> bool {
    let base = section.split(':').next().unwrap_or(section);
    base == "global" || Some(base) == stanza
}

/// Checks every key of the config file: unknown keys warn in any section; cipher and
/// unsupported pgBackRest options in the sections that apply to this stanza go to `refused`.
pub(super) fn check_file(src: &Sources, warnings: &mut Vec<String>, refused: &mut Refused) {
    let Some(f) = &src.file else {
        return;
    };
    let path = f.path.display();
    warn_readable_secrets(f, warnings);
    for (section, props) in f.ini.iter() {
        let Some(section) = section else {
            for (key, _) in props.iter() {
                warnings.push(format!(
                    "config file {path}: {key} is outside any section; pgjet reads [global] and [<stanza>] sections: ignored"
                ));
            }
            continue;
        };
        let place = format!("config file {path}, section [{section}]");
        if let Some((_, c)) = section.split_once(':') {
            if table::command(c).is_none() && !PGBACKREST_COMMANDS.contains(&c) {
                warnings.push(format!(
                    "{place}: '{c}' is not a command; pgjet ignores this section"
                ));
            }
        }
        let applies_here = section_applies(section, src.stanza.as_deref());
        for (key, value) in props.iter() {
            match table::classify(key) {
                Key::Option { def, .. } => {
                    let def = table::find(def.name, src.cmd).unwrap_or(def);
                    let applies = src.cmd.is_none_or(|c| def.commands.contains(c));
                    if !def.places.file && applies && applies_here {
                        warnings.push(format!(
                            "{place}: option {key} is not read from the config file (only from {}); ignored",
                            match (def.places.cli, def.places.env) {
                                (true, true) => format!("the command line and {}", def.env_var()),
                                (false, true) => def.env_var(),
                                _ => "the command line".to_string(),
                            }
                        ));
                    }
                }
                Key::Cipher => {
                    if applies_here && !cipher_none(key, value) {
                        refused.cipher.push((key.to_string(), place.clone()));
                    }
                }
                Key::PgBackRest(_) if super::pgbackrest::always(key, value) => {}
                Key::PgBackRest(hint) if applies_here => match super::pgbackrest::ignored(key) {
                    Some(why) => warnings.push(format!("{place}: {key} is ignored: {why}")),
                    None => refused
                        .unsupported
                        .push((key.to_string(), place.clone(), hint)),
                },
                Key::PgBackRest(_) => {}
                Key::Unknown => warnings.push(format!("{place}: unknown option {key}, ignored")),
            }
        }
    }
}

/// Warns when the config file holds a secret (an S3, GCS, Azure or SFTP key, a cipher
/// passphrase) and any user of the host may read it (a world bit in its mode): the warning
/// names the options, never their values.
pub(super) fn warn_readable_secrets(f: &ConfigFile, warnings: &mut Vec<String>) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::metadata(&f.path) else {
        return;
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o007 == 0 {
        return;
    }
    let mut secrets: Vec<&str> = f
        .ini
        .iter()
        .flat_map(|(_, props)| props.iter().map(|(k, _)| k))
        .filter(|k| match table::classify(k) {
            Key::Option { def, .. } => def.secret,
            Key::Cipher => k.ends_with("cipher-pass"),
            _ => false,
        })
        .collect();
    secrets.sort_unstable();
    secrets.dedup();
    if !secrets.is_empty() {
        warnings.push(format!(
            "config file {} holds {} and any user of this host may read it (mode {mode:04o}): chmod 0600 it (or 0640, with a group of backup users only)",
            f.path.display(),
            secrets.join(", ")
        ));
    }
}

/// pgBackRest's commands (its src/build/config/config.yaml, `command:`): a
/// `[<stanza>:<command>]` section for one of them is pgBackRest's, not a typo.
pub(super) const PGBACKREST_COMMANDS: &[&str] = &[
    "annotate",
    "archive-get",
    "archive-push",
    "backup",
    "check",
    "expire",
    "help",
    "info",
    "manifest",
    "repo-create",
    "repo-get",
    "repo-ls",
    "repo-put",
    "repo-rm",
    "restore",
    "server",
    "server-ping",
    "stanza-create",
    "stanza-delete",
    "stanza-upgrade",
    "start",
    "stop",
    "verify",
    "version",
];
