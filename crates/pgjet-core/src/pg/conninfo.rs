//! libpq connection strings, the way a libpq user expects them to work (see PostgreSQL's
//! documentation, "Connection Strings", "Environment Variables", "The Password File" and
//! "SSL Support", and src/interfaces/libpq/fe-connect.c):
//! - `key=value` pairs (values optionally single-quoted, with `\'` and `\\` escapes) or a
//!   `postgresql://user:password@host:port/dbname?key=value` URI;
//! - defaults from `PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`,
//!   `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`, `PGAPPNAME`, `PGCONNECT_TIMEOUT`,
//!   `PGPASSFILE`, `PGCHANNELBINDING`, `PGOPTIONS`;
//! - the password from `~/.pgpass` (or `passfile`/`PGPASSFILE`) when none is given;
//! - `sslmode` disable, allow, prefer (default), require, verify-ca and verify-full, with
//!   `sslrootcert` (default `~/.postgresql/root.crt`; when it exists, `require` verifies the
//!   chain as libpq does), and `sslcert`/`sslkey` client certificates. TLS is rustls, set
//!   up by [`crate::io::tls`]: a server certificate that is itself in `sslrootcert` (a
//!   self-signed one) is accepted as OpenSSL does, and verify-full checks the host against
//!   the subjectAltName, else the CN, as libpq does.
//!
//! Differences from libpq: the database defaults to `postgres` (not the user name), since
//! pgjet needs a database for its SQL and every cluster has that one; `sslrootcert=system`,
//! X.509 version 1 server certificates and `gssencmode`/Kerberos are not supported.
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// libpq keywords pgjet understands; anything else is refused with a clear message.
const KNOWN: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "user",
    "password",
    "passfile",
    "dbname",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "application_name",
    "fallback_application_name",
    "connect_timeout",
    "channel_binding",
    "options",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "target_session_attrs",
    "sslcompression",
    "sslsni",
    "gssencmode",
    "requiressl",
];

/// Environment variables that give defaults, as libpq reads them (keyword, variable).
const ENV_DEFAULTS: &[(&str, &str)] = &[
    ("host", "PGHOST"),
    ("hostaddr", "PGHOSTADDR"),
    ("port", "PGPORT"),
    ("user", "PGUSER"),
    ("password", "PGPASSWORD"),
    ("passfile", "PGPASSFILE"),
    ("dbname", "PGDATABASE"),
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
    ("application_name", "PGAPPNAME"),
    ("connect_timeout", "PGCONNECT_TIMEOUT"),
    ("channel_binding", "PGCHANNELBINDING"),
    ("options", "PGOPTIONS"),
    ("target_session_attrs", "PGTARGETSESSIONATTRS"),
];

/// Defaults pgjet applies to TCP connections when the connection string leaves them unset, so
/// that a cut link ends a copy with an error within about a minute instead of TCP's
/// retransmission timeout of a quarter of an hour: keepalive probes after 15 s idle, every
/// 5 s, 6 of them; and `tcp_user_timeout` 60 s for data that is never acknowledged.
pub const DEFAULT_KEEPALIVES_IDLE_S: u64 = 15;
/// See [`DEFAULT_KEEPALIVES_IDLE_S`].
pub const DEFAULT_KEEPALIVES_INTERVAL_S: u64 = 5;
/// See [`DEFAULT_KEEPALIVES_IDLE_S`].
pub const DEFAULT_KEEPALIVES_COUNT: u32 = 6;
/// See [`DEFAULT_KEEPALIVES_IDLE_S`].
pub const DEFAULT_TCP_USER_TIMEOUT_S: u64 = 60;

/// libpq's default Unix socket directory on Debian (DEFAULT_PGSOCKET_DIR).
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";

/// A parsed connection string: libpq keywords and their values, as given (before defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnInfo {
    pub params: BTreeMap<String, String>,
}

/// What TLS a connection uses (libpq's sslmode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    /// libpq's name of the mode (`verify-full`, ...).
    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    fn parse(s: &str) -> Result<SslMode> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(Error::Config(format!(
                "sslmode '{other}' is not one of disable, allow, prefer, require, verify-ca, verify-full"
            )))
            }
        })
    }
}

/// Everything needed to open a session: the tokio-postgres settings and the TLS settings.
#[derive(Clone)]
pub struct ConnTarget {
    pub config: tokio_postgres::Config,
    pub ssl_mode: SslMode,
    /// A rustls client configuration when TLS may be used (sslmode other than disable).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The effective parameters (connection string, then environment, then defaults), for
    /// primary_conninfo of a standby. A password found in the password file is not one of
    /// them (it is in `config` only), as libpq's PQconninfo, which pg_basebackup -R writes.
    pub effective: ConnInfo,
    /// `host=... port=... user=...`, for messages (never the password).
    pub describe: String,
}

