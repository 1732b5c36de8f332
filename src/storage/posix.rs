//! The posix store: objects are files below a root directory.
//!
//! Durability is batched: `put` only writes; `sync` runs one `syncfs(2)` over the filesystem
//! that holds the root (data and directory entries alike), so thousands of small objects cost
//! one flush instead of one fsync each.
use super::{ObjectWriter, Storage};
use crate::error::{Error, Result};
use crate::io::direct::{self, AlignedBuf, Writer};
use crate::io::fs::{fsync_dir, SyncHandle};
use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A store rooted at a local directory.
pub struct PosixStorage {
    root: PathBuf,
    root_handle: SyncHandle,
    made_dirs: Mutex<HashSet<PathBuf>>,
}

impl PosixStorage {
    /// Opens a store at `root`; the directory must exist.
    pub fn open(root: &Path) -> Result<Self> {
        if !root.is_dir() {
            return Err(Error::Repo(format!(
                "repository path {} does not exist or is not a directory",
                root.display()
            )));
        }
        Ok(PosixStorage {
            root: root.to_path_buf(),
            root_handle: SyncHandle::open(root)?,
            made_dirs: Mutex::new(HashSet::new()),
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// A temporary sibling of `p` no other process uses: `<name>.tmp.<pid>.<n>`.
    fn temp_for(p: &Path) -> PathBuf {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut t = p.as_os_str().to_owned();
        t.push(format!(".tmp.{}.{n}", std::process::id()));
        PathBuf::from(t)
    }

    /// Writes `data` to a new temporary sibling of `p` and fsyncs it.
    fn write_temp(p: &Path, data: &[u8]) -> Result<PathBuf> {
        let tmp = Self::temp_for(p);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| Error::io("create", &tmp, e))?;
        let r = f
            .write_all(data)
            .and_then(|_| f.sync_all())
            .map_err(|e| Error::io("write", &tmp, e));
        if r.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        r.map(|_| tmp)
    }

    fn ensure_parent(&self, p: &Path) -> Result<()> {
        if let Some(parent) = p.parent() {
            let mut made = self.made_dirs.lock().unwrap_or_else(|e| e.into_inner());
            if !made.contains(parent) {
                // The directories this call creates, so their entries are made durable too
                // (an archived WAL file must survive a crash with its new directory).
                let mut created = Vec::new();
                let mut d = parent;
                while !d.exists() {
                    created.push(d.to_path_buf());
                    match d.parent() {
                        Some(up) => d = up,
                        None => break,
                    }
                }
                fs::create_dir_all(parent).map_err(|e| Error::io("create directory", parent, e))?;
                for c in created.iter().rev() {
                    if let Some(up) = c.parent() {
                        fsync_dir(up)?;
                    }
                }
                made.insert(parent.to_path_buf());
            }
        }
        Ok(())
    }
}

/// [`ObjectWriter`] of the posix store: a temporary file renamed into place by `finish`.
struct PosixWriter {
    tmp: PathBuf,
    dest: PathBuf,
    file: Option<BufWriter<File>>,
}

impl ObjectWriter for PosixWriter {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        match self.file.as_mut() {
            Some(f) => f
                .write_all(data)
                .map_err(|e| Error::io("write", &self.tmp, e)),
            None => Err(Error::Other(format!(
                "{} was already finished",
                self.dest.display()
            ))),
        }
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        let f = self
            .file
            .take()
            .ok_or_else(|| Error::Other(format!("{} was already finished", self.dest.display())))?;
        let f = f
            .into_inner()
            .map_err(|e| Error::io("write", &self.tmp, e.into_error()))?;
        f.sync_all().map_err(|e| Error::io("fsync", &self.tmp, e))?;
        fs::rename(&self.tmp, &self.dest).map_err(|e| Error::io("rename", &self.tmp, e))?;
        fsync_dir(self.dest.parent().unwrap_or(Path::new("/")))
    }
}

impl Drop for PosixWriter {
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

impl Storage for PosixStorage {
    fn describe(&self) -> String {
        format!("posix {}", self.root.display())
    }

    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        let p = self.path(name);
        self.ensure_parent(&p)?;
        let w = Writer::create(&p).map_err(|e| Error::io("create", &p, e))?;
        w.write_at(data, 0).map_err(|e| Error::io("write", &p, e))
    }

