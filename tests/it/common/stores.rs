//! Real object-store servers for tests, each on 127.0.0.1 only, started by the test and
//! stopped by PID when dropped:
//! - S3: versitygw serving a posix directory, TLS from a test CA;
//! - GCS: fake-gcs-server (filesystem backend), TLS from a test CA;
//! - Azure Blob: Azurite (blob service), plain HTTP, path-style URLs;
//! - SFTP: OpenSSH's sshd with its internal-sftp, key authentication.
//!
//! scripts/install-deps.sh installs them (Go modules versitygw and fake-gcs-server, npm
//! packages azurite and @azure/storage-blob, Debian's openssh-server).
use super::*;
use pgjet_core::storage::config::RepoConfig;
use std::process::Child;

/// Access key and secret of the S3 test server.
pub const S3_KEY: &str = "pgjettestkey";
pub const S3_SECRET: &str = "pgjet-test-secret-0123456789";
/// The bucket (container) every test server starts with.
pub const BUCKET: &str = "pgjet";
/// Azurite's well-known development account and key.
pub const AZURE_ACCOUNT: &str = "devstoreaccount1";
pub const AZURE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// The first of `candidates` that exists.
fn find_bin(what: &str, candidates: &[PathBuf]) -> PathBuf {
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| panic!("{what} is not installed: run scripts/install-deps.sh"))
}

fn sh(dir: &Path, cmd: &str) {
    sh_in(dir, cmd)
}

/// A test CA (`ca.crt`) and a server certificate for 127.0.0.1 (`server.crt`, `server.key`)
/// in `dir`.
fn make_tls(dir: &Path) {
    make_test_certificates(
        dir,
        "127.0.0.1",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    );
}

/// A server process with its output in `<dir>/server.log`.
struct Proc {
    child: Option<Child>,
}

impl Proc {
    fn spawn(dir: &Path, program: &Path, args: &[String]) -> Proc {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("server.log"))
            .unwrap();
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        Proc { child: Some(child) }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe {
                libc::kill(c.id() as i32, libc::SIGKILL);
            }
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until something listens on 127.0.0.1:`port`.
fn wait_listening(port: u16, dir: &Path) {
    let up = wait_for(Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    let log = fs::read_to_string(dir.join("server.log")).unwrap_or_default();
    assert!(up.is_some(), "no server on port {port}:\n{log}");
}

/// Which store a test server is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    S3,
    Gcs,
    Azure,
    Sftp,
}

/// A running test store.
pub struct StoreServer {
    pub kind: StoreKind,
    /// HTTPS with the test CA (S3 and GCS), or plain HTTP.
    pub tls: bool,
    pub port: u16,
    /// The server's files, TLS material, keys and log.
    pub dir: Scratch,
    proc: Proc,
    args: Vec<String>,
    program: PathBuf,
}

impl StoreServer {
    /// Starts a server of `kind` with an empty bucket (container, directory) [`BUCKET`].
    pub fn start(kind: StoreKind, tag: &str) -> StoreServer {
        Self::start_with(kind, tag, true)
    }

