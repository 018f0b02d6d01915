//! The store's keys and queues, the connections parked in a `WAIT` or a barrier, and the
//! answer to each request.

use std::collections::{HashMap, VecDeque};

use super::super::protocol::{
    Encoder, Request, CHECK_NOT_READY, CHECK_READY, WAIT_CANCELED, WAIT_STOP_WAITING,
};
use super::StoreLimits;
use crate::error::Result;

/// Connection identifier inside the server thread.
pub(super) type ConnId = u64;

/// Replies produced by one request: (connection, bytes). Usually one entry for the requester,
/// plus one `STOP_WAITING` per waiter the request released.
pub(super) type Outbox = Vec<(ConnId, Vec<u8>)>;

/// The key-value state and the parked waiters. Pure logic, no sockets: unit-testable.
#[derive(Debug)]
pub(super) struct Db {
    limits: StoreLimits,
    /// Bytes of every stored key, value and queued item.
    bytes: usize,
    kv: HashMap<Vec<u8>, Vec<u8>>,
    queues: HashMap<Vec<u8>, VecDeque<Vec<u8>>>,
    /// key -> connections waiting for it (each at most once per key).
    waiting: HashMap<Vec<u8>, Vec<ConnId>>,
    /// connection -> number of its awaited keys still missing.
    awaited: HashMap<ConnId, usize>,
}

/// Why a request made the server drop the connection (torch drops it too: the protocol has no
/// error reply).
#[derive(Debug)]
pub(super) struct Fatal(pub(super) String);

impl Default for Db {
    fn default() -> Db {
        Db::new(StoreLimits::default())
    }
}

impl Db {
    pub(super) fn new(limits: StoreLimits) -> Db {
        Db {
            limits,
            bytes: 0,
            kv: HashMap::new(),
            queues: HashMap::new(),
            waiting: HashMap::new(),
            awaited: HashMap::new(),
        }
    }

    /// Bytes of the stored keys, values and queued items.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Refuses a request that would store `grow` more bytes than the `room` left in the quota.
    fn fits(&self, grow: usize, room: usize) -> Result<(), Fatal> {
        if grow > room {
            return Err(Fatal(format!(
                "storing {grow} more bytes would pass the memory quota of {} bytes \
                 (TORCHCOMMS_STORE_MAX_BYTES; {} bytes stored)",
                self.limits.max_bytes, self.bytes
            )));
        }
        Ok(())
    }

    /// Refuses a reply larger than a client may leave unread.
    fn reply_fits(&self, len: usize) -> Result<(), Fatal> {
        let cap = self
            .limits
            .client_buffer
            .saturating_add(self.limits.max_value);
        if len > cap {
            return Err(Fatal(format!(
                "a reply of {len} bytes passes the limit of {cap} bytes \
                 (TORCHCOMMS_STORE_CLIENT_BUFFER_BYTES + TORCHCOMMS_STORE_MAX_VALUE_BYTES)"
            )));
        }
        Ok(())
    }

