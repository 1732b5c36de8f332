//! A physical replication connection (`replication=true`), spoken by hand over a blocking
//! socket: tokio-postgres 0.7 has no replication mode (docs/basebackup-transport.md says why
//! this, and not another crate, was chosen). The messages themselves come from
//! `postgres-protocol` (tokio-postgres's own codec: startup, SCRAM-SHA-256, md5, query); this
//! module only frames them, runs the TLS handshake with the rustls configuration that
//! [`crate::pg::conninfo::ConnTarget`] already built (sslmode, sslrootcert, verify-full as on
//! the libpq transport) and reads the replies.
//!
//! PostgreSQL sources relied on: the protocol flow of src/interfaces/libpq/fe-connect.c and
//! fe-auth.c (SSLRequest, StartupMessage, AuthenticationSASL/MD5/cleartext), the replication
//! commands of src/backend/replication/walsender.c (`IDENTIFY_SYSTEM`, `BASE_BACKUP`), and the
//! message formats of the "Frontend/Backend Protocol" chapter of the documentation.
use crate::error::{Error, Result};
use crate::pg::conninfo::{ConnTarget, SslMode};
use bytes::BytesMut;
use postgres_protocol::authentication::sasl::{self, ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

/// Largest backend message accepted, bytes (1 GiB + a header): PostgreSQL never sends a
/// message larger than its MaxAllocSize (src/include/utils/memutils.h); anything larger is a
/// broken stream, refused before memory is allocated for it.
pub const MAX_MESSAGE: usize = (1 << 30) + 64;

/// The byte stream under the connection.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// One backend message: its type byte and its body (without the length word).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub tag: u8,
    pub body: Vec<u8>,
}

pub use crate::error::ServerError;

/// Parses an ErrorResponse or NoticeResponse body: fields of one type byte and a
/// NUL-terminated string, ended by a zero byte. Never fails: a malformed body gives what
/// could be read.
pub fn parse_error_fields(body: &[u8]) -> ServerError {
    let mut e = ServerError::default();
    let mut rest = body;
    while let Some((&kind, tail)) = rest.split_first() {
        if kind == 0 {
            break;
        }
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        let text = String::from_utf8_lossy(&tail[..end]).into_owned();
        match kind {
            b'V' => e.severity = text,
            b'S' if e.severity.is_empty() => e.severity = text,
            b'C' => e.code = text,
            b'M' => e.message = text,
            b'D' => e.detail = Some(text),
            b'H' => e.hint = Some(text),
            _ => {}
        }
        rest = tail.get(end + 1..).unwrap_or(&[]);
    }
    e
}

/// A result set's rows, every column as text (NULL as None).
pub type Rows = Vec<Vec<Option<String>>>;

/// Parses a DataRow body into text columns. Errors: a malformed row.
pub fn parse_data_row(body: &[u8]) -> Result<Vec<Option<String>>> {
    let bad = || Error::Protocol {
        target: "a replication connection".into(),
        detail: "a malformed DataRow message".into(),
    };
    let n = u16::from_be_bytes(
        body.get(0..2)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?,
    );
    let mut at = 2usize;
    let mut cols = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let len = i32::from_be_bytes(
            body.get(at..at + 4)
                .ok_or_else(bad)?
                .try_into()
                .map_err(|_| bad())?,
        );
        at += 4;
        if len < 0 {
            cols.push(None);
            continue;
        }
        let v = body.get(at..at + len as usize).ok_or_else(bad)?;
        cols.push(Some(String::from_utf8_lossy(v).into_owned()));
        at += len as usize;
    }
    Ok(cols)
}

/// A replication connection (see the module's documentation). Blocking: it is driven by the
/// one thread that decodes the stream.
pub struct ReplConn {
    stream: BufReader<Stream>,
    /// `host=... port=... user=...`, for messages.
    describe: String,
    user: String,
    /// BackendKeyData: the WAL sender's PID and secret key, for a cancel request.
    key: Option<(u32, Vec<u8>)>,
    /// Sends the cancel request when the process is cancelled ([`crate::io::cancel`]): a
    /// `BASE_BACKUP` waiting on its checkpoint, or streaming, ends at once.
    _cancel: Option<crate::io::cancel::Hook>,
    /// WAL bytes of the last XLogData message not read yet ([`Self::read_wal`]).
    pub(super) wal_pending: usize,
}

