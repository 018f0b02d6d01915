//! Settings of one communicator. Defaults come from the environment (the cvars layer owns the
//! full list); callers override per communicator.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::transport::socket::SocketConfig;

/// Default per-operation timeout when neither the caller nor `TORCHCOMM_TIMEOUT_SECONDS` set one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Everything a communicator needs to know besides its store.
#[derive(Debug, Clone)]
pub struct CommConfig {
    /// Name, unique in the process; prefixes the store keys of this communicator.
    pub name: String,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Deadline for init and the default for every operation.
    pub timeout: Duration,
    /// Size of one staging chunk: large messages move through a few of these, never whole.
    pub chunk_bytes: usize,
    /// TCP transport settings.
    pub socket: SocketConfig,
    /// Abort the whole process when an operation fails or times out (torchcomms'
    /// `abort_process_on_timeout_or_error`), like NCCL's watchdog does.
    pub abort_process_on_error: bool,
}

fn env_parse<T: std::str::FromStr>(name: &str, expected: &str) -> Result<Option<T>> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| Error::invalid(name, expected, v)),
        _ => Ok(None),
    }
}

impl CommConfig {
    /// A configuration for `rank` of `size` named `name`, with defaults read from the
    /// environment: `TORCHCOMM_TIMEOUT_SECONDS`, `CTRAN_CHUNK_BYTES`, `CTRAN_SOCKET_IFADDR`,
    /// `CTRAN_SOCKET_SPIN_US`, `CTRAN_SOCKET_BUF_BYTES`.
    pub fn from_env(name: impl Into<String>, rank: usize, size: usize) -> Result<CommConfig> {
        let name = name.into();
        if size == 0 {
            return Err(Error::invalid("size", "at least 1 rank", size));
        }
        if rank >= size {
            return Err(Error::invalid(
                "rank",
                format!("a rank in [0, {size})"),
                rank,
            ));
        }
        if name.is_empty() || name.contains('/') {
            return Err(Error::invalid(
                "name",
                "a non-empty communicator name without '/'",
                &name,
            ));
        }
        let timeout =
            env_parse::<f64>("TORCHCOMM_TIMEOUT_SECONDS", "a positive number of seconds")?
                .map(Duration::try_from_secs_f64)
                .transpose()
                .map_err(|_| {
                    Error::invalid(
                        "TORCHCOMM_TIMEOUT_SECONDS",
                        "a positive number of seconds",
                        "negative",
                    )
                })?
                .unwrap_or(DEFAULT_TIMEOUT);
        let chunk_bytes =
            env_parse::<usize>("CTRAN_CHUNK_BYTES", "a byte count >= 4096")?.unwrap_or(1 << 20);
        if chunk_bytes < 4096 {
            return Err(Error::invalid(
                "CTRAN_CHUNK_BYTES",
                "a byte count >= 4096",
                chunk_bytes,
            ));
        }
        let mut socket = SocketConfig {
            ifaddr: env_parse("CTRAN_SOCKET_IFADDR", "an IP address")?,
            ..SocketConfig::default()
        };
        if let Some(us) = env_parse::<u64>("CTRAN_SOCKET_SPIN_US", "microseconds")? {
            socket.spin = Duration::from_micros(us);
        }
        if let Some(b) = env_parse::<usize>("CTRAN_SOCKET_BUF_BYTES", "a byte count")? {
            socket.buf_bytes = b;
        }
        Ok(CommConfig {
            name,
            rank,
            size,
            timeout,
            chunk_bytes,
            socket,
            abort_process_on_error: false,
        })
    }
}
