//! `pgjet-delayline`: a packet-level delay line on a TUN device, the stand-in for `netem delay`
//! in pgjet's network lab (scripts/netlab.sh, docs/netlab.md).
//!
//! It creates (or attaches to) a TUN device (`IFF_TUN | IFF_NO_PI`, via `ioctl(TUNSETIFF)` on
//! `/dev/net/tun`), brings it up, and then reads every packet the kernel routes into it, holds
//! it for `--delay-ms` milliseconds (the one-way delay) and writes it back into the same
//! device. A packet written to a TUN device is received by the kernel as if it had arrived on
//! that interface, so it is routed onward by the namespace's routing table: with policy
//! routing that sends the traffic of each side into the TUN device, every packet crossing the
//! wire passes the delay line exactly once per direction.
//!
//! The queue is a byte ring (no allocation per packet) plus a FIFO of (due time, offset,
//! length); the loop waits in `ppoll(2)` with a nanosecond timeout until the next packet is
//! due or a new one arrives, and reads in bursts. The queue is bounded like a router's: a
//! packet that would take the queued bytes over `--limit-bytes` is dropped.
//!
//! With `--offload` the device is opened with `IFF_VNET_HDR` and `TUNSETOFFLOAD` (checksum,
//! TSO4, TSO6, TSO-ECN), so the kernel hands over TCP super-packets of up to 64 KiB with a
//! `virtio_net_hdr` in front instead of one packet per 1500-byte segment; the header is kept
//! and written back unchanged. This divides the number of system calls per byte by up to ~40
//! (see docs/netlab.md for the CPU measured with and without it).
//!
//! Exit: 0 after SIGTERM, SIGINT or SIGHUP (queued packets are discarded, the pid file is
//! removed, counters are printed on stderr); 2 on a usage error; 1 when the device cannot be
//! set up (the message says why: `/dev/net/tun` missing, not root / no CAP_NET_ADMIN, name in
//! use, ...) or on an I/O error of the device.
//!
//! Only std and libc; Linux only.

use std::collections::VecDeque;
use std::ffi::CString;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Default queue bound in bytes: 16 MiB. The bandwidth-delay product at 1 Gbit/s and 50 ms is
/// 125 MB/s × 0.050 s = 6.25 MB per direction; both directions share this queue, and the
/// reverse direction (ACKs) holds little, so 16 MiB leaves room for a 100 ms RTT at 1 Gbit/s.
const DEFAULT_LIMIT_BYTES: usize = 16 << 20;

/// Largest packet read from the device, in bytes: an IPv4/IPv6 GSO super-packet is at most
/// 64 KiB (without BIG TCP), plus the 10-byte `virtio_net_hdr` with `--offload`. A read that
/// fills the whole buffer is treated as truncated and dropped.
const MAX_PACKET: usize = 65536 + 64;

/// Packets read per burst before the due ones are written again (bounds the extra delay a
/// burst of arrivals can add to packets that are due).
const READ_BURST: usize = 64;

/// Longest accepted delay in milliseconds (one minute); anything longer is a typo.
const MAX_DELAY_MS: f64 = 60_000.0;

/// Timer slack asked of the kernel for our `ppoll` wake-ups, in nanoseconds (default is 50 µs).
const TIMER_SLACK_NS: libc::c_ulong = 5_000;

// <linux/if_tun.h>
const TUNSETIFF: libc::c_ulong = 0x4004_54ca; // _IOW('T', 202, int)
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0; // _IOW('T', 208, unsigned int)
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUN_F_CSUM: libc::c_uint = 0x01;
const TUN_F_TSO4: libc::c_uint = 0x02;
const TUN_F_TSO6: libc::c_uint = 0x04;
const TUN_F_TSO_ECN: libc::c_uint = 0x08;
/// Length of an interface name including the NUL (<linux/if.h> IFNAMSIZ).
const IFNAMSIZ: usize = 16;

