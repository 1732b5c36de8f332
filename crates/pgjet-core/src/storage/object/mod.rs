//! Object stores (S3 and S3-compatible servers, GCS, Azure Blob, SFTP) through OpenDAL.
//!
//! The engine's workers are threads; each call here runs its OpenDAL future on the store's own
//! tokio runtime and blocks the calling thread until it ends, is cancelled
//! ([`Storage::cancel`]) or times out. Every request goes through OpenDAL's retry layer
//! (exponential backoff with jitter, each retry logged as a warning) and timeout layer; what
//! still fails becomes [`Error::Storage`] with a [`StorageFault`] that says whether a later
//! try can help.
//!
//! HTTP goes through our own reqwest client over rustls, set up by [`crate::io::tls`] like the
//! libpq TLS, so `repo-storage-ca-file` and `repo-storage-verify-tls` apply, and a store's
//! self-signed certificate given as `repo-storage-ca-file` is accepted as OpenSSL does.
mod errors;
mod services;

use super::config::RepoConfig;
use super::{Names, ObjectWriter, Storage};
use crate::error::{Error, Result, StorageFault};
use crate::io::direct::AlignedBuf;
use errors::*;
use futures::StreamExt;
use opendal::{ErrorKind, Operator};
use services::*;
use std::future::Future;
use std::io::Read;
use std::time::Duration;

/// Attempts after the first before a request counts as failed (OpenDAL's retry layer).
pub const RETRIES: usize = 6;
/// First backoff delay; it doubles per retry, with jitter, up to [`RETRY_MAX_DELAY`].
pub const RETRY_MIN_DELAY: Duration = Duration::from_millis(200);
/// Longest backoff delay.
pub const RETRY_MAX_DELAY: Duration = Duration::from_secs(10);
/// Longest a request without a body may take, and longest a body transfer may stall.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Part size of multipart uploads by [`Storage::writer`], bytes (S3's minimum part is 5 MiB).
pub const WRITER_PART: usize = 8 << 20;
/// Whole-object reads a restore keeps in flight ([`Storage::read_ahead`]), each of
/// [`READ_PARTS`] requests. Measured at 20 ms on 2 GiB of large files (docs/benchmark-notes.md,
/// "The large-file restore from S3 against s5cmd"): 8 whole-object GETs restored in 12.83 s
/// at 165 MiB, against 14.79 s at 159 MiB for 6 objects of 4 ranged GETs each, in the same
/// runs.
pub const OBJECT_READ_AHEAD: usize = 8;
/// Ranged requests one object read of known size is split into
/// ([`Storage::get_into`] with a known size), each of at least [`READ_PART_MIN`] bytes.
/// 1: one GET per object. On 2026-11-22 four ranged GETs per object restored as fast as
/// twice the objects in flight; on 2026-11-29 whole-object GETs were 1.15-1.17× faster on
/// the same bench (the client, the S3 server and the delay line share 2 cores there, and a
/// split read costs more requests for the same bytes). `PGJET_READ_PARTS` (1 to 16)
/// overrides it for the benchmarks.
pub const READ_PARTS: usize = 1;
/// Smallest ranged request of a split read, bytes.
pub const READ_PART_MIN: u64 = 1 << 20;
/// Parts of one multipart upload in flight at once.
pub const WRITER_CONCURRENCY: usize = 4;

/// A repository on an object store.
pub struct ObjectStorage {
    op: Operator,
    rt: &'static tokio::runtime::Runtime,
    /// `s3 https://host/bucket/prefix`, for messages.
    desc: String,
    /// URL-ish prefix of object names in messages: `s3://bucket/prefix/`.
    target_prefix: String,
    cancel_tx: tokio::sync::watch::Sender<bool>,
}

