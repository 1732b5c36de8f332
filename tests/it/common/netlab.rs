//! The network lab for integration tests and benchmarks: two hosts (network namespaces `a`,
//! the primary's, and `b`, the destination) joined by a wire namespace with a real rate limit
//! (tc tbf) and a real round-trip time (the TUN delay line `pgjet-delayline`). It wraps
//! scripts/netlab.sh; docs/netlab.md describes the topology.
//!
//! ```ignore
//! let lab = NetLab::up(Some("200mbit"), 20.0);      // 200 Mbit/s each way, 20 ms RTT
//! let out = lab.exec(&lab.ns_b, "ping", &["-c1", &lab.addr_a.to_string()]);
//! let server = lab.spawn(&lab.ns_a, "iperf3", &["-s", "-B", &lab.addr_a.to_string()]);
//! let t = lab.spawn_thread(&lab.ns_b, move || std::net::TcpStream::connect(addr));
//! let (rx, tx) = lab.iface_bytes(&lab.ns_b);          // bytes through b's link
//! drop(lab);                                          // namespaces gone, delay line stopped
//! ```
//!
//! Everything runs as root (the test suite does). Each lab has a prefix unique to this process
//! and a counter (`pj<pid>n<k>`), so tests may build several labs at once. Labs are torn down
//! on drop and, as a safety net for one kept in a static or leaked by a panic in a thread, by
//! an `atexit` handler.

use std::ffi::OsStr;
use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// scripts/netlab.sh of this checkout.
pub const NETLAB_SH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/netlab.sh");
/// The delay line binary cargo built for this test run.
pub const DELAYLINE_BIN: &str = env!("CARGO_BIN_EXE_pgjet-delayline");
/// The interface name of each host's end of the link, in both `a` and `b`.
pub const HOST_IFACE: &str = "lab0";
/// Upper bound for `netlab.sh up` / `down` (seconds): they take well under a second normally.
const SCRIPT_TIMEOUT_S: u64 = 60;

static COUNTER: AtomicUsize = AtomicUsize::new(0);
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());
static ATEXIT: Once = Once::new();

extern "C" fn down_all_at_exit() {
    let prefixes = match LIVE.lock() {
        Ok(mut l) => std::mem::take(&mut *l),
        Err(_) => return,
    };
    for p in prefixes {
        let _ = script(&["down", &p], &[]);
    }
}

fn script(args: &[&str], env: &[(&str, String)]) -> std::io::Result<Output> {
    let mut c = Command::new("timeout");
    c.arg(SCRIPT_TIMEOUT_S.to_string())
        .arg("bash")
        .arg(NETLAB_SH)
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.env("DELAYLINE", DELAYLINE_BIN)
        .stdin(Stdio::null())
        .output()
}

/// A running lab. Fields are the names and addresses the tests need; `Drop` runs
/// `netlab.sh down`, which stops the delay line by PID, stops by PID anything still running
/// in the three namespaces, and deletes them.
#[derive(Debug)]
pub struct NetLab {
    /// Prefix of the namespace names (`<prefix>a`, `<prefix>b`, `<prefix>w`).
    pub prefix: String,
    /// 0..=255: the third octet of the lab's addresses (198.18.<id>.0/29).
    pub id: u8,
    /// Host A (the primary's side).
    pub ns_a: String,
    /// Host B (the destination side).
    pub ns_b: String,
    /// The wire in between (forwarding, tbf, the delay line).
    pub ns_wire: String,
    /// Host A's address on its link (198.18.<id>.2).
    pub addr_a: Ipv4Addr,
    /// Host B's address on its link (198.18.<id>.6).
    pub addr_b: Ipv4Addr,
    /// tc rate of the wire in each direction (e.g. "1gbit"); None = unshaped.
    pub rate: Option<String>,
    /// Round-trip time added by the wire, in milliseconds (0 = no delay line).
    pub rtt_ms: f64,
    /// PID of the delay line (in the wire namespace), when rtt_ms > 0.
    pub delayline_pid: Option<u32>,
    down: bool,
}

