//! Access keys: what a peer needs to name a registration of this process, as a string (the
//! hex of a small versioned record), so it travels in pickles and URLs untouched.
//!
//! A key is a claim, never a capability: the process that owns the memory looks the
//! registration up by id, compares the nonce and generation, and checks the bounds before it
//! touches anything ([`super::registry`]).

use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use super::error::{RdmaError, Result};
use super::registry::MemDevice;

/// Version byte of the record.
const VERSION: u8 = 1;
/// Bytes of the record: version, host, pid, nonce, id, generation, addr, len, device.
const RECORD_BYTES: usize = 1 + 8 + 4 + 8 + 8 + 8 + 8 + 8 + 4;

/// Identifies "this host" for the same-host data paths: same kernel boot, same network
/// namespace, same hostname, and the same pid namespace (a pid must name the same process at
/// both ends for cross-memory attach).
pub fn host_id() -> u64 {
    static ID: OnceLock<u64> = OnceLock::new();
    *ID.get_or_init(|| {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let link = |p: &str| {
            std::fs::read_link(p)
                .map(|l| l.display().to_string())
                .unwrap_or_default()
        };
        let host = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut h = Sha256::new();
        for part in [
            read("/proc/sys/kernel/random/boot_id").trim().to_string(),
            link("/proc/self/ns/net"),
            link("/proc/self/ns/pid"),
            host,
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        u64::from_le_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
    })
}

/// A random number drawn once per process: a key made by an earlier process that had this
/// pid does not match it.
pub fn process_nonce() -> u64 {
    static NONCE: OnceLock<u64> = OnceLock::new();
    *NONCE.get_or_init(|| loop {
        let n: u64 = rand::random();
        if n != 0 {
            break n;
        }
    })
}

/// The decoded record of an access key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessKey {
    /// [`host_id`] of the owner.
    pub host: u64,
    /// The owner's pid.
    pub pid: u32,
    /// The owner's [`process_nonce`].
    pub nonce: u64,
    /// Registration id.
    pub id: u64,
    /// Registration generation.
    pub generation: u64,
    /// Registered start (in the owner's address space).
    pub addr: u64,
    /// Registered length.
    pub len: u64,
    /// Where the memory lives.
    pub device: MemDevice,
}

impl AccessKey {
    /// The key's text form.
    pub fn encode(&self) -> String {
        let mut b = Vec::with_capacity(RECORD_BYTES);
        b.push(VERSION);
        b.extend_from_slice(&self.host.to_le_bytes());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.nonce.to_le_bytes());
        b.extend_from_slice(&self.id.to_le_bytes());
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.addr.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b.extend_from_slice(&self.device.to_wire().to_le_bytes());
        hex(&b)
    }

    /// Parses a key's text form; every malformation is an error saying what was wrong.
    pub fn parse(text: &str) -> Result<AccessKey> {
        let bad = |why: String| RdmaError::MalformedKey(why);
        let want = RECORD_BYTES * 2;
        if text.len() != want {
            return Err(bad(format!(
                "expected {want} hex digits, got {} characters",
                text.len()
            )));
        }
        let b = unhex(text).ok_or_else(|| bad("not hexadecimal".into()))?;
        if b[0] != VERSION {
            return Err(bad(format!(
                "unsupported version {} (this build reads version {VERSION})",
                b[0]
            )));
        }
        let mut at = 1;
        let mut take = |n: usize| {
            let s = &b[at..at + n];
            at += n;
            s
        };
        let u64_of = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes"));
        let host = u64_of(take(8));
        let pid = u32::from_le_bytes(take(4).try_into().expect("4 bytes"));
        let nonce = u64_of(take(8));
        let id = u64_of(take(8));
        let generation = u64_of(take(8));
        let addr = u64_of(take(8));
        let len = u64_of(take(8));
        let dev = i32::from_le_bytes(take(4).try_into().expect("4 bytes"));
        let device = MemDevice::from_wire(dev).ok_or_else(|| {
            bad(format!(
                "device code {dev} is neither cpu (-1) nor a CUDA ordinal"
            ))
        })?;
        if addr.checked_add(len).is_none() {
            return Err(bad(format!("range {len} bytes at {addr:#x} overflows")));
        }
        Ok(AccessKey {
            host,
            pid,
            nonce,
            id,
            generation,
            addr,
            len,
            device,
        })
    }

    /// Whether this process made the key.
    pub fn is_mine(&self) -> bool {
        self.host == host_id() && self.pid == std::process::id() && self.nonce == process_nonce()
    }

    /// Checks that the key was made by this process (the target's first check).
    pub fn check_mine(&self) -> Result<()> {
        if self.is_mine() {
            Ok(())
        } else {
            Err(RdmaError::ForeignKey {
                key_pid: self.pid,
                pid: std::process::id(),
            })
        }
    }
}

/// Lower-case hex of `b`.
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Bytes of a hex string, `None` when it is not one.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> AccessKey {
        AccessKey {
            host: host_id(),
            pid: std::process::id(),
            nonce: process_nonce(),
            id: 7,
            generation: 3,
            addr: 0x1000,
            len: 4096,
            device: MemDevice::Cuda(1),
        }
    }

    #[test]
    fn round_trips_and_rejects_malformed() {
        let k = key();
        let text = k.encode();
        assert_eq!(AccessKey::parse(&text).unwrap(), k);
        assert!(k.is_mine());
        for bad in ["", "zz", &text[1..], &text.replace('0', "g")] {
            let e = AccessKey::parse(bad).unwrap_err();
            assert!(matches!(e, RdmaError::MalformedKey(_)), "{bad}: {e}");
        }
        let mut v2 = text.clone();
        v2.replace_range(0..2, "02");
        assert!(AccessKey::parse(&v2)
            .unwrap_err()
            .to_string()
            .contains("version 2"));
        let foreign = AccessKey {
            nonce: k.nonce ^ 1,
            ..k
        };
        assert!(matches!(
            foreign.check_mine(),
            Err(RdmaError::ForeignKey { .. })
        ));
    }
}