    /// Stores `value` under `key`, keeping the byte count.
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        let (klen, vlen) = (key.len(), value.len());
        match self.kv.insert(key, value) {
            Some(old) => self.bytes = self.bytes - old.len() + vlen,
            None => self.bytes += klen + vlen,
        }
    }

    /// Bytes storing `value` under `key` adds (0 when it shrinks an entry).
    fn growth(&self, key: &[u8], value_len: usize) -> usize {
        match self.kv.get(key) {
            Some(old) => value_len.saturating_sub(old.len()),
            None => key.len() + value_len,
        }
    }

    fn present(&self, key: &[u8]) -> bool {
        self.kv.contains_key(key) || self.queues.get(key).is_some_and(|q| !q.is_empty())
    }

    /// Runs one request of `conn`; `room` is what the memory quota has left. Replies go to
    /// `out`.
    pub(super) fn handle(
        &mut self,
        conn: ConnId,
        req: Request,
        room: usize,
        out: &mut Outbox,
    ) -> Result<(), Fatal> {
        let mut reply = Encoder::default();
        match req {
            // The server loop consumes VALIDATE before requests reach here; a second one on a
            // validated connection is harmless.
            Request::Validate { .. } => {}
            Request::Ping { nonce } => {
                reply.u32(nonce);
            }
            Request::Set { key, value } => {
                self.fits(self.growth(&key, value.len()), room)?;
                self.set(key, value, out);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                // Same answers as torch: a missing key is created only when `expected` is
                // empty; otherwise the reply is `expected` itself (torch's documented "lie").
                self.fits(self.growth(&key, desired.len()), room)?;
                let now = match self.kv.get(&key) {
                    None if expected.is_empty() => {
                        self.put(key.clone(), desired.clone());
                        desired
                    }
                    None => expected,
                    Some(cur) if *cur == expected => {
                        self.put(key.clone(), desired.clone());
                        desired
                    }
                    Some(cur) => cur.clone(),
                };
                reply.bytes(&now);
                // torch's libuv server wakes waiters here even when the key is still missing;
                // only a key that now exists releases them.
                if self.kv.contains_key(&key) {
                    self.wake_all(&key, out);
                }
            }
            Request::Get { key } => {
                // torch's client always waits before GET; a key deleted in between reads as
                // empty (libuv server behaviour) rather than killing the connection.
                reply.bytes(self.kv.get(&key).map_or(&[][..], Vec::as_slice));
            }
            Request::Add { key, delta } => {
                let new = self.add(&key, delta)?;
                reply.i64(new);
                self.wake_all(&key, out);
            }
            Request::Check { keys } => {
                let ready = keys.iter().all(|k| self.present(k));
                reply.u8(if ready { CHECK_READY } else { CHECK_NOT_READY });
            }
            Request::Wait { keys } => {
                if !self.park(conn, &keys) {
                    reply.u8(WAIT_STOP_WAITING);
                }
            }
            Request::GetNumKeys => {
                reply.i64(self.kv.len() as i64);
            }
            Request::DeleteKey { key } => {
                let removed = self.kv.remove(&key);
                if let Some(v) = &removed {
                    self.bytes -= key.len() + v.len();
                }
                reply.i64(i64::from(removed.is_some()));
            }
            Request::Append { key, value } => {
                let old = self.kv.get(&key).map_or(0, Vec::len);
                let max = self.limits.max_value;
                if old + value.len() > max {
                    return Err(Fatal(format!(
                        "APPEND would make a value of {} bytes, above the limit of {max} \
                         (TORCHCOMMS_STORE_MAX_VALUE_BYTES)",
                        old + value.len()
                    )));
                }
                self.fits(self.growth(&key, old + value.len()), room)?;
                let mut v = self.kv.get(&key).cloned().unwrap_or_default();
                v.extend_from_slice(&value);
                self.put(key.clone(), v);
                self.wake_all(&key, out);
            }
            Request::MultiGet { keys } => {
                let len: usize = keys
                    .iter()
                    .map(|k| 8 + self.kv.get(k).map_or(0, Vec::len))
                    .sum();
                self.reply_fits(len)?;
                for k in &keys {
                    reply.bytes(self.kv.get(k).map_or(&[][..], Vec::as_slice));
                }
            }
            Request::MultiSet { pairs } => {
                let grow: usize = pairs.iter().map(|(k, v)| k.len() + v.len()).sum();
                self.fits(grow, room)?;
                for (k, v) in pairs {
                    self.set(k, v, out);
                }
            }
            Request::CancelWait => {
                self.forget(conn);
                reply.u8(WAIT_CANCELED);
            }
            Request::QueuePush { key, value } => {
                self.fits(key.len() + value.len(), room)?;
                self.bytes += key.len() + value.len();
                self.queues.entry(key.clone()).or_default().push_back(value);
                // One item can satisfy one blocked pop.
                self.wake_one(&key, out);
            }
            Request::QueuePop { key } => {
                let q = self.queues.entry(key.clone()).or_default();
                reply.i64(q.len() as i64);
                if let Some(v) = q.pop_front() {
                    self.bytes -= key.len() + v.len();
                    reply.bytes(&v);
                }
            }
            Request::QueueLen { key } => {
                reply.i64(self.queues.get(&key).map_or(0, VecDeque::len) as i64);
            }
            Request::ListKeys => {
                self.reply_fits(self.kv.keys().map(|k| 8 + k.len()).sum())?;
                reply.i64(self.kv.len() as i64);
                for k in self.kv.keys() {
                    reply.bytes(k);
                }
            }
            Request::Barrier { key, world_size } => {
                let count = self.add(&key, 1)?;
                if count >= world_size {
                    reply.u8(WAIT_STOP_WAITING);
                    self.wake_all(&key, out);
                } else {
                    self.forget(conn);
                    self.waiting.entry(key).or_default().push(conn);
                    self.awaited.insert(conn, 1);
                }
            }
        }
        if !reply.0.is_empty() {
            out.push((conn, reply.0));
        }
        Ok(())
    }

    fn set(&mut self, key: Vec<u8>, value: Vec<u8>, out: &mut Outbox) {
        self.put(key.clone(), value);
        self.wake_all(&key, out);
    }

    /// `ADD`: values are decimal text so that `get` shows them (`std::to_string` in torch).
    fn add(&mut self, key: &[u8], delta: i64) -> Result<i64, Fatal> {
        let old = match self.kv.get(key) {
            None => 0,
            Some(v) => parse_leading_i64(v).ok_or_else(|| {
                Fatal(format!(
                    "ADD on key {:?} whose value {:?} is not an integer",
                    String::from_utf8_lossy(key),
                    String::from_utf8_lossy(v)
                ))
            })?,
        };
        let new = old.checked_add(delta).ok_or_else(|| {
            Fatal(format!(
                "ADD on key {:?} overflows i64",
                String::from_utf8_lossy(key)
            ))
        })?;
        self.put(key.to_vec(), new.to_string().into_bytes());
        Ok(new)
    }

    /// Registers `conn` as waiting for the missing ones of `keys`; false when none is missing.
    fn park(&mut self, conn: ConnId, keys: &[Vec<u8>]) -> bool {
        if keys.iter().all(|k| self.present(k)) {
            return false;
        }
        // A client has at most one outstanding WAIT; drop stale state defensively.
        self.forget(conn);
        let mut missing = 0;
        for k in keys {
            if !self.present(k) {
                let list = self.waiting.entry(k.clone()).or_default();
                if !list.contains(&conn) {
                    list.push(conn);
                    missing += 1;
                }
            }
        }
        self.awaited.insert(conn, missing);
        true
    }

    fn wake_all(&mut self, key: &[u8], out: &mut Outbox) {
        if let Some(conns) = self.waiting.remove(key) {
            for c in conns {
                self.release(c, out);
            }
        }
    }

    fn wake_one(&mut self, key: &[u8], out: &mut Outbox) {
        let Some(list) = self.waiting.get_mut(key) else {
            return;
        };
        if list.is_empty() {
            return;
        }
        let c = list.remove(0);
        if list.is_empty() {
            self.waiting.remove(key);
        }
        self.release(c, out);
    }

    /// One of `c`'s keys arrived; answer its WAIT when it was the last one.
    fn release(&mut self, c: ConnId, out: &mut Outbox) {
        if let Some(n) = self.awaited.get_mut(&c) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.awaited.remove(&c);
                out.push((c, vec![WAIT_STOP_WAITING]));
            }
        }
    }

    /// Drops every wait registration of `conn` (cancel, or the connection closed).
    pub(super) fn forget(&mut self, conn: ConnId) {
        if self.awaited.remove(&conn).is_none() {
            return;
        }
        self.waiting.retain(|_, list| {
            list.retain(|c| *c != conn);
            !list.is_empty()
        });
    }
}