impl ObjectStorage {
    /// Opens the repository `cfg` (not posix) and checks, with one listing request, that the
    /// bucket exists and the credentials are accepted.
    ///
    /// Errors: settings OpenDAL refuses ([`Error::Config`]), then the listing's
    /// [`Error::Storage`] (Denied, NotFound, Transient).
    pub fn open(cfg: &RepoConfig) -> Result<ObjectStorage> {
        // Each HTTP store gives its TLS settings; our client goes under it.
        let Store {
            op,
            tls,
            desc,
            target_prefix,
        } = store(cfg)?;
        let op = match tls {
            Some(tls) => with_client(op, http_client(tls)?),
            None => op,
        };
        let rt = crate::io::runtime::get()?;
        // One listing, first without retries: a certificate the store's TLS cannot verify
        // fails here at once instead of after every retry; then a missing bucket or refused
        // credentials fail by name instead of looking like an empty repository.
        let probe = rt.block_on(async { op.list_with("").limit(1).await.map(|_| ()) });
        if let Err(e) = &probe {
            if let Some(tls) = crate::error::tls::tls_error_in(e) {
                return Err(Error::Storage {
                    op: "connect",
                    target: desc,
                    fault: StorageFault::Tls(crate::error::tls::TlsFailure::of(tls)),
                    detail: format!("TLS: {}: {}", crate::error::tls::reason(tls), causes(e)),
                    source: None,
                });
            }
        }
        let op = with_retries(op);
        let (cancel_tx, _) = tokio::sync::watch::channel(false);
        let s = ObjectStorage {
            op,
            rt,
            desc,
            target_prefix,
            cancel_tx,
        };
        if probe.is_err() {
            s.run("check", "", async {
                s.op.list_with("").limit(1).await.map(|_| ())
            })?;
        }
        Ok(s)
    }

    /// A store held in this process's memory (OpenDAL's Memory service), empty, gone when
    /// dropped: for tests and for programs that embed pgjet and want a repository without a
    /// disk or a server. `label` names it in messages (`memory LABEL`).
    ///
    /// Errors: the runtime cannot start ([`Error::Other`]).
    pub fn in_memory(label: &str) -> Result<ObjectStorage> {
        let op = Operator::new(opendal::services::Memory::default().root("/"))
            .map_err(|e| config_err("memory store", e))?;
        let (cancel_tx, _) = tokio::sync::watch::channel(false);
        Ok(ObjectStorage {
            op,
            rt: crate::io::runtime::get()?,
            desc: format!("memory {label}"),
            target_prefix: format!("memory://{label}/"),
            cancel_tx,
        })
    }

    fn target(&self, name: &str) -> String {
        format!("{}{name}", self.target_prefix)
    }

    fn err(&self, op: &'static str, name: &str, e: opendal::Error) -> Error {
        storage_error(op, self.target(name), e)
    }

    /// Uploads `buf` as object `name`: one PUT, or a multipart upload of [`WRITER_PART`]
    /// parts, [`WRITER_CONCURRENCY`] at once, for a larger one.
    fn upload(&self, name: &str, buf: bytes::Bytes) -> Result<()> {
        self.run("write", name, async {
            self.op
                .write_with(name, buf)
                .chunk(WRITER_PART)
                .concurrent(WRITER_CONCURRENCY)
                .await
                .map(|_| ())
        })
    }

    /// Reads all of `name` into `buf`, as one request.
    fn get_whole_into(&self, name: &str, buf: &mut AlignedBuf) -> Result<()> {
        // The body is copied into the buffer as it arrives, so only the buffer holds the
        // object (a whole-body read would hold it twice: with 8 readers, 64 MiB more).
        buf.clear();
        self.run("read", name, async {
            let mut body = self.op.reader(name).await?.into_bytes_stream(..).await?;
            while let Some(chunk) = body.next().await {
                buf.extend_from_slice(&chunk.map_err(from_io)?);
            }
            Ok(())
        })
    }

