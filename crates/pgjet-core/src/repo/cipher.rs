//! Encryption at rest: the primitives of docs/encryption.md (issue 20). A key derived from
//! the passphrase (Argon2id) wraps random data keys (AES-256-GCM); each object is sealed
//! under its own key (HKDF-SHA-256 of a data key, a random salt, the repository id and the
//! object's name) in 64 KiB segments (AES-256-GCM, STREAM nonces: a random prefix, the
//! segment's number and whether it is the last).
//!
//! Cryptography comes from well-kept crates only: ring (AES-256-GCM, HKDF, the system's
//! random generator) and RustCrypto's argon2. Nothing here is a primitive of its own; the
//! construction is the one docs/encryption.md specifies.
//!
//! Not yet used by the repository: `repo-cipher-type` is not accepted yet.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroize;

/// The first bytes of every encrypted object: magic and format version.
pub const MAGIC: &[u8; 8] = b"PGJAE1\0\0";
/// Random bytes per object that go into its key.
pub const SALT_LEN: usize = 16;
/// Random bytes per object that begin each segment's nonce.
pub const PREFIX_LEN: usize = 7;
/// Bytes before the first segment: magic, salt, nonce prefix.
pub const HEADER_LEN: usize = MAGIC.len() + SALT_LEN + PREFIX_LEN;
/// Plaintext bytes per segment (every segment but the last holds exactly this many).
pub const SEGMENT: usize = 64 << 10;
/// The GCM tag after each segment's ciphertext.
pub const TAG_LEN: usize = 16;
/// Bytes of a full sealed segment.
const SEALED_SEGMENT: usize = SEGMENT + TAG_LEN;
/// Bytes of a data key, of the key-encrypting key and of each object's key (AES-256).
pub const KEY_LEN: usize = 32;
/// Bytes of a repository id.
pub const REPO_ID_LEN: usize = 16;
/// Argon2id's defaults: RFC 9106 section 4, second recommended option (64 MiB, 3 passes,
/// 1 lane).
pub const KDF_MEMORY_KIB: u32 = 64 * 1024;
pub const KDF_PASSES: u32 = 3;
pub const KDF_LANES: u32 = 1;

/// What went wrong opening or sealing. Messages name what, never a key or a passphrase.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CipherError {
    /// A wrapped key did not open: the passphrase is not the one that wrapped it (or the
    /// wrapped key was changed or moved).
    #[error("the passphrase does not open the key '{0}'")]
    WrongPassphrase(String),
    /// An object's bytes failed authentication.
    #[error("{0}: does not authenticate (damaged, truncated, or not this repository's)")]
    Unauthentic(String),
    /// An object or a wrapped key that is not in pgjet's encrypted format at all.
    #[error("{0}: not an encrypted object of this format ({1})")]
    Malformed(String, &'static str),
    /// The key derivation refused its parameters.
    #[error("key derivation: {0}")]
    Kdf(String),
    /// The operating system's random generator failed.
    #[error("the system's random generator failed")]
    Random,
}

impl From<CipherError> for crate::error::Error {
    fn from(e: CipherError) -> Self {
        crate::error::Error::Repo(e.to_string())
    }
}

type CResult<T> = std::result::Result<T, CipherError>;

fn random<const N: usize>() -> CResult<[u8; N]> {
    let mut b = [0u8; N];
    SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| CipherError::Random)?;
    Ok(b)
}

/// A repository's id: random, stored in `cipher.json`; part of every object's key and of
/// every wrapped key's associated data, so nothing moves between repositories unnoticed.
pub fn new_repository_id() -> CResult<[u8; REPO_ID_LEN]> {
    random()
}

/// Argon2id parameters and salt for the key-encrypting key (`cipher.json`'s `kdf`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kdf {
    pub memory_kib: u32,
    pub passes: u32,
    pub lanes: u32,
    pub salt: [u8; SALT_LEN],
}

impl Kdf {
    /// The default parameters with a fresh random salt.
    pub fn new() -> CResult<Kdf> {
        Ok(Kdf {
            memory_kib: KDF_MEMORY_KIB,
            passes: KDF_PASSES,
            lanes: KDF_LANES,
            salt: random()?,
        })
    }

    /// The key-encrypting key of `passphrase` (Argon2id, RFC 9106, version 0x13).
    /// Errors: parameters Argon2 refuses (a repository's `cipher.json` is input).
    pub fn derive(&self, passphrase: &[u8]) -> CResult<Kek> {
        Ok(Kek::from_raw(&*self.derive_raw(passphrase)?))
    }

