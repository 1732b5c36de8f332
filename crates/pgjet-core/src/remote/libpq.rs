//! The libpq source: a cluster on another host, read through ordinary connections to its
//! server, with nothing installed there (the way pg_rewind's libpq source works, see
//! src/bin/pg_rewind/libpq_source.c).
//!
//! - Listing: `pg_ls_dir` and `pg_stat_file` for a whole level of directories in one query
//!   (arrays + unnest), so a data directory costs one round trip per level of depth; the
//!   tablespaces' locations come from `pg_tablespace_location`.
//! - Reading: `pg_read_binary_file(path, offset, length, missing_ok => true)` in binary
//!   result format. A bundle of small files is one query (arrays + unnest), never a round
//!   trip per file; a large file's chunks are read by several connections at once. One call
//!   is capped at [`MAX_READ`]: the server allocates the requested length up front and a
//!   bytea cannot exceed 1 GB.
//! - Paths are relative to the data directory, so the role needs no `pg_read_server_files`;
//!   tablespace files are read through `pg_tblspc/<oid>/...`.
//!
//! Each engine thread holds one connection of its own: `jobs` connections plus the session
//! that runs pg_backup_start/stop.
use crate::error::{Error, Result};
use crate::pg::conninfo::ConnTarget;
use crate::pg::datadir::{self, DirLister, Entry, EntryKind, Listing, TablespaceLink};
use crate::pg::lsn::Lsn;
use crate::pg::session::{cancel_hook, open_client, ServerInfo, Session, READ_RANGES_SQL};
use crate::transfer::{PieceSpec, Source, SourceFile, SourceReader};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Row, Statement};

/// Most bytes asked of the server in one `pg_read_binary_file` call: 64 MiB, far under the
/// 1 GB limit of a bytea, since the server allocates the whole length before reading.
pub const MAX_READ: u64 = 64 << 20;

/// Bytes per result row when reading: a unit is asked for as rows of at most this size in
/// one query, so the server sends each row while it reads the next (the connection is not
/// idle while the server reads a whole unit) and neither side allocates a unit-sized reply.
pub const READ_ROW: u64 = 1 << 20;

/// The row size in use: [`READ_ROW`], or `PGJET_LIBPQ_ROW_KIB` for the benchmark that
/// chooses it ([`crate::io::tuning`]).
pub fn read_row() -> u64 {
    crate::io::tuning::get().libpq_row.unwrap_or(READ_ROW)
}

/// Lists a level of directories: for each input path, either one row per entry (name,
/// size, is-dir, mtime) or one row with a NULL name (empty directory), or a NULL directory
/// flag (the directory does not exist).
const LIST_SQL: &str = "SELECT d.n::int4, ds.isdir, x.name, x.size, x.isdir, \
    extract(epoch FROM x.modification)::int8 \
    FROM unnest($1::text[]) WITH ORDINALITY AS d(path, n) \
    CROSS JOIN LATERAL pg_stat_file(CASE WHEN d.path = '' THEN '.' ELSE d.path END, true) AS ds \
    LEFT JOIN LATERAL (SELECT f.name, s.size, s.isdir, s.modification \
        FROM pg_ls_dir(CASE WHEN d.path = '' THEN '.' ELSE d.path END, true, false) AS f(name) \
        CROSS JOIN LATERAL pg_stat_file(CASE WHEN d.path = '' THEN f.name ELSE d.path || '/' || f.name END, true) AS s) x \
        ON ds.isdir \
    ORDER BY 1";

/// Size and mtime of files by path; NULL size for a missing file.
const STAT_SQL: &str = "SELECT d.n::int4, s.size, extract(epoch FROM s.modification)::int8 \
    FROM unnest($1::text[]) WITH ORDINALITY AS d(path, n) \
    LEFT JOIN LATERAL pg_stat_file(d.path, true) AS s ON true ORDER BY 1";

/// SHA-256 of ranges of files, computed by the server (sha256(bytea), PostgreSQL 11+), so
/// a delta compares ranges with only 32 bytes per range crossing the wire; NULL for a file
/// that does not exist.
const HASH_SQL: &str = "SELECT sha256(pg_read_binary_file(f.p, f.o, f.l, true)) \
    FROM unnest($1::text[], $2::int8[], $3::int8[]) WITH ORDINALITY AS f(p, o, l, n) ORDER BY f.n";