/// Where a cancel request goes: the server's socket as connected.
#[derive(Debug, Clone)]
enum CancelTo {
    Unix(std::path::PathBuf),
    Tcp(std::net::SocketAddr),
}

/// Sends PostgreSQL's CancelRequest (protocol "Canceling Requests in Progress": length 16,
/// code 80877102, the backend's PID and secret key) on a new connection to `to`, in plain
/// text (the postmaster reads it before any TLS or authentication). Best effort.
fn send_cancel(to: &CancelTo, pid: u32, key: &[u8]) {
    let mut msg = Vec::with_capacity(12 + key.len());
    msg.extend_from_slice(&((12 + key.len()) as u32).to_be_bytes());
    msg.extend_from_slice(&80877102u32.to_be_bytes());
    msg.extend_from_slice(&pid.to_be_bytes());
    msg.extend_from_slice(key);
    let wait = std::time::Duration::from_secs(2);
    let sent = match to {
        CancelTo::Unix(p) => UnixStream::connect(p).and_then(|mut s| {
            s.set_write_timeout(Some(wait))?;
            s.write_all(&msg)
        }),
        CancelTo::Tcp(a) => TcpStream::connect_timeout(a, wait).and_then(|mut s| {
            s.set_write_timeout(Some(wait))?;
            s.write_all(&msg)
        }),
    };
    if let Err(e) = sent {
        tracing::debug!("the cancel request to WAL sender {pid} could not be sent: {e}");
    }
}

impl ReplConn {
    /// Opens a physical replication connection to the first host of `target` with the
    /// target's TLS, password and keepalive settings, and authenticates (SCRAM-SHA-256 with
    /// channel binding when `channel_binding=require`, md5, cleartext, trust).
    ///
    /// Errors: [`Error::Replication`] with the server's refusal (its hint names the fix: the
    /// REPLICATION attribute, a `replication` line in pg_hba.conf); [`Error::Io`] when the
    /// host cannot be reached.
    pub fn connect(target: &ConnTarget) -> Result<ReplConn> {
        let c = &target.config;
        let port = c.get_ports().first().copied().unwrap_or(5432);
        let user = c.get_user().unwrap_or_default().to_string();
        let describe = format!("{} (replication)", target.describe);
        let timeout = c.get_connect_timeout().copied();
        let host = c.get_hosts().first().cloned();
        let addr = c.get_hostaddrs().first().copied();
        let mut tls_name = String::new();
        let cancel_to;
        let stream = match (&host, addr) {
            (Some(tokio_postgres::config::Host::Unix(dir)), None) => {
                let path = dir.join(format!(".s.PGSQL.{port}"));
                let s = UnixStream::connect(&path)
                    .map_err(|e| Error::io("connect to the socket", &path, e))?;
                cancel_to = Some(CancelTo::Unix(path));
                Stream::Unix(s)
            }
            _ => {
                let name = match &host {
                    Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
                    _ => addr.map(|a| a.to_string()).unwrap_or_default(),
                };
                tls_name = name.clone();
                let addrs: Vec<std::net::SocketAddr> = match addr {
                    Some(ip) => vec![std::net::SocketAddr::new(ip, port)],
                    None => std::net::ToSocketAddrs::to_socket_addrs(&(name.as_str(), port))
                        .map_err(|e| Error::io("resolve", &name, e))?
                        .collect(),
                };
                let mut last = None;
                let mut sock = None;
                for a in &addrs {
                    let r = match timeout {
                        Some(t) => TcpStream::connect_timeout(a, t),
                        None => TcpStream::connect(a),
                    };
                    match r {
                        Ok(s) => {
                            sock = Some(s);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                let s = sock.ok_or_else(|| {
                    Error::io(
                        "connect to",
                        format!("{name}:{port}"),
                        last.unwrap_or_else(|| std::io::Error::other("no address")),
                    )
                })?;
                let _ = s.set_nodelay(true);
                set_keepalives(&s, target);
                cancel_to = s.peer_addr().ok().map(CancelTo::Tcp);
                Stream::Tcp(s)
            }
        };
        let mut stream = stream;
        if let (Stream::Tcp(_), Some(cfg)) = (&stream, &target.tls) {
            stream = start_tls(stream, cfg.clone(), &tls_name, target.ssl_mode, &describe)?;
        }
        let mut conn = ReplConn {
            stream: BufReader::with_capacity(256 << 10, stream),
            describe,
            user: user.clone(),
            key: None,
            _cancel: None,
            wal_pending: 0,
        };
        conn.startup(target)?;
        if let (Some(to), Some((pid, key))) = (cancel_to, conn.key.clone()) {
            conn._cancel = Some(crate::io::cancel::on_cancel(
                crate::io::cancel::Stage::Interrupt,
                move || send_cancel(&to, pid, &key),
            ));
        }
        Ok(conn)
    }

    /// Where this connection goes, for messages.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    pub(super) fn send(&mut self, buf: &[u8]) -> Result<()> {
        let s = self.stream.get_mut();
        s.write_all(buf)
            .and_then(|_| s.flush())
            .map_err(|e| Error::lost("send to", &self.describe, e))
    }

    /// Waits up to `timeout` until a message can be read, or `wake` (another descriptor, such
    /// as a pipe another thread writes to) becomes readable. Returns (the connection is
    /// readable, `wake` is). A message already buffered, here or in the TLS layer, counts
    /// as readable at once.
    ///
    /// Errors: poll(2) fails, or the TLS layer finds the buffered records broken.
    pub(super) fn wait_readable(
        &mut self,
        wake: Option<std::os::fd::RawFd>,
        timeout: Duration,
    ) -> Result<(bool, bool)> {
        use std::os::fd::AsRawFd;
        if !self.stream.buffer().is_empty() {
            return Ok((true, false));
        }
        let fd = match self.stream.get_mut() {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tls(s) => {
                let st = s.conn.process_new_packets().map_err(|e| {
                    Error::lost("read from", &self.describe, std::io::Error::other(e))
                })?;
                if st.plaintext_bytes_to_read() > 0 {
                    return Ok((true, false));
                }
                s.sock.as_raw_fd()
            }
        };
        let mut fds = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: poll on two pollfd structs of this stack frame; a negative fd is ignored.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok((false, false));
            }
            return Err(Error::lost("wait for", &self.describe, e));
        }
        let ready =
            |f: &libc::pollfd| f.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
        Ok((ready(&fds[0]), wake.is_some() && ready(&fds[1])))
    }

