//! The library error type. Every error says what failed and where; [`Error::hint`] gives the
//! one-line hint the binary prints under it, and [`Error::exit_code`] the process exit code.
pub mod tls;

use std::path::PathBuf;

/// Result alias used across the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A cause another library or the operating system reported, kept as a value.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong, in kinds a caller can act on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad or missing settings (flags, environment, config file).
    #[error("configuration: {0}")]
    Config(String),
    /// PostgreSQL could not be reached or refused the session.
    #[error("could not connect to PostgreSQL ({target}): {source}")]
    Connect {
        target: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// A SQL statement failed on an open session.
    #[error("PostgreSQL query failed ({what}): {source}")]
    Query {
        what: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// The server refused or ended a replication connection (the BASE_BACKUP transport,
    /// crates/pgjet-core/src/remote/replication.rs): `error` is its ErrorResponse; `user` the role that
    /// connected, for the hint.
    #[error("replication connection to {target} failed: {error}")]
    Replication {
        target: String,
        user: String,
        error: Box<ServerError>,
    },
    /// A connection to the server broke while in use (the replication connection of the
    /// BASE_BACKUP transport: a cut link, a keepalive or tcp_user_timeout that ran out).
    #[error("the connection to {target} was lost ({op}): {source}")]
    Lost {
        op: &'static str,
        target: String,
        #[source]
        source: std::io::Error,
    },
    /// The server's side of a replication connection did not follow the protocol (a
    /// message malformed, out of order, or missing from a reply; see the protocol chapter
    /// "Streaming Replication Protocol"): `target` the connection, `detail` what arrived.
    #[error("replication protocol error on {target}: {detail}")]
    Protocol { target: String, detail: String },
    /// The repository is missing, belongs to another cluster or is malformed.
    #[error("repository: {0}")]
    Repo(String),
    /// Stored bytes do not match the manifest: names the affected files (the message shows
    /// the first [`CORRUPT_NAMES_SHOWN`]; each one is also logged on its own line).
    /// `label` says what holds them: `backup <label>` or `WAL archive`.
    #[error("corrupt {label}: {}", shown_names(files))]
    Corrupt { label: String, files: Vec<String> },
    /// A file of the WAL archive does not hold what its header says (or no valid header):
    /// `name` is the repository object.
    #[error("corrupt WAL archive file {name}: {reason}")]
    CorruptWal { name: String, reason: String },
    /// The cluster or the target is in a state that makes the command unsafe.
    #[error("{0}")]
    Unsafe(String),
    /// A filesystem or stream operation failed on a named path.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A repository storage request failed (object store or its client), after the retries
    /// that could help.
    #[error("storage {op} {target}: {detail}")]
    Storage {
        op: &'static str,
        /// The repository and object, e.g. `s3://bucket/prefix/main/stanza.json`.
        target: String,
        fault: StorageFault,
        /// The store's answer, short (its kind, message and causes, for the message line).
        detail: String,
        /// The store client's own error, kept as a value (none for a fault pgjet raised).
        #[source]
        source: Option<Cause>,
    },
    /// The process was asked to stop (SIGTERM, SIGINT: [`crate::io::cancel`]).
    #[error("cancelled by {}", signal_name(*signal))]
    Cancelled { signal: i32 },
    /// Anything else, with its context.
    #[error("{0}")]
    Other(String),
    /// An error whose raiser knows the fix better than its kind's hint: it prints, exits and
    /// classifies as `error`, and [`Error::hint`] is `hint` (see [`Error::with_hint`]).
    #[error("{error}")]
    Hinted { error: Box<Error>, hint: String },
    /// `error` (what failed, in pgjet's words; its kind decides the hint and exit code) with
    /// the cause another library or the operating system reported, kept as a value: its
    /// [`std::error::Error::source`] (see [`Error::because`]). Displayed as `error: cause`.
    #[error("{error}: {cause}")]
    Caused {
        error: Box<Error>,
        #[source]
        cause: Cause,
    },
}

/// Why a storage request failed, in the terms that decide what the user does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageFault {
    /// Worth another try later: timeouts, resets, 5xx, throttling (retries were spent).
    Transient,
    /// Credentials or permissions refused (HTTP 401/403, SSH authentication).
    Denied,
    /// The bucket, container or object is not there.
    NotFound,
    /// The settings cannot work (bad endpoint, unsupported operation).
    Config,
    /// A conditional write lost: the object was created or changed by someone else.
    Conflict,
    /// The TLS handshake with the store failed, for the reason given.
    Tls(crate::error::tls::TlsFailure),
    /// Anything else the store reported.
    Other,
}