impl std::fmt::Debug for ConnTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe)
    }
}

impl ConnInfo {
    /// Parses a `key=value` connection string or a `postgresql://` / `postgres://` URI.
    ///
    /// Errors: [`Error::Config`] naming the problem (unknown keyword, unterminated quote,
    /// bad URI).
    pub fn parse(s: &str) -> Result<ConnInfo> {
        let t = s.trim();
        let ci = if t.starts_with("postgresql://") || t.starts_with("postgres://") {
            parse_uri(t)?
        } else {
            parse_kv(t)?
        };
        for k in ci.params.keys() {
            if !KNOWN.contains(&k.as_str()) {
                return Err(Error::Config(format!(
                    "connection string '{}': unknown keyword '{k}'",
                    redact(s)
                )));
            }
        }
        Ok(ci)
    }

    /// One connection string per host of a multi-host one, in order (libpq's `host`,
    /// `hostaddr` and `port` may each list several, comma-separated; a single port serves
    /// every host: fe-connect.c, `connectOptions2`), and whether only a server that accepts
    /// writes will do (`target_session_attrs=read-write` or `primary`), which each caller
    /// then checks itself (the strings returned carry no `target_session_attrs`).
    ///
    /// Errors: [`Error::Config`] when the lists' lengths do not match.
    pub fn per_host(&self) -> Result<(Vec<ConnInfo>, bool)> {
        let list = |k: &str| -> Vec<String> {
            self.get(k)
                .map(|v| v.split(',').map(|x| x.trim().to_string()).collect())
                .unwrap_or_default()
        };
        let (hosts, addrs, ports) = (list("host"), list("hostaddr"), list("port"));
        let n = hosts.len().max(addrs.len()).max(1);
        for (k, l) in [("host", &hosts), ("hostaddr", &addrs)] {
            if !l.is_empty() && l.len() != n {
                return Err(Error::Config(format!(
                    "connection string: {} values of {k} for {n} hosts",
                    l.len()
                )));
            }
        }
        if ports.len() > 1 && ports.len() != n {
            return Err(Error::Config(format!(
                "connection string: {} ports for {n} hosts (give one port, or one per host)",
                ports.len()
            )));
        }
        let read_write = matches!(
            self.get("target_session_attrs"),
            Some("read-write") | Some("primary")
        );
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let mut one = self.clone();
            one.params.remove("target_session_attrs");
            for (k, l) in [("host", &hosts), ("hostaddr", &addrs), ("port", &ports)] {
                if let Some(v) = l.get(i).or(if l.len() == 1 { l.first() } else { None }) {
                    one.params.insert(k.to_string(), v.clone());
                }
            }
            out.push(one);
        }
        Ok((out, read_write))
    }

    /// The value of keyword `k`, if set.
    pub fn get(&self, k: &str) -> Option<&str> {
        self.params.get(k).map(String::as_str)
    }

    /// Fills keywords not set from the environment (`env` looks a variable up).
    pub fn with_env_defaults(mut self, env: &dyn Fn(&str) -> Option<String>) -> ConnInfo {
        for (k, var) in ENV_DEFAULTS {
            if !self.params.contains_key(*k) {
                if let Some(v) = env(var).filter(|v| !v.is_empty()) {
                    self.params.insert(k.to_string(), v);
                }
            }
        }
        self
    }

    /// Renders the parameters as a `key='value'` connection string (values quoted and
    /// escaped as libpq's parser expects).
    pub fn to_conninfo_string(&self) -> String {
        self.params
            .iter()
            .map(|(k, v)| format!("{k}={}", quote_value(v)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Resolves defaults (host, port, user, database, application_name), the password file
    /// and TLS, and builds the settings to connect with. `env` looks variables up (for
    /// HOME); `default_app` is the application_name used when none is given.
    ///
    /// Errors: [`Error::Config`] for bad values and unreadable certificate files.
    pub fn resolve(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
        default_app: &str,
    ) -> Result<ConnTarget> {
        let mut eff = self.clone();
        let p = &mut eff.params;
        fill_defaults(p, env, default_app);
        let host = p.get("host").cloned().unwrap_or_default();
        let port = p.get("port").cloned().unwrap_or_default();
        let user = p.get("user").cloned().unwrap_or_default();
        let dbname = p.get("dbname").cloned().unwrap_or_default();
        let home = env("HOME").map(PathBuf::from);
        // A password from the password file authenticates this connection only: it is not
        // an effective parameter, so primary_conninfo never carries it (libpq keeps it
        // apart from conn->pgpass, and pg_basebackup -R writes PQconninfo's, see
        // PostgreSQL src/interfaces/libpq/fe-connect.c and src/fe_utils/recovery_gen.c).
        // The file it came from is named instead (`passfile`), as PQconninfo names it, so a
        // standby reads the same file.
        let password = match p.get("password") {
            Some(pw) => Some(pw.clone()),
            None => password_from_file(p, home.as_deref(), &host, &port, &dbname, &user).map(
                |(file, pw)| {
                    p.insert("passfile".into(), file.display().to_string());
                    pw
                },
            ),
        };
        let ssl_mode = match p.get("sslmode") {
            Some(m) => SslMode::parse(m)?,
            None if p.get("requiressl").map(String::as_str) == Some("1") => SslMode::Require,
            None => SslMode::Prefer,
        };
        let is_socket = host.starts_with('/') && !p.contains_key("hostaddr");
        let mut c = tokio_postgres::Config::new();
        set_addresses(&mut c, p, &host, &port)?;
        c.user(&user).dbname(&dbname);
        if let Some(pw) = &password {
            c.password(pw.as_bytes());
        }
        if let Some(a) = p.get("application_name") {
            c.application_name(a);
        }
        if let Some(o) = p.get("options") {
            c.options(o);
        }
        set_timeouts(&mut c, p)?;
        set_session_rules(&mut c, p)?;
        let (tls_mode, tls) = set_tls(&mut c, ssl_mode, is_socket, p, home.as_deref())?;
        let describe = format!("host={host} port={port} user={user} dbname={dbname}");
        Ok(ConnTarget {
            config: c,
            ssl_mode: tls_mode,
            tls,
            effective: eff,
            describe,
        })
    }
}

/// Fills the defaults of [`ConnInfo::resolve`] into `p`: host (the default socket
/// directory, unless hostaddr is given), port 5432, the OS user, database `postgres`, and
/// application_name (fallback_application_name, else `default_app`; the fallback keyword
/// itself is removed).
fn fill_defaults(
    p: &mut BTreeMap<String, String>,
    env: &dyn Fn(&str) -> Option<String>,
    default_app: &str,
) {
    if !p.contains_key("host") && !p.contains_key("hostaddr") {
        p.insert("host".into(), DEFAULT_SOCKET_DIR.into());
    }
    p.entry("port".into()).or_insert_with(|| "5432".into());
    if !p.contains_key("user") {
        p.insert("user".into(), os_user_name(env));
    }
    p.entry("dbname".into())
        .or_insert_with(|| "postgres".into());
    if !p.contains_key("application_name") {
        let app = p
            .get("fallback_application_name")
            .cloned()
            .unwrap_or_else(|| default_app.to_string());
        p.insert("application_name".into(), app);
    }
    p.remove("fallback_application_name");
}

/// The password file that holds a password for (host, port, dbname, user) (`passfile`,
/// else `~/.pgpass`), and that password; a socket directory or an empty host is looked up
/// as `localhost`, as libpq does.
fn password_from_file(
    p: &BTreeMap<String, String>,
    home: Option<&Path>,
    host: &str,
    port: &str,
    dbname: &str,
    user: &str,
) -> Option<(PathBuf, String)> {
    let file = p
        .get("passfile")
        .map(PathBuf::from)
        .or_else(|| home.map(|h| h.join(".pgpass")));
    let lookup_host = if host.is_empty() || host.starts_with('/') || host.starts_with('@') {
        "localhost"
    } else {
        host
    };
    let file = file?;
    let pw = pgpass_lookup(&file, lookup_host, port, dbname, user)?;
    Some((file, pw))
}

/// Sets the hosts (socket directories or names), the hostaddr IP addresses and the ports,
/// each a comma-separated list.
///
/// Errors: a hostaddr that is not an IP address, a port that is not a port number.
fn set_addresses(
    c: &mut tokio_postgres::Config,
    p: &BTreeMap<String, String>,
    host: &str,
    port: &str,
) -> Result<()> {
    for h in host.split(',').filter(|h| !h.is_empty()) {
        if h.starts_with('/') {
            c.host_path(h);
        } else {
            c.host(h);
        }
    }
    if let Some(a) = p.get("hostaddr") {
        for a in a.split(',') {
            let ip = a
                .parse()
                .map_err(|_| Error::Config(format!("hostaddr '{a}' is not an IP address")))?;
            c.hostaddr(ip);
        }
        if host.is_empty() {
            c.host(a);
        }
    }
    for pt in port.split(',') {
        let n: u16 = pt
            .parse()
            .map_err(|_| Error::Config(format!("port '{pt}' is not a port number")))?;
        c.port(n);
    }
    Ok(())
}

/// Sets connect_timeout (at least 2 s, as libpq) and the TCP keepalive and user timeout
/// settings, with pgjet's defaults ([`DEFAULT_KEEPALIVES_IDLE_S`] and the others) where the
/// connection string leaves them unset.
///
/// Errors: a value that is not a number.
fn set_timeouts(c: &mut tokio_postgres::Config, p: &BTreeMap<String, String>) -> Result<()> {
    if let Some(t) = p.get("connect_timeout") {
        let secs: u64 = t.parse().map_err(|_| {
            Error::Config(format!("connect_timeout '{t}' is not a number of seconds"))
        })?;
        if secs > 0 {
            c.connect_timeout(std::time::Duration::from_secs(secs.max(2)));
        }
    }
    let secs = |k: &str, default: u64| -> Result<std::time::Duration> {
        match p.get(k) {
            None => Ok(std::time::Duration::from_secs(default)),
            Some(v) => v
                .parse()
                .map(std::time::Duration::from_secs)
                .map_err(|_| Error::Config(format!("{k} '{v}' is not a number of seconds"))),
        }
    };
    if let Some(k) = p.get("keepalives") {
        c.keepalives(k != "0");
    }
    c.keepalives_idle(secs("keepalives_idle", DEFAULT_KEEPALIVES_IDLE_S)?);
    c.keepalives_interval(secs("keepalives_interval", DEFAULT_KEEPALIVES_INTERVAL_S)?);
    c.keepalives_retries(match p.get("keepalives_count") {
        None => DEFAULT_KEEPALIVES_COUNT,
        Some(v) => v
            .parse()
            .map_err(|_| Error::Config(format!("keepalives_count '{v}' is not a number")))?,
    });
    // libpq gives tcp_user_timeout in milliseconds.
    c.tcp_user_timeout(match p.get("tcp_user_timeout") {
        None => std::time::Duration::from_secs(DEFAULT_TCP_USER_TIMEOUT_S),
        Some(v) => v
            .parse()
            .map(std::time::Duration::from_millis)
            .map_err(|_| {
                Error::Config(format!(
                    "tcp_user_timeout '{v}' is not a number of milliseconds"
                ))
            })?,
    });
    Ok(())
}

/// Sets channel_binding (default prefer) and target_session_attrs (any or read-write).
///
/// Errors: a value pgjet does not support.
fn set_session_rules(c: &mut tokio_postgres::Config, p: &BTreeMap<String, String>) -> Result<()> {
    match p.get("channel_binding").map(String::as_str) {
        None | Some("prefer") => {
            c.channel_binding(tokio_postgres::config::ChannelBinding::Prefer);
        }
        Some("disable") => {
            c.channel_binding(tokio_postgres::config::ChannelBinding::Disable);
        }
        Some("require") => {
            c.channel_binding(tokio_postgres::config::ChannelBinding::Require);
        }
        Some(o) => {
            return Err(Error::Config(format!(
                "channel_binding '{o}' is not one of disable, prefer, require"
            )))
        }
    }
    if let Some(t) = p.get("target_session_attrs") {
        match t.as_str() {
            "any" => {}
            "read-write" => {
                c.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
            }
            o => {
                return Err(Error::Config(format!(
                    "target_session_attrs '{o}' is not supported (any, read-write)"
                )))
            }
        }
    }
    Ok(())
}

/// Sets the connection's TLS mode and returns the mode in effect with its rustls
/// configuration ([`tls_config`]): none for sslmode=disable and for a Unix socket.
///
/// Errors: as [`tls_config`].
fn set_tls(
    c: &mut tokio_postgres::Config,
    ssl_mode: SslMode,
    is_socket: bool,
    p: &BTreeMap<String, String>,
    home: Option<&Path>,
) -> Result<(SslMode, Option<Arc<rustls::ClientConfig>>)> {
    // A Unix socket never uses TLS (libpq: sslmode is ignored for sockets).
    if ssl_mode == SslMode::Disable || is_socket {
        c.ssl_mode(tokio_postgres::config::SslMode::Disable);
        return Ok((SslMode::Disable, None));
    }
    c.ssl_mode(match ssl_mode {
        SslMode::Allow | SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    Ok((ssl_mode, Some(Arc::new(tls_config(ssl_mode, p, home)?))))
}

/// The OS user's name (libpq's default role): $USER, else the password database.
fn os_user_name(env: &dyn Fn(&str) -> Option<String>) -> String {
    // SAFETY: getpwuid returns a pointer into static storage or null; read at once.
    let from_passwd = unsafe {
        let pw = libc::getpwuid(libc::geteuid());
        if pw.is_null() || (*pw).pw_name.is_null() {
            None
        } else {
            std::ffi::CStr::from_ptr((*pw).pw_name)
                .to_str()
                .ok()
                .map(str::to_owned)
        }
    };
    from_passwd
        .or_else(|| env("USER"))
        .unwrap_or_else(|| "postgres".into())
}

/// Names the --source setting in a connection-string error, without a second
/// "configuration:" prefix.
pub fn source_error(e: Error) -> Error {
    match e {
        Error::Config(m) => Error::Config(format!("--source: {m}")),
        Error::Caused { error, cause } => source_error(*error).because(cause),
        other => other,
    }
}

/// Hides a password in a connection string shown in messages.
pub fn redact(s: &str) -> String {
    match ConnInfo::parse_loose(s) {
        Some(mut ci) if ci.params.contains_key("password") => {
            ci.params.insert("password".into(), "********".into());
            ci.to_conninfo_string()
        }
        Some(_) => s.to_string(),
        None => "<unparsable connection string>".into(),
    }
}

impl ConnInfo {
    fn parse_loose(s: &str) -> Option<ConnInfo> {
        let t = s.trim();
        if t.starts_with("postgresql://") || t.starts_with("postgres://") {
            parse_uri(t).ok()
        } else {
            parse_kv(t).ok()
        }
    }
}

/// Quotes a connection-string value when it needs it (empty, spaces, quotes, backslashes).
pub fn quote_value(v: &str) -> String {
    if !v.is_empty() && !v.contains([' ', '\'', '\\', '\t', '\n']) {
        return v.to_string();
    }
    format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
}

fn parse_kv(s: &str) -> Result<ConnInfo> {
    let mut params = BTreeMap::new();
    let b: Vec<char> = s.chars().collect();
    let mut i = 0;
    let err = |m: &str| Error::Config(format!("connection string '{}': {m}", redact_raw(s)));
    while i < b.len() {
        while i < b.len() && b[i].is_whitespace() {
            i += 1;
        }
        if i >= b.len() {
            break;
        }
        let ks = i;
        while i < b.len() && b[i] != '=' && !b[i].is_whitespace() {
            i += 1;
        }
        let key: String = b[ks..i].iter().collect();
        while i < b.len() && b[i].is_whitespace() {
            i += 1;
        }
        if i >= b.len() || b[i] != '=' {
            return Err(err(&format!("missing '=' after '{key}'")));
        }
        i += 1;
        while i < b.len() && b[i].is_whitespace() {
            i += 1;
        }
        let mut val = String::new();
        if i < b.len() && b[i] == '\'' {
            i += 1;
            loop {
                if i >= b.len() {
                    return Err(err("unterminated quoted string"));
                }
                match b[i] {
                    '\\' if i + 1 < b.len() => {
                        val.push(b[i + 1]);
                        i += 2;
                    }
                    '\'' => {
                        i += 1;
                        break;
                    }
                    ch => {
                        val.push(ch);
                        i += 1;
                    }
                }
            }
        } else {
            while i < b.len() && !b[i].is_whitespace() {
                if b[i] == '\\' && i + 1 < b.len() {
                    val.push(b[i + 1]);
                    i += 2;
                } else {
                    val.push(b[i]);
                    i += 1;
                }
            }
        }
        if key.is_empty() {
            return Err(err("empty keyword"));
        }
        params.insert(key, val);
    }
    Ok(ConnInfo { params })
}

/// A key=value string with any password value replaced, without parsing it fully.
fn redact_raw(s: &str) -> String {
    match s.find("password") {
        Some(i) => format!("{}password=********…", &s[..i]),
        None => s.to_string(),
    }
}

fn percent_decode(s: &str) -> Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| Error::Config(format!("bad percent-encoding in URI part '{s}'")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| Error::Config(format!("URI part '{s}' is not UTF-8")))
}

fn parse_uri(s: &str) -> Result<ConnInfo> {
    let rest = s
        .strip_prefix("postgresql://")
        .or_else(|| s.strip_prefix("postgres://"))
        .unwrap_or(s);
    let mut params = BTreeMap::new();
    let (main, query) = match rest.split_once('?') {
        Some((m, q)) => (m, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match main.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (main, None),
    };
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if let Some(u) = userinfo {
        let (user, pw) = match u.split_once(':') {
            Some((a, b)) => (a, Some(b)),
            None => (u, None),
        };
        if !user.is_empty() {
            params.insert("user".into(), percent_decode(user)?);
        }
        if let Some(pw) = pw {
            params.insert("password".into(), percent_decode(pw)?);
        }
    }
    let mut hosts = Vec::new();
    let mut ports = Vec::new();
    for hp in hostport.split(',').filter(|x| !x.is_empty()) {
        let (h, p) = if let Some(r) = hp.strip_prefix('[') {
            let (h, after) = r
                .split_once(']')
                .ok_or_else(|| Error::Config(format!("URI host '{hp}': missing ']'")))?;
            (h.to_string(), after.strip_prefix(':').map(str::to_owned))
        } else {
            match hp.rsplit_once(':') {
                Some((h, p)) => (percent_decode(h)?, Some(p.to_string())),
                None => (percent_decode(hp)?, None),
            }
        };
        hosts.push(h);
        if let Some(p) = p {
            ports.push(p);
        }
    }
    if !hosts.is_empty() && hosts.iter().any(|h| !h.is_empty()) {
        params.insert("host".into(), hosts.join(","));
    }
    if !ports.is_empty() {
        params.insert("port".into(), ports.join(","));
    }
    if let Some(db) = path.filter(|p| !p.is_empty()) {
        params.insert("dbname".into(), percent_decode(db)?);
    }
    if let Some(q) = query {
        for kv in q.split('&').filter(|x| !x.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| Error::Config(format!("URI parameter '{kv}' has no '='")))?;
            params.insert(percent_decode(k)?, percent_decode(v)?);
        }
    }
    Ok(ConnInfo { params })
}

/// Finds the password for (host, port, database, user) in a password file: lines
/// `hostname:port:database:username:password`, `*` matching anything, `\:` and `\\`
/// escaped, `#` comments; the first matching line wins. A file readable by group or others
/// is ignored with a warning, as libpq does.
pub fn pgpass_lookup(path: &Path, host: &str, port: &str, db: &str, user: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        return None;
    }
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(
            "password file {} has group or world access; permissions should be u=rw (0600) or less; ignored",
            path.display()
        );
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    pgpass_find(&text, host, port, db, user)
}

/// The password-file matching of [`pgpass_lookup`] on the file's text.
pub fn pgpass_find(text: &str, host: &str, port: &str, db: &str, user: &str) -> Option<String> {
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut fields = Vec::new();
        let mut cur = String::new();
        let mut chars = line.chars();
        while let Some(ch) = chars.next() {
            match ch {
                '\\' => {
                    if let Some(n) = chars.next() {
                        cur.push(n);
                    }
                }
                ':' if fields.len() < 4 => fields.push(std::mem::take(&mut cur)),
                _ => cur.push(ch),
            }
        }
        fields.push(cur);
        if fields.len() != 5 {
            continue;
        }
        let m = |pat: &str, v: &str| pat == "*" || pat == v;
        if m(&fields[0], host) && m(&fields[1], port) && m(&fields[2], db) && m(&fields[3], user) {
            return Some(fields[4].clone());
        }
    }
    None
}
/// Refuses a client key file others may read, as libpq does (src/interfaces/libpq/
/// fe-secure-openssl.c, initialize_SSL): a regular file owned by the user running pgjet may
/// have no group or world bits (0600 or less); one owned by root may be group-readable
/// (0640 or less). Errors: [`Error::Config`] naming the file and its mode.
fn check_key_mode(key: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(key) else {
        return Ok(()); // a missing key file is reported when it is read
    };
    if !meta.is_file() {
        return Ok(());
    }
    let mode = meta.mode() & 0o777;
    let (bad, allowed) = if meta.uid() == 0 {
        (
            mode & 0o037 != 0,
            "u=rw,g=r (0640) or less when owned by root",
        )
    } else {
        (mode & 0o077 != 0, "u=rw (0600) or less")
    };
    if bad {
        return Err(Error::Config(format!(
            "private key file {} has group or world access (mode {mode:04o}); its permissions must be {allowed}, as libpq requires",
            key.display()
        )));
    }
    Ok(())
}

/// The TLS configuration for `mode` (not Disable), from libpq's keywords: the trusted
/// certificates from sslrootcert (default ~/.postgresql/root.crt), the chain checked for
/// verify-ca and verify-full (and for require when the root file exists, as libpq does), the
/// host name for verify-full (subjectAltName, else the CN, as libpq); a client certificate
/// from sslcert/sslkey (default ~/.postgresql/postgresql.crt and .key) when present. The
/// rules themselves are [`crate::io::tls`]'s.
fn tls_config(
    mode: SslMode,
    p: &BTreeMap<String, String>,
    home: Option<&Path>,
) -> Result<rustls::ClientConfig> {
    use crate::io::tls::{ClientIdentity, NameCheck, ServerTrust};
    let pg_dir = home.map(|h| h.join(".postgresql"));
    let root_file = match p.get("sslrootcert") {
        Some(s) if s == "system" => {
            return Err(Error::Config(
                "sslrootcert=system is not supported by pgjet; give the CA file's path".into(),
            ))
        }
        Some(s) => Some(PathBuf::from(s)),
        None => pg_dir
            .as_ref()
            .map(|d| d.join("root.crt"))
            .filter(|f| f.exists()),
    };
    let trust = match mode {
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let f = root_file.as_ref().filter(|f| f.exists()).ok_or_else(|| {
                Error::Config(format!(
                    "sslmode={} needs a root certificate file: set sslrootcert (default ~/.postgresql/root.crt{})",
                    if mode == SslMode::VerifyCa { "verify-ca" } else { "verify-full" },
                    root_file.as_ref().map(|f| format!(", tried {}", f.display())).unwrap_or_default()
                ))
            })?;
            ServerTrust::File {
                path: f.clone(),
                names: if mode == SslMode::VerifyFull {
                    NameCheck::SubjectAltNameOrCommonName
                } else {
                    NameCheck::Off
                },
            }
        }
        // libpq: with a root certificate file present, require behaves like verify-ca.
        SslMode::Require => match root_file.filter(|f| f.exists()) {
            Some(path) => ServerTrust::File {
                path,
                names: NameCheck::Off,
            },
            None => ServerTrust::Any,
        },
        _ => ServerTrust::Any,
    };
    let cert = p
        .get("sslcert")
        .map(PathBuf::from)
        .or_else(|| pg_dir.as_ref().map(|d| d.join("postgresql.crt")));
    let key = p
        .get("sslkey")
        .map(PathBuf::from)
        .or_else(|| pg_dir.as_ref().map(|d| d.join("postgresql.key")));
    let identity = match (cert.filter(|c| c.exists()), key) {
        (Some(cert), Some(key)) => {
            check_key_mode(&key)?;
            Some(ClientIdentity { cert, key })
        }
        _ => None,
    };
    crate::io::tls::client_config(&trust, identity.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn client_key_files_others_may_read_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pgjet-keymode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("client.key");
        std::fs::write(&key, "not a key").unwrap();
        // The test may run as root (0640 allowed) or as another user (0600 only).
        let root = unsafe { libc::geteuid() } == 0;
        for (mode, ok) in [
            (0o600, true),
            (0o400, true),
            (0o640, root),
            (0o644, false),
            (0o660, false),
        ] {
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
            let r = check_key_mode(&key);
            assert_eq!(r.is_ok(), ok, "mode {mode:o}: {r:?}");
            if let Err(e) = r {
                assert!(e.to_string().contains("group or world access"), "{e}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn key_value_and_quoting() {
        let ci =
            ConnInfo::parse(r"host=db1 port = 6543 user='a b' password='it\'s \\x' dbname=app")
                .unwrap();
        assert_eq!(ci.get("host"), Some("db1"));
        assert_eq!(ci.get("port"), Some("6543"));
        assert_eq!(ci.get("user"), Some("a b"));
        assert_eq!(ci.get("password"), Some(r"it's \x"));
        let again = ConnInfo::parse(&ci.to_conninfo_string()).unwrap();
        assert_eq!(again, ci);
        assert!(ConnInfo::parse("host=db1 bogus=1").is_err());
        assert!(ConnInfo::parse("host='db1").is_err());
        assert!(ConnInfo::parse("host").is_err());
        assert!(!redact("host=a password=secret").contains("secret"));
    }

    #[test]
    fn uris() {
        let ci = ConnInfo::parse(
            "postgresql://rep%40x:p%3Aw@10.0.0.1:5433/my%20db?sslmode=verify-full&application_name=s1",
        )
        .unwrap();
        assert_eq!(ci.get("user"), Some("rep@x"));
        assert_eq!(ci.get("password"), Some("p:w"));
        assert_eq!(ci.get("host"), Some("10.0.0.1"));
        assert_eq!(ci.get("port"), Some("5433"));
        assert_eq!(ci.get("dbname"), Some("my db"));
        assert_eq!(ci.get("sslmode"), Some("verify-full"));
        let v6 = ConnInfo::parse("postgres://[::1]:7/").unwrap();
        assert_eq!(v6.get("host"), Some("::1"));
        assert_eq!(v6.get("port"), Some("7"));
    }

    #[test]
    fn environment_fills_only_what_is_missing() {
        let env = |k: &str| match k {
            "PGHOST" => Some("envhost".to_string()),
            "PGUSER" => Some("envuser".to_string()),
            "PGSSLMODE" => Some("disable".to_string()),
            _ => None,
        };
        let ci = ConnInfo::parse("host=given")
            .unwrap()
            .with_env_defaults(&env);
        assert_eq!(ci.get("host"), Some("given"));
        assert_eq!(ci.get("user"), Some("envuser"));
        let t = ci.resolve(&no_env, "pgjet").unwrap();
        assert_eq!(t.ssl_mode, SslMode::Disable);
        assert!(t.tls.is_none());
        assert_eq!(t.effective.get("dbname"), Some("postgres"));
        assert_eq!(t.effective.get("application_name"), Some("pgjet"));
    }

    #[test]
    fn password_file_rules() {
        let text = "# comment\nother:*:*:*:no\ndb1:5432:*:rep:first\ndb1:*:*:rep:second\n*:*:*:*:any\\:one\n";
        assert_eq!(
            pgpass_find(text, "db1", "5432", "x", "rep").as_deref(),
            Some("first")
        );
        assert_eq!(
            pgpass_find(text, "db1", "6000", "x", "rep").as_deref(),
            Some("second")
        );
        assert_eq!(
            pgpass_find(text, "db2", "1", "x", "u").as_deref(),
            Some("any:one")
        );
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("pgpass");
        std::fs::write(&f, "h:1:d:u:pw\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            pgpass_lookup(&f, "h", "1", "d", "u"),
            None,
            "world-readable file ignored"
        );
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(pgpass_lookup(&f, "h", "1", "d", "u").as_deref(), Some("pw"));
        let ci = ConnInfo::parse(&format!(
            "host=h port=1 dbname=d user=u passfile={}",
            f.display()
        ))
        .unwrap();
        let t = ci.resolve(&no_env, "pgjet").unwrap();
        assert_eq!(t.config.get_password(), Some(&b"pw"[..]));
        // ... but it is not an effective parameter: primary_conninfo never carries it, only
        // the file's name.
        assert_eq!(t.effective.get("password"), None);
        assert_eq!(t.effective.get("passfile"), Some(f.to_str().unwrap()));
        // A password in the connection string is one (pg_basebackup -R writes it).
        let ci = ConnInfo::parse(&format!(
            "host=h port=1 dbname=d user=u password=given passfile={}",
            f.display()
        ))
        .unwrap();
        let t = ci.resolve(&no_env, "pgjet").unwrap();
        assert_eq!(t.config.get_password(), Some(&b"given"[..]));
        assert_eq!(t.effective.get("password"), Some("given"));
    }

    #[test]
    fn verify_modes_need_a_root_certificate() {
        let ci =
            ConnInfo::parse("host=h sslmode=verify-full sslrootcert=/nonexistent/ca.crt").unwrap();
        let e = ci.resolve(&no_env, "pgjet").unwrap_err().to_string();
        assert!(e.contains("root certificate"), "{e}");
        let ci = ConnInfo::parse("host=h sslmode=require").unwrap();
        let t = ci.resolve(&no_env, "pgjet").unwrap();
        assert_eq!(t.ssl_mode, SslMode::Require);
        assert!(t.tls.is_some());
        // A socket never uses TLS.
        let ci = ConnInfo::parse("host=/run/pg sslmode=require").unwrap();
        assert!(ci.resolve(&no_env, "pgjet").unwrap().tls.is_none());
        assert!(ConnInfo::parse("sslmode=maybe")
            .unwrap()
            .resolve(&no_env, "x")
            .is_err());
    }

    /// A multi-host string becomes one string per host, a single port shared, the
    /// target_session_attrs taken out and reported.
    #[test]
    fn a_multi_host_string_is_split_per_host() {
        let ci =
            ConnInfo::parse("host=a,b,c port=5433 user=r target_session_attrs=read-write").unwrap();
        let (hosts, rw) = ci.per_host().unwrap();
        assert!(rw);
        let hp: Vec<(String, String)> = hosts
            .iter()
            .map(|h| (h.get("host").unwrap().into(), h.get("port").unwrap().into()))
            .collect();
        assert_eq!(
            hp,
            vec![
                ("a".into(), "5433".into()),
                ("b".into(), "5433".into()),
                ("c".into(), "5433".into())
            ]
        );
        assert!(hosts
            .iter()
            .all(|h| h.get("target_session_attrs").is_none() && h.get("user") == Some("r")));
        let (hosts, rw) = ConnInfo::parse("host=a,b port=1,2")
            .unwrap()
            .per_host()
            .unwrap();
        assert!(!rw);
        assert_eq!(hosts[1].get("port"), Some("2"));
        assert_eq!(
            ConnInfo::parse("user=x")
                .unwrap()
                .per_host()
                .unwrap()
                .0
                .len(),
            1
        );
        assert!(ConnInfo::parse("host=a,b port=1,2,3")
            .unwrap()
            .per_host()
            .is_err());
    }
}