    /// Reads the next backend message. NoticeResponse and ParameterStatus are logged and
    /// skipped. Errors: the connection closed or failed, a message over [`MAX_MESSAGE`].
    pub fn read_message(&mut self) -> Result<Message> {
        let (tag, len) = self.read_head()?;
        let body = self.read_body(len)?;
        Ok(Message { tag, body })
    }

    /// Reads the next message's type and the length of its body (bytes), leaving the body
    /// to [`Self::read_body`] or [`Self::read_into`]; NoticeResponse and ParameterStatus
    /// are read whole, logged and skipped.
    ///
    /// Errors: the connection closed or failed, a message over [`MAX_MESSAGE`].
    pub(super) fn read_head(&mut self) -> Result<(u8, usize)> {
        loop {
            let mut head = [0u8; 5];
            self.stream
                .read_exact(&mut head)
                .map_err(|e| Error::lost("read from", &self.describe, e))?;
            let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            if !(4..=MAX_MESSAGE).contains(&len) {
                return Err(self.protocol(format!(
                    "the server sent a message of {len} bytes (type '{}'); the stream is broken",
                    head[0].escape_ascii()
                )));
            }
            match head[0] {
                b'N' => {
                    let body = self.read_body(len - 4)?;
                    tracing::info!("server: {}", parse_error_fields(&body));
                }
                b'S' => {
                    self.read_body(len - 4)?;
                }
                tag => return Ok((tag, len - 4)),
            }
        }
    }

    /// Reads `len` bytes of a message body into a new buffer. Errors: the connection closed
    /// or failed.
    pub(super) fn read_body(&mut self, len: usize) -> Result<Vec<u8>> {
        let mut body = vec![0u8; len];
        self.read_into(&mut body)?;
        Ok(body)
    }

