//! The configuration of a repository's store: which store (posix, S3, GCS, Azure, SFTP),
//! where, with which credentials and TLS. Built by the options layer from `repoN-*` names
//! (crates/pgjet-core/src/options/repo.rs), or by a program that embeds pgjet; opened by
//! [`super::open`]. The words of its choices (`words!`) are the option table's.
use std::path::PathBuf;

/// TLS settings of an HTTPS object store (`repo-storage-verify-tls`, `repo-storage-ca-file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageTls {
    /// Verify the server's certificate and name (default yes).
    pub verify: bool,
    /// CA certificates (PEM) to trust instead of the system's.
    pub ca_file: Option<PathBuf>,
}

/// `repo-s3-uri-style`: bucket in the host name (`host`, AWS's default) or in the path
/// (`path`, what most S3-compatible servers expect).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UriStyle {
    Host,
    Path,
}
words!(UriStyle, "URI style", {
    "host" => Host: "",
    "path" => Path: "",
});

/// `repo-type`: the kind of store (`cifs`, pgBackRest's, is posix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepoType {
    Posix,
    S3,
    Gcs,
    Azure,
    Sftp,
}
words!(RepoType, "repository type", {
    "posix" | "cifs" => Posix: "",
    "s3" => S3: "",
    "gcs" => Gcs: "",
    "azure" => Azure: "",
    "sftp" => Sftp: "",
});

/// `repo-sftp-host-key-check-type`: how the SFTP server's host key is checked against
/// `known_hosts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKeyCheck {
    /// A key that is not in `known_hosts` is refused.
    Strict,
    /// A new host's key is added; a changed key is refused.
    AcceptNew,
    /// Any key is accepted.
    None,
}
words!(HostKeyCheck, "host key check", {
    "strict" => Strict: "",
    "accept-new" => AcceptNew: "",
    "none" => None: "",
});

/// One configured repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepoConfig {
    /// A local (or mounted) directory.
    Posix { path: PathBuf },
    /// Amazon S3 or an S3-compatible server.
    S3 {
        bucket: String,
        /// `https://host[:port]`, or `http://...` when the endpoint was given with that scheme.
        endpoint: String,
        region: String,
        key: String,
        key_secret: String,
        /// Session token of temporary credentials (`repo-s3-token`).
        token: Option<String>,
        uri_style: UriStyle,
        /// Prefix of the repository inside the bucket ("/" = the bucket's root).
        path: String,
        tls: StorageTls,
    },
    /// Google Cloud Storage.
    Gcs {
        bucket: String,
        endpoint: String,
        /// Service account key file (JSON), or None for anonymous access (test servers).
        key_file: Option<PathBuf>,
        path: String,
        tls: StorageTls,
    },
    /// Azure Blob Storage.
    Azure {
        account: String,
        container: String,
        /// Shared key (base64), or a SAS token when `sas` is true.
        key: String,
        sas: bool,
        /// `https://<account>.blob.core.windows.net` or, path style, `https://host/<account>`.
        endpoint: String,
        path: String,
        tls: StorageTls,
    },
    /// A directory on an SSH server, over SFTP (uses the `ssh` client).
    Sftp {
        host: String,
        port: u16,
        user: String,
        private_key_file: Option<PathBuf>,
        /// `repo-sftp-host-key-check-type`.
        host_key_check: HostKeyCheck,
        path: String,
    },
}

impl RepoConfig {
    /// The repository's kind as `repo-type` spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            RepoConfig::Posix { .. } => RepoType::Posix,
            RepoConfig::S3 { .. } => RepoType::S3,
            RepoConfig::Gcs { .. } => RepoType::Gcs,
            RepoConfig::Azure { .. } => RepoType::Azure,
            RepoConfig::Sftp { .. } => RepoType::Sftp,
        }
        .as_str()
    }
}
