//! The pgjet binary: parse the command line, run the command, map errors to exit codes.
mod cli;
#[cfg(test)]
mod cli_tests;
mod manual;
mod signals;
mod term;

use cli::ParseError;
use pgjet_core::commands;
use pgjet_core::error::Error;
use pgjet_core::options::table::Cmd;
use pgjet_core::options::{Command, InfoFormat, Invocation, Output};

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(format!("pgjet={level}"))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("pgjet=info"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    // At debug level each line carries the seconds since the start: a timeline of the run.
    let _ = if level == "debug" || level == "trace" {
        fmt.with_timer(tracing_subscriber::fmt::time::uptime())
            .try_init()
    } else {
        fmt.without_time().try_init()
    };
}

/// The exit status of a pgjet whose standard output was closed by its reader (`pgjet info
/// | head`): what a shell reports for a process SIGPIPE ended (128 + 13), without a panic.
const BROKEN_PIPE_EXIT: i32 = 141;

/// Writes `args` to standard output (`say!`, `say_line!`): a reader that went away ends the
/// process quietly with [`BROKEN_PIPE_EXIT`] instead of println!'s panic.
fn say_fmt(args: std::fmt::Arguments, newline: bool) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let r = out
        .write_fmt(args)
        .and_then(|_| {
            if newline {
                out.write_all(b"\n")
            } else {
                Ok(())
            }
        })
        .and_then(|_| out.flush());
    if let Err(e) = r {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            exit(BROKEN_PIPE_EXIT);
        }
        eprintln!("pgjet: ERROR: cannot write to standard output: {e}");
        exit(7);
    }
}

