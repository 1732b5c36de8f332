//! What an option takes ([`Kind`], declared by its entry in [`super::table::OPTIONS`]) and the
//! one check of a value against it ([`Kind::check`]), the same for a flag, a `PGJET_*`
//! variable, the config file and the table's own defaults: a value refused in one place is
//! refused in the others with the same words (the caller adds where it was).

/// The words of a choice, in order: (word, what it means, other spellings accepted). Declared
/// by the type the option's value becomes (the `words!` macro: `Transport::WORDS`).
pub type Words = &'static [(&'static str, &'static str, &'static [&'static str])];

/// What an option's value is: how it is checked ([`Kind::check`]) and what the command line
/// builds for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Text, checked where it is used.
    Text,
    /// A file or directory.
    Path,
    /// pgBackRest's `y` or `n`; also yes/no, true/false, on/off, 1/0, in any case.
    Bool,
    /// A number of bytes, with an optional suffix: B, KB, MB, GB, TB (powers of 1024, as
    /// pgBackRest reads them; also K, M, G, T and KiB, MiB, GiB, TiB), in any case.
    Size,
    /// A decimal number of seconds, more than 0 and at most `max`.
    Seconds { max: u32 },
    /// A whole number from `min` to `max`, both included; the bounds fit the integer type
    /// the setting is read into.
    Range { min: i64, max: i64 },
    /// A flag without a value (true when given); in the config file, a [`Kind::Bool`].
    Switch,
    /// A repeatable text value (every occurrence kept, in order).
    List,
    /// One of these words (or another spelling of one).
    Choice(Words),
}

/// A value that passed [`Kind::check`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// [`Kind::Text`], [`Kind::Path`] and [`Kind::List`]: as given.
    Text(String),
    /// [`Kind::Bool`] and [`Kind::Switch`].
    Bool(bool),
    /// [`Kind::Size`], in bytes.
    Size(u64),
    /// [`Kind::Seconds`].
    Seconds(f64),
    /// [`Kind::Range`].
    Int(i64),
    /// [`Kind::Choice`]: the word (another spelling is given as the word it stands for).
    Word(&'static str),
}

/// Bounds printed as their type's limit stand for "no bound" in messages.
const UNBOUNDED: i64 = i32::MAX as i64;

impl Kind {
    /// Checks `value`, given for the option (or config key) `key`, against this kind.
    ///
    /// Errors: what is wrong, naming `key` and the value, without where it was (the caller
    /// knows): `'jobs=x' is not valid (a whole number between 1 and 256)`, `jobs must be
    /// between 1 and 256, not 0`, `resume: 'maybe' is not y or n`, `max-rate: '1PB' is not a
    /// size (...)`, `transport 'x' is not one of auto, local, libpq, basebackup`.
    pub fn check(self, key: &str, value: &str) -> Result<Value, String> {
        let t = value.trim();
        match self {
            Kind::Text | Kind::Path | Kind::List => Ok(Value::Text(value.to_string())),
            Kind::Bool | Kind::Switch => match t.to_ascii_lowercase().as_str() {
                "y" | "yes" | "true" | "on" | "1" => Ok(Value::Bool(true)),
                "n" | "no" | "false" | "off" | "0" => Ok(Value::Bool(false)),
                _ => Err(format!("{key}: '{value}' is not y or n")),
            },
            Kind::Size => size(t).map(Value::Size).ok_or_else(|| {
                format!(
                    "{key}: '{value}' is not a size (a number with an optional KB, MB, GB or TB)"
                )
            }),
            Kind::Seconds { max } => {
                let s: f64 = t.parse().map_err(|_| {
                    format!("'{key}={value}' is not valid (seconds, a decimal number)")
                })?;
                if s > 0.0 && s <= f64::from(max) {
                    Ok(Value::Seconds(s))
                } else {
                    Err(format!(
                        "{key} must be between 0 and {max} seconds, not {s}"
                    ))
                }
            }
            Kind::Range { min, max } => {
                let not_valid = || {
                    format!(
                        "'{key}={value}' is not valid (a whole number{})",
                        match bounds(min, max) {
                            Some(b) if b.starts_with("between") => format!(" {b}"),
                            Some(b) => format!(", {b}"),
                            None => String::new(),
                        }
                    )
                };
                let n: i64 = t.parse().map_err(|_| not_valid())?;
                if (min..=max).contains(&n) {
                    return Ok(Value::Int(n));
                }
                let beyond = if n < min { min } else { max };
                match bounds(min, max) {
                    Some(b) if beyond.abs() < UNBOUNDED => {
                        Err(format!("{key} must be {b}, not {n}"))
                    }
                    _ => Err(not_valid()),
                }
            }
            Kind::Choice(words) => words
                .iter()
                .find(|(w, _, other)| *w == t || other.contains(&t))
                .map(|(w, _, _)| Value::Word(w))
                .ok_or_else(|| {
                    format!(
                        "{key} '{t}' is not one of {}",
                        words.iter().map(|w| w.0).collect::<Vec<_>>().join(", ")
                    )
                }),
        }
    }
}

/// The bounds of a range in words: "between 1 and 256", "at least 1"; None when both are
/// only the type's.
fn bounds(min: i64, max: i64) -> Option<String> {
    match (min.abs() < UNBOUNDED, max < UNBOUNDED) {
        (true, true) => Some(format!("between {min} and {max}")),
        (true, false) => Some(format!("at least {min}")),
        (false, true) => Some(format!("at most {max}")),
        (false, false) => None,
    }
}