    /// [`StoreServer::start`], over plain HTTP when `tls` is false (S3 only: a proxy that
    /// answers HTTP itself needs to read the requests). Over TLS connections are kept open
    /// between requests, as real object stores do; over plain HTTP the server closes each
    /// one, so the fault proxy, which picks a fault per connection, sees every request.
    pub fn start_with(kind: StoreKind, tag: &str, tls: bool) -> StoreServer {
        assert!(tls || kind == StoreKind::S3, "plain HTTP is for S3 only");
        let dir = Scratch::new(&format!("{tag}-store"));
        let port = free_port();
        let p = |s: &str| dir.join(s).display().to_string();
        let (program, args) = match kind {
            StoreKind::S3 => {
                make_tls(&dir.path);
                fs::create_dir_all(dir.join(&format!("data/{BUCKET}"))).unwrap();
                let mut a = args![
                    "--port",
                    format!("127.0.0.1:{port}"),
                    "--access",
                    S3_KEY,
                    "--secret",
                    S3_SECRET
                ];
                if tls {
                    a.extend(args!["--cert", p("server.crt"), "--key", p("server.key")]);
                    // pooled connections, as against a real object store (versitygw
                    // closes every connection otherwise)
                    a.extend(args!["--keep-alive"]);
                }
                a.extend(args!["posix", p("data")]);
                (
                    find_bin(
                        "versitygw",
                        &[
                            PathBuf::from("/usr/local/bin/versitygw"),
                            PathBuf::from("/root/go/bin/versitygw"),
                        ],
                    ),
                    a,
                )
            }
            StoreKind::Gcs => {
                make_tls(&dir.path);
                (
                    find_bin(
                        "fake-gcs-server",
                        &[
                            PathBuf::from("/usr/local/bin/fake-gcs-server"),
                            PathBuf::from("/root/go/bin/fake-gcs-server"),
                        ],
                    ),
                    args![
                        "-scheme",
                        "https",
                        "-host",
                        "127.0.0.1",
                        "-port",
                        port,
                        "-backend",
                        "filesystem",
                        "-filesystem-root",
                        p("data"),
                        "-public-host",
                        format!("127.0.0.1:{port}"),
                        "-external-url",
                        format!("https://127.0.0.1:{port}"),
                        "-cert-location",
                        p("server.crt"),
                        "-private-key-location",
                        p("server.key"),
                        "-log-level",
                        "warn"
                    ],
                )
            }
            StoreKind::Azure => (
                find_bin(
                    "azurite-blob",
                    &[
                        PathBuf::from("/usr/bin/azurite-blob"),
                        PathBuf::from("/usr/local/bin/azurite-blob"),
                    ],
                ),
                args![
                    "--blobHost",
                    "127.0.0.1",
                    "--blobPort",
                    port,
                    "--location",
                    p("data"),
                    "--skipApiVersionCheck",
                    "--silent"
                ],
            ),
            StoreKind::Sftp => {
                sh(&dir.path, "ssh-keygen -q -t ed25519 -N '' -f host_key");
                sh(&dir.path, "ssh-keygen -q -t ed25519 -N '' -f client_key");
                sh(&dir.path, "cp client_key.pub authorized_keys");
                fs::create_dir_all(dir.join(BUCKET)).unwrap();
                fs::create_dir_all("/run/sshd").unwrap();
                // UsePAM: without it sshd refuses every key of a locked account (postgres has
                // no password).
                let conf = format!(
                    "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\n\
                     PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM yes\n\
                     StrictModes no\nPidFile {}\nSubsystem sftp internal-sftp\nAllowUsers postgres\n\
                     MaxStartups 100\nMaxSessions 100\n",
                    p("host_key"),
                    p("authorized_keys"),
                    p("sshd.pid")
                );
                fs::write(dir.join("sshd_config"), conf).unwrap();
                (
                    PathBuf::from("/usr/sbin/sshd"),
                    args!["-D", "-e", "-f", p("sshd_config")],
                )
            }
        };
        chown_pg_recursive(&dir.path);
        for f in ["client_key", "host_key"] {
            if dir.join(f).exists() {
                fs::set_permissions(dir.join(f), fs::Permissions::from_mode(0o600)).unwrap();
            }
        }
        let proc = Proc::spawn(&dir.path, &program, &args);
        wait_listening(port, &dir.path);
        let s = StoreServer {
            kind,
            tls,
            port,
            dir,
            proc,
            args,
            program,
        };
        s.make_bucket();
        s
    }

    /// Creates the bucket where the server has no other way (GCS and Azure APIs).
    fn make_bucket(&self) {
        match self.kind {
            StoreKind::Gcs => sh(
                &self.dir.path,
                &format!(
                    "curl -sSf --cacert ca.crt -X POST -H 'Content-Type: application/json' \
                     -d '{{\"name\":\"{BUCKET}\"}}' 'https://127.0.0.1:{}/storage/v1/b?project=test' >/dev/null",
                    self.port
                ),
            ),
            StoreKind::Azure => sh(
                &self.dir.path,
                &format!(
                    "NODE_PATH=$(npm root -g 2>/dev/null) node -e \"require('@azure/storage-blob').BlobServiceClient\
                     .fromConnectionString('DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={AZURE_KEY};BlobEndpoint=http://127.0.0.1:{}/{AZURE_ACCOUNT};')\
                     .getContainerClient('{BUCKET}').create().catch(e => {{ console.error(e); process.exit(1); }})\"",
                    self.port
                ),
            ),
            StoreKind::S3 | StoreKind::Sftp => {}
        }
    }