/// `struct ifreq` as used by TUNSETIFF and SIOC[GS]IFFLAGS: the name and the flags member of
/// the union; the padding makes it the kernel's 40 bytes.
#[repr(C)]
struct IfReq {
    name: [u8; IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

const USAGE: &str = "\
usage: pgjet-delayline --delay-ms MS [--dev NAME] [--limit-bytes N] [--offload]
                       [--pid-file PATH] [--quiet]

Holds every packet routed into the TUN device NAME for MS milliseconds, then writes it back
into the same device (the kernel routes it onward). Run as root (CAP_NET_ADMIN).

  --delay-ms MS       one-way delay in milliseconds, 0..=60000, fractional allowed (required)
  --dev NAME          TUN device to create or attach to (default dl0, at most 15 bytes)
  --limit-bytes N     queue bound in bytes; packets beyond it are dropped (default 16777216)
  --offload           IFF_VNET_HDR + TUNSETOFFLOAD: TCP super-packets up to 64 KiB (less CPU)
  --pid-file PATH     written once the device is up (a readiness signal), removed at exit
  --quiet             do not print the counters on exit

Stops cleanly on SIGTERM, SIGINT or SIGHUP.";

/// The validated command line.
#[derive(Debug)]
struct Options {
    /// One-way delay.
    delay: Duration,
    /// TUN device name, 1..=15 bytes, no '/', no whitespace.
    dev: String,
    /// Queue bound in bytes.
    limit_bytes: usize,
    /// Use `IFF_VNET_HDR` + `TUNSETOFFLOAD`.
    offload: bool,
    pid_file: Option<PathBuf>,
    quiet: bool,
}

/// A usage error: the message is printed with the usage text, exit code 2.
struct UsageError(String);

fn parse_args(args: &[String]) -> Result<Option<Options>, UsageError> {
    let mut delay_ms: Option<f64> = None;
    let mut dev = "dl0".to_string();
    let mut limit_bytes = DEFAULT_LIMIT_BYTES;
    let mut offload = false;
    let mut pid_file = None;
    let mut quiet = false;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        // Accept both "--opt value" and "--opt=value".
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg, None),
        };
        let mut value = |what: &str| -> Result<String, UsageError> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            i += 1;
            args.get(i)
                .cloned()
                .ok_or_else(|| UsageError(format!("{name} needs a value ({what})")))
        };
        match name {
            "-h" | "--help" => return Ok(None),
            "--delay-ms" => {
                let v = value("milliseconds")?;
                let ms: f64 = v
                    .trim()
                    .parse()
                    .map_err(|_| UsageError(format!("--delay-ms: '{v}' is not a number")))?;
                if !ms.is_finite() || !(0.0..=MAX_DELAY_MS).contains(&ms) {
                    return Err(UsageError(format!(
                        "--delay-ms: {v} is out of range 0..={MAX_DELAY_MS}"
                    )));
                }
                delay_ms = Some(ms);
            }
            "--dev" => {
                let v = value("interface name")?;
                if v.is_empty()
                    || v.len() >= IFNAMSIZ
                    || v.bytes()
                        .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0)
                {
                    return Err(UsageError(format!(
                        "--dev: '{v}' is not a valid interface name (1..=15 bytes, no '/', ':' or spaces)"
                    )));
                }
                dev = v;
            }
            "--limit-bytes" => {
                let v = value("bytes")?;
                let n: usize = v
                    .trim()
                    .parse()
                    .map_err(|_| UsageError(format!("--limit-bytes: '{v}' is not a byte count")))?;
                if !(MAX_PACKET..=(4usize << 30)).contains(&n) {
                    return Err(UsageError(format!(
                        "--limit-bytes: {n} is out of range {MAX_PACKET}..=4294967296"
                    )));
                }
                limit_bytes = n;
            }
            "--offload" => {
                if inline.is_some() {
                    return Err(UsageError("--offload takes no value".into()));
                }
                offload = true;
            }
            "--pid-file" => pid_file = Some(PathBuf::from(value("path")?)),
            "--quiet" => quiet = true,
            other => return Err(UsageError(format!("unknown argument '{other}'"))),
        }
        i += 1;
    }
    let delay_ms = delay_ms.ok_or_else(|| UsageError("--delay-ms is required".into()))?;
    Ok(Some(Options {
        delay: Duration::from_secs_f64(delay_ms / 1000.0),
        dev,
        limit_bytes,
        offload,
        pid_file,
        quiet,
    }))
}

