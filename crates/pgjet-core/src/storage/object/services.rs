//! Each object store's OpenDAL operator, built from its [`RepoConfig`]: S3, GCS, Azure Blob,
//! SFTP (and the in-memory store for tests), with our HTTP client (rustls, the repository's
//! TLS settings) and the retry and timeout layers.
use super::*;
use crate::error::{Error, Result};
use crate::storage::config::{HostKeyCheck, RepoConfig, StorageTls, UriStyle};
use opendal::layers::{RetryEvent, RetryInterceptor, RetryLayer, TimeoutLayer};
use opendal::Operator;

/// Logs each retry OpenDAL makes, so a storm of 5xx answers is visible.
pub(super) struct LogRetry;

impl RetryInterceptor for LogRetry {
    fn intercept(&self, ev: RetryEvent<'_>) {
        tracing::warn!(
            "storage {} failed (attempt {}), retrying in {:.1} s: {}",
            ev.op,
            ev.attempt,
            ev.retry_after.as_secs_f64(),
            ev.err
        );
    }
}

/// The prefix inside the bucket as OpenDAL's `root`: absolute, '/'-terminated.
pub(super) fn root_of(path: &str) -> String {
    let p = path.trim_matches('/');
    if p.is_empty() {
        "/".into()
    } else {
        format!("/{p}/")
    }
}

/// The store's description for messages (`s3 https://host/bucket/prefix`) and the prefix of
/// its object names in messages (`s3://bucket/prefix/`).
pub(super) fn names(
    kind: &str,
    endpoint: &str,
    scheme: &str,
    bucket: &str,
    path: &str,
) -> (String, String) {
    let root = root_of(path);
    (
        format!("{kind} {endpoint}/{bucket}{}", root.trim_end_matches('/')),
        format!("{scheme}{bucket}{root}"),
    )
}

/// A reqwest client for `tls`: HTTP/1.1 (several pooled connections move large objects
/// faster than one HTTP/2 connection), rustls as [`crate::io::tls`] sets it up: the store's
/// certificate verified against `repo-storage-ca-file` (or the system's CAs), names by
/// subjectAltName, or not verified with `repo-storage-verify-tls=n`.
pub(super) fn http_client(tls: &StorageTls) -> Result<reqwest::Client> {
    use crate::io::tls::{NameCheck, ServerTrust};
    let trust = match (&tls.ca_file, tls.verify) {
        (_, false) => ServerTrust::Any,
        (Some(f), true) => ServerTrust::File {
            path: f.clone(),
            names: NameCheck::SubjectAltName,
        },
        (None, true) => ServerTrust::System,
    };
    let mut cfg = crate::io::tls::client_config(&trust, None)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    reqwest::Client::builder()
        .tls_backend_preconfigured(cfg)
        .http1_only()
        .pool_max_idle_per_host(64)
        .build()
        .map_err(|e| Error::Config("cannot set up the HTTP client".into()).because(e))
}

/// Puts our HTTP client under an operator.
pub(super) fn with_client(op: Operator, client: reqwest::Client) -> Operator {
    let transport = opendal::HttpTransporter::new(
        opendal_http_transport_reqwest::ReqwestTransport::new(client),
    );
    let ctx = op.base_context().with_http_transport(transport);
    op.with_context(ctx)
}

pub(super) fn config_err(what: &str, e: opendal::Error) -> Error {
    Error::Config(what.to_string()).because(e)
}

/// A store's operator as its settings make it, before our HTTP client and the retry and
/// timeout layers go on.
pub(super) struct Store<'a> {
    pub(super) op: Operator,
    /// The TLS settings of an HTTP store (None for SFTP).
    pub(super) tls: Option<&'a StorageTls>,
    /// [`ObjectStorage`]'s `desc`.
    pub(super) desc: String,
    /// [`ObjectStorage`]'s `target_prefix`.
    pub(super) target_prefix: String,
}

/// An S3 store ([`RepoConfig::S3`]'s fields): static credentials only (no config file, no
/// EC2 metadata), virtual-host style unless `uri_style` is path.
///
/// Errors: settings OpenDAL refuses ([`Error::Config`]).
#[allow(clippy::too_many_arguments)] // one per field of RepoConfig::S3
pub(super) fn s3_store<'a>(
    bucket: &str,
    endpoint: &str,
    region: &str,
    key: &str,
    key_secret: &str,
    token: Option<&str>,
    uri_style: UriStyle,
    path: &str,
    tls: &'a StorageTls,
) -> Result<Store<'a>> {
    let mut b = opendal::services::S3::default()
        .bucket(bucket)
        .endpoint(endpoint)
        .region(region)
        .access_key_id(key)
        .secret_access_key(key_secret)
        .root(&root_of(path))
        .disable_config_load()
        .disable_ec2_metadata();
    if let Some(t) = token {
        b = b.session_token(t);
    }
    if uri_style == UriStyle::Host {
        b = b.enable_virtual_host_style();
    }
    let op = Operator::new(b).map_err(|e| config_err("S3 repository settings", e))?;
    let (desc, target_prefix) = names("s3", endpoint, "s3://", bucket, path);
    Ok(Store {
        op,
        tls: Some(tls),
        desc,
        target_prefix,
    })
}

