//! pgjet: PostgreSQL physical backup, restore, replica creation and WAL archiving.
//!
//! The library knows nothing of the terminal: commands report progress through
//! [`transfer::Progress`] and return typed [`error::Error`]s; the binary maps them to exit codes.
//! docs/architecture.md draws the rooms below and what each owns.

/// Declares, once, the words a plain enum is written with on the command line and in the
/// config file: the option table's `Kind::Choice` takes them (`Kind::Choice(Seed::WORDS)`),
/// so an option's words are listed in one place, beside the values they stand for.
///
/// ```ignore
/// words!(Seed, "seed", {
///     "auto" => Auto: "What auto means (shown in help; may be empty)",
///     "source" | "src" => Source: "Other spellings follow the word",
/// });
/// ```
///
/// It defines `WORDS` ((word, what it means, other spellings), in order), `as_str` (the word
/// of a value) and `FromStr` (a word or another spelling, trimmed; the error names `what` and
/// the words).
macro_rules! words {
    ($t:ident, $what:literal, { $($w:literal $(| $alias:literal)* => $v:ident: $help:literal),* $(,)? }) => {
        impl $t {
            /// The words of this type, in order: (word, what it means, other spellings).
            pub const WORDS: &'static [(&'static str, &'static str, &'static [&'static str])] =
                &[$(($w, $help, &[$($alias),*])),*];

            /// The word of this value.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($t::$v => $w,)*
                }
            }
        }

        impl std::str::FromStr for $t {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, String> {
                match s.trim() {
                    $($w $(| $alias)* => Ok($t::$v),)*
                    o => Err(format!(
                        concat!("'{}' is not a ", $what, " ({})"),
                        o,
                        Self::WORDS.iter().map(|w| w.0).collect::<Vec<_>>().join(", ")
                    )),
                }
            }
        }
    };
}

pub mod archive;
pub mod codec;
pub mod commands;
pub mod error;
pub mod io;
pub mod options;
pub mod pg;
pub mod pgdata;
pub mod primary;
pub mod remote;
pub mod repo;
pub mod storage;
pub mod transfer;