    /// [`Storage::get_into`] of an object the manifest says is `size` bytes, as up to
    /// `parts` ranged GETs at once, each of at least [`READ_PART_MIN`] bytes (fewer than 2:
    /// one GET of the whole object). A range that fails makes the object be read whole once;
    /// the last range is open-ended, so an object longer than `size` reads one byte long.
    ///
    /// Errors: the store's ([`Error::Storage`], NotFound for a missing object).
    pub fn get_split_into(
        &self,
        name: &str,
        size: u64,
        parts: usize,
        buf: &mut AlignedBuf,
    ) -> Result<()> {
        let parts = parts.min((size / READ_PART_MIN) as usize);
        let Ok(len) = usize::try_from(size) else {
            return self.get_whole_into(name, buf);
        };
        if parts < 2 {
            return self.get_whole_into(name, buf);
        }
        // The buffer is cut into `parts` slices, each filled by its own ranged GET. The
        // last range is open-ended, so an object longer than `size` is noticed. A shorter
        // one fails a range (the store refuses it, or sends less than asked): the object
        // is then read whole, once, and the caller's length check names it.
        buf.clear();
        buf.resize(len, 0);
        let per = len.div_ceil(parts);
        let last = len.div_ceil(per) - 1;
        let split = self.run("read", name, async {
            let reader = self.op.reader(name).await?;
            let reads = buf.chunks_mut(per).enumerate().map(|(i, slice)| {
                let reader = reader.clone();
                async move {
                    let start = (i * per) as u64;
                    let opened = if i == last {
                        reader.into_bytes_stream(start..).await
                    } else {
                        reader
                            .into_bytes_stream(start..start + slice.len() as u64)
                            .await
                    };
                    let mut body = opened?;
                    let (mut at, mut longer) = (0usize, false);
                    while let Some(chunk) = body.next().await {
                        let chunk = chunk.map_err(from_io)?;
                        let room = slice.len() - at;
                        if chunk.len() > room {
                            if i != last {
                                return Err(opendal::Error::new(
                                    ErrorKind::Unexpected,
                                    "a ranged read returned more bytes than asked",
                                ));
                            }
                            longer = true;
                        }
                        let n = chunk.len().min(room);
                        slice[at..at + n].copy_from_slice(&chunk[..n]);
                        at += n;
                    }
                    Ok::<(usize, bool), opendal::Error>((at, longer))
                }
            });
            futures::future::try_join_all(reads).await
        });
        let got = match split {
            Ok(got) => got,
            Err(e) if e.is_not_found() => return Err(e),
            Err(e) => {
                tracing::debug!("split read of {name} failed ({e}); reading it whole");
                return self.get_whole_into(name, buf);
            }
        };
        // Keep the bytes up to the first short range; one byte more marks a longer object.
        let mut total = 0usize;
        for (i, (n, longer)) in got.iter().enumerate() {
            total += n;
            if *longer {
                buf.truncate(total);
                buf.push(0);
                return Ok(());
            }
            if *n < per.min(len - i * per) {
                break;
            }
        }
        buf.truncate(total);
        Ok(())
    }

    /// Runs `fut` to its end on the store's runtime, unless cancelled first.
    fn run<T>(
        &self,
        op: &'static str,
        name: &str,
        fut: impl Future<Output = opendal::Result<T>>,
    ) -> Result<T> {
        let mut cancel = self.cancel_tx.subscribe();
        self.rt.block_on(async {
            tokio::select! {
                r = fut => r.map_err(|e| self.err(op, name, e)),
                _ = cancel.wait_for(|c| *c) => Err(Error::Storage {
                    op,
                    target: self.target(name),
                    fault: StorageFault::Transient,
                    detail: "cancelled".into(),
                    source: None,
                }),
            }
        })
    }
}

/// [`READ_PARTS`], or `PGJET_READ_PARTS` (1 to 16).
fn read_parts() -> usize {
    crate::io::tuning::get().read_parts.unwrap_or(READ_PARTS)
}

/// [`ObjectWriter`] of an object store: a multipart upload, completed by `finish`, aborted
/// when dropped unfinished.
struct ObjWriter {
    w: Option<opendal::Writer>,
    rt: &'static tokio::runtime::Runtime,
    target: String,
}