/// The blocks of relation files whose page LSN is at or after $3 (or zero, or unreadable):
/// the server reads the first 8 bytes of each block (`pd_lsn`: two little-endian 32-bit
/// halves, PostgreSQL src/include/storage/bufpage.h) and only (file, block) pairs cross
/// the wire. $1: paths, $2: blocks to look at per path.
const CHANGED_BLOCKS_SQL: &str = "SELECT f.n::int4, b::int4 \
    FROM unnest($1::text[], $2::int8[]) WITH ORDINALITY AS f(p, nb, n), \
    LATERAL generate_series(0::int8, f.nb - 1) AS b, \
    LATERAL (SELECT pg_read_binary_file(f.p, b * 8192, 8, true) AS h) x \
    WHERE x.h IS NULL OR length(x.h) < 8 OR x.h = '\\x0000000000000000'::bytea \
    OR ((get_byte(x.h, 3)::int8 << 56) | (get_byte(x.h, 2)::int8 << 48) \
      | (get_byte(x.h, 1)::int8 << 40) | (get_byte(x.h, 0)::int8 << 32) \
      | (get_byte(x.h, 7)::int8 << 24) | (get_byte(x.h, 6)::int8 << 16) \
      | (get_byte(x.h, 5)::int8 << 8) | get_byte(x.h, 4)::int8) >= $3 \
    ORDER BY 1, 2";

/// A cluster reached over libpq.
pub struct LibpqSource {
    target: ConnTarget,
    /// The process's runtime ([`crate::io::runtime`]).
    rt: &'static tokio::runtime::Runtime,
    /// Idle connections, handed to readers and given back.
    pool: Mutex<Vec<Client>>,
    /// Connections this source may open (readers beyond it wait for one).
    max_connections: usize,
    opened: Mutex<usize>,
    /// A cancel request for each connection opened, sent when the process is cancelled.
    cancel_hooks: Mutex<Vec<crate::io::cancel::Hook>>,
    /// Permission bits of the data directory (data_directory_mode): 0700 or 0750.
    dir_mode: u32,
    /// Most bytes per result row ([`read_row`]).
    row: u64,
    /// Whether readers send the next unit's read before the current one is processed
    /// (`PGJET_LIBPQ_PREFETCH=0` turns it off, for the benchmark).
    prefetch: bool,
    /// `--max-rate`: the reads of every connection together at most this many bytes per
    /// second.
    pacer: Option<crate::io::pace::Pacer>,
    describe: String,
}

impl LibpqSource {
    /// A source reading the cluster behind `target` (whose session gave `info`) over at
    /// most `connections` connections, opened when first needed.
    ///
    /// Errors: the settings cannot be read on `sess`.
    pub fn new(target: ConnTarget, sess: &Session, connections: usize) -> Result<LibpqSource> {
        let r = sess.query_row("read data_directory_mode", "SHOW data_directory_mode")?;
        let mode = r
            .first()
            .cloned()
            .flatten()
            .and_then(|m| u32::from_str_radix(m.trim_start_matches('0'), 8).ok())
            .unwrap_or(0o700);
        let rt = crate::io::runtime::get()?;
        let describe = target.describe.clone();
        Ok(LibpqSource {
            target,
            rt,
            pool: Mutex::new(Vec::new()),
            max_connections: connections.max(1),
            opened: Mutex::new(0),
            cancel_hooks: Mutex::new(Vec::new()),
            dir_mode: mode & 0o777,
            row: read_row(),
            prefetch: crate::io::tuning::get().libpq_prefetch,
            pacer: None,
            describe,
        })
    }

    /// Limits the reads of all connections together to `max_rate` bytes per second (None:
    /// no limit).
    pub fn with_max_rate(mut self, max_rate: Option<u64>) -> LibpqSource {
        self.pacer = max_rate.map(crate::io::pace::Pacer::new);
        self
    }

