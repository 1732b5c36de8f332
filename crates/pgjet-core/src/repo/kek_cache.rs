//! A short-lived cache of derived key-encrypting keys in the Linux kernel's user keyring
//! (keyrings(7)), so that the processes PostgreSQL starts one per WAL segment
//! (`archive_command`, `restore_command`) do not each spend Argon2id's 64 MiB and ~0.1 s.
//!
//! An entry is a `user` key in the user keyring of the uid running pgjet, readable by that
//! uid only (and root), which can read the passphrase itself anyway (the config file, mode
//! 0600, or the environment of its processes): the cache gives nothing to anyone who could
//! not already derive the key. Its description is a SHA-256 of the KDF's salt, the
//! repository id and the passphrase (so another passphrase misses); the payload is the
//! 32-byte key; it expires [`TTL_SECS`] after it was made. Where the kernel refuses keyrings
//! (a seccomp profile, an old kernel), nothing is cached and every process derives.
use ring::digest;

/// Seconds an entry lives.
pub const TTL_SECS: u32 = 300;

// keyctl(2) operations and the user keyring's special id (linux/keyctl.h; a stable ABI).
const KEY_SPEC_USER_KEYRING: libc::c_long = -4;
const KEYCTL_SETPERM: libc::c_long = 5;
const KEYCTL_SEARCH: libc::c_long = 10;
const KEYCTL_READ: libc::c_long = 11;
const KEYCTL_SET_TIMEOUT: libc::c_long = 15;
/// Possessor: view, read, write, search, link, setattr; user (same uid): view, read, search.
const PERM: libc::c_long = 0x3f0b_0000;

/// The entry's description for a KDF salt, a repository id and a passphrase.
fn description(salt: &[u8], repo_id: &[u8], passphrase: &[u8]) -> std::ffi::CString {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(b"pgjet kek cache v1");
    ctx.update(&(salt.len() as u32).to_be_bytes());
    ctx.update(salt);
    ctx.update(repo_id);
    ctx.update(passphrase);
    let d = format!("pgjet:kek:{}", hex::encode(ctx.finish().as_ref()));
    // hex and ASCII only: no NUL byte.
    std::ffi::CString::new(d).unwrap_or_default()
}

/// The cached key for these inputs, if the keyring has one.
pub fn lookup(
    salt: &[u8],
    repo_id: &[u8],
    passphrase: &[u8],
) -> Option<zeroize::Zeroizing<[u8; 32]>> {
    if std::env::var_os("PGJET_NO_KEK_CACHE").is_some() {
        return None;
    }
    let desc = description(salt, repo_id, passphrase);
    // SAFETY: keyctl(KEYCTL_SEARCH, keyring, type, description, dest) with NUL-terminated
    // strings that outlive the call; the result is a key id or -1.
    let id = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_SEARCH,
            KEY_SPEC_USER_KEYRING,
            c"user".as_ptr(),
            desc.as_ptr(),
            0 as libc::c_long,
        )
    };
    if id < 0 {
        return None;
    }
    let mut key = zeroize::Zeroizing::new([0u8; 32]);
    // SAFETY: keyctl(KEYCTL_READ, id, buffer, length) writes at most `length` bytes into
    // the buffer and returns the payload's full length.
    let n = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_READ,
            id,
            key.as_mut_ptr(),
            key.len() as libc::c_long,
        )
    };
    (n == 32).then_some(key)
}

/// Caches `key` for these inputs (best effort: a refusal of the kernel is ignored).
pub fn store(salt: &[u8], repo_id: &[u8], passphrase: &[u8], key: &[u8; 32]) {
    if std::env::var_os("PGJET_NO_KEK_CACHE").is_some() {
        return;
    }
    let desc = description(salt, repo_id, passphrase);
    // SAFETY: add_key(type, description, payload, length, keyring) reads `length` bytes of
    // the payload; the strings are NUL-terminated and outlive the call.
    let id = unsafe {
        libc::syscall(
            libc::SYS_add_key,
            c"user".as_ptr(),
            desc.as_ptr(),
            key.as_ptr(),
            key.len(),
            KEY_SPEC_USER_KEYRING,
        )
    };
    if id < 0 {
        return;
    }
    // SAFETY: keyctl on the key just made, with integer arguments only.
    unsafe {
        libc::syscall(libc::SYS_keyctl, KEYCTL_SETPERM, id, PERM);
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_SET_TIMEOUT,
            id,
            TTL_SECS as libc::c_long,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_key_is_found_for_the_same_inputs_only() {
        let salt: [u8; 16] = rand_bytes();
        let key: [u8; 32] = rand_bytes();
        store(&salt, b"repo", b"pass", &key);
        match lookup(&salt, b"repo", b"pass") {
            // The kernel may refuse keyrings (a container's seccomp profile): then nothing
            // is cached, which is what the callers expect too.
            None => eprintln!("no user keyring here: nothing cached"),
            Some(k) => {
                assert_eq!(*k, key);
                assert!(lookup(&salt, b"repo", b"another").is_none());
                assert!(lookup(&salt, b"other", b"pass").is_none());
            }
        }
    }

    fn rand_bytes<const N: usize>() -> [u8; N] {
        use ring::rand::SecureRandom;
        let mut b = [0u8; N];
        ring::rand::SystemRandom::new().fill(&mut b).unwrap();
        b
    }
}
