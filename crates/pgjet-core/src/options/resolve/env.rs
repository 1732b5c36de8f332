//! The environment an invocation is resolved with: the process's (`PGJET_*` variables, the
//! default config file), none (tests, a program that embeds pgjet), or a map.
use super::*;

/// The environment options come from: the process's, or none (tests, library callers).
pub trait Env {
    /// The value of `var`. Errors: a value that is not UTF-8.
    fn var(&self, var: &str) -> Result<Option<String>>;
    /// The names of the `PGJET_*` variables set.
    fn pgjet_names(&self) -> Vec<String>;
    /// The config file read when neither `--config` nor `PGJET_CONFIG` names one (and it
    /// exists): [`DEFAULT_CONFIG`] for the process; none for the environments tests make,
    /// so that a machine's own file never changes a test's result.
    fn default_config(&self) -> Option<PathBuf> {
        None
    }
}

/// The process's environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, var: &str) -> Result<Option<String>> {
        match std::env::var(var) {
            Ok(v) => Ok(Some(v)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(Error::Config(format!(
                "environment: {var} is not valid UTF-8"
            ))),
        }
    }
    fn pgjet_names(&self) -> Vec<String> {
        std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| k.starts_with("PGJET_"))
            .collect()
    }
    fn default_config(&self) -> Option<PathBuf> {
        Some(PathBuf::from(DEFAULT_CONFIG))
    }
}

/// No environment at all.
pub struct NoEnv;

impl Env for NoEnv {
    fn var(&self, _: &str) -> Result<Option<String>> {
        Ok(None)
    }
    fn pgjet_names(&self) -> Vec<String> {
        Vec::new()
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, var: &str) -> Result<Option<String>> {
        Ok(self.get(var).cloned())
    }
    fn pgjet_names(&self) -> Vec<String> {
        self.keys()
            .filter(|k| k.starts_with("PGJET_"))
            .cloned()
            .collect()
    }
}
