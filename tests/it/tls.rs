//! Which server certificates pgjet trusts, on both of its TLS paths (crates/pgjet-core/src/io/tls.rs), each
//! case checked against the OpenSSL client that users compare pgjet with:
//!
//! - libpq (`--source "host=127.0.0.1 ... sslmode=verify-full sslrootcert=..."`, `pgjet
//!   check`) against a PostgreSQL 15 server with `ssl = on` on 127.0.0.1, and `psql` with the
//!   same connection string: pgjet connects exactly when psql does.
//! - An S3 repository on versitygw over TLS (`repo-storage-ca-file`, `pgjet info`), and
//!   `curl --cacert` with the same file: pgjet opens the repository exactly when curl
//!   connects.
//!
//! The cases, on each path: a self-signed certificate made by PostgreSQL's documented recipe
//! ("Creating Certificates": `openssl req -new -x509 ...`, so `CA:TRUE`) given as its own
//! trust root (accepted); a CA and a leaf it signed (accepted); the right certificate with
//! another host name (refused: the name); an expired self-signed certificate as its own root
//! (refused: the date); another CA, and another self-signed certificate (refused: the issuer);
//! client certificates for a `cert` line in pg_hba.conf, and a key file others may read.
//! Each refusal names its cause in the message, and the hint is about TLS and the option to
//! check, not about a stopped cluster.

use crate::common::stores::*;
use crate::common::*;
use std::fs;
use std::path::{Path, PathBuf};

/// Certificates made in a directory with the openssl command line, as a user would.
struct Pki {
    dir: Scratch,
}