/// An error or notice a PostgreSQL server sent over a connection pgjet speaks itself (the
/// ErrorResponse fields severity, SQLSTATE, message, detail, hint; see the protocol chapter
/// "Error and Notice Message Fields").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerError {
    pub severity: String,
    /// SQLSTATE, e.g. `42501`.
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.severity, self.message)?;
        if let Some(d) = &self.detail {
            write!(f, " (DETAIL: {d})")?;
        }
        Ok(())
    }
}

/// A signal's name, for messages: SIGTERM, SIGINT.
pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        _ => "a signal",
    }
}

/// How many damaged files an [`Error::Corrupt`] message names before "and N more".
pub const CORRUPT_NAMES_SHOWN: usize = 20;

fn shown_names(files: &[String]) -> String {
    let mut s = files
        .iter()
        .take(CORRUPT_NAMES_SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if files.len() > CORRUPT_NAMES_SHOWN {
        s.push_str(&format!(
            " and {} more (each is logged above)",
            files.len() - CORRUPT_NAMES_SHOWN
        ));
    }
    s
}

impl Error {
    /// This error with `hint` (the fix, without "HINT: ") instead of its kind's.
    pub fn with_hint(self, hint: impl Into<String>) -> Error {
        let error = match self {
            Error::Hinted { error, .. } => error,
            e => Box::new(e),
        };
        Error::Hinted {
            error,
            hint: hint.into(),
        }
    }

    /// This error, caused by `cause` (kept as its source, not turned into text):
    /// `Error::Repo(format!("{name} is not valid")).because(e)`. The message reads
    /// "{self}: {cause}"; the kind, hint and exit code stay this error's.
    pub fn because(self, cause: impl Into<Cause>) -> Error {
        Error::Caused {
            error: Box::new(self),
            cause: cause.into(),
        }
    }

    /// The error under any hint given by [`Error::with_hint`] and any cause given by
    /// [`Error::because`]: what callers that act on the kind look at.
    pub fn kind(&self) -> &Error {
        match self {
            Error::Hinted { error, .. } | Error::Caused { error, .. } => error.kind(),
            e => e,
        }
    }

    /// The cause kept by [`Error::because`], if any (under a hint too).
    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Error::Hinted { error, .. } => error.cause(),
            Error::Caused { cause, .. } => Some(cause.as_ref()),
            _ => None,
        }
    }

    /// Wraps an I/O error with the operation and path it concerns.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// A broken connection to `target` during `op` ([`Error::Lost`]).
    pub fn lost(op: &'static str, target: &str, source: std::io::Error) -> Error {
        Error::Lost {
            op,
            target: target.to_string(),
            source,
        }
    }

    /// True when a file or object that was asked for does not exist (posix ENOENT, an object
    /// store's 404).
    pub fn is_not_found(&self) -> bool {
        match self.kind() {
            Error::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            Error::Storage { fault, .. } => *fault == StorageFault::NotFound,
            _ => false,
        }
    }

    /// True when the error is the disk running out of space (ENOSPC or EDQUOT).
    pub fn is_disk_full(&self) -> bool {
        matches!(self.kind(), Error::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)))
    }

    /// The message with its chain of causes, each once (a server's own message is the
    /// cause of a query error): what `pgjet: ERROR:` prints, and what a log line that
    /// explains a fallback should say.
    pub fn with_causes(&self) -> String {
        let inner = match self {
            Error::Hinted { error, .. } => error.as_ref(),
            e => e,
        };
        if let Error::Caused { error, cause } = inner {
            let mut msg = error.with_causes();
            let mut src: Option<&(dyn std::error::Error + 'static)> = Some(cause.as_ref());
            while let Some(s) = src {
                let t = s.to_string();
                if !msg.contains(&t) {
                    msg.push_str(&format!(": {t}"));
                }
                src = s.source();
            }
            return msg;
        }
        let mut msg = inner.to_string();
        if let Error::Storage { .. } = inner {
            // `detail` says the client's error and its causes already, shortened.
            return msg;
        }
        let mut src = std::error::Error::source(inner);
        while let Some(s) = src {
            let t = s.to_string();
            if !msg.contains(&t) {
                msg.push_str(&format!(": {t}"));
            }
            src = s.source();
        }
        msg
    }

    /// One line telling the user what to do about it.
    ///
    /// A query error is told apart by its cause: a lost connection (no server error, or the
    /// server shutting down), missing rights (SQLSTATE 42501), or another refusal. A
    /// connection error is a TLS one when a `rustls::Error` is in its source chain
    /// ([`crate::error::tls::tls_error_in`]).
    pub fn hint(&self) -> String {
        match self {
            Error::Hinted { hint, .. } => format!("HINT: {hint}"),
            Error::Caused { error, .. } => error.hint(),
            Error::Config(_) => "HINT: check the flags, the PGJET_* environment and the config file (--config).".into(),
            Error::Connect { source, .. } => match crate::error::tls::tls_error_in(source) {
                Some(tls) => format!(
                    "HINT: {}; {}",
                    crate::error::tls::reason(tls),
                    libpq_tls_advice(crate::error::tls::TlsFailure::of(tls))
                ),
                None => match source.as_db_error() {
                    Some(d) => connect_refused_hint(d.code().code(), d.message()),
                    // tokio-postgres's own words when the server asks for a password and the
                    // client has none (its Error::config("password missing")).
                    None if chain_text(source).contains("password missing") => "HINT: the server asks for a password and none was found: put it in the password file (~/.pgpass, or the file PGPASSFILE or passfile= names, mode 0600, a line host:port:database:user:password), in PGPASSWORD, or as password= in --source.".into(),
                    None => "HINT: is the cluster running? Check --pg-port, --pg-socket-path, --pg-user (or --source) and pg_hba.conf.".into(),
                },
            },
            Error::Query { source, .. } if connection_lost(source) => "HINT: the connection to the server was lost (network, server restart or timeout); run the command again (replica-create: with --delta, to copy only what is missing).".into(),
            Error::Lost { .. } => "HINT: the connection to the server was lost (network, server restart or timeout); run the command again (replica-create: with --delta, to copy only what is missing).".into(),
            Error::Replication { error, .. } if error.code.starts_with("57P") => "HINT: the connection to the server was lost (network, server restart or timeout); run the command again (replica-create: with --delta, to copy only what is missing).".into(),
            Error::Query { source, .. } if source.as_db_error().map(|d| d.code() != &tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE).unwrap_or(false) => "HINT: the server refused the statement; its message above says why.".into(),
            Error::Query { .. } => "HINT: pgjet needs a superuser or a role with the rights the README lists (\"A role for pgjet\"); `pgjet check` names each missing one with the GRANT that fixes it.".into(),
            Error::Replication { user, error, .. } => replication_hint(user, error),
            Error::Protocol { .. } => "HINT: the server's answers did not follow PostgreSQL's replication protocol: check that --source reaches PostgreSQL 15 or later itself (a pooler such as PgBouncer passes no replication connection), then run again with --log-level debug.".into(),
            Error::Repo(_) => "HINT: check --repo-path and --stanza; a new stanza is made with `pgjet stanza-create`.".into(),
            Error::Corrupt { .. } => "HINT: the repository bytes changed after they were written; take a new backup and check the storage.".into(),
            Error::CorruptWal { .. } => "HINT: the archived WAL changed after it was written; recovery cannot pass this file: take a new backup (its own WAL is in it) and check the storage.".into(),
            Error::Unsafe(_) => "HINT: pgjet refuses to risk data; fix the target or the cluster state and run it again.".into(),
            Error::Io { .. } if self.is_disk_full() => "HINT: no space left on the device: free space or choose another target; nothing written counts as complete.".into(),
            Error::Io { .. } => "HINT: check that the path exists and that the user running pgjet (postgres) may use it.".into(),
            Error::Storage { fault: StorageFault::Transient, .. } => "HINT: the repository storage did not answer or failed after every retry; nothing incomplete is taken as complete: check the network and the store, then run the command again.".into(),
            Error::Storage { fault: StorageFault::Denied, .. } => "HINT: the store refused the credentials or the request: check repo-s3-key/repo-s3-key-secret (or the gcs, azure, sftp equivalents) and the bucket's policy.".into(),
            Error::Storage { fault: StorageFault::NotFound, .. } => "HINT: check the bucket (or container) name, the endpoint and the region; pgjet does not create buckets.".into(),
            Error::Storage { fault: StorageFault::Tls(t), .. } => format!("HINT: {}", storage_tls_advice(*t)),
            Error::Storage { fault: StorageFault::Config, .. } => "HINT: check the repo-* settings (type, endpoint, uri style, TLS).".into(),
            Error::Storage { .. } => "HINT: run again with --log-level debug for the store's full answer.".into(),
            Error::Other(_) => "HINT: run again with --log-level debug for details.".into(),
            Error::Cancelled { .. } => "HINT: nothing unfinished looks complete: a copy stays marked unfinished (--delta takes it up), a backup is not listed; run the command again.".into(),
        }
    }

    /// Process exit code: 2 configuration, 3 connection, 4 repository, 5 corruption,
    /// 6 unsafe target/state, 7 I/O (8 disk full), 9 storage that failed after its retries
    /// (a later try may work), 4 storage that refused (credentials, missing bucket, settings),
    /// 128 + the signal's number when cancelled (143 SIGTERM, 130 SIGINT), 1 anything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Hinted { error, .. } | Error::Caused { error, .. } => error.exit_code(),
            Error::Config(_) => 2,
            Error::Connect { .. }
            | Error::Query { .. }
            | Error::Replication { .. }
            | Error::Protocol { .. }
            | Error::Lost { .. } => 3,
            Error::Repo(_) => 4,
            Error::Corrupt { .. } | Error::CorruptWal { .. } => 5,
            Error::Unsafe(_) => 6,
            Error::Io { .. } if self.is_disk_full() => 8,
            Error::Io { .. } => 7,
            Error::Storage {
                fault: StorageFault::Transient,
                ..
            } => 9,
            Error::Storage { .. } => 4,
            Error::Other(_) => 1,
            Error::Cancelled { signal } => 128 + signal,
        }
    }
}

