//! A store that misbehaves on purpose, for tests: [`FaultyStorage`] wraps any [`Storage`]
//! (the in-memory one, [`super::object::ObjectStorage::in_memory`], or a posix directory) and
//! makes chosen calls fail, return damaged bytes, or wait.
//!
//! A rule names an operation ([`Op`]), a part of the object name, which of the matching calls
//! it hits (the Nth, counted from 1) and for how many calls from there, and the fault. Calls
//! no rule hits go to the wrapped store unchanged, so a test sees exactly the fault it chose:
//! "the second upload of a data object is refused as throttled", "the manifest reads back
//! with one byte flipped", "every lock read waits 2 s".

use super::{Names, ObjectWriter, Storage};
use crate::error::{Error, Result, StorageFault};
use crate::io::direct::AlignedBuf;
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The store operations a rule can aim at. [`Op::Put`] covers every whole-object write
/// (`put`, `put_owned`, `put_durable`), [`Op::Get`] every whole or ranged read (`get`,
/// `get_range`, `get_into`, `reader`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Put,
    Create,
    Get,
    Writer,
    Exists,
    Size,
    List,
    Delete,
    Sync,
}

impl Op {
    /// The verb an [`Error::Storage`] of this operation carries.
    fn verb(self) -> &'static str {
        match self {
            Op::Put | Op::Writer => "write",
            Op::Create => "create",
            Op::Get => "read",
            Op::Exists | Op::Size => "stat",
            Op::List => "list",
            Op::Delete => "delete",
            Op::Sync => "sync",
        }
    }
}

/// What a rule does to the calls it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The call fails with [`Error::Storage`] of this kind (nothing reaches the store).
    Fail(StorageFault),
    /// The call goes through; the bytes it reads have the byte at this offset (modulo the
    /// length read) flipped. Only for [`Op::Get`]; other operations go through unchanged.
    Corrupt(usize),
    /// The call waits this long, then goes through.
    Delay(Duration),
}

/// One rule: the calls of `op` on names containing `name` (empty: every name), from the
/// `nth` matching call (1-based) on, `times` of them, get `fault`.
#[derive(Debug, Clone)]
pub struct Rule {
    pub op: Op,
    pub name: String,
    pub nth: u32,
    pub times: u32,
    pub fault: Fault,
}

struct Armed {
    rule: Rule,
    /// Matching calls seen so far.
    seen: u32,
}

/// [`Storage`] over another, with the faults of its rules ([`FaultyStorage::inject`]).
pub struct FaultyStorage {
    inner: Arc<dyn Storage>,
    rules: Mutex<Vec<Armed>>,
    /// Every call made through this store: operation and name, in order.
    calls: Mutex<Vec<(Op, String)>>,
}

impl FaultyStorage {
    /// `inner` with no rule yet: every call goes through.
    pub fn new(inner: Arc<dyn Storage>) -> FaultyStorage {
        FaultyStorage {
            inner,
            rules: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
        }
    }

    /// Adds a rule: calls of `op` on names containing `name`, from the `nth` matching one
    /// (1-based, counted from now) for `times` calls, get `fault`.
    pub fn inject(&self, op: Op, name: &str, nth: u32, times: u32, fault: Fault) -> &Self {
        self.rules.lock().unwrap().push(Armed {
            rule: Rule {
                op,
                name: name.into(),
                nth: nth.max(1),
                times,
                fault,
            },
            seen: 0,
        });
        self
    }

    /// Removes every rule (the store has recovered).
    pub fn heal(&self) {
        self.rules.lock().unwrap().clear();
    }

    /// How many calls of `op` on names containing `name` were made through this store.
    pub fn calls(&self, op: Op, name: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(o, n)| *o == op && n.contains(name))
            .count()
    }

    /// Records the call and applies the rules that hit it: a failure is returned, a delay
    /// slept, a corruption returned for the caller to apply to what it read.
    fn enter(&self, op: Op, name: &str) -> Result<Option<usize>> {
        self.calls.lock().unwrap().push((op, name.to_string()));
        let mut hit = Vec::new();
        for a in self.rules.lock().unwrap().iter_mut() {
            if a.rule.op != op || !name.contains(a.rule.name.as_str()) {
                continue;
            }
            a.seen += 1;
            if a.seen >= a.rule.nth && a.seen < a.rule.nth.saturating_add(a.rule.times) {
                hit.push(a.rule.fault);
            }
        }
        let mut corrupt = None;
        for f in hit {
            match f {
                Fault::Delay(d) => std::thread::sleep(d),
                Fault::Corrupt(at) => corrupt = Some(at),
                Fault::Fail(fault) => {
                    return Err(Error::Storage {
                        op: op.verb(),
                        target: format!("{} {name}", self.inner.describe()),
                        fault,
                        detail: format!("injected {fault:?} on {op:?}"),
                        source: None,
                    })
                }
            }
        }
        Ok(corrupt)
    }
}

/// Panics unless `e` is a transient [`Error::Storage`] (through any hint), of the operation
/// `op` when given (`"write"`, `"read"`, ...): what an injected
/// `Fault::Fail(StorageFault::Transient)` must come back as. For tests.
pub fn assert_transient(e: &Error, op: Option<&str>) {
    match e.kind() {
        Error::Storage {
            fault: StorageFault::Transient,
            op: o,
            ..
        } if op.is_none_or(|op| op == *o) => {}
        other => panic!("not a transient storage error of {op:?}: {other:?}"),
    }
}