    /// The key-encrypting key of `passphrase` as bytes (for [`super::kek_cache`]).
    pub fn derive_raw(&self, passphrase: &[u8]) -> CResult<zeroize::Zeroizing<[u8; KEY_LEN]>> {
        let params = argon2::Params::new(self.memory_kib, self.passes, self.lanes, Some(KEY_LEN))
            .map_err(|e| CipherError::Kdf(e.to_string()))?;
        let argon =
            argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let mut out = zeroize::Zeroizing::new([0u8; KEY_LEN]);
        argon
            .hash_password_into(passphrase, &self.salt, &mut *out)
            .map_err(|e| CipherError::Kdf(e.to_string()))?;
        Ok(out)
    }
}

fn aes_key(bytes: &[u8; KEY_LEN]) -> LessSafeKey {
    // AES_256_GCM takes exactly KEY_LEN bytes: cannot fail.
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).expect("a 32-byte AES-256 key"))
}

/// The key-encrypting key: derived from the passphrase, never stored.
pub struct Kek(LessSafeKey);

/// Associated data of a wrapped key: `"pgjet key v1" | repository id | name`.
fn wrap_aad(repo_id: &[u8; REPO_ID_LEN], name: &str) -> Vec<u8> {
    let mut aad = b"pgjet key v1".to_vec();
    aad.extend_from_slice(repo_id);
    aad.extend_from_slice(name.as_bytes());
    aad
}

impl Kek {
    /// The key-encrypting key whose bytes are `raw` ([`Kdf::derive_raw`]).
    pub fn from_raw(raw: &[u8; KEY_LEN]) -> Kek {
        Kek(aes_key(raw))
    }

    /// `key` wrapped for `name` (`stanza`, `archive`, `backup/<label>`): a random nonce, the
    /// ciphertext and the tag, `NONCE_LEN + KEY_LEN + TAG_LEN` bytes.
    pub fn wrap(&self, repo_id: &[u8; REPO_ID_LEN], name: &str, key: &DataKey) -> CResult<Vec<u8>> {
        let nonce: [u8; NONCE_LEN] = random()?;
        let mut buf = key.0.to_vec();
        let tag = self
            .0
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(wrap_aad(repo_id, name)),
                &mut buf,
            )
            .map_err(|_| CipherError::Malformed(name.to_string(), "cannot seal"))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        out.extend_from_slice(tag.as_ref());
        buf.zeroize();
        Ok(out)
    }

    /// The data key `wrapped` holds for `name`. Errors: [`CipherError::WrongPassphrase`]
    /// when it does not open (another passphrase, another name or repository, a changed
    /// byte); [`CipherError::Malformed`] when it has the wrong length.
    pub fn unwrap(
        &self,
        repo_id: &[u8; REPO_ID_LEN],
        name: &str,
        wrapped: &[u8],
    ) -> CResult<DataKey> {
        if wrapped.len() != NONCE_LEN + KEY_LEN + TAG_LEN {
            return Err(CipherError::Malformed(
                name.to_string(),
                "a wrapped key has 60 bytes",
            ));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&wrapped[..NONCE_LEN]);
        let mut buf = wrapped[NONCE_LEN..].to_vec();
        let opened = self
            .0
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(wrap_aad(repo_id, name)),
                &mut buf,
            )
            .map_err(|_| CipherError::WrongPassphrase(name.to_string()))?;
        let mut key = [0u8; KEY_LEN];
        key.copy_from_slice(opened);
        buf.zeroize();
        Ok(DataKey(key))
    }
}

/// A data key: the stanza's, the archive's or one backup's. Wiped when dropped.
pub struct DataKey([u8; KEY_LEN]);

impl Drop for DataKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// `KeyType` for HKDF output of [`KEY_LEN`] bytes.
struct AesKeyLen;
impl ring::hkdf::KeyType for AesKeyLen {
    fn len(&self) -> usize {
        KEY_LEN
    }
}

impl DataKey {
    /// A fresh random data key.
    pub fn random() -> CResult<DataKey> {
        Ok(DataKey(random()?))
    }