/// `std::stoll` semantics: optional leading whitespace and sign, then digits; trailing bytes
/// are ignored.
fn parse_leading_i64(v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?.trim_start();
    let digits_start = usize::from(s.starts_with(['-', '+']));
    let end = s[digits_start..]
        .find(|c: char| !c.is_ascii_digit())
        .map_or(s.len(), |i| i + digits_start);
    if end == digits_start {
        return None;
    }
    s[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn wait_is_answered_when_the_last_key_arrives() {
        let mut db = Db::default();
        let mut out = Outbox::new();
        db.handle(
            1,
            Request::Wait {
                keys: vec![k("a"), k("b")],
            },
            usize::MAX,
            &mut out,
        )
        .unwrap();
        assert!(out.is_empty());
        db.handle(
            2,
            Request::Set {
                key: k("a"),
                value: k("1"),
            },
            usize::MAX,
            &mut out,
        )
        .unwrap();
        assert!(out.is_empty());
        db.handle(
            2,
            Request::Add {
                key: k("b"),
                delta: 2,
            },
            usize::MAX,
            &mut out,
        )
        .unwrap();
        out.sort();
        assert_eq!(
            out,
            vec![
                (1, vec![WAIT_STOP_WAITING]),
                (2, 2i64.to_le_bytes().to_vec())
            ]
        );
        assert!(db.waiting.is_empty() && db.awaited.is_empty());
    }

    #[test]
    fn cancel_wait_forgets_the_waiter() {
        let mut db = Db::default();
        let mut out = Outbox::new();
        db.handle(
            1,
            Request::Wait { keys: vec![k("a")] },
            usize::MAX,
            &mut out,
        )
        .unwrap();
        db.handle(1, Request::CancelWait, usize::MAX, &mut out)
            .unwrap();
        assert_eq!(out, vec![(1, vec![WAIT_CANCELED])]);
        out.clear();
        db.handle(
            2,
            Request::Set {
                key: k("a"),
                value: k("1"),
            },
            usize::MAX,
            &mut out,
        )
        .unwrap();
        assert!(
            out.is_empty(),
            "a cancelled waiter must not get STOP_WAITING: {out:?}"
        );
    }

    #[test]
    fn queue_push_releases_one_blocked_pop() {
        let mut db = Db::default();
        let mut out = Outbox::new();
        db.handle(
            1,
            Request::Wait { keys: vec![k("q")] },
            usize::MAX,
            &mut out,
        )
        .unwrap();
        db.handle(
            2,
            Request::Wait { keys: vec![k("q")] },
            usize::MAX,
            &mut out,
        )
        .unwrap();
        db.handle(
            3,
            Request::QueuePush {
                key: k("q"),
                value: k("x"),
            },
            usize::MAX,
            &mut out,
        )
        .unwrap();
        assert_eq!(out, vec![(1, vec![WAIT_STOP_WAITING])]);
        out.clear();
        db.handle(1, Request::QueuePop { key: k("q") }, usize::MAX, &mut out)
            .unwrap();
        let mut expect = Encoder::default();
        expect.i64(1).bytes(b"x");
        assert_eq!(out, vec![(1, expect.0)]);
    }

    #[test]
    fn add_follows_stoll_and_rejects_garbage() {
        assert_eq!(parse_leading_i64(b" -12abc"), Some(-12));
        assert_eq!(parse_leading_i64(b"+7"), Some(7));
        assert_eq!(parse_leading_i64(b"abc"), None);
        assert_eq!(parse_leading_i64(b"-"), None);
        let mut db = Db::default();
        let mut out = Outbox::new();
        db.handle(
            1,
            Request::Set {
                key: k("x"),
                value: k("oops"),
            },
            usize::MAX,
            &mut out,
        )
        .unwrap();
        assert!(db
            .handle(
                1,
                Request::Add {
                    key: k("x"),
                    delta: 1
                },
                usize::MAX,
                &mut out
            )
            .is_err());
    }

    #[test]
    fn barrier_releases_everyone_at_world_size() {
        let mut db = Db::default();
        let mut out = Outbox::new();
        for conn in 0..2 {
            db.handle(
                conn,
                Request::Barrier {
                    key: k("b"),
                    world_size: 3,
                },
                usize::MAX,
                &mut out,
            )
            .unwrap();
        }
        assert!(out.is_empty());
        db.handle(
            2,
            Request::Barrier {
                key: k("b"),
                world_size: 3,
            },
            usize::MAX,
            &mut out,
        )
        .unwrap();
        let mut who: Vec<ConnId> = out.iter().map(|(c, _)| *c).collect();
        who.sort();
        assert_eq!(who, vec![0, 1, 2]);
    }
}