/// A runtime error with what failed and a hint; exit code 1.
struct Error {
    what: String,
    source: io::Error,
    hint: Option<&'static str>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.source)?;
        if let Some(h) = self.hint {
            write!(f, "\nHINT: {h}")?;
        }
        Ok(())
    }
}

fn err(what: impl Into<String>, source: io::Error, hint: Option<&'static str>) -> Error {
    Error {
        what: what.into(),
        source,
        hint,
    }
}

const HINT_PRIV: &str = "run as root (the device needs CAP_NET_ADMIN in its network namespace)";

/// An owned file descriptor closed on drop.
struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: the descriptor is owned by this value and closed once.
        unsafe { libc::close(self.0) };
    }
}

fn ifreq(name: &str) -> IfReq {
    let mut r = IfReq {
        name: [0; IFNAMSIZ],
        flags: 0,
        _pad: [0; 22],
    };
    // The name was validated to be at most IFNAMSIZ-1 bytes, so the NUL stays.
    r.name[..name.len()].copy_from_slice(name.as_bytes());
    r
}

/// Opens `/dev/net/tun`, attaches it to the TUN device `opts.dev` (created if absent; removed
/// by the kernel when this process exits), sets the offloads, and brings the interface up.
///
/// Errors: `/dev/net/tun` missing (no tun module), permission denied (not root), device busy
/// (another process holds it) or an interface of that name that is not a TUN device.
fn open_tun(opts: &Options) -> Result<Fd, Error> {
    let path = CString::new("/dev/net/tun").expect("static path has no NUL");
    // SAFETY: plain open(2) of a NUL-terminated path.
    let raw = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if raw < 0 {
        let e = io::Error::last_os_error();
        let hint = match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENXIO) | Some(libc::ENODEV) => Some(
                "the TUN driver is not available: load it (modprobe tun) or create the node \
                 (mkdir -p /dev/net && mknod /dev/net/tun c 10 200)",
            ),
            Some(libc::EACCES) | Some(libc::EPERM) => Some(HINT_PRIV),
            _ => None,
        };
        return Err(err("cannot open /dev/net/tun", e, hint));
    }
    let fd = Fd(raw);
    let mut req = ifreq(&opts.dev);
    req.flags = IFF_TUN | IFF_NO_PI | if opts.offload { IFF_VNET_HDR } else { 0 };
    // SAFETY: TUNSETIFF reads and writes a struct ifreq, which IfReq mirrors (40 bytes).
    if unsafe { libc::ioctl(fd.0, TUNSETIFF as _, &mut req as *mut IfReq) } < 0 {
        let e = io::Error::last_os_error();
        let hint = match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => Some(HINT_PRIV),
            Some(libc::EBUSY) => Some("another process holds this TUN device: pick another --dev"),
            Some(libc::EINVAL) => Some("an interface of this name exists and is not a TUN device"),
            _ => None,
        };
        return Err(err(
            format!("cannot attach TUN device {}", opts.dev),
            e,
            hint,
        ));
    }
    if opts.offload {
        let flags = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
        // SAFETY: TUNSETOFFLOAD takes the flags as the ioctl's integer argument.
        if unsafe { libc::ioctl(fd.0, TUNSETOFFLOAD as _, flags as libc::c_ulong) } < 0 {
            let e = io::Error::last_os_error();
            return Err(err(format!("cannot set offloads on {}", opts.dev), e, None));
        }
    }
    set_up(&opts.dev)?;
    Ok(fd)
}

/// Sets IFF_UP on interface `name` (SIOCGIFFLAGS then SIOCSIFFLAGS on a datagram socket).
fn set_up(name: &str) -> Result<(), Error> {
    // SAFETY: socket(2) with constant arguments.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(err(
            "cannot open a socket to set the device up",
            io::Error::last_os_error(),
            None,
        ));
    }
    let s = Fd(s);
    let mut req = ifreq(name);
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read/write the flags of a struct ifreq.
    unsafe {
        if libc::ioctl(s.0, libc::SIOCGIFFLAGS as _, &mut req as *mut IfReq) < 0 {
            return Err(err(
                format!("cannot read the flags of {name}"),
                io::Error::last_os_error(),
                None,
            ));
        }
        req.flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(s.0, libc::SIOCSIFFLAGS as _, &mut req as *mut IfReq) < 0 {
            return Err(err(
                format!("cannot set {name} up"),
                io::Error::last_os_error(),
                Some(HINT_PRIV),
            ));
        }
    }
    Ok(())
}