    /// The key of the object `name` with salt `salt`: HKDF-SHA-256 (RFC 5869), salt as
    /// the HKDF salt, `"pgjet object v1" | repository id | name` as info.
    fn object_key(
        &self,
        salt: &[u8; SALT_LEN],
        repo_id: &[u8; REPO_ID_LEN],
        name: &str,
    ) -> LessSafeKey {
        let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, salt).extract(&self.0);
        let info: [&[u8]; 3] = [b"pgjet object v1", repo_id, name.as_bytes()];
        let mut k = [0u8; KEY_LEN];
        // expand/fill fail only for an output longer than 255 hash lengths: 32 bytes is not.
        prk.expand(&info, AesKeyLen)
            .and_then(|okm| okm.fill(&mut k))
            .expect("32 bytes of HKDF-SHA-256 output");
        let key = aes_key(&k);
        k.zeroize();
        key
    }
}

/// The nonce of segment `index` of an object with nonce prefix `prefix`.
fn segment_nonce(prefix: &[u8; PREFIX_LEN], index: u32, last: bool) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[..PREFIX_LEN].copy_from_slice(prefix);
    n[PREFIX_LEN..PREFIX_LEN + 4].copy_from_slice(&index.to_be_bytes());
    n[NONCE_LEN - 1] = last as u8;
    Nonce::assume_unique_for_key(n)
}

/// Segments of an object of `plain` bytes: one per [`SEGMENT`], and one (empty) for none.
pub fn segments(plain: u64) -> u64 {
    plain.div_ceil(SEGMENT as u64).max(1)
}

/// Stored bytes of an object of `plain` bytes.
pub fn sealed_size(plain: u64) -> u64 {
    HEADER_LEN as u64 + plain + TAG_LEN as u64 * segments(plain)
}

/// Plaintext bytes of a stored object of `sealed` bytes. Errors: no object of this format
/// has that size (`name` for the message).
pub fn plain_size(name: &str, sealed: u64) -> CResult<u64> {
    let body = sealed
        .checked_sub(HEADER_LEN as u64)
        .ok_or_else(|| CipherError::Malformed(name.to_string(), "shorter than its header"))?;
    let full = body / SEALED_SEGMENT as u64;
    let rest = body % SEALED_SEGMENT as u64;
    match (full, rest) {
        (0, r) if r == TAG_LEN as u64 => Ok(0),
        (f, 0) if f > 0 => Ok(f * SEGMENT as u64),
        (f, r) if r > TAG_LEN as u64 => Ok(f * SEGMENT as u64 + r - TAG_LEN as u64),
        _ => Err(CipherError::Malformed(
            name.to_string(),
            "its size is no whole number of segments",
        )),
    }
}

/// Segment `i` of an object of `plain` bytes: (its plaintext offset, its length, where its
/// sealed form starts in the stored object).
fn placed_segment(plain: u64, i: u64) -> (usize, usize, usize) {
    let from = (i * SEGMENT as u64) as usize;
    let m = (plain.saturating_sub(from as u64)).min(SEGMENT as u64) as usize;
    (from, m, HEADER_LEN + i as usize * SEALED_SEGMENT)
}

/// Seals objects under one data key for one repository.
pub struct ObjectCipher<'a> {
    pub key: &'a DataKey,
    pub repo_id: &'a [u8; REPO_ID_LEN],
}