/// A GCS store ([`RepoConfig::Gcs`]'s fields): the service account key file, or unsigned
/// requests without one (no config file, no VM metadata).
///
/// Errors: settings OpenDAL refuses ([`Error::Config`]).
pub(super) fn gcs_store<'a>(
    bucket: &str,
    endpoint: &str,
    key_file: Option<&std::path::Path>,
    path: &str,
    tls: &'a StorageTls,
) -> Result<Store<'a>> {
    let mut b = opendal::services::Gcs::default()
        .bucket(bucket)
        .endpoint(endpoint)
        .root(&root_of(path))
        .disable_config_load()
        .disable_vm_metadata();
    b = match key_file {
        Some(f) => b.credential_path(&f.display().to_string()),
        None => b.skip_signature(),
    };
    let op = Operator::new(b).map_err(|e| config_err("GCS repository settings", e))?;
    let (desc, target_prefix) = names("gcs", endpoint, "gs://", bucket, path);
    Ok(Store {
        op,
        tls: Some(tls),
        desc,
        target_prefix,
    })
}

/// An Azure Blob store ([`RepoConfig::Azure`]'s fields): `key` is a SAS token when `sas`,
/// else the account's shared key.
///
/// Errors: settings OpenDAL refuses ([`Error::Config`]).
pub(super) fn azure_store<'a>(
    account: &str,
    container: &str,
    key: &str,
    sas: bool,
    endpoint: &str,
    path: &str,
    tls: &'a StorageTls,
) -> Result<Store<'a>> {
    let mut b = opendal::services::Azblob::default()
        .container(container)
        .endpoint(endpoint)
        .account_name(account)
        .root(&root_of(path));
    b = if sas {
        b.sas_token(key)
    } else {
        b.account_key(key)
    };
    let op = Operator::new(b).map_err(|e| config_err("Azure repository settings", e))?;
    let (desc, target_prefix) = names(
        "azure",
        endpoint,
        &format!("azure://{account}/"),
        container,
        path,
    );
    Ok(Store {
        op,
        tls: Some(tls),
        desc,
        target_prefix,
    })
}

/// An SFTP store ([`RepoConfig::Sftp`]'s fields): `host_key_check` becomes OpenDAL's
/// known-hosts strategy.
///
/// Errors: settings OpenDAL refuses ([`Error::Config`]).
pub(super) fn sftp_store(
    host: &str,
    port: u16,
    user: &str,
    private_key_file: Option<&std::path::Path>,
    host_key_check: HostKeyCheck,
    path: &str,
) -> Result<Store<'static>> {
    let mut b = opendal::services::Sftp::default()
        .endpoint(&format!("ssh://{host}:{port}"))
        .user(user)
        .root(&root_of(path))
        .known_hosts_strategy(match host_key_check {
            HostKeyCheck::None => "Accept",
            HostKeyCheck::AcceptNew => "Add",
            HostKeyCheck::Strict => "Strict",
        });
    if let Some(k) = private_key_file {
        b = b.key(&k.display().to_string());
    }
    let op = Operator::new(b).map_err(|e| config_err("SFTP repository settings", e))?;
    let root = root_of(path);
    let desc = format!("sftp {user}@{host}:{port}{}", root.trim_end_matches('/'));
    Ok(Store {
        op,
        tls: None,
        desc,
        target_prefix: format!("sftp://{user}@{host}{root}"),
    })
}

/// The store `cfg` configures, by its kind.
///
/// Errors: a posix repository, settings OpenDAL refuses ([`Error::Config`]).
pub(super) fn store(cfg: &RepoConfig) -> Result<Store<'_>> {
    match cfg {
        RepoConfig::S3 {
            bucket,
            endpoint,
            region,
            key,
            key_secret,
            token,
            uri_style,
            path,
            tls,
        } => s3_store(
            bucket,
            endpoint,
            region,
            key,
            key_secret,
            token.as_deref(),
            *uri_style,
            path,
            tls,
        ),
        RepoConfig::Gcs {
            bucket,
            endpoint,
            key_file,
            path,
            tls,
        } => gcs_store(bucket, endpoint, key_file.as_deref(), path, tls),
        RepoConfig::Azure {
            account,
            container,
            key,
            sas,
            endpoint,
            path,
            tls,
        } => azure_store(account, container, key, *sas, endpoint, path, tls),
        RepoConfig::Sftp {
            host,
            port,
            user,
            private_key_file,
            host_key_check,
            path,
        } => sftp_store(
            host,
            *port,
            user,
            private_key_file.as_deref(),
            *host_key_check,
            path,
        ),
        RepoConfig::Posix { .. } => Err(Error::Config(
            "a posix repository is not an object store".into(),
        )),
    }
}

/// Puts OpenDAL's retry layer ([`RETRIES`] with jittered backoff from [`RETRY_MIN_DELAY`] to
/// [`RETRY_MAX_DELAY`], each retry logged) and timeout layer ([`REQUEST_TIMEOUT`]) on `op`.
pub(super) fn with_retries(op: Operator) -> Operator {
    op.layer(
        RetryLayer::new()
            .with_jitter()
            .with_max_times(RETRIES)
            .with_min_delay(RETRY_MIN_DELAY)
            .with_max_delay(RETRY_MAX_DELAY)
            .with_notify(LogRetry),
    )
    .layer(
        TimeoutLayer::new()
            .with_timeout(REQUEST_TIMEOUT)
            .with_io_timeout(REQUEST_TIMEOUT),
    )
}
