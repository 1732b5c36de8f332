//! The process's memory: handing freed memory back, and a note of what is in use for logs.

/// Returns the memory the allocator holds free to the system (glibc `malloc_trim`), after a
/// phase that freed much of it in small pieces; a no-op elsewhere.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// This process's peak resident memory so far and its resident memory now, for debug logs
/// ("peak 183 MiB, now 120 MiB"; Linux `/proc/self/status` VmHWM and VmRSS), or "unknown".
pub fn memory_note() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    match (field("VmHWM:"), field("VmRSS:")) {
        (Some(peak), Some(now)) => format!("peak {} MiB, now {} MiB", peak / 1024, now / 1024),
        _ => "unknown".into(),
    }
}