impl NetLab {
    /// Builds a lab with `rate` (tc syntax: "1gbit", "200mbit"; None = unshaped) and `rtt_ms`
    /// of round-trip time (0 = none). Panics with netlab.sh's output if it cannot be built
    /// (tests want a loud failure); see [`NetLab::try_up`].
    pub fn up(rate: Option<&str>, rtt_ms: f64) -> NetLab {
        match NetLab::try_up(rate, rtt_ms) {
            Ok(l) => l,
            Err(e) => panic!("network lab: {e}"),
        }
    }

    /// As [`NetLab::up`], returning the error text (netlab.sh's stderr) instead of panicking.
    pub fn try_up(rate: Option<&str>, rtt_ms: f64) -> Result<NetLab, String> {
        if !rtt_ms.is_finite() || rtt_ms < 0.0 {
            return Err(format!("rtt_ms must be >= 0, got {rtt_ms}"));
        }
        let k = COUNTER.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let prefix = format!("pj{pid}n{k}");
        let id = ((pid as usize).wrapping_mul(16).wrapping_add(k) % 256) as u8;
        ATEXIT.call_once(|| {
            // SAFETY: registering a plain extern "C" fn with no arguments.
            unsafe { libc::atexit(down_all_at_exit) };
        });
        if let Ok(mut l) = LIVE.lock() {
            l.push(prefix.clone());
        }
        let env = vec![
            ("RATE", rate.unwrap_or("").to_string()),
            ("RTT_MS", format!("{rtt_ms}")),
            ("CI", "true".to_string()),
        ];
        let id_s = id.to_string();
        let out = script(&["up", &prefix, &id_s], &env)
            .map_err(|e| format!("cannot run {NETLAB_SH}: {e}"))?;
        if !out.status.success() {
            let _ = script(&["down", &prefix], &[]);
            forget(&prefix);
            return Err(format!(
                "netlab.sh up {prefix} {id} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let get = |k: &str| -> Result<String, String> {
            text.lines()
                .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
                .map(str::to_string)
                .ok_or_else(|| format!("netlab.sh up printed no {k}: {text}"))
        };
        let ip = |k: &str| -> Result<Ipv4Addr, String> {
            let v = get(k)?;
            v.parse()
                .map_err(|_| format!("{k}={v} is not an IPv4 address"))
        };
        let lab = NetLab {
            prefix: prefix.clone(),
            id,
            ns_a: get("NETLAB_NS_A")?,
            ns_b: get("NETLAB_NS_B")?,
            ns_wire: get("NETLAB_NS_WIRE")?,
            addr_a: ip("NETLAB_ADDR_A")?,
            addr_b: ip("NETLAB_ADDR_B")?,
            rate: rate.filter(|r| !r.is_empty()).map(str::to_string),
            rtt_ms,
            delayline_pid: get("NETLAB_DELAYLINE_PID")?.parse().ok(),
            down: false,
        };
        Ok(lab)
    }

    /// `ip netns exec <ns> <program>`: a Command running inside namespace `ns` (add args,
    /// env, stdio as usual). Note that `ip netns exec` also gives the program a private mount
    /// namespace with that network namespace's /sys.
    pub fn command<S: AsRef<OsStr>>(&self, ns: &str, program: S) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(program);
        c
    }

    /// As [`NetLab::command`], in a new mount namespace where each directory of `hidden` is
    /// covered by an empty tmpfs: a process there cannot take a local shortcut to the source's
    /// files (the project's convention for a test of a network path: docs/netlab.md).
    pub fn command_hiding<S: AsRef<OsStr>>(
        &self,
        ns: &str,
        hidden: &[&Path],
        program: S,
    ) -> Command {
        let mut script = String::from("set -e; mount --make-rprivate / ; ");
        for (i, _) in hidden.iter().enumerate() {
            script.push_str(&format!(
                "mount -t tmpfs -o size=1m,mode=0755 pgjet-hidden \"${{{}}}\"; ",
                i + 1
            ));
        }
        script.push_str(&format!("shift {}; exec \"$@\"", hidden.len()));
        let mut c = Command::new("ip");
        c.args([
            "netns", "exec", ns, "unshare", "-m", "--", "sh", "-c", &script, "sh",
        ]);
        for h in hidden {
            c.arg(h);
        }
        c.arg(program);
        c
    }

    /// Runs `program args` in namespace `ns` to completion (stdin closed) and returns its
    /// output; panics only if it cannot be started.
    pub fn exec<S: AsRef<OsStr>>(&self, ns: &str, program: &str, args: &[S]) -> Output {
        self.command(ns, program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("ip netns exec {ns} {program}: cannot start: {e}"))
    }

    /// Starts `program args` in namespace `ns` in the background (stdin closed, output
    /// discarded); the returned guard kills it by PID when dropped.
    pub fn spawn<S: AsRef<OsStr>>(&self, ns: &str, program: &str, args: &[S]) -> NsProcess {
        let child = self
            .command(ns, program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("ip netns exec {ns} {program}: cannot start: {e}"));
        NsProcess { child }
    }

    /// Runs `f` on a new thread that has first joined network namespace `ns` (setns(2) on
    /// /run/netns/<ns>): std::net sockets it opens live in that namespace. Only this thread
    /// changes namespace; it ends when `f` returns. Panics in the thread if `ns` cannot be
    /// joined.
    pub fn spawn_thread<T, F>(&self, ns: &str, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let ns = ns.to_string();
        std::thread::spawn(move || {
            enter_netns(&ns).unwrap_or_else(|e| panic!("{e}"));
            f()
        })
    }

    /// (rx_bytes, tx_bytes) of the host's link interface (lab0) in namespace `ns` (`ns_a` or
    /// `ns_b`), from /sys/class/net/lab0/statistics inside that namespace.
    pub fn iface_bytes(&self, ns: &str) -> (u64, u64) {
        self.iface_bytes_of(ns, HOST_IFACE)
    }

    /// (rx_bytes, tx_bytes) of interface `iface` in namespace `ns` (e.g. the wire's "wa",
    /// "wb" or "dl0").
    pub fn iface_bytes_of(&self, ns: &str, iface: &str) -> (u64, u64) {
        let rx = format!("/sys/class/net/{iface}/statistics/rx_bytes");
        let tx = format!("/sys/class/net/{iface}/statistics/tx_bytes");
        let out = self.exec(ns, "cat", &[&rx, &tx]);
        assert!(
            out.status.success(),
            "reading {iface} counters in {ns}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text.split_whitespace().map(|v| v.parse::<u64>());
        match (it.next(), it.next()) {
            (Some(Ok(r)), Some(Ok(t))) => (r, t),
            _ => panic!("unexpected counters for {iface} in {ns}: {text:?}"),
        }
    }

    /// Whether namespace `ns` still exists (/run/netns/<ns>).
    pub fn ns_exists(ns: &str) -> bool {
        Path::new("/run/netns").join(ns).exists()
    }

    /// Tears the lab down now (idempotent; Drop calls it). Panics if netlab.sh down fails.
    pub fn down(&mut self) {
        if self.down {
            return;
        }
        self.down = true;
        forget(&self.prefix);
        match script(&["down", &self.prefix], &[]) {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "netlab.sh down {} failed ({}): {}",
                self.prefix,
                o.status,
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("cannot run netlab.sh down {}: {e}", self.prefix),
        }
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        self.down();
    }
}

fn forget(prefix: &str) {
    if let Ok(mut l) = LIVE.lock() {
        l.retain(|p| p != prefix);
    }
}

/// Moves the calling thread into network namespace `ns` (by /run/netns/<ns>).
pub fn enter_netns(ns: &str) -> Result<(), String> {
    let path = Path::new("/run/netns").join(ns);
    let f = fs::File::open(&path).map_err(|e| format!("open {}: {e}", path.display()))?;
    use std::os::fd::AsRawFd;
    // SAFETY: setns(2) on a descriptor we own; affects only the calling thread.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if r != 0 {
        return Err(format!(
            "setns({}): {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// A background process started in a namespace by [`NetLab::spawn`]; killed by PID (SIGTERM,
/// then SIGKILL after 2 s) and reaped on drop.
pub struct NsProcess {
    pub child: Child,
}

impl NsProcess {
    /// PID of the process (`ip netns exec` execs the program, so this is the program's PID).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops it now: SIGTERM, then SIGKILL if still alive after 2 s; waits for it.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SAFETY: kill(2) on the PID of our own unreaped child (it cannot be reused yet).
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(2) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NsProcess {
    fn drop(&mut self) {
        self.stop();
    }
}