/// A role name as SQL writes it in a statement a hint gives: bare when it is a plain
/// lower-case identifier, else double-quoted.
pub fn role_ident(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// What to do about a refused replication connection: the REPLICATION attribute (the
/// walsender's check in src/backend/utils/init/postinit.c: "must be superuser or replication
/// role", PostgreSQL 16+ "permission denied to start WAL sender"), a `replication` line in
/// pg_hba.conf (src/backend/libpq/auth.c: "no pg_hba.conf entry for replication connection"),
/// or free WAL senders (max_wal_senders).
fn replication_hint(user: &str, e: &ServerError) -> String {
    let m = format!("{} {}", e.message, e.detail.clone().unwrap_or_default());
    let role = role_ident(user);
    if m.contains("replication role") || m.contains("WAL sender") && m.contains("REPLICATION") {
        format!("HINT: the role needs the REPLICATION attribute for --transport basebackup: ALTER ROLE {role} REPLICATION; (or use --transport libpq)")
    } else if m.contains("pg_hba.conf") {
        format!("HINT: pg_hba.conf needs a line for replication connections from this host, e.g. `hostssl replication {user} <this host's address>/32 scram-sha-256`, then SELECT pg_reload_conf(); (the `all` database does not match replication connections)")
    } else if m.contains("max_wal_senders") || m.contains("WAL sender") {
        "HINT: the server has no free WAL sender: raise max_wal_senders (restart needed) or end other replication connections".into()
    } else if e.code == "28P01" || e.code == "28000" {
        "HINT: check the user and password (password=, PGPASSWORD or ~/.pgpass) and pg_hba.conf's replication lines".into()
    } else {
        "HINT: the server refused the replication command; its message above says why.".into()
    }
}

/// What to do when the server answered a connection with an error: it runs, and refused
/// this user (SQLSTATE 28000 and 28P01: pg_hba.conf, a client certificate, a password;
/// src/backend/libpq/auth.c), or said why (a database that does not exist, too many
/// connections, a server starting or shutting down).
fn connect_refused_hint(code: &str, message: &str) -> String {
    if message.contains("client certificate") || message.contains("certificate authentication") {
        "HINT: the server's pg_hba.conf asks for a client certificate: give sslcert and sslkey (default ~/.postgresql/postgresql.crt and .key), a certificate signed by a CA in the server's ssl_ca_file whose CN is the user's name (or one its pg_ident.conf maps).".into()
    } else if code == "28000" && message.contains("no pg_hba.conf entry") {
        // auth.c: `no pg_hba.conf entry for host "H", user "U", database "D", ...` for an
        // ordinary session; a replication connection says "replication connection" and
        // has its own hint (replication_hint).
        let quoted = |key: &str| {
            message
                .split_once(&format!("{key} \""))
                .and_then(|(_, rest)| rest.split_once('"'))
                .map(|(v, _)| v.to_string())
        };
        let user = quoted("user").unwrap_or_else(|| "<role>".into());
        let db = quoted("database").unwrap_or_else(|| "postgres".into());
        format!("HINT: pg_hba.conf has no line for this host, user {user} and database {db}. replica-create over the BASE_BACKUP stream needs only the `replication` line; the file transports (libpq, local), backup and check of a stanza open an ordinary session (the database of dbname=, {db} here): add a line such as `hostssl {db} {user} <this host's address>/32 scram-sha-256` (a `replication` line does not match it), then SELECT pg_reload_conf();")
    } else if code == "28P01" || code == "28000" {
        "HINT: the server refused this user from this host: check the user and password (password=, PGPASSWORD or ~/.pgpass) and the server's pg_hba.conf.".into()
    } else {
        "HINT: the server is up and refused the connection; its message above says why.".into()
    }
}

/// What to do about a TLS failure on a libpq connection (`--source` and its sslmode,
/// sslrootcert, sslcert, sslkey keywords).
fn libpq_tls_advice(f: crate::error::tls::TlsFailure) -> &'static str {
    use crate::error::tls::TlsFailure as T;
    match f {
        T::Untrusted => "sslrootcert must hold the CA certificate that signed the server's certificate, or the server's certificate itself when it is self-signed (check sslmode too: verify-ca and verify-full verify, and so does require when ~/.postgresql/root.crt exists).",
        T::Expired | T::NotYetValid => "renew the server's certificate (ssl_cert_file), or check the clocks of this host and the server; no sslrootcert or sslmode makes it valid, short of sslmode=require without a root certificate, which checks nothing.",
        T::WrongName => "connect with a host name the certificate holds (its subjectAltName, or its CN when it has no subjectAltName of that kind; hostaddr= can give the address apart), or use sslmode=verify-ca, which does not check names.",
        T::Unsupported => "issue the server's certificate as X.509 version 3 with a supported key (openssl x509 -req ... -extfile with e.g. basicConstraints=CA:FALSE), or use sslmode=require without a root certificate.",
        T::BadCertificate | T::Handshake => "check sslmode, sslrootcert, sslcert and sslkey against the server's ssl settings and its log.",
    }
}