/// Set by the signal handler; the main loop sees it after `ppoll` returns EINTR.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// Blocks the stop signals (so they are only delivered inside `ppoll`, which avoids the race
/// between checking STOP and sleeping), installs the handler, and returns the mask to use in
/// `ppoll` (the old mask, without the stop signals).
fn install_signals() -> Result<libc::sigset_t, Error> {
    // SAFETY: sigset and sigaction calls on locally owned, zero-initialised structures; the
    // handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        for s in STOP_SIGNALS {
            libc::sigaddset(&mut block, s);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        if libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old) != 0 {
            return Err(err(
                "cannot block signals",
                io::Error::last_os_error(),
                None,
            ));
        }
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        for s in STOP_SIGNALS {
            if libc::sigaction(s, &sa, std::ptr::null_mut()) != 0 {
                return Err(err(
                    "cannot install a signal handler",
                    io::Error::last_os_error(),
                    None,
                ));
            }
            libc::sigdelset(&mut old, s);
        }
        Ok(old)
    }
}

/// One queued packet: when it is due and where its bytes are in the ring.
struct Slot {
    due: Instant,
    off: usize,
    len: usize,
}

/// A FIFO of packets whose bytes live in one contiguous ring buffer.
///
/// Invariants: `slots` are in ring order; `head` is the offset of the oldest packet (0 when
/// empty); `tail` is where the next packet goes; a packet never wraps (when the end of the
/// buffer has fewer than MAX_PACKET bytes free, the next packet goes to offset 0), and `tail`
/// never catches up with `head` while packets are queued.
struct Ring {
    buf: Vec<u8>,
    slots: VecDeque<Slot>,
    head: usize,
    tail: usize,
    /// Bytes of the queued packets (the quantity bounded by `limit`).
    queued: usize,
    limit: usize,
}

impl Ring {
    fn new(limit: usize) -> Ring {
        Ring {
            // The ring holds `limit` bytes plus the waste of at most one wrap and the packet
            // being read.
            buf: vec![0u8; limit + 2 * MAX_PACKET],
            slots: VecDeque::with_capacity(4096),
            head: 0,
            tail: 0,
            queued: 0,
            limit,
        }
    }

    /// Offset where a packet of up to MAX_PACKET bytes can be read, or None when full.
    fn write_offset(&self) -> Option<usize> {
        if self.queued >= self.limit {
            return None;
        }
        if self.slots.is_empty() {
            return Some(0);
        }
        let cap = self.buf.len();
        if self.tail >= self.head {
            if cap - self.tail >= MAX_PACKET {
                Some(self.tail)
            } else if self.head > MAX_PACKET {
                Some(0)
            } else {
                None
            }
        } else if self.head - self.tail > MAX_PACKET {
            Some(self.tail)
        } else {
            None
        }
    }

    fn push(&mut self, off: usize, len: usize, due: Instant) {
        if self.slots.is_empty() {
            self.head = off;
        }
        self.slots.push_back(Slot { due, off, len });
        self.tail = off + len;
        self.queued += len;
    }

    fn pop(&mut self) {
        if let Some(s) = self.slots.pop_front() {
            self.queued -= s.len;
        }
        match self.slots.front() {
            Some(s) => self.head = s.off,
            None => {
                self.head = 0;
                self.tail = 0;
            }
        }
    }
}

/// Counters printed at exit.
#[derive(Default)]
struct Stats {
    packets: u64,
    bytes: u64,
    dropped_full: u64,
    dropped_oversize: u64,
    write_errors: u64,
    max_queued: usize,
}

