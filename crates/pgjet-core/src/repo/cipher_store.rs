//! An encrypted repository: a [`Storage`] that seals every object it writes and opens every
//! object it reads, over any store (posix, S3, GCS, Azure, SFTP), as docs/encryption.md
//! specifies (the primitives are [`super::cipher`]'s).
//!
//! Which key seals an object follows from its name below the repository root:
//!
//! ```text
//! <stanza>/cipher.json              plain: the KDF, the repository id, the wrapped keys
//! <stanza>/backup/<label>/key       plain: the backup's wrapped key
//! <stanza>/backup/<label>/...       the backup's key (made when its first object is written)
//! <stanza>/archive/...              the archive key
//! <stanza>/...                      the stanza key (stanza.json, the lock, check probes)
//! ```
//!
//! The first object written to a stanza that has no `cipher.json` creates it (a new salt,
//! repository id, stanza and archive keys); a stanza that holds plain objects is refused.
//! Keys are derived and unwrapped once per stanza per process and kept in memory.
use super::cipher::{self, CipherError, ObjectCipher, HEADER_LEN, SEGMENT, TAG_LEN};
use super::cipher_keys::*;
use crate::error::{Error, Result};
use crate::io::direct::AlignedBuf;
use crate::storage::{Names, ObjectWriter, Storage};
use std::collections::HashMap;
use std::io::Read;
use std::sync::{Arc, Mutex};

/// A store whose objects are encrypted with the passphrase of repository `repo`.
pub struct CipherStorage {
    pub(super) inner: Arc<dyn Storage>,
    pub(super) repo: u8,
    pub(super) pass: zeroize::Zeroizing<Vec<u8>>,
    pub(super) stanzas: Mutex<HashMap<String, Arc<StanzaKeys>>>,
}

