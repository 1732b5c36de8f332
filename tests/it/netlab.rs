//! Functional tests of the network lab itself (scripts/netlab.sh, pgjet-delayline,
//! tests/it/common/netlab.rs): bytes cross the wire both ways and show in the interface counters,
//! the wire adds at least the configured round-trip time, a server in host A is not reachable
//! from the root namespace, and dropping the lab removes everything it started.
//! No speed is asserted here; bench/netlab-check.sh measures rate and RTT (docs/netlab.md).

use crate::common::netlab::{NetLab, DELAYLINE_BIN};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Socket timeouts (s): a broken lab fails the test instead of hanging it.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// A deterministic byte pattern of `n` bytes (so the other side can check every byte).
fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Binds a listener on `addr`:0 in host A; returns its address and a thread that accepts one
/// connection, reads until EOF, answers with `reply`, and returns (what it read, the peer).
fn one_shot_server(
    lab: &NetLab,
    addr: Ipv4Addr,
    reply: Vec<u8>,
) -> (SocketAddr, std::thread::JoinHandle<(Vec<u8>, SocketAddr)>) {
    let (tx, rx) = mpsc::channel();
    let h = lab.spawn_thread(&lab.ns_a, move || {
        let l = TcpListener::bind((addr, 0)).expect("bind in host A");
        tx.send(l.local_addr().expect("local_addr"))
            .expect("send addr");
        let (mut s, peer) = l.accept().expect("accept in host A");
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("server read");
        s.write_all(&reply).expect("server write");
        s.shutdown(Shutdown::Write).expect("server shutdown");
        (got, peer)
    });
    let bound = rx.recv_timeout(IO_TIMEOUT).expect("server did not bind");
    (bound, h)
}

#[test]
fn tcp_carries_bytes_both_ways_across_the_wire() {
    let lab = NetLab::up(Some("200mbit"), 10.0);
    let up = pattern(4 << 20, 1); // b -> a
    let down = pattern(3 << 20, 2); // a -> b
    let (server_addr, server) = one_shot_server(&lab, lab.addr_a, down.clone());
    assert_eq!(server_addr.ip(), lab.addr_a);

    let (rx0, tx0) = lab.iface_bytes(&lab.ns_b);
    let (wrx0, wtx0) = lab.iface_bytes_of(&lab.ns_wire, "dl0");
    let up_c = up.clone();
    let client = lab.spawn_thread(&lab.ns_b, move || {
        let mut s = TcpStream::connect_timeout(&server_addr, IO_TIMEOUT).expect("connect from B");
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        let local = s.local_addr().unwrap();
        s.write_all(&up_c).expect("client write");
        s.shutdown(Shutdown::Write).expect("client shutdown");
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("client read");
        (got, local)
    });
    let (client_got, client_local) = client.join().expect("client thread");
    let (server_got, peer) = server.join().expect("server thread");
    let (rx1, tx1) = lab.iface_bytes(&lab.ns_b);
    let (wrx1, wtx1) = lab.iface_bytes_of(&lab.ns_wire, "dl0");

    assert!(
        server_got == up,
        "A received {} bytes, not the {} B sent",
        server_got.len(),
        up.len()
    );
    assert!(
        client_got == down,
        "B received {} bytes, not the {} A sent",
        client_got.len(),
        down.len()
    );
    // The server saw B's own address: no NAT, no proxy.
    assert_eq!(peer.ip(), lab.addr_b);
    assert_eq!(client_local.ip(), lab.addr_b);
    // B's link counted at least the payload each way (plus headers).
    assert!(
        tx1 - tx0 >= up.len() as u64,
        "B's lab0 sent {} B < {}",
        tx1 - tx0,
        up.len()
    );
    assert!(
        rx1 - rx0 >= down.len() as u64,
        "B's lab0 received {} B < {}",
        rx1 - rx0,
        down.len()
    );
    // ... and every byte passed the delay line (TUN dl0: its tx is what the kernel handed the
    // delay line, its rx what the delay line wrote back), both directions together.
    let both = (up.len() + down.len()) as u64;
    assert!(
        wtx1 - wtx0 >= both,
        "dl0 handed the delay line {} B < {both}",
        wtx1 - wtx0
    );
    assert!(
        wrx1 - wrx0 >= both,
        "the delay line wrote back {} B < {both}",
        wrx1 - wrx0
    );
}