    /// Stops the server (SIGKILL by PID): requests fail until [`StoreServer::resume`].
    pub fn stop(&mut self) {
        self.proc.kill();
    }

    /// Starts the server process again, same port and data.
    pub fn resume(&mut self) {
        self.proc = Proc::spawn(&self.dir.path, &self.program, &self.args);
        wait_listening(self.port, &self.dir.path);
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        let t = fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The repository options (pgBackRest names, repository 1) for `prefix` on this server.
    pub fn options(&self, prefix: &str) -> Vec<(String, String)> {
        let kv = |pairs: &[(&str, String)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect()
        };
        let ca = self.dir.join("ca.crt").display().to_string();
        match self.kind {
            StoreKind::S3 if !self.tls => kv(&[
                ("repo1-type", "s3".into()),
                ("repo1-path", prefix.into()),
                ("repo1-s3-bucket", BUCKET.into()),
                ("repo1-s3-endpoint", "http://127.0.0.1".into()),
                ("repo1-storage-port", self.port.to_string()),
                ("repo1-s3-region", "us-east-1".into()),
                ("repo1-s3-key", S3_KEY.into()),
                ("repo1-s3-key-secret", S3_SECRET.into()),
                ("repo1-s3-uri-style", "path".into()),
            ]),
            StoreKind::S3 => kv(&[
                ("repo1-type", "s3".into()),
                ("repo1-path", prefix.into()),
                ("repo1-s3-bucket", BUCKET.into()),
                ("repo1-s3-endpoint", "127.0.0.1".into()),
                ("repo1-storage-port", self.port.to_string()),
                ("repo1-s3-region", "us-east-1".into()),
                ("repo1-s3-key", S3_KEY.into()),
                ("repo1-s3-key-secret", S3_SECRET.into()),
                ("repo1-s3-uri-style", "path".into()),
                ("repo1-storage-ca-file", ca),
            ]),
            StoreKind::Gcs => kv(&[
                ("repo1-type", "gcs".into()),
                ("repo1-path", prefix.into()),
                ("repo1-gcs-bucket", BUCKET.into()),
                ("repo1-gcs-endpoint", "127.0.0.1".into()),
                ("repo1-storage-port", self.port.to_string()),
                ("repo1-gcs-key-type", "none".into()),
                ("repo1-storage-ca-file", ca),
            ]),
            StoreKind::Azure => kv(&[
                ("repo1-type", "azure".into()),
                ("repo1-path", prefix.into()),
                ("repo1-azure-account", AZURE_ACCOUNT.into()),
                ("repo1-azure-container", BUCKET.into()),
                ("repo1-azure-key", AZURE_KEY.into()),
                (
                    "repo1-azure-endpoint",
                    format!("http://127.0.0.1:{}", self.port),
                ),
                ("repo1-azure-uri-style", "path".into()),
            ]),
            StoreKind::Sftp => kv(&[
                ("repo1-type", "sftp".into()),
                (
                    "repo1-path",
                    format!(
                        "{}/{}",
                        self.dir.join(BUCKET).display(),
                        prefix.trim_start_matches('/')
                    ),
                ),
                ("repo1-sftp-host", "127.0.0.1".into()),
                ("repo1-sftp-host-port", self.port.to_string()),
                ("repo1-sftp-host-user", "postgres".into()),
                (
                    "repo1-sftp-private-key-file",
                    self.dir.join("client_key").display().to_string(),
                ),
                ("repo1-sftp-host-key-check-type", "none".into()),
            ]),
        }
    }

    /// The same repository as [`StoreServer::options`], for the library.
    pub fn repo_config(&self, prefix: &str) -> RepoConfig {
        let opts = self.options(prefix);
        let get = move |k: &str| -> Option<String> {
            opts.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        RepoConfig::resolve(1, &get).unwrap().unwrap()
    }

    /// Writes a config file (0600, owned by postgres) with [`StoreServer::options`] for
    /// `prefix`; `overrides` replace or add keys.
    pub fn config_file(&self, name: &str, prefix: &str, overrides: &[(&str, &str)]) -> PathBuf {
        let mut kv = self.options(prefix);
        for (k, v) in overrides {
            match kv.iter_mut().find(|(key, _)| key == k) {
                Some(e) => e.1 = v.to_string(),
                None => kv.push((k.to_string(), v.to_string())),
            }
        }
        let mut text = String::from("[global]\n");
        for (k, v) in kv {
            text.push_str(&format!("{k}={v}\n"));
        }
        let p = self.dir.join(name);
        fs::write(&p, text).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        chown_pg_recursive(&p);
        p
    }

    /// The file behind object `name` of the repository at `prefix` (S3: versitygw keeps
    /// each object as a file), for tests that damage stored bytes.
    pub fn object_file(&self, prefix: &str, name: &str) -> PathBuf {
        assert_eq!(
            self.kind,
            StoreKind::S3,
            "only versitygw keeps objects as plain files"
        );
        self.dir
            .join(&format!("data/{BUCKET}/{}", prefix.trim_matches('/')))
            .join(name)
    }

    /// The stored bytes of object `name` of the repository at `prefix`, read without
    /// pgjet's cipher (SFTP from the served directory, for the reason given at
    /// [`StoreServer::objects`]).
    pub fn object_bytes(&self, prefix: &str, name: &str) -> Vec<u8> {
        if self.kind == StoreKind::Sftp {
            let p = self
                .dir
                .join(&format!("{BUCKET}/{}", prefix.trim_matches('/')))
                .join(name);
            return fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        }
        let store = pgjet_core::storage::open(&self.repo_config(prefix))
            .unwrap_or_else(|e| panic!("open the {:?} repository: {e}", self.kind));
        store.get(name).unwrap().to_vec()
    }

    /// Every object name below the repository at `prefix`, sorted (read through the store's
    /// own API, as pgjet sees it).
    ///
    /// SFTP is read from the served directory instead: OpenDAL's SFTP store starts an ssh
    /// control master (`ControlPersist=yes`) that only pgjet's own exit path ends
    /// (`storage::ssh::stop_masters`), so opening it here would leave one behind and trip
    /// the scenario's check that no ssh process outlives pgjet. The server is sshd's
    /// internal-sftp without a chroot, so the directory holds exactly what the store lists.
    pub fn objects(&self, prefix: &str) -> Vec<String> {
        if self.kind == StoreKind::Sftp {
            let root = self
                .dir
                .join(&format!("{BUCKET}/{}", prefix.trim_matches('/')));
            let mut out = Vec::new();
            let mut dirs = vec![root.clone()];
            while let Some(d) = dirs.pop() {
                for e in fs::read_dir(&d).unwrap() {
                    let e = e.unwrap();
                    if e.file_type().unwrap().is_dir() {
                        dirs.push(e.path());
                    } else {
                        let rel = e.path().strip_prefix(&root).unwrap().to_owned();
                        out.push(rel.display().to_string());
                    }
                }
            }
            out.sort();
            return out;
        }
        let store = pgjet_core::storage::open(&self.repo_config(prefix))
            .unwrap_or_else(|e| panic!("open the {:?} repository: {e}", self.kind));
        let mut out = Vec::new();
        let mut dirs = vec![String::new()];
        while let Some(d) = dirs.pop() {
            for n in store.list(&d).unwrap() {
                let n = n.unwrap();
                let full = if d.is_empty() { n } else { format!("{d}/{n}") };
                if store.exists(&full).unwrap() {
                    out.push(full);
                } else {
                    dirs.push(full);
                }
            }
        }
        out.sort();
        out
    }
}