impl ObjectWriter for ObjWriter {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        let w = self
            .w
            .as_mut()
            .ok_or_else(|| Error::Other(format!("{} was already finished", self.target)))?;
        let buf = bytes::Bytes::copy_from_slice(data);
        self.rt
            .block_on(w.write(buf))
            .map_err(|e| storage_error("write", self.target.clone(), e))
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        let mut w = self
            .w
            .take()
            .ok_or_else(|| Error::Other(format!("{} was already finished", self.target)))?;
        self.rt
            .block_on(w.close())
            .map(|_| ())
            .map_err(|e| storage_error("write", self.target.clone(), e))
    }
}

impl Drop for ObjWriter {
    fn drop(&mut self) {
        if let Some(mut w) = self.w.take() {
            if let Err(e) = self.rt.block_on(w.abort()) {
                tracing::warn!("could not abort the upload of {}: {e}", self.target);
            }
        }
    }
}

/// The names of a listing, a page of the store's at a time ([`Storage::list`]).
struct ObjNames<'a> {
    store: &'a ObjectStorage,
    /// None once the listing ended (or the directory does not exist).
    lister: Option<opendal::Lister>,
    /// The listed directory, with its trailing '/'.
    dir: String,
}

impl Iterator for ObjNames<'_> {
    type Item = Result<String>;

    fn next(&mut self) -> Option<Result<String>> {
        loop {
            let lister = self.lister.as_mut()?;
            let got = self
                .store
                .run("list", &self.dir, async { lister.next().await.transpose() });
            let entry = match got {
                Ok(Some(entry)) => entry,
                Ok(None) => None?,
                Err(e) if e.is_not_found() => None?,
                Err(e) => {
                    self.lister = None;
                    return Some(Err(e));
                }
            };
            // The directory itself, and anything deeper, are not names below it.
            let name = entry.path().trim_end_matches('/');
            match name.strip_prefix(self.dir.as_str()) {
                Some(n) if !n.is_empty() && !n.contains('/') => return Some(Ok(n.to_string())),
                _ => continue,
            }
        }
    }
}

/// A blocking [`Read`] over an object's byte stream.
struct ObjReader {
    stream: futures::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>,
    cur: bytes::Bytes,
    rt: &'static tokio::runtime::Runtime,
}

impl Read for ObjReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rt.block_on(self.stream.next()) {
                Some(Ok(b)) => self.cur = b,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len());
        out[..n].copy_from_slice(&self.cur[..n]);
        self.cur = self.cur.slice(n..);
        Ok(n)
    }
}

