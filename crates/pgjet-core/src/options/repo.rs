//! Repository settings, with pgBackRest's option names: `repo-type`, `repo-path`,
//! `repo-s3-*`, `repo-gcs-*`, `repo-azure-*`, `repo-sftp-*`, `repo-storage-*`.
//!
//! Up to [`MAX_REPOS`] repositories are configured at once as `repoN-<option>`; the
//! unnumbered `repo-<option>` is repository 1. Each value comes from a flag (repository 1
//! only), then the environment (`PGJET_REPON_<OPTION>`, e.g. `PGJET_REPO2_S3_KEY_SECRET`, and
//! for repository 1 also `PGJET_REPO_<OPTION>`), then the config file (stanza section, then
//! `[global]`).
use crate::error::{Error, Result};
use crate::storage::config::{RepoConfig, StorageTls, UriStyle};
use std::path::PathBuf;

/// How many repositories can be configured (`repo1-*` .. `repo4-*`), as in pgBackRest.
pub const MAX_REPOS: u8 = 4;

impl RepoConfig {
    /// Reads repository `n` (1-based) through `get`, which answers an option name such as
    /// `repo2-s3-bucket` with its value. None when repository `n` is not configured
    /// (neither a type nor a path is set).
    ///
    /// Errors: an unknown type, a missing required option (named with its environment
    /// variable), a malformed value.
    pub fn resolve(n: u8, get: &dyn Fn(&str) -> Option<String>) -> Result<Option<RepoConfig>> {
        let o = RepoOptions { n, get };
        let kind = o.opt("type");
        let path = o.opt("path");
        if kind.is_none() && path.is_none() {
            return Ok(None);
        }
        let cfg = match kind.as_deref().unwrap_or("posix") {
            "posix" | "cifs" => RepoConfig::Posix {
                path: PathBuf::from(o.need("path")?),
            },
            "s3" => s3(&o, path.as_deref())?,
            "gcs" => gcs(&o, path.as_deref())?,
            "azure" => azure(&o, path.as_deref())?,
            "sftp" => sftp(&o)?,
            other => {
                return Err(Error::Config(format!(
                    "repo{n}-type '{other}' is not one of posix, s3, gcs, azure, sftp"
                )))
            }
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

    /// `repoN-storage-verify-tls` and `repoN-storage-ca-file`.
    fn tls(&self) -> Result<StorageTls> {
        let n = self.n;
        Ok(StorageTls {
            verify: match self.opt("storage-verify-tls").as_deref() {
                None => true,
                Some(v) => yes_no(&format!("repo{n}-storage-verify-tls"), v)?,
            },
            ca_file: self.opt("storage-ca-file").map(PathBuf::from),
        })
    }

    /// `repoN-storage-port`, if set.
    fn port(&self) -> Result<Option<u16>> {
        let n = self.n;
        self.opt("storage-port")
            .map(|v| {
                v.parse()
                    .map_err(|_| Error::Config(format!("repo{n}-storage-port '{v}' is not a port")))
            })
            .transpose()
    }
}

/// The prefix of an object-store repository: `repoN-path`, else the bucket's root.
fn prefix(path: Option<&str>) -> String {
    path.unwrap_or("/").to_string()
}

/// An S3 repository (`repoN-s3-*`).
fn s3(o: &RepoOptions, path: Option<&str>) -> Result<RepoConfig> {
    let n = o.n;
    let bucket = o.need("s3-bucket")?;
    let endpoint = endpoint_url(&o.need("s3-endpoint")?, o.opt("storage-host"), o.port()?);
    Ok(RepoConfig::S3 {
        bucket,
        endpoint,
        region: o.need("s3-region")?,
        key: o.need("s3-key")?,
        key_secret: o.need("s3-key-secret")?,
        token: o.opt("s3-token"),
        uri_style: match o.opt("s3-uri-style").as_deref() {
            None | Some("host") => UriStyle::Host,
            Some("path") => UriStyle::Path,
            Some(other) => {
                return Err(Error::Config(format!(
                    "repo{n}-s3-uri-style must be host or path, not '{other}'"
                )))
            }
        },
        path: prefix(path),
        tls: o.tls()?,
    })
}

/// A Google Cloud Storage repository (`repoN-gcs-*`).
fn gcs(o: &RepoOptions, path: Option<&str>) -> Result<RepoConfig> {
    let n = o.n;
    Ok(RepoConfig::Gcs {
        bucket: o.need("gcs-bucket")?,
        endpoint: endpoint_url(
            &o.opt("gcs-endpoint")
                .unwrap_or_else(|| "storage.googleapis.com".into()),
            o.opt("storage-host"),
            o.port()?,
        ),
        key_file: match o.opt("gcs-key-type").as_deref() {
            None | Some("service") => Some(PathBuf::from(o.need("gcs-key")?)),
            Some("none") => None,
            Some(other) => {
                return Err(Error::Config(format!(
                    "repo{n}-gcs-key-type must be service or none, not '{other}'"
                )))
            }
        },
        path: prefix(path),
        tls: o.tls()?,
    })
}

/// An Azure Blob Storage repository (`repoN-azure-*`): the endpoint is
/// `https://<account>.<host>`, or `https://<host>/<account>` path style.
fn azure(o: &RepoOptions, path: Option<&str>) -> Result<RepoConfig> {
    let n = o.n;
    let account = o.need("azure-account")?;
    let host = o
        .opt("azure-endpoint")
        .unwrap_or_else(|| "blob.core.windows.net".into());
    let path_style = match o.opt("azure-uri-style").as_deref() {
        None | Some("host") => false,
        Some("path") => true,
        Some(other) => {
            return Err(Error::Config(format!(
                "repo{n}-azure-uri-style must be host or path, not '{other}'"
            )))
        }
    };
    let base = if path_style {
        endpoint_url(&host, o.opt("storage-host"), o.port()?)
    } else {
        endpoint_url(
            &format!("{account}.{host}"),
            o.opt("storage-host"),
            o.port()?,
        )
    };
    Ok(RepoConfig::Azure {
        endpoint: if path_style {
            format!("{base}/{account}")
        } else {
            base
        },
        container: o.need("azure-container")?,
        key: o.need("azure-key")?,
        sas: match o.opt("azure-key-type").as_deref() {
            None | Some("shared") => false,
            Some("sas") => true,
            Some(other) => {
                return Err(Error::Config(format!(
                    "repo{n}-azure-key-type must be shared or sas, not '{other}'"
                )))
            }
        },
        account,
        path: prefix(path),
        tls: o.tls()?,
    })
}

/// An SFTP repository (`repoN-sftp-*`); its path is required.
fn sftp(o: &RepoOptions) -> Result<RepoConfig> {
    let n = o.n;
    Ok(RepoConfig::Sftp {
        host: o.need("sftp-host")?,
        port: match o.opt("sftp-host-port") {
            None => 22,
            Some(v) => v.parse().map_err(|_| {
                Error::Config(format!("repo{n}-sftp-host-port '{v}' is not a port"))
            })?,
        },
        user: o.need("sftp-host-user")?,
        private_key_file: o.opt("sftp-private-key-file").map(PathBuf::from),
        host_key_check: match o.opt("sftp-host-key-check-type").as_deref() {
            None => "strict".into(),
            Some(v @ ("strict" | "accept-new" | "none")) => v.into(),
            Some(other) => {
                return Err(Error::Config(format!(
                    "repo{n}-sftp-host-key-check-type must be strict, accept-new or none, not '{other}'"
                )))
            }
        },
        path: o.need("path")?,
    })
}

/// `y`/`n` (pgBackRest's booleans), also `yes`/`no`, `true`/`false`, `on`/`off`, `1`/`0`.
fn yes_no(key: &str, v: &str) -> Result<bool> {
    match v.to_ascii_lowercase().as_str() {
        "y" | "yes" | "true" | "on" | "1" => Ok(true),
        "n" | "no" | "false" | "off" | "0" => Ok(false),
        _ => Err(Error::Config(format!("{key} must be y or n, not '{v}'"))),
    }
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