    /// Fills `dst` from the connection: what the read buffer holds first, the rest read
    /// from the socket (or the TLS layer) into `dst` without passing the buffer. Reading a
    /// message's header fills the buffer (up to 256 KiB), so most of a WAL message still
    /// comes from it; what this saves is a body allocated per message and its copy.
    /// Errors: the connection closed or failed.
    pub(super) fn read_into(&mut self, dst: &mut [u8]) -> Result<()> {
        use std::io::BufRead;
        let buffered = self.stream.buffer();
        let n = buffered.len().min(dst.len());
        dst[..n].copy_from_slice(&buffered[..n]);
        self.stream.consume(n);
        if n < dst.len() {
            // The buffer is empty now: reading past it loses nothing.
            self.stream
                .get_mut()
                .read_exact(&mut dst[n..])
                .map_err(|e| Error::lost("read from", &self.describe, e))?;
        }
        Ok(())
    }

    /// An [`Error::Protocol`] on this connection: the server sent `detail`, which the
    /// protocol does not allow here.
    pub fn protocol(&self, detail: impl Into<String>) -> Error {
        Error::Protocol {
            target: self.describe.clone(),
            detail: detail.into(),
        }
    }

    /// The error for an ErrorResponse body.
    pub fn server_error(&self, body: &[u8]) -> Error {
        Error::Replication {
            target: self.describe.clone(),
            user: self.user.clone(),
            error: Box::new(parse_error_fields(body)),
        }
    }

    fn startup(&mut self, target: &ConnTarget) -> Result<()> {
        let c = &target.config;
        let mut params: Vec<(&str, &str)> = vec![
            ("user", c.get_user().unwrap_or_default()),
            ("replication", "true"),
            ("client_encoding", "UTF8"),
        ];
        if let Some(a) = c.get_application_name() {
            params.push(("application_name", a));
        }
        if let Some(o) = c.get_options() {
            params.push(("options", o));
        }
        let mut buf = BytesMut::new();
        frontend::startup_message(params.iter().copied(), &mut buf)
            .map_err(|e| Error::Other("startup message".into()).because(e))?;
        self.send(&buf)?;
        let password = c.get_password().map(<[u8]>::to_vec);
        let need_pw = |me: &ReplConn| {
            password.clone().ok_or_else(|| Error::Replication {
                target: me.describe.clone(),
                user: me.user.clone(),
                error: Box::new(ServerError {
                    severity: "FATAL".into(),
                    code: "28P01".into(),
                    message: "the server asks for a password and none was given (password=, PGPASSWORD or ~/.pgpass)".into(),
                    ..Default::default()
                }),
            })
        };
        let mut scram: Option<ScramSha256> = None;
        loop {
            let m = self.read_message()?;
            match m.tag {
                b'R' => {
                    let code = be_u32(&m.body, 0).unwrap_or(u32::MAX);
                    let mut out = BytesMut::new();
                    match code {
                        0 => continue, // AuthenticationOk
                        3 => {
                            let pw = need_pw(self)?;
                            frontend::password_message(&pw, &mut out)
                                .map_err(|e| Error::Other("password message".into()).because(e))?;
                        }
                        5 => {
                            let pw = need_pw(self)?;
                            let salt: [u8; 4] = m
                                .body
                                .get(4..8)
                                .and_then(|s| s.try_into().ok())
                                .ok_or_else(|| self.protocol("a malformed MD5 password request"))?;
                            let h = postgres_protocol::authentication::md5_hash(
                                self.user.as_bytes(),
                                &pw,
                                salt,
                            );
                            frontend::password_message(h.as_bytes(), &mut out)
                                .map_err(|e| Error::Other("password message".into()).because(e))?;
                        }
                        10 => {
                            let pw = need_pw(self)?;
                            let mechs: Vec<&[u8]> = m
                                .body
                                .get(4..)
                                .unwrap_or(&[])
                                .split(|&b| b == 0)
                                .filter(|s| !s.is_empty())
                                .collect();
                            let plus = mechs.contains(&sasl::SCRAM_SHA_256_PLUS.as_bytes());
                            let require = c.get_channel_binding()
                                == tokio_postgres::config::ChannelBinding::Require;
                            let end_point = self.tls_end_point();
                            let (mech, cb) = match (plus && require, end_point) {
                                (true, Some(ep)) => (
                                    sasl::SCRAM_SHA_256_PLUS,
                                    ChannelBinding::tls_server_end_point(ep),
                                ),
                                _ if require => {
                                    return Err(Error::Config(format!(
                                        "{}: channel_binding=require, but the server offers no channel binding here",
                                        self.describe
                                    )))
                                }
                                _ => (sasl::SCRAM_SHA_256, ChannelBinding::unsupported()),
                            };
                            let s = ScramSha256::new(&pw, cb);
                            frontend::sasl_initial_response(mech, s.message(), &mut out)
                                .map_err(|e| Error::Other("SASL message".into()).because(e))?;
                            scram = Some(s);
                        }
                        11 => {
                            let s = scram
                                .as_mut()
                                .ok_or_else(|| self.protocol("SASL continue without a start"))?;
                            s.update(m.body.get(4..).unwrap_or(&[]))
                                .map_err(|e| self.protocol(format!("SCRAM: {e}")))?;
                            frontend::sasl_response(s.message(), &mut out)
                                .map_err(|e| Error::Other("SASL message".into()).because(e))?;
                        }
                        12 => {
                            let s = scram
                                .as_mut()
                                .ok_or_else(|| self.protocol("SASL final without a start"))?;
                            s.finish(m.body.get(4..).unwrap_or(&[])).map_err(|e| {
                                self.protocol(format!("the server's SCRAM proof is wrong: {e}"))
                            })?;
                            continue;
                        }
                        other => {
                            return Err(Error::Other(format!(
                                "{}: authentication method {other} is not supported (use scram-sha-256, md5, password or trust)",
                                self.describe
                            )))
                        }
                    }
                    self.send(&out)?;
                }
                b'K' => {
                    if let Some(pid) = be_u32(&m.body, 0) {
                        self.key = Some((pid, m.body[4..].to_vec()));
                    }
                }
                b'Z' => return Ok(()),
                b'E' => return Err(self.server_error(&m.body)),
                other => {
                    return Err(self.protocol(format!(
                        "unexpected message '{}' during startup",
                        other.escape_ascii()
                    )))
                }
            }
        }
    }

