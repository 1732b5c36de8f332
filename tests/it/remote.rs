//! Replicas and backups across a network, with nothing of pgjet on the primary.
//!
//! Every scenario runs in the network lab (tests/it/common/netlab.rs): the primary listens only
//! on host `a`'s address inside namespace `a`; pgjet runs in namespace `b`, inside a mount
//! namespace where the primary's data and tablespace directories are hidden under an empty
//! tmpfs, so no byte can take a local shortcut; `b`'s interface counters show the bytes
//! crossed the link. pgjet connects as `rep`, a role that is not a superuser and has exactly
//! the rights the README lists.
//!
//! - PostgreSQL 15: TLS with sslmode=verify-full against a test CA, password from a password
//!   file; replica-create, a backup from the remote primary restored and checked, `check`
//!   naming a missing right, a wrong password, delta onto a stale standby, onto an
//!   interrupted replica-create, after a cut link, after a primary restart, and onto a former
//!   primary that diverged after its standby was promoted (it then follows the new primary);
//!   a backup of the standby while the wire drops every packet between the hosts.
//! - PostgreSQL 16, 17 and 18 (without TLS: 18's wheel and 16's clients have none): SCRAM
//!   over plain TCP, password from PGPASSWORD; md5 authentication (right and wrong password);
//!   replica-create, backup and restore, delta onto a stale standby.

use crate::common::netlab::NetLab;
use crate::common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "rep";
const PASSWORD: &str = "rep secret'1";

/// The primary of a scenario, running in the lab's namespace `a`.
struct Remote {
    lab: NetLab,
    cluster: Cluster,
    /// Directories of the destination host (standbys, repository), never hidden.
    dest: Scratch,
    tls: bool,
    /// The CA that signed the server certificate (PostgreSQL 15 only).
    ca: PathBuf,
    /// A password file for `rep` (0600, owned by postgres).
    passfile: PathBuf,
}

impl Remote {
    fn new(pg: Pg, tag: &str, tls: bool) -> Remote {
        Remote::on_link(pg, tag, tls, Some("300mbit"), 2.0)
    }

    /// A scenario on a link of `rate` (tc tbf, None: unshaped) and `rtt_ms`.
    fn on_link(pg: Pg, tag: &str, tls: bool, rate: Option<&str>, rtt_ms: f64) -> Remote {
        let lab = NetLab::up(rate, rtt_ms);
        let cluster = Cluster::new(&pg, tag);
        let dest = Scratch::new(&format!("{tag}-dest"));
        let mut r = Remote {
            lab,
            cluster,
            dest,
            tls,
            ca: PathBuf::new(),
            passfile: PathBuf::new(),
        };
        r.configure();
        r
    }

    /// `--source <primary> --stanza main --repo-path <dest>/repo`: the repository the
    /// backups across the link go to.
    fn repo_args(&self) -> Vec<String> {
        args![
            "--source",
            self.source(""),
            "--stanza",
            "main",
            "--repo-path",
            self.dest.join("repo").display()
        ]
    }

    fn addr_a(&self) -> String {
        self.lab.addr_a.to_string()
    }