fn flip(bytes: &mut [u8], at: Option<usize>) {
    if let Some(at) = at {
        if !bytes.is_empty() {
            let i = at % bytes.len();
            bytes[i] ^= 0x5a;
        }
    }
}

impl Storage for FaultyStorage {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn read_ahead(&self) -> usize {
        self.inner.read_ahead()
    }
    fn remote(&self) -> bool {
        self.inner.remote()
    }
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.enter(Op::Put, name)?;
        self.inner.put(name, data)
    }
    fn put_owned(&self, name: &str, data: AlignedBuf) -> Result<Option<AlignedBuf>> {
        self.enter(Op::Put, name)?;
        self.inner.put_owned(name, data)
    }
    fn put_durable(&self, name: &str, data: &[u8]) -> Result<()> {
        self.enter(Op::Put, name)?;
        self.inner.put_durable(name, data)
    }
    fn create_new(&self, name: &str, data: &[u8]) -> Result<bool> {
        self.enter(Op::Create, name)?;
        self.inner.create_new(name, data)
    }
    fn create_new_owned(&self, name: &str, data: Vec<u8>) -> Result<(bool, Vec<u8>)> {
        self.enter(Op::Create, name)?;
        self.inner.create_new_owned(name, data)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let c = self.enter(Op::Get, name)?;
        let mut b = self.inner.get_range(name, offset, len)?;
        flip(&mut b, c);
        Ok(b)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let c = self.enter(Op::Get, name)?;
        let mut b = self.inner.get(name)?;
        flip(&mut b, c);
        Ok(b)
    }
    fn get_into(&self, name: &str, size: Option<u64>, buf: &mut AlignedBuf) -> Result<()> {
        let c = self.enter(Op::Get, name)?;
        self.inner.get_into(name, size, buf)?;
        flip(&mut buf[..], c);
        Ok(())
    }
    fn reader(&self, name: &str) -> Result<Box<dyn Read + Send>> {
        match self.enter(Op::Get, name)? {
            None => self.inner.reader(name),
            Some(at) => {
                // A damaged stream: read whole, flipped, served from memory.
                let mut b = Vec::new();
                self.inner
                    .reader(name)?
                    .read_to_end(&mut b)
                    .map_err(|e| Error::io("read", std::path::Path::new(name), e))?;
                flip(&mut b, Some(at));
                Ok(Box::new(std::io::Cursor::new(b)))
            }
        }
    }
    fn writer(&self, name: &str) -> Result<Box<dyn ObjectWriter>> {
        self.enter(Op::Writer, name)?;
        self.inner.writer(name)
    }
    fn exists(&self, name: &str) -> Result<bool> {
        self.enter(Op::Exists, name)?;
        self.inner.exists(name)
    }
    fn size(&self, name: &str) -> Result<Option<u64>> {
        self.enter(Op::Size, name)?;
        self.inner.size(name)
    }
    fn list(&self, dir: &str) -> Result<Names<'_>> {
        self.enter(Op::List, dir)?;
        self.inner.list(dir)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.enter(Op::Delete, name)?;
        self.inner.delete(name)
    }
    fn remove_all(&self, dir: &str) -> Result<()> {
        self.enter(Op::Delete, dir)?;
        self.inner.remove_all(dir)
    }
    fn sync(&self) -> Result<()> {
        self.enter(Op::Sync, "")?;
        self.inner.sync()
    }
    fn cancel(&self) {
        self.inner.cancel()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::object::ObjectStorage;

    fn memory() -> Arc<dyn Storage> {
        Arc::new(ObjectStorage::in_memory("fault-test").unwrap())
    }

    #[test]
    fn a_rule_hits_only_its_calls() {
        let f = FaultyStorage::new(memory());
        f.inject(Op::Put, "data/", 2, 1, Fault::Fail(StorageFault::Transient));
        f.put("data/1", b"one").unwrap();
        f.put("other", b"x").unwrap();
        let e = f.put("data/2", b"two").unwrap_err();
        crate::storage::fault::assert_transient(&e, Some("write"));
        // Past its one call, the rule is spent: the retry goes through.
        f.put("data/2", b"two").unwrap();
        assert_eq!(f.get("data/2").unwrap(), b"two");
        assert_eq!(f.calls(Op::Put, "data/"), 3);
    }

    #[test]
    fn corrupt_reads_flip_one_byte_and_heal_restores() {
        let f = FaultyStorage::new(memory());
        f.put("m", b"abcdef").unwrap();
        f.inject(Op::Get, "m", 1, u32::MAX, Fault::Corrupt(2));
        let got = f.get("m").unwrap();
        assert_eq!(got.len(), 6);
        assert_ne!(got, b"abcdef");
        assert_eq!(&got[..2], b"ab");
        let mut r = String::new();
        f.reader("m").unwrap().read_to_string(&mut r).ok();
        assert_ne!(r.as_bytes(), b"abcdef");
        f.heal();
        assert_eq!(f.get("m").unwrap(), b"abcdef");
    }
}
