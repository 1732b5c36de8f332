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
//! 5. On 15, with an S3 repository (versitygw) the members archive into: a member cloned
//!    from a replica tagged `clonefrom`, a re-sync cancelled by Patroni mid-copy, Patroni's
//!    custom bootstrap of a new cluster to a point in time by `pgjet restore`, and a member
//!    seeded from the repository with no leader (`no_leader`): see
//!    [`clone_cancel_and_repository`].
//! 6. After each step every member holds exactly Patroni's physical slots (one per other
//!    member, named after it, and on 15 the permanent slot of archive-stream): pgjet leaves
//!    none.
//! 7. On 15, `pgjet archive-stream` streams WAL into the S3 repository from steps 1 to 4,
//!    beside the members' archive-push, from whichever member leads (a multi-host string
//!    with `target_session_attrs=read-write`) as Patroni's replicator, with a permanent slot
//!    of Patroni's: it follows the switchover and the failover without a gap, and the
//!    point-in-time bootstrap of step 5 replays from that archive.
//!
//! Needs (scripts/install-deps.sh installs them): PostgreSQL 15 (Debian) and 18 (the wheel), etcd at
//! /usr/bin/etcd (Debian's etcd-server; its service is not used), Patroni in a venv at
//! /opt/pgjet/patroni readable by the OS user postgres. Everything listens on 127.0.0.1 on
//! free ports, lives in one scratch directory, and every process started here (etcd, each
//! Patroni, their PostgreSQL servers) is stopped by PID at the end, on failure too.

use crate::common::stores::{StoreKind, StoreServer};
use crate::common::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::mem::ManuallyDrop;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PATRONI_VENV: &str = "/opt/pgjet/patroni/bin";
const ETCD: &str = "/usr/bin/etcd";
const SCOPE: &str = "pgjet-acc";
/// The stanza of the S3 repository (PostgreSQL 15's run).
const STANZA: &str = "acc";
/// archive-stream's slot in the repository's run: a permanent slot in Patroni's DCS.
const STREAM_SLOT: &str = "pgjet_stream_acc";
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

/// Panics unless `log` holds each of `needles`; `what` says what it shows.
fn assert_log_has(log: &str, what: &str, needles: &[&str]) {
    for needle in needles {
        assert!(log.contains(needle), "{what}: {needle:?} missing:\n{log}");
    }
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
    opts: NodeOpts,
}

/// What a member's configuration holds beyond the common part.
#[derive(Default, Clone)]
struct NodeOpts {
    /// Its Patroni cluster (default [`SCOPE`]).
    scope: Option<&'static str>,
    /// pgjet's config file for the S3 repository (stanza [`STANZA`]): archive_command and
    /// Patroni's restore_command use it, the pgjet method gets it and `no_leader: true`.
    repo: Option<PathBuf>,
    /// `tags: clonefrom: true`: new members clone from this one.
    clonefrom: bool,
    /// The pgjet method's `max_rate` (pgjet's `--max-rate`): a copy slow enough to cancel.
    max_rate: Option<&'static str>,
    /// Patroni's custom bootstrap: `pgjet restore` of the repository's newest backup, with
    /// `recovery_conf` recovering to this time and promoting.
    bootstrap_to: Option<String>,
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

