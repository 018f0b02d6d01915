//! The key-value store ranks meet through before they connect to each other.

use std::fmt::Debug;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;

/// A key-value store shared by all ranks of a job, with the semantics of
/// `torch.distributed.Store`: `get` and `wait` block until the key exists or the timeout passes.
///
/// Implementations must be usable from several threads at once.
pub trait Store: Send + Sync + Debug {
    /// Sets `key` to `value`, replacing any earlier value.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;

    /// Returns the value of `key`, waiting up to `timeout` for another rank to set it.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;

    /// Atomically adds `delta` to the integer stored at `key` (missing keys count as 0) and
    /// returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;

    /// Sets `key` to `desired` if its current value is `expected` (an empty `expected` matches
    /// a missing key); returns the value now stored.
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>>;

    /// Deletes `key`; returns whether it existed.
    fn delete(&self, key: &str) -> Result<bool>;

    /// True when every key exists now (does not wait).
    fn check(&self, keys: &[&str]) -> Result<bool>;

    /// Waits until every key exists, up to `timeout`.
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()>;

    /// The local address this process uses to reach the store, when known. Peers on other hosts
    /// can reach this process at that address, so the socket transport listens on it.
    fn local_addr_hint(&self) -> Option<IpAddr> {
        None
    }
}

/// A view of another store in which every key is prefixed with `prefix/`, so many communicators
/// (and the launcher) share one store without their keys colliding.
#[derive(Debug, Clone)]
pub struct PrefixStore {
    prefix: String,
    inner: Arc<dyn Store>,
}

impl PrefixStore {
    /// Wraps `inner`, prefixing keys with `prefix` and a `/`.
    pub fn new(prefix: impl Into<String>, inner: Arc<dyn Store>) -> Self {
        PrefixStore {
            prefix: prefix.into(),
            inner,
        }
    }

    fn key(&self, key: &str) -> String {
        format!("{}/{}", self.prefix, key)
    }

    /// The prefix, without the trailing `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(&self.key(key), value)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner.get(&self.key(key), timeout)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(&self.key(key), delta)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.inner.compare_set(&self.key(key), expected, desired)
    }

    fn delete(&self, key: &str) -> Result<bool> {
        self.inner.delete(&self.key(key))
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let full: Vec<String> = keys.iter().map(|k| self.key(k)).collect();
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        self.inner.check(&refs)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let full: Vec<String> = keys.iter().map(|k| self.key(k)).collect();
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        self.inner.wait(&refs, timeout)
    }

    fn local_addr_hint(&self) -> Option<IpAddr> {
        self.inner.local_addr_hint()
    }
}