impl CipherStorage {
    /// `inner` encrypted with `passphrase` (repository number `repo`, for messages).
    pub fn new(inner: Arc<dyn Storage>, repo: u8, passphrase: &str) -> CipherStorage {
        CipherStorage {
            inner,
            repo,
            pass: zeroize::Zeroizing::new(passphrase.as_bytes().to_vec()),
            stanzas: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn wrong_passphrase(&self) -> Error {
        let n = self.repo;
        Error::Repo(format!(
            "repository repo{n}: the passphrase (repo{n}-cipher-pass) does not open its keys"
        ))
    }

    pub(super) fn plain_stanza(&self, stanza: &str) -> Error {
        let n = self.repo;
        Error::Repo(format!(
            "stanza '{stanza}' of repo{n} was created without encryption, but repo{n}-cipher-type={CIPHER_TYPE} is set: \
             remove repo{n}'s cipher options to use it, or create the stanza in an empty repository"
        ))
    }
}

impl Storage for CipherStorage {
    fn describe(&self) -> String {
        format!("{} (encrypted, {CIPHER_TYPE})", self.inner.describe())
    }

    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        match self.sealing(name, true)? {
            None => self.inner.put(name, data),
            Some(s) => self.inner.put(name, &s.cipher().seal(name, data)?),
        }
    }

    fn read_ahead(&self) -> usize {
        self.inner.read_ahead()
    }

    fn remote(&self) -> bool {
        self.inner.remote()
    }

    fn put_owned(&self, name: &str, mut data: AlignedBuf) -> Result<Option<AlignedBuf>> {
        // Sealed in the caller's (aligned) buffer: a posix store writes it directly, an
        // object store uploads it without a copy.
        if let Some(s) = self.sealing(name, true)? {
            s.cipher().seal_in_place(name, &mut data)?;
        }
        self.inner.put_owned(name, data)
    }

    fn put_durable(&self, name: &str, data: &[u8]) -> Result<()> {
        match self.sealing(name, true)? {
            None => self.inner.put_durable(name, data),
            Some(s) => self.inner.put_durable(name, &s.cipher().seal(name, data)?),
        }
    }

    fn create_new(&self, name: &str, data: &[u8]) -> Result<bool> {
        match self.sealing(name, true)? {
            None => self.inner.create_new(name, data),
            Some(s) => self.inner.create_new(name, &s.cipher().seal(name, data)?),
        }
    }

    fn create_new_owned(&self, name: &str, mut data: Vec<u8>) -> Result<(bool, Vec<u8>)> {
        if let Some(s) = self.sealing(name, true)? {
            s.cipher().seal_vec_in_place(name, &mut data)?;
        }
        self.inner.create_new_owned(name, data)
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let Some(s) = self.sealing(name, false)? else {
            return self.inner.get_range(name, offset, len);
        };
        let Some(sealed) = self.inner.size(name)? else {
            return self.inner.get_range(name, offset, len);
        };
        let plain = cipher::plain_size(name, sealed)?;
        if offset.saturating_add(len) > plain {
            return Err(Error::Repo(format!(
                "{name}: {len} bytes at {offset} asked of an object of {plain}"
            )));
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        let (first, at, n) = ObjectCipher::range(offset, len, plain);
        let header = self.inner.get_range(name, 0, HEADER_LEN as u64)?;
        let body = self.inner.get_range(name, at, n)?;
        let start = first as u64 * SEGMENT as u64;
        let end = (start + n - n.div_ceil((SEGMENT + TAG_LEN) as u64) * TAG_LEN as u64).min(plain);
        let mut out = vec![0u8; (end - start) as usize];
        s.cipher()
            .open_segments(name, &header, first, plain, &body, &mut out)?;
        let from = (offset - start) as usize;
        Ok(out[from..from + len as usize].to_vec())
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let s = self.sealing(name, false)?;
        let mut v = self.inner.get(name)?;
        if let Some(s) = s {
            let n = s.cipher().open_in_place(name, &mut v)?;
            v.truncate(n);
        }
        Ok(v)
    }

    fn get_into(&self, name: &str, size: Option<u64>, buf: &mut AlignedBuf) -> Result<()> {
        let Some(s) = self.sealing(name, false)? else {
            return self.inner.get_into(name, size, buf);
        };
        // Read sealed into the caller's buffer and opened there: no copy of the data.
        self.inner
            .get_into(name, size.map(cipher::sealed_size), buf)?;
        let n = s.cipher().open_in_place(name, buf)?;
        buf.truncate(n);
        Ok(())
    }

    fn reader(&self, name: &str) -> Result<Box<dyn Read + Send>> {
        let Some(s) = self.sealing(name, false)? else {
            return self.inner.reader(name);
        };
        let Some(sealed) = self.inner.size(name)? else {
            return self.inner.reader(name);
        };
        Ok(Box::new(OpenReader {
            plain: cipher::plain_size(name, sealed)?,
            inner: self.inner.reader(name)?,
            sealing: s,
            name: name.to_string(),
            header: None,
            index: 0,
            seg: Vec::new(),
            out: Vec::new(),
            pos: 0,
        }))
    }

    fn writer(&self, name: &str) -> Result<Box<dyn ObjectWriter>> {
        let Some(s) = self.sealing(name, true)? else {
            return self.inner.writer(name);
        };
        Ok(Box::new(SealWriter {
            sealer: Some(s.cipher().sealer(name)?),
            inner: self.inner.writer(name)?,
            out: Vec::new(),
        }))
    }

    fn exists(&self, name: &str) -> Result<bool> {
        self.inner.exists(name)
    }

    fn size(&self, name: &str) -> Result<Option<u64>> {
        let Some(sealed) = self.inner.size(name)? else {
            return Ok(None);
        };
        match classify(name) {
            Class::Plain | Class::Outside => Ok(Some(sealed)),
            _ => Ok(Some(cipher::plain_size(name, sealed)?)),
        }
    }

    fn list(&self, dir: &str) -> Result<Names<'_>> {
        self.inner.list(dir)
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.forget(name);
        self.inner.delete(name)
    }

    fn remove_all(&self, dir: &str) -> Result<()> {
        self.forget(dir);
        self.inner.remove_all(dir)
    }

    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }

