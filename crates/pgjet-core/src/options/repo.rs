//! Repository settings, with pgBackRest's option names: `repo-type`, `repo-path`,
//! `repo-s3-*`, `repo-gcs-*`, `repo-azure-*`, `repo-sftp-*`, `repo-storage-*`.
//!
//! Up to [`MAX_REPOS`] repositories are configured at once as `repoN-<option>`; the
//! unnumbered `repo-<option>` is repository 1. Each value comes from a flag (repository 1
//! only), then the environment (`PGJET_REPON_<OPTION>`, e.g. `PGJET_REPO2_S3_KEY_SECRET`, and
//! for repository 1 also `PGJET_REPO_<OPTION>`), then the config file (stanza section, then
//! `[global]`).
use super::kind::Value;
use super::table;
use crate::error::{Error, Result};
use crate::storage::config::{RepoConfig, RepoType, StorageTls, UriStyle};
use std::path::PathBuf;

/// How many repositories can be configured (`repo1-*` .. `repo4-*`), as in pgBackRest.
pub const MAX_REPOS: u8 = 4;

/// `repo-gcs-key-type`: a service account key file, or anonymous access (test servers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcsKeyType {
    Service,
    None,
}
words!(GcsKeyType, "GCS key type", {
    "service" => Service: "",
    "none" => None: "",
});

/// `repo-azure-key-type`: the account's shared key, or a SAS token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AzureKeyType {
    Shared,
    Sas,
}
words!(AzureKeyType, "Azure key type", {
    "shared" => Shared: "",
    "sas" => Sas: "",
});

impl RepoConfig {
    /// Reads repository `n` (1-based) through `get`, which answers an option name such as
    /// `repo2-s3-bucket` with its value. None when repository `n` is not configured
    /// (neither a type nor a path is set).
    ///
    /// Each value is checked against its option's kind in the table
    /// ([`super::kind::Kind::check`]); an unset option takes the table's default.
    ///
    /// Errors: a value its option does not take (an unknown type, a port that is not a
    /// number, ...), a missing required option (named with its environment variable).
    pub fn resolve(n: u8, get: &dyn Fn(&str) -> Option<String>) -> Result<Option<RepoConfig>> {
        let o = RepoOptions { n, get };
        if o.opt("type").is_none() && o.opt("path").is_none() {
            return Ok(None);
        }
        let path = o.opt("path");
        let cfg = match o.word::<RepoType>("type")? {
            RepoType::Posix => RepoConfig::Posix {
                path: PathBuf::from(o.need("path")?),
            },
            RepoType::S3 => s3(&o, path.as_deref())?,
            RepoType::Gcs => gcs(&o, path.as_deref())?,
            RepoType::Azure => azure(&o, path.as_deref())?,
            RepoType::Sftp => sftp(&o)?,
        };
        Ok(Some(cfg))
    }
}

/// The options of repository `n` as [`RepoConfig::resolve`] reads them through `get`.
struct RepoOptions<'a> {
    n: u8,
    get: &'a dyn Fn(&str) -> Option<String>,
}