/// The RTTs (ms) of `count` pings from B to A.
fn ping_rtts(lab: &NetLab, count: u32) -> Vec<f64> {
    let out = lab.exec(
        &lab.ns_b,
        "ping",
        &[
            "-n",
            "-c",
            &count.to_string(),
            "-i",
            "0.2",
            "-W",
            "5",
            &lab.addr_a.to_string(),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ping failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut rtts: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(rtts.len(), count as usize, "ping output: {text}");
    rtts.sort_by(|a, b| a.total_cmp(b));
    rtts
}

#[test]
fn ping_rtt_is_at_least_the_configured_rtt() {
    for (rate, rtt) in [(Some("1gbit"), 20.0), (None, 7.5)] {
        let lab = NetLab::up(rate, rtt);
        assert!(lab.delayline_pid.is_some());
        let rtts = ping_rtts(&lab, 10);
        let median = rtts[rtts.len() / 2];
        assert!(
            rtts[0] >= rtt,
            "rate {rate:?}: min ping RTT {} ms < configured {rtt} ms ({rtts:?})",
            rtts[0]
        );
        assert!(
            median < rtt + 15.0,
            "rate {rate:?}: median ping RTT {median} ms >= {rtt} + 15 ms ({rtts:?})"
        );
    }
}

#[test]
fn unshaped_lab_without_delay_line_forwards() {
    let lab = NetLab::up(None, 0.0);
    assert!(lab.delayline_pid.is_none());
    let rtts = ping_rtts(&lab, 3);
    // No delay line: sub-millisecond on an idle machine; a loose bound for a busy one.
    assert!(
        rtts[1] < 5.0,
        "median ping RTT {} ms without a delay line",
        rtts[1]
    );
}

#[test]
fn server_in_host_a_is_not_reachable_from_the_root_namespace() {
    let lab = NetLab::up(None, 2.0);
    let token = b"pgjet-netlab-host-a".to_vec();
    // A server in A on every address of A (0.0.0.0), answering with a token to any client.
    let (tx, rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let tok = token.clone();
    let server = lab.spawn_thread(&lab.ns_a, move || {
        let l = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("bind in A");
        l.set_nonblocking(true).unwrap();
        tx.send(l.local_addr().unwrap().port()).unwrap();
        let t0 = Instant::now();
        let mut served = 0;
        while stop_rx.try_recv().is_err() && t0.elapsed() < IO_TIMEOUT {
            match l.accept() {
                Ok((mut s, _)) => {
                    let _ = s.write_all(&tok);
                    served += 1;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        served
    });
    let port = rx.recv_timeout(IO_TIMEOUT).expect("server did not bind");

    // From B, across the wire: reachable.
    let a = SocketAddr::from((lab.addr_a, port));
    let from_b = lab.spawn_thread(&lab.ns_b, move || {
        let mut s = TcpStream::connect_timeout(&a, IO_TIMEOUT).expect("connect from B");
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        got
    });
    assert_eq!(from_b.join().unwrap(), token, "B must reach A's server");

    // From the root namespace on loopback: A's server is not there (a connection, if any
    // other program of this machine happens to use the port, must not be A's server).
    let sa = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    if let Ok(mut s) = TcpStream::connect_timeout(&sa, Duration::from_secs(2)) {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        assert_ne!(
            got, token,
            "A's server answered on {sa} in the root namespace"
        );
    }
    // A's address is on no interface of the root namespace, and the root's route to it uses
    // none of the lab's interfaces. (No packet is sent to it from the root: the root's default
    // route leads off this machine, where no lab host is.)
    let addrs = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .unwrap();
    let addrs = String::from_utf8_lossy(&addrs.stdout);
    assert!(
        !addrs.contains(&format!("{}/", lab.addr_a)),
        "root namespace has A's address: {addrs}"
    );
    let route = Command::new("ip")
        .args(["route", "get", &lab.addr_a.to_string()])
        .output()
        .unwrap();
    let route = String::from_utf8_lossy(&route.stdout);
    for dev in ["lab0", "wa", "wb", "dl0"] {
        assert!(
            !route.contains(&format!("dev {dev} ")),
            "root routes to A via {dev}: {route}"
        );
    }
    stop_tx.send(()).unwrap();
    assert_eq!(
        server.join().unwrap(),
        1,
        "A's server must have served B only"
    );
}

#[test]
fn drop_removes_namespaces_and_stops_processes() {
    let lab = NetLab::up(Some("100mbit"), 4.0);
    let names = [lab.ns_a.clone(), lab.ns_b.clone(), lab.ns_wire.clone()];
    let dl_pid = lab.delayline_pid.expect("delay line pid");
    assert!(Path::new(&format!("/proc/{dl_pid}")).exists());
    for ns in &names {
        assert!(NetLab::ns_exists(ns), "{ns} missing");
    }
    // A process left running in host A (not stopped by its starter) is stopped by down.
    let mut leftover = lab
        .command(&lab.ns_a, "sleep")
        .arg("600")
        .spawn()
        .expect("spawn sleep");
    // A process stopped by its guard.
    let mut guarded = lab.spawn(&lab.ns_b, "sleep", &["600"]);
    guarded.stop();
    assert!(guarded.child.try_wait().unwrap().is_some());

    drop(lab);
    for ns in &names {
        assert!(!NetLab::ns_exists(ns), "{ns} still exists after drop");
    }
    let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    for ns in &names {
        assert!(
            !list
                .lines()
                .any(|l| l.split_whitespace().next() == Some(ns)),
            "{ns} listed"
        );
    }
    let cmdline = std::fs::read(format!("/proc/{dl_pid}/cmdline")).unwrap_or_default();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains("pgjet-delayline"),
        "delay line {dl_pid} still running"
    );
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = leftover.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > Duration::from_secs(5) {
            let _ = leftover.kill();
            let _ = leftover.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.is_some(), "the process left in host A survived down");
}

#[test]
fn hidden_directories_are_empty_in_the_destination() {
    let lab = NetLab::up(None, 0.0);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), b"x").unwrap();
    let out = lab
        .command_hiding(&lab.ns_b, &[dir.path()], "ls")
        .arg("-A")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "",
        "hidden dir not empty"
    );
    // Outside, the file is still there.
    assert!(dir.path().join("secret").exists());
    // And the process is in B's network namespace.
    let out = lab
        .command_hiding(&lab.ns_b, &[dir.path()], "ip")
        .args(["-o", "-4", "addr"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(&lab.addr_b.to_string()));
}

#[test]
fn delayline_refuses_bad_input_with_a_message() {
    let run = |args: &[&str]| Command::new(DELAYLINE_BIN).args(args).output().unwrap();
    for (args, needle) in [
        (&[][..], "--delay-ms is required"),
        (&["--delay-ms", "abc"][..], "not a number"),
        (&["--delay-ms", "-3"][..], "out of range"),
        (&["--delay-ms", "NaN"][..], "out of range"),
        (
            &["--delay-ms", "5", "--dev", "a/b"][..],
            "not a valid interface name",
        ),
        (
            &["--delay-ms", "5", "--dev", "waytoolonginterfacename"][..],
            "not a valid interface name",
        ),
        (
            &["--delay-ms", "5", "--limit-bytes", "12"][..],
            "out of range",
        ),
        (&["--delay-ms", "5", "--bogus"][..], "unknown argument"),
        (&["--delay-ms"][..], "needs a value"),
    ] {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // Not root: a clear message and exit 1, no panic.
    let o = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(DELAYLINE_BIN)
        .args(["--delay-ms", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("run as root"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