    /// tls-server-end-point channel binding data (RFC 5929): the hash of the server's
    /// certificate, SHA-256 unless its signature uses SHA-384 or SHA-512.
    fn tls_end_point(&self) -> Option<Vec<u8>> {
        use sha2::Digest;
        let Stream::Tls(s) = self.stream.get_ref() else {
            return None;
        };
        let cert = s.conn.peer_certificates()?.first()?.as_ref().to_vec();
        use x509_cert::der::Decode;
        let parsed = x509_cert::Certificate::from_der(&cert).ok()?;
        let oid = parsed.signature_algorithm.oid.to_string();
        Some(match oid.as_str() {
            // sha384WithRSAEncryption, ecdsa-with-SHA384
            "1.2.840.113549.1.1.12" | "1.2.840.10045.4.3.3" => sha2::Sha384::digest(&cert).to_vec(),
            // sha512WithRSAEncryption, ecdsa-with-SHA512
            "1.2.840.113549.1.1.13" | "1.2.840.10045.4.3.4" => sha2::Sha512::digest(&cert).to_vec(),
            _ => sha2::Sha256::digest(&cert).to_vec(),
        })
    }

    /// Sends `sql` (a replication command) with the simple query protocol and returns the
    /// rows of every result set until ReadyForQuery. Errors: the server's ErrorResponse.
    pub fn simple_query(&mut self, sql: &str) -> Result<Rows> {
        self.send_query(sql)?;
        self.read_results()
    }