impl Pki {
    fn new(tag: &str) -> Pki {
        let dir = Scratch::new(tag);
        fs::set_permissions(
            &dir.path,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn sh(&self, cmd: &str) {
        sh_in(&self.dir.path, &format!("{cmd} 2>/dev/null"));
    }

    /// PostgreSQL's self-signed server certificate (`<name>.crt`, `<name>.key`):
    /// `openssl req -new -x509 -days 365 -nodes -text ... -subj /CN=<cn>`, plus `addext`
    /// (e.g. a subjectAltName) when given.
    fn self_signed(&self, name: &str, cn: &str, addext: Option<&str>) {
        let ext = addext.map(|e| format!(" -addext {e}")).unwrap_or_default();
        self.sh(&format!(
            "openssl req -new -x509 -days 365 -nodes -text -out {name}.crt -keyout {name}.key -subj /CN={cn}{ext}"
        ));
    }

    /// A CA (`<ca>.crt`, PostgreSQL's recipe for a root) and a leaf it signs
    /// (`<leaf>.crt`, `<leaf>.key`) for `cn`, with the extensions `ext` (version 3).
    fn ca_and_leaf(&self, ca: &str, leaf: &str, cn: &str, ext: &str) {
        self.self_signed(ca, &format!("{ca}.pgjet.test"), None);
        fs::write(self.path(&format!("{leaf}.ext")), ext).unwrap();
        self.sh(&format!(
            "openssl req -new -nodes -text -out {leaf}.csr -keyout {leaf}.key -subj /CN={cn}"
        ));
        self.sh(&format!(
            "openssl x509 -req -in {leaf}.csr -text -days 365 -CA {ca}.crt -CAkey {ca}.key \
             -CAcreateserial -extfile {leaf}.ext -out {leaf}.crt"
        ));
    }

    /// A self-signed certificate like [`Pki::self_signed`]'s (`CA:TRUE`) that was valid in
    /// January 2020 only: OpenSSL 3.0 (Debian 12) has no `-not_after` for `req`/`x509`, so
    /// `openssl ca -selfsign` with `-startdate`/`-enddate` makes it.
    fn expired_self_signed(&self, name: &str, cn: &str, san: Option<&str>) {
        let d = format!("{name}-ca");
        fs::create_dir_all(self.path(&d)).unwrap();
        let san = san
            .map(|s| format!("subjectAltName = {s}\n"))
            .unwrap_or_default();
        fs::write(
            self.path(&format!("{d}/ca.cnf")),
            format!(
                "[ca]\ndefault_ca = past\n[past]\ndatabase = index.txt\nnew_certs_dir = .\n\
                 serial = serial.txt\ndefault_md = sha256\npolicy = anything\nx509_extensions = ext\n\
                 [anything]\ncommonName = supplied\n\
                 [ext]\nbasicConstraints = critical,CA:TRUE\nsubjectKeyIdentifier = hash\n{san}"
            ),
        )
        .unwrap();
        fs::write(self.path(&format!("{d}/index.txt")), "").unwrap();
        fs::write(self.path(&format!("{d}/serial.txt")), "01\n").unwrap();
        self.sh(&format!(
            "cd {d} && openssl req -new -nodes -keyout ../{name}.key -out {name}.csr -subj /CN={cn} && \
             openssl ca -batch -notext -config ca.cnf -selfsign -keyfile ../{name}.key -in {name}.csr \
             -startdate 20200101000000Z -enddate 20200201000000Z -out ../{name}.crt"
        ));
    }

    /// Makes everything readable by postgres (pgjet and psql run as postgres).
    fn share(&self) {
        chown_pg_recursive(&self.dir.path);
    }
}

/// What the hint of a TLS refusal must not say: the connection hint for a stopped cluster.
const NOT_RUNNING_HINT: &str = "is the cluster running";

// ------------------------------------------------------------------------------------------
// libpq

/// A PostgreSQL 15 cluster with `ssl = on` on 127.0.0.1 (hostssl, trust), serving the
/// certificate given to [`TlsServer::serve`].
struct TlsServer {
    cluster: Cluster,
}

impl TlsServer {
    fn new() -> TlsServer {
        let cluster = Cluster::new(&Pg::v15(), "tls-libpq");
        fs::write(
            cluster.data().join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        )
        .unwrap();
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(cluster.data().join("postgresql.conf"))
            .unwrap();
        std::io::Write::write_all(
            &mut f,
            b"\nlisten_addresses = '127.0.0.1'\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n",
        )
        .unwrap();
        TlsServer { cluster }
    }

    /// Installs `crt`/`key` as the server's certificate and restarts the server.
    fn serve(&self, crt: &Path, key: &Path) {
        let data = self.cluster.data();
        fs::copy(crt, data.join("server.crt")).unwrap();
        fs::copy(key, data.join("server.key")).unwrap();
        chown_pg_recursive(&data.join("server.crt"));
        chown_pg_recursive(&data.join("server.key"));
        fs::set_permissions(
            data.join("server.key"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let s = &self.cluster.server;
        let restart = args![
            "restart",
            "-w",
            "-t",
            "60",
            "-D",
            data.display(),
            "-l",
            s.log.display(),
            "-o",
            format!("-p {} -k {}", s.port, s.sock.display())
        ];
        run_as_postgres(&s.pg.tool("pg_ctl"), &restart, None).ok();
    }

    /// The connection string for host `host` (and `hostaddr`), verify-full against `root`.
    fn conninfo(&self, host: &str, root: &Path) -> String {
        format!(
            "host={host} hostaddr=127.0.0.1 port={} user=postgres dbname=postgres sslmode=verify-full sslrootcert={}",
            self.cluster.port(),
            root.display()
        )
    }

    /// `pgjet check --source <conninfo>` and whether psql connects with the same string.
    fn try_both(&self, conninfo: &str) -> (Run, bool) {
        let r = pgjet(&["--source", conninfo, "check"]);
        let psql = run_as_postgres(
            &self.cluster.pg().tool("psql"),
            &["-X", "-At", "-d", conninfo, "-c", "SELECT 1"],
            None,
        );
        (r, psql.success())
    }

    /// pgjet and psql both connect.
    fn accepted(&self, what: &str, conninfo: &str) {
        let (r, psql) = self.try_both(conninfo);
        assert!(psql, "{what}: psql (libpq, OpenSSL) must connect");
        assert!(
            r.success() && r.stdout.contains("connected to"),
            "{what}: pgjet must connect as psql does:\n{r}"
        );
        // check says what the connection is, as the server sees it.
        if let Some(mode) = conninfo
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("sslmode="))
            .filter(|m| *m != "disable")
        {
            assert!(
                r.stdout.contains(&format!(", sslmode={mode})"))
                    && r.stdout.contains("(TLS TLSv1."),
                "{what}: check must say the session is TLS with sslmode={mode}:\n{r}"
            );
        }
        step!("{what}: accepted, as by psql");
    }

    /// pgjet and psql both refuse; pgjet's message holds `message` and its hint `hint`.
    fn refused(&self, what: &str, conninfo: &str, message: &str, hint: &str) -> Run {
        let (r, psql) = self.try_both(conninfo);
        assert!(!psql, "{what}: psql (libpq, OpenSSL) must refuse");
        assert_eq!(r.status.code(), Some(3), "{what}: a connection error:\n{r}");
        let (msg, hint_line) = split_hint(&r);
        assert!(
            msg.contains(message),
            "{what}: the message must contain {message:?}:\n{r}"
        );
        assert!(
            hint_line.contains(hint) && !hint_line.contains(NOT_RUNNING_HINT),
            "{what}: the hint must be about TLS and contain {hint:?}:\n{r}"
        );
        step!("{what}: refused, as by psql: {msg} / {hint_line}");
        r
    }
}

/// The error line(s) and the HINT line of a failed run.
fn split_hint(r: &Run) -> (String, String) {
    let hint = r
        .stderr
        .lines()
        .find(|l| l.starts_with("HINT:"))
        .unwrap_or_else(|| panic!("no HINT line:\n{r}"))
        .to_string();
    let msg = r
        .stderr
        .lines()
        .filter(|l| !l.starts_with("HINT:"))
        .collect::<Vec<_>>()
        .join("\n");
    (msg, hint)
}

#[test]
fn tls_libpq_trust_follows_openssl() {
    let pki = Pki::new("tls-libpq-pki");
    // PostgreSQL's recipes word for word: CN only, no subjectAltName.
    pki.self_signed("self", "127.0.0.1", None);
    pki.self_signed("stranger", "127.0.0.1", None);
    pki.ca_and_leaf("root", "leaf", "127.0.0.1", "basicConstraints=CA:FALSE\n");
    pki.ca_and_leaf(
        "otherca",
        "otherleaf",
        "127.0.0.1",
        "basicConstraints=CA:FALSE\n",
    );
    pki.expired_self_signed("expired", "127.0.0.1", None);
    pki.share();
    let srv = TlsServer::new();
    let p = |n: &str| pki.path(n);

    // A self-signed certificate as its own root: accepted; the host name still counts (the
    // CN, as the certificate has no subjectAltName); another self-signed one is no root.
    srv.serve(&p("self.crt"), &p("self.key"));
    srv.accepted(
        "self-signed as its own root",
        &srv.conninfo("127.0.0.1", &p("self.crt")),
    );
    srv.refused(
        "self-signed, wrong host name",
        &srv.conninfo("localhost", &p("self.crt")),
        "not valid for name \"localhost\"",
        "host name",
    );
    srv.refused(
        "self-signed, another self-signed certificate as root",
        &srv.conninfo("127.0.0.1", &p("stranger.crt")),
        "is self-signed and is not in",
        "sslrootcert",
    );

    // A CA and its leaf: accepted; wrong name and another CA refused.
    srv.serve(&p("leaf.crt"), &p("leaf.key"));
    srv.accepted("CA and leaf", &srv.conninfo("127.0.0.1", &p("root.crt")));
    srv.refused(
        "CA and leaf, wrong host name",
        &srv.conninfo("localhost", &p("root.crt")),
        "not valid for name \"localhost\"",
        "host name",
    );
    srv.refused(
        "CA and leaf, another CA",
        &srv.conninfo("127.0.0.1", &p("otherca.crt")),
        "issued by \"CN=root.pgjet.test\"",
        "sslrootcert",
    );

    // Expired, though given as its own root.
    srv.serve(&p("expired.crt"), &p("expired.key"));
    srv.refused(
        "expired self-signed as its own root",
        &srv.conninfo("127.0.0.1", &p("expired.crt")),
        "certificate expired",
        "expired on 2020-02-01",
    );
}

/// Client certificates, PostgreSQL's recipe ("Creating Certificates", "Certificate
/// Authentication"): the server trusts a CA (`ssl_ca_file`) and pg_hba.conf says `cert`, so
/// the client's certificate, signed by that CA, must carry the user's name as its CN. With
/// `sslcert`/`sslkey` pgjet connects as psql does; without them the server refuses both; a
/// key file others may read is refused by both before the server is asked (libpq's rule).
#[test]
fn tls_libpq_client_certificate() {
    let pki = Pki::new("tls-client-pki");
    pki.ca_and_leaf("root", "server", "127.0.0.1", "basicConstraints=CA:FALSE\n");
    // The client's leaf, signed by the same CA, named for the database user.
    fs::write(pki.path("client.ext"), "basicConstraints=CA:FALSE\n").unwrap();
    pki.sh("openssl req -new -nodes -text -out client.csr -keyout client.key -subj /CN=postgres");
    pki.sh(
        "openssl x509 -req -in client.csr -text -days 365 -CA root.crt -CAkey root.key \
         -CAcreateserial -extfile client.ext -out client.crt",
    );
    pki.sh("cp client.key open.key && chmod 0644 open.key && chmod 0600 client.key");
    pki.share();
    let srv = TlsServer::new();
    let data = srv.cluster.data();
    fs::copy(pki.path("root.crt"), data.join("root.crt")).unwrap();
    chown_pg_recursive(&data.join("root.crt"));
    fs::write(
        data.join("pg_hba.conf"),
        "local all all trust\nhostssl all all 127.0.0.1/32 cert\n",
    )
    .unwrap();
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(data.join("postgresql.conf"))
        .unwrap();
    std::io::Write::write_all(&mut f, b"ssl_ca_file = 'root.crt'\n").unwrap();
    srv.serve(&pki.path("server.crt"), &pki.path("server.key"));
    let p = |n: &str| pki.path(n).display().to_string();
    let base = srv.conninfo("127.0.0.1", &pki.path("root.crt"));
    let with = |key: &str| format!("{base} sslcert={} sslkey={}", p("client.crt"), p(key));

    srv.accepted("client certificate and key", &with("client.key"));
    let (r, psql) = srv.try_both(&base);
    assert!(!psql, "no client certificate: psql must be refused");
    assert!(
        !r.success(),
        "no client certificate: pgjet must be refused:\n{r}"
    );
    let (msg, hint) = split_hint(&r);
    assert!(
        msg.contains("requires a valid client certificate"),
        "no client certificate: the server's reason must be shown:\n{r}"
    );
    assert!(
        hint.contains("sslcert") && !hint.contains(NOT_RUNNING_HINT),
        "no client certificate: the hint must name sslcert, not a stopped cluster:\n{r}"
    );
    step!(
        "no client certificate: refused by the server, as psql is: {}",
        r.stderr.trim()
    );
    let (r, psql) = srv.try_both(&with("open.key"));
    assert!(!psql, "a key file others may read: psql must refuse it");
    assert!(
        !r.success() && r.stderr.contains("group or world access"),
        "a key file others may read: pgjet must refuse it as libpq does:\n{r}"
    );
    step!(
        "a key file others may read: refused, as by psql: {}",
        r.stderr.trim()
    );
}

// ------------------------------------------------------------------------------------------
// Object stores

/// `pgjet info` on an S3 repository of `s3` with `repo1-storage-ca-file` = `ca` and the
/// endpoint `host`, and whether curl (OpenSSL) connects to the same server with `--cacert`.
fn s3_try_both(s3: &StoreServer, name: &str, host: &str, ca: &Path) -> (Run, bool) {
    let conf = s3.config_file(
        name,
        "/r",
        &[
            ("repo1-storage-ca-file", &ca.display().to_string()),
            ("repo1-s3-endpoint", host),
        ],
    );
    let info = args!["info", "--config", conf.display()];
    let r = pgjet(&info);
    let curl = std::process::Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "--cacert"])
        .arg(ca)
        .arg(format!("https://{host}:{}/", s3.port))
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run curl");
    (r, curl.success())
}

/// Restarts versitygw with `crt`/`key` as its certificate.
fn s3_serve(s3: &mut StoreServer, crt: &Path, key: &Path) {
    s3.stop();
    fs::copy(crt, s3.dir.join("server.crt")).unwrap();
    fs::copy(key, s3.dir.join("server.key")).unwrap();
    s3.resume();
}

fn s3_accepted(s3: &StoreServer, what: &str, host: &str, ca: &Path) {
    let (r, curl) = s3_try_both(s3, &format!("{}.conf", what.replace(' ', "-")), host, ca);
    assert!(curl, "{what}: curl (OpenSSL) must connect");
    assert!(
        r.success(),
        "{what}: pgjet must open the repository as curl connects:\n{r}"
    );
    step!("{what}: accepted, as by curl");
}

fn s3_refused(s3: &StoreServer, what: &str, host: &str, ca: &Path, message: &str, hint: &str) {
    let (r, curl) = s3_try_both(s3, &format!("{}.conf", what.replace(' ', "-")), host, ca);
    assert!(!curl, "{what}: curl (OpenSSL) must refuse");
    assert_eq!(r.status.code(), Some(4), "{what}: a storage refusal:\n{r}");
    let (msg, hint_line) = split_hint(&r);
    assert!(
        msg.contains(message),
        "{what}: the message must contain {message:?}:\n{r}"
    );
    assert!(
        hint_line.contains(hint),
        "{what}: the hint must contain {hint:?}:\n{r}"
    );
    step!("{what}: refused, as by curl: {msg} / {hint_line}");
}

#[test]
fn tls_s3_trust_follows_openssl() {
    let pki = Pki::new("tls-s3-pki");
    let san = "subjectAltName=IP:127.0.0.1";
    pki.self_signed("self", "127.0.0.1", Some(san));
    pki.self_signed("stranger", "127.0.0.1", Some(san));
    let leaf_ext = "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\n";
    pki.ca_and_leaf("root", "leaf", "127.0.0.1", leaf_ext);
    pki.ca_and_leaf("otherca", "otherleaf", "127.0.0.1", leaf_ext);
    pki.expired_self_signed("expired", "127.0.0.1", Some("IP:127.0.0.1"));
    pki.share();
    let p = |n: &str| pki.path(n);
    let mut s3 = StoreServer::start(StoreKind::S3, "tls-s3");

    s3_serve(&mut s3, &p("self.crt"), &p("self.key"));
    s3_accepted(
        &s3,
        "self-signed as its own root",
        "127.0.0.1",
        &p("self.crt"),
    );
    s3_refused(
        &s3,
        "self-signed, wrong host name",
        "localhost",
        &p("self.crt"),
        "not valid for name \"localhost\"",
        "subjectAltName",
    );
    s3_refused(
        &s3,
        "self-signed, another self-signed certificate as CA file",
        "127.0.0.1",
        &p("stranger.crt"),
        "is self-signed and is not in",
        "repo-storage-ca-file",
    );

    s3_serve(&mut s3, &p("leaf.crt"), &p("leaf.key"));
    s3_accepted(&s3, "CA and leaf", "127.0.0.1", &p("root.crt"));
    s3_refused(
        &s3,
        "CA and leaf, wrong host name",
        "localhost",
        &p("root.crt"),
        "not valid for name \"localhost\"",
        "subjectAltName",
    );
    s3_refused(
        &s3,
        "CA and leaf, another CA",
        "127.0.0.1",
        &p("otherca.crt"),
        "issued by \"CN=root.pgjet.test\"",
        "repo-storage-ca-file",
    );

    s3_serve(&mut s3, &p("expired.crt"), &p("expired.key"));
    s3_refused(
        &s3,
        "expired self-signed as its own root",
        "127.0.0.1",
        &p("expired.crt"),
        "expired on 2020-02-01",
        "renew the store's certificate",
    );
}