    /// A connection from the pool, or a new one while fewer than `max_connections` exist.
    fn checkout(&self) -> Result<Client> {
        loop {
            if let Some(c) = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop() {
                if !c.is_closed() {
                    return Ok(c);
                }
                *self.opened.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
                continue;
            }
            {
                let mut n = self.opened.lock().unwrap_or_else(|p| p.into_inner());
                if *n < self.max_connections {
                    *n += 1;
                    drop(n);
                    return self.connect().inspect_err(|_| {
                        *self.opened.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
                    });
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn connect(&self) -> Result<Client> {
        let (client, _conn) = self
            .rt
            .block_on(open_client(&self.target))
            .map_err(|source| Error::Connect {
                target: self.describe.clone(),
                source,
            })?;
        self.cancel_hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(cancel_hook(&client, &self.target));
        // Reads can be long on a slow link; role or database timeouts must not end them.
        self.rt
            .block_on(client.batch_execute(
                "SET statement_timeout = 0; SET idle_session_timeout = 0; \
                 SET idle_in_transaction_session_timeout = 0; SET tcp_keepalives_idle = 15; \
                 SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 6",
            ))
            .map_err(|source| Error::Query {
                what: "set up a copy connection".into(),
                source,
            })?;
        Ok(client)
    }

    fn checkin(&self, c: Client) {
        if c.is_closed() {
            *self.opened.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        } else {
            self.pool.lock().unwrap_or_else(|p| p.into_inner()).push(c);
        }
    }

    /// Errors unless the server answered one row (of `what`) per range asked.
    fn expect_rows(&self, what: &str, got: usize, asked: usize) -> Result<()> {
        if got == asked {
            return Ok(());
        }
        Err(Error::Other(format!(
            "{} answered {got} {what} for {asked} ranges asked",
            self.describe
        )))
    }

    /// Runs `sql` with `params` (values and their types: sent together, no round trip to
    /// prepare the statement) on a pooled connection.
    fn query(
        &self,
        what: &str,
        sql: &str,
        params: &[(&(dyn tokio_postgres::types::ToSql + Sync), Type)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        let c = self.checkout()?;
        let res = self.rt.block_on(c.query_typed(sql, params));
        self.checkin(c);
        res.map_err(|source| Error::Query {
            what: format!("{what} on {}", self.describe),
            source,
        })
    }
}

fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
    i: usize,
) -> Result<T> {
    row.try_get(i).map_err(|e| {
        Error::Other(format!("unexpected reply from the server (column {i})")).because(e)
    })
}

impl DirLister for LibpqSource {
    fn list_dirs(&self, dirs: &[String]) -> Result<Vec<Option<Vec<Entry>>>> {
        let rows = self.query(
            "list the data directory",
            LIST_SQL,
            &[(&dirs, Type::TEXT_ARRAY)],
        )?;
        let mut out: Vec<Option<Vec<Entry>>> = vec![None; dirs.len()];
        let file_mode = self.dir_mode & 0o666;
        for row in &rows {
            let n: i32 = col(row, 0)?;
            let Some(slot) = out.get_mut((n as usize).wrapping_sub(1)) else {
                continue;
            };
            let dir_is_dir: Option<bool> = col(row, 1)?;
            if dir_is_dir != Some(true) {
                continue; // missing, or not a directory
            }
            let list = slot.get_or_insert_with(Vec::new);
            let name: Option<String> = col(row, 2)?;
            let size: Option<i64> = col(row, 3)?;
            let is_dir: Option<bool> = col(row, 4)?;
            let mtime: Option<i64> = col(row, 5)?;
            let (Some(name), Some(size), Some(is_dir)) = (name, size, is_dir) else {
                continue; // an empty directory, or an entry removed between ls and stat
            };
            list.push(Entry {
                name: name.into(),
                kind: if is_dir {
                    EntryKind::Dir
                } else {
                    EntryKind::File
                },
                size: size.max(0) as u64,
                mtime: mtime.unwrap_or(0),
                mode: if is_dir { self.dir_mode } else { file_mode },
            });
        }
        Ok(out)
    }
}

impl Source for LibpqSource {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn list(&self, info: &ServerInfo, tablespaces: &[(u32, String, String)]) -> Result<Listing> {
        let links = tablespaces
            .iter()
            .map(|(oid, _, loc)| TablespaceLink {
                oid: *oid,
                target: PathBuf::from(loc),
            })
            .collect();
        datadir::walk(
            self,
            links,
            info.version_num,
            &info.tablespace_dir(),
            info.data_checksums,
        )
    }

    fn threads(&self, jobs: usize) -> usize {
        jobs.min(self.max_connections)
    }

    fn queues_reads(&self) -> bool {
        self.prefetch
    }

    fn reader(&self) -> Result<Box<dyn SourceReader + '_>> {
        let client = self.checkout()?;
        let read_stmt = match self.rt.block_on(client.prepare(READ_RANGES_SQL)) {
            Ok(s) => s,
            Err(source) => {
                self.checkin(client);
                return Err(Error::Query {
                    what: format!("prepare the read query on {}", self.describe),
                    source,
                });
            }
        };
        Ok(Box::new(LibpqReader {
            src: self,
            client: Some(Arc::new(client)),
            read_stmt,
            pending: Default::default(),
        }))
    }

    /// Over the connection, with the function the ranges use (`pg_read_binary_file` with an
    /// offset and a length, at most what a bytea holds, 1 GiB - 5 bytes (MaxAllocSize less
    /// the varlena header, src/backend/utils/adt/genfile.c): any part of a segment but the
    /// whole of a 1 GiB one, which the WAL reader then finds short and gives up on;
    /// missing: NULL).
    fn wal_segment(&self, name: &str, part: std::ops::Range<u64>) -> Result<Option<Vec<u8>>> {
        let path = format!("pg_wal/{name}");
        let offset = part.start as i64;
        let len = part.end.saturating_sub(part.start).min(1073741819) as i64;
        let rows = self.query(
            "read a WAL segment",
            "SELECT pg_read_binary_file($1, $2, $3, true)",
            &[
                (&path, Type::TEXT),
                (&offset, Type::INT8),
                (&len, Type::INT8),
            ],
        )?;
        match rows.first() {
            Some(row) => col::<Option<Vec<u8>>>(row, 0),
            None => Ok(None),
        }
    }

    fn changed_blocks(&self, files: &[(String, u64)], lsn: Lsn) -> Result<Option<Vec<Vec<u32>>>> {
        let mut out = vec![Vec::new(); files.len()];
        // At most about a million blocks (8 GiB of relation files) per query.
        let mut start = 0;
        while start < files.len() {
            let (mut end, mut blocks) = (start, 0u64);
            while end < files.len() && (end == start || blocks + files[end].1 <= 1 << 20) {
                blocks += files[end].1;
                end += 1;
            }
            let paths: Vec<&str> = files[start..end].iter().map(|f| f.0.as_str()).collect();
            let counts: Vec<i64> = files[start..end].iter().map(|f| f.1 as i64).collect();
            let at = lsn.0 as i64;
            let rows = self.query(
                "find the changed blocks",
                CHANGED_BLOCKS_SQL,
                &[
                    (&paths, Type::TEXT_ARRAY),
                    (&counts, Type::INT8_ARRAY),
                    (&at, Type::INT8),
                ],
            )?;
            for row in &rows {
                let n: i32 = col(row, 0)?;
                let b: i32 = col(row, 1)?;
                if let Some(v) = out.get_mut(start + (n as usize).wrapping_sub(1)) {
                    v.push(b as u32);
                }
            }
            start = end;
        }
        Ok(Some(out))
    }

    fn stat(&self, paths: &[String]) -> Result<Vec<Option<(u64, i64)>>> {
        let rows = self.query("stat files", STAT_SQL, &[(&paths, Type::TEXT_ARRAY)])?;
        let mut out = vec![None; paths.len()];
        for row in &rows {
            let n: i32 = col(row, 0)?;
            let size: Option<i64> = col(row, 1)?;
            let mtime: Option<i64> = col(row, 2)?;
            if let (Some(slot), Some(size)) = (out.get_mut((n as usize).wrapping_sub(1)), size) {
                *slot = Some((size.max(0) as u64, mtime.unwrap_or(0)));
            }
        }
        Ok(out)
    }
}

/// Reads sent ahead on one connection, at most: the unit being received and the next one,
/// so the server always has a query to answer while this side checks and writes.
const READS_AHEAD: usize = 2;

/// One engine thread's connection, with up to [`READS_AHEAD`] reads sent ahead
/// ([`SourceReader::prefetch`]), answered in the order they were sent.
struct LibpqReader<'a> {
    src: &'a LibpqSource,
    client: Option<Arc<Client>>,
    /// [`READ_RANGES_SQL`], prepared once: a query sent as text is prepared first, a round trip
    /// that a queued read would otherwise wait for before its bytes could start.
    read_stmt: Statement,
    pending: std::collections::VecDeque<Pending>,
}

/// A read sent ahead: its requests and the task receiving its rows.
struct Pending {
    key: Vec<(usize, u64, u64)>,
    req: ReadRequests,
    rows: tokio::task::JoinHandle<std::result::Result<Vec<Row>, tokio_postgres::Error>>,
}

/// The rows asked of the server for a list of pieces: each piece cut into rows of at most
/// the source's row size.
struct ReadRequests {
    paths: Vec<String>,
    offsets: Vec<i64>,
    lens: Vec<i64>,
    /// The piece each row belongs to.
    owner: Vec<usize>,
}

impl ReadRequests {
    fn new(files: &[SourceFile], pieces: &[PieceSpec], row: u64) -> ReadRequests {
        let mut r = ReadRequests {
            paths: Vec::new(),
            offsets: Vec::new(),
            lens: Vec::new(),
            owner: Vec::new(),
        };
        for (i, p) in pieces.iter().enumerate() {
            let mut off = 0u64;
            while off < p.bytes() || (p.len == 0 && off == 0) {
                let len = (p.bytes() - off).min(row);
                r.paths.push(files[p.index()].path.to_string());
                r.offsets.push((p.offset + off) as i64);
                r.lens.push(len as i64);
                r.owner.push(i);
                if len == 0 {
                    break;
                }
                off += len;
            }
        }
        r
    }
}

fn piece_key(pieces: &[PieceSpec]) -> Vec<(usize, u64, u64)> {
    pieces
        .iter()
        .map(|p| (p.index(), p.offset, p.bytes()))
        .collect()
}

impl Drop for LibpqReader<'_> {
    fn drop(&mut self) {
        for p in self.pending.drain(..) {
            // Dropping a query discards the rest of its reply; wait until the task lets go
            // of the connection so it can go back to the pool.
            p.rows.abort();
            let _ = self.src.rt.block_on(p.rows);
        }
        if let Some(c) = self.client.take().and_then(|c| Arc::try_unwrap(c).ok()) {
            self.src.checkin(c);
        }
    }
}

impl LibpqReader<'_> {
    fn client(&self) -> Result<&Arc<Client>> {
        match &self.client {
            Some(c) if !c.is_closed() => Ok(c),
            _ => Err(Error::Other(format!(
                "the connection to {} was lost during the copy",
                self.src.describe
            ))),
        }
    }