    /// Reads a command's replies up to ReadyForQuery: the rows of its result sets, or the
    /// server's ErrorResponse.
    pub(super) fn read_results(&mut self) -> Result<Rows> {
        let mut rows = Vec::new();
        let mut failed = None;
        loop {
            let m = self.read_message()?;
            match m.tag {
                b'D' => rows.push(parse_data_row(&m.body)?),
                b'E' => failed = Some(self.server_error(&m.body)),
                b'Z' => break,
                _ => {}
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(rows),
        }
    }

    /// Sends `sql` with the simple query protocol; the caller reads the replies.
    pub fn send_query(&mut self, sql: &str) -> Result<()> {
        let mut buf = BytesMut::new();
        frontend::query(sql, &mut buf).map_err(|e| Error::Other("query".into()).because(e))?;
        self.send(&buf)
    }

    /// `IDENTIFY_SYSTEM`: (system identifier, timeline, current WAL flush LSN as text).
    /// Errors: the server's refusal, or a reply without the expected columns.
    pub fn identify_system(&mut self) -> Result<(u64, u32, String)> {
        let rows = self.simple_query("IDENTIFY_SYSTEM")?;
        let r = rows
            .first()
            .ok_or_else(|| self.protocol("IDENTIFY_SYSTEM returned no row"))?;
        let col = |i: usize| r.get(i).cloned().flatten().unwrap_or_default();
        let id = col(0).parse().map_err(|_| {
            self.protocol(format!(
                "IDENTIFY_SYSTEM returned system identifier '{}'",
                col(0)
            ))
        })?;
        Ok((id, col(1).parse().unwrap_or(0), col(2)))
    }

    /// `UPLOAD_MANIFEST` (PostgreSQL 17+, walsender.c UploadManifest): sends `manifest` (a
    /// backup_manifest, version 2, with its `Manifest-Checksum` line) with COPY FROM STDIN,
    /// in CopyData messages of at most 1 MiB, then CopyDone. The server keeps it for this
    /// connection only: the `BASE_BACKUP ( INCREMENTAL )` that uses it must follow on it.
    ///
    /// Errors: the server's refusal ([`Error::Replication`]: a manifest it cannot parse,
    /// another cluster's system identifier, a checksum mismatch, a server before 17), which
    /// may come while the manifest is still being sent; a connection that fails.
    pub fn upload_manifest(&mut self, manifest: &[u8]) -> Result<()> {
        self.send_query("UPLOAD_MANIFEST")?;
        let m = self.read_message()?;
        match m.tag {
            b'G' => {}
            b'E' => {
                let e = self.server_error(&m.body);
                self.read_until_ready()?;
                return Err(e);
            }
            other => {
                return Err(self.protocol(format!(
                    "unexpected message '{}' after UPLOAD_MANIFEST",
                    other.escape_ascii()
                )))
            }
        }
        let mut buf = BytesMut::new();
        for chunk in manifest.chunks(1 << 20) {
            buf.clear();
            frontend::CopyData::new(chunk)
                .map_err(|e| Error::Other("UPLOAD_MANIFEST".into()).because(e))?
                .write(&mut buf);
            self.send(&buf)?;
        }
        buf.clear();
        frontend::copy_done(&mut buf);
        self.send(&buf)?;
        self.read_results().map(|_| ())
    }

    /// Reads messages up to ReadyForQuery (after an error, the connection is usable again).
    fn read_until_ready(&mut self) -> Result<()> {
        while self.read_message()?.tag != b'Z' {}
        Ok(())
    }

    /// `TIMELINE_HISTORY tli`: the history file of timeline `tli` (its text: one
    /// "parent-timeline switch-LSN reason" line per ancestor, oldest first), as
    /// walsender.c SendTimeLineHistory sends it. Needs only REPLICATION.
    /// Errors: the server's refusal (no such timeline), a reply without the file.
    pub fn timeline_history(&mut self, tli: u32) -> Result<String> {
        let rows = self.simple_query(&format!("TIMELINE_HISTORY {tli}"))?;
        rows.first()
            .and_then(|r| r.get(1).cloned().flatten())
            .ok_or_else(|| self.protocol(format!("TIMELINE_HISTORY {tli} returned no file")))
    }

    /// `SHOW name` on the replication connection (walsender.c: any setting the role may
    /// read). None when the server has no such setting.
    /// Errors: the connection, a refusal other than an unknown setting.
    pub fn show(&mut self, name: &str) -> Result<Option<String>> {
        match self.simple_query(&format!("SHOW {name}")) {
            Ok(rows) => Ok(rows.first().and_then(|r| r.first().cloned().flatten())),
            Err(Error::Replication { error, .. })
                if error
                    .message
                    .contains("unrecognized configuration parameter") =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Ends the connection politely (Terminate); errors are ignored.
    pub fn close(mut self) {
        let mut buf = BytesMut::new();
        frontend::terminate(&mut buf);
        let _ = self.send(&buf);
    }
}

fn be_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// TCP keepalives and the user timeout as the target sets them (libpq's keepalives_*
/// and tcp_user_timeout, with pgjet's defaults from [`crate::pg::conninfo`]), so a cut link
/// ends the stream with an error.
fn set_keepalives(s: &TcpStream, target: &ConnTarget) {
    use std::os::fd::AsRawFd;
    let c = &target.config;
    let fd = s.as_raw_fd();
    let set = |level: i32, name: i32, v: i32| {
        // SAFETY: setsockopt on an open socket with a pointer to a local int of that size.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                &v as *const i32 as *const libc::c_void,
                std::mem::size_of::<i32>() as libc::socklen_t,
            );
        }
    };
    if c.get_keepalives() {
        set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
        set(
            libc::IPPROTO_TCP,
            libc::TCP_KEEPIDLE,
            c.get_keepalives_idle().as_secs().max(1) as i32,
        );
        if let Some(i) = c.get_keepalives_interval() {
            set(
                libc::IPPROTO_TCP,
                libc::TCP_KEEPINTVL,
                i.as_secs().max(1) as i32,
            );
        }
        if let Some(n) = c.get_keepalives_retries() {
            set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, n as i32);
        }
    }
    if let Some(t) = c.get_tcp_user_timeout() {
        set(
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            t.as_millis().min(i32::MAX as u128) as i32,
        );
    }
}