/// Runs the delay line until a stop signal: each round writes back the packets that are
/// due, sleeps until a packet arrives or the next one is due, and reads a burst of packets.
fn run(opts: &Options) -> Result<Stats, Error> {
    let sigmask = install_signals()?;
    let tun = open_tun(opts)?;
    // SAFETY: prctl with integer arguments; failure only means coarser wake-ups.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0) };
    if let Some(p) = &opts.pid_file {
        let tmp = p.with_extension("tmp");
        std::fs::write(&tmp, format!("{}\n", std::process::id()))
            .and_then(|_| std::fs::rename(&tmp, p))
            .map_err(|e| err(format!("cannot write pid file {}", p.display()), e, None))?;
    }

    let mut ring = Ring::new(opts.limit_bytes);
    let mut scratch = vec![0u8; MAX_PACKET];
    let mut st = Stats::default();
    let mut write_error_reported = false;

    while !STOP.load(Ordering::SeqCst) {
        // 1. Write back every packet that is due.
        write_due(opts, &tun, &mut ring, &mut st, &mut write_error_reported)?;
        // 2. Sleep until a packet arrives, the next one is due, or a stop signal.
        if !wait(opts, &tun, &ring, &sigmask)? {
            continue;
        }
        // 3. Read a burst of packets and stamp each with its due time.
        read_burst(opts, &tun, &mut ring, &mut scratch, &mut st)?;
    }
    if let Some(p) = &opts.pid_file {
        let _ = std::fs::remove_file(p);
    }
    Ok(st)
}

/// Writes every packet of `ring` that is due to the device. A packet the kernel refuses is
/// dropped and counted (the first refusal reported unless quiet); a full device waits for
/// the next wake-up.
///
/// Errors: the device is gone or broken (EBADF, EBADFD, EIO).
fn write_due(
    opts: &Options,
    tun: &Fd,
    ring: &mut Ring,
    st: &mut Stats,
    write_error_reported: &mut bool,
) -> Result<(), Error> {
    let now = Instant::now();
    while let Some(s) = ring.slots.front() {
        if s.due > now {
            break;
        }
        let pkt = &ring.buf[s.off..s.off + s.len];
        // SAFETY: write(2) from a slice of our buffer.
        let n = unsafe { libc::write(tun.0, pkt.as_ptr().cast(), pkt.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => break, // retry after the next wake-up
                Some(libc::EBADFD) | Some(libc::EBADF) | Some(libc::EIO) => {
                    return Err(err(format!("write to {}", opts.dev), e, None))
                }
                _ => {
                    // The kernel refused this packet (e.g. malformed): drop it, go on.
                    st.write_errors += 1;
                    if !*write_error_reported && !opts.quiet {
                        eprintln!("pgjet-delayline: {}: write: {e} (packet dropped)", opts.dev);
                        *write_error_reported = true;
                    }
                }
            }
        }
        ring.pop();
    }
    Ok(())
}

/// Sleeps until the device has a packet to read, the first packet of `ring` is due, or a
/// signal in `sigmask` arrives. True when there is a packet to read.
///
/// Errors: ppoll fails other than by a signal; the device reports an error.
fn wait(opts: &Options, tun: &Fd, ring: &Ring, sigmask: &libc::sigset_t) -> Result<bool, Error> {
    let timeout = ring.slots.front().map(|s| {
        let d = s.due.saturating_duration_since(Instant::now());
        libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as _,
        }
    });
    let mut pfd = libc::pollfd {
        fd: tun.0,
        events: libc::POLLIN,
        revents: 0,
    };
    let tp = timeout
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: one pollfd, an optional timespec and a sigset, all alive for the call.
    let r = unsafe { libc::ppoll(&mut pfd, 1, tp, sigmask) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok(false);
        }
        return Err(err("ppoll", e, None));
    }
    if r == 0 {
        return Ok(false);
    }
    if pfd.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
        return Err(err(
            format!("{}: device error", opts.dev),
            io::Error::other(format!("poll revents {:#x}", pfd.revents)),
            None,
        ));
    }
    Ok(true)
}