    fn cancel(&self) {
        self.inner.cancel()
    }
}

/// Reads an encrypted object segment by segment, each authenticated before a byte of it is
/// returned.
struct OpenReader {
    inner: Box<dyn Read + Send>,
    sealing: Sealing,
    name: String,
    plain: u64,
    header: Option<[u8; HEADER_LEN]>,
    index: u64,
    seg: Vec<u8>,
    out: Vec<u8>,
    pos: usize,
}

impl Read for OpenReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let bad = |e: CipherError| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        if self.pos == self.out.len() {
            let start = self.index * SEGMENT as u64;
            if start >= self.plain && !(self.plain == 0 && self.index == 0) {
                return Ok(0);
            }
            let header = match self.header {
                Some(h) => h,
                None => {
                    let mut h = [0u8; HEADER_LEN];
                    self.inner.read_exact(&mut h)?;
                    self.header = Some(h);
                    h
                }
            };
            let m = (self.plain - start).min(SEGMENT as u64) as usize;
            self.seg.resize(m + TAG_LEN, 0);
            self.inner.read_exact(&mut self.seg)?;
            self.out.resize(m, 0);
            self.sealing
                .cipher()
                .open_segments(
                    &self.name,
                    &header,
                    self.index as u32,
                    self.plain,
                    &self.seg,
                    &mut self.out,
                )
                .map_err(bad)?;
            self.index += 1;
            self.pos = 0;
            if m == 0 {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.out.len() - self.pos);
        buf[..n].copy_from_slice(&self.out[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Seals an object written in parts.
struct SealWriter {
    sealer: Option<cipher::Sealer>,
    inner: Box<dyn ObjectWriter>,
    out: Vec<u8>,
}

impl ObjectWriter for SealWriter {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        let Some(s) = self.sealer.as_mut() else {
            return Err(Error::Other("write after finish".into()));
        };
        s.push(data, &mut self.out)?;
        if !self.out.is_empty() {
            self.inner.write(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        if let Some(s) = self.sealer.take() {
            s.finish(&mut self.out)?;
        }
        self.inner.write(&self.out)?;
        self.inner.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::posix::PosixStorage;

    fn stores(dir: &std::path::Path) -> (Arc<dyn Storage>, CipherStorage) {
        let plain: Arc<dyn Storage> = Arc::new(PosixStorage::open(dir).unwrap());
        let enc = CipherStorage::new(plain.clone(), 1, "correct horse battery staple");
        (plain, enc)
    }

    #[test]
    fn names_choose_their_key() {
        assert_eq!(classify("main/cipher.json"), Class::Plain);
        assert_eq!(classify("main/backup/L/key"), Class::Plain);
        assert_eq!(
            classify("main/backup/L/data/000001"),
            Class::Backup("main", "L")
        );
        assert_eq!(classify("main/archive/00000001/x"), Class::Archive("main"));
        assert_eq!(classify("main/stanza.json"), Class::Stanza("main"));
        assert_eq!(classify("main/lock/backup.json"), Class::Stanza("main"));
        assert_eq!(classify("stray"), Class::Outside);
    }

    #[test]
    fn every_way_in_and_out_round_trips_and_nothing_is_stored_plain() {
        let dir = tempfile::tempdir().unwrap();
        let (plain, enc) = stores(dir.path());
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let marker = b"a row of the cluster";
        let mut with_marker = data.clone();
        with_marker.extend_from_slice(marker);
        // Sealed in place, in an aligned buffer (a backup's objects), at several sizes.
        for n in [0usize, 1, 65535, 65536, 65537, 200_000] {
            let mut buf = crate::io::direct::aligned_buf(n);
            buf.extend_from_slice(&with_marker[..n]);
            let name = format!("main/backup/L0/data/{n:06}");
            assert!(enc.put_owned(&name, buf).unwrap().is_some());
            assert_eq!(enc.get(&name).unwrap(), &with_marker[..n], "{n} bytes");
        }
        enc.put("main/stanza.json", b"{\"stanza\":\"main\"}")
            .unwrap();
        enc.put("main/backup/L1/data/000001", &with_marker).unwrap();
        enc.put_durable("main/archive/00000001/seg", &data[..1000])
            .unwrap();
        assert!(enc.create_new("main/lock/backup.json", b"lock").unwrap());
        assert!(!enc.create_new("main/lock/backup.json", b"lock").unwrap());
        let mut w = enc.writer("main/backup/L1/manifest").unwrap();
        for part in with_marker.chunks(7000) {
            w.write(part).unwrap();
        }
        w.finish().unwrap();

        for name in ["main/backup/L1/data/000001", "main/backup/L1/manifest"] {
            assert_eq!(enc.get(name).unwrap(), with_marker, "{name}");
            assert_eq!(enc.size(name).unwrap(), Some(with_marker.len() as u64));
            let stored = plain.get(name).unwrap();
            assert!(!stored.windows(marker.len()).any(|w| w == marker));
            let mut back = Vec::new();
            enc.reader(name).unwrap().read_to_end(&mut back).unwrap();
            assert_eq!(back, with_marker, "{name} through the reader");
            let mut buf = crate::io::direct::aligned_buf(0);
            enc.get_into(name, Some(with_marker.len() as u64), &mut buf)
                .unwrap();
            assert_eq!(&buf[..], &with_marker[..]);
            for (off, len) in [(0u64, 10u64), (65530, 20), (131072, 65536), (299_990, 30)] {
                let r = enc.get_range(name, off, len).unwrap();
                assert_eq!(r, &with_marker[off as usize..(off + len) as usize]);
            }
            assert!(enc.get_range(name, 299_990, 100).is_err());
        }
        assert_eq!(enc.get("main/lock/backup.json").unwrap(), b"lock");
        assert_eq!(enc.get("main/archive/00000001/seg").unwrap(), &data[..1000]);
        // The key files are the only plain objects, and hold no key in the clear.
        assert!(plain.exists("main/cipher.json").unwrap());
        assert!(plain.exists("main/backup/L1/key").unwrap());
        // A missing object is still missing.
        assert!(enc
            .get("main/backup/L1/data/000002")
            .unwrap_err()
            .is_not_found());
        assert!(enc.get("other/stanza.json").unwrap_err().is_not_found());
    }

    #[test]
    fn wrong_passphrase_flipped_byte_swapped_object_and_plain_stanza_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (plain, enc) = stores(dir.path());
        enc.put("main/backup/L1/data/000001", b"one").unwrap();
        enc.put("main/backup/L2/data/000001", b"two").unwrap();
        let wrong = CipherStorage::new(plain.clone(), 1, "Tr0ub4dor&3");
        let e = wrong.get("main/backup/L1/data/000001").unwrap_err();
        assert!(e.to_string().contains("does not open its keys"), "{e}");
        assert!(!e.to_string().contains("Tr0ub4dor"), "{e}");
        // A flipped byte.
        let name = "main/backup/L1/data/000001";
        let mut stored = plain.get(name).unwrap();
        let last = stored.len() - 1;
        stored[last] ^= 1;
        plain.put(name, &stored).unwrap();
        let e = enc.get(name).unwrap_err();
        assert!(e.to_string().contains("does not authenticate"), "{e}");
        // Another backup's object under this name: another key, another name.
        let other = plain.get("main/backup/L2/data/000001").unwrap();
        plain.put(name, &other).unwrap();
        assert!(enc
            .get(name)
            .unwrap_err()
            .to_string()
            .contains("does not authenticate"));
        // A backup's key file swapped for another backup's.
        let k2 = plain.get("main/backup/L2/key").unwrap();
        plain.put("main/backup/L1/key", &k2).unwrap();
        let fresh = CipherStorage::new(plain.clone(), 1, "correct horse battery staple");
        let e = fresh.get(name).unwrap_err();
        assert!(e.to_string().contains("key"), "{e}");
        // A stanza made without encryption is not encrypted by accident.
        plain.put("plain/stanza.json", b"{}").unwrap();
        let e = enc.put("plain/backup/L/data/000001", b"x").unwrap_err();
        assert!(e.to_string().contains("created without encryption"), "{e}");
        let e = enc.get("plain/stanza.json").unwrap_err();
        assert!(e.to_string().contains("created without encryption"), "{e}");
        // A removed backup's key is not reused by a new backup of the same label.
        enc.put("main/backup/L3/data/000001", b"three").unwrap();
        enc.remove_all("main/backup/L3").unwrap();
        enc.put("main/backup/L3/data/000001", b"again").unwrap();
        assert_eq!(fresh.get("main/backup/L3/data/000001").unwrap(), b"again");
    }

    #[test]
    fn a_passphrase_change_rewraps_keys_only_and_survives_an_interruption() {
        let dir = tempfile::tempdir().unwrap();
        let (plain, enc) = stores(dir.path());
        let objects = [
            ("main/stanza.json", b"stanza".as_slice()),
            ("main/archive/00000001/seg", b"wal"),
            ("main/backup/L1/data/000001", b"one"),
            ("main/backup/L2/data/000001", b"two"),
        ];
        for (n, b) in objects {
            enc.put(n, b).unwrap();
        }
        let stored: Vec<Vec<u8>> = objects.iter().map(|(n, _)| plain.get(n).unwrap()).collect();
        let old_cipher = plain.get("main/cipher.json").unwrap();
        let old_key: KeyFile =
            serde_json::from_slice(&plain.get("main/backup/L1/key").unwrap()).unwrap();
        assert_eq!(enc.change_passphrase("main", "the new one").unwrap(), 2);
        // Only the key files and cipher.json changed.
        for ((n, _), before) in objects.iter().zip(&stored) {
            assert_eq!(&plain.get(n).unwrap(), before, "{n} was rewritten");
        }
        let with = |pass: &str| CipherStorage::new(plain.clone(), 1, pass);
        let e = with("correct horse battery staple")
            .get("main/stanza.json")
            .unwrap_err();
        assert!(e.to_string().contains("does not open its keys"), "{e}");
        let new = with("the new one");
        for (n, b) in objects {
            assert_eq!(new.get(n).unwrap(), b, "{n} under the new passphrase");
        }
        // Interrupted between the key files and the switch (old cipher.json, key files
        // holding both wrappings): the old passphrase opens everything; after the switch
        // (new cipher.json) the new one does.
        let new_cipher = plain.get("main/cipher.json").unwrap();
        let new_key: KeyFile =
            serde_json::from_slice(&plain.get("main/backup/L1/key").unwrap()).unwrap();
        let both = KeyFile {
            format: 1,
            key: old_key.key.clone(),
            kek: old_key.kek.clone(),
            next: Some(NextKey {
                kek: new_key.kek.clone().unwrap(),
                key: new_key.key.clone(),
            }),
        };
        plain
            .put("main/backup/L1/key", &to_json(&both).unwrap())
            .unwrap();
        plain.put("main/cipher.json", &old_cipher).unwrap();
        let old = with("correct horse battery staple");
        assert_eq!(old.get("main/backup/L1/data/000001").unwrap(), b"one");
        plain.put("main/cipher.json", &new_cipher).unwrap();
        assert_eq!(
            with("the new one")
                .get("main/backup/L1/data/000001")
                .unwrap(),
            b"one"
        );
    }

    /// The encrypting store over a store that fails: a refused key-file write fails the
    /// object's write by the store's error (not as a key problem) and leaves no key behind,
    /// so the retry makes one key and everything reads back; a transient failure reading a
    /// key file is not remembered (the next read opens it); a byte flipped on the way back
    /// is refused as not authenticating, naming the object.
    #[test]
    fn over_a_failing_store_errors_are_the_stores_and_nothing_is_remembered() {
        use crate::error::StorageFault;
        use crate::storage::fault::{Fault, FaultyStorage, Op};
        use crate::storage::object::ObjectStorage;
        let mem: Arc<dyn Storage> = Arc::new(ObjectStorage::in_memory("cipher").unwrap());
        let faulty = Arc::new(FaultyStorage::new(mem.clone()));
        let pass = "correct horse battery staple";
        let enc = CipherStorage::new(faulty.clone(), 1, pass);
        enc.put("main/stanza.json", b"{}").unwrap();
        faulty.inject(
            Op::Create,
            "main/backup/L1/key",
            1,
            1,
            Fault::Fail(StorageFault::Transient),
        );
        let e = enc.put("main/backup/L1/data/000001", b"one").unwrap_err();
        crate::storage::fault::assert_transient(&e, None);
        assert!(!mem.exists("main/backup/L1/key").unwrap());
        assert!(!mem.exists("main/backup/L1/data/000001").unwrap());
        enc.put("main/backup/L1/data/000001", b"one").unwrap();
        enc.put("main/backup/L1/data/000002", b"two").unwrap();
        assert_eq!(faulty.calls(Op::Create, "main/backup/L1/key"), 2);
        // A fresh store (no cached keys) whose first key-file read fails.
        let fresh = CipherStorage::new(faulty.clone(), 1, pass);
        faulty.inject(
            Op::Get,
            "main/backup/L1/key",
            1,
            1,
            Fault::Fail(StorageFault::Transient),
        );
        let e = fresh.get("main/backup/L1/data/000001").unwrap_err();
        assert!(!e.to_string().contains("passphrase"), "{e}");
        assert_eq!(fresh.get("main/backup/L1/data/000001").unwrap(), b"one");
        // A damaged read.
        faulty.inject(
            Op::Get,
            "main/backup/L1/data/000002",
            1,
            1,
            Fault::Corrupt(40),
        );
        let e = fresh.get("main/backup/L1/data/000002").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("does not authenticate") && text.contains("000002"),
            "{text}"
        );
        assert_eq!(fresh.get("main/backup/L1/data/000002").unwrap(), b"two");
    }

    /// A passphrase change cut short by the store (the second key file's write refused):
    /// the change fails by the store's error, the old passphrase still opens every object,
    /// and running the change again finishes it.
    #[test]
    fn a_passphrase_change_cut_short_by_the_store_is_finished_by_a_second_run() {
        use crate::error::StorageFault;
        use crate::storage::fault::{Fault, FaultyStorage, Op};
        use crate::storage::object::ObjectStorage;
        let mem: Arc<dyn Storage> = Arc::new(ObjectStorage::in_memory("rewrap").unwrap());
        let faulty = Arc::new(FaultyStorage::new(mem.clone()));
        let old = "correct horse battery staple";
        let enc = CipherStorage::new(faulty.clone(), 1, old);
        let objects = [
            ("main/stanza.json", b"stanza".as_slice()),
            ("main/backup/L1/data/000001", b"one"),
            ("main/backup/L2/data/000001", b"two"),
            ("main/backup/L3/data/000001", b"three"),
        ];
        for (n, b) in objects {
            enc.put(n, b).unwrap();
        }
        faulty.inject(Op::Put, "/key", 2, 1, Fault::Fail(StorageFault::Transient));
        assert!(enc.change_passphrase("main", "the new one").is_err());
        let with = |pass: &str| CipherStorage::new(mem.clone(), 1, pass);
        for (n, b) in objects {
            assert_eq!(with(old).get(n).unwrap(), b, "{n} under the old passphrase");
        }
        assert_eq!(enc.change_passphrase("main", "the new one").unwrap(), 3);
        for (n, b) in objects {
            assert_eq!(
                with("the new one").get(n).unwrap(),
                b,
                "{n} under the new one"
            );
        }
    }
}
