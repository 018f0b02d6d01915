//! The per-job key and what is derived from it.
//!
//! Every rank of a job holds the same 32-byte key. It never passes through the store: the store
//! speaks torch's unauthenticated protocol, and anyone who reaches `MASTER_PORT` can read it.
//! Ranks prove they know the key on every transport connection (a mutual HMAC challenge, see
//! `ctran::transport::socket::handshake`), and each communicator's secret is derived from the
//! key and a public nonce, so the nonce may sit in the store in the clear.
//!
//! Where the key comes from, first match wins (`docs/security.md`):
//! 1. `TORCHCOMMS_JOB_KEY`: the key text itself, set by the launcher (read directly from the
//!    environment and not declared as a cvar, so cvar listings and trace dumps never show it);
//! 2. `TORCHCOMMS_JOB_KEY_FILE`: a file holding it (must not be readable by group or others);
//! 3. the default file `$XDG_RUNTIME_DIR/torchcomms-job.key`, else
//!    `~/.cache/torchcomms/job.key`, created 0600 with 32 random bytes by the first rank that
//!    needs it. It suits one user's jobs on one machine (or a shared home directory); ranks on
//!    other hosts need one of the first two.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The launcher's variable holding the key itself.
pub const JOB_KEY_VAR: &str = "TORCHCOMMS_JOB_KEY";
/// The cvar naming a file that holds the key.
pub const JOB_KEY_FILE_VAR: &str = "TORCHCOMMS_JOB_KEY_FILE";

type HmacSha256 = Hmac<Sha256>;

/// A job's key. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct JobKey([u8; 32]);

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A fingerprint tells keys apart in logs without revealing them.
        write!(f, "JobKey(fingerprint {:016x})", self.fingerprint())
    }
}

/// Where a [`JobKey`] came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `TORCHCOMMS_JOB_KEY`.
    Env,
    /// A file (`TORCHCOMMS_JOB_KEY_FILE` or the default one).
    File(PathBuf),
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::Env => f.write_str(JOB_KEY_VAR),
            KeySource::File(p) => write!(f, "key file {}", p.display()),
        }
    }
}

impl JobKey {
    /// The key of any text or bytes (hashed, so any length works).
    pub fn from_bytes(material: &[u8]) -> JobKey {
        let mut h = Sha256::new();
        h.update(b"torchcomms-rs job key v1\0");
        h.update(material);
        JobKey(h.finalize().into())
    }

    /// The key of this process: environment, then file, then the default file.
    pub fn load() -> Result<(JobKey, KeySource)> {
        if let Some(k) = std::env::var_os(JOB_KEY_VAR).filter(|k| !k.is_empty()) {
            return Ok((JobKey::from_bytes(k.as_encoded_bytes()), KeySource::Env));
        }
        let cv = torchcomms_cvars::reload()
            .map_err(|e| Error::invalid(JOB_KEY_FILE_VAR, "a valid configuration", e))?;
        let file = cv.torchcomms_job_key_file();
        if !file.is_empty() {
            let path = PathBuf::from(file);
            return Ok((read_key_file(&path)?, KeySource::File(path)));
        }
        let path = default_key_path()?;
        Ok((read_or_create(&path)?, KeySource::File(path)))
    }

    /// A short, non-secret fingerprint (the first bytes of a hash of the key).
    pub fn fingerprint(&self) -> u64 {
        let d = Sha256::digest([&b"fingerprint"[..], &self.0].concat());
        u64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
    }

    /// HMAC-SHA-256 of the parts under this key, each prefixed with its length (so part
    /// boundaries cannot shift).
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        mac(&self.0, parts)
    }

    /// A communicator's secret: derived from the key and a per-communicator `nonce` that may be
    /// public. Without the key the nonce tells nothing about the secret.
    pub fn comm_secret(&self, comm: &str, nonce: &[u8]) -> [u8; 32] {
        self.mac(&[b"torchcomms-rs comm secret v1", comm.as_bytes(), nonce])
    }
}

/// HMAC-SHA-256 of length-prefixed `parts` under `key`.
pub fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    for p in parts {
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// Checks a MAC in constant time (the `hmac` crate compares with `subtle`).
pub fn verify_mac(key: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    for p in parts {
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    m.verify_slice(tag).is_ok()
}

fn default_key_path() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
    {
        return Ok(dir.join("torchcomms-job.key"));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache/torchcomms/job.key")),
        None => Err(Error::invalid(
            JOB_KEY_VAR,
            format!("a job key: set {JOB_KEY_VAR} or {JOB_KEY_FILE_VAR} (no XDG_RUNTIME_DIR or HOME for the default key file)"),
            "unset",
        )),
    }
}

fn key_error(path: &Path, what: impl fmt::Display) -> Error {
    Error::invalid(
        JOB_KEY_FILE_VAR,
        format!("a job key file readable only by its owner ({JOB_KEY_VAR} overrides it)"),
        format!("{}: {what}", path.display()),
    )
}

/// Reads a key file, refusing one that others could read too.
fn read_key_file(path: &Path) -> Result<JobKey> {
    let meta = std::fs::metadata(path).map_err(|e| key_error(path, e))?;
    if meta.mode() & 0o077 != 0 {
        return Err(key_error(
            path,
            format!(
                "mode {:o} lets group or others read it",
                meta.mode() & 0o777
            ),
        ));
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(key_error(path, "owned by another user"));
    }
    let bytes = std::fs::read(path).map_err(|e| key_error(path, e))?;
    if bytes.is_empty() {
        return Err(key_error(path, "empty"));
    }
    Ok(JobKey::from_bytes(&bytes))
}

/// The default key file, created atomically by whichever rank comes first: the key is written
/// to a private temporary file and linked into place, so no rank ever reads a half-written key.
fn read_or_create(path: &Path) -> Result<JobKey> {
    if path.exists() {
        return read_key_file(path);
    }
    let dir = path.parent().expect("a key path has a directory");
    std::fs::create_dir_all(dir).map_err(|e| key_error(path, e))?;
    let tmp = dir.join(format!(
        ".job.key.{}.{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        let key: [u8; 32] = rand::random();
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        f.write_all(hex.as_bytes())?;
        f.sync_all()?;
        match std::fs::hard_link(&tmp, path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    written.map_err(|e| key_error(path, e))?;
    tracing::info!(path = %path.display(), "created the default job key file");
    read_key_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_bind_every_part_and_its_boundaries() {
        let k = JobKey::from_bytes(b"k");
        let m = k.mac(&[b"ab", b"c"]);
        assert_ne!(m, k.mac(&[b"a", b"bc"]));
        assert!(verify_mac(&k.0, &[b"ab", b"c"], &m));
        assert!(!verify_mac(
            &JobKey::from_bytes(b"other").0,
            &[b"ab", b"c"],
            &m
        ));
        assert_ne!(k.comm_secret("c", b"n1"), k.comm_secret("c", b"n2"));
        assert!(!format!("{k:?}").contains(&format!("{:?}", k.0)));
    }

    #[test]
    fn the_default_file_is_created_private_once_and_others_are_checked() {
        let dir = std::env::temp_dir().join(format!("tcrs-key-{}", rand::random::<u64>()));
        let path = dir.join("sub/job.key");
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let p = path.clone();
                std::thread::spawn(move || read_or_create(&p).unwrap())
            })
            .collect();
        let keys: Vec<JobKey> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(
            keys.windows(2).all(|w| w[0] == w[1]),
            "every rank reads one key"
        );
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_key_file(&path).unwrap_err().to_string();
        assert!(
            e.contains("group or others") && e.contains(JOB_KEY_FILE_VAR),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