impl Storage for ObjectStorage {
    fn describe(&self) -> String {
        self.desc.clone()
    }

    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.upload(name, bytes::Bytes::copy_from_slice(data))
    }

    fn read_ahead(&self) -> usize {
        OBJECT_READ_AHEAD
    }

    fn remote(&self) -> bool {
        true
    }

    fn put_owned(&self, name: &str, data: AlignedBuf) -> Result<Option<AlignedBuf>> {
        // The upload holds the buffer (retries included) and frees it when done: no copy.
        self.upload(name, bytes::Bytes::from_owner(OwnedBuf(data)))?;
        Ok(None)
    }

    fn put_durable(&self, name: &str, data: &[u8]) -> Result<()> {
        // An object store's PUT is atomic and durable when it is acknowledged.
        self.put(name, data)
    }

    fn create_new(&self, name: &str, data: &[u8]) -> Result<bool> {
        let buf = bytes::Bytes::copy_from_slice(data);
        let r = self.run("create", name, async {
            self.op
                .write_with(name, buf)
                .if_not_exists(true)
                .await
                .map(|_| ())
        });
        match r {
            Ok(()) => Ok(true),
            Err(Error::Storage {
                fault: StorageFault::Conflict,
                ..
            }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let buf = self.run("read", name, async {
            self.op.read_with(name).range(offset..offset + len).await
        })?;
        if buf.len() as u64 != len {
            return Err(Error::Storage {
                op: "read",
                target: self.target(name),
                fault: StorageFault::Other,
                detail: format!(
                    "asked for {len} bytes at offset {offset}, got {}",
                    buf.len()
                ),
                source: None,
            });
        }
        Ok(buf.to_vec())
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        Ok(self
            .run("read", name, async { self.op.read(name).await })?
            .to_vec())
    }

    fn get_into(&self, name: &str, size: Option<u64>, buf: &mut AlignedBuf) -> Result<()> {
        match size {
            Some(size) => self.get_split_into(name, size, read_parts(), buf),
            None => self.get_whole_into(name, buf),
        }
    }

    fn reader(&self, name: &str) -> Result<Box<dyn Read + Send>> {
        let stream = self.run("read", name, async {
            let r = self
                .op
                .reader_with(name)
                .chunk(WRITER_PART)
                .concurrent(2)
                .await?;
            r.into_bytes_stream(..).await
        })?;
        Ok(Box::new(ObjReader {
            stream: stream.boxed(),
            cur: bytes::Bytes::new(),
            rt: self.rt,
        }))
    }

    fn writer(&self, name: &str) -> Result<Box<dyn ObjectWriter>> {
        let w = self.run("write", name, async {
            self.op
                .writer_with(name)
                .chunk(WRITER_PART)
                .concurrent(WRITER_CONCURRENCY)
                .await
        })?;
        Ok(Box::new(ObjWriter {
            w: Some(w),
            rt: self.rt,
            target: self.target(name),
        }))
    }

    fn exists(&self, name: &str) -> Result<bool> {
        Ok(self.size(name)?.is_some())
    }

    fn size(&self, name: &str) -> Result<Option<u64>> {
        match self.run("stat", name, async { self.op.stat(name).await }) {
            Ok(m) if m.mode().is_file() => Ok(Some(m.content_length())),
            Ok(_) => Ok(None),
            Err(Error::Storage {
                fault: StorageFault::NotFound,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn list(&self, dir: &str) -> Result<Names<'_>> {
        let d = if dir.is_empty() || dir.ends_with('/') {
            dir.to_string()
        } else {
            format!("{dir}/")
        };
        let lister = match self.run("list", &d, async { self.op.lister(&d).await }) {
            Ok(l) => Some(l),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e),
        };
        Ok(Box::new(ObjNames {
            store: self,
            lister,
            dir: d,
        }))
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.run("delete", name, async { self.op.delete(name).await })
    }

    fn remove_all(&self, dir: &str) -> Result<()> {
        let d = format!("{}/", dir.trim_end_matches('/'));
        self.run("remove", &d, async {
            self.op.delete_with(&d).recursive(true).await
        })
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn cancel(&self) {
        let _ = self.cancel_tx.send(true);
    }
}

/// An aligned buffer as the owner of [`bytes::Bytes`].
struct OwnedBuf(AlignedBuf);

impl AsRef<[u8]> for OwnedBuf {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_region_names_the_one_the_store_expects() {
        // versitygw 1.x's message, as OpenDAL passes it on; AWS's wording.
        let vgw = r#"S3Error { code: "AuthorizationHeaderMalformed", message: "The authorization header is malformed; the region \"eu-west-1\" is wrong; expecting \"us-east-1\"" }"#;
        assert_eq!(expected_region(vgw).as_deref(), Some("us-east-1"));
        let aws = "The authorization header is malformed; the region 'us-east-1' is wrong; expecting 'eu-central-1'";
        assert_eq!(expected_region(aws).as_deref(), Some("eu-central-1"));
        assert_eq!(expected_region("NoSuchBucket: expecting nothing"), None);
    }

    #[test]
    fn roots_are_absolute_and_slash_terminated() {
        assert_eq!(root_of("/"), "/");
        assert_eq!(root_of(""), "/");
        assert_eq!(root_of("/repo"), "/repo/");
        assert_eq!(root_of("a/b/"), "/a/b/");
    }
}