impl RepoOptions<'_> {
    /// `repoN-<name>` (for repository 1 also `repo-<name>`), trimmed; None when unset or empty.
    fn opt(&self, name: &str) -> Option<String> {
        let n = self.n;
        (self.get)(&format!("repo{n}-{name}"))
            .or_else(|| {
                if n == 1 {
                    (self.get)(&format!("repo-{name}"))
                } else {
                    None
                }
            })
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// [`Self::opt`], or an error naming the option and its environment variable.
    fn need(&self, name: &str) -> Result<String> {
        let n = self.n;
        self.opt(name).ok_or_else(|| {
            Error::Config(format!(
                "repo{n}-{name} is required for repo{n}-type={} (flag, PGJET_REPO{n}_{} or the config file)",
                self.opt("type").unwrap_or_default(),
                name.to_uppercase().replace('-', "_")
            ))
        })
    }

    /// `repoN-<name>` checked against its kind in the option table, else the table's
    /// default (checked likewise); None when neither.
    ///
    /// Errors: a value the option does not take, naming `repoN-<name>`.
    fn checked(&self, name: &str) -> Result<Option<Value>> {
        let suffix = format!("-{name}");
        let def = table::OPTIONS
            .iter()
            .find(|d| d.repo && d.name.strip_prefix("repo") == Some(suffix.as_str()))
            .ok_or_else(|| Error::Config(format!("repo-{name} is not an option")))?;
        let key = format!("repo{}-{name}", self.n);
        match self.opt(name).or_else(|| def.default.map(str::to_string)) {
            Some(v) => def.kind.check(&key, &v).map(Some).map_err(Error::Config),
            None => Ok(None),
        }
    }

    /// The word of choice `repoN-<name>` (or its default) as a `T`.
    fn word<T: std::str::FromStr<Err = String>>(&self, name: &str) -> Result<T> {
        let value = self.checked(name)?;
        value
            .as_ref()
            .and_then(Value::word)
            .unwrap_or_default()
            .parse()
            .map_err(Error::Config)
    }

    /// Port `repoN-<name>` (or its default), if set.
    fn port(&self, name: &str) -> Result<Option<u16>> {
        Ok(self.checked(name)?.and_then(|v| v.int()))
    }

    /// Text `repoN-<name>`, else its default.
    fn text(&self, name: &str) -> Result<String> {
        let value = self.checked(name)?;
        Ok(value
            .as_ref()
            .and_then(Value::text)
            .unwrap_or_default()
            .trim()
            .to_string())
    }

    /// `repoN-storage-verify-tls` and `repoN-storage-ca-file`.
    fn tls(&self) -> Result<StorageTls> {
        Ok(StorageTls {
            verify: self
                .checked("storage-verify-tls")?
                .and_then(|v| v.bool())
                .unwrap_or(true),
            ca_file: self.opt("storage-ca-file").map(PathBuf::from),
        })
    }
}

/// The prefix of an object-store repository: `repoN-path`, else the bucket's root.
fn prefix(path: Option<&str>) -> String {
    path.unwrap_or("/").to_string()
}

/// An S3 repository (`repoN-s3-*`).
fn s3(o: &RepoOptions, path: Option<&str>) -> Result<RepoConfig> {
    let bucket = o.need("s3-bucket")?;
    let endpoint = endpoint_url(
        &o.need("s3-endpoint")?,
        o.opt("storage-host"),
        o.port("storage-port")?,
    );
    Ok(RepoConfig::S3 {
        bucket,
        endpoint,
        region: o.need("s3-region")?,
        key: o.need("s3-key")?,
        key_secret: o.need("s3-key-secret")?,
        token: o.opt("s3-token"),
        uri_style: o.word("s3-uri-style")?,
        path: prefix(path),
        tls: o.tls()?,
    })
}

/// A Google Cloud Storage repository (`repoN-gcs-*`).
fn gcs(o: &RepoOptions, path: Option<&str>) -> Result<RepoConfig> {
    Ok(RepoConfig::Gcs {
        bucket: o.need("gcs-bucket")?,
        endpoint: endpoint_url(
            &o.text("gcs-endpoint")?,
            o.opt("storage-host"),
            o.port("storage-port")?,
        ),
        key_file: match o.word("gcs-key-type")? {
            GcsKeyType::Service => Some(PathBuf::from(o.need("gcs-key")?)),
            GcsKeyType::None => None,
        },
        path: prefix(path),
        tls: o.tls()?,
    })
}

/// An Azure Blob Storage repository (`repoN-azure-*`): the endpoint is
/// `https://<account>.<host>`, or `https://<host>/<account>` path style.
fn azure(o: &RepoOptions, path: Option<&str>) -> Result<RepoConfig> {
    let account = o.need("azure-account")?;
    let host = o.text("azure-endpoint")?;
    let path_style = o.word::<UriStyle>("azure-uri-style")? == UriStyle::Path;
    let port = o.port("storage-port")?;
    let base = if path_style {
        endpoint_url(&host, o.opt("storage-host"), port)
    } else {
        endpoint_url(&format!("{account}.{host}"), o.opt("storage-host"), port)
    };
    Ok(RepoConfig::Azure {
        endpoint: if path_style {
            format!("{base}/{account}")
        } else {
            base
        },
        container: o.need("azure-container")?,
        key: o.need("azure-key")?,
        sas: o.word::<AzureKeyType>("azure-key-type")? == AzureKeyType::Sas,
        account,
        path: prefix(path),
        tls: o.tls()?,
    })
}

