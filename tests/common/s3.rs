//! A real S3 server for tests: versitygw serving a posix directory, with TLS from a test CA,
//! listening on 127.0.0.1 only. Started by the test, stopped by PID when dropped.
//!
//! scripts/install-deps.sh installs versitygw (`go install
//! github.com/versity/versitygw/cmd/versitygw@v1.8.0`) into /usr/local/bin.
use super::*;
use std::process::Child;

/// Access key and secret of the test server.
pub const S3_KEY: &str = "pgjettestkey";
pub const S3_SECRET: &str = "pgjet-test-secret-0123456789";
/// The bucket every test server starts with.
pub const S3_BUCKET: &str = "pgjet";

/// Path of the versitygw binary: $PGJET_VERSITYGW, /usr/local/bin/versitygw, ~/go/bin/versitygw.
pub fn versitygw_bin() -> PathBuf {
    let candidates = [
        std::env::var("PGJET_VERSITYGW").ok().map(PathBuf::from),
        Some(PathBuf::from("/usr/local/bin/versitygw")),
        std::env::var("HOME")
            .ok()
            .map(|h| PathBuf::from(h).join("go/bin/versitygw")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.exists())
        .expect("versitygw is not installed: run scripts/install-deps.sh")
}

/// A versitygw server over TLS on 127.0.0.1.
pub struct S3Server {
    pub port: u16,
    /// The server's files (`<dir>/data/<bucket>/...`), its TLS material and its log.
    pub dir: Scratch,
    /// The CA certificate that signed the server's certificate (readable by postgres).
    pub ca: PathBuf,
    child: Option<Child>,
}

impl S3Server {
    /// Starts a server with an empty bucket [`S3_BUCKET`]; waits until it answers.
    pub fn start(tag: &str) -> S3Server {
        let dir = Scratch::new(&format!("{tag}-s3"));
        let sh = |cmd: &str| {
            let out = Command::new("sh")
                .arg("-c")
                .arg(format!("cd {} && {cmd}", dir.path.display()))
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{cmd}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        sh("openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=pgjet-s3-test-ca 2>/dev/null");
        sh("printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext");
        sh("openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1 2>/dev/null");
        sh("openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile san.ext 2>/dev/null");
        fs::create_dir_all(dir.join(&format!("data/{S3_BUCKET}"))).unwrap();
        chown_pg_recursive(&dir.path);
        let mut s = S3Server {
            port: free_port(),
            ca: dir.join("ca.crt"),
            dir,
            child: None,
        };
        s.resume();
        s
    }

    /// Starts the server process again on the same port and directory (after [`S3Server::stop`]).
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "the S3 server runs already");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("versitygw.log"))
            .unwrap();
        let child = Command::new(versitygw_bin())
            .args([
                "--port",
                &format!("127.0.0.1:{}", self.port),
                "--access",
                S3_KEY,
                "--secret",
                S3_SECRET,
                "--cert",
                &self.dir.join("server.crt").display().to_string(),
                "--key",
                &self.dir.join("server.key").display().to_string(),
                "posix",
                &self.dir.join("data").display().to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start versitygw");
        self.child = Some(child);
        let port = self.port;
        let up = wait_for(Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        });
        assert!(
            up.is_some(),
            "versitygw did not listen on port {port}:\n{}",
            self.log_tail()
        );
    }

    /// Stops the server (SIGKILL by PID): requests fail until [`S3Server::resume`].
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe {
                libc::kill(c.id() as i32, libc::SIGKILL);
            }
            let _ = c.wait();
        }
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        let t = fs::read_to_string(self.dir.join("versitygw.log")).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Writes a config file (0600, owned by postgres) for repository 1 on this server, with
    /// `prefix` inside the bucket, and returns its path. `overrides` replace or add keys.
    pub fn config_file(&self, name: &str, prefix: &str, overrides: &[(&str, &str)]) -> PathBuf {
        let mut kv: Vec<(String, String)> = vec![
            ("repo1-type".into(), "s3".into()),
            ("repo1-path".into(), prefix.into()),
            ("repo1-s3-bucket".into(), S3_BUCKET.into()),
            ("repo1-s3-endpoint".into(), "127.0.0.1".into()),
            ("repo1-storage-port".into(), self.port.to_string()),
            ("repo1-s3-region".into(), "us-east-1".into()),
            ("repo1-s3-key".into(), S3_KEY.into()),
            ("repo1-s3-key-secret".into(), S3_SECRET.into()),
            ("repo1-s3-uri-style".into(), "path".into()),
            (
                "repo1-storage-ca-file".into(),
                self.ca.display().to_string(),
            ),
        ];
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

    /// Names of the objects below `prefix` in the bucket (from the server's directory).
    pub fn objects(&self, prefix: &str) -> Vec<String> {
        let base = self.dir.join(&format!("data/{S3_BUCKET}"));
        let mut out: Vec<String> = snapshot_tree(&base.join(prefix.trim_start_matches('/')))
            .keys()
            .filter(|k| !k.ends_with('/'))
            .cloned()
            .collect();
        out.sort();
        out
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}