    /// Role, rights, pg_hba, TLS; then the primary is restarted inside namespace `a`,
    /// listening on its lab address (and its Unix socket, for the test's own psql).
    fn configure(&mut self) {
        let c = &self.cluster;
        let mut grants = format!(
            "CREATE ROLE {ROLE} LOGIN PASSWORD '{}';\nCREATE ROLE norights LOGIN PASSWORD 'x';\n",
            PASSWORD.replace('\'', "''")
        );
        grants.push_str(&format!(
            "ALTER ROLE {ROLE} REPLICATION;\nGRANT pg_read_all_settings TO {ROLE};\n\
             GRANT EXECUTE ON FUNCTION pg_backup_start(text, boolean) TO {ROLE};\n\
             GRANT EXECUTE ON FUNCTION pg_backup_stop(boolean) TO {ROLE};\n\
             GRANT EXECUTE ON FUNCTION pg_read_binary_file(text, bigint, bigint, boolean) TO {ROLE};\n\
             GRANT EXECUTE ON FUNCTION pg_ls_dir(text, boolean, boolean) TO {ROLE};\n\
             GRANT EXECUTE ON FUNCTION pg_stat_file(text, boolean) TO {ROLE};\n"
        ));
        c.psql("postgres", &grants);
        let kind = if self.tls { "hostssl" } else { "host" };
        fs::write(
            c.data().join("pg_hba.conf"),
            format!(
                "local all all trust\n{kind} all {ROLE} 0.0.0.0/0 scram-sha-256\n\
                 {kind} replication {ROLE} 0.0.0.0/0 scram-sha-256\n\
                 {kind} all norights 0.0.0.0/0 scram-sha-256\n"
            ),
        )
        .unwrap();
        let mut conf =
            String::from("\nlisten_addresses = '*'\npassword_encryption = 'scram-sha-256'\n");
        if self.tls {
            self.ca = self.make_certificates();
            conf.push_str("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        }
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(c.data().join("postgresql.conf"))
            .unwrap();
        std::io::Write::write_all(&mut f, conf.as_bytes()).unwrap();
        self.passfile = self.dest.join("pgpass");
        fs::write(
            &self.passfile,
            format!(
                "*:*:*:{ROLE}:{}\n",
                PASSWORD.replace('\\', "\\\\").replace(':', "\\:")
            ),
        )
        .unwrap();
        chown_pg_recursive(&self.passfile);
        fs::set_permissions(
            &self.passfile,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        self.restart_primary();
    }

    /// A test CA and a server certificate for both lab addresses (the standby, a copy, uses
    /// the same files once promoted). Returns the CA certificate's path.
    fn make_certificates(&self) -> PathBuf {
        let dir = self.dest.join("pki");
        mkdir_pg(&dir, 0o755);
        make_test_certificates(
            &dir,
            &self.lab.addr_a.to_string(),
            &format!(
                "subjectAltName=IP:{},IP:{}\nbasicConstraints=CA:FALSE\n",
                self.lab.addr_a, self.lab.addr_b
            ),
        );
        let data = self.cluster.data();
        fs::copy(dir.join("server.crt"), data.join("server.crt")).unwrap();
        fs::copy(dir.join("server.key"), data.join("server.key")).unwrap();
        chown_pg_recursive(data);
        fs::set_permissions(
            data.join("server.key"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        chown_pg_recursive(&dir);
        dir.join("ca.crt")
    }

    /// Stops the primary (after a checkpoint: the fixture runs with synchronous_commit off
    /// and stops with -m immediate) and starts it again inside namespace `a`.
    fn restart_primary(&mut self) {
        let _ = self.cluster.psql_run("postgres", "CHECKPOINT");
        self.cluster.server.stop();
        let s = &self.cluster.server;
        start_in_ns(
            &self.lab,
            &self.lab.ns_a,
            &s.pg,
            &s.data,
            s.port,
            &s.sock,
            &s.log,
        );
        let adopted = Server::adopt(&s.pg, &s.data, &s.log).expect("adopt the primary");
        let old = std::mem::replace(&mut self.cluster.server, adopted);
        std::mem::forget(old); // already stopped; its Drop would stop the new one
    }

    /// The connection string pgjet uses in namespace `b` (password from the password file).
    fn source(&self, extra: &str) -> String {
        // TLS runs use the password file, plain runs PGPASSWORD (see pgjet_in).
        let auth = if self.tls {
            format!(
                "sslmode=verify-full sslrootcert={} passfile={}",
                self.ca.display(),
                self.passfile.display()
            )
        } else {
            "sslmode=disable".into()
        };
        format!(
            "host={} port={} user={ROLE} dbname=postgres {auth} {extra}",
            self.addr_a(),
            self.cluster.port()
        )
    }

    /// Directories of the primary that pgjet in namespace `b` must not see.
    fn hidden(&self) -> Vec<PathBuf> {
        let mut v = vec![self.cluster.data().to_path_buf()];
        if self.cluster.ts1.exists() {
            v.push(self.cluster.ts1.clone());
        }
        v
    }

    /// Runs pgjet as postgres in namespace `ns` with `hidden` covered; PGPASSWORD is
    /// `password`, else rep's password on runs without TLS.
    fn pgjet_in(
        &self,
        ns: &str,
        hidden: &[PathBuf],
        args: &[String],
        password: Option<&str>,
    ) -> Run {
        let hidden: Vec<&Path> = hidden.iter().map(|p| p.as_path()).collect();
        let mut cmd = self.lab.command_hiding(ns, &hidden, "runuser");
        cmd.args(["-u", "postgres", "--", "env"]);
        if self.cluster.pg().major == "16" {
            // A small cluster: on 16 (no summaries) the delta lists the changed blocks from
            // the WAL; what the primary sends of it is here nearly as large as the data
            // (the default takes it up to an eighth).
            cmd.arg("PGJET_DELTA_WAL_SHARE=1");
        }
        if let Some(pw) = password.or((!self.tls).then_some(PASSWORD)) {
            cmd.arg(format!("PGPASSWORD={pw}"));
        }
        cmd.args(["timeout", "-k", "10", "600"])
            .arg(pgjet_bin())
            .args(args);
        run_command(cmd, args)
    }

    /// `pgjet replica-create` from `b` into `dir` (more flags in `extra`).
    fn replica_create(&self, dir: &Path, extra: &[&str]) -> Run {
        let mut a = args![
            "--source",
            self.source(""),
            "--pg-path",
            dir.display(),
            "--transport",
            "libpq",
            "--jobs",
            "3",
            "--output",
            "json",
            "replica-create",
            "--start-fast",
            "--tablespace-map",
            format!("ts1={}", self.ts_dir(dir).display())
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        self.pgjet_in(&self.lab.ns_b.clone(), &self.hidden(), &a, None)
    }

    /// Where a copy in `dir` keeps tablespace ts1.
    fn ts_dir(&self, dir: &Path) -> PathBuf {
        PathBuf::from(format!("{}-ts1", dir.display()))
    }

    /// Starts a copy (standby) inside namespace `ns` on a new port and socket.
    fn start_copy(&self, ns: &str, dir: &Path) -> Server {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let sock = self.dest.join(&format!("{name}-sock"));
        let log = self.dest.join(&format!("{name}.log"));
        let port = free_port();
        let pg = self.cluster.pg().clone();
        start_in_ns(&self.lab, ns, &pg, dir, port, &sock, &log);
        Server::adopt(&pg, dir, &log).expect("adopt the copy")
    }

    /// Waits until `standby` has replayed everything the primary has written so far.
    fn wait_caught_up(&self, standby: &Server) {
        wait_replayed(&self.cluster.server, standby);
    }
}

/// Waits (up to 60 s) until `standby` has replayed everything `primary` has inserted so far.
fn wait_replayed(primary: &Server, standby: &Server) {
    let target = primary.psql("postgres", "SELECT pg_current_wal_insert_lsn()");
    let ok = wait_for(Duration::from_secs(60), || {
        let r = standby.psql_run(
            "postgres",
            &format!("SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"),
        );
        (r.success() && r.stdout.trim() == "t").then_some(())
    });
    assert!(
        ok.is_some(),
        "{} did not catch up to {target}:\n{}",
        standby.data.display(),
        standby.log_tail()
    );
}

/// Runs a prepared command and captures it as a [`Run`].
fn run_command(mut cmd: Command, args: &[String]) -> Run {
    let t = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .current_dir("/tmp")
        .output()
        .expect("start pgjet in the lab");
    Run {
        cmdline: format!("pgjet {}", args.join(" ")),
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: t.elapsed(),
    }
}

/// Waits until a copy into `dir` has begun writing files; panics with the command's output
/// if it ended first or never began.
fn wait_copy_started(dir: &Path, handle: &std::thread::JoinHandle<Run>) {
    let began = wait_for(Duration::from_secs(60), || {
        (dir.join("base").exists() || handle.is_finished()).then_some(())
    });
    assert!(
        began.is_some(),
        "the copy into {} never started",
        dir.display()
    );
    assert!(
        !handle.is_finished() || dir.join("base").exists(),
        "the copy ended before it began writing"
    );
}

/// `pg_ctl start` as postgres inside namespace `ns`.
fn start_in_ns(lab: &NetLab, ns: &str, pg: &Pg, data: &Path, port: u16, sock: &Path, log: &Path) {
    if !sock.exists() {
        mkdir_pg(sock, 0o755);
    }
    let out = lab
        .command(ns, "runuser")
        .args(["-u", "postgres", "--"])
        .arg(pg.tool("pg_ctl"))
        .args(["start", "-w", "-t", "120", "-D"])
        .arg(data)
        .arg("-l")
        .arg(log)
        .arg("-o")
        .arg(format!("-p {port} -k {}", sock.display()))
        .current_dir("/tmp")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pg_ctl start in {ns} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        fs::read_to_string(log).unwrap_or_default()
    );
}

/// The JSON summary a pgjet command printed.
fn summary(r: &Run) -> serde_json::Value {
    serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}):\n{r}"))
}

/// Slots of the primary whose name starts with pgjet_ (temporary copy slots).
fn pgjet_slots(c: &Cluster) -> String {
    c.psql(
        "postgres",
        "SELECT string_agg(slot_name, ',') FROM pg_replication_slots WHERE slot_name LIKE 'pgjet%'",
    )
}

/// A full replica-create across the lab, then the checks a user makes.
fn replica_across_the_link(r: &Remote, dir: &Path) -> Server {
    let (rx0, _) = r.lab.iface_bytes(&r.lab.ns_b);
    let run = r.replica_create(dir, &["--slot", "standby1"]);
    if !run.success() {
        step!("primary's log:\n{}", r.cluster.server.log_tail());
    }
    let run = run.ok();
    let (rx1, _) = r.lab.iface_bytes(&r.lab.ns_b);
    let s = summary(&run);
    assert_eq!(s["transport"], "libpq", "{run}");
    let size = s["size"].as_u64().unwrap();
    step!(
        "replica-create over libpq: {} MiB in {:.1} s, {} MiB received on b's link",
        size >> 20,
        s["seconds"].as_f64().unwrap(),
        (rx1 - rx0) >> 20
    );
    assert!(
        rx1 - rx0 >= size,
        "only {} bytes crossed the link for {size} bytes copied",
        rx1 - rx0
    );
    assert!(
        !dir.join(pgjet_marker()).exists(),
        "the marker is removed at the end"
    );
    let conf = fs::read_to_string(dir.join("postgresql.auto.conf")).unwrap();
    assert!(conf.contains("primary_slot_name = 'standby1'"), "{conf}");
    if r.tls {
        // The password came from the password file: like pg_basebackup -R, the standby's
        // settings name that file and never hold the password itself.
        assert!(!conf.contains(PASSWORD), "password copied:\n{conf}");
        assert!(
            conf.contains(&format!("passfile={}", r.passfile.display())),
            "{conf}"
        );
    }
    let standby = r.start_copy(&r.lab.ns_b.clone(), dir);
    let streaming = wait_for(Duration::from_secs(60), || {
        let st = r.cluster.psql(
            "postgres",
            "SELECT state FROM pg_stat_replication WHERE application_name = 'standby1'",
        );
        (st == "streaming").then_some(())
    });
    assert!(
        streaming.is_some(),
        "standby does not stream:\n{}",
        standby.log_tail()
    );
    r.cluster
        .psql("postgres", "CREATE TABLE after_clone AS SELECT 42 AS v");
    r.wait_caught_up(&standby);
    assert_eq!(standby.psql("postgres", "SELECT v FROM after_clone"), "42");
    assert_same_fingerprint(
        "standby",
        &fingerprint(&r.cluster.server),
        &fingerprint(&standby),
    );
    standby
}

/// A backup of the standby in `dir` (namespace `b`) while the wire drops every packet
/// between the hosts, so the primary is unreachable: pgjet, run in `b` against the
/// standby's files, never needs it. The backup is restored (in the root namespace) and
/// holds the standby's rows. The link is mended afterwards.
fn standby_backup_with_the_primary_firewalled(r: &Remote, dir: &Path, standby: &Server) {
    let b = r.lab.ns_b.clone();
    let repo = r.dest.join("standby-repo");
    mkdir_pg(&repo, 0o750);
    let base = args![
        "--stanza",
        "main",
        "--repo-path",
        repo.display(),
        "--pg-path",
        dir.display(),
        "--pg-port",
        standby.port,
        "--pg-socket-path",
        standby.sock.display()
    ];
    let cut_rule = ["rule", "add", "priority", "1", "blackhole"];
    assert!(r.lab.exec(&r.lab.ns_wire, "ip", &cut_rule).status.success());
    let mut a = base.clone();
    a.push("stanza-create".into());
    let created = r.pgjet_in(&b, &r.hidden(), &a, None);
    let mut a = base.clone();
    a.extend(args!["--output", "json", "backup", "--start-fast"]);
    let run = r.pgjet_in(&b, &r.hidden(), &a, None);
    let fp = fingerprint(standby);
    let mend = ["rule", "del", "priority", "1"];
    assert!(r.lab.exec(&r.lab.ns_wire, "ip", &mend).status.success());
    let run = (created.ok(), run.ok()).1;
    let label = summary(&run)["label"].as_str().unwrap().to_string();
    step!(
        "backup {label} of the standby with the primary firewalled off: {:.1} s",
        run.elapsed.as_secs_f64()
    );
    let restored = r.dest.join("standby-restored");
    let ts = format!("ts1={}", r.ts_dir(&restored).display());
    pgjet_ok(&restore_args(&repo, &restored, &label, &ts));
    let server = start_restored(&r.cluster, "standby backup", &restored);
    assert_same_fingerprint(&label, &fp, &fingerprint(&server));
    drop(server);
    let _ = fs::remove_dir_all(&restored);
}

fn pgjet_marker() -> &'static str {
    "pgjet.incomplete"
}

/// A backup of the remote primary from `b`, restored, verified by pg_verifybackup, started
/// and compared with the primary.
fn backup_across_the_link(r: &Remote) {
    mkdir_pg(&r.dest.join("repo"), 0o750);
    let base = r.repo_args();
    let b = r.lab.ns_b.clone();
    let mut a = base.clone();
    a.push("stanza-create".into());
    r.pgjet_in(&b, &r.hidden(), &a, None).ok();
    let mut a = base.clone();
    a.extend(args![
        "--transport",
        "libpq",
        "--jobs",
        "3",
        "--output",
        "json",
        "backup",
        "--start-fast"
    ]);
    let run = r.pgjet_in(&b, &r.hidden(), &a, None).ok();
    let label = summary(&run)["label"].as_str().unwrap().to_string();
    let source_fp = fingerprint(&r.cluster.server);
    let mut a = base.clone();
    a.extend(args!["verify", "--set", label]);
    r.pgjet_in(&b, &r.hidden(), &a, None).ok();
    // The same over the BASE_BACKUP stream (the server's best method: zstd on PostgreSQL 15,
    // gzip after zstd and lz4 are refused on the PostgreSQL 18 wheel): verify passes.
    let mut a = base.clone();
    a.extend(args![
        "--transport",
        "basebackup",
        "--network-compress",
        "auto",
        "--output",
        "json",
        "backup",
        "--start-fast"
    ]);
    let run = r.pgjet_in(&b, &r.hidden(), &a, None).ok();
    let stream_label = summary(&run)["label"].as_str().unwrap().to_string();
    let mut a = base.clone();
    a.extend(args!["verify", "--set", stream_label]);
    r.pgjet_in(&b, &r.hidden(), &a, None).ok();
    step!("backup {stream_label} over the BASE_BACKUP stream verified");
    let restored = r.dest.join("restored");
    let ts = r.ts_dir(&restored);
    let mut a = base;
    a.extend(args![
        "--pg-path",
        restored.display(),
        "restore",
        "--set",
        label,
        "--tablespace-map",
        format!("ts1={}", ts.display())
    ]);
    r.pgjet_in(&b, &r.hidden(), &a, None).ok();
    verifybackup_if_any(r.cluster.pg(), &restored, "backup across the link");
    let server = r.start_copy(&b, &restored);
    server.wait_promoted(Duration::from_secs(120));
    assert_same_fingerprint(
        "restored from a remote backup",
        &source_fp,
        &fingerprint(&server),
    );
    step!("backup {label} of the remote primary restored and compared");
}

/// Stops `standby`, writes on the primary, and re-syncs it with --delta: fewer bytes cross
/// than a full copy, and it then streams and holds the primary's rows. With `summaries`
/// (the primary summarizes WAL): the changed blocks come from the WAL summaries, so
/// relation files are neither read nor compared, and the writes include what the
/// summaries' rules cover beyond changed blocks (a relation truncated, rewritten, dropped
/// and created, a database created).
fn delta_onto_stale_standby(
    r: &Remote,
    standby: Server,
    full_bytes: u64,
    summaries: bool,
) -> Server {
    delta_onto_stale_standby_run(r, standby, full_bytes, summaries).0
}

/// [`delta_onto_stale_standby`], with the delta's run.
fn delta_onto_stale_standby_run(
    r: &Remote,
    standby: Server,
    full_bytes: u64,
    summaries: bool,
) -> (Server, Run) {
    let dir = standby.data.clone();
    let (run, received) = resync_stale_standby(r, standby, summaries, |r| {
        r.replica_create(&dir, &["--delta"]).ok()
    });
    let s = summary(&run);
    let same = s["delta_same"].as_u64().unwrap();
    let copied = s["delta_copied"].as_u64().unwrap();
    step!(
        "delta onto the stale standby: {} MiB unchanged, {} MiB copied, {} MiB received",
        same >> 20,
        copied >> 20,
        received >> 20
    );
    let listed = run
        .stderr
        .lines()
        .find(|l| l.contains("WAL summaries"))
        .unwrap_or("");
    step!("{listed}");
    // Without summaries the delta lists the changed blocks from the WAL since the
    // standby's redo point: the standby's own pg_wal up to where it stopped, the primary's
    // after (its wal_keep_size holds it). On 16 (the test's PGJET_DELTA_WAL_SHARE=1, the
    // primary's part no larger than the data) it must; the primary's segments cross the
    // link, the rest must still be less than a full copy.
    let mut wal_read = 0u64;
    let wal_line = run
        .stderr
        .lines()
        .find(|l| l.contains("WAL from the target's") && l.contains("block changes"));
    if let Some(line) = wal_line {
        step!("{line}");
        let primary: u64 = line
            .split_once(" from the primary's")
            .and_then(|(head, _)| head.rsplit(", ").next())
            .and_then(|n| n.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        wal_read = primary << 24;
    }
    if r.cluster.pg().major == "16" {
        assert!(
            wal_line.is_some_and(|l| l.contains("segments from the target's own pg_wal")),
            "no WAL listing of the changed blocks from the standby's own WAL:\n{run}"
        );
    }
    assert_eq!(
        listed.contains("list") && listed.contains("block changes"),
        summaries,
        "WAL summaries used: expected {summaries}:\n{run}"
    );
    assert!(same > 0 && copied > 0, "{run}");
    assert!(
        received < full_bytes + wal_read,
        "delta moved {received} bytes ({wal_read} of WAL read), a full copy {full_bytes}"
    );
    (check_resynced(r, &dir, listed_by_rules(r, summaries)), run)
}

/// Whether a re-sync lists its changed blocks by the rules of the WAL summaries (dropped,
/// truncated and created relations): with the summaries, and on 16 from the WAL itself.
fn listed_by_rules(r: &Remote, summaries: bool) -> bool {
    summaries || r.cluster.pg().major == "16"
}

/// Patroni's `replicator` (REPLICATION and nothing else) re-syncs the stale standby over the
/// `BASE_BACKUP` stream: on 17+ with summaries, PostgreSQL's incremental `BASE_BACKUP`
/// sends only the blocks changed since the standby's redo point (a relation truncated,
/// rewritten, dropped and created, a database created: the summaries' rules), applied in
/// place; less than half of a full copy crosses the link, and the standby holds the
/// primary's rows.
fn stream_delta_by_replication_role(r: &Remote, standby: Server, full_bytes: u64) -> Server {
    r.cluster.psql(
        "postgres",
        &format!(
            "CREATE ROLE replonly LOGIN REPLICATION PASSWORD '{}'",
            PASSWORD.replace('\'', "''")
        ),
    );
    let hba = r.cluster.data().join("pg_hba.conf");
    let mut lines = fs::read_to_string(&hba).unwrap();
    lines.push_str(
        "host replication replonly 0.0.0.0/0 scram-sha-256\nhost all replonly 0.0.0.0/0 scram-sha-256\n",
    );
    fs::write(&hba, lines).unwrap();
    r.cluster.psql("postgres", "SELECT pg_reload_conf()");
    let dir = standby.data.clone();
    let (run, received) = resync_stale_standby(r, standby, true, |r| {
        replonly_resync(r, &dir, &r.ts_dir(&dir))
    });
    let s = summary(&run);
    let copied = s["delta_copied"].as_u64().unwrap();
    step!(
        "incremental stream onto the stale standby, role with REPLICATION only: {} MiB written, {} MiB received, a full copy {} MiB",
        copied >> 20,
        received >> 20,
        full_bytes >> 20
    );
    log_line(
        &run,
        "incremental (PostgreSQL",
        "the re-sync must be PostgreSQL's incremental BASE_BACKUP",
    );
    assert!(copied > 0, "{run}");
    assert!(
        received < full_bytes / 2,
        "the incremental stream moved {received} bytes, a full copy {full_bytes}:\n{run}"
    );
    assert!(
        !dir.join("backup_manifest").exists(),
        "an incremental stream's manifest lists increments, not the files rebuilt"
    );
    let label = fs::read_to_string(dir.join("backup_label")).unwrap();
    assert!(!label.contains("INCREMENTAL"), "{label}");
    check_resynced(r, &dir, true)
}

/// `replica-create --delta` of `dir` over the stream by the role `replonly` (REPLICATION
/// only), from `b`, its tablespace in `ts`; the run must succeed.
fn replonly_resync(r: &Remote, dir: &Path, ts: &Path) -> Run {
    let a = args![
        "--source",
        format!(
            "host={} port={} user=replonly dbname=postgres sslmode=disable",
            r.addr_a(),
            r.cluster.port()
        ),
        "--pg-path",
        dir.display(),
        "--transport",
        "basebackup",
        "--output",
        "json",
        "replica-create",
        "--start-fast",
        "--delta",
        "--tablespace-map",
        format!("ts1={}", ts.display())
    ];
    r.pgjet_in(&r.lab.ns_b.clone(), &r.hidden(), &a, None).ok()
}

/// The primary's WAL summaries gone (as `wal_summary_keep_time` removes them): the server
/// refuses the incremental `BASE_BACKUP` before sending anything, and the re-sync by the
/// replication-only role takes the whole stream instead, compared block by block, saying
/// why; the standby then holds the primary's rows.
fn incremental_refused_takes_the_whole_stream(
    r: &Remote,
    standby: Server,
    full_bytes: u64,
) -> Server {
    let dir = standby.data.clone();
    let (run, received) = resync_stale_standby(r, standby, true, |r| {
        // The summarizer first reaches the last checkpoint's redo point: removed before it
        // does, the summaries of the re-sync's range would be written after the removal.
        let caught_up = wait_for(Duration::from_secs(60), || {
            let done = r.cluster.psql(
                "postgres",
                "SELECT summarized_lsn >= (SELECT redo_lsn FROM pg_control_checkpoint()) \
                 FROM pg_get_wal_summarizer_state()",
            );
            (done == "t").then_some(())
        });
        assert!(
            caught_up.is_some(),
            "the WAL summarizer never reached the checkpoint's redo point"
        );
        let summaries = r.cluster.data().join("pg_wal/summaries");
        for e in fs::read_dir(&summaries).unwrap() {
            fs::remove_file(e.unwrap().path()).unwrap();
        }
        replonly_resync(r, &dir, &r.ts_dir(&dir))
    });
    step!(
        "incremental refused (summaries gone): the whole stream, {} MiB received, a full copy {} MiB",
        received >> 20,
        full_bytes >> 20
    );
    log_line(
        &run,
        "the server refused the incremental BASE_BACKUP",
        "a refused incremental BASE_BACKUP must fall back to the whole stream",
    );
    // The whole cluster crosses (compressed: the wire holds less than the copy's bytes).
    let sent = summary(&run)["size"].as_u64().unwrap();
    assert!(
        sent > full_bytes / 2,
        "the whole stream must cross: {sent} bytes of files, a full copy {full_bytes}:\n{run}"
    );
    check_resynced(r, &dir, true)
}

/// A re-sync by the replication-only role that moves the tablespace (`--tablespace-map` to a
/// new directory): the incremental `BASE_BACKUP` would apply increments to files that are
/// not where the manifest says, so the whole stream is taken, saying why; the tablespace is
/// written in its new place, `pg_tblspc` points there, and the standby holds the rows.
fn moved_tablespace_takes_the_whole_stream(r: &Remote, standby: Server) -> Server {
    let dir = standby.data.clone();
    let moved = PathBuf::from(format!("{}-moved", r.ts_dir(&dir).display()));
    let (run, _) = resync_stale_standby(r, standby, true, |r| replonly_resync(r, &dir, &moved));
    log_line(
        &run,
        "moves from",
        "a moved tablespace must make the re-sync take the whole stream",
    );
    let links: Vec<PathBuf> = fs::read_dir(dir.join("pg_tblspc"))
        .unwrap()
        .map(|e| fs::read_link(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(links, vec![moved.clone()], "{run}");
    check_resynced(r, &dir, true)
}

/// Stops `standby`, writes on the primary (with `summaries`, also what the summaries'
/// rules cover beyond changed blocks), checkpoints, and runs `resync`. Returns its run and
/// the bytes namespace `b` received meanwhile.
fn resync_stale_standby(
    r: &Remote,
    standby: Server,
    summaries: bool,
    resync: impl FnOnce(&Remote) -> Run,
) -> (Run, u64) {
    let dir = standby.data.clone();
    // Dropped (stopped) now, not at the end: a Server stops whatever runs in its directory
    // when dropped, and the standby started again below runs there.
    drop(standby);
    assert_control_reads_as_pg_controldata(r.cluster.pg(), &dir);
    let (bin, a) = pgbench_args(&r.cluster.server, &args!["-n", "-t", "200", "-c", "2"]);
    run_as_postgres(&bin, &a, None).ok();
    // The changes the summaries' rules (and the WAL listing's, on 16) cover beyond changed
    // blocks; again on a second re-sync, on objects made anew.
    if listed_by_rules(r, summaries) {
        r.cluster
            .psql("postgres", "DROP DATABASE IF EXISTS after_stop");
        r.cluster.psql(
            "postgres",
            "DROP TABLE IF EXISTS t_trunc, t_new;\n\
             CREATE TABLE t_trunc AS SELECT i, md5(i::text) v FROM generate_series(1, 20000) i;\n\
             CREATE TABLE t_drop AS SELECT i FROM generate_series(1, 5000) i;",
        );
        r.cluster.psql("postgres", "CHECKPOINT");
        r.cluster.psql(
            "postgres",
            "DELETE FROM t_trunc WHERE i > 100; VACUUM t_trunc;\n\
             INSERT INTO t_trunc SELECT i, 'again' FROM generate_series(101, 300) i;\n\
             DROP TABLE t_drop;\n\
             CREATE TABLE t_new AS SELECT i FROM generate_series(1, 7000) i;\n\
             VACUUM FULL pgbench_branches;",
        );
        r.cluster.psql("postgres", "CREATE DATABASE after_stop");
        r.cluster.psql(
            "after_stop",
            "CREATE TABLE t AS SELECT i FROM generate_series(1, 1000) i",
        );
    }
    r.cluster.psql("postgres", "CHECKPOINT");
    let (rx0, _) = r.lab.iface_bytes(&r.lab.ns_b);
    let run = resync(r);
    let (rx1, _) = r.lab.iface_bytes(&r.lab.ns_b);
    (run, rx1 - rx0)
}

/// Starts the re-synced standby in `dir`: it streams from the primary and holds its rows
/// (with `summaries`, the tables [`resync_stale_standby`] changed too).
fn check_resynced(r: &Remote, dir: &Path, summaries: bool) -> Server {
    let standby = r.start_copy(&r.lab.ns_b.clone(), dir);
    r.cluster.psql(
        "postgres",
        "DROP TABLE IF EXISTS after_delta; CREATE TABLE after_delta AS SELECT 7 AS v",
    );
    r.wait_caught_up(&standby);
    assert_eq!(standby.psql("postgres", "SELECT v FROM after_delta"), "7");
    assert_same_fingerprint(
        "standby after --delta",
        &fingerprint(&r.cluster.server),
        &fingerprint(&standby),
    );
    if summaries {
        assert_eq!(standby.psql("after_stop", "SELECT count(*) FROM t"), "1000");
        assert_eq!(
            standby.psql("postgres", "SELECT count(*), sum(i) FROM t_trunc"),
            r.cluster
                .psql("postgres", "SELECT count(*), sum(i) FROM t_trunc")
        );
    }
    standby
}

/// The README's re-sync of a standby made with `--slot standby1` (`replica-create --delta`
/// without `--slot`), just run: the standby keeps its slot, its application_name, its port
/// and its own settings, streams from `standby1`, and no slot is left that nothing uses.
/// Run again as a user would, with `--slot standby1`: the slot is reused, not refused.
fn resync_keeps_the_standby_and_its_slot(r: &Remote, dir: &Path, standby: Server) -> Server {
    use pgjet_core::pgdata::own_settings::OwnSettings;
    let check_slot = |standby: &Server, what: &str, slot: &str| {
        step!("{what}: checking the standby's settings and slot");
        let own = OwnSettings::read(dir).unwrap();
        assert_eq!(own.slot().as_deref(), Some(slot), "{what}: slot");
        assert_eq!(own.get("port").as_deref(), Some("5499"), "{what}: port");
        assert_eq!(
            own.get("hot_standby_feedback").as_deref(),
            Some("on"),
            "{what}"
        );
        let ci = own.conninfo().expect("primary_conninfo");
        assert_eq!(ci.get("application_name"), Some("standby1"), "{what}");
        let t = Instant::now();
        let streaming = wait_for(Duration::from_secs(60), || {
            let v = r.cluster.psql(
                "postgres",
                "SELECT string_agg(slot_name || ':' || active, ',' ORDER BY slot_name) FROM pg_replication_slots",
            );
            (v == format!("{slot}:true")).then_some(())
        });
        assert!(
            streaming.is_some(),
            "{what}: the standby must stream from {slot}, the only slot, after {:.1} s: {} (pg_stat_replication: {})\n{}\n{}",
            t.elapsed().as_secs_f64(),
            r.cluster.psql(
                "postgres",
                "SELECT string_agg(slot_name || ':' || active, ',') FROM pg_replication_slots"
            ),
            r.cluster.psql(
                "postgres",
                "SELECT string_agg(application_name || ':' || state, ',') FROM pg_stat_replication"
            ),
            fs::read_to_string(dir.join("postgresql.auto.conf")).unwrap_or_default(),
            format_args!(
                "standby {} (port {}): wal receiver: {}\n{}",
                standby.data.display(),
                standby.port,
                standby.psql_run("postgres", "SELECT status, slot_name, sender_host, conninfo FROM pg_stat_wal_receiver"),
                standby.log_tail()
            )
        );
        step!("{what}: the standby kept its settings and streams from slot {slot}");
    };
    let check = |standby: &Server, what: &str| check_slot(standby, what, "standby1");
    check(&standby, "re-sync without --slot");
    drop(standby); // stops it (and must not outlive it: it would stop the next one)
    let run = r
        .replica_create(dir, &["--delta", "--slot", "standby1"])
        .ok();
    log_line(
        &run,
        "is reused",
        "the existing, unused slot must be reused",
    );
    let standby = r.start_copy(&r.lab.ns_b.clone(), dir);
    check(&standby, "re-sync with --slot standby1");
    // Another copy asking for the slot this standby streams from: refused before anything
    // is copied, and the slot stays in use.
    let other = r.dest.join("slot-in-use");
    r.replica_create(&other, &["--slot", "standby1"])
        .fails_with("replication slot standby1 is in use");
    assert!(!other.join("global/pg_control").exists());
    check(&standby, "after a copy asked for its slot");
    // A re-sync onto another slot that exists but holds no WAL (made without reserving
    // any): it is made again from the copy's slot, and the standby's former slot is dropped.
    r.cluster.psql(
        "postgres",
        "SELECT pg_create_physical_replication_slot('standby2')",
    );
    drop(standby);
    let run = r
        .replica_create(dir, &["--delta", "--slot", "standby2"])
        .ok();
    log_line(
        &run,
        "no longer holds the WAL",
        "a reused slot without WAL must be made again",
    );
    log_line(
        &run,
        "former slot, was dropped",
        "the slot the standby left must be dropped",
    );
    let standby = r.start_copy(&r.lab.ns_b.clone(), dir);
    check_slot(&standby, "re-sync onto an unreserved slot", "standby2");
    standby
}

fn dataset(r: &Remote) {
    load_dataset(
        &r.cluster,
        DatasetSpec {
            pgbench_scale: 2,
            small_tables: 300,
            random_bytes: 24 << 20,
        },
    );
}

#[test]
fn remote_pg15_tls_replica_backup_delta_and_faults() {
    let mut r = Remote::new(Pg::v15(), "remote15", true);
    dataset(&r);
    let b = r.lab.ns_b.clone();

    // check names what a role lacks, with the statement that fixes it.
    let mut a = args![
        "--source",
        r.source("")
            .replace(&format!("user={ROLE}"), "user=norights"),
        "check"
    ];
    r.pgjet_in(&b, &r.hidden(), &a, Some("x"))
        .fails_with("GRANT EXECUTE ON FUNCTION pg_backup_start(text, boolean) TO norights;");
    a = args!["--source", r.source(""), "check"];
    let ok = r.pgjet_in(&b, &r.hidden(), &a, None).ok();
    assert!(ok.stdout.contains("every right"), "{ok}");
    // A wrong password is a clear connection error (exit code 3).
    a = args![
        "--source",
        format!(
            "host={} port={} user={ROLE} password=wrong sslmode=verify-full sslrootcert={}",
            r.addr_a(),
            r.cluster.port(),
            r.ca.display()
        ),
        "--pg-path",
        r.dest.join("never").display(),
        "replica-create"
    ];
    let bad = r
        .pgjet_in(&b, &r.hidden(), &a, None)
        .fails_with("password authentication failed");
    assert_eq!(bad.status.code(), Some(3), "{bad}");
    assert!(!r.dest.join("never").exists());
    // verify-full refuses a certificate for another name.
    a = args![
        "--source",
        r.source("").replace(
            &format!("host={}", r.addr_a()),
            &format!("host={} hostaddr={}", "wrong.example", r.addr_a())
        ),
        "check"
    ];
    r.pgjet_in(&b, &r.hidden(), &a, None)
        .fails_with("certificate");

    let standby_dir = r.dest.join("standby");
    let full_bytes;
    let standby = {
        let (rx0, _) = r.lab.iface_bytes(&b);
        let s = replica_across_the_link(&r, &standby_dir);
        full_bytes = r.lab.iface_bytes(&b).0 - rx0;
        s
    };
    standby_backup_with_the_primary_firewalled(&r, &standby_dir, &standby);
    backup_across_the_link(&r);
    // The standby's own settings, as a DBA adds them: the re-sync must keep them.
    fs::write(
        standby_dir.join("postgresql.auto.conf"),
        format!(
            "{}hot_standby_feedback = 'on'\nport = '5499'\n",
            fs::read_to_string(standby_dir.join("postgresql.auto.conf")).unwrap()
        ),
    )
    .unwrap();
    let standby = delta_onto_stale_standby(&r, standby, full_bytes, false);
    let standby = resync_keeps_the_standby_and_its_slot(&r, &standby_dir, standby);

    // An interrupted replica-create: killed mid-copy, it leaves no pg_control and no slot;
    // --delta then finishes the job.
    let cut = r.dest.join("interrupted");
    let pidfile = r.dest.join("interrupted.pid");
    let args_bg = args![
        "netns",
        "exec",
        b,
        "runuser",
        "-u",
        "postgres",
        "--",
        "sh",
        "-c",
        format!("echo $$ > {}; exec \"$0\" \"$@\"", pidfile.display()),
        pgjet_bin().display(),
        "--source",
        r.source(""),
        "--pg-path",
        cut.display(),
        "--transport",
        "libpq",
        "--jobs",
        "1",
        "replica-create",
        "--start-fast",
        "--tablespace-map",
        format!("ts1={}", r.ts_dir(&cut).display())
    ];
    let mut child = Command::new("ip")
        .args(&args_bg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = wait_for(Duration::from_secs(60), || {
        cut.join("base").exists().then_some(())
    });
    assert!(started.is_some(), "the copy never started");
    let pid: i32 = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = child.wait();
    assert!(
        !cut.join("global/pg_control").exists(),
        "a killed copy must not look complete"
    );
    assert!(
        cut.join(pgjet_marker()).exists(),
        "the marker proves the unfinished copy's identity"
    );
    let gone = wait_for(Duration::from_secs(30), || {
        (pgjet_slots(&r.cluster).is_empty()).then_some(())
    });
    assert!(gone.is_some(), "slot leaked: {}", pgjet_slots(&r.cluster));
    let run = r.replica_create(&cut, &["--delta"]).ok();
    assert!(summary(&run)["delta_copied"].as_u64().is_some(), "{run}");
    let finished = r.start_copy(&b, &cut);
    r.wait_caught_up(&finished);
    assert_same_fingerprint(
        "interrupted copy finished by --delta",
        &fingerprint(&r.cluster.server),
        &fingerprint(&finished),
    );
    drop(finished);

    // A link cut mid-copy, over the ranges and over the BASE_BACKUP stream (slowed so the
    // cut lands in its middle).
    link_cut(&r, "linkcut", &["--transport", "libpq"]);
    link_cut(
        &r,
        "linkcut-stream",
        &["--transport", "basebackup", "--max-rate", "2M"],
    );
    let hidden = r.hidden();

    // The primary restarted mid-copy: a clear error, then --delta finishes.
    let cut3 = r.dest.join("restarted");
    let a3 = args![
        "--source",
        r.source(""),
        "--pg-path",
        cut3.display(),
        "--transport",
        "libpq",
        "--jobs",
        "1",
        "replica-create",
        "--start-fast",
        "--tablespace-map",
        format!("ts1={}", r.ts_dir(&cut3).display())
    ];
    let h: Vec<&Path> = hidden.iter().map(|p| p.as_path()).collect();
    let mut c = r.lab.command_hiding(&b, &h, "runuser");
    c.args(["-u", "postgres", "--", "timeout", "300"])
        .arg(pgjet_bin())
        .args(&a3);
    let handle = std::thread::spawn(move || run_command(c, &a3));
    wait_copy_started(&cut3, &handle);
    r.restart_primary();
    let res = handle.join().unwrap();
    if res.success() {
        step!("note: the copy finished before the restart took effect");
    } else {
        assert!(!cut3.join("global/pg_control").exists());
        step!(
            "primary restart: {}",
            res.stderr.lines().last().unwrap_or("")
        );
    }
    r.replica_create(&cut3, &["--delta"]).ok();

    // A former primary that diverged: promote the standby, write on both, then turn the old
    // primary into a standby of the new one with --delta, run from the old primary's host.
    drop(standby);
    former_primary_follows(&mut r, &standby_dir);
}

/// A link cut in the middle of replica-create into `<dest>/<name>` (with `extra` flags): a
/// clear error within the keepalive window, nothing that looks complete, no slot leaked;
/// `--delta` (over libpq ranges) afterwards finishes the job.
fn link_cut(r: &Remote, name: &str, extra: &[&str]) {
    let b = r.lab.ns_b.clone();
    let cut2 = r.dest.join(name);
    let lab_wire = r.lab.ns_wire.clone();
    let source_fast_fail = r
        .source("keepalives_idle=1 keepalives_interval=1 keepalives_count=3 tcp_user_timeout=3000");
    let mut a2 = args![
        "--source",
        source_fast_fail,
        "--pg-path",
        cut2.display(),
        "--jobs",
        "1"
    ];
    a2.extend(extra.iter().map(|s| s.to_string()));
    a2.extend(args![
        "replica-create",
        "--start-fast",
        "--tablespace-map",
        format!("ts1={}", r.ts_dir(&cut2).display())
    ]);
    let hidden = r.hidden();
    let lab_cmd = {
        let h: Vec<&Path> = hidden.iter().map(|p| p.as_path()).collect();
        let mut c = r.lab.command_hiding(&b, &h, "runuser");
        c.args(["-u", "postgres", "--", "timeout", "300"])
            .arg(pgjet_bin())
            .args(&a2);
        c
    };
    let handle = std::thread::spawn(move || run_command(lab_cmd, &a2));
    wait_copy_started(&cut2, &handle);
    // The wire drops every packet from either host (a policy rule ahead of the lab's own).
    let cut_rule = ["rule", "add", "priority", "1", "blackhole"];
    assert!(r.lab.exec(&lab_wire, "ip", &cut_rule).status.success());
    let res = handle.join().unwrap();
    let mend = ["rule", "del", "priority", "1"];
    assert!(r.lab.exec(&lab_wire, "ip", &mend).status.success());
    assert!(!res.success(), "a copy over a cut link must fail:\n{res}");
    step!(
        "link cut ({name}): failed after {:.1} s: {}",
        res.elapsed.as_secs_f64(),
        res.stderr.lines().last().unwrap_or("")
    );
    assert!(res.elapsed < Duration::from_secs(120), "{res}");
    assert!(!cut2.join("global/pg_control").exists());
    let gone = wait_for(Duration::from_secs(90), || {
        (pgjet_slots(&r.cluster).is_empty()).then_some(())
    });
    assert!(
        gone.is_some(),
        "slot leaked after the link cut: {}",
        pgjet_slots(&r.cluster)
    );
    r.replica_create(&cut2, &["--delta"]).ok();
    assert!(cut2.join("global/pg_control").exists());
}

/// The pg_rewind case: the standby in `standby_dir` is promoted; the old primary writes a
/// row the new one never sees; --delta (run in `a`, the new primary's files hidden) makes the
/// old primary a standby of the new one, without the diverged row.
fn former_primary_follows(r: &mut Remote, standby_dir: &Path) {
    let b = r.lab.ns_b.clone();
    let a_ns = r.lab.ns_a.clone();
    let new_primary = r.start_copy(&b, standby_dir);
    let promote = run_as_postgres(
        &r.cluster.pg().tool("pg_ctl"),
        &args!["promote", "-w", "-D", standby_dir.display()],
        None,
    );
    assert!(promote.success(), "{promote}");
    new_primary.wait_promoted(Duration::from_secs(60));
    new_primary.psql(
        "postgres",
        "CREATE TABLE on_new_primary AS SELECT 1 AS v; CHECKPOINT",
    );
    r.cluster.psql(
        "postgres",
        "CREATE TABLE diverged AS SELECT 1 AS v; CHECKPOINT",
    );
    let old_data = r.cluster.data().to_path_buf();
    r.cluster.server.stop();
    // pgjet runs on the old primary's host now, the new primary's files hidden.
    let source = {
        let ssl = format!("sslmode=verify-full sslrootcert={}", r.ca.display());
        format!(
            "host={} port={} user={ROLE} dbname=postgres passfile={} {ssl}",
            r.lab.addr_b,
            new_primary.port,
            r.passfile.display()
        )
    };
    let a = args![
        "--source",
        source,
        "--pg-path",
        old_data.display(),
        "--jobs",
        "3",
        "--output",
        "json",
        "replica-create",
        "--delta",
        "--start-fast",
        "--tablespace-map",
        format!("ts1={}", r.cluster.ts1.display())
    ];
    let hide = vec![standby_dir.to_path_buf(), r.ts_dir(standby_dir)];
    let run = r.pgjet_in(&a_ns, &hide, &a, None).ok();
    let s = summary(&run);
    step!(
        "former primary re-synced: {} MiB unchanged, {} MiB copied",
        s["delta_same"].as_u64().unwrap() >> 20,
        s["delta_copied"].as_u64().unwrap() >> 20
    );
    r.restart_primary();
    let old = &r.cluster.server;
    assert_eq!(old.psql("postgres", "SELECT pg_is_in_recovery()"), "t");
    new_primary.psql("postgres", "CREATE TABLE followed AS SELECT 3 AS v");
    wait_replayed(&new_primary, old);
    assert_eq!(old.psql("postgres", "SELECT v FROM followed"), "3");
    assert_eq!(old.psql("postgres", "SELECT v FROM on_new_primary"), "1");
    assert_eq!(
        old.psql(
            "postgres",
            "SELECT count(*) FROM pg_class WHERE relname = 'diverged'"
        ),
        "0",
        "the diverged table must be gone"
    );
    assert_same_fingerprint(
        "former primary",
        &fingerprint(&new_primary),
        &fingerprint(old),
    );
}

#[test]
fn remote_pg18_scram_replica_backup_delta() {
    scram_replica_backup_delta(Pg::v18(), "remote18");
}

#[test]
fn remote_pg17_scram_replica_backup_delta() {
    scram_replica_backup_delta(Pg::v17(), "remote17");
}

#[test]
fn remote_pg16_scram_replica_backup_delta() {
    scram_replica_backup_delta(Pg::v16(), "remote16");
}

/// Without TLS (the wheel's 18 and the 16 clients have none): SCRAM and md5 authentication,
/// `--transport local` refused across hosts, replica-create, a backup restored, delta onto a
/// stale standby.
fn scram_replica_backup_delta(pg: Pg, tag: &str) {
    let r = Remote::new(pg, tag, false);
    // 17 and 18 summarize WAL: the delta takes its changed blocks from the summaries.
    let summaries = matches!(r.cluster.pg().major, "17" | "18");
    if summaries {
        r.cluster.summarize_wal();
    }
    // The primary keeps its WAL since the standby stopped, as a busy primary's max_wal_size
    // does (a test's checkpoints recycle it at once): the delta without summaries reads it.
    r.cluster
        .psql("postgres", "ALTER SYSTEM SET wal_keep_size = '512MB'");
    r.cluster.psql("postgres", "SELECT pg_reload_conf()");
    dataset(&r);
    let b = r.lab.ns_b.clone();
    // md5 authentication: a role whose password is stored as md5, allowed by an md5 line.
    r.cluster.psql(
        "postgres",
        "SET password_encryption = 'md5'; CREATE ROLE md5user LOGIN PASSWORD 'md5 pw';",
    );
    let hba = r.cluster.data().join("pg_hba.conf");
    let mut lines = fs::read_to_string(&hba).unwrap();
    lines.push_str("host all md5user 0.0.0.0/0 md5\n");
    fs::write(&hba, lines).unwrap();
    r.cluster.psql("postgres", "SELECT pg_reload_conf()");
    let a = args![
        "--source",
        format!(
            "host={} port={} user=md5user sslmode=disable",
            r.addr_a(),
            r.cluster.port()
        ),
        "check"
    ];
    // --transport local is refused where the primary's files are not on this host.
    let never = r.dest.join("never");
    let local = args![
        "--source",
        r.source(""),
        "--transport",
        "local",
        "--pg-path",
        never.display(),
        "replica-create"
    ];
    r.pgjet_in(&b, &r.hidden(), &local, None)
        .fails_with("does not run on this host");
    assert!(!never.exists());
    assert!(pgjet_slots(&r.cluster).is_empty());
    let md5 = r
        .pgjet_in(&b, &r.hidden(), &a, Some("md5 pw"))
        .fails_with("MISSING");
    assert!(md5.stdout.contains("connected to"), "{md5}");
    r.pgjet_in(&b, &r.hidden(), &a, Some("wrong"))
        .fails_with("password authentication failed");

    if summaries {
        let a = args!["--source", r.source(""), "check"];
        let run = r.pgjet_in(&b, &r.hidden(), &a, None).ok();
        assert!(
            run.stdout
                .contains("WAL summaries: summarize_wal is on and the role may read them"),
            "{run}"
        );
    }
    let standby_dir = r.dest.join("standby");
    let (rx0, _) = r.lab.iface_bytes(&b);
    let standby = replica_across_the_link(&r, &standby_dir);
    let full_bytes = r.lab.iface_bytes(&b).0 - rx0;
    backup_across_the_link(&r);
    let mut standby = delta_onto_stale_standby(&r, standby, full_bytes, summaries);
    if r.cluster.pg().major == "17" {
        // A DBA who revoked the summaries from PUBLIC: the query fails on the copy's own
        // session, and the re-sync compares by hash instead, saying why.
        r.cluster.psql(
            "postgres",
            "REVOKE EXECUTE ON FUNCTION pg_wal_summary_contents(bigint, pg_lsn, pg_lsn) FROM PUBLIC",
        );
        // check names it, with the grant, as a note (pgjet works without it).
        let a = args!["--source", r.source(""), "check"];
        let run = r.pgjet_in(&b, &r.hidden(), &a, None).ok();
        let sig = "pg_wal_summary_contents(bigint, pg_lsn, pg_lsn)";
        assert!(
            run.stdout
                .contains(&format!("note: the role may not run {sig}"))
                && run
                    .stdout
                    .contains(&format!("GRANT EXECUTE ON FUNCTION {sig} TO {ROLE};")),
            "{run}"
        );
        let (again, run) = delta_onto_stale_standby_run(&r, standby, full_bytes, false);
        standby = again;
        let why = run
            .stderr
            .lines()
            .find(|l| l.contains("WAL summaries not used"))
            .unwrap_or_else(|| panic!("no reason for the comparison by hash:\n{run}"));
        assert!(why.contains("permission denied"), "{why}");
        // An incremental backup by the same role: its changed blocks are found without the
        // summaries (the WAL or page LSNs), and the backup holds its slot to the end.
        let base = r.repo_args();
        let mut a = base.clone();
        a.extend(args![
            "--transport",
            "libpq",
            "--output",
            "json",
            "backup",
            "--type",
            "incr",
            "--start-fast"
        ]);
        let run = r.pgjet_in(&b, &r.hidden(), &a, None).ok();
        assert!(
            run.stderr
                .lines()
                .any(|l| l.contains("WAL summaries not used") && l.contains("permission denied")),
            "{run}"
        );
        let label = summary(&run)["label"].as_str().unwrap().to_string();
        assert!(label.ends_with('I'), "{label}");
        let mut a = base;
        a.extend(args!["verify", "--set", label]);
        r.pgjet_in(&b, &r.hidden(), &a, None).ok();
    }
    if summaries {
        standby = stream_delta_by_replication_role(&r, standby, full_bytes);
    }
    if r.cluster.pg().major == "18" {
        standby = incremental_refused_takes_the_whole_stream(&r, standby, full_bytes);
        standby = moved_tablespace_takes_the_whole_stream(&r, standby);
    }
    drop(standby);
}

/// `--transport auto` from `b`, replica-create into `<dest>/<name>`: returns the run (the
/// log line of the choice is on stderr).
fn auto_replica(r: &Remote, name: &str) -> Run {
    let dir = r.dest.join(name);
    let a = args![
        "--source",
        r.source(""),
        "--pg-path",
        dir.display(),
        "--output",
        "json",
        "replica-create",
        "--start-fast",
        "--tablespace-map",
        format!("ts1={}", r.ts_dir(&dir).display())
    ];
    let run = r.pgjet_in(&r.lab.ns_b.clone(), &r.hidden(), &a, None).ok();
    let choice = auto_choice(&run).to_string();
    step!("{name}: {choice}");
    if summary(&run)["transport"] == "basebackup" {
        // The server's manifest is kept with the stream (the ranges write none).
        pg_verifybackup(r.cluster.pg(), &dir).ok();
    }
    run
}

/// `--seed auto` with a repository on this side of a slow link: a backup of the primary
/// taken across the link (the compressed stream), then a new standby for which auto times
/// the repository against the link and restores the backup; the standby streams from the
/// primary and holds its rows.
fn seed_auto_takes_the_repository(r: &Remote) {
    mkdir_pg(&r.dest.join("repo"), 0o750);
    let b = r.lab.ns_b.clone();
    let base = r.repo_args();
    let mut a = base.clone();
    a.push("stanza-create".into());
    r.pgjet_in(&b, &r.hidden(), &a, None).ok();
    let mut a = base.clone();
    a.extend(args!["--transport", "basebackup", "backup", "--start-fast"]);
    r.pgjet_in(&b, &r.hidden(), &a, None).ok();
    let dir = r.dest.join("standby-seeded");
    let mut a = base;
    a.extend(args![
        "--pg-path",
        dir.display(),
        "--output",
        "json",
        "replica-create",
        "--tablespace-map",
        format!("ts1={}", r.ts_dir(&dir).display())
    ]);
    let run = r.pgjet_in(&b, &r.hidden(), &a, None).ok();
    let choice = log_line(&run, "seed auto:", "auto must log its seed figures").to_string();
    step!("{choice}");
    assert!(choice.contains("chose the repository"), "{run}");
    let transport = summary(&run)["transport"].as_str().unwrap().to_string();
    assert!(transport.starts_with("repo1 backup"), "{run}");
    let standby = r.start_copy(&b, &dir);
    r.wait_caught_up(&standby);
    assert_same_fingerprint(
        "standby seeded from the repository",
        &fingerprint(&r.cluster.server),
        &fingerprint(&standby),
    );
}

/// The line in which `--transport auto` logs its figures and its choice. Panics (the test
/// fails) when the run has none.
fn auto_choice(run: &Run) -> &str {
    run.stderr
        .lines()
        .find(|l| l.contains("transport auto:"))
        .unwrap_or_else(|| panic!("auto must log its choice:\n{run}"))
}

/// A primary of `pg` behind a 20 Mbit/s link (2 ms RTT) holding pgbench scale 3: the slow,
/// compressible case in which auto must take the stream.
fn slow_link_with_pgbench(pg: Pg, tag: &str, tls: bool) -> Remote {
    let slow = Remote::on_link(pg, tag, tls, Some("20mbit"), 2.0);
    load_dataset(
        &slow.cluster,
        DatasetSpec {
            pgbench_scale: 3,
            small_tables: 0,
            random_bytes: 0,
        },
    );
    slow
}

/// `--transport auto` measures, then chooses: on a 20 Mbit/s link with pgbench data it takes
/// the compressed stream (the server's best, zstd: Debian's PostgreSQL 15 has it), which
/// passes pg_verifybackup; when the server refuses the stream's replication connection it
/// warns and keeps the ranges; on the unshaped link with incompressible data it keeps the
/// parallel ranges.
#[test]
fn remote_pg15_transport_auto_chooses_by_measurement() {
    let slow = slow_link_with_pgbench(Pg::v15(), "auto-slow", true);
    let run = auto_replica(&slow, "standby-slow");
    seed_auto_takes_the_repository(&slow);
    // On a slow link the method with the best ratio: zstd (`rep` is no superuser; the
    // server's methods come from pg_settings).
    assert!(run.stderr.contains("chose basebackup"), "{run}");
    assert_eq!(summary(&run)["transport"], "basebackup", "{run}");
    assert_eq!(summary(&run)["network_compress"], "zstd", "{run}");

    // A replication connection the server refuses (no `replication` line in pg_hba.conf):
    // auto warns with the fix and keeps the ranges. A target that is not empty stops the
    // ranges before they copy, so this costs no second copy.
    let hba = slow.cluster.data().join("pg_hba.conf");
    let lines: String = fs::read_to_string(&hba)
        .unwrap()
        .lines()
        .filter(|l| !l.contains(" replication "))
        .map(|l| format!("{l}\n"))
        .collect();
    fs::write(&hba, lines).unwrap();
    slow.cluster.psql("postgres", "SELECT pg_reload_conf()");
    let dir = slow.dest.join("standby-refused");
    mkdir_pg(&dir, 0o700);
    fs::write(dir.join("keep"), b"precious").unwrap();
    chown_pg_recursive(&dir);
    let a = args![
        "--source",
        slow.source(""),
        "--pg-path",
        dir.display(),
        "replica-create"
    ];
    let run = slow
        .pgjet_in(&slow.lab.ns_b.clone(), &slow.hidden(), &a, None)
        .fails_with("is not empty");
    for want in [
        "its replication connection failed",
        // the server's own reason, not only "db error"
        "no pg_hba.conf entry for replication connection",
        "pg_hba.conf",
        "ranges (libpq)",
    ] {
        assert!(run.stderr.contains(want), "{want:?} missing:\n{run}");
    }
    assert_eq!(fs::read(dir.join("keep")).unwrap(), b"precious", "{run}");
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 1, "{run}");
    drop(slow);

    // Incompressible data: 128 MiB of random bytes beside pgbench scale 1 (13 MiB), about
    // 1.1x with lz4. (At 48 MiB of random bytes, 1.5x, lz4's estimate passes the margin and
    // the stream is taken: see docs/basebackup-transport.md, "How auto chooses".)
    let fast = Remote::on_link(Pg::v15(), "auto-fast", true, None, 0.0);
    load_dataset(
        &fast.cluster,
        DatasetSpec {
            pgbench_scale: 1,
            small_tables: 0,
            random_bytes: 128 << 20,
        },
    );
    let run = auto_replica(&fast, "standby-fast");
    assert!(run.stderr.contains("chose ranges (libpq)"), "{run}");
    assert_eq!(summary(&run)["transport"], "libpq", "{run}");
}

/// PostgreSQL 18 built without lz4 and zstd (the wheel): on a slow link with pgbench data
/// `--transport auto` still compresses at the source, with gzip at level 1 (its methods
/// come from pg_settings: `{pglz,on,off}`); the new directory passes pg_verifybackup.
#[test]
fn remote_pg18_transport_auto_takes_gzip_on_a_slow_link() {
    let slow = slow_link_with_pgbench(Pg::v18(), "auto-gzip", false);
    let run = auto_replica(&slow, "standby-gzip");
    assert!(run.stderr.contains("chose basebackup (gzip)"), "{run}");
    let choice = auto_choice(&run);
    assert!(
        !choice.contains("zstd") && !choice.contains("lz4"),
        "a server without lz4 and zstd: neither is weighed\n{run}"
    );
    assert_eq!(summary(&run)["network_compress"], "gzip", "{run}");
}