/// `v` (trimmed) as a size in bytes: digits, then an optional unit.
fn size(v: &str) -> Option<u64> {
    let t = v.to_ascii_lowercase();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

impl Value {
    /// The value of a [`Kind::Bool`] or [`Kind::Switch`].
    pub fn bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The bytes of a [`Kind::Size`].
    pub fn size(&self) -> Option<u64> {
        match self {
            Value::Size(n) => Some(*n),
            _ => None,
        }
    }

    /// The seconds of a [`Kind::Seconds`].
    pub fn seconds(&self) -> Option<f64> {
        match self {
            Value::Seconds(s) => Some(*s),
            _ => None,
        }
    }

    /// The number of a [`Kind::Range`], as a `T` (None when it does not fit, which the
    /// table's bounds rule out).
    pub fn int<T: TryFrom<i64>>(&self) -> Option<T> {
        match self {
            Value::Int(n) => T::try_from(*n).ok(),
            _ => None,
        }
    }

    /// The word of a [`Kind::Choice`].
    pub fn word(&self) -> Option<&'static str> {
        match self {
            Value::Word(w) => Some(w),
            _ => None,
        }
    }

    /// The text of a [`Kind::Text`], [`Kind::Path`] or [`Kind::List`] value.
    pub fn text(&self) -> Option<&str> {
        match self {
            Value::Text(t) => Some(t),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::command::Transport;

    #[test]
    fn booleans_are_pgbackrests_and_the_usual_spellings() {
        for (v, b) in [
            ("y", true),
            ("Yes", true),
            ("true", true),
            (" on ", true),
            ("1", true),
            ("n", false),
            ("NO", false),
            ("false", false),
            ("off", false),
            ("0", false),
        ] {
            assert_eq!(Kind::Bool.check("resume", v), Ok(Value::Bool(b)), "{v}");
            assert_eq!(Kind::Switch.check("delta", v), Ok(Value::Bool(b)), "{v}");
        }
        assert_eq!(
            Kind::Bool.check("resume", "maybe"),
            Err("resume: 'maybe' is not y or n".into())
        );
    }

    #[test]
    fn sizes_take_pgbackrests_suffixes() {
        for (v, n) in [
            ("4096", 4096),
            ("1GB", 1 << 30),
            ("256mb", 256 << 20),
            ("2 MiB", 2 << 20),
            ("64k", 64 << 10),
            ("1TB", 1 << 40),
        ] {
            assert_eq!(Kind::Size.check("max-rate", v), Ok(Value::Size(n)), "{v}");
        }
        for bad in ["", "MB", "1.5GB", "-1", "1PB", "99999999999TB"] {
            assert_eq!(
                Kind::Size.check("max-rate", bad),
                Err(format!(
                    "max-rate: '{bad}' is not a size (a number with an optional KB, MB, GB or TB)"
                ))
            );
        }
    }

    #[test]
    fn seconds_are_more_than_0_and_at_most_the_bound() {
        let k = Kind::Seconds { max: 86400 };
        assert_eq!(k.check("archive-timeout", "0.5"), Ok(Value::Seconds(0.5)));
        assert_eq!(
            k.check("archive-timeout", "86400"),
            Ok(Value::Seconds(86400.0))
        );
        for (bad, shown) in [("0", "0"), ("-3", "-3"), ("86401", "86401"), ("NaN", "NaN")] {
            assert_eq!(
                k.check("archive-timeout", bad),
                Err(format!(
                    "archive-timeout must be between 0 and 86400 seconds, not {shown}"
                ))
            );
        }
        assert_eq!(
            k.check("archive-timeout", "soon"),
            Err("'archive-timeout=soon' is not valid (seconds, a decimal number)".into())
        );
    }

    #[test]
    fn ranges_name_their_bounds() {
        let jobs = Kind::Range { min: 1, max: 256 };
        assert_eq!(jobs.check("jobs", " 8 "), Ok(Value::Int(8)));
        assert_eq!(
            jobs.check("jobs", "0"),
            Err("jobs must be between 1 and 256, not 0".into())
        );
        assert_eq!(
            jobs.check("jobs", "257"),
            Err("jobs must be between 1 and 256, not 257".into())
        );
        assert_eq!(
            jobs.check("process-max", "two"),
            Err("'process-max=two' is not valid (a whole number between 1 and 256)".into())
        );
        let count = Kind::Range {
            min: 1,
            max: u32::MAX as i64,
        };
        assert_eq!(
            count.check("retention-full", "0"),
            Err("retention-full must be at least 1, not 0".into())
        );
        assert_eq!(
            count.check("retention-full", "4294967296"),
            Err("'retention-full=4294967296' is not valid (a whole number, at least 1)".into())
        );
        let level = Kind::Range {
            min: i32::MIN as i64,
            max: i32::MAX as i64,
        };
        assert_eq!(level.check("compress-level", "-5"), Ok(Value::Int(-5)));
        assert_eq!(
            level.check("compress-level", "1.5"),
            Err("'compress-level=1.5' is not valid (a whole number)".into())
        );
        assert_eq!(Value::Int(70000).int::<u16>(), None);
        assert_eq!(Value::Int(5432).int::<u16>(), Some(5432));
    }

    #[test]
    fn a_choice_takes_its_words_and_other_spellings_and_lists_the_words() {
        let k = Kind::Choice(Transport::WORDS);
        assert_eq!(k.check("transport", " libpq"), Ok(Value::Word("libpq")));
        assert_eq!(
            k.check("transport", "ssh"),
            Err("transport 'ssh' is not one of auto, local, libpq, basebackup".into())
        );
        let k = Kind::Choice(crate::codec::CompressType::WORDS);
        assert_eq!(k.check("compress-type", "zst"), Ok(Value::Word("zstd")));
        assert_eq!(
            k.check("compress-type", "xz"),
            Err("compress-type 'xz' is not one of none, lz4, zstd, gzip".into())
        );
    }
}