/// What to do about a TLS failure with an object store (`repo-storage-ca-file`,
/// `repo-storage-verify-tls`, the endpoint options).
fn storage_tls_advice(f: crate::error::tls::TlsFailure) -> &'static str {
    use crate::error::tls::TlsFailure as T;
    match f {
        T::Untrusted => "set repo-storage-ca-file to the CA certificate that signed the store's certificate, or to the store's certificate itself when it is self-signed (without it the system's CAs are used); repo-storage-verify-tls=n turns verification off.",
        T::Expired | T::NotYetValid => "renew the store's certificate, or check the clocks of this host and the store; repo-storage-verify-tls=n turns verification off.",
        T::WrongName => "set the endpoint (repo-s3-endpoint, repo-gcs-endpoint, repo-azure-endpoint) to a host name or address in the certificate's subjectAltName, or reissue the certificate with that name.",
        T::Unsupported => "issue the store's certificate as X.509 version 3 with a supported key, or set repo-storage-verify-tls=n.",
        T::BadCertificate | T::Handshake => "check repo-storage-ca-file, repo-storage-verify-tls and the endpoint's scheme and port.",
    }
}

/// `e` and its causes, as text (tokio-postgres's Display leaves its cause out).
fn chain_text(e: &dyn std::error::Error) -> String {
    let mut t = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        t.push_str(": ");
        t.push_str(&s.to_string());
        src = s.source();
    }
    t
}

/// True when a query failed because the session ended: the connection broke (no server
/// error) or the server was shut down or restarted (SQLSTATE class 57P, see PostgreSQL's
/// errcodes.txt).
fn connection_lost(e: &tokio_postgres::Error) -> bool {
    match e.as_db_error() {
        None => true,
        Some(d) => d.code().code().starts_with("57P"),
    }
}