impl ObjectCipher<'_> {
    /// `plain` sealed as the object `name`: [`sealed_size`] bytes (one copy of the data,
    /// each segment sealed where it lands).
    pub fn seal(&self, name: &str, plain: &[u8]) -> CResult<Vec<u8>> {
        let len = plain.len() as u64;
        let mut out = vec![0u8; sealed_size(len) as usize];
        for i in 0..segments(len) {
            let (from, m, to) = placed_segment(len, i);
            out[to..to + m].copy_from_slice(&plain[from..from + m]);
        }
        self.seal_placed(name, &mut out, len)?;
        Ok(out)
    }

    /// Seals `buf` (the plaintext of the object `name`) where it lies: it grows to
    /// [`sealed_size`] bytes, each segment moved up past the header and the tags before it
    /// (last first) and sealed in place. No other buffer is used.
    pub fn seal_in_place(
        &self,
        name: &str,
        buf: &mut crate::io::direct::AlignedBuf,
    ) -> CResult<()> {
        let plain = buf.len() as u64;
        buf.resize(sealed_size(plain) as usize, 0);
        self.seal_spread(name, buf, plain)
    }

    /// [`ObjectCipher::seal_in_place`] of a `Vec` (an archived WAL segment's encoded bytes).
    pub fn seal_vec_in_place(&self, name: &str, buf: &mut Vec<u8>) -> CResult<()> {
        let plain = buf.len() as u64;
        buf.resize(sealed_size(plain) as usize, 0);
        self.seal_spread(name, buf, plain)
    }

    /// Seals `buf`, grown to [`sealed_size`] of its first `plain` bytes: moves each segment
    /// up past the header and the tags before it (last first), then seals it there.
    fn seal_spread(&self, name: &str, buf: &mut [u8], plain: u64) -> CResult<()> {
        for i in (0..segments(plain)).rev() {
            let (from, m, to) = placed_segment(plain, i);
            buf.copy_within(from..from + m, to);
        }
        self.seal_placed(name, buf, plain)
    }

    /// Writes the header into `buf` (a sealed object's room, each plaintext segment of an
    /// object of `plain` bytes already where its sealed form goes) and seals every segment
    /// in place, its tag after it.
    fn seal_placed(&self, name: &str, buf: &mut [u8], plain: u64) -> CResult<()> {
        let n = segments(plain);
        let salt: [u8; SALT_LEN] = random()?;
        let prefix: [u8; PREFIX_LEN] = random()?;
        let key = self.key.object_key(&salt, self.repo_id, name);
        buf[..MAGIC.len()].copy_from_slice(MAGIC);
        buf[MAGIC.len()..MAGIC.len() + SALT_LEN].copy_from_slice(&salt);
        buf[MAGIC.len() + SALT_LEN..HEADER_LEN].copy_from_slice(&prefix);
        for i in 0..n {
            let (_, m, to) = placed_segment(plain, i);
            let tag = key
                .seal_in_place_separate_tag(
                    segment_nonce(&prefix, i as u32, i == n - 1),
                    Aad::empty(),
                    &mut buf[to..to + m],
                )
                .map_err(|_| CipherError::Malformed(name.to_string(), "cannot seal"))?;
            buf[to + m..to + m + TAG_LEN].copy_from_slice(tag.as_ref());
        }
        Ok(())
    }

    /// A sealer for the object `name`, for bytes that arrive in parts. Its header is the
    /// first thing [`Sealer::push`] or [`Sealer::finish`] writes.
    pub fn sealer(&self, name: &str) -> CResult<Sealer> {
        let salt: [u8; SALT_LEN] = random()?;
        let prefix: [u8; PREFIX_LEN] = random()?;
        Ok(Sealer {
            key: self.key.object_key(&salt, self.repo_id, name),
            salt,
            prefix,
            index: 0,
            header_written: false,
            pending: Vec::with_capacity(SEGMENT),
            name: name.to_string(),
        })
    }

    /// The plaintext of the whole stored object `name`. Errors: it does not authenticate,
    /// or is not of this format.
    pub fn open(&self, name: &str, sealed: &[u8]) -> CResult<Vec<u8>> {
        let mut out = sealed.to_vec();
        let n = self.open_in_place(name, &mut out)?;
        out.truncate(n);
        Ok(out)
    }

    /// The key of the object `name` and its nonce prefix, from the header at the start of
    /// `header`. Errors: not a pgjet encryption header.
    fn header_key(&self, name: &str, header: &[u8]) -> CResult<(LessSafeKey, [u8; PREFIX_LEN])> {
        if header.len() < HEADER_LEN || &header[..MAGIC.len()] != MAGIC {
            return Err(CipherError::Malformed(
                name.to_string(),
                "no pgjet encryption header",
            ));
        }
        let mut salt = [0u8; SALT_LEN];
        salt.copy_from_slice(&header[MAGIC.len()..MAGIC.len() + SALT_LEN]);
        let mut prefix = [0u8; PREFIX_LEN];
        prefix.copy_from_slice(&header[MAGIC.len() + SALT_LEN..HEADER_LEN]);
        Ok((self.key.object_key(&salt, self.repo_id, name), prefix))
    }

    /// Opens the whole stored object `name` where it lies: `buf` holds its sealed bytes, and
    /// when this returns `Ok(n)` its first `n` bytes are the plaintext (each segment opened
    /// and moved down over the header and the tags before it; nothing is copied elsewhere).
    /// Errors: a segment does not authenticate; not of this format.
    pub fn open_in_place(&self, name: &str, buf: &mut [u8]) -> CResult<usize> {
        let plain = plain_size(name, buf.len() as u64)?;
        let (key, prefix) = self.header_key(name, buf)?;
        let n = segments(plain);
        for i in 0..n {
            let dst = (i * SEGMENT as u64) as usize;
            let m = (plain - dst as u64).min(SEGMENT as u64) as usize;
            let src = HEADER_LEN + i as usize * SEALED_SEGMENT;
            let nonce = segment_nonce(&prefix, i as u32, i == n - 1);
            key.open_within(
                nonce,
                Aad::empty(),
                &mut buf[dst..src + m + TAG_LEN],
                src - dst..,
            )
            .map_err(|_| CipherError::Unauthentic(name.to_string()))?;
        }
        Ok(plain as usize)
    }

    /// Where the plaintext range `offset`, `len` of an object of `plain` bytes lies in the
    /// stored object: (its first segment, the stored offset and length of the whole segments
    /// that hold it). The header ([`HEADER_LEN`] bytes at 0) is needed too.
    pub fn range(offset: u64, len: u64, plain: u64) -> (u32, u64, u64) {
        let end = (offset + len).min(plain);
        let first = offset.min(plain) / SEGMENT as u64;
        let last = if end > offset {
            (end - 1) / SEGMENT as u64
        } else {
            first
        };
        let last = last.min(segments(plain) - 1);
        let at = HEADER_LEN as u64 + first * SEALED_SEGMENT as u64;
        let stop = (HEADER_LEN as u64 + (last + 1) * SEALED_SEGMENT as u64).min(sealed_size(plain));
        (first as u32, at, stop - at)
    }

    /// Opens the stored segments `body` (whole segments from `first`, as [`Self::range`]
    /// gave them) of the object `name` of `plain` bytes, whose header is `header`, into
    /// `out` (exactly the plaintext of those segments). Errors: a segment does not
    /// authenticate; the header is not of this format.
    pub fn open_segments(
        &self,
        name: &str,
        header: &[u8],
        first: u32,
        plain: u64,
        body: &[u8],
        out: &mut [u8],
    ) -> CResult<()> {
        let (key, prefix) = self.header_key(name, header)?;
        let last_index = segments(plain) - 1;
        let mut seg = vec![0u8; SEALED_SEGMENT];
        let (mut at, mut wrote) = (0usize, 0usize);
        let mut index = first as u64;
        while at < body.len() {
            let n = (body.len() - at).min(SEALED_SEGMENT);
            if n < TAG_LEN || index > last_index {
                return Err(CipherError::Unauthentic(name.to_string()));
            }
            seg[..n].copy_from_slice(&body[at..at + n]);
            let nonce = segment_nonce(&prefix, index as u32, index == last_index);
            let opened = key
                .open_in_place(nonce, Aad::empty(), &mut seg[..n])
                .map_err(|_| CipherError::Unauthentic(name.to_string()))?;
            let m = opened.len();
            if wrote + m > out.len() {
                return Err(CipherError::Unauthentic(name.to_string()));
            }
            out[wrote..wrote + m].copy_from_slice(opened);
            wrote += m;
            at += n;
            index += 1;
        }
        if wrote != out.len() {
            return Err(CipherError::Unauthentic(name.to_string()));
        }
        seg.zeroize();
        Ok(())
    }
}