macro_rules! say {
    ($($t:tt)*) => { say_fmt(format_args!($($t)*), false) };
}
macro_rules! say_line {
    ($($t:tt)*) => { say_fmt(format_args!($($t)*), true) };
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<(), Error> {
    let s = serde_json::to_string_pretty(v)
        .map_err(|e| Error::Other("cannot encode the JSON output".into()).because(e))?;
    say_line!("{s}");
    Ok(())
}

fn run(inv: Invocation) -> Result<(), Error> {
    let s = inv.settings;
    init_logging(&s.log_level);
    pgjet_core::io::tuning::init()?;
    for w in &inv.warnings {
        tracing::warn!("{w}");
    }
    // Like PostgreSQL's own server tools: files pgjet writes must belong to the cluster's owner.
    let writes_cluster_files = !matches!(inv.command, Command::Info(_) | Command::Verify(_));
    // SAFETY: geteuid has no preconditions and cannot fail.
    if writes_cluster_files && unsafe { libc::geteuid() } == 0 {
        return Err(Error::Unsafe(
            "pgjet must not run as root: it would leave files PostgreSQL cannot use; run it as the OS user that owns the cluster, e.g. `sudo -u postgres pgjet ...`".into(),
        ));
    }
    if s.output == Output::Prometheus && !matches!(inv.command, Command::Info(_)) {
        return Err(Error::Config(
            "--output prometheus applies to info only (metrics of the repositories)".into(),
        ));
    }
    let json = s.output == Output::Json;
    let progress = term::TermProgress::for_stderr(json);
    match inv.command {
        Command::StanzaCreate => say_line!("{}", commands::stanza_create::run(&s)?),
        Command::CipherPassChange => say_line!("{}", commands::cipher_pass::run(&s)?),
        Command::Backup(a) => {
            let r = commands::backup::run(&s, &a, &progress)?;
            if json {
                print_json(&r)?;
            } else {
                say_line!(
                    "backup {} complete: {} files, {} logical, {} stored, {:.1} s, {:.0} MiB/s, LSN {} - {}{}",
                    r.label, r.files, pgjet_core::io::mib(r.size), pgjet_core::io::mib(r.stored_size), r.seconds, r.mib_per_sec,
                    r.start_lsn, r.stop_lsn,
                    if r.page_errors > 0 { format!(", {} page checksum error(s)", r.page_errors) } else { String::new() }
                );
            }
        }
        Command::Restore(a) => {
            let label = commands::restore::run(&s, &a, &progress)?;
            say_line!("restored backup {label} into {}", s.pg_path()?.display());
        }
        Command::Verify(a) => {
            for l in commands::verify::run(&s, a.set.as_deref(), &progress)? {
                say_line!("{l}");
            }
        }
        Command::Info(a) if a.format == InfoFormat::Pgbackrest => {
            let v = commands::info_pgbackrest::collect(&s)?;
            if json {
                say_line!("{}", serde_json::Value::Array(v));
            } else {
                say!("{}", commands::info_pgbackrest::render_text(&v));
            }
        }
        Command::Info(_) => {
            let v = commands::info::collect(&s)?;
            if s.output == Output::Prometheus {
                let queues = commands::metrics::queues(&s, &v);
                let streams = commands::metrics_stream::streams(&s, &v);
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                say!(
                    "{}{}",
                    commands::metrics::render_prometheus(&v, &queues),
                    commands::metrics_stream::render(&streams, now)
                );
            } else if json {
                print_json(&v)?;
            } else {
                say!("{}", commands::info::render_text(&v));
            }
        }
        Command::Check => {
            let report = commands::check::run(&s)?;
            for l in &report.lines {
                say_line!("{l}");
            }
            if let Some(e) = report.failure {
                return Err(e);
            }
        }
        Command::Expire(a) => {
            for l in commands::expire::run(&s, a.dry_run)? {
                say_line!("{l}");
            }
        }
        Command::ArchivePush { wal_path } => commands::archive_push::run(&s, &wal_path)?,
        Command::ArchiveStream => commands::archive_stream::run(&s)?,
        Command::ArchiveGet { wal_file, dest } => {
            if commands::archive_get::run(&s, &wal_file, &dest)?
                == pgjet_core::archive::get::GetOutcome::Missing
            {
                // The normal end of recovery from the archive: PostgreSQL asks for the next
                // file until one is missing, and a standby asks again every few seconds, so
                // the line is for --log-level debug only (its stderr is the server's log;
                // PostgreSQL itself logs a missing file at DEBUG2, xlogarchive.c).
                tracing::debug!("{wal_file} is not in the archive");
                exit(1);
            }
        }
        Command::ArchivePushAsync { wal_dir } => {
            pgjet_core::archive::pusher::push_background(&s.archive_config(), &wal_dir)?
        }
        Command::ArchiveGetAsync { first_request } => {
            pgjet_core::archive::prefetcher::get_background(&s.archive_config(), &first_request)?
        }
        Command::ReplicaCreate(a) => {
            let r = commands::replica::run(&s, &a, &progress)?;
            if json {
                print_json(&r)?;
            } else {
                say_line!(
                    "standby created in {}: {} in {:.1} s ({:.0} MiB/s, {} with {} job(s)){}{}",
                    r.pg_path,
                    pgjet_core::io::mib(r.size),
                    r.seconds,
                    r.mib_per_sec,
                    r.transport,
                    r.jobs,
                    match (r.delta_same, r.delta_copied) {
                        (Some(same), Some(copied)) => format!(
                            "; delta: {} unchanged, {} copied",
                            pgjet_core::io::mib(same),
                            pgjet_core::io::mib(copied)
                        ),
                        _ => String::new(),
                    } + &match (r.wire_bytes, &r.network_compress) {
                        (Some(w), Some(c)) =>
                            format!("; {} on the wire ({c})", pgjet_core::io::mib(w)),
                        _ => String::new(),
                    },
                    if r.started {
                        ", started and streaming"
                    } else {
                        ""
                    }
                );
            }
        }
    }
    Ok(())
}

/// Exit status of a failed `archive-get` during archive recovery that is not standby mode.
/// PostgreSQL takes any status up to 125 for "file not available" and ends recovery there,
/// promoting early; above 125 it stops recovery with FATAL instead ("an error by the shell",
/// `RestoreArchivedFile` in src/backend/access/transam/xlogarchive.c). A standby keeps the
/// ordinary codes: it falls back to streaming and asks again.
const ARCHIVE_GET_ABORT_RECOVERY: i32 = 126;

/// True when `archive-get` runs for an archive recovery that would end at a failure: the
/// working directory (PostgreSQL runs restore_command in the data directory) holds
/// recovery.signal and no standby.signal.
fn archive_recovery_in_cwd() -> bool {
    std::path::Path::new("recovery.signal").exists()
        && !std::path::Path::new("standby.signal").exists()
}

/// Ends a failed `archive-get` so that recovery stops rather than ends early.
fn abort_recovery() -> ! {
    eprintln!("pgjet: archive-get failed for another reason than a missing file: recovery stops here instead of ending early; fix the repository and start the server again (it resumes where it stopped)");
    exit(ARCHIVE_GET_ABORT_RECOVERY);
}

/// Ends the process with `code`, once the async runtime's tasks have closed their
/// connections (at most 10 s, usually none: see `io::runtime::drain`; an SFTP store's
/// `ssh -O exit` took over 2 s on a loaded 2-core machine and left its control master),
/// then ends the SFTP store's ssh masters still running (see `storage::ssh`).
fn exit(code: i32) -> ! {
    before_exit();
    // Cancelled (SIGTERM, SIGINT): the signal's status, whatever the error it caused.
    let code = match pgjet_core::io::cancel::cancelled() {
        Some(signal) if code != 0 => 128 + signal,
        _ => code,
    };
    std::process::exit(code);
}

/// What every exit does first: the runtime drained, the ssh masters ended (see [`exit`]).
fn before_exit() {
    // Cancelled: the connections' tasks were sent their cancel requests; a short wait.
    let limit = match pgjet_core::io::cancel::cancelled() {
        Some(_) => 1,
        None => 10,
    };
    pgjet_core::io::runtime::drain(std::time::Duration::from_secs(limit));
    let stopped = pgjet_core::storage::ssh::stop_masters();
    if stopped > 0 {
        tracing::debug!("ended {stopped} ssh control master(s) left by the SFTP store");
    }
}

/// Prints `e` with its chain of causes and its hint, on stderr.
fn print_error(e: &Error) {
    eprintln!("pgjet: ERROR: {}\n{}", e.with_causes(), e.hint());
}

fn main() {
    if let Some(doc) = cli::document(std::env::args_os()) {
        match doc {
            Ok(bytes) => {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                if out.write_all(&bytes).and_then(|_| out.flush()).is_err() {
                    exit(1);
                }
                exit(0);
            }
            Err(e) => e.exit(),
        }
    }
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (args, patroni) = match pgjet_core::options::patroni::translate(&args) {
        Some((translated, call)) => (translated, Some(call)),
        None => (args, None),
    };
    let mut inv = match cli::parse(args) {
        Ok(inv) => inv,
        Err(ParseError::Clap(e)) => e.exit(),
        Err(ParseError::Config {
            error,
            warnings,
            cmd,
        }) => {
            init_logging("info");
            for w in &warnings {
                tracing::warn!("{w}");
            }
            print_error(&error);
            if cmd == Some(Cmd::ArchiveGet) && archive_recovery_in_cwd() {
                abort_recovery();
            }
            exit(error.exit_code());
        }
    };
    if inv
        .settings
        .repo_set
        .repos
        .iter()
        .any(|(_, r)| matches!(r, pgjet_core::storage::config::RepoConfig::Sftp { .. }))
    {
        // Before any thread starts: it sets XDG_STATE_HOME (see storage::ssh).
        pgjet_core::storage::ssh::own_control_dir();
    }
    // After the environment is set, before any work: SIGTERM and SIGINT cancel the command.
    let stopping = match inv.command {
        Command::ArchiveStream => "the WAL received so far is stored and reported first",
        _ => "the server's backup and temporary slots are cancelled; a target being written stays marked unfinished",
    };
    if let Err(e) = signals::install(before_exit, stopping) {
        tracing::warn!("{e}");
    }
    if let (Some(call), Command::ReplicaCreate(a)) = (&patroni, &mut inv.command) {
        a.patroni = Some(call.clone());
    }
    let archive_get = matches!(inv.command, Command::ArchiveGet { .. });
    if let Err(e) = run(inv) {
        print_error(&e);
        if archive_get && archive_recovery_in_cwd() {
            abort_recovery();
        }
        exit(e.exit_code());
    }
    exit(0);
}