/// An SFTP repository (`repoN-sftp-*`); its path is required.
fn sftp(o: &RepoOptions) -> Result<RepoConfig> {
    Ok(RepoConfig::Sftp {
        host: o.need("sftp-host")?,
        // Never unset: the table's default is 22.
        port: o.port("sftp-host-port")?.unwrap_or_default(),
        user: o.need("sftp-host-user")?,
        private_key_file: o.opt("sftp-private-key-file").map(PathBuf::from),
        host_key_check: o.word("sftp-host-key-check-type")?,
        path: o.need("path")?,
    })
}

/// The base URL of an endpoint given as pgBackRest does (a host name, HTTPS implied) or as a
/// URL with its scheme (`http://127.0.0.1:9000` for a local test server). `storage-host`
/// replaces the host to connect to, `storage-port` the port.
fn endpoint_url(endpoint: &str, host: Option<String>, port: Option<u16>) -> String {
    let (scheme, rest) = match endpoint.split_once("://") {
        Some((s, r)) => (s.to_string(), r.trim_end_matches('/').to_string()),
        None => (
            "https".to_string(),
            endpoint.trim_end_matches('/').to_string(),
        ),
    };
    let (h, p) = match rest.rsplit_once(':') {
        Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) && !p.is_empty() => {
            (h.to_string(), Some(p.to_string()))
        }
        _ => (rest.clone(), None),
    };
    let h = host.unwrap_or(h);
    match port.map(|p| p.to_string()).or(p) {
        Some(p) => format!("{scheme}://{h}:{p}"),
        None => format!("{scheme}://{h}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(kv: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn unnumbered_options_are_repo1_and_s3_needs_its_keys() {
        let g = with(&[
            ("repo-type", "s3"),
            ("repo-s3-bucket", "b"),
            ("repo-s3-endpoint", "127.0.0.1:9000"),
            ("repo1-s3-region", "us-east-1"),
            ("repo-s3-key", "k"),
            ("repo-s3-key-secret", "s"),
            ("repo-s3-uri-style", "path"),
            ("repo-storage-verify-tls", "n"),
        ]);
        let c = RepoConfig::resolve(1, &g).unwrap().unwrap();
        match c {
            RepoConfig::S3 {
                endpoint,
                uri_style,
                tls,
                path,
                ..
            } => {
                assert_eq!(endpoint, "https://127.0.0.1:9000");
                assert_eq!(uri_style, UriStyle::Path);
                assert!(!tls.verify);
                assert_eq!(path, "/");
            }
            o => panic!("not s3: {o:?}"),
        }
        assert_eq!(RepoConfig::resolve(2, &g).unwrap(), None);
        let g = with(&[("repo2-type", "s3"), ("repo2-s3-bucket", "b")]);
        let e = RepoConfig::resolve(2, &g).unwrap_err().to_string();
        assert!(
            e.contains("repo2-s3-endpoint") && e.contains("PGJET_REPO2_S3_ENDPOINT"),
            "{e}"
        );
        let g = with(&[("repo3-type", "nfs"), ("repo3-path", "/x")]);
        assert!(RepoConfig::resolve(3, &g).is_err());
    }

    #[test]
    fn endpoints_keep_an_explicit_scheme_and_take_port_overrides() {
        assert_eq!(
            endpoint_url("s3.example.com", None, None),
            "https://s3.example.com"
        );
        assert_eq!(
            endpoint_url("http://127.0.0.1:7070/", None, None),
            "http://127.0.0.1:7070"
        );
        assert_eq!(
            endpoint_url("s3.example.com", Some("127.0.0.2".into()), Some(9443)),
            "https://127.0.0.2:9443"
        );
    }
}
