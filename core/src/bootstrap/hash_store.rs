//! An in-process store (like `torch.distributed.HashStore`): for ranks that are threads of one
//! process, and for tests.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::Store;
use crate::error::{Error, Result};

/// A store held in memory, shared by reference between threads.
#[derive(Debug, Default)]
pub struct HashStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    cv: Condvar,
}

impl HashStore {
    /// An empty store.
    pub fn new() -> HashStore {
        HashStore::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<u8>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for HashStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.lock().insert(key.to_string(), value.to_vec());
        self.cv.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait(&[key], timeout)?;
        self.lock().get(key).cloned().ok_or_else(|| Error::Store {
            op: "get",
            key: key.into(),
            reason: "deleted while waiting".into(),
        })
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut m = self.lock();
        let cur = match m.get(key) {
            Some(v) => String::from_utf8_lossy(v)
                .parse::<i64>()
                .map_err(|_| Error::Store {
                    op: "add",
                    key: key.into(),
                    reason: "value is not an integer".into(),
                })?,
            None => 0,
        };
        let new = cur + delta;
        m.insert(key.to_string(), new.to_string().into_bytes());
        self.cv.notify_all();
        Ok(new)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let mut m = self.lock();
        let current = m.get(key).cloned();
        let out = match current {
            None if expected.is_empty() => {
                m.insert(key.to_string(), desired.to_vec());
                desired.to_vec()
            }
            None => expected.to_vec(),
            Some(v) if v == expected => {
                m.insert(key.to_string(), desired.to_vec());
                desired.to_vec()
            }
            Some(v) => v,
        };
        self.cv.notify_all();
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<bool> {
        Ok(self.lock().remove(key).is_some())
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let m = self.lock();
        Ok(keys.iter().all(|k| m.contains_key(*k)))
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut m = self.lock();
        loop {
            if keys.iter().all(|k| m.contains_key(*k)) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let missing: Vec<&str> = keys
                    .iter()
                    .copied()
                    .filter(|k| !m.contains_key(*k))
                    .collect();
                return Err(Error::Store {
                    op: "wait",
                    key: missing.join(","),
                    reason: format!("timed out after {timeout:?}"),
                });
            }
            m = self
                .cv
                .wait_timeout(m, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}
