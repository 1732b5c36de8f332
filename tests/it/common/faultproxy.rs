//! A TCP proxy on 127.0.0.1 in front of a test server, for fault tests: it counts the bytes
//! clients send, and in storm mode it injects faults into new connections: a reset before
//! anything is read, an HTTP `503 Slow Down` answer to the first request (plain HTTP only),
//! or a cut after some bytes. The link can also be taken down and up again (every open
//! connection cut, new ones reset). Threads only; stopped when dropped.
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Fault rates of storm mode, in percent of new connections.
#[derive(Clone, Copy, Debug, Default)]
pub struct Storm {
    pub reset_pct: u64,
    pub http503_pct: u64,
    pub cut_pct: u64,
}

#[derive(Default)]
struct State {
    stop: AtomicBool,
    /// Bytes clients sent through the proxy.
    up_bytes: AtomicU64,
    storm: Mutex<Option<Storm>>,
    /// Pause after each chunk a client sends (0 = none), milliseconds.
    throttle_ms: AtomicU64,
    rng: AtomicU64,
    /// Faults injected so far: resets, 503 answers, cuts.
    resets: AtomicU64,
    answers_503: AtomicU64,
    cuts: AtomicU64,
    /// The link is down: new connections are reset at once.
    down: AtomicBool,
    /// Both ends of every open connection, by connection number, for
    /// [`FaultProxy::link_down`] to cut; a connection removes its own when it ends (a long
    /// storm makes tens of thousands: kept, their descriptors ran out).
    conns: Mutex<std::collections::HashMap<u64, [TcpStream; 2]>>,
    /// Numbers the connections.
    next_conn: AtomicU64,
}

impl State {
    /// xorshift64: cheap and reproducible enough for fault choices.
    fn roll(&self) -> u64 {
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        x
    }
}

/// The proxy: listens on `port`, forwards to 127.0.0.1:`upstream`.
pub struct FaultProxy {
    pub port: u16,
    state: Arc<State>,
}

impl FaultProxy {
    /// Starts a pass-through proxy to 127.0.0.1:`upstream`.
    pub fn start(upstream: u16) -> FaultProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        l.set_nonblocking(true).unwrap();
        let state = Arc::new(State {
            rng: AtomicU64::new(0x9E37_79B9_7F4A_7C15),
            ..Default::default()
        });
        let st = state.clone();
        std::thread::spawn(move || {
            while !st.stop.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((c, _)) => {
                        let st = st.clone();
                        std::thread::spawn(move || serve(c, upstream, &st));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FaultProxy { port, state }
    }

    /// Bytes clients have sent through the proxy so far.
    pub fn up_bytes(&self) -> u64 {
        self.state.up_bytes.load(Ordering::SeqCst)
    }

    /// Turns storm mode on (Some) or off (None) for new connections.
    pub fn set_storm(&self, storm: Option<Storm>) {
        *self.state.storm.lock().unwrap() = storm;
    }

    /// Slows what clients send: a pause of `ms` after each chunk of at most 64 KiB.
    pub fn set_throttle_ms(&self, ms: u64) {
        self.state.throttle_ms.store(ms, Ordering::SeqCst);
    }

    /// Takes the link down: every open connection is cut (both ends shut down, as when a
    /// router between two hosts drops them) and new ones are reset, until
    /// [`FaultProxy::link_up`].
    pub fn link_down(&self) {
        self.state.down.store(true, Ordering::SeqCst);
        for (_, ends) in self.state.conns.lock().unwrap().drain() {
            for c in ends {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }

    /// Brings the link up again after [`FaultProxy::link_down`].
    pub fn link_up(&self) {
        self.state.down.store(false, Ordering::SeqCst);
    }

    /// Faults injected so far: (resets, 503 answers, cuts).
    pub fn faults(&self) -> (u64, u64, u64) {
        (
            self.state.resets.load(Ordering::SeqCst),
            self.state.answers_503.load(Ordering::SeqCst),
            self.state.cuts.load(Ordering::SeqCst),
        )
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
    }
}

fn serve(client: TcpStream, upstream: u16, st: &Arc<State>) {
    if st.down.load(Ordering::SeqCst) {
        let _ = socket2_linger_zero(&client);
        return;
    }
    let storm = *st.storm.lock().unwrap();
    let mut cut_after = u64::MAX;
    if let Some(s) = storm {
        let r = st.roll() % 100;
        if r < s.reset_pct {
            st.resets.fetch_add(1, Ordering::SeqCst);
            // SO_LINGER 0: close sends a RST.
            let _ = socket2_linger_zero(&client);
            return;
        }
        if r < s.reset_pct + s.http503_pct {
            st.answers_503.fetch_add(1, Ordering::SeqCst);
            answer_503(client);
            return;
        }
        if r < s.reset_pct + s.http503_pct + s.cut_pct {
            cut_after = 1 + st.roll() % (256 << 10);
        }
    }
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
        return;
    };
    let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
        client.try_clone(),
        server.try_clone(),
        client.try_clone(),
        server.try_clone(),
    ) else {
        return;
    };
    let id = st.next_conn.fetch_add(1, Ordering::SeqCst);
    st.conns.lock().unwrap().insert(id, [c3, s3]);
    let st_up = st.clone();
    let up = std::thread::spawn(move || pump(client, server, Some(&st_up), cut_after));
    pump(s2, c2, None, u64::MAX);
    let _ = up.join();
    st.conns.lock().unwrap().remove(&id);
}

/// Copies `from` -> `to` until either ends (or `cut_after` bytes, then both are shut down).
fn pump(mut from: TcpStream, mut to: TcpStream, count: Option<&State>, cut_after: u64) {
    let mut buf = vec![0u8; 64 << 10];
    let mut moved = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(st) = count {
            st.up_bytes.fetch_add(n as u64, Ordering::SeqCst);
            let ms = st.throttle_ms.load(Ordering::SeqCst);
            if ms > 0 {
                std::thread::sleep(Duration::from_millis(ms));
            }
        }
        moved += n as u64;
        if moved >= cut_after {
            if let Some(st) = count {
                st.cuts.fetch_add(1, Ordering::SeqCst);
            }
            break;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Reads the request head, answers `503 Slow Down` (S3's throttling answer) and closes.
fn answer_503(mut c: TcpStream) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::new();
    let mut b = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < (64 << 10) {
        match c.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code><Message>injected by the test proxy</Message></Error>";
    let _ = write!(
        c,
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = c.shutdown(Shutdown::Both);
}

/// Sets SO_LINGER to 0 so that dropping the socket resets the connection.
fn socket2_linger_zero(s: &TcpStream) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt with a valid linger struct on a descriptor we own.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