    /// Sends the read of `req` and returns the task that collects its rows.
    fn send(
        &self,
        req: &ReadRequests,
    ) -> Result<tokio::task::JoinHandle<std::result::Result<Vec<Row>, tokio_postgres::Error>>> {
        let client = self.client()?.clone();
        if let Some(p) = &self.src.pacer {
            p.take(req.lens.iter().map(|l| *l as u64).sum());
        }
        let stmt = self.read_stmt.clone();
        let (paths, offsets, lens) = (req.paths.clone(), req.offsets.clone(), req.lens.clone());
        Ok(self
            .src
            .rt
            .spawn(async move { client.query(&stmt, &[&paths, &offsets, &lens]).await }))
    }
}

impl SourceReader for LibpqReader<'_> {
    fn hash_ranges(
        &mut self,
        files: &[SourceFile],
        pieces: &[PieceSpec],
    ) -> Result<Vec<Option<[u8; 32]>>> {
        if pieces.is_empty() {
            return Ok(Vec::new());
        }
        let client = self.client()?;
        let paths: Vec<&str> = pieces.iter().map(|p| &*files[p.index()].path).collect();
        let offsets: Vec<i64> = pieces.iter().map(|p| p.offset as i64).collect();
        let lens: Vec<i64> = pieces
            .iter()
            .map(|p| p.bytes().min(MAX_READ) as i64)
            .collect();
        let rows = self
            .src
            .rt
            .block_on(client.query_typed(
                HASH_SQL,
                &[
                    (&paths, Type::TEXT_ARRAY),
                    (&offsets, Type::INT8_ARRAY),
                    (&lens, Type::INT8_ARRAY),
                ],
            ))
            .map_err(|source| Error::Query {
                what: format!("hash ranges of {} on {}", paths[0], self.src.describe),
                source,
            })?;
        self.src.expect_rows("hashes", rows.len(), pieces.len())?;
        rows.iter()
            .map(|r| {
                let h: Option<&[u8]> = col(r, 0)?;
                Ok(h.and_then(|h| h.try_into().ok()))
            })
            .collect()
    }

    fn prefetch(&mut self, files: &[SourceFile], pieces: &[PieceSpec]) {
        if self.pending.len() >= READS_AHEAD || !self.src.prefetch {
            return;
        }
        let req = ReadRequests::new(files, pieces, self.src.row);
        // A failure to send shows again when the read is asked for.
        if let Ok(rows) = self.send(&req) {
            self.pending.push_back(Pending {
                key: piece_key(pieces),
                req,
                rows,
            });
        }
    }

    fn read(
        &mut self,
        files: &[SourceFile],
        pieces: &[PieceSpec],
        buf: &mut [u8],
    ) -> Result<Vec<bool>> {
        let key = piece_key(pieces);
        let (req, task) = match self.pending.front() {
            Some(p) if p.key == key => {
                let p = self.pending.pop_front().expect("front exists");
                (p.req, p.rows)
            }
            _ => {
                // Not the read sent ahead (a page read again): send it now, behind those.
                let req = ReadRequests::new(files, pieces, self.src.row);
                let task = self.send(&req)?;
                (req, task)
            }
        };
        let what = || {
            format!(
                "read {} of {} on {}",
                if pieces.len() == 1 {
                    "a range"
                } else {
                    "a bundle of files"
                },
                files[pieces[0].index()].path,
                self.src.describe
            )
        };
        let rows = self
            .src
            .rt
            .block_on(task)
            .map_err(|e| Error::Other(format!("{}: the reading task failed", what())).because(e))?
            .map_err(|source| Error::Query {
                what: what(),
                source,
            })?;
        let ReadRequests {
            offsets,
            lens,
            owner,
            ..
        } = req;
        self.src.expect_rows("ranges", rows.len(), offsets.len())?;
        let mut found = vec![true; pieces.len()];
        let mut starts = Vec::with_capacity(pieces.len());
        let mut pos = 0usize;
        for p in pieces {
            starts.push(pos);
            pos += p.len as usize;
        }
        for (k, row) in rows.iter().enumerate() {
            let i = owner[k];
            let data: Option<&[u8]> = col(row, 0)?;
            let Some(data) = data else {
                found[i] = false;
                continue;
            };
            let at = starts[i] + (offsets[k] as u64 - pieces[i].offset) as usize;
            let want = lens[k] as usize;
            let n = data.len().min(want);
            buf[at..at + n].copy_from_slice(&data[..n]);
            // A file that shrank: the rest of the range reads as zeros.
            buf[at + n..at + want].fill(0);
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64) -> SourceFile {
        SourceFile::plain(path, size)
    }

    #[test]
    fn pieces_are_cut_into_rows_in_order() {
        let files = [
            file("base/1/1", 5000),
            file("base/1/2", 0),
            file("PG_VERSION", 3),
        ];
        let pieces = [
            PieceSpec {
                file: 0,
                offset: 1000,
                len: 2500,
            },
            PieceSpec {
                file: 1,
                offset: 0,
                len: 0,
            },
            PieceSpec {
                file: 2,
                offset: 0,
                len: 3,
            },
        ];
        let r = ReadRequests::new(&files, &pieces, 1024);
        assert_eq!(
            r.paths,
            ["base/1/1", "base/1/1", "base/1/1", "base/1/2", "PG_VERSION"]
        );
        assert_eq!(r.offsets, [1000, 2024, 3048, 0, 0]);
        assert_eq!(r.lens, [1024, 1024, 452, 0, 3]);
        assert_eq!(r.owner, [0, 0, 0, 1, 2]);
    }
}