/// Reads up to [`READ_BURST`] packets from the device into `ring`, each due `opts.delay`
/// from now; a packet that does not fit (queue over the limit, or oversize) is read into
/// `scratch` and dropped, and counted.
///
/// Errors: a read fails other than by EAGAIN or a signal.
fn read_burst(
    opts: &Options,
    tun: &Fd,
    ring: &mut Ring,
    scratch: &mut [u8],
    st: &mut Stats,
) -> Result<(), Error> {
    for _ in 0..READ_BURST {
        let off = ring.write_offset();
        let dst: &mut [u8] = match off {
            Some(o) => &mut ring.buf[o..o + MAX_PACKET],
            None => &mut scratch[..],
        };
        // SAFETY: read(2) into a slice of MAX_PACKET bytes we own.
        let n = unsafe { libc::read(tun.0, dst.as_mut_ptr().cast(), dst.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => break,
                _ => return Err(err(format!("read from {}", opts.dev), e, None)),
            }
        }
        let n = n as usize;
        if n == 0 {
            break;
        }
        let due = Instant::now() + opts.delay;
        match off {
            Some(_) if n >= MAX_PACKET => st.dropped_oversize += 1,
            Some(o) if ring.queued + n <= ring.limit => {
                ring.push(o, n, due);
                st.packets += 1;
                st.bytes += n as u64;
                st.max_queued = st.max_queued.max(ring.queued);
            }
            _ => st.dropped_full += 1,
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse_args(&args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(UsageError(m)) => {
            eprintln!("pgjet-delayline: {m}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&opts) {
        Ok(st) => {
            if !opts.quiet {
                eprintln!(
                    "pgjet-delayline: {}: stopped; {} packets ({} bytes) delayed by {:.3} ms, \
                     {} dropped (queue over {} bytes), {} dropped (oversize), {} write errors, \
                     max queue {} bytes",
                    opts.dev,
                    st.packets,
                    st.bytes,
                    opts.delay.as_secs_f64() * 1000.0,
                    st.dropped_full,
                    opts.limit_bytes,
                    st.dropped_oversize,
                    st.write_errors,
                    st.max_queued
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pgjet-delayline: {e}");
            if let Some(p) = &opts.pid_file {
                let _ = std::fs::remove_file(p);
            }
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_options() {
        let o = parse_args(&args(&["--delay-ms", "12.5", "--dev=dlx", "--offload"]))
            .ok()
            .flatten()
            .unwrap();
        assert_eq!(o.delay, Duration::from_micros(12_500));
        assert_eq!(o.dev, "dlx");
        assert!(o.offload);
        assert_eq!(o.limit_bytes, DEFAULT_LIMIT_BYTES);
        assert!(parse_args(&args(&["--help"])).ok().unwrap().is_none());
        for bad in [
            &["--delay-ms", "inf"][..],
            &["--delay-ms", "1e9"][..],
            &["--delay-ms", "1", "--dev", ""][..],
            &["--delay-ms", "1", "--dev", "a b"][..],
            &["--delay-ms", "1", "--limit-bytes", "-1"][..],
            &["--delay-ms", "1", "--offload=yes"][..],
            &["--dev", "x"][..],
        ] {
            assert!(parse_args(&args(bad)).is_err(), "{bad:?} accepted");
        }
    }

    /// Pushes and pops packets of varied sizes through a small ring and checks that no two
    /// queued packets overlap and that the byte count and limit hold.
    #[test]
    fn ring_never_overlaps_and_respects_the_limit() {
        let limit = 3 * MAX_PACKET;
        let mut r = Ring::new(limit);
        let t = Instant::now();
        let mut seed = 7u64;
        let mut accepted = 0;
        for i in 0..100_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = 1 + (seed % (MAX_PACKET as u64 - 1)) as usize;
            if seed.is_multiple_of(3) {
                r.pop();
            } else if let Some(off) = r.write_offset() {
                // The read may fill MAX_PACKET bytes at `off`: none of them may be queued.
                assert!(off + MAX_PACKET <= r.buf.len());
                for q in &r.slots {
                    assert!(
                        off + MAX_PACKET <= q.off || q.off + q.len <= off,
                        "step {i}: read area overlaps"
                    );
                }
                if r.queued + len <= limit {
                    r.push(off, len, t);
                    accepted += 1;
                }
            }
            let mut spans: Vec<(usize, usize)> =
                r.slots.iter().map(|s| (s.off, s.off + s.len)).collect();
            assert_eq!(
                r.queued,
                spans.iter().map(|(a, b)| b - a).sum::<usize>(),
                "step {i}"
            );
            assert!(r.queued <= limit);
            spans.sort();
            for w in spans.windows(2) {
                assert!(w[0].1 <= w[1].0, "step {i}: overlap {w:?}");
            }
        }
        assert!(accepted > 10_000);
        while !r.slots.is_empty() {
            r.pop();
        }
        assert_eq!((r.head, r.tail, r.queued), (0, 0, 0));
    }
}
