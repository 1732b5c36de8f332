//! Direct I/O (`O_DIRECT`) for the big sequential reads and writes of backups and restores.
//!
//! Measured on this project's machine (docs/benchmarks.md): reading a cold 1 GiB relation
//! segment through the page cache runs at 613 MB/s and costs 1.65 s of kernel CPU; with
//! O_DIRECT it runs at 1.8 GB/s for 0.05 s of CPU. Writing 2 GiB through the page cache and
//! fsync runs at 408 MB/s (4.7 s of kernel CPU), and with O_DIRECT at 2.1 GB/s. A backup also
//! should not push the database's working set out of the page cache.
//!
//! Direct I/O needs the buffer address, the file offset and the length aligned to
//! [`ALIGN`]. The helpers here do the aligned head of each request directly and the unaligned
//! rest (a file's tail, small files) through the page cache. Filesystems without O_DIRECT
//! (tmpfs on older kernels) get plain buffered I/O.
//! Direct writes are not durable by themselves; syncfs at the end of the unit of work is
//! still the barrier.
use aligned_vec::{AVec, RuntimeAlign};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Alignment of buffers, offsets and lengths for direct I/O: 4096 bytes (a page; covers
/// the 512- and 4096-byte logical blocks of common devices).
pub const ALIGN: usize = 4096;

/// Size of a transparent huge page on x86-64 and the usual arm64 kernels: 2 MiB. Buffers of
/// at least this many bytes start on such a boundary and are advised to the kernel as
/// huge-page memory (see [`aligned_buf`]).
pub const HUGE_PAGE: usize = 2 << 20;

/// A byte buffer whose start is aligned to [`ALIGN`] (to [`HUGE_PAGE`] when it was made
/// with room for that much).
pub type AlignedBuf = AVec<u8, RuntimeAlign>;

/// An empty aligned buffer with room for `cap` bytes.
///
/// A buffer of [`HUGE_PAGE`] bytes or more starts on a huge-page boundary and is given
/// `madvise(MADV_HUGEPAGE)`, so that where transparent huge pages are `always` or `madvise`
/// (Debian's default) it is made of 2 MiB physically contiguous pieces. A direct request on
/// 4 KiB pages needs one scatter-gather segment per page, and a disk takes few of them per
/// request (254 on this project's VM, so about 1 MiB per request whatever the buffer); on
/// huge pages the request grows to the device's own limit (4 MiB here). Measured on this
/// project's VM (docs/benchmark-notes.md): fio at depth 4 with 1 MiB blocks reached
/// 1946 MiB/s on ordinary pages and 2494 MiB/s on huge pages; replica-create of a 2 GiB
/// cluster on one host fell from 5.06 s to 3.33 s (medians of 3 alternating runs). Where
/// the kernel has no huge pages (`never`, or none built in) the advice is ignored and the
/// buffer is ordinary memory. Under Debian's default `defrag` setting (`madvise`) the first
/// touch of an advised buffer may compact memory to find a huge page; the jobs allocate
/// their large buffers once and reuse them, so that cost is paid once per buffer.
pub fn aligned_buf(cap: usize) -> AlignedBuf {
    if cap < HUGE_PAGE {
        return AVec::with_capacity(ALIGN, cap);
    }
    let b: AlignedBuf = AVec::with_capacity(HUGE_PAGE, cap);
    // SAFETY: advice on the pages of this buffer's own allocation (it starts on a huge-page
    // boundary and the length stays within its capacity); no memory is read or written.
    // Advisory: an error (EINVAL from a kernel without transparent huge pages) is ignored.
    unsafe {
        libc::madvise(
            b.as_ptr() as *mut libc::c_void,
            b.capacity() / ALIGN * ALIGN,
            libc::MADV_HUGEPAGE,
        );
    }
    b
}

/// Sets `buf`'s length to `len` bytes for a caller that overwrites them all: a buffer
/// that shrinks keeps its bytes, and only the part past its old length is zeroed. A
/// restore reuses 8 MiB buffers for every frame; zeroing each before a read or a
/// decompression wrote over it took 7-10% of a restore's CPU (perf, PostgreSQL 18,
/// bench/incr.sh's chain). A buffer that grows to [`HUGE_PAGE`] or more is moved to a new
/// advised allocation ([`aligned_buf`]) with its bytes (a reallocation would not carry the
/// advice).
pub fn fit(buf: &mut AlignedBuf, len: usize) {
    if buf.len() > len {
        buf.truncate(len);
        return;
    }
    if len > buf.capacity() && len >= HUGE_PAGE {
        let mut bigger = aligned_buf(len);
        bigger.extend_from_slice(buf);
        *buf = bigger;
    }
    buf.resize(len, 0);
}

fn aligned(n: u64) -> bool {
    n.is_multiple_of(ALIGN as u64)
}

/// Splits a request on `buf` at `offset` into (direct head length, rest), the head being
/// the largest aligned prefix when address and offset are aligned.
fn split(ptr: *const u8, offset: u64, len: usize) -> usize {
    if aligned(ptr as u64) && aligned(offset) {
        len - len % ALIGN
    } else {
        0
    }
}

fn open_direct(path: &Path, write: bool) -> Option<File> {
    let mut o = OpenOptions::new();
    o.read(!write).write(write).custom_flags(libc::O_DIRECT);
    o.open(path).ok()
}

/// A file opened for reading, with a direct handle when the filesystem allows it.
pub struct Reader {
    buffered: File,
    direct: Option<File>,
}

impl Reader {
    /// Opens `path`. Errors as `File::open` (NotFound for a file that vanished).
    pub fn open(path: &Path) -> io::Result<Reader> {
        let buffered = File::open(path)?;
        Ok(Reader {
            buffered,
            direct: open_direct(path, false),
        })
    }

    /// Opens `path` for reads through the page cache only: for scattered small reads that
    /// [`Reader::will_need`] announced first. Errors as `File::open`.
    pub fn open_cached(path: &Path) -> io::Result<Reader> {
        Ok(Reader {
            buffered: File::open(path)?,
            direct: None,
        })
    }

    /// Tells the kernel that `len` bytes at `offset` will be read soon
    /// (`posix_fadvise(POSIX_FADV_WILLNEED)`): it starts reading them into the page cache
    /// and returns, so many announced ranges are in flight at once. Advisory: an error is
    /// ignored, and the read that follows is correct either way.
    pub fn will_need(&self, offset: u64, len: u64) {
        use std::os::unix::io::AsRawFd;
        // SAFETY: plain syscall on an open descriptor; nothing is read or written here.
        unsafe {
            libc::posix_fadvise(
                self.buffered.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            );
        }
    }

    /// Fills `buf` from `offset`; bytes past the end of the file are zero.
    pub fn read_padded(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0usize;
        if let Some(d) = &self.direct {
            let head = split(buf.as_ptr(), offset, buf.len());
            while done < head {
                match d.read_at(&mut buf[done..head], offset + done as u64) {
                    Ok(0) => {
                        buf[done..].fill(0);
                        return Ok(());
                    }
                    Ok(n) if n % ALIGN == 0 => done += n,
                    // A short, unaligned read: the end of the file. Finish through the cache.
                    Ok(n) => {
                        done += n;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
                    Err(e) => return Err(e),
                }
            }
        }
        while done < buf.len() {
            match self
                .buffered
                .read_at(&mut buf[done..], offset + done as u64)
            {
                Ok(0) => {
                    buf[done..].fill(0);
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Writes of fewer bytes than this to one file go through the page cache (and the caller's
/// final sync), not direct I/O: a direct write returns only when the disk has the bytes, so
/// a bundle of many small files written directly costs one disk round trip per file, in
/// series, where the page cache takes them at memory speed and one syncfs writes them
/// back together. 1 MiB: above it a direct write costs about what its bytes take anyway.
pub const DIRECT_MIN_WRITE: usize = 1 << 20;

/// A file opened for writing, with a direct handle when the filesystem allows it.
pub struct Writer {
    buffered: File,
    direct: Option<File>,
}

impl Writer {
    /// Opens an existing file for writing.
    pub fn open(path: &Path) -> io::Result<Writer> {
        let buffered = OpenOptions::new().write(true).open(path)?;
        Ok(Writer {
            buffered,
            direct: open_direct(path, true),
        })
    }

    /// Wraps `file`, already open for writing at `path` (say, just created), adding a direct
    /// handle when `direct` and the filesystem allows it: no second open of the page-cache
    /// handle.
    pub fn wrap(file: File, path: &Path, direct: bool) -> Writer {
        Writer {
            buffered: file,
            direct: if direct {
                open_direct(path, true)
            } else {
                None
            },
        }
    }

    /// Whether writes go direct (the aligned part of each).
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Opens an existing file for writing through the page cache only: for writes smaller
    /// than [`DIRECT_MIN_WRITE`], where a direct write would wait for the disk each time.
    pub fn open_buffered(path: &Path) -> io::Result<Writer> {
        Ok(Writer {
            buffered: OpenOptions::new().write(true).open(path)?,
            direct: None,
        })
    }

    /// Creates (or truncates) `path` for writing; a new file gets the permission bits `mode`
    /// less the umask (an existing one keeps its own).
    pub fn create(path: &Path, mode: u32) -> io::Result<Writer> {
        let buffered = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(path)?;
        Ok(Writer {
            buffered,
            direct: open_direct(path, true),
        })
    }

    /// The handle through the page cache (for what is not a write: the modification time,
    /// a sync).
    pub fn file(&self) -> &File {
        &self.buffered
    }

    /// Allocates `len` bytes at `offset` (`fallocate(2)`, the file size unchanged), so a later
    /// direct write there overwrites allocated blocks instead of filling a hole. On ext4 that
    /// matters for parallel writers: a direct write that fills a hole holds the file's lock
    /// exclusively until the I/O completes, so writes to one file go one at a time, while
    /// aligned overwrites of allocated (even unwritten) blocks share it. Ok(false) when the
    /// filesystem cannot allocate ahead (EOPNOTSUPP): the write then just fills the hole.
    pub fn allocate(&self, offset: u64, len: u64) -> io::Result<bool> {
        allocate(&self.buffered, offset, len)
    }

    /// Writes all of `data` at `offset`: the aligned head directly, the rest buffered.
    pub fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut done = 0usize;
        if let Some(d) = &self.direct {
            let head = split(data.as_ptr(), offset, data.len());
            if head > 0 {
                match d.write_all_at(&data[..head], offset) {
                    Ok(()) => done = head,
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if done < data.len() {
            self.buffered
                .write_all_at(&data[done..], offset + done as u64)?;
        }
        Ok(())
    }
}

/// Reads all of `path` (`size` bytes, known from the caller) into an aligned buffer.
pub fn read_all(path: &Path, size: u64) -> io::Result<AlignedBuf> {
    let mut buf = aligned_buf(size as usize);
    read_all_into(path, size, &mut buf)?;
    Ok(buf)
}

/// [`read_all`] into `buf` (resized to `size`), so a caller can reuse one buffer for many
/// files: fresh memory costs a page fault per 4 KiB on first touch.
pub fn read_all_into(path: &Path, size: u64, buf: &mut AlignedBuf) -> io::Result<()> {
    let r = Reader::open(path)?;
    fit(buf, size as usize);
    r.read_padded(buf, 0)?;
    let actual = r.buffered.metadata()?.len();
    if actual != size {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{} has {actual} bytes, expected {size}", path.display()),
        ));
    }
    Ok(())
}

/// [`Writer::allocate`] on an open file: `len` bytes at `offset` allocated, the size
/// unchanged; Ok(false) when the filesystem cannot (EOPNOTSUPP).
pub fn allocate(file: &File, offset: u64, len: u64) -> io::Result<bool> {
    use std::os::unix::io::AsRawFd;
    if len == 0 {
        return Ok(true);
    }
    loop {
        // SAFETY: plain syscall on an open descriptor.
        let rc = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EOPNOTSUPP) => return Ok(false),
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The VmFlags of the mapping holding `addr` in /proc/self/smaps.
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
            if inside {
                if let Some(f) = line.strip_prefix("VmFlags:") {
                    return f.to_string();
                }
            }
        }
        String::new()
    }

    #[test]
    fn large_buffers_are_advised_as_huge_pages() {
        let b = aligned_buf(8 << 20);
        assert!((b.as_ptr() as usize).is_multiple_of(HUGE_PAGE));
        let small = aligned_buf(64 << 10);
        assert!((small.as_ptr() as usize).is_multiple_of(ALIGN));
        // A buffer grown past a huge page by `fit` moves to a huge-page allocation, with its
        // bytes.
        let mut grown = aligned_buf(0);
        grown.extend_from_slice(b"head");
        fit(&mut grown, 3 << 20);
        assert!((grown.as_ptr() as usize).is_multiple_of(HUGE_PAGE));
        assert_eq!(&grown[..4], b"head");
        assert!(grown[4..].iter().all(|x| *x == 0));
        // Where the kernel has transparent huge pages, the advice is on the mapping ("hg").
        if std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            for buf in [&b, &grown] {
                let flags = vm_flags(buf.as_ptr() as usize);
                assert!(
                    flags.split_whitespace().any(|f| f == "hg"),
                    "VmFlags:{flags}"
                );
            }
        }
    }

    #[test]
    fn round_trip_aligned_and_unaligned() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let p = dir.path().join("f");
        let mut data = aligned_buf(3 * ALIGN + 100);
        data.extend_from_slice(
            &(0..3 * ALIGN + 100)
                .map(|i| (i % 251) as u8)
                .collect::<Vec<_>>(),
        );
        let w = Writer::create(&p, 0o600).unwrap();
        w.write_at(&data, 0).unwrap();
        w.write_at(&data[1..50], 3 * ALIGN as u64 + 200).unwrap();
        drop(w);
        let back = std::fs::read(&p).unwrap();
        assert_eq!(&back[..data.len()], &data[..]);
        assert_eq!(&back[3 * ALIGN + 200..3 * ALIGN + 249], &data[1..50]);
        let r = Reader::open(&p).unwrap();
        let mut buf = aligned_buf(4 * ALIGN);
        buf.resize(4 * ALIGN, 7);
        r.read_padded(&mut buf, 0).unwrap();
        assert_eq!(&buf[..back.len()], &back[..]);
        assert!(buf[back.len()..].iter().all(|b| *b == 0));
        let all = read_all(&p, back.len() as u64).unwrap();
        assert_eq!(&all[..], &back[..]);
        assert!(read_all(&p, 5).is_err());
    }
}