/// Seals one object whose bytes arrive in parts ([`ObjectCipher::sealer`]).
pub struct Sealer {
    key: LessSafeKey,
    salt: [u8; SALT_LEN],
    prefix: [u8; PREFIX_LEN],
    index: u32,
    header_written: bool,
    /// Plaintext not sealed yet: a full segment is held back until more arrives, since the
    /// last segment is sealed differently.
    pending: Vec<u8>,
    name: String,
}

impl Sealer {
    fn header(&mut self, out: &mut Vec<u8>) {
        if !self.header_written {
            out.extend_from_slice(MAGIC);
            out.extend_from_slice(&self.salt);
            out.extend_from_slice(&self.prefix);
            self.header_written = true;
        }
    }

    fn seal_segment(&mut self, last: bool, out: &mut Vec<u8>) -> CResult<()> {
        let n = self.pending.len().min(SEGMENT);
        let start = out.len();
        out.extend_from_slice(&self.pending[..n]);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                segment_nonce(&self.prefix, self.index, last),
                Aad::empty(),
                &mut out[start..],
            )
            .map_err(|_| CipherError::Malformed(self.name.clone(), "cannot seal"))?;
        out.extend_from_slice(tag.as_ref());
        self.pending.drain(..n);
        self.index = self.index.checked_add(1).ok_or(CipherError::Malformed(
            self.name.clone(),
            "more than 2^32 segments",
        ))?;
        Ok(())
    }

    /// Adds `data`, appending whole sealed segments to `out` (a full one only once more
    /// bytes follow it).
    pub fn push(&mut self, data: &[u8], out: &mut Vec<u8>) -> CResult<()> {
        self.header(out);
        let mut data = data;
        while !data.is_empty() {
            let room = SEGMENT + 1 - self.pending.len();
            let take = room.min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.pending.len() > SEGMENT {
                self.seal_segment(false, out)?;
            }
        }
        Ok(())
    }

    /// Seals what is left as the last segment (empty when nothing was pushed).
    pub fn finish(mut self, out: &mut Vec<u8>) -> CResult<()> {
        self.header(out);
        self.seal_segment(true, out)?;
        self.pending.zeroize();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A random data key and repository id.
    fn fresh() -> (DataKey, [u8; REPO_ID_LEN]) {
        (DataKey::random().unwrap(), new_repository_id().unwrap())
    }

    fn quick_kdf() -> Kdf {
        // The tests' parameters: cheap (the defaults take 64 MiB and about 0.1 s).
        Kdf {
            memory_kib: 64,
            passes: 1,
            lanes: 1,
            salt: [7; SALT_LEN],
        }
    }

    #[test]
    fn sizes_round_trip_and_refuse_impossible_ones() {
        for n in [
            0u64,
            1,
            100,
            SEGMENT as u64 - 1,
            SEGMENT as u64,
            SEGMENT as u64 + 1,
            3 * SEGMENT as u64,
            8 << 20,
        ] {
            assert_eq!(plain_size("o", sealed_size(n)).unwrap(), n, "{n}");
        }
        assert_eq!(sealed_size(0), (HEADER_LEN + TAG_LEN) as u64);
        for bad in [
            0u64,
            30,
            HEADER_LEN as u64,
            HEADER_LEN as u64 + 5,
            (HEADER_LEN + SEALED_SEGMENT + TAG_LEN) as u64,
        ] {
            assert!(plain_size("o", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn objects_seal_and_open_in_one_piece_or_in_parts() {
        let (key, repo) = fresh();
        let c = ObjectCipher {
            key: &key,
            repo_id: &repo,
        };
        let data: Vec<u8> = (0..(3 * SEGMENT + 123))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        for n in [0, 1, SEGMENT, SEGMENT + 1, data.len()] {
            let sealed = c.seal("backup/x/data/000001", &data[..n]).unwrap();
            assert_eq!(sealed.len() as u64, sealed_size(n as u64));
            assert_eq!(c.open("backup/x/data/000001", &sealed).unwrap(), &data[..n]);
            // in parts of odd sizes
            let mut s = c.sealer("o").unwrap();
            let mut out = Vec::new();
            for part in data[..n].chunks(1000) {
                s.push(part, &mut out).unwrap();
            }
            s.finish(&mut out).unwrap();
            assert_eq!(out.len() as u64, sealed_size(n as u64));
            assert_eq!(c.open("o", &out).unwrap(), &data[..n]);
        }
        // the same bytes sealed twice differ (fresh salt and prefix)
        assert_ne!(c.seal("o", &data).unwrap(), c.seal("o", &data).unwrap());
    }

    #[test]
    fn damage_truncation_reordering_and_swaps_are_refused() {
        let (key, repo) = fresh();
        let c = ObjectCipher {
            key: &key,
            repo_id: &repo,
        };
        let data = vec![42u8; 2 * SEGMENT + 10];
        let sealed = c.seal("a", &data).unwrap();
        let unauthentic = Err(CipherError::Unauthentic("a".into()));
        // a flipped byte anywhere: header, body, tag
        for at in [
            MAGIC.len() + 1,
            HEADER_LEN + 5,
            HEADER_LEN + SEGMENT + 3,
            sealed.len() - 1,
        ] {
            let mut bad = sealed.clone();
            bad[at] ^= 1;
            assert_eq!(c.open("a", &bad), unauthentic, "byte {at}");
        }
        // cut at a segment boundary: the segment now last was not sealed as last
        let cut = &sealed[..HEADER_LEN + 2 * SEALED_SEGMENT];
        assert_eq!(c.open("a", cut), unauthentic);
        // two segments swapped
        let mut swapped = sealed.clone();
        let (s0, s1) = (HEADER_LEN, HEADER_LEN + SEALED_SEGMENT);
        let first = sealed[s0..s1].to_vec();
        swapped.copy_within(s1..s1 + SEALED_SEGMENT, s0);
        swapped[s1..s1 + SEALED_SEGMENT].copy_from_slice(&first);
        assert_eq!(c.open("a", &swapped), unauthentic);
        // another name, another key, another repository
        assert!(c.open("b", &sealed).is_err());
        let other = DataKey::random().unwrap();
        assert!(ObjectCipher {
            key: &other,
            repo_id: &repo
        }
        .open("a", &sealed)
        .is_err());
        let repo2 = new_repository_id().unwrap();
        assert!(ObjectCipher {
            key: &key,
            repo_id: &repo2
        }
        .open("a", &sealed)
        .is_err());
        // not this format at all
        assert!(matches!(
            c.open("a", &[0u8; 100]),
            Err(CipherError::Malformed(..)) | Err(CipherError::Unauthentic(_))
        ));
    }

    #[test]
    fn ranges_open_only_their_segments() {
        let (key, repo) = fresh();
        let c = ObjectCipher {
            key: &key,
            repo_id: &repo,
        };
        let data: Vec<u8> = (0..(4 * SEGMENT + 777)).map(|i| (i % 253) as u8).collect();
        let sealed = c.seal("r", &data).unwrap();
        let plain = data.len() as u64;
        for (off, len) in [
            (0u64, 1u64),
            (5, 100),
            (SEGMENT as u64 - 1, 2),
            (SEGMENT as u64, SEGMENT as u64),
            (3 * SEGMENT as u64 + 5, 2000),
            (plain - 1, 1),
            (0, plain),
        ] {
            let (first, at, n) = ObjectCipher::range(off, len, plain);
            let body = &sealed[at as usize..(at + n) as usize];
            let segs = n.div_ceil(SEALED_SEGMENT as u64);
            let start = first as u64 * SEGMENT as u64;
            let size = (segs * SEGMENT as u64).min(plain - start) as usize;
            let mut out = vec![0u8; size];
            c.open_segments("r", &sealed[..HEADER_LEN], first, plain, body, &mut out)
                .unwrap();
            let rel = (off - start) as usize;
            assert_eq!(
                &out[rel..rel + len as usize],
                &data[off as usize..(off + len) as usize],
                "{off} {len}"
            );
        }
    }

    #[test]
    fn keys_wrap_under_the_passphrase_and_nothing_else() {
        let repo = new_repository_id().unwrap();
        let kdf = quick_kdf();
        let kek = kdf.derive(b"correct horse").unwrap();
        let key = DataKey::random().unwrap();
        let wrapped = kek.wrap(&repo, "backup/20261126-120000F", &key).unwrap();
        assert_eq!(wrapped.len(), NONCE_LEN + KEY_LEN + TAG_LEN);
        let back = kek
            .unwrap(&repo, "backup/20261126-120000F", &wrapped)
            .unwrap();
        assert_eq!(back.0, key.0);
        let wrong = kdf.derive(b"wrong horse").unwrap();
        assert_eq!(
            wrong
                .unwrap(&repo, "backup/20261126-120000F", &wrapped)
                .err(),
            Some(CipherError::WrongPassphrase(
                "backup/20261126-120000F".into()
            ))
        );
        // moved to another name or repository
        assert!(kek.unwrap(&repo, "archive", &wrapped).is_err());
        assert!(kek
            .unwrap(
                &new_repository_id().unwrap(),
                "backup/20261126-120000F",
                &wrapped
            )
            .is_err());
        assert!(kek.unwrap(&repo, "stanza", &wrapped[1..]).is_err());
        // the derivation is deterministic for the same salt, different for another
        let again = quick_kdf().derive(b"correct horse").unwrap();
        assert!(again
            .unwrap(&repo, "backup/20261126-120000F", &wrapped)
            .is_ok());
        let salted = Kdf {
            salt: [8; SALT_LEN],
            ..quick_kdf()
        }
        .derive(b"correct horse")
        .unwrap();
        assert!(salted
            .unwrap(&repo, "backup/20261126-120000F", &wrapped)
            .is_err());
        // parameters Argon2 refuses are an error, not a panic
        assert!(Kdf {
            memory_kib: 1,
            ..quick_kdf()
        }
        .derive(b"x")
        .is_err());
    }
}
