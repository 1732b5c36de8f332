//! The ground floor: what every other room uses and that knows nothing of PostgreSQL,
//! repositories or transports. Direct I/O buffers and files ([`direct`]), small durable
//! file operations ([`fs`]), the tuning read once from the environment ([`tuning`]), the one
//! async runtime ([`runtime`]), the one way to run work on several threads ([`parallel`]),
//! the process's memory ([`mem`]) and the TLS of libpq and the object stores ([`tls`]).
pub mod cancel;
pub mod direct;
pub mod fs;
pub mod mem;
pub mod pace;
pub mod tls;
pub mod tuning;

/// Bytes as MiB with one decimal, for messages: `12.5 MiB`.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}
pub mod parallel;
pub mod runtime;

/// True when process `pid` exists on this host (another user's included).
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}