/// SSLRequest, then the rustls handshake when the server agrees. With sslmode allow or
/// prefer a server that declines TLS is used in plain text, as libpq does.
fn start_tls(
    stream: Stream,
    cfg: Arc<rustls::ClientConfig>,
    host: &str,
    mode: SslMode,
    describe: &str,
) -> Result<Stream> {
    let Stream::Tcp(mut tcp) = stream else {
        return Ok(stream);
    };
    let mut buf = BytesMut::new();
    frontend::ssl_request(&mut buf);
    tcp.write_all(&buf)
        .map_err(|e| Error::lost("send to", describe, e))?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer)
        .map_err(|e| Error::lost("read from", describe, e))?;
    if answer[0] != b'S' {
        if matches!(mode, SslMode::Allow | SslMode::Prefer) {
            return Ok(Stream::Tcp(tcp));
        }
        return Err(Error::Config(format!(
            "{describe}: the server does not accept TLS connections, and sslmode requires TLS"
        )));
    }
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|_| Error::Config(format!("'{host}' is not a valid TLS server name")))?;
    let mut conn = rustls::ClientConnection::new(cfg, name)
        .map_err(|e| Error::Other(format!("{describe}: TLS set-up")).because(e))?;
    // Run the handshake now, so a refused certificate is reported as such.
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(60)));
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).map_err(|e| {
            let detail = e
                .get_ref()
                .and_then(|i| i.downcast_ref::<rustls::Error>())
                .map(crate::error::tls::reason)
                .unwrap_or_else(|| e.to_string());
            Error::Config(format!("{describe}: TLS handshake failed: {detail}"))
        })?;
    }
    let _ = tcp.set_read_timeout(None);
    Ok(Stream::Tls(Box::new(rustls::StreamOwned::new(conn, tcp))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_fields_and_rows() {
        let body = b"SFATAL\0VFATAL\0C42501\0Mmust be superuser or replication role\0Dmore\0\0";
        let e = parse_error_fields(body);
        assert_eq!(e.code, "42501");
        assert_eq!(e.severity, "FATAL");
        assert_eq!(e.detail.as_deref(), Some("more"));
        // Malformed: no terminators.
        let e = parse_error_fields(b"Mhalf");
        assert_eq!(e.message, "half");
        let mut row = vec![0u8, 2];
        row.extend_from_slice(&3i32.to_be_bytes());
        row.extend_from_slice(b"abc");
        row.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(
            parse_data_row(&row).unwrap(),
            vec![Some("abc".to_string()), None]
        );
        assert!(parse_data_row(&row[..5]).is_err());
        assert!(parse_data_row(&[]).is_err());
    }
}