    fn scope(&self) -> &'static str {
        self.opts.scope.unwrap_or(SCOPE)
    }

    fn write_config(&self, etcd_port: u16, pgjet: &Path) {
        let (dir, data, sock) = (
            self.dir.display(),
            self.data().display().to_string(),
            self.dir.join("sock").display().to_string(),
        );
        let o = &self.opts;
        let with_repo = |cmd: &str| match &o.repo {
            Some(cfg) => format!(
                "{} --config={} --stanza={STANZA} {cmd}",
                pgjet.display(),
                cfg.display()
            ),
            None => format!("{} {cmd}", pgjet.display()),
        };
        // The repository: WAL archived into it, Patroni's restore_command reading it (as in
        // Patroni's pgBackRest recipe), the pgjet method allowed with no leader.
        let (archive, recovery, no_leader) = match &o.repo {
            // A cluster made by point-in-time recovery would archive a new timeline into
            // the repository of the cluster it came from.
            Some(_) if o.bootstrap_to.is_none() => (
                format!(
                    "    archive_mode: 'on'\n    archive_command: '{}'\n",
                    with_repo("archive-push %p")
                ),
                format!(
                    "  recovery_conf:\n    restore_command: '{}'\n",
                    with_repo("archive-get %f \"%p\"")
                ),
                "    no_leader: true\n",
            ),
            _ => (String::new(), String::new(), ""),
        };
        let tags = if o.clonefrom {
            "tags:\n  clonefrom: true\n"
        } else {
            ""
        };
        let max_rate = o
            .max_rate
            .map(|r| format!("    max_rate: {r}\n"))
            .unwrap_or_default();
        let method = match &o.bootstrap_to {
            Some(time) => format!(
                "  method: pgjet\n  pgjet:\n    command: {}\n    recovery_conf:\n      restore_command: '{}'\n      recovery_target_time: '{time}'\n      recovery_target_action: promote\n",
                with_repo("restore"),
                with_repo("archive-get %f \"%p\"")
            ),
            None => String::new(),
        };
        let yml = format!(
            r#"scope: {scope}
name: {name}
{tags}log:
  level: INFO
restapi:
  listen: 127.0.0.1:{api}
  connect_address: 127.0.0.1:{api}
etcd3:
  hosts: 127.0.0.1:{etcd_port}
watchdog:
  mode: off
bootstrap:
{method}  dcs:
    ttl: 20  # the least Patroni 4 takes (it raises 10 to 20)
    loop_wait: 2
    retry_timeout: 5
    maximum_lag_on_failover: 104857600
{permanent}    postgresql:
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
{archive}{recovery}  create_replica_methods:
    - pgjet
    - basebackup
  pgjet:
    command: {pgjet}
    keep_data: true
    start_fast: true
{no_leader}{max_rate}  basebackup:
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
            pgjet = with_repo("replica-create"),
            // The repository's run streams WAL into it with archive-stream, whose slot is one
            // of Patroni's permanent slots: every member keeps it, so the new leader has it
            // after a failover.
            permanent = if o.repo.is_some() && o.bootstrap_to.is_none() && o.scope.is_none() {
                format!("    slots:\n      {STREAM_SLOT}:\n        type: physical\n")
            } else {
                String::new()
            },
            scope = self.scope(),
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

    /// Stops this member's Patroni as a service manager does (SIGTERM): it stops its
    /// PostgreSQL and, when it leads, gives up the leader key. Waits for both to end.
    fn stop(&mut self) {
        let mut bg = self.patroni.take().expect("Patroni runs");
        bg.signal(libc::SIGTERM);
        // A leader's Patroni stops its PostgreSQL before it gives up the key, and the
        // postmaster first archives what is left (here: archive-push to S3) and writes its
        // shutdown checkpoint (Patroni's ha.py, shutdown): slow on a loaded machine, so
        // 120 s, and the log's end says where it waited if even that is not enough.
        let ended = wait_for(Duration::from_secs(120), || bg.try_wait());
        if ended.is_none() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "{}: Patroni ignored SIGTERM for 120 s; the end of its log:\n{}",
                self.name,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        if let Some(pid) = read_pid(&self.data()) {
            let gone = wait_for(Duration::from_secs(30), || (!pid_alive(pid)).then_some(()));
            assert!(
                gone.is_some(),
                "{}: postmaster {pid} outlived Patroni",
                self.name
            );
        }
        step!(
            "{}: Patroni stopped (SIGTERM), its PostgreSQL with it",
            self.name
        );
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
    etcd_port: u16,
    spy: Spy,
    /// The S3 server of the repository (PostgreSQL 15's run), stopped after the members.
    store: Option<StoreServer>,
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

    /// Adds member `name` with `opts` (its directory, ports and configuration); not started.
    fn add_node(&mut self, name: &'static str, pg: &Pg, mut opts: NodeOpts) {
        let dir = self._root.join(name);
        mkdir_pg(&dir, 0o700);
        mkdir_pg(&dir.join("sock"), 0o755);
        let pg_port = free_port();
        if let Some(store) = &self.store {
            opts.repo = Some(pgjet_conf(store, &dir, pg_port));
        }
        let n = Node {
            name,
            pg: pg.clone(),
            dir,
            api_port: free_port(),
            pg_port,
            patroni: None,
            opts,
        };
        n.write_config(self.etcd_port, &pgjet_bin());
        self.nodes.push(n);
    }

    /// `GET /cluster` from the first member of Patroni cluster `scope` whose Patroni runs
    /// and answers.
    fn cluster(&self, scope: &str) -> Option<Value> {
        self.nodes
            .iter()
            .filter(|n| n.patroni.is_some() && n.scope() == scope)
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
        let scope = self.node(leader).scope();
        let ok = wait_for(TRANSITION, || {
            let c = self.cluster(scope)?;
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

    /// The physical slots of every member (a node of [`SCOPE`] whose Patroni runs) are
    /// exactly Patroni's: one for each other member its DCS lists (`/cluster`; a member
    /// stopped keeps its key until the key's TTL runs out), named after it, and, in the
    /// repository's run, the permanent slot [`STREAM_SLOT`]; none of pgjet's making
    /// (`what` in the message). Patroni makes and drops a member's slots on its own loop,
    /// so this waits (up to 60 s) for them.
    fn assert_patroni_slots(&self, what: &str) {
        let t = Instant::now();
        let members: Vec<&Node> = self
            .nodes
            .iter()
            .filter(|n| n.patroni.is_some() && n.scope() == SCOPE)
            .collect();
        for n in &members {
            let want = || -> Option<BTreeSet<String>> {
                let c = self.cluster(SCOPE)?;
                let mut w: BTreeSet<String> = c["members"]
                    .as_array()?
                    .iter()
                    .filter_map(|m| m["name"].as_str())
                    .filter(|name| *name != n.name)
                    .map(|name| format!("{name}:physical"))
                    .collect();
                if self.store.is_some() {
                    w.insert(format!("{STREAM_SLOT}:physical"));
                }
                Some(w)
            };
            let got = wait_for(Duration::from_secs(60), || {
                let w = want()?;
                n.slots().filter(|s| *s == w)
            });
            if got.is_none() {
                self.fail(&format!(
                    "{what}: {} must hold Patroni's slots {:?} and no other; it holds {:?}",
                    n.name,
                    want(),
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
        // archive-push and archive-get (PostgreSQL's) are not the method.
        let mut ran = Vec::new();
        for argv in self
            .spy
            .take()
            .into_iter()
            .filter(|a| a.contains(" replica-create") || a.contains(" restore"))
        {
            step!("{what}: Patroni ran: {argv}");
            ran.push(format!("Patroni ran: {argv}"));
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
            "seed",
            "restoring backup",
            "the source is a standby",
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
        ran.extend(lines);
        ran.join("\n")
    }

    /// pgjet ARGS as postgres with member `name`'s config file and the stanza; panics
    /// unless it succeeds.
    fn pgjet_on(&self, name: &str, args: &[&str]) -> Run {
        let cfg = self.node(name).opts.repo.clone().expect("a repository");
        let mut a = vec![
            format!("--config={}", cfg.display()),
            format!("--stanza={STANZA}"),
        ];
        a.extend(args.iter().map(|s| s.to_string()));
        let r = run_as_postgres(&pgjet_bin(), &a, None);
        if !r.success() {
            self.fail(&format!("pgjet {args:?} on {name} failed:\n{r}"));
        }
        r
    }
}

/// pgjet's config file for member directory `dir` (its data, socket and `pg_port`) and the
/// S3 repository `store` (prefix /acc), written into `dir` for the OS user postgres.
fn pgjet_conf(store: &StoreServer, dir: &Path, pg_port: u16) -> PathBuf {
    let mut text = String::from("[global]\n");
    for (k, v) in store.options("/acc") {
        text.push_str(&format!("{k}={v}\n"));
    }
    text.push_str(&format!(
        "pg1-path={}\npg1-socket-path={}\npg1-port={pg_port}\n",
        dir.join("data").display(),
        dir.join("sock").display()
    ));
    let p = dir.join("pgjet.conf");
    fs::write(&p, text).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
    chown_pg_recursive(&p);
    p
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
    // On 15, the members archive into an S3 repository (versitygw on 127.0.0.1, plain
    // HTTP) for the scenarios that restore from it.
    let with_repo = pg.major == "15";
    let mut acc = Acc {
        nodes: Vec::new(),
        etcd: Some(etcd),
        etcd_port: client,
        spy: Spy::start(pgjet.clone(), root.join("")),
        store: with_repo.then(|| StoreServer::start_with(StoreKind::S3, "patroni", false)),
        _root: root,
    };
    acc.add_node("node1", &pg, NodeOpts::default());
    // node2 is the member new ones clone from (`clonefrom`), a replica most of the time.
    acc.add_node(
        "node2",
        &pg,
        NodeOpts {
            clonefrom: true,
            ..NodeOpts::default()
        },
    );
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
    // On 15, archive-stream streams the cluster's WAL into the repository beside the
    // members' archive-push, from whichever member leads (a multi-host string), with
    // Patroni's replicator and the permanent slot.
    let receiver = with_repo.then(|| {
        acc.pgjet_on("node1", &["stanza-create"]);
        start_stream(&acc)
    });

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
    assert_log_has(
        &log,
        "node2's log must show",
        &[
            "called by Patroni as its replica creation method (scope pgjet-acc, role replica, keep_data",
            "the role may not copy files",
            "BASE_BACKUP",
            "replica has been created using pgjet",
        ],
    );
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
    assert_log_has(
        &log,
        "node1's reinit must show",
        &[
            "Leaving data directory uncleaned",
            "called by Patroni as its replica creation method (scope pgjet-acc, role replica, keep_data",
            "(Patroni kept it): it is re-synced in place",
            "replica has been created using pgjet",
        ],
    );
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
    if let Some(r) = receiver {
        stop_stream(&acc, r, "node1");
    }

    if with_repo {
        clone_cancel_and_repository(&mut acc, &pg);
    }
    drop(acc);
    step!("Patroni acceptance passed in {}", secs(t0));
}

/// Starts `pgjet archive-stream` into the repository from node1 or node2, whichever
/// accepts writes, as Patroni's replicator (REPLICATION only) with the permanent slot.
fn start_stream(acc: &Acc) -> Background {
    let cfg = acc.node("node1").opts.repo.clone().expect("a repository");
    let dir = acc._root.join("stream");
    mkdir_pg(&dir, 0o700);
    let source = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=replicator password=rep-secret application_name=pgjet_stream target_session_attrs=read-write",
        acc.node("node1").pg_port,
        acc.node("node2").pg_port
    );
    let a = args![
        format!("--config={}", cfg.display()),
        format!("--stanza={STANZA}"),
        format!("--archive-stream-slot={STREAM_SLOT}"),
        format!("--spool-path={}", dir.display()),
        format!("--source={source}"),
        "archive-stream"
    ];
    let r = Background::spawn_logged(
        &pgjet_bin(),
        &a,
        &dir.join("stream.pid"),
        &dir.join("stream.log"),
    );
    step!("archive-stream started from the member that leads");
    r
}

/// Waits until the receiver has made durable everything leader `leader` has flushed,
/// stops it (SIGTERM), and checks it followed every promotion with Patroni's slot: no gap.
fn stop_stream(acc: &Acc, receiver: Background, leader: &str) {
    let node = acc.node(leader);
    let flushed = wait_for(Duration::from_secs(60), || {
        (node.psql(
            "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'pgjet_stream'              AND flush_lsn >= pg_current_wal_flush_lsn()",
        ) == "1")
            .then_some(())
    });
    let log_path = acc._root.join("stream").join("stream.log");
    let log = || fs::read_to_string(&log_path).unwrap_or_default();
    if flushed.is_none() {
        acc.fail(&format!(
            "archive-stream did not catch up with {leader}:\n{}",
            tail(&log(), 40)
        ));
    }
    receiver.signal(libc::SIGTERM);
    let r = receiver.wait();
    let text = log();
    assert!(
        r.success(),
        "archive-stream did not stop cleanly:\n{}",
        tail(&text, 40)
    );
    assert!(
        text.contains("following timeline") && !text.contains("recorded as a gap"),
        "archive-stream must follow the switchover and the failover without a gap:\n{}",
        tail(&text, 40)
    );
    step!("archive-stream followed the switchover and the failover with Patroni's permanent slot, no gap");
}

/// The PID of the running `pgjet replica-create` for member `name`, if any.
fn replica_create_pid(acc: &Acc, name: &str) -> Option<i32> {
    let data = acc.node(name).data().display().to_string();
    pgjet_processes(&pgjet_bin(), &acc._root.join(""))
        .into_iter()
        .find(|(_, a)| {
            a.iter().any(|x| x == "replica-create") && a.iter().any(|x| x.contains(&data))
        })
        .map(|(pid, _)| pid)
}

/// The scenarios with the S3 repository (PostgreSQL 15), after step 4 (node1 leads, node2
/// streams):
/// 5. node3 joins and Patroni clones it from node2, a replica tagged `clonefrom`: pgjet
///    copies a standby (the server's stream), and node3 follows the leader.
/// 6. `patronictl reinit node3` during which a second `reinit --force` cancels the first
///    pgjet mid-copy (node3's method has `max_rate`: the copy lasts several seconds):
///    Patroni's SIGTERM ends it before Patroni's 10 s are up, and the second re-sync
///    leaves node3 streaming; no backup in progress, no pgjet process, only Patroni's slots.
/// 7. A backup of the leader into the repository; a row before and one after a point in
///    time; the WAL archived.
/// 8. Patroni's custom bootstrap: a new cluster (scope pgjet-pitr) made by `pgjet restore`
///    with Patroni's `recovery_conf` to that time, then led by Patroni: it holds the first
///    row, not the second.
/// 9. No leader: every member stops, node2's data is gone; node2 started again is made by
///    pgjet with no source (Patroni's `no_leader` call, `--connstring=` empty): seeded from
///    the S3 repository, it replays the archive through Patroni's restore_command and
///    Patroni promotes it; it holds both rows.
fn clone_cancel_and_repository(acc: &mut Acc, pg: &Pg) {
    // ------------------------------------------------------------- 5. clone from a replica
    let t = Instant::now();
    acc.add_node(
        "node3",
        pg,
        NodeOpts {
            max_rate: Some("4M"),
            ..NodeOpts::default()
        },
    );
    mkdir_pg(&acc.node("node3").data(), 0o700);
    acc.node_mut("node3").start();
    acc.wait_roles("node3 created", "node1", &["node2", "node3"]);
    step!("node3 cloned and streaming in {}", secs(t));
    let log = acc.report_replica_method("node3 created", "node3", 0);
    let node2_port = format!("port={}", acc.node("node2").pg_port);
    assert_log_has(
        &log,
        "node3 must be cloned by pgjet from node2 (clonefrom), a standby",
        &[
            node2_port.as_str(),
            "the source is a standby",
            "replica has been created using pgjet",
        ],
    );
    // The file transports copy a primary only: forced onto the standby, refused up front.
    let node2 = acc.node("node2");
    let never = std::env::temp_dir().join(format!("pgjet-never-{}", std::process::id()));
    let r = run_as_postgres(
        &pgjet_bin(),
        &args![
            "--source",
            format!(
                "host={} port={} user=postgres dbname=postgres",
                node2.dir.join("sock").display(),
                node2.pg_port
            ),
            "--transport",
            "libpq",
            "--pg-path",
            never.display(),
            "replica-create"
        ],
        None,
    );
    assert!(
        !r.success() && r.stderr.contains("the source is a standby") && !never.exists(),
        "--transport libpq from a standby must be refused before anything is written:\n{r}"
    );
    acc.wait_rows("node3", "30000", Some("after failover"));
    acc.assert_same_data("node3 cloned from node2", "node1", "node3");
    acc.assert_patroni_slots("after node3's clone");

    // ------------------------------------------------------------- 6. a cancelled re-sync
    let from = acc.node("node3").log_text().len();
    acc.patronictl(&["reinit", SCOPE, "node3", "--force"]);
    let first = wait_for(Duration::from_secs(30), || replica_create_pid(acc, "node3"))
        .unwrap_or_else(|| acc.fail("no pgjet replica-create for node3's reinit"));
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        pid_alive(first),
        "node3's re-sync ended within 3 s: too quick to cancel (max_rate)"
    );
    // When the first pgjet ends, seen from here (Patroni's reply comes only once its whole
    // reinit task has ended).
    let sent = Instant::now();
    let watch = std::thread::spawn(move || {
        wait_for(Duration::from_secs(30), || {
            (!pid_alive(first)).then(|| sent.elapsed())
        })
    });
    acc.patronictl(&["reinit", SCOPE, "node3", "--force"]);
    let ended = watch.join().unwrap();
    step!("reinit --force during the re-sync: pgjet {first} ended {ended:?} after it was sent");
    // Patroni sends SIGTERM, polls for 10 s, then kills.
    if ended.is_none_or(|e| e >= Duration::from_secs(8)) {
        acc.fail(&format!(
            "pgjet must end on Patroni's SIGTERM, before its SIGKILL 10 s later ({ended:?})"
        ));
    }
    // Patroni then makes node3 again: a new reinit with pgjet. (When Patroni's own loop
    // starts a bootstrap between the cancel and the new reinit, Patroni's cancel, still
    // polling for 10 s, kills that next process, and basebackup, the next method, makes
    // node3: Patroni's race, seen here once; the cancelled pgjet is what is checked.)
    let made = wait_for(TRANSITION, || {
        let l = acc.node("node3").log_since(from);
        l.contains("replica has been created using").then_some(())
    });
    if made.is_none() {
        acc.fail("node3 was not made again after the cancelled re-sync");
    }
    acc.wait_roles("re-sync after the cancel", "node1", &["node2", "node3"]);
    acc.report_replica_method("cancel", "node3", from);
    let all = acc.node("node3").log_since(from);
    assert!(
        all.contains("Terminating") && all.contains("exited with code=143"),
        "node3's log must show Patroni terminating the first pgjet and pgjet's status for SIGTERM (143):\n{}",
        tail(&all, 80)
    );
    assert!(
        replica_create_pid(acc, "node3").is_none(),
        "a pgjet replica-create is left running"
    );
    for n in ["node1", "node2"] {
        assert_eq!(
            acc.node(n)
                .psql("SELECT count(*) FROM pg_stat_progress_basebackup"),
            "0",
            "{n}: a base backup is left in progress after the cancel"
        );
    }
    acc.wait_rows("node3", "30000", Some("after failover"));
    acc.assert_patroni_slots("after the cancelled re-sync");

    // ------------------------------------------------------------- 7. backup, target
    acc.pgjet_on("node1", &["backup", "--start-fast"]);
    let leader = acc.node("node1");
    leader.psql("INSERT INTO acc_marks VALUES ('after backup')");
    std::thread::sleep(Duration::from_millis(1200));
    let target = leader
        .psql("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || '+00'");
    std::thread::sleep(Duration::from_millis(1200));
    leader.psql("INSERT INTO acc_marks VALUES ('after target')");
    let seg = leader.psql("SELECT pg_walfile_name(pg_switch_wal())");
    let archived = wait_for(Duration::from_secs(60), || {
        let last = leader.psql("SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver");
        (last.len() == 24 && last[8..] >= seg[8..]).then_some(())
    });
    assert!(archived.is_some(), "{seg} was not archived within 60 s");
    step!("backup in S3; target time {target}; WAL archived to {seg}");

    // ------------------------------------------------------------- 8. custom bootstrap
    let t = Instant::now();
    acc.add_node(
        "pitr1",
        pg,
        NodeOpts {
            scope: Some("pgjet-pitr"),
            bootstrap_to: Some(target.clone()),
            ..NodeOpts::default()
        },
    );
    acc.node_mut("pitr1").start();
    acc.wait_roles("PITR bootstrap", "pitr1", &[]);
    step!(
        "cluster pgjet-pitr bootstrapped by pgjet restore to {target} in {}",
        secs(t)
    );
    acc.report_replica_method("PITR bootstrap", "pitr1", 0);
    assert_eq!(
        acc.node("pitr1").psql(
            "SELECT (SELECT count(*) FROM acc_rows) || ':' || (SELECT string_agg(m, ',' ORDER BY m) FROM acc_marks)"
        ),
        "30000:after backup,after failover,after switchover",
        "the point-in-time bootstrap must hold what was committed before {target}, not after"
    );
    acc.node_mut("pitr1").stop();

    // ------------------------------------------------------------- 9. seed with no leader
    for n in ["node3", "node2", "node1"] {
        acc.node_mut(n).stop();
    }
    let data = acc.node("node2").data();
    fs::remove_dir_all(&data).unwrap();
    mkdir_pg(&data, 0o700);
    let t = Instant::now();
    let from = acc.node("node2").log_text().len();
    acc.node_mut("node2").start();
    acc.wait_roles("seeded with no leader", "node2", &[]);
    step!(
        "node2 seeded from S3 with no leader and promoted in {}",
        secs(t)
    );
    let log = acc.report_replica_method("no leader", "node2", from);
    assert_log_has(
        &log,
        "node2 must be seeded from the repository",
        &[
            "Patroni found no member to clone",
            "restoring backup",
            "replica has been created using pgjet",
        ],
    );
    assert_eq!(
        acc.node("node2").psql(
            "SELECT (SELECT count(*) FROM acc_rows) || ':' || (SELECT string_agg(m, ',' ORDER BY m) FROM acc_marks)"
        ),
        "30000:after backup,after failover,after switchover,after target",
        "the seeded member must hold everything archived"
    );
    acc.assert_patroni_slots("after the seed with no leader");
}
