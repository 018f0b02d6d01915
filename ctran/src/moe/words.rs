//! The mapped host words the MoE kernels share with the host (`kernels/report.cuh`): where
//! they report an error, and what tells their waits that the communicator aborted.

use std::sync::Arc;
use std::time::Duration;

use crate::cuda::error::Result;
use crate::cuda::{Context, PinnedBuffer};
use crate::error::Error;

/// Code of a wait that reached the timeout (`DEV_ERR_TIMEOUT`).
const ERR_TIMEOUT: u64 = 2;
/// Code of a wait that saw the abort word (`DEV_ERR_ABORTED`).
const ERR_ABORTED: u64 = 7;

/// A word that the kernels' waits poll: raised once the communicator aborts, so a kernel
/// waiting for a peer gives up at once instead of at the timeout.
#[derive(Debug)]
pub struct AbortWord(PinnedBuffer);

impl AbortWord {
    /// A lowered word on `ctx`'s device.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<AbortWord>> {
        PinnedBuffer::alloc(ctx, 8).map(|b| Arc::new(AbortWord(b)))
    }

    /// Raises it: every wait of every kernel given it fails.
    pub fn raise(&self) {
        // SAFETY: 8 bytes of pinned memory, 8-aligned; the kernels only read it.
        unsafe { self.0.as_ptr().cast::<u64>().write_volatile(1) };
    }

    /// Its device address, for the kernels.
    pub fn device_ptr(&self) -> u64 {
        self.0.device_ptr()
    }
}

/// One device error: its code and three details (what they mean depends on the code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceError {
    /// The kernel source's code (1 and up).
    pub code: u64,
    /// The details.
    pub detail: [u64; 3],
}

impl DeviceError {
    /// The error of a wait that gave up, if this is one. `what` names the operation by the
    /// wait's "what waited" detail; `rank`, `comm` and `timeout` are this rank's.
    pub fn wait_error(
        &self,
        what: impl Fn(u64) -> String,
        rank: usize,
        comm: &str,
        timeout: Duration,
    ) -> Option<Error> {
        let [peer, waited, round] = self.detail;
        match self.code {
            ERR_TIMEOUT => Some(Error::Timeout {
                op: what(waited),
                seq: round,
                rank,
                peer: Some(peer as usize),
                timeout,
            }),
            ERR_ABORTED => Some(Error::Aborted {
                comm: comm.to_string(),
                reason: format!(
                    "{} waiting for rank {peer} gave up: the communicator aborted",
                    what(waited)
                ),
            }),
            _ => None,
        }
    }
}

/// Where the kernels report the first error (a code, then three details).
#[derive(Debug)]
pub struct ErrorWords(PinnedBuffer);

impl ErrorWords {
    /// Cleared words on `ctx`'s device.
    pub fn new(ctx: &Arc<Context>) -> Result<ErrorWords> {
        PinnedBuffer::alloc(ctx, 32).map(ErrorWords)
    }

    /// Their device address, for the kernels.
    pub fn device_ptr(&self) -> u64 {
        self.0.device_ptr()
    }

    /// The first error reported since the last call, cleared.
    pub fn take(&self) -> Option<DeviceError> {
        self.take_unless(|_| false)
    }

    /// The first error reported since the last call, cleared; with `keep(code)` true it
    /// stays pending instead.
    pub fn take_unless(&self, keep: impl Fn(u64) -> bool) -> Option<DeviceError> {
        let words = self.0.as_ptr().cast::<u64>();
        // SAFETY: four u64 words of pinned memory (32 bytes, 8-aligned) that the device writes
        // with system-scope stores; volatile reads see them.
        let [code, a, b, c] = std::array::from_fn(|i| unsafe { words.add(i).read_volatile() });
        if code == 0 || keep(code) {
            return None;
        }
        // SAFETY: as above; clearing lets the next error through.
        (0..4).for_each(|i| unsafe { words.add(i).write_volatile(0) });
        Some(DeviceError {
            code,
            detail: [a, b, c],
        })
    }
}