    fn put_durable(&self, name: &str, data: &[u8]) -> Result<()> {
        let p = self.path(name);
        self.ensure_parent(&p)?;
        let tmp = Self::write_temp(&p, data)?;
        fs::rename(&tmp, &p).map_err(|e| Error::io("rename", &tmp, e))?;
        fsync_dir(p.parent().unwrap_or(&self.root))
    }

    fn create_new(&self, name: &str, data: &[u8]) -> Result<bool> {
        let p = self.path(name);
        self.ensure_parent(&p)?;
        let tmp = Self::write_temp(&p, data)?;
        // link(2) fails with EEXIST when the name is taken: an atomic create-if-absent of a
        // file that is complete from its first moment.
        let linked = fs::hard_link(&tmp, &p);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                fsync_dir(p.parent().unwrap_or(&self.root))?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // The name may come from a create killed between its link and its fsync:
                // make it durable before anyone acts on its existence.
                fsync_dir(p.parent().unwrap_or(&self.root))?;
                Ok(false)
            }
            Err(e) => Err(Error::io("link", &p, e)),
        }
    }

    fn reader(&self, name: &str) -> Result<Box<dyn Read + Send>> {
        let p = self.path(name);
        let f = File::open(&p).map_err(|e| Error::io("open", &p, e))?;
        Ok(Box::new(std::io::BufReader::with_capacity(1 << 20, f)))
    }

    fn writer(&self, name: &str) -> Result<Box<dyn ObjectWriter>> {
        let p = self.path(name);
        self.ensure_parent(&p)?;
        let tmp = Self::temp_for(&p);
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| Error::io("create", &tmp, e))?;
        Ok(Box::new(PosixWriter {
            tmp,
            dest: p,
            file: Some(BufWriter::with_capacity(1 << 20, f)),
        }))
    }

    fn delete(&self, name: &str) -> Result<()> {
        let p = self.path(name);
        match fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove", &p, e)),
        }
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let p = self.path(name);
        let f = File::open(&p).map_err(|e| Error::io("open", &p, e))?;
        let mut buf = vec![0u8; len as usize];
        f.read_exact_at(&mut buf, offset)
            .map_err(|e| Error::io("read", &p, e))?;
        Ok(buf)
    }

    fn get_aligned(&self, name: &str) -> Result<AlignedBuf> {
        let p = self.path(name);
        let size = fs::metadata(&p)
            .map_err(|e| Error::io("stat", &p, e))?
            .len();
        direct::read_all(&p, size).map_err(|e| Error::io("read", &p, e))
    }

    fn get_aligned_into(&self, name: &str, buf: &mut AlignedBuf) -> Result<()> {
        let p = self.path(name);
        let size = fs::metadata(&p)
            .map_err(|e| Error::io("stat", &p, e))?
            .len();
        direct::read_all_into(&p, size, buf).map_err(|e| Error::io("read", &p, e))
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let p = self.path(name);
        let mut buf = Vec::new();
        File::open(&p)
            .and_then(|mut f| f.read_to_end(&mut buf))
            .map_err(|e| Error::io("read", &p, e))?;
        Ok(buf)
    }

    fn exists(&self, name: &str) -> Result<bool> {
        Ok(self.path(name).is_file())
    }

    fn size(&self, name: &str) -> Result<Option<u64>> {
        let p = self.path(name);
        match fs::metadata(&p) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("stat", &p, e)),
        }
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        let p = self.path(dir);
        let rd = match fs::read_dir(&p) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io("list", &p, e)),
        };
        let mut names = Vec::new();
        for ent in rd {
            let ent = ent.map_err(|e| Error::io("list", &p, e))?;
            names.push(ent.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn remove_all(&self, dir: &str) -> Result<()> {
        let p = self.path(dir);
        match fs::remove_dir_all(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove", &p, e)),
        }
    }

    fn sync(&self) -> Result<()> {
        self.root_handle.syncfs()
    }
}
